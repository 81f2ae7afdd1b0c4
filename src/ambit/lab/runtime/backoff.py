"""Restart back-off: how long to wait before starting again something that exited (pure).

The policy of the pod worker that restarts containers (:mod:`ambit.lab.runtime.containers`, the kubelet's
CrashLoopBackOff), with its constants and whether the first restart waits as parameters.

Rules (:class:`RestartBackoff`; bookkeeping only, the caller passes the times and sleeps):

1. Exits are counted in a streak. The first exit of a streak waits ``initial``, or nothing when
   ``immediate_first`` (the kubelet restarts a container at once the first time).
2. Each further exit of the streak waits twice the delay before it (``initial`` after an immediate first), up to
   ``maximum``.
3. An instance that ran at least ``reset_after`` seconds before it exited starts a new streak (a crash an hour
   after the last one is not a crash loop).
"""

from __future__ import annotations

from dataclasses import dataclass

_MAX_DOUBLINGS = 1000
"""Past this the delay is ``maximum`` anyway; the bound keeps ``2.0 ** n`` finite however long the streak."""


@dataclass(slots=True)
class RestartBackoff:
    """The restart delays of one restartable thing (rules 1 to 3)."""

    initial: float
    """The first delay of a streak (the second when ``immediate_first``), in seconds."""
    maximum: float
    """The longest delay, in seconds."""
    reset_after: float
    """An instance that ran this long before it exited starts a new streak (rule 3)."""
    immediate_first: bool = False
    """The first exit of a streak waits nothing (rule 1)."""
    streak: int = 0
    """Exits counted in the current streak."""

    def delay_after_exit(self, started: float, now: float) -> float:
        """The delay before starting again an instance that started at ``started`` and exited at ``now``."""
        if now - started >= self.reset_after:
            self.streak = 0
        doublings = self.streak - 1 if self.immediate_first else self.streak
        self.streak += 1
        if doublings < 0:
            return 0.0
        return min(self.initial * 2.0 ** min(doublings, _MAX_DOUBLINGS), self.maximum)
