"""A gRPC client channel on our HTTP/2 engine (no grpcio): what the node proxy's xDS and CA clients call through.

Theory of operation: a :class:`GrpcChannel` holds at most one HTTP/2 connection to its target, dialled on the first
call that needs one: TCP, then TLS verified against the mesh root alone (ALPN ``h2``; the certificate must name
``server_name``, as ``grpc.ssl_target_name_override`` made grpcio check it), or h2c with prior knowledge when the
channel has no root. Each call is one stream of :class:`~ambit.hbone.messages.Http2ClientConnection`;
:mod:`ambit.hbone.grpc_calls` says what goes on it and how its outcome is read (the sans-IO half). This module is
the asyncio shell: one reader task per connection feeds the engine and routes its events to the calls, one timer
task keeps it alive, any task writes under one lock.

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
import logging
import ssl
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Protocol

from ambit.hbone import wire
from ambit.hbone.connection import HboneSettings
from ambit.hbone.errors import HboneError
from ambit.hbone.events import (
    ConnectionDraining,
    ConnectionTerminated,
    DataReceived,
    PingAcknowledged,
    ResponseReceived,
    StreamEnded,
    StreamReset,
    StreamWritable,
    TrailersReceived,
)
from ambit.hbone.grpc_calls import (
    CallResponse,
    CallStatus,
    MessageQueue,
    StatusCode,
    encode_message,
    request_headers,
)
from ambit.hbone.liveness import Expire, LivenessSettings, LivenessTimer, SendPing
from ambit.hbone.messages import Http2ClientConnection
from ambit.xds.errors import GrpcCallError
from ambit.xds.keepalive import DEFAULT_KEEPALIVE, KeepaliveSettings

__all__ = ["DEFAULT_MAX_RECEIVE", "Channel", "ChannelFactory", "ChannelSettings", "GrpcChannel", "StreamCall"]

log = logging.getLogger("ambit.xds.grpc_channel")

DEFAULT_MAX_RECEIVE = 4 * 1024 * 1024
"""gRPC's default bound on a received message (the CA's answers are a few KiB)."""
_READ_SIZE = 256 * 1024
_SETTINGS = HboneSettings(stream_window=4 * 1024 * 1024, connection_window=8 * 1024 * 1024, max_concurrent_streams=100)


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


class _GrpcConnection(Http2ClientConnection):
    """The engine with RFC 9113's graceful GOAWAY (rule 3): grpcio's servers drain that way when they stop."""

    _graceful_goaway = True


def split_target(target: str) -> tuple[str, int]:
    """(host, port) of a ``host:port`` target; :class:`GrpcCallError` (INVALID_ARGUMENT) when it is not one."""
    text = target.removeprefix("dns:///")
    host, sep, port_text = text.rpartition(":")
    if host.startswith("[") and host.endswith("]"):
        host = host[1:-1]
    if not sep or not host or not port_text.isdigit() or not 0 < int(port_text) < 65536:
        raise GrpcCallError(StatusCode.INVALID_ARGUMENT, f"the target {target!r} is not host:port")
    return host, int(port_text)


class _Call:
    """One call's stream as its consumer sees it."""

    __slots__ = ("conn", "queue", "response", "stream_id", "wakeup", "writable")

    def __init__(self, conn: _Connection, stream_id: int, max_receive: int) -> None:
        self.conn = conn
        self.stream_id = stream_id
        self.response = CallResponse(max_receive)
        self.queue = MessageQueue()
        self.wakeup = asyncio.Event()
        self.writable = asyncio.Event()
        self.writable.set()

    def finished(self) -> None:
        self.wakeup.set()
        self.writable.set()

    async def write(self, message: bytes) -> None:
        await self.conn.send(self, encode_message(message))

    async def read(self) -> bytes | None:
        while not len(self.queue):
            status = self.response.status
            if status is not None:
                self.conn.forget(self)
                if status.ok:
                    return None
                raise GrpcCallError(status.code, status.message)
            self.wakeup.clear()
            await self.wakeup.wait()
        message, credit = self.queue.take()
        if credit:
            self.conn.give_back(self.stream_id, credit)
        return message

    def cancel(self) -> None:
        self.response.fail(CallStatus(StatusCode.CANCELLED, "cancelled by the client"))
        self.conn.reset(self)


