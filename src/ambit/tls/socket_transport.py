"""TLS on the socket itself: an asyncio transport over a non-blocking :class:`ssl.SSLSocket` (issue 23).

Theory of operation: the event loop's own TLS transport runs an ``SSLObject`` between two memory BIOs, so every
byte is copied socket -> incoming BIO -> plaintext, and plaintext -> outgoing BIO -> bytes -> socket. Here OpenSSL
reads and writes the file descriptor itself (``SSL_read`` / ``SSL_write`` on a socket BIO), and the loop only says
when the descriptor is ready (``add_reader`` / ``add_writer``). :func:`open_tls` runs the handshake (bounded by one
deadline from its start: bytes trickled by the peer do not extend it) and returns a :class:`TlsSocketTransport`
with the protocol connected, as ``loop.create_connection(..., ssl=...)`` would; where this process runs the native
accelerator (:mod:`ambit.native`), a :class:`~ambit.tls.native_transport.NativeTlsSocketTransport`, the same
transport with its record loops in C.

Invariants:

- OpenSSL reads ahead (``READ_AHEAD_BUFFER``): one ``read`` system call brings as many records as the socket holds,
  instead of two per record (its header, then its body). A context made for this transport (``read_ahead=
  READ_AHEAD_BUFFER``, :func:`ambit.tls.contexts.read_ahead_context`) has it on for all its connections; on any
  other, :func:`open_tls` turns it on per connection (:func:`ambit.tls.contexts.read_ahead`). Where that cannot be
  done, OpenSSL reads each record by itself and holds nothing beyond the record being returned; where it reads
  ahead but what it holds cannot be asked (``SSL_has_pending``), a read callback reads until ``WANT_READ``.
- One read callback reads records until OpenSSL says ``WANT_READ``, or until a record shorter than a full one (the
  end of the peer's write, most likely) when OpenSSL holds nothing more (``SSL_has_pending``; without read-ahead it
  never does): so a request is read with no extra system call just to hear ``EAGAIN``, and bytes OpenSSL already
  holds never wait for a readiness the poller will not report. At most ``READ_SIZE`` bytes go to the protocol per
  callback (joined into one ``data_received``); when that bound cuts a read short, the next read is scheduled with
  ``call_soon`` rather than left to the poller.
- A descriptor is registered with the loop once per way it waits: the handshake's steps share one registration,
  and a reading one becomes the transport's (only the callback changes), so a connection's reads need one
  registration from its first handshake step to its close.
- A read that needs to write (``WANT_WRITE``: a TLS 1.3 KeyUpdate answer) waits for the socket to be writable, and a
  write that needs to read (``WANT_READ``) waits for it to be readable, even while the protocol paused reading.
- Writes are bookkept by :class:`~ambit.tls.write_backlog.WriteBacklog` (its rules: a refused chunk is retried
  as it was; asyncio's pause/resume contract). A write that finds nothing buffered goes to OpenSSL at once.
- ``close()`` flushes what is buffered, sends close_notify and reads (discarding) until the peer closes or
  ``SHUTDOWN_TIMEOUT`` passes; ``abort()`` drops everything at once. ``connection_lost`` is called exactly once,
  from the loop, after the descriptor was unregistered and closed.
- A failing peer (reset, garbage instead of a record, a bad alert) ends the connection with one log line at debug
  level, never a traceback: it is the peer's doing, and the protocol hears of it through ``connection_lost``.
"""

from __future__ import annotations

import asyncio
import logging
import socket
import ssl
from collections.abc import Callable
from typing import Any, Literal, TypeVar

from ambit import native
from ambit.tls.contexts import pending_probe, read_ahead, reads_ahead
from ambit.tls.write_backlog import WriteBacklog

log = logging.getLogger(__name__)

TlsTransportKind = Literal["loop", "socket"]
"""Which TLS transport HBONE runs on: the event loop's (memory BIOs) or :class:`TlsSocketTransport`."""
TLS_TRANSPORTS: tuple[TlsTransportKind, ...] = ("loop", "socket")

