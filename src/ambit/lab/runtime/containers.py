"""The state of one container: a pure state machine, and the container status and pod phase computed from it.

:class:`ContainerState` is driven by events (:class:`Started`, :class:`ConfigFailed`, :class:`Exited`,
:class:`StopRequested`); its asyncio shell is :class:`ambit.lab.runtime.containers_apply.ContainerSupervisor`. Phases,
and what the container status shows in each::

    CREATING      waiting: ContainerCreating            never started yet
    CONFIG_ERROR  waiting: CreateContainerConfigError   cannot be started as specified (no command, missing key),
                  or CreateContainerError /           or the container runtime could not create or start it
                  RunContainerError
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
Rule 5. Restart back-off is the kubelet's (:func:`crash_loop_backoff`, an
        :class:`ambit.lab.runtime.backoff.RestartBackoff`): the first restart is immediate, then ``initial``, 2 x
        ``initial``, ... up to ``maximum``; an instance that ran ``reset_after`` seconds starts the count over.
Rule 6. An exit whose code cannot be known (an adopted process) is reported as the kubelet reports a container it
        lost: exit code 137, reason ``ContainerStatusUnknown``.
Rule 7. ``StopRequested`` out of BACKING_OFF ends in EXITED at once (there is no process); out of RUNNING it marks
        the container stopping, and the ``Exited`` that follows the signal ends in EXITED.
Rule 8. ``ConfigFailed`` out of RUNNING is an instance the container runtime could not create or start (its
        process never ran): the container waits in CONFIG_ERROR with the runtime's reason and message; nothing is
        counted as a restart and no termination is recorded.
Rule 9. ``started`` (the status's ``started``) is true while RUNNING once the startup probe passed: an instance of a
        container with a startup probe (``Started.startup_probe``) starts unstarted, and :class:`StartupPassed`
        marks it started; without one it is started as soon as it runs (the kubelet's ``UpdatePodStatus``).
Rule 10. Init containers run the same machine with the restart policy :func:`init_restart_policy` gives (a
        completed one never runs again). Their status waits as ``PodInitializing`` before they run and is ready once
        they completed (exit code 0), as the kubelet's prober manager says; app containers wait as
        ``PodInitializing`` until every init container completed (:func:`incomplete_init`). An init container that
        exited for good with another code fails the pod (:func:`pod_phase`, which only a ``Never`` policy allows).
Rule 11. A native sidecar (an init container whose own ``restartPolicy`` is Always: its state's policy is Always,
        which no plain init container gets) counts as initialized once it is ``started`` (rule 9); it is restarted
        whenever it exits, its status is ready by its readiness as an app container's, and it never fails the
        pod's initialization.
"""

from __future__ import annotations

import enum
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from datetime import UTC, datetime
from typing import Any

from ambit.errors import AmbitError
from ambit.lab.runtime.backoff import RestartBackoff

UNKNOWN_EXIT_CODE = 137


class ContainerStateError(AmbitError):
    """An event arrived that the container's phase does not accept (a bug in the caller)."""


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
    startup_probe: bool = False
    """The container has a startup probe: the instance is not ``started`` until :class:`StartupPassed` (rule 9)."""


@dataclass(frozen=True, slots=True)
class StartupPassed:
    """The running instance's startup probe succeeded (rule 9)."""


@dataclass(frozen=True, slots=True)
class ConfigFailed:
    message: str
    reason: str = "CreateContainerConfigError"


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


ContainerEvent = Started | StartupPassed | ConfigFailed | Exited | StopRequested

_WAITING = (Phase.CREATING, Phase.CONFIG_ERROR, Phase.BACKING_OFF)
_TRANSITIONS: dict[tuple[Phase, type[ContainerEvent]], tuple[Phase, ...]] = {
    **{(p, Started): (Phase.RUNNING,) for p in _WAITING},
    **{(p, ConfigFailed): (Phase.CONFIG_ERROR,) for p in _WAITING},
    (Phase.RUNNING, StartupPassed): (Phase.RUNNING,),
    (Phase.RUNNING, Exited): (Phase.BACKING_OFF, Phase.EXITED),
    (Phase.RUNNING, ConfigFailed): (Phase.CONFIG_ERROR,),
}


def should_restart(restart_policy: str, exit_code: int | None) -> bool:
    if restart_policy == "Never":
        return False
    if restart_policy == "OnFailure":
        return exit_code != 0
    return True  # Always, and the default


