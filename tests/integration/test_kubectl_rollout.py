"""``kubectl rollout status|history|undo|restart`` on a DaemonSet: the real kubectl binary against the embedded API
server, with the lab's controllers and a stand-in kubelet running in the test's event loop."""

from __future__ import annotations

from collections.abc import AsyncIterator
from pathlib import Path

import pytest
from tests.integration.lab_cluster import NS, Kubelet, add_node, kubectl, settings, until

from ambit.apiserver.server import ApiServer
from ambit.k8s import KubeClient, kinds
from ambit.lab.controllers import ControllerManager

pytestmark = pytest.mark.kubectl

MANIFEST = """
apiVersion: apps/v1
kind: DaemonSet
metadata:
  name: agent
  namespace: default
  annotations:
    kubernetes.io/change-cause: "{cause}"
spec:
  selector:
    matchLabels: {{app: agent}}
  template:
    metadata:
      labels: {{app: agent}}
    spec:
      containers:
      - name: agent
        image: {image}
"""


@pytest.fixture
async def cluster(apiserver: ApiServer) -> AsyncIterator[tuple[KubeClient, Path]]:
    async with (
        KubeClient.from_kubeconfig(apiserver.kubeconfig) as kube,
        ControllerManager(kube, settings(endpoints=False)),
        Kubelet(kube),
    ):
        for name in ("node-a", "node-b"):
            await add_node(kube, name)
        yield kube, apiserver.kubeconfig


async def images(kube: KubeClient) -> set[str]:
    items = (await kube.list(kinds.PODS, NS, label_selector={"app": "agent"}))[0]
    return {p["spec"]["containers"][0]["image"] for p in items if not p["metadata"].get("deletionTimestamp")}


async def on_both_nodes(kube: KubeClient, image: str) -> bool:
    items = (await kube.list(kinds.PODS, NS, label_selector={"app": "agent"}))[0]
    live = [p for p in items if not p["metadata"].get("deletionTimestamp")]
    return len(live) == 2 and all(
        p["spec"]["containers"][0]["image"] == image and p["status"].get("phase") == "Running" for p in live
    )


async def test_rollout_status_history_undo_and_restart_work_on_a_daemon_set(cluster: tuple[KubeClient, Path]) -> None:
    kube, config = cluster
    await kubectl(config, "apply", "-f", "-", stdin=MANIFEST.format(cause="first", image="registry.example/agent:1"))
    out = await kubectl(config, "rollout", "status", "daemonset/agent", "--timeout=60s")
    assert 'daemon set "agent" successfully rolled out' in out

    await kubectl(config, "apply", "-f", "-", stdin=MANIFEST.format(cause="second", image="registry.example/agent:2"))
    out = await kubectl(config, "rollout", "status", "ds/agent", "--timeout=60s")
    assert 'daemon set "agent" successfully rolled out' in out
    assert await images(kube) == {"registry.example/agent:2"}

    history = await kubectl(config, "rollout", "history", "ds/agent")
    rows = [line.split() for line in history.splitlines()[2:] if line.strip()]
    assert rows == [["1", "first"], ["2", "second"]]
    detail = await kubectl(config, "rollout", "history", "ds/agent", "--revision=1")
    assert "registry.example/agent:1" in detail and "registry.example/agent:2" not in detail

    out = await kubectl(config, "rollout", "undo", "ds/agent")
    assert "daemonset.apps/agent rolled back" in out
    await until(lambda: on_both_nodes(kube, "registry.example/agent:1"), "back on the first image", within=30)
    history = await kubectl(config, "rollout", "history", "ds/agent")
    assert [line.split()[0] for line in history.splitlines()[2:] if line.strip()] == ["2", "3"]

    out = await kubectl(config, "rollout", "undo", "ds/agent", "--to-revision=2")
    assert "daemonset.apps/agent rolled back" in out
    await until(lambda: on_both_nodes(kube, "registry.example/agent:2"), "on the second image again", within=30)

    before = {p["metadata"]["uid"] for p in (await kube.list(kinds.PODS, NS))[0]}
    out = await kubectl(config, "rollout", "restart", "ds/agent")
    assert "daemonset.apps/agent restarted" in out
    ds = await kube.get(kinds.DAEMON_SETS, "agent", NS)
    assert "kubectl.kubernetes.io/restartedAt" in ds["spec"]["template"]["metadata"]["annotations"]
    out = await kubectl(config, "rollout", "status", "ds/agent", "--timeout=60s")
    assert 'daemon set "agent" successfully rolled out' in out

    async def replaced() -> bool:
        items = (await kube.list(kinds.PODS, NS, label_selector={"app": "agent"}))[0]
        live = [p for p in items if not p["metadata"].get("deletionTimestamp")]
        return len(live) == 2 and not ({p["metadata"]["uid"] for p in live} & before)

    assert await until(replaced, "every pod replaced by the restart", within=30)
    listing = await kubectl(config, "get", "controllerrevisions")
    assert listing.split()[:4] == ["NAME", "CONTROLLER", "REVISION", "AGE"]
    assert "daemonset.apps/agent" in listing


async def test_kubectl_finds_priority_classes_and_disruption_budgets_by_short_name(
    cluster: tuple[KubeClient, Path],
) -> None:
    _, config = cluster
    listing = (await kubectl(config, "get", "pc")).splitlines()
    assert listing[0].split() == ["NAME", "VALUE", "GLOBAL-DEFAULT", "AGE", "PREEMPTIONPOLICY"]
    rows = {line.split()[0]: line.split() for line in listing[1:]}
    assert rows["system-node-critical"][1:3] == ["2000001000", "false"]
    assert rows["system-cluster-critical"][-1] == "PreemptLowerPriority"
    pdb = "apiVersion: policy/v1\nkind: PodDisruptionBudget\nmetadata: {name: web, namespace: default}\n"
    pdb += "spec: {maxUnavailable: 1, selector: {matchLabels: {app: web}}}\n"
    await kubectl(config, "apply", "-f", "-", stdin=pdb)
    listing = (await kubectl(config, "get", "pdb")).splitlines()
    assert listing[0].split() == ["NAME", "MIN", "AVAILABLE", "MAX", "UNAVAILABLE", "ALLOWED", "DISRUPTIONS", "AGE"]
    assert listing[1].split()[:4] == ["web", "N/A", "1", "0"]
