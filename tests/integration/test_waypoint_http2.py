"""HTTP/2 and gRPC through the waypoint on loopback: real gRPC servers (grpcio's aio server) behind the endpoints,
a real gRPC client (grpcio, through a local TCP bridge into an HBONE tunnel) and h2 as the independent HTTP/2
client for what a gRPC client would not do (resets, floods). See :mod:`tests.integration.waypoint_rig`."""

from __future__ import annotations

import asyncio
import collections
import contextlib
import dataclasses
import hashlib
import random
import socket
import struct
from collections.abc import AsyncIterator
from pathlib import Path

import grpc
import grpc.aio
import h2.config
import h2.connection
import h2.events
import h2.exceptions
import pytest
from tests.integration.waypoint_rig import (
    ECHO_VIP,
    GRPC_MIXED_VIP,
    GRPC_PORT,
    GRPC_TWO_VIP,
    GRPC_VIP,
    H2C_TARGET_PORT,
    WEB2_VIP,
    Rig,
    echo_of,
    free_port,
    http_get,
    mirroring_router,
    started_rig,
)

from ambit.hbone import wire
from ambit.model.route_matches import PathMatch, PathMatchType, RouteMatch, ValueMatch
from ambit.model.routes import (
    BackendService,
    CorsPolicy,
    Fault,
    RouteRule,
    RouteTable,
    Timeouts,
    WaypointConfig,
    WeightedBackend,
)
from ambit.proxy.hbone_client import HboneClient
from ambit.proxy.hbone_stream import HboneStream
from ambit.proxy.streams import SocketStream
from ambit.tls.socket_transport import TlsTransportKind
from ambit.waypoint.decisions import Decision, Forward, RequestHead
from ambit.waypoint.grpc_timeout import parse_grpc_timeout
from ambit.waypoint.settings import WaypointLimits
from ambit.waypoint.sniff import H2_PREFACE
from ambit.waypoint.tcp import relay

LIMITS = WaypointLimits(sniff_timeout=0.5, startup_wait=5.0, max_streams_per_connection=20)
GRPC = BackendService("app", "grpc.app.svc.cluster.local", GRPC_PORT)
GRPC_TWO = BackendService("app", "grpc-two.app.svc.cluster.local", GRPC_PORT)


@pytest.fixture
async def rig(tmp_path: Path, tls_transport: TlsTransportKind) -> AsyncIterator[Rig]:
    async with started_rig(tmp_path, LIMITS, tls_transport) as rig:
        yield rig


@contextlib.asynccontextmanager
async def grpc_channel(rig: Rig, vip: str = GRPC_VIP) -> AsyncIterator[grpc.aio.Channel]:
    """A grpcio channel whose TCP connections each become an HBONE tunnel to ``vip`` through the waypoint."""
    listener = socket.socket()
    listener.bind(("127.0.0.1", free_port()))
    listener.listen(8)
    listener.setblocking(False)
    clients: list[HboneClient] = []
    relays: set[asyncio.Task[object]] = set()

    async def bridge(sock: socket.socket) -> None:
        client, tunnel = await rig.tunnel(f"{vip}:{GRPC_PORT}")
        clients.append(client)
        await relay(SocketStream(sock), tunnel, 30.0)

    async def accept() -> None:
        loop = asyncio.get_running_loop()
        while True:
            sock, _ = await loop.sock_accept(listener)
            task: asyncio.Task[object] = asyncio.create_task(bridge(sock))
            relays.add(task)
            task.add_done_callback(relays.discard)

    accepting = asyncio.create_task(accept())
    channel = grpc.aio.insecure_channel(f"127.0.0.1:{listener.getsockname()[1]}")
    try:
        yield channel
    finally:
        await channel.close()
        accepting.cancel()
        for task in [accepting, *relays]:
            task.cancel()
        await asyncio.gather(accepting, *relays, return_exceptions=True)
        listener.close()
        for client in clients:
            await client.aclose()


def _identity(data: bytes) -> bytes:
    return data


def unary(channel: grpc.aio.Channel, method: str) -> grpc.aio.UnaryUnaryMultiCallable[bytes, bytes]:
    return channel.unary_unary(f"/echo.Echo/{method}", request_serializer=_identity, response_deserializer=_identity)


def grpc_frame(payload: bytes) -> bytes:
    return b"\0" + struct.pack(">I", len(payload)) + payload


