"""The ingress gateway's listeners hold slow clients to the HBONE listeners' guard (issue 14).

Whoever reaches the gateway's address can open connections. Each listener port has an admission gate
(:mod:`ambit.waypoint.ingress_admission`): a connection is pending until its TLS handshake (HTTPS) or its first
request head (plain HTTP) is through, pending connections are bounded per port and per address with the oldest
evicted for a newcomer, and a pending connection has a deadline from accept. Replayed in-process against the real
:class:`~ambit.waypoint.ingress.IngressGateway` on loopback, with small bounds and deadlines:

- a slowloris on the HTTPS listener (ClientHellos trickled a byte at a time from several addresses, more than the
  pending bound): every trickler is evicted or closed at the handshake deadline, and legitimate HTTPS clients get
  their answers all along;
- silent connections on the plain HTTP listener are closed at the first-request deadline, while a legitimate
  request is answered;
- an HTTPS client that finishes its handshake and sends no request is closed at the same deadline.
"""

from __future__ import annotations

import asyncio
import contextlib
import ssl
import time
from collections.abc import AsyncIterator
from pathlib import Path

import pytest
from tests.integration.ingress_rig import gateway_settings, mesh_backends
from tests.integration.waypoint_rig import free_port
from tests.security.listener_flood import closed_by_server, dial_from, loopback_addresses, trickle_until_closed
from tests.supervision import until_true

from ambit.model.ingress import GatewayConfig, IngressCertificate, IngressListener, ListenerProtocol, VirtualHost
from ambit.tls.certs import issue_server_cert, new_ca
from ambit.waypoint.ingress import IngressGateway
from ambit.waypoint.settings import WaypointLimits

pytestmark = pytest.mark.timeout(60)

EDGE_CA = new_ca("gateway handshakes test CA", now=time.time())
LIMITS = WaypointLimits(
    max_connections=64,
    max_pending_handshakes=8,
    max_pending_handshakes_per_peer=4,
    max_connections_per_peer=16,
    handshake_timeout=2.0,
    request_headers_timeout=1.0,
)
ANSWER_BOUND = 2.0
"""Seconds a legitimate request may take while the attack goes on (milliseconds unloaded)."""
SLACK = 1.5


@contextlib.asynccontextmanager
async def gateway(tmp_path: Path) -> AsyncIterator[tuple[IngressGateway, int, int]]:
    """The gateway with an HTTPS listener for ``a.example`` and a plain HTTP one; yields it and the two ports."""
    https_port, http_port = free_port(), free_port()
    pair = issue_server_cert(
        EDGE_CA, common_name="a.example", dns_names=["a.example"], ip_addresses=[], now=time.time()
    )
    config = GatewayConfig(
        "edge/edge",
        (
            IngressListener(
                "https",
                https_port,
                ListenerProtocol.HTTPS,
                "a.example",
                (IngressCertificate(pair.cert_pem, pair.key_pem),),
                (VirtualHost("a.example"),),
            ),
            IngressListener("http", http_port, ListenerProtocol.HTTP, "", (), (VirtualHost("a.example"),)),
        ),
    )
    async with mesh_backends(tmp_path) as backends:
        proc = IngressGateway(gateway_settings(backends, LIMITS))
        proc.apply(config)
        await proc.start()
        try:
            async with asyncio.timeout(15):
                await proc.startup.ready.wait()
            yield proc, https_port, http_port
        finally:
            await proc.aclose()


def client_context() -> ssl.SSLContext:
    return ssl.create_default_context(cadata=EDGE_CA.cert_pem.decode())


async def https_get(port: int) -> bytes:
    """A legitimate HTTPS request from 127.0.0.1: the gateway's own answer (404: no route on the host)."""
    reader, writer = await asyncio.open_connection("127.0.0.1", port, ssl=client_context(), server_hostname="a.example")
    try:
        writer.write(b"GET / HTTP/1.1\r\nHost: a.example\r\n\r\n")
        return await reader.readuntil(b"\r\n\r\n")  # the answer's head; the connection may stay open
    finally:
        writer.transport.abort()


async def http_get(port: int) -> bytes:
    reader, writer = await asyncio.open_connection("127.0.0.1", port)
    try:
        writer.write(b"GET / HTTP/1.1\r\nHost: a.example\r\nConnection: close\r\n\r\n")
        return await reader.read()
    finally:
        writer.close()


