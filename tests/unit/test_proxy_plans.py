"""The node proxy's decisions without sockets: outbound (spec §6.3), inbound HBONE (§6.5), plaintext (§6.6)."""

from __future__ import annotations

import dataclasses
import ipaddress
from collections.abc import Callable

import pytest
from hypothesis import given
from hypothesis import strategies as st
from workload_builders import VIP, VIP6, WEB_KEY, first, ip, pod, state_with, web_service

from ambit.model.identity import SpiffeId
from ambit.model.state import Transport, WorkloadState
from ambit.model.workload import HealthPolicy, HealthStatus, PortMapping, TunnelProtocol, Workload
from ambit.proxy.authorization import allow_all
from ambit.proxy.errors import ResponseFlag
from ambit.proxy.plans import (
    ILLEGAL_PORTS,
    SELF_SERVED_PORTS,
    Dial,
    InboundFacts,
    Local,
    NodeView,
    OutboundFacts,
    OutboundPlan,
    Plain,
    Refuse,
    Tunnel,
    parse_ip,
    plan_inbound,
    plan_outbound,
    plan_plaintext,
)
from ambit.rbac import NOT_ALLOWED, Connection, Decision

CLIENT = pod("client-0", "198.18.16.2", services={}, service_account="client")
WEB = pod("web-0", "198.18.17.5")  # on node1, but not served by this proxy unless a test says so
PLAIN = pod("legacy-0", "198.18.17.9", services={}, tunnel_protocol=TunnelProtocol.NONE)
CLIENT_ID = SpiffeId("cluster.local", "apps", "client")
WEB_ID = SpiffeId("cluster.local", "apps", "web")


def node(*served: Workload, name: str = "node1") -> NodeView:
    return NodeView("", name, {w.uid for w in served})


def outbound(
    dst: str,
    port: int,
    *,
    state: WorkloadState | None = None,
    source: Workload | None = CLIENT,
    view: NodeView | None = None,
) -> OutboundPlan:
    state = state or state_with(CLIENT, WEB, PLAIN)
    facts = OutboundFacts(ip(dst), dst, port, source)
    return plan_outbound(facts, state, view or node(CLIENT), first)


# --- outbound: self-calls and unknown sources --------------------------------------------------------------------


@pytest.mark.parametrize("port", sorted(ILLEGAL_PORTS))
@pytest.mark.parametrize("dst", ["127.0.0.1", "127.0.0.53", "::1", "198.18.16.2"])
def test_a_call_to_the_proxys_own_ports_at_loopback_or_the_pods_own_address_is_refused_uncounted(
    dst: str, port: int
) -> None:
    plan = outbound(dst, port)
    assert isinstance(plan, Refuse) and not plan.counted
    assert "own port" in plan.reason


def test_a_self_call_is_refused_before_the_source_is_even_known() -> None:
    plan = outbound("127.0.0.1", 15001, source=None)
    assert isinstance(plan, Refuse) and "own port" in plan.reason


@pytest.mark.parametrize("port", [15008, 15001])
def test_the_proxys_ports_on_another_pods_address_are_not_a_self_call(port: int) -> None:
    plan = outbound("198.18.17.5", port)
    assert isinstance(plan, Tunnel) and plan.authority == f"198.18.17.5:{port}"


def test_the_pod_calling_its_own_address_on_an_application_port_is_not_a_self_call() -> None:
    plan = outbound("198.18.16.2", 8080, view=node(CLIENT))
    assert isinstance(plan, Local) and plan.workload == CLIENT


def test_an_unknown_source_is_refused_uncounted() -> None:
    plan = outbound("198.18.17.5", 8080, source=None)
    assert plan == Refuse(503, ResponseFlag.NO_ROUTE, "unknown source workload", counted=False)


# --- outbound: services ----------------------------------------------------------------------------------------


def test_a_service_vip_goes_to_an_endpoint_through_its_hbone_port_with_the_target_port() -> None:
    plan = outbound(str(VIP), 80)
    assert isinstance(plan, Tunnel)
    assert plan.address == ("198.18.17.5", 15008)
    assert plan.authority == "198.18.17.5:8080"
    assert plan.expected == frozenset({WEB_ID})
    assert plan.destination.service == web_service() and plan.destination.workload == WEB


