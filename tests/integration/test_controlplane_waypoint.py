"""Waypoint binding through the real control plane: a namespace labelled ``istio.io/use-waypoint`` gives a pod's
Workload and its Service the ``waypoint`` field over delta ADS, and the Service the ``istio.io/WaypointBound``
condition; removing the label clears both.

A real API server (subprocess, the CRDs installed), the real control plane (xDS on an ephemeral loopback port, no
webhook) and the node proxy's own xDS client (:class:`ambit.xds.client.XdsClient`) with a real service-account
token, so the waypoint field is checked as the node proxy decodes it.
"""

from __future__ import annotations

import ipaddress
import secrets
from collections.abc import AsyncIterator
from pathlib import Path
from typing import Any

import pytest
from tests.integration.controlplane_rig import eventually, make_pod

from ambit.controlplane.process import ControlPlane
from ambit.k8s import KubeClient, kinds
from ambit.model.state import WorkloadState
from ambit.model.workload import GatewayAddress, NamespacedHostname, NetworkAddress, WeightedWaypoint
from ambit.xds.client import Backoff, XdsClient

Obj = dict[str, Any]
BOUND = "istio.io/WaypointBound"


@pytest.fixture
def plane_options() -> dict[str, Any]:
    # The Gateways' addresses are written by the test, as a deployed waypoint's would be: no deployment controller.
    return {"deploy_waypoints": False}


@pytest.fixture
async def state(kube: KubeClient, plane: ControlPlane, tmp_path: Path) -> AsyncIterator[WorkloadState]:
    assert plane.root is not None and plane.server is not None
    token = await kube.create_token("istio-system", "ztunnel", audiences=["istio-ca"])
    (tmp_path / "token").write_text(token["status"]["token"])
    (tmp_path / "root.pem").write_bytes(plane.root.root_pem)
    workloads = WorkloadState()
    client = XdsClient(
        f"127.0.0.1:{plane.server.port}",
        workloads,
        lambda: None,
        root_cert_file=tmp_path / "root.pem",
        token_file=tmp_path / "token",
        cluster_id="Kubernetes",
        backoff=Backoff(initial=0.05, maximum=0.3),
    )
    await client.start()
    try:
        await eventually(lambda: client.synced)
        yield workloads
    finally:
        await client.aclose()


def bound_condition(obj: Obj) -> Obj | None:
    return next((c for c in (obj.get("status") or {}).get("conditions") or () if c.get("type") == BOUND), None)


async def test_a_namespace_waypoint_label_binds_pods_and_services_and_removing_it_unbinds(
    kube: KubeClient, plane: ControlPlane, state: WorkloadState
) -> None:
    ns = f"wp-{secrets.token_hex(3)}"
    pod_ip = f"198.18.{secrets.randbelow(200) + 20}.{secrets.randbelow(200) + 20}"
    await kube.create(kinds.NAMESPACES, {"metadata": {"name": ns}})
    gateway = {
        "apiVersion": "gateway.networking.k8s.io/v1",
        "kind": "Gateway",
        "metadata": {"name": "waypoint", "namespace": ns, "labels": {"istio.io/waypoint-for": "all"}},
        "spec": {
            "gatewayClassName": "istio-waypoint",
            "listeners": [{"name": "mesh", "port": 15008, "protocol": "HBONE"}],
        },
    }
    await kube.create(kinds.GATEWAYS, gateway, ns)
    hostname = f"waypoint.{ns}.svc.cluster.local"
    await kube.patch_status(
        kinds.GATEWAYS, "waypoint", {"status": {"addresses": [{"type": "Hostname", "value": hostname}]}}, ns
    )
    await kube.create(
        kinds.SERVICES,
        {"metadata": {"name": "web", "namespace": ns}, "spec": {"selector": {"app": "web"}, "ports": [{"port": 80}]}},
        ns,
    )
    await make_pod(kube, ns, "web-1", pod_ip, {"app": "web"})
    uid = f"Kubernetes//Pod/{ns}/web-1"
    service_host = f"web.{ns}.svc.cluster.local"
    await eventually(lambda: state.find_workload(uid) is not None and state.find_service_by_hostname(service_host))
    workload, service = state.find_workload(uid), state.find_service_by_hostname(service_host)
    assert workload is not None and workload.waypoint is None
    assert service is not None and service.waypoint is None

    # The namespace opts in: the pod (waypoint-for all) and the Service both point at the waypoint.
    await kube.patch(kinds.NAMESPACES, ns, {"metadata": {"labels": {"istio.io/use-waypoint": "waypoint"}}})
    expected = GatewayAddress(NamespacedHostname(ns, hostname), 15008)

    def bound() -> bool:
        w, s = state.find_workload(uid), state.find_service_by_hostname(service_host)
        return w is not None and w.waypoint == expected and s is not None and s.waypoint == expected

    await eventually(bound)
    found = state.find_workload_by_address("", ipaddress.ip_address(pod_ip))
    assert found is not None and found.waypoint == expected

    async def condition() -> Obj | None:
        obj = await kube.get(kinds.SERVICES, "web", ns)
        return obj if bound_condition(obj) else None

    svc = await eventually(condition)
    written = bound_condition(svc)
    assert written is not None
    assert (written["status"], written["reason"], written["message"]) == (
        "True",
        "WaypointAccepted",
        f"Successfully attached to waypoint {ns}/waypoint",
    )
    assert written["lastTransitionTime"]

    # No status loop: another translation (a second pod) leaves the Service as it is.
    version, pushes, writes = svc["metadata"]["resourceVersion"], plane.pushes, plane.service_status.writes
    await make_pod(kube, ns, "web-2", f"{pod_ip.rsplit('.', 1)[0]}.250", {"app": "web"})
    await eventually(lambda: plane.pushes > pushes and state.find_workload(f"Kubernetes//Pod/{ns}/web-2"))
    assert (await kube.get(kinds.SERVICES, "web", ns))["metadata"]["resourceVersion"] == version
    assert plane.service_status.writes == writes

    # The label goes: the field is cleared on the wire and the condition is removed.
    await kube.patch(kinds.NAMESPACES, ns, {"metadata": {"labels": {"istio.io/use-waypoint": None}}})

    def unbound() -> bool:
        w, s = state.find_workload(uid), state.find_service_by_hostname(service_host)
        return w is not None and w.waypoint is None and s is not None and s.waypoint is None

    await eventually(unbound)

    async def condition_gone() -> bool:
        return bound_condition(await kube.get(kinds.SERVICES, "web", ns)) is None

    await eventually(condition_gone)


