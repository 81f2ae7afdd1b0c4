"""OperationBound (ambit.waypoint.idle): one timer for many bounded reads and writes; and the HTTP/1.1 downstream's
writes through it: a client that stops reading after many writes it took at once still fails after ``idle_timeout``."""

from __future__ import annotations

import asyncio
from types import SimpleNamespace
from typing import Any, cast

import pytest

from ambit.waypoint.downstream import Downstream, DownstreamGoneError
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


async def _at_once(value: str) -> str:
    return value  # finishes without waiting on anything


async def test_an_operation_that_waits_after_work_done_at_once_is_still_bounded() -> None:
    async def works_then_waits(never: asyncio.Future[None]) -> None:
        await _at_once("some work")
        await never

    bound = OperationBound()
    never: asyncio.Future[None] = asyncio.get_running_loop().create_future()
    with pytest.raises(TimeoutError):
        await asyncio.wait_for(bound.run(works_then_waits(never), 0.02), 5.0)
    assert never.cancelled()
    bound.close()


async def test_an_operation_that_waits_then_finishes_returns_its_result_and_an_error_it_catches_is_its_own() -> None:
    async def waits_and_survives_an_error(ready: asyncio.Future[str]) -> str:
        try:
            return await ready
        except ConnectionResetError:
            return "handled"

    loop = asyncio.get_running_loop()
    bound = OperationBound()
    ready: asyncio.Future[str] = loop.create_future()
    loop.call_later(0.01, ready.set_result, "arrived")
    assert await bound.run(waits_and_survives_an_error(ready), 1.0) == "arrived"
    failed: asyncio.Future[str] = loop.create_future()
    loop.call_later(0.01, failed.set_exception, ConnectionResetError())
    assert await bound.run(waits_and_survives_an_error(failed), 1.0) == "handled"
    bound.close()


async def test_a_second_task_at_once_whose_operation_finishes_in_time_gets_its_result() -> None:
    bound = OperationBound()
    never: asyncio.Future[None] = asyncio.get_running_loop().create_future()
    first = asyncio.get_running_loop().create_task(bound.run(never, 30.0))
    await asyncio.sleep(0)
    assert await bound.run(asyncio.sleep(0.01, "second"), 1.0) == "second"  # rule 3, after its first wait
    first.cancel()
    with pytest.raises(asyncio.CancelledError):
        await first
    bound.close()


class _TakesThenStops:
    """A client's tunnel that takes ``accepted`` writes at once, then never takes another (it stopped reading)."""

    def __init__(self, accepted: int) -> None:
        self.accepted = accepted
        self.written: list[bytes] = []

    async def write(self, data: bytes | memoryview) -> None:
        if len(self.written) >= self.accepted:
            await asyncio.get_running_loop().create_future()
        self.written.append(bytes(data))


async def test_a_client_that_stops_reading_after_writes_taken_at_once_still_fails_after_idle_timeout() -> None:
    stream = _TakesThenStops(accepted=20)
    ctx = SimpleNamespace(limits=SimpleNamespace(idle_timeout=0.05))
    downstream = Downstream(cast(Any, ctx), cast(Any, stream), cast(Any, None))
    for _ in range(20):
        await downstream.write(b"HTTP/1.1 200 OK\r\ncontent-length: 0\r\n\r\n")
    loop = asyncio.get_running_loop()
    started = loop.time()
    with pytest.raises(DownstreamGoneError, match="stopped reading"):
        await asyncio.wait_for(downstream.write(b"one more"), 5.0)
    assert 0.04 <= loop.time() - started < 2.0
    downstream.close()
