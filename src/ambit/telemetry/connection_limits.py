"""Connection limits for the proxies' small HTTP servers (admin, stats, readiness, dashboard, monitoring).

Theory of operation
-------------------
An HTTP server that takes every connection it is offered and waits as long as a client likes can be exhausted: a
client that sends half a request head waits forever, and one that asks for a large answer (a page of flows, a config
dump, the metrics) and never reads pins the whole answer in the transport's buffer. Two hundred such clients pinned
130 MiB in a node proxy. The servers put a :class:`ConnectionGate` in front of their protocol (the node proxy's
:mod:`ambit.telemetry.http_server`, and :class:`~ambit.telemetry.limited_site.LimitedSite` for aiohttp's):

1. At most ``total`` connections are open at once, and at most ``per_address`` from one peer address; a connection
   over either limit is aborted as soon as it is accepted (the client sees a reset, nothing is allocated for it).
2. A connection is asked to close ``lifetime`` seconds after it was accepted, gracefully: a request in progress
   finishes, an idle keep-alive or half-sent head ends at once. ``grace`` seconds later it is aborted with whatever
   it still had to write. So what one slot can pin is bounded by the largest answer, for ``lifetime + grace`` seconds.

Scrapers and probes open a connection, ask, read and either close or come back within a scrape interval; a keep-alive
connection closed between two scrapes is re-opened by the client. The limits are per server (:data:`ADMIN_LIMITS`,
:data:`PUBLIC_LIMITS`). This module is pure bookkeeping and imports no HTTP stack: the node proxy loads it without
aiohttp.
"""

from __future__ import annotations

import collections
from dataclasses import dataclass


@dataclass(frozen=True, slots=True)
class ConnectionLimits:
    total: int
    """Connections open at once."""
    per_address: int
    """Connections open at once from one peer address."""
    lifetime: float
    """Seconds after acceptance when a connection is asked to close (it finishes the request it is serving)."""
    grace: float = 5.0
    """Seconds after that when it is aborted, with whatever it still had to write."""

    def __post_init__(self) -> None:
        if not (1 <= self.per_address <= self.total) or self.lifetime <= 0 or self.grace < 0:
            raise ValueError(f"invalid connection limits: {self}")


ADMIN_LIMITS = ConnectionLimits(total=16, per_address=16, lifetime=30.0)
"""The admin port (loopback only: every client has the same address, so the total is the limit)."""
PUBLIC_LIMITS = ConnectionLimits(total=64, per_address=8, lifetime=30.0)
"""The stats and readiness ports (any pod reaches them on the node's address)."""


class ConnectionGate:
    """Counts open connections, in total and per peer address (pure bookkeeping, no I/O)."""

    def __init__(self, limits: ConnectionLimits) -> None:
        self.limits = limits
        self._by_address: collections.Counter[str] = collections.Counter()
        self.open = 0
        self.refused = 0

    def admit(self, address: str) -> bool:
        if self.open >= self.limits.total or self._by_address[address] >= self.limits.per_address:
            self.refused += 1
            return False
        self.open += 1
        self._by_address[address] += 1
        return True

    def release(self, address: str) -> None:
        self.open -= 1
        self._by_address[address] -= 1
        if self._by_address[address] <= 0:
            del self._by_address[address]
