"""One HBONE tunnel as a byte stream: the application's end of one CONNECT stream of an HBONE session.

Theory of operation: :class:`HboneStream` is one CONNECT stream seen as a :class:`~ambit.proxy.streams.ByteStream`.
Its session (:class:`~ambit.proxy.hbone_session.HboneSession`, the asyncio shell around the sans-IO core of one
mutual-TLS HTTP/2 connection) makes it, hands it the core's events for its stream (``_data``, ``_ended``,
``_wake_writer``, ``_fail``) and owns the core it writes to. What the stream does:

- ``read`` returns the next DATA chunk and only then tells the core the bytes are consumed, which is what
  reopens the peer's HTTP/2 window: a reader that stops reading stops the peer after one window, so memory per
  stream is bounded by the window, not by what the peer wants to send. A read that owes the peer a
  WINDOW_UPDATE (once per half window) sends it with the iteration's other writes (``flush_soon``); the others
  write nothing.
- ``write`` hands the bytes to the core, which are flushed at the end of the loop iteration (the writes of one
  iteration share a TLS record and a system call), and waits while the core holds more than :data:`WRITE_BOUND`
  bytes it could not frame yet (the peer's window is shut) or while the TLS transport's buffer is above its
  high-water mark (``pause_writing``): backpressure runs end to end, from the far reader to our writer.
- Push mode (:class:`~ambit.proxy.streams.PushStream`, what the relay uses): DATA is handed to ``on_data`` as
  the session dispatches it, consumed at that moment like a ``read``; ``pause_reading`` holds further chunks
  (unconsumed, so the peer's window closes as in pull mode) until ``resume_reading``. ``write_nowait`` is
  ``write`` without the wait: it answers False over the same bounds, and ``when_drained`` fires once below them.
  While nothing is held back (not paused, no chunk queued, no error) the sink's ``on_data`` is attached to the core
  (``HboneCore.attach``), which hands it each chunk as it parses it, consumed: no event, no dispatch (or the sink's
  ``native`` callable where it has one: the relay's socket side in C, ``ambit.proxy.relay``). Pausing
  detaches it first, so what follows queues here unconsumed; resuming delivers the queue, then attaches again.
- ``write_eof`` sends END_STREAM, ``abort`` sends RST_STREAM; a reset from the peer or the loss of the
  connection makes a pending or later ``read``/``write`` raise :class:`StreamClosedError`.
"""

from __future__ import annotations

import asyncio
import collections
import contextlib
from collections.abc import Callable
from typing import TYPE_CHECKING

from ambit.hbone.events import Headers
from ambit.proxy.errors import ProxyError, StreamClosedError
from ambit.proxy.streams import PushSink

if TYPE_CHECKING:
    from ambit.proxy.hbone_session import HboneSession

WRITE_BOUND = 64 * 1024
"""Bytes a stream may have queued in the core (beyond the peer's window) before ``write`` waits."""

DRAIN_TIMEOUT = 10.0
"""How long ``aclose`` waits for queued bytes to reach a peer that does not open its window, before a reset."""

_CANCEL = 0x8  # HTTP/2 CANCEL: we gave up on the stream


