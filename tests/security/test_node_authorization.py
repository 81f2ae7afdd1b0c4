"""A node's credential reaches only what its own pods need, as kube's Node authorizer and NodeRestriction allow:
a stolen kubelet token of node-1 reads no Secret of node-2's pods, mints no token for them, and changes no other
node, lease or pod. The kubelet's legitimate requests pass."""

from __future__ import annotations

import secrets
from collections.abc import AsyncIterator
from dataclasses import dataclass
from pathlib import Path

import pytest
from tests.integration.apiserver_client import ApiClient, JsonObject, assert_status

from ambit.apiserver.server import ApiServer, ApiServerSettings

NS = "/api/v1/namespaces/apps"
LEASES = "/apis/coordination.k8s.io/v1/namespaces/kube-node-lease/leases"


@dataclass
class Cluster:
    admin: ApiClient
    node1: ApiClient
    pods: dict[str, str]


def _pod(name: str, node: str, secret: str, config_map: str, account: str) -> JsonObject:
    return {
        "metadata": {"name": name},
        "spec": {
            "nodeName": node,
            "serviceAccountName": account,
            "containers": [
                {
                    "name": "app",
                    "image": "example.com/app:1",
                    "env": [{"name": "K", "valueFrom": {"configMapKeyRef": {"name": config_map, "key": "k"}}}],
                }
            ],
            "volumes": [{"name": "s", "secret": {"secretName": secret}}],
        },
    }


@pytest.fixture
async def cluster(tmp_path: Path) -> AsyncIterator[Cluster]:
    token = secrets.token_urlsafe(24)
    token_file = tmp_path / "tokens.csv"
    token_file.write_text(f'{token},system:node:node-1,,"system:nodes"\n')
    token_file.chmod(0o600)
    server = ApiServer(ApiServerSettings(data_dir=tmp_path / "apiserver", port=0, token_auth_file=token_file))
    await server.start()
    try:
        async with ApiClient.for_server(server) as admin, ApiClient.for_server(server, token) as node1:
            assert (await admin.post("/api/v1/namespaces", {"metadata": {"name": "apps"}})).status == 201
            for name in ("mine", "theirs"):
                assert (await admin.post(f"{NS}/secrets", {"metadata": {"name": name}})).status == 201
                cm = {"metadata": {"name": name}, "data": {"k": "v"}}
                assert (await admin.post(f"{NS}/configmaps", cm)).status == 201
                sa = {"metadata": {"name": f"sa-{name}"}}
                assert (await admin.post(f"{NS}/serviceaccounts", sa)).status == 201
            uids = {}
            for pod, node, name in (("on-1", "node-1", "mine"), ("on-2", "node-2", "theirs")):
                reply = await admin.post(f"{NS}/pods", _pod(pod, node, name, name, f"sa-{name}"))
                assert reply.status == 201, reply.body
                uids[pod] = reply.body["metadata"]["uid"]
            for node in ("node-1", "node-2"):
                reply = await admin.post("/api/v1/nodes", {"metadata": {"name": node}})
                assert reply.status == 201, reply.body
            yield Cluster(admin, node1, uids)
    finally:
        await server.aclose()


def _token_request(pod: str, uid: str) -> JsonObject:
    ref = {"kind": "Pod", "apiVersion": "v1", "name": pod, "uid": uid}
    return {
        "apiVersion": "authentication.k8s.io/v1",
        "kind": "TokenRequest",
        "spec": {"audiences": ["istio-ca"], "boundObjectRef": ref},
    }


async def test_a_node_reads_only_the_secrets_and_config_maps_of_its_own_pods(cluster: Cluster) -> None:
    node = cluster.node1
    assert (await node.get(f"{NS}/secrets/mine")).status == 200
    assert (await node.get(f"{NS}/configmaps/mine")).status == 200
    assert (await node.get(f"{NS}/secrets?fieldSelector=metadata.name%3Dmine")).status == 200
    for path in (f"{NS}/secrets/theirs", f"{NS}/configmaps/theirs", f"{NS}/secrets", "/api/v1/secrets"):
        assert_status(await node.get(path), 403, "Forbidden")


