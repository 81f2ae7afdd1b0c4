"""The cluster view reads Nodes for the pods' locality (issue 24): a topology label change is translated again, a
Node status heartbeat is not; a Service's traffic distribution follows its spec and its namespace's annotation. An
in-process embedded API server; the real informers and translation."""

from __future__ import annotations

import asyncio
from collections.abc import Callable
from pathlib import Path

from ambit.apiserver.server import ApiServer, ApiServerSettings
from ambit.controlplane.view import ClusterView, ClusterViewSettings
from ambit.k8s import KubeClient, kinds
from ambit.model.localconfig import LocalConfig
from ambit.model.workload import LoadBalancingMode, Locality, RoutingScope, Service


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


async def test_a_services_traffic_distribution_follows_its_spec_and_its_namespaces_annotation(tmp_path: Path) -> None:
    configs: list[LocalConfig] = []
    close = (RoutingScope.NETWORK, RoutingScope.REGION, RoutingScope.ZONE)
    async with (
        ApiServer(ApiServerSettings(data_dir=tmp_path / "api", port=0, crd_dir=None)) as server,
        KubeClient.from_kubeconfig(server.kubeconfig) as client,
    ):
        await client.create(kinds.NAMESPACES, {"metadata": {"name": "shop"}})
        ports = [{"port": 80, "targetPort": 8080}]
        await client.create(
            kinds.SERVICES, {"metadata": {"name": "web", "namespace": "shop"}, "spec": {"ports": ports}}
        )
        spec = {"ports": ports, "trafficDistribution": "PreferClose", "internalTrafficPolicy": "Cluster"}
        await client.create(kinds.SERVICES, {"metadata": {"name": "near", "namespace": "shop"}, "spec": spec})

        def service(name: str) -> Service:
            return next(s for s in configs[-1].services if s.name == name)

        async with ClusterView(client, ClusterViewSettings(debounce=0.05, sync_timeout=10), configs.append):
            await _until(lambda: bool(configs) and {s.name for s in configs[-1].services} == {"web", "near"})
            assert (service("near").load_balancing_mode, service("near").routing_preference) == (
                LoadBalancingMode.FAILOVER,
                close,
            )
            assert service("web").routing_preference == ()
            # The namespace's annotation reaches the Service that says nothing itself, not the one whose spec does.
            annotations = {"networking.istio.io/traffic-distribution": "PreferSameNode"}
            await client.patch(kinds.NAMESPACES, "shop", {"metadata": {"annotations": annotations}})
            await _until(lambda: service("web").routing_preference[-1:] == (RoutingScope.NODE,))
            assert service("near").routing_preference == close
            # internalTrafficPolicy Local: only the client's node.
            await client.patch(kinds.SERVICES, "near", {"spec": {"internalTrafficPolicy": "Local"}}, namespace="shop")
            await _until(lambda: service("near").load_balancing_mode is LoadBalancingMode.STRICT)
            assert service("near").routing_preference == (RoutingScope.NODE,)
