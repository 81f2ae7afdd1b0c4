"""Issue 14's API attacks, replayed with a pod's own service-account token: every one is refused with 403 in
kube-apiserver's format, and the token may do nothing beyond discovery and asking what it may do."""

from __future__ import annotations

from collections.abc import AsyncIterator
from dataclasses import dataclass
from typing import Any

import pytest
from tests.harness import ServerProcess
from tests.integration.apiserver_client import ApiClient, JsonObject, assert_status, pod

from ambit.apiserver.server import ApiServer

RBAC = "/apis/rbac.authorization.k8s.io/v1"
ISTIO = "/api/v1/namespaces/istio-system"
ME = "system:serviceaccount:apps:default"
WEBHOOKS = "/apis/admissionregistration.k8s.io/v1"
EDIT_VERBS = ["get", "list", "watch", "create", "update", "patch", "delete"]


@dataclass
class Mesh:
    admin: ApiClient
    pod_client: ApiClient


def _webhook_config(kind: str, name: str) -> JsonObject:
    return {
        "apiVersion": "admissionregistration.k8s.io/v1",
        "kind": kind,
        "metadata": {"name": name},
        "webhooks": [
            {
                "name": "hook.example.com",
                "clientConfig": {"url": "https://127.0.0.1:1/hook"},
                "rules": [
                    {"operations": ["CREATE"], "apiGroups": [""], "apiVersions": ["v1"], "resources": ["secrets"]}
                ],
                "sideEffects": "None",
                "admissionReviewVersions": ["v1"],
                "failurePolicy": "Ignore",
            }
        ],
    }


@pytest.fixture
async def mesh(apiserver: ApiServer) -> AsyncIterator[Mesh]:
    async with ApiClient.for_server(apiserver) as admin:
        for ns in ("istio-system", "apps"):
            assert (await admin.post("/api/v1/namespaces", {"metadata": {"name": ns}})).status == 201
        secret = {"metadata": {"name": "istio-ca-secret"}, "data": {"ca-key.pem": "a2V5"}}
        assert (await admin.post(f"{ISTIO}/secrets", secret)).status == 201
        assert (await admin.post(f"{ISTIO}/serviceaccounts", {"metadata": {"name": "ztunnel"}})).status == 201
        assert (await admin.post("/api/v1/namespaces/apps/pods", pod("client", namespace="apps"))).status == 201
        found = await admin.must_get("/api/v1/namespaces/apps/pods/client")
        ref = {"kind": "Pod", "apiVersion": "v1", "name": "client", "uid": found["metadata"]["uid"]}
        reply = await admin.post(
            "/api/v1/namespaces/apps/serviceaccounts/default/token",
            {"apiVersion": "authentication.k8s.io/v1", "kind": "TokenRequest", "spec": {"boundObjectRef": ref}},
        )
        assert reply.status == 201, reply.body
        hook = _webhook_config("ValidatingWebhookConfiguration", "istio-validator-istio-system")
        assert (await admin.post(f"{WEBHOOKS}/validatingwebhookconfigurations", hook)).status == 201
        async with ApiClient.for_server(apiserver, reply.body["status"]["token"]) as pod_client:
            yield Mesh(admin, pod_client)


def forbidden(reply: Any, message: str) -> None:
    status = assert_status(reply, 403, "Forbidden")
    assert status["message"] == message


async def test_pod_token_cannot_read_the_mesh_ca_secret(mesh: Mesh) -> None:
    forbidden(
        await mesh.pod_client.get(f"{ISTIO}/secrets/istio-ca-secret"),
        f'secrets "istio-ca-secret" is forbidden: User "{ME}" cannot get resource "secrets" in API group "" '
        'in the namespace "istio-system"',
    )
    forbidden(
        await mesh.pod_client.get(f"{ISTIO}/secrets"),
        f'secrets is forbidden: User "{ME}" cannot list resource "secrets" in API group "" in the namespace '
        '"istio-system"',
    )
    forbidden(
        await mesh.pod_client.get("/api/v1/secrets", watch="true"),
        f'secrets is forbidden: User "{ME}" cannot watch resource "secrets" in API group "" at the cluster scope',
    )
    forbidden(
        await mesh.pod_client.get("/api/v1/watch/namespaces/istio-system/secrets"),
        f'secrets is forbidden: User "{ME}" cannot watch resource "secrets" in API group "" in the namespace '
        '"istio-system"',
    )


