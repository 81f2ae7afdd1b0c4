"""A forwarded try's response on its way to the client, once the retry machine has said ``ForwardResponse``
(:mod:`ambit.waypoint.forwarding` rule 6), and how its head is judged before that.

Theory of operation: a try of :mod:`ambit.waypoint.forwarding` reads the response head, asks the retry machine
what to do with it (:func:`retry_status` is the status the machine judges) and, when told to forward it, hands it
here: :func:`client_headers` makes the head the client gets, :func:`stream_response` writes it and the body, and
:func:`switch_protocols` turns a 101 into a raw relay. What happens on the way (the first body byte, the end, a
failure) is posted to the machine through the ``post`` callback the try passes in, when it happens.

Rules:

1. The client's head is the endpoint's without its hop-by-hop fields, with ``x-envoy-upstream-service-time`` (the
   time since the client's request ended) in place of any the endpoint sent, then the route's Gateway API header
   changes (``set`` replaces, ``add`` appends, ``remove`` drops), then its EnvoyFilter edits.
2. :func:`stream_response` posts ``BodyStarted`` at the first body byte and ``ResponseCompleted`` at the end (the
   trailers passed on); it returns None then. When the endpoint fails in the middle it returns why, and the try
   posts ``UpstreamReset``. The response's ``grpc-status`` is the head's, else the trailers'.
3. A 101 answer completes the exchange and becomes a raw relay of both connections (HTTP/1.1 on both sides only),
   bounded by the idle timeout only.
4. A gRPC answer whose head says ``grpc-status`` CANCELLED (1) or UNAVAILABLE (14) is judged by the retry policy as
   a 503 (Istio's default retry conditions ``cancelled`` and ``unavailable`` sit next to 503): a policy that
   retries 503 retries it on another endpoint; forwarded, it stays the endpoint's gRPC answer.
5. What of a forwarded response already arrived with its head (read in the same piece: the usual small answer)
   goes to the client with the head, in one write (``start_response`` with ``body``, and ``end`` when the end
   came too): the same bytes and the same retry-machine events in the same order as piece by piece, less a
   write per piece. Nothing is held back to wait for more: a streamed answer's first piece leaves at once.
"""

from __future__ import annotations

import contextlib
from collections.abc import Callable, Iterable

from ambit.errors import AmbitError
from ambit.model.envoyfilter import HeaderOp
from ambit.model.routes import HeaderModifier
from ambit.waypoint import retries
from ambit.waypoint.downstream import Downstream, Outcome, RequestSide
from ambit.waypoint.envoy_patches import apply_header_ops
from ambit.waypoint.errors import HttpProtocolError
from ambit.waypoint.http1 import BodyData, Event, InterimResponse, MessageEnded, ResponseStarted, forwardable
from ambit.waypoint.http1_upstream import Http1Upstream
from ambit.waypoint.response_base import UPSTREAM_SERVICE_TIME
from ambit.waypoint.tcp import relay
from ambit.waypoint.upstream import UpstreamExchange

__all__ = ["client_headers", "retry_status", "stream_response", "switch_protocols"]

_GRPC_RETRIABLE = frozenset({"1", "14"})
"""``grpc-status`` CANCELLED and UNAVAILABLE: Istio's default retry conditions ``cancelled`` and ``unavailable``."""


def retry_status(head: ResponseStarted | InterimResponse) -> int:
    """Rule 4: the status the retry policy judges; a gRPC answer of CANCELLED or UNAVAILABLE in its head (the
    "trailers-only" form an error takes) counts as 503."""
    if isinstance(head, ResponseStarted) and head.status == 200:
        grpc_status = _first(head.headers, "grpc-status")
        if grpc_status is not None and grpc_status.strip() in _GRPC_RETRIABLE:
            return 503
    return head.status


