"""A gRPC client channel on our HTTP/2 engine (no grpcio): what the node proxy's xDS and CA clients call through.

Theory of operation: a :class:`GrpcChannel` holds at most one HTTP/2 connection to its target, dialled on the first
call that needs one: TCP, then TLS verified against the mesh root alone (ALPN ``h2``; the certificate must name
``server_name``, as ``grpc.ssl_target_name_override`` made grpcio check it), or h2c with prior knowledge when the
channel has no root. Each call is one stream of :class:`~ambit.hbone.messages.Http2ClientConnection`;
:mod:`ambit.hbone.grpc_calls` says what goes on it and how its outcome is read (the sans-IO half). This module
dials and keeps the connection; :mod:`ambit.xds.grpc_connection` runs one (its reader, its keepalive timer, its
calls).

Rules:

1. Dialling (TCP, TLS and the server's first SETTINGS) is bounded by ``connect_timeout``; any failure there, a
   server that does not negotiate ``h2``, or a connection that fails later, ends the affected calls with
   :class:`~ambit.xds.errors.GrpcCallError` UNAVAILABLE. The channel never reconnects on its own: the next call
   dials again, so the rate of reconnects is the caller's (the xDS client's back-off, the certificate manager's
   retries), never a loop of ours.
2. Keepalive is :mod:`ambit.hbone.liveness` rule 3 with the channel's :class:`KeepaliveSettings`: a PING after
   ``time`` seconds without a byte from the server, the connection dropped when its ACK is ``timeout`` seconds
   late, with or without a call open. Every read counts at once (the timer is told on each read, not at its next
   turn), so a silent server is noticed within ``time + timeout`` of its last byte, grpcio's bound.
3. A graceful GOAWAY drains: the calls it covers go on to their end, the ones above its last stream id fail
   UNAVAILABLE (never processed), the next call dials a new connection, and the old one is closed once its last
   call ended. So is a connection left for a new one because it has no room for another call: a channel holds
   one connection plus those still finishing calls, never more. A GOAWAY with an error code, or a connection
   error, fails every call at once.
4. Flow control follows the consumer (``grpc_calls`` rule 6): a stream call whose reader stops holds at most one
   message plus one stream window; messages are bounded by ``max_receive_message`` from their prefix.
5. Every call ends with a status. A failure is one :class:`~ambit.xds.errors.GrpcCallError` (code and message);
   what a peer sends never escapes as another exception. A unary call has a deadline (sent as ``grpc-timeout``
   and enforced here: DEADLINE_EXCEEDED, and the stream is reset).
"""

from __future__ import annotations

import asyncio
import contextlib
import ssl
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Protocol

from ambit.hbone.errors import HboneError
from ambit.hbone.grpc_calls import CallStatus, StatusCode, encode_message, request_headers
from ambit.xds.errors import GrpcCallError
from ambit.xds.grpc_connection import READ_SIZE, GrpcCall, GrpcConnection
from ambit.xds.keepalive import DEFAULT_KEEPALIVE, KeepaliveSettings

__all__ = ["DEFAULT_MAX_RECEIVE", "Channel", "ChannelFactory", "ChannelSettings", "GrpcChannel", "StreamCall"]

DEFAULT_MAX_RECEIVE = 4 * 1024 * 1024
"""gRPC's default bound on a received message (the CA's answers are a few KiB)."""


@dataclass(frozen=True, slots=True)
class ChannelSettings:
    """Where a channel connects and what it accepts."""

    target: str
    """``host:port`` (``[v6]:port``; a ``dns:///`` prefix, as gRPC targets may have, is dropped)."""
    root_pem: bytes | None
    """The only roots the server's certificate may chain to; None: plaintext h2c (tests, never the mesh)."""
    server_name: str | None = None
    """The name the server's certificate must carry (and SNI); default: the target's host."""
    keepalive: KeepaliveSettings = DEFAULT_KEEPALIVE
    max_receive_message: int = DEFAULT_MAX_RECEIVE
    connect_timeout: float = 10.0