def test_a_service_vip_over_ipv6_picks_the_endpoints_ipv6_address_and_brackets_the_authority() -> None:
    web6 = pod("web-0", "198.18.17.5", "fd00:18::5")
    plan = outbound(str(VIP6), 80, state=state_with(CLIENT, web6))
    assert isinstance(plan, Tunnel)
    assert plan.address == ("fd00:18::5", 15008) and plan.authority == "[fd00:18::5]:8080"


def test_the_services_subject_alt_names_are_expected_too() -> None:
    extra = "spiffe://cluster.local/ns/apps/sa/web-canary"
    state = state_with(CLIENT, WEB, services=[web_service(subject_alt_names=(extra, "not-a-spiffe-id"))])
    plan = outbound(str(VIP), 80, state=state)
    assert isinstance(plan, Tunnel) and plan.expected == frozenset({WEB_ID, SpiffeId.parse(extra)})


def test_a_service_without_a_healthy_endpoint_is_refused_and_counted_no_route() -> None:
    sick = dataclasses.replace(WEB, status=HealthStatus.UNHEALTHY)
    plan = outbound(str(VIP), 80, state=state_with(CLIENT, sick))
    assert isinstance(plan, Refuse) and plan.counted
    assert (plan.flag, plan.status) == (ResponseFlag.NO_ROUTE, 503)
    assert "no healthy upstream" in plan.reason


def test_a_service_that_allows_unhealthy_endpoints_still_goes_to_one() -> None:
    sick = dataclasses.replace(WEB, status=HealthStatus.UNHEALTHY)
    state = state_with(CLIENT, sick, services=[web_service(health_policy=HealthPolicy.ALLOW_ALL)])
    assert isinstance(outbound(str(VIP), 80, state=state), Tunnel)


def test_a_service_endpoint_without_hbone_is_reached_in_plaintext_on_its_target_port() -> None:
    legacy = dataclasses.replace(WEB, tunnel_protocol=TunnelProtocol.NONE)
    plan = outbound(str(VIP), 80, state=state_with(CLIENT, legacy))
    assert isinstance(plan, Plain) and plan.address == ("198.18.17.5", 8080)
    assert plan.destination.transport is Transport.PLAINTEXT and plan.destination.service is not None


def test_the_endpoint_is_the_one_choose_picks() -> None:
    other = pod("web-1", "198.18.17.6")
    state = state_with(CLIENT, WEB, other)
    plan = plan_outbound(OutboundFacts(VIP, str(VIP), 80, CLIENT), state, node(CLIENT), lambda c: c[-1])
    assert isinstance(plan, Tunnel) and plan.destination.workload == other


# --- outbound: pods and passthrough ----------------------------------------------------------------------------


def test_a_pod_address_goes_to_that_pod_on_the_same_port_whatever_its_health() -> None:
    sick = dataclasses.replace(WEB, status=HealthStatus.UNHEALTHY)
    plan = outbound("198.18.17.5", 9999, state=state_with(CLIENT, sick))
    assert isinstance(plan, Tunnel)
    assert plan.authority == "198.18.17.5:9999" and plan.destination.service is None
    assert plan.expected == frozenset({WEB_ID})


def test_a_pod_without_hbone_is_reached_in_plaintext() -> None:
    plan = outbound("198.18.17.9", 5432)
    assert isinstance(plan, Plain) and plan.address == ("198.18.17.9", 5432)


def test_an_address_outside_the_mesh_is_passed_through_to_the_original_destination() -> None:
    plan = outbound("203.0.113.7", 443)
    assert isinstance(plan, Plain) and plan.address == ("203.0.113.7", 443)
    assert plan.destination.transport is Transport.PASSTHROUGH and plan.destination.workload is None


def test_a_pod_of_another_network_is_passed_through() -> None:
    remote = dataclasses.replace(WEB, network="net-b")
    plan = outbound("198.18.17.5", 8080, state=state_with(CLIENT, remote))
    assert isinstance(plan, Plain) and plan.destination.transport is Transport.PASSTHROUGH


# --- outbound: the same-node path ------------------------------------------------------------------------------


