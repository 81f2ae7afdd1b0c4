"""The ingress gateway's tunnel listener reading one PROXY header (:mod:`ambit.waypoint.ingress_tunnel` rules 1-4),
over real loopback TCP connections: what is accepted, what is refused and why, and that no payload byte is taken."""

from __future__ import annotations

import asyncio
import contextlib
import ipaddress
import socket
from collections.abc import AsyncIterator

import pytest

from ambit.model.identity import SpiffeId
from ambit.model.workload import ApplicationTunnel, AppTunnelProtocol
from ambit.proxyprotocol import TLV_PEER_IDENTITY, encode_v2, encode_v2_local
from ambit.waypoint.ingress_tunnel import Proxied, TunnelRefused, loopback_for, read_proxied, tunnel_ports

pytestmark = pytest.mark.timeout(30)

CLIENT = SpiffeId("cluster.local", "apps", "client")
SOURCE = (ipaddress.ip_address("10.1.0.5"), 40000)
TARGET = (ipaddress.ip_address("10.2.0.9"), 80)


@contextlib.asynccontextmanager
async def pair() -> AsyncIterator[tuple[socket.socket, socket.socket]]:
    """A connected (client, accepted) pair of non-blocking TCP sockets on 127.0.0.1."""
    listener = socket.create_server(("127.0.0.1", 0))
    client = socket.create_connection(listener.getsockname())
    accepted, _ = listener.accept()
    listener.close()
    accepted.setblocking(False)
    try:
        yield client, accepted
    finally:
        client.close()
        accepted.close()


async def read_after(data: bytes, *, within: float = 5.0) -> tuple[Proxied | TunnelRefused, bytes]:
    async with pair() as (client, accepted):
        client.sendall(data)
        client.shutdown(socket.SHUT_WR)
        result = await read_proxied(accepted, within)
        rest = b""
        if isinstance(result, Proxied):
            loop = asyncio.get_running_loop()
            while chunk := await loop.sock_recv(accepted, 4096):
                rest += chunk
        return result, rest


def test_ports_follow_the_binding() -> None:
    assert tunnel_ports(None, [80]) == frozenset()
    assert tunnel_ports(ApplicationTunnel(AppTunnelProtocol.NONE, 15088), [80]) == frozenset()
    assert tunnel_ports(ApplicationTunnel(AppTunnelProtocol.PROXY, 15088), [80, 443]) == {15088}
    assert tunnel_ports(ApplicationTunnel(AppTunnelProtocol.PROXY, 0), [80, 443]) == {80, 443}
    assert (loopback_for("10.0.0.1"), loopback_for("fd00::1"), loopback_for("0.0.0.0")) == (
        "127.0.0.1",
        "::1",
        "127.0.0.1",
    )


async def test_a_header_with_the_identity_tlv_names_client_target_and_identity_and_leaves_the_payload() -> None:
    header = encode_v2(SOURCE, TARGET, ((TLV_PEER_IDENTITY, str(CLIENT).encode()),))
    result, rest = await read_after(header + b"GET / HTTP/1.1\r\n\r\n")
    assert result == Proxied(("10.1.0.5", 40000), ("10.2.0.9", 80), CLIENT)
    assert rest == b"GET / HTTP/1.1\r\n\r\n"


async def test_no_identity_tlv_is_an_anonymous_client() -> None:
    result, _ = await read_after(encode_v2(SOURCE, TARGET))
    assert isinstance(result, Proxied) and result.identity is None


@pytest.mark.parametrize(
    ("data", "reason"),
    [
        (b"GET / HTTP/1.1\r\nhost: x\r\n\r\n", "bad header"),
        (encode_v2_local(), "bad header"),
        (encode_v2(SOURCE, TARGET, ((TLV_PEER_IDENTITY, b"spiffe://evil/../x"),)), "bad identity"),
        (encode_v2(SOURCE, TARGET, ((TLV_PEER_IDENTITY, b"\xff\xfe"),)), "bad identity"),
        (encode_v2(SOURCE, TARGET)[:20], "closed"),
    ],
)
async def test_anything_but_a_valid_proxy_header_is_refused_with_its_reason(data: bytes, reason: str) -> None:
    result, _ = await read_after(data)
    assert isinstance(result, TunnelRefused) and result.reason == reason, result


async def test_a_client_that_sends_nothing_is_refused_after_the_time_allowed() -> None:
    async with pair() as (_client, accepted):
        result = await read_proxied(accepted, 0.05)
    assert result == TunnelRefused("timeout", "no PROXY header within 0.05s")
