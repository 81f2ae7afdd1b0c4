"""Namespace-visible services (spec §4.1 ``Service.visibility``, §9) and hostname endpoints (``Workload.hostname``)
in the pure parts: the state's lookups, the outbound plan, the DNS proxy's answer, the wire and file forms, and
``exportTo`` → visibility."""

from __future__ import annotations

import dataclasses

import dns.message
import pytest
from hypothesis import given
from hypothesis import strategies as st
from workload_builders import VIP, WEB_KEY, first, ip, pod, state_with, web_service

from ambit.controlplane.translate.skips import SERVICE_ENTRY, Skipped
from ambit.controlplane.translate.visibility import export_visibility
from ambit.dns.answer import Answered, DnsClient, Forward, decide
from ambit.model.dnsname import check_dns_name
from ambit.model.errors import LocalConfigError
from ambit.model.localconfig import LocalConfig, parse_local_config, render_local_config
from ambit.model.state import Transport
from ambit.model.workload import NetworkAddress, PortMapping, Service, TunnelProtocol, Visibility, Workload
from ambit.proxy.errors import ResponseFlag
from ambit.proxy.plans import NodeView, OutboundFacts, Plain, Refuse, Tunnel, plan_outbound
from ambit.xds.convert import XdsConversionError, address_from_proto, address_of

PRIVATE = web_service(visibility=Visibility.NAMESPACE)
CLIENT = pod("client-0", "198.18.16.2", services={})
OUTSIDER = dataclasses.replace(
    pod("outsider-0", "198.18.16.3", services={}), uid="Kubernetes//Pod/other/outsider-0", namespace="other"
)
WEB = pod("web-0", "198.18.17.5")
NODE = NodeView("", "node1", {CLIENT.uid, OUTSIDER.uid})


def outbound(source: Workload, dst: str = str(VIP), port: int = 80, **kw: object) -> Plain | Tunnel | Refuse:
    state = kw.pop("state", None) or state_with(CLIENT, OUTSIDER, WEB, services=[PRIVATE])
    plan = plan_outbound(OutboundFacts(ip(dst), dst, port, source), state, NODE, first)  # type: ignore[arg-type]
    assert not kw
    assert isinstance(plan, Plain | Tunnel | Refuse)
    return plan


# --- the state and the outbound plan ----------------------------------------------------------------------------


def test_a_namespace_visible_vip_is_the_service_for_its_own_namespace() -> None:
    plan = outbound(CLIENT)
    assert isinstance(plan, Tunnel) and plan.destination.service == PRIVATE
    assert plan.address == ("198.18.17.5", 15008)


def test_a_namespace_visible_vip_is_passthrough_for_another_namespace() -> None:
    plan = outbound(OUTSIDER)
    assert isinstance(plan, Plain)
    assert plan.destination.transport is Transport.PASSTHROUGH and plan.destination.service is None
    assert plan.address == (str(VIP), 80)


def test_a_public_service_sharing_the_vip_answers_for_other_namespaces() -> None:
    public = dataclasses.replace(web_service(), namespace="shared")
    state = state_with(CLIENT, OUTSIDER, WEB, services=[public, PRIVATE])
    assert state.find_service_by_vip("", VIP) == PRIVATE  # the latest added, without a client
    assert state.find_service_by_vip("", VIP, "other") == public
    assert state.find_service_by_vip("", VIP, "apps") == PRIVATE


def test_a_waypoint_of_an_invisible_service_is_not_taken() -> None:
    from workload_builders import WAYPOINT_BY_HOST

    state = state_with(CLIENT, OUTSIDER, WEB, services=[dataclasses.replace(PRIVATE, waypoint=WAYPOINT_BY_HOST)])
    assert isinstance(outbound(OUTSIDER, state=state), Plain)  # passthrough, not "waypoint not found"
    refused = outbound(CLIENT, state=state)
    assert isinstance(refused, Refuse) and "waypoint" in refused.reason


HOSTNAME_EP = Workload(
    uid="Kubernetes/networking.istio.io/ServiceEntry/apps/ext/api.example.com",
    name="ext",
    namespace="apps",
    addresses=(),
    hostname="api.example.com",
    services={WEB_KEY: (PortMapping(80, 8443),)},
)


def test_a_hostname_endpoint_is_picked_and_planned_as_a_name_to_resolve() -> None:
    state = state_with(CLIENT, HOSTNAME_EP)
    plan = outbound(CLIENT, state=state)
    assert isinstance(plan, Plain)
    assert plan.hostname == "api.example.com" and plan.address == ("api.example.com", 8443)
    assert plan.destination.workload == HOSTNAME_EP and plan.destination.resolve_hostname == "api.example.com"
    assert plan.destination.ip == VIP  # the original destination: its family picks the address


def test_a_hostname_endpoint_with_hbone_is_refused_cleanly() -> None:
    state = state_with(CLIENT, dataclasses.replace(HOSTNAME_EP, tunnel_protocol=TunnelProtocol.HBONE))
    plan = outbound(CLIENT, state=state)
    assert isinstance(plan, Refuse) and plan.flag is ResponseFlag.NO_ROUTE and "hostname" in plan.reason