class StreamCall(Protocol):
    """A bidirectional-stream call: ``read`` returns the next message, None once the server ended it with OK."""

    async def write(self, message: bytes) -> None: ...

    async def read(self) -> bytes | None: ...

    def cancel(self) -> None: ...


class Channel(Protocol):
    """What the xDS and CA clients need of a gRPC channel."""

    async def unary(
        self, path: str, request: bytes, *, metadata: Sequence[tuple[str, str]], time_limit: float
    ) -> bytes: ...

    async def stream(self, path: str, *, metadata: Sequence[tuple[str, str]]) -> StreamCall: ...

    async def aclose(self, grace: float = 0.0) -> None: ...


class ChannelFactory(Protocol):
    def __call__(self, settings: ChannelSettings) -> Channel: ...


def split_target(target: str) -> tuple[str, int]:
    """(host, port) of a ``host:port`` target; :class:`GrpcCallError` (INVALID_ARGUMENT) when it is not one."""
    text = target.removeprefix("dns:///")
    host, sep, port_text = text.rpartition(":")
    if host.startswith("[") and host.endswith("]"):
        host = host[1:-1]
    if not sep or not host or not port_text.isdigit() or not 0 < int(port_text) < 65536:
        raise GrpcCallError(StatusCode.INVALID_ARGUMENT, f"the target {target!r} is not host:port")
    return host, int(port_text)


