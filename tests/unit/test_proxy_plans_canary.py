"""Weighted (canary) waypoints on the data path, without sockets: :func:`ambit.model.waypoint_choice.choose_waypoint`
by table and by a bounded statistical check, the node proxy's per-connection choice (outbound rule 3 of
:mod:`ambit.proxy.plans`) with an injected draw, the canary waypoint accepting the Service
(:func:`ambit.waypoint.destinations.plan_tunnel`) and the ingress gateway's per-request choice."""

from __future__ import annotations

import dataclasses
import ipaddress
import random

import pytest
from workload_builders import (
    VIP,
    WAYPOINT_BY_HOST,
    first,
    pod,
    state_with,
    waypoint_pod,
    waypoint_service,
    web_service,
)

from ambit.model.state import WorkloadState
from ambit.model.waypoint_choice import choose_waypoint
from ambit.model.workload import GatewayAddress, NamespacedHostname, NetworkAddress, PortMapping, Service
from ambit.model.workload import WeightedWaypoint as W
from ambit.proxy.authorization import allow_all
from ambit.proxy.plans import (
    Dial,
    InboundFacts,
    NodeView,
    OutboundFacts,
    OutboundPlan,
    Refuse,
    Tunnel,
    plan_inbound,
    plan_outbound,
)
from ambit.waypoint.destinations import ServiceTarget, WaypointSelf, pick_ingress_endpoint, plan_tunnel

CANARY_HOST = "canary.apps.svc.cluster.local"
CANARY_BY_HOST = GatewayAddress(NamespacedHostname("apps", CANARY_HOST))
GONE = GatewayAddress(NamespacedHostname("apps", "gone.apps.svc.cluster.local"))
CLIENT = pod("client-0", "198.18.16.2", services={}, service_account="client")
WEB = pod("web-0", "198.18.17.5")
PRIMARY_POD = waypoint_pod()  # 198.18.18.7
CANARY_POD = waypoint_pod("canary-0", "198.18.18.8", services={f"apps/{CANARY_HOST}": ()}, service_account="canary")
CANARY_SERVICE = waypoint_service(
    name="canary", hostname=CANARY_HOST, vips=(NetworkAddress("", ipaddress.ip_address("198.19.0.21")),)
)


def weighted(primary: int, canary: int, canary_address: GatewayAddress = CANARY_BY_HOST, **more: object) -> Service:
    return web_service(
        waypoint=WAYPOINT_BY_HOST,
        weighted_waypoints=(W(WAYPOINT_BY_HOST, primary), W(canary_address, canary)),
        **more,
    )


def mesh(web: Service, *extra: object) -> WorkloadState:
    workloads = [CLIENT, WEB, PRIMARY_POD, CANARY_POD, *extra]
    return state_with(*workloads, services=[web, waypoint_service(), CANARY_SERVICE])  # type: ignore[arg-type]


def outbound(state: WorkloadState, draw: float, *, source: object = CLIENT) -> OutboundPlan:
    facts = OutboundFacts(VIP, str(VIP), 80, source)  # type: ignore[arg-type]
    return plan_outbound(facts, state, NodeView("", "node1", {CLIENT.uid}), first, lambda: draw)


def tunnel_to(plan: OutboundPlan) -> str:
    assert isinstance(plan, Tunnel) and plan.waypoint is not None, plan
    return plan.address[0]


# --- the choice, pure -------------------------------------------------------------------------------------------

ALWAYS = lambda _g: True  # noqa: E731


@pytest.mark.parametrize(
    ("weights", "draw", "chosen"),
    [
        ((80, 20), 0.0, WAYPOINT_BY_HOST),
        ((80, 20), 0.799, WAYPOINT_BY_HOST),
        ((80, 20), 0.8, CANARY_BY_HOST),
        ((80, 20), 0.999, CANARY_BY_HOST),
        ((80, 20), 1.0, CANARY_BY_HOST),  # out of range: the last candidate, never an error
        ((100, 0), 0.999, WAYPOINT_BY_HOST),  # weight 0 is never chosen
        ((0, 100), 0.0, CANARY_BY_HOST),
        ((0, 0), 0.5, WAYPOINT_BY_HOST),  # nothing to weigh: the primary
        ((3, 1), 0.74, WAYPOINT_BY_HOST),
        ((3, 1), 0.75, CANARY_BY_HOST),
    ],
)
def test_a_draw_picks_the_entry_whose_running_weight_passes_it(
    weights: tuple[int, int], draw: float, chosen: GatewayAddress
) -> None:
    assert choose_waypoint(weighted(*weights), ALWAYS, draw) == chosen


