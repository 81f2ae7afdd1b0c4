"""The cluster view reads Nodes for the pods' locality (issue 24): a topology label change is translated again, a
Node status heartbeat is not. An in-process embedded API server; the real informers and translation."""

from __future__ import annotations

import asyncio
from collections.abc import Callable
from pathlib import Path

from ambit.apiserver.server import ApiServer, ApiServerSettings
from ambit.controlplane.view import ClusterView, ClusterViewSettings
from ambit.k8s import KubeClient, kinds
from ambit.model.localconfig import LocalConfig
from ambit.model.workload import Locality


async def _until(condition: Callable[[], bool], within: float = 10.0) -> None:
    deadline = asyncio.get_running_loop().time() + within
    while not condition():
        assert asyncio.get_running_loop().time() < deadline, "condition not met in time"
        await asyncio.sleep(0.02)


async def test_pods_take_their_nodes_locality_and_follow_label_changes_but_not_heartbeats(tmp_path: Path) -> None:
    configs: list[LocalConfig] = []
    async with (
        ApiServer(ApiServerSettings(data_dir=tmp_path / "api", port=0, crd_dir=None)) as server,
        KubeClient.from_kubeconfig(server.kubeconfig) as client,
    ):
        labels = {"topology.kubernetes.io/region": "us-east", "topology.kubernetes.io/zone": "us-east-1a"}
        await client.create(kinds.NODES, {"metadata": {"name": "node-1", "labels": labels}})
        pod = {
            "metadata": {"name": "web", "namespace": "default"},
            "spec": {"nodeName": "node-1", "containers": [{"name": "app", "image": "app"}]},
        }
        await client.create(kinds.PODS, pod)
        status = {"phase": "Running", "podIP": "198.18.210.9", "conditions": [{"type": "Ready", "status": "True"}]}
        await client.patch_status(kinds.PODS, "web", {"status": status}, namespace="default")
        async with ClusterView(client, ClusterViewSettings(debounce=0.05, sync_timeout=10), configs.append) as view:
            assert "nodes" not in view.absent
            (web,) = configs[-1].workloads
            assert web.locality == Locality("us-east", "us-east-1a", "")

            # A heartbeat (status only) is not a reason to translate again ...
            heartbeat = {"status": {"conditions": [{"type": "Ready", "status": "True", "reason": "KubeletReady"}]}}
            seen = await client.patch_status(kinds.NODES, "node-1", heartbeat)
            version = seen["metadata"]["resourceVersion"]
            await _until(lambda: view.items("nodes")[0]["metadata"]["resourceVersion"] == version)
            # The mark is set synchronously by the informer's callback; ten debounces let a translation show.
            await asyncio.sleep(0.5)
            assert len(configs) == 1
            # ... a subzone label is: the pod's locality follows.
            await client.patch(kinds.NODES, "node-1", {"metadata": {"labels": {"topology.istio.io/subzone": "rack-7"}}})
            await _until(lambda: configs[-1].workloads[0].locality.subzone == "rack-7")
            assert len(configs) == 2, "one translation for the label change, none for the heartbeat"
