"""A :class:`~ambit.proxy.streams.ByteStream` that is itself the protocol of an asyncio stream transport (the
ingress gateway's TLS-terminated downstream on :mod:`ambit.tls.socket_transport`).

Theory of operation: the transport calls :class:`TransportStream`'s protocol methods; ``read`` and ``write`` are the
stream side, awaited by one reading and one writing task. No ``StreamReader``/``StreamWriter`` pair stands between
them: a chunk the transport delivers is handed to the waiting reader as it is (several chunks that arrived while
nobody read are joined once).

Rules:

1. Reading back-pressure: once ``max_buffer`` bytes wait unread, the transport is paused; the next ``read`` takes
   them all and resumes it. So a client that sends faster than the request path reads costs at most about
   ``max_buffer`` plus one transport read.
2. Writing back-pressure: ``write`` hands the bytes to the transport and returns at once unless the transport paused
   the protocol (its write buffer is over its high mark); then it waits for ``resume_writing``. So a client that stops
   reading holds the writer, and the gateway's memory for it stays bounded by the transport's high mark plus one
   write.
3. The peer's EOF (TLS close_notify) reads as ``b""`` once what came before it is read; the transport then closes
   (TLS has no half-close: ``eof_received`` answers False, as a stream reader over TLS does). A connection lost with
   an error (a reset, a bad record) makes a waiting or later ``read``, and any ``write``, raise
   :class:`StreamClosedError`; lost without one, ``read`` returns ``b""``.
4. ``write_eof``: TLS cannot half-close. With ``close_on_eof`` our end is a close (close_notify after what is
   buffered), so a client reading to EOF gets it at once; without it, nothing is sent and the connection stays
   open for the peer's rest (a relay).
5. ``abort`` drops the connection at once and wakes a waiting ``read`` or ``write`` with
   :class:`StreamClosedError`; ``aclose`` closes gracefully and waits for the transport to be done (its close
   exchange has its own bound), aborting instead if cancelled meanwhile.
"""

from __future__ import annotations

import asyncio
import collections

from ambit.proxy.errors import StreamClosedError

__all__ = ["TransportStream"]

MAX_BUFFER = 256 * 1024
"""Unread bytes at which the transport is paused (rule 1)."""


class TransportStream(asyncio.Protocol):
    """A byte stream over the transport it is the protocol of (see the module docstring)."""

    close_on_eof = False
    """Rule 4: ``write_eof`` closes the connection (serving HTTP) rather than doing nothing (relaying)."""

    def __init__(self, *, max_buffer: int = MAX_BUFFER) -> None:
        self._transport: asyncio.Transport | None = None
        self._loop = asyncio.get_running_loop()
        self._chunks: collections.deque[bytes] = collections.deque()
        self._buffered = 0
        self._max_buffer = max_buffer
        self._read_paused = False
        self._eof = False
        self._lost = False
        self._error: str | None = None
        self._aborted = False
        self._write_paused = False
        self._reader: asyncio.Future[None] | None = None
        self._writer: asyncio.Future[None] | None = None
        self._done: asyncio.Future[None] = self._loop.create_future()

    @property
    def transport(self) -> asyncio.Transport:
        assert self._transport is not None, "not connected"
        return self._transport

    # asyncio.Protocol

    def connection_made(self, transport: asyncio.BaseTransport) -> None:
        assert isinstance(transport, asyncio.Transport)
        self._transport = transport

    def data_received(self, data: bytes) -> None:
        self._chunks.append(data)
        self._buffered += len(data)
        if self._buffered >= self._max_buffer and not self._read_paused and self._transport is not None:
            self._read_paused = True
            self._transport.pause_reading()
        self._wake_reader()

    def eof_received(self) -> bool:
        self._eof = True
        self._wake_reader()
        return False

    def connection_lost(self, exc: Exception | None) -> None:
        self._lost = True
        if exc is not None and self._error is None:
            self._error = str(exc) or type(exc).__name__
        self._wake_reader()
        self._wake_writer()
        if not self._done.done():
            self._done.set_result(None)

    def pause_writing(self) -> None:
        self._write_paused = True

    def resume_writing(self) -> None:
        self._write_paused = False
        self._wake_writer()

    # ByteStream

    async def read(self) -> bytes:
        while not self._chunks:
            self._check("read")
            if self._eof or self._lost:
                return b""
            waiter = self._reader = self._loop.create_future()
            try:
                await waiter
            finally:
                self._reader = None
        chunks = self._chunks
        data = chunks.popleft() if len(chunks) == 1 else b"".join(chunks)
        chunks.clear()
        self._buffered = 0
        if self._read_paused and self._transport is not None:
            self._read_paused = False
            self._transport.resume_reading()
        return data

    async def write(self, data: bytes | memoryview) -> None:
        self._check("write")
        if self._lost:
            raise StreamClosedError("write: the connection is closed")
        self.transport.write(data)
        while self._write_paused and not (self._lost or self._aborted):
            waiter = self._writer = self._loop.create_future()
            try:
                await waiter
            finally:
                self._writer = None
        self._check("write")

    def write_eof(self) -> None:
        if self.close_on_eof and self._transport is not None:
            self._transport.close()

    def abort(self) -> None:
        if self._aborted:
            return
        self._aborted = True
        if self._transport is not None:
            self._transport.abort()
        self._wake_reader()
        self._wake_writer()

    async def aclose(self) -> None:
        if self._transport is None:
            return
        self._transport.close()
        try:
            await asyncio.shield(self._done)
        except asyncio.CancelledError:
            self.abort()
            raise

    # Waking

    def _check(self, what: str) -> None:
        if self._aborted:
            raise StreamClosedError(f"{what} on a stream that was aborted")
        if self._error is not None and not (what == "read" and self._chunks):
            raise StreamClosedError(f"{what}: {self._error}")

    def _wake_reader(self) -> None:
        waiter = self._reader
        if waiter is not None and not waiter.done():
            waiter.set_result(None)

    def _wake_writer(self) -> None:
        waiter = self._writer
        if waiter is not None and not waiter.done():
            waiter.set_result(None)