class HboneStream:
    """One CONNECT tunnel as a :class:`~ambit.proxy.streams.ByteStream` (client or server end)."""

    __slots__ = (
        "_chunks",
        "_drained",
        "_eof_delivered",
        "_error",
        "_local_ended",
        "_paused",
        "_reader",
        "_remote_ended",
        "_response",
        "_session",
        "_sink",
        "_writer",
        "stream_id",
    )

    def __init__(self, session: HboneSession, stream_id: int) -> None:
        self._session = session
        self.stream_id = stream_id
        # DATA not yet read (pull mode) or held while paused (push mode); made when first needed.
        self._chunks: collections.deque[tuple[bytes | memoryview, int]] | None = None
        self._remote_ended = False
        self._local_ended = False
        self._error: str | None = None  # set once reset (either way) or the connection is gone
        self._reader: asyncio.Future[None] | None = None
        self._writer: asyncio.Future[None] | None = None
        self._response: asyncio.Future[tuple[int, Headers]] | None = None  # made when first asked for
        # Push mode.
        self._sink: PushSink | None = None  # set in push mode
        self._paused = False
        self._eof_delivered = False
        self._drained: Callable[[], None] | None = None

    @property
    def response(self) -> asyncio.Future[tuple[int, Headers]]:
        """Client: the server's answer (status, headers); an exception if the stream died first.

        Made on first use: server-side streams never have one (an idle tunnel is smaller without it).
        """
        if self._response is None:
            self._response = self._session.loop.create_future()
            if self._error is not None:
                self._response.set_exception(StreamClosedError(self._error))
        return self._response

    @property
    def done(self) -> bool:
        """Nothing more will happen on the wire for this stream."""
        if self._error is not None:
            return True
        return self._remote_ended and self._local_ended and self._session.core.pending_bytes(self.stream_id) == 0

    async def read(self) -> bytes:
        while not self._chunks:
            if self._error is not None:
                raise StreamClosedError(f"read: {self._error}")
            if self._remote_ended:
                return b""
            self._reader = self._session.loop.create_future()
            try:
                await self._reader
            finally:
                self._reader = None
        assert self._chunks is not None
        data, flow_length = self._chunks.popleft()
        if self._error is None:
            core = self._session.core
            core.consumed(self.stream_id, flow_length)
            if core.outgoing:  # a WINDOW_UPDATE is owed (once per half window): most reads owe nothing
                self._session.flush_soon()
        return data if isinstance(data, bytes) else data.tobytes()

    async def write(self, data: bytes | memoryview) -> None:
        self._check_writable("write")
        if not data:
            return
        core = self._session.core
        core.send_data(self.stream_id, bytes(data))
        self._session.flush_soon()
        while core.pending_bytes(self.stream_id) > WRITE_BOUND or self._session.write_paused:
            self._writer = self._session.loop.create_future()
            try:
                await self._writer
            finally:
                self._writer = None
            self._check_writable("write")

    # Push mode (see the module docstring).

    def start_push(self, sink: PushSink) -> None:
        self._sink = sink
        if self._error is not None:
            sink.on_error(self._error)
            return
        self._deliver()
        self._attach()
        self._session.flush()

    def pause_reading(self) -> None:
        if not self._paused:
            self._paused = True
            self._session.core.detach(self.stream_id)

    def resume_reading(self) -> None:
        if not self._paused:
            return
        self._paused = False
        self._deliver()
        self._attach()
        self._session.flush()

    def _attach(self) -> None:
        """Have the core hand DATA straight to the sink (no event, no ``_data``) while nothing is held back."""
        sink = self._sink
        if sink is not None and not self._paused and not self._chunks and self._error is None:
            # The relay's sink in C where it has one (step 3: a payload sent on its socket with no Python frame).
            native_sink = getattr(sink, "native", None)
            self._session.core.attach(self.stream_id, sink.on_data if native_sink is None else native_sink)

    def write_nowait(self, data: bytes | memoryview) -> bool:
        if self._error is not None or self._local_ended:
            self._check_writable("write")  # raises
        session = self._session
        send_now = session.send_now
        if send_now is not None and (below_bound := send_now(self.stream_id, data)) is not None:
            return below_bound
        if session.held:
            pending = session.core.send_data(self.stream_id, data)
        else:  # send_data and session.flush() in one call: this runs for every chunk relayed
            out, pending = session.core.send_data_now(self.stream_id, data)
            transport = session.transport
            if out and transport is not None and not transport.is_closing():
                transport.write(out)
        return not (session.write_paused or pending > WRITE_BOUND)

    def when_drained(self, callback: Callable[[], None]) -> None:
        self._drained = callback

    @property
    def flushed(self) -> bool:
        return True  # what is queued belongs to the core now; ``aclose`` waits for it

    @property
    def native_data(self) -> bool:
        """The session parses and frames DATA in C (``DataPath``): the relay may move this stream's bytes in C."""
        return self._session.data_path is not None

    def _deliver(self) -> None:
        """Hand queued chunks (then EOF) to the sink while not paused; the caller flushes the session."""
        sink = self._sink
        assert sink is not None
        chunks = self._chunks
        while chunks and not self._paused and self._error is None:
            data, flow_length = chunks.popleft()
            self._session.core.consumed(self.stream_id, flow_length)
            sink.on_data(data)
        if not chunks and self._remote_ended and not self._eof_delivered and self._error is None:
            self._eof_delivered = True
            sink.on_eof()

    def write_eof(self) -> None:
        if self._local_ended or self._error is not None:
            return
        self._local_ended = True
        self._session.core.end_stream(self.stream_id)
        self._session.flush()
        self._session.check_done(self)

    def abort(self) -> None:
        """Reset the stream (RST_STREAM CANCEL) unless it is already done; wakes waiters; idempotent."""
        if self._error is not None:
            return
        if not self.done:
            self._session.core.reset_stream(self.stream_id, _CANCEL)
            self._session.flush()
        self._fail("aborted locally")
        self._session.check_done(self)

    async def aclose(self) -> None:
        """Half-close, let queued bytes drain, then reset if the peer is still sending; idempotent."""
        if self._error is not None:
            return
        self.write_eof()
        if self._session.core.pending_bytes(self.stream_id) > 0 and self._error is None:
            await self._drain()  # usually nothing is queued, and no timeout's timer is armed
        if not self.done:
            self.abort()
        self._sink = None  # as close_nowait

    def close_nowait(self) -> bool:
        """:meth:`aclose` without waiting: True when done, False when queued bytes still need ``aclose``'s wait."""
        if self._error is not None:
            return True
        self.write_eof()
        if self._session.core.pending_bytes(self.stream_id) > 0 and self._error is None:
            return False
        if not self.done:
            self.abort()
        self._sink = None  # done on the wire: nothing more is pushed (the relay, a cycle through us, is let go)
        return True

    async def _drain(self) -> None:
        with contextlib.suppress(StreamClosedError, TimeoutError):
            async with asyncio.timeout(DRAIN_TIMEOUT):
                while self._session.core.pending_bytes(self.stream_id) > 0 and self._error is None:
                    self._writer = self._session.loop.create_future()
                    try:
                        await self._writer
                    finally:
                        self._writer = None

    # Called by the session's dispatch.

    def _data(self, data: bytes | memoryview, flow_length: int) -> None:
        if self._error is not None:
            self._session.core.consumed(self.stream_id, flow_length)
            return
        sink = self._sink
        if sink is not None and not self._paused and not self._chunks:
            self._session.core.consumed(self.stream_id, flow_length)  # the common case: straight through
            sink.on_data(data)
            return
        if self._chunks is None:
            self._chunks = collections.deque()
        self._chunks.append((data, flow_length))
        if sink is not None:
            if not self._paused:
                self._deliver()
            return
        _wake(self._reader)

    def _ended(self) -> None:
        self._remote_ended = True
        if self._sink is not None:
            if not self._paused:
                self._deliver()
            return
        _wake(self._reader)

    def _wake_writer(self) -> None:
        _wake(self._writer)
        if self._drained is not None and self._error is None:
            session = self._session
            if session.core.pending_bytes(self.stream_id) <= WRITE_BOUND and not session.write_paused:
                callback, self._drained = self._drained, None
                callback()

    def _fail(self, reason: str, error: ProxyError | None = None) -> None:
        if self._error is not None:
            return
        self._error = reason
        self._chunks = None
        if self._sink is not None:
            self._session.core.detach(self.stream_id)
        for waiter in (self._reader, self._writer):
            if waiter is not None and not waiter.done():
                waiter.set_exception(StreamClosedError(reason))
        response = self._response
        if response is not None and not response.done():
            response.set_exception(error or StreamClosedError(reason))
            response.exception()  # nobody may be awaiting it any more
        self._drained = None
        sink, self._sink = self._sink, None  # nothing more is pushed: the relay (a cycle through us) is let go
        if sink is not None:
            sink.on_error(reason)

    def _check_writable(self, what: str) -> None:
        if self._error is not None:
            raise StreamClosedError(f"{what}: {self._error}")
        if self._local_ended:
            raise StreamClosedError(f"{what} after write_eof")


def _wake(waiter: asyncio.Future[None] | None) -> None:
    if waiter is not None and not waiter.done():
        waiter.set_result(None)
