"""Admission of accepted connections: bounded handshakes and bounded connections, per listener and per process.

Theory of operation: a TCP connection costs its peer almost nothing, and each one costs the proxy a task, buffers
and, on an HBONE port, a TLS handshake that a slow peer may stretch to the handshake timeout. So every listener that
a workload or a peer reaches (a pod's 15008, 15001 and 15006, the node proxy's self-proxy 15008, a waypoint's
15008) has a :class:`ListenerGate`, and the gates of one process share one :class:`NodeBudget`. The accept loop
asks the gate before anything else is done for the connection: a few integer comparisons, no lock, no clock
(the event loop is one thread). Pure bookkeeping: nothing here touches a socket; the shell resets what is refused.

Rules:

1. ``admit(peer)`` decides at accept, with the listener's own bounds first, then the process's (the handshake bounds
   apply only on a listener with a handshake, ``ListenerGate.handshake``). It refuses when
   ``connections``: the listener holds ``ListenerLimits.max_connections`` (pending and established);
   ``peer_pending``: this peer address has ``ListenerLimits.max_pending_per_peer`` handshakes in progress there;
   ``node_connections``: the process holds ``NodeBudget.max_connections`` connections;
   ``node_peer_connections``: this peer address holds ``NodeBudget.max_connections_per_peer`` of them, pending or
   established, over every listener (a peer with a valid certificate could otherwise keep the whole budget with
   idle established connections).
2. When the listener has ``ListenerLimits.max_pending`` handshakes in progress, the newcomer takes the place of the
   oldest of them, which is evicted (its connection closed); likewise, over the process, when it has
   ``NodeBudget.max_pending``. A full pending bound would otherwise be a lever of its own (tls-listener's
   RUSTSEC-2024-0341): a few connections every timeout from a few addresses would lock every new client out. With
   eviction a flood must open connections faster than a legitimate handshake completes (milliseconds) to keep one
   out, and what it holds is still bounded. Only a ticket whose shell said how to close it (:meth:`Ticket.on_evict`)
   is evicted; without one the newcomer is refused (``pending``, ``node_pending``).
3. An admitted connection holds a :class:`Ticket`. On a handshake listener it is *pending* until
   :meth:`Ticket.established` (the handshake is done and the peer judged); elsewhere it is established at once.
   ``established`` cannot fail: the connection was counted against ``max_connections`` from its accept, so a
   connection that completes its handshake always has its place.
4. :meth:`Ticket.release` gives back whatever the ticket holds, from either state; it is idempotent.
5. An established connection is never closed by the gate (its own deadlines, ``ListenerLimits.liveness``, are the
   connection's business: :mod:`ambit.hbone.liveness`): a flood of new connections is refused at accept or
   evicts pending ones, it never displaces an established one; and since ``max_pending`` is below
   ``max_connections`` it cannot take every place either. How long a pending connection may hold its place is also
   bounded by the handshake timeout (the shell's: one deadline for the certificate and the whole TLS handshake, so a
   peer sending a byte a second gains nothing).
6. Every refusal and eviction is reported to ``NodeBudget.on_refused(listener, reason)`` (a metric);
   :class:`RefusalLog` turns them into at most one log line per listener kind and reason per interval, with the
   count since the last.

Pending tickets are kept oldest first (a dict keeps insertion order), so the oldest is found and removed in constant
time. Counts per peer are kept only while the peer has a pending connection, so their number is bounded by the
pending bounds, whatever the number of addresses a flood comes from.
"""

from __future__ import annotations

import enum
import logging
from collections.abc import Callable
from dataclasses import dataclass, field

from ambit.hbone.liveness import LivenessSettings
from ambit.proxy.errors import ProxyError


class AdmissionSettingsError(ProxyError):
    """A connection limit that cannot work (zero, negative, or a pending bound above the connection bound)."""


class Refusal(enum.StrEnum):
    """Why a connection was refused at accept, or closed in its handshake (the ``reason`` label of the metric)."""

    CONNECTIONS = "connections"
    PEER_PENDING = "peer_pending"
    NODE_CONNECTIONS = "node_connections"
    NODE_PEER_CONNECTIONS = "node_peer_connections"
    PENDING = "pending"
    NODE_PENDING = "node_pending"
    EVICTED = "pending_evicted"
    """Not a refusal of the newcomer: the oldest handshake in progress, closed to make room for it (rule 2)."""