async def test_pod_token_cannot_mint_a_ztunnel_token(mesh: Mesh) -> None:
    body = {"apiVersion": "authentication.k8s.io/v1", "kind": "TokenRequest", "spec": {"audiences": ["istio-ca"]}}
    forbidden(
        await mesh.pod_client.post(f"{ISTIO}/serviceaccounts/ztunnel/token", body),
        f'serviceaccounts "ztunnel" is forbidden: User "{ME}" cannot create resource "serviceaccounts/token" in API '
        'group "" in the namespace "istio-system"',
    )


@pytest.mark.parametrize("namespace", ["kube-system", "istio-system", "default", "apps"])
async def test_pod_token_cannot_create_pods(mesh: Mesh, namespace: str) -> None:
    reply = await mesh.pod_client.post(f"/api/v1/namespaces/{namespace}/pods", pod("evil", namespace=namespace))
    forbidden(
        reply,
        f'pods is forbidden: User "{ME}" cannot create resource "pods" in API group "" in the namespace "{namespace}"',
    )
    assert (await mesh.admin.get(f"/api/v1/namespaces/{namespace}/pods/evil")).status == 404


async def test_pod_token_cannot_change_webhooks(mesh: Mesh) -> None:
    forbidden(
        await mesh.pod_client.delete(f"{WEBHOOKS}/validatingwebhookconfigurations/istio-validator-istio-system"),
        'validatingwebhookconfigurations.admissionregistration.k8s.io "istio-validator-istio-system" is forbidden: '
        f'User "{ME}" cannot delete resource "validatingwebhookconfigurations" in API group '
        '"admissionregistration.k8s.io" at the cluster scope',
    )
    evil = _webhook_config("MutatingWebhookConfiguration", "evil")
    forbidden(
        await mesh.pod_client.post(f"{WEBHOOKS}/mutatingwebhookconfigurations", evil),
        "mutatingwebhookconfigurations.admissionregistration.k8s.io is forbidden: "
        f'User "{ME}" cannot create resource "mutatingwebhookconfigurations" in API group '
        '"admissionregistration.k8s.io" at the cluster scope',
    )
    assert (
        await mesh.admin.get(f"{WEBHOOKS}/validatingwebhookconfigurations/istio-validator-istio-system")
    ).status == 200


async def test_pod_token_cannot_write_policy_in_the_root_namespace(mesh: Mesh) -> None:
    policy = {
        "apiVersion": "security.istio.io/v1",
        "kind": "AuthorizationPolicy",
        "metadata": {"name": "allow-all"},
        "spec": {"rules": [{}]},
    }
    forbidden(
        await mesh.pod_client.post("/apis/security.istio.io/v1/namespaces/istio-system/authorizationpolicies", policy),
        f'authorizationpolicies.security.istio.io is forbidden: User "{ME}" cannot create resource '
        '"authorizationpolicies" in API group "security.istio.io" in the namespace "istio-system"',
    )


async def test_pod_token_cannot_delete_namespaces(mesh: Mesh) -> None:
    forbidden(
        await mesh.pod_client.delete("/api/v1/namespaces/istio-system"),
        f'namespaces "istio-system" is forbidden: User "{ME}" cannot delete resource "namespaces" in API group "" '
        'in the namespace "istio-system"',
    )
    assert (await mesh.admin.get("/api/v1/namespaces/istio-system")).status == 200


async def test_pod_token_cannot_impersonate(mesh: Mesh) -> None:
    for headers in (
        {"Impersonate-User": "kubernetes-admin"},
        {"Impersonate-User": ME, "Impersonate-Group": "system:masters"},
    ):
        reply = await mesh.pod_client.request("GET", f"{ISTIO}/secrets", headers=headers)
        assert_status(reply, 403, "Forbidden", "cannot impersonate resource")


