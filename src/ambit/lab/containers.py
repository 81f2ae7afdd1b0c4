"""Containers of the lab: commands from the machine's filesystem, run and restarted as the kubelet runs containers.

There are no images. A container is its ``command`` + ``args`` run inside the pod's network namespace as
``ip netns exec <netns> <command> <args>`` (directly when the namespace name is empty, for tests), in a session of
its own so that stopping it signals its whole process group, with stdin from ``/dev/null`` and stdout and stderr
appended to its log file. Exits are seen through a pidfd, which also works for a process adopted after the
runtime restarted (one that is no longer our child, whose exit code is then unknown).

The state of one container is :class:`ContainerState`, a pure state machine; :class:`ContainerSupervisor` is its
asyncio shell (spawn, wait, probe, restart, stop). Phases, and what the container status shows in each::

    CREATING      waiting: ContainerCreating            never started yet
    CONFIG_ERROR  waiting: CreateContainerConfigError   cannot be started as specified (no command, missing key)
    RUNNING       running
    BACKING_OFF   waiting: CrashLoopBackOff             exited; starts again at ``restart_at``
    EXITED        terminated                            exited, and will not run again

Rule 1. Transitions are the table ``_TRANSITIONS`` below; an event a phase does not list is a bug
        (:class:`ContainerStateError`). ``StopRequested`` is accepted in every phase.
Rule 2. ``Exited`` leads to BACKING_OFF when the container is not being stopped and its pod's restart policy says
        so (Always; OnFailure after a non-zero or unknown exit code), else to EXITED.
Rule 3. ``restartCount`` counts the instances started after the first (``Started`` out of BACKING_OFF).
Rule 4. Each exit's termination becomes ``lastState`` while the container waits or runs again. In EXITED the
        state is the last termination and ``lastState`` the one before it.
Rule 5. Restart back-off is the kubelet's: the first restart is immediate, then ``initial``, 2 x ``initial``, ... up
        to ``maximum``; an instance that ran ``reset_after`` seconds starts the count over.
Rule 6. An exit whose code cannot be known (an adopted process) is reported as the kubelet reports a container it
        lost: exit code 137, reason ``ContainerStatusUnknown``.
Rule 7. ``StopRequested`` out of BACKING_OFF ends in EXITED at once (there is no process); out of RUNNING it marks
        the container stopping, and the ``Exited`` that follows the signal ends in EXITED.
"""

from __future__ import annotations

import asyncio
import contextlib
import enum
import logging
import os
import shutil
import signal
from collections.abc import Awaitable, Callable, Mapping, Sequence
from dataclasses import dataclass, field
from datetime import UTC, datetime
from pathlib import Path
from typing import Any, Literal, Protocol

from ambit.errors import AmbitError
from ambit.lab.probes import ProbeConfigError, ProbeSpec, ProbeTarget, ProbeTracker, ProbeWorker

log = logging.getLogger("ambit.lab.containers")

EventType = Literal["Normal", "Warning"]

UNKNOWN_EXIT_CODE = 137
START_ERROR = 128
KILL_WAIT = 5.0
"""Seconds to wait for a process group to go after SIGKILL before giving up on it."""
_RESET_SIGNALS = tuple(
    getattr(signal, name)
    for name in ("SIGPIPE", "SIGXFSZ", "SIGHUP", "SIGINT", "SIGQUIT", "SIGTERM", "SIGUSR1", "SIGUSR2", "SIGCHLD")
    if hasattr(signal, name)
)
"""Dispositions a container starts with at their defaults (Python ignores SIGPIPE and SIGXFSZ; exec keeps that)."""


class ContainerStateError(AmbitError):
    """An event arrived that the container's phase does not accept (a bug in the caller)."""


class ContainerConfigError(AmbitError):
    """A container cannot be started as specified; ``retry`` when a later attempt may succeed (a missing key)."""

    def __init__(self, message: str, *, retry: bool) -> None:
        super().__init__(message)
        self.retry = retry