def client_hello() -> bytes:
    """A browser-like client's first flight to ``a.example``: a complete ClientHello record."""
    incoming, outgoing = ssl.MemoryBIO(), ssl.MemoryBIO()
    tls = client_context().wrap_bio(incoming, outgoing, server_side=False, server_hostname="a.example")
    with contextlib.suppress(ssl.SSLWantReadError):
        tls.do_handshake()
    return outgoing.read()


async def test_a_slowloris_on_the_https_listener_is_evicted_or_closed_and_legitimate_clients_get_in(
    tmp_path: Path,
) -> None:
    hello = client_hello()
    assert len(hello) > 200  # at 20 bytes a second, far longer than the handshake deadline
    async with gateway(tmp_path) as (proc, https_port, _):
        attackers = [
            await dial_from(source, ("127.0.0.1", https_port))
            for source in loopback_addresses(4, third=12)
            for _ in range(LIMITS.max_pending_handshakes_per_peer)
        ]  # twice the pending bound
        try:
            trickles = [
                asyncio.ensure_future(trickle_until_closed(sock, hello, 0.05, LIMITS.handshake_timeout + SLACK + 2))
                for sock in attackers
            ]
            await until_true(
                lambda: proc.budget.pending == LIMITS.max_pending_handshakes, "the tricklers to fill the pending places"
            )
            for _ in range(5):  # legitimate clients, while the pending places are all taken
                started = time.monotonic()
                answer = await asyncio.wait_for(https_get(https_port), ANSWER_BOUND)
                assert answer.startswith(b"HTTP/1.1 404 "), answer[:100]
                assert time.monotonic() - started < ANSWER_BOUND
            took = await asyncio.gather(*trickles)
        finally:
            for sock in attackers:
                sock.close()
        assert max(took) <= LIMITS.handshake_timeout + SLACK, took
        await until_true(lambda: proc.budget.connections == 0, "every place back", 2.0)
        refusals = proc.connection_refusals
        # Eight evicted by the other eight tricklers, five more by the legitimate clients; the rest at the deadline.
        assert refusals["evicted"] >= len(attackers) - LIMITS.max_pending_handshakes, refusals
        assert refusals["evicted"] + refusals["handshake timeout"] >= len(attackers), refusals


async def test_silent_connections_on_the_http_listener_are_closed_at_the_first_request_deadline(
    tmp_path: Path,
) -> None:
    async with gateway(tmp_path) as (proc, _, http_port):
        silent = [await dial_from(source, ("127.0.0.1", http_port)) for source in loopback_addresses(2, third=13)]
        try:
            started = time.monotonic()
            assert (await asyncio.wait_for(http_get(http_port), ANSWER_BOUND)).startswith(b"HTTP/1.1 404 ")
            closed = await closed_by_server(silent, LIMITS.request_headers_timeout + SLACK + 1)
            assert len(closed) == len(silent)
            assert time.monotonic() - started >= LIMITS.request_headers_timeout - 0.2
        finally:
            for sock in silent:
                sock.close()
        await until_true(lambda: proc.budget.connections == 0, "the silent connections' places back", 2.0)
        assert proc.connection_refusals["request head timeout"] == len(silent)


async def test_an_https_client_that_sends_no_request_is_closed_at_the_first_request_deadline(tmp_path: Path) -> None:
    async with gateway(tmp_path) as (proc, https_port, _):
        sock = await dial_from("127.0.14.1", ("127.0.0.1", https_port))
        reader, writer = await asyncio.open_connection(sock=sock, ssl=client_context(), server_hostname="a.example")
        try:
            await until_true(lambda: proc.budget.pending == 0, "the handshake to be judged", 2.0)
            started = time.monotonic()
            async with asyncio.timeout(LIMITS.request_headers_timeout + SLACK + 1):
                with contextlib.suppress(ConnectionError, ssl.SSLError):
                    assert await reader.read() == b""
            took = time.monotonic() - started
            assert LIMITS.request_headers_timeout - 0.3 <= took <= LIMITS.request_headers_timeout + SLACK, took
        finally:
            writer.transport.abort()
        await until_true(lambda: proc.budget.connections == 0, "its place back", 2.0)
        assert proc.connection_refusals["request head timeout"] == 1