class H2OverTunnel:
    """h2 as a client on one HBONE tunnel to the waypoint: requests on many streams of one connection."""

    def __init__(self, stream: HboneStream) -> None:
        self.stream = stream
        self.h2 = h2.connection.H2Connection(h2.config.H2Configuration(client_side=True, header_encoding="utf-8"))
        self.h2.initiate_connection()
        self.events: dict[int, list[h2.events.Event]] = collections.defaultdict(list)
        self.terminated: h2.events.ConnectionTerminated | None = None
        self.eof = False

    async def flush(self) -> None:
        data = self.h2.data_to_send()
        if data:
            await self.stream.write(data)

    def grpc_headers(self, method: str, extra: tuple[tuple[str, str], ...] = ()) -> list[tuple[str, str]]:
        return [
            (":method", "POST"),
            (":scheme", "http"),
            (":authority", f"grpc.app.svc.cluster.local:{GRPC_PORT}"),
            (":path", f"/echo.Echo/{method}"),
            ("content-type", "application/grpc"),
            ("te", "trailers"),
            *extra,
        ]

    async def start_call(self, method: str, message: bytes | None, extra: tuple[tuple[str, str], ...] = ()) -> int:
        sid = self.h2.get_next_available_stream_id()
        self.h2.send_headers(sid, self.grpc_headers(method, extra))
        if message is not None:
            self.h2.send_data(sid, grpc_frame(message), end_stream=True)
        await self.flush()
        return sid

    async def pump_once(self) -> None:
        data = await self.stream.read()
        if not data:
            self.eof = True
            return
        for event in self.h2.receive_data(data):
            if isinstance(event, h2.events.ConnectionTerminated):
                self.terminated = event
            sid = getattr(event, "stream_id", None)
            if sid:
                self.events[sid].append(event)
            if isinstance(event, h2.events.DataReceived) and event.flow_controlled_length:
                self.h2.acknowledge_received_data(event.flow_controlled_length, event.stream_id)
        await self.flush()

    async def until(self, done: object) -> None:
        async with asyncio.timeout(15):
            while not done() and not self.eof:  # type: ignore[operator]
                await self.pump_once()

    def finished(self, sid: int) -> bool:
        return any(isinstance(e, h2.events.StreamEnded | h2.events.StreamReset) for e in self.events[sid])

    def answer(self, sid: int) -> tuple[dict[str, str], bytes, dict[str, str]]:
        headers: dict[str, str] = {}
        trailers: dict[str, str] = {}
        body = b""
        for event in self.events[sid]:
            if isinstance(event, h2.events.ResponseReceived):
                headers = dict(event.headers)  # type: ignore[arg-type]
            elif isinstance(event, h2.events.DataReceived):
                body += event.data
            elif isinstance(event, h2.events.TrailersReceived):
                trailers = dict(event.headers)  # type: ignore[arg-type]
        return headers, body, trailers

    async def call(self, method: str, message: bytes, extra: tuple[tuple[str, str], ...] = ()) -> bytes:
        sid = await self.start_call(method, message, extra)
        await self.until(lambda: self.finished(sid))
        headers, body, trailers = self.answer(sid)
        assert headers.get(":status") == "200", (headers, body)
        assert trailers.get("grpc-status") == "0", trailers
        return body[5:]


async def until_no_upstream_streams(rig: Rig) -> None:
    """Every upstream stream of finished requests leaves its connection's table (no slot leaks)."""
    async with asyncio.timeout(10):
        while rig.waypoint.context.http2.open_streams():  # noqa: ASYNC110 - the waypoint's own bookkeeping
            await asyncio.sleep(0.01)


async def metric_lines(rig: Rig, name: str) -> list[str]:
    _, text = await http_get(f"http://127.0.0.1:{rig.settings.stats_port}/stats/prometheus")
    return [line for line in text.splitlines() if line.startswith(name)]


async def test_unary_grpc_through_the_waypoint_is_answered_and_counted_as_grpc(rig: Rig) -> None:
    async with grpc_channel(rig) as channel:
        answers = [await unary(channel, "Say")(f"hello {i}".encode(), timeout=10) for i in range(4)]
    assert sorted(a.split(b":")[0] for a in answers) == [b"echo-1", b"echo-1", b"echo-2", b"echo-2"]
    lines = await metric_lines(rig, "istio_requests_total")
    grpc_lines = [line for line in lines if 'request_protocol="grpc"' in line and 'grpc_response_status="0"' in line]
    assert grpc_lines and sum(float(line.rsplit(" ", 1)[1]) for line in grpc_lines) == 4


async def test_a_grpc_error_status_and_trailing_metadata_reach_the_client_intact(rig: Rig) -> None:
    async with grpc_channel(rig) as channel:
        with pytest.raises(grpc.aio.AioRpcError) as caught:
            await unary(channel, "Say")(b"fail", timeout=10)
    assert caught.value.code() is grpc.StatusCode.NOT_FOUND
    assert caught.value.details() == "no such thing"
    assert ("x-why", "asked-to") in tuple(caught.value.trailing_metadata() or ())
    lines = await metric_lines(rig, "istio_requests_total")
    assert any('grpc_response_status="5"' in line and 'request_protocol="grpc"' in line for line in lines)


async def test_a_bidirectional_grpc_stream_is_relayed_message_by_message(rig: Rig) -> None:
    async with grpc_channel(rig) as channel:
        call = channel.stream_stream("/echo.Echo/Chat", request_serializer=_identity, response_deserializer=_identity)()
        got = []
        for i in range(50):
            await call.write(f"m{i}".encode())
            got.append(await asyncio.wait_for(call.read(), 10))  # each answer before the next message: streamed
        await call.done_writing()
        assert await call.code() is grpc.StatusCode.OK
    assert [g.split(b":", 1)[1] for g in got] == [f"m{i}".encode() for i in range(50)]
    await until_no_upstream_streams(rig)


async def test_large_grpc_messages_cross_the_flow_control_windows_both_ways(rig: Rig) -> None:
    async with grpc_channel(rig) as channel:
        answer = await unary(channel, "Say")(b"big", timeout=20)
        upload = bytes(range(256)) * 8 * 1024  # 2 MiB: eight times the waypoint's stream window
        echoed = await unary(channel, "Say")(upload, timeout=20)
    assert answer == b"b" * (1024 * 1024)
    assert echoed.endswith(upload)