class GrpcChannel:
    """A gRPC channel to one target over our HTTP/2 engine (see the module rules)."""

    def __init__(self, settings: ChannelSettings) -> None:
        self.settings = settings
        self.host, self.port = split_target(settings.target)
        self._context = _client_context(settings.root_pem) if settings.root_pem is not None else None
        self._conn: GrpcConnection | None = None
        self._draining: set[GrpcConnection] = set()
        self._lock = asyncio.Lock()
        self._closed = False
        self.dials = 0
        """Connections dialled so far (each reconnect is one more)."""

    async def __aenter__(self) -> GrpcChannel:
        return self

    async def __aexit__(self, *exc_info: object) -> None:
        await self.aclose()

    async def unary(
        self, path: str, request: bytes, *, metadata: Sequence[tuple[str, str]], time_limit: float
    ) -> bytes:
        """One request, one response within ``time_limit`` seconds (rule 5): the response's bytes, or
        :class:`GrpcCallError`."""
        timeout = time_limit
        headers = _headers(path, metadata, timeout)
        call: GrpcCall | None = None
        try:
            async with asyncio.timeout(timeout):
                conn = await self._connection()
                call = await conn.open(path, headers)
                await conn.send(call, encode_message(request), end=True)
                messages = []
                while (message := await call.read()) is not None:
                    messages.append(message)
                    if len(messages) > 1:
                        raise GrpcCallError(StatusCode.INTERNAL, "the server sent more than one response message")
        except TimeoutError:
            raise GrpcCallError(StatusCode.DEADLINE_EXCEEDED, f"no answer within {timeout:g} s") from None
        finally:
            if call is not None and call.response.status is None:
                call.cancel()
        if not messages:
            raise GrpcCallError(StatusCode.UNIMPLEMENTED, "the server answered OK without a response message")
        return messages[0]

    async def stream(self, path: str, *, metadata: Sequence[tuple[str, str]]) -> StreamCall:
        """Open a bidirectional-stream call; its ``read``/``write`` raise :class:`GrpcCallError` once it failed."""
        headers = _headers(path, metadata, None)
        conn = await self._connection()
        return await conn.open(path, headers)

    async def _connection(self) -> GrpcConnection:
        async with self._lock:
            if self._closed:
                raise GrpcCallError(StatusCode.CANCELLED, "the channel is closed")
            conn = self._conn
            if conn is not None and conn.usable:
                return conn
            if conn is not None and conn.failed is None:  # draining or full: its calls finish, new ones go elsewhere
                conn.retire()
                if conn.failed is None:
                    self._draining.add(conn)
            self._draining = {c for c in self._draining if c.failed is None}
            self._conn = None
            self._conn = conn = await self._dial()
            return conn

    async def _dial(self) -> GrpcConnection:
        self.dials += 1
        settings = self.settings
        server_name = settings.server_name or self.host
        conn: GrpcConnection | None = None
        try:
            async with asyncio.timeout(settings.connect_timeout):
                if self._context is None:
                    reader, writer = await asyncio.open_connection(self.host, self.port, limit=READ_SIZE)
                else:
                    reader, writer = await asyncio.open_connection(
                        self.host, self.port, ssl=self._context, server_hostname=server_name, limit=READ_SIZE
                    )
                    protocol = writer.get_extra_info("ssl_object").selected_alpn_protocol()
                    if protocol != "h2":
                        writer.transport.abort()
                        raise GrpcCallError(
                            StatusCode.UNAVAILABLE, f"{settings.target} did not negotiate HTTP/2 (ALPN {protocol!r})"
                        )
                authority = settings.server_name or settings.target.removeprefix("dns:///")
                conn = GrpcConnection(
                    reader,
                    writer,
                    target=settings.target,
                    scheme="http" if self._context is None else "https",
                    authority=authority,
                    keepalive=settings.keepalive,
                    max_receive_message=settings.max_receive_message,
                    settings_timeout=settings.connect_timeout,
                )
                await conn.ready.wait()  # the server's SETTINGS, or the connection's failure
        except TimeoutError:
            within = f"no HTTP/2 within {settings.connect_timeout:g} s"
            raise GrpcCallError(StatusCode.UNAVAILABLE, f"cannot connect to {settings.target}: {within}") from None
        except (OSError, EOFError) as exc:
            raise GrpcCallError(StatusCode.UNAVAILABLE, f"cannot connect to {settings.target}: {exc}") from None
        finally:
            if conn is not None and not conn.ready.is_set():  # the dial timed out or was cancelled
                conn.fail(CallStatus(StatusCode.UNAVAILABLE, "the dial was abandoned"))
        if conn.failed is not None:
            raise GrpcCallError(StatusCode.UNAVAILABLE, f"cannot connect to {settings.target}: {conn.failed.message}")
        return conn

    async def aclose(self, grace: float = 0.0) -> None:
        """Close the channel; with ``grace``, calls in flight get that long to finish first."""
        self._closed = True
        conns = [c for c in (self._conn, *self._draining) if c is not None]
        self._conn, self._draining = None, set()
        if grace > 0:
            with contextlib.suppress(TimeoutError):
                async with asyncio.timeout(grace):
                    await asyncio.gather(*(c.idle.wait() for c in conns))
        for conn in conns:
            await conn.aclose()


def _headers(path: str, metadata: Sequence[tuple[str, str]], timeout: float | None) -> list[tuple[str, str]]:
    try:
        return request_headers(path, metadata, timeout)
    except HboneError as exc:
        raise GrpcCallError(StatusCode.INVALID_ARGUMENT, str(exc)) from None


def _client_context(root_pem: bytes) -> ssl.SSLContext:
    """TLS that trusts only the mesh root (rule 1), offering ``h2``."""
    context = ssl.SSLContext(ssl.PROTOCOL_TLS_CLIENT)
    context.minimum_version = ssl.TLSVersion.TLSv1_2
    try:
        context.load_verify_locations(cadata=root_pem.decode("ascii", errors="replace"))
    except (ssl.SSLError, ValueError) as exc:
        raise GrpcCallError(StatusCode.UNAVAILABLE, f"the root certificate is unusable: {exc}") from None
    context.set_alpn_protocols(["h2"])
    return context
