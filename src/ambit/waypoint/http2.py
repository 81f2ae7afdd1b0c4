"""HTTP/2 connections of the waypoint, both ways: one byte stream, our engine, and a channel per HTTP/2 stream.

Theory of operation: an :class:`Http2Session` joins a :class:`~ambit.proxy.streams.ByteStream` (an HBONE tunnel)
to a sans-IO engine (:class:`~ambit.hbone.messages.Http2ServerConnection` downstream,
:class:`~ambit.hbone.messages.Http2ClientConnection` upstream). One reader (:meth:`Http2Session.run`) feeds the
engine what the peer sends and hands each stream's events to its :class:`StreamChannel`; any task may send on a
stream. The adapter loop is the usual one: feed bytes, act on events, flush.

Rules:

1. One writer at a time: :meth:`Http2Session.flush` takes the engine's output and writes it under a lock, so
   frames leave in the order the engine made them. The reader flushes after every read (ACKs, WINDOW_UPDATEs,
   resets) and so stops reading while the peer does not take what we write: a peer that floods without reading
   stalls its own connection, and the engine's rule B ends it. Each write is bounded by ``idle_timeout`` through
   one :class:`~ambit.waypoint.idle.OperationBound` (one timer for many writes, not one per write).
2. Receiving is flow-controlled by the consumer: a channel holds what arrived for its stream, and the window is
   reopened (``consumed``) only when the consumer takes a piece, after it wrote the previous one on. A stream
   thus holds at most its window, a connection at most its connection window, whatever the peer sends.
3. Sending waits for the windows: :meth:`Http2Session.send_data` returns once the engine framed all but what the
   windows hold back, and waits (bounded by ``idle_timeout``) until that is framed too before the next piece, so
   the engine's queue per stream never holds more than one piece.
4. A reset (by the peer or the engine), a GOAWAY or the end of the byte stream fails the affected channels: their
   consumer gets :class:`StreamClosedError` (with ``refused`` when the peer never processed the stream: REFUSED_STREAM,
   or above a GOAWAY's last stream id, which is safe to send again).
5. Every read a consumer waits for is bounded by ``idle_timeout`` (TimeoutError).
"""

from __future__ import annotations

import asyncio
import collections
import contextlib
import logging
from collections.abc import Callable, Hashable
from dataclasses import dataclass

from ambit.errors import AmbitError
from ambit.hbone import wire
from ambit.hbone.events import (
    ConnectionTerminated,
    DataReceived,
    RequestReceived,
    RequestRejected,
    ResponseReceived,
    StreamEnded,
    StreamReset,
    StreamWritable,
    TrailersReceived,
)
from ambit.hbone.messages import Http2ClientConnection, Http2ServerConnection
from ambit.proxy.streams import ByteStream
from ambit.waypoint.errors import WaypointError
from ambit.waypoint.http1 import BodyData, Headers, MessageEnded, ResponseStarted
from ambit.waypoint.idle import OperationBound

EndpointKey = tuple[str, str, int, Hashable]
"""(workload uid, IP, target port, transport), as :data:`ambit.waypoint.upstream.EndpointKey`."""

log = logging.getLogger("ambit.waypoint.http2")

Http2Connection = Http2ServerConnection | Http2ClientConnection
ChannelEvent = ResponseStarted | BodyData | MessageEnded


class StreamClosedError(WaypointError):
    """The HTTP/2 stream was reset, or its connection ended, before the message was complete."""

    def __init__(self, reason: str, *, refused: bool = False) -> None:
        super().__init__(reason)
        self.refused = refused


@dataclass(slots=True)
class _Piece:
    """Body bytes not yet taken; pieces that arrive while one waits are appended to it (rule 2: a peer's tiny
    DATA frames cost one buffer, not an object each)."""

    data: bytearray
    flow: int


