"""The waypoint inbound binding end to end on loopback: a sandwich ingress Gateway annotated
``ambient.istio.io/waypoint-inbound-binding: PROXY/<port>`` learns each client's identity from its node proxy's PROXY
header and authorizes by it, real sockets throughout.

The objects are those of :mod:`tests.integration.sandwich_rig` (Istio's TestSimpleHTTPSandwich) with the
annotation and an AuthorizationPolicy on the Gateway (``targetRefs``) that allows only the client's SPIFFE
id, translated by :func:`translate_all`. The gateway pod's node proxy (the rig's inbound side) then delivers each
tunnel to ``127.0.0.1:<port>`` after a PROXY v2 header; the real :class:`IngressGateway` listens there (loopback
only), serves the request as if it had come to its listener port, and allows it for the client's identity (200) and
for no other (403). The attacks: a header of the client's own making (inside its tunnel, or sent straight to the
gateway's listener) is never read as an identity, and the tunnel port is not reachable at the gateway's address.
"""

from __future__ import annotations

import asyncio
import contextlib
import ipaddress
from pathlib import Path

import pytest
from tests.integration import sandwich_rig
from tests.integration.inbound_rig import POD_IP, SERVER, TD, InboundProxy
from tests.integration.sandwich_rig import CLIENT, FACTORY, HOSTS, VIP, Sandwich
from tests.integration.waypoint_rig import http_get

from ambit.model.identity import SpiffeId
from ambit.proxy.hbone_client import HboneClient, TunnelRefusedError
from ambit.proxy.sockets import connect
from ambit.proxyprotocol import TLV_PEER_IDENTITY, encode_v2

pytestmark = pytest.mark.timeout(60)

CLIENT_PRINCIPAL = f"{TD}/ns/apps/sa/client"
INTRUDER = SpiffeId(TD, "apps", "intruder")


def sandwich(tmp_path: Path) -> contextlib.AbstractAsyncContextManager[Sandwich]:
    """The sandwich with the PROXY inbound binding and a policy that allows only the client."""
    return sandwich_rig.sandwich(tmp_path, tunnel=True, allowed=CLIENT_PRINCIPAL)


def request(host: str) -> bytes:
    return f"GET /sandwich HTTP/1.1\r\nhost: {host}\r\nconnection: close\r\n\r\n".encode()


def status_of(response: bytes) -> int:
    head = response.partition(b"\r\n\r\n")[0]
    parts = head.split(b" ", 2)
    return int(parts[1]) if len(parts) > 1 and parts[1].isdigit() else 0


async def call(proxy: InboundProxy, identity: SpiffeId, port: int, first: bytes) -> int:
    """A client's node proxy: an HBONE tunnel as ``identity`` to the gateway pod for the VIP, carrying ``first``;
    the tunnel's refusal status, else the HTTP status the gateway answered (0: closed without an answer)."""
    cert = await proxy.ca.fetch_certificate(identity)
    client = await HboneClient.connect(await connect(FACTORY, proxy.hbone), cert, frozenset({SERVER}), trust_domain=TD)
    try:
        try:
            stream = await client.open_tunnel(f"{VIP}:{port}", [])
        except TunnelRefusedError as exc:
            return exc.status
        await stream.write(first)
        response = b""
        async with asyncio.timeout(10):
            while chunk := await stream.read():
                response += chunk
        stream.abort()
        return status_of(response)
    finally:
        await client.aclose()


async def plain_call(address: tuple[str, int], data: bytes) -> int:
    """Straight to the gateway, no node proxy: the HTTP status, 0 when closed without an answer."""
    reader, writer = await asyncio.open_connection(*address)
    try:
        writer.write(data)
        await writer.drain()
        async with asyncio.timeout(10):
            response = await reader.read()
        return status_of(response)
    except ConnectionResetError:  # closed with our bytes unread
        return 0
    finally:
        writer.close()
        with contextlib.suppress(ConnectionError):
            await writer.wait_closed()


def forged(identity: SpiffeId, port: int) -> bytes:
    source = (ipaddress.ip_address("127.0.0.4"), 40000)
    return encode_v2(source, (ipaddress.ip_address(VIP), port), ((TLV_PEER_IDENTITY, str(identity).encode()),))


async def test_the_client_named_by_the_policy_is_allowed_and_another_is_denied(tmp_path: Path) -> None:
    async with sandwich(tmp_path) as rig:
        proxy, proc, port, seen = rig.proxy, rig.gateway, rig.port, rig.seen
        for host in HOSTS:
            assert await call(proxy, CLIENT, port, request(host)) == 200, host
        assert await call(proxy, INTRUDER, port, request("captured")) == 403
        assert seen == list(HOSTS)  # the denied request never left the gateway
        assert proc.connection_refusals == {}
        # The gateway's telemetry names the client the header named, over mutual TLS (its node proxy's).
        status, text = await http_get(f"http://127.0.0.1:{proc.settings.stats_port}/metrics")
        assert status == 200
        lines = [line for line in text.splitlines() if line.startswith("istio_requests_total{")]
        allowed = [line for line in lines if 'response_code="200"' in line]
        denied = [line for line in lines if 'response_code="403"' in line]
        assert allowed and all(f'source_principal="spiffe://{CLIENT_PRINCIPAL}"' in line for line in allowed)
        assert all('connection_security_policy="mutual_tls"' in line for line in allowed)
        assert denied and all(f'source_principal="{INTRUDER}"' in line for line in denied)


async def test_a_header_the_client_wrote_itself_is_never_an_identity(tmp_path: Path) -> None:
    async with sandwich(tmp_path) as rig:
        proxy, port, tunnel_port, seen = rig.proxy, rig.port, rig.tunnel_port, rig.seen
        assert tunnel_port is not None
        # Inside its own tunnel: the node proxy's header (the intruder's verified identity) comes first; the
        # forgery is the start of the HTTP stream, which is no request.
        assert await call(proxy, INTRUDER, port, forged(CLIENT, port) + request("captured")) in (0, 400)
        # Straight to the gateway's listener: a PROXY header is not read there.
        assert await plain_call((POD_IP, port), forged(CLIENT, port) + request("captured")) in (0, 400)
        # Straight to the tunnel port at the gateway's address: nothing listens there (loopback only).
        with pytest.raises(ConnectionRefusedError):
            await plain_call((POD_IP, tunnel_port), forged(CLIENT, port) + request("captured"))
        assert seen == []


async def test_a_tunnel_connection_without_a_valid_header_is_closed_and_counted(tmp_path: Path) -> None:
    async with sandwich(tmp_path) as rig:
        proc, tunnel_port, seen = rig.gateway, rig.tunnel_port, rig.seen
        assert tunnel_port is not None
        assert await plain_call(("127.0.0.1", tunnel_port), request("captured")) == 0
        assert proc.connection_refusals["tunnel bad header"] == 1
        assert seen == []
