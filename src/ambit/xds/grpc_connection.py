"""One HTTP/2 connection of a gRPC channel (:mod:`ambit.xds.grpc_channel`) and the calls on it: the asyncio shell.

Theory of operation: a :class:`GrpcConnection` joins a connected byte stream (TLS or TCP) to the engine
(:class:`~ambit.hbone.messages.Http2ClientConnection`, reading a graceful GOAWAY as RFC 9113's drain). One reader
task feeds the engine what the server sends and routes its events to the calls, whose outcome
:class:`~ambit.hbone.grpc_calls.CallResponse` decides and whose window credit
:class:`~ambit.hbone.grpc_calls.MessageQueue` decides (both sans-IO); one timer task runs
:class:`~ambit.hbone.liveness.LivenessTimer`; any task writes, under one lock, and the reader stops reading while
its writes back up. The channel's rules 2-5 are carried out here.

Invariants:

- ``calls`` holds exactly the calls whose consumer has not yet seen their end; a call leaves it when its consumer
  reads its status, when it is cancelled, and all at once when the connection fails.
- Once :attr:`GrpcConnection.failed` is set the connection is over: every call has a status, the transport is
  aborted and the tasks are cancelled; nothing is sent or read again.
- A connection that is draining or retiring ends with its last call.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging

from ambit.hbone import wire
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
from ambit.hbone.grpc_calls import CallResponse, CallStatus, MessageQueue, StatusCode, encode_message
from ambit.hbone.liveness import Expire, LivenessSettings, LivenessTimer, SendPing
from ambit.hbone.messages import Http2ClientConnection
from ambit.hbone.settings import HboneSettings
from ambit.xds.errors import GrpcCallError
from ambit.xds.keepalive import KeepaliveSettings

__all__ = ["ENGINE_SETTINGS", "READ_SIZE", "GrpcCall", "GrpcConnection"]

log = logging.getLogger("ambit.xds.grpc_connection")

READ_SIZE = 256 * 1024
ENGINE_SETTINGS = HboneSettings(
    stream_window=4 * 1024 * 1024, connection_window=8 * 1024 * 1024, max_concurrent_streams=100
)
"""A call's window is what a stalled consumer may hold beyond one message (``grpc_calls`` rule 6)."""


class _GrpcEngine(Http2ClientConnection):
    """The engine with RFC 9113's graceful GOAWAY (rule 3): grpcio's servers drain that way when they stop."""

    _graceful_goaway = True


class GrpcCall:
    """One call's stream as its consumer sees it."""

    __slots__ = ("conn", "queue", "response", "stream_id", "wakeup", "writable")

    def __init__(self, conn: GrpcConnection, stream_id: int, max_receive: int) -> None:
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
                raise GrpcCallError(status.code, status.message, status.pushback)
            self.wakeup.clear()
            await self.wakeup.wait()
        message, credit = self.queue.take()
        if credit:
            self.conn.give_back(self.stream_id, credit)
        return message

    def cancel(self) -> None:
        self.response.fail(CallStatus(StatusCode.CANCELLED, "cancelled by the client"))
        self.conn.reset(self)


class GrpcConnection:
    """One HTTP/2 connection of a channel, its reader and its keepalive timer."""

    def __init__(
        self,
        reader: asyncio.StreamReader,
        writer: asyncio.StreamWriter,
        *,
        target: str,
        scheme: str,
        authority: str,
        keepalive: KeepaliveSettings,
        max_receive_message: int,
        settings_timeout: float,
    ) -> None:
        self.reader, self.writer = reader, writer
        self.target, self.scheme, self.authority = target, scheme, authority
        self.max_receive_message = max_receive_message
        self.engine = _GrpcEngine(ENGINE_SETTINGS)
        self.calls: dict[int, GrpcCall] = {}
        self.failed: CallStatus | None = None
        self.retiring = False
        self.ready = asyncio.Event()
        self.idle = asyncio.Event()
        """No call is open (set again each time the last one ends)."""
        self.idle.set()
        loop = asyncio.get_running_loop()
        self._timer = LivenessTimer(
            LivenessSettings(
                preface_timeout=settings_timeout,
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
            loop.create_task(self._read_loop(), name=f"grpc {target} reader"),
            loop.create_task(self._keepalive_loop(), name=f"grpc {target} keepalive"),
        ]

    @property
    def usable(self) -> bool:
        return self.failed is None and not self.engine.draining and self.engine.can_open_stream

    # --- calls ----------------------------------------------------------------------------------------------

    async def open(self, path: str, headers: list[tuple[str, str]]) -> GrpcCall:
        try:
            stream_id = self.engine.send_request("POST", self.scheme, self.authority, path, headers)
        except HboneError as exc:  # closed meanwhile, or the server allows no stream at all
            raise GrpcCallError(StatusCode.UNAVAILABLE, f"cannot open a call: {exc}") from None
        call = self.calls[stream_id] = GrpcCall(self, stream_id, self.max_receive_message)
        self.idle.clear()
        await self.flush()
        return call

    async def send(self, call: GrpcCall, data: bytes, *, end: bool = False) -> None:
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

    def reset(self, call: GrpcCall) -> None:
        credit = call.queue.drop()  # the connection's window must not shrink by what nobody will read
        if credit:
            self.engine.consumed(call.stream_id, credit)
        if self.engine.is_open(call.stream_id):
            self.engine.reset_stream(call.stream_id, wire.CANCEL)
            self.flush_soon()
        call.finished()
        self.forget(call)

    def forget(self, call: GrpcCall) -> None:
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
                data = await self.reader.read(READ_SIZE)
                if not data:
                    self.fail(CallStatus(StatusCode.UNAVAILABLE, "the server closed the connection"))
                    break
                self._tick(heard=True)
                self.receive(data)
                await self.flush()
        except (OSError, EOFError) as exc:
            self.fail(CallStatus(StatusCode.UNAVAILABLE, f"read failed: {exc or type(exc).__name__}"))
        except Exception as exc:  # a bug of ours: the calls must end (rule 5), not hang on a dead reader
            log.warning("grpc %s: reader failed: %s: %s", self.target, type(exc).__name__, exc)
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
                log.info("grpc %s: the server is going away (%s)", self.target, event.reason[:200])
                if not self.calls:
                    self.fail(CallStatus(StatusCode.UNAVAILABLE, "the connection drained"))
            elif isinstance(event, ConnectionTerminated):
                self.fail(CallStatus(StatusCode.UNAVAILABLE, f"connection ended: {event.reason[:200]}"))
        if self.engine.peer_ready:
            self.ready.set()

    def _settle(self, call: GrpcCall) -> None:
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
    return GrpcCallError(status.code, status.message, status.pushback)