READ_SIZE = 256 * 1024
"""Plaintext bytes asked of OpenSSL per read, and the most one read callback hands the protocol."""
READ_AHEAD_BUFFER = 64 * 1024
"""OpenSSL's read buffer with its read-ahead on (a context's ``read_ahead`` for this transport, else per connection
by :func:`ambit.tls.contexts.read_ahead`): up to this much ciphertext per ``read`` system call instead of two calls
per record (header, then body); 0: read-ahead off."""
_FULL_RECORD = 16384
"""The most plaintext one TLS record carries: a record this full is most likely followed by more of one write."""
SHUTDOWN_TIMEOUT = 30.0
"""Seconds ``close()`` waits for the peer's own close once ours is sent (asyncio's default, too)."""

_P = TypeVar("_P", bound=asyncio.Protocol)
Addresses = tuple[Any, Any]
"""A connected socket's (peer, local) addresses, as ``getpeername()`` and ``getsockname()`` return them."""


async def open_tls(
    protocol_factory: Callable[[], _P],
    sock: socket.socket,
    context: ssl.SSLContext,
    *,
    server_side: bool,
    handshake_timeout: float,
    addresses: Addresses | None = None,
) -> tuple[TlsSocketTransport, _P]:
    """Run the TLS handshake on the connected ``sock`` (ours from now on: closed on failure) within
    ``handshake_timeout`` seconds of the call, then connect a protocol from ``protocol_factory`` to it.

    Raises what the handshake raised (``ssl.SSLError``, ``OSError``) or ``TimeoutError``. A client sends no SNI.
    A ``context`` made with ``read_ahead=READ_AHEAD_BUFFER`` spares each connection the turning on of read-ahead.
    ``addresses``: ``sock``'s (peer, local) addresses as ``getpeername()`` and ``getsockname()`` returned them, when
    the caller asked already (the transport's ``peername`` and ``sockname``: two system calls fewer)."""
    loop = asyncio.get_running_loop()
    has_pending: Callable[[], int] | None = None
    tls: ssl.SSLSocket | None = None
    try:
        sock.setblocking(False)
        # A peer that closes without close_notify (mid-record, say) has failed, not ended: an error, never an EOF.
        tls = context.wrap_socket(
            sock, server_side=server_side, do_handshake_on_connect=False, suppress_ragged_eofs=False
        )
        context_reads_ahead = reads_ahead(context)
        if READ_AHEAD_BUFFER and not context_reads_ahead:
            has_pending = read_ahead(tls, READ_AHEAD_BUFFER)
    except BaseException as exc:
        sock.close()  # a no-op once wrap_socket took the descriptor: then the SSLSocket, made or half-made, has it
        if tls is not None:
            tls.close()
        else:
            _close_half_made(exc)
        raise
    reading = False  # the handshake left the descriptor registered for reading
    try:
        reading = await _handshake(loop, tls, loop.time() + handshake_timeout)
        protocol = protocol_factory()
        tls_records = native.selection().tls_records
        records = None
        if tls_records is not None:
            from ambit.tls.native_transport import attach_records

            records = attach_records(tls_records, tls)
    except BaseException:
        if reading:
            loop.remove_reader(tls.fileno())
        tls.close()
        raise
    if tls_records is not None and records is not None:
        from ambit.tls.native_transport import NativeTlsSocketTransport  # it subclasses ours

        transport: TlsSocketTransport = NativeTlsSocketTransport(
            loop, tls, protocol, tls_records, records, reading=reading, addresses=addresses
        )
        return transport, protocol
    if context_reads_ahead:
        # OpenSSL reads ahead on this connection: what it holds must be asked, or else assumed (read to WANT_READ).
        has_pending = pending_probe(tls) or _assume_pending
    return TlsSocketTransport(loop, tls, protocol, has_pending, reading=reading, addresses=addresses), protocol