class _Connection:
    """One HTTP/2 connection of a channel, its reader and its keepalive timer."""

    def __init__(
        self,
        reader: asyncio.StreamReader,
        writer: asyncio.StreamWriter,
        settings: ChannelSettings,
        scheme: str,
        authority: str,
    ) -> None:
        self.reader, self.writer = reader, writer
        self.settings, self.scheme, self.authority = settings, scheme, authority
        self.engine = _GrpcConnection(_SETTINGS)
        self.calls: dict[int, _Call] = {}
        self.failed: CallStatus | None = None
        self.retiring = False
        self.ready = asyncio.Event()
        self.idle = asyncio.Event()
        """No call is open (set again each time the last one ends)."""
        self.idle.set()
        keepalive = settings.keepalive
        loop = asyncio.get_running_loop()
        self._timer = LivenessTimer(
            LivenessSettings(
                preface_timeout=settings.connect_timeout,
                idle_timeout=0,
                keepalive_interval=keepalive.time,
                keepalive_timeout=keepalive.timeout,
            ),
            loop.time(),
        )
        self._lock = asyncio.Lock()
        self._wake_at = self._timer.next_at
        self._rearm = asyncio.Event()
        self._tasks = [
            loop.create_task(self._read_loop(), name=f"grpc {settings.target} reader"),
            loop.create_task(self._keepalive_loop(), name=f"grpc {settings.target} keepalive"),
        ]

    @property
    def usable(self) -> bool:
        return self.failed is None and not self.engine.draining and self.engine.can_open_stream

    # --- calls ----------------------------------------------------------------------------------------------

    async def open(self, path: str, headers: list[tuple[str, str]]) -> _Call:
        try:
            stream_id = self.engine.send_request("POST", self.scheme, self.authority, path, headers)
        except HboneError as exc:  # closed meanwhile, or the server allows no stream at all
            raise GrpcCallError(StatusCode.UNAVAILABLE, f"cannot open a call: {exc}") from None
        call = self.calls[stream_id] = _Call(self, stream_id, self.settings.max_receive_message)
        self.idle.clear()
        await self.flush()
        return call

    async def send(self, call: _Call, data: bytes, *, end: bool = False) -> None:
        if call.response.status is not None or not self.engine.is_open(call.stream_id):
            raise _ended(call.response.status)
        try:
            self.engine.send_data(call.stream_id, data)
            if end:
                self.engine.end_stream(call.stream_id)
        except HboneError as exc:
            raise GrpcCallError(StatusCode.INTERNAL, f"cannot send on the call: {exc}") from None
        await self.flush()
        while self.engine.pending_bytes(call.stream_id) and call.response.status is None:
            call.writable.clear()
            await call.writable.wait()
        if call.response.status is not None and not call.response.status.ok:
            raise _ended(call.response.status)

    def give_back(self, stream_id: int, credit: int) -> None:
        self.engine.consumed(stream_id, credit)
        self.flush_soon()

    def reset(self, call: _Call) -> None:
        if self.engine.is_open(call.stream_id):
            self.engine.reset_stream(call.stream_id, wire.CANCEL)
            self.flush_soon()
        call.finished()
        self.forget(call)

    def forget(self, call: _Call) -> None:
        self.calls.pop(call.stream_id, None)
        if not self.calls:
            self.idle.set()
        if not self.calls and (self.engine.draining or self.retiring):
            self.fail(CallStatus(StatusCode.UNAVAILABLE, "the connection drained"))

    def retire(self) -> None:
        """The channel dials another connection: this one ends with its last call (now, if it has none)."""
        self.retiring = True
        if not self.calls:
            self.fail(CallStatus(StatusCode.UNAVAILABLE, "the connection was retired"))

    # --- writing --------------------------------------------------------------------------------------------

    async def flush(self) -> None:
        async with self._lock:
            data = self.engine.data_to_send()
            if not data or self.writer.is_closing():
                return
            try:
                self.writer.write(data)
                await self.writer.drain()
            except (OSError, RuntimeError) as exc:
                self.fail(CallStatus(StatusCode.UNAVAILABLE, f"write failed: {exc or type(exc).__name__}"))

    def flush_soon(self) -> None:
        if self.failed is None:
            task = asyncio.get_running_loop().create_task(self.flush())
            self._tasks.append(task)
            task.add_done_callback(self._tasks.remove)

    # --- reading --------------------------------------------------------------------------------------------

    async def _read_loop(self) -> None:
        try:
            await self.flush()  # the preface and our SETTINGS
            while self.failed is None:
                data = await self.reader.read(_READ_SIZE)
                if not data:
                    self.fail(CallStatus(StatusCode.UNAVAILABLE, "the server closed the connection"))
                    break
                self._tick(heard=True)
                self.receive(data)
                await self.flush()
        except (OSError, EOFError) as exc:
            self.fail(CallStatus(StatusCode.UNAVAILABLE, f"read failed: {exc or type(exc).__name__}"))
        except Exception as exc:  # a bug of ours: the calls must end (rule 5), not hang on a dead reader
            log.warning("grpc %s: reader failed: %s: %s", self.settings.target, type(exc).__name__, exc)
            self.fail(CallStatus(StatusCode.INTERNAL, f"{type(exc).__name__}: {exc}"))

    def receive(self, data: bytes) -> None:
        for event in self.engine.receive_data(data):
            if isinstance(event, DataReceived):
                call = self.calls.get(event.stream_id)
                if call is None:
                    self.engine.consumed(event.stream_id, event.flow_length)
                    continue
                credit = call.queue.arrived(call.response.data(event.data), event.flow_length)
                if credit:
                    self.engine.consumed(event.stream_id, credit)
                self._settle(call)
            elif isinstance(event, ResponseReceived):
                if (call := self.calls.get(event.stream_id)) is not None:
                    call.response.head(event.status, event.headers)
                    self._settle(call)
            elif isinstance(event, TrailersReceived):
                if (call := self.calls.get(event.stream_id)) is not None:
                    call.response.trailers(event.headers)
                    self._settle(call)
            elif isinstance(event, StreamEnded):
                if (call := self.calls.get(event.stream_id)) is not None:
                    call.response.ended()
                    self._settle(call)
            elif isinstance(event, StreamWritable):
                if (call := self.calls.get(event.stream_id)) is not None:
                    call.writable.set()
            elif isinstance(event, StreamReset):
                if (call := self.calls.get(event.stream_id)) is not None:
                    call.response.reset(event.error_code, remote=event.remote)
                    call.finished()
            elif isinstance(event, PingAcknowledged):
                self._timer.acknowledged()
            elif isinstance(event, ConnectionDraining):
                log.info("grpc %s: the server is going away (%s)", self.settings.target, event.reason[:200])
                if not self.calls:
                    self.fail(CallStatus(StatusCode.UNAVAILABLE, "the connection drained"))
            elif isinstance(event, ConnectionTerminated):
                self.fail(CallStatus(StatusCode.UNAVAILABLE, f"connection ended: {event.reason[:200]}"))
        if self.engine.peer_ready:
            self.ready.set()

    def _settle(self, call: _Call) -> None:
        """Wake the call's consumer; a call over for its own reason (a refused message, a bad head) is reset."""
        status = call.response.status
        if status is not None and not status.ok and self.engine.is_open(call.stream_id):
            self.engine.reset_stream(call.stream_id, wire.CANCEL)
        call.finished() if status is not None else call.wakeup.set()

    # --- keepalive (rule 2) ---------------------------------------------------------------------------------

    def _tick(self, *, heard: bool) -> None:
        now = asyncio.get_running_loop().time()
        action = self._timer.due(
            now, heard=heard, ready=self.engine.peer_ready, idle_since=None, draining=self.engine.draining
        )
        if self._timer.next_at < self._wake_at:
            self._rearm.set()
        if isinstance(action, SendPing):
            self.engine.ping(action.payload)
            self.flush_soon()
        elif isinstance(action, Expire):
            late = "no HTTP/2 SETTINGS from the server" if action.expiry.value == "preface_timeout" else "keepalive"
            self.fail(CallStatus(StatusCode.UNAVAILABLE, f"the server went silent ({late})"))

    async def _keepalive_loop(self) -> None:
        loop = asyncio.get_running_loop()
        while self.failed is None:
            self._wake_at = self._timer.next_at
            self._rearm.clear()
            with contextlib.suppress(TimeoutError):
                async with asyncio.timeout_at(self._wake_at):
                    await self._rearm.wait()  # an earlier deadline than the one we sleep for
            if loop.time() >= self._wake_at:
                self._tick(heard=False)

    # --- ending ---------------------------------------------------------------------------------------------

    def fail(self, status: CallStatus) -> None:
        """End the connection: every call still open ends with ``status`` (rules 1 and 3)."""
        if self.failed is not None:
            return
        self.failed = status
        self.engine.close()
        for call in self.calls.values():
            call.response.fail(status)
            call.finished()
        self.calls.clear()
        self.ready.set()
        self.idle.set()
        with contextlib.suppress(Exception):
            data = self.engine.data_to_send()
            if data and not self.writer.is_closing():
                self.writer.write(data)  # our GOAWAY, best effort
        self.writer.transport.abort()
        current = asyncio.current_task()
        for task in self._tasks:
            if task is not current:
                task.cancel()

    async def aclose(self) -> None:
        self.fail(CallStatus(StatusCode.CANCELLED, "the channel was closed"))
        current = asyncio.current_task()
        tasks = [task for task in self._tasks if task is not current]
        if tasks:
            await asyncio.gather(*tasks, return_exceptions=True)


