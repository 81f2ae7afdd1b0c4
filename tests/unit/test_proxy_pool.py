"""ConnectionPool bookkeeping with fake connections and a fake dial (no sockets, no TLS)."""

from __future__ import annotations

import asyncio
from collections.abc import Callable, Sequence
from typing import Any

import pytest

from ambit.model.identity import SpiffeId
from ambit.proxy.hbone_client import TunnelRefusedError
from ambit.proxy.hbone_stream import ConnectionLostError
from ambit.proxy.pool import ConnectionPool, PoolClosedError, PoolKey

SRC = SpiffeId("cluster.local", "a", "client")
DST = SpiffeId("cluster.local", "b", "server")
KEY = PoolKey(SRC, frozenset({DST}), "198.18.200.1", ("198.18.200.2", 15008))
OTHER_KEY = PoolKey(SRC, frozenset({DST}), "198.18.200.1", ("198.18.200.3", 15008))


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
        self.refuse: int | None = None
        self.attempts = 0
        self.on_idle: Callable[[], None] | None = None

    def when_idle(self, callback: Callable[[], None]) -> None:
        self.on_idle = callback

    @property
    def available(self) -> bool:
        return not self.closed and self.streams < self.capacity

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


@pytest.fixture
def clock() -> Clock:
    return Clock()


@pytest.fixture
def dialer(clock: Clock) -> Dialer:
    return Dialer(clock)


@pytest.fixture
async def pool(clock: Clock) -> ConnectionPool:
    return ConnectionPool(idle_timeout=300.0, clock=clock)


async def test_a_second_tunnel_reuses_the_live_connection_of_its_key(pool: ConnectionPool, dialer: Dialer) -> None:
    first = await pool.open_tunnel(KEY, "10.0.0.1:80", [], dialer)
    second = await pool.open_tunnel(KEY, "10.0.0.1:80", [], dialer)
    assert len(dialer.made) == 1
    assert first.connection is second.connection
    await pool.open_tunnel(OTHER_KEY, "10.0.0.1:80", [], dialer)
    assert len(dialer.made) == 2  # another key never shares


async def test_concurrent_openers_of_a_cold_key_share_one_dial(pool: ConnectionPool, dialer: Dialer) -> None:
    dialer.gate = asyncio.Event()
    openers = [asyncio.create_task(pool.open_tunnel(KEY, "10.0.0.1:80", [], dialer)) for _ in range(20)]
    await asyncio.sleep(0.01)
    assert pool.stats()["keys"][0]["dialing"] == 1
    dialer.gate.set()
    streams = await asyncio.gather(*openers)
    assert len(dialer.made) == 1
    assert {s.connection for s in streams} == {dialer.made[0]}
    assert dialer.made[0].streams == 20


async def test_openers_spill_onto_a_new_connection_past_the_stream_limit(pool: ConnectionPool, dialer: Dialer) -> None:
    dialer.gate = asyncio.Event()
    openers = [asyncio.create_task(pool.open_tunnel(KEY, "10.0.0.1:80", [], dialer)) for _ in range(150)]
    await asyncio.sleep(0.01)
    assert pool.stats()["keys"][0]["dialing"] == 2  # 100 wait on the first dial, 50 on the second
    dialer.gate.set()
    await asyncio.gather(*openers)
    assert sorted(c.streams for c in dialer.made) == [50, 100]
    stats = pool.stats()
    assert (stats["connections"], stats["streams"]) == (2, 150)
    # With both full... one more spills again, now without anyone else waiting.
    dialer.gate = None
    for _ in range(50):
        await pool.open_tunnel(KEY, "10.0.0.1:80", [], dialer)
    assert len(dialer.made) == 2
    await pool.open_tunnel(KEY, "10.0.0.1:80", [], dialer)
    assert len(dialer.made) == 3


async def test_a_peer_with_a_lower_stream_limit_makes_the_pool_dial_again(pool: ConnectionPool, dialer: Dialer) -> None:
    dialer.capacity = 2
    await asyncio.gather(*(pool.open_tunnel(KEY, "10.0.0.1:80", [], dialer) for _ in range(5)))
    assert sorted(c.streams for c in dialer.made) == [1, 2, 2]


