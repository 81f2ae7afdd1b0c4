"""Fakes for the connection pool's unit tests: a manual clock, fake connections and streams, and a dialer that
records its dials and can fail them."""

from __future__ import annotations

import asyncio
from collections.abc import Callable, Sequence
from typing import Any

from ambit.model.identity import SpiffeId
from ambit.proxy.hbone_client import TunnelRefusedError
from ambit.proxy.hbone_session import ConnectionLostError
from ambit.proxy.pool import PoolKey

SRC = SpiffeId("cluster.local", "a", "client")
DST = SpiffeId("cluster.local", "b", "server")
KEY = PoolKey(SRC, frozenset({DST}), "198.18.200.1", ("198.18.200.2", 15008))
OTHER_KEY = PoolKey(SRC, frozenset({DST}), "198.18.200.1", ("198.18.200.3", 15008))
SETTLE_STEPS = 200


async def settle() -> None:
    """Let every task run until it waits on something the test controls. The fakes only yield with ``sleep(0)``,
    so a bounded number of loop turns is enough, whatever the machine's load (a wall-clock sleep was not: under load
    its timer fired before the tasks had opened their streams)."""
    for _ in range(SETTLE_STEPS):
        await asyncio.sleep(0)


class Clock:
    def __init__(self) -> None:
        self.now = 100.0

    def __call__(self) -> float:
        return self.now


class FakeStream:
    def __init__(self, connection: FakeConnection, authority: str) -> None:
        self.connection = connection
        self.authority = authority

    def finish(self) -> None:
        self.connection.streams -= 1
        if self.connection.streams == 0:
            self.connection.idle_since = self.connection.clock()
            if self.connection.on_idle is not None:
                asyncio.get_running_loop().call_soon(self.connection.on_idle)


class FakeConnection:
    """Claims its stream slot before suspending, like HboneClient."""

    def __init__(self, clock: Clock, name: str, capacity: int = 100) -> None:
        self.clock = clock
        self.name = name
        self.capacity = capacity
        self.streams = 0
        self.idle_since: float | None = clock()
        self.closed = False
        self.close_calls = 0
        self.dead = False
        self.going_away = False
        """Its peer said GOAWAY: no new stream on it, as HboneClient's ``available`` says then."""
        self.refuse: int | None = None
        self.attempts = 0
        self.on_idle: Callable[[], None] | None = None
        self.on_closed: list[Callable[[], None]] = []

    def when_idle(self, callback: Callable[[], None]) -> None:
        self.on_idle = callback

    def when_closed(self, callback: Callable[[], None]) -> None:
        self.on_closed.append(callback)

    def lose(self) -> None:
        """The connection is gone (its peer closed it, say): closed, and its owner is told soon, as HboneClient's."""
        self.closed = True
        for callback in self.on_closed:
            asyncio.get_running_loop().call_soon(callback)
        self.on_closed.clear()

    @property
    def available(self) -> bool:
        return not self.closed and not self.going_away and self.streams < self.capacity

    @property
    def active_streams(self) -> int:
        return self.streams

    async def open_tunnel(self, authority: str, headers: Sequence[tuple[str, str]]) -> Any:
        self.attempts += 1
        if self.dead:
            self.closed = True
            raise ConnectionLostError(f"{self.name} is dead")
        self.streams += 1
        self.idle_since = None
        await asyncio.sleep(0)  # the CONNECT round trip
        if self.refuse is not None:
            FakeStream(self, authority).finish()
            raise TunnelRefusedError(self.refuse)
        return FakeStream(self, authority)

    def close(self) -> None:
        self.close_calls += 1
        self.closed = True

    async def aclose(self) -> None:
        self.close()


class Dialer:
    def __init__(self, clock: Clock) -> None:
        self.clock = clock
        self.made: list[FakeConnection] = []
        self.gate: asyncio.Event | None = None
        self.error: Exception | None = None
        self.capacity = 100

    async def __call__(self) -> FakeConnection:
        if self.gate is not None:
            await self.gate.wait()
        if self.error is not None:
            raise self.error
        connection = FakeConnection(self.clock, f"conn{len(self.made)}", self.capacity)
        self.made.append(connection)
        return connection
