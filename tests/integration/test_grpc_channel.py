"""The node proxy's gRPC channel (ambit.xds.grpc_channel) against a real grpcio server and against hostile servers.

grpcio is the honest peer: a stream the server drains with GOAWAY while it stops goes on to its end, and a consumer
that stops reading holds at most a window plus a message however much the server has to send. The hostile servers
are our own HTTP/2 engine on loopback TLS, scripted to break gRPC's rules (an oversized length prefix, a compressed
flag, garbage trailers, no answer, a GOAWAY on every connection): each gives the xDS and CA clients one clear,
one-line error and a reconnect paced by the client's back-off, never a traceback or unbounded buffering.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import ssl
import time
from collections.abc import AsyncIterator, Awaitable, Callable, Iterator
from dataclasses import dataclass
from pathlib import Path

import grpc  # type: ignore[import-untyped]
import grpc.aio  # type: ignore[import-untyped]
import pytest

from ambit.hbone import wire
from ambit.hbone.events import RequestReceived
from ambit.hbone.grpc_calls import PREFIX, StatusCode, encode_message
from ambit.hbone.messages import Http2ServerConnection
from ambit.hbone.settings import HboneSettings
from ambit.identity.caclient import CaError
from ambit.identity.istiod import IstiodCaClient
from ambit.model.identity import SpiffeId
from ambit.model.state import WorkloadState
from ambit.tls.certs import issue_server_cert, new_ca
from ambit.xds.client import Backoff, XdsClient
from ambit.xds.errors import GrpcCallError
from ambit.xds.grpc_channel import ChannelSettings, GrpcChannel
from ambit.xds.keepalive import KeepaliveSettings

SERVER_NAME = "istiod.istio-system.svc"
IDENTITY = SpiffeId("cluster.local", "shop", "web")
MIB = 1024 * 1024


async def until(condition: Callable[[], bool], seconds: float) -> None:
    """Wait for ``condition`` (polled every 10 ms), failing after ``seconds``."""
    deadline = time.monotonic() + seconds
    while not condition():
        assert time.monotonic() < deadline, "condition not met in time"
        await asyncio.sleep(0.01)


@dataclass
class Pki:
    root_file: Path
    root_pem: bytes
    server_context: ssl.SSLContext
    token_file: Path


@pytest.fixture
def pki(tmp_path: Path) -> Pki:
    now = time.time()
    ca = new_ca("test mesh root", now=now)
    server = issue_server_cert(ca, common_name="istiod", dns_names=[SERVER_NAME], ip_addresses=[], now=now)
    (tmp_path / "root.pem").write_bytes(ca.cert_pem)
    (tmp_path / "server.pem").write_bytes(server.cert_pem + ca.cert_pem)
    (tmp_path / "server.key").write_bytes(server.key_pem)
    (tmp_path / "token").write_text("a-token")
    context = ssl.SSLContext(ssl.PROTOCOL_TLS_SERVER)
    context.load_cert_chain(tmp_path / "server.pem", tmp_path / "server.key")
    context.set_alpn_protocols(["h2"])
    return Pki(tmp_path / "root.pem", ca.cert_pem, context, tmp_path / "token")


# -- grpcio, the honest peer ----------------------------------------------------------------------------------------


@dataclass
class Feed:
    """A grpcio server whose stream method answers each request with ``count`` messages of ``size`` bytes."""

    server: grpc.aio.Server
    port: int
    sent: int = 0


@pytest.fixture
async def feed() -> AsyncIterator[Feed]:
    holder: list[Feed] = []

    async def pour(requests: AsyncIterator[bytes], context: grpc.aio.ServicerContext) -> AsyncIterator[bytes]:
        async for request in requests:
            count, size = (int(part) for part in request.split(b"x"))
            for _ in range(count):
                yield b"m" * size
                holder[0].sent += 1

    handler = grpc.method_handlers_generic_handler("test.Feed", {"Pour": grpc.stream_stream_rpc_method_handler(pour)})
    server = grpc.aio.server(options=[("grpc.max_send_message_length", 16 * MIB)])
    server.add_generic_rpc_handlers((handler,))
    port = server.add_insecure_port("127.0.0.1:0")
    await server.start()
    holder.append(Feed(server, port))
    try:
        yield holder[0]
    finally:
        await server.stop(None)


async def test_a_stream_goes_on_to_its_end_while_grpcio_drains_the_connection_with_goaway(feed: Feed) -> None:
    async with GrpcChannel(ChannelSettings(f"127.0.0.1:{feed.port}", None)) as channel:
        call = await channel.stream("/test.Feed/Pour", metadata=())
        await call.write(b"1x10")
        assert await call.read() == b"m" * 10
        stopping = asyncio.create_task(feed.server.stop(grace=10.0))  # GOAWAY now; the stream may finish
        await asyncio.sleep(0.3)
        await call.write(b"2x5")
        assert [await call.read(), await call.read()] == [b"m" * 5] * 2
        call.cancel()
        await asyncio.wait_for(stopping, 15.0)


async def test_a_consumer_that_stops_reading_holds_at_most_a_window_plus_a_message(feed: Feed) -> None:
    """The server has 64 MiB to send; the client takes one message and stops. The server can only get a stream
    window (4 MiB) plus a message past what the client took, plus what grpcio and the kernel buffer themselves."""
    async with GrpcChannel(ChannelSettings(f"127.0.0.1:{feed.port}", None, max_receive_message=2 * MIB)) as channel:
        call = await channel.stream("/test.Feed/Pour", metadata=())
        await call.write(f"64x{MIB}".encode())
        assert len(await call.read() or b"") == MIB
        previous = -1
        while feed.sent != previous:  # until the server is held back
            previous = feed.sent
            await asyncio.sleep(0.5)
        queued = len(call.queue)  # type: ignore[attr-defined]
        print(f"held back after {feed.sent} messages sent, {queued} queued")
        assert queued * MIB <= 4 * MIB + MIB, f"{queued} messages held"
        assert feed.sent < 16, f"the server got {feed.sent} messages out to a consumer that took 1"
        for _ in range(63):  # reading again reopens the window: everything arrives
            assert len(await call.read() or b"") == MIB
        call.cancel()


async def test_a_message_above_the_bound_fails_the_call_and_the_channel_serves_the_next(feed: Feed) -> None:
    async with GrpcChannel(ChannelSettings(f"127.0.0.1:{feed.port}", None, max_receive_message=1000)) as channel:
        call = await channel.stream("/test.Feed/Pour", metadata=())
        await call.write(b"1x1001")
        with pytest.raises(GrpcCallError) as refused:
            await call.read()
        assert refused.value.code is StatusCode.RESOURCE_EXHAUSTED
        again = await channel.stream("/test.Feed/Pour", metadata=())
        await again.write(b"1x1000")
        assert await again.read() == b"m" * 1000
        again.cancel()
        assert channel.dials == 1


# -- hostile servers --------------------------------------------------------------------------------------------------

DEFAULT_SETTINGS = HboneSettings()
Script = Callable[[Http2ServerConnection, int], Awaitable[None] | None]


class Hostile:
    """A TLS (ALPN h2) server on our own engine that answers every request with ``script``; with ``goaway``,
    every connection gets GOAWAY right after its SETTINGS instead."""

    def __init__(
        self,
        pki: Pki,
        script: Script | None = None,
        *,
        goaway: bool = False,
        tls: bool = True,
        settings: HboneSettings = DEFAULT_SETTINGS,
    ) -> None:
        self.pki, self.script, self.goaway, self.tls, self.settings = pki, script, goaway, tls, settings
        self.connections = 0
        self.requests = 0
        self.port = 0
        self._server: asyncio.Server | None = None
        self._writers: set[asyncio.StreamWriter] = set()
        self._handlers: set[asyncio.Task[None]] = set()

    async def __aenter__(self) -> Hostile:
        context = self.pki.server_context if self.tls else None
        self._server = await asyncio.start_server(self._serve, "127.0.0.1", 0, ssl=context)
        self.port = self._server.sockets[0].getsockname()[1]
        return self

    async def __aexit__(self, *exc_info: object) -> None:
        assert self._server is not None
        self._server.close()
        for writer in list(self._writers):
            writer.transport.abort()
        if self._handlers:
            await asyncio.wait(self._handlers, timeout=5.0)
        await self._server.wait_closed()

    async def _serve(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        self.connections += 1
        self._writers.add(writer)
        handler = asyncio.current_task()
        assert handler is not None
        self._handlers.add(handler)
        conn = Http2ServerConnection(self.settings)
        try:
            if not self.tls:  # a server that takes the TCP connection and says nothing, ever
                await reader.read()
                return
            if self.goaway:
                conn.close(wire.NO_ERROR)
            writer.write(conn.data_to_send())
            while data := await reader.read(65536):
                for event in conn.receive_data(data):
                    if isinstance(event, RequestReceived) and self.script is not None:
                        self.requests += 1
                        if (step := self.script(conn, event.stream_id)) is not None:
                            await step
                writer.write(conn.data_to_send())
                await writer.drain()
        except (OSError, ssl.SSLError):
            pass
        finally:
            self._writers.discard(writer)
            self._handlers.discard(handler)
            writer.transport.abort()


GRPC_HEAD = [("content-type", "application/grpc")]


def oversized(conn: Http2ServerConnection, sid: int) -> None:
    conn.respond(sid, 200, GRPC_HEAD)
    conn.send_data(sid, PREFIX.pack(0, 0xFFFFFFFF) + b"x" * 65536)


def compressed(conn: Http2ServerConnection, sid: int) -> None:
    conn.respond(sid, 200, GRPC_HEAD)
    conn.send_data(sid, PREFIX.pack(1, 3) + b"abc")


def garbage_trailers(conn: Http2ServerConnection, sid: int) -> None:
    conn.respond(sid, 200, GRPC_HEAD)
    conn.send_trailers(sid, [("grpc-status", "banana"), ("grpc-message", "%0A%1B[31m" * 300 + "%ZZ%ff")])


def truncated(conn: Http2ServerConnection, sid: int) -> None:
    conn.respond(sid, 200, GRPC_HEAD)
    conn.send_data(sid, encode_message(b"a whole message")[:9])
    conn.send_trailers(sid, [("grpc-status", "0")])


def answer_then_goaway(conn: Http2ServerConnection, sid: int) -> None:
    conn.respond(sid, 200, GRPC_HEAD)
    conn.send_data(sid, encode_message(b"answer"))
    conn.send_trailers(sid, [("grpc-status", "0")])
    conn.go_away("restarting")


def mute(conn: Http2ServerConnection, sid: int) -> None:
    return None  # the request is taken and never answered; PINGs are still acknowledged by the engine


CASES = [
    pytest.param(oversized, StatusCode.RESOURCE_EXHAUSTED, "4294967295 bytes", id="oversized-prefix"),
    pytest.param(compressed, StatusCode.INTERNAL, "flag 1", id="compressed-flag"),
    pytest.param(garbage_trailers, StatusCode.UNKNOWN, "", id="garbage-trailers"),
    pytest.param(truncated, StatusCode.INTERNAL, "inside a message", id="truncated-message"),
]


@pytest.fixture
def clean_logs(caplog: pytest.LogCaptureFixture) -> Iterator[pytest.LogCaptureFixture]:
    """Fails the test if anything logged a traceback (or asyncio complained of a task's lost exception)."""
    caplog.set_level(logging.INFO)
    yield caplog
    tracebacks = [r for r in caplog.records if r.exc_info or r.name == "asyncio"]
    assert not tracebacks, [r.getMessage() for r in tracebacks]


def ca_client(pki: Pki, port: int, timeout: float = 10.0) -> IstiodCaClient:
    return IstiodCaClient(f"127.0.0.1:{port}", pki.root_file, pki.token_file, server_name=SERVER_NAME, timeout=timeout)


@pytest.mark.parametrize(("script", "code", "detail"), CASES)
async def test_a_hostile_ca_gives_one_clear_error_and_the_connection_serves_the_retry(
    pki: Pki, clean_logs: object, script: Script, code: StatusCode, detail: str
) -> None:
    async with Hostile(pki, script) as server, ca_client(pki, server.port) as client:
        for _ in range(2):
            with pytest.raises(CaError) as failed:
                await client.fetch_certificate(IDENTITY)
            message = str(failed.value)
            assert f"refused a certificate for {IDENTITY}: {code.name}" in message and detail in message, message
            assert "\n" not in message and len(message) < 800, message
        assert (server.connections, server.requests) == (1, 2)  # a stream error leaves the connection usable


async def test_a_ca_that_never_answers_is_deadline_exceeded_within_the_timeout(pki: Pki, clean_logs: object) -> None:
    async with Hostile(pki, mute) as server, ca_client(pki, server.port, timeout=1.0) as client:
        started = time.monotonic()
        with pytest.raises(CaError, match="DEADLINE_EXCEEDED: no answer within 1 s"):
            await client.fetch_certificate(IDENTITY)
        assert time.monotonic() - started < 5.0  # 1 s, and generous slack for a loaded machine


async def test_a_server_that_never_speaks_tls_is_unavailable_after_the_connect_timeout(
    pki: Pki, clean_logs: object
) -> None:
    async with Hostile(pki, tls=False) as server:
        settings = ChannelSettings(f"127.0.0.1:{server.port}", pki.root_pem, SERVER_NAME, connect_timeout=0.5)
        async with GrpcChannel(settings) as channel:
            with pytest.raises(GrpcCallError) as failed:
                await channel.unary("/a.B/C", b"", metadata=(), time_limit=30.0)
        assert failed.value.code is StatusCode.UNAVAILABLE and "no HTTP/2 within 0.5 s" in str(failed.value)


async def test_a_server_with_another_name_is_refused_by_tls(pki: Pki, clean_logs: object) -> None:
    async with Hostile(pki, mute) as server:
        settings = ChannelSettings(f"127.0.0.1:{server.port}", pki.root_pem, "other.istio-system.svc")
        async with GrpcChannel(settings) as channel:
            with pytest.raises(GrpcCallError, match=r"UNAVAILABLE: cannot connect .*certificate"):
                await channel.unary("/a.B/C", b"", metadata=(), time_limit=5.0)
        assert server.requests == 0


async def test_a_goaway_storm_fails_each_ca_call_and_each_dials_once(pki: Pki, clean_logs: object) -> None:
    async with Hostile(pki, mute, goaway=True) as server, ca_client(pki, server.port) as client:
        for attempt in range(1, 4):
            with pytest.raises(CaError, match="UNAVAILABLE"):
                await client.fetch_certificate(IDENTITY)
            assert server.connections == attempt  # no reconnect loop of the channel's own
        assert server.requests == 0


async def test_after_a_graceful_goaway_the_next_call_dials_a_new_connection(pki: Pki, clean_logs: object) -> None:
    async with Hostile(pki, answer_then_goaway) as server:
        settings = ChannelSettings(f"127.0.0.1:{server.port}", pki.root_pem, SERVER_NAME)
        async with GrpcChannel(settings) as channel:
            for calls in range(1, 4):
                assert await channel.unary("/a.B/C", b"q", metadata=(), time_limit=5.0) == b"answer"
                assert (channel.dials, server.requests) == (calls, calls)
            await until(lambda: not server._writers or len(server._writers) <= 1, seconds=5.0)  # drained ones closed


async def test_a_server_that_allows_no_stream_costs_one_connection_per_call_and_keeps_none(
    pki: Pki, clean_logs: object
) -> None:
    async with (
        Hostile(pki, mute, settings=HboneSettings(max_concurrent_streams=0)) as server,
        ca_client(pki, server.port) as client,
    ):
        for attempt in range(1, 4):
            with pytest.raises(CaError, match="UNAVAILABLE: cannot open a call"):
                await client.fetch_certificate(IDENTITY)
            assert server.connections == attempt
        await until(lambda: len(server._writers) <= 1, seconds=5.0)  # the connections left behind were closed


def xds_client(pki: Pki, port: int) -> XdsClient:
    return XdsClient(
        f"127.0.0.1:{port}",
        WorkloadState(),
        lambda: None,
        root_cert_file=pki.root_file,
        token_file=pki.token_file,
        cluster_id="Kubernetes",
        server_name=SERVER_NAME,
        backoff=Backoff(initial=0.1, maximum=0.4),
        keepalive=KeepaliveSettings(time=2.0, timeout=1.0),
    )


@pytest.mark.parametrize(
    ("script", "goaway", "code"),
    [*((c.values[0], False, c.values[1]) for c in CASES), (mute, True, StatusCode.UNAVAILABLE)],
    ids=[*(str(c.id) for c in CASES), "goaway-storm"],
)
async def test_a_hostile_control_plane_gives_the_xds_client_one_clear_error_and_a_paced_reconnect(
    pki: Pki, clean_logs: object, script: Script, goaway: bool, code: StatusCode
) -> None:
    async with Hostile(pki, script, goaway=goaway) as server:
        client = xds_client(pki, server.port)
        await client.start()
        try:
            started = time.monotonic()
            await until(lambda: client.connects >= 4, seconds=20.0)
            elapsed = time.monotonic() - started
            assert client.last_error.startswith(code.name) and "\n" not in client.last_error, client.last_error
            assert not client.synced
        finally:
            await client.aclose()
        # Back-off: at least 0.1 + 0.2 + 0.2 s (the jitter halves at most) before the fourth connect.
        assert elapsed >= 0.5, f"4 connects in {elapsed:.2f}s"
        assert server.connections <= client.connects


async def test_an_xds_server_that_never_answers_the_stream_is_noticed_by_keepalive_only_if_it_goes_silent(
    pki: Pki, clean_logs: object
) -> None:
    """A server that takes the stream and answers PINGs but never responds is alive: the client waits (as grpcio
    does) without reconnecting, and holds nothing but the stream."""
    async with Hostile(pki, mute) as server:
        client = xds_client(pki, server.port)
        await client.start()
        try:
            await until(lambda: client.connected, seconds=10.0)
            await asyncio.sleep(4.0)  # two keepalive periods: PINGs are answered
            assert (client.connects, server.connections, server.requests) == (1, 1, 1)
        finally:
            with contextlib.suppress(Exception):
                await client.aclose()
