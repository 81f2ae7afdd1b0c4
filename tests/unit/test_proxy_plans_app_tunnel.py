"""The node proxy's application tunnel decisions without sockets (spec §6.5 steps 3 and 5): inbound rules 3 and 6
of :mod:`ambit.proxy.plans`, for a waypoint pod whose Gateway has an inbound binding."""

from __future__ import annotations

import dataclasses
import ipaddress
import struct

import pytest
from workload_builders import VIP, WAYPOINT_VIP, pod, state_with, waypoint_pod, waypoint_service, web_service

from ambit.model.identity import SpiffeId
from ambit.model.workload import ApplicationTunnel, AppTunnelProtocol, NetworkAddress, PortMapping, Workload
from ambit.proxy.authorization import allow_all
from ambit.proxy.plans import AppTunnelHeader, Dial, InboundFacts, Refuse, plan_inbound, plan_plaintext
from ambit.proxyprotocol import TLV_PEER_IDENTITY, ProxyHeaderDecoder
from ambit.rbac import NOT_ALLOWED, Decision

CLIENT = pod("client-0", "198.18.16.2", services={}, service_account="client")
CLIENT_ID = SpiffeId("cluster.local", "apps", "client")
WAYPOINT_IP = "198.18.18.7"
PROXY_15088 = ApplicationTunnel(AppTunnelProtocol.PROXY, 15088)
PORTS = (PortMapping(80, 80),)
GATEWAY_SERVICE = waypoint_service(ports=PORTS)
"""The gateway's Service: an HTTP port (a sandwich serves its listeners' ports)."""


def gateway_pod(tunnel: ApplicationTunnel | None) -> Workload:
    return waypoint_pod(application_tunnel=tunnel)


def inbound(
    authority: str | None,
    local: Workload,
    *,
    port: int = 0,
    identity: SpiffeId | None = CLIENT_ID,
    source: str = "198.18.16.2",
) -> Dial | Refuse:
    state = state_with(CLIENT, local, services=[web_service(), GATEWAY_SERVICE])
    facts = InboundFacts(local, WAYPOINT_IP, port, source, identity, authority, source_port=40000)
    return plan_inbound(facts, state, allow_all)


def test_proxy_dials_loopback_on_the_tunnel_port_with_the_client_and_the_original_target_in_the_header() -> None:
    local = gateway_pod(PROXY_15088)
    plan = inbound("198.19.0.10:80", local)  # another Service's VIP: no ip mismatch for a tunnelled waypoint
    assert isinstance(plan, Dial)
    assert (plan.ip, plan.port, plan.source_ip) == ("127.0.0.1", 15088, "198.18.16.2")
    assert plan.header == AppTunnelHeader((ipaddress.ip_address("198.18.16.2"), 40000), (VIP, 80), CLIENT_ID)


def test_the_header_is_the_bytes_the_gateway_decodes_with_the_identity_tlv() -> None:
    plan = inbound("198.19.0.10:80", gateway_pod(PROXY_15088))
    assert isinstance(plan, Dial) and plan.header is not None
    decoder = ProxyHeaderDecoder()
    header = decoder.receive_data(plan.header.encode() + b"GET /")
    assert header is not None and decoder.trailing == b"GET /"
    assert header.source == (ipaddress.ip_address("198.18.16.2"), 40000)
    assert header.destination == (VIP, 80)
    assert header.tlv(TLV_PEER_IDENTITY) == b"spiffe://cluster.local/ns/apps/sa/client"


def test_a_client_without_identity_gets_no_identity_tlv() -> None:
    plan = inbound(None, gateway_pod(PROXY_15088), port=80, identity=None)
    assert isinstance(plan, Dial) and plan.header is not None and plan.header.identity is None
    header = ProxyHeaderDecoder().receive_data(plan.header.encode())
    assert header is not None and header.tlvs == ()


def test_port_zero_keeps_the_clients_port() -> None:
    plan = inbound("198.19.0.10:80", gateway_pod(ApplicationTunnel(AppTunnelProtocol.PROXY, 0)))
    assert isinstance(plan, Dial) and (plan.ip, plan.port) == ("127.0.0.1", 80)


def test_none_dials_the_pod_as_today_on_the_tunnel_port_and_waives_the_ip_check() -> None:
    plan = inbound("198.19.0.10:80", gateway_pod(ApplicationTunnel(AppTunnelProtocol.NONE, 8080)))
    assert plan == Dial(gateway_pod(ApplicationTunnel(AppTunnelProtocol.NONE, 8080)), WAYPOINT_IP, 8080, "198.18.16.2")
    assert isinstance(plan, Dial) and plan.header is None
    plain = inbound("198.19.0.10:80", gateway_pod(ApplicationTunnel(AppTunnelProtocol.NONE, 0)))
    assert isinstance(plain, Dial) and (plain.ip, plain.port, plain.header) == (WAYPOINT_IP, 80, None)


