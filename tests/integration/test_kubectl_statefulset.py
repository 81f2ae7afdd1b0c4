"""The real kubectl against the embedded API server on a StatefulSet: ``apply``, ``get sts`` (the server's table),
``scale``, ``rollout status|restart|history|undo``, with the lab's controllers and a stand-in kubelet running in
the test's event loop."""

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
apiVersion: v1
kind: Service
metadata: {{name: web, namespace: default}}
spec:
  clusterIP: None
  selector: {{app: web}}
  ports: [{{name: http, port: 80}}]
---
apiVersion: apps/v1
kind: StatefulSet
metadata:
  name: web
  namespace: default
  annotations:
    kubernetes.io/change-cause: "{cause}"
spec:
  serviceName: web
  replicas: {replicas}
  selector:
    matchLabels: {{app: web}}
  template:
    metadata:
      labels: {{app: web}}
    spec:
      containers:
      - name: web
        image: {image}
"""


@pytest.fixture
async def cluster(apiserver: ApiServer) -> AsyncIterator[tuple[KubeClient, Path]]:
    async with (
        KubeClient.from_kubeconfig(apiserver.kubeconfig) as kube,
        ControllerManager(kube, settings(disruption=False)),
        Kubelet(kube),
    ):
        await add_node(kube, "node-a")
        yield kube, apiserver.kubeconfig


async def images(kube: KubeClient) -> dict[str, str]:
    items = (await kube.list(kinds.PODS, NS, label_selector={"app": "web"}))[0]
    return {
        p["metadata"]["name"]: p["spec"]["containers"][0]["image"]
        for p in items
        if not p["metadata"].get("deletionTimestamp") and p["status"].get("phase") == "Running"
    }


async def test_apply_get_scale_and_rollout_status_of_a_stateful_set(cluster: tuple[KubeClient, Path]) -> None:
    kube, config = cluster
    out = await kubectl(
        config, "apply", "-f", "-", stdin=MANIFEST.format(cause="first", replicas=3, image="registry.example/web:1")
    )
    assert "statefulset.apps/web created" in out
    out = await kubectl(config, "rollout", "status", "statefulset/web", "--timeout=60s")
    # partition is defaulted to 0, so kubectl reports a partitioned rollout, as it does against kube.
    assert "partitioned roll out complete: 3 new pods have been updated" in out

    table = (await kubectl(config, "get", "sts")).splitlines()
    assert table[0].split() == ["NAME", "READY", "AGE"]
    assert table[1].split()[:2] == ["web", "3/3"]
    wide = (await kubectl(config, "get", "statefulsets", "-o", "wide")).splitlines()
    assert wide[0].split() == ["NAME", "READY", "AGE", "CONTAINERS", "IMAGES"]
    assert wide[1].split()[-2:] == ["web", "registry.example/web:1"]
    everything = await kubectl(config, "get", "all")
    assert "statefulset.apps/web" in everything

    out = await kubectl(config, "scale", "sts", "web", "--replicas=1")
    assert "statefulset.apps/web scaled" in out
    await until(lambda: _only(kube, {"web-0"}), "scaled down to web-0")
    out = await kubectl(config, "rollout", "status", "sts/web", "--timeout=60s")
    assert "partitioned roll out complete: 1 new pods have been updated" in out
    table = (await kubectl(config, "get", "sts", "web")).splitlines()
    assert table[1].split()[:2] == ["web", "1/1"]


async def _images_are(kube: KubeClient, want: dict[str, str]) -> bool:
    return await images(kube) == want


async def _only(kube: KubeClient, names: set[str]) -> bool:
    return set(await images(kube)) == names and len((await kube.list(kinds.PODS, NS))[0]) == len(names)


async def test_rollout_restart_history_and_undo_of_a_stateful_set(cluster: tuple[KubeClient, Path]) -> None:
    kube, config = cluster
    for cause, image in (("first", "registry.example/web:1"), ("second", "registry.example/web:2")):
        await kubectl(config, "apply", "-f", "-", stdin=MANIFEST.format(cause=cause, replicas=2, image=image))
        await kubectl(config, "rollout", "status", "sts/web", "--timeout=60s")
    assert await images(kube) == {"web-0": "registry.example/web:2", "web-1": "registry.example/web:2"}

    history = await kubectl(config, "rollout", "history", "sts/web")
    rows = [line.split() for line in history.splitlines()[2:] if line.strip()]
    assert rows == [["1", "first"], ["2", "second"]]

    out = await kubectl(config, "rollout", "undo", "sts/web")
    assert "statefulset.apps/web rolled back" in out
    out = await kubectl(config, "rollout", "status", "sts/web", "--timeout=60s")
    assert "partitioned roll out complete: 2 new pods have been updated" in out
    first = {"web-0": "registry.example/web:1", "web-1": "registry.example/web:1"}
    assert await until(lambda: _images_are(kube, first), "both pods back on the first image")
    history = await kubectl(config, "rollout", "history", "sts/web")
    assert [line.split()[0] for line in history.splitlines()[2:] if line.strip()] == ["2", "3"]

    before = {p["metadata"]["uid"] for p in (await kube.list(kinds.PODS, NS))[0]}
    out = await kubectl(config, "rollout", "restart", "sts/web")
    assert "statefulset.apps/web restarted" in out
    out = await kubectl(config, "rollout", "status", "sts/web", "--timeout=60s")
    assert "partitioned roll out complete: 2 new pods have been updated" in out

    async def replaced() -> bool:
        live = (await kube.list(kinds.PODS, NS, label_selector={"app": "web"}))[0]
        uids = {p["metadata"]["uid"] for p in live if not p["metadata"].get("deletionTimestamp")}
        return len(uids) == 2 and not (uids & before)

    assert await until(replaced, "both pods replaced by the restart", within=30)
    listing = await kubectl(config, "get", "controllerrevisions")
    assert "statefulset.apps/web" in listing
