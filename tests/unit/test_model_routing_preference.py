"""A service's routing preference narrows its endpoints to the closest to the client (ambit.model.routing_preference
and the state's rule 12), as ztunnel's ``load_balance`` does: a pick table, the state's outbound and waypoint
lookups, the plan's refusal when STRICT finds nothing close, and properties over random localities."""

from __future__ import annotations

import dataclasses
from collections.abc import Sequence

import pytest
from hypothesis import given
from hypothesis import strategies as st
from workload_builders import VIP, WAYPOINT_BY_HOST, WAYPOINT_HOST, first, ip, pod, state_with, web_service

from ambit.model.routing_preference import client_view, closest
from ambit.model.state import NoHealthyUpstreamError, UnknownWaypointError, WorkloadState
from ambit.model.workload import (
    HealthPolicy,
    HealthStatus,
    LoadBalancingMode,
    Locality,
    PortMapping,
    RoutingScope,
    Service,
    Workload,
)
from ambit.proxy.errors import ResponseFlag
from ambit.proxy.plans import NodeView, OutboundFacts, Refuse, Tunnel, plan_outbound

N, R, Z, SZ, NODE = (
    RoutingScope.NETWORK,
    RoutingScope.REGION,
    RoutingScope.ZONE,
    RoutingScope.SUBZONE,
    RoutingScope.NODE,
)
PREFER_CLOSE = (N, R, Z)
PREFER_SAME_NODE = (N, R, Z, SZ, NODE)


def at(
    name: str, address: str, region: str, zone: str, node: str = "n", network: str = "net", **kw: object
) -> Workload:
    return pod(name, address, locality=Locality(region, zone), node=node, network=network, **kw)


def service(mode: LoadBalancingMode, preference: tuple[RoutingScope, ...], **kw: object) -> Service:
    return web_service(load_balancing_mode=mode, routing_preference=preference, **kw)


# ztunnel's table (state.rs, ``load_balance`` tests): endpoints around a client in net/reg/zone.
MATCH = at("match", "10.0.0.1", "reg", "zone")
ALMOST = at("almost", "10.0.0.2", "reg", "other-zone")
NO_LOCALITY = at("no-locality", "10.0.0.3", "", "")
OTHER = at("other", "10.0.0.4", "other-reg", "other-zone")
FAR = at("far", "10.0.0.5", "reg", "zone", network="other-net")
TABLE = (MATCH, ALMOST, NO_LOCALITY, OTHER, FAR)


def names(workloads: list[Workload]) -> list[str]:
    return [w.name for w in workloads]


@pytest.mark.parametrize(
    ("mode", "client", "expected"),
    [
        (LoadBalancingMode.STRICT, at("c", "10.9.0.1", "reg", "zone"), ["match"]),
        (LoadBalancingMode.STRICT, at("c", "10.9.0.1", "reg", "nowhere"), []),
        (LoadBalancingMode.STRICT, at("c", "10.9.0.1", "reg", "zone", network="other-net"), ["far"]),
        (LoadBalancingMode.FAILOVER, at("c", "10.9.0.1", "reg", "zone"), ["match"]),
        (LoadBalancingMode.FAILOVER, at("c", "10.9.0.1", "reg", "nowhere"), ["match", "almost"]),
        (
            LoadBalancingMode.FAILOVER,
            at("c", "10.9.0.1", "nowhere", "nowhere"),
            ["match", "almost", "no-locality", "other"],
        ),
        # On the same network, "far" (another network, same region and zone) ranks below every other endpoint ...
        (LoadBalancingMode.FAILOVER, at("c", "10.9.0.1", "other-reg", "z"), ["other"]),
        # ... but from a third network, region and zone still rank them all.
        (LoadBalancingMode.FAILOVER, at("c", "10.9.0.1", "reg", "zone", network="x"), ["match", "far"]),
        (LoadBalancingMode.FAILOVER, at("c", "10.9.0.1", "", "", network="net"), ["no-locality"]),
        (LoadBalancingMode.UNSPECIFIED, at("c", "10.9.0.1", "reg", "zone"), names(list(TABLE))),
    ],
    ids=[
        "strict-match",
        "strict-no-zone-match-is-nothing",
        "strict-other-network",
        "failover-same-zone",
        "failover-same-region",
        "failover-same-network-only",
        "failover-network-outranks-locality",
        "failover-client-on-a-third-network",
        "failover-unknown-matches-unknown",
        "unspecified-ignores-preference",
    ],
)
def test_the_closest_ring_of_endpoints_is_kept(mode: LoadBalancingMode, client: Workload, expected: list[str]) -> None:
    svc = service(mode, PREFER_CLOSE)
    assert names(closest(svc, client_view(svc, client), TABLE)) == expected


