"""The ingress gateway's TLS-terminated downstream on the socket TLS transport, on each record path (Python, C).

The gateway terminates an HTTPS or TLS_TERMINATE listener's TLS with :func:`ambit.tls.socket_handshake.open_tls`
and serves the connection through :class:`~ambit.proxy.transport_stream.TransportStream`. Replayed against the real
:class:`~ambit.waypoint.ingress.IngressGateway` on loopback with real TLS clients: the server name picks the
listener's certificate (two certificates, the context switched in the server-name callback on an ``SSLSocket``),
ALPN ``h2`` is chosen and the connection served over HTTP/2, a peer sending garbage instead of a ClientHello or a
handshake that never completes is closed (one line, no traceback; counted at the deadline), a TLS_TERMINATE
listener relays the decrypted bytes both ways to the end and closes with close_notify, and a client that stops
reading holds the relay instead of filling the gateway's memory.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import socket
import ssl
import time
from collections.abc import AsyncIterator
from pathlib import Path

import h2.config
import h2.connection
import h2.events
import pytest
from tests.integration.ingress_rig import backend, gateway_settings, mesh_backends
from tests.integration.waypoint_rig import free_port

from ambit.model.ingress import GatewayConfig, IngressCertificate, IngressListener, ListenerProtocol, VirtualHost
from ambit.model.routes import WeightedBackend
from ambit.tls.certs import KeyPair, issue_server_cert, new_ca
from ambit.waypoint.ingress import IngressGateway
from ambit.waypoint.settings import WaypointLimits

pytestmark = pytest.mark.timeout(60)

NOW = time.time()
CA_A = new_ca("downstream test CA a", now=NOW)
CA_B = new_ca("downstream test CA b", now=NOW)
CERT_A = issue_server_cert(CA_A, common_name="a.example", dns_names=["a.example"], ip_addresses=[], now=NOW)
CERT_B = issue_server_cert(CA_B, common_name="b.example", dns_names=["b.example"], ip_addresses=[], now=NOW)
RELAY_CERT = issue_server_cert(CA_A, common_name="echo.example", dns_names=["echo.example"], ip_addresses=[], now=NOW)
LIMITS = WaypointLimits(handshake_timeout=1.5, request_headers_timeout=5.0)
SLACK = 2.0


def config(https_port: int, relay_port: int) -> GatewayConfig:
    """An HTTPS listener taking ``a.example`` and ``b.example`` with a certificate for each (no routes: the gateway
    answers 404 itself), and a TLS_TERMINATE listener relaying ``echo.example`` to the mesh's TCP echo server."""
    return GatewayConfig(
        "edge/edge",
        (
            IngressListener(
                "https",
                https_port,
                ListenerProtocol.HTTPS,
                "*.example",
                (
                    IngressCertificate(CERT_A.cert_pem, CERT_A.key_pem),
                    IngressCertificate(CERT_B.cert_pem, CERT_B.key_pem),
                ),
                (VirtualHost("*.example"),),
            ),
            IngressListener(
                "relay",
                relay_port,
                ListenerProtocol.TLS_TERMINATE,
                "echo.example",
                (IngressCertificate(RELAY_CERT.cert_pem, RELAY_CERT.key_pem),),
                (VirtualHost("echo.example", (), (WeightedBackend(backend("tcp")),)),),
            ),
        ),
    )


@pytest.fixture
async def gateway(tmp_path: Path, records_path: str) -> AsyncIterator[tuple[IngressGateway, int, int]]:
    https_port, relay_port = free_port(), free_port()
    async with mesh_backends(tmp_path) as backends:
        proc = IngressGateway(gateway_settings(backends, LIMITS))
        proc.apply(config(https_port, relay_port))
        await proc.start()
        try:
            async with asyncio.timeout(15):
                await proc.startup.ready.wait()
            yield proc, https_port, relay_port
        finally:
            await proc.aclose()


