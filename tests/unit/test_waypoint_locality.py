"""A waypoint (and an ingress gateway) picks a Service's endpoints close to itself when the Service has a traffic
distribution (ambit.waypoint.destinations' locality rules; istiod's forced failover priority)."""

from __future__ import annotations

import dataclasses
import ipaddress

from ambit.model.state import WorkloadState
from ambit.model.workload import (
    GatewayAddress,
    HealthStatus,
    LoadBalancingMode,
    Locality,
    NamespacedHostname,
    NetworkAddress,
    PortMapping,
    RoutingScope,
    Service,
    TunnelProtocol,
    Workload,
)
from ambit.waypoint.destinations import WaypointSelf, pick_endpoint, pick_ingress_endpoint

ECHO_KEY = "app/echo.app.svc.cluster.local"
WAYPOINT_HOST = "waypoint.app.svc.cluster.local"
CLOSE = (RoutingScope.NETWORK, RoutingScope.REGION, RoutingScope.ZONE)


def ip(text: str) -> ipaddress.IPv4Address | ipaddress.IPv6Address:
    return ipaddress.ip_address(text)


def workload(name: str, address: str, zone: str, node: str = "n", key: str = ECHO_KEY, **extra: object) -> Workload:
    return Workload(
        uid=f"Kubernetes//Pod/app/{name}",
        name=name,
        namespace="app",
        addresses=(ip(address),),
        tunnel_protocol=TunnelProtocol.HBONE,
        node=node,
        locality=Locality("reg", zone),
        services={key: (PortMapping(80, 8080),)},
        **extra,  # type: ignore[arg-type]
    )


def echo(mode: LoadBalancingMode = LoadBalancingMode.FAILOVER, preference: tuple[RoutingScope, ...] = CLOSE) -> Service:
    return Service(
        name="echo",
        namespace="app",
        hostname="echo.app.svc.cluster.local",
        vips=(NetworkAddress("", ip("198.19.1.1")),),
        ports=(PortMapping(80, 8080),),
        load_balancing_mode=mode,
        routing_preference=preference,
    )


ME = WaypointSelf("app", "waypoint", frozenset({ip("198.18.0.10"), ip("fd00::10")}))
ME_POD = workload("waypoint-0", "198.18.0.10", "zone-a", key=f"app/{WAYPOINT_HOST}")
# "a-far" sorts first by uid: without locality, first-choice picks it.
FAR = workload("a-far", "198.18.1.1", "zone-b", node="n2")
NEAR = workload("b-near", "198.18.1.2", "zone-a")


def first(candidates: object) -> Workload:
    return candidates[0]  # type: ignore[index, no-any-return]


def _state(*workloads: Workload, service: Service | None = None) -> WorkloadState:
    state = WorkloadState()
    state.replace_all([ME_POD, *workloads], [service or echo()])
    return state


def _picked(state: WorkloadState, service: Service | None = None, **kw: object) -> str | None:
    endpoint = pick_endpoint(state, service or echo(), 80, first, near=ME.own_workload(state), **kw)  # type: ignore[arg-type]
    return None if endpoint is None else endpoint.workload.name


def test_the_waypoint_finds_its_own_pod_by_its_address() -> None:
    assert ME.own_workload(_state()) == ME_POD
    assert ME.own_workload(WorkloadState()) is None


def test_the_endpoint_in_the_waypoints_zone_takes_the_request() -> None:
    state = _state(FAR, NEAR)
    assert _picked(state) == "b-near"
    assert pick_endpoint(state, echo(), 80, first).workload.name == "a-far"  # type: ignore[union-attr]
    assert _picked(state, echo(LoadBalancingMode.UNSPECIFIED, ())) == "a-far"


def test_requests_spill_over_when_the_close_endpoint_is_unhealthy_tried_or_outside_the_subset() -> None:
    state = _state(FAR, dataclasses.replace(NEAR, status=HealthStatus.UNHEALTHY))
    assert _picked(state) == "a-far"
    state = _state(FAR, NEAR)
    assert _picked(state, exclude=frozenset({NEAR.uid})) == "a-far"
    assert _picked(state, only=frozenset({FAR.uid})) == "a-far"


def test_internal_traffic_policy_local_keeps_only_endpoints_on_the_waypoints_node() -> None:
    strict = echo(LoadBalancingMode.STRICT, (RoutingScope.NODE,))
    state = _state(FAR, NEAR, service=strict)
    assert _picked(state, strict) == "b-near"
    assert _picked(_state(FAR, service=strict), strict) is None


def test_without_its_own_pod_in_the_state_the_waypoint_picks_among_all() -> None:
    state = WorkloadState()
    state.replace_all([FAR, NEAR], [echo()])
    assert _picked(state) == "a-far"


def test_an_ingress_gateway_picks_close_endpoints_and_the_close_waypoint_instance() -> None:
    assert pick_ingress_endpoint(_state(FAR, NEAR), echo(), 80, first, near=ME_POD).workload.name == "b-near"  # type: ignore[union-attr]
    waypoint = Service(
        name="waypoint",
        namespace="app",
        hostname=WAYPOINT_HOST,
        ports=(PortMapping(15008, 15008),),
        load_balancing_mode=LoadBalancingMode.FAILOVER,
        routing_preference=CLOSE,
    )
    key = f"app/{WAYPOINT_HOST}"
    far_instance = dataclasses.replace(workload("a-wp-far", "198.18.2.1", "zone-b", key=key))
    near_instance = dataclasses.replace(workload("b-wp-near", "198.18.2.2", "zone-a", key=key))
    fronted = dataclasses.replace(
        echo(), waypoint=GatewayAddress(NamespacedHostname("app", WAYPOINT_HOST)), ingress_use_waypoint=True
    )
    state = WorkloadState()
    gateway = workload("gateway-0", "198.18.0.20", "zone-a", key="app/gateway")
    state.replace_all([gateway, far_instance, near_instance, FAR, NEAR], [fronted, waypoint])
    hop = pick_ingress_endpoint(state, fronted, 80, first, near=gateway)
    assert hop is not None and hop.workload.name == "b-wp-near"
    assert pick_ingress_endpoint(state, fronted, 80, first).workload.name == "a-wp-far"  # type: ignore[union-attr]