def rfc3339(ts: float) -> str:
    return datetime.fromtimestamp(ts, UTC).strftime("%Y-%m-%dT%H:%M:%SZ")


def parse_rfc3339(text: Any) -> float | None:
    if not isinstance(text, str) or not text:
        return None
    try:
        return datetime.fromisoformat(text.replace("Z", "+00:00")).timestamp()
    except ValueError:
        return None


# -- the state machine (pure) -------------------------------------------------------------------------------------
class Phase(enum.Enum):
    CREATING = "creating"
    CONFIG_ERROR = "config-error"
    RUNNING = "running"
    BACKING_OFF = "backing-off"
    EXITED = "exited"


@dataclass(frozen=True, slots=True)
class Started:
    pid: int
    at: float


@dataclass(frozen=True, slots=True)
class ConfigFailed:
    message: str


@dataclass(frozen=True, slots=True)
class Exited:
    exit_code: int | None
    """None: unknown (rule 6)."""
    at: float
    message: str = ""
    start_error: bool = False
    """The process could not be started (its command was not found): reason ``StartError``."""


@dataclass(frozen=True, slots=True)
class StopRequested:
    pass


ContainerEvent = Started | ConfigFailed | Exited | StopRequested

_WAITING = (Phase.CREATING, Phase.CONFIG_ERROR, Phase.BACKING_OFF)
_TRANSITIONS: dict[tuple[Phase, type[ContainerEvent]], tuple[Phase, ...]] = {
    **{(p, Started): (Phase.RUNNING,) for p in _WAITING},
    **{(p, ConfigFailed): (Phase.CONFIG_ERROR,) for p in _WAITING},
    (Phase.RUNNING, Exited): (Phase.BACKING_OFF, Phase.EXITED),
}


def should_restart(restart_policy: str, exit_code: int | None) -> bool:
    if restart_policy == "Never":
        return False
    if restart_policy == "OnFailure":
        return exit_code != 0
    return True  # Always, and the default


@dataclass(slots=True)
class RestartBackoff:
    """Rule 5; pure bookkeeping, the caller sleeps."""

    initial: float = 10.0
    maximum: float = 300.0
    reset_after: float = 600.0
    streak: int = 0
    """Exits counted towards the current back-off."""

    def next_delay(self, ran_for: float) -> float:
        if ran_for >= self.reset_after:
            self.streak = 0
        delay = 0.0 if self.streak == 0 else min(self.initial * 2 ** (self.streak - 1), self.maximum)
        self.streak += 1
        return delay


