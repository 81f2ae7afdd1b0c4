"""Builders of workloads, services and workload states for the unit tests of the data path's decisions."""

from __future__ import annotations

import dataclasses
import ipaddress
from collections.abc import Sequence

from ambit.model.state import WorkloadState
from ambit.model.workload import (
    GatewayAddress,
    IPAddress,
    NamespacedHostname,
    NetworkAddress,
    PortMapping,
    Service,
    TunnelProtocol,
    Workload,
)

WEB_KEY = "apps/web.apps.svc.cluster.local"
VIP = ipaddress.ip_address("198.19.0.10")
VIP6 = ipaddress.ip_address("fd00:19::10")
WAYPOINT_HOST = "waypoint.apps.svc.cluster.local"
WAYPOINT_KEY = f"apps/{WAYPOINT_HOST}"
WAYPOINT_VIP = ipaddress.ip_address("198.19.0.20")
WAYPOINT_VIP6 = ipaddress.ip_address("fd00:19::20")
WAYPOINT_BY_HOST = GatewayAddress(NamespacedHostname("apps", WAYPOINT_HOST))
"""The waypoint ``apps/waypoint`` named as istiod names it: by its Service's hostname."""


def ip(text: str) -> IPAddress:
    return ipaddress.ip_address(text)


def pod(
    name: str,
    *addresses: str,
    services: dict[str, tuple[PortMapping, ...]] | None = None,
    **overrides: object,
) -> Workload:
    workload = Workload(
        uid=f"Kubernetes//Pod/apps/{name}",
        name=name,
        namespace="apps",
        addresses=tuple(ip(a) for a in addresses),
        tunnel_protocol=TunnelProtocol.HBONE,
        service_account="web",
        node="node1",
        services=services if services is not None else {WEB_KEY: ()},
    )
    return dataclasses.replace(workload, **overrides)  # type: ignore[arg-type]


def web_service(**overrides: object) -> Service:
    service = Service(
        name="web",
        namespace="apps",
        hostname="web.apps.svc.cluster.local",
        vips=(NetworkAddress("", VIP), NetworkAddress("", VIP6)),
        ports=(PortMapping(80, 8080), PortMapping(9090, 0)),
    )
    return dataclasses.replace(service, **overrides)  # type: ignore[arg-type]


def first(candidates: Sequence[Workload]) -> Workload:
    return candidates[0]


def state_with(*workloads: Workload, services: Sequence[Service] = ()) -> WorkloadState:
    state = WorkloadState()
    state.replace_all(workloads, services or [web_service()])
    return state


def by_address(text: str, port: int = 15008) -> GatewayAddress:
    """A waypoint named by an address (a pod IP or a VIP), as ``GatewayAddress.address``."""
    return GatewayAddress(NetworkAddress("", ip(text)), port)


def waypoint_pod(name: str = "waypoint-0", *addresses: str, **overrides: object) -> Workload:
    """An instance of waypoint ``apps/waypoint`` (service account ``waypoint``), on node1, not captured."""
    fields: dict[str, object] = {
        "services": {WAYPOINT_KEY: ()},
        "service_account": "waypoint",
        "tunnel_protocol": TunnelProtocol.NONE,
    }
    return pod(name, *(addresses or ("198.18.18.7",)), **{**fields, **overrides})  # type: ignore[arg-type]


def waypoint_service(**overrides: object) -> Service:
    """The waypoint's Service, as the gateway controller makes it: one port, 15008 (HBONE)."""
    service = Service(
        name="waypoint",
        namespace="apps",
        hostname=WAYPOINT_HOST,
        vips=(NetworkAddress("", WAYPOINT_VIP), NetworkAddress("", WAYPOINT_VIP6)),
        ports=(PortMapping(15008, 15008),),
    )
    return dataclasses.replace(service, **overrides)  # type: ignore[arg-type]