def test_a_client_on_another_network_prefers_same_locality_among_the_remote_endpoints() -> None:
    # Rule 3: a network mismatch does not end the run, so region and zone still rank the endpoints of other networks.
    svc = service(LoadBalancingMode.FAILOVER, PREFER_CLOSE)
    far_zone = at("far-zone", "10.0.0.6", "reg", "zone", network="net-b")
    far_region = at("far-region", "10.0.0.7", "reg", "z2", network="net-b")
    client = at("c", "10.9.0.1", "reg", "zone", network="net-c")
    assert names(closest(svc, client_view(svc, client), [far_region, far_zone])) == ["far-zone"]


def test_network_not_first_is_an_ordinary_scope() -> None:
    svc = service(LoadBalancingMode.FAILOVER, (R, N))
    client = at("c", "10.9.0.1", "reg", "zone", network="x")
    same_region = at("a", "10.0.0.1", "reg", "q", network="y")
    other_region = at("b", "10.0.0.2", "r2", "q", network="x")
    assert names(closest(svc, client_view(svc, client), [same_region, other_region])) == ["a"]


def test_internal_traffic_policy_local_keeps_only_endpoints_on_the_clients_node() -> None:
    svc = service(LoadBalancingMode.STRICT, (NODE,))
    here, there = at("here", "10.0.0.1", "r", "z", node="n1"), at("there", "10.0.0.2", "r", "z", node="n2")
    assert names(closest(svc, client_view(svc, at("c", "10.9.0.1", "r", "z", node="n1")), [here, there])) == ["here"]
    assert closest(svc, client_view(svc, at("c", "10.9.0.1", "r", "z", node="n3")), [here, there]) == []


def test_prefer_same_node_ranks_node_above_subzone_above_zone() -> None:
    svc = service(LoadBalancingMode.FAILOVER, PREFER_SAME_NODE)
    client = pod("c", "10.9.0.1", locality=Locality("r", "z", "s"), node="n1")
    same_zone = pod("zone", "10.0.0.1", locality=Locality("r", "z", "s2"), node="n2")
    same_subzone = pod("subzone", "10.0.0.2", locality=Locality("r", "z", "s"), node="n2")
    same_node = pod("node", "10.0.0.3", locality=Locality("r", "z", "s"), node="n1")
    view = client_view(svc, client)
    assert names(closest(svc, view, [same_zone, same_subzone, same_node])) == ["node"]
    assert names(closest(svc, view, [same_zone, same_subzone])) == ["subzone"]
    assert names(closest(svc, view, [same_zone])) == ["zone"]


# --- the state's outbound lookup (rule 12) ------------------------------------------------------------------------

CLIENT = at("client", "10.9.0.1", "reg", "zone", services={})


def _resolve(state: WorkloadState, client: Workload | None = CLIENT) -> str:
    destination = state.resolve("", VIP, 80, first, "apps", client=client)  # the VIPs are on the default network
    assert destination.workload is not None
    return destination.workload.name


def _state(svc: Service, *workloads: Workload) -> WorkloadState:
    return state_with(CLIENT, *workloads, services=[svc])