def test_an_hbone_pod_served_by_this_proxy_is_delivered_locally() -> None:
    plan = outbound(str(VIP), 80, view=node(CLIENT, WEB))
    assert isinstance(plan, Local)
    assert plan.workload == WEB and plan.address == ("198.18.17.5", 8080)


def test_a_pod_the_state_places_on_another_node_is_tunnelled_even_if_a_local_pod_had_its_uid() -> None:
    assert isinstance(outbound(str(VIP), 80, view=node(CLIENT, WEB, name="node2")), Tunnel)


def test_a_plaintext_pod_on_this_node_is_dialled_not_delivered() -> None:
    assert isinstance(outbound("198.18.17.9", 5432, view=node(CLIENT, PLAIN)), Plain)


# --- inbound (HBONE) -------------------------------------------------------------------------------------------

LOCAL_IP = "198.18.17.5"


Seen = list[tuple[Workload, Connection]]


def recording(seen: Seen, allowed: bool = True) -> Callable[[Workload, Connection], Decision]:
    """An authorizer that notes what it was asked and answers ``allowed``."""

    def authorize(workload: Workload, connection: Connection) -> Decision:
        seen.append((workload, connection))
        return Decision(True) if allowed else Decision(False, NOT_ALLOWED)

    return authorize


def asked_as(source: str, identity: SpiffeId | None, destination: str, port: int) -> Connection:
    return Connection(ipaddress.ip_address(source), identity, ipaddress.ip_address(destination), port)


def inbound(
    authority: str | None,
    *,
    port: int = 0,
    local: Workload | None = WEB,
    local_ip: str | None = LOCAL_IP,
    identity: SpiffeId | None = CLIENT_ID,
    state: WorkloadState | None = None,
    authorize: Callable[[Workload, Connection], Decision] = allow_all,
) -> Dial | Refuse:
    facts = InboundFacts(local, local_ip, port, "198.18.16.2", identity, authority=authority)
    return plan_inbound(facts, state or state_with(CLIENT, WEB), authorize)


def test_a_connect_to_the_pods_own_address_dials_that_port_from_the_clients_address() -> None:
    assert inbound(f"{LOCAL_IP}:8080") == Dial(WEB, LOCAL_IP, 8080, "198.18.16.2")


@pytest.mark.parametrize("authority", ["198.18.17.5", "198.18.17.5:0", "198.18.17.5:65536", "web:http", "[fd00::1:80"])
def test_a_malformed_authority_is_a_400_uncounted(authority: str) -> None:
    plan = inbound(authority)
    assert isinstance(plan, Refuse) and (plan.status, plan.flag, plan.counted) == (400, ResponseFlag.NONE, False)


def test_the_authority_is_judged_before_the_workload_is_missed() -> None:
    plan = inbound("nonsense", local=None)
    assert isinstance(plan, Refuse) and plan.status == 400


def test_an_unknown_local_workload_is_a_503_no_route() -> None:
    plan = inbound(f"{LOCAL_IP}:8080", local=None)
    assert isinstance(plan, Refuse) and (plan.status, plan.flag, plan.counted) == (503, ResponseFlag.NO_ROUTE, False)


@pytest.mark.parametrize("authority", ["198.18.17.6:8080", "[fd00::5]:8080", "10.0.0.1:80"])
def test_an_ip_authority_other_than_the_arrival_address_is_an_ip_mismatch(authority: str) -> None:
    plan = inbound(authority)
    assert isinstance(plan, Refuse) and plan.status == 400 and "ip mismatch" in plan.reason


def test_an_ipv6_authority_equal_to_the_arrival_address_in_another_spelling_is_accepted() -> None:
    web6 = pod("web-0", "fd00:18::5")
    plan = inbound("[fd00:18:0::5]:8080", local=web6, local_ip="fd00:18::5", state=state_with(CLIENT, web6))
    assert plan == Dial(web6, "fd00:18::5", 8080, "198.18.16.2")


def test_a_service_hostname_the_pod_serves_maps_the_service_port_to_the_target_port() -> None:
    assert inbound("web.apps.svc.cluster.local:80") == Dial(WEB, LOCAL_IP, 8080, "198.18.16.2")