def _ended(status: CallStatus | None) -> GrpcCallError:
    if status is None or status.ok:
        return GrpcCallError(StatusCode.INTERNAL, "the call is already over")
    return GrpcCallError(status.code, status.message)


class GrpcChannel:
    """A gRPC channel to one target over our HTTP/2 engine (see the module rules)."""

    def __init__(self, settings: ChannelSettings) -> None:
        self.settings = settings
        self.host, self.port = split_target(settings.target)
        self._context = _client_context(settings.root_pem) if settings.root_pem is not None else None
        self._conn: _Connection | None = None
        self._draining: set[_Connection] = set()
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
        call: _Call | None = None
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

    async def _connection(self) -> _Connection:
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

    async def _dial(self) -> _Connection:
        self.dials += 1
        settings = self.settings
        server_name = settings.server_name or self.host
        conn: _Connection | None = None
        try:
            async with asyncio.timeout(settings.connect_timeout):
                if self._context is None:
                    reader, writer = await asyncio.open_connection(self.host, self.port, limit=_READ_SIZE)
                else:
                    reader, writer = await asyncio.open_connection(
                        self.host, self.port, ssl=self._context, server_hostname=server_name, limit=_READ_SIZE
                    )
                    protocol = writer.get_extra_info("ssl_object").selected_alpn_protocol()
                    if protocol != "h2":
                        writer.transport.abort()
                        raise GrpcCallError(
                            StatusCode.UNAVAILABLE, f"{settings.target} did not negotiate HTTP/2 (ALPN {protocol!r})"
                        )
                authority = settings.server_name or settings.target.removeprefix("dns:///")
                conn = _Connection(reader, writer, settings, "http" if self._context is None else "https", authority)
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