class StreamChannel:
    """One stream's events for its consumer (rule 2) and its writability (rule 3)."""

    __slots__ = (
        "_error",
        "_items",
        "_session",
        "_trailers",
        "_wakeup",
        "ended",
        "on_peer_reset",
        "stream_id",
        "writable",
    )

    def __init__(self, session: Http2Session, stream_id: int) -> None:
        self._session = session
        self.stream_id = stream_id
        self._items: collections.deque[ResponseStarted | _Piece | MessageEnded] = collections.deque()
        self._wakeup = asyncio.Event()
        self._error: StreamClosedError | None = None
        self._trailers: Headers = ()
        self.ended = False
        """The peer ended its half of the stream (all of its message arrived)."""
        self.writable = asyncio.Event()
        self.writable.set()
        self.on_peer_reset: Callable[[], object] | None = None
        """Called when the peer resets the stream (or the engine does, for the peer's error)."""

    def _push(self, item: ResponseStarted | _Piece | MessageEnded) -> None:
        self._items.append(item)
        self._wakeup.set()

    def _add_data(self, data: bytes | memoryview, flow: int) -> None:
        last = self._items[-1] if self._items else None
        if isinstance(last, _Piece):
            last.data += data
            last.flow += flow
        else:
            self._push(_Piece(bytearray(data), flow))

    def _fail(self, error: StreamClosedError) -> None:
        """The stream is gone: what already arrived can still be read, then ``error`` is raised; sends fail."""
        if self._error is None:
            self._error = error
        self._wakeup.set()
        self.writable.set()

    async def next_event(self) -> ChannelEvent:
        """The stream's next event (rule 5: within ``idle_timeout``); :class:`StreamClosedError` after a reset."""
        while not self._items:
            if self._error is not None:
                raise self._error
            self._wakeup.clear()
            async with asyncio.timeout(self._session.idle_timeout):
                await self._wakeup.wait()
        event = self.next_event_nowait()
        assert event is not None
        return event

    def next_event_nowait(self) -> ChannelEvent | None:
        """The stream's next event when it has arrived, else None (a reset shows at :meth:`next_event`)."""
        if not self._items:
            return None
        item = self._items.popleft()
        if isinstance(item, _Piece):
            self._session.conn.consumed(self.stream_id, item.flow)
            self._session.flush_soon()
            return BodyData(bytes(item.data))
        return item

    @property
    def ended_without_body(self) -> bool:
        """The message ended with its head: its next event is ``MessageEnded``."""
        return self.ended and bool(self._items) and isinstance(self._items[0], MessageEnded)

    @property
    def failed(self) -> bool:
        return self._error is not None