@dataclass(slots=True)
class ContainerState:
    name: str
    restart_policy: str
    backoff: RestartBackoff = field(default_factory=RestartBackoff)
    phase: Phase = Phase.CREATING
    stopping: bool = False
    restart_count: int = 0
    pid: int | None = None
    started_at: float | None = None
    ready: bool = False
    message: str = ""
    """Why the container waits (CONFIG_ERROR)."""
    restart_at: float = 0.0
    backoff_delay: float = 0.0
    last_termination: dict[str, Any] | None = None
    prior_termination: dict[str, Any] | None = None

    def apply(self, event: ContainerEvent) -> Phase:
        if isinstance(event, StopRequested):
            self.stopping = True
            if self.phase is Phase.BACKING_OFF:
                self.phase = Phase.EXITED
            return self.phase
        allowed = _TRANSITIONS.get((self.phase, type(event)))
        if allowed is None:
            raise ContainerStateError(f"container {self.name}: {type(event).__name__} in phase {self.phase.value}")
        if isinstance(event, Started):
            if self.last_termination is not None:
                self.restart_count += 1
            self.phase, self.pid, self.started_at = Phase.RUNNING, event.pid, event.at
            self.ready, self.message = False, ""
        elif isinstance(event, ConfigFailed):
            self.phase, self.message = Phase.CONFIG_ERROR, event.message
        else:
            self._exited(event)
        assert self.phase in allowed
        return self.phase

    def _exited(self, event: Exited) -> None:
        started = self.started_at if self.started_at is not None else event.at
        if event.exit_code is None:
            code, reason = UNKNOWN_EXIT_CODE, "ContainerStatusUnknown"
        else:
            code, reason = event.exit_code, "Completed" if event.exit_code == 0 else "Error"
            if event.start_error:
                reason = "StartError"
        termination: dict[str, Any] = {
            "exitCode": code,
            "reason": reason,
            "startedAt": rfc3339(started),
            "finishedAt": rfc3339(event.at),
        }
        if event.message:
            termination["message"] = event.message
        if self.pid:
            termination["containerID"] = container_id(self.pid)
        self.prior_termination, self.last_termination = self.last_termination, termination
        self.ready = False
        if self.stopping or not should_restart(self.restart_policy, event.exit_code):
            self.phase = Phase.EXITED
            return
        self.backoff_delay = self.backoff.next_delay(event.at - started)
        self.restart_at = event.at + self.backoff_delay
        self.phase = Phase.BACKING_OFF

    def restore(self, status: Mapping[str, Any], pid: int) -> None:
        """Take over an instance found running after the runtime restarted, with its reported history."""
        self.restart_count = int(status.get("restartCount") or 0)
        last = (status.get("lastState") or {}).get("terminated")
        self.last_termination = dict(last) if isinstance(last, dict) else None
        running = (status.get("state") or {}).get("running") or {}
        self.started_at = parse_rfc3339(running.get("startedAt"))
        self.phase, self.pid = Phase.RUNNING, pid

    def resume_exited(self, status: Mapping[str, Any]) -> None:
        """Take over a container reported terminated: it stays EXITED unless its restart policy restarts it."""
        terminated = dict((status.get("state") or {}).get("terminated") or {})
        self.restart_count = int(status.get("restartCount") or 0)
        code = terminated.get("exitCode")
        if self.stopping or not should_restart(self.restart_policy, code if isinstance(code, int) else None):
            previous = (status.get("lastState") or {}).get("terminated")
            self.prior_termination = dict(previous) if isinstance(previous, dict) else None
            self.last_termination, self.phase = terminated, Phase.EXITED
        else:
            self.last_termination = terminated  # restarted at once, as after any first exit

    @property
    def started(self) -> bool:
        return self.phase is Phase.RUNNING


def container_id(pid: int) -> str:
    return f"ambit://{pid}"


def container_status(state: ContainerState, image: str, pod_ref: str) -> dict[str, Any]:
    """The ``containerStatuses`` entry (rule 4); ``pod_ref`` is ``name_namespace(uid)`` for messages."""
    current: dict[str, Any]
    last: dict[str, Any] | None = state.last_termination
    if state.phase is Phase.CREATING:
        current = {"waiting": {"reason": "ContainerCreating"}}
    elif state.phase is Phase.CONFIG_ERROR:
        current = {"waiting": {"reason": "CreateContainerConfigError", "message": state.message}}
    elif state.phase is Phase.RUNNING:
        current = {"running": {"startedAt": rfc3339(state.started_at or 0.0)}}
    elif state.phase is Phase.BACKING_OFF:
        note = f"back-off {state.backoff_delay:g}s restarting failed container={state.name} pod={pod_ref}"
        current = {"waiting": {"reason": "CrashLoopBackOff", "message": note}}
    else:
        current = {"terminated": dict(state.last_termination or {"exitCode": 0, "reason": "Completed"})}
        last = state.prior_termination
    status: dict[str, Any] = {
        "name": state.name,
        "ready": state.ready and state.phase is Phase.RUNNING,
        "started": state.started,
        "restartCount": state.restart_count,
        "state": current,
        "lastState": {"terminated": dict(last)} if last else {},
        "image": image,
        "imageID": "",
    }
    if state.pid:
        status["containerID"] = container_id(state.pid)
    return status


