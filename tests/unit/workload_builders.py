"""Builders of workloads, services and workload states for the unit tests of the data path's decisions."""

from __future__ import annotations

import dataclasses
import ipaddress
from collections.abc import Sequence

from ambit.model.state import WorkloadState
from ambit.model.workload import IPAddress, NetworkAddress, PortMapping, Service, TunnelProtocol, Workload

WEB_KEY = "apps/web.apps.svc.cluster.local"
VIP = ipaddress.ip_address("198.19.0.10")
VIP6 = ipaddress.ip_address("fd00:19::10")


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
