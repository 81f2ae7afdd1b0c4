"""ConnectionPool bookkeeping with fake connections and a fake dial (no sockets, no TLS)."""

from __future__ import annotations

import asyncio

import pytest
from pool_fakes import KEY, OTHER_KEY, Clock, Dialer, FakeConnection, settle

from ambit.proxy import pool as pool_module
from ambit.proxy.hbone_client import TunnelRefusedError
from ambit.proxy.hbone_session import ConnectionLostError
from ambit.proxy.pool import ConnectionPool, PoolClosedError


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
    await settle()
    assert pool.stats()["keys"][0]["dialing"] == 1
    dialer.gate.set()
    streams = await asyncio.gather(*openers)
    assert len(dialer.made) == 1
    assert {s.connection for s in streams} == {dialer.made[0]}
    assert dialer.made[0].streams == 20


async def test_openers_spill_onto_a_new_connection_past_the_stream_limit(pool: ConnectionPool, dialer: Dialer) -> None:
    dialer.gate = asyncio.Event()
    openers = [asyncio.create_task(pool.open_tunnel(KEY, "10.0.0.1:80", [], dialer)) for _ in range(150)]
    await settle()
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


async def test_a_dial_whose_connection_is_going_away_is_closed_and_the_open_dials_once_more(
    pool: ConnectionPool, dialer: Dialer
) -> None:
    """Its server accepted it as it began to drain (its GOAWAY came with its SETTINGS): the open goes on a fresh
    connection, the first is closed without a stream having been tried on it."""
    original = Dialer.__call__

    async def dial() -> FakeConnection:
        connection = await original(dialer)
        connection.going_away = len(dialer.made) == 1
        return connection

    stream = await pool.open_tunnel(KEY, "10.0.0.1:80", [], dial)
    assert stream.connection is dialer.made[1]
    assert dialer.made[0].closed and dialer.made[0].attempts == 0
    assert pool.stats()["connections"] == 1


async def test_a_peer_that_only_ever_goes_away_fails_the_open_after_the_second_dial(
    pool: ConnectionPool, dialer: Dialer
) -> None:
    original = Dialer.__call__

    async def dial() -> FakeConnection:
        connection = await original(dialer)
        connection.going_away = True
        return connection

    with pytest.raises(ConnectionLostError, match="going away"):
        await pool.open_tunnel(KEY, "10.0.0.1:80", [], dial)
    assert len(dialer.made) == 2 and all(c.closed for c in dialer.made)
    assert pool.stats()["connections"] == 0


async def test_a_dial_that_fails_as_lost_is_retried_once_and_a_second_loss_fails_the_open(
    pool: ConnectionPool, dialer: Dialer
) -> None:
    """HboneClient.connect fails with ConnectionLostError when the peer took our certificate and went away before
    the first tunnel (its close came with its GOAWAY): safe to dial again, once."""
    losses = [ConnectionLostError("going away")]

    async def dial() -> FakeConnection:
        if losses:
            raise losses.pop()
        return await dialer()

    stream = await pool.open_tunnel(KEY, "10.0.0.1:80", [], dial)
    assert stream.connection is dialer.made[0] and len(dialer.made) == 1
    dialer.error = ConnectionLostError("going away again")
    stream.finish()
    dialer.made[0].lose()
    await settle()
    losses.append(ConnectionLostError("going away"))
    with pytest.raises(ConnectionLostError, match="going away again"):
        await pool.open_tunnel(KEY, "10.0.0.1:80", [], dial)


class _DyingConnection(FakeConnection):
    """Alive when the dial's end asks, closed by the time its opener comes for it (the peer dropped it meanwhile)."""

    @property
    def available(self) -> bool:
        alive = super().available
        self.closed = True
        return alive


async def test_new_connections_that_die_before_their_first_tunnel_fail_the_open_after_the_second(clock: Clock) -> None:
    """A peer that takes each connection and drops it before the opener gets to it (after the dial's own check): the
    acquire gives up at the second such connection instead of dialing in a loop (and the open, retried once, too)."""
    pool = ConnectionPool(idle_timeout=0.0, clock=clock, max_streams=1)
    made: list[_DyingConnection] = []

    async def dial() -> _DyingConnection:
        made.append(_DyingConnection(clock, f"conn{len(made)}"))
        return made[-1]

    with pytest.raises(ConnectionLostError, match="gone before their first tunnel"):
        await pool.open_tunnel(KEY, "10.0.0.1:80", [], dial)
    assert len(made) == 4 and all(c.attempts == 0 for c in made)  # the open's one retry: two acquires of two dials


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
    await settle()
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
    await settle()
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


class _CountingConnection(FakeConnection):
    """Counts how often the pool asks whether it is alive and free (``available``)."""

    asked = 0

    @property
    def available(self) -> bool:
        type(self).asked += 1
        return not self.closed and self.streams < self.capacity