def pod_phase(restart_policy: str, states: Sequence[ContainerState]) -> str:
    """The pod phase from its containers, as the kubelet's ``getPhase`` computes it."""
    waiting = running = stopped = succeeded = 0
    for state in states:
        if state.phase is Phase.RUNNING:
            running += 1
        elif state.phase is Phase.EXITED or (state.phase in _WAITING and state.last_termination is not None):
            stopped += 1
            last = state.last_termination or {}
            if state.phase is Phase.EXITED and last.get("exitCode") == 0:
                succeeded += 1
        else:
            waiting += 1
    if waiting or not states:
        return "Pending"
    if running:
        return "Running"
    if restart_policy == "Always":
        return "Running"
    if stopped == succeeded:
        return "Succeeded"
    if restart_policy == "Never":
        return "Failed"
    return "Running"


# -- processes --------------------------------------------------------------------------------------------------
@dataclass(frozen=True, slots=True)
class ProcessHandle:
    pid: int
    start_ticks: int
    """Field 22 of ``/proc/<pid>/stat``: with the pid, it names one process even after the pid is reused."""


def _stat_fields(pid: int) -> list[str]:
    """``/proc/<pid>/stat`` from field 3 (state) on; empty when there is no such process."""
    try:
        stat = Path(f"/proc/{pid}/stat").read_text()
    except OSError:
        return []
    return stat[stat.rfind(")") + 2 :].split()


def process_start_ticks(pid: int) -> int | None:
    fields = _stat_fields(pid)
    try:
        return int(fields[19])
    except (IndexError, ValueError):
        return None


def find_process(pid: int, start_ticks: int) -> ProcessHandle | None:
    """The process ``pid`` if it still runs (a zombie does not) and is the one that started at ``start_ticks``."""
    fields = _stat_fields(pid)
    if len(fields) < 20 or fields[0] in ("Z", "X") or fields[19] != str(start_ticks):
        return None
    return ProcessHandle(pid, start_ticks)


def reap(pid: int) -> int | None:
    """Collect the exit code of ``pid`` if it is our child and has exited; None otherwise."""
    return _reap(pid)


def pids_in_netns(netns_path: str) -> list[int]:
    """Processes whose network namespace is ``netns_path`` (what ``ip netns pids`` prints)."""
    try:
        target = os.stat(netns_path)
    except OSError:
        return []
    pids = []
    for entry in os.listdir("/proc"):
        if not entry.isdigit():
            continue
        try:
            ns = os.stat(f"/proc/{entry}/ns/net")
        except OSError:
            continue
        if (ns.st_dev, ns.st_ino) == (target.st_dev, target.st_ino):
            pids.append(int(entry))
    return pids


def container_argv(netns: str, command: Sequence[str], args: Sequence[str], working_dir: str = "") -> list[str]:
    argv = [*command, *args]
    if working_dir:
        argv = ["env", "-C", working_dir, "--", *argv]
    if netns:
        argv = ["ip", "netns", "exec", netns, *argv]
    return argv


def spawn(argv: Sequence[str], env: Mapping[str, str], log_path: Path) -> ProcessHandle:
    """Start ``argv`` in a new session with output appended to ``log_path``; OSError when it cannot be executed.

    The executable is looked up in the container's ``PATH`` (``env``), as ``ip netns exec`` would.
    """
    path = env.get("PATH", os.defpath)
    executable = shutil.which(argv[0], path=path) if "/" not in argv[0] else argv[0]
    if executable is None:
        raise FileNotFoundError(2, "executable file not found in $PATH", argv[0])
    if list(argv[:3]) == ["ip", "netns", "exec"] and len(argv) > 4:
        # The container's own command runs after `ip netns exec NETNS`: look it up now, as a runtime does, so a
        # missing executable is a start error (128, StartError) rather than an exit of the wrapper.
        command = argv[4]
        found = (
            shutil.which(command, path=path)
            if "/" not in command
            else (command if os.access(command, os.X_OK) else None)
        )
        if found is None:
            raise FileNotFoundError(2, "executable file not found in $PATH", command)
    fd = os.open(log_path, os.O_WRONLY | os.O_APPEND | os.O_CREAT | os.O_CLOEXEC, 0o640)
    try:
        pid = os.posix_spawn(
            executable,
            list(argv),
            dict(env),
            file_actions=[
                (os.POSIX_SPAWN_OPEN, 0, "/dev/null", os.O_RDONLY, 0),
                (os.POSIX_SPAWN_DUP2, fd, 1),
                (os.POSIX_SPAWN_DUP2, fd, 2),
            ],
            setsid=True,
            setsigmask=(),
            setsigdef=_RESET_SIGNALS,
        )
    finally:
        os.close(fd)
    return ProcessHandle(pid, process_start_ticks(pid) or 0)


