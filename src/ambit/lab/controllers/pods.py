"""What controllers read off a pod and its conditions (pure; time comes in as ``now``).

- *terminal*: phase Succeeded or Failed; it will never run again.
- *terminating*: ``deletionTimestamp`` is set; it is going away (a bound pod lingers until its node stops it).
- *active*: neither; it counts towards a ReplicaSet's replicas. A deleted or Failed pod is therefore replaced.
- *ready*: its ``Ready`` condition is True. *available*: ready for at least ``minReadySeconds``.
"""

from __future__ import annotations

from collections.abc import Mapping
from datetime import UTC, datetime
from typing import Any

from ambit.lab.controllers.ownership import is_deleting


def rfc3339(ts: float) -> str:
    return datetime.fromtimestamp(ts, UTC).strftime("%Y-%m-%dT%H:%M:%SZ")


def parse_time(value: Any) -> float | None:
    if not isinstance(value, str) or not value:
        return None
    try:
        return datetime.fromisoformat(value.replace("Z", "+00:00")).timestamp()
    except ValueError:
        return None


def phase(pod: Mapping[str, Any]) -> str:
    return str((pod.get("status") or {}).get("phase") or "Pending")


def is_terminal(pod: Mapping[str, Any]) -> bool:
    return phase(pod) in ("Succeeded", "Failed")


def is_active(pod: Mapping[str, Any]) -> bool:
    return not is_terminal(pod) and not is_deleting(pod)


def condition(obj: Mapping[str, Any], kind: str) -> dict[str, Any] | None:
    for cond in (obj.get("status") or {}).get("conditions") or ():
        if isinstance(cond, dict) and cond.get("type") == kind:
            return cond
    return None


def is_ready(pod: Mapping[str, Any]) -> bool:
    cond = condition(pod, "Ready")
    return cond is not None and cond.get("status") == "True"


def unavailable_for(pod: Mapping[str, Any], min_ready_seconds: int, now: float) -> float | None:
    """Seconds until a ready pod becomes available (0: it is), or None when it is not ready."""
    if not is_ready(pod):
        return None
    if min_ready_seconds <= 0:
        return 0.0
    since = parse_time((condition(pod, "Ready") or {}).get("lastTransitionTime"))
    if since is None:
        return 0.0
    return max(0.0, since + min_ready_seconds - now)


def is_available(pod: Mapping[str, Any], min_ready_seconds: int, now: float) -> bool:
    return unavailable_for(pod, min_ready_seconds, now) == 0.0


def restarts(pod: Mapping[str, Any]) -> int:
    total = 0
    for status in (pod.get("status") or {}).get("containerStatuses") or ():
        if isinstance(status, dict) and isinstance(status.get("restartCount"), int):
            total += status["restartCount"]
    return total


_PHASE_RANK = {"Pending": 0, "Unknown": 1, "Running": 2}


def deletion_rank(pod: Mapping[str, Any]) -> tuple[int, int, int, float, int, float, str]:
    """Sort key putting the pods to delete first when scaling down (kube's ``ActivePods`` order): unbound before
    bound, Pending before Running, not ready before ready, ready more recently first, more restarts first,
    newest first."""
    meta = pod.get("metadata") or {}
    ready = is_ready(pod)
    ready_since = parse_time((condition(pod, "Ready") or {}).get("lastTransitionTime")) or 0.0
    created = parse_time(meta.get("creationTimestamp")) or 0.0
    return (
        1 if (pod.get("spec") or {}).get("nodeName") else 0,
        _PHASE_RANK.get(phase(pod), 0),
        1 if ready else 0,
        -ready_since if ready else 0.0,
        -restarts(pod),
        -created,
        str(meta.get("name") or ""),
    )
