"""ConnectionPool limits: streams per connection and the idle timeout, zero included (fake connections, no I/O)."""

from __future__ import annotations

import asyncio
from typing import Any

import pytest
from pool_fakes import KEY, Clock, Dialer, settle

from ambit.proxy.pool import ConnectionPool, PoolSettingsError


@pytest.fixture
def clock() -> Clock:
    return Clock()


@pytest.fixture
def dialer(clock: Clock) -> Dialer:
    return Dialer(clock)


async def one_tunnel(pool: ConnectionPool, dialer: Dialer, *, hold: asyncio.Event | None = None) -> Any:
    """What a proxied connection's task does: open a tunnel, use it, end it, and return."""
    stream = await pool.open_tunnel(KEY, "10.0.0.1:80", [], dialer)
    if hold is not None:
        await hold.wait()
    stream.finish()
    return stream


@pytest.mark.parametrize(("max_streams", "idle_timeout"), [(0, 300.0), (-3, 300.0), (1, -1.0), (1, float("nan"))])
def test_limits_out_of_range_are_refused(max_streams: int, idle_timeout: float) -> None:
    with pytest.raises(PoolSettingsError):
        ConnectionPool(max_streams=max_streams, idle_timeout=idle_timeout)


def test_the_pool_reports_its_limits() -> None:
    pool = ConnectionPool(max_streams=7, idle_timeout=0)
    assert (pool.max_streams, pool.idle_timeout) == (7, 0)


async def test_with_one_stream_and_no_idle_time_every_tunnel_dials_and_its_connection_closes_when_it_ends(
    clock: Clock, dialer: Dialer
) -> None:
    pool = ConnectionPool(max_streams=1, idle_timeout=0, clock=clock)
    for expected in range(1, 4):
        stream = await asyncio.create_task(one_tunnel(pool, dialer))
        assert len(dialer.made) == expected
        await asyncio.sleep(0)  # the task's done callbacks run
        assert stream.connection.close_calls == 1, "closed when its tunnel ended, not at a reap"
        assert pool.stats() == {"connections": 0, "streams": 0, "keys": []}
    assert pool.reap_idle() == 0


async def test_with_no_idle_time_a_connection_closes_when_its_tunnel_ends_even_long_after_the_opener_returned(
    clock: Clock, dialer: Dialer
) -> None:
    # The node proxy's handlers splice a tunnel and return: the tunnel outlives the task that opened it.
    pool = ConnectionPool(max_streams=1, idle_timeout=0, clock=clock)
    stream = await asyncio.create_task(pool.open_tunnel(KEY, "10.0.0.1:80", [], dialer))
    await settle()
    assert not stream.connection.closed, "its tunnel is still open"
    stream.finish()
    await asyncio.sleep(0)  # the connection says it is idle from the loop, soon
    assert stream.connection.close_calls == 1
    assert pool.stats() == {"connections": 0, "streams": 0, "keys": []}


async def test_with_no_idle_time_a_connection_that_took_a_new_stream_before_its_idle_call_stays_open(
    clock: Clock, dialer: Dialer
) -> None:
    pool = ConnectionPool(max_streams=100, idle_timeout=0, clock=clock)
    first = await pool.open_tunnel(KEY, "10.0.0.1:80", [], dialer)
    first.connection.streams += 1  # a second stream starts before the pool hears that the first ended
    first.finish()
    await asyncio.sleep(0)
    assert not first.connection.closed


async def test_with_one_stream_concurrent_tunnels_each_get_their_own_connection(clock: Clock, dialer: Dialer) -> None:
    pool = ConnectionPool(max_streams=1, idle_timeout=0, clock=clock)
    hold = asyncio.Event()
    tasks = [asyncio.create_task(one_tunnel(pool, dialer, hold=hold)) for _ in range(5)]
    await settle()
    assert len(dialer.made) == 5
    assert all(c.streams == 1 for c in dialer.made)
    assert not any(c.closed for c in dialer.made)
    hold.set()
    await asyncio.gather(*tasks)
    await asyncio.sleep(0)
    assert all(c.close_calls == 1 for c in dialer.made)


