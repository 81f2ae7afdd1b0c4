"""The node proxy's small HTTP server (telemetry/http_server.py) under attack, on real loopback sockets.

The stats and readiness ports are reachable by every pod, the admin port by every host-network pod: each rule of the
module is attacked here (too many clients, one address taking every slot, half-sent heads, clients that never read,
a huge request line, never-ending headers, bodies, a pipelining flood, malformed requests carrying a token), with
short lifetimes so each test waits well under a second per rule; the brief version runs on both event loops.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import os
import socket
import time
from collections.abc import AsyncIterator, Iterator

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st
from tests.harness import process_rss

from ambit.inpod.eventloop import run
from ambit.telemetry.connection_limits import ConnectionLimits
from ambit.telemetry.http_server import MAX_BODY, MAX_HEAD, HttpServer, Response, http_date, parse_target

BIG = b"x" * (4 << 20)  # larger than any socket buffer on loopback: a client that does not read pins it
SECRET = "s3cret-admin-token-0123456789"


def routes() -> dict[str, dict[str, object]]:
    return {
        "/small": {"GET": lambda _r: Response.text("ok\n"), "POST": lambda _r: Response.text("ok\n")},
        "/big": {"GET": lambda _r: Response(body=BIG)},
        "/echo": {"GET": lambda r: Response.text(f"{r.path} {sorted(r.query.items())} {r.headers.get('x-a')}\n")},
        "/boom": {"GET": lambda _r: 1 / 0},
    }


async def start(limits: ConnectionLimits) -> HttpServer:
    server = HttpServer(routes(), limits)  # type: ignore[arg-type]
    await server.start("127.0.0.1", 0)
    return server


@pytest.fixture
async def servers() -> AsyncIterator[list[HttpServer]]:
    started: list[HttpServer] = []
    yield started
    for server in started:
        await server.aclose()


class Clients:
    """Raw client sockets (non-blocking, for the loop's sock_* calls); all closed at the end."""

    def __init__(self) -> None:
        self.socks: list[socket.socket] = []

    async def connect(self, port: int, source: str = "127.0.0.1", rcvbuf: int = 0) -> socket.socket:
        sock = socket.socket()
        self.socks.append(sock)
        if rcvbuf:
            sock.setsockopt(socket.SOL_SOCKET, socket.SO_RCVBUF, rcvbuf)
        sock.bind((source, 0))
        sock.setblocking(False)
        await asyncio.get_running_loop().sock_connect(sock, ("127.0.0.1", port))
        return sock


@pytest.fixture
def clients() -> Iterator[Clients]:
    made = Clients()
    yield made
    for sock in made.socks:
        sock.close()


def port_of(server: HttpServer) -> int:
    assert server.port is not None
    return server.port


async def read_until_closed(sock: socket.socket, within: float = 10.0) -> tuple[bytes, bool]:
    """Everything the server sends until it closes (EOF or reset); the bool is False if still open after ``within``."""
    loop = asyncio.get_running_loop()
    got = b""
    try:
        async with asyncio.timeout(within):
            while chunk := await loop.sock_recv(sock, 65536):
                got += chunk
    except TimeoutError:
        return got, False
    except ConnectionResetError:
        pass
    return got, True


async def closed_by_peer(sock: socket.socket, within: float = 10.0) -> bool:
    return (await read_until_closed(sock, within))[1]


async def ask(sock: socket.socket, path: str, extra: str = "") -> bytes:
    """One keep-alive request; its answer, up to the end of the body its Content-Length announces."""
    loop = asyncio.get_running_loop()
    await loop.sock_sendall(sock, f"GET {path} HTTP/1.1\r\nHost: x\r\n{extra}\r\n".encode())
    answer = b""
    async with asyncio.timeout(10):
        while True:
            head, sep, body = answer.partition(b"\r\n\r\n")
            if sep:
                length = next(
                    int(v) for k, _, v in (h.partition(b": ") for h in head.split(b"\r\n")) if k == b"Content-Length"
                )
                if len(body) >= length:
                    return answer
            chunk = await loop.sock_recv(sock, 4096)
            if not chunk:
                return answer
            answer += chunk


async def eventually(check: object, within: float = 10.0) -> None:
    assert callable(check)
    async with asyncio.timeout(within):
        while not check():  # noqa: ASYNC110 - the server's own bookkeeping
            await asyncio.sleep(0.02)


# -- the routes and the answers ------------------------------------------------------------------------------------


async def test_an_answer_has_its_status_line_length_type_date_and_server(
    servers: list[HttpServer], clients: Clients
) -> None:
    servers.append(server := await start(ConnectionLimits(total=4, per_address=4, lifetime=30.0)))
    answer = await ask(await clients.connect(port_of(server)), "/small")
    head, _, body = answer.partition(b"\r\n\r\n")
    lines = head.split(b"\r\n")
    assert lines[0] == b"HTTP/1.1 200 OK" and body == b"ok\n"
    assert b"Content-Type: text/plain; charset=utf-8" in lines and b"Content-Length: 3" in lines
    assert b"Server: ambit" in lines and any(line.startswith(b"Date: ") and line.endswith(b" GMT") for line in lines)


async def test_unknown_paths_wrong_methods_head_and_a_failing_handler(
    servers: list[HttpServer], clients: Clients, caplog: pytest.LogCaptureFixture
) -> None:
    servers.append(server := await start(ConnectionLimits(total=4, per_address=4, lifetime=30.0)))
    sock = await clients.connect(port_of(server))
    assert (await ask(sock, "/nope")).startswith(b"HTTP/1.1 404 Not Found\r\n")
    loop = asyncio.get_running_loop()
    await loop.sock_sendall(sock, b"DELETE /small HTTP/1.1\r\nHost: x\r\n\r\n")
    head = await loop.sock_recv(sock, 4096)
    assert head.startswith(b"HTTP/1.1 405 Method Not Allowed\r\n") and b"\r\nAllow: GET,POST\r\n" in head
    await loop.sock_sendall(sock, b"HEAD /small HTTP/1.1\r\nHost: x\r\n\r\n")  # a 405 whose body is not sent
    head = await loop.sock_recv(sock, 4096)
    assert head.startswith(b"HTTP/1.1 405") and head.endswith(b"\r\n\r\n")
    assert (await ask(sock, "/boom")).startswith(b"HTTP/1.1 500 Internal Server Error\r\n")
    assert any(r.exc_info for r in caplog.records)
    echoed = await ask(sock, "/ech%6F?b=2&a=1&a=3&c", "X-A: one\r\nX-a: two\r\n")  # the same connection goes on
    assert echoed.endswith(b"/echo [('a', '1'), ('b', '2'), ('c', '')] one\n")


def test_an_http_date_is_the_imf_fixdate() -> None:
    assert http_date(0) == "Thu, 01 Jan 1970 00:00:00 GMT"
    assert http_date(1_800_000_000.5) == "Fri, 15 Jan 2027 08:00:00 GMT"


@given(st.binary(max_size=200))
def test_any_target_parses_into_a_path_and_first_values(target: bytes) -> None:
    path, query = parse_target(target)
    assert isinstance(path, str) and all(isinstance(k, str) and isinstance(v, str) for k, v in query.items())


# -- admission and lifetime ----------------------------------------------------------------------------------------


async def test_connections_past_the_total_are_cut_at_once_and_slots_come_back(
    servers: list[HttpServer], clients: Clients
) -> None:
    servers.append(server := await start(ConnectionLimits(total=3, per_address=3, lifetime=30.0)))
    held = [await clients.connect(port_of(server)) for _ in range(3)]
    await eventually(lambda: server.gate.open == 3)
    assert await closed_by_peer(await clients.connect(port_of(server)), within=5.0)
    assert server.gate.refused >= 1
    assert b"200 OK" in await ask(held[0], "/small")
    held[1].close()
    await eventually(lambda: server.gate.open == 2)
    assert b"200 OK" in await ask(await clients.connect(port_of(server)), "/small")


async def test_one_address_cannot_take_every_slot(servers: list[HttpServer], clients: Clients) -> None:
    servers.append(server := await start(ConnectionLimits(total=6, per_address=2, lifetime=30.0)))
    mine = [await clients.connect(port_of(server), source="127.0.0.1") for _ in range(2)]
    await eventually(lambda: server.gate.open == 2)
    assert await closed_by_peer(await clients.connect(port_of(server), source="127.0.0.1"), within=5.0)
    assert b"200 OK" in await ask(await clients.connect(port_of(server), source="127.0.0.2"), "/small")
    assert b"200 OK" in await ask(mine[0], "/small")


async def test_a_half_sent_head_is_closed_after_the_lifetime(servers: list[HttpServer], clients: Clients) -> None:
    servers.append(server := await start(ConnectionLimits(total=4, per_address=4, lifetime=0.5, grace=0.5)))
    sock = await clients.connect(port_of(server))
    await asyncio.get_running_loop().sock_sendall(sock, b"GET /small HTTP/1.1\r\nHost: x\r\nX-Slow: ")
    assert await closed_by_peer(sock)
    await eventually(lambda: server.gate.open == 0)


async def test_a_slow_trickle_of_header_bytes_is_closed_after_the_lifetime(
    servers: list[HttpServer], clients: Clients
) -> None:
    """Slowloris: a byte every 50 ms never completes a head; the lifetime ends it all the same."""
    servers.append(server := await start(ConnectionLimits(total=4, per_address=4, lifetime=0.5, grace=0.5)))
    loop = asyncio.get_running_loop()
    sock = await clients.connect(port_of(server))
    await loop.sock_sendall(sock, b"GET /small HTTP/1.1\r\n")
    started = time.monotonic()
    with contextlib.suppress(OSError):
        async with asyncio.timeout(10):
            while True:
                await loop.sock_sendall(sock, b"X")
                await asyncio.sleep(0.05)
    assert time.monotonic() - started < 10
    await eventually(lambda: server.gate.open == 0)


async def test_a_client_that_never_reads_a_large_answer_is_aborted_and_its_slot_freed(
    servers: list[HttpServer], clients: Clients
) -> None:
    servers.append(server := await start(ConnectionLimits(total=4, per_address=4, lifetime=0.5, grace=0.5)))
    loop = asyncio.get_running_loop()
    stalled = await clients.connect(port_of(server), rcvbuf=4096)
    await loop.sock_sendall(stalled, b"GET /big HTTP/1.1\r\nHost: x\r\n\r\n")
    await eventually(lambda: server.gate.open == 1)
    await eventually(lambda: server.gate.open == 0)  # aborted with most of 4 MiB unsent
    got, _ = await read_until_closed(stalled)
    assert len(got) < len(BIG)


async def test_a_keep_alive_client_is_served_and_closed_cleanly_between_requests(
    servers: list[HttpServer], clients: Clients
) -> None:
    servers.append(server := await start(ConnectionLimits(total=4, per_address=4, lifetime=0.5, grace=0.5)))
    sock = await clients.connect(port_of(server))
    for _ in range(3):
        assert b"200 OK" in await ask(sock, "/small")
    assert await closed_by_peer(sock)


async def test_connection_close_and_http_1_0_are_answered_then_closed(
    servers: list[HttpServer], clients: Clients
) -> None:
    servers.append(server := await start(ConnectionLimits(total=4, per_address=4, lifetime=30.0)))
    loop = asyncio.get_running_loop()
    for request in (b"GET /small HTTP/1.1\r\nHost: x\r\nConnection: close\r\n\r\n", b"GET /small HTTP/1.0\r\n\r\n"):
        sock = await clients.connect(port_of(server))
        await loop.sock_sendall(sock, request)
        got, closed = await read_until_closed(sock, within=5.0)
        assert closed and b" 200 OK\r\n" in got and got.endswith(b"\r\n\r\nok\n")


# -- heads and bodies ---------------------------------------------------------------------------------------------


@pytest.mark.parametrize(
    "attack",
    [
        pytest.param(b"GET /" + b"a" * (1 << 20), id="huge-request-line"),
        pytest.param(
            b"GET /small HTTP/1.1\r\nHost: x\r\n" + b"X-Never: ending\r\n" * 60_000, id="never-ending-headers"
        ),
        pytest.param(b"GET /small HTTP/1.1\r\nHost: x\r\nX-Big: " + b"b" * (1 << 20), id="huge-header"),
    ],
)
async def test_a_head_past_the_bound_is_refused_431_and_closed(
    servers: list[HttpServer], clients: Clients, attack: bytes
) -> None:
    servers.append(server := await start(ConnectionLimits(total=4, per_address=4, lifetime=30.0)))
    sock = await clients.connect(port_of(server))
    with contextlib.suppress(OSError):  # the server may close while we are still sending
        await asyncio.get_running_loop().sock_sendall(sock, attack)
    got, closed = await read_until_closed(sock, within=5.0)
    assert closed
    assert got == b"" or got.startswith(b"HTTP/1.1 431 Request Header Fields Too Large\r\n")
    await eventually(lambda: server.gate.open == 0)
    assert len(attack) > MAX_HEAD


@pytest.mark.parametrize(
    "request_bytes",
    [
        pytest.param(
            f"POST /small HTTP/1.1\r\nHost: x\r\nContent-Length: {MAX_BODY + 1}\r\n\r\n".encode(), id="length"
        ),
        pytest.param(
            b"POST /small HTTP/1.1\r\nHost: x\r\nTransfer-Encoding: chunked\r\n\r\n"
            + (b"1000\r\n" + b"c" * 0x1000 + b"\r\n") * (MAX_BODY // 0x1000 + 1),
            id="chunked",
        ),
    ],
)
async def test_a_body_past_the_bound_is_413_and_closed(
    servers: list[HttpServer], clients: Clients, request_bytes: bytes
) -> None:
    servers.append(server := await start(ConnectionLimits(total=4, per_address=4, lifetime=30.0)))
    sock = await clients.connect(port_of(server))
    await asyncio.get_running_loop().sock_sendall(sock, request_bytes)
    got, closed = await read_until_closed(sock, within=5.0)
    assert closed and got.startswith(b"HTTP/1.1 413 ")


async def test_a_small_body_is_read_and_dropped_and_the_connection_goes_on(
    servers: list[HttpServer], clients: Clients
) -> None:
    servers.append(server := await start(ConnectionLimits(total=4, per_address=4, lifetime=30.0)))
    sock = await clients.connect(port_of(server))
    loop = asyncio.get_running_loop()
    await loop.sock_sendall(sock, b"POST /small HTTP/1.1\r\nHost: x\r\nContent-Length: 5\r\n\r\nhello")
    assert (await loop.sock_recv(sock, 4096)).endswith(b"\r\n\r\nok\n")
    assert b"200 OK" in await ask(sock, "/small")


@pytest.mark.parametrize(
    "malformed",
    [
        b"GET /small HTTP/1.1\r\nAuthorization: Bearer " + SECRET.encode() + b"\n\r\n",  # bare LF
        b"GET /small HTTP/1.1\r\nHost: x\r\nAuthorization: Bearer " + SECRET.encode() + b"\x00\r\n\r\n",  # a NUL
        b"GET /small HTTP/1.1\r\nAuthorization: Bearer " + SECRET.encode() + b"\r\n\r\n",  # no Host
        b"GET /small HTTP/1.1\r\nHost: x\r\nTransfer-Encoding: gzip, chunked\r\n\r\n",  # a coding h11 refuses
        b"GET /small HTTP/1.1\r\nHost: x\r\nContent-Length: -1\r\n\r\n",
        b"GET /small HTTP/1.1\r\nHost: x\r\nContent-Length: 1\r\nContent-Length: 2\r\n\r\n",
        b"\x16\x03\x01\x02\x00\x01\x00\x01\xfc\x03\x03" + SECRET.encode() + b"\r\n\r\n",  # TLS to a plain port
    ],
)
async def test_a_malformed_request_is_400_and_one_log_line_without_its_bytes(
    servers: list[HttpServer], clients: Clients, caplog: pytest.LogCaptureFixture, malformed: bytes
) -> None:
    servers.append(server := await start(ConnectionLimits(total=4, per_address=4, lifetime=30.0)))
    caplog.set_level(logging.DEBUG)
    sock = await clients.connect(port_of(server))
    await asyncio.get_running_loop().sock_sendall(sock, malformed)
    got, closed = await read_until_closed(sock, within=5.0)
    assert closed and got.startswith(b"HTTP/1.1 400 Bad Request\r\n")
    refused = [r for r in caplog.records if r.name == "ambit.telemetry.http_server"]
    assert [r.levelno for r in refused] == [logging.INFO]
    assert refused[0].getMessage().startswith("refused a malformed request from 127.0.0.1 (")
    assert SECRET not in caplog.text and not refused[0].exc_info


@settings(max_examples=40, deadline=None)
@given(st.binary(min_size=1, max_size=300))
def test_any_bytes_get_an_answer_or_a_close_and_the_server_goes_on(garbage: bytes) -> None:
    async def probe() -> None:
        server = await start(ConnectionLimits(total=4, per_address=4, lifetime=5.0, grace=0.5))
        try:
            reader, writer = await asyncio.open_connection("127.0.0.1", port_of(server))
            writer.write(garbage)
            writer.write_eof()
            async with asyncio.timeout(10):
                await reader.read()  # an answer or not, the server closes
            writer.close()
            reader, writer = await asyncio.open_connection("127.0.0.1", port_of(server))
            writer.write(b"GET /small HTTP/1.1\r\nHost: x\r\nConnection: close\r\n\r\n")
            async with asyncio.timeout(10):
                assert (await reader.read()).endswith(b"ok\n")
            writer.close()
        finally:
            await server.aclose()

    asyncio.run(probe())


# -- pipelining ---------------------------------------------------------------------------------------------------


async def test_pipelined_requests_are_all_answered_in_order(servers: list[HttpServer], clients: Clients) -> None:
    servers.append(server := await start(ConnectionLimits(total=4, per_address=4, lifetime=30.0)))
    sock = await clients.connect(port_of(server))
    loop = asyncio.get_running_loop()
    count = 500
    requests = b"".join(f"GET /echo?n={i} HTTP/1.1\r\nHost: x\r\n\r\n".encode() for i in range(count))
    await loop.sock_sendall(sock, requests + b"GET /small HTTP/1.1\r\nHost: x\r\nConnection: close\r\n\r\n")
    got, closed = await read_until_closed(sock, within=20.0)
    assert closed
    bodies = [part.split(b"\r\n\r\n", 1)[1] for part in got.split(b"HTTP/1.1 200 OK\r\n")[1:]]
    assert bodies[:-1] == [f"/echo [('n', '{i}')] None\n".encode() for i in range(count)] and bodies[-1] == b"ok\n"


async def test_a_pipelining_flood_that_never_reads_pins_little_and_does_not_starve_others(
    servers: list[HttpServer], clients: Clients
) -> None:
    """Ten clients each pipeline 40,000 requests for a 4 KiB answer and never read: the server stops reading them
    once their answers back up, grows by little, and answers an honest client promptly meanwhile."""
    servers.append(server := await start(ConnectionLimits(total=16, per_address=16, lifetime=30.0)))
    server.routes = {**server.routes, "/page": {"GET": lambda _r: Response(body=b"p" * 4096)}}
    loop = asyncio.get_running_loop()
    flood = b"GET /page HTTP/1.1\r\nHost: x\r\n\r\n" * 40_000  # 1.2 MiB of requests, 160 MiB of answers
    before = process_rss(os.getpid())

    async def flooder() -> None:
        sock = await clients.connect(port_of(server), rcvbuf=4096)
        with contextlib.suppress(OSError, TimeoutError):
            async with asyncio.timeout(3):
                await loop.sock_sendall(sock, flood)  # stops when the server stops reading

    floods = [asyncio.create_task(flooder()) for _ in range(10)]
    await asyncio.sleep(0.5)
    honest = await clients.connect(port_of(server))
    started = time.monotonic()
    assert b"200 OK" in await ask(honest, "/small")
    assert time.monotonic() - started < 2.0, "an honest client waited behind the flood"
    await asyncio.gather(*floods)
    grown = process_rss(os.getpid()) - before
    assert grown < 40 << 20, f"the server grew by {grown >> 20} MiB for 10 pipelining flooders"


# -- the same under uvloop (the node proxy's loop: its transports are not asyncio.Transport subclasses) -----------


async def _the_rules_in_brief() -> None:
    server = await start(ConnectionLimits(total=2, per_address=2, lifetime=0.5, grace=0.5))
    made = Clients()
    try:
        first = await made.connect(port_of(server))
        assert b"200 OK" in await ask(first, "/small")
        second = await made.connect(port_of(server))
        await asyncio.get_running_loop().sock_sendall(second, b"GET /small HTTP/1.1\r\nHost: x\r\nX-Slow: ")
        await eventually(lambda: server.gate.open == 2)
        assert await closed_by_peer(await made.connect(port_of(server)), within=5.0)  # past the total
        assert await closed_by_peer(second) and await closed_by_peer(first)  # the lifetime ends both
        await eventually(lambda: server.gate.open == 0)
        third = await made.connect(port_of(server))
        await asyncio.get_running_loop().sock_sendall(third, b"GET /" + b"a" * (2 * MAX_HEAD))
        got, closed = await read_until_closed(third, within=5.0)
        assert closed and got.startswith(b"HTTP/1.1 431 ")
    finally:
        for sock in made.socks:
            sock.close()
        await server.aclose()


@pytest.mark.parametrize("loop_name", ["asyncio", "uvloop"])
def test_the_rules_hold_on_either_event_loop(loop_name: str) -> None:
    run(_the_rules_in_brief, loop_name)