async def test_a_connection_at_the_pools_stream_limit_is_passed_over_without_asking_more(clock: Clock) -> None:
    """Under a cold load (one stream per connection) every busy connection of the key is passed over on its stream
    count alone; only a connection with a free slot is asked whether it can take one (and the choice is the same)."""
    pool = ConnectionPool(idle_timeout=0.0, clock=clock, max_streams=1)
    made: list[_CountingConnection] = []

    async def dial() -> _CountingConnection:
        made.append(_CountingConnection(clock, f"conn{len(made)}"))
        return made[-1]

    streams = [await pool.open_tunnel(KEY, "10.0.0.1:80", [], dial) for _ in range(5)]
    assert len(made) == 5 and all(c.streams == 1 for c in made)
    _CountingConnection.asked = 0
    streams.append(await pool.open_tunnel(KEY, "10.0.0.1:80", [], dial))  # all five busy: a sixth dial
    assert len(made) == 6
    assert _CountingConnection.asked == 2  # the new one only (as its dial ends, and chosen), none of the five
    assert {s.connection for s in streams} == set(made)


async def test_every_dial_of_a_key_runs_in_a_task_named_after_the_key(pool: ConnectionPool, dialer: Dialer) -> None:
    """The name is made at the key's first dial and kept with its bucket: the same text for every later dial."""
    dialer.capacity = 1
    names: list[str] = []

    async def dial() -> FakeConnection:
        task = asyncio.current_task()
        assert task is not None
        names.append(task.get_name())
        return await dialer()

    for _ in range(3):
        await pool.open_tunnel(KEY, "10.0.0.1:80", [], dial)
    assert len(dialer.made) == 3
    assert names == [f"hbone dial {KEY}"] * 3


async def test_a_key_gets_one_bucket_however_many_tunnels_it_opens(
    pool: ConnectionPool, dialer: Dialer, monkeypatch: pytest.MonkeyPatch
) -> None:
    made: list[object] = []

    class CountedBucket(pool_module._Bucket):
        def __init__(self) -> None:
            super().__init__()
            made.append(self)

    monkeypatch.setattr(pool_module, "_Bucket", CountedBucket)
    for _ in range(3):
        await pool.open_tunnel(KEY, "10.0.0.1:80", [], dialer)
    assert len(made) == 1  # made for the key's first open, found by the others


class _ClosedCountingConnection(FakeConnection):
    """Counts how often the pool asks whether it is closed."""

    asked = 0

    @property  # type: ignore[override]
    def closed(self) -> bool:
        type(self).asked += 1
        return self._closed

    @closed.setter
    def closed(self, value: bool) -> None:
        self._closed = value


async def test_an_open_does_not_ask_every_connection_of_its_key_whether_it_is_closed(clock: Clock) -> None:
    """Under a cold load the busy connections of a key are passed over on their stream count alone: the pool learns
    of a close from the connection (``when_closed``), not by asking each of them on every acquire."""
    pool = ConnectionPool(idle_timeout=0.0, clock=clock, max_streams=1)
    made: list[_ClosedCountingConnection] = []

    async def dial() -> _ClosedCountingConnection:
        made.append(_ClosedCountingConnection(clock, f"conn{len(made)}"))
        return made[-1]

    for _ in range(5):
        await pool.open_tunnel(KEY, "10.0.0.1:80", [], dial)
    _ClosedCountingConnection.asked = 0
    await pool.open_tunnel(KEY, "10.0.0.1:80", [], dial)
    assert len(made) == 6
    # The new connection only: its ``available`` (twice at most) and once whether it was gone before its opener came.
    assert _ClosedCountingConnection.asked <= 3


async def test_a_connection_that_says_it_is_gone_is_forgotten_with_its_key(
    pool: ConnectionPool, dialer: Dialer
) -> None:
    stream = await pool.open_tunnel(KEY, "10.0.0.1:80", [], dialer)
    stream.connection.lose()
    await settle()
    assert pool.stats() == {"connections": 0, "streams": 0, "keys": []}
    assert pool.reap_idle() == 0
    await pool.open_tunnel(KEY, "10.0.0.1:80", [], dialer)
    assert len(dialer.made) == 2


async def test_a_busy_connection_that_says_it_is_gone_is_forgotten(clock: Clock) -> None:
    """Even one at its stream limit, which an open passes over without asking anything else."""
    pool = ConnectionPool(idle_timeout=300.0, clock=clock, max_streams=1)
    dialer = Dialer(clock)
    first = await pool.open_tunnel(KEY, "10.0.0.1:80", [], dialer)
    second = await pool.open_tunnel(KEY, "10.0.0.1:80", [], dialer)
    first.connection.lose()
    await settle()
    assert pool._buckets[KEY].connections == [second.connection]


async def test_a_closed_connection_that_has_not_said_so_is_never_handed_out_and_is_forgotten(
    pool: ConnectionPool, dialer: Dialer
) -> None:
    stream = await pool.open_tunnel(KEY, "10.0.0.1:80", [], dialer)
    stream.finish()
    stale = stream.connection
    stale.closed = True  # closed, its callback not run (nor ever: a connection slow to tell)
    fresh = await pool.open_tunnel(KEY, "10.0.0.1:80", [], dialer)
    assert fresh.connection is not stale
    assert stale.attempts == 1  # never asked to open another tunnel
    assert pool._buckets[KEY].connections == [fresh.connection]


async def test_a_connection_lost_after_the_pool_forgot_it_changes_nothing(pool: ConnectionPool, dialer: Dialer) -> None:
    stream = await pool.open_tunnel(KEY, "10.0.0.1:80", [], dialer)
    stream.finish()
    other = await pool.open_tunnel(OTHER_KEY, "10.0.0.1:80", [], dialer)
    await pool.aclose()
    stream.connection.lose()
    other.connection.lose()
    await settle()
    assert pool.stats() == {"connections": 0, "streams": 0, "keys": []}