DEFAULT_HANDSHAKE_TIMEOUT = 10.0
DEFAULT_NODE_CONNECTIONS_PER_PEER = 1024
"""Connections one peer address may hold over the process: with 100 tunnels on each pooled HBONE connection, far
more than a workload needs, and a small share of the node's budget."""


@dataclass(frozen=True, slots=True)
class ListenerLimits:
    """The bounds of one listener (each pod's, each port's own: one pod's flood takes none of another's places, but
    for the process's budget, :class:`NodeBudget`, which they all share)."""

    max_connections: int = 4096
    """Connections held at once, pending and established."""
    max_pending: int = 64
    """Connections in their handshake at once (TLS and the peer's judgement); only on listeners with a handshake.
    A TLS connection allocates a 256 KiB read buffer (asyncio's and uvloop's; untouched pages of it are not
    resident until used), so this bounds what a flood of one listener may cost: 16 MiB at most at the default."""
    max_pending_per_peer: int = 16
    """Connections in their handshake at once from one peer address. A node proxy or waypoint pools its HBONE
    connections per source workload, so a legitimate peer has one or two handshakes in flight, rarely more."""
    handshake_timeout: float = DEFAULT_HANDSHAKE_TIMEOUT
    """Seconds from accept to a judged client: fetching the local certificate and the whole TLS handshake."""
    liveness: LivenessSettings = field(default_factory=LivenessSettings)
    """After the handshake, on an HBONE listener: the deadlines that keep an established connection from holding its
    place for ever without doing its part (HTTP/2 preface, idle, keepalive; :mod:`ambit.hbone.liveness`)."""

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

    __slots__ = (
        "_pending",
        "by_peer",
        "connections",
        "max_connections",
        "max_connections_per_peer",
        "max_pending",
        "on_refused",
    )

    def __init__(
        self,
        max_connections: int = 65536,
        max_pending: int = 256,
        on_refused: Callable[[str, Refusal], None] = _ignore,
        max_connections_per_peer: int | None = None,
    ) -> None:
        per_peer = (
            min(DEFAULT_NODE_CONNECTIONS_PER_PEER, max_connections)
            if max_connections_per_peer is None
            else (max_connections_per_peer)
        )
        if max_connections < 1 or max_pending < 1 or max_pending > max_connections:
            raise AdmissionSettingsError(
                f"node connection budget must be at least 1 and hold its pending handshakes: "
                f"{max_connections} connections, {max_pending} pending"
            )
        if not 1 <= per_peer <= max_connections:
            raise AdmissionSettingsError(
                f"node connections per peer must be from 1 to the node's {max_connections}, not {per_peer}"
            )
        self.max_connections = max_connections
        self.max_pending = max_pending
        self.max_connections_per_peer = per_peer
        self.on_refused = on_refused
        self.connections = 0
        """Connections held (pending and established) over every gate."""
        self.by_peer: dict[str, int] = {}
        """Connections held per peer address over every gate (only peers holding some)."""
        self._pending: dict[Ticket, None] = {}

    @property
    def pending(self) -> int:
        """Connections in their handshake over every gate."""
        return len(self._pending)