def client_headers(
    response: ResponseStarted,
    took: tuple[str, str] | None,
    modifier: HeaderModifier | None,
    ops: tuple[HeaderOp, ...],
) -> list[tuple[str, str]]:
    """Rule 1: the head's fields as the client gets them; ``took`` is the service-time field (None: none)."""
    headers = forwardable(response.headers)
    if took is not None:
        headers = [*(field for field in headers if field[0] != UPSTREAM_SERVICE_TIME), took]
    if modifier is not None:
        headers = modifier.applied(headers)
    if ops:
        headers = apply_header_ops(headers, ops)
    return headers


async def stream_response(
    down: RequestSide,
    up: UpstreamExchange,
    response: ResponseStarted,
    headers: list[tuple[str, str]],
    outcome: Outcome,
    post: Callable[[retries.Event], None],
) -> str | None:
    """Rules 2 and 5: the response to the client; None when it ended cleanly, else why it did not. What of the body
    (and its end) is already here leaves with the head, in one write."""
    outcome.status = response.status
    outcome.grpc_status = _first(response.headers, "grpc-status") or ""
    first, ended, held, failed = _ready(up)
    if first:
        post(retries.BodyStarted())
        outcome.bytes_out += len(first)
    if ended is None:
        await down.start_response(response.status, headers, response.reason, body=first)
    else:
        if (trailer_status := _first(ended.trailers, "grpc-status")) is not None:
            outcome.grpc_status = trailer_status
        await down.start_response(
            response.status, headers, response.reason, body=first, end=True, trailers=ended.trailers
        )
        post(retries.ResponseCompleted())
        return None
    body_started = bool(first)
    while True:
        try:
            if held is not None:
                event, held = held, None
            elif failed is not None:
                error, failed = failed, None
                raise error
            else:
                event = await up.next_event()
        except (AmbitError, OSError) as exc:
            return f"upstream: {exc or type(exc).__name__}"
        if isinstance(event, BodyData):
            if not body_started:
                body_started = True
                post(retries.BodyStarted())
            outcome.bytes_out += len(event.data)
            await down.send_body(event.data)
        elif isinstance(event, MessageEnded):
            outcome.grpc_status = next((v for n, v in event.trailers if n == "grpc-status"), outcome.grpc_status)
            await down.end_response(event.trailers)
            post(retries.ResponseCompleted())
            return None
        else:
            return "upstream: closed the connection in the middle of the response"


async def switch_protocols(
    down: RequestSide, exchange: UpstreamExchange, answer: InterimResponse, outcome: Outcome, idle_timeout: float
) -> None:
    """Rule 3: after a 101, both connections carry raw bytes (HTTP/1.1 on both sides only)."""
    if not isinstance(down, Downstream) or not isinstance(exchange, Http1Upstream):
        raise HttpProtocolError("an upgrade needs HTTP/1.1 on both sides", 502, upstream=True)
    up = exchange.conn
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
    sent, received, error = await relay(down.stream, up.stream, idle_timeout)
    outcome.bytes_in += sent + len(from_client)
    outcome.bytes_out += received + len(from_server)
    outcome.error = error
    with contextlib.suppress(Exception):
        await up.stream.aclose()


def _first(fields: Iterable[tuple[str, str]], name: str) -> str | None:
    """The value of the first of ``fields`` named ``name``, or None."""
    for key, value in fields:
        if key == name:
            return value
    return None


def _ready(up: UpstreamExchange) -> tuple[bytes, MessageEnded | None, Event | None, AmbitError | OSError | None]:
    """Rule 5: what of the response already arrived after its head, taken without waiting: the first body piece
    (``b""`` when none), the end when it follows at once, else the next event taken (to be acted on first) or
    the error taking it raised (to be raised where the next read would)."""
    first = b""
    try:
        event = up.next_event_nowait()
        if isinstance(event, BodyData):
            first = event.data
            event = up.next_event_nowait()
    except (AmbitError, OSError) as exc:
        return first, None, None, exc
    if isinstance(event, MessageEnded):
        return first, event, None, None
    return first, None, event, None
