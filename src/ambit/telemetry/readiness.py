"""Readiness: the node proxy is ready when none of its start-up tasks is pending.

Theory of operation
-------------------
Each component registers a named task while it starts (ztunnel's are "state manager", "proxy", "dns proxy",
"workload proxy manager") and marks it done when it can serve. ``/healthz/ready`` answers 200 ``ready`` when
nothing is pending, else 500 naming the pending tasks.

Rules: a task name is pending once however often it is added; ``done`` of a task that is not pending is a no-op
(so a component may call it on every successful (re)start); :meth:`Readiness.pending` is sorted, so the 500 body
is stable. Pure and synchronous: the readiness server only reads it.
"""

from __future__ import annotations


class Readiness:
    """The set of pending start-up tasks."""

    __slots__ = ("_pending",)

    def __init__(self) -> None:
        self._pending: set[str] = set()

    def add_pending(self, task: str) -> None:
        self._pending.add(task)

    def done(self, task: str) -> None:
        self._pending.discard(task)

    @property
    def ready(self) -> bool:
        return not self._pending

    def pending(self) -> list[str]:
        return sorted(self._pending)
