"""OperationBound (ambit.waypoint.idle): one timer for many bounded reads and writes."""

from __future__ import annotations

import asyncio

import pytest

from ambit.waypoint.idle import OperationBound


def _timers(loop: asyncio.AbstractEventLoop) -> int:
    """Live (not cancelled) timer handles of the loop (the default loop keeps them in ``_scheduled``)."""
    return sum(1 for handle in loop._scheduled if not handle.cancelled())  # type: ignore[attr-defined]


async def test_an_operation_that_finishes_in_time_returns_its_result() -> None:
    bound = OperationBound()
    assert await bound.run(asyncio.sleep(0, "data"), 1.0) == "data"
    bound.close()


async def test_an_operation_past_its_time_is_cancelled_and_raises_timeout() -> None:
    bound = OperationBound()
    never: asyncio.Future[None] = asyncio.get_running_loop().create_future()
    with pytest.raises(TimeoutError):
        await bound.run(never, 0.02)
    assert never.cancelled()
    assert asyncio.current_task().cancelling() == 0  # type: ignore[union-attr]


async def test_many_operations_share_one_timer_which_fires_once_per_limit() -> None:
    loop = asyncio.get_running_loop()
    before = _timers(loop)
    bound = OperationBound()
    for _ in range(100):
        await bound.run(asyncio.sleep(0), 30.0)
    assert _timers(loop) - before == 1  # one handle armed, none per operation
    bound.close()
    assert _timers(loop) == before


async def test_a_timer_armed_for_an_earlier_operation_rearms_for_the_one_in_progress() -> None:
    bound = OperationBound()
    await bound.run(asyncio.sleep(0), 0.05)  # arms a handle due in 0.05 s
    await asyncio.sleep(0.03)
    # Due 0.5 s from now: the handle fires first (0.02 s from now), finds it not due and arms again. (The margin is
    # wide: with 0.06 s for a 0.04 s sleep, a loaded machine once made the sleep itself late; flaky-tests 52.)
    assert await bound.run(asyncio.sleep(0.1, "late but in time"), 0.5) == "late but in time"
    bound.close()


async def test_a_shorter_limit_than_the_armed_timer_is_still_kept() -> None:
    bound = OperationBound()
    await bound.run(asyncio.sleep(0), 30.0)
    never: asyncio.Future[None] = asyncio.get_running_loop().create_future()
    with pytest.raises(TimeoutError):
        await asyncio.wait_for(bound.run(never, 0.02), 5.0)
    bound.close()


async def test_a_timer_that_fires_between_operations_does_nothing() -> None:
    bound = OperationBound()
    await bound.run(asyncio.sleep(0), 0.01)
    await asyncio.sleep(0.03)  # it fired with nothing in progress
    assert await bound.run(asyncio.sleep(0, "next"), 1.0) == "next"
    bound.close()


async def test_cancellation_from_elsewhere_is_passed_on_not_turned_into_a_timeout() -> None:
    bound = OperationBound()
    never: asyncio.Future[None] = asyncio.get_running_loop().create_future()
    task = asyncio.get_running_loop().create_task(bound.run(never, 30.0))
    await asyncio.sleep(0)
    task.cancel()
    with pytest.raises(asyncio.CancelledError):
        await task
    bound.close()


async def test_a_second_task_at_once_gets_its_own_timeout() -> None:
    bound = OperationBound()
    never: asyncio.Future[None] = asyncio.get_running_loop().create_future()
    first = asyncio.get_running_loop().create_task(bound.run(never, 30.0))
    await asyncio.sleep(0)
    with pytest.raises(TimeoutError):
        await bound.run(asyncio.sleep(1.0), 0.02)  # rule 3: a plain asyncio.timeout, the first unaffected
    assert not first.done()
    first.cancel()
    with pytest.raises(asyncio.CancelledError):
        await first
    bound.close()


async def test_an_error_of_the_operation_is_raised_as_it_is() -> None:
    async def fails() -> None:
        raise ConnectionResetError("peer reset")

    bound = OperationBound()
    with pytest.raises(ConnectionResetError):
        await bound.run(fails(), 1.0)
    bound.close()
