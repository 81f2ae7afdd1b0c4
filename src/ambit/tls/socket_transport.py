"""TLS on the socket itself: an asyncio transport over a non-blocking :class:`ssl.SSLSocket` (issue 23).

Theory of operation: the event loop's own TLS transport runs an ``SSLObject`` between two memory BIOs, so every
byte is copied socket -> incoming BIO -> plaintext, and plaintext -> outgoing BIO -> bytes -> socket. Here OpenSSL
reads and writes the file descriptor itself (``SSL_read`` / ``SSL_write`` on a socket BIO), and the loop only says
when the descriptor is ready (``add_reader`` / ``add_writer``). :func:`ambit.tls.socket_handshake.open_tls` runs
the handshake and returns a :class:`TlsSocketTransport` with the protocol connected (where this process runs the
native accelerator, :mod:`ambit.native`, a :class:`~ambit.tls.native_transport.NativeTlsSocketTransport`, the same
transport with its record loops in C).

Invariants:

- OpenSSL reads ahead (``READ_AHEAD_BUFFER``): one ``read`` system call brings as many records as the socket holds,
  instead of two per record (its header, then its body). A context made for this transport (``read_ahead=
  READ_AHEAD_BUFFER``, :func:`ambit.tls.contexts.read_ahead_context`) has it on for all its connections; on any
  other, :func:`~ambit.tls.socket_handshake.open_tls` turns it on per connection
  (:func:`ambit.tls.contexts.read_ahead`). Where that cannot be done, OpenSSL reads each record by itself and holds
  nothing beyond the record being returned; where it reads ahead but what it holds cannot be asked
  (``SSL_has_pending``), a read callback reads until ``WANT_READ``.
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
import ssl
from collections.abc import Callable
from typing import Any, Literal

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
Addresses = tuple[Any, Any]
"""A connected socket's (peer, local) addresses, as ``getpeername()`` and ``getsockname()`` return them."""


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
        """``reading``: the descriptor is registered for reading already (by the handshake of
        :func:`~ambit.tls.socket_handshake.open_tls`); the transport makes that registration its own. ``addresses``:
        the socket's (peer, local) addresses, if known."""
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
