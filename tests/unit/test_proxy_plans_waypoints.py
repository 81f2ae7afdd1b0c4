"""The node proxy's waypoint decisions without sockets (spec §6.3 steps 3 and 6, §6.5 step 3): the outbound rules
3 and 5 and the inbound rule 3 of :mod:`ambit.proxy.plans`, one branch per test."""

from __future__ import annotations

import dataclasses
import ipaddress

import pytest
from hypothesis import given
from hypothesis import strategies as st
from workload_builders import (
    VIP,
    VIP6,
    WAYPOINT_BY_HOST,
    WAYPOINT_VIP,
    by_address,
    first,
    pod,
    state_with,
    waypoint_pod,
    waypoint_service,
    web_service,
)

from ambit.model.identity import SpiffeId
from ambit.model.state import Transport, WorkloadState
from ambit.model.workload import GatewayAddress, HealthStatus, NamespacedHostname, Service, TunnelProtocol, Workload
from ambit.proxy.authorization import Authorizer, allow_all
from ambit.proxy.errors import ResponseFlag
from ambit.proxy.plans import (
    Dial,
    InboundFacts,
    NodeView,
    OutboundFacts,
    OutboundPlan,
    Plain,
    Refuse,
    Tunnel,
    plan_inbound,
    plan_outbound,
)
from ambit.rbac import NOT_ALLOWED, Connection, Decision

CLIENT = pod("client-0", "198.18.16.2", services={}, service_account="client")
WEB = pod("web-0", "198.18.17.5")
WAYPOINT = waypoint_pod()  # 198.18.18.7, service account "waypoint"
WAYPOINT_ID = SpiffeId("cluster.local", "apps", "waypoint")
WEB_ID = SpiffeId("cluster.local", "apps", "web")
WAYPOINT_IP = "198.18.18.7"
MISSING = GatewayAddress(NamespacedHostname("apps", "gone.apps.svc.cluster.local"))


def mesh(*workloads: Workload, web: Service | None = None, waypoint: Service | None = None) -> WorkloadState:
    return state_with(*workloads, services=[web or web_service(), waypoint or waypoint_service()])


def outbound(
    dst: str,
    port: int,
    state: WorkloadState,
    *,
    source: Workload = CLIENT,
    served: tuple[Workload, ...] = (),
) -> OutboundPlan:
    view = NodeView("", "node1", {w.uid for w in (source, *served)})
    return plan_outbound(OutboundFacts(ipaddress.ip_address(dst), dst, port, source), state, view, first)


def via_waypoint(plan: OutboundPlan) -> Tunnel:
    assert isinstance(plan, Tunnel) and plan.waypoint is not None, plan
    return plan


# --- outbound rule 3: a service with a waypoint ----------------------------------------------------------------


def test_a_vip_whose_service_has_a_waypoint_is_tunnelled_to_the_waypoint_with_the_vip_as_authority() -> None:
    state = mesh(CLIENT, WEB, WAYPOINT, web=web_service(waypoint=WAYPOINT_BY_HOST))
    plan = via_waypoint(outbound(str(VIP), 80, state))
    assert plan.address == ("198.18.18.7", 15008)
    assert plan.authority == "198.19.0.10:80"  # the original destination, not an endpoint
    assert plan.expected == frozenset({WAYPOINT_ID})
    assert plan.waypoint == WAYPOINT_BY_HOST


def test_waypoint_traffic_is_reported_as_the_waypoint_for_the_original_service() -> None:
    state = mesh(CLIENT, WEB, WAYPOINT, web=web_service(waypoint=WAYPOINT_BY_HOST))
    destination = via_waypoint(outbound(str(VIP), 80, state)).destination
    assert destination.workload == WAYPOINT and destination.service == web_service(waypoint=WAYPOINT_BY_HOST)
    assert destination.transport is Transport.HBONE


def test_a_service_waypoint_is_used_even_when_the_service_has_no_healthy_endpoint() -> None:
    sick = dataclasses.replace(WEB, status=HealthStatus.UNHEALTHY)
    state = mesh(CLIENT, sick, WAYPOINT, web=web_service(waypoint=WAYPOINT_BY_HOST))
    assert via_waypoint(outbound(str(VIP), 80, state)).address == ("198.18.18.7", 15008)