async def test_a_node_mints_tokens_only_for_its_own_pods_and_only_bound(cluster: Cluster) -> None:
    node = cluster.node1
    reply = await node.post(f"{NS}/serviceaccounts/sa-mine/token", _token_request("on-1", cluster.pods["on-1"]))
    assert reply.status == 201, reply.body
    # Another node's pod's account: the authorizer refuses (no pod of node-1 runs as it).
    reply = await node.post(f"{NS}/serviceaccounts/sa-theirs/token", _token_request("on-2", cluster.pods["on-2"]))
    assert_status(reply, 403, "Forbidden")
    # Its own pod's account, but bound to another node's pod, or not bound at all: NodeRestriction refuses.
    reply = await node.post(f"{NS}/serviceaccounts/sa-mine/token", _token_request("on-2", cluster.pods["on-2"]))
    assert reply.status in (400, 403), reply.body
    unbound = {"apiVersion": "authentication.k8s.io/v1", "kind": "TokenRequest", "spec": {"audiences": ["istio-ca"]}}
    status = assert_status(await node.post(f"{NS}/serviceaccounts/sa-mine/token", unbound), 403, "Forbidden")
    assert "bound to a pod" in status["message"]


async def test_a_node_changes_only_itself_and_its_own_pods(cluster: Cluster) -> None:
    node = cluster.node1
    status_patch = {"status": {"conditions": [{"type": "Ready", "status": "True"}]}}
    ok = await node.patch("/api/v1/nodes/node-1/status", status_patch)
    assert ok.status == 200, ok.body
    refused = await node.patch("/api/v1/nodes/node-2/status", status_patch)
    assert_status(refused, 403, "Forbidden")
    assert_status(await node.delete("/api/v1/nodes/node-2"), 403, "Forbidden")
    pod_status = {"status": {"phase": "Running"}}
    ok = await node.patch(f"{NS}/pods/on-1/status", pod_status)
    assert ok.status == 200, ok.body
    refused = await node.patch(f"{NS}/pods/on-2/status", pod_status)
    assert_status(refused, 403, "Forbidden")
    relabel = {"metadata": {"labels": {"hacked": "yes"}}}
    assert_status(await node.patch(f"{NS}/pods/on-1", relabel), 403, "Forbidden")
    assert_status(await node.delete(f"{NS}/pods/on-2"), 403, "Forbidden")
    new_pod = {
        "metadata": {"name": "sneaky"},
        "spec": {"nodeName": "node-1", "containers": [{"name": "c", "image": "x"}]},
    }
    assert_status(await node.post(f"{NS}/pods", new_pod), 403, "Forbidden")
    assert (await node.delete(f"{NS}/pods/on-1")).status == 200


async def test_a_node_renews_only_its_own_lease(cluster: Cluster) -> None:
    node = cluster.node1
    await cluster.admin.post("/api/v1/namespaces", {"metadata": {"name": "kube-node-lease"}})
    mine = {"metadata": {"name": "node-1"}, "spec": {"holderIdentity": "node-1"}}
    assert (await node.post(LEASES, mine)).status == 201
    theirs = {"metadata": {"name": "node-2"}, "spec": {"holderIdentity": "node-1"}}
    assert_status(await node.post(LEASES, theirs), 403, "Forbidden")


async def test_a_node_may_not_touch_rbac_webhooks_or_namespaces(cluster: Cluster) -> None:
    node = cluster.node1
    role = {"metadata": {"name": "x"}, "rules": []}
    assert_status(await node.post("/apis/rbac.authorization.k8s.io/v1/clusterroles", role), 403, "Forbidden")
    assert_status(await node.delete("/api/v1/namespaces/apps"), 403, "Forbidden")
    path = "/apis/admissionregistration.k8s.io/v1/validatingwebhookconfigurations"
    assert_status(await node.get(path), 403, "Forbidden")
    review = {"apiVersion": "authorization.k8s.io/v1", "kind": "SelfSubjectRulesReview", "spec": {"namespace": "apps"}}
    reply = await node.post("/apis/authorization.k8s.io/v1/selfsubjectrulesreviews", review)
    assert reply.status == 201
    assert reply.body["status"]["incomplete"] is True