class ListenerGate:
    """One listener's admission (rules 1-4); ``kind`` names the listener in metrics and logs (``hbone``...)."""

    __slots__ = ("_pending", "budget", "connections", "handshake", "kind", "limits", "pending_by_peer")

    def __init__(self, kind: str, limits: ListenerLimits, budget: NodeBudget, *, handshake: bool) -> None:
        self.kind = kind
        self.limits = limits
        self.budget = budget
        self.handshake = handshake
        self.connections = 0
        self.pending_by_peer: dict[str, int] = {}
        self._pending: dict[Ticket, None] = {}

    @property
    def pending(self) -> int:
        """Connections in their handshake at this listener."""
        return len(self._pending)

    def admit(self, peer: str) -> Ticket | Refusal:
        """A ticket for a connection from ``peer`` (its address), or why it is refused (rules 1 and 2)."""
        budget, limits = self.budget, self.limits
        refusal: Refusal | None = None
        if self.connections >= limits.max_connections:
            refusal = Refusal.CONNECTIONS
        elif self.handshake and self.pending_by_peer.get(peer, 0) >= limits.max_pending_per_peer:
            refusal = Refusal.PEER_PENDING
        elif budget.connections >= budget.max_connections:
            refusal = Refusal.NODE_CONNECTIONS
        elif budget.by_peer.get(peer, 0) >= budget.max_connections_per_peer:
            refusal = Refusal.NODE_PEER_CONNECTIONS
        elif self.handshake:
            if len(self._pending) >= limits.max_pending and not _evict_oldest(self._pending):
                refusal = Refusal.PENDING
            elif len(budget._pending) >= budget.max_pending and not _evict_oldest(budget._pending):
                refusal = Refusal.NODE_PENDING
        if refusal is not None:
            budget.on_refused(self.kind, refusal)
            return refusal
        budget.connections += 1
        budget.by_peer[peer] = budget.by_peer.get(peer, 0) + 1
        self.connections += 1
        if not self.handshake:
            return Ticket(self, peer, _ESTABLISHED)
        ticket = Ticket(self, peer, _PENDING)
        self._pending[ticket] = None
        budget._pending[ticket] = None
        self.pending_by_peer[peer] = self.pending_by_peer.get(peer, 0) + 1
        return ticket

    def _end_pending(self, ticket: Ticket) -> None:
        del self._pending[ticket]
        del self.budget._pending[ticket]
        peer = ticket._peer
        left = self.pending_by_peer[peer] - 1
        if left:
            self.pending_by_peer[peer] = left
        else:
            del self.pending_by_peer[peer]


def _evict_oldest(pending: dict[Ticket, None]) -> bool:
    """Rule 2: close the oldest pending connection of ``pending`` to make room; False when it cannot be closed."""
    victim = next(iter(pending))
    close = victim._on_evict
    if close is None:
        return False
    victim.release()
    victim._gate.budget.on_refused(victim._gate.kind, Refusal.EVICTED)
    close()
    return True


_PENDING, _ESTABLISHED, _RELEASED = 0, 1, 2


class Ticket:
    """One admitted connection's place (rules 3 and 4)."""

    __slots__ = ("_gate", "_on_evict", "_peer", "_state")

    def __init__(self, gate: ListenerGate, peer: str, state: int) -> None:
        self._gate, self._peer, self._state = gate, peer, state
        self._on_evict: Callable[[], object] | None = None

    @property
    def pending(self) -> bool:
        return self._state == _PENDING

    @property
    def handshake_timeout(self) -> float:
        """The listener's bound on the handshake of this connection (:attr:`ListenerLimits.handshake_timeout`)."""
        return self._gate.limits.handshake_timeout

    @property
    def liveness(self) -> LivenessSettings:
        """The listener's deadlines for this connection once established (:attr:`ListenerLimits.liveness`)."""
        return self._gate.limits.liveness

    def on_evict(self, close: Callable[[], object]) -> None:
        """How to close the connection if a newcomer evicts it while pending (rule 2): called once, after the
        ticket was released (cancelling the task that serves the connection, typically)."""
        self._on_evict = close

    def established(self) -> None:
        """The handshake is done: the connection keeps its place, no longer a pending one."""
        if self._state == _PENDING:
            self._state = _ESTABLISHED
            self._on_evict = None
            self._gate._end_pending(self)

    def release(self) -> None:
        """The connection is over (or was never served): its place is free."""
        if self._state == _RELEASED:
            return
        gate = self._gate
        if self._state == _PENDING:
            gate._end_pending(self)
        self._state = _RELEASED
        self._on_evict = None
        gate.connections -= 1
        budget = gate.budget
        budget.connections -= 1
        left = budget.by_peer[self._peer] - 1
        if left:
            budget.by_peer[self._peer] = left
        else:
            del budget.by_peer[self._peer]

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
    Refusal.NODE_PEER_CONNECTIONS: "one peer address holds its maximum of connections over the process",
    Refusal.EVICTED: "the oldest handshakes in progress were closed to make room for new connections",
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
                "%s listener: refused or evicted %d connection(s) (%s): %s", kind, held, reason.value, _WHY[reason]
            )

    return refused
