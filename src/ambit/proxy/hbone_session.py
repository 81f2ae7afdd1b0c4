"""The asyncio shell of one mutual-TLS HBONE connection: it feeds the core and hands each tunnel its events.

Theory of operation: :class:`HboneSession` is the thin shell around a sans-IO HBONE core (``ambit.hbone``) on
one TLS transport, used by both the client (:mod:`ambit.proxy.hbone_client`) and the server
(:mod:`ambit.proxy.hbone_server`). Its loop is the usual one: bytes arrive (``data_received``), the core turns
them into events, :meth:`HboneSession._dispatch` hands each to its stream
(:class:`~ambit.proxy.hbone_stream.HboneStream`), and whatever the core wants to send is flushed to the transport.
There is exactly one dispatch function; an unknown event raises.

Writes backing up: while the TLS transport's buffer is above its high-water mark (``pause_writing``) the core is
told (``output_blocked``: a peer that keeps making us answer PINGs and SETTINGS then loses the connection) and, on
the server side (``read_pause``), the transport stops reading until the buffer drains: a client that never
reads cannot make us buffer more than the high-water mark plus the answers to one read. Only one side may do
that, or two peers both sending in bulk could each wait for the other to read; the client keeps reading (its
memory is bounded by the flow-control windows and the core's control-frame cap).

Invariants:

- Nothing is sent, and nothing received is fed to the core, until the owner has judged the peer's certificate
  and called :meth:`HboneSession.release` (asyncio may deliver the peer's first bytes in the same callback that
  completes the handshake, before the owner's coroutine runs).
- A draining connection (a graceful GOAWAY sent with :meth:`HboneSession.go_away`, or received) is closed by the
  session once its last stream is done: nothing new can ride it, so holding it open would only keep a draining
  proxy (or its peer) waiting.
- A stream is in :attr:`HboneSession.streams` until it is done on the wire (both END_STREAMs sent and all its
  bytes framed, or reset); :attr:`HboneSession.idle_since` is the clock time that table last became empty.
"""

from __future__ import annotations

import asyncio
import logging
import time
from collections.abc import Callable
from typing import TYPE_CHECKING, Protocol, cast

from ambit import native
from ambit.hbone.events import (
    ConnectionDraining,
    ConnectionTerminated,
    DataReceived,
    Event,
    PingAcknowledged,
    StreamEnded,
    StreamReset,
    StreamWritable,
    TunnelEstablished,
    TunnelRefused,
    TunnelRejected,
    TunnelRequested,
)
from ambit.proxy.errors import ProxyError
from ambit.proxy.hbone_stream import DRAIN_TIMEOUT, HboneStream
from ambit.tls.native_transport import NativeTlsSocketTransport

if TYPE_CHECKING:
    from ambit.native._hbone_data import DataPath

log = logging.getLogger(__name__)

GOAWAY_GRACE = 1.0
"""Seconds between the two GOAWAYs of a graceful shutdown: a round trip, generously (Go's http2 waits 1 s too)."""

TRANSPORT_HIGH_WATER = 256 * 1024
"""TLS transport buffer size above which every stream's ``write`` waits (asyncio ``pause_writing``)."""

_REFUSED_STREAM = 0x7  # HTTP/2 REFUSED_STREAM: the peer did not process it, retry is safe


class ConnectionLostError(ProxyError):
    """The HBONE connection went away before the tunnel was answered; opening again on a new one is safe."""


class HboneCore(Protocol):
    """The part of ``ambit.hbone``'s client and server connections that the shell drives."""

    outgoing: list[bytes | memoryview]

    def receive_data(self, data: bytes) -> list[Event]: ...
    def data_to_send(self) -> bytes: ...
    def send_data(self, stream_id: int, data: bytes | memoryview) -> int: ...
    def send_data_now(self, stream_id: int, data: bytes | memoryview) -> tuple[bytes, int]: ...
    def attach(self, stream_id: int, sink: Callable[[bytes | memoryview], object]) -> None: ...
    def detach(self, stream_id: int) -> None: ...
    def pending_bytes(self, stream_id: int) -> int: ...
    def end_stream(self, stream_id: int) -> None: ...
    def reset_stream(self, stream_id: int, error_code: int = ...) -> None: ...
    def consumed(self, stream_id: int, flow_length: int) -> None: ...
    def close(self) -> None: ...
    def go_away(self, reason: str = ...) -> None: ...
    def finish_going_away(self) -> None: ...
    def output_blocked(self) -> list[Event]: ...
    def output_drained(self) -> None: ...
    def ping(self, payload: bytes) -> None: ...
    @property
    def peer_ready(self) -> bool: ...
    @property
    def closed(self) -> bool: ...
    @property
    def draining(self) -> bool: ...
    @property
    def drained_when_idle(self) -> bool: ...


