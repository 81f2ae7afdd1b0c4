"""Connection limits for the proxies' small HTTP servers (admin, stats, readiness).

Theory of operation
-------------------
aiohttp's server takes every connection it is offered and waits as long as a client likes: a client that sends half
a request head waits forever, and one that asks for a large answer (a page of flows, a config dump, the metrics)
and never reads pins the whole answer in the transport's buffer. Two hundred such clients pinned 130 MiB in a node
proxy. :class:`LimitedSite` puts a gate in front of the server:

1. At most ``total`` connections are open at once, and at most ``per_address`` from one peer address; a connection
   over either limit is aborted as soon as it is accepted (the client sees a reset, nothing is allocated for it).
2. A connection is asked to close ``lifetime`` seconds after it was accepted, gracefully: a request in progress
   finishes, an idle keep-alive or half-sent head ends at once. ``grace`` seconds later it is aborted with whatever
   it still had to write. So what one slot can pin is bounded by the largest answer, for ``lifetime + grace`` seconds.

Scrapers and probes open a connection, ask, read and either close or come back within a scrape interval; a keep-alive
connection closed between two scrapes is re-opened by the client. The limits are per server (:data:`ADMIN_LIMITS`,
:data:`PUBLIC_LIMITS`).
"""

from __future__ import annotations

import asyncio
import collections
from collections.abc import Callable
from dataclasses import dataclass
from typing import cast

from aiohttp import web


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


class _GatedConnection(asyncio.Protocol):
    """One accepted connection: admitted by the gate and handed to aiohttp's protocol, or aborted."""

    def __init__(self, gate: ConnectionGate, make: Callable[[], asyncio.Protocol]) -> None:
        self._gate = gate
        self._make = make
        self._inner: asyncio.Protocol | None = None
        self._address = ""
        self._timer: asyncio.TimerHandle | None = None

    def connection_made(self, transport: asyncio.BaseTransport) -> None:
        transport = cast(asyncio.Transport, transport)  # uvloop's transports are not asyncio.Transport subclasses
        peer = transport.get_extra_info("peername")
        self._address = str(peer[0]) if isinstance(peer, tuple) and peer else ""
        if not self._gate.admit(self._address):
            transport.abort()
            return
        self._inner = self._make()
        loop = asyncio.get_running_loop()
        self._timer = loop.call_later(self._gate.limits.lifetime, self._expire, transport)
        self._inner.connection_made(transport)

    def _expire(self, transport: asyncio.Transport) -> None:
        close = getattr(self._inner, "close", None)  # aiohttp's RequestHandler: close once the request is served
        if callable(close):
            close()
        self._timer = asyncio.get_running_loop().call_later(self._gate.limits.grace, transport.abort)

    def connection_lost(self, exc: Exception | None) -> None:
        if self._timer is not None:
            self._timer.cancel()
            self._timer = None
        if self._inner is not None:
            inner, self._inner = self._inner, None
            self._gate.release(self._address)
            inner.connection_lost(exc)

    def data_received(self, data: bytes) -> None:
        if self._inner is not None:
            self._inner.data_received(data)

    def eof_received(self) -> bool | None:
        return self._inner.eof_received() if self._inner is not None else None

    def pause_writing(self) -> None:
        if self._inner is not None:
            self._inner.pause_writing()

    def resume_writing(self) -> None:
        if self._inner is not None:
            self._inner.resume_writing()


class LimitedSite(web.BaseSite):
    """aiohttp's TCP site with a :class:`ConnectionGate` in front of the runner's server."""

    __slots__ = ("_gate", "_host", "_port", "_reuse_port")

    def __init__(
        self, runner: web.BaseRunner, host: str, port: int, limits: ConnectionLimits, *, reuse_port: bool = False
    ) -> None:
        super().__init__(runner)
        self._host = host
        self._port = port
        self._gate = ConnectionGate(limits)
        self._reuse_port = reuse_port
        """SO_REUSEPORT: a successor process may bind the same port while this one still serves."""

    @property
    def gate(self) -> ConnectionGate:
        return self._gate

    @property
    def name(self) -> str:
        return f"http://{self._host}:{self._port}"

    async def start(self) -> None:
        await super().start()
        server = self._runner.server
        assert server is not None
        gate = self._gate
        self._server = await asyncio.get_running_loop().create_server(
            lambda: _GatedConnection(gate, server),
            self._host,
            self._port,
            reuse_address=True,
            reuse_port=self._reuse_port or None,
        )
