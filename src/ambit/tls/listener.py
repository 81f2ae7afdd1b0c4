"""A TLS listener that owns every connection it accepts, so that closing it leaves no socket open.

Theory of operation: :class:`TlsListener` accepts on a socket its caller bound, runs each server handshake in a
task of its own (bounded by ``handshake_timeout``), and then hands the connection to a protocol made by
``protocol_factory`` (for an HTTP server, aiohttp's ``runner.server``), which it wraps to learn when the connection
is lost. It exists because asyncio's own server does not own its connections on Python 3.11: ``Server.close()``
closes only the listening socket, ``wait_closed()`` does not wait for accepted connections, and
``close_clients()``/``abort_clients()`` arrive in 3.13. A TLS connection closed by its protocol first sends
close_notify and keeps its socket until the peer answers; a peer that never does (stopped, overloaded, hostile)
held that socket for ``ssl_shutdown_timeout`` and, if the event loop ended first, for ever.

Rules:

1. Every accepted socket is in one of three places: handshaking (a task in ``_handshakes``), open (its protocol
   in ``_open``), or gone (its socket closed). A connection leaves ``_open`` only from ``connection_lost``, which
   asyncio calls after the socket is closed.
2. :meth:`stop` closes the listening socket and cancels every handshake; a cancelled or failed handshake aborts
   its socket. Nothing is accepted after it.
3. :meth:`aclose` stops, then gives the open connections ``grace`` seconds to end on their own (their protocol's
   owner closes them first, e.g. ``runner.cleanup()``), aborts those still open, and returns only when every
   accepted socket is closed.
4. A connection is not read from while its writing is paused (more than the transport's high-water mark waits to
   be sent), whatever its protocol does: the loop's TLS answers a peer's KeyUpdate request from inside its read,
   so a peer that keeps asking and never reads would otherwise have us hold one answer per request, without
   bound. The protocol sees a transport (:class:`_ReadGate`) whose reading runs only while neither it nor rule 4
   holds it paused.
"""

from __future__ import annotations

import asyncio
import contextlib
import errno
import logging
import socket
import ssl
from collections.abc import Callable, Iterable
from typing import cast

log = logging.getLogger(__name__)

_ACCEPT_RETRY_DELAY = 0.5
"""Pause after running out of file descriptors before accepting again (asyncio's own server waits 1 s)."""


class _ReadGate(asyncio.Transport):
    """The transport as the protocol sees it (rule 4): reading runs while neither the protocol nor the write side's
    flow control holds it paused; everything else is the transport's own."""

    def __init__(self, transport: asyncio.Transport) -> None:
        super().__init__()
        self._transport = transport
        self._paused_by_protocol = False
        self._paused_by_writes = False

    def writes_paused(self, paused: bool) -> None:
        self._paused_by_writes = paused
        self._apply()

    def pause_reading(self) -> None:
        self._paused_by_protocol = True
        self._apply()

    def resume_reading(self) -> None:
        self._paused_by_protocol = False
        self._apply()

    def is_reading(self) -> bool:
        return not self._paused_by_protocol and not self._transport.is_closing()

    def _apply(self) -> None:
        transport = self._transport
        if transport.is_closing():
            return
        if self._paused_by_protocol or self._paused_by_writes:
            transport.pause_reading()
        else:
            transport.resume_reading()

    def get_extra_info(self, name: str, default: object = None) -> object:
        return self._transport.get_extra_info(name, default)

    def is_closing(self) -> bool:
        return self._transport.is_closing()

    def close(self) -> None:
        self._transport.close()

    def abort(self) -> None:
        self._transport.abort()

    def set_protocol(self, protocol: asyncio.BaseProtocol) -> None:
        self._transport.set_protocol(protocol)

    def get_protocol(self) -> asyncio.BaseProtocol:
        return self._transport.get_protocol()

    def write(self, data: bytes | bytearray | memoryview) -> None:
        self._transport.write(data)

    def writelines(self, list_of_data: Iterable[bytes | bytearray | memoryview]) -> None:
        self._transport.writelines(list_of_data)

    def write_eof(self) -> None:
        self._transport.write_eof()

    def can_write_eof(self) -> bool:
        return self._transport.can_write_eof()

    def get_write_buffer_size(self) -> int:
        return self._transport.get_write_buffer_size()

    def get_write_buffer_limits(self) -> tuple[int, int]:
        return self._transport.get_write_buffer_limits()

    def set_write_buffer_limits(self, high: int | None = None, low: int | None = None) -> None:
        self._transport.set_write_buffer_limits(high, low)


