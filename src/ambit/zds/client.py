"""The node proxy's ZDS client (spec §3.3): connect with back-off, drive one :class:`ProxySession`, start pods.

Theory of operation: one task connects to the agent's SEQPACKET socket, retrying with a capped, jittered
exponential back-off (10 ms doubling to 15 s, reset after each successful connection). On each connection the
session says hello, then every datagram goes through the session; :class:`OpenPodListeners` and
:class:`StopPodProxy` go to the :class:`PodHandler`, whose answer goes back into the session (ok → Ack, raise →
nack). The session outlives connections: pods keep running across reconnects until a snapshot drops them.
Whatever ends a connection, the task connects again: end of stream, a failed receive, a send that fails because the
agent closed its end while a pod command ran (EPIPE on the Del's ack: the agent stopping just after a pod was
deleted), or any other error (logged with its traceback, then the back-off): a node proxy without its agent can
take no pod, so the loop must never end but by ``aclose``. A connect that cannot even make its socket (EMFILE: the
proxy out of fds under load) is a failed connect like any other: the back-off, then again.

fd ownership: the netns fd of an Add is lent to the handler for the duration of ``open_listeners`` and closed here
afterwards; a handler that needs it longer dups it. When the handler fails, the pod is nacked and kept pending
(spec §3.3): the client keeps its own dup of the fd and retries every ``pending_retry`` seconds until the pod's
listeners open (the pod then counts as running, and readiness follows) or a Del or snapshot drops it.
"""

from __future__ import annotations

import asyncio
import logging
import os
import random
import socket
from collections.abc import Awaitable, Callable
from pathlib import Path
from typing import Protocol

from ambit.zds.commands import CloseConnection, OpenPodListeners, Output, StopPodProxy
from ambit.zds.errors import ProtocolError
from ambit.zds.events import SuccessorReported
from ambit.zds.protocol import WorkloadInfo
from ambit.zds.proxy import ProxySession
from ambit.zds.transport import ZdsSocket

log = logging.getLogger("ambit.zds.client")

BACKOFF_INITIAL = 0.01
BACKOFF_MAX = 15.0
PENDING_RETRY = 5.0
DEFECT_PAUSE = 1.0
"""Seconds before connecting again after a connection ended by an unexpected error (not a plain disconnect)."""
"""Seconds between retries of pods whose listeners failed (spec §3.3: kept pending, retried every 5 s)."""


class PodHandler(Protocol):
    """What the client starts and stops pods with (the workload manager)."""

    async def open_listeners(self, uid: str, info: WorkloadInfo, netns_fd: int) -> None:
        """Start the pod's proxy in the netns ``netns_fd`` (borrowed); raise to nack the Add."""
        ...

    async def stop(self, uid: str) -> None:
        """Stop the pod's proxy now."""
        ...


def backoff_delays(initial: float, cap: float, rng: random.Random) -> Callable[[], float]:
    """Successive delays: doubling from ``initial`` up to ``cap``, each scaled by a jitter in [0.5, 1.0]."""
    current = initial

    def next_delay() -> float:
        nonlocal current
        delay = current * (0.5 + rng.random() / 2)
        current = min(current * 2, cap)
        return delay

    return next_delay


