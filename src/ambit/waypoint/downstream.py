"""The client's end of a request through the waypoint, and what one request's telemetry records.

Theory of operation: :class:`RequestSide` is what the per-request path (:mod:`ambit.waypoint.exchange`,
:mod:`ambit.waypoint.forwarding`) needs of the client's end of one request, whatever the HTTP version: the
request body as events (:class:`~ambit.waypoint.http1.BodyData`, then
:class:`~ambit.waypoint.http1.MessageEnded` with the trailers), and the response as a head, body pieces and an
end with trailers, or an abort. :class:`Downstream` is the HTTP/1.1 one; :mod:`ambit.waypoint.http2_proxy` has one
per HTTP/2 stream.

:class:`Downstream` holds a tunnel's byte stream and its h11 server side, and reads the
client's bytes only when h11 needs them, so a client can make the waypoint hold one request head (bounded by
``max_head_bytes``) plus one read, never a queue of pipelined requests. Reads are bounded in time (``idle_timeout``
per read, ``head_timeout`` for the rest of a head once it began); a write that the client does not take within
``idle_timeout`` fails with :class:`DownstreamGoneError`. Its reads and its writes are bounded by one
:class:`~ambit.waypoint.idle.OperationBound` each (one timer for many operations; :meth:`Downstream.close` when the
tunnel ends). Both the request loop
(:mod:`ambit.waypoint.http1_proxy`) and the tries of a forwarded request (:mod:`ambit.waypoint.forwarding`) use
it, one at a time: a read cancelled by a timer loses nothing (the byte stream keeps what it did not hand out, and
a chunk handed out is fed to h11 before the next await).

:class:`Outcome` is what one request's metrics line and access-log line say, filled in as the exchange goes;
:func:`respond` writes a complete local answer (a routing decision, or an Envoy-like error body), with the
EnvoyFilter response edits the caller says Envoy would run on that answer (:mod:`ambit.waypoint.exchange` rule 7).
"""

from __future__ import annotations

import asyncio
from collections.abc import Iterable, Sequence
from dataclasses import dataclass
from typing import Protocol

from ambit.errors import AmbitError
from ambit.model.envoyfilter import HeaderOp
from ambit.model.routes import HeaderModifier
from ambit.model.workload import Service
from ambit.proxy.streams import ByteStream
from ambit.waypoint.context import WaypointContext
from ambit.waypoint.destinations import Endpoint
from ambit.waypoint.envoy_patches import apply_header_ops
from ambit.waypoint.http1 import Event, ServerSide, Signal
from ambit.waypoint.idle import OperationBound
from ambit.waypoint.response_base import finalized


class HeadTimeoutError(Exception):
    """No complete request head in time; ``partial`` when the client had started one (408) rather than idled."""

    def __init__(self, partial: bool) -> None:
        self.partial = partial


class DownstreamGoneError(Exception):
    """The client went away or stopped reading (flag DC)."""


class RequestSide(Protocol):
    """The client's end of one request, as the per-request path sees it (any HTTP version)."""

    async def next_event(self, *, head: bool = False) -> Event:
        """The next request event: body pieces, then ``MessageEnded`` (anything else: the body broke off)."""
        ...

    async def continue_if_waited(self) -> None:
        """Tell a client that waits for ``100 Continue`` to send its body."""
        ...

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
        """The response head, then ``body`` (the first body piece) and, with ``end``, the end of the response with
        ``trailers``: what ``send_body(body)`` and ``end_response(trailers)`` after it would send, in one write
        where the side can (a forwarded answer whose body is already here leaves at once)."""
        ...

    async def send_body(self, data: bytes) -> None: ...

    async def end_response(self, trailers: Iterable[tuple[str, str]] = ()) -> None: ...

    async def answer(self, status: int, headers: Iterable[tuple[str, str]], body: bytes) -> None:
        """A complete response at once (a local answer)."""
        ...

    def abort(self) -> None:
        """End the request abnormally: the client learns the response is incomplete (reset)."""
        ...

    @property
    def response_started(self) -> bool: ...


class SideWrapper:
    """A :class:`RequestSide` that reads the request through ``down`` (subclasses change :meth:`next_event`: a
    mirror's tee, an authorizer's read-ahead) and hands the response half to it unchanged."""

    __slots__ = ("_down",)

    def __init__(self, down: RequestSide) -> None:
        self._down = down

    async def next_event(self, *, head: bool = False) -> Event:
        return await self._down.next_event(head=head)

    async def continue_if_waited(self) -> None:
        await self._down.continue_if_waited()

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
        await self._down.start_response(status, headers, reason, body=body, end=end, trailers=trailers)

    async def send_body(self, data: bytes) -> None:
        await self._down.send_body(data)

    async def end_response(self, trailers: Iterable[tuple[str, str]] = ()) -> None:
        await self._down.end_response(trailers)

    async def answer(self, status: int, headers: Iterable[tuple[str, str]], body: bytes) -> None:
        await self._down.answer(status, headers, body)

    def abort(self) -> None:
        self._down.abort()

    @property
    def response_started(self) -> bool:
        return self._down.response_started