async def test_a_label_naming_a_missing_waypoint_leaves_the_field_unset_until_the_waypoint_gets_an_address(
    kube: KubeClient, plane: ControlPlane, state: WorkloadState
) -> None:
    ns = f"wp-{secrets.token_hex(3)}"
    await kube.create(kinds.NAMESPACES, {"metadata": {"name": ns}})
    await kube.create(
        kinds.SERVICES,
        {
            "metadata": {"name": "web", "namespace": ns, "labels": {"istio.io/use-waypoint": "nowhere"}},
            "spec": {"selector": {"app": "web"}, "ports": [{"port": 80}]},
        },
        ns,
    )

    async def condition() -> Obj | None:
        return bound_condition(await kube.get(kinds.SERVICES, "web", ns))

    written = await eventually(condition)
    assert (written["status"], written["reason"], written["message"]) == (
        "False",
        "WaypointIsNotReady",
        f'waypoint "{ns}/nowhere" is not ready',
    )
    service = await eventually(lambda: state.find_service_by_hostname(f"web.{ns}.svc.cluster.local"))
    assert service.waypoint is None

    # The Gateway appears, still without an address: not ready yet. Its status gets one: bound.
    gateway = {
        "apiVersion": "gateway.networking.k8s.io/v1",
        "kind": "Gateway",
        "metadata": {"name": "nowhere", "namespace": ns},
        "spec": {
            "gatewayClassName": "istio-waypoint",
            "listeners": [{"name": "mesh", "port": 15008, "protocol": "HBONE"}],
        },
    }
    await kube.create(kinds.GATEWAYS, gateway, ns)
    await kube.patch_status(
        kinds.GATEWAYS, "nowhere", {"status": {"addresses": [{"type": "IPAddress", "value": "198.19.77.7"}]}}, ns
    )

    async def accepted() -> Obj | None:
        found = bound_condition(await kube.get(kinds.SERVICES, "web", ns))
        return found if found and found["status"] == "True" else None

    assert (await eventually(accepted))["reason"] == "WaypointAccepted"
    expected = GatewayAddress(NetworkAddress.parse("/198.19.77.7"), 15008)

    def bound() -> bool:
        found = state.find_service_by_hostname(f"web.{ns}.svc.cluster.local")
        return found is not None and found.waypoint == expected

    await eventually(bound)


