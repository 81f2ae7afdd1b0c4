"""``kubectl drain`` and ``kubectl get pdb``: the real kubectl binary against the embedded API server, with the
lab's controllers (disruption controller included) and a stand-in kubelet in the test's event loop. A budget that
cannot spare a pod stops the drain with kube's message; one that can lets it finish."""

from __future__ import annotations

from collections.abc import AsyncIterator
from pathlib import Path

import pytest
from tests.integration.lab_cluster import NS, Kubelet, add_node, kubectl, settings, until

from ambit.apiserver.server import ApiServer
from ambit.k8s import KubeClient, kinds
from ambit.lab.controllers import ControllerManager

pytestmark = pytest.mark.kubectl

DEPLOYMENT = """
apiVersion: apps/v1
kind: Deployment
metadata: {name: web, namespace: default}
spec:
  replicas: 2
  selector: {matchLabels: {app: web}}
  template:
    metadata: {labels: {app: web}}
    spec:
      containers: [{name: web, image: registry.example/web:1}]
---
apiVersion: policy/v1
kind: PodDisruptionBudget
metadata: {name: web, namespace: default}
spec:
  minAvailable: 2
  selector: {matchLabels: {app: web}}
"""


@pytest.fixture
async def cluster(apiserver: ApiServer) -> AsyncIterator[tuple[KubeClient, Path]]:
    async with (
        KubeClient.from_kubeconfig(apiserver.kubeconfig) as kube,
        ControllerManager(kube, settings(endpoints=False)),
        Kubelet(kube),
    ):
        for name in ("node-a", "node-b", "node-c"):
            await add_node(kube, name)
        yield kube, apiserver.kubeconfig


async def budget_says(kube: KubeClient, want: dict[str, int]) -> dict[str, int] | None:
    """None until the budget's status holds ``want`` (then the status)."""
    status = (await kube.get(kinds.POD_DISRUPTION_BUDGETS, "web", NS)).get("status") or {}
    got = {k: status.get(k, 0) for k in want}
    return got if got == want else None


async def node_of_a_web_pod(kube: KubeClient) -> str:
    pods = (await kube.list(kinds.PODS, NS, label_selector={"app": "web"}))[0]
    return str(pods[0]["spec"]["nodeName"])


async def test_kubectl_drain_is_held_by_a_budget_that_cannot_spare_a_pod_and_finishes_when_it_can(
    cluster: tuple[KubeClient, Path],
) -> None:
    kube, config = cluster
    await kubectl(config, "apply", "-f", "-", stdin=DEPLOYMENT)
    want = {"expectedPods": 2, "currentHealthy": 2, "desiredHealthy": 2, "disruptionsAllowed": 0}
    await until(lambda: budget_says(kube, want), "the budget's status", within=30)

    table = await kubectl(config, "get", "pdb", "web")
    header, row = table.splitlines()[:2]
    assert header.split() == ["NAME", "MIN", "AVAILABLE", "MAX", "UNAVAILABLE", "ALLOWED", "DISRUPTIONS", "AGE"]
    assert row.split()[:4] == ["web", "2", "N/A", "0"]

    node = await node_of_a_web_pod(kube)
    out = await kubectl(config, "drain", node, "--ignore-daemonsets", "--timeout=5s", check=False)
    assert "Cannot evict pod as it would violate the pod's disruption budget." in out
    assert "global timeout reached: 5s" in out
    assert (await kube.get(kinds.NODES, node))["spec"]["unschedulable"] is True
    assert len((await kube.list(kinds.PODS, NS, label_selector={"app": "web"}))[0]) == 2

    await kubectl(config, "patch", "pdb", "web", "--type=merge", "-p", '{"spec": {"minAvailable": 1}}')
    want = {"expectedPods": 2, "currentHealthy": 2, "desiredHealthy": 1, "disruptionsAllowed": 1}
    await until(lambda: budget_says(kube, want), "the budget to spare a pod", within=30)
    table = await kubectl(config, "get", "pdb", "web", "--no-headers")
    assert table.split()[:4] == ["web", "1", "N/A", "1"]
    out = await kubectl(config, "drain", node, "--ignore-daemonsets", "--timeout=30s")
    assert f"node/{node} drained" in out

    async def moved() -> bool:
        pods = (await kube.list(kinds.PODS, NS, label_selector={"app": "web"}))[0]
        return len(pods) == 2 and all(p["spec"].get("nodeName") not in ("", None, node) for p in pods)

    await until(moved, "both web pods off the drained node", within=30)
