"""TLS on the socket itself with the record path in C: :class:`TlsSocketTransport` over ``ambit.native``'s
``_tls_records`` (issue 23, step 1 of docs/native-data-path.md).

Theory of operation: the same transport as :mod:`ambit.tls.socket_transport` (its docstring's invariants hold here
unchanged: handshake, read-ahead, pausing, closing, failing), with the per-record loops done by one C call each:

- A read callback is one ``Records.read``: every record OpenSSL can return now, in one ``bytes`` (at most
  ``READ_SIZE``), and a status: wait for the poller, read again soon (the limit cut it short), the read needs the
  socket writable, the peer closed (close_notify), or failed (the exception to fail the connection with, after
  the data read before it is delivered).
- A write is one ``Records.write``: OpenSSL encrypts all of it into the connection's output buffer (its write BIO is
  a memory sink), and the buffer goes out with one ``send``. Ciphertext the socket refused stays in C and counts in
  the write buffer's size (``WriteBacklog`` rule 4): the protocol is paused above the high limit and resumed at the
  low one as before. While any is held, a write is refused as a socket BIO's ``WANT_WRITE`` would be, and its
  plaintext waits in the ``WriteBacklog`` until the writer has sent what is held: so nothing is encrypted behind
  held bytes (no ``send`` only to hear ``EAGAIN``, no moving them to make room), and order is kept. A write OpenSSL
  itself refuses (``WANT_READ`` during a post-handshake message) is kept the same way, as on the Python path.
- Anything OpenSSL writes while reading or closing (a KeyUpdate's answer, close_notify) goes into the same buffer
  and is sent by the same call; what stays is held like a write's, and a read that left some of its own output held
  ends with the status that stops reading until the socket is writable (a socket BIO's ``WANT_WRITE`` on the Python
  path): a peer that asks for new keys and never reads cannot make us hold one answer per request.

Step 2: the protocol may give the transport a ``feed`` (``set_data_path``; the HBONE session does, with
``ambit.native._hbone_data``): each read's plaintext goes to it first, it hands the DATA frames of attached streams
to their sinks as the HTTP/2 core would, and only the rest reaches ``data_received``, from its first unparsed octet.

The ``SSL *`` is reached by the extension only after the checks of :func:`ambit.tls.contexts.read_ahead` (made
again in C), and ``Records.close`` is called before the socket is closed: no C call touches the SSL afterwards.
"""

from __future__ import annotations

import asyncio
import logging
import ssl
from collections.abc import Callable
from types import ModuleType
from typing import TYPE_CHECKING, cast

from ambit.tls.contexts import context_options, libssl_verify_mode
from ambit.tls.socket_transport import READ_SIZE, SHUTDOWN_TIMEOUT, Addresses, TlsSocketTransport

if TYPE_CHECKING:
    from ambit.native._tls_records import Records

log = logging.getLogger(__name__)


def attach_records(tls_records: ModuleType, tls: ssl.SSLSocket) -> Records | None:
    """A ``Records`` for the handshaken ``tls``, or None (with a warning) when its ``SSL *`` cannot be trusted."""
    sslobj = tls._sslobj  # type: ignore[attr-defined]  # the _ssl object that owns the SSL *
    context = sslobj.context  # the SSLSocket's, without its property's frame
    try:
        return cast(
            "Records",
            tls_records.Records(
                tls,
                sslobj,
                context,
                context_options(context),
                libssl_verify_mode(context),
            ),
        )
    except (TypeError, ValueError) as exc:
        log.warning("TLS records stay in Python for this connection: %s", exc)
        return None


