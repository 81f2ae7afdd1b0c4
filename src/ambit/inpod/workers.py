"""A node proxy's worker processes (``--workers N``): more than one core for one node's pods.

Theory of operation: ztunnel serves a node with several worker threads sharing one state. A Python process has
one core for its event loop, so a node proxy started with ``workers > 1`` runs ``workers - 1`` more processes, each
a whole data path (its own workload state from the control plane or the local file, its own certificates and
connection pool) serving the same pods. Each opens its own SO_REUSEPORT listeners in every pod, beside the node
proxy's, and the kernel spreads each listener's new connections over them, as it does between a node proxy and
its successor during a hand-over.

The node agent sees only the node proxy (worker 0). The node proxy serves its workers a ZDS of its own: a
:class:`~ambit.zds.server.ZdsServer` with the fan-out rules (every worker gets every pod, and the node proxy's word
on a successor) on a socket in a fresh directory of mode 0700, so only root reaches it, as the agent's socket. A pod
the agent hands over is handed on once the node proxy's own listeners are open (:class:`FanOutPods`); a delete
goes to every worker.

Each worker is ``python -m ambit.cli.nodeproxy_worker`` (:mod:`ambit.inpod.worker_process`) holding one end of a
socketpair (:mod:`ambit.inpod.worker_channel`): the node proxy writes the worker's settings there first; the worker
then reports its metrics, which the node proxy adds to its own on ``/metrics``
(:meth:`~ambit.telemetry.metrics.ProxyMetrics.peer_report`). The worker opens no admin, stats or readiness endpoint
and no self-proxy listener; the end of the socketpair (the node proxy gone, even by SIGKILL) makes it drain and
exit.

Rules:
1. :meth:`WorkerGroup.start` opens the private ZDS server, then starts every worker; it does not wait for them:
   until a worker holds a pod, the node proxy's own listeners serve it.
2. A worker that exits while the group serves is started again after a back-off (1 s, doubling to 30 s; 1 s again
   after one that lived a minute). Its last metrics stay counted (:meth:`ProxyMetrics.peer_gone`).
3. :meth:`WorkerGroup.successor_changed` passes the node agent's word on a successor to every worker, whose drain
   bound then follows it as the node proxy's does.
4. :meth:`WorkerGroup.stop` (the node proxy's drain begins) tells each worker to drain
   (:data:`~ambit.inpod.worker_channel.DRAIN`, a word a worker may hear twice, never a second SIGTERM, which would
   cut its drain short): each drains its own connections under the same bounds, however long the node proxy's own
   connections last. :meth:`WorkerGroup.cut` passes on a drain cut short. :meth:`WorkerGroup.aclose` waits for them
   at most ``wait`` seconds, then kills what is left, and removes the private directory.
"""

from __future__ import annotations

import asyncio
import contextlib
import dataclasses
import logging
import shutil
import signal
import socket
import subprocess
import sys
import tempfile
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from ambit.inpod.settings import NodeProxySettings
from ambit.inpod.worker_channel import CUT, DRAIN, ChannelError, read_frame, say, write_settings
from ambit.telemetry.metrics import ProxyMetrics
from ambit.telemetry.peer_counts import PeerCountsError
from ambit.zds.client import PodHandler
from ambit.zds.errors import ZdsError
from ambit.zds.protocol import WorkloadInfo
from ambit.zds.server import ZdsServer

log = logging.getLogger("ambit.inpod.workers")

RESTART_FIRST = 1.0
RESTART_MAX = 30.0
LIVED_LONG = 60.0
"""A worker that ran this many seconds before it ended is started again after :data:`RESTART_FIRST`."""
ZDS_NAME = "zds"


@dataclass(slots=True)
class _Slot:
    index: int
    proc: asyncio.subprocess.Process | None = None
    writer: asyncio.StreamWriter | None = None
    """The control socket to the running worker, once its settings are written."""
    starts: int = 0
    task: asyncio.Task[None] | None = None


