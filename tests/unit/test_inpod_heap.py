"""The node proxy's heap settler: a burst of configuration changes freezes the heap once, after the burst."""

from __future__ import annotations

import asyncio
import gc
import weakref

from ambit.inpod.heap import HeapSettler


class Cycle:
    def __init__(self) -> None:
        self.me = self


def test_a_burst_of_changes_settles_once_after_the_burst_and_freezes_what_lives() -> None:
    async def run() -> tuple[int, int, int]:
        settler = HeapSettler(settle=0.05)
        kept = [object() for _ in range(1000)]
        for _ in range(20):
            settler.changed()
            await asyncio.sleep(0.001)
        assert settler.settles == 0
        await asyncio.sleep(0.2)
        frozen = gc.get_freeze_count()
        assert kept
        return settler.settles, frozen, len(kept)

    try:
        settles, frozen, _ = asyncio.run(run())
    finally:
        gc.unfreeze()
    assert settles == 1
    assert frozen > 1000


def test_garbage_frozen_by_one_settle_is_collected_by_the_next() -> None:
    async def run() -> tuple[bool, bool]:
        settler = HeapSettler(settle=0.01)
        cycle = Cycle()
        ref = weakref.ref(cycle)
        settler.changed()
        await asyncio.sleep(0.1)
        del cycle  # now cyclic garbage, frozen: a full collection alone does not see it
        gc.collect()
        survived_collect = ref() is not None
        settler.changed()
        await asyncio.sleep(0.1)
        return survived_collect, ref() is None

    try:
        assert asyncio.run(run()) == (True, True)
    finally:
        gc.unfreeze()


def test_close_cancels_a_pending_settle() -> None:
    async def run() -> int:
        settler = HeapSettler(settle=0.05)
        settler.changed()
        settler.close()
        await asyncio.sleep(0.1)
        return settler.settles

    assert asyncio.run(run()) == 0


def test_a_change_outside_an_event_loop_schedules_nothing() -> None:
    settler = HeapSettler()
    settler.changed()
    assert settler.settles == 0