def test_a_connection_goes_to_the_same_zone_endpoint_and_fails_over_when_it_is_unhealthy_or_gone() -> None:
    # "almost" sorts first by uid: without the preference it would be picked.
    state = _state(service(LoadBalancingMode.FAILOVER, PREFER_CLOSE), ALMOST, MATCH, OTHER)
    assert _resolve(state) == "match"
    state.upsert_workload(dataclasses.replace(MATCH, status=HealthStatus.UNHEALTHY))
    assert _resolve(state) == "almost"
    state.remove_workload(ALMOST.uid)
    assert _resolve(state) == "other"
    state.upsert_workload(MATCH)
    assert _resolve(state) == "match"


def test_an_unhealthy_close_endpoint_stays_closest_when_the_service_allows_all() -> None:
    svc = service(LoadBalancingMode.FAILOVER, PREFER_CLOSE, health_policy=HealthPolicy.ALLOW_ALL)
    state = _state(svc, ALMOST, dataclasses.replace(MATCH, status=HealthStatus.UNHEALTHY))
    assert _resolve(state) == "match"


def test_strict_with_nothing_close_is_no_healthy_upstream() -> None:
    state = _state(service(LoadBalancingMode.STRICT, PREFER_CLOSE), ALMOST, OTHER)
    with pytest.raises(NoHealthyUpstreamError, match="no healthy upstream"):
        _resolve(state)


def test_without_a_client_the_preference_is_not_weighed() -> None:
    state = _state(service(LoadBalancingMode.STRICT, PREFER_CLOSE), ALMOST, OTHER)
    assert _resolve(state, client=None) == "almost"


def test_clients_in_different_zones_get_their_own_closest_endpoints_from_one_state() -> None:
    state = _state(service(LoadBalancingMode.FAILOVER, PREFER_CLOSE), ALMOST, MATCH)
    assert _resolve(state) == "match"
    assert _resolve(state, at("c2", "10.9.0.2", "reg", "other-zone", services={})) == "almost"
    assert _resolve(state) == "match"


def test_the_narrowing_follows_a_change_of_the_services_preference() -> None:
    state = _state(service(LoadBalancingMode.FAILOVER, PREFER_CLOSE), ALMOST, MATCH)
    assert _resolve(state) == "match"
    state.upsert_service(web_service())
    assert _resolve(state) == "almost"


def test_candidates_handed_to_choose_keep_the_uid_order() -> None:
    twin = at("twin", "10.0.0.9", "reg", "zone")
    state = _state(service(LoadBalancingMode.FAILOVER, PREFER_CLOSE), twin, MATCH, ALMOST)
    seen: list[list[str]] = []

    def record(candidates: Sequence[Workload]) -> Workload:
        seen.append(names(list(candidates)))
        return candidates[0]

    state.resolve("", VIP, 80, record, "apps", client=CLIENT)
    assert seen == [sorted(["match", "twin"], key=lambda n: f"Kubernetes//Pod/apps/{n}")]


# --- the plan ------------------------------------------------------------------------------------------------------


def test_the_plan_refuses_a_strict_service_with_nothing_close_as_no_route() -> None:
    state = _state(service(LoadBalancingMode.STRICT, (NODE,)), dataclasses.replace(ALMOST, node="elsewhere"))
    facts = OutboundFacts(VIP, str(VIP), 80, CLIENT)
    plan = plan_outbound(facts, state, NodeView("", "n", set()), first)
    assert isinstance(plan, Refuse)
    assert (plan.status, plan.flag) == (503, ResponseFlag.NO_ROUTE)
    assert "no healthy upstream" in plan.reason


def test_the_plan_tunnels_to_the_closest_endpoint() -> None:
    state = _state(service(LoadBalancingMode.FAILOVER, PREFER_CLOSE), ALMOST, MATCH)
    plan = plan_outbound(OutboundFacts(VIP, str(VIP), 80, CLIENT), state, NodeView("", "n", set()), first)
    assert isinstance(plan, Tunnel)
    assert plan.destination.workload == MATCH


