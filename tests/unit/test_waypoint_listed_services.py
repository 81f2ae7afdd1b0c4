"""A waypoint fed by the control plane serves a Service only once its WaypointConfig lists it (rule 6 of
:func:`ambit.waypoint.destinations.plan_tunnel`): the binding comes in the workload state, the policies in the
WaypointConfig, and the two may arrive in either order. Pure decisions on a state; the wait and the wire are
tested in tests/integration/test_waypoint_listing_over_xds.py and tests/unit/test_xds_routes.py."""

from __future__ import annotations

import ipaddress

import pytest

from ambit.model.routes import WaypointConfig
from ambit.model.state import WorkloadState
from ambit.model.workload import (
    AppProtocol,
    GatewayAddress,
    NamespacedHostname,
    NetworkAddress,
    PortMapping,
    Service,
    TunnelProtocol,
    Workload,
)
from ambit.waypoint.config import RouteConfig
from ambit.waypoint.destinations import Refusal, ServiceTarget, WaypointSelf, WorkloadTarget, plan_tunnel

ME = WaypointSelf("app", "waypoint", frozenset({ipaddress.ip_address("198.18.0.10")}))
BY_NAME = GatewayAddress(NamespacedHostname("app", "waypoint.app.svc.cluster.local"))
ECHO = "app/echo.app.svc.cluster.local"
OTHER = "app/other.app.svc.cluster.local"


def service(name: str, vip: str, waypoint: GatewayAddress | None = BY_NAME) -> Service:
    return Service(
        name=name,
        namespace="app",
        hostname=f"{name}.app.svc.cluster.local",
        vips=(NetworkAddress("", ipaddress.ip_address(vip)),),
        ports=(PortMapping(80, 8080, AppProtocol.HTTP11),),
        waypoint=waypoint,
    )


@pytest.fixture
def state() -> WorkloadState:
    state = WorkloadState()
    state.upsert_service(service("echo", "198.18.1.1"))
    state.upsert_service(service("other", "198.18.1.2"))
    state.upsert_service(service("plain", "198.18.1.3", waypoint=None))
    state.upsert_workload(
        Workload(
            uid="Kubernetes//Pod/app/pinned",
            name="pinned",
            namespace="app",
            addresses=(ipaddress.ip_address("198.18.0.30"),),
            tunnel_protocol=TunnelProtocol.HBONE,
            service_account="pinned",
            waypoint=BY_NAME,
        )
    )
    return state


@pytest.mark.parametrize("authority", ["198.18.1.1:80", "echo.app.svc.cluster.local:80"])
def test_a_bound_service_the_config_lists_is_served(state: WorkloadState, authority: str) -> None:
    plan = plan_tunnel(authority, state, ME, frozenset({ECHO, OTHER}))
    assert isinstance(plan, ServiceTarget) and plan.service.key == ECHO


@pytest.mark.parametrize("listed", [frozenset(), frozenset({OTHER})])
def test_a_bound_service_the_config_does_not_list_counts_as_not_bound(
    state: WorkloadState, listed: frozenset[str]
) -> None:
    """The workload state says echo uses this waypoint, but the config that carries echo's policies has not come."""
    for authority in ("198.18.1.1:80", "echo.app.svc.cluster.local:80"):
        plan = plan_tunnel(authority, state, ME, listed)
        assert isinstance(plan, Refusal), plan
        assert plan.status == 400 and plan.unbound  # the binding wait applies, then 400
        assert "not (yet) in this waypoint's configuration" in plan.reason and ECHO in plan.reason


def test_a_listing_does_not_bind_a_service_the_state_does_not_bind(state: WorkloadState) -> None:
    """The list narrows what the state binds, never widens it: the state is still asked first."""
    plan = plan_tunnel("198.18.1.3:80", state, ME, frozenset({"app/plain.app.svc.cluster.local"}))
    assert isinstance(plan, Refusal) and plan.unbound and "does not use this waypoint" in plan.reason


def test_an_undeclared_port_of_a_listed_service_is_still_refused_outright(state: WorkloadState) -> None:
    plan = plan_tunnel("198.18.1.1:81", state, ME, frozenset({ECHO}))
    assert isinstance(plan, Refusal) and not plan.unbound and "has no port 81" in plan.reason


def test_without_a_list_the_state_alone_decides(state: WorkloadState) -> None:
    """A waypoint run from a local file has no WaypointConfig from the control plane: today's rule 3."""
    assert isinstance(plan_tunnel("198.18.1.1:80", state, ME), ServiceTarget)
    assert isinstance(plan_tunnel("198.18.1.1:80", state, ME, None), ServiceTarget)


def test_a_workload_addressed_tunnel_needs_no_listing(state: WorkloadState) -> None:
    """Only the waypoint-wide policies apply to pod-IP traffic, and those do not depend on a binding."""
    assert isinstance(plan_tunnel("198.18.0.30:8080", state, ME, frozenset()), WorkloadTarget)


def test_a_service_listed_by_a_config_update_is_served_from_then_on(state: WorkloadState) -> None:
    """What the binding wait judges again after a WaypointConfig update: refused (unbound) before, served after;
    and a later config that drops the Service takes it back."""
    routes = RouteConfig(WaypointConfig("app/waypoint", services=(OTHER,)))
    before = plan_tunnel("198.18.1.1:80", state, ME, routes.listed)
    assert isinstance(before, Refusal) and before.unbound
    routes.replace(WaypointConfig("app/waypoint", services=(ECHO, OTHER)))
    assert routes.listed == frozenset({ECHO, OTHER})
    assert isinstance(plan_tunnel("198.18.1.1:80", state, ME, routes.listed), ServiceTarget)
    routes.replace(WaypointConfig("app/waypoint", services=(OTHER,)))
    after = plan_tunnel("198.18.1.1:80", state, ME, routes.listed)
    assert isinstance(after, Refusal) and after.unbound


def test_a_config_and_a_state_update_in_either_order_serve_only_when_both_are_in() -> None:
    """The binding arrives by workload state, the listing by WaypointConfig: each alone is not enough."""
    state = WorkloadState()
    state.upsert_service(service("echo", "198.18.1.1", waypoint=None))
    for listed in (frozenset(), frozenset({ECHO})):
        assert isinstance(plan_tunnel("198.18.1.1:80", state, ME, listed), Refusal)
    state.upsert_service(service("echo", "198.18.1.1"))
    assert isinstance(plan_tunnel("198.18.1.1:80", state, ME, frozenset()), Refusal)
    assert isinstance(plan_tunnel("198.18.1.1:80", state, ME, frozenset({ECHO})), ServiceTarget)
