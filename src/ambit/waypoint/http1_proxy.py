"""HTTP/1.1 through the waypoint: every request of a tunnel routed, balanced and measured on its own.

Theory of operation: :func:`serve_http1` owns one tunnel that carries HTTP/1.1. It reads the client's bytes only
when the h11 server side needs them (:class:`_Downstream`), so a client can make it hold one request head (bounded
by ``max_head_bytes``) plus one read, never a queue of pipelined requests. For each request:

1. ``x-request-id`` is added when missing.
2. The :data:`~ambit.waypoint.decisions.Router` decides, with the destination's route table (a Service target;
   a workload target is forwarded to that workload as addressed): :class:`~ambit.waypoint.decisions.Respond`
   is answered locally; :class:`~ambit.waypoint.decisions.Forward` goes to one endpoint of the backend Service,
   chosen for this request (so one keep-alive connection spreads over all endpoints).
3. The request goes upstream on an idle kept HTTP/1.1 connection to that endpoint or a new one
   (:mod:`ambit.waypoint.upstream`); its body is streamed, then the response is streamed back, with the route's
   response header changes. A request without a body that fails on a reused connection before any answer is
   retried once on a fresh one (the keep-alive race).
4. Failures answer as Envoy does: a backend Service the state does not know → 500 (flag NC: "a route to a
   missing backend answers 500"); no endpoint → 503 ``no healthy upstream`` (flag UH); endpoint unreachable →
   503 (UF); endpoint reset before answering → 503 (UC); ``timeouts.request`` (or ``timeouts.backend_request``
   for one try) passed before the response head → 504 ``upstream request timeout`` (UT). After the response has
   started, a failure can only reset the tunnel.
5. A malformed request gets a 400 (an oversized head 431, a head not finished within ``head_timeout`` 408) and the
   tunnel is closed; never a traceback. Any bug in this module ends the tunnel with a 500 and a log line.
6. An upgrade answered 101 switches both connections to a raw relay (:func:`ambit.waypoint.tcp.relay`).
7. Each request is counted (``istio_requests_total`` and the histograms, reporter="waypoint") and logged once.

TODO: retries per ``Forward.retry`` come with the engine's retry state machine. ``timeouts.request`` and
``timeouts.backend_request`` (each try) bound the exchange up to the response head, not the response body.
"""

from __future__ import annotations

import asyncio
import contextlib
import dataclasses
import logging
import uuid
from dataclasses import dataclass

from ambit.errors import AmbitError
from ambit.hbone.headers import hostport
from ambit.model.routes import HeaderModifier
from ambit.model.workload import Service, Workload
from ambit.proxy.streams import ByteStream
from ambit.waypoint.context import Tunnel, WaypointContext
from ambit.waypoint.decisions import RequestHead, Respond
from ambit.waypoint.destinations import Endpoint, ServiceTarget, find_backend_service, pick_endpoint
from ambit.waypoint.errors import HttpProtocolError
from ambit.waypoint.http1 import (
    BodyData,
    Event,
    InterimResponse,
    MessageEnded,
    RequestStarted,
    ResponseStarted,
    ServerSide,
    Signal,
    forwardable,
    simple_response,
)
from ambit.waypoint.mirror import start_mirrors
from ambit.waypoint.tcp import relay
from ambit.waypoint.telemetry import RequestRecord
from ambit.waypoint.upstream import UpstreamConnectError, UpstreamHttp

log = logging.getLogger("ambit.waypoint.http1")

LINGER_SECONDS = 2.0
"""How long a closing tunnel waits for the client's EOF after our last answer."""
DRAIN_LIMIT = 1024 * 1024
"""Request body bytes read and dropped before a local answer; a longer body closes the connection instead."""

_REASONS = {400: "Bad Request", 408: "Request Timeout", 431: "Request Header Fields Too Large"}