async def test_requests_on_one_http2_connection_are_spread_over_the_endpoints_and_upstream_is_multiplexed(
    rig: Rig,
) -> None:
    client, stream = await rig.tunnel(f"{GRPC_VIP}:{GRPC_PORT}")
    h2c = H2OverTunnel(stream)
    sids = [await h2c.start_call("Say", f"n{i}".encode()) for i in range(10)]  # ten at once on one connection
    await h2c.until(lambda: all(h2c.finished(sid) for sid in sids))
    names = collections.Counter(h2c.answer(sid)[1][5:].split(b":")[0] for sid in sids)
    assert names == {b"echo-1": 5, b"echo-2": 5}
    assert all(h2c.answer(sid)[0].get("x-request-id") is None for sid in sids)  # added upstream, not echoed
    assert [e.tunnels for e in rig.endpoints] == [1, 1]  # one upstream HTTP/2 connection per endpoint, shared
    await until_no_upstream_streams(rig)
    await client.aclose()


async def test_an_http2_header_match_picks_the_backend_and_weights_hold_90_10(rig: Rig) -> None:
    split = RouteRule(
        "HTTPRoute/app/split", RouteMatch(), backends=(WeightedBackend(GRPC, 90), WeightedBackend(GRPC_TWO, 10))
    )
    canary = RouteRule(
        "HTTPRoute/app/canary",
        RouteMatch(headers=(ValueMatch("x-version", "v2"),)),
        backends=(WeightedBackend(GRPC_TWO, 1),),
    )
    table = RouteTable(GRPC.service_key, GRPC_PORT, http=(canary, split))
    rig.waypoint.context.routes.replace(WaypointConfig("app/waypoint", (table,)))
    rig.waypoint.context.choose = lambda candidates: candidates[0]  # echo-1 for "grpc": echo-2 only via grpc-two
    rig.waypoint.context.random = random.Random(1717).random  # seeded: the split is real, the test not flaky
    client, stream = await rig.tunnel(f"{GRPC_VIP}:{GRPC_PORT}")
    h2c = H2OverTunnel(stream)
    for _ in range(5):
        assert (await h2c.call("Say", b"x", (("x-version", "v2"),))).startswith(b"echo-2:v2:")
    counts: collections.Counter[bytes] = collections.Counter()
    for _ in range(25):  # 500 requests, 20 at a time on the one connection
        sids = [await h2c.start_call("Say", b"y") for _i in range(20)]
        await h2c.until(lambda sids=sids: all(h2c.finished(sid) for sid in sids))  # type: ignore[misc]
        counts.update(h2c.answer(sid)[1][5:].split(b":")[0] for sid in sids)
    assert counts[b"echo-1"] + counts[b"echo-2"] == 500
    assert 0.07 <= counts[b"echo-2"] / 500 <= 0.13, counts
    await client.aclose()


async def test_a_client_reset_cancels_the_call_upstream_and_the_connection_goes_on(rig: Rig) -> None:
    client, stream = await rig.tunnel(f"{GRPC_VIP}:{GRPC_PORT}")
    h2c = H2OverTunnel(stream)
    sid = await h2c.start_call("Hang", b"")
    async with asyncio.timeout(10):
        while sum(e.grpc_calls.count("Hang") for e in rig.endpoints) == 0:  # noqa: ASYNC110 - another task's progress
            await asyncio.sleep(0.01)
    h2c.h2.reset_stream(sid)
    await h2c.flush()
    async with asyncio.timeout(10):
        while sum(e.grpc_cancelled for e in rig.endpoints) == 0:  # noqa: ASYNC110
            await asyncio.sleep(0.01)
    assert (await h2c.call("Say", b"after")).endswith(b"after")
    await client.aclose()


async def test_an_endpoint_that_goes_away_mid_call_answers_unavailable_and_the_connection_survives(rig: Rig) -> None:
    client, stream = await rig.tunnel(f"{GRPC_VIP}:{GRPC_PORT}")
    h2c = H2OverTunnel(stream)
    sid = await h2c.start_call("Hang", b"")
    async with asyncio.timeout(10):
        while sum(e.grpc_calls.count("Hang") for e in rig.endpoints) == 0:  # noqa: ASYNC110
            await asyncio.sleep(0.01)
    for endpoint in rig.endpoints:  # the endpoint's server goes away: its connection and streams die
        await endpoint.grpc_server.stop(0)
    await h2c.until(lambda: h2c.finished(sid))
    headers, _, _ = h2c.answer(sid)
    assert (headers[":status"], headers["grpc-status"]) == ("200", "14")  # 503 UC, as gRPC says it: UNAVAILABLE
    assert h2c.terminated is None  # the client's connection survives
    await client.aclose()


async def test_an_undeclared_port_is_sniffed_as_http2_and_served_per_request(rig: Rig) -> None:
    client, stream = await rig.tunnel(f"{GRPC_TWO_VIP}:{GRPC_PORT}")
    h2c = H2OverTunnel(stream)
    assert (await h2c.call("Say", b"sniffed")).startswith(b"echo-2:")
    await client.aclose()