def test_a_service_waypoint_over_ipv6_is_reached_at_its_ipv6_address_with_a_bracketed_authority() -> None:
    dual = waypoint_pod("waypoint-0", "198.18.18.7", "fd00:18::7")
    state = mesh(CLIENT, WEB, dual, web=web_service(waypoint=WAYPOINT_BY_HOST))
    plan = via_waypoint(outbound(str(VIP6), 80, state))
    assert plan.address == ("fd00:18::7", 15008) and plan.authority == "[fd00:19::10]:80"


def test_a_service_waypoint_named_by_its_vip_is_reached_at_an_instance_not_at_the_vip() -> None:
    state = mesh(CLIENT, WEB, WAYPOINT, web=web_service(waypoint=by_address(str(WAYPOINT_VIP))))
    assert via_waypoint(outbound(str(VIP), 80, state)).address == ("198.18.18.7", 15008)


@pytest.mark.parametrize("missing", [MISSING, by_address("198.18.99.99")])
def test_a_service_waypoint_that_does_not_resolve_refuses_the_connection_counted(missing: GatewayAddress) -> None:
    state = mesh(CLIENT, WEB, WAYPOINT, web=web_service(waypoint=missing))
    plan = outbound(str(VIP), 80, state)
    assert isinstance(plan, Refuse) and plan.counted  # never silently sent around the waypoint
    assert (plan.status, plan.flag) == (503, ResponseFlag.NO_ROUTE)
    assert "waypoint" in plan.reason and "not found" in plan.reason


def test_a_service_waypoint_without_a_ready_instance_refuses_the_connection() -> None:
    down = dataclasses.replace(WAYPOINT, status=HealthStatus.UNHEALTHY)
    plan = outbound(str(VIP), 80, mesh(CLIENT, WEB, down, web=web_service(waypoint=WAYPOINT_BY_HOST)))
    assert isinstance(plan, Refuse) and plan.counted and "no healthy instance" in plan.reason


def test_a_waypoint_on_this_node_served_by_this_proxy_is_still_reached_over_hbone() -> None:
    state = mesh(CLIENT, WEB, WAYPOINT, web=web_service(waypoint=WAYPOINT_BY_HOST))
    plan = outbound(str(VIP), 80, state, served=(WEB, WAYPOINT))
    assert via_waypoint(plan).address == ("198.18.18.7", 15008)  # not Local: the waypoint terminates HBONE


def test_the_waypoint_itself_calling_its_service_goes_to_an_endpoint() -> None:
    state = mesh(CLIENT, WEB, WAYPOINT, web=web_service(waypoint=WAYPOINT_BY_HOST))
    plan = outbound(str(VIP), 80, state, source=WAYPOINT)
    assert isinstance(plan, Tunnel) and plan.waypoint is None
    assert plan.address == ("198.18.17.5", 15008) and plan.expected == frozenset({WEB_ID})


def test_a_pod_with_the_waypoints_identity_but_not_its_address_still_goes_through_the_waypoint() -> None:
    impostor = pod("impostor-0", "198.18.16.66", services={}, service_account="waypoint")
    state = mesh(impostor, WEB, WAYPOINT, web=web_service(waypoint=WAYPOINT_BY_HOST))
    via_waypoint(outbound(str(VIP), 80, state, source=impostor))


# --- outbound rule 5: a workload with a waypoint ---------------------------------------------------------------


def test_a_pod_ip_whose_workload_has_a_waypoint_is_tunnelled_to_it_with_the_pod_ip_as_authority() -> None:
    web = dataclasses.replace(WEB, waypoint=WAYPOINT_BY_HOST)
    plan = via_waypoint(outbound("198.18.17.5", 8080, mesh(CLIENT, web, WAYPOINT)))
    assert plan.address == ("198.18.18.7", 15008) and plan.authority == "198.18.17.5:8080"
    assert plan.expected == frozenset({WAYPOINT_ID})
    assert plan.destination.workload == WAYPOINT and plan.destination.service is None


def test_a_workload_waypoint_named_by_its_pod_address_is_reached_there() -> None:
    web = dataclasses.replace(WEB, waypoint=by_address("198.18.18.7"))
    plan = via_waypoint(outbound("198.18.17.5", 8080, mesh(CLIENT, web, WAYPOINT)))
    assert plan.address == ("198.18.18.7", 15008) and plan.destination.service is None


@pytest.mark.parametrize("served", [False, True])
def test_a_workload_waypoint_is_used_whatever_the_pods_transport_and_node(served: bool) -> None:
    plain = dataclasses.replace(WEB, waypoint=WAYPOINT_BY_HOST, tunnel_protocol=TunnelProtocol.NONE)
    local = dataclasses.replace(WEB, waypoint=WAYPOINT_BY_HOST)
    for web in (plain, local):
        plan = outbound("198.18.17.5", 8080, mesh(CLIENT, web, WAYPOINT), served=(web,) if served else ())
        assert via_waypoint(plan).authority == "198.18.17.5:8080"


