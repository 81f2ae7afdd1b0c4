"""``ambit lab supervise``: start the mesh's daemons and start them again when they die.

Theory of operation: the supervisor is the parent of the lab's control plane (root namespace, on the lab bridge)
and of every node agent and node proxy (``ambit lab up`` starts the supervisor, not the daemons), so it learns of a
death by ``wait``, not by polling. Node proxies start once their credentials exist (:mod:`ambit.lab.mesh.identity`).
Each node daemon runs inside its node's network namespace through ``nsenter --net=/run/netns/<node netns>``
(nsenter execs, so the pid is the daemon's), in a session of its own, with its output appended to
``nodes/<node>/<what>.log``, and is noted in the lab record right after each start (as ``lab up`` notes its
processes), so that ``ambit lab down`` removes it whoever started it.

Rules (2 and 3 are :class:`ambit.lab.runtime.backoff.RestartBackoff`'s, with :class:`SupervisorSettings`):

1. A daemon that exits, for whatever reason, is started again after a delay.
2. The first delay is ``initial`` (1 s); each further one doubles, up to ``maximum`` (30 s).
3. A daemon that ran at least ``stable`` seconds before it died starts the sequence over (a crash an hour after
   the last one is not a crash loop).
4. On SIGTERM or SIGINT the supervisor stops restarting, sends SIGTERM to every daemon (draining ones too), waits
   ``term_grace`` seconds, kills what is left, and exits.
5. Hand-over (:meth:`Supervisor.hand_over`, a rolling restart without a gap): a daemon that can tell when it is
   ready (``notify``: node proxies, ``--notify-fd``) is started a second time beside its running process. Once the
   new process writes ``READY=1`` (within ``handover_ready`` seconds) it becomes the daemon's process and the old
   one gets SIGTERM: it drains and exits on its own, and that exit is not a death (rule 1 does not apply). A new
   process that exits or is not ready in time is stopped, and the old one keeps running: the hand-over failed.
   One hand-over per daemon at a time.

The lab's tools ask for a hand-over over a unix socket (:mod:`ambit.lab.cluster.handover`, ``ambit lab restart``).

Extra flags: a daemon's command line is computed at each start, not once. A node proxy's gets the flags found in
``<lab dir>/mesh/nodeproxy-flags`` at that moment appended (one flag per line, e.g. ``--pool-max-streams=1``;
blank lines and ``#`` comments skipped; no file, no flags). So a benchmark changes the node proxies' settings by
writing that file and sending SIGTERM to the proxies (rule 1 starts them again, with the new flags), and goes
back by removing the file and doing the same. The file is read as it is, never parsed further: a bad flag makes
the daemon exit at start-up, which shows in its log and in the restart count.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import os
import signal
import subprocess
import sys
import time
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path

from ambit.commands import process_start_time
from ambit.errors import AmbitError
from ambit.lab.cluster.record import Record
from ambit.lab.network.topology import Topology
from ambit.lab.runtime.backoff import RestartBackoff

log = logging.getLogger("ambit.lab.cluster.supervisor")

MESH_DAEMONS = ("nodeagent", "nodeproxy")
NODEPROXY_FLAGS_FILE = "nodeproxy-flags"
"""Under ``<lab dir>/mesh/``: extra flags for every node proxy, read at each (re)start (module docstring)."""


@dataclass(frozen=True, slots=True)
class SupervisorSettings:
    initial: float = 1.0
    """The first restart delay, in seconds."""
    maximum: float = 30.0
    """The longest restart delay, in seconds."""
    stable: float = 30.0
    """A daemon that ran this long before dying is restarted after ``initial`` again."""
    term_grace: float = 5.0
    """Seconds between SIGTERM and SIGKILL when the supervisor stops."""
    handover_ready: float = 60.0
    """Seconds a hand-over waits for the new process to be ready (rule 5)."""


class SupervisorError(AmbitError):
    """A request the supervisor cannot carry out (a hand-over of an unknown daemon, or one that failed)."""


@dataclass(frozen=True, slots=True)
class Daemon:
    """One process to keep running."""

    what: str
    """What the lab record calls it, e.g. ``nodeproxy node-1``."""
    argv: tuple[str, ...]
    log: Path
    flags_file: Path | None = None
    """Extra flags appended to ``argv`` at each start, one a line (absent file: none)."""
    env: tuple[tuple[str, str], ...] = ()
    """Added to the supervisor's environment for this daemon."""
    notify: bool = False
    """Takes ``--notify-fd FD`` and writes ``READY=1`` there once ready: it can be handed over (rule 5)."""

    def command(self) -> tuple[str, ...]:
        """The command line for a start now: ``argv`` and the flags the flags file holds at this moment."""
        return (*self.argv, *read_flags(self.flags_file)) if self.flags_file is not None else self.argv