def signal_group(pid: int, sig: int) -> bool:
    """Signal the process group ``pid`` leads; False when there is none left."""
    try:
        os.killpg(pid, sig)
    except ProcessLookupError:
        return False
    return True


async def wait_exit(handle: ProcessHandle) -> int | None:
    """Wait for the process to exit; its exit code (128+n for signal n), or None when it is not our child.

    What is left of its process group is killed before the exit is reaped, as a container's cgroup is.
    """
    try:
        pidfd = os.pidfd_open(handle.pid)
    except ProcessLookupError:
        return _reap(handle.pid)
    loop = asyncio.get_running_loop()
    exited = loop.create_future()

    def readable() -> None:
        if not exited.done():
            exited.set_result(None)

    loop.add_reader(pidfd, readable)
    try:
        await exited
    finally:
        loop.remove_reader(pidfd)
        os.close(pidfd)
    signal_group(handle.pid, signal.SIGKILL)
    return _reap(handle.pid)


def _reap(pid: int) -> int | None:
    try:
        reaped, status = os.waitpid(pid, os.WNOHANG)
    except ChildProcessError:
        return None
    if reaped == 0:
        return None
    code = os.waitstatus_to_exitcode(status)
    return 128 - code if code < 0 else code


async def stop_process(handle: ProcessHandle, grace: float) -> None:
    """SIGTERM a process group nobody supervises, SIGKILL it after ``grace`` seconds."""
    if not signal_group(handle.pid, signal.SIGTERM):
        return
    try:
        await asyncio.wait_for(wait_exit(handle), grace)
    except TimeoutError:
        signal_group(handle.pid, signal.SIGKILL)
        with contextlib.suppress(TimeoutError):
            await asyncio.wait_for(wait_exit(handle), KILL_WAIT)


# -- the asyncio shell ------------------------------------------------------------------------------------------
@dataclass(frozen=True, slots=True)
class LaunchSpec:
    """Everything needed to start one instance of a container."""

    argv: tuple[str, ...]
    env: Mapping[str, str]
    log_path: Path
    target: ProbeTarget
    grace: float
    """Seconds between SIGTERM and SIGKILL when a failed liveness probe restarts it."""


class ContainerHooks(Protocol):
    """What a supervisor needs from its pod."""

    async def prepare(self, container: Mapping[str, Any]) -> LaunchSpec:
        """Resolve command, environment and probe target; raises :class:`ContainerConfigError`."""
        ...

    async def spawned(self, name: str, handle: ProcessHandle) -> None:
        """Called right after a process started (to record it); the supervisor waits for it."""
        ...

    def event(self, type: EventType, reason: str, note: str) -> None: ...

    def changed(self) -> None: ...