def init_restart_policy(pod_policy: str) -> str:
    """Rule 10: an init container is restarted after a failure unless the pod's policy is Never."""
    return "Never" if pod_policy == "Never" else "OnFailure"


def is_sidecar(state: ContainerState) -> bool:
    """Rule 11: an init container that keeps running beside the app containers."""
    return state.restart_policy == "Always"


def crash_loop_backoff(initial: float = 10.0, maximum: float = 300.0, reset_after: float = 600.0) -> RestartBackoff:
    """Rule 5: the kubelet's container restart back-off (the first restart of a streak is immediate)."""
    return RestartBackoff(initial, maximum, reset_after, immediate_first=True)


@dataclass(slots=True)
class ContainerState:
    name: str
    restart_policy: str
    backoff: RestartBackoff = field(default_factory=crash_loop_backoff)
    phase: Phase = Phase.CREATING
    stopping: bool = False
    restart_count: int = 0
    pid: int | None = None
    started_at: float | None = None
    ready: bool = False
    startup_passed: bool = True
    """Rule 9: false from the ``Started`` of an instance with a startup probe until its ``StartupPassed``."""
    message: str = ""
    """Why the container waits (CONFIG_ERROR)."""
    reason: str = "CreateContainerConfigError"
    """The waiting reason in CONFIG_ERROR."""
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
            self.startup_passed = not event.startup_probe
        elif isinstance(event, StartupPassed):
            self.startup_passed = True
        elif isinstance(event, ConfigFailed):
            if self.phase is Phase.RUNNING:  # rule 8: the instance never ran, its Started counts for nothing
                self.pid, self.started_at, self.ready = None, None, False
                if self.last_termination is not None:
                    self.restart_count -= 1
            self.phase, self.message, self.reason = Phase.CONFIG_ERROR, event.message, event.reason
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
        self.backoff_delay = self.backoff.delay_after_exit(started, event.at)
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
        self.startup_passed = status.get("started") is not False  # a started instance is not probed for it again

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

    def assume_completed(self) -> None:
        """An init container of a pod known to be initialized whose status was never reported (rule 10)."""
        self.phase = Phase.EXITED
        self.last_termination = self.last_termination or {"exitCode": 0, "reason": "Completed"}

    @property
    def completed(self) -> bool:
        """Exited for good with exit code 0 (an init container that did its work)."""
        return self.phase is Phase.EXITED and (self.last_termination or {}).get("exitCode") == 0

    @property
    def started(self) -> bool:
        return self.phase is Phase.RUNNING and self.startup_passed


def container_id(pid: int) -> str:
    return f"ambit://{pid}"


def container_status(
    state: ContainerState, image: str, pod_ref: str, *, init: bool = False, initializing: bool = False
) -> dict[str, Any]:
    """The ``containerStatuses`` entry (rule 4), or with ``init`` the ``initContainerStatuses`` one (rule 10);
    ``initializing``: an app container of a pod whose init containers have not all completed. ``pod_ref`` is
    ``name_namespace(uid)`` for messages."""
    current: dict[str, Any]
    last: dict[str, Any] | None = state.last_termination
    if state.phase is Phase.CREATING:
        current = {"waiting": {"reason": "PodInitializing" if init or initializing else "ContainerCreating"}}
    elif state.phase is Phase.CONFIG_ERROR:
        current = {"waiting": {"reason": state.reason, "message": state.message}}
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
        "ready": state.completed if init and not is_sidecar(state) else state.ready and state.phase is Phase.RUNNING,
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


def incomplete_init(init_states: Sequence[ContainerState]) -> list[str]:
    """The init containers that have not completed, or (sidecars, rule 11) not started, in order (rule 10)."""
    return [s.name for s in init_states if not (s.started if is_sidecar(s) else s.completed)]


def pod_phase(restart_policy: str, states: Sequence[ContainerState], init_states: Sequence[ContainerState] = ()) -> str:
    """The pod phase from its containers, as the kubelet's ``getPhase`` computes it: Pending while initializing,
    Failed when an init container exited for good unsuccessfully (rule 10)."""
    if incomplete_init(init_states):
        failed = any(s.phase is Phase.EXITED and not s.completed and not is_sidecar(s) for s in init_states)
        return "Failed" if failed else "Pending"
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