def test_an_endpoint_with_neither_address_nor_hostname_is_never_picked() -> None:
    state = state_with(CLIENT, dataclasses.replace(HOSTNAME_EP, hostname=""))
    plan = outbound(CLIENT, state=state)
    assert isinstance(plan, Refuse) and plan.flag is ResponseFlag.NO_ROUTE


# --- the DNS proxy ----------------------------------------------------------------------------------------------

API_PRIVATE = Service("api", "team-a", "api.example.com", (NetworkAddress("", ip("240.240.0.1")),),
                      visibility=Visibility.NAMESPACE)  # fmt: skip
API_PUBLIC = Service("api", "team-b", "api.example.com", (NetworkAddress("", ip("240.240.0.2")),))


def ask(namespace: str, *services: Service, host: str = "api.example.com") -> Answered | Forward:
    state = state_with(services=list(services))
    return decide(state, DnsClient(namespace=namespace), dns.message.make_query(host, "A"))


def addresses(decision: Answered | Forward) -> list[str]:
    assert isinstance(decision, Answered), decision
    return [rdata.address for rrset in decision.response.answer for rdata in rrset]


def test_the_dns_proxy_answers_a_namespace_visible_name_in_its_own_namespace() -> None:
    assert addresses(ask("team-a", API_PRIVATE)) == ["240.240.0.1"]


def test_the_dns_proxy_drops_a_namespace_visible_name_for_other_namespaces() -> None:
    assert isinstance(ask("team-c", API_PRIVATE), Forward)  # as if unknown: upstream decides, no NXDOMAIN here
    assert addresses(ask("team-c", API_PRIVATE, API_PUBLIC)) == ["240.240.0.2"]  # no shadowing
    assert addresses(ask("team-a", API_PRIVATE, API_PUBLIC)) == ["240.240.0.1"]


# --- wire and file forms ----------------------------------------------------------------------------------------


def test_visibility_and_hostname_round_trip_through_xds() -> None:
    for item in (API_PRIVATE, API_PUBLIC, HOSTNAME_EP):
        assert address_from_proto(address_of(item)) == item


@pytest.mark.parametrize(
    ("change", "problem"),
    [
        (lambda m: setattr(m.workload, "hostname", "bad name"), "not a host name"),
        (lambda m: setattr(m.workload, "hostname", "a" * 64 + ".com"), "longer than 63"),
        (lambda m: m.workload.addresses.append(bytes(4)), "not both"),
    ],
)
def test_a_bad_hostname_from_the_control_plane_is_refused_with_its_field(change: object, problem: str) -> None:
    message = address_of(HOSTNAME_EP)
    change(message)  # type: ignore[operator]
    with pytest.raises(XdsConversionError, match=problem) as info:
        address_from_proto(message)
    assert "workload.hostname" in str(info.value)


def test_an_unknown_visibility_from_the_control_plane_is_refused() -> None:
    message = address_of(API_PRIVATE)
    message.service.visibility = 7  # type: ignore[assignment]
    with pytest.raises(XdsConversionError, match=r"service\.visibility"):
        address_from_proto(message)


def test_visibility_and_hostname_round_trip_through_the_local_config() -> None:
    config = LocalConfig(workloads=(HOSTNAME_EP,), services=(API_PRIVATE, API_PUBLIC))
    text = render_local_config(config)
    assert "visibility: Namespace" in text and "hostname: api.example.com" in text
    assert parse_local_config(text) == config


def test_a_local_config_workload_with_both_addresses_and_hostname_is_refused() -> None:
    text = "workloads:\n- {uid: u, name: n, namespace: ns, workloadIps: [198.18.0.1], hostname: a.example.com}\n"
    with pytest.raises(LocalConfigError, match=r"workloads\[0\]\.hostname"):
        parse_local_config(text)


@given(st.text(max_size=300))
def test_any_text_is_judged_as_a_host_name_without_raising(text: str) -> None:
    problem = check_dns_name(text)
    if not problem:
        name = text.rstrip(".")
        assert 0 < len(name) <= 253 and all(0 < len(label) <= 63 for label in name.split("."))
        dns.message.make_query(text, "A")  # a name we accept, dnspython can ask for


# --- exportTo -> visibility -------------------------------------------------------------------------------------


@pytest.mark.parametrize(
    ("export", "expected", "reported"),
    [
        (None, Visibility.PUBLIC, False),
        ([], Visibility.PUBLIC, False),
        (["*"], Visibility.PUBLIC, False),
        ([".", "*"], Visibility.PUBLIC, False),
        (["."], Visibility.NAMESPACE, False),
        (["team-a"], Visibility.NAMESPACE, False),
        (["~"], Visibility.NAMESPACE, False),
        ([".", "team-b"], Visibility.PUBLIC, True),
        (".", Visibility.NAMESPACE, False),  # the Service annotation's comma-separated form
        (" . , team-a ", Visibility.NAMESPACE, False),
        ("team-b,team-c", Visibility.PUBLIC, True),
        (42, Visibility.PUBLIC, False),
    ],
)
def test_export_to_becomes_a_visibility(export: object, expected: Visibility, reported: bool) -> None:
    skips: list[Skipped] = []
    obj = {"metadata": {"name": "e", "namespace": "team-a"}}
    assert export_visibility(SERVICE_ENTRY, obj, "spec.exportTo", export, skips) is expected
    assert bool(skips) is reported