def test_a_service_hostname_maps_through_the_endpoints_own_port_map() -> None:
    mapped = dataclasses.replace(WEB, services={WEB_KEY: (PortMapping(80, 9080),)})
    plan = inbound("web.apps.svc.cluster.local:80", local=mapped, state=state_with(CLIENT, mapped))
    assert isinstance(plan, Dial) and plan.port == 9080


@pytest.mark.parametrize("host", ["db.apps.svc.cluster.local", "web.other.svc.cluster.local"])
def test_a_hostname_that_is_not_a_service_of_this_pod_is_a_400(host: str) -> None:
    db = web_service(name="db", hostname="db.apps.svc.cluster.local", vips=())
    plan = inbound(f"{host}:80", state=state_with(CLIENT, WEB, services=[web_service(), db]))
    assert isinstance(plan, Refuse) and plan.status == 400 and "unknown service" in plan.reason


@pytest.mark.parametrize("port", sorted(ILLEGAL_PORTS))
def test_a_connect_to_the_proxys_own_port_on_the_pods_address_is_a_400_uncounted(port: int) -> None:
    asked: Seen = []
    plan = inbound(f"{LOCAL_IP}:{port}", authorize=recording(asked))
    assert isinstance(plan, Refuse) and (plan.status, plan.flag, plan.counted) == (400, ResponseFlag.NONE, False)
    assert "own port" in plan.reason and not asked


@pytest.mark.parametrize("port", sorted(ILLEGAL_PORTS))
def test_the_proxys_own_pod_opens_only_its_metrics_and_readiness_ports(port: int) -> None:
    facts = InboundFacts(WEB, LOCAL_IP, 0, "198.18.16.2", CLIENT_ID, authority=f"{LOCAL_IP}:{port}", itself=True)
    plan = plan_inbound(facts, state_with(CLIENT, WEB), allow_all)
    if port in SELF_SERVED_PORTS:
        assert plan == Dial(WEB, LOCAL_IP, port, "198.18.16.2")
    else:
        assert isinstance(plan, Refuse) and plan.status == 400 and "own port" in plan.reason


@pytest.mark.parametrize("port", [15001, 15008, 15021])
def test_a_connect_to_the_proxys_own_port_at_loopback_is_a_400(port: int) -> None:
    plan = inbound(f"127.0.0.1:{port}")
    assert isinstance(plan, Refuse) and plan.status == 400


@pytest.mark.parametrize("target", [15006, 15008, 15000])
def test_a_service_port_mapped_onto_the_proxys_own_port_is_a_400(target: int) -> None:
    mapped = dataclasses.replace(WEB, services={WEB_KEY: (PortMapping(80, target),)})
    plan = inbound("web.apps.svc.cluster.local:80", local=mapped, state=state_with(CLIENT, mapped))
    assert isinstance(plan, Refuse) and plan.status == 400 and "own port" in plan.reason


def test_the_proxys_own_port_on_the_same_node_path_is_refused_too() -> None:
    plan = inbound(None, port=15008)
    assert isinstance(plan, Refuse) and "own port" in plan.reason


def test_the_authorizer_sees_the_peer_the_pod_and_the_mapped_port_and_its_refusal_is_a_counted_401() -> None:
    seen: Seen = []
    plan = inbound("web.apps.svc.cluster.local:80", authorize=recording(seen, allowed=False))
    assert seen == [(WEB, asked_as("198.18.16.2", CLIENT_ID, LOCAL_IP, 8080))]
    assert isinstance(plan, Refuse) and (plan.status, plan.flag, plan.counted) == (401, ResponseFlag.DENY, True)
    assert plan.reason == NOT_ALLOWED
    assert plan.stopped == Dial(WEB, LOCAL_IP, 8080, "198.18.16.2")


def test_the_authorizer_is_not_asked_about_a_connection_already_refused() -> None:
    asked: Seen = []
    inbound("198.18.17.6:8080", authorize=recording(asked))
    inbound(f"{LOCAL_IP}:8080", local=None, authorize=recording(asked))
    assert asked == []


# --- the same-node path ----------------------------------------------------------------------------------------


