"""Containers of the lab: commands from the machine's filesystem, run and restarted as the kubelet runs containers.

:class:`ContainerSupervisor` is the asyncio shell of one container's state machine
(:class:`ambit.lab.runtime.containers.ContainerState`, whose rules are in :mod:`ambit.lab.runtime.containers`): it asks
its pod for a :class:`LaunchSpec` (command, environment, probe target, OCI configuration), starts an instance through
its :class:`ContainerRuntime` (runc, :mod:`ambit.lab.runtime.oci_apply`; or a plain process, :class:`ProcessRuntime`,
for tests in the test's own namespace), waits for it while probing it, restarts it after the back-off its state
computes, and stops it (SIGTERM, SIGKILL after the grace period). A container that cannot be started as specified
raises :class:`ContainerConfigError` from its pod's ``prepare``; it waits in CONFIG_ERROR and is tried again after
``config_retry`` seconds when ``retry`` says a later attempt may succeed. An instance the runtime could not create or
start waits as ``CreateContainerError`` or ``RunContainerError`` and is tried again after ``config_retry``. A process
that cannot be executed is a start error (exit code 128, reason ``StartError``), as container runtimes report it.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import signal
from collections.abc import Awaitable, Callable, Mapping
from dataclasses import dataclass, replace
from pathlib import Path
from typing import TYPE_CHECKING, Any, Literal, Protocol

from ambit.errors import AmbitError
from ambit.lab.runtime.containers import (
    ConfigFailed,
    ContainerState,
    Exited,
    Phase,
    Started,
    StartupPassed,
    StopRequested,
)
from ambit.lab.runtime.oci_spec import BundlePaths
from ambit.lab.runtime.probes import (
    PRE_STOP_EXTENSION,
    ProbeConfigError,
    ProbeSpec,
    ProbeTarget,
    ProbeTracker,
    ProbeWorker,
    run_hook,
)
from ambit.lab.runtime.processes import KILL_WAIT, ProcessHandle, signal_group, spawn, wait_exit

if TYPE_CHECKING:
    from ambit.lab.runtime.oci_apply import ContainerRuntimeError

log = logging.getLogger("ambit.lab.runtime.containers_apply")

EventType = Literal["Normal", "Warning"]

START_ERROR = 128
POST_START_LIMIT = 120.0
"""Seconds a postStart hook may run (the kubelet waits for it as long as it takes; a bound keeps a stuck one from
holding the container's probes forever)."""


class ContainerConfigError(AmbitError):
    """A container cannot be started as specified; ``retry`` when a later attempt may succeed (a missing key);
    ``reason`` is the waiting reason (``CreateContainerError`` when the runtime, not the kubelet, refuses)."""

    def __init__(self, message: str, *, retry: bool, reason: str = "CreateContainerConfigError") -> None:
        super().__init__(message)
        self.retry = retry
        self.reason = reason


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
    container_id: str = ""
    config: Mapping[str, Any] | None = None
    """The OCI runtime configuration (for a sandboxing runtime)."""


class ContainerRuntime(Protocol):
    """Starts, signals and cleans up container instances (:class:`ambit.lab.runtime.oci_apply.RuncRuntime`)."""

    @property
    def sandboxed(self) -> bool:
        """Containers get their own root, mounts and identity (the pod's files are seen at their in-pod paths)."""
        ...

    def spawn(self, launch: LaunchSpec) -> ProcessHandle:
        """Start an instance; OSError when its command cannot be found or executed."""
        ...

    async def signal(self, handle: ProcessHandle, container_id: str, sig: int) -> None: ...

    async def finished(self, container_id: str) -> ContainerRuntimeError | None:
        """Clean up after an instance ended; the runtime's own error when that is why it ended."""
        ...

    async def remove_pod(self, pod_uid: str) -> None:
        """Remove every container of the pod the runtime still has."""
        ...

    def members(self, container_id: str, handle: ProcessHandle) -> set[int]:
        """Pids that belong to the running container."""
        ...

    def exec_prefix(self, container_id: str) -> tuple[str, ...]:
        """The argv prefix running a command inside the container; empty: the pod's network namespace only."""
        ...

    def bundle_paths(self, container_id: str, netns_path: str, service_account_dir: Path) -> BundlePaths:
        """What the OCI configuration needs to know of this machine (:mod:`ambit.lab.runtime.oci_spec`)."""
        ...


class ProcessRuntime:
    """No sandbox: each container is a plain process (:mod:`ambit.lab.runtime.processes`) in the runtime's own
    filesystem as root. Only for tests that run pods in their own namespace; the lab uses runc."""

    sandboxed = False

    def spawn(self, launch: LaunchSpec) -> ProcessHandle:
        return spawn(launch.argv, launch.env, launch.log_path)

    async def signal(self, handle: ProcessHandle, container_id: str, sig: int) -> None:
        signal_group(handle.pid, sig)

    async def finished(self, container_id: str) -> ContainerRuntimeError | None:
        return None

    async def remove_pod(self, pod_uid: str) -> None:
        return None

    def members(self, container_id: str, handle: ProcessHandle) -> set[int]:
        return {handle.pid}

    def exec_prefix(self, container_id: str) -> tuple[str, ...]:
        return ()

    def bundle_paths(self, container_id: str, netns_path: str, service_account_dir: Path) -> BundlePaths:
        return BundlePaths(container_id, netns_path, str(service_account_dir), "")


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
        runtime: ContainerRuntime,
        container_id: str = "",
    ) -> None:
        self.spec = spec
        self.state = state
        self.hooks = hooks
        self._config_retry = config_retry
        self._clock = clock
        self._sleep = sleep
        self._runtime = runtime
        self.container_id = container_id
        self._handle: ProcessHandle | None = None
        self._launch: LaunchSpec | None = None
        self._fresh = False
        """The instance being supervised was started here (not adopted): its postStart hook is due."""
        self._task: asyncio.Task[None] | None = None

    @property
    def name(self) -> str:
        return self.state.name

    def start(self, adopt: ProcessHandle | None = None) -> asyncio.Task[None]:
        if self._task is None:
            self._task = asyncio.get_running_loop().create_task(self._guarded(adopt), name=f"container {self.name}")
        return self._task

    async def stop(self, grace: float) -> None:
        """Run the container's preStop hook, then SIGTERM the running instance's group, SIGKILL when ``grace``
        seconds have passed since the stop began (the kubelet's order); no restart afterwards."""
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
        grace = await self._pre_stop(grace)
        if not task.done():
            await self._terminate(handle, task, grace)

    def _hook(self, name: str) -> Mapping[str, Any] | None:
        """The container's ``lifecycle.<name>`` handler (``postStart``, ``preStop``), if it has one."""
        lifecycle = self.spec.get("lifecycle")
        hook = lifecycle.get(name) if isinstance(lifecycle, dict) else None
        return hook if isinstance(hook, dict) else None

    async def _pre_stop(self, grace: float) -> float:
        """The container's ``lifecycle.preStop`` handler, within ``grace`` seconds; the seconds left for the SIGTERM
        (:data:`~ambit.lab.runtime.probes.PRE_STOP_EXTENSION` when the hook used them all). A hook that fails or
        runs out of time is reported (``FailedPreStopHook``) and the stop goes on, as the kubelet's does."""
        hook = self._hook("preStop")
        launch = self._launch
        if hook is None or launch is None or grace <= 0:
            return grace
        loop = asyncio.get_running_loop()
        began = loop.time()
        try:
            async with asyncio.timeout(grace):
                failure = await run_hook(hook, self.spec, launch.target, grace)
        except TimeoutError:
            self.hooks.event("Warning", "FailedPreStopHook", f"PreStopHook did not finish within {grace:g}s")
            return PRE_STOP_EXTENSION
        except Exception:  # a bug in running the hook must not keep the container from stopping
            log.exception("container %s: preStop hook failed to run", self.name)
            failure = ""
        if failure:
            self.hooks.event("Warning", "FailedPreStopHook", f"PreStopHook failed: {failure}")
        return max(grace - (loop.time() - began), 0.0)

    async def detach(self) -> None:
        """Stop supervising and leave the process running (the runtime is going away, its pods are not)."""
        task, self._task = self._task, None
        if task is not None:
            task.cancel()
            with contextlib.suppress(asyncio.CancelledError):
                await task

    async def _terminate(self, handle: ProcessHandle, task: asyncio.Future[Any], grace: float) -> None:
        await self._runtime.signal(handle, self.container_id, signal.SIGTERM)
        done, _ = await asyncio.wait({task}, timeout=grace)
        if not done:
            await self._runtime.signal(handle, self.container_id, signal.SIGKILL)
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
                    self.state.apply(ConfigFailed(str(exc), exc.reason))
                    self.hooks.event("Warning", "Failed", f"Error: {exc}")
                    self.hooks.changed()
                    if not exc.retry:
                        return
                    await self._sleep(self._config_retry)
                    continue
            if handle is None:
                assert launch is not None
                handle = await self._start_instance(launch, startup_probe="startupProbe" in probes)
                if handle is None:
                    continue
            self._launch = launch
            code = await self._supervise(handle, launch, probes)
            handle = self._handle = None
            failure = await self._runtime.finished(self.container_id)
            if failure is not None and not self.state.stopping:
                self.state.apply(ConfigFailed(str(failure), failure.reason))
                self.hooks.event("Warning", "Failed", f"Error: {failure}")
                self.hooks.changed()
                await self._sleep(self._config_retry)
                continue
            self._exited(code, str(failure or ""))

    def _probe_specs(self) -> dict[str, ProbeSpec]:
        probes = {}
        for key in ("startupProbe", "readinessProbe", "livenessProbe"):
            probe = self.spec.get(key)
            if isinstance(probe, dict):
                try:
                    probes[key] = ProbeSpec.parse(probe, self.spec)
                except ProbeConfigError as exc:
                    raise ContainerConfigError(f"{key}: {exc}", retry=False) from None
        return probes

    async def _start_instance(self, launch: LaunchSpec, *, startup_probe: bool) -> ProcessHandle | None:
        now = self._clock()
        try:
            handle = self._runtime.spawn(launch)
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
        self._fresh = True
        self.state.apply(Started(handle.pid, now, startup_probe))
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
        startup = probes.get("startupProbe") if launch is not None and not self.state.startup_passed else None
        post_start = self._hook("postStart") if launch is not None and self._fresh else None
        self._fresh = False
        if startup is None and post_start is None and "readinessProbe" not in probes:
            self.state.ready = True
            self.hooks.changed()
        unhealthy = asyncio.Event()
        tasks = []
        if launch is not None:
            probing = self._probe_all(startup, probes, launch, unhealthy, post_start)
            tasks.append(loop.create_task(probing, name=f"probes {self.name}"))
        exit_task = loop.create_task(wait_exit(handle), name=f"container {self.name} pid {handle.pid}")
        kill_task = loop.create_task(unhealthy.wait())
        try:
            done, _ = await asyncio.wait({exit_task, kill_task}, return_when=asyncio.FIRST_COMPLETED)
            if exit_task not in done:  # a failed liveness or startup probe: the preStop hook runs first here too
                grace = await self._pre_stop(launch.grace if launch is not None else 0.0)
                await self._runtime.signal(handle, self.container_id, signal.SIGTERM)
                done, _ = await asyncio.wait({exit_task}, timeout=grace)
                if not done:
                    await self._runtime.signal(handle, self.container_id, signal.SIGKILL)
            return await exit_task
        finally:
            for task in (*tasks, kill_task, exit_task):
                task.cancel()
            for task in (*tasks, kill_task, exit_task):
                with contextlib.suppress(asyncio.CancelledError):
                    await task

    async def _probe_all(
        self,
        startup: ProbeSpec | None,
        probes: dict[str, ProbeSpec],
        launch: LaunchSpec,
        unhealthy: asyncio.Event,
        post_start: Mapping[str, Any] | None = None,
    ) -> None:
        """The postStart hook (a new instance's), then the startup probe until it passes (probes.py rule 4), then the
        readiness and liveness probes side by side. No probe runs before the hook has finished; a hook that fails
        or a startup probe that fails out kills the instance as a failed liveness probe does."""
        others = {key: spec for key, spec in probes.items() if key != "startupProbe"}
        if post_start is not None:
            failure = await run_hook(post_start, self.spec, launch.target, POST_START_LIMIT)
            if failure:
                self.hooks.event("Warning", "FailedPostStartHook", f"PostStartHook failed: {failure}")
                self.hooks.event("Normal", "Killing", f"Container {self.name} failed its postStart hook")
                unhealthy.set()
                return
        if startup is not None:
            if not await self._startup(startup, launch):
                note = f"Container {self.name} failed startup probe, will be restarted"
                self.hooks.event("Normal", "Killing", note)
                unhealthy.set()
                return
            self.state.apply(StartupPassed())
        if startup is not None or post_start is not None:
            if "readinessProbe" not in others:
                self.state.ready = True
            self.hooks.changed()
            # Their initial delays count from the container's start; the readiness probe's first attempt is now.
            elapsed = self._clock() - (self.state.started_at or self._clock())
            others = {
                key: replace(spec, initial_delay=max(0.0, spec.initial_delay - elapsed)) for key, spec in others.items()
            }
        await asyncio.gather(*(self._probe(key, spec, launch, unhealthy) for key, spec in others.items()))

    async def _startup(self, spec: ProbeSpec, launch: LaunchSpec) -> bool:
        def failed(message: str) -> None:
            self.hooks.event("Warning", "Unhealthy", f"Startup probe failed: {message}")

        worker = ProbeWorker(spec, ProbeTracker.startup(spec), launch.target, lambda *_: None, on_failure=failed)
        try:
            return await worker.run_until_verdict()
        except asyncio.CancelledError:
            raise
        except Exception:  # a bug in probing: take the container as started rather than leave it unstarted
            log.exception("container %s: startup probe failed to run", self.name)
            return True

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
