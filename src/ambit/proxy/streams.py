"""Byte streams: one end of a relay, and the TCP-socket kind (the HBONE tunnel is the other kind).

Theory of operation: a :class:`ByteStream` is a reliable ordered byte stream with half-close, shaped like a TCP
socket. ``read`` returns the next chunk (its size is the stream's choice) or ``b""`` at EOF; ``write`` returns once
the data is within the stream's bound (for a socket: handed to the kernel), which is what keeps a relay's memory
bounded; ``write_eof`` half-closes our sending side; ``abort`` is a hard close (TCP RST, HTTP/2 RST_STREAM) that
also wakes any read or write waiting on the stream, which then raises :class:`StreamClosedError`.

:class:`SocketStream` drives a connected non-blocking TCP socket with the loop's readiness callbacks directly
(rather than ``loop.sock_recv_into``/``sock_sendall``): ``abort`` must unregister the fd and fail the waiting
operation *before* closing the socket, or a later socket reusing the fd number would inherit a stale callback.
Reads start at 1 KiB and double while reads fill the request, up to ``max_chunk`` (256 KiB), as ztunnel's buffers
grow 1 KiB → 16 KiB → 256 KiB: an idle connection costs nothing, a bulk one makes few syscalls. No buffer is kept
between reads (``recv`` allocates exactly what it returns). One task may read and one write at a time.

The read side stays registered with the loop between reads, so a relay that reads, writes and reads again does not
re-arm epoll for every chunk. Readiness with nobody waiting (the relay is blocked writing elsewhere) unregisters
it, so a stalled reader never spins the loop.

Push mode (:class:`PushStream`, what :func:`ambit.proxy.relay.splice` drives): the loop's readiness callbacks move
the bytes instead of a task awaiting ``read`` and ``write`` for every chunk. ``start_push`` hands the stream one
:class:`PushSink` (data, EOF, error); the relay passes each chunk to the other end's ``write_nowait``, which sends
what the kernel takes, keeps the rest (one chunk at most) and answers False, and the relay then pauses the source
until ``when_drained`` fires. A stream is in pull or push mode for its whole life.
"""

from __future__ import annotations

import asyncio
import collections
import contextlib
import errno
import socket
import struct
from collections.abc import Callable
from typing import Protocol

from ambit.proxy.errors import StreamClosedError

__all__ = ["ByteStream", "PushStream", "SocketStream", "StreamClosedError"]

MIN_CHUNK = 1024
_LINGER_ZERO = struct.pack("ii", 1, 0)


class ByteStream(Protocol):
    """One end of a relay: a reliable ordered byte stream with half-close, like a TCP socket."""

    async def read(self) -> bytes: ...
    async def write(self, data: bytes | memoryview) -> None: ...
    def write_eof(self) -> None: ...
    def abort(self) -> None: ...
    async def aclose(self) -> None: ...


class PushSink(Protocol):
    """What a :class:`PushStream` delivers to: every chunk, then EOF, or the reason the stream failed (once).

    One object with three methods rather than three callbacks: a held connection keeps the sink, not three bound
    method objects per direction.
    """

    def on_data(self, data: bytes | memoryview) -> None: ...
    def on_eof(self) -> None: ...
    def on_error(self, reason: str) -> None: ...


class PushStream(ByteStream, Protocol):
    """A :class:`ByteStream` that can also be driven by callbacks (see the module docstring)."""

    def start_push(self, sink: PushSink) -> None:
        """From now on deliver every chunk, then EOF, or the reason the stream failed (once), to ``sink``."""

    def pause_reading(self) -> None: ...
    def resume_reading(self) -> None: ...

    def write_nowait(self, data: bytes | memoryview) -> bool:
        """Queue ``data`` without waiting; False when over the stream's bound (then see ``when_drained``)."""

    def when_drained(self, callback: Callable[[], None]) -> None:
        """Call ``callback`` once, when the stream is back under its bound after ``write_nowait`` said False."""

    @property
    def flushed(self) -> bool:
        """Nothing written is held by us any more (what is left is the kernel's or the protocol core's)."""


def describe(exc: OSError) -> str:
    """A socket error in a few words, as the relay reports it."""
    if exc.errno in (errno.ECONNRESET, errno.EPIPE):
        return "connection reset by peer"
    return exc.strerror or str(exc)