def test_a_service_only_waypoint_is_skipped_for_pod_ip_traffic() -> None:
    state = mesh(CLIENT, WEB, WAYPOINT, web=web_service(waypoint=WAYPOINT_BY_HOST))
    plan = outbound("198.18.17.5", 8080, state)
    assert isinstance(plan, Tunnel) and plan.waypoint is None
    assert plan.address == ("198.18.17.5", 15008) and plan.expected == frozenset({WEB_ID})


def test_vip_traffic_does_not_take_the_chosen_endpoints_workload_waypoint() -> None:
    web = dataclasses.replace(WEB, waypoint=WAYPOINT_BY_HOST)
    plan = outbound(str(VIP), 80, mesh(CLIENT, web, WAYPOINT))
    assert isinstance(plan, Tunnel) and plan.waypoint is None and plan.authority == "198.18.17.5:8080"


def test_the_waypoint_itself_calling_a_pod_it_fronts_goes_straight_to_the_pod() -> None:
    web = dataclasses.replace(WEB, waypoint=WAYPOINT_BY_HOST)
    plan = outbound("198.18.17.5", 8080, mesh(CLIENT, web, WAYPOINT), source=WAYPOINT)
    assert isinstance(plan, Tunnel) and plan.waypoint is None and plan.address == ("198.18.17.5", 15008)


def test_a_workload_waypoint_that_does_not_resolve_refuses_the_connection_counted() -> None:
    web = dataclasses.replace(WEB, waypoint=MISSING)
    plan = outbound("198.18.17.5", 8080, mesh(CLIENT, web, WAYPOINT))
    assert isinstance(plan, Refuse) and plan.counted and (plan.status, plan.flag) == (503, ResponseFlag.NO_ROUTE)


def test_a_pod_ip_without_any_waypoint_is_unchanged() -> None:
    plan = outbound("198.18.17.5", 8080, mesh(CLIENT, WEB, WAYPOINT))
    assert isinstance(plan, Tunnel) and plan.waypoint is None
    legacy = pod("legacy-0", "198.18.17.9", services={}, tunnel_protocol=TunnelProtocol.NONE)
    assert isinstance(outbound("198.18.17.9", 5432, mesh(CLIENT, legacy, WAYPOINT)), Plain)


# --- inbound rule 3: a captured waypoint (sandwich) receives for what it fronts --------------------------------


def inbound(
    authority: str,
    state: WorkloadState,
    *,
    local: Workload = WAYPOINT,
    authorize: Authorizer = allow_all,
) -> Dial | Refuse:
    facts = InboundFacts(local, WAYPOINT_IP, 0, "198.18.16.2", SpiffeId("cluster.local", "apps", "client"), authority)
    return plan_inbound(facts, state, authorize)


@pytest.mark.parametrize("named", [WAYPOINT_BY_HOST, by_address(str(WAYPOINT_VIP)), by_address(WAYPOINT_IP)])
def test_a_connect_to_a_vip_whose_service_uses_this_waypoint_dials_the_waypoint_on_that_port(
    named: GatewayAddress,
) -> None:
    state = mesh(CLIENT, WEB, WAYPOINT, web=web_service(waypoint=named))
    assert inbound("198.19.0.10:80", state) == Dial(WAYPOINT, WAYPOINT_IP, 80, "198.18.16.2")


def test_a_connect_to_a_pod_whose_workload_uses_this_waypoint_dials_the_waypoint_on_that_port() -> None:
    web = dataclasses.replace(WEB, waypoint=by_address(WAYPOINT_IP))
    assert inbound("198.18.17.5:8080", mesh(CLIENT, web, WAYPOINT)) == Dial(WAYPOINT, WAYPOINT_IP, 8080, "198.18.16.2")


def test_a_connect_to_a_pod_whose_service_only_uses_this_waypoint_is_an_ip_mismatch() -> None:
    state = mesh(CLIENT, WEB, WAYPOINT, web=web_service(waypoint=WAYPOINT_BY_HOST))
    plan = inbound("198.18.17.5:8080", state)
    assert isinstance(plan, Refuse) and plan.status == 400 and "ip mismatch" in plan.reason