async def test_with_no_idle_time_a_shared_connection_closes_only_after_its_last_tunnel(
    clock: Clock, dialer: Dialer
) -> None:
    pool = ConnectionPool(max_streams=100, idle_timeout=0, clock=clock)
    first_hold, second_hold = asyncio.Event(), asyncio.Event()
    first = asyncio.create_task(one_tunnel(pool, dialer, hold=first_hold))
    second = asyncio.create_task(one_tunnel(pool, dialer, hold=second_hold))
    await settle()
    assert len(dialer.made) == 1, "concurrent openers share the fresh connection (fresh is not stale)"
    connection = dialer.made[0]
    first_hold.set()
    await first
    await asyncio.sleep(0)
    assert not connection.closed, "the second tunnel still uses it"
    second_hold.set()
    await second
    await asyncio.sleep(0)
    assert connection.close_calls == 1


async def test_with_no_idle_time_a_connection_whose_tunnel_ended_is_never_reused(clock: Clock, dialer: Dialer) -> None:
    # Both tunnels in one task: the owner has not ended when the second opens, so the pool's own check applies.
    pool = ConnectionPool(max_streams=100, idle_timeout=0, clock=clock)
    first = await pool.open_tunnel(KEY, "10.0.0.1:80", [], dialer)
    first.finish()
    second = await pool.open_tunnel(KEY, "10.0.0.1:80", [], dialer)
    assert second.connection is not first.connection
    assert first.connection.close_calls == 1
    assert pool.stats()["connections"] == 1


async def test_with_no_idle_time_a_refused_tunnel_leaves_no_connection_behind(clock: Clock, dialer: Dialer) -> None:
    from ambit.proxy.hbone_client import TunnelRefusedError

    pool = ConnectionPool(max_streams=1, idle_timeout=0, clock=clock)

    async def dial_refusing() -> Any:
        connection = await dialer()
        connection.refuse = 403
        return connection

    async def refused() -> None:
        with pytest.raises(TunnelRefusedError):
            await pool.open_tunnel(KEY, "10.0.0.1:80", [], dial_refusing)

    await asyncio.create_task(refused())
    await asyncio.sleep(0)
    assert dialer.made[0].close_calls == 1
    assert pool.stats()["connections"] == 0


async def test_reap_idle_with_no_idle_time_closes_every_idle_connection(clock: Clock, dialer: Dialer) -> None:
    pool = ConnectionPool(max_streams=100, idle_timeout=0, clock=clock)
    stream = await pool.open_tunnel(KEY, "10.0.0.1:80", [], dialer)
    assert pool.reap_idle() == 0
    stream.finish()
    assert pool.reap_idle() == 1
    assert stream.connection.closed


async def test_with_the_default_timeout_a_connection_outlives_the_task_that_used_it(
    clock: Clock, dialer: Dialer
) -> None:
    pool = ConnectionPool(clock=clock)
    first = await asyncio.create_task(one_tunnel(pool, dialer))
    await asyncio.sleep(0)
    assert not first.connection.closed
    second = await asyncio.create_task(one_tunnel(pool, dialer))
    assert second.connection is first.connection
    assert len(dialer.made) == 1


async def test_a_closed_pool_ignores_tunnels_that_end_afterwards(clock: Clock, dialer: Dialer) -> None:
    pool = ConnectionPool(max_streams=1, idle_timeout=0, clock=clock)
    hold = asyncio.Event()
    task = asyncio.create_task(one_tunnel(pool, dialer, hold=hold))
    await settle()
    await pool.aclose()
    hold.set()
    await task
    await asyncio.sleep(0)
    assert dialer.made[0].close_calls == 1  # by aclose, not once more when the task ended