class Downstream:
    """The client's end over HTTP/1.1: its tunnel and the h11 server side, read only when h11 needs bytes."""

    __slots__ = ("_ctx", "_reads", "_writes", "server", "stream")

    def __init__(self, ctx: WaypointContext, stream: ByteStream, server: ServerSide) -> None:
        self._ctx, self.stream, self.server = ctx, stream, server
        self._reads, self._writes = OperationBound(), OperationBound()

    def close(self) -> None:
        """The tunnel is done: no timer of its reads or writes outlives it."""
        self._reads.close()
        self._writes.close()

    async def next_event(self, *, head: bool = False) -> Event:
        """The next event; waiting for a head, the first byte may take ``idle_timeout`` and the rest of the head
        ``head_timeout`` (slowloris), else each read may take ``idle_timeout``."""
        limits = self._ctx.limits
        loop = asyncio.get_running_loop()
        started = head and self.server.head_begun  # a head begun before this call has no idle wait
        deadline = loop.time() + limits.head_timeout if started else None
        while (event := self.server.next_event()) is Signal.NEED_DATA:
            timeout = limits.idle_timeout if deadline is None else deadline - loop.time()
            try:
                if timeout <= 0:
                    raise TimeoutError
                data = await self._reads.run(self.stream.read(), timeout)
            except TimeoutError:
                if head:
                    raise HeadTimeoutError(started) from None
                raise
            if head and deadline is None:
                deadline = loop.time() + limits.head_timeout
            started = started or bool(data)
            self.server.receive_data(data)
        return event

    async def write(self, data: bytes) -> None:
        if data:
            try:
                await self._writes.run(self.stream.write(data), self._ctx.limits.idle_timeout)
            except TimeoutError:  # a client that stops reading does not hold the tunnel forever
                raise DownstreamGoneError("client stopped reading") from None
            except (AmbitError, OSError) as exc:
                raise DownstreamGoneError(str(exc)) from None

    # --- RequestSide ---------------------------------------------------------------------------------------

    async def continue_if_waited(self) -> None:
        await self.write(self.server.continue_if_waited())

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
        server = self.server
        data = server.send_response(status, finalized(headers), reason)
        try:
            if body:
                data += server.send_body(body)
            if end:
                data += server.end_response(trailers)
        except Exception:
            await self.write(data)  # what went before the piece that failed goes out, as in separate calls
            raise
        await self.write(data)

    async def send_body(self, data: bytes) -> None:
        await self.write(self.server.send_body(data))

    async def end_response(self, trailers: Iterable[tuple[str, str]] = ()) -> None:
        await self.write(self.server.end_response(trailers))

    async def answer(self, status: int, headers: Iterable[tuple[str, str]], body: bytes) -> None:
        server = self.server
        head = server.send_response(status, finalized(headers))
        await self.write(head + server.send_body(body) + server.end_response())

    def abort(self) -> None:
        self.stream.abort()

    @property
    def response_started(self) -> bool:
        return self.server.response_started


_FLAG_ORDER = (
    "LH", "UH", "UT", "LR", "UR", "UF", "UC", "UO", "NR", "DI", "FI", "RL", "UAEX", "RLSE", "DC", "URX", "SI", "IH",
    "DPE", "UMSDR", "RFCF", "NFCF", "DT", "UPE", "NC", "OM", "DF", "DO", "DR",
)  # fmt: skip
"""Envoy's response flags in the order its access log and Istio's metrics list them (its flag bits' order)."""


@dataclass(slots=True)
class Outcome:
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
    attempts: int = 0
    """Tries sent upstream (1 + retries); 0 when the request was answered without reaching upstream."""
    head_at: float | None = None
    """When the request's head was taken up (``ctx.clock``): a bodiless request ended then."""
    delay_injected: bool = False
    """A fault delay held the request (Envoy's flag ``DI``, reported beside any other)."""

    def reported_flags(self) -> str:
        """``flags`` with ``DI`` when a delay was injected, in Envoy's order of response flags."""
        if not self.delay_injected:
            return self.flags
        present = {"DI", *(flag for flag in self.flags.split(",") if flag and flag != "-")}
        ordered = [flag for flag in _FLAG_ORDER if flag in present]
        return ",".join(ordered + sorted(present.difference(_FLAG_ORDER)))


async def respond(
    down: RequestSide,
    status: int,
    headers: tuple[tuple[str, str], ...],
    body: bytes,
    outcome: Outcome,
    *,
    flags: str = "-",
    edits: Sequence[HeaderOp] = (),
    route: HeaderModifier | None = None,
) -> None:
    """A complete local answer; with ``flags``, the body is also the log line's error; ``edits`` run on its
    finished headers (they never name a framing header, so the body's length stands). ``route``: the matched
    route's ``ResponseHeaderModifier``, applied first, as Envoy's local reply runs the route's
    ``finalizeResponseHeaders`` before it sets the body's ``content-type`` and ``content-length`` (so a route cannot
    change those of an answer with a body)."""
    outcome.status, outcome.flags = status, flags
    if flags != "-":
        outcome.error = body.decode("utf-8", "replace")
    fields = [(n, v) for n, v in headers if n not in ("content-length", "transfer-encoding")]
    content_type = next((v for n, v in fields if n == "content-type"), "text/plain")
    if route is not None:
        fields = [(n, v) for n, v in route.applied(fields) if n not in ("content-length", "transfer-encoding")]
        if body:
            fields = [(n, v) for n, v in fields if n != "content-type"]
    if body and not any(n == "content-type" for n, _ in fields):
        fields.append(("content-type", content_type))
    # No x-request-id: Envoy puts one on a response only when told to always (istiod does not) or for a forced trace.
    fields.append(("content-length", str(len(body))))
    if edits:
        fields = apply_header_ops(fields, edits)
    outcome.bytes_out += len(body)
    await down.answer(status, fields, body)
