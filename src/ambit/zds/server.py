"""The node agent's ZDS server (spec §3.2, §3.3): a thin asyncio shell around one :class:`AgentHub`.

Theory of operation: the server listens on an ``AF_UNIX``/``SOCK_SEQPACKET`` socket (a stale path is unlinked
first; mode 0600). Each accepted node proxy gets a connection id, an :class:`AgentSession` from the hub and a reader
task. Every input (a datagram, a submission, the deadline timer) goes the same way: ask the hub, then perform its
outputs in order under one lock, then tell older node proxies whether a successor is live
(:meth:`AgentHub.tell_successors`), then re-arm the timer at the hub's deadline.

:meth:`ZdsServer.add` and :meth:`ZdsServer.delete` make the server a
:class:`ambit.cni.enrolment.NodeProxyLink`. ``add`` waits for the Ack of its Add on the connection it went to.
Before :meth:`ZdsServer.start` no node proxy can be connected: an ``add`` then only records the pod for the first
snapshot and returns (the agent builds its initial snapshot from the running pods this way before it serves, as
istio-cni does after a restart, so a node proxy that connects never gets a partial snapshot and drops listeners).

Invariants:
- the hub borrows netns fds, so the server owns one open fd per known pod (opened by ``add``, closed by
  ``delete``): a new connection's snapshot sends them later, perhaps seconds later. An fd replaced by a re-add is
  retired and closed once no session has anything queued or in flight (``hub.deadline is None``), so an fd number
  the hub may still send is never closed and reused under it.
- an ``add`` future is settled exactly once: by the Ack, the nack, the connection's end, or its own timeout.
- only ``aclose`` ends the accept task: a failed accept (EMFILE, ENFILE, ECONNABORTED) is logged and tried again
  after ``ACCEPT_RETRY``; a node agent that stopped accepting would leave its node without a node proxy for good.
- a connection's reader ends only with its connection: an unexpected error drops the connection (logged with its
  traceback) as a closed one is dropped, so its adds fail at once and the node proxy connects again.
"""

from __future__ import annotations

import asyncio
import contextlib
import functools
import logging
import os
import socket
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from ambit.zds.agent import REQUEST_TIMEOUT, AgentHub, PodEntry
from ambit.zds.commands import CloseConnection, Output
from ambit.zds.errors import ZdsError
from ambit.zds.events import ProtocolViolated, RequestAcked, RequestNacked, TimedOut
from ambit.zds.protocol import WorkloadInfo
from ambit.zds.transport import ZdsSocket

log = logging.getLogger("ambit.zds.server")

ADD_TIMEOUT = 2 * REQUEST_TIMEOUT
"""An Add may queue behind one other request (each with its own 5 s deadline) before its own ack."""
ACCEPT_RETRY = 0.1
"""Seconds before accepting again after a failed accept (EMFILE: the agent out of fds under load)."""


class ZdsLinkError(ZdsError):
    """The node proxy did not take a pod: it nacked, timed out, went away, or none is connected."""


@dataclass(slots=True)
class _Connection:
    sock: ZdsSocket
    task: asyncio.Task[None] | None = None
    waiters: dict[str, asyncio.Future[None]] = field(default_factory=dict)


def workload_info_from(workload: dict[str, Any]) -> WorkloadInfo:
    return WorkloadInfo(
        str(workload.get("name", "")), str(workload.get("namespace", "")), str(workload.get("service_account", ""))
    )