class _HeadTimeoutError(Exception):
    def __init__(self, partial: bool) -> None:
        self.partial = partial


class _UpstreamFailedError(Exception):
    """The endpoint went away before its response head (503, flag UC)."""


class _DownstreamGoneError(Exception):
    """The client went away (flag DC)."""


class _Downstream:
    """The client's end: its tunnel and the h11 server side, read only when h11 needs bytes."""

    __slots__ = ("_ctx", "server", "stream")

    def __init__(self, ctx: WaypointContext, stream: ByteStream, server: ServerSide) -> None:
        self._ctx, self.stream, self.server = ctx, stream, server

    async def next_event(self, *, head: bool = False) -> Event:
        """The next event; waiting for a head, the first byte may take ``idle_timeout`` and the rest of the head
        ``head_timeout`` (slowloris), else each read may take ``idle_timeout``."""
        limits = self._ctx.limits
        loop = asyncio.get_running_loop()
        deadline: float | None = None
        started = False
        while (event := self.server.next_event()) is Signal.NEED_DATA:
            timeout = limits.idle_timeout if deadline is None else deadline - loop.time()
            try:
                if timeout <= 0:
                    raise TimeoutError
                async with asyncio.timeout(timeout):
                    data = await self.stream.read()
            except TimeoutError:
                if head:
                    raise _HeadTimeoutError(started) from None
                raise
            if head and deadline is None:
                deadline = loop.time() + limits.head_timeout
            started = started or bool(data)
            self.server.receive_data(data)
        return event

    async def write(self, data: bytes) -> None:
        if data:
            try:
                async with asyncio.timeout(self._ctx.limits.idle_timeout):
                    await self.stream.write(data)
            except TimeoutError:  # a client that stops reading does not hold the tunnel forever
                raise _DownstreamGoneError("client stopped reading") from None
            except (AmbitError, OSError) as exc:
                raise _DownstreamGoneError(str(exc)) from None


@dataclass(slots=True)
class _Outcome:
    """What one request's metrics and log line say, filled in as the exchange goes."""

    request_id: str
    status: int = 0
    flags: str = "-"
    route: str = ""
    endpoint: Endpoint | None = None
    service: Service | None = None
    bytes_in: int = 0
    bytes_out: int = 0
    grpc_status: str = ""
    error: str = ""


async def serve_http1(ctx: WaypointContext, tunnel: Tunnel, stream: ByteStream, prefix: bytes) -> None:
    """Serve the HTTP/1.1 requests of one tunnel until the client is done or the tunnel must close."""
    down = _Downstream(ctx, stream, ServerSide(ctx.limits.max_head_bytes, authority=tunnel.authority))
    if prefix:
        down.server.receive_data(prefix)
    try:
        await _serve(ctx, tunnel, down)
    finally:
        await _linger(stream)


async def _linger(stream: ByteStream) -> None:
    """Half-close, then read and drop what the client still sends (bounded in time and bytes) until its EOF, so
    our last answer is not lost to a reset that overtakes it (a lingering close, as HTTP servers do)."""
    with contextlib.suppress(AmbitError, OSError, TimeoutError):
        stream.write_eof()
        dropped = 0
        async with asyncio.timeout(LINGER_SECONDS):
            while dropped <= DRAIN_LIMIT and (chunk := await stream.read()):
                dropped += len(chunk)


async def _serve(ctx: WaypointContext, tunnel: Tunnel, down: _Downstream) -> None:
    served = 0
    limit = ctx.limits.max_requests_per_connection
    while True:
        began = ctx.clock()
        try:
            event = await down.next_event(head=True)
        except _HeadTimeoutError as exc:
            if exc.partial:
                await _answer_and_close(down, 408, "request head not received in time")
                _account_refused(ctx, tunnel, 408, "request head not received in time", ctx.clock() - began)
            return
        except HttpProtocolError as exc:
            await _answer_and_close(down, exc.status, exc.reason)
            _account_refused(ctx, tunnel, exc.status, exc.reason, ctx.clock() - began)
            return
        except (AmbitError, OSError):
            return
        if not isinstance(event, RequestStarted):  # CLOSED, or anything else between requests: done
            return
        keep = await _exchange(ctx, tunnel, down, event)
        served += 1
        if not keep or not down.server.next_cycle() or (limit and served >= limit):
            return


