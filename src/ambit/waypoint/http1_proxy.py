"""HTTP/1.1 through the waypoint: every request of a tunnel routed, balanced and measured on its own.

Theory of operation: :func:`serve_http1` owns one tunnel that carries HTTP/1.1. It reads the client's bytes only
when the h11 server side needs them (:class:`~ambit.waypoint.downstream.Downstream`), so a client can make it hold
one request head (bounded by ``max_head_bytes``) plus one read, never a queue of pipelined requests. For each
request:

1. The ``x-envoy-*`` headers a client may not send are removed, and at a gateway its ``x-request-id``
   (:mod:`ambit.waypoint.envoy_request_headers`); ``x-request-id`` is added when missing.
2. (In :func:`ambit.waypoint.exchange.serve_request`, shared with HTTP/2.) The
   :data:`~ambit.waypoint.decisions.Router` decides, with the destination's route table (a Service target;
   a workload target is forwarded to that workload as addressed): :class:`~ambit.waypoint.decisions.Respond`
   is answered locally; :class:`~ambit.waypoint.decisions.Forward` goes to one endpoint of the backend Service,
   chosen for this request (so one keep-alive connection spreads over all endpoints).
3. :func:`ambit.waypoint.forwarding.forward` carries the request upstream, with the route's retry policy and
   timeouts: tries, retries on other endpoints, the request body replayed, the response streamed back with the
   route's response header changes, Envoy's local answers (503 UF/UC/UR, 504 UT) and aborts.
4. A backend Service the state does not know → 500, empty (flag NC: "a route to a missing backend answers
   500"; 503 for a VirtualService's); no endpoint → 503 ``no healthy upstream`` (flag UH).
5. A malformed request gets a 400 (an oversized head 431) whose body is the reason phrase (``Bad Request``), flag
   ``DPE``, as Envoy's codec errors are answered; a head not finished within ``head_timeout`` gets 408 ``stream
   timeout`` with flag ``SI`` (Envoy's stream idle timeout). The tunnel is then closed; never a traceback. Any
   bug here or in the forwarding ends the tunnel with a 500 and a log line. (An HTTP/1.0 request is no codec
   error: it is parsed, and answered 426 by :func:`~ambit.waypoint.exchange.serve_request` rule 0 unless
   ``WaypointContext.accept_http10``.)
6. Authentication and authorization come first (:func:`ambit.waypoint.exchange.serve_request` rule 0): 401 for
   a rejected token, 403 ``RBAC: access denied`` (no response flag, as Envoy's) for a denied request.
7. Each client request is counted once (``istio_requests_total`` and the histograms, reporter="waypoint"), however
   many tries it took, with its final response code and flags, and logged once with its number of tries.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
from collections.abc import Callable

from ambit.errors import AmbitError
from ambit.proxy.streams import ByteStream
from ambit.waypoint.context import Tunnel, WaypointContext
from ambit.waypoint.decisions import RequestHead
from ambit.waypoint.downstream import Downstream, DownstreamGoneError, HeadTimeoutError, Outcome
from ambit.waypoint.envoy_request_headers import REQUEST_ID, without_internal_headers
from ambit.waypoint.errors import HttpProtocolError
from ambit.waypoint.exchange import account, serve_request
from ambit.waypoint.http1 import RequestStarted, ServerSide, reason_phrase, simple_response

log = logging.getLogger("ambit.waypoint.http1")

LINGER_SECONDS = 2.0
"""How long a closing tunnel waits for the client's EOF after our last answer."""
DRAIN_LIMIT = 1024 * 1024
"""Request body bytes read and dropped before a local answer; a longer body closes the connection instead."""

STREAM_TIMEOUT_BODY = "stream timeout"
"""Envoy's answer when a stream's idle timeout passes before its response began (flag ``SI``)."""


async def serve_http1(
    ctx: WaypointContext,
    tunnel: Tunnel,
    stream: ByteStream,
    prefix: bytes,
    on_first_request: Callable[[], object] | None = None,
) -> None:
    """Serve the HTTP/1.1 requests of one tunnel until the client is done or the tunnel must close;
    ``on_first_request`` is called once the first request head is complete (an ingress gateway's admission)."""
    down = Downstream(
        ctx,
        stream,
        ServerSide(ctx.limits.max_head_bytes, scheme=tunnel.scheme, accept_http10=ctx.accept_http10),
    )
    if prefix:
        down.server.receive_data(prefix)
    cancelled = False
    try:
        await _serve(ctx, tunnel, down, on_first_request)
    except asyncio.CancelledError:  # a deadline, an eviction, the process closing: nobody waits for an answer
        cancelled = True
        raise
    finally:
        down.close()
        if not cancelled:
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