class WorkerGroup:
    """The node proxy's workers: started, kept running, told of pods and successors, stopped (rules 1-4)."""

    def __init__(
        self, settings: NodeProxySettings, metrics: ProxyMetrics, clock: Callable[[], float], *, python: str = ""
    ) -> None:
        self.settings = settings
        self.metrics = metrics
        self.clock = clock
        self.python = python or sys.executable
        self.slots = [_Slot(index) for index in range(1, settings.workers)]
        self.stopping = False
        self.directory: Path | None = None
        self.server: ZdsServer | None = None
        self._tasks: set[asyncio.Task[None]] = set()

    def worker_settings(self, zds_socket: Path) -> NodeProxySettings:
        """A worker's settings: the node proxy's, with the group's ZDS and nothing only the node proxy holds (no flow
        log either: only the node proxy's admin port serves one, so a worker's would be work per connection for
        nobody)."""
        return dataclasses.replace(
            self.settings,
            zds_socket=zds_socket,
            workers=1,
            worker=True,
            flow_log_size=0,
            notify_fd=None,
            own_pod=None,
            own_address=None,
            admin_token_file=None,
        )

    async def start(self) -> None:
        """Rule 1."""
        # The private directory goes where the process may write: its own /tmp first (a container's, gone with it),
        # else beside the agent's socket (a read-only root file system); 0700 and root's either way.
        for parent in (None, self.settings.zds_socket.parent):
            directory: Path | None = None
            try:
                directory = Path(tempfile.mkdtemp(prefix="ambit-workers-", dir=parent))
                server = ZdsServer(directory / ZDS_NAME, fan_out=True)
                await server.start()
            except OSError as exc:
                log.warning("node proxy workers: no private ZDS socket in %s: %s", directory or parent or "/tmp", exc)
                if directory is not None:
                    shutil.rmtree(directory, ignore_errors=True)
                continue
            self.directory, self.server = directory, server
            break
        else:
            log.error("node proxy workers: none started (no directory for their ZDS socket); this process serves alone")
            return
        for slot in self.slots:
            slot.task = asyncio.create_task(self._keep(slot), name=f"node proxy worker {slot.index}")
        log.info("node proxy workers: %d more process(es) serve every pod", len(self.slots))

    async def add(self, uid: str, info: WorkloadInfo, netns_fd: int) -> None:
        """Hand a pod to every worker (the server opens its own descriptor of the netns); never raises: the node
        proxy serves the pod either way."""
        if self.server is None or self.stopping:
            return
        workload = {"name": info.name, "namespace": info.namespace, "service_account": info.service_account}
        try:
            await self.server.add(uid, f"/proc/self/fd/{netns_fd}", workload)
        except (OSError, ZdsError) as exc:
            log.warning("pod %s not handed to the workers: %s", uid, exc)

    async def delete(self, uid: str) -> None:
        if self.server is not None:
            await self.server.delete(uid)

    def successor_changed(self, ready: bool) -> None:
        """Rule 3 (from the node proxy's ZDS callback: the word goes on in a task of its own)."""
        if self.server is None:
            return
        task = asyncio.create_task(self.server.set_successor(ready), name="node proxy workers: successor")
        self._tasks.add(task)
        task.add_done_callback(self._tasks.discard)

    def stop(self) -> None:
        """Rule 4: each worker drains (a worker already draining goes on as it was)."""
        self.stopping = True
        self._say(DRAIN)

    def cut(self) -> None:
        """Rule 4: the node proxy's drain was cut short; so is each worker's."""
        self.stopping = True
        self._say(CUT)

    def _say(self, word: bytes) -> None:
        for slot in self.slots:
            if slot.writer is not None:
                say(slot.writer, word)

    async def aclose(self, wait: float) -> None:
        """Rule 4: wait for the workers (at most ``wait`` seconds), kill what is left, close the server."""
        self.stop()
        tasks = [slot.task for slot in self.slots if slot.task is not None]
        if tasks:
            _, pending = await asyncio.wait(tasks, timeout=wait)
            if pending:
                log.warning("node proxy workers: %d still running after %g s: killed", len(pending), wait)
                for slot in self.slots:
                    _signal(slot.proc, signal.SIGKILL)
                await asyncio.wait(pending, timeout=10.0)
                for task in pending:
                    task.cancel()
        for task in list(self._tasks):
            task.cancel()
        if self.server is not None:
            await self.server.aclose()
        if self.directory is not None:
            shutil.rmtree(self.directory, ignore_errors=True)

    def to_dump(self) -> list[dict[str, Any]]:
        return [
            {"index": slot.index, "pid": slot.proc.pid if slot.proc else 0, "starts": slot.starts}
            for slot in self.slots
        ]

    async def _keep(self, slot: _Slot) -> None:
        """Rule 2."""
        delay = RESTART_FIRST
        while not self.stopping:
            began = self.clock()
            try:
                await self._run_once(slot)
            except (OSError, ChannelError) as exc:
                log.error("node proxy worker %d could not run: %s", slot.index, exc)
            if self.stopping:
                return
            delay = RESTART_FIRST if self.clock() - began >= LIVED_LONG else min(delay * 2, RESTART_MAX)
            log.warning("node proxy worker %d ended; starting it again in %g s", slot.index, delay)
            await asyncio.sleep(delay)

    async def _run_once(self, slot: _Slot) -> None:
        assert self.server is not None
        ours, theirs = socket.socketpair(socket.AF_UNIX, socket.SOCK_STREAM)
        try:
            proc = await asyncio.create_subprocess_exec(
                self.python,
                "-m",
                "ambit.cli.nodeproxy_worker",
                "--control-fd",
                str(theirs.fileno()),
                stdin=subprocess.DEVNULL,
                pass_fds=(theirs.fileno(),),
            )
        except BaseException:
            ours.close()
            raise
        finally:
            theirs.close()
        slot.proc = proc
        slot.starts += 1
        peer = f"worker-{slot.index}-{proc.pid}"
        log.info("node proxy worker %d started (pid %d)", slot.index, proc.pid)
        try:
            reader, writer = await asyncio.open_unix_connection(sock=ours)
        except BaseException:
            ours.close()
            _signal(proc, signal.SIGKILL)
            await proc.wait()
            raise
        try:
            await write_settings(writer, self.worker_settings(self.server.socket_path))
            slot.writer = writer
            if self.stopping:  # the node proxy began its drain while this worker started
                say(writer, DRAIN)
            await self._read_reports(reader, peer)
            status = await proc.wait()
            log.log(
                logging.INFO if self.stopping else logging.WARNING,
                "node proxy worker %d exited: %s",
                slot.index,
                status,
            )
        finally:
            slot.writer = None
            writer.close()
            with contextlib.suppress(OSError):
                await writer.wait_closed()
            if proc.returncode is None:
                _signal(proc, signal.SIGKILL)
                await proc.wait()
            self.metrics.peer_gone(peer)

    async def _read_reports(self, reader: asyncio.StreamReader, peer: str) -> None:
        """Each metrics report the worker sends, until it closes its end (it exits)."""
        while True:
            try:
                report = await read_frame(reader)
            except ChannelError as exc:
                log.warning("%s: %s", peer, exc)
                return
            if report is None:
                return
            try:
                self.metrics.peer_report(peer, report)
            except PeerCountsError as exc:
                log.warning("%s: metrics report refused: %s", peer, exc)


def _signal(proc: asyncio.subprocess.Process | None, sig: int) -> None:
    if proc is not None and proc.returncode is None:
        with contextlib.suppress(ProcessLookupError):
            proc.send_signal(sig)


class FanOutPods:
    """The node proxy's pod handler with workers: its own listeners first, then the same pod to every worker."""

    def __init__(self, own: PodHandler, group: WorkerGroup) -> None:
        self.own = own
        self.group = group

    async def open_listeners(self, uid: str, info: WorkloadInfo, netns_fd: int) -> None:
        await self.own.open_listeners(uid, info, netns_fd)  # a failure nacks the agent's Add, as without workers
        await self.group.add(uid, info, netns_fd)

    async def stop(self, uid: str) -> None:
        await self.own.stop(uid)
        await self.group.delete(uid)