async def _answer_and_close(down: _Downstream, status: int, reason: str) -> None:
    log.info("tunnel: %d %s", status, reason)
    with contextlib.suppress(Exception):
        await down.stream.write(simple_response(status, _REASONS.get(status, "Error"), f"{reason}\n"))


async def _exchange(ctx: WaypointContext, tunnel: Tunnel, down: _Downstream, started: RequestStarted) -> bool:
    """One request (rules 1-7); True when the tunnel may carry another."""
    began = ctx.clock()
    head = started.head
    request_id = head.header("x-request-id")
    if not request_id:
        request_id = str(uuid.uuid4())
        head = dataclasses.replace(head, headers=(*head.headers, ("x-request-id", request_id)))
    outcome = _Outcome(request_id)
    grpc = (head.header("content-type") or "").startswith("application/grpc")
    try:
        keep = await _handle(ctx, tunnel, down, dataclasses.replace(started, head=head), outcome)
    except HttpProtocolError as exc:  # the client's body broke HTTP/1.1
        outcome.error, outcome.status = exc.reason, exc.status
        if not down.server.response_started:
            await _answer_and_close(down, exc.status, exc.reason)
        keep = False
    except (_DownstreamGoneError, AmbitError, OSError) as exc:  # the client's tunnel broke (reset, idle timeout)
        outcome.error, outcome.flags = f"downstream: {exc or type(exc).__name__}", "DC"
        keep = False
    except Exception as exc:  # rule 5: a bug here ends this tunnel, not the process
        log.exception("waypoint: request %s %s failed", head.method, head.path)
        outcome.error, outcome.status = f"{type(exc).__name__}: {exc}", 500
        if not down.server.response_started:
            with contextlib.suppress(Exception):
                await down.stream.write(simple_response(500, "Internal Server Error", "internal error\n"))
        keep = False
    _account(ctx, tunnel, head, outcome, ctx.clock() - began, grpc)
    return keep


async def _handle(
    ctx: WaypointContext, tunnel: Tunnel, down: _Downstream, started: RequestStarted, outcome: _Outcome
) -> bool:
    target = tunnel.target
    plan = _Plan(started.head)
    if isinstance(target, ServiceTarget):
        table = ctx.routes.find_table(target.service.key, target.port)
        decision = ctx.router(table, target.backend, started.head, ctx.random())
        outcome.route = decision.route
        if isinstance(decision, Respond):
            keep = await _drain(down, started)
            await _respond(down, decision.status, decision.headers, decision.body, outcome)
            return keep
        start_mirrors(ctx, tunnel, decision.mirrors, started.has_body)
        timeouts = decision.timeouts
        plan = _Plan(decision.request, decision.response_headers, timeouts.request, timeouts.backend_request)
        service = find_backend_service(ctx.state, decision.backend)
        outcome.service = service
        endpoint = pick_endpoint(ctx.state, service, decision.backend.port, ctx.choose) if service is not None else None
    else:  # workload-addressed: to that workload, as addressed
        endpoint = Endpoint(target.workload, target.ip, target.port, None)
    if endpoint is None:
        keep = await _drain(down, started)
        if isinstance(target, ServiceTarget) and outcome.service is None:  # the route names an unknown Service
            await _respond(down, 500, (), b"no such backend", outcome, flags="NC")
        else:
            await _respond(down, 503, (), b"no healthy upstream", outcome, flags="UH")
        return keep
    outcome.endpoint = endpoint
    return await _forward(ctx, tunnel, down, started, plan, endpoint, outcome)


