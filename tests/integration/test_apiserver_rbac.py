"""RBAC in the embedded API server, over HTTP: the four kinds served, bindings granting what they say and no more,
aggregation kept up to date, access reviews, impersonation, and the components' own least-privilege roles."""

from __future__ import annotations

from collections.abc import AsyncIterator
from typing import Any

import pytest
from apiserver_client import ApiClient, JsonObject, assert_status, configmap, grant, pod

from ambit.apiserver.server import ApiServer

RBAC = "/apis/rbac.authorization.k8s.io/v1"
AUTHZ = "/apis/authorization.k8s.io/v1"
SA = "system:serviceaccount:apps:default"
AGG_VIEW = "rbac.authorization.k8s.io/aggregate-to-view"


@pytest.fixture
async def api(apiserver: ApiServer) -> AsyncIterator[ApiClient]:
    async with ApiClient.for_server(apiserver) as client:
        for ns in ("apps", "other", "istio-system"):
            assert (await client.post("/api/v1/namespaces", {"metadata": {"name": ns}})).status == 201
        for name in ("istiod", "ztunnel", "istio-cni"):
            sa = {"metadata": {"name": name}}
            assert (await client.post("/api/v1/namespaces/istio-system/serviceaccounts", sa)).status == 201
        yield client


async def token_for(api: ApiClient, namespace: str, account: str) -> str:
    reply = await api.post(f"/api/v1/namespaces/{namespace}/serviceaccounts/{account}/token", {"spec": {}})
    assert reply.status == 201, reply.body
    token: str = reply.body["status"]["token"]
    return token


async def as_account(apiserver: ApiServer, api: ApiClient, namespace: str, account: str) -> ApiClient:
    return ApiClient.for_server(apiserver, await token_for(api, namespace, account))


async def test_rbac_kinds_are_discovered_and_the_default_roles_exist(api: ApiClient) -> None:
    doc = await api.must_get(RBAC)
    assert {r["name"] for r in doc["resources"]} == {"roles", "clusterroles", "rolebindings", "clusterrolebindings"}
    names = (await api.get(f"{RBAC}/clusterroles")).names()
    for name in ("cluster-admin", "admin", "edit", "view", "system:discovery", "system:basic-user"):
        assert name in names
    for name in ("system:public-info-viewer", "istiod-clusterrole-istio-system", "istio-cni"):
        assert name in names
    binding = await api.must_get(f"{RBAC}/clusterrolebindings/cluster-admin")
    assert binding["subjects"] == [{"apiGroup": "rbac.authorization.k8s.io", "kind": "Group", "name": "system:masters"}]


async def test_view_edit_and_admin_are_aggregated(api: ApiClient) -> None:
    def resources(role: JsonObject) -> set[str]:
        return {r for rule in role["rules"] for r in rule.get("resources", ())}

    view = await api.must_get(f"{RBAC}/clusterroles/view")
    assert "pods" in resources(view) and "secrets" not in resources(view)
    edit = await api.must_get(f"{RBAC}/clusterroles/edit")
    assert "secrets" in resources(edit) and "rolebindings" not in resources(edit)
    admin = await api.must_get(f"{RBAC}/clusterroles/admin")
    assert {"secrets", "rolebindings", "pods"} <= resources(admin)
    widgets = {
        "metadata": {"name": "widget-viewer", "labels": {AGG_VIEW: "true"}},
        "rules": [{"apiGroups": ["example.com"], "resources": ["widgets"], "verbs": ["get"]}],
    }
    assert (await api.post(f"{RBAC}/clusterroles", widgets)).status == 201
    for name in ("view", "edit", "admin"):
        assert "widgets" in resources(await api.must_get(f"{RBAC}/clusterroles/{name}")), name
    assert (await api.delete(f"{RBAC}/clusterroles/widget-viewer")).status == 200
    for name in ("view", "edit", "admin"):
        assert "widgets" not in resources(await api.must_get(f"{RBAC}/clusterroles/{name}")), name


