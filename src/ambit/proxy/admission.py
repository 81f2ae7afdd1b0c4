"""Admission of accepted connections: bounded handshakes and bounded connections, per listener and per process.

Theory of operation: a TCP connection costs its peer almost nothing, and each one costs the proxy a task, buffers
and, on an HBONE port, a TLS handshake that a slow peer may stretch to the handshake timeout. So every listener that
a workload or a peer reaches (a pod's 15008, 15001 and 15006, the node proxy's self-proxy 15008, a waypoint's
15008) has a :class:`ListenerGate`, and the gates of one process share one :class:`NodeBudget`. The accept loop
asks the gate before anything else is done for the connection: a few integer comparisons, no lock, no clock
(the event loop is one thread). Pure bookkeeping: nothing here touches a socket; the shell resets what is refused.

Rules:

1. ``admit(peer)`` decides at accept. It refuses, with the first reason that applies (the listener's own bounds
   first, then the process's; the handshake bounds only on a listener with a handshake, ``ListenerGate.handshake``):
   ``connections``: the listener holds ``ListenerLimits.max_connections`` (pending and established);
   ``pending``: the listener has ``ListenerLimits.max_pending`` handshakes in progress;
   ``peer_pending``: this peer address has ``ListenerLimits.max_pending_per_peer`` of the listener's;
   ``node_connections``: the process holds ``NodeBudget.max_connections`` connections;
   ``node_pending``: the process has ``NodeBudget.max_pending`` handshakes in progress.
2. An admitted connection holds a :class:`Ticket`. On a handshake listener it is *pending* until
   :meth:`Ticket.established` (the handshake is done and the peer judged); elsewhere it is established at once.
   ``established`` cannot fail: the connection was counted against ``max_connections`` from its accept, so a
   connection that completes its handshake always has its place.
3. :meth:`Ticket.release` gives back whatever the ticket holds, from either state; it is idempotent.
4. The gate never closes a connection it admitted. A flood of new connections is refused at accept; it never
   displaces an established one, and since ``max_pending`` is below ``max_connections`` it cannot take every
   place either. How long a pending connection may hold its place is the handshake timeout's business (the shell's:
   one deadline for the certificate and the whole TLS handshake, so a peer sending a byte a second gains nothing).
5. Every refusal is reported to ``NodeBudget.on_refused(listener, reason)`` (a metric); :class:`RefusalLog` turns
   the refusals into at most one log line per listener kind and reason per interval, with the count since the last.

Counts per peer are kept only while the peer has a pending connection, so their number is bounded by the pending
bounds, whatever the number of addresses a flood comes from.
"""

from __future__ import annotations

import enum
import logging
from collections.abc import Callable
from dataclasses import dataclass

from ambit.proxy.errors import ProxyError


class AdmissionSettingsError(ProxyError):
    """A connection limit that cannot work (zero, negative, or a pending bound above the connection bound)."""


class Refusal(enum.StrEnum):
    """Why a connection was refused at accept (the ``reason`` label of the refusal metric)."""

    NODE_CONNECTIONS = "node_connections"
    CONNECTIONS = "connections"
    NODE_PENDING = "node_pending"
    PENDING = "pending"
    PEER_PENDING = "peer_pending"


DEFAULT_HANDSHAKE_TIMEOUT = 10.0


@dataclass(frozen=True, slots=True)
class ListenerLimits:
    """The bounds of one listener (each pod's, each port's own: one pod's flood leaves the others' places alone)."""

    max_connections: int = 4096
    """Connections held at once, pending and established."""
    max_pending: int = 64
    """Connections in their handshake at once (TLS and the peer's judgement); only on listeners with a handshake.
    A TLS connection in progress costs the proxy about 260 KiB (asyncio's and uvloop's TLS read buffer is 256 KiB),
    so this bounds what a flood of one listener may cost: about 16 MiB at the default."""
    max_pending_per_peer: int = 16
    """Connections in their handshake at once from one peer address. A node proxy or waypoint pools its HBONE
    connections per source workload, so a legitimate peer has one or two handshakes in flight, rarely more."""
    handshake_timeout: float = DEFAULT_HANDSHAKE_TIMEOUT
    """Seconds from accept to a judged client: fetching the local certificate and the whole TLS handshake."""

    def __post_init__(self) -> None:
        if self.max_connections < 1 or self.max_pending < 1 or self.max_pending_per_peer < 1:
            raise AdmissionSettingsError(f"connection limits must be at least 1: {self}")
        if self.max_pending > self.max_connections:
            raise AdmissionSettingsError(
                f"max pending handshakes ({self.max_pending}) above max connections ({self.max_connections}): "
                "a flood of handshakes could take every place"
            )
        if self.max_pending_per_peer > self.max_pending:
            raise AdmissionSettingsError(
                f"max pending handshakes per peer ({self.max_pending_per_peer}) above the listener's "
                f"({self.max_pending})"
            )
        if not 0 < self.handshake_timeout < float("inf"):
            raise AdmissionSettingsError(f"the handshake timeout must be a positive number of seconds: {self}")


def _ignore(listener: str, reason: Refusal) -> None:
    return None


class NodeBudget:
    """What every listener of the process shares: connections and handshakes in total."""

    __slots__ = ("connections", "max_connections", "max_pending", "on_refused", "pending")

    def __init__(
        self,
        max_connections: int = 65536,
        max_pending: int = 256,
        on_refused: Callable[[str, Refusal], None] = _ignore,
    ) -> None:
        if max_connections < 1 or max_pending < 1 or max_pending > max_connections:
            raise AdmissionSettingsError(
                f"node connection budget must be at least 1 and hold its pending handshakes: "
                f"{max_connections} connections, {max_pending} pending"
            )
        self.max_connections = max_connections
        self.max_pending = max_pending
        self.on_refused = on_refused
        self.connections = 0
        """Connections held (pending and established) over every gate."""
        self.pending = 0
        """Connections in their handshake over every gate."""


