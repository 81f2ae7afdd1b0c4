"""The kubelet's port-forward shell: one SPDY session (in WebSocket messages) relayed to a pod's local ports.

Theory of operation. :class:`PortForwardRelay` feeds the session's binary messages to a
:class:`~ambit.k8s.portforward.PortForwardSession` and carries out its commands: it dials the pod through a
:class:`PodDialer`, writes the client's bytes to the pod, and runs one pump per connection that reads the pod and
reports its bytes back; whatever the session then has to send goes out as one binary message, under a lock, so
frames leave in the order their header blocks were compressed.

Rules:
1. A port is dialled inside the pod's network namespace at ``127.0.0.1``, then ``::1`` (kube connects to localhost
   there). :class:`NetnsDialer` makes the socket on a short-lived thread of its own that ``setns``'d into the pod
   (a socket keeps the namespace it was made in; the thread dies with the namespace change instead of returning to
   a pool); a refusal or timeout of both families is :class:`PodDialError`, which the session words as kube does.
2. Bounded buffers: a pump reads at most :data:`CHUNK` bytes and the next only once the WebSocket took the last
   message; the client's bytes are written to the pod and drained before the next message is read, so a pod that
   does not read stalls its session (as it stalls kube's) instead of growing our memory, until the client leaves.
3. The session ending (GOAWAY, a protocol error, the WebSocket closing) closes every connection and the WebSocket.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import os
import socket
import threading
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from typing import Protocol

from aiohttp import WSMsgType, web

from ambit.errors import AmbitError
from ambit.k8s import portforward as pf
from ambit.proxy.sockets import enter_netns

log = logging.getLogger("ambit.lab.kubelet.portforward")

CHUNK = 32 * 1024
CONNECT_TIMEOUT = 5.0


class PodDialError(AmbitError):
    """Nothing accepted the connection in the pod; the errors of each address family, as kube reports them."""

    def __init__(self, netns: str, ipv4_error: str, ipv6_error: str) -> None:
        super().__init__(f"{netns}: {ipv4_error}; {ipv6_error}")
        self.netns = netns
        self.ipv4_error = ipv4_error
        self.ipv6_error = ipv6_error


class PodDialer(Protocol):
    """Connects to a port on a pod's localhost (the seam: the lab's is :class:`NetnsDialer`); raises
    :class:`PodDialError`."""

    async def dial(self, pod_uid: str, port: int) -> socket.socket: ...


def _dial_here(port: int, timeout: float) -> tuple[socket.socket | None, str, str]:
    """Rule 1's two attempts from the calling thread's namespace: a connected socket, or each family's error."""
    errors = []
    for family, host, net in ((socket.AF_INET, "127.0.0.1", "tcp4"), (socket.AF_INET6, "::1", "tcp6")):
        sock = socket.socket(family, socket.SOCK_STREAM | socket.SOCK_CLOEXEC)
        sock.settimeout(timeout)
        where = f"{host}:{port}" if family == socket.AF_INET else f"[{host}]:{port}"
        try:
            sock.connect((host, port))
        except OSError as exc:
            sock.close()
            why = "i/o timeout" if isinstance(exc, TimeoutError) else (exc.strerror or str(exc)).lower()
            errors.append(f"dial {net} {where}: connect: {why}")
            continue
        sock.setblocking(False)
        return sock, "", ""
    return None, errors[0], errors[1]


@dataclass(frozen=True, slots=True)
class NetnsDialer:
    """Rule 1 in the lab: ``netns_path(uid)`` names the pod's namespace (``/run/netns/<name>``)."""

    netns_path: Callable[[str], str]
    timeout: float = CONNECT_TIMEOUT

    async def dial(self, pod_uid: str, port: int) -> socket.socket:
        path = self.netns_path(pod_uid)
        loop = asyncio.get_running_loop()
        done: asyncio.Future[tuple[socket.socket | None, str, str]] = loop.create_future()

        def settle(result: tuple[socket.socket | None, str, str] | BaseException) -> None:
            if done.cancelled():
                if not isinstance(result, BaseException) and result[0] is not None:
                    result[0].close()
            elif isinstance(result, BaseException):
                done.set_exception(result)
            else:
                done.set_result(result)

        def run() -> None:
            result: tuple[socket.socket | None, str, str] | BaseException
            try:
                fd = os.open(path, os.O_RDONLY | os.O_CLOEXEC)
                try:
                    enter_netns(fd)
                finally:
                    os.close(fd)
                result = _dial_here(port, self.timeout)
            except OSError as exc:
                result = PodDialError(path, f"cannot enter the namespace: {exc.strerror or exc}", "-")
            with contextlib.suppress(RuntimeError):  # the loop is gone: nobody waits
                loop.call_soon_threadsafe(settle, result)

        threading.Thread(target=run, name=f"portforward dial {pod_uid}:{port}", daemon=True).start()
        sock, ipv4_error, ipv6_error = await done
        if sock is None:
            raise PodDialError(path, ipv4_error, ipv6_error)
        return sock


@dataclass(frozen=True, slots=True)
class LocalDialer:
    """Rule 1 from the caller's own namespace, ``ports`` mapping a pod's port to a local one (tests)."""

    ports: dict[int, int] = field(default_factory=dict)

    async def dial(self, pod_uid: str, port: int) -> socket.socket:
        sock, ipv4_error, ipv6_error = await asyncio.to_thread(_dial_here, self.ports.get(port, port), CONNECT_TIMEOUT)
        if sock is None:
            raise PodDialError(f"local:{pod_uid}", ipv4_error, ipv6_error)
        return sock