def _close_half_made(exc: BaseException) -> None:
    """Close the ``SSLSocket`` that ``wrap_socket`` made and then failed on, if ``exc`` came from inside it.

    ``SSLSocket._create`` takes the descriptor from the socket it wraps before it checks that socket: a peer's reset
    that lands before (``recv`` raising ``ECONNRESET`` in that check) leaves the new object, and the descriptor,
    reachable only from the traceback's frames. Reference counting would close it with a ``ResourceWarning`` once
    the exception is gone; a frame kept by the exception (a log record, a test's collection of warnings) would keep
    the descriptor open as long. The standard library gives no other handle on that object."""
    tb = exc.__traceback__
    while tb is not None:
        made = tb.tb_frame.f_locals.get("self")
        if isinstance(made, ssl.SSLSocket):
            made.close()
            return
        tb = tb.tb_next


def _assume_pending() -> int:
    """For a connection reading ahead whose ``SSL_has_pending`` cannot be asked: OpenSSL may hold more."""
    return 1


async def _handshake(loop: asyncio.AbstractEventLoop, tls: ssl.SSLSocket, deadline: float) -> bool:
    """Run the handshake on ``tls`` until ``deadline`` (the loop's clock; ``TimeoutError`` then); True when it ends
    with the descriptor still registered for reading.

    One registration serves every step that waits the same way (only its callback changes, which costs the loop no
    system call), and the transport takes over a reading one in turn: an event loop that registers a descriptor
    anew pays for it (uvloop: a poll handle made and destroyed, with several ``epoll_ctl`` and ``ioctl`` calls).
    The deadline is one timer for all the steps, which wakes the step waiting when it passes (not
    ``asyncio.timeout``, whose task bookkeeping costs more Python than the handshake's own steps). On any failure
    (the handshake's, the deadline, a cancellation) nothing stays registered and the timer is gone."""
    fd = tls.fileno()
    # The _ssl object's own method: SSLSocket.do_handshake adds a Python frame and, per call, a settimeout (an ioctl
    # system call) to restore what it never changed here. Not connected, the socket has none: ssl's says ENOTCONN.
    inner = tls._sslobj  # type: ignore[attr-defined]
    do_handshake: Callable[[], None] = inner.do_handshake if inner is not None else tls.do_handshake
    waiting: Literal["read", "write"] | None = None  # what the descriptor is registered for
    timer: _Deadline | None = None
    try:
        while True:
            try:
                do_handshake()
                break
            except ssl.SSLWantReadError:
                want: Literal["read", "write"] = "read"
            except ssl.SSLWantWriteError:
                want = "write"
            if waiting is not None and waiting != want:
                _unregister(loop, fd, waiting)
                waiting = None
            if timer is None:
                timer = _Deadline(loop, deadline)
            ready = timer.waiter = loop.create_future()
            if want == "read":
                loop.add_reader(fd, _set_done, ready)
            else:
                loop.add_writer(fd, _set_done, ready)
            waiting = want
            await ready
            if timer.expired:  # what woke this step, or it passed while the step's readiness was being delivered
                raise TimeoutError
    except BaseException:
        if waiting is not None:
            _unregister(loop, fd, waiting)
        raise
    finally:
        if timer is not None:
            timer.handle.cancel()
    if waiting == "write":
        _unregister(loop, fd, waiting)
    return waiting == "read"


class _Deadline:
    """The handshake's deadline: once it passed, ``expired``, and the step waiting (``waiter``) is woken."""

    __slots__ = ("expired", "handle", "waiter")

    def __init__(self, loop: asyncio.AbstractEventLoop, deadline: float) -> None:
        self.waiter: asyncio.Future[None] | None = None
        self.expired = False
        self.handle = loop.call_at(deadline, self._expire)

    def _expire(self) -> None:
        self.expired = True
        if self.waiter is not None:
            _set_done(self.waiter)


def _unregister(loop: asyncio.AbstractEventLoop, fd: int, waiting: Literal["read", "write"]) -> None:
    if waiting == "read":
        loop.remove_reader(fd)
    else:
        loop.remove_writer(fd)


def _set_done(future: asyncio.Future[None]) -> None:
    if not future.done():
        future.set_result(None)