class Http2Session:
    """A byte stream and its HTTP/2 engine, with a channel per stream (see the module rules)."""

    def __init__(self, conn: Http2Connection, stream: ByteStream, *, idle_timeout: float, name: str) -> None:
        self.conn = conn
        self.stream = stream
        self.idle_timeout = idle_timeout
        self.name = name
        self.channels: dict[int, StreamChannel] = {}
        self.closed = False
        self.broken = False
        """The byte stream failed: nothing more is written to it."""
        self.served = 0
        """Streams opened on this session so far (an upstream session is ``reused`` after its first)."""
        self._lock = asyncio.Lock()
        self._writes = OperationBound()
        """Bounds each write by ``idle_timeout`` with one timer for many (the lock makes them one at a time)."""
        self._idle = OperationBound()
        """Bounds the reader's wait by ``idle_timeout`` while no stream is open, with one timer for many reads."""
        self._flusher: asyncio.Task[None] | None = None
        self._dirty = False
        self._eof_after_flush = False

    def open_channel(self, stream_id: int) -> StreamChannel:
        channel = self.channels[stream_id] = StreamChannel(self, stream_id)
        self.served += 1
        return channel

    def close_channel(self, stream_id: int) -> None:
        self.channels.pop(stream_id, None)

    # --- writing (rules 1 and 3) --------------------------------------------------------------------------

    async def flush(self) -> None:
        if not self.conn.outgoing and not self._lock.locked():
            return  # nothing to write and no write under way: what taking the lock would find, without it
        async with self._lock:
            data = self.conn.data_to_send()
            if data and not self.broken:
                try:
                    await self._writes.run(self.stream.write(data), self.idle_timeout)
                except (AmbitError, OSError, TimeoutError) as exc:
                    self.broken = True
                    self._end(f"write failed: {exc or type(exc).__name__}")

    def flush_soon(self) -> None:
        """Flush from a task of its own (for callers that cannot wait: resets, window updates). A flush already
        under way that took its bytes before these were made goes round once more, so none is left behind."""
        self._dirty = True
        if self._flusher is None or self._flusher.done():
            self._flusher = asyncio.get_running_loop().create_task(self._flush_loop(), name=f"{self.name} flush")

    async def _flush_loop(self) -> None:
        while self._dirty:
            self._dirty = False
            await self.flush()
        if self._eof_after_flush and not self.broken:
            with contextlib.suppress(AmbitError, OSError):
                self.stream.write_eof()

    def retire(self, reason: str) -> None:
        """End a session that has no stream open, gracefully: GOAWAY, then our half of the byte stream closed once
        it is written; the reader ends at the peer's EOF (bounded by the peer's own close or ``idle_timeout``)."""
        if not self.closed:
            self._end(reason)
        self._eof_after_flush = True
        self.flush_soon()

    async def send_data(self, stream_id: int, data: bytes, *, end: bool = False) -> None:
        """Rule 3; with ``end``, our half of the stream ends after ``data`` (END_STREAM in the same flush)."""
        channel = self.channels.get(stream_id)
        if channel is None or channel.failed or self.closed:
            raise StreamClosedError("the stream is gone")
        self.conn.send_data(stream_id, data)
        if end:
            self.conn.end_stream(stream_id)
        await self.flush()
        while self.conn.pending_bytes(stream_id) and not channel.failed and not self.closed:
            channel.writable.clear()
            async with asyncio.timeout(self.idle_timeout):
                await channel.writable.wait()
            await self.flush()
        if channel.failed or self.closed:
            raise StreamClosedError("the stream was reset while sending")

    def reset(self, stream_id: int, code: int = wire.CANCEL) -> None:
        self.conn.reset_stream(stream_id, code)
        channel = self.channels.pop(stream_id, None)
        if channel is not None:
            channel._fail(StreamClosedError("reset by us"))
        self.flush_soon()

    # --- reading (rules 2 and 4) ---------------------------------------------------------------------------

    async def run(
        self,
        on_request: Callable[[RequestReceived], None] | None = None,
        on_rejected: Callable[[RequestRejected], None] | None = None,
    ) -> None:
        """Read until the peer or the engine ends the connection; ``on_request`` gets each new request and
        ``on_rejected`` each malformed one, which the engine already reset (server)."""
        try:
            await self.flush()  # our preface and SETTINGS
            while not self.closed:
                try:
                    if self.channels:  # a stream open: its consumer's reads and writes are bounded (rule 5)
                        data = await self.stream.read()
                    else:
                        data = await self._idle.run(self.stream.read(), self.idle_timeout)
                except TimeoutError:
                    self._end("idle")
                    break
                if not data:
                    self._end("the peer closed the connection")
                    break
                self.receive(data, on_request, on_rejected)
                await self.flush()
        except (AmbitError, OSError) as exc:
            self.broken = True
            self._end(f"read failed: {exc or type(exc).__name__}")
        finally:
            if not self.closed:
                self._end("stopped")
            with contextlib.suppress(Exception):
                await self.flush()  # our GOAWAY
            self._writes.close()
            self._idle.close()
            if self.broken:
                self.stream.abort()
            else:
                with contextlib.suppress(AmbitError, OSError):
                    self.stream.write_eof()

    def receive(
        self,
        data: bytes,
        on_request: Callable[[RequestReceived], None] | None = None,
        on_rejected: Callable[[RequestRejected], None] | None = None,
    ) -> None:
        for event in self.conn.receive_data(data):
            if isinstance(event, DataReceived):
                channel = self.channels.get(event.stream_id)
                if channel is None:
                    self.conn.consumed(event.stream_id, event.flow_length)
                else:
                    channel._add_data(event.data, event.flow_length)
            elif isinstance(event, RequestReceived):
                if on_request is None:
                    self.conn.reset_stream(event.stream_id, wire.REFUSED_STREAM)
                else:
                    on_request(event)
            elif isinstance(event, RequestRejected):
                if on_rejected is not None:
                    on_rejected(event)
            elif isinstance(event, ResponseReceived):
                channel = self.channels.get(event.stream_id)
                if channel is not None:
                    channel._push(ResponseStarted(event.status, event.headers))
            elif isinstance(event, TrailersReceived):
                channel = self.channels.get(event.stream_id)
                if channel is not None:
                    channel._trailers = event.headers
            elif isinstance(event, StreamEnded):
                channel = self.channels.get(event.stream_id)
                if channel is not None:
                    channel.ended = True
                    channel._push(MessageEnded(channel._trailers))
            elif isinstance(event, StreamWritable):
                channel = self.channels.get(event.stream_id)
                if channel is not None:
                    channel.writable.set()
            elif isinstance(event, StreamReset):
                channel = self.channels.pop(event.stream_id, None)
                if channel is not None:
                    refused = event.remote and event.error_code == wire.REFUSED_STREAM
                    channel._fail(StreamClosedError(f"stream reset (code {event.error_code})", refused=refused))
                    if channel.on_peer_reset is not None:
                        channel.on_peer_reset()
            elif isinstance(event, ConnectionTerminated):
                self._end(f"connection ended: {event.reason}", last_stream=event.last_stream_id)

    def _end(self, reason: str, last_stream: int | None = None) -> None:
        """Rule 4: every open channel fails; streams above a GOAWAY's last id were never processed."""
        self.closed = True
        self.conn.close()
        channels, self.channels = self.channels, {}
        for stream_id, channel in channels.items():
            refused = last_stream is not None and stream_id > last_stream
            channel._fail(StreamClosedError(reason, refused=refused))

    @property
    def alive(self) -> bool:
        return not self.closed and not self.conn.closed

    def abort(self) -> None:
        """End at once: every channel fails and the byte stream is aborted."""
        self.broken = True
        if not self.closed:
            self._end("aborted")
        self.stream.abort()