async def test_a_canary_label_and_weight_give_the_service_a_weighted_set_and_a_bad_weight_is_reported(
    kube: KubeClient, plane: ControlPlane, state: WorkloadState
) -> None:
    ns = f"canary-{secrets.token_hex(3)}"
    await kube.create(kinds.NAMESPACES, {"metadata": {"name": ns}})
    addresses: dict[str, GatewayAddress] = {}
    for name in ("primary", "canary"):
        gateway = {
            "apiVersion": "gateway.networking.k8s.io/v1",
            "kind": "Gateway",
            "metadata": {"name": name, "namespace": ns},
            "spec": {
                "gatewayClassName": "istio-waypoint",
                "listeners": [{"name": "mesh", "port": 15008, "protocol": "HBONE"}],
            },
        }
        await kube.create(kinds.GATEWAYS, gateway, ns)
        hostname = f"{name}.{ns}.svc.cluster.local"
        await kube.patch_status(
            kinds.GATEWAYS, name, {"status": {"addresses": [{"type": "Hostname", "value": hostname}]}}, ns
        )
        addresses[name] = GatewayAddress(NamespacedHostname(ns, hostname), 15008)
    labels = {"istio.io/use-waypoint": "primary", "istio.io/use-waypoint-canary": "canary"}
    web = {
        "metadata": {
            "name": "web",
            "namespace": ns,
            "labels": labels,
            "annotations": {"istio.io/use-waypoint-canary-weight": "30"},
        },
        "spec": {"selector": {"app": "web"}, "ports": [{"port": 80}]},
    }
    await kube.create(kinds.SERVICES, web, ns)
    service_host = f"web.{ns}.svc.cluster.local"
    split = (WeightedWaypoint(addresses["primary"], 70), WeightedWaypoint(addresses["canary"], 30))

    def weighted(expected: tuple[WeightedWaypoint, ...]) -> bool:
        s = state.find_service_by_hostname(service_host)
        return s is not None and s.waypoint == addresses["primary"] and s.weighted_waypoints == expected

    await eventually(lambda: weighted(split))

    async def condition(message: str) -> bool:
        written = bound_condition(await kube.get(kinds.SERVICES, "web", ns))
        return written is not None and (written["status"], written["reason"], written["message"]) == (
            "True",
            "WaypointAccepted",
            message,
        )

    await eventually(lambda: condition(f"Successfully attached to waypoint {ns}/primary"))

    # A weight that is not a percentage: the primary alone, and the condition says why.
    annotations = {"metadata": {"annotations": {"istio.io/use-waypoint-canary-weight": "half"}}}
    await kube.patch(kinds.SERVICES, "web", annotations, ns)
    await eventually(lambda: weighted(()))
    await eventually(
        lambda: condition(
            f"Successfully attached to waypoint {ns}/primary. Canary waypoint not attached: canary waypoint"
            f' "{ns}/canary" has an invalid weight; must be an integer in [0,100]'
        )
    )


async def test_moving_the_label_between_waypoints_and_to_none_moves_the_fields_and_a_deleted_waypoint_unbinds(
    kube: KubeClient, plane: ControlPlane, state: WorkloadState
) -> None:
    """Istio's TestRemoveAddWaypoint/TestBogusUseWaypoint label steps on the wire: the namespace label moved from
    w1 to w2 moves the pod and the Service; ``none`` on the pod opts it out; the Service's own label wins over the
    namespace's; deleting the waypoint it names leaves it unbound (not stale) with WaypointIsNotReady; removing
    its label returns it to the namespace's waypoint."""
    ns = f"wp-{secrets.token_hex(3)}"
    pod_ip = f"198.18.{secrets.randbelow(200) + 20}.{secrets.randbelow(200) + 20}"
    await kube.create(kinds.NAMESPACES, {"metadata": {"name": ns, "labels": {"istio.io/use-waypoint": "w1"}}})
    address: dict[str, GatewayAddress] = {}
    for name in ("w1", "w2"):
        gateway = {
            "apiVersion": "gateway.networking.k8s.io/v1",
            "kind": "Gateway",
            "metadata": {"name": name, "namespace": ns, "labels": {"istio.io/waypoint-for": "all"}},
            "spec": {
                "gatewayClassName": "istio-waypoint",
                "listeners": [{"name": "mesh", "port": 15008, "protocol": "HBONE"}],
            },
        }
        await kube.create(kinds.GATEWAYS, gateway, ns)
        hostname = f"{name}.{ns}.svc.cluster.local"
        status = {"status": {"addresses": [{"type": "Hostname", "value": hostname}]}}
        await kube.patch_status(kinds.GATEWAYS, name, status, ns)
        address[name] = GatewayAddress(NamespacedHostname(ns, hostname), 15008)
    service = {
        "metadata": {"name": "web", "namespace": ns},
        "spec": {"selector": {"app": "web"}, "ports": [{"port": 80}]},
    }
    await kube.create(kinds.SERVICES, service, ns)
    await make_pod(kube, ns, "web-1", pod_ip, {"app": "web"})
    uid, host = f"Kubernetes//Pod/{ns}/web-1", f"web.{ns}.svc.cluster.local"

    async def fields_become(pod: str | None, svc: str | None) -> None:
        def now() -> bool:
            w, s = state.find_workload(uid), state.find_service_by_hostname(host)
            return (
                w is not None
                and s is not None
                and w.waypoint == (address[pod] if pod else None)
                and s.waypoint == (address[svc] if svc else None)
            )

        await eventually(now)

    async def label(kind: Any, name: str, value: str | None) -> None:
        patch = {"metadata": {"labels": {"istio.io/use-waypoint": value}}}
        await kube.patch(kind, name, patch, None if kind is kinds.NAMESPACES else ns)

    await fields_become("w1", "w1")
    await label(kinds.NAMESPACES, ns, "w2")
    await fields_become("w2", "w2")
    await label(kinds.PODS, "web-1", "none")
    await fields_become(None, "w2")
    await label(kinds.SERVICES, "web", "w1")
    await fields_become(None, "w1")
    await kube.delete(kinds.GATEWAYS, "w1", ns)
    await fields_become(None, None)

    async def not_ready() -> Obj | None:
        written = bound_condition(await kube.get(kinds.SERVICES, "web", ns))
        return written if written and written["reason"] == "WaypointIsNotReady" else None

    written = await eventually(not_ready)
    assert written["status"] == "False", written
    await label(kinds.SERVICES, "web", None)
    await fields_become(None, "w2")