class TlsSocketTransport(asyncio.Transport):
    """An asyncio stream transport doing TLS on its socket (see the module docstring)."""

    def __init__(
        self,
        loop: asyncio.AbstractEventLoop,
        tls: ssl.SSLSocket,
        protocol: asyncio.Protocol,
        has_pending: Callable[[], int] | None = None,
        *,
        reading: bool = False,
        addresses: Addresses | None = None,
    ) -> None:
        """``reading``: the descriptor is registered for reading already (by :func:`open_tls`'s handshake); the
        transport makes that registration its own. ``addresses``: the socket's (peer, local) addresses, if known."""
        # The ``_ssl`` object's own context and cipher: ``SSLSocket.context`` and ``cipher()`` only add Python
        # frames (and a closed check) around them, on a socket just handshaken.
        sslobj = tls._sslobj  # type: ignore[attr-defined]
        extra: dict[str, Any] = {"socket": tls, "ssl_object": tls, "sslcontext": sslobj.context}
        if addresses is not None:
            extra["peername"], extra["sockname"] = addresses
        else:
            try:
                extra["peername"], extra["sockname"] = tls.getpeername(), tls.getsockname()
            except OSError:
                extra["peername"] = extra["sockname"] = None
        extra["cipher"] = sslobj.cipher()  # "peercert": decoded on demand (get_extra_info)
        super().__init__(extra)
        self._info = extra  # asyncio's _extra, which get_extra_info completes
        self._loop = loop
        self._tls = tls
        self._sslobj = sslobj  # the _ssl object: kept past close, as the SSL *
        self._fd = tls.fileno()
        self._protocol = protocol
        # The C methods of the ``_ssl`` object itself: ``SSLSocket.recv`` and ``send`` only add Python frames (their
        # one difference, ``suppress_ragged_eofs``, is off here).
        self._read: Callable[[int], bytes] = self._sslobj.read
        self._write: Callable[[bytes | bytearray | memoryview], int] = self._sslobj.write
        self._has_pending = has_pending  # with OpenSSL's read-ahead on: whether it holds bytes we have not read
        self._backlog = WriteBacklog()
        self._closing = False  # close() or abort() was called, or the connection failed
        self._lost = False  # the descriptor is closed; connection_lost is scheduled
        self._read_paused = False
        self._eof = False  # the peer closed its side: nothing more will be read
        self._reading = reading  # our reader is registered
        self._writing = False  # our writer is registered
        self._read_wants_write = False
        self._write_wants_read = False
        self._shutdown_handle: asyncio.TimerHandle | None = None
        self._draining = False  # close_notify sent; reading until the peer closes
        self._read_pump: Callable[[], object] | None = None
        """The read callback registered in place of ``_read_ready`` (the native transport's C one), or None."""
        if reading:
            loop.add_reader(self._fd, self._read_ready)  # the handshake's registration, with our callback
        protocol.connection_made(self)
        if not self._closing:
            self._update_reader()
            if self._holds_input():  # the handshake's last read brought more than it needed
                loop.call_soon(self._read_ready)

    def _holds_input(self) -> bool:
        """Whether OpenSSL holds input not returned yet, which the poller cannot report (read-ahead took it in).
        Without read-ahead it never does: it reads a record at a time, and the handshake reads no data record."""
        return self._has_pending is not None and bool(self._has_pending())

    # asyncio.BaseTransport

    def get_extra_info(self, name: str, default: Any = None) -> Any:
        """asyncio's extra information; ``peercert`` (the peer's certificate as a dict) is decoded on first demand,
        not per connection: the identity checks read the DER (``ssl_object.getpeercert(binary_form=True)``). It is
        there after the close too, as on the loop's transport (the ``_ssl`` object and its ``SSL *`` live on)."""
        if name == "peercert" and name not in self._info:
            self._info[name] = self._sslobj.getpeercert()
        return super().get_extra_info(name, default)

    def is_closing(self) -> bool:
        return self._closing

    def close(self) -> None:
        if self._closing:
            return
        self._closing = True
        self._read_paused = True
        if not self._backlog:
            self._shutdown()
        else:
            self._update_reader()

    def set_protocol(self, protocol: asyncio.BaseProtocol) -> None:
        if not isinstance(protocol, asyncio.Protocol):
            raise TypeError(f"a stream protocol is needed, not {protocol!r}")
        self._protocol = protocol

    def get_protocol(self) -> asyncio.BaseProtocol:
        return self._protocol

    # asyncio.ReadTransport

    def is_reading(self) -> bool:
        return not self._read_paused and not self._closing

    def pause_reading(self) -> None:
        if self._closing:
            return
        self._read_paused = True
        self._update_reader()

    def resume_reading(self) -> None:
        if self._closing or not self._read_paused:
            return
        self._read_paused = False
        self._update_reader()
        self._loop.call_soon(self._read_ready)  # OpenSSL may hold plaintext the poller knows nothing of

    # asyncio.WriteTransport

    def set_write_buffer_limits(self, high: int | None = None, low: int | None = None) -> None:
        if self._backlog.set_limits(high, low):
            self._pause_protocol()

    def get_write_buffer_limits(self) -> tuple[int, int]:
        return self._backlog.low, self._backlog.high

    def get_write_buffer_size(self) -> int:
        return self._backlog.size

    def write(self, data: bytes | bytearray | memoryview) -> None:
        if self._closing or not data:
            return
        if self._backlog.size:
            pause = self._backlog.append(bytes(data))
        else:
            try:
                self._write(data)  # all of it: without SSL_MODE_ENABLE_PARTIAL_WRITE, OpenSSL sends all or none
                return
            except ssl.SSLWantWriteError:
                pass
            except ssl.SSLWantReadError:
                self._write_wants_read = True
            except OSError as exc:
                self._fail(exc)
                return
            pause = self._backlog.refused(bytes(data))
        if pause:
            self._pause_protocol()
        self._update_writer()
        self._update_reader()

    def write_eof(self) -> None:
        raise NotImplementedError("TLS cannot half-close; close() sends close_notify")

    def can_write_eof(self) -> bool:
        return False

    def abort(self) -> None:
        self._closing = True
        self._finish(None)

    # Readiness callbacks

    def _read_ready(self) -> None:
        if self._read_deferred():
            return
        read, has_pending = self._read, self._has_pending
        first: bytes | None = None
        chunks: list[bytes] | None = None
        total = 0
        more = eof = False
        error: OSError | None = None
        while True:
            try:
                data = read(READ_SIZE)
            except ssl.SSLWantReadError:
                break
            except ssl.SSLWantWriteError:
                self._read_wants_write = True
                break
            except ssl.SSLZeroReturnError:
                eof = True
                break
            except OSError as exc:
                error = exc
                break
            if not data:
                eof = True
                break
            if first is None:
                first = data
            elif chunks is None:
                chunks = [first, data]
            else:
                chunks.append(data)
            total += len(data)
            if len(data) < _FULL_RECORD and (has_pending is None or not has_pending()):
                break  # the end of the peer's write, likely, and OpenSSL holds nothing: no read to hear EAGAIN
            if total >= READ_SIZE:
                more = True
                break
        if first is not None and not self._deliver(first if chunks is None else b"".join(chunks)):
            return
        if self._lost:
            return
        if error is not None:
            self._fail(error)
        elif eof:
            self._eof = True
            self._update_reader()
            if self._closing:
                self._finish(None)
            elif not self._protocol.eof_received():
                self.close()
        else:
            if more and not self._read_paused and not self._closing:
                self._loop.call_soon(self._read_ready)
            if self._read_wants_write:
                self._update_reader()
                self._update_writer()

    def _read_deferred(self) -> bool:
        """Whether this read callback must not read now (a write waits for it, or the connection is closing, paused,
        or gone); if so, it did what the callback is for instead."""
        if (
            self._lost
            or self._write_wants_read
            or self._draining
            or self._read_paused
            or self._read_wants_write
            or self._eof
        ):
            self._read_ready_otherwise()
            return True
        return False

    def _deliver(self, data: bytes) -> bool:
        """Hand ``data`` to the protocol; False when the connection is gone after it (failed, closed, aborted)."""
        try:
            self._protocol.data_received(data)
        except Exception as exc:  # the protocol's bug, not the peer's: said once, with its traceback
            self._protocol_failed(exc)
            return False
        return not self._lost

    def _protocol_failed(self, exc: Exception) -> None:
        log.exception("%r: data_received failed", self)
        self._fail(exc)

    def _read_ready_otherwise(self) -> None:
        """The reader fired while a write waits for it, or the connection is closing, paused, or gone."""
        if self._lost:
            return
        if self._write_wants_read:
            self._write_wants_read = False
            self._flush()
            if self._lost:
                return
        if self._draining:
            self._drain_input()
        elif self._read_paused or self._eof or self._read_wants_write:
            self._update_reader()
        else:
            self._read_ready()

    def _write_ready(self) -> None:
        if self._lost:
            return
        if self._read_wants_write:
            self._read_wants_write = False
            self._update_reader()
            self._read_ready()
            if self._lost:
                return
        self._flush()

    def _flush(self) -> None:
        backlog = self._backlog
        send = self._write
        while (chunk := backlog.next_chunk()) is not None:
            try:
                sent = send(chunk)
            except ssl.SSLWantWriteError:
                break
            except ssl.SSLWantReadError:
                self._write_wants_read = True
                break
            except OSError as exc:
                self._fail(exc)
                return
            if backlog.sent(sent) and not self._closing:
                try:
                    self._protocol.resume_writing()
                except Exception as exc:  # the protocol's bug, not the peer's: said once, with its traceback
                    log.exception("%r: resume_writing failed", self)
                    self._fail(exc)
                    return
                if self._lost:
                    return
        self._update_writer()
        self._update_reader()
        if not backlog and self._closing and not self._draining:
            self._shutdown()

    # Closing

    def _shutdown(self) -> None:
        """Send close_notify, then read until the peer closes (``SHUTDOWN_TIMEOUT`` at most)."""
        if self._lost or self._draining:
            return
        try:
            self._tls.unwrap()
        except ssl.SSLWantReadError:  # ours went out; the peer's has not come yet
            pass
        except (OSError, ValueError):  # could not even send ours: nothing more to wait for
            self._finish(None)
            return
        else:  # both sides closed
            self._finish(None)
            return
        self._draining = True
        self._shutdown_handle = self._loop.call_later(SHUTDOWN_TIMEOUT, self._finish, None)
        self._update_reader()

    def _drain_input(self) -> None:
        while True:
            try:
                data = self._tls.recv(READ_SIZE)
            except ssl.SSLWantReadError:
                return
            except (OSError, ValueError):
                break
            if not data:
                break
        self._finish(None)

    def _fail(self, exc: BaseException) -> None:
        log.debug("%r: connection failed: %s", self, exc)
        self._closing = True
        self._finish(exc if isinstance(exc, Exception) else None)

    def _finish(self, exc: Exception | None) -> None:
        if self._lost:
            return
        self._lost = True
        self._closing = True
        if self._shutdown_handle is not None:
            self._shutdown_handle.cancel()
        if self._reading:
            self._loop.remove_reader(self._fd)
            self._reading = False
        if self._writing:
            self._loop.remove_writer(self._fd)
            self._writing = False
        self._backlog.clear()
        self._tls.close()
        self._loop.call_soon(self._protocol.connection_lost, exc)

    # Registration

    def _update_reader(self) -> None:
        want = not self._lost and (
            self._write_wants_read
            or self._draining
            or not (self._read_paused or self._eof or self._read_wants_write or self._closing)
        )
        if want != self._reading:
            self._reading = want
            if want:
                self._loop.add_reader(self._fd, self._read_pump or self._read_ready)
            else:
                self._loop.remove_reader(self._fd)

    def _update_writer(self) -> None:
        want = not self._lost and (self._read_wants_write or (bool(self._backlog) and not self._write_wants_read))
        if want != self._writing:
            self._writing = want
            if want:
                self._loop.add_writer(self._fd, self._write_ready)
            else:
                self._loop.remove_writer(self._fd)

    def _pause_protocol(self) -> None:
        try:
            self._protocol.pause_writing()
        except Exception as exc:  # the protocol's bug: said once, with its traceback
            log.exception("%r: pause_writing failed", self)
            self._fail(exc)

    def __repr__(self) -> str:
        state = "lost" if self._lost else "closing" if self._closing else "open"
        return f"<TlsSocketTransport fd={self._fd} {state} peer={self.get_extra_info('peername')}>"