def test_without_a_tunnel_a_foreign_authority_is_still_an_ip_mismatch() -> None:
    plan = inbound("198.19.0.10:80", gateway_pod(None))
    assert isinstance(plan, Refuse) and plan.status == 400 and "ip mismatch" in plan.reason


def test_a_hostname_authority_puts_the_services_vip_ipv4_first_in_the_header() -> None:
    plan = inbound("waypoint.apps.svc.cluster.local:80", gateway_pod(PROXY_15088))
    assert isinstance(plan, Dial) and plan.header is not None
    assert plan.header.target == (WAYPOINT_VIP, 80)


def test_a_hostname_without_a_vip_is_refused() -> None:
    local = gateway_pod(PROXY_15088)
    state = state_with(CLIENT, local, services=[waypoint_service(vips=(), ports=PORTS)])
    facts = InboundFacts(local, WAYPOINT_IP, 0, "198.18.16.2", CLIENT_ID, "waypoint.apps.svc.cluster.local:80")
    plan = plan_inbound(facts, state, allow_all)
    assert isinstance(plan, Refuse) and plan.status == 400 and "no IP address for service" in plan.reason


def test_a_v6_pod_dials_v6_loopback() -> None:
    local = waypoint_pod("waypoint-0", "fd00:18::7", application_tunnel=PROXY_15088)
    state = state_with(CLIENT, local, services=[waypoint_service()])
    facts = InboundFacts(local, "fd00:18::7", 0, "fd00:16::2", CLIENT_ID, "[fd00:19::10]:80", source_port=1)
    plan = plan_inbound(facts, state, allow_all)
    assert isinstance(plan, Dial) and plan.ip == "::1"


def test_a_client_and_target_of_different_families_are_refused() -> None:
    plan = inbound("[fd00:19::10]:80", gateway_pod(PROXY_15088))
    assert isinstance(plan, Refuse) and plan.status == 400 and "differ in family" in plan.reason


@pytest.mark.parametrize("port", [15008, 15001, 15006])
def test_a_tunnel_port_that_is_the_proxys_own_is_refused(port: int) -> None:
    plan = inbound("198.19.0.10:80", gateway_pod(ApplicationTunnel(AppTunnelProtocol.PROXY, port)))
    assert isinstance(plan, Refuse) and plan.status == 400 and "own port" in plan.reason


def test_the_same_node_path_takes_the_tunnel_too() -> None:
    plan = inbound(None, gateway_pod(PROXY_15088), port=80)
    assert isinstance(plan, Dial) and (plan.ip, plan.port) == ("127.0.0.1", 15088)
    assert plan.header is not None and plan.header.target == (ipaddress.ip_address(WAYPOINT_IP), 80)


def test_plaintext_never_takes_the_tunnel() -> None:
    local = gateway_pod(PROXY_15088)
    state = state_with(CLIENT, local, services=[waypoint_service()])
    plan = plan_plaintext(InboundFacts(local, WAYPOINT_IP, 80, "198.18.16.2", None), state, allow_all)
    assert plan == Dial(local, WAYPOINT_IP, 80, "198.18.16.2")


def test_authorization_still_decides_and_a_denial_stops_the_tunnelled_dial() -> None:
    local = gateway_pod(PROXY_15088)
    state = state_with(CLIENT, local, services=[waypoint_service()])
    facts = InboundFacts(local, WAYPOINT_IP, 0, "198.18.16.2", CLIENT_ID, "198.19.0.10:80", source_port=1)
    plan = plan_inbound(facts, state, lambda _w, _c: Decision(False, NOT_ALLOWED))
    assert isinstance(plan, Refuse) and plan.status == 401
    assert plan.stopped is not None and plan.stopped.header is not None


def test_the_tunnel_target_encodes_exactly() -> None:
    header = AppTunnelHeader((ipaddress.ip_address("10.0.0.1"), 1), (ipaddress.ip_address("10.0.0.2"), 2), CLIENT_ID)
    identity = b"spiffe://cluster.local/ns/apps/sa/client"
    assert header.encode().endswith(bytes((0xD0,)) + struct.pack("!H", len(identity)) + identity)


def test_a_service_vip_on_the_pods_network_wins() -> None:
    local = dataclasses.replace(gateway_pod(PROXY_15088), network="net1")
    remote = NetworkAddress("net2", ipaddress.ip_address("198.19.9.9"))
    home = NetworkAddress("net1", ipaddress.ip_address("fd00:19::99"))
    state = state_with(CLIENT, local, services=[waypoint_service(vips=(remote, home), ports=PORTS)])
    facts = InboundFacts(local, WAYPOINT_IP, 0, "fd00:16::2", CLIENT_ID, "waypoint.apps.svc.cluster.local:80")
    plan = plan_inbound(facts, state, allow_all)
    assert isinstance(plan, Dial) and plan.header is not None
    assert plan.header.target[0] == home.ip
