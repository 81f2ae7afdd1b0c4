"""HTTP/2 (and gRPC) through the waypoint: every stream of a tunnel is one request, routed and measured on its own.

Theory of operation: :func:`serve_http2` owns one tunnel whose client spoke HTTP/2 with prior knowledge (h2c, how
a node proxy hands gRPC to a waypoint). An :class:`~ambit.waypoint.http2.Http2Session` with our server engine
reads the tunnel; each request head starts a task that runs the same per-request path as HTTP/1.1
(:func:`ambit.waypoint.exchange.serve_request`: routing, local answers, forwarding with retries and timeouts) with
an :class:`Http2RequestSide` as the client's end; the version spoken to the endpoint is that request path's
decision (:func:`ambit.waypoint.traffic_policy.plan_upstream_h2`: HTTP/2 on a connection shared by requests, or
HTTP/1.1 with one kept connection per request in flight).

Rules:

1. The ``x-envoy-*`` headers a client may not send are removed, and at a gateway its ``x-request-id``
   (:mod:`ambit.waypoint.envoy_request_headers`); ``x-request-id`` is added when missing; the request is counted
   once (``request_protocol="grpc"`` for a ``content-type`` of ``application/grpc*``, with the ``grpc-status`` of
   the response head or trailers) and logged.
2. Limits: at most ``max_streams_per_connection`` streams per tunnel (the engine refuses more and charges the
   client's reset budget); request heads are bounded by the engine (64 KiB decoded, 128 KiB compressed, 32
   CONTINUATION frames); what a stream's body may hold unread is its window (``STREAM_WINDOW``), a tunnel's the
   connection window (``CONNECTION_WINDOW``). A flood of resets, malformed heads or refused streams ends the
   connection with GOAWAY ENHANCE_YOUR_CALM (the engine's rule A).
3. A client's RST_STREAM cancels its request's task (and with it the upstream stream, which is reset); a GOAWAY or
   the end of the tunnel cancels them all.
4. A response the endpoint breaks off after its head resets the client's stream (INTERNAL_ERROR); a client that
   is still sending its body when the whole response was sent gets RST_STREAM(NO_ERROR) (RFC 9113 §8.1).
5. A bug in one request resets that stream (or answers 500 if nothing was sent yet), never the tunnel.
6. A response head is sent at the next turn of the event loop, unless the end of the response is already there:
   then head and end go as one HEADERS frame with END_STREAM, so a gRPC "trailers-only" answer (an error status
   in the head) reaches the client in the form gRPC requires.
7. A local answer to a gRPC request (404 no route, 500 missing backend, 503 no endpoint or upstream failure, 504
   timeout, ...) is a gRPC "trailers-only" answer, as Envoy sends one: ``:status`` 200 with ``grpc-status`` mapped
   from the HTTP status as gRPC maps them (404 UNIMPLEMENTED, 429/502/503/504 UNAVAILABLE, 401
   UNAUTHENTICATED, 403 PERMISSION_DENIED, 400 INTERNAL, else UNKNOWN) and the text as ``grpc-message``, unless
   the answer names its own ``grpc-status`` (and ``grpc-message``: a fault abort's); the request is still
   counted with the HTTP status the waypoint chose, and that ``grpc_response_status``.
8. A malformed request head (reset by the engine with PROTOCOL_ERROR) is counted and logged as HTTP/1.1's are:
   response code 400, flag ``DPE`` (downstream protocol error).
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
from collections.abc import Callable, Iterable

from ambit.errors import AmbitError
from ambit.hbone import wire
from ambit.hbone.errors import HboneError
from ambit.hbone.events import RequestReceived, RequestRejected
from ambit.hbone.messages import Http2ServerConnection
from ambit.hbone.settings import HboneSettings
from ambit.proxy.streams import ByteStream
from ambit.waypoint.context import Tunnel, WaypointContext
from ambit.waypoint.decisions import RequestHead
from ambit.waypoint.downstream import DownstreamGoneError, Outcome
from ambit.waypoint.envoy_request_headers import REQUEST_ID, without_internal_headers
from ambit.waypoint.errors import HttpProtocolError
from ambit.waypoint.exchange import account, serve_request
from ambit.waypoint.http1 import Event, RequestStarted
from ambit.waypoint.http2 import Http2Session, StreamChannel, StreamClosedError
from ambit.waypoint.response_base import finalized

log = logging.getLogger("ambit.waypoint.http2")

_GRPC_LOCAL_FIELDS = frozenset(("content-type", "content-length", "grpc-status", "grpc-message"))
_GRPC_STATUS_OF_HTTP = {400: 13, 401: 16, 403: 7, 404: 12, 429: 14, 502: 14, 503: 14, 504: 14}


def _percent_encoded(text: str) -> str:
    """gRPC's ``grpc-message`` encoding: printable ASCII but ``%`` as is, every other UTF-8 octet as ``%XX``."""
    return "".join(chr(b) if 0x20 <= b <= 0x7E and b != 0x25 else f"%{b:02X}" for b in text.encode("utf-8", "replace"))