def client_context(ca: KeyPair, alpn: list[str] | None = None) -> ssl.SSLContext:
    context = ssl.create_default_context(cadata=ca.cert_pem.decode())
    if alpn is not None:
        context.set_alpn_protocols(alpn)
    return context


async def https_get(port: int, name: str, ca: KeyPair) -> tuple[bytes, bytes]:
    """An HTTP/1.1 GET to ``name`` verifying the gateway's certificate against ``ca``: the certificate served (DER)
    and the answer's status line."""
    reader, writer = await asyncio.open_connection(
        "127.0.0.1", port, ssl=client_context(ca, ["http/1.1"]), server_hostname=name
    )
    try:
        served = writer.get_extra_info("ssl_object").getpeercert(binary_form=True)
        writer.write(f"GET / HTTP/1.1\r\nHost: {name}\r\n\r\n".encode())
        status = await asyncio.wait_for(reader.readline(), 10)
        return served, status
    finally:
        writer.transport.abort()


async def test_the_server_name_picks_each_of_a_listener_s_two_certificates(
    gateway: tuple[IngressGateway, int, int],
) -> None:
    _, port, _ = gateway
    for name, pair, ca in (("a.example", CERT_A, CA_A), ("b.example", CERT_B, CA_B)):
        served, status = await https_get(port, name, ca)
        assert served == ssl.PEM_cert_to_DER_cert(pair.cert_pem.decode()), name
        assert status.startswith(b"HTTP/1.1 404"), status


async def test_alpn_h2_is_chosen_and_the_connection_is_served_over_http2(
    gateway: tuple[IngressGateway, int, int],
) -> None:
    _, port, _ = gateway
    reader, writer = await asyncio.open_connection(
        "127.0.0.1", port, ssl=client_context(CA_A, ["h2", "http/1.1"]), server_hostname="a.example"
    )
    try:
        assert writer.get_extra_info("ssl_object").selected_alpn_protocol() == "h2"
        conn = h2.connection.H2Connection(h2.config.H2Configuration(client_side=True, header_encoding="utf-8"))
        conn.initiate_connection()
        conn.send_headers(
            1, [(":method", "GET"), (":scheme", "https"), (":authority", "a.example"), (":path", "/")], end_stream=True
        )
        writer.write(conn.data_to_send())
        status = ""
        async with asyncio.timeout(10):
            while not status:
                data = await reader.read(65536)
                assert data, "the gateway closed the connection"
                for event in conn.receive_data(data):
                    if isinstance(event, h2.events.ResponseReceived):
                        status = dict(event.headers)[":status"]
                writer.write(conn.data_to_send())
        assert status == "404"
    finally:
        writer.transport.abort()


def _no_traceback(records: list[logging.LogRecord]) -> None:
    assert not [r for r in records if r.exc_info or r.levelno >= logging.ERROR], [r.getMessage() for r in records]


async def test_garbage_instead_of_a_client_hello_is_closed_with_one_line_and_no_traceback(
    gateway: tuple[IngressGateway, int, int], caplog: pytest.LogCaptureFixture
) -> None:
    _, port, _ = gateway
    caplog.set_level(logging.DEBUG)
    loop = asyncio.get_running_loop()
    for garbage in (b"GET / HTTP/1.1\r\nHost: a.example\r\n\r\n", b"\x16\x03\x01\x00\x10" + b"\xff" * 16):
        sock = socket.create_connection(("127.0.0.1", port))
        sock.setblocking(False)
        try:
            await loop.sock_sendall(sock, garbage)
            async with asyncio.timeout(5):
                with contextlib.suppress(ConnectionResetError):
                    while await loop.sock_recv(sock, 4096):  # an alert, perhaps, then the close
                        pass
        finally:
            sock.close()
    failed = [r for r in caplog.records if "TLS handshake from" in r.getMessage()]
    assert len(failed) == 2, [r.getMessage() for r in caplog.records]
    _no_traceback(caplog.records)
    _, status = await https_get(port, "a.example", CA_A)  # the listener serves on
    assert status.startswith(b"HTTP/1.1 404")


