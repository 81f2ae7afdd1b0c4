"""The cells kube-apiserver prints for a Pod in ``kubectl get pods``, and the conditions of its table row (pure; the
columns are in :data:`ambit.apiserver.printers.PRINTERS`).

Columns: NAME, READY (ready containers out of all), STATUS, RESTARTS (with the time since the last one), AGE, then
the wide IP (the first pod IP), NODE, NOMINATED NODE and READINESS GATES (true gates out of all). STATUS reads the pod
as kubectl does: the phase, or the reason of an init container's or a container's waiting or terminated state, and
``Terminating`` once the pod is deleted (``Unknown`` on a lost node). The row of a pod that finished (Succeeded or
Failed) carries a ``Completed`` condition, so that clients tell it apart without parsing the STATUS cell.

Invariants (those of :mod:`ambit.apiserver.printers`): a cell function never raises on any JSON-shaped object, and
time comes in as ``now``.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

from ambit.apiserver.cells import (
    Cell,
    age,
    as_int,
    as_list,
    as_map,
    as_maps,
    as_str,
    human_duration,
    name_of,
    parse_timestamp,
)


def pod_cells(pod: Mapping[str, Any], now: float) -> list[Cell]:
    spec, status = as_map(pod.get("spec")), as_map(pod.get("status"))
    ready, total, restarts, reason = _pod_summary(spec, status)
    restarts_cell = str(restarts.count)
    if restarts.count and restarts.last is not None:
        restarts_cell = f"{restarts.count} ({human_duration(now - restarts.last)} ago)"
    if as_map(pod.get("metadata")).get("deletionTimestamp"):
        if status.get("reason") == "NodeLost":
            reason = "Unknown"
        elif status.get("phase") not in ("Succeeded", "Failed"):
            reason = "Terminating"
    ips = [as_str(as_map(ip).get("ip")) for ip in as_list(status.get("podIPs"))]
    ip = (ips[0] if ips else "") or as_str(status.get("podIP")) or "<none>"
    gates = [as_str(g.get("conditionType")) for g in as_maps(spec.get("readinessGates"))]
    gates_cell = "<none>"
    if gates:
        true = {as_str(c.get("type")) for c in as_maps(status.get("conditions")) if c.get("status") == "True"}
        gates_cell = f"{sum(1 for g in gates if g in true)}/{len(gates)}"
    return [
        name_of(pod),
        f"{ready}/{total}",
        reason,
        restarts_cell,
        age(pod, now),
        ip,
        as_str(spec.get("nodeName")) or "<none>",
        as_str(status.get("nominatedNodeName")) or "<none>",
        gates_cell,
    ]


@dataclass(slots=True)
class _Restarts:
    count: int = 0
    last: float | None = None

    def add(self, container_status: Mapping[str, Any]) -> None:
        self.count += as_int(container_status.get("restartCount"))
        last_state = as_map(as_map(container_status.get("lastState")).get("terminated"))
        finished = parse_timestamp(last_state.get("finishedAt"))
        if finished is not None and (self.last is None or finished > self.last):
            self.last = finished


def _pod_summary(spec: Mapping[str, Any], status: Mapping[str, Any]) -> tuple[int, int, _Restarts, str]:
    """(ready containers, containers, restarts, status reason) the way kubectl's STATUS column reads a pod.

    Init containers are looked at first: the first one that has not finished successfully names the status
    (``Init:1/2``, ``Init:CrashLoopBackOff``). Then the last app container with a waiting or terminated reason
    wins, so a crash-looping container shows through a phase of Running. Sidecars (init containers with
    ``restartPolicy: Always``) count as containers once started.
    """
    init_specs = as_maps(spec.get("initContainers"))
    sidecars = {as_str(c.get("name")) for c in init_specs if c.get("restartPolicy") == "Always"}
    total = len(as_list(spec.get("containers"))) + len(sidecars)
    ready = 0
    reason = as_str(status.get("reason")) or as_str(status.get("phase"))
    conditions = {as_str(c.get("type")): c for c in as_maps(status.get("conditions"))}
    scheduled = as_map(conditions.get("PodScheduled"))
    if scheduled.get("status") == "False" and scheduled.get("reason") == "SchedulingGated":
        reason = "SchedulingGated"

    sidecar_restarts = _Restarts()
    restarts = _Restarts()
    initializing = False
    for i, cs in enumerate(as_maps(status.get("initContainerStatuses"))):
        restarts.add(cs)
        is_sidecar = as_str(cs.get("name")) in sidecars
        if is_sidecar:
            sidecar_restarts.add(cs)
        state = as_map(cs.get("state"))
        terminated, waiting = as_map(state.get("terminated")), as_map(state.get("waiting"))
        if state.get("terminated") is not None and as_int(terminated.get("exitCode")) == 0:
            continue
        if is_sidecar and cs.get("started") is True:
            ready += 1 if cs.get("ready") is True else 0
            continue
        if state.get("terminated") is not None:
            reason = "Init:" + (as_str(terminated.get("reason")) or _exit_text(terminated))
        elif as_str(waiting.get("reason")) not in ("", "PodInitializing"):
            reason = "Init:" + as_str(waiting.get("reason"))
        else:
            reason = f"Init:{i}/{len(init_specs)}"
        initializing = True
        break

    if not initializing or as_map(conditions.get("Initialized")).get("status") == "True":
        restarts = sidecar_restarts
        running = False
        for cs in reversed(as_maps(status.get("containerStatuses"))):
            restarts.add(cs)
            state = as_map(cs.get("state"))
            terminated, waiting = as_map(state.get("terminated")), as_map(state.get("waiting"))
            if as_str(waiting.get("reason")):
                reason = as_str(waiting.get("reason"))
            elif state.get("terminated") is not None:
                reason = as_str(terminated.get("reason")) or _exit_text(terminated)
            elif cs.get("ready") is True and state.get("running") is not None:
                running = True
                ready += 1
        if reason == "Completed" and running:
            reason = "Running" if as_map(conditions.get("Ready")).get("status") == "True" else "NotReady"
    return ready, total, restarts, reason


def _exit_text(terminated: Mapping[str, Any]) -> str:
    signal = as_int(terminated.get("signal"))
    return f"Signal:{signal}" if signal else f"ExitCode:{as_int(terminated.get('exitCode'))}"


def pod_conditions(pod: Mapping[str, Any]) -> list[dict[str, Any]]:
    # kube-apiserver marks finished pods so clients can tell them apart without parsing the status cell.
    phase = as_map(pod.get("status")).get("phase")
    message = {"Succeeded": "The pod has completed successfully.", "Failed": "The pod failed."}.get(str(phase))
    if message is None:
        return []
    return [{"type": "Completed", "status": "True", "reason": phase, "message": message}]
