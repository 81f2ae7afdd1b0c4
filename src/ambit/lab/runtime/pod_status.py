"""A pod's status as its node reports it, computed without I/O, and the merge patch that writes it.

Theory of operation. :func:`pod_status` derives the phase, the conditions (``PodReadyToStartContainers``,
``Initialized``, ``Ready``, ``ContainersReady``, ``PodScheduled``), the addresses and the container statuses (init
containers' too) from a :class:`PodView` (the pod worker's state). ``Initialized`` is false, naming the init
containers that have not completed, until they all have (rule 10 of :mod:`ambit.lab.runtime.containers`). A
condition keeps its ``lastTransitionTime`` while its status stays the same; ``PodScheduled`` is the scheduler's and
is kept as written. A pod being terminated has a final phase (Succeeded when every container exited 0, else
Failed). :func:`status_patch` turns what was last written and the
new status into a merge patch of the keys the node manages (:data:`MANAGED_STATUS`), or None when nothing
changed: status is written only when it differs (rule 5 of :mod:`ambit.lab.runtime.pod_worker`).
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import Any

from ambit.lab.network.plugins import CniInvocationError
from ambit.lab.runtime.containers import (
    ContainerState,
    Phase,
    container_status,
    incomplete_init,
    is_sidecar,
    pod_phase,
    rfc3339,
)

MANAGED_STATUS = (
    "phase",
    "conditions",
    "hostIP",
    "hostIPs",
    "podIP",
    "podIPs",
    "startTime",
    "initContainerStatuses",
    "containerStatuses",
)


def _condition(
    kind: str, ok: bool, now: float, previous: Mapping[str, Mapping[str, Any]], reason: str = "", message: str = ""
) -> dict[str, Any]:
    status = "True" if ok else "False"
    before = previous.get(kind) or {}
    since = before.get("lastTransitionTime") if before.get("status") == status else None
    cond: dict[str, Any] = {"type": kind, "status": status, "lastTransitionTime": since or rfc3339(now)}
    if reason:
        cond["reason"] = reason
    if message:
        cond["message"] = message
    return cond


@dataclass(frozen=True, slots=True)
class PodView:
    """What a pod's status is computed from."""

    restart_policy: str
    containers: Sequence[tuple[ContainerState, str]]
    """Each container's state with its image."""
    pod_ref: str
    host_ip: str
    pod_ips: tuple[str, ...]
    sandbox_ready: bool
    sandbox_error: str
    start_time: str
    deleted: bool = False
    """Being terminated: the phase is final (Succeeded when every container exited 0, else Failed)."""
    host_ip6: str = ""
    """The node's IPv6 address in a dual-stack lab: ``hostIPs``' second entry, as the kubelet reports both."""
    init_containers: Sequence[tuple[ContainerState, str]] = ()
    """Each init container's state with its image, in order."""
    initialized: bool = False
    """The pod's init containers all completed (or started, sidecars) once: ``Initialized`` stays true after, when a
    sidecar restarts, as the kubelet keeps it."""


def pod_status(view: PodView, previous: Mapping[str, Any], now: float) -> dict[str, Any]:
    """The status the node reports; ``previous`` is the pod's current status (for transition times)."""
    states = [state for state, _ in view.containers]
    init_states = [state for state, _ in view.init_containers]
    incomplete = [] if view.initialized else incomplete_init(init_states)
    phase = pod_phase(view.restart_policy, states, [] if view.initialized else init_states)
    if view.deleted and phase not in ("Succeeded", "Failed"):
        all_ok = all((s.last_termination or {}).get("exitCode") == 0 and s.phase is Phase.EXITED for s in states)
        phase = "Succeeded" if all_ok and states else "Failed"
    conditions = {
        str(c.get("type")): c for c in previous.get("conditions") or () if isinstance(c, dict) and c.get("type")
    }
    sidecars = [s for s in init_states if is_sidecar(s)]
    unready = [s.name for s in (*sidecars, *states) if not (s.ready and s.phase is Phase.RUNNING)]
    terminal = phase in ("Succeeded", "Failed")
    if terminal:
        ready_reason, ready_message = "PodCompleted", ""
    elif unready:
        ready_reason, ready_message = "ContainersNotReady", f"containers with unready status: [{' '.join(unready)}]"
        if view.sandbox_error:
            ready_message += f"; pod sandbox not created: {view.sandbox_error}"
    else:
        ready_reason = ready_message = ""
    sandbox_reason = "FailedCreatePodSandBox" if view.sandbox_error else ""
    scheduled = conditions.get("PodScheduled")
    status: dict[str, Any] = {
        "phase": phase,
        "conditions": [
            _condition(
                "PodReadyToStartContainers", view.sandbox_ready, now, conditions, sandbox_reason, view.sandbox_error
            ),
            _condition("Initialized", True, now, conditions, "PodCompleted" if terminal else "")
            if not incomplete
            else _condition(
                "Initialized",
                False,
                now,
                conditions,
                "ContainersNotInitialized",
                f"containers with incomplete status: [{' '.join(incomplete)}]",
            ),
            _condition("Ready", not unready and not terminal, now, conditions, ready_reason, ready_message),
            _condition("ContainersReady", not unready and not terminal, now, conditions, ready_reason, ready_message),
            dict(scheduled) if scheduled else _condition("PodScheduled", True, now, conditions),
        ],
        "hostIP": view.host_ip,
        "hostIPs": [{"ip": ip} for ip in (view.host_ip, view.host_ip6) if ip],
        "startTime": view.start_time,
        "containerStatuses": [
            container_status(state, image, view.pod_ref, initializing=bool(incomplete))
            for state, image in view.containers
        ],
    }
    if view.init_containers:
        status["initContainerStatuses"] = [
            container_status(state, image, view.pod_ref, init=True) for state, image in view.init_containers
        ]
    if view.pod_ips:
        status["podIP"] = view.pod_ips[0]
        status["podIPs"] = [{"ip": ip} for ip in view.pod_ips]
    return status


def status_patch(written: Mapping[str, Any], status: Mapping[str, Any]) -> dict[str, Any] | None:
    """A merge patch from ``written`` to ``status`` (managed keys only), or None when nothing changed."""
    patch = {k: v for k, v in status.items() if written.get(k) != v}
    patch.update({k: None for k in MANAGED_STATUS if k in written and k not in status})
    return {"status": patch} if patch else None


def sandbox_error_message(exc: BaseException) -> str:
    """What a sandbox failure says, in the kubelet's words for a CNI plugin's error."""
    if isinstance(exc, CniInvocationError):
        text = exc.error.msg or "no message"
        if exc.plugin:
            text = f'plugin type="{exc.plugin}" failed ({(exc.command or "add").lower()}): {text}'
        return f"{text}: {exc.error.details}" if exc.error.details else text
    return str(exc) or type(exc).__name__
