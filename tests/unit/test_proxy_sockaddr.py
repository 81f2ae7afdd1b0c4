"""The original destination's socket address, decoded from the bytes ``SO_ORIGINAL_DST`` and
``IP6T_SO_ORIGINAL_DST`` return (spec §2.1), and the host:port text the proxy writes for either family."""

from __future__ import annotations

import ipaddress
import socket
import struct

import pytest
from hypothesis import given
from hypothesis import strategies as st

from ambit.hbone.headers import hostport, parse_authority
from ambit.inpod.listeners import IPV4_LISTENERS, POD_LISTENERS, pod_listeners
from ambit.model.identity import SpiffeId
from ambit.model.workload import GatewayAddress, NamespacedHostname, NetworkAddress, parse_ip
from ambit.proxy.pool import PoolKey
from ambit.proxy.sockaddr import (
    SOCKADDR_IN6_SIZE,
    SOCKADDR_IN_SIZE,
    SockaddrError,
    decode_sockaddr,
    encode_sockaddr,
)

ports = st.integers(min_value=0, max_value=65535)
v4 = st.ip_addresses(v=4).map(str)
v6 = st.ip_addresses(v=6).filter(lambda ip: ip.ipv4_mapped is None).map(str)


@given(v4, ports)
def test_an_ipv4_socket_address_decodes_to_its_address_and_port(ip: str, port: int) -> None:
    raw = encode_sockaddr(ip, port)
    assert len(raw) == SOCKADDR_IN_SIZE
    assert decode_sockaddr(raw, socket.AF_INET) == (ip, port)


@given(st.binary(min_size=4, max_size=4), ports, st.binary(min_size=8, max_size=8))
def test_any_four_ipv4_address_octets_decode_to_ipaddress_text_whatever_the_padding(
    octets: bytes, port: int, padding: bytes
) -> None:
    """The dotted quad is written in C (``inet_ntoa``): the same text as ``ipaddress`` gives, for every address."""
    raw = struct.pack("=H", socket.AF_INET) + struct.pack("!H", port) + octets + padding
    assert decode_sockaddr(raw, socket.AF_INET) == (str(ipaddress.IPv4Address(octets)), port)


@given(v6, ports, st.binary(min_size=4, max_size=4), st.binary(min_size=4, max_size=4))
def test_an_ipv6_socket_address_decodes_to_its_canonical_address_and_port_whatever_its_flow_and_scope(
    ip: str, port: int, flow: bytes, scope: bytes
) -> None:
    raw = encode_sockaddr(ip, port)
    assert len(raw) == SOCKADDR_IN6_SIZE
    raw = raw[:4] + flow + raw[8:24] + scope
    assert decode_sockaddr(raw, socket.AF_INET6) == (str(ipaddress.IPv6Address(ip)), port)


def test_the_kernels_own_sockaddr_in6_layout_is_what_is_decoded() -> None:
    """Checked against the C layout: family in host order, port big-endian, flowinfo, 16 bytes, scope id."""
    raw = struct.pack("=H", socket.AF_INET6) + struct.pack("!HI", 8080, 0) + bytes.fromhex("fd00ab00" + "0" * 23 + "2")
    raw += struct.pack("=I", 0)
    assert decode_sockaddr(raw, socket.AF_INET6) == ("fd00:ab00::2", 8080)


def test_an_ipv4_mapped_ipv6_destination_is_given_as_the_ipv4_address() -> None:
    raw = encode_sockaddr("::ffff:198.18.0.7", 443)
    assert decode_sockaddr(raw, socket.AF_INET6) == ("198.18.0.7", 443)


@pytest.mark.parametrize(
    ("raw", "family", "says"),
    [
        (b"", socket.AF_INET, "16 bytes, got 0"),
        (encode_sockaddr("198.18.0.1", 1)[:15], socket.AF_INET, "16 bytes, got 15"),
        (encode_sockaddr("fd00:ab::1", 1)[:27], socket.AF_INET6, "28 bytes, got 27"),
        (encode_sockaddr("fd00:ab::1", 1), socket.AF_INET, "expected a AF_INET socket address, got family 10"),
        (encode_sockaddr("198.18.0.1", 1) + bytes(12), socket.AF_INET6, "got family 2"),
        (encode_sockaddr("198.18.0.1", 1), socket.AF_UNIX, "not an IP address family"),
    ],
)
def test_a_short_or_foreign_socket_address_is_refused_with_a_clear_error(
    raw: bytes, family: socket.AddressFamily, says: str
) -> None:
    with pytest.raises(SockaddrError, match=says):
        decode_sockaddr(raw, family)


@given(st.binary(max_size=40), st.sampled_from([socket.AF_INET, socket.AF_INET6]))
def test_any_bytes_decode_to_an_address_or_a_sockaddr_error_and_nothing_else(
    raw: bytes, family: socket.AddressFamily
) -> None:
    try:
        ip, port = decode_sockaddr(raw, family)
    except SockaddrError:
        return
    assert 0 <= port <= 65535
    ipaddress.ip_address(ip)


@given(st.one_of(v4, v6), ports.filter(lambda port: port > 0))
def test_host_port_text_brackets_ipv6_and_parses_back_as_a_connect_authority(ip: str, port: int) -> None:
    text = hostport(ip, port)
    assert text.startswith("[") == (":" in ip)
    assert parse_authority(text) == (str(ipaddress.ip_address(ip)), port)


def test_a_pool_key_and_a_waypoint_address_name_an_ipv6_destination_unambiguously() -> None:
    key = PoolKey(
        SpiffeId("cluster.local", "apps", "client"),
        frozenset({SpiffeId("cluster.local", "apps", "server")}),
        "fd00:ab:1::1",
        ("fd00:ab:1::2", 15008),
    )
    assert str(key).endswith("@[fd00:ab:1::2]:15008")
    assert str(GatewayAddress(NetworkAddress("net", parse_ip("fd00:ab::9")))) == "net/[fd00:ab::9]:15008"
    assert str(GatewayAddress(NetworkAddress("", parse_ip("198.18.0.9")))) == "/198.18.0.9:15008"
    assert str(GatewayAddress(NamespacedHostname("apps", "wp.apps.svc.cluster.local"))) == (
        "apps/wp.apps.svc.cluster.local:15008"
    )


def test_with_ipv6_on_every_capture_port_and_the_dns_proxy_listen_in_both_families() -> None:
    specs = pod_listeners(ipv6=True)
    assert specs == POD_LISTENERS
    by_family = {(spec.port, spec.kind, spec.family): spec for spec in specs}
    for spec in IPV4_LISTENERS:
        twin = by_family[(spec.port, spec.kind, socket.AF_INET6)]
        assert (twin.transparent, twin.optional, spec.optional) == (spec.transparent, True, False)
        assert twin.host == ("::1" if spec.host == "127.0.0.1" else "::")


def test_with_ipv6_off_pods_get_ipv4_listeners_only() -> None:
    assert pod_listeners(ipv6=False) == IPV4_LISTENERS
    assert {spec.family for spec in IPV4_LISTENERS} == {socket.AF_INET}