def grpc_status_of(http_status: int) -> int:
    """gRPC's status for an HTTP status (gRPC's HTTP to gRPC status mapping; 2 UNKNOWN otherwise)."""
    return _GRPC_STATUS_OF_HTTP.get(http_status, 2)


STREAM_WINDOW = 256 * 1024
CONNECTION_WINDOW = 1024 * 1024


class _ProtocolPrefix:
    """The tunnel's byte stream with the bytes the sniffer already read put back in front."""

    __slots__ = ("_prefix", "_stream")

    def __init__(self, stream: ByteStream, prefix: bytes) -> None:
        self._stream, self._prefix = stream, prefix

    async def read(self) -> bytes:
        if self._prefix:
            data, self._prefix = self._prefix, b""
            return data
        return await self._stream.read()

    async def write(self, data: bytes | memoryview) -> None:
        await self._stream.write(data)

    def write_eof(self) -> None:
        self._stream.write_eof()

    def abort(self) -> None:
        self._stream.abort()

    async def aclose(self) -> None:
        await self._stream.aclose()


class Http2RequestSide:
    """The client's end of one request: a stream of the downstream session."""

    __slots__ = ("_head", "_started", "channel", "grpc", "local_grpc_status", "session")

    def __init__(self, session: Http2Session, channel: StreamChannel, *, grpc: bool = False) -> None:
        self.session, self.channel = session, channel
        self._started = False
        self._head: tuple[int, list[tuple[str, str]]] | None = None
        self.grpc = grpc
        self.local_grpc_status = ""
        """The ``grpc-status`` of a local answer to a gRPC request (rule 7)."""

    @property
    def stream_id(self) -> int:
        return self.channel.stream_id

    async def next_event(self, *, head: bool = False) -> Event:
        try:
            return await self.channel.next_event()
        except StreamClosedError as exc:
            raise DownstreamGoneError(str(exc)) from None

    async def continue_if_waited(self) -> None:
        return None  # HTTP/2 clients do not wait for 100-continue here: nothing is forwarded that would need it

    async def start_response(
        self,
        status: int,
        headers: Iterable[tuple[str, str]],
        reason: str = "",
        *,
        body: bytes = b"",
        end: bool = False,
        trailers: Iterable[tuple[str, str]] = (),
    ) -> None:
        """Rule 6: the head goes out at the next turn of the loop, or with the end of the response when that
        follows at once (a trailers-only answer stays one HEADERS frame with END_STREAM); given ``body``, with
        it, and given ``end`` too, with END_STREAM on the same write (trailers: after it, as ``end_response``)."""
        self._head = (status, list(headers))
        self._started = True
        if not body and not end:
            asyncio.get_running_loop().call_soon(self._send_head_soon)
            return
        fields = list(trailers) if end else []
        if not body:
            await self.end_response(fields)
        elif end and not fields:
            await self.send_body(body, end=True)
        else:
            await self.send_body(body)
            if end:
                await self.end_response(fields)

    def _send_head_soon(self) -> None:
        if self._head is not None:
            with contextlib.suppress(DownstreamGoneError, HttpProtocolError):
                self._send_head(end_stream=False)
            self.session.flush_soon()

    def _send_head(self, *, end_stream: bool) -> None:
        if self._head is not None:
            (status, headers), self._head = self._head, None
            self._respond(status, headers, end_stream=end_stream)

    def _respond(self, status: int, headers: Iterable[tuple[str, str]], *, end_stream: bool) -> None:
        conn = self.session.conn
        assert isinstance(conn, Http2ServerConnection)
        if self.channel.failed or not self.session.alive:
            raise DownstreamGoneError("the client reset the stream")
        try:
            fields = finalized((n, v) for n, v in headers if n != "transfer-encoding")  # that is HTTP/1.1 framing
            conn.respond(self.stream_id, status, fields, end_stream=end_stream)
        except HboneError as exc:
            raise HttpProtocolError(f"cannot send this response: {exc}", 502, upstream=True) from None
        self._started = True

    async def send_body(self, data: bytes, *, end: bool = False) -> None:
        """A body piece; with ``end`` (and ``data``), the stream's end after it, flushed together."""
        self._send_head(end_stream=False)
        if data:
            try:
                await self.session.send_data(self.stream_id, data, end=end)
            except (StreamClosedError, TimeoutError) as exc:
                raise DownstreamGoneError(str(exc) or "client stopped reading") from None

    async def end_response(self, trailers: Iterable[tuple[str, str]] = ()) -> None:
        fields = list(trailers)
        if self._head is not None and not fields:
            self._send_head(end_stream=True)
            await self.session.flush()
            return
        self._send_head(end_stream=False)
        try:
            self.session.conn.send_trailers(self.stream_id, fields)
        except HboneError as exc:
            raise HttpProtocolError(f"cannot send these trailers: {exc}", 502, upstream=True) from None
        await self.session.flush()

    async def answer(self, status: int, headers: Iterable[tuple[str, str]], body: bytes) -> None:
        if self.grpc:  # rule 7
            fields = [(n, v) for n, v in headers if n not in _GRPC_LOCAL_FIELDS]
            given = dict((n, v) for n, v in headers if n in ("grpc-status", "grpc-message"))
            self.local_grpc_status = given.get("grpc-status") or str(grpc_status_of(status))
            message = given.get("grpc-message") or body.decode("utf-8", "replace").strip()
            fields += [("content-type", "application/grpc"), ("grpc-status", self.local_grpc_status)]
            fields.append(("grpc-message", _percent_encoded(message)))
            self._respond(200, fields, end_stream=True)
            await self.session.flush()
            return
        self._respond(status, headers, end_stream=not body)
        if body:
            await self.send_body(body)
            self.session.conn.end_stream(self.stream_id)
        await self.session.flush()

    def abort(self) -> None:
        self.session.reset(self.stream_id, wire.INTERNAL_ERROR)

    @property
    def response_started(self) -> bool:
        return self._started