def read_flags(path: Path) -> tuple[str, ...]:
    """One flag per non-blank line of ``path``, ``#`` lines skipped; none if the file is absent or unreadable."""
    try:
        text = path.read_text()
    except FileNotFoundError:
        return ()
    except (OSError, UnicodeDecodeError) as exc:
        log.warning("ignoring the flags in %s: %s", path, exc)
        return ()
    lines = (line.strip() for line in text.splitlines())
    return tuple(line for line in lines if line and not line.startswith("#"))


def daemon_backoff(settings: SupervisorSettings) -> RestartBackoff:
    """The restart delays of one daemon (rules 2 and 3): the first restart waits ``initial``."""
    return RestartBackoff(settings.initial, settings.maximum, reset_after=settings.stable)


NODEPROXY_ENV = (("CONNECTION_TERMINATION_DEADLINE", "25s"),)
"""As the ztunnel DaemonSet (deploy/base/ztunnel): a node proxy stopped with no successor drains for 25 s at most;
one whose successor the node agent announced (a hand-over) keeps its connections until they end, up to the default
``--drain-max`` (nothing here kills a draining proxy before the supervisor itself stops)."""
READY_LINE = b"READY=1"

CONTROL_PLANE_PORT = 15012
WEBHOOK_PORT = 15017
MONITORING_PORT = 15014


def control_plane_daemon(topology: Topology) -> Daemon:
    """The control plane, in the root namespace on the lab bridge, signing with the lab's plug-in CA."""
    from ambit.identity.localca import ROOT_NAME
    from ambit.lab.mesh.accounts import CONTROL_PLANE_ACCOUNT, kubeconfig_path
    from ambit.lab.network.topology import BRIDGE_ADDRESS

    ca = topology.mesh_ca_dir
    argv = (
        sys.executable, "-m", "ambit.cli", "controlplane",
        "--lab-dir", str(topology.path),
        "--kubeconfig", str(kubeconfig_path(topology, CONTROL_PLANE_ACCOUNT)),
        "--listen", f"{BRIDGE_ADDRESS}:{CONTROL_PLANE_PORT}",
        "--webhook-port", str(WEBHOOK_PORT),
        "--monitoring-port", str(MONITORING_PORT),
        "--san", BRIDGE_ADDRESS,
        "--plugin-cert", str(ca / f"{ROOT_NAME}.crt"),
        "--plugin-key", str(ca / f"{ROOT_NAME}.key"),
        "--enable-dry-run",
        # Waypoint pods reach the control plane where every lab pod reaches the API server: the bridge address
        # (the serving certificate names it); the lab runs commands, not images.
        "--waypoint-xds-address", f"{BRIDGE_ADDRESS}:{CONTROL_PLANE_PORT}",
        "--waypoint-image-pull-policy", "Never",
    )  # fmt: skip
    return Daemon("controlplane", argv, topology.path / "logs" / "controlplane.log")