class NativeTlsSocketTransport(TlsSocketTransport):
    """:class:`TlsSocketTransport` with its record loops in C (see the module docstring)."""

    def __init__(
        self,
        loop: asyncio.AbstractEventLoop,
        tls: ssl.SSLSocket,
        protocol: asyncio.Protocol,
        tls_records: ModuleType,
        records: Records,
        *,
        reading: bool = False,
        addresses: Addresses | None = None,
    ) -> None:
        self._records = records
        self._records_read = records.read
        self._records_write = records.write
        self._again, self._more, self._eof_status = tls_records.READ_AGAIN, tls_records.READ_MORE, tls_records.READ_EOF
        self._wants_write_status = tls_records.READ_WANTS_WRITE
        self._feed: Callable[[bytes], int] | None = None  # see set_data_path
        self._pump_type = tls_records.ReadPump
        # Connects the protocol, which may write at once.
        super().__init__(loop, tls, protocol, None, reading=reading, addresses=addresses)

    def _holds_input(self) -> bool:
        return self._records.pending()

    def set_data_path(self, feed: Callable[[bytes], int] | None) -> None:
        """Give each read's plaintext to ``feed`` first (a ``DataPath.feed`` of ``ambit.native._hbone_data``): it
        takes the DATA frames of attached streams at the start and says how many octets it took; the protocol's
        ``data_received`` gets the rest. None: everything goes to ``data_received`` again.

        With a feed the loop calls a ``ReadPump`` (C) instead of :meth:`_read_ready`: the same read, and in the
        steady state (the feed took every octet, nothing else to do) no Python frame at all; anything else goes to
        :meth:`_read_ready` or :meth:`_after_read` from the point it reached."""
        self._feed = feed
        self._read_pump = None if feed is None else self._pump_type(self, self._records, feed, READ_SIZE)
        if self._reading:  # registered with the other callback: swap it
            # ``add_reader`` on a descriptor registered for reading replaces its callback (asyncio's loops and
            # uvloop alike); a ``remove_reader`` first would unregister and register it anew (uvloop: its poll
            # handle stopped and started, ``epoll_ctl`` calls) for the same registration.
            self._loop.add_reader(self._fd, self._read_pump or self._read_ready)

    def write(self, data: bytes | bytearray | memoryview) -> None:
        if self._closing or not data:
            return
        backlog = self._backlog
        if backlog.size != backlog.held:  # a refused write waits: everything goes behind it
            pause = backlog.append(bytes(data))
        else:
            try:
                held = self._records_write(data)
            except ssl.SSLWantWriteError:
                pass
            except ssl.SSLWantReadError:
                self._write_wants_read = True
            except OSError as exc:
                self._fail(exc)
                return
            else:
                if held or backlog.held:
                    self._hold(held)
                return
            self._hold(self._records.held)
            if self._lost:
                return
            pause = backlog.refused(bytes(data))
        if pause:
            self._pause_protocol()
        self._update_writer()
        self._update_reader()

    def _hold(self, held: int) -> None:
        """The C side now holds ``held`` bytes of ciphertext: flow control and the writer follow."""
        backlog = self._backlog
        if backlog.hold(held):
            self._pause_protocol()
        elif backlog.released() and not self._closing:
            self._resume_protocol()
        self._update_writer()

    def _resume_protocol(self) -> None:
        try:
            self._protocol.resume_writing()
        except Exception as exc:  # the protocol's bug, not the peer's: said once, with its traceback
            log.exception("%r: resume_writing failed", self)
            self._fail(exc)

    def _read_ready(self) -> None:
        # ``_read_deferred()``, inline (a Python call per read callback fewer): the same conditions, in its order.
        if (
            self._lost
            or self._write_wants_read
            or self._draining
            or self._read_paused
            or self._read_wants_write
            or self._eof
        ):
            self._read_ready_otherwise()
            return
        try:
            data, status, error = self._records_read(READ_SIZE)
        except OSError as exc:  # the socket closed under the records (not by us), or no memory for what was read
            self._fail(exc)
            return
        if data is not None and (feed := self._feed) is not None:
            try:
                taken = feed(data)
            except Exception as exc:  # a sink's bug (the relay's), as in data_received: said once, with its traceback
                self._protocol_failed(exc)
                return
            if self._lost:
                return
            if taken:
                data = data[taken:] if taken < len(data) else None
        if data is None and status == self._again and self._records.held == self._backlog.held:
            return  # the steady state of a relayed connection (the pump's, in C)
        self._after_read(data, status, error)

    def _after_read(self, data: bytes | None, status: int, error: OSError | None) -> None:
        """The rest of a read callback once the feed had its part: ``data`` (what it left) to the protocol, then
        what the records hold and the read's status acted on (the C pump calls it for all but its steady state)."""
        if data is not None:  # ``_deliver(data)``, inline: a Python call per read fewer
            try:
                self._protocol.data_received(data)
            except Exception as exc:  # the protocol's bug, not the peer's: said once, with its traceback
                self._protocol_failed(exc)
                return
            if self._lost:
                return
        if self._records.held != self._backlog.held:
            self._hold(self._records.held)
        if status == self._again:
            return
        if status == self._more:
            if not self._read_paused and not self._closing:
                self._loop.call_soon(self._read_ready)
        elif status == self._eof_status:
            self._eof = True
            self._update_reader()
            if self._closing:
                self._finish(None)
            elif not self._protocol.eof_received():
                self.close()
        elif status == self._wants_write_status:
            self._read_wants_write = True
            self._update_reader()
            self._update_writer()
        else:
            self._fail(error if error is not None else ssl.SSLError("TLS records failed"))

    def _flush(self) -> None:
        backlog = self._backlog
        try:
            held = self._records.flush()
        except OSError as exc:
            self._fail(exc)
            return
        self._hold(held)
        while not self._lost and not held and (chunk := backlog.next_chunk()) is not None:
            try:
                held = self._records_write(chunk)
            except ssl.SSLWantWriteError:
                break
            except ssl.SSLWantReadError:
                self._write_wants_read = True
                break
            except OSError as exc:
                self._fail(exc)
                return
            if backlog.sent(len(chunk), held) and not self._closing:
                self._resume_protocol()
        if self._lost:
            return
        self._update_writer()
        self._update_reader()
        if not backlog and self._closing and not self._draining:
            self._shutdown()

    def _shutdown(self) -> None:
        """Send close_notify (behind what is held), then read until the peer closes (``SHUTDOWN_TIMEOUT`` at most)."""
        if self._lost or self._draining:
            return
        try:
            done = self._records.shutdown()
        except (OSError, ValueError):  # could not even queue ours: nothing more to wait for
            self._finish(None)
            return
        held = self._records.held
        if done and not held:
            self._finish(None)
            return
        self._backlog.hold(held)
        self._draining = True
        self._shutdown_handle = self._loop.call_later(SHUTDOWN_TIMEOUT, self._finish, None)
        self._update_reader()
        self._update_writer()

    def _drain_input(self) -> None:
        while True:
            try:
                _data, status, _error = self._records_read(READ_SIZE)
            except (OSError, ValueError):
                break
            if status == self._again:
                return
            if status != self._more:
                break
        self._finish(None)

    def _finish(self, exc: Exception | None) -> None:
        if not self._lost:
            self._records.close()  # before the socket: no C call touches it after
            self._feed = self._read_pump = None  # they hold the protocol and us: no cycle left behind
        super()._finish(exc)