class ZdsClient:
    """The node proxy's end of ZDS, reconnecting for as long as it runs."""

    def __init__(
        self,
        socket_path: str | os.PathLike[str],
        handler: PodHandler,
        *,
        sleep: Callable[[float], Awaitable[None]] = asyncio.sleep,
        backoff_initial: float = BACKOFF_INITIAL,
        backoff_max: float = BACKOFF_MAX,
        rng: random.Random | None = None,
        pending_retry: float = PENDING_RETRY,
        on_successor: Callable[[bool], None] | None = None,
    ) -> None:
        self.socket_path = Path(socket_path)
        self.handler = handler
        self.session = ProxySession()
        self.connects = 0
        """How many connections were made so far."""
        self._sleep = sleep
        self._backoff = (backoff_initial, backoff_max)
        self._rng = rng or random.Random()
        self._sock: ZdsSocket | None = None
        self._task: asyncio.Task[None] | None = None
        self._pending_retry = pending_retry
        self._pending: dict[str, tuple[WorkloadInfo, int]] = {}  # uid → (info, our dup of its netns fd)
        self._retry_task: asyncio.Task[None] | None = None
        self.retries = 0
        """Pending pods whose listeners a retry opened."""
        self._on_successor = on_successor
        """Told whether a later node proxy holds every pod, each time the agent says so (or the connection drops)."""

    @property
    def ready(self) -> bool:
        """Connected, the snapshot received and no pod pending (spec §3.3 readiness)."""
        return self._sock is not None and not self._sock.closed and self.session.ready

    @property
    def tasks(self) -> tuple[asyncio.Task[None], ...]:
        """The connection task and the pending pods' retry task, once started: only ``aclose`` ends them."""
        return tuple(task for task in (self._task, self._retry_task) if task is not None)

    async def start(self) -> None:
        self._task = asyncio.create_task(self._run(), name=f"zds client {self.socket_path}")
        self._retry_task = asyncio.create_task(self._retry_pending(), name=f"zds pending pods {self.socket_path}")

    async def aclose(self) -> None:
        tasks = self.tasks
        for task in tasks:
            task.cancel()
        await asyncio.gather(*tasks, return_exceptions=True)  # one that ended by an error was logged (supervision)
        self._task = self._retry_task = None
        if self._sock is not None:
            self._sock.close()
        for uid in list(self._pending):
            self._forget_pending(uid)

    def _forget_pending(self, uid: str) -> None:
        entry = self._pending.pop(uid, None)
        if entry is not None:
            os.close(entry[1])

    async def _retry_pending(self) -> None:
        """Every ``pending_retry`` seconds, try again the pods whose listeners failed; success makes them running."""
        while True:
            await asyncio.sleep(self._pending_retry)
            for uid, (info, fd) in list(self._pending.items()):
                try:
                    await self.handler.open_listeners(uid, info, fd)
                except Exception as exc:  # still failing: stays pending, retried later
                    log.info("pod %s: listeners still failing: %s", uid, exc)
                    continue
                if self._pending.get(uid, (None, -1))[1] == fd:
                    self._forget_pending(uid)
                    self.retries += 1
                    log.info("pod %s: listeners open after a retry", uid)
                    if self._sock is not None and not self._sock.closed:
                        try:
                            await self._apply(self._sock, self.session.listeners_opened(uid))
                        except OSError as exc:  # the agent is gone: the connection's reader reconnects
                            log.info("pod %s: could not tell the agent: %s", uid, exc)
                    else:
                        self.session.listeners_opened(uid)

    async def _run(self) -> None:
        delays = backoff_delays(*self._backoff, self._rng)
        while True:
            sock = await self._connect()
            if sock is None:
                delay = delays()
                log.debug("cannot reach %s, retrying in %.3fs", self.socket_path, delay)
                await self._sleep(delay)
                continue
            delays = backoff_delays(*self._backoff, self._rng)
            self.connects += 1
            self._sock = sock
            try:
                await self._serve(sock)
            except OSError as exc:  # e.g. an ack sent after the agent closed its end (EPIPE)
                log.info("connection to %s failed: %s", self.socket_path, exc)
            except Exception:  # a defect must not leave the node proxy without its agent for good
                log.exception("ZDS connection to %s ended by an unexpected error", self.socket_path)
                await self._sleep(min(DEFECT_PAUSE, self._backoff[1]))  # not a hot loop if it recurs
            finally:
                sock.close()
                self.session.connection_lost()
            log.info("disconnected from %s; reconnecting", self.socket_path)

    async def _connect(self) -> ZdsSocket | None:
        try:  # the socket itself too: a node proxy out of fds (EMFILE) under load tries again after the back-off
            raw = socket.socket(socket.AF_UNIX, socket.SOCK_SEQPACKET | socket.SOCK_CLOEXEC)
        except OSError as exc:
            log.warning("cannot make a socket for %s: %s", self.socket_path, exc)
            return None
        raw.setblocking(False)
        try:
            await asyncio.get_running_loop().sock_connect(raw, str(self.socket_path))
        except OSError:
            raw.close()
            return None
        return ZdsSocket(raw)

    async def _serve(self, sock: ZdsSocket) -> None:
        await self._apply(sock, self.session.connection_made())
        while not sock.closed:
            try:
                datagram = await sock.receive()
            except OSError as exc:
                log.info("receive failed: %s", exc)
                return
            if datagram is None:
                return
            await self._apply(sock, self.session.datagram_received(datagram))

    async def _apply(self, sock: ZdsSocket, outputs: list[Output]) -> None:
        """The one dispatch: transport commands to the socket, pod commands to the handler, events to the log."""
        pod_commands: list[OpenPodListeners | StopPodProxy] = []

        def handle(out: Output) -> None:
            match out:
                case OpenPodListeners() | StopPodProxy():
                    pod_commands.append(out)
                case CloseConnection(reason=reason):
                    log.warning("closing the ZDS connection: %s", reason)
                case SuccessorReported(ready=ready):
                    log.info("zds: the node agent says a successor %s", "holds every pod" if ready else "is gone")
                    if self._on_successor is not None:
                        self._on_successor(ready)
                case _:
                    log.debug("zds: %s", out)

        for out in outputs:
            await sock.apply([out], handle)
            while pod_commands:
                await self._apply(sock, await self._run_pod_command(pod_commands.pop(0)))

    async def _run_pod_command(self, command: OpenPodListeners | StopPodProxy) -> list[Output]:
        match command:
            case OpenPodListeners(uid=uid, info=info, fd=fd):
                self._forget_pending(uid)
                try:
                    await self.handler.open_listeners(uid, info, fd)
                except Exception as exc:  # any failure of one pod is a nack for that pod, never our crash
                    log.warning("pod %s: listeners failed: %s (retrying every %gs)", uid, exc, self._pending_retry)
                    self._pending[uid] = (info, os.dup(fd))
                    return self.session.listeners_failed(uid, str(exc)[:200] or type(exc).__name__)
                finally:
                    os.close(fd)
                return self.session.listeners_opened(uid)
            case StopPodProxy(uid=uid):
                self._forget_pending(uid)
                await self.handler.stop(uid)
                return []
        raise ProtocolError(f"unknown pod command {command!r}")