def spent(session: Http2Session, limit: int) -> bool:
    """Whether ``session`` has served its ``limit`` of streams (0: no limit) and takes no more."""
    return bool(limit) and session.served >= limit


class Http2Pool:
    """Upstream HTTP/2 sessions per endpoint, each shared by the streams of many requests (multiplexing).

    Bookkeeping is synchronous: :meth:`find` hands out a live session with room for another stream (dropping dead
    ones as it looks) that has served fewer than ``limit`` streams (a DestinationRule's
    ``maxRequestsPerConnection``, as Envoy applies it to HTTP/2 upstreams too; 0: no limit), :meth:`add` keeps a
    new one, at most ``max_per_endpoint`` per endpoint (an extra one still serves its request but is not kept). A
    session with no stream ends itself after ``idle_timeout`` (:meth:`Http2Session.run`) and is dropped when next
    looked at; one that reached its limit is retired by its last request (:meth:`Http2Session.retire`).
    """

    def __init__(self, max_per_endpoint: int = 4) -> None:
        self._max = max_per_endpoint
        self._sessions: dict[EndpointKey, list[Http2Session]] = {}
        self.opening: dict[EndpointKey, asyncio.Future[None]] = {}
        """Sessions being dialled: other requests to the endpoint wait for the dial instead of making their own."""
        self.tasks: set[asyncio.Task[None]] = set()

    def find(self, key: EndpointKey, limit: int = 0) -> Http2Session | None:
        sessions = self._sessions.get(key)
        if not sessions:
            return None
        sessions[:] = [s for s in sessions if s.alive]
        for session in sessions:
            conn = session.conn
            if isinstance(conn, Http2ClientConnection) and conn.can_open_stream and not spent(session, limit):
                return session
        if not sessions:
            del self._sessions[key]
        return None

    def add(self, key: EndpointKey, session: Http2Session) -> None:
        sessions = self._sessions.setdefault(key, [])
        if len(sessions) < self._max:
            sessions.append(session)
        task = asyncio.get_running_loop().create_task(session.run(), name=f"{session.name} reader")
        self.tasks.add(task)
        task.add_done_callback(self.tasks.discard)

    def count(self) -> int:
        """Live sessions kept (dead ones are dropped only when next looked at)."""
        return sum(s.alive for group in self._sessions.values() for s in group)

    def open_streams(self) -> int:
        """Streams open on the kept sessions (each one a request in flight, or a leak)."""
        return sum(s.conn.active_streams for group in self._sessions.values() for s in group if s.alive)

    async def aclose(self) -> None:
        sessions, self._sessions = self._sessions, {}
        for group in sessions.values():
            for session in group:
                session.abort()
        for task in list(self.tasks):
            task.cancel()
        if self.tasks:
            await asyncio.wait(list(self.tasks))