class HboneSession(asyncio.Protocol):
    """The asyncio protocol of one HBONE connection: feeds the core, dispatches its events, flushes its output."""

    def __init__(
        self,
        core: HboneCore,
        *,
        name: str,
        on_request: Callable[[HboneStream, TunnelRequested], None] | None = None,
        clock: Callable[[], float] = time.monotonic,
        held: bool = True,
        read_pause: bool = False,
        on_stream_failed: Callable[[int], None] | None = None,
    ) -> None:
        self.core = core
        self.name = name
        self.streams: dict[int, HboneStream] = {}
        self.transport: asyncio.Transport | None = None
        self.write_paused = False
        self.held = held  # until the peer's certificate is judged: nothing is sent, input is only buffered
        self._held_input: list[bytes] = []
        self.terminated: str | None = None  # why no new stream can be used any more
        self.loop = asyncio.get_running_loop()
        self.heard_from_peer: asyncio.Future[None] = self.loop.create_future()
        """Done once the peer's first bytes (its SETTINGS) arrived, or the connection was lost: a future, not an
        ``asyncio.Event`` (a Python object and a coroutine per wait), as only the client waits on it, once."""
        self.received_any = False  # ``heard_from_peer`` was set by a read
        self.received = False
        """Set by every arrival of bytes and every drain of our output; the owner's liveness timer clears it (a
        flag: no clock read per read)."""
        self.data_path: DataPath | None = None
        """The core's DATA frames of attached streams parsed in C (``ambit.native._hbone_data``) once released, on a
        native TLS transport: it sets ``received`` and calls ``flush`` as ``data_received`` does."""
        self.send_now: Callable[[int, bytes | memoryview], bool | None] | None = None
        """The data path's ``send``: a stream's chunk framed and written in C, as ``send_data_now`` and the
        transport's ``write`` would; None where it cannot (and always without a data path)."""
        self.on_ping_acknowledged: Callable[[], None] | None = None
        """Called when the peer answers the PING the owner sent (``core.ping``)."""
        self.lost: asyncio.Future[None] = self.loop.create_future()
        self._on_request = on_request
        self._read_pause = read_pause  # stop reading while writes are paused (the server side)
        self._reading_paused = False
        self._flush_due = False  # a flush is scheduled for the end of this loop iteration (flush_soon)
        self._on_stream_failed = on_stream_failed
        """Called with the id of each stream reset (either way) or lost with the connection."""
        self.clock = clock
        """The clock of :attr:`idle_since` (and of the owner's timers)."""
        self.idle_since: float | None = clock()
        self.on_idle: Callable[[], None] | None = None
        """Called (synchronously, from the stream bookkeeping) each time the last open stream ended; dropped when the
        connection is lost."""

    # asyncio.Protocol

    def connection_made(self, transport: asyncio.BaseTransport) -> None:
        # A stream transport (uvloop's TLS transport is one without being an ``asyncio.Transport`` subclass).
        self.transport = cast(asyncio.Transport, transport)
        self.transport.set_write_buffer_limits(high=TRANSPORT_HIGH_WATER)

    def data_received(self, data: bytes) -> None:
        if not self.received_any:  # not a call per read
            self.received_any = True
            if not self.heard_from_peer.done():
                self.heard_from_peer.set_result(None)
        self.received = True
        if self.held:
            # The TLS layer may hand us the peer's first bytes before the handshake's waiter has run.
            self._held_input.append(data)
            return
        streams = self.streams
        for event in self.core.receive_data(data):
            if type(event) is DataReceived:  # the hot path, ahead of the general dispatch
                stream = streams.get(event.stream_id)
                if stream is None:  # data racing our reset: give the window back
                    self.core.consumed(event.stream_id, event.flow_length)
                else:
                    stream._data(event.data, event.flow_length)
            else:
                self._dispatch(event)
        if self.core.outgoing:  # flush(), inline, and only when there is something: this runs for every read
            out = self.core.data_to_send()
            if self.transport is not None and not self.transport.is_closing():
                self.transport.write(out)

    def eof_received(self) -> bool:
        self._terminate("the peer closed the connection")
        return False

    def connection_lost(self, exc: Exception | None) -> None:
        self._terminate(f"connection lost: {exc}" if exc else "connection closed")
        if not self.heard_from_peer.done():
            self.heard_from_peer.set_result(None)
        self.transport = None
        # The data path holds this session (and its core): dropped here, the session is freed by its last reference
        # rather than left in a cycle for the collector. Nothing can be sent any more (its send would say so).
        self.data_path = self.send_now = None
        # No stream ends from now on (``_terminate`` failed them all): the owner's idle callback, which holds the
        # owner (the pool's holds the client that holds us), is let go for the same reason.
        self.on_idle = None
        if not self.lost.done():
            self.lost.set_result(None)

    def pause_writing(self) -> None:
        self.write_paused = True
        transport = self.transport
        if self._read_pause and transport is not None and not transport.is_closing():
            transport.pause_reading()
            self._reading_paused = True
        # Called from inside transport.write: the core's verdict is acted on once that call has returned.
        self.loop.call_soon(self._output_blocked)

    def resume_writing(self) -> None:
        self.write_paused = False
        self.received = True  # the peer took our bytes: it is alive, as much as if it had sent some
        self.core.output_drained()
        transport = self.transport
        if self._reading_paused and transport is not None and not transport.is_closing() and not self.core.closed:
            self._reading_paused = False
            transport.resume_reading()
        for stream in list(self.streams.values()):
            stream._wake_writer()

    # Shell

    def let_go(self) -> None:
        """The owner is done with this connection (it is lost, or was never made): drop the owner's callbacks. They
        are its bound methods, and the owner holds us: kept, they would leave both to the cyclic collector."""
        self._on_request = self._on_stream_failed = self.on_ping_acknowledged = self.on_idle = None

    def release(self) -> None:
        """The peer is judged acceptable: process what it sent meanwhile and start talking."""
        self.held = False
        held, self._held_input = self._held_input, []
        for data in held:
            if self.transport is None:
                break
            self.data_received(data)
        self.flush()
        hbone_data = native.selection().hbone_data
        if hbone_data is not None and isinstance(self.transport, NativeTlsSocketTransport):
            self.data_path = hbone_data.DataPath(self.core, self, self.transport)
            self.send_now = self.data_path.send
            self.transport.set_data_path(self.data_path.feed)

    def flush(self) -> None:
        """Write what the core has to send, if the transport is still open (and not held)."""
        if self.held or not self.core.outgoing:  # nothing to send: no call to join nothing
            return
        data = self.core.data_to_send()
        if data and self.transport is not None and not self.transport.is_closing():
            self.transport.write(data)

    def flush_soon(self) -> None:
        """Flush once the callbacks ready now have run: what the streams write in one loop iteration (a response
        head and its body, several tunnels' answers) leaves in one TLS write, one record and one system call."""
        if not self._flush_due:
            self._flush_due = True
            self.loop.call_soon(self._flush_scheduled)

    def _flush_scheduled(self) -> None:
        self._flush_due = False
        self.flush()

    def add_stream(self, stream_id: int) -> HboneStream:
        stream = HboneStream(self, stream_id)
        self.streams[stream_id] = stream
        self.idle_since = None
        return stream

    def check_done(self, stream: HboneStream) -> None:
        """Forget ``stream`` once nothing more happens on the wire for it."""
        if stream.done and self.streams.get(stream.stream_id) is stream:
            del self.streams[stream.stream_id]
            if not self.streams:
                self.idle_since = self.clock()
                if self.core.drained_when_idle:
                    self.loop.call_soon(self._close_if_drained)
                elif self.on_idle is not None:
                    self.on_idle()

    def go_away(self, reason: str = "draining") -> None:
        """Say a graceful GOAWAY: the streams in flight go on, the peer opens new ones elsewhere; after
        ``GOAWAY_GRACE`` (streams the peer sent before it heard us are still served) the last one served is named,
        and the connection is closed once the last of them is done."""
        if self.transport is None or self.core.closed or self.held:
            return
        self.core.go_away(reason)
        self.flush()
        self.loop.call_later(GOAWAY_GRACE, self._finish_going_away)

    def _finish_going_away(self) -> None:
        if self.transport is None or self.core.closed:
            return
        self.core.finish_going_away()
        self.flush()
        self._close_if_drained()

    def _close_if_drained(self) -> None:
        if not self.streams and self.core.drained_when_idle:
            self.close()

    def close(self) -> None:
        """Say GOAWAY and close the transport (after its buffer drains); streams still open are reset."""
        if self.transport is not None and not self.transport.is_closing():
            if not self.core.closed:
                self.core.close()
            self.flush()
            self.transport.close()
        self._terminate("connection closed locally")

    def abort(self, reason: str = "connection aborted locally") -> None:
        if self.transport is not None:
            self.transport.abort()
        self._terminate(reason)

    def _hold_for_a_peer_that_does_not_read(self, transport: asyncio.Transport) -> None:
        """End a connection whose peer is not reading (a flood) so that it can still get our GOAWAY.

        ``close()`` would not do: TLS sends close_notify, the peer's next bytes (it is still sending) make the TLS
        layer fail, and the reset that follows drops what the kernel still held for the peer, GOAWAY included.
        So reading stays paused (the peer stalls, at no cost to us) and the connection is held until the peer
        closes it or ``DRAIN_TIMEOUT`` passes; what is buffered for it is bounded by the transport's high-water mark.
        """
        if not self._reading_paused and not transport.is_closing():
            transport.pause_reading()
            self._reading_paused = True
        self.loop.call_later(DRAIN_TIMEOUT, transport.abort)

    def _output_blocked(self) -> None:
        if not self.write_paused or self.core.closed:
            return
        for event in self.core.output_blocked():
            self._dispatch(event)

    def _dispatch(self, event: Event) -> None:
        match event:
            case DataReceived(stream_id=sid, data=data, flow_length=flow_length):
                stream = self.streams.get(sid)
                if stream is None:  # data racing our reset: give the window back
                    self.core.consumed(sid, flow_length)
                else:
                    stream._data(data, flow_length)
            case StreamEnded(stream_id=sid):
                if (stream := self.streams.get(sid)) is not None:
                    stream._ended()
                    self.check_done(stream)
            case StreamWritable(stream_id=sid):
                if (stream := self.streams.get(sid)) is not None:
                    stream._wake_writer()
                    self.check_done(stream)
            case StreamReset(stream_id=sid, error_code=code, remote=remote):
                if self._on_stream_failed is not None:
                    self._on_stream_failed(sid)
                if (stream := self.streams.get(sid)) is not None:
                    who = "peer" if remote else "protocol error"
                    lost = ConnectionLostError(f"stream refused by {who}") if code == _REFUSED_STREAM else None
                    stream._fail(f"stream reset by {who} (HTTP/2 error {code:#x})", lost)
                    self.check_done(stream)
            case TunnelEstablished(stream_id=sid, headers=headers):
                if (stream := self.streams.get(sid)) is not None and not stream.response.done():
                    stream.response.set_result((200, headers))
            case TunnelRefused(stream_id=sid, status=status, headers=headers):
                if (stream := self.streams.get(sid)) is not None:
                    if not stream.response.done():
                        stream.response.set_result((status, headers))
                    stream._fail(f"tunnel refused with status {status}")
                    self.check_done(stream)
            case TunnelRequested(stream_id=sid):
                stream = self.add_stream(sid)
                if self._on_request is None:
                    raise ProxyError(f"{self.name}: a client connection received a CONNECT request")
                self._on_request(stream, event)
            case TunnelRejected(stream_id=sid, status=status, reason=reason):
                log.info("%s: rejected stream %d with %d: %s", self.name, sid, status, reason)
            case ConnectionDraining(last_stream_id=last, reason=reason):
                log.debug("%s: the peer is going away after stream %d: %s", self.name, last, reason)
                if not self.streams:
                    self.loop.call_soon(self._close_if_drained)
            case PingAcknowledged():
                if self.on_ping_acknowledged is not None:
                    self.on_ping_acknowledged()
            case ConnectionTerminated(error_code=code, reason=reason):
                self._terminate(f"connection terminated (HTTP/2 error {code:#x}): {reason}")
                transport = self.transport
                if transport is not None:
                    self.flush()
                    if self.write_paused:
                        self._hold_for_a_peer_that_does_not_read(transport)
                    else:
                        transport.close()
            case _:
                raise ProxyError(f"{self.name}: unknown HBONE event {event!r}")

    def _terminate(self, reason: str) -> None:
        """No stream survives: fail them all; unanswered tunnels may be retried elsewhere."""
        if self.terminated is None:
            self.terminated = reason
        if self._on_stream_failed is not None:
            for sid in list(self.streams):
                self._on_stream_failed(sid)
        for stream in list(self.streams.values()):
            stream._fail(reason, ConnectionLostError(reason))
            self.check_done(stream)