async def test_a_headers_only_stream_flood_is_bounded_by_the_stream_limit(rig: Rig) -> None:
    client, stream = await rig.tunnel(f"{GRPC_VIP}:{GRPC_PORT}")
    h2c = H2OverTunnel(stream)
    h2c.h2.remote_settings.max_concurrent_streams = 10_000  # ignore the waypoint's limit, as an attacker would
    h2c.h2.remote_settings.acknowledge()
    for _ in range(300):  # heads that never end: each would hold a request open
        sid = h2c.h2.get_next_available_stream_id()
        h2c.h2.send_headers(sid, h2c.grpc_headers("Say"))
    await h2c.flush()
    await h2c.until(lambda: h2c.terminated is not None or len(_refused(h2c)) >= 280 - LIMITS.max_streams_per_connection)
    assert h2c.terminated is not None or len(_refused(h2c)) >= 280
    context = rig.waypoint.context
    assert context.tunnels <= 1
    await client.aclose()
    # the waypoint still serves others
    client, stream = await rig.tunnel(f"{GRPC_VIP}:{GRPC_PORT}")
    assert (await H2OverTunnel(stream).call("Say", b"still")).endswith(b"still")
    await client.aclose()


def _refused(h2c: H2OverTunnel) -> list[h2.events.StreamReset]:
    return [
        e
        for events in h2c.events.values()
        for e in events
        if isinstance(e, h2.events.StreamReset) and e.error_code == wire.REFUSED_STREAM
    ]


async def test_a_rapid_reset_flood_ends_the_connection_with_enhance_your_calm(rig: Rig) -> None:
    client, stream = await rig.tunnel(f"{GRPC_VIP}:{GRPC_PORT}")
    h2c = H2OverTunnel(stream)
    for _ in range(400):
        sid = h2c.h2.get_next_available_stream_id()
        try:
            h2c.h2.send_headers(sid, h2c.grpc_headers("Hang"))
            h2c.h2.reset_stream(sid)
        except h2.exceptions.ProtocolError:
            break
    with contextlib.suppress(Exception):
        await h2c.flush()
    await h2c.until(lambda: h2c.terminated is not None)
    assert h2c.terminated is not None and h2c.terminated.error_code == wire.ENHANCE_YOUR_CALM
    await client.aclose()


async def test_a_malformed_request_head_resets_only_its_stream(rig: Rig) -> None:
    client, stream = await rig.tunnel(f"{GRPC_VIP}:{GRPC_PORT}")
    h2c = H2OverTunnel(stream)
    h2c.h2.config.validate_outbound_headers = False
    sid = h2c.h2.get_next_available_stream_id()
    h2c.h2.send_headers(sid, [(":method", "GET"), (":path", "/")], end_stream=True)  # no :scheme
    await h2c.flush()
    await h2c.until(lambda: h2c.finished(sid))
    assert [e.error_code for e in h2c.events[sid] if isinstance(e, h2.events.StreamReset)] == [wire.PROTOCOL_ERROR]
    assert (await h2c.call("Say", b"fine")).endswith(b"fine")
    lines = await metric_lines(rig, "istio_requests_total")
    assert any('response_code="400"' in line and 'response_flags="DPE"' in line for line in lines), lines
    await client.aclose()


async def test_a_retry_on_connect_failure_hides_a_dead_endpoint_from_grpc_calls(rig: Rig) -> None:
    async with grpc_channel(rig, GRPC_MIXED_VIP) as channel:
        answers = [await unary(channel, "Say")(f"r{i}".encode(), timeout=10) for i in range(6)]
    assert all(a.startswith(b"echo-1:") for a in answers)  # every other first try went to dead-1 and was retried
    lines = await metric_lines(rig, "istio_requests_total")
    assert any('grpc_response_status="0"' in line and "grpc-mixed" in line for line in lines)


async def test_a_backend_timeout_answers_a_grpc_client_unavailable_in_grpc_form(rig: Rig) -> None:
    def router(table: RouteTable | None, destination: BackendService, request: RequestHead, r: float) -> Decision:
        # Only the hanging call gets the short budget: the first call also opens the tunnel to the backend, which
        # may take longer than 0.3 s on a loaded machine.
        timeouts = Timeouts(backend_request=0.3) if request.path.endswith("/Hang") else Timeouts()
        return Forward(destination, request, timeouts=timeouts)

    rig.waypoint.context.router = router
    async with grpc_channel(rig) as channel:
        assert (await unary(channel, "Say")(b"quick", timeout=10)).endswith(b"quick")
        with pytest.raises(grpc.aio.AioRpcError) as caught:
            await unary(channel, "Hang")(b"", timeout=10)
    assert caught.value.code() is grpc.StatusCode.UNAVAILABLE
    assert caught.value.details() == "upstream request timeout"
    lines = await metric_lines(rig, "istio_requests_total")
    assert any('response_code="504"' in line and 'grpc_response_status="14"' in line for line in lines)