def mesh_daemons(topology: Topology, *, what: tuple[str, ...] = MESH_DAEMONS) -> list[Daemon]:
    """The node agent and node proxy of every node (or those named in ``what``)."""
    from ambit.lab.mesh.accounts import NODE_AGENT_ACCOUNT, kubeconfig_path
    from ambit.lab.mesh.identity import root_file, token_file
    from ambit.lab.network.topology import BRIDGE_ADDRESS

    out: list[Daemon] = []
    directory = str(topology.path)
    control_plane = f"{BRIDGE_ADDRESS}:{CONTROL_PLANE_PORT}"
    for node in topology.all_nodes():
        for daemon in what:
            args = [daemon, "--node", node.name, "--lab-dir", directory]
            if daemon == "nodeagent":
                args += ["--kubeconfig", str(kubeconfig_path(topology, NODE_AGENT_ACCOUNT))]
            if daemon == "nodeproxy":
                args += [
                    "--xds-address", control_plane,
                    "--ca-address", control_plane,
                    "--root-cert", str(root_file(topology, node.name)),
                    "--token", str(token_file(topology, node.name)),
                ]  # fmt: skip
            # nsenter, not `ip netns exec`: the daemon must stay in the root mount namespace (pod namespaces are
            # bind mounts under /run/netns).
            argv = ("nsenter", f"--net=/run/netns/{node.netns}", "--", sys.executable, "-m", "ambit.cli", *args)
            log_file = topology.node_dir(node.name) / f"{daemon}.log"
            if daemon == "nodeproxy":
                flags = topology.path / "mesh" / NODEPROXY_FLAGS_FILE
                out.append(Daemon(f"{daemon} {node.name}", argv, log_file, flags, NODEPROXY_ENV, notify=True))
            else:
                out.append(Daemon(f"{daemon} {node.name}", argv, log_file))
    return out