async def test_a_handshake_that_never_completes_is_closed_at_the_deadline(
    gateway: tuple[IngressGateway, int, int], caplog: pytest.LogCaptureFixture
) -> None:
    proc, port, _ = gateway
    caplog.set_level(logging.DEBUG)
    incoming, outgoing = ssl.MemoryBIO(), ssl.MemoryBIO()
    tls = client_context(CA_A).wrap_bio(incoming, outgoing, server_side=False, server_hostname="a.example")
    with contextlib.suppress(ssl.SSLWantReadError):
        tls.do_handshake()
    hello = outgoing.read()
    loop = asyncio.get_running_loop()
    sock = socket.create_connection(("127.0.0.1", port))
    sock.setblocking(False)
    try:
        await loop.sock_sendall(sock, hello[: len(hello) // 2])  # and never the rest
        began = loop.time()
        async with asyncio.timeout(LIMITS.handshake_timeout + SLACK):
            with contextlib.suppress(ConnectionResetError):
                while await loop.sock_recv(sock, 4096):
                    pass
        assert loop.time() - began >= LIMITS.handshake_timeout - 0.3
    finally:
        sock.close()
    assert proc.connection_refusals["handshake timeout"] == 1
    _no_traceback(caplog.records)


def _relay_to_the_end(port: int, payload: bytes) -> tuple[bytes, bool]:
    """Over TLS to ``echo.example``: send ``payload`` while reading the echo, then close_notify; what came back and
    whether the gateway answered with its own close_notify (a clean end, not a reset)."""
    context = client_context(CA_A)
    with (
        socket.create_connection(("127.0.0.1", port), timeout=10) as raw,
        context.wrap_socket(raw, server_hostname="echo.example") as tls,
    ):
        assert tls.selected_alpn_protocol() is None
        tls.sendall(payload)
        got = bytearray()
        while len(got) < len(payload):
            chunk = tls.recv(65536)
            assert chunk, "EOF before the echo was complete"
            got += chunk
        tls.unwrap().close()  # ours, then waits for the gateway's
        return bytes(got), True


async def test_a_tls_terminate_listener_relays_to_the_end_and_closes_with_close_notify(
    gateway: tuple[IngressGateway, int, int],
) -> None:
    _, _, relay_port = gateway
    payload = bytes(range(256)) * 256  # 64 KiB
    got, clean = await asyncio.to_thread(_relay_to_the_end, relay_port, payload)
    assert got == payload
    assert clean


async def test_a_relay_client_that_stops_reading_holds_the_relay_within_bounds(
    gateway: tuple[IngressGateway, int, int],
) -> None:
    """The echo server sends back all the client sends; the client never reads. The gateway's writes to the client
    wait (back-pressure), it stops reading the mesh, which stops reading it: the client's own sending stalls well
    before what it wrote could all be held, instead of the gateway buffering it."""
    _, _, relay_port = gateway
    loop = asyncio.get_running_loop()
    raw = socket.create_connection(("127.0.0.1", relay_port), timeout=10)
    raw.setsockopt(socket.SOL_SOCKET, socket.SO_RCVBUF, 64 * 1024)
    try:  # the handshake blocks: in a thread, the gateway's loop is this one
        tls = await asyncio.to_thread(client_context(CA_A).wrap_socket, raw, server_hostname="echo.example")
    except BaseException:
        raw.close()
        raise
    tls.setblocking(False)
    sent = 0
    chunk = b"x" * 16384
    stalled_since = loop.time()
    try:
        while loop.time() - stalled_since < 1.0 and sent < 256 * 1024 * 1024:
            try:
                sent += tls.send(chunk)
                stalled_since = loop.time()
            except (ssl.SSLWantWriteError, BlockingIOError):
                await asyncio.sleep(0.02)
        assert sent < 256 * 1024 * 1024, "the client's writes never stalled: nothing held the relay back"
    finally:
        tls.close()
