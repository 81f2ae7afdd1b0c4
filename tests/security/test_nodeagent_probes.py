"""The node agent's probe port (istio-cni's :8000, ambit.cni.health) under attack by a hostile local process.

In a cluster the node agent runs in the host's network namespace and listens on every address, so every pod on
the node reaches the port. The server here is the real :class:`~ambit.cni.health.HealthEndpoints` in a process of
its own (so that its descriptors and memory are its own), bound to 127.0.0.1; the attacker connects from other
loopback addresses (127.0.0.2, 127.0.0.3, ...), as a pod does from its own address, and the well-behaved client
(the kubelet) from 127.0.0.1. Each attack is bounded in count and time:

- an idle-connection flood from one address: the server keeps at most ``max_per_peer`` of them and answers the
  kubelet within ``ANSWER_BOUND`` all along;
- an idle flood from many addresses: the server's descriptors stay under ``max_connections`` plus its own few;
- slowloris heads, one header line at a time: closed at the deadline, unanswered;
- oversized request lines and headers: 431, closed; garbage bytes: 400, closed;
- the server's resident memory grows by less than ``RSS_BOUND`` across all of it;
- and each connection ended early is counted by its reason.
"""

from __future__ import annotations

import asyncio
import contextlib
import socket
import subprocess
import sys
import time
from collections.abc import Iterator

import pytest
from tests.harness import process_fds, process_rss

from ambit.cni.health import HealthEndpoints, HealthSettings

DEADLINE = 1.5
"""The server's per-connection deadline in these tests (the agent's default is 5 s)."""
MAX_CONNECTIONS = 128
MAX_PER_PEER = 16
ANSWER_BOUND = 0.5
"""Seconds the kubelet's probe may take to be answered while an attack goes on."""
RSS_BOUND = 16 * 1024 * 1024
IP_BIND_ADDRESS_NO_PORT = 24  # linux/in.h; not in Python's socket module

SERVER = """
import asyncio, sys
from ambit.cni.health import HealthEndpoints, HealthSettings

async def main() -> None:
    endpoints = HealthEndpoints(("127.0.0.1", 0), HealthSettings(deadline=float(sys.argv[1])))
    await endpoints.start()
    endpoints.ready = True
    print(endpoints.bound_port(), flush=True)
    await asyncio.get_running_loop().run_in_executor(None, sys.stdin.read)  # until the test closes stdin
    await endpoints.aclose()

asyncio.run(main())
"""


class ProbeServer:
    def __init__(self, process: subprocess.Popen[str], port: int) -> None:
        self.process = process
        self.port = port

    def fds(self) -> int:
        return process_fds(self.process.pid)

    def rss(self) -> int:
        return process_rss(self.process.pid)

    def probe(self, target: str = "/readyz") -> tuple[bytes, float]:
        """The kubelet's probe from 127.0.0.1: the answer's status line and how long it took."""
        started = time.monotonic()
        with socket.create_connection(("127.0.0.1", self.port), timeout=5.0) as sock:
            try:
                sock.sendall(f"GET {target} HTTP/1.1\r\nHost: x\r\nConnection: close\r\n\r\n".encode())
            except OSError:  # refused: the table was full
                return b"", time.monotonic() - started
            answer = read_until_closed(sock)
        return answer.split(b"\r\n", 1)[0], time.monotonic() - started

    def connect_from(self, source: str) -> socket.socket:
        sock = socket.socket(socket.AF_INET, socket.SOCK_STREAM)
        sock.settimeout(2.0)
        sock.setsockopt(socket.IPPROTO_IP, IP_BIND_ADDRESS_NO_PORT, 1)  # the port is chosen at connect: faster
        sock.bind((source, 0))
        sock.connect(("127.0.0.1", self.port))
        return sock


def read_until_closed(sock: socket.socket, limit: int = 1 << 16) -> bytes:
    data = b""
    with contextlib.suppress(ConnectionResetError):
        while len(data) < limit and (chunk := sock.recv(4096)):
            data += chunk
    return data


@pytest.fixture
def server() -> Iterator[ProbeServer]:
    with subprocess.Popen(
        [sys.executable, "-c", SERVER, str(DEADLINE)], stdin=subprocess.PIPE, stdout=subprocess.PIPE, text=True
    ) as process:
        assert process.stdin is not None and process.stdout is not None
        try:
            yield ProbeServer(process, int(process.stdout.readline()))
        finally:
            process.stdin.close()
            try:
                process.wait(5.0)
            except subprocess.TimeoutExpired:
                process.kill()


@contextlib.contextmanager
def sockets() -> Iterator[list[socket.socket]]:
    held: list[socket.socket] = []
    try:
        yield held
    finally:
        for sock in held:
            sock.close()


def test_the_probes_answer_as_the_kubelet_expects(server: ProbeServer) -> None:
    assert server.probe("/readyz")[0] == b"HTTP/1.1 200 "
    assert server.probe("/healthz?verbose=1")[0] == b"HTTP/1.1 200 "
    assert server.probe("/metrics")[0] == b"HTTP/1.1 404 "