@dataclass(frozen=True, slots=True)
class _Plan:
    """What goes upstream: the (rewritten) request, the response header changes and the request timeout."""

    request: RequestHead
    response_headers: HeaderModifier | None = None
    timeout: float | None = None
    try_timeout: float | None = None


async def _drain(down: _Downstream, started: RequestStarted) -> bool:
    """Read and drop the request body before a local answer; False when it is too long to keep the tunnel."""
    dropped = 0
    while True:
        event = await down.next_event()
        if isinstance(event, MessageEnded):
            return True
        if isinstance(event, BodyData):
            dropped += len(event.data)
            if dropped > DRAIN_LIMIT:
                return False
        elif event is not Signal.PAUSED:
            return False


async def _respond(
    down: _Downstream,
    status: int,
    headers: tuple[tuple[str, str], ...],
    body: bytes,
    outcome: _Outcome,
    *,
    flags: str = "-",
) -> None:
    """A local answer (a routing decision, or an Envoy-like error body)."""
    outcome.status, outcome.flags = status, flags
    if flags != "-":
        outcome.error = body.decode("utf-8", "replace")
    server = down.server
    fields = [(n, v) for n, v in headers if n not in ("content-length", "transfer-encoding")]
    if body and not any(n == "content-type" for n, _ in fields):
        fields.append(("content-type", "text/plain"))
    fields += [("content-length", str(len(body))), ("x-request-id", outcome.request_id)]
    data = server.send_response(status, fields) + server.send_body(body) + server.end_response()
    outcome.bytes_out += len(body)
    await down.write(data)


async def _forward(
    ctx: WaypointContext,
    tunnel: Tunnel,
    down: _Downstream,
    started: RequestStarted,
    plan: _Plan,
    endpoint: Endpoint,
    outcome: _Outcome,
) -> bool:
    """Rules 3, 4 and 6 for one request to ``endpoint``."""
    try:
        async with asyncio.timeout(plan.timeout):
            up, first = await _send_request(ctx, tunnel, down, started, plan, endpoint, outcome)
    except TimeoutError:
        keep = False  # the request body may be half read
        await _respond(down, 504, (), b"upstream request timeout", outcome, flags="UT")
        return keep
    except UpstreamConnectError as exc:
        await _respond(
            down,
            503,
            (),
            b"upstream connect error or disconnect/reset before headers. reset reason: connection failure",
            outcome,
            flags="UF",
        )
        outcome.error = str(exc)
        return not started.has_body  # an unread body cannot stay in the tunnel
    except _UpstreamFailedError as exc:
        await _respond(
            down,
            503,
            (),
            b"upstream connect error or disconnect/reset before headers. reset reason: connection termination",
            outcome,
            flags="UC",
        )
        outcome.error = str(exc)
        return not started.has_body  # an unread body cannot stay in the tunnel
    if isinstance(first, InterimResponse):  # rule 6: 101 Switching Protocols
        await _switch(ctx, down, up, first, outcome)
        return False
    return await _stream_response(ctx, down, up, first, plan, outcome)