def test_an_unusable_canary_leaves_everything_to_the_primary_and_no_set_means_the_waypoint() -> None:
    service = weighted(0, 100)
    assert choose_waypoint(service, lambda g: g != CANARY_BY_HOST, 0.3) == WAYPOINT_BY_HOST
    assert choose_waypoint(web_service(waypoint=WAYPOINT_BY_HOST), ALWAYS, 0.9) == WAYPOINT_BY_HOST
    assert choose_waypoint(web_service(), ALWAYS, 0.9) is None
    # The primary is not filtered: an unusable primary is the caller's refusal, never a bypass.
    assert choose_waypoint(weighted(100, 0), lambda _g: False, 0.3) == WAYPOINT_BY_HOST


def test_over_many_connections_each_waypoint_gets_about_its_share() -> None:
    rng = random.Random(20261202)
    service = weighted(70, 30)
    draws = 4000
    canary = sum(choose_waypoint(service, ALWAYS, rng.random()) == CANARY_BY_HOST for _ in range(draws))
    # 30% of 4000 = 1200, standard deviation about 29: six of them either side.
    assert abs(canary - 1200) < 175, canary


# --- the node proxy, per connection -----------------------------------------------------------------------------


def test_the_node_proxy_sends_each_connection_to_the_waypoint_its_draw_picks() -> None:
    state = mesh(weighted(50, 50))
    assert tunnel_to(outbound(state, 0.1)) == "198.18.18.7"
    canary = outbound(state, 0.9)
    assert tunnel_to(canary) == "198.18.18.8"
    assert isinstance(canary, Tunnel) and canary.waypoint == CANARY_BY_HOST
    assert canary.authority == "198.19.0.10:80"  # the original destination, as for the primary
    assert canary.destination.workload == CANARY_POD


def test_weight_100_sends_everything_to_the_canary_and_weight_0_nothing() -> None:
    assert {tunnel_to(outbound(mesh(weighted(0, 100)), d)) for d in (0.0, 0.5, 0.99)} == {"198.18.18.8"}
    assert {tunnel_to(outbound(mesh(weighted(100, 0)), d)) for d in (0.0, 0.5, 0.99)} == {"198.18.18.7"}


def test_a_canary_unknown_to_the_state_or_without_an_instance_leaves_everything_to_the_primary() -> None:
    assert tunnel_to(outbound(mesh(weighted(0, 100, GONE)), 0.5)) == "198.18.18.7"
    no_instance = state_with(CLIENT, WEB, PRIMARY_POD, services=[weighted(0, 100), waypoint_service(), CANARY_SERVICE])
    assert tunnel_to(outbound(no_instance, 0.5)) == "198.18.18.7"


def test_a_picked_canary_that_does_not_resolve_falls_back_to_the_primary() -> None:
    elsewhere = dataclasses.replace(CANARY_POD, network="other")  # an instance, but not on this network
    state = state_with(
        CLIENT, WEB, PRIMARY_POD, elsewhere, services=[weighted(0, 100), waypoint_service(), CANARY_SERVICE]
    )
    assert tunnel_to(outbound(state, 0.5)) == "198.18.18.7"


def test_a_missing_primary_is_still_refused_never_bypassed() -> None:
    state = state_with(CLIENT, WEB, services=[weighted(100, 0), waypoint_service(), CANARY_SERVICE])
    plan = outbound(state, 0.5)
    assert isinstance(plan, Refuse) and plan.status == 503


def test_an_instance_of_either_waypoint_goes_to_the_endpoint_not_back_through_a_waypoint() -> None:
    for source in (PRIMARY_POD, CANARY_POD):
        plan = outbound(mesh(weighted(50, 50)), 0.9, source=source)
        assert not (isinstance(plan, Tunnel) and plan.waypoint is not None), (source.name, plan)


def test_the_draw_is_not_taken_for_a_service_without_a_weighted_set() -> None:
    def no_draw() -> float:
        raise AssertionError("drawn")

    state = mesh(web_service(waypoint=WAYPOINT_BY_HOST))
    facts = OutboundFacts(VIP, str(VIP), 80, CLIENT)
    plan = plan_outbound(facts, state, NodeView("", "node1", {CLIENT.uid}), first, no_draw)
    assert tunnel_to(plan) == "198.18.18.7"