class Supervisor:
    """Keeps ``daemons`` running until :meth:`aclose`; ``async with`` it, or ``start()`` then ``aclose()``."""

    def __init__(
        self,
        daemons: list[Daemon],
        record: Record | None,
        settings: SupervisorSettings | None = None,
        *,
        clock: Callable[[], float] = time.monotonic,
    ) -> None:
        self.daemons = daemons
        self.record = record
        self.settings = settings or SupervisorSettings()
        self.restarts: dict[str, int] = {d.what: 0 for d in daemons}
        self.pids: dict[str, int] = {}
        self._clock = clock
        self._tasks: list[asyncio.Task[None]] = []
        self._procs: dict[str, asyncio.subprocess.Process] = {}
        self._replaced: dict[str, asyncio.Event] = {}
        """Set when a hand-over gave the daemon a new process: its keeper waits for that one from then on."""
        self._draining: dict[int, asyncio.subprocess.Process] = {}
        """Processes handed over and told to stop, by pid, until they exit."""
        self._handing_over: set[str] = set()

    def start(self) -> None:
        for daemon in self.daemons:
            self._supervise(daemon)

    def add(self, daemons: list[Daemon]) -> None:
        """Supervise more daemons from now on (the node proxies, once their credentials exist)."""
        for daemon in daemons:
            self.daemons.append(daemon)
            self.restarts[daemon.what] = 0
            self._supervise(daemon)

    def _supervise(self, daemon: Daemon) -> None:
        task = asyncio.get_running_loop().create_task(self._keep(daemon), name=f"supervise {daemon.what}")
        self._tasks.append(task)

    async def _keep(self, daemon: Daemon) -> None:
        backoff = daemon_backoff(self.settings)
        while True:
            started = self._clock()
            try:
                proc = await self._spawn(daemon)
            except OSError as exc:
                log.error("cannot start %s: %s", daemon.what, exc)
            else:
                self._procs[daemon.what] = proc
                self.pids[daemon.what] = proc.pid
                proc, code = await self._until_exit(daemon.what, proc)
                self._procs.pop(daemon.what, None)
                log.warning("%s (pid %d) exited with %s", daemon.what, proc.pid, _describe(code))
            delay = backoff.delay_after_exit(started, self._clock())
            log.info("starting %s again in %.0f s", daemon.what, delay)
            await asyncio.sleep(delay)
            self.restarts[daemon.what] += 1

    async def _until_exit(self, what: str, proc: asyncio.subprocess.Process) -> tuple[asyncio.subprocess.Process, int]:
        """Wait until the daemon's process exits, following hand-overs to the process that took over (rule 5)."""
        while True:
            replaced = self._replaced.setdefault(what, asyncio.Event())
            exited = asyncio.ensure_future(proc.wait())
            swapped = asyncio.ensure_future(replaced.wait())
            try:
                await asyncio.wait({exited, swapped}, return_when=asyncio.FIRST_COMPLETED)
            finally:
                swapped.cancel()
                if not exited.done():
                    exited.cancel()
            current = self._procs.get(what)
            if current is not None and current is not proc:
                replaced.clear()
                proc = current
                continue
            return proc, exited.result()

    async def hand_over(self, what: str) -> str:
        """Rule 5: start ``what`` again beside its running process, and stop the old one once the new one is
        ready. Returns what happened in one line; raises :class:`SupervisorError` when it cannot or did not."""
        daemon = next((d for d in self.daemons if d.what == what), None)
        if daemon is None:
            known = ", ".join(d.what for d in self.daemons if d.notify) or "none"
            raise SupervisorError(f"no daemon {what!r} to hand over (these can be: {known})")
        if not daemon.notify:
            raise SupervisorError(f"{what} cannot be handed over: it does not say when it is ready")
        old = self._procs.get(what)
        if old is None or old.returncode is not None:
            raise SupervisorError(f"{what} is not running now (it is being restarted): nothing to hand over")
        if what in self._handing_over:
            raise SupervisorError(f"a hand-over of {what} is already under way")
        self._handing_over.add(what)
        try:
            started = self._clock()
            new = await self._start_ready(daemon)
            took = self._clock() - started
            if self._procs.get(what) is not old:  # the old one died meanwhile and rule 1 started another
                await self._stop(new)
                raise SupervisorError(f"{what} (pid {old.pid}) exited during the hand-over; restarted as usual")
            self._procs[what] = new
            self.pids[what] = new.pid
            self._replaced.setdefault(what, asyncio.Event()).set()
            self._draining[old.pid] = old
            with contextlib.suppress(ProcessLookupError):
                old.send_signal(signal.SIGTERM)
            self._tasks.append(asyncio.create_task(self._reap(what, old), name=f"drain {what} pid {old.pid}"))
        finally:
            self._handing_over.discard(what)
        message = f"{what}: pid {new.pid} ready in {took:.1f} s, pid {old.pid} draining"
        log.info("hand-over: %s", message)
        return message

    async def _start_ready(self, daemon: Daemon) -> asyncio.subprocess.Process:
        """Start ``daemon`` with a readiness pipe; return the process once it is ready, else stop it and raise."""
        read_end, write_end = os.pipe()
        try:
            proc = await self._spawn(daemon, ("--notify-fd", str(write_end)), pass_fds=(write_end,))
        except OSError as exc:
            os.close(read_end)
            raise SupervisorError(f"cannot start a new {daemon.what}: {exc}") from None
        finally:
            os.close(write_end)
        loop = asyncio.get_running_loop()
        reader = asyncio.StreamReader()
        transport, _ = await loop.connect_read_pipe(
            lambda: asyncio.StreamReaderProtocol(reader), os.fdopen(read_end, "rb", buffering=0)
        )
        try:
            async with asyncio.timeout(self.settings.handover_ready):
                line = await reader.readline()  # b"" once the process (the pipe's only writer) is gone
        except TimeoutError:
            line = None
        finally:
            transport.close()
        if line is not None and line.strip() == READY_LINE:
            return proc
        why = (
            f"not ready within {self.settings.handover_ready:g} s"
            if line is None
            else "exited before it was ready"
            if not line
            else f"said {line[:64]!r} instead of READY=1"
        )
        await self._stop(proc)
        code = f" ({_describe(proc.returncode)})" if proc.returncode is not None else ""
        raise SupervisorError(f"the new {daemon.what} (pid {proc.pid}) {why}{code}; the old one keeps running")

    async def _stop(self, proc: asyncio.subprocess.Process) -> None:
        with contextlib.suppress(ProcessLookupError):
            proc.send_signal(signal.SIGTERM)
        try:
            async with asyncio.timeout(self.settings.term_grace):
                await proc.wait()
        except TimeoutError:
            with contextlib.suppress(ProcessLookupError):
                proc.kill()
            await proc.wait()

    async def _reap(self, what: str, proc: asyncio.subprocess.Process) -> None:
        try:
            code = await proc.wait()
        finally:
            self._draining.pop(proc.pid, None)
        log.info("%s (pid %d, handed over) exited with %s", what, proc.pid, _describe(code))

    async def _spawn(
        self, daemon: Daemon, extra: tuple[str, ...] = (), pass_fds: tuple[int, ...] = ()
    ) -> asyncio.subprocess.Process:
        daemon.log.parent.mkdir(parents=True, exist_ok=True)
        argv = (*daemon.command(), *extra)
        out = os.open(daemon.log, os.O_WRONLY | os.O_APPEND | os.O_CREAT, 0o644)
        try:
            proc = await asyncio.create_subprocess_exec(
                *argv,
                stdin=subprocess.DEVNULL,
                stdout=out,
                stderr=out,
                start_new_session=True,
                close_fds=True,
                pass_fds=pass_fds,
                env={**os.environ, **dict(daemon.env)} if daemon.env else None,
            )
        finally:
            os.close(out)
        if self.record is not None:
            self.record.note("process", pid=proc.pid, start_time=process_start_time(proc.pid) or 0, what=daemon.what)
        extra = argv[len(daemon.argv) :]
        log.info("started %s (pid %d)%s", daemon.what, proc.pid, f" with {' '.join(extra)}" if extra else "")
        return proc

    async def aclose(self) -> None:
        """Stop restarting, then stop the daemons (rule 4)."""
        tasks, self._tasks = self._tasks, []
        for task in tasks:
            task.cancel()
        for task in tasks:
            with contextlib.suppress(asyncio.CancelledError):
                await task
        procs = [*self._procs.values(), *self._draining.values()]
        self._procs.clear()
        self._draining.clear()
        for proc in procs:
            with contextlib.suppress(ProcessLookupError):
                proc.send_signal(signal.SIGTERM)
        if not procs:
            return
        _, pending = await asyncio.wait(
            [asyncio.ensure_future(p.wait()) for p in procs], timeout=self.settings.term_grace
        )
        for proc in procs:
            if proc.returncode is None:
                with contextlib.suppress(ProcessLookupError):
                    proc.kill()
        for waiter in pending:
            with contextlib.suppress(Exception):
                await waiter

    async def __aenter__(self) -> Supervisor:
        self.start()
        return self

    async def __aexit__(self, *exc: object) -> None:
        await self.aclose()