class ZdsServer:
    """The agent's end of ZDS: accepts node proxies and implements ``NodeProxyLink``."""

    def __init__(
        self, socket_path: str | os.PathLike[str], *, add_timeout: float = ADD_TIMEOUT, fan_out: bool = False
    ) -> None:
        self.socket_path = Path(socket_path)
        self.add_timeout = add_timeout
        self.fan_out = fan_out
        """A node proxy's server for its workers (the hub's fan-out rules): ``add`` goes to every connected
        proxy and returns without waiting for acks (a nack is logged)."""
        self.pods: dict[str, tuple[str, dict[str, Any]]] = {}
        """Every pod added and not deleted: uid -> (netns path, workload info)."""
        self._hub = AgentHub(fan_out=fan_out)
        self._fds: dict[str, int] = {}
        self._retired: list[int] = []
        self._conns: dict[int, _Connection] = {}
        self._next_id = 0
        self._lock = asyncio.Lock()
        self._listener: socket.socket | None = None
        self._accept_task: asyncio.Task[None] | None = None
        self._timer: asyncio.TimerHandle | None = None
        self._timer_tasks: set[asyncio.Task[None]] = set()

    @property
    def connections(self) -> int:
        return sum(1 for cid in self._conns if self._open(cid))

    async def start(self) -> None:
        with contextlib.suppress(FileNotFoundError):
            self.socket_path.unlink()
        listener = socket.socket(socket.AF_UNIX, socket.SOCK_SEQPACKET | socket.SOCK_CLOEXEC)
        old_umask = os.umask(0o177)  # never world-accessible, not even between bind and chmod
        try:
            listener.bind(str(self.socket_path))
        finally:
            os.umask(old_umask)
        self.socket_path.chmod(0o600)
        listener.listen(16)
        listener.setblocking(False)
        self._listener = listener
        self._accept_task = asyncio.create_task(self._accept_loop(), name=f"zds server {self.socket_path}")

    async def aclose(self) -> None:
        if self._accept_task is not None:
            self._accept_task.cancel()
            with contextlib.suppress(asyncio.CancelledError):
                await self._accept_task
        if self._listener is not None:
            self._listener.close()
            with contextlib.suppress(FileNotFoundError):
                self.socket_path.unlink()
        for cid in list(self._conns):
            await self._drop(cid, "server closing")
        if self._timer is not None:
            self._timer.cancel()
        for fd in [*self._fds.values(), *self._retired]:
            os.close(fd)
        self._fds.clear()
        self._retired.clear()

    async def add(self, pod_uid: str, netns_path: str, workload: dict[str, Any]) -> None:
        """Send the pod to the newest node proxy and wait for its Ack; raise :class:`ZdsLinkError` otherwise (a
        fan-out server: send it to every node proxy connected, and return).

        Before :meth:`start`, record the pod for the snapshot and return.
        """
        info = workload_info_from(workload)
        fd = os.open(netns_path, os.O_RDONLY | os.O_CLOEXEC)
        old = self._fds.pop(pod_uid, None)
        if old is not None:
            self._retired.append(old)
        self._fds[pod_uid] = fd
        self.pods[pod_uid] = (netns_path, dict(workload))
        if self.fan_out:
            async with self._lock:
                await self._perform(self._hub.pod_added(PodEntry(pod_uid, info, fd), self._now()))
            return
        newest = next((cid for cid in reversed(self._conns) if self._open(cid)), None)
        waiter: asyncio.Future[None] | None = None
        if newest is not None:
            waiter = asyncio.get_running_loop().create_future()
            previous = self._conns[newest].waiters.pop(pod_uid, None)
            if previous is not None and not previous.done():
                previous.set_exception(ZdsLinkError(f"pod {pod_uid} was added again"))
            self._conns[newest].waiters[pod_uid] = waiter
        async with self._lock:
            await self._perform(self._hub.pod_added(PodEntry(pod_uid, info, fd), self._now()))
        if waiter is None and self._listener is None:
            return  # not serving yet: the pod is in the snapshot every node proxy gets when it connects
        if waiter is None:
            raise ZdsLinkError(f"no node proxy is connected to {self.socket_path}")
        try:
            await asyncio.wait_for(waiter, self.add_timeout)
        except TimeoutError:
            raise ZdsLinkError(f"node proxy did not ack pod {pod_uid} in {self.add_timeout:g}s") from None

    async def delete(self, pod_uid: str) -> None:
        """Tell every node proxy the pod is gone (acks are not awaited: the pod is gone either way)."""
        self.pods.pop(pod_uid, None)
        async with self._lock:
            await self._perform(self._hub.pod_deleted(pod_uid, self._now()))
        fd = self._fds.pop(pod_uid, None)
        if fd is not None:
            self._retired.append(fd)  # a session may still hold it in a snapshot queue: see the invariants
        self._close_retired()

    async def set_successor(self, ready: bool) -> None:
        """A fan-out server's word to its proxies that asked for notices: a successor holds every pod (or not)."""
        async with self._lock:
            self._hub.set_successor(ready)
            await self._perform(self._hub.tell_successors(self._now()))

    def _open(self, cid: int) -> bool:
        session = self._hub.find_session(cid)
        return session is not None and not session.closed

    def _now(self) -> float:
        return asyncio.get_running_loop().time()

    async def _accept_loop(self) -> None:
        assert self._listener is not None
        loop = asyncio.get_running_loop()
        while True:
            try:
                sock, _ = await loop.sock_accept(self._listener)
            except OSError as exc:  # EMFILE and friends: the listener stays, the node proxy's connect waits
                log.warning("ZDS accept on %s failed: %s", self.socket_path, exc)
                await asyncio.sleep(ACCEPT_RETRY)
                continue
            self._next_id += 1
            cid = self._next_id
            conn = _Connection(ZdsSocket(sock))
            self._conns[cid] = conn
            self._hub.connect(cid, self._now())
            conn.task = asyncio.create_task(self._read_loop(cid, conn), name=f"zds server conn {cid}")
            self._rearm()
            log.info("node proxy connected (connection %d)", cid)

    async def _read_loop(self, cid: int, conn: _Connection) -> None:
        try:
            await self._read_datagrams(cid, conn)
        except Exception:  # a defect: drop this connection (its node proxy reconnects), never leave it unread
            log.exception("connection %d: ended by an unexpected error", cid)
            async with self._lock:
                await self._drop(cid, "an unexpected error")
                await self._perform(self._hub.tell_successors(self._now()))

    async def _read_datagrams(self, cid: int, conn: _Connection) -> None:
        while not conn.sock.closed:
            try:
                datagram = await conn.sock.receive()
            except OSError as exc:
                datagram = None
                log.info("connection %d: receive failed: %s", cid, exc)
            async with self._lock:
                session = self._hub.find_session(cid)
                if datagram is None or session is None:
                    await self._drop(cid, "connection closed by the node proxy")
                    await self._perform(self._hub.tell_successors(self._now()))
                    return
                await self._perform([(cid, out) for out in session.datagram_received(datagram, self._now())])

    async def _perform(self, outputs: list[tuple[int, Output]]) -> None:
        """Do what the hub asked, in order; callers hold the lock. Then re-arm the timer."""
        closed: list[int] = []
        for cid, out in outputs:
            conn = self._conns.get(cid)
            if conn is None:
                continue
            try:
                await conn.sock.apply([out], functools.partial(self._on_event, cid))
            except OSError as exc:
                log.warning("connection %d: send failed: %s", cid, exc)
                conn.sock.close()
            if conn.sock.closed:
                closed.append(cid)
        for cid in closed:
            await self._drop(cid, "connection closed")
        notices = self._hub.tell_successors(self._now())  # a session went live or away: older ones may care
        if notices:
            await self._perform(notices)
        self._rearm()

    def _on_event(self, cid: int, event: Output) -> None:
        waiters = self._conns[cid].waiters
        match event:
            case RequestAcked(kind="add", uid=uid):
                _settle(waiters.pop(uid, None), None)
            case RequestNacked(kind="add", uid=uid, error=error) if uid in waiters:
                _settle(waiters.pop(uid), ZdsLinkError(f"node proxy refused pod {uid}: {error}"))
            case RequestNacked(kind=kind, uid=uid, error=error):
                log.warning("connection %d: node proxy nacked %s %s: %s", cid, kind, uid, error)
            case TimedOut(waiting_for=what):
                log.warning("connection %d: timed out waiting for %s", cid, what)
            case ProtocolViolated(error=error):
                log.warning("connection %d: %s", cid, error)
            case CloseConnection(reason=reason):
                log.info("connection %d closing: %s", cid, reason)
            case _:
                log.debug("connection %d: %s", cid, event)

    async def _drop(self, cid: int, reason: str) -> None:
        conn = self._conns.pop(cid, None)
        if conn is None:
            return
        self._hub.disconnect(cid)
        conn.sock.close()
        for uid, waiter in conn.waiters.items():
            _settle(waiter, ZdsLinkError(f"node proxy went away before acking pod {uid}: {reason}"))
        if conn.task is not None and conn.task is not asyncio.current_task():
            conn.task.cancel()
        log.info("connection %d dropped: %s", cid, reason)
        self._close_retired()

    def _close_retired(self) -> None:
        if self._hub.deadline is None:
            for fd in self._retired:
                os.close(fd)
            self._retired.clear()

    def _rearm(self) -> None:
        if self._timer is not None:
            self._timer.cancel()
            self._timer = None
        self._close_retired()
        deadline = self._hub.deadline
        if deadline is not None:
            loop = asyncio.get_running_loop()
            self._timer = loop.call_at(deadline, self._spawn_timer_task)

    def _spawn_timer_task(self) -> None:
        task = asyncio.get_running_loop().create_task(self._timer_fired(), name=f"zds server timer {self.socket_path}")
        self._timer_tasks.add(task)
        task.add_done_callback(self._timer_tasks.discard)

    async def _timer_fired(self) -> None:
        async with self._lock:
            await self._perform(self._hub.timer_fired(self._now()))


def _settle(waiter: asyncio.Future[None] | None, error: Exception | None) -> None:
    if waiter is None or waiter.done():
        return
    if error is None:
        waiter.set_result(None)
    else:
        waiter.set_exception(error)