# --- the canary waypoint accepts the Service; the ingress gateway splits per request --------------------------


def test_the_canary_waypoint_accepts_the_service_and_a_bystander_waypoint_does_not() -> None:
    state = mesh(weighted(50, 50))
    canary = WaypointSelf("apps", "canary", frozenset({ipaddress.ip_address("198.18.18.8")}))
    target = plan_tunnel("198.19.0.10:80", state, canary)
    assert isinstance(target, ServiceTarget) and target.service.name == "web"
    primary = WaypointSelf("apps", "waypoint", frozenset({ipaddress.ip_address("198.18.18.7")}))
    assert isinstance(plan_tunnel("198.19.0.10:80", state, primary), ServiceTarget)
    bystander = WaypointSelf("apps", "other", frozenset({ipaddress.ip_address("198.18.18.9")}))
    assert not isinstance(plan_tunnel("198.19.0.10:80", state, bystander), ServiceTarget)


def test_the_ingress_gateway_picks_a_waypoint_per_request_by_its_draw() -> None:
    web = weighted(60, 40, ingress_use_waypoint=True, ports=(PortMapping(80, 8080),))
    state = mesh(web)
    low = pick_ingress_endpoint(state, web, 80, first, draw=0.1)
    high = pick_ingress_endpoint(state, web, 80, first, draw=0.7)
    assert low is not None and high is not None
    assert (str(low.via), str(high.via)) == ("198.18.18.7", "198.18.18.8")
    assert str(high.ip) == "198.19.0.10" and high.port == 80  # addressed to the Service, through the canary
    no_canary = state_with(CLIENT, WEB, PRIMARY_POD, services=[web, waypoint_service(), CANARY_SERVICE])
    fallback = pick_ingress_endpoint(no_canary, web, 80, first, draw=0.7)
    assert fallback is not None and str(fallback.via) == "198.18.18.7"


def test_an_ingress_retry_stays_with_the_weighted_choice_and_never_takes_a_weight_0_waypoint() -> None:
    # TestWeightedWaypointIngressTrafficShift at weight 100: the destination refuses the canary's identity and the
    # gateway retries; the retry tries the canary's instance again, never the weight-0 primary.
    web = weighted(0, 100, ingress_use_waypoint=True, ports=(PortMapping(80, 8080),))
    state = mesh(web)
    for draw in (0.0, 0.5, 0.99):
        first_try = pick_ingress_endpoint(state, web, 80, first, draw=draw)
        retry = pick_ingress_endpoint(state, web, 80, first, draw=draw, exclude=frozenset({CANARY_POD.uid}))
        assert first_try is not None and retry is not None
        assert (str(first_try.via), str(retry.via)) == ("198.18.18.8", "198.18.18.8")
    # A second canary instance is preferred over the one already tried.
    second = waypoint_pod("canary-1", "198.18.18.9", services={f"apps/{CANARY_HOST}": ()}, service_account="canary")
    retry = pick_ingress_endpoint(mesh(web, second), web, 80, first, exclude=frozenset({CANARY_POD.uid}))
    assert retry is not None and str(retry.via) == "198.18.18.9"
    # At 50/50 a retry after the primary goes to the canary whatever the draw (Envoy skips hosts already tried).
    even = weighted(50, 50, ingress_use_waypoint=True, ports=(PortMapping(80, 8080),))
    for draw in (0.0, 0.99):
        retry = pick_ingress_endpoint(mesh(even), even, 80, first, draw=draw, exclude=frozenset({PRIMARY_POD.uid}))
        assert retry is not None and str(retry.via) == "198.18.18.8"


def test_a_captured_canary_waypoint_receives_for_the_service_it_is_the_canary_of() -> None:
    # Inbound rule 3 (a sandwiched waypoint): the canary pod's node proxy dials it on the VIP's port; a waypoint in
    # neither place of the set is still an ip mismatch.
    facts = InboundFacts(CANARY_POD, "198.18.18.8", 0, "198.18.16.2", None, "198.19.0.10:80")
    assert plan_inbound(facts, mesh(weighted(50, 50)), allow_all) == Dial(CANARY_POD, "198.18.18.8", 80, "198.18.16.2")
    plan = plan_inbound(facts, mesh(web_service(waypoint=WAYPOINT_BY_HOST)), allow_all)
    assert isinstance(plan, Refuse) and "ip mismatch" in plan.reason
