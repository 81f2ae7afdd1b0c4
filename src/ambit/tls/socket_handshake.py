"""Opening TLS on the socket itself: the handshake, then the transport (:mod:`ambit.tls.socket_transport`).

Theory of operation: :func:`open_tls` runs the handshake on a connected non-blocking socket (``SSLSocket`` with
OpenSSL reading and writing the descriptor) and returns a :class:`~ambit.tls.socket_transport.TlsSocketTransport`
with the protocol connected, as ``loop.create_connection(..., ssl=...)`` would; where this process runs the native
accelerator (:mod:`ambit.native`), a :class:`~ambit.tls.native_transport.NativeTlsSocketTransport`, the same
transport with its record loops in C.

Rules:

- The handshake is bounded by one deadline from the call (bytes trickled by the peer do not extend it): one timer
  for all the steps, which wakes the step waiting when it passes.
- The descriptor is registered with the loop once per way the handshake waits (its steps share one registration),
  and a reading registration is handed to the transport, which keeps it (the transport's invariants).
- On any failure (the handshake's, the deadline, a cancellation) the socket is closed, nothing stays registered and
  the timer is gone; a half-made ``SSLSocket`` that ``wrap_socket`` failed on is closed too.
- OpenSSL's read-ahead is turned on per connection where the context does not have it on already (the transport's
  invariants say why).
"""

from __future__ import annotations

import asyncio
import socket
import ssl
from collections.abc import Callable
from typing import Literal, TypeVar

from ambit import native
from ambit.tls.contexts import pending_probe, read_ahead, reads_ahead
from ambit.tls.socket_transport import READ_AHEAD_BUFFER, Addresses, TlsSocketTransport

_P = TypeVar("_P", bound=asyncio.Protocol)


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