async def serve_http2(
    ctx: WaypointContext,
    tunnel: Tunnel,
    stream: ByteStream,
    prefix: bytes,
    on_first_request: Callable[[], object] | None = None,
) -> None:
    """Serve the HTTP/2 streams of one tunnel until the client is done or the connection must end;
    ``on_first_request`` is called once the first request head is complete (an ingress gateway's admission)."""
    limit = ctx.limits.max_streams_per_connection
    settings = HboneSettings(
        stream_window=STREAM_WINDOW, connection_window=CONNECTION_WINDOW, max_concurrent_streams=limit
    )
    session = Http2Session(
        Http2ServerConnection(settings),
        _ProtocolPrefix(stream, prefix),
        idle_timeout=ctx.limits.idle_timeout,
        name=f"waypoint h2 {tunnel.peer_addr}->{tunnel.authority}",
    )
    tasks: dict[int, asyncio.Task[None]] = {}

    first = on_first_request

    def on_request(request: RequestReceived) -> None:
        nonlocal first
        if first is not None:
            call = first
            first = None
            call()
        if len(tasks) >= 2 * limit:  # streams the engine forgot whose tasks still finish: bounded all the same
            session.conn.reset_stream(request.stream_id, wire.REFUSED_STREAM)
            return
        channel = session.open_channel(request.stream_id)
        task = asyncio.get_running_loop().create_task(
            _serve_stream(ctx, tunnel, session, channel, request),
            name=f"{session.name} stream {request.stream_id}",
        )
        tasks[request.stream_id] = task
        channel.on_peer_reset = task.cancel  # rule 3
        task.add_done_callback(lambda _: tasks.pop(request.stream_id, None))

    def on_rejected(rejected: RequestRejected) -> None:  # rule 8
        log.info("HTTP/2 stream %d from %s reset: %s", rejected.stream_id, tunnel.peer_addr, rejected.reason)
        outcome = Outcome("", status=400, flags="DPE", error=rejected.reason)
        account(ctx, tunnel, RequestHead("-", "-", tunnel.authority), outcome, 0.0, False, protocol="HTTP/2")

    try:
        await session.run(on_request, on_rejected)
    finally:
        for task in list(tasks.values()):
            task.cancel()  # rule 3
        if tasks:
            await asyncio.wait(list(tasks.values()))


