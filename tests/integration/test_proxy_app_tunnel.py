"""A waypoint pod with an application tunnel (spec §6.5 steps 3 and 5) behind the real HBONE inbound path: real
sockets, TLS and HBONE on loopback (:mod:`tests.integration.inbound_rig`).

The served pod ``apps/web`` at ``POD_IP`` is a waypoint instance whose workload carries ``application_tunnel``. With
PROXY, a CONNECT for any address is dialled to loopback on the tunnel port, and what arrives there starts with a
PROXY v2 header naming the HBONE client's address, the CONNECT's target and (TLV 0xD0) the client's verified SPIFFE
identity, then the client's bytes. With NONE, the pod's own address is dialled on the tunnel port, bytes as sent.
"""

from __future__ import annotations

import asyncio
import contextlib
import dataclasses
import ipaddress
from collections.abc import AsyncIterator
from pathlib import Path

import pytest
from tests.integration.inbound_rig import POD_IP, SERVER, TD, InboundProxy, inbound_proxy
from tests.unit.workload_builders import WAYPOINT_KEY, pod, waypoint_service, web_service

from ambit.model.identity import SpiffeId
from ambit.model.workload import ApplicationTunnel, AppTunnelProtocol
from ambit.proxy.hbone_client import HboneClient
from ambit.proxy.sockets import HostSocketFactory, connect
from ambit.proxyprotocol import TLV_PEER_IDENTITY, ProxyHeader, ProxyHeaderDecoder, ProxyHeaderError, encode_v2

pytestmark = pytest.mark.timeout(30)

FACTORY = HostSocketFactory(mark=None)
CLIENT = SpiffeId(TD, "apps", "client")
VIP = "198.19.0.10"


@dataclasses.dataclass
class Arrival:
    peer: tuple[str, int]
    header: ProxyHeader | None
    payload: bytes


@contextlib.asynccontextmanager
async def tunnel_app(host: str, *, expect_header: bool) -> AsyncIterator[tuple[int, asyncio.Queue[Arrival]]]:
    """An application on ``host``: reads a PROXY header (when expected) and 4 payload bytes, echoes the payload."""
    arrivals: asyncio.Queue[Arrival] = asyncio.Queue()

    async def serve(reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        peer = writer.get_extra_info("peername")[:2]
        header, rest = None, b""
        try:
            if expect_header:
                decoder = ProxyHeaderDecoder()
                while header is None:
                    data = await reader.read(4096)
                    if not data:
                        return
                    header = decoder.receive_data(data)
                rest = decoder.trailing
            while len(rest) < 4:
                data = await reader.read(4096)
                if not data:
                    return
                rest += data
            await arrivals.put(Arrival(peer, header, rest))
            writer.write(rest)
            await writer.drain()
        except (ProxyHeaderError, ConnectionError):
            pass
        finally:
            writer.close()

    server = await asyncio.start_server(serve, host, 0)
    try:
        yield server.sockets[0].getsockname()[1], arrivals
    finally:
        server.close()
        await server.wait_closed()


@contextlib.asynccontextmanager
async def tunnelled_waypoint(tmp_path: Path, tunnel: ApplicationTunnel) -> AsyncIterator[InboundProxy]:
    instance = pod("web", POD_IP, services={WAYPOINT_KEY: ()}, node="node-1", application_tunnel=tunnel)
    async with inbound_proxy(tmp_path, instance) as proxy:
        proxy.ctx.state.replace_all([instance], [web_service(), waypoint_service()])
        yield proxy


async def exchange(
    proxy: InboundProxy, authority: str, first: bytes = b"ping", identity: SpiffeId = CLIENT
) -> tuple[bytes, tuple[str, int]]:
    """Open a tunnel as ``identity``, send ``first``, return the echo and the HBONE connection's own address."""
    cert = await proxy.ca.fetch_certificate(identity)
    sock = await connect(FACTORY, proxy.hbone)
    local = sock.getsockname()[:2]
    client = await HboneClient.connect(sock, cert, frozenset({SERVER}), trust_domain=TD)
    try:
        stream = await client.open_tunnel(authority, [])
        await stream.write(first)
        echoed = b""
        async with asyncio.timeout(5):
            while len(echoed) < len(first):
                echoed += await stream.read()
        stream.abort()
        return echoed, local
    finally:
        await client.aclose()


async def test_proxy_delivers_to_loopback_with_the_clients_identity_in_the_header(tmp_path: Path) -> None:
    async with tunnel_app("127.0.0.1", expect_header=True) as (port, arrivals):
        tunnel = ApplicationTunnel(AppTunnelProtocol.PROXY, port)
        async with tunnelled_waypoint(tmp_path, tunnel) as proxy:
            # The VIP of a Service that does not even use this waypoint: no ip mismatch with a tunnel.
            echoed, client_addr = await exchange(proxy, f"{VIP}:80")
            assert echoed == b"ping"
            async with asyncio.timeout(5):
                arrival = await arrivals.get()
    assert arrival.peer[0] == "127.0.0.1"  # from loopback, inside the pod
    assert arrival.header is not None and arrival.payload == b"ping"
    assert arrival.header.source == (ipaddress.ip_address(client_addr[0]), client_addr[1])
    assert arrival.header.destination == (ipaddress.ip_address(VIP), 80)
    assert arrival.header.tlv(TLV_PEER_IDENTITY) == str(CLIENT).encode()


async def test_none_delivers_plain_bytes_to_the_pod_on_the_tunnel_port(tmp_path: Path) -> None:
    tunnel = ApplicationTunnel(AppTunnelProtocol.NONE)
    async with (
        tunnel_app(POD_IP, expect_header=False) as (port, arrivals),
        tunnelled_waypoint(tmp_path, dataclasses.replace(tunnel, port=port)) as proxy,
    ):
        echoed, _ = await exchange(proxy, f"{VIP}:80")
        assert echoed == b"ping"
        async with asyncio.timeout(5):
            arrival = await arrivals.get()
    assert arrival.header is None and arrival.payload == b"ping"


async def test_a_client_cannot_claim_another_identity_with_a_header_of_its_own(tmp_path: Path) -> None:
    # Attack: the client starts its tunnel with a forged PROXY header naming an admin identity. The node proxy's
    # header (the verified identity) comes first; the forgery is only payload, which the application sees as such.
    admin = SpiffeId(TD, "istio-system", "admin")
    forged = encode_v2(
        (ipaddress.ip_address("10.9.9.9"), 1),
        (ipaddress.ip_address(VIP), 80),
        ((TLV_PEER_IDENTITY, str(admin).encode()),),
    )
    async with (
        tunnel_app("127.0.0.1", expect_header=True) as (port, arrivals),
        tunnelled_waypoint(tmp_path, ApplicationTunnel(AppTunnelProtocol.PROXY, port)) as proxy,
    ):
        echoed, _ = await exchange(proxy, f"{VIP}:80", first=forged)
        async with asyncio.timeout(5):
            arrival = await arrivals.get()
    assert arrival.header is not None and arrival.header.tlv(TLV_PEER_IDENTITY) == str(CLIENT).encode()
    assert echoed == forged and arrival.payload.startswith(forged[:12])
