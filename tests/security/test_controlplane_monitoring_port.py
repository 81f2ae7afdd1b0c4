"""The control plane's monitoring port (15014) under hostile clients: only GETs of two paths, small heads, no
bodies, a bounded number of connections, and bounded memory for a flood of clients that ask and never read.

The real :class:`~ambit.controlplane.monitoring.MonitoringServer` on loopback, with raw sockets as clients.
"""

from __future__ import annotations

import asyncio
import contextlib
import os
import socket
from collections.abc import AsyncIterator, Iterator

import pytest
from tests.harness import process_rss

from ambit.controlplane.monitoring import ControlPlaneMetrics, MonitoringServer
from ambit.controlplane.monitoring.server import MONITORING_LIMITS
from ambit.telemetry.connection_limits import ConnectionLimits


@pytest.fixture
def metrics() -> ControlPlaneMetrics:
    return ControlPlaneMetrics(version="9.9.9", process=False)


@pytest.fixture
async def server(metrics: ControlPlaneMetrics) -> AsyncIterator[MonitoringServer]:
    monitoring = MonitoringServer(metrics, host="127.0.0.1", port=0, version="9.9.9")
    await monitoring.start()
    try:
        yield monitoring
    finally:
        await monitoring.aclose()


class Clients:
    """Raw non-blocking client sockets; all closed at the end."""

    def __init__(self) -> None:
        self.socks: list[socket.socket] = []

    async def connect(self, port: int, rcvbuf: int = 0) -> socket.socket:
        sock = socket.socket()
        self.socks.append(sock)
        if rcvbuf:
            sock.setsockopt(socket.SOL_SOCKET, socket.SO_RCVBUF, rcvbuf)
        sock.setblocking(False)
        await asyncio.get_running_loop().sock_connect(sock, ("127.0.0.1", port))
        return sock

    def close(self) -> None:
        for sock in self.socks:
            sock.close()
        self.socks.clear()


@pytest.fixture
def clients() -> Iterator[Clients]:
    made = Clients()
    yield made
    made.close()


async def exchange(port: int, raw: bytes) -> bytes:
    """Send ``raw`` on a fresh connection and read until the server closes it (``Connection: close`` or not)."""
    reader, writer = await asyncio.open_connection("127.0.0.1", port)
    try:
        writer.write(raw)
        async with asyncio.timeout(10):
            return await reader.read()
    finally:
        writer.close()
        with contextlib.suppress(ConnectionError):
            await writer.wait_closed()


def status(answer: bytes) -> int:
    assert answer.startswith((b"HTTP/1.1 ", b"HTTP/1.0 ")), answer[:200]
    return int(answer.split(b" ", 2)[1])


async def test_metrics_and_version_are_served_without_credentials(server: MonitoringServer) -> None:
    answer = await exchange(server.port, b"GET /metrics HTTP/1.1\r\nHost: istiod\r\nConnection: close\r\n\r\n")
    assert status(answer) == 200
    assert b"Content-Type: text/plain; version=0.0.4" in answer
    assert b'istio_build{component="pilot",tag="9.9.9"} 1.0\n' in answer
    answer = await exchange(server.port, b"GET /version HTTP/1.1\r\nHost: istiod\r\nConnection: close\r\n\r\n")
    assert status(answer) == 200 and answer.endswith(b"\r\n\r\n9.9.9")


@pytest.mark.parametrize("method", ["POST", "PUT", "DELETE", "HEAD", "PATCH", "OPTIONS"])
async def test_only_get_is_allowed(server: MonitoringServer, method: str) -> None:
    answer = await exchange(server.port, f"{method} /metrics HTTP/1.1\r\nHost: x\r\nConnection: close\r\n\r\n".encode())
    assert status(answer) == 405


@pytest.mark.parametrize("path", ["/", "/debug/syncz", "/metrics/", "/../metrics", "/stats/prometheus"])
async def test_other_paths_are_not_found(server: MonitoringServer, path: str) -> None:
    answer = await exchange(server.port, f"GET {path} HTTP/1.1\r\nHost: x\r\nConnection: close\r\n\r\n".encode())
    assert status(answer) == 404


async def test_a_get_with_a_body_is_refused_unread_and_the_connection_closed(server: MonitoringServer) -> None:
    # A large declared body that never comes: the answer must not wait for it.
    answer = await exchange(server.port, b"GET /metrics HTTP/1.1\r\nHost: x\r\nContent-Length: 100000000\r\n\r\nabc")
    assert status(answer) == 400
    chunked = b"GET /metrics HTTP/1.1\r\nHost: x\r\nTransfer-Encoding: chunked\r\n\r\n5\r\nhello\r\n"
    assert status(await exchange(server.port, chunked)) == 400