def test_an_idle_flood_from_one_address_leaves_the_kubelet_answered(server: ProbeServer) -> None:
    baseline = server.fds()
    with sockets() as held:
        for _ in range(500):
            with contextlib.suppress(OSError):
                held.append(server.connect_from("127.0.0.2"))
        assert len(held) > 450  # the kernel accepted them; the server closes all but its share
        for _ in range(10):
            status, took = server.probe()
            assert status == b"HTTP/1.1 200 " and took < ANSWER_BOUND
        assert server.fds() <= baseline + MAX_PER_PEER + 2
    # The attacker's share is closed at the deadline even though it never sends a byte.
    time.sleep(DEADLINE + 0.5)
    assert server.fds() <= baseline + 1


def test_an_idle_flood_from_many_addresses_is_held_to_the_connection_cap(server: ProbeServer) -> None:
    baseline = server.fds()
    with sockets() as held:
        for index in range(600):
            with contextlib.suppress(OSError):
                held.append(server.connect_from(f"127.0.{2 + index // 100}.{2 + index % 100}"))
        time.sleep(0.3)
        assert server.fds() <= baseline + MAX_CONNECTIONS + 2
    time.sleep(DEADLINE + 0.5)
    status, took = server.probe()
    assert status == b"HTTP/1.1 200 " and took < ANSWER_BOUND
    assert server.fds() <= baseline + 1


def test_slowloris_heads_are_closed_at_the_deadline_unanswered(server: ProbeServer) -> None:
    with sockets() as held:
        for _ in range(MAX_PER_PEER):
            sock = server.connect_from("127.0.0.3")
            sock.sendall(b"GET /readyz HTTP/1.1\r\n")
            held.append(sock)
        started = time.monotonic()
        closed: set[int] = set()
        while len(closed) < len(held) and time.monotonic() - started < DEADLINE + 2.0:
            for index, sock in enumerate(held):
                if index in closed:
                    continue
                try:
                    sock.sendall(b"X-Drip: 1\r\n")
                except OSError:
                    closed.add(index)
            status, took = server.probe()
            assert status == b"HTTP/1.1 200 " and took < ANSWER_BOUND
            time.sleep(0.2)
        assert len(closed) == len(held)
        assert time.monotonic() - started < DEADLINE + 1.0
        for sock in held:
            sock.settimeout(1.0)
            assert read_until_closed(sock) == b""  # no answer to a head that never ended


@pytest.mark.parametrize(
    ("request_bytes", "status"),
    [
        (b"GET /" + b"a" * 100_000 + b" HTTP/1.1\r\nHost: x\r\n\r\n", b"431"),
        (b"GET /readyz HTTP/1.1\r\nHost: x\r\n" + b"X-Big: " + b"b" * 100_000 + b"\r\n\r\n", b"431"),
        (b"GET /readyz HTTP/1.1\r\nHost: x\r\n" + b"X-Many: m\r\n" * 5000 + b"\r\n", b"431"),
        (b"\x16\x03\x01\x02\x00\x01\x00\x01\xfc\x03\x03" + bytes(range(256)) + b"\r\n\r\n", b"400"),
        (b"GET /readyz HTTP/1.1\r\nHost: x\r\nBad Header\r\n\r\n", b"400"),
    ],
    ids=["long-request-line", "long-header", "many-headers", "tls-hello", "malformed-header"],
)
def test_oversized_and_garbage_requests_are_refused_and_closed(
    server: ProbeServer, request_bytes: bytes, status: bytes
) -> None:
    with server.connect_from("127.0.0.4") as sock:
        with contextlib.suppress(ConnectionResetError, BrokenPipeError):
            sock.sendall(request_bytes)
        answer = read_until_closed(sock)
    assert answer.startswith(b"HTTP/1.1 " + status + b" ")
    assert server.probe()[0] == b"HTTP/1.1 200 "


def test_memory_stays_bounded_across_repeated_floods(server: ProbeServer) -> None:
    before = server.rss()
    big_head = b"GET /readyz HTTP/1.1\r\nHost: x\r\nX-Big: " + b"b" * 7000
    for round_ in range(3):
        with sockets() as held:
            for index in range(MAX_CONNECTIONS + 50):
                with contextlib.suppress(OSError):
                    sock = server.connect_from(f"127.1.{round_}.{2 + index % 250}")
                    held.append(sock)
                    sock.sendall(big_head)  # just under the head limit, never finished
            assert server.probe()[0] in (b"HTTP/1.1 200 ", b"")  # a full table may refuse the kubelet too
        time.sleep(0.2)
    time.sleep(DEADLINE + 0.5)
    assert server.rss() - before < RSS_BOUND
    status, took = server.probe()
    assert status == b"HTTP/1.1 200 " and took < ANSWER_BOUND


async def test_connections_ended_early_are_counted_by_reason() -> None:
    endpoints = HealthEndpoints(("127.0.0.1", 0), HealthSettings(max_per_peer=1, deadline=0.3))
    await endpoints.start()
    try:
        port = endpoints.bound_port()
        _, held = await asyncio.open_connection("127.0.0.1", port)  # silent: ends at the deadline
        _, refused = await asyncio.open_connection("127.0.0.1", port)  # over the per-peer cap
        await asyncio.sleep(0.5)
        reader, garbage = await asyncio.open_connection("127.0.0.1", port)
        garbage.write(b"\x00\x01\x02 nonsense\r\n\r\n")
        assert (await reader.read()).startswith(b"HTTP/1.1 400 ")
        for writer in (held, refused, garbage):
            writer.close()
        assert endpoints.counts == {"deadline": 1, "refused": 1, "malformed": 1}
        assert endpoints.open_connections == 0
    finally:
        await endpoints.aclose()