def _describe(code: int) -> str:
    if code < 0:
        with contextlib.suppress(ValueError):
            return f"signal {signal.Signals(-code).name}"
    return f"status {code}"


async def run_supervisor(topology: Topology, settings: SupervisorSettings | None = None) -> None:
    """Supervise the lab's mesh daemons until SIGTERM or SIGINT (what ``ambit lab supervise`` runs).

    The control plane and the node agents start once their service accounts' tokens are written
    (:mod:`ambit.lab.mesh.accounts`); the node proxies once their credentials exist (a token bound to their node's
    ztunnel pod, and the mesh root from the ConfigMap the control plane publishes).
    """
    from ambit.k8s import KubeClient
    from ambit.lab.cluster.handover import HandOverServer, socket_path
    from ambit.lab.mesh.accounts import prepare_system_namespaces, write_component_credentials
    from ambit.lab.mesh.identity import provision_node_proxies, refresh_tokens

    logging.basicConfig(level=logging.INFO, format="%(asctime)s %(levelname)s %(name)s: %(message)s")
    stop = asyncio.Event()
    loop = asyncio.get_running_loop()
    for sig in (signal.SIGTERM, signal.SIGINT):
        loop.add_signal_handler(sig, stop.set)
    first = [control_plane_daemon(topology), *mesh_daemons(topology, what=("nodeagent",))]
    async with KubeClient.from_kubeconfig(topology.kubeconfig) as client:
        # The daemons run with their own service accounts' tokens, written before they start.
        await prepare_system_namespaces(client)
        await write_component_credentials(client, topology)
        async with Supervisor(first, Record(topology.record_file), settings) as supervisor:
            log.info("supervising the mesh daemons of lab %s (pid %d)", topology.lab_id, os.getpid())
            await provision_node_proxies(client, topology)
            supervisor.add(mesh_daemons(topology, what=("nodeproxy",)))
            requests = HandOverServer(socket_path(topology.path), supervisor.hand_over)
            await requests.start()
            refresher = asyncio.create_task(refresh_tokens(client, topology), name="mesh tokens")
            try:
                await stop.wait()
            finally:
                await requests.aclose()
                refresher.cancel()
                with contextlib.suppress(asyncio.CancelledError):
                    await refresher