async def _send_request(
    ctx: WaypointContext,
    tunnel: Tunnel,
    down: _Downstream,
    started: RequestStarted,
    plan: _Plan,
    endpoint: Endpoint,
    outcome: _Outcome,
) -> tuple[UpstreamHttp, ResponseStarted | InterimResponse]:
    """Send the request (head, body) and wait for the response head; rule 3's retry on a stale connection.

    Each try is bounded by ``plan.try_timeout`` (``timeouts.backend_request``): its expiry raises TimeoutError,
    which the caller answers 504 like the request timeout."""
    upstreams = ctx.upstreams
    if not started.has_body:
        event = await down.next_event()  # h11 ends a bodiless request at once
        if not isinstance(event, MessageEnded):
            raise HttpProtocolError("request without a body did not end")
    attempt = 0
    while True:
        attempt += 1
        up = upstreams.take_idle(endpoint) or await upstreams.open_http(endpoint, tunnel.peer_addr)
        per_try = asyncio.timeout(plan.try_timeout)
        try:
            async with per_try:
                await _send_up(ctx, up, up.http.send_request(plan.request, upgrade=started.upgrade))
                if started.has_body:
                    await _send_body(ctx, down, up, outcome)
                else:
                    await _send_up(ctx, up, up.http.end_request())
                return up, await _response_head(ctx, up)
        except BaseException as exc:
            up.stream.abort()  # whatever happened, this connection is in an unknown state
            if isinstance(exc, TimeoutError) and per_try.expired():
                raise  # the backend request timeout
            if not isinstance(exc, (AmbitError, OSError, _UpstreamFailedError)):
                raise  # cancelled (the request timeout), or a bug
            if isinstance(exc, HttpProtocolError) and not exc.upstream:
                raise
            if up.reused and not started.has_body and attempt == 1:
                continue
            raise _UpstreamFailedError(str(exc) or type(exc).__name__) from None


async def _send_body(ctx: WaypointContext, down: _Downstream, up: UpstreamHttp, outcome: _Outcome) -> None:
    waiting = down.server.continue_if_waited()
    if waiting:
        await down.write(waiting)
    while True:
        event = await down.next_event()
        if isinstance(event, BodyData):
            outcome.bytes_in += len(event.data)
            await _send_up(ctx, up, up.http.send_body(event.data))
        elif isinstance(event, MessageEnded):
            await _send_up(ctx, up, up.http.end_request(event.trailers))
            return
        else:
            raise HttpProtocolError("request body ended early")


async def _send_up(ctx: WaypointContext, up: UpstreamHttp, data: bytes) -> None:
    """Write to the endpoint; one that stops reading for ``idle_timeout`` fails (TimeoutError, an OSError)."""
    if data:
        async with asyncio.timeout(ctx.limits.idle_timeout):
            await up.stream.write(data)


async def _upstream_event(ctx: WaypointContext, up: UpstreamHttp) -> Event:
    while (event := up.http.next_event()) is Signal.NEED_DATA:
        async with asyncio.timeout(ctx.limits.idle_timeout):
            data = await up.stream.read()
        up.http.receive_data(data)
    return event


async def _response_head(ctx: WaypointContext, up: UpstreamHttp) -> ResponseStarted | InterimResponse:
    while True:
        event = await _upstream_event(ctx, up)
        if isinstance(event, ResponseStarted):
            return event
        if isinstance(event, InterimResponse):
            if event.status == 101:
                return event
            continue  # other 1xx (103 Early Hints) are not passed on
        raise _UpstreamFailedError("upstream closed the connection before answering")


async def _stream_response(
    ctx: WaypointContext,
    down: _Downstream,
    up: UpstreamHttp,
    response: ResponseStarted,
    plan: _Plan,
    outcome: _Outcome,
) -> bool:
    headers = _modified(forwardable(response.headers), plan.response_headers)
    outcome.status = response.status
    outcome.grpc_status = next((v for n, v in response.headers if n == "grpc-status"), "")
    server = down.server
    try:
        await down.write(server.send_response(response.status, headers, response.reason))
        while True:
            event = await _upstream_event(ctx, up)
            if isinstance(event, BodyData):
                outcome.bytes_out += len(event.data)
                await down.write(server.send_body(event.data))
            elif isinstance(event, MessageEnded):
                outcome.grpc_status = next((v for n, v in event.trailers if n == "grpc-status"), outcome.grpc_status)
                await down.write(server.end_response(event.trailers))
                break
            else:
                raise _UpstreamFailedError("upstream closed the connection in the middle of the response")
    except _DownstreamGoneError:
        up.stream.abort()
        raise
    except (AmbitError, OSError, TimeoutError, _UpstreamFailedError) as exc:
        up.stream.abort()
        outcome.flags, outcome.error = "UC", f"upstream: {exc or type(exc).__name__}"
        down.stream.abort()
        return False
    if up.http.next_cycle():
        ctx.upstreams.put_idle(up, ctx.clock())
    else:
        up.stream.abort()
    return True