def test_a_connect_to_a_vip_whose_service_only_has_a_workload_waypoint_here_is_an_ip_mismatch() -> None:
    web = dataclasses.replace(WEB, waypoint=WAYPOINT_BY_HOST)
    plan = inbound("198.19.0.10:80", mesh(CLIENT, web, WAYPOINT))
    assert isinstance(plan, Refuse) and plan.status == 400


def test_a_connect_for_another_waypoints_service_is_an_ip_mismatch() -> None:
    other = waypoint_pod("other-waypoint-0", "198.18.18.8", services={"apps/other.apps.svc.cluster.local": ()})
    other_service = dataclasses.replace(waypoint_service(), name="other", hostname="other.apps.svc.cluster.local")
    named = GatewayAddress(NamespacedHostname("apps", "other.apps.svc.cluster.local"))
    state = state_with(
        CLIENT, WEB, WAYPOINT, other, services=[web_service(waypoint=named), waypoint_service(), other_service]
    )
    plan = inbound("198.19.0.10:80", state)
    assert isinstance(plan, Refuse) and "ip mismatch" in plan.reason


def test_a_pod_that_is_not_a_waypoint_still_refuses_a_foreign_authority() -> None:
    state = mesh(CLIENT, WEB, WAYPOINT, web=web_service(waypoint=WAYPOINT_BY_HOST))
    facts = InboundFacts(WEB, "198.18.17.5", 0, "198.18.16.2", None, "198.19.0.10:80")
    plan = plan_inbound(facts, state, allow_all)
    assert isinstance(plan, Refuse) and "ip mismatch" in plan.reason


def test_a_waypoint_authority_onto_the_proxys_own_port_is_still_refused() -> None:
    state = mesh(CLIENT, WEB, WAYPOINT, web=web_service(waypoint=WAYPOINT_BY_HOST))
    plan = inbound("198.19.0.10:15008", state)
    assert isinstance(plan, Refuse) and plan.status == 400 and "own port" in plan.reason


def test_a_connect_through_the_waypoint_is_still_authorized() -> None:
    state = mesh(CLIENT, WEB, WAYPOINT, web=web_service(waypoint=WAYPOINT_BY_HOST))
    seen: list[Connection] = []

    def deny(workload: Workload, connection: Connection) -> Decision:
        seen.append(connection)
        return Decision(False, NOT_ALLOWED)

    plan = inbound("198.19.0.10:80", state, authorize=deny)
    assert isinstance(plan, Refuse) and plan.status == 401
    assert [(str(c.destination_ip), c.destination_port) for c in seen] == [(WAYPOINT_IP, 80)]


# --- properties ------------------------------------------------------------------------------------------------

GATEWAYS = st.sampled_from([None, WAYPOINT_BY_HOST, by_address(WAYPOINT_IP), by_address(str(WAYPOINT_VIP)), MISSING])


@given(
    service_waypoint=GATEWAYS,
    workload_waypoint=GATEWAYS,
    waypoint_health=st.sampled_from(list(HealthStatus)),
    web_health=st.sampled_from(list(HealthStatus)),
    to_vip=st.booleans(),
    served=st.booleans(),
    from_waypoint=st.booleans(),
)
def test_a_configured_waypoint_is_taken_or_the_connection_refused_never_bypassed(
    service_waypoint: GatewayAddress | None,
    workload_waypoint: GatewayAddress | None,
    waypoint_health: HealthStatus,
    web_health: HealthStatus,
    to_vip: bool,
    served: bool,
    from_waypoint: bool,
) -> None:
    web = dataclasses.replace(WEB, waypoint=workload_waypoint, status=web_health)
    waypoint = dataclasses.replace(WAYPOINT, status=waypoint_health)
    state = mesh(CLIENT, web, waypoint, web=web_service(waypoint=service_waypoint))
    source = waypoint if from_waypoint else CLIENT
    plan = outbound(str(VIP) if to_vip else "198.18.17.5", 80, state, source=source, served=(web,) if served else ())
    applies = service_waypoint if to_vip else workload_waypoint
    if applies is not None and not from_waypoint:
        assert isinstance(plan, Refuse) or (isinstance(plan, Tunnel) and plan.waypoint == applies), plan
        if isinstance(plan, Tunnel):
            assert plan.expected == frozenset({WAYPOINT_ID}) and plan.address[0] == WAYPOINT_IP
            assert plan.authority == (f"{VIP}:80" if to_vip else "198.18.17.5:80")
    else:
        assert not (isinstance(plan, Tunnel) and plan.waypoint is not None), plan