class ContainerSupervisor:
    """Runs one container: start, watch, probe, restart with back-off, stop. ``start()`` it once."""

    def __init__(
        self,
        spec: Mapping[str, Any],
        state: ContainerState,
        hooks: ContainerHooks,
        *,
        config_retry: float,
        clock: Callable[[], float],
        sleep: Callable[[float], Awaitable[None]] = asyncio.sleep,
        spawner: Callable[[Sequence[str], Mapping[str, str], Path], ProcessHandle] = spawn,
    ) -> None:
        self.spec = spec
        self.state = state
        self.hooks = hooks
        self._config_retry = config_retry
        self._clock = clock
        self._sleep = sleep
        self._spawn = spawner
        self._handle: ProcessHandle | None = None
        self._task: asyncio.Task[None] | None = None

    @property
    def name(self) -> str:
        return self.state.name

    def start(self, adopt: ProcessHandle | None = None) -> asyncio.Task[None]:
        if self._task is None:
            self._task = asyncio.get_running_loop().create_task(self._guarded(adopt), name=f"container {self.name}")
        return self._task

    async def stop(self, grace: float) -> None:
        """SIGTERM the running instance's group, SIGKILL after ``grace`` seconds; no restart afterwards."""
        self.state.apply(StopRequested())
        self.hooks.changed()
        task = self._task
        if task is None or task.done():
            return
        handle = self._handle
        if handle is None:
            task.cancel()
            with contextlib.suppress(asyncio.CancelledError):
                await task
            return
        await self._terminate(handle, task, grace)

    async def detach(self) -> None:
        """Stop supervising and leave the process running (the runtime is going away, its pods are not)."""
        task, self._task = self._task, None
        if task is not None:
            task.cancel()
            with contextlib.suppress(asyncio.CancelledError):
                await task

    async def _terminate(self, handle: ProcessHandle, task: asyncio.Future[Any], grace: float) -> None:
        signal_group(handle.pid, signal.SIGTERM)
        done, _ = await asyncio.wait({task}, timeout=grace)
        if not done:
            signal_group(handle.pid, signal.SIGKILL)
            done, _ = await asyncio.wait({task}, timeout=KILL_WAIT)
            if not done:
                log.error("container %s: pid %d survived SIGKILL for %.0fs", self.name, handle.pid, KILL_WAIT)

    async def _guarded(self, adopt: ProcessHandle | None) -> None:
        try:
            await self._run(adopt)
        except asyncio.CancelledError:
            raise
        except Exception:  # a bug: the container is left as it is, the pod and the runtime carry on
            log.exception("container %s: supervisor failed", self.name)

    async def _run(self, adopt: ProcessHandle | None) -> None:
        handle = adopt
        while self.state.phase is not Phase.EXITED:
            if handle is None and self.state.phase is Phase.BACKING_OFF:
                await self._backoff()
            try:
                launch = await self.hooks.prepare(self.spec)
                probes = self._probe_specs()
            except ContainerConfigError as exc:
                if handle is not None:  # adopted: probe what runs, as well as we can
                    launch, probes = None, {}
                else:
                    self.state.apply(ConfigFailed(str(exc)))
                    self.hooks.event("Warning", "Failed", f"Error: {exc}")
                    self.hooks.changed()
                    if not exc.retry:
                        return
                    await self._sleep(self._config_retry)
                    continue
            if handle is None:
                assert launch is not None
                handle = await self._start_instance(launch)
                if handle is None:
                    continue
            code = await self._supervise(handle, launch, probes)
            handle = self._handle = None
            self._exited(code, "")

    def _probe_specs(self) -> dict[str, ProbeSpec]:
        probes = {}
        for key in ("readinessProbe", "livenessProbe"):
            probe = self.spec.get(key)
            if isinstance(probe, dict):
                try:
                    probes[key] = ProbeSpec.parse(probe, self.spec)
                except ProbeConfigError as exc:
                    raise ContainerConfigError(f"{key}: {exc}", retry=False) from None
        return probes

    async def _start_instance(self, launch: LaunchSpec) -> ProcessHandle | None:
        now = self._clock()
        try:
            handle = self._spawn(launch.argv, launch.env, launch.log_path)
        except OSError as exc:
            # The container's command (also the one behind ``ip netns exec``) is looked up before spawning: a
            # missing one is a start error, exit code 128, as container runtimes report it.
            message = f"exec {exc.filename or launch.argv[0]!r}: {exc.strerror or exc}"
            with contextlib.suppress(OSError), launch.log_path.open("a") as out:
                out.write(message + "\n")
            self.state.apply(Started(0, now))
            self._exited(START_ERROR if isinstance(exc, FileNotFoundError) else 126, message, start_error=True)
            return None
        self._handle = handle
        self.state.apply(Started(handle.pid, now))
        await self.hooks.spawned(self.name, handle)
        self.hooks.event("Normal", "Started", f"Started container {self.name}")
        self.hooks.changed()
        return handle

    def _exited(self, code: int | None, message: str, *, start_error: bool = False) -> None:
        phase = self.state.apply(Exited(code, self._clock(), message, start_error))
        if code != 0 and not self.state.stopping:
            shown = "unknown" if code is None else str(code)
            note = f"Container {self.name} exited with code {shown}" + (f": {message}" if message else "")
            self.hooks.event("Warning", "Failed", note)
        if phase is Phase.BACKING_OFF and self.state.backoff_delay > 0:
            self.hooks.event("Warning", "BackOff", f"Back-off restarting failed container {self.name}")
        self.hooks.changed()

    async def _backoff(self) -> None:
        delay = self.state.restart_at - self._clock()
        if delay > 0:
            await self._sleep(delay)

    async def _supervise(
        self, handle: ProcessHandle, launch: LaunchSpec | None, probes: dict[str, ProbeSpec]
    ) -> int | None:
        """Wait for the instance to exit, probing it meanwhile; a failed liveness probe terminates it."""
        self._handle = handle
        loop = asyncio.get_running_loop()
        if "readinessProbe" not in probes:
            self.state.ready = True
            self.hooks.changed()
        unhealthy = asyncio.Event()
        tasks = [
            loop.create_task(self._probe(key, spec, launch, unhealthy), name=f"probe {self.name} {key}")
            for key, spec in probes.items()
            if launch is not None
        ]
        exit_task = loop.create_task(wait_exit(handle), name=f"container {self.name} pid {handle.pid}")
        kill_task = loop.create_task(unhealthy.wait())
        try:
            done, _ = await asyncio.wait({exit_task, kill_task}, return_when=asyncio.FIRST_COMPLETED)
            if exit_task not in done:
                signal_group(handle.pid, signal.SIGTERM)
                grace = launch.grace if launch is not None else 0.0
                done, _ = await asyncio.wait({exit_task}, timeout=grace)
                if not done:
                    signal_group(handle.pid, signal.SIGKILL)
            return await exit_task
        finally:
            for task in (*tasks, kill_task, exit_task):
                task.cancel()
            for task in (*tasks, kill_task, exit_task):
                with contextlib.suppress(asyncio.CancelledError):
                    await task

    async def _probe(self, key: str, spec: ProbeSpec, launch: LaunchSpec, unhealthy: asyncio.Event) -> None:
        kind = "Readiness" if key == "readinessProbe" else "Liveness"

        def failed(message: str) -> None:
            self.hooks.event("Warning", "Unhealthy", f"{kind} probe failed: {message}")

        def ready(healthy: bool, message: str) -> None:
            self.state.ready = healthy
            self.hooks.changed()

        def alive(healthy: bool, message: str) -> None:
            if not healthy:
                note = f"Container {self.name} failed liveness probe, will be restarted"
                self.hooks.event("Normal", "Killing", note)
                unhealthy.set()

        if key == "readinessProbe":
            worker = ProbeWorker(spec, ProbeTracker.readiness(spec), launch.target, ready, on_failure=failed)
        else:
            worker = ProbeWorker(spec, ProbeTracker.liveness(spec), launch.target, alive, on_failure=failed)
        try:
            await worker.run()
        except asyncio.CancelledError:
            raise
        except Exception:  # a bug in probing must not leave the instance unsupervised
            log.exception("container %s: %s probe failed to run", self.name, kind.lower())