async def test_a_node_registers_with_taints_but_never_lifts_or_changes_them(cluster: Cluster) -> None:
    node, admin = cluster.node1, cluster.admin
    taint = {"key": "cni.istio.io/not-ready", "value": "true", "effect": "NoSchedule"}
    assert (await admin.delete("/api/v1/nodes/node-1")).status == 200
    # kubelet --register-with-taints: the Node is created with them.
    created = await node.post("/api/v1/nodes", {"metadata": {"name": "node-1"}, "spec": {"taints": [taint]}})
    assert created.status == 201, created.body
    # A stolen kubelet token cannot lift the taint that keeps ambient pods away until the node agent is ready.
    for lift in (
        node.patch("/api/v1/nodes/node-1", {"spec": {"taints": None}}),
        node.patch("/api/v1/nodes/node-1", {"spec": {"taints": []}}),
        node.patch(
            "/api/v1/nodes/node-1",
            [{"op": "remove", "path": "/spec/taints"}],
            content_type="application/json-patch+json",
        ),
        node.patch("/api/v1/nodes/node-1", {"spec": {"taints": [{**taint, "effect": "PreferNoSchedule"}]}}),
        node.patch("/api/v1/nodes/node-1", {"spec": {"taints": [taint, {"key": "x", "effect": "NoExecute"}]}}),
    ):
        status = assert_status(await lift, 403, "Forbidden")
        assert "is not allowed to modify taints" in status["message"]
    # What the kubelet does afterwards still passes: its labels and podCIDR, its status.
    again = await node.patch(
        "/api/v1/nodes/node-1", {"metadata": {"labels": {"a": "b"}}, "spec": {"podCIDR": "198.18.1.0/24"}}
    )
    assert again.status == 200, again.body
    ok = await node.patch(
        "/api/v1/nodes/node-1/status", {"status": {"conditions": [{"type": "Ready", "status": "True"}]}}
    )
    assert ok.status == 200, ok.body
    refused = await node.patch(
        "/api/v1/nodes/node-1",
        {"metadata": {"ownerReferences": [{"apiVersion": "v1", "kind": "Node", "name": "node-2", "uid": "u"}]}},
    )
    assert "is not allowed to modify ownerReferences" in assert_status(refused, 403, "Forbidden")["message"]
    # Nor through its status: the status subresource leaves the spec as it was (or refuses).
    await node.patch("/api/v1/nodes/node-1/status", {"spec": {"taints": None}})
    assert (await admin.get("/api/v1/nodes/node-1")).body["spec"]["taints"] == [taint]
    # The control plane (here the admin) removes it.
    lifted = await admin.patch("/api/v1/nodes/node-1", {"spec": {"taints": None}})
    assert lifted.status == 200 and not lifted.body["spec"].get("taints"), lifted.body


async def test_a_node_evicts_only_pods_bound_to_itself_and_a_refused_eviction_charges_no_budget(
    cluster: Cluster,
) -> None:
    admin = cluster.admin
    for pod in ("on-1", "on-2"):
        status = {"phase": "Running", "conditions": [{"type": "Ready", "status": "True"}]}
        assert (await admin.patch(f"{NS}/pods/{pod}/status", {"status": status})).status == 200
        reply = await admin.patch(f"{NS}/pods/{pod}", {"metadata": {"labels": {"app": "web"}}})
        assert reply.status == 200, reply.body
    budgets = "/apis/policy/v1/namespaces/apps/poddisruptionbudgets"
    pdb = {"metadata": {"name": "web"}, "spec": {"minAvailable": 1, "selector": {"matchLabels": {"app": "web"}}}}
    assert (await admin.post(budgets, pdb)).status == 201
    allowing = {"disruptionsAllowed": 1, "currentHealthy": 2, "desiredHealthy": 1, "expectedPods": 2}
    assert (await admin.patch(f"{budgets}/web/status", {"status": {**allowing, "observedGeneration": 1}})).status == 200

    def eviction(pod: str) -> JsonObject:
        return {"apiVersion": "policy/v1", "kind": "Eviction", "metadata": {"name": pod, "namespace": "apps"}}

    # A stolen kubelet token of node-1 must not drain node-2, nor spend the budget that guards node-2's pods.
    status = assert_status(await cluster.node1.post(f"{NS}/pods/on-2/eviction", eviction("on-2")), 403, "Forbidden")
    assert "can only evict pods with spec.nodeName set to itself" in status["message"]
    assert not (await admin.must_get(f"{NS}/pods/on-2"))["metadata"].get("deletionTimestamp")
    budget = (await admin.must_get(f"{budgets}/web"))["status"]
    assert budget["disruptionsAllowed"] == 1 and not budget.get("disruptedPods")
    # Its own pod it may evict, within the budget.
    assert (await cluster.node1.post(f"{NS}/pods/on-1/eviction", eviction("on-1"))).status == 201
    budget = (await admin.must_get(f"{budgets}/web"))["status"]
    assert budget["disruptionsAllowed"] == 0 and list(budget["disruptedPods"]) == ["on-1"]
    # A pod that does not exist is the eviction's 404, not a refusal that tells what exists.
    assert_status(await cluster.node1.post(f"{NS}/pods/gone/eviction", eviction("gone")), 404, "NotFound")