async def test_pod_token_may_only_discover_and_ask(mesh: Mesh) -> None:
    for path in ("/api", "/apis", "/api/v1", "/apis/apps/v1", "/version", "/healthz"):
        assert (await mesh.pod_client.get(path)).status == 200, path
    forbidden(await mesh.pod_client.get("/metrics"), f'forbidden: User "{ME}" cannot get path "/metrics"')
    review = {
        "apiVersion": "authorization.k8s.io/v1",
        "kind": "SelfSubjectRulesReview",
        "spec": {"namespace": "apps"},
    }
    reply = await mesh.pod_client.post("/apis/authorization.k8s.io/v1/selfsubjectrulesreviews", review)
    assert reply.status == 201
    resources = {(tuple(r["apiGroups"]), tuple(r["resources"])) for r in reply.body["status"]["resourceRules"]}
    assert resources == {(("authorization.k8s.io",), ("selfsubjectaccessreviews", "selfsubjectrulesreviews"))}


async def test_a_rules_review_with_a_missing_role_is_incomplete(mesh: Mesh) -> None:
    """kube's rule resolver: a binding whose role does not exist grants nothing and makes the review incomplete."""
    binding = {
        "metadata": {"name": "dangling"},
        "roleRef": {"apiGroup": "rbac.authorization.k8s.io", "kind": "Role", "name": "no-such-role"},
        "subjects": [{"kind": "ServiceAccount", "name": "default", "namespace": "apps"}],
    }
    assert (await mesh.admin.post(f"{RBAC}/namespaces/apps/rolebindings", binding)).status == 201
    try:
        review = {
            "apiVersion": "authorization.k8s.io/v1",
            "kind": "SelfSubjectRulesReview",
            "spec": {"namespace": "apps"},
        }
        reply = await mesh.pod_client.post("/apis/authorization.k8s.io/v1/selfsubjectrulesreviews", review)
        assert reply.status == 201
        status = reply.body["status"]
        assert status["incomplete"] is True
        assert 'role.rbac.authorization.k8s.io "no-such-role" not found' in status["evaluationError"]
        resources = {(tuple(r["apiGroups"]), tuple(r["resources"])) for r in status["resourceRules"]}
        assert resources == {(("authorization.k8s.io",), ("selfsubjectaccessreviews", "selfsubjectrulesreviews"))}
    finally:
        await mesh.admin.delete(f"{RBAC}/namespaces/apps/rolebindings/dangling")


# -- escalation ---------------------------------------------------------------------------------------------
async def _may_manage_roles(mesh: Mesh) -> None:
    """An admin lets the pod's account manage Roles and RoleBindings in its own namespace, nothing more."""
    role = {
        "metadata": {"name": "role-manager"},
        "rules": [
            {"apiGroups": ["rbac.authorization.k8s.io"], "resources": ["roles", "rolebindings"], "verbs": EDIT_VERBS}
        ],
    }
    assert (await mesh.admin.post(f"{RBAC}/namespaces/apps/roles", role)).status == 201
    binding = {
        "metadata": {"name": "role-manager"},
        "roleRef": {"apiGroup": "rbac.authorization.k8s.io", "kind": "Role", "name": "role-manager"},
        "subjects": [{"kind": "ServiceAccount", "name": "default", "namespace": "apps"}],
    }
    assert (await mesh.admin.post(f"{RBAC}/namespaces/apps/rolebindings", binding)).status == 201


async def test_escalation_through_a_role_is_refused(mesh: Mesh) -> None:
    await _may_manage_roles(mesh)
    grab = {"metadata": {"name": "grab"}, "rules": [{"apiGroups": [""], "resources": ["secrets"], "verbs": ["get"]}]}
    reply = await mesh.pod_client.post(f"{RBAC}/namespaces/apps/roles", grab)
    status = assert_status(reply, 403, "Forbidden")
    assert status["message"] == (
        f'roles.rbac.authorization.k8s.io "grab" is forbidden: user "{ME}" (groups=["system:serviceaccounts" '
        '"system:serviceaccounts:apps" "system:authenticated"]) is attempting to grant RBAC permissions not '
        'currently held:\n{APIGroups:[""], Resources:["secrets"], Verbs:["get"]}'
    )
    # A role within what it holds is fine; so is updating it, but not widening it afterwards.
    mine = {
        "metadata": {"name": "mine"},
        "rules": [{"apiGroups": ["rbac.authorization.k8s.io"], "resources": ["roles"], "verbs": ["get"]}],
    }
    assert (await mesh.pod_client.post(f"{RBAC}/namespaces/apps/roles", mine)).status == 201
    widen = b'[{"op":"add","path":"/rules/-","value":{"apiGroups":[""],"resources":["secrets"],"verbs":["list"]}}]'
    reply = await mesh.pod_client.request(
        "PATCH", f"{RBAC}/namespaces/apps/roles/mine", data=widen, content_type="application/json-patch+json"
    )
    assert_status(reply, 403, "Forbidden", "attempting to grant RBAC permissions not currently held")
    assert (await mesh.pod_client.get(f"{ISTIO}/secrets")).status == 403
    assert (await mesh.pod_client.get("/api/v1/namespaces/apps/secrets")).status == 403


