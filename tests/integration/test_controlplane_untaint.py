"""The node untaint controller against a real API server: a node's ``cni.istio.io/not-ready`` taint goes once a
ready node agent pod runs on it, other taints stay, and a controller without ``patch nodes`` only logs."""

from __future__ import annotations

import contextlib
import logging
from collections.abc import AsyncIterator
from pathlib import Path
from typing import Any

import pytest
import yaml
from tests.harness import ServerProcess
from tests.integration.controlplane_rig import eventually

from ambit.controlplane.untaint import NOT_READY_TAINT, NodeUntainter
from ambit.k8s import KubeAlreadyExistsError, KubeClient, kinds
from ambit.k8s.kinds import ResourceKind

CLUSTER_ROLES = ResourceKind("rbac.authorization.k8s.io", "v1", "clusterroles", "ClusterRole", namespaced=False)
CLUSTER_ROLE_BINDINGS = ResourceKind(
    "rbac.authorization.k8s.io", "v1", "clusterrolebindings", "ClusterRoleBinding", namespaced=False
)

NOT_READY = {"key": NOT_READY_TAINT, "effect": "NoSchedule"}
OTHER = {"key": "dedicated", "value": "gpu", "effect": "NoSchedule"}


@pytest.fixture
async def kube(server_process: ServerProcess) -> AsyncIterator[KubeClient]:
    async with KubeClient.from_kubeconfig(server_process.kubeconfig) as client:
        with contextlib.suppress(KubeAlreadyExistsError):
            await client.create(kinds.NAMESPACES, {"metadata": {"name": "istio-system"}})
        yield client


async def make_node(kube: KubeClient, name: str, *taints: dict[str, Any]) -> None:
    await kube.create(kinds.NODES, {"metadata": {"name": name}, "spec": {"taints": list(taints)}})


async def make_agent(kube: KubeClient, node: str, *, ready: bool) -> str:
    name = f"istio-cni-node-{node}"
    pod = {
        "metadata": {"name": name, "namespace": "istio-system", "labels": {"k8s-app": "istio-cni-node"}},
        "spec": {"nodeName": node, "containers": [{"name": "install-cni", "image": "ambit"}]},
    }
    await kube.create(kinds.PODS, pod, namespace="istio-system")
    await set_ready(kube, name, ready)
    return name


async def set_ready(kube: KubeClient, name: str, ready: bool) -> None:
    status = {"status": {"phase": "Running", "conditions": [{"type": "Ready", "status": str(ready)}]}}
    await kube.patch_status(kinds.PODS, name, status, namespace="istio-system")


async def taints(kube: KubeClient, node: str) -> list[Any]:
    return list((await kube.get(kinds.NODES, node)).get("spec", {}).get("taints") or [])


async def test_the_not_ready_taint_goes_once_the_node_agent_is_ready_and_other_taints_stay(kube: KubeClient) -> None:
    await make_node(kube, "ut-1", OTHER, NOT_READY)
    await make_node(kube, "ut-2", NOT_READY)
    untainter = NodeUntainter(kube, resync=0.5)
    await untainter.start()
    try:
        agent = await make_agent(kube, "ut-1", ready=False)
        await make_agent(kube, "ut-2", ready=False)
        await eventually(lambda: untainter._pods.synced and len(untainter._pods) >= 2)
        await untainter.reconcile()
        assert await taints(kube, "ut-1") == [OTHER, NOT_READY], "an agent that is not ready leaves the taint"
        await set_ready(kube, agent, True)

        async def untainted() -> bool:
            return await taints(kube, "ut-1") == [OTHER]

        await eventually(untainted)
        assert await taints(kube, "ut-2") == [NOT_READY], "only the node whose agent is ready"
    finally:
        await untainter.aclose()


async def test_without_patch_on_nodes_the_controller_logs_once_and_keeps_going(
    kube: KubeClient, server_process: ServerProcess, caplog: pytest.LogCaptureFixture, tmp_path: Path
) -> None:
    await make_node(kube, "ut-3", NOT_READY)
    await make_agent(kube, "ut-3", ready=True)
    await kube.create(kinds.SERVICE_ACCOUNTS, {"metadata": {"name": "reader", "namespace": "istio-system"}})
    reader_role = {
        "metadata": {"name": "untaint-reader"},
        "rules": [{"apiGroups": [""], "resources": ["nodes", "pods"], "verbs": ["get", "list", "watch"]}],
    }
    await kube.create(CLUSTER_ROLES, reader_role)
    binding = {
        "metadata": {"name": "untaint-reader"},
        "roleRef": {"apiGroup": "rbac.authorization.k8s.io", "kind": "ClusterRole", "name": "untaint-reader"},
        "subjects": [{"kind": "ServiceAccount", "name": "reader", "namespace": "istio-system"}],
    }
    await kube.create(CLUSTER_ROLE_BINDINGS, binding)
    token = (await kube.create_token("istio-system", "reader", audiences=[]))["status"]["token"]
    config = yaml.safe_load(server_process.kubeconfig.read_text())
    config["users"][0]["user"] = {"token": token}
    kubeconfig = tmp_path / "reader.kubeconfig"
    kubeconfig.write_text(yaml.safe_dump(config))
    async with KubeClient.from_kubeconfig(kubeconfig) as reader:
        untainter = NodeUntainter(reader, resync=0.2)
        with caplog.at_level(logging.WARNING, logger="ambit.controlplane.untaint"):
            await untainter.start()
            try:
                await eventually(lambda: "cannot remove taint" in caplog.text)
                await eventually(lambda: untainter._pods.synced and untainter._nodes.synced)
                for _ in range(3):
                    await untainter.reconcile()
            finally:
                await untainter.aclose()
    assert caplog.text.count("cannot remove taint cni.istio.io/not-ready from node ut-3") == 1
    assert await taints(kube, "ut-3") == [NOT_READY]