class _Tracked(asyncio.Protocol):
    """Forwards to the real protocol, stops reading while writes are paused (rule 4), and resolves ``lost`` once
    asyncio reports the connection gone."""

    def __init__(self, inner: asyncio.Protocol, lost: asyncio.Future[None]) -> None:
        self.inner = inner
        self.lost = lost
        self.transport: asyncio.Transport | None = None
        self._gate: _ReadGate | None = None

    def connection_made(self, transport: asyncio.BaseTransport) -> None:
        transport = cast(asyncio.Transport, transport)  # uvloop's TLS transport is not an asyncio.Transport subclass
        self.transport = transport
        self._gate = _ReadGate(transport)
        self.inner.connection_made(self._gate)

    def data_received(self, data: bytes) -> None:
        self.inner.data_received(data)

    def eof_received(self) -> bool | None:
        return self.inner.eof_received()

    def pause_writing(self) -> None:
        if self._gate is not None:
            self._gate.writes_paused(True)
        self.inner.pause_writing()

    def resume_writing(self) -> None:
        if self._gate is not None:
            self._gate.writes_paused(False)
        self.inner.resume_writing()

    def connection_lost(self, exc: Exception | None) -> None:
        try:
            self.inner.connection_lost(exc)
        finally:
            if not self.lost.done():
                self.lost.set_result(None)


class TlsListener:
    """Accepts TLS connections on ``sock`` for ``protocol_factory``; ``start()``, then ``await aclose(grace)``."""

    def __init__(
        self,
        sock: socket.socket,
        protocol_factory: Callable[[], asyncio.Protocol],
        context: ssl.SSLContext,
        *,
        handshake_timeout: float = 10.0,
        backlog: int = 128,
        name: str = "tls listener",
    ) -> None:
        self._sock = sock
        self._factory = protocol_factory
        self._context = context
        self._handshake_timeout = handshake_timeout
        self._backlog = backlog
        self._name = name
        self._accepting: asyncio.Task[None] | None = None
        self._handshakes: set[asyncio.Task[None]] = set()
        self._open: set[_Tracked] = set()

    @property
    def address(self) -> tuple[str, int]:
        """The bound (host, port)."""
        host, port = self._sock.getsockname()[:2]
        return str(host), int(port)

    @property
    def open_connections(self) -> int:
        """Connections past their handshake and not yet lost."""
        return len(self._open)

    def start(self) -> None:
        self._sock.setblocking(False)
        self._sock.listen(self._backlog)
        self._accepting = asyncio.get_running_loop().create_task(self._accept(), name=f"{self._name} accept")

    async def stop(self) -> None:
        """Rule 2: no more connections; handshakes under way are cancelled and their sockets closed."""
        if self._accepting is not None:
            self._accepting.cancel()
            with contextlib.suppress(asyncio.CancelledError):
                await self._accepting
            self._accepting = None
        self._sock.close()
        handshakes = list(self._handshakes)
        for task in handshakes:
            task.cancel()
        await asyncio.gather(*handshakes, return_exceptions=True)

    async def aclose(self, grace: float = 1.0) -> None:
        """Rule 3: stop, let open connections end within ``grace`` seconds, abort the rest, wait for all."""
        await self.stop()
        if self._open:
            await asyncio.wait([tracked.lost for tracked in self._open], timeout=grace)
        for tracked in list(self._open):
            if tracked.transport is not None:
                log.info("%s: aborting a connection still open %.1f s after close", self._name, grace)
                tracked.transport.abort()
        if self._open:
            await asyncio.wait([tracked.lost for tracked in self._open])

    async def _accept(self) -> None:
        loop = asyncio.get_running_loop()
        while True:
            try:
                conn, _ = await loop.sock_accept(self._sock)
            except (ConnectionAbortedError, InterruptedError):
                continue
            except OSError as exc:
                if exc.errno not in (errno.EMFILE, errno.ENFILE, errno.ENOBUFS, errno.ENOMEM):
                    raise
                log.warning("%s: cannot accept (%s); retrying in %.1f s", self._name, exc, _ACCEPT_RETRY_DELAY)
                await asyncio.sleep(_ACCEPT_RETRY_DELAY)
                continue
            task = loop.create_task(self._handshake(conn), name=f"{self._name} handshake {_peer(conn)}")
            self._handshakes.add(task)
            task.add_done_callback(self._handshakes.discard)

    async def _handshake(self, conn: socket.socket) -> None:
        loop = asyncio.get_running_loop()
        tracked = _Tracked(self._factory(), loop.create_future())
        try:
            await loop.connect_accepted_socket(
                lambda: tracked, conn, ssl=self._context, ssl_handshake_timeout=self._handshake_timeout
            )
        except (OSError, TimeoutError) as exc:  # ssl.SSLError is an OSError; asyncio has aborted the socket
            log.debug("%s: handshake with %s failed: %s", self._name, _peer(conn), exc or type(exc).__name__)
            return
        if not tracked.lost.done():
            self._open.add(tracked)
            tracked.lost.add_done_callback(lambda _: self._open.discard(tracked))


def _peer(conn: socket.socket) -> str:
    try:
        host, port = conn.getpeername()[:2]
    except OSError:
        return "?"
    return f"{host}:{port}"