async def _switch(
    ctx: WaypointContext, down: _Downstream, up: UpstreamHttp, answer: InterimResponse, outcome: _Outcome
) -> None:
    outcome.status = 101
    await down.write(down.server.send_interim(101, forwardable(answer.headers, upgrade=True)))
    from_client, from_server = down.server.switched(), up.http.switched()
    try:
        if from_client:
            await up.stream.write(from_client)
        if from_server:
            await down.stream.write(from_server)
    except (AmbitError, OSError) as exc:
        up.stream.abort()
        down.stream.abort()
        outcome.error = str(exc)
        return
    sent, received, error = await relay(down.stream, up.stream, ctx.limits.idle_timeout)
    outcome.bytes_in += sent + len(from_client)
    outcome.bytes_out += received + len(from_server)
    outcome.error = error
    with contextlib.suppress(Exception):
        await up.stream.aclose()


def _modified(headers: list[tuple[str, str]], modifier: HeaderModifier | None) -> list[tuple[str, str]]:
    """Gateway API header changes: ``set`` replaces, ``add`` appends, ``remove`` drops (names lower-case)."""
    if modifier is None:
        return headers
    drop = set(modifier.remove) | {name for name, _ in modifier.set}
    out = [(n, v) for n, v in headers if n not in drop]
    return out + list(modifier.set) + list(modifier.add)


def _account_refused(ctx: WaypointContext, tunnel: Tunnel, status: int, reason: str, duration: float) -> None:
    """A request the waypoint could not parse: counted with Envoy's ``DPE`` flag (downstream protocol error)."""
    outcome = _Outcome("", status=status, flags="DPE", error=reason)
    _account(ctx, tunnel, RequestHead("-", "-", tunnel.authority), outcome, duration, grpc=False)


def _account(
    ctx: WaypointContext, tunnel: Tunnel, head: RequestHead, outcome: _Outcome, duration: float, grpc: bool
) -> None:
    endpoint = outcome.endpoint
    destination: Workload | None = endpoint.workload if endpoint is not None else None
    service = outcome.service or (endpoint.service if endpoint is not None else None)
    if service is None and isinstance(tunnel.target, ServiceTarget) and endpoint is None:
        service = tunnel.target.service
    labels = tunnel.labels(destination, service, flags=outcome.flags, protocol="grpc" if grpc else "http")
    ctx.metrics.request(
        labels,
        response_code=outcome.status,
        grpc_status=outcome.grpc_status if grpc else "",
        duration_ms=duration * 1000,
        request_bytes=outcome.bytes_in,
        response_bytes=outcome.bytes_out,
    )
    source = tunnel.source
    ctx.request_log.write(
        RequestRecord(
            src_addr=tunnel.peer_addr,
            src_workload=source.name if source else "",
            src_namespace=source.namespace if source else "",
            src_identity=labels.source_principal,
            dst_addr=hostport(endpoint.ip, endpoint.port) if endpoint else "",
            dst_hbone_addr=tunnel.authority,
            dst_service=service.hostname if service else "",
            dst_workload=destination.name if destination else "",
            dst_namespace=destination.namespace if destination else "",
            dst_identity=labels.destination_principal,
            method=head.method,
            path=head.path,
            response_code=outcome.status,
            response_flags=outcome.flags,
            request_id=outcome.request_id,
            route=outcome.route,
            bytes_sent=outcome.bytes_in,
            bytes_recv=outcome.bytes_out,
            duration_seconds=duration,
            error=outcome.error,
        )
    )