async def _serve(
    ctx: WaypointContext, tunnel: Tunnel, down: Downstream, on_first_request: Callable[[], object] | None
) -> None:
    served = 0
    limit = ctx.limits.max_requests_per_connection
    while True:
        began = ctx.clock()
        try:
            event = await down.next_event(head=True)
        except HeadTimeoutError as exc:
            if exc.partial:  # Envoy's stream idle timeout on a stream whose head never ended
                await _answer_and_close(down, 408, "request head not received in time", STREAM_TIMEOUT_BODY)
                reason = "request head not received in time"
                _account_refused(ctx, tunnel, 408, reason, ctx.clock() - began, flags="SI")
            return
        except HttpProtocolError as exc:
            await _answer_and_close(down, exc.status, exc.reason)
            _account_refused(ctx, tunnel, exc.status, exc.reason, ctx.clock() - began)
            return
        except (AmbitError, OSError):
            return
        if not isinstance(event, RequestStarted):  # CLOSED, or anything else between requests: done
            return
        if on_first_request is not None and not served:
            on_first_request()
        keep = await _exchange(ctx, tunnel, down, event)
        served += 1
        if not keep or not down.server.next_cycle() or (limit and served >= limit):
            return


async def _answer_and_close(down: Downstream, status: int, reason: str, body: str | None = None) -> None:
    """Rule 5: Envoy's answer to a request its HTTP/1 codec refused, the status's reason phrase as the body (the
    codec hands the connection manager ``sendLocalReply(code, <phrase>)``); ``reason`` is for the log."""
    log.info("tunnel: %d %s", status, reason)
    phrase = reason_phrase(status, "Error")
    with contextlib.suppress(Exception):
        await down.stream.write(simple_response(status, phrase, phrase if body is None else body))


async def _exchange(ctx: WaypointContext, tunnel: Tunnel, down: Downstream, started: RequestStarted) -> bool:
    """One request (rules 1-6); True when the tunnel may carry another."""
    began = ctx.clock()
    head = started.head
    headers = without_internal_headers(head.headers, edge=ctx.edge)
    request_id = next((v for n, v in headers if n == REQUEST_ID), "")
    if not request_id:
        request_id = ctx.request_id()
        headers = (*headers, (REQUEST_ID, request_id))
    if headers is not head.headers:  # not dataclasses.replace: this runs for every request
        head = RequestHead(head.method, head.path, head.authority, headers, head.scheme)
        started = RequestStarted(head, started.version, started.upgrade, started.has_body)
    outcome = Outcome(request_id)
    grpc = (head.header("content-type") or "").startswith("application/grpc")
    try:
        keep = await _handle(ctx, tunnel, down, started, outcome)
    except HttpProtocolError as exc:  # the client's body broke HTTP/1.1
        outcome.error, outcome.status = exc.reason, exc.status
        if not down.server.response_started:
            await _answer_and_close(down, exc.status, exc.reason)
        keep = False
    except (DownstreamGoneError, AmbitError, OSError) as exc:  # the client's tunnel broke (reset, idle timeout)
        outcome.error, outcome.flags = f"downstream: {exc or type(exc).__name__}", "DC"
        keep = False
    except Exception as exc:  # rule 5: a bug here ends this tunnel, not the process
        log.exception("waypoint: request %s %s failed", head.method, head.path)
        outcome.error, outcome.status = f"{type(exc).__name__}: {exc}", 500
        if not down.server.response_started:
            with contextlib.suppress(Exception):
                await down.stream.write(simple_response(500, "Internal Server Error", "internal error\n"))
        keep = False
    protocol = "HTTP/1.1" if started.version == "1.1" else "HTTP/1.0"  # the access log's, as Envoy's codec names it
    account(ctx, tunnel, head, outcome, ctx.clock() - began, grpc, protocol)
    return keep


async def _handle(
    ctx: WaypointContext, tunnel: Tunnel, down: Downstream, started: RequestStarted, outcome: Outcome
) -> bool:
    return await serve_request(ctx, tunnel, down, started, outcome)


def _account_refused(
    ctx: WaypointContext, tunnel: Tunnel, status: int, reason: str, duration: float, *, flags: str = "DPE"
) -> None:
    """A request the waypoint could not parse: counted with Envoy's ``DPE`` flag (downstream protocol error), or
    ``SI`` (stream idle timeout) for a head that never ended."""
    outcome = Outcome("", status=status, flags=flags, error=reason)
    account(ctx, tunnel, RequestHead("-", "-", tunnel.authority), outcome, duration, grpc=False)