def test_the_same_node_path_dials_the_pods_first_address_on_the_given_port() -> None:
    assert inbound(None, port=8080, local_ip=None) == Dial(WEB, LOCAL_IP, 8080, "198.18.16.2")


def test_the_same_node_path_refuses_a_pod_without_an_address() -> None:
    bare = dataclasses.replace(WEB, addresses=())
    plan = inbound(None, port=8080, local_ip=None, local=bare)
    assert isinstance(plan, Refuse) and (plan.status, plan.flag) == (503, ResponseFlag.NO_ROUTE)


def test_the_same_node_path_runs_the_same_authorization() -> None:
    plan = inbound(
        None,
        port=8080,
        local_ip=None,
        authorize=lambda w, c: Decision(c.source_identity != CLIENT_ID, "explicitly denied by: apps/no-client"),
    )
    assert isinstance(plan, Refuse) and plan.flag is ResponseFlag.DENY


# --- plaintext (15006) -----------------------------------------------------------------------------------------


def plaintext(port: int, **kw: object) -> Dial | Refuse:
    facts = InboundFacts(kw.get("local", WEB), LOCAL_IP, port, "198.18.16.2", None)  # type: ignore[arg-type]
    return plan_plaintext(facts, state_with(CLIENT, WEB), kw.get("authorize", allow_all))  # type: ignore[arg-type]


@pytest.mark.parametrize("port", sorted(ILLEGAL_PORTS))
def test_a_plaintext_call_to_the_proxys_own_ports_is_refused_uncounted_even_for_an_unknown_pod(port: int) -> None:
    for local in (WEB, None):
        plan = plaintext(port, local=local)
        assert isinstance(plan, Refuse) and not plan.counted and "own port" in plan.reason


def test_plaintext_dials_the_original_destination_and_is_authorized_without_an_identity() -> None:
    seen: Seen = []
    plan = plaintext(8080, authorize=recording(seen))
    assert plan == Dial(WEB, LOCAL_IP, 8080, "198.18.16.2")
    assert seen == [(WEB, asked_as("198.18.16.2", None, LOCAL_IP, 8080))]
    assert isinstance(plan, Dial) and plan.connection == seen[0][1]


def test_plaintext_to_an_unknown_pod_is_a_503_no_route() -> None:
    plan = plaintext(8080, local=None)
    assert isinstance(plan, Refuse) and plan.flag is ResponseFlag.NO_ROUTE


# --- properties ------------------------------------------------------------------------------------------------


@given(
    st.ip_addresses(v=4).map(str),
    st.integers(min_value=1, max_value=65535),
    st.booleans(),
    st.sampled_from([CLIENT, WEB, PLAIN]),
)
def test_every_outbound_plan_is_one_of_the_four_and_only_a_refusal_lacks_a_destination(
    dst: str, port: int, known_source: bool, served: Workload
) -> None:
    plan = outbound(dst, port, source=CLIENT if known_source else None, view=node(CLIENT, served))
    assert isinstance(plan, Tunnel | Plain | Local | Refuse)
    if isinstance(plan, Tunnel):
        assert plan.address[1] == 15008 and plan.expected
    if isinstance(plan, Local):
        assert plan.workload.uid in {CLIENT.uid, served.uid}
    if not known_source:
        assert isinstance(plan, Refuse) and not plan.counted


@given(st.text(max_size=40), st.integers(min_value=0, max_value=70000))
def test_any_authority_gets_a_dial_or_a_refusal_never_an_exception(host: str, port: int) -> None:
    plan = inbound(f"{host}:{port}")
    assert isinstance(plan, Dial | Refuse)
    if isinstance(plan, Dial):
        assert plan.ip == LOCAL_IP and 0 < plan.port <= 65535


def test_parse_ip_remembers_addresses_without_changing_them_and_refuses_bad_text_every_time() -> None:
    for _ in range(3):
        assert parse_ip("198.18.0.7") == ipaddress.IPv4Address("198.18.0.7")
        assert parse_ip("fd00:ab::7") == ipaddress.IPv6Address("fd00:ab::7")
        with pytest.raises(ValueError):
            parse_ip("198.18.0.256")
    assert parse_ip("198.18.0.7") is parse_ip("198.18.0.7")
