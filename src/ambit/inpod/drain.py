"""The node proxy's graceful drain (ztunnel's ``drain`` and ``self_termination_deadline``), sans-IO.

Theory of operation: SIGTERM, SIGINT or ``POST /quitquitquit`` asks the proxy to go away. It then stops accepting
everywhere at once (every pod's listeners and its own admin, stats and readiness ports close, so readiness fails
and a successor bound beside it with SO_REUSEPORT gets every new connection), tells inbound HBONE clients GOAWAY,
and lets the connections it already has run until they end on their own, up to a deadline; what is left then is
closed, and the process exits. :class:`Drain` decides; the daemon (:mod:`ambit.inpod.daemon`) carries the
commands out and feeds it the events. Time is passed in.

Rules:

1. ``DrainRequested`` while serving starts the drain: ``StopAccepting`` (listeners, endpoints, GOAWAY, not ready)
   and a deadline ``deadline`` seconds from now.
2. Once draining, ``ConnectionsCounted`` with none left ends the drain (``Exit``): nothing to wait for.
3. The deadline reached while connections are left closes them (``ForceClose``, naming how many), then ``Exit``.
4. A second ``DrainRequested`` while draining (an operator's second Ctrl+C or SIGTERM) does the same as rule 3.
5. After ``Exit`` every event is ignored; before the drain, counts and deadlines are.
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


# Commands: imperative.
@dataclass(frozen=True, slots=True)
class StopAccepting:
    deadline: float
    """Clock time at which connections still open are closed."""


@dataclass(frozen=True, slots=True)
class ForceClose:
    live: int
    reason: str


@dataclass(frozen=True, slots=True)
class Exit:
    reason: str


Event = DrainRequested | ConnectionsCounted
Command = StopAccepting | ForceClose | Exit


class Drain:
    """One process's drain; see the module docstring's rules."""

    def __init__(self, deadline: float) -> None:
        self.phase = Phase.SERVING
        self._timeout = deadline
        self.deadline: float | None = None
        """Clock time at which the drain is cut short, once it started."""
        self.started_at: float | None = None

    @property
    def draining(self) -> bool:
        return self.phase is Phase.DRAINING

    @property
    def over(self) -> bool:
        return self.phase is Phase.DONE

    def handle(self, event: Event) -> list[Command]:
        if self.phase is Phase.DONE:  # rule 5
            return []
        match event:
            case DrainRequested(now=now, reason=reason):
                if self.phase is Phase.SERVING:  # rule 1
                    self.phase = Phase.DRAINING
                    self.started_at = now
                    self.deadline = now + self._timeout
                    return [StopAccepting(self.deadline)]
                return self._finish(f"asked again ({reason})", live=None)  # rule 4
            case ConnectionsCounted(now=now, live=live):
                if self.phase is not Phase.DRAINING:
                    return []
                if live <= 0:  # rule 2
                    self.phase = Phase.DONE
                    return [Exit("every connection ended")]
                assert self.deadline is not None
                if now >= self.deadline:  # rule 3
                    return self._finish(f"drain deadline of {self._timeout:g} s reached", live)
                return []
        raise TypeError(f"not a drain event: {event!r}")

    def _finish(self, reason: str, live: int | None) -> list[Command]:
        self.phase = Phase.DONE
        return [ForceClose(-1 if live is None else live, reason), Exit(reason)]