async def test_a_dead_connection_is_dropped_and_the_open_retried_once(pool: ConnectionPool, dialer: Dialer) -> None:
    stream = await pool.open_tunnel(KEY, "10.0.0.1:80", [], dialer)
    stream.finish()
    dialer.made[0].dead = True
    retried = await pool.open_tunnel(KEY, "10.0.0.1:80", [], dialer)
    assert retried.connection is dialer.made[1]
    assert dialer.made[0].attempts == 2
    assert dialer.made[0].closed
    assert pool.stats()["connections"] == 1


async def test_a_second_dead_connection_fails_the_open(pool: ConnectionPool, dialer: Dialer) -> None:
    await pool.open_tunnel(KEY, "10.0.0.1:80", [], dialer)
    dialer.made[0].dead = True
    original = Dialer.__call__

    async def dial_dead() -> FakeConnection:
        connection = await original(dialer)
        connection.dead = True
        return connection

    with pytest.raises(ConnectionLostError):
        await pool.open_tunnel(KEY, "10.0.0.1:80", [], dial_dead)
    assert len(dialer.made) == 2
    assert pool.stats()["connections"] == 0


async def test_a_refused_tunnel_is_not_retried(pool: ConnectionPool, dialer: Dialer) -> None:
    await pool.open_tunnel(KEY, "10.0.0.1:80", [], dialer)
    dialer.made[0].refuse = 401
    with pytest.raises(TunnelRefusedError) as caught:
        await pool.open_tunnel(KEY, "10.0.0.1:80", [], dialer)
    assert caught.value.status == 401
    assert dialer.made[0].attempts == 2
    assert len(dialer.made) == 1


async def test_a_failed_dial_fails_every_opener_waiting_for_it(pool: ConnectionPool, dialer: Dialer) -> None:
    dialer.gate = asyncio.Event()
    dialer.error = ConnectionLostError("refused")
    openers = [asyncio.create_task(pool.open_tunnel(KEY, "10.0.0.1:80", [], dialer)) for _ in range(10)]
    await asyncio.sleep(0.01)
    dialer.gate.set()
    results = await asyncio.gather(*openers, return_exceptions=True)
    assert all(isinstance(r, ConnectionLostError) for r in results)
    assert dialer.made == []
    dialer.error = None
    await pool.open_tunnel(KEY, "10.0.0.1:80", [], dialer)  # the next opener dials afresh
    assert len(dialer.made) == 1


async def test_a_cancelled_opener_does_not_cancel_the_shared_dial(pool: ConnectionPool, dialer: Dialer) -> None:
    dialer.gate = asyncio.Event()
    first = asyncio.create_task(pool.open_tunnel(KEY, "10.0.0.1:80", [], dialer))
    second = asyncio.create_task(pool.open_tunnel(KEY, "10.0.0.1:80", [], dialer))
    await asyncio.sleep(0.01)
    first.cancel()
    dialer.gate.set()
    stream = await second
    assert stream.connection is dialer.made[0]
    assert first.cancelled()


async def test_reap_idle_closes_only_connections_idle_past_the_timeout(
    pool: ConnectionPool, dialer: Dialer, clock: Clock
) -> None:
    busy = await pool.open_tunnel(KEY, "10.0.0.1:80", [], dialer)
    idle = await pool.open_tunnel(OTHER_KEY, "10.0.0.1:80", [], dialer)
    idle.finish()
    clock.now += 299
    assert pool.reap_idle() == 0
    clock.now += 1
    assert pool.reap_idle() == 1
    assert idle.connection.close_calls == 1
    assert not busy.connection.closed
    assert [k["destination_addr"] for k in pool.stats()["keys"]] == ["198.18.200.2:15008"]
    busy.finish()
    clock.now += 300
    assert pool.reap_idle() == 1
    assert pool.stats() == {"connections": 0, "streams": 0, "keys": []}


async def test_reap_idle_forgets_dead_connections_without_counting_them(pool: ConnectionPool, dialer: Dialer) -> None:
    stream = await pool.open_tunnel(KEY, "10.0.0.1:80", [], dialer)
    stream.connection.closed = True
    assert pool.reap_idle() == 0
    assert pool.stats()["connections"] == 0


async def test_a_closed_pool_closes_its_connections_and_refuses_opens(pool: ConnectionPool, dialer: Dialer) -> None:
    stream = await pool.open_tunnel(KEY, "10.0.0.1:80", [], dialer)
    await pool.aclose()
    assert stream.connection.closed
    with pytest.raises(PoolClosedError):
        await pool.open_tunnel(KEY, "10.0.0.1:80", [], dialer)