async def test_a_role_binding_grants_in_its_namespace_only(apiserver: ApiServer, api: ApiClient) -> None:
    await grant(api, "view", "apps", "default")
    async with await as_account(apiserver, api, "apps", "default") as sa:
        assert (await sa.get("/api/v1/namespaces/apps/pods")).status == 200
        assert (await sa.get("/api/v1/namespaces/apps/pods", watch="true", timeoutSeconds="1")).status == 200
        assert_status(await sa.get("/api/v1/namespaces/other/pods"), 403, "Forbidden")
        assert_status(await sa.get("/api/v1/pods"), 403, "Forbidden")
        assert_status(await sa.get("/api/v1/namespaces/apps/secrets"), 403, "Forbidden")
        reply = await sa.post("/api/v1/namespaces/apps/configmaps", configmap("x", namespace="apps"))
        assert_status(reply, 403, "Forbidden", 'cannot create resource "configmaps"')


async def test_resource_names_and_subresources(apiserver: ApiServer, api: ApiClient) -> None:
    assert (await api.post("/api/v1/namespaces/apps/pods", pod("p", namespace="apps"))).status == 201
    for name in ("mine", "theirs"):
        assert (await api.post("/api/v1/namespaces/apps/configmaps", configmap(name, namespace="apps"))).status == 201
    role = {
        "metadata": {"name": "narrow"},
        "rules": [
            {"apiGroups": [""], "resources": ["configmaps"], "resourceNames": ["mine"], "verbs": ["get"]},
            {"apiGroups": [""], "resources": ["pods/status"], "verbs": ["get", "patch"]},
        ],
    }
    assert (await api.post(f"{RBAC}/namespaces/apps/roles", role)).status == 201
    binding = {
        "metadata": {"name": "narrow"},
        "roleRef": {"apiGroup": "rbac.authorization.k8s.io", "kind": "Role", "name": "narrow"},
        "subjects": [{"kind": "ServiceAccount", "name": "default"}],  # the binding's namespace
    }
    assert (await api.post(f"{RBAC}/namespaces/apps/rolebindings", binding)).status == 201
    async with await as_account(apiserver, api, "apps", "default") as sa:
        assert (await sa.get("/api/v1/namespaces/apps/configmaps/mine")).status == 200
        assert_status(await sa.get("/api/v1/namespaces/apps/configmaps/theirs"), 403)
        assert_status(await sa.get("/api/v1/namespaces/apps/configmaps"), 403)
        assert (await sa.get("/api/v1/namespaces/apps/pods/p/status")).status == 200
        assert_status(await sa.get("/api/v1/namespaces/apps/pods/p"), 403)
        patch = b'{"metadata":{"labels":{"ready":"yes"}}}'
        reply = await sa.request(
            "PATCH", "/api/v1/namespaces/apps/pods/p/status", data=patch, content_type="application/merge-patch+json"
        )
        assert reply.status == 200, reply.body


async def test_the_role_of_a_binding_cannot_change(api: ApiClient) -> None:
    await grant(api, "view", "apps", "default")
    path = f"{RBAC}/namespaces/apps/rolebindings/default-view"
    patch = b'{"roleRef":{"apiGroup":"rbac.authorization.k8s.io","kind":"ClusterRole","name":"edit"}}'
    reply = await api.request("PATCH", path, data=patch, content_type="application/merge-patch+json")
    assert_status(reply, 422, "Invalid", "roleRef: cannot change roleRef")
    subjects = b'{"subjects":[{"kind":"ServiceAccount","name":"other","namespace":"apps"}]}'
    reply = await api.request("PATCH", path, data=subjects, content_type="application/merge-patch+json")
    assert reply.status == 200, reply.body


async def test_access_reviews(api: ApiClient) -> None:
    def sar(user: str, verb: str, resource: str, namespace: str = "apps", **more: Any) -> JsonObject:
        attrs = {"verb": verb, "resource": resource, "namespace": namespace, **more}
        return {"kind": "SubjectAccessReview", "spec": {"user": user, "groups": [], "resourceAttributes": attrs}}

    await grant(api, "edit", "apps", "default")
    cases = [
        (sar(SA, "create", "pods"), True),
        (sar(SA, "create", "pods", "other"), False),
        (sar(SA, "get", "secrets"), True),
        (sar(SA, "create", "serviceaccounts", subresource="token"), True),
        (sar(SA, "create", "rolebindings", group="rbac.authorization.k8s.io"), False),
        (sar("ada", "get", "pods"), False),
    ]
    for body, allowed in cases:
        reply = await api.post(f"{AUTHZ}/subjectaccessreviews", body)
        assert reply.status == 201 and reply.body["status"]["allowed"] is allowed, (body, reply.body)
    local = sar(SA, "get", "pods") | {"kind": "LocalSubjectAccessReview"}
    reply = await api.post(f"{AUTHZ}/namespaces/apps/localsubjectaccessreviews", local)
    assert reply.status == 201 and reply.body["status"]["allowed"] is True
    url = {"kind": "SubjectAccessReview", "spec": {"groups": ["system:unauthenticated"]}}
    url["spec"]["nonResourceAttributes"] = {"path": "/healthz", "verb": "get"}
    assert (await api.post(f"{AUTHZ}/subjectaccessreviews", url)).body["status"]["allowed"] is True
    mine = {"kind": "SelfSubjectAccessReview", "spec": {"resourceAttributes": {"verb": "delete", "resource": "nodes"}}}
    assert (await api.post(f"{AUTHZ}/selfsubjectaccessreviews", mine)).body["status"]["allowed"] is True