# --- waypoint instances ---------------------------------------------------------------------------------------------


def _waypoint_state(mode: LoadBalancingMode) -> WorkloadState:
    key = f"apps/{WAYPOINT_HOST}"
    waypoint = Service(
        name="waypoint",
        namespace="apps",
        hostname=WAYPOINT_HOST,
        vips=(),
        ports=(PortMapping(15008, 15008),),
        load_balancing_mode=mode,
        routing_preference=PREFER_CLOSE,
    )
    far = at("wp-far", "10.1.0.1", "reg", "other-zone", services={key: ()})
    near = at("wp-near", "10.1.0.2", "reg", "zone", services={key: ()})
    return state_with(CLIENT, far, near, services=[waypoint, web_service(waypoint=WAYPOINT_BY_HOST)])


def test_a_waypoint_instance_in_the_clients_zone_is_preferred() -> None:
    state = _waypoint_state(LoadBalancingMode.FAILOVER)
    chosen = state.resolve_waypoint(WAYPOINT_BY_HOST, "net", VIP, first, client=CLIENT)
    assert chosen.workload is not None and chosen.workload.name == "wp-near"
    assert chosen.ip == ip("10.1.0.2")


def test_a_strict_waypoint_with_no_close_instance_is_refused() -> None:
    state = _waypoint_state(LoadBalancingMode.STRICT)
    elsewhere = at("c", "10.9.0.3", "r9", "z9", services={})
    with pytest.raises(UnknownWaypointError, match="routing preference"):
        state.resolve_waypoint(WAYPOINT_BY_HOST, "net", VIP, first, client=elsewhere)


# --- properties ----------------------------------------------------------------------------------------------------

_values = st.sampled_from(["", "a", "b"])
_workloads = st.builds(
    lambda i, net, r, z, s, n: pod(f"w{i}", f"10.0.1.{i}", network=net, locality=Locality(r, z, s), node=n),
    st.integers(0, 200),
    _values,
    _values,
    _values,
    _values,
    _values,
)


@given(
    st.lists(_workloads, max_size=8, unique_by=lambda w: w.uid),
    _workloads,
    st.lists(st.sampled_from(list(RoutingScope)), min_size=1, max_size=6),
    st.sampled_from([LoadBalancingMode.STRICT, LoadBalancingMode.FAILOVER]),
)
def test_the_kept_endpoints_are_a_non_empty_ordered_subset_unless_strict_finds_none(
    candidates: list[Workload], client: Workload, preference: list[RoutingScope], mode: LoadBalancingMode
) -> None:
    svc = service(mode, tuple(preference))
    kept = closest(svc, client_view(svc, client), candidates)
    assert [w for w in candidates if w in kept] == kept
    if mode is LoadBalancingMode.FAILOVER:
        assert bool(kept) == bool(candidates)
    else:
        # STRICT: exactly the endpoints equal to the client in every scope of the preference.
        values = {
            N: lambda w: w.network,
            R: lambda w: w.locality.region,
            Z: lambda w: w.locality.zone,
            SZ: lambda w: w.locality.subzone,
            NODE: lambda w: w.node,
            RoutingScope.CLUSTER: lambda w: w.cluster_id,
        }
        assert kept == [w for w in candidates if all(values[s](w) == values[s](client) for s in preference)]


def test_the_state_keeps_no_more_narrowed_lists_than_its_bound(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr("ambit.model.state.CLOSEST_CACHED", 2)
    state = _state(service(LoadBalancingMode.FAILOVER, PREFER_CLOSE), ALMOST, MATCH)
    for zone in ("z1", "z2", "z3", "zone"):
        _resolve(state, at("c", "10.9.0.9", "reg", zone, services={}))
    assert len(state._closest) <= 2  # the bound is the point of the test
    assert _resolve(state) == "match"
