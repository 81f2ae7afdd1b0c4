"""The node proxy's graceful drain (ztunnel's ``drain`` and ``self_termination_deadline``), sans-IO.

Theory of operation: SIGTERM, SIGINT or ``POST /quitquitquit`` asks the proxy to go away. It then stops accepting
everywhere at once (every pod's listeners and its own admin, stats and readiness ports close, so readiness fails
and a successor bound beside it with SO_REUSEPORT gets every new connection), tells inbound HBONE clients GOAWAY,
and lets the connections it already has run until they end on their own, up to a deadline; what is left then is
closed, and the process exits. :class:`Drain` decides; the daemon (:mod:`ambit.inpod.daemon`) carries the
commands out and feeds it the events. Time is passed in.

Two bounds, chosen by whether a successor took over (issue 21; Istio has only the first):

- **No successor** (a node drained, the mesh uninstalled, the pod deleted with no replacement): ``deadline``
  seconds, ztunnel's ``CONNECTION_TERMINATION_DEADLINE`` (by default the pod's grace period less 5 s). Nobody else
  serves the node's pods, so there is no point in holding their connections much longer than Istio does.
- **Hand-over**: the node agent said (ZDS ``SuccessorReady``, :mod:`ambit.zds.agent`) that a newer node proxy holds
  the full snapshot of the node's pods and gets every new pod. New connections go to it; the established ones stay
  with us until they end, up to ``drain_max`` seconds (one hour by default), so an upgrade resets nothing that ends
  within that.

Rules:

1. ``DrainRequested`` while serving starts the drain: ``StopAccepting`` (listeners, endpoints, GOAWAY, not ready)
   with a deadline ``drain_max`` seconds from now if a successor is ready, else ``deadline`` seconds from now.
2. Once draining, ``ConnectionsCounted`` with none left ends the drain (``Exit``): nothing to wait for.
3. The deadline reached while connections are left closes them (``ForceClose``, naming how many and which bound),
   then ``Exit``.
4. A second ``DrainRequested`` while draining (an operator's second Ctrl+C or SIGTERM) does the same as rule 3.
5. After ``Exit`` every event is ignored; before the drain, counts and deadlines are.
6. ``SuccessorChanged`` records whether a successor is ready. While a drain without a successor runs, a successor
   becoming ready lengthens it to ``drain_max`` from the drain's start (``ExtendDrain``): from then on new
   connections have somewhere to go. A successor lost while a hand-over drain runs does not shorten it: the
   connections we relay do not depend on it, and its restart (the kubelet's) is on the way.
"""

from __future__ import annotations

import enum
from dataclasses import dataclass


class Phase(enum.Enum):
    SERVING = "serving"
    DRAINING = "draining"
    DONE = "done"


# Events: past-tense facts.
@dataclass(frozen=True, slots=True)
class DrainRequested:
    now: float
    reason: str


@dataclass(frozen=True, slots=True)
class ConnectionsCounted:
    now: float
    live: int


@dataclass(frozen=True, slots=True)
class SuccessorChanged:
    now: float
    ready: bool
    """Whether a newer node proxy holds every pod of the node (the node agent's word over ZDS)."""


# Commands: imperative.
@dataclass(frozen=True, slots=True)
class StopAccepting:
    deadline: float
    """Clock time at which connections still open are closed."""
    handover: bool = False
    """Whether the deadline is the hand-over's ``drain_max`` (a successor is ready) or the no-successor bound."""


@dataclass(frozen=True, slots=True)
class ExtendDrain:
    deadline: float
    """The new clock time at which connections still open are closed (a successor became ready, rule 6)."""


@dataclass(frozen=True, slots=True)
class ForceClose:
    live: int
    reason: str


@dataclass(frozen=True, slots=True)
class Exit:
    reason: str


Event = DrainRequested | ConnectionsCounted | SuccessorChanged
Command = StopAccepting | ExtendDrain | ForceClose | Exit


class Drain:
    """One process's drain; see the module docstring's rules."""

    def __init__(self, deadline: float, drain_max: float | None = None) -> None:
        self.phase = Phase.SERVING
        self._timeout = deadline
        self._drain_max = deadline if drain_max is None else max(drain_max, deadline)
        self.successor = False
        """Whether the node agent last said a successor is ready."""
        self.handover = False
        """Whether the drain running is a hand-over's (its bound is ``drain_max``)."""
        self.deadline: float | None = None
        """Clock time at which the drain is cut short, once it started."""
        self.started_at: float | None = None

    @property
    def draining(self) -> bool:
        return self.phase is Phase.DRAINING

    @property
    def over(self) -> bool:
        return self.phase is Phase.DONE

    @property
    def bound(self) -> float:
        """Seconds the running (or next) drain may last."""
        return self._drain_max if self.handover or (self.phase is Phase.SERVING and self.successor) else self._timeout

    def handle(self, event: Event) -> list[Command]:
        if self.phase is Phase.DONE:  # rule 5
            return []
        match event:
            case DrainRequested(now=now, reason=reason):
                if self.phase is Phase.SERVING:  # rule 1
                    self.phase = Phase.DRAINING
                    self.started_at = now
                    self.handover = self.successor
                    self.deadline = now + self.bound
                    return [StopAccepting(self.deadline, self.handover)]
                return self._finish(f"asked again ({reason})", live=None)  # rule 4
            case ConnectionsCounted(now=now, live=live):
                if self.phase is not Phase.DRAINING:
                    return []
                if live <= 0:  # rule 2
                    self.phase = Phase.DONE
                    return [Exit("every connection ended")]
                assert self.deadline is not None
                if now >= self.deadline:  # rule 3
                    what = "drain-max (hand-over)" if self.handover else "drain deadline (no successor)"
                    return self._finish(f"{what} of {self.bound:g} s reached", live)
                return []
            case SuccessorChanged(ready=ready):  # rule 6
                self.successor = ready
                if ready and self.phase is Phase.DRAINING and not self.handover:
                    assert self.started_at is not None
                    self.handover = True
                    self.deadline = self.started_at + self._drain_max
                    return [ExtendDrain(self.deadline)]
                return []
        raise TypeError(f"not a drain event: {event!r}")

    def _finish(self, reason: str, live: int | None) -> list[Command]:
        self.phase = Phase.DONE
        return [ForceClose(-1 if live is None else live, reason), Exit(reason)]