async def test_impersonation_needs_the_impersonate_verb(apiserver: ApiServer, api: ApiClient) -> None:
    async def get_as(token: str, path: str, **headers: str) -> tuple[int, JsonObject]:
        reply = await api.request("GET", path, token=token, headers=headers)
        return reply.status, reply.body

    code, body = await get_as(apiserver.admin_token, "/api/v1/namespaces/apps/pods", **{"Impersonate-User": SA})
    assert code == 403 and body["message"].startswith(f'pods is forbidden: User "{SA}" cannot list')
    await grant(api, "view", "apps", "default")
    code, _ = await get_as(apiserver.admin_token, "/api/v1/namespaces/apps/pods", **{"Impersonate-User": SA})
    assert code == 200
    token = await token_for(api, "apps", "default")
    code, body = await get_as(token, "/api/v1/namespaces/apps/pods", **{"Impersonate-User": "someone"})
    assert code == 403 and body["message"] == (
        f'users "someone" is forbidden: User "{SA}" cannot impersonate resource "users" in API group "" '
        "at the cluster scope"
    )


async def test_component_service_accounts_have_least_privilege(apiserver: ApiServer, api: ApiClient) -> None:
    async with await as_account(apiserver, api, "istio-system", "istiod") as istiod:
        for path in ("/api/v1/pods", "/api/v1/services", "/api/v1/namespaces", "/api/v1/nodes"):
            assert (await istiod.get(path)).status == 200, path
        assert (await istiod.get("/apis/discovery.k8s.io/v1/endpointslices")).status == 200
        assert (await istiod.get("/apis/security.istio.io/v1/authorizationpolicies")).status == 200
        assert (await istiod.get("/api/v1/secrets")).status == 200  # gateway certificates, as Istio's istiod
        secret = {"apiVersion": "v1", "kind": "Secret", "metadata": {"name": "s"}, "data": {}}
        assert_status(await istiod.post("/api/v1/namespaces/apps/secrets", secret), 403)
        assert_status(await istiod.post("/api/v1/namespaces/apps/pods", pod("x", namespace="apps")), 403)
        review = {"kind": "TokenReview", "spec": {"token": "x"}}
        assert (await istiod.post("/apis/authentication.k8s.io/v1/tokenreviews", review)).status == 201
    async with await as_account(apiserver, api, "istio-system", "ztunnel") as ztunnel:
        assert_status(await ztunnel.get("/api/v1/pods"), 403)
        assert_status(await ztunnel.get("/api/v1/namespaces/istio-system/secrets"), 403)
        assert (await ztunnel.get("/apis")).status == 200
    assert (await api.post("/api/v1/namespaces/apps/pods", pod("p", namespace="apps"))).status == 201
    async with await as_account(apiserver, api, "istio-system", "istio-cni") as cni:
        assert (await cni.get("/api/v1/pods")).status == 200
        patch = b'{"metadata":{"annotations":{"ambient.istio.io/redirection":"enabled"}}}'
        reply = await cni.request(
            "PATCH", "/api/v1/namespaces/apps/pods/p", data=patch, content_type="application/merge-patch+json"
        )
        assert reply.status == 200, reply.body
        assert_status(await cni.delete("/api/v1/namespaces/apps/pods/p"), 403)


async def test_anonymous_requests_see_only_public_info(api: ApiClient) -> None:
    assert (await api.request("GET", "/healthz", token="")).status == 200
    assert (await api.request("GET", "/version", token="")).status == 200
