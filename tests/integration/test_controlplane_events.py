"""The control plane records a Warning Event for each object its translation has to leave out, once per problem.

A real API server (subprocess) and the real control plane (xDS on an ephemeral loopback port, no webhook). Each
test works in its own namespace. The last test checks that the cluster view goes on without the ServiceEntry and
WorkloadEntry kinds when the API server does not serve them (no CRDs installed).
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest
from tests.integration.controlplane_rig import eventually

from ambit.apiserver.server import ApiServer, ApiServerSettings
from ambit.controlplane.process import SKIPPED_REASON, ControlPlane
from ambit.controlplane.view import ClusterView, ClusterViewSettings
from ambit.k8s import KubeClient, kinds
from ambit.model.localconfig import LocalConfig

Obj = dict[str, Any]


@pytest.fixture
def plane_options() -> dict[str, Any]:
    return {"instance": "cp-test"}


async def skip_events(kube: KubeClient, namespace: str, name: str) -> list[Obj]:
    events = (await kube.list(kinds.EVENTS, namespace))[0]
    return [e for e in events if e.get("reason") == SKIPPED_REASON and e["regarding"].get("name") == name]


def service_entry(name: str, namespace: str, **spec: Any) -> Obj:
    return {
        "apiVersion": "networking.istio.io/v1",
        "kind": "ServiceEntry",
        "metadata": {"name": name, "namespace": namespace},
        "spec": spec,
    }


async def test_a_service_entry_without_hosts_gets_one_warning_event_naming_the_field(
    kube: KubeClient, namespace: str, plane: ControlPlane
) -> None:
    created = await kube.create(
        kinds.SERVICE_ENTRIES,
        service_entry("no-hosts", namespace, resolution="STATIC", ports=[{"number": 80, "name": "http"}]),
    )
    [event] = await eventually(lambda: skip_events(kube, namespace, "no-hosts"))
    assert event["type"] == "Warning" and event["action"] == "Translate"
    assert event["reportingController"] == "ambit.dev/controlplane" and event["reportingInstance"] == "cp-test"
    assert event["note"].startswith("left out of the workload API: spec.hosts: required")
    assert event["regarding"]["kind"] == "ServiceEntry" and event["regarding"]["apiVersion"] == "networking.istio.io/v1"
    assert event["regarding"]["uid"] == created["metadata"]["uid"]

    # Later translations (another object changes) still skip it, but do not report it again.
    pushes = plane.pushes
    good = service_entry("ok", namespace, hosts=["ok.example"], resolution="STATIC", ports=[{"number": 80}])
    good["spec"]["endpoints"] = [{"address": "198.18.210.7"}]
    await kube.create(kinds.SERVICE_ENTRIES, good)
    await eventually(lambda: plane.pushes > pushes)
    await plane.events.flush()
    [again] = await skip_events(kube, namespace, "no-hosts")
    assert "series" not in again
    assert f"Kubernetes/networking.istio.io/ServiceEntry/{namespace}/ok/198.18.210.7" in plane.table.current.by_name


async def test_a_problem_that_goes_away_and_comes_back_is_reported_again(
    kube: KubeClient, namespace: str, plane: ControlPlane
) -> None:
    entry = {
        "apiVersion": "networking.istio.io/v1",
        "kind": "WorkloadEntry",
        "metadata": {"name": "vm", "namespace": namespace},
        "spec": {"address": "vm_1!.example.com"},  # neither an IP nor a DNS name
    }
    await kube.create(kinds.WORKLOAD_ENTRIES, entry)
    [event] = await eventually(lambda: skip_events(kube, namespace, "vm"))
    assert "spec.address" in event["note"] and "vm_1!.example.com" in event["note"]

    uid = f"Kubernetes/networking.istio.io/WorkloadEntry/{namespace}/vm"
    await kube.patch(kinds.WORKLOAD_ENTRIES, "vm", {"spec": {"address": "198.18.210.8"}}, namespace=namespace)
    await eventually(lambda: uid in plane.table.current.by_name)
    await kube.patch(kinds.WORKLOAD_ENTRIES, "vm", {"spec": {"address": "vm_1!.example.com"}}, namespace=namespace)

    async def reported_twice() -> bool:
        events = await skip_events(kube, namespace, "vm")
        return sum((e.get("series") or {}).get("count", 1) for e in events) == 2

    await eventually(reported_twice)
    assert uid not in plane.table.current.by_name


async def test_the_cluster_view_goes_on_without_the_istio_kinds_when_their_crds_are_missing(tmp_path: Path) -> None:
    configs: list[LocalConfig] = []
    async with (
        ApiServer(ApiServerSettings(data_dir=tmp_path / "api", port=0, crd_dir=None)) as server,
        KubeClient.from_kubeconfig(server.kubeconfig) as client,
    ):
        pod = {
            "metadata": {"name": "web", "namespace": "default"},
            "spec": {"nodeName": "node-1", "containers": [{"name": "app", "image": "app"}]},
        }
        created = await client.create(kinds.PODS, pod)
        status = {"phase": "Running", "podIP": "198.18.210.9", "conditions": [{"type": "Ready", "status": "True"}]}
        await client.patch_status(kinds.PODS, "web", {"status": status}, namespace="default")
        view = ClusterView(client, ClusterViewSettings(debounce=0.05, sync_timeout=10), configs.append)
        async with view:
            assert view.absent == {
                "listenersets",
                "xlistenersets",
                "serviceentries",
                "envoyfilters",
                "workloadentries",
                "authorizationpolicies",
                "peerauthentications",
                "requestauthentications",
                "telemetries",
                "virtualservices",
                "destinationrules",
                "gateways",
                "gatewayclasses",
                "httproutes",
                "grpcroutes",
                "tcproutes",
                "tlsroutes",
                "referencegrants",
                "backendtlspolicies",
                "gateways.networking.istio.io",
            }
            assert [w.name for w in configs[0].workloads] == ["web"]
        assert created["metadata"]["uid"]