async def test_oversized_request_heads_are_refused(server: MonitoringServer) -> None:
    long_line = b"GET /metrics?" + b"a" * 4096 + b" HTTP/1.1\r\nHost: x\r\n\r\n"
    assert status(await exchange(server.port, long_line)) == 400
    long_field = b"GET /metrics HTTP/1.1\r\nHost: x\r\nX-Big: " + b"b" * 4096 + b"\r\n\r\n"
    assert status(await exchange(server.port, long_field)) == 400
    many = b"".join(b"X-%d: y\r\n" % n for n in range(100))
    assert status(await exchange(server.port, b"GET /metrics HTTP/1.1\r\nHost: x\r\n" + many + b"\r\n")) == 400


async def test_connections_past_the_limit_are_cut_and_honest_scrapes_resume(
    server: MonitoringServer, clients: Clients
) -> None:
    assert server.site is not None
    held = [await clients.connect(server.port) for _ in range(MONITORING_LIMITS.per_address)]
    async with asyncio.timeout(10):
        while server.site.gate.open < len(held):  # noqa: ASYNC110 - the server's own bookkeeping
            await asyncio.sleep(0.02)
    extra = await clients.connect(server.port)
    loop = asyncio.get_running_loop()
    with contextlib.suppress(ConnectionResetError):
        async with asyncio.timeout(5):
            assert await loop.sock_recv(extra, 100) == b""
    assert server.site.gate.refused >= 1
    clients.close()
    async with asyncio.timeout(10):
        while True:
            with contextlib.suppress(ConnectionError):
                answer = await exchange(server.port, b"GET /version HTTP/1.1\r\nHost: x\r\nConnection: close\r\n\r\n")
                if answer.startswith(b"HTTP/1.1 200"):
                    break
            await asyncio.sleep(0.05)


async def test_a_half_sent_head_is_closed_after_the_lifetime(metrics: ControlPlaneMetrics, clients: Clients) -> None:
    short = ConnectionLimits(total=4, per_address=4, lifetime=0.5, grace=0.5)
    server = MonitoringServer(metrics, host="127.0.0.1", port=0, version="x", limits=short)
    await server.start()
    try:
        sock = await clients.connect(server.port)
        loop = asyncio.get_running_loop()
        await loop.sock_sendall(sock, b"GET /metrics HTTP/1.1\r\nHost: x\r\nX-Slow: ")
        with contextlib.suppress(ConnectionResetError):
            async with asyncio.timeout(10):
                while await loop.sock_recv(sock, 4096):
                    pass
        assert server.site is not None
        async with asyncio.timeout(10):
            while server.site.gate.open:  # noqa: ASYNC110 - the server's own bookkeeping
                await asyncio.sleep(0.02)
    finally:
        await server.aclose()


async def test_a_flood_of_clients_that_ask_and_never_read_cannot_grow_memory(
    metrics: ControlPlaneMetrics, server: MonitoringServer, clients: Clients
) -> None:
    # About 1 MiB of metrics per answer: 300 unread answers would pin 300 MiB without the connection limit.
    for n in range(12_000):
        metrics.client_connected(f"{n:05d}-" + "v" * 58)
    answer_size = len(metrics.render())
    assert answer_size > 800_000
    loop = asyncio.get_running_loop()
    before = process_rss(os.getpid())
    for _ in range(300):
        try:
            sock = await clients.connect(server.port, rcvbuf=4096)
            await loop.sock_sendall(sock, b"GET /metrics HTTP/1.1\r\nHost: x\r\n\r\n")
        except OSError:  # past the limit the server has already cut the connection
            pass
    assert server.site is not None
    gate = server.site.gate
    async with asyncio.timeout(20):  # every connection admitted or cut by the server
        while gate.open + gate.refused < 300:  # noqa: ASYNC110 - the server's own bookkeeping
            await asyncio.sleep(0.02)
    assert server.site.gate.open <= MONITORING_LIMITS.total
    grown = process_rss(os.getpid()) - before
    bound = MONITORING_LIMITS.total * answer_size + (16 << 20)
    assert grown < bound, f"grew by {grown >> 20} MiB for 300 clients that never read (bound {bound >> 20} MiB)"
    clients.close()