class SocketStream:
    """A :class:`ByteStream` over a connected non-blocking TCP socket, which it owns from now on.

    Slotted, and the push-mode output queue is only made when the kernel first refuses part of a write: an idle
    relayed connection holds two of these, so their size is part of the proxy's memory per connection.
    """

    __slots__ = (
        "_aborted",
        "_chunk",
        "_closed",
        "_drained",
        "_eof_seen",
        "_eof_sent",
        "_fd",
        "_loop",
        "_max_chunk",
        "_out",
        "_read_armed",
        "_reader",
        "_shutdown_pending",
        "_sink",
        "_sock",
        "_write_armed",
        "_writer",
    )

    def __init__(self, sock: socket.socket, *, max_chunk: int = 256 * 1024) -> None:
        if sock.gettimeout() != 0.0:  # the proxy's sockets are non-blocking already: spare an ioctl
            sock.setblocking(False)
        self._sock = sock
        self._fd = sock.fileno()
        self._loop = asyncio.get_running_loop()
        self._chunk = min(MIN_CHUNK, max_chunk)
        self._max_chunk = max_chunk
        self._reader: asyncio.Future[None] | None = None
        self._read_armed = False  # our fd is registered for reading (see the module docstring)
        self._writer: asyncio.Future[None] | None = None
        self._eof_sent = False
        self._closed = False
        self._aborted = False
        # Push mode.
        self._sink: PushSink = _UNATTACHED
        self._eof_seen = False
        self._out: collections.deque[memoryview] | None = None  # what the kernel did not take yet (made on need)
        self._write_armed = False
        self._shutdown_pending = False
        self._drained: Callable[[], None] | None = None

    @property
    def socket(self) -> socket.socket:
        return self._sock

    @property
    def read_size(self) -> int:
        """How many bytes the next read asks for."""
        return self._chunk

    async def read(self) -> bytes:
        while True:
            self._check_open("read")
            try:
                data = self._sock.recv(self._chunk)
            except (BlockingIOError, InterruptedError):
                await self._wait_readable()
                continue
            except OSError as exc:
                raise StreamClosedError(f"read: {describe(exc)}") from exc
            if len(data) == self._chunk and self._chunk < self._max_chunk:
                self._chunk = min(self._chunk * 2, self._max_chunk)
            return data

    async def write(self, data: bytes | memoryview) -> None:
        view = memoryview(data).cast("B")
        while view:
            self._check_open("write")
            if self._eof_sent:
                raise StreamClosedError("write after write_eof")
            try:
                sent = self._sock.send(view)
            except (BlockingIOError, InterruptedError):
                await self._wait_writable()
                continue
            except OSError as exc:
                raise StreamClosedError(f"write: {describe(exc)}") from exc
            view = view[sent:]

    def write_eof(self) -> None:
        if self._eof_sent or self._closed:
            return
        self._eof_sent = True
        if self._out:  # push mode: after what the kernel has not taken yet
            self._shutdown_pending = True
            return
        with contextlib.suppress(OSError):  # already reset or not connected: nothing left to half-close
            self._sock.shutdown(socket.SHUT_WR)

    # Push mode (see the module docstring).

    def start_push(self, sink: PushSink) -> None:
        self._sink = sink
        if self._closed:
            sink.on_error("aborted" if self._aborted else "closed")
            return
        self.resume_reading()

    def pause_reading(self) -> None:
        if self._read_armed:
            self._read_armed = False
            self._loop.remove_reader(self._fd)

    def resume_reading(self) -> None:
        if not self._read_armed and not self._closed and not self._eof_seen:
            self._read_armed = True
            # The relay's reader in C where its sink has one (step 3 of docs/native-data-path.md: it falls back to
            # _push_readable itself whenever it is not in its steady state).
            reader = getattr(self._sink, "native", None)
            self._loop.add_reader(self._fd, self._push_readable if reader is None else reader)

    def write_nowait(self, data: bytes | memoryview) -> bool:
        if self._closed or self._eof_sent:
            self._check_open("write")
            raise StreamClosedError("write after write_eof")
        if not self._out:
            try:
                sent = self._sock.send(data)
            except (BlockingIOError, InterruptedError):
                sent = 0
            except OSError as exc:
                raise StreamClosedError(f"write: {describe(exc)}") from exc
            if sent == len(data):
                return True
            view = memoryview(data)[sent:]
            self._write_armed = True
            self._loop.add_writer(self._fd, self._push_writable)
        else:
            view = memoryview(data)
        out = self._out
        if out is None:
            out = self._out = collections.deque()
        out.append(view)
        return False

    def when_drained(self, callback: Callable[[], None]) -> None:
        self._drained = callback

    @property
    def flushed(self) -> bool:
        return not self._out

    @property
    def buffered(self) -> int:
        """Bytes ``write_nowait`` accepted that the kernel has not taken yet (at most about one chunk)."""
        return sum(len(view) for view in self._out or ())

    def _push_readable(self) -> None:
        try:
            data = self._sock.recv(self._chunk)
        except (BlockingIOError, InterruptedError):
            return
        except OSError as exc:
            self._read_failed(exc)
            return
        if not data:
            self._read_eof()
            return
        if len(data) == self._chunk and self._chunk < self._max_chunk:
            self._chunk = min(self._chunk * 2, self._max_chunk)
        self._sink.on_data(data)

    def _read_failed(self, exc: OSError) -> None:
        """A push-mode read failed (here or in the relay's C reader, ``relay_socket.c``)."""
        self.pause_reading()
        self._sink.on_error(describe(exc))

    def _read_eof(self) -> None:
        """A push-mode read found EOF (here or in the relay's C reader)."""
        self._eof_seen = True
        self.pause_reading()
        self._sink.on_eof()

    def _push_writable(self) -> None:
        out = self._out
        assert out is not None
        while out:
            try:
                sent = self._sock.send(out[0])
            except (BlockingIOError, InterruptedError):
                return
            except OSError as exc:
                self._disarm_writer()
                self._sink.on_error(f"(while writing) {describe(exc)}")
                return
            if sent < len(out[0]):
                out[0] = out[0][sent:]
                return
            out.popleft()
        self._disarm_writer()
        if self._shutdown_pending:
            self._shutdown_pending = False
            with contextlib.suppress(OSError):
                self._sock.shutdown(socket.SHUT_WR)
        callback, self._drained = self._drained, None
        if callback is not None:
            callback()

    def _disarm_writer(self) -> None:
        if self._write_armed:
            self._write_armed = False
            self._loop.remove_writer(self._fd)

    def abort(self) -> None:
        """Close with a TCP RST (``SO_LINGER`` 0); wakes a pending read or write; idempotent."""
        if self._closed:
            return
        self._aborted = True
        with contextlib.suppress(OSError):
            self._sock.setsockopt(socket.SOL_SOCKET, socket.SO_LINGER, _LINGER_ZERO)
        self._close()

    async def aclose(self) -> None:
        """Close gracefully (FIN after what was written); idempotent."""
        self._close()

    def close(self) -> None:
        """:meth:`aclose` without a coroutine: closing a socket never waits."""
        self._close()

    def _close(self) -> None:
        if self._closed:
            return
        self._closed = True
        if self._read_armed:
            self._read_armed = False
            self._loop.remove_reader(self._fd)
        if self._writer is not None or self._write_armed:
            self._write_armed = False
            self._loop.remove_writer(self._fd)
        self._out = None
        self._drained = None
        self._sink = _UNATTACHED  # nothing is pushed after the close: the relay (a cycle through us) is let go
        for waiter in (self._reader, self._writer):
            if waiter is not None and not waiter.done():
                waiter.set_exception(StreamClosedError("aborted" if self._aborted else "closed"))
        self._reader = self._writer = None
        self._sock.close()

    def _check_open(self, what: str) -> None:
        if self._closed:
            raise StreamClosedError(f"{what} on a stream that was {'aborted' if self._aborted else 'closed'}")

    async def _wait_readable(self) -> None:
        waiter = self._loop.create_future()
        self._reader = waiter
        if not self._read_armed:
            self._read_armed = True
            self._loop.add_reader(self._fd, self._readable)
        try:
            await waiter
        finally:
            if self._reader is waiter:  # not already failed by _close
                self._reader = None

    def _readable(self) -> None:
        waiter = self._reader
        if waiter is None:  # nobody reads now: stop watching until the next read has to wait
            self._read_armed = False
            self._loop.remove_reader(self._fd)
        elif not waiter.done():
            waiter.set_result(None)

    async def _wait_writable(self) -> None:
        waiter = self._loop.create_future()
        self._writer = waiter
        self._loop.add_writer(self._fd, _wake, waiter)
        try:
            await waiter
        finally:
            if self._writer is waiter:
                self._writer = None
                self._loop.remove_writer(self._fd)


def _wake(waiter: asyncio.Future[None]) -> None:
    if not waiter.done():
        waiter.set_result(None)


class _Unattached:
    """The sink of a stream not in push mode: what it would deliver is dropped."""

    __slots__ = ()

    def on_data(self, data: bytes | memoryview) -> None:
        pass

    def on_eof(self) -> None:
        pass

    def on_error(self, reason: str) -> None:
        pass


_UNATTACHED = _Unattached()