@contextlib.asynccontextmanager
async def silent_h2_backends(rig: Rig) -> AsyncIterator[list[dict[str, str]]]:
    """On each endpoint's port 8082 (Service ``web2``, declared HTTP/2) an h2c server that records every request's
    headers and never answers: only the waypoint's deadline can end a call."""
    seen: list[dict[str, str]] = []

    async def serve(reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        conn = h2.connection.H2Connection(h2.config.H2Configuration(client_side=False, header_encoding="utf-8"))
        conn.initiate_connection()
        writer.write(conn.data_to_send())
        with contextlib.suppress(ConnectionError, h2.exceptions.ProtocolError):
            while data := await reader.read(65536):
                for event in conn.receive_data(data):
                    if isinstance(event, h2.events.RequestReceived):
                        seen.append(dict(event.headers))  # type: ignore[arg-type]
                writer.write(conn.data_to_send())
                await writer.drain()
        writer.close()

    servers = []
    for endpoint in rig.endpoints:
        server = await asyncio.start_server(serve, "127.0.0.1", 0)
        servers.append(server)
        endpoint.extra[H2C_TARGET_PORT] = server.sockets[0].getsockname()[1]
    try:
        yield seen
    finally:
        for server in servers:
            server.close()


@pytest.mark.parametrize(
    ("route", "sent", "most"),
    [
        (Timeouts(), "300m", 300),  # no route timeout (istiod: max_grpc_timeout 0): the client's deadline
        (Timeouts(request=0.4), "1H", 400),  # the route's timeout caps the client's
        (Timeouts(request=0.4), None, 400),  # and stands in for none
    ],
    ids=["client-deadline", "capped", "route-for-none"],
)
async def test_a_grpc_call_s_deadline_is_its_grpc_timeout_capped_by_the_route_and_told_upstream(
    rig: Rig, route: Timeouts, sent: str | None, most: int
) -> None:
    """Envoy's router with istiod's max_grpc_timeout: the call is answered at its deadline (the router's 504,
    in gRPC form: grpc-status 14 UNAVAILABLE, as Envoy converts it) and the endpoint was told the deadline in a
    rewritten grpc-timeout (and x-envoy-expected-rq-timeout-ms)."""

    def router(table: RouteTable | None, destination: BackendService, request: RequestHead, r: float) -> Decision:
        return Forward(destination, request, timeouts=route)

    rig.waypoint.context.router = router
    async with silent_h2_backends(rig) as seen:
        client, stream = await rig.tunnel(f"{WEB2_VIP}:80")
        h2c = H2OverTunnel(stream)
        extra = (("grpc-timeout", sent),) if sent is not None else ()
        sid = h2c.h2.get_next_available_stream_id()
        h2c.h2.send_headers(
            sid,
            [
                (":method", "POST"),
                (":scheme", "http"),
                (":authority", "web2.app.svc.cluster.local"),
                (":path", "/echo.Echo/Hang"),
                ("content-type", "application/grpc"),
                ("te", "trailers"),
                *extra,
            ],
        )
        h2c.h2.send_data(sid, grpc_frame(b""), end_stream=True)
        await h2c.flush()
        await h2c.until(lambda: h2c.finished(sid))
        headers, body, _ = h2c.answer(sid)
        await client.aclose()
    assert headers[":status"] == "200" and headers["grpc-status"] == "14", headers
    assert headers["grpc-message"] == "upstream request timeout" and body == b""
    (upstream,) = seen
    told = parse_grpc_timeout(upstream["grpc-timeout"])
    assert upstream["grpc-timeout"].endswith("m") and told is not None and 0 < told <= most, upstream
    assert upstream["x-envoy-expected-rq-timeout-ms"] == upstream["grpc-timeout"][:-1]


async def test_a_grpc_server_behind_the_waypoint_gets_the_deadline_the_route_allows(rig: Rig) -> None:
    """A real gRPC client asks for an hour; the route's 5 s timeout is what grpcio's server sees (its own reading
    of the rewritten grpc-timeout), and a call without a route timeout keeps the client's deadline."""
    timeouts = Timeouts(request=5.0)

    def router(table: RouteTable | None, destination: BackendService, request: RequestHead, r: float) -> Decision:
        return Forward(destination, request, timeouts=timeouts)

    rig.waypoint.context.router = router
    async with grpc_channel(rig) as channel:
        capped = float(await unary(channel, "Deadline")(b"", timeout=3600))
        timeouts = Timeouts()
        kept = float(await unary(channel, "Deadline")(b"", timeout=3600))
    assert 0 < capped <= 5.0
    assert 3000 < kept <= 3700  # the client's own grpc-timeout, as grpcio rounded it, left alone


async def test_a_grpc_method_without_a_route_answers_unimplemented(rig: Rig) -> None:
    only_say = RouteRule(
        "GRPCRoute/app/say",
        RouteMatch(path=PathMatch(PathMatchType.EXACT, "/echo.Echo/Say"), method="POST"),
        backends=(WeightedBackend(GRPC, 1),),
    )
    rig.waypoint.context.routes.replace(
        WaypointConfig("app/waypoint", (RouteTable(GRPC.service_key, GRPC_PORT, http=(only_say,)),))
    )
    async with grpc_channel(rig) as channel:
        assert (await unary(channel, "Say")(b"routed", timeout=10)).endswith(b"routed")
        with pytest.raises(grpc.aio.AioRpcError) as caught:
            await unary(channel, "Hang")(b"", timeout=10)
    assert caught.value.code() is grpc.StatusCode.UNIMPLEMENTED


async def test_an_endpoint_that_goes_away_after_its_answer_began_resets_the_client_stream(rig: Rig) -> None:
    client, stream = await rig.tunnel(f"{GRPC_VIP}:{GRPC_PORT}")
    h2c = H2OverTunnel(stream)
    sid = h2c.h2.get_next_available_stream_id()
    h2c.h2.send_headers(sid, h2c.grpc_headers("Chat"))
    h2c.h2.send_data(sid, grpc_frame(b"one"))  # the call stays open: more could follow
    await h2c.flush()
    await h2c.until(lambda: any(isinstance(e, h2.events.DataReceived) for e in h2c.events[sid]))
    for endpoint in rig.endpoints:
        await endpoint.grpc_server.stop(0)
    await h2c.until(lambda: h2c.finished(sid))
    assert [e.error_code for e in h2c.events[sid] if isinstance(e, h2.events.StreamReset)] == [wire.INTERNAL_ERROR]
    assert h2c.terminated is None
    await client.aclose()


async def test_a_grpc_unavailable_answer_is_retried_on_another_endpoint_by_default(rig: Rig) -> None:
    rig.endpoints[0].grpc_unavailable = True  # echo-1 answers UNAVAILABLE (trailers-only), echo-2 works
    async with grpc_channel(rig) as channel:
        answers = [await unary(channel, "Say")(f"u{i}".encode(), timeout=10) for i in range(4)]
    assert all(a.startswith(b"echo-2:") for a in answers)
    assert rig.endpoints[0].grpc_calls.count("Say") >= 1  # tried there, and retried


async def test_a_grpc_unavailable_answer_is_passed_on_once_the_retries_run_out(rig: Rig) -> None:
    for endpoint in rig.endpoints:
        endpoint.grpc_unavailable = True
    async with grpc_channel(rig) as channel:
        with pytest.raises(grpc.aio.AioRpcError) as caught:
            await unary(channel, "Say")(b"x", timeout=10)
    assert caught.value.code() is grpc.StatusCode.UNAVAILABLE
    assert caught.value.details().endswith("is unavailable")  # the endpoint's own answer, not a local one
    assert sum(e.grpc_calls.count("Say") for e in rig.endpoints) == 3  # the try and Istio's 2 retries
    lines = await metric_lines(rig, "istio_requests_total")
    assert any('grpc_response_status="14"' in line and 'response_flags="URX"' in line for line in lines), lines


# HTTP/2 with prior knowledge on a port declared HTTP/1.1 (Istio's TestServerSideLB): served per request on the
# HTTP/2 engine, spoken HTTP/1.1 to the endpoints (the echo servers speak nothing else).

H2C_LIMITS = dataclasses.replace(LIMITS, head_timeout=1.0, idle_timeout=2.0)


def _echo_request(h2c: H2OverTunnel, path: str = "/echo") -> int:
    sid = h2c.h2.get_next_available_stream_id()
    authority = "echo.app.svc.cluster.local"
    fields = [(":method", "GET"), (":scheme", "http"), (":authority", authority), (":path", path)]
    h2c.h2.send_headers(sid, fields, end_stream=True)
    return sid


async def test_a_cors_preflight_on_http2_is_answered_by_the_waypoint_and_a_get_gets_allow_origin(rig: Rig) -> None:
    echo = BackendService("app", "echo.app.svc.cluster.local", 80)
    cors = CorsPolicy(allow_origins=(ValueMatch("origin", "cors.com"),), allow_methods="POST,GET", max_age=86400)
    cors_rule = RouteRule("VirtualService/app/cors", RouteMatch(), backends=(WeightedBackend(echo, 1),), cors=cors)
    rig.waypoint.context.routes.replace(
        WaypointConfig("app/waypoint", (RouteTable(echo.service_key, 80, (cors_rule,)),))
    )
    client, stream = await rig.tunnel(f"{ECHO_VIP}:80")
    h2c = H2OverTunnel(stream)
    base = [(":scheme", "http"), (":authority", "echo.app.svc.cluster.local"), (":path", "/echo")]
    preflight = h2c.h2.get_next_available_stream_id()
    fields = [(":method", "OPTIONS"), *base, ("origin", "cors.com"), ("access-control-request-method", "PUT")]
    h2c.h2.send_headers(preflight, fields, end_stream=True)
    get = preflight + 2
    h2c.h2.send_headers(get, [(":method", "GET"), *base, ("origin", "cors.com")], end_stream=True)
    await h2c.flush()
    await h2c.until(lambda: h2c.finished(preflight) and h2c.finished(get))
    headers, body, _ = h2c.answer(preflight)
    assert headers[":status"] == "200" and body == b""
    assert headers["access-control-allow-origin"] == "cors.com"
    assert (headers["access-control-allow-methods"], headers["access-control-max-age"]) == ("POST,GET", "86400")
    headers, body, _ = h2c.answer(get)
    assert headers[":status"] == "200" and headers["access-control-allow-origin"] == "cors.com"
    assert echo_of(body)["endpoint"] in {"echo-1", "echo-2"}
    assert [s for e in rig.endpoints for s in e.seen] == ["GET /echo"]  # the preflight never left the waypoint
    await client.aclose()


async def test_http2_prior_knowledge_on_an_http11_port_is_balanced_per_request_and_spoken_http11_upstream(
    rig: Rig,
) -> None:
    client, stream = await rig.tunnel(f"{ECHO_VIP}:80")
    h2c = H2OverTunnel(stream)
    sids = [_echo_request(h2c) for _ in range(10)]  # ten at once on one connection, as TestServerSideLB sends
    await h2c.flush()
    await h2c.until(lambda: all(h2c.finished(sid) for sid in sids))
    answers = [h2c.answer(sid) for sid in sids]
    assert [headers.get(":status") for headers, _, _ in answers] == ["200"] * 10
    names = collections.Counter(echo_of(body)["endpoint"] for _, body, _ in answers)
    assert names == {"echo-1": 5, "echo-2": 5}  # balanced per request, not per connection
    assert {host for e in rig.endpoints for host in e.hosts} == {"echo.app.svc.cluster.local"}
    assert h2c.terminated is None
    await client.aclose()
    lines = await metric_lines(rig, "istio_requests_total")
    assert any('response_code="200"' in line and "echo.app" in line for line in lines), lines


async def test_an_http2_request_body_without_length_reaches_an_http11_endpoint_whole(rig: Rig) -> None:
    client, stream = await rig.tunnel(f"{ECHO_VIP}:80")
    h2c = H2OverTunnel(stream)
    body = bytes(range(256)) * 1024  # 256 KiB, past the HTTP/2 windows; no content-length: chunked upstream
    sid = h2c.h2.get_next_available_stream_id()
    fields = [
        (":method", "POST"),
        (":scheme", "http"),
        (":authority", "echo.app.svc.cluster.local"),
        (":path", "/echo"),
    ]
    h2c.h2.send_headers(sid, fields)
    await h2c.flush()
    sent = 0
    async with asyncio.timeout(15):
        while sent < len(body):
            window = min(h2c.h2.local_flow_control_window(sid), h2c.h2.max_outbound_frame_size, len(body) - sent)
            if window <= 0:
                await h2c.pump_once()
                continue
            h2c.h2.send_data(sid, body[sent : sent + window])
            sent += window
            await h2c.flush()
    h2c.h2.end_stream(sid)
    await h2c.flush()
    await h2c.until(lambda: h2c.finished(sid))
    headers, answer, _ = h2c.answer(sid)
    assert headers.get(":status") == "200"
    assert echo_of(answer)["sha256"] == hashlib.sha256(body).hexdigest()
    await client.aclose()


async def test_a_chunked_http11_answer_reaches_the_http2_client_without_its_framing(rig: Rig) -> None:
    client, stream = await rig.tunnel(f"{ECHO_VIP}:80")
    h2c = H2OverTunnel(stream)
    sid = _echo_request(h2c, "/chunked")
    await h2c.flush()
    await h2c.until(lambda: h2c.finished(sid))
    headers, body, _ = h2c.answer(sid)
    assert headers.get(":status") == "200" and "transfer-encoding" not in headers
    assert body == b"one,two"
    await client.aclose()


async def test_a_preface_that_arrives_a_few_bytes_at_a_time_is_still_http2(rig: Rig) -> None:
    client, stream = await rig.tunnel(f"{ECHO_VIP}:80")
    h2c = H2OverTunnel(stream)
    data = h2c.h2.data_to_send()
    for i in range(0, 30, 3):
        await stream.write(data[i : i + 3])
        await asyncio.sleep(0.01)
    await stream.write(data[30:])
    sid = _echo_request(h2c)
    await h2c.flush()
    await h2c.until(lambda: h2c.finished(sid))
    assert h2c.answer(sid)[0].get(":status") == "200"
    await client.aclose()


async def _answer_and_end(stream: HboneStream) -> bytes:
    parts = []
    async with asyncio.timeout(5):
        while chunk := await stream.read():
            parts.append(chunk)
    return b"".join(parts)


async def test_a_partial_preface_then_silence_is_answered_and_closed_in_bounded_time(tmp_path: Path) -> None:
    async with started_rig(tmp_path, H2C_LIMITS) as rig:
        client, stream = await rig.tunnel(f"{ECHO_VIP}:80")
        began = asyncio.get_running_loop().time()
        await stream.write(H2_PREFACE[:10])
        answer = await _answer_and_end(stream)  # the sniff timer, then HTTP/1.1's head timer
        elapsed = asyncio.get_running_loop().time() - began
        assert answer.startswith((b"HTTP/1.1 408", b"HTTP/1.1 400")), answer
        assert elapsed < H2C_LIMITS.sniff_timeout + H2C_LIMITS.head_timeout + 2
        assert [e.tunnels for e in rig.endpoints] == [0, 0]
        await client.aclose()
        async with asyncio.timeout(5):
            while rig.waypoint.context.tunnels:  # noqa: ASYNC110 - the waypoint's own bookkeeping
                await asyncio.sleep(0.01)


async def test_a_client_that_sends_nothing_is_closed_in_bounded_time(tmp_path: Path) -> None:
    async with started_rig(tmp_path, H2C_LIMITS) as rig:
        client, stream = await rig.tunnel(f"{ECHO_VIP}:80")
        began = asyncio.get_running_loop().time()
        assert await _answer_and_end(stream) == b""  # the sniff timer, then the idle timer
        assert asyncio.get_running_loop().time() - began < H2C_LIMITS.sniff_timeout + H2C_LIMITS.idle_timeout + 1
        await client.aclose()


@pytest.mark.parametrize(
    ("garbage", "status"),
    [
        (bytes.fromhex("160301020001000200030300") + bytes(200), b"400"),  # a TLS ClientHello
        (H2_PREFACE[:-2] + b"XX\x00\x01", b"505"),  # a broken preface: no HTTP/2, and HTTP/2.0 is not HTTP/1.x
        (b"\x00" * 4096, b"400"),
    ],
)
async def test_garbage_on_an_http11_port_is_refused_and_never_relayed(rig: Rig, garbage: bytes, status: bytes) -> None:
    client, stream = await rig.tunnel(f"{ECHO_VIP}:80")
    await stream.write(garbage)
    answer = await _answer_and_end(stream)
    assert answer.startswith(b"HTTP/1.1 " + status), answer
    assert [e.tunnels for e in rig.endpoints] == [0, 0]
    await client.aclose()


# VirtualService fault.abort.grpcStatus (istio routing.go "fault abort gRPC": a gRPC client sees UNAVAILABLE).


def _aborting(percent: float) -> RouteRule:
    rule = RouteRule(
        "VirtualService/app/default",
        RouteMatch(),
        backends=(WeightedBackend(GRPC, 1),),
        fault=Fault(abort_grpc_status=14, abort_percent=percent),
    )
    return rule


def _abort_config(rig: Rig, percent: float) -> None:
    rig.waypoint.context.routes.replace(
        WaypointConfig("app/waypoint", (RouteTable(GRPC.service_key, GRPC_PORT, http=(_aborting(percent),)),))
    )


async def test_a_grpc_status_fault_abort_answers_a_grpc_client_with_that_status(rig: Rig) -> None:
    _abort_config(rig, 100.0)
    async with grpc_channel(rig) as channel:
        for _ in range(3):
            with pytest.raises(grpc.aio.AioRpcError) as caught:
                await unary(channel, "Say")(b"hello", timeout=10)
            assert caught.value.code() is grpc.StatusCode.UNAVAILABLE
            assert caught.value.details() == "fault filter abort"
    assert [e.grpc_calls for e in rig.endpoints] == [[], []]  # aborted at the waypoint, never forwarded
    lines = await metric_lines(rig, "istio_requests_total")
    assert any('response_code="200"' in line and 'grpc_response_status="14"' in line for line in lines)


async def test_a_grpc_status_fault_abort_is_a_trailers_only_answer_on_the_wire(rig: Rig) -> None:
    _abort_config(rig, 100.0)
    client, stream = await rig.tunnel(f"{GRPC_VIP}:{GRPC_PORT}")
    h2c = H2OverTunnel(stream)
    sid = await h2c.start_call("Say", b"x")
    await h2c.until(lambda: h2c.finished(sid))
    headers, body, trailers = h2c.answer(sid)
    assert headers[":status"] == "200" and headers["grpc-status"] == "14"
    assert headers["content-type"] == "application/grpc" and headers["grpc-message"] == "fault filter abort"
    assert body == b"" and trailers == {}
    ended = [e for e in h2c.events[sid] if isinstance(e, h2.events.StreamEnded)]
    assert len(ended) == 1  # the END_STREAM came on the HEADERS frame itself
    await client.aclose()


async def test_a_grpc_status_fault_abort_at_zero_percent_forwards_every_call(rig: Rig) -> None:
    _abort_config(rig, 0.0)
    async with grpc_channel(rig) as channel:
        answers = [await unary(channel, "Say")(b"through", timeout=10) for _ in range(4)]
    assert all(a.endswith(b"through") for a in answers)
    assert sum(len(e.grpc_calls) for e in rig.endpoints) == 4


@pytest.mark.parametrize(
    "garbage",
    [bytes.fromhex("160301020001000200030300") + bytes(200), b"\x00" * 4096, b"\xff\xfe not http at all\r\n\r\n"],
)
async def test_garbage_on_a_grpc_port_is_refused_and_never_relayed(rig: Rig, garbage: bytes) -> None:
    """A port declared gRPC takes HTTP/1.1 too (Envoy's automatic codec): bytes that are neither get HTTP/1.1's
    400, never reach an endpoint."""
    client, stream = await rig.tunnel(f"{GRPC_VIP}:{GRPC_PORT}")
    await stream.write(garbage)
    answer = await _answer_and_end(stream)
    assert answer.startswith(b"HTTP/1.1 400"), answer
    assert [e.tunnels for e in rig.endpoints] == [0, 0]
    await client.aclose()


async def test_a_request_over_http2_is_mirrored_as_one_over_http11_is(rig: Rig) -> None:
    """A RequestMirror applies whatever version the client spoke (Envoy's shadowing is per route, not per codec):
    the client sees one answer, the mirror backend gets the copy with the ``-shadow`` authority."""

    rig.waypoint.context.router = mirroring_router
    client, stream = await rig.tunnel(f"{ECHO_VIP}:80")
    h2c = H2OverTunnel(stream)
    sid = _echo_request(h2c)
    await h2c.flush()
    await h2c.until(lambda: h2c.finished(sid))
    headers, body, _ = h2c.answer(sid)
    assert headers[":status"] == "200" and echo_of(body)["host"] == "echo.app.svc.cluster.local"
    async with asyncio.timeout(10):
        while not any(h.endswith("-shadow") for e in rig.endpoints for h in e.hosts):  # noqa: ASYNC110
            await asyncio.sleep(0.01)
    shadows = [h for e in rig.endpoints for h in e.hosts if h.endswith("-shadow")]
    assert shadows == ["echo.app.svc.cluster.local-shadow"]
    await client.aclose()