class ListenerGate:
    """One listener's admission (rules 1-3); ``kind`` names the listener in metrics and logs (``hbone``...)."""

    __slots__ = ("budget", "connections", "handshake", "kind", "limits", "pending", "pending_by_peer")

    def __init__(self, kind: str, limits: ListenerLimits, budget: NodeBudget, *, handshake: bool) -> None:
        self.kind = kind
        self.limits = limits
        self.budget = budget
        self.handshake = handshake
        self.connections = 0
        self.pending = 0
        self.pending_by_peer: dict[str, int] = {}

    def admit(self, peer: str) -> Ticket | Refusal:
        """A ticket for a connection from ``peer`` (its address), or why it is refused (rule 1)."""
        budget, limits = self.budget, self.limits
        refusal: Refusal | None = None
        if self.connections >= limits.max_connections:
            refusal = Refusal.CONNECTIONS
        elif self.handshake and self.pending >= limits.max_pending:
            refusal = Refusal.PENDING
        elif self.handshake and self.pending_by_peer.get(peer, 0) >= limits.max_pending_per_peer:
            refusal = Refusal.PEER_PENDING
        elif budget.connections >= budget.max_connections:
            refusal = Refusal.NODE_CONNECTIONS
        elif self.handshake and budget.pending >= budget.max_pending:
            refusal = Refusal.NODE_PENDING
        if refusal is not None:
            budget.on_refused(self.kind, refusal)
            return refusal
        budget.connections += 1
        self.connections += 1
        if not self.handshake:
            return Ticket(self, peer, _ESTABLISHED)
        budget.pending += 1
        self.pending += 1
        self.pending_by_peer[peer] = self.pending_by_peer.get(peer, 0) + 1
        return Ticket(self, peer, _PENDING)

    def _end_pending(self, peer: str) -> None:
        self.budget.pending -= 1
        self.pending -= 1
        left = self.pending_by_peer[peer] - 1
        if left:
            self.pending_by_peer[peer] = left
        else:
            del self.pending_by_peer[peer]


_PENDING, _ESTABLISHED, _RELEASED = 0, 1, 2


class Ticket:
    """One admitted connection's place (rules 2 and 3)."""

    __slots__ = ("_gate", "_peer", "_state")

    def __init__(self, gate: ListenerGate, peer: str, state: int) -> None:
        self._gate, self._peer, self._state = gate, peer, state

    @property
    def pending(self) -> bool:
        return self._state == _PENDING

    @property
    def handshake_timeout(self) -> float:
        """The listener's bound on the handshake of this connection (:attr:`ListenerLimits.handshake_timeout`)."""
        return self._gate.limits.handshake_timeout

    def established(self) -> None:
        """The handshake is done: the connection keeps its place, no longer a pending one."""
        if self._state == _PENDING:
            self._state = _ESTABLISHED
            self._gate._end_pending(self._peer)

    def release(self) -> None:
        """The connection is over (or was never served): its place is free."""
        if self._state == _RELEASED:
            return
        gate = self._gate
        if self._state == _PENDING:
            gate._end_pending(self._peer)
        self._state = _RELEASED
        gate.connections -= 1
        gate.budget.connections -= 1

    def release_when_done(self, _done: object) -> None:
        """:meth:`release`, as a done callback of the task serving the connection (it runs even when the task was
        cancelled before it started)."""
        self.release()


class RefusalLog:
    """Rule 5: at most one line per (listener kind, reason) per ``interval`` seconds; ``now`` is the caller's."""

    __slots__ = ("_interval", "_last", "_since")

    def __init__(self, interval: float = 10.0) -> None:
        self._interval = interval
        self._last: dict[tuple[str, Refusal], float] = {}
        self._since: dict[tuple[str, Refusal], int] = {}

    def note(self, kind: str, reason: Refusal, now: float) -> int:
        """Count one refusal; the number of refusals the caller should log now (this one and those held back since
        the last line), or 0 to stay quiet."""
        key = (kind, reason)
        held = self._since.get(key, 0) + 1
        last = self._last.get(key)
        if last is not None and now - last < self._interval:
            self._since[key] = held
            return 0
        self._last[key] = now
        self._since[key] = 0
        return held


_WHY = {
    Refusal.NODE_CONNECTIONS: "the process holds its maximum of connections",
    Refusal.CONNECTIONS: "the listener holds its maximum of connections",
    Refusal.NODE_PENDING: "the process has its maximum of handshakes in progress",
    Refusal.PENDING: "the listener has its maximum of handshakes in progress",
    Refusal.PEER_PENDING: "one peer address has its maximum of handshakes in progress",
}


def refusal_reporter(
    count: Callable[[str, str], None],
    clock: Callable[[], float],
    logger: logging.Logger,
    *,
    interval: float = 10.0,
) -> Callable[[str, Refusal], None]:
    """A :attr:`NodeBudget.on_refused`: ``count(listener, reason)`` every refusal (the metric), and a warning at most
    once per listener kind and reason per ``interval`` seconds (rule 5)."""
    lines = RefusalLog(interval)

    def refused(kind: str, reason: Refusal) -> None:
        count(kind, reason.value)
        held = lines.note(kind, reason, clock())
        if held:
            logger.warning(
                "%s listener: refused %d connection(s) at accept (%s): %s", kind, held, reason.value, _WHY[reason]
            )

    return refused