async def _serve_stream(
    ctx: WaypointContext,
    tunnel: Tunnel,
    session: Http2Session,
    channel: StreamChannel,
    request: RequestReceived,
) -> None:
    began = ctx.clock()
    headers = without_internal_headers(request.headers, edge=ctx.edge)
    request_id = next((v for n, v in headers if n == REQUEST_ID), "")
    if not request_id:
        request_id = ctx.request_id()
        headers = (*headers, (REQUEST_ID, request_id))
    head = RequestHead(request.method, request.path, request.authority, headers, request.scheme)
    outcome = Outcome(request_id)
    grpc = (head.header("content-type") or "").startswith("application/grpc")
    side = Http2RequestSide(session, channel, grpc=grpc)
    try:
        started = RequestStarted(head, "2", upgrade=False, has_body=not channel.ended_without_body)
        await serve_request(ctx, tunnel, side, started, outcome)
    except HttpProtocolError as exc:
        outcome.error, outcome.status = exc.reason, exc.status
        if not side.response_started:
            with contextlib.suppress(Exception):
                await side.answer(exc.status, [("content-type", "text/plain")], f"{exc.reason}\n".encode())
        else:
            side.abort()
    except (DownstreamGoneError, StreamClosedError, AmbitError, OSError, TimeoutError) as exc:
        outcome.error, outcome.flags = f"downstream: {exc or type(exc).__name__}", "DC"
        side.abort()
    except asyncio.CancelledError:
        outcome.error, outcome.flags = "downstream: the client reset the stream", "DC"
        session.reset(channel.stream_id)
        raise
    except Exception as exc:  # rule 5: a bug here ends this stream, not the tunnel
        log.exception("waypoint: HTTP/2 request %s %s failed", head.method, head.path)
        outcome.error, outcome.status = f"{type(exc).__name__}: {exc}", 500
        if not side.response_started:
            with contextlib.suppress(Exception):
                await side.answer(500, [("content-type", "text/plain")], b"internal error\n")
        else:
            side.abort()
    finally:
        if side.local_grpc_status and not outcome.grpc_status:
            outcome.grpc_status = side.local_grpc_status
        if channel.stream_id in session.channels and not channel.ended:
            session.reset(channel.stream_id, wire.NO_ERROR)  # rule 4: the answer is complete, stop sending
        session.close_channel(channel.stream_id)
        account(ctx, tunnel, head, outcome, ctx.clock() - began, grpc, protocol="HTTP/2")