class _ClientGone(Exception):
    """The session's client left while the relay waited on a pod (a signal inside the relay, never raised out)."""


@dataclass(slots=True)
class _Connection:
    writer: asyncio.StreamWriter
    pump: asyncio.Task[None]


class PortForwardRelay:
    """One session's relay (rules 2 and 3)."""

    def __init__(
        self,
        ws: web.WebSocketResponse,
        pod_uid: str,
        dialer: PodDialer,
        *,
        max_streams: int,
        client_gone: Callable[[], bool],
        poll_interval: float = 0.25,
    ) -> None:
        self.ws = ws
        self.pod_uid = pod_uid
        self.dialer = dialer
        self.client_gone = client_gone
        """Whether the client's connection is gone (checked while a pod is slow to take the client's bytes)."""
        self.poll_interval = poll_interval
        self.session = pf.PortForwardSession(max_streams=max_streams)
        self._connections: dict[str, _Connection] = {}
        self._send_lock = asyncio.Lock()

    async def run(self) -> None:
        try:
            async for msg in self.ws:
                if msg.type is not WSMsgType.BINARY:
                    continue
                await self._carry_out(self.session.receive(msg.data))
                await self._flush()
                if self.session.ended:
                    break
            else:
                await self._carry_out(self.session.close())
        except _ClientGone:
            log.debug("port-forward to pod %s: the client left while the pod was not reading", self.pod_uid)
        finally:
            for request_id in list(self._connections):
                await self._close(request_id)
            with contextlib.suppress(ConnectionResetError):
                await self._flush()
                await self.ws.close()

    async def _flush(self) -> None:
        async with self._send_lock:
            data = self.session.data_to_send()
            if data and not self.ws.closed:
                await self.ws.send_bytes(data)

    async def _carry_out(self, commands: Sequence[pf.Command]) -> None:
        for command in commands:
            if isinstance(command, pf.OpenConnection):
                await self._open(command.request_id, command.port)
            elif isinstance(command, pf.SendToPod):
                connection = self._connections.get(command.request_id)
                if connection is not None and not connection.writer.is_closing():
                    connection.writer.write(command.data)
                    await self._drain(connection.writer)
            elif isinstance(command, pf.ShutdownPodWrite):
                connection = self._connections.get(command.request_id)
                if connection is not None and connection.writer.can_write_eof():
                    with contextlib.suppress(OSError):
                        connection.writer.write_eof()
            elif isinstance(command, pf.CloseConnection):
                await self._close(command.request_id)
            elif isinstance(command, pf.SessionEnded):
                log.debug("port-forward to pod %s: session ended: %s", self.pod_uid, command.reason)
            else:  # pragma: no cover - the union is exhaustive
                raise TypeError(f"unknown command {command!r}")

    async def _drain(self, writer: asyncio.StreamWriter) -> None:
        """Wait until the pod took the client's bytes (rule 2), or raise :class:`_ClientGone` if the client left
        meanwhile (a pod that never reads must not hold its session after the client went)."""
        drain = asyncio.ensure_future(writer.drain())
        try:
            while True:
                done, _ = await asyncio.wait([drain], timeout=self.poll_interval)
                if done:
                    with contextlib.suppress(ConnectionResetError, BrokenPipeError):
                        drain.result()
                    return
                if self.client_gone():
                    raise _ClientGone
        finally:
            if not drain.done():
                drain.cancel()
                with contextlib.suppress(asyncio.CancelledError, ConnectionResetError, BrokenPipeError):
                    await drain

    async def _open(self, request_id: str, port: int) -> None:
        try:
            sock = await self.dialer.dial(self.pod_uid, port)
        except PodDialError as exc:
            message = pf.forward_error(port, self.pod_uid, exc.netns, exc.ipv4_error, exc.ipv6_error)
            log.info("port-forward to pod %s: %s", self.pod_uid, message)
            await self._carry_out(self.session.connect_failed(request_id, message))
            return
        reader, writer = await asyncio.open_connection(sock=sock, limit=CHUNK)
        pump = asyncio.get_running_loop().create_task(
            self._pump(request_id, reader), name=f"portforward pod {self.pod_uid}:{port} request {request_id}"
        )
        self._connections[request_id] = _Connection(writer, pump)

    async def _pump(self, request_id: str, reader: asyncio.StreamReader) -> None:
        with contextlib.suppress(ConnectionResetError, OSError):
            while chunk := await reader.read(CHUNK):
                self.session.pod_data(request_id, chunk)
                await self._flush()
        for command in self.session.pod_closed(request_id):  # only this pump's CloseConnection: no self-cancel
            if isinstance(command, pf.CloseConnection):
                connection = self._connections.pop(command.request_id, None)
                if connection is not None:
                    connection.writer.close()
        with contextlib.suppress(ConnectionResetError):
            await self._flush()

    async def _close(self, request_id: str) -> None:
        connection = self._connections.pop(request_id, None)
        if connection is None:
            return
        if connection.writer.transport.get_write_buffer_size():
            connection.writer.transport.abort()  # a pod that stopped reading: what it never took is dropped
        else:
            connection.writer.close()
        if connection.pump is not asyncio.current_task():
            connection.pump.cancel()
            with contextlib.suppress(asyncio.CancelledError, ConnectionResetError, OSError):
                await connection.pump