async def test_escalation_through_a_binding_is_refused(mesh: Mesh) -> None:
    await _may_manage_roles(mesh)
    for role in ("admin", "edit", "cluster-admin"):
        binding = {
            "metadata": {"name": f"grab-{role}"},
            "roleRef": {"apiGroup": "rbac.authorization.k8s.io", "kind": "ClusterRole", "name": role},
            "subjects": [{"kind": "ServiceAccount", "name": "default", "namespace": "apps"}],
        }
        reply = await mesh.pod_client.post(f"{RBAC}/namespaces/apps/rolebindings", binding)
        assert_status(reply, 403, "Forbidden", "attempting to grant RBAC permissions not currently held")
    cluster_binding = {
        "metadata": {"name": "grab"},
        "roleRef": {"apiGroup": "rbac.authorization.k8s.io", "kind": "ClusterRole", "name": "cluster-admin"},
        "subjects": [{"kind": "ServiceAccount", "name": "default", "namespace": "apps"}],
    }
    forbidden(
        await mesh.pod_client.post(f"{RBAC}/clusterrolebindings", cluster_binding),
        f'clusterrolebindings.rbac.authorization.k8s.io is forbidden: User "{ME}" cannot create resource '
        '"clusterrolebindings" in API group "rbac.authorization.k8s.io" at the cluster scope',
    )
    # Binding a role whose rules it holds is allowed, as in kube.
    binding = {
        "metadata": {"name": "again"},
        "roleRef": {"apiGroup": "rbac.authorization.k8s.io", "kind": "Role", "name": "role-manager"},
        "subjects": [{"kind": "ServiceAccount", "name": "other", "namespace": "apps"}],
    }
    assert (await mesh.pod_client.post(f"{RBAC}/namespaces/apps/rolebindings", binding)).status == 201
    assert (await mesh.pod_client.get(f"{ISTIO}/secrets")).status == 403


# -- kubectl auth can-i --list -------------------------------------------------------------------------------
@pytest.fixture(scope="module")
def kube(server_process: ServerProcess) -> ServerProcess:
    server_process.kubectl("create", "namespace", "apps")
    return server_process


def test_kubectl_can_i_list_for_a_default_service_account(kube: ServerProcess) -> None:
    token = kube.kubectl("create", "token", "default", "-n", "apps").strip()
    out = kube.kubectl("auth", "can-i", "--list", "-n", "apps", f"--token={token}")
    lines = [line.split() for line in out.strip().splitlines()[1:]]
    resources = {line[0] for line in lines}
    assert resources == {
        "selfsubjectaccessreviews.authorization.k8s.io",
        "selfsubjectrulesreviews.authorization.k8s.io",
        *[f"[{url}]" for url in ("/api/*", "/api", "/apis/*", "/apis", "/healthz", "/healthz", "/livez", "/livez")],
        *[f"[{url}]" for url in ("/openapi/*", "/openapi", "/readyz", "/readyz", "/version/", "/version/")],
        "[/version]",
    }, out
    as_sa = ["--as=system:serviceaccount:apps:default"]
    assert kube.kubectl("auth", "can-i", "--list", "-n", "apps", *as_sa) == out
    for verb, what in (("get", "secrets"), ("create", "pods"), ("create", "serviceaccounts/token"), ("delete", "ns")):
        answer = kube.kubectl("auth", "can-i", verb, what, "-n", "istio-system", *as_sa, check=False)
        assert answer.strip().startswith("no"), (verb, what, answer)
