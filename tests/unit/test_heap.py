"""The heap policies of :mod:`ambit.heap`: the node proxy's settler (a burst of configuration changes freezes the
heap once, after the burst) and the control plane's churning heap (each change freezes; a settle comes after quiet,
or by its deadline under endless change)."""

from __future__ import annotations

import asyncio
import gc
import weakref

from ambit.heap import YOUNG_THRESHOLD, ChurningHeap, HeapSettler, tune_collector


class Cycle:
    def __init__(self) -> None:
        self.me = self


async def settled(settler: HeapSettler, count: int) -> None:
    """Wait (up to about 10 s) until ``settler`` has settled ``count`` times: a loaded machine runs a timer late,
    never early."""
    for _ in range(1000):
        if settler.settles >= count:
            return
        await asyncio.sleep(0.01)
    raise AssertionError(f"{settler.settles} settles, not {count}")


def test_a_burst_of_changes_settles_once_after_the_burst_and_freezes_what_lives() -> None:
    """The burst's changes come 1 ms apart with a 0.5 s settle: only a stall of half a second between two of them
    would let a settle in mid-burst (with a 50 ms settle, a loaded CI machine did once)."""

    async def run() -> tuple[int, int, int]:
        settler = HeapSettler(settle=0.5)
        kept = [object() for _ in range(1000)]
        for _ in range(20):
            settler.changed()
            await asyncio.sleep(0.001)
        assert settler.settles == 0
        await settled(settler, 1)
        await asyncio.sleep(1.0)  # two settle periods more: no second settle without a change
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
        await settled(settler, 1)
        del cycle  # now cyclic garbage, frozen: a full collection alone does not see it
        gc.collect()
        survived_collect = ref() is not None
        settler.changed()
        await settled(settler, 2)
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


def test_each_change_of_a_churning_heap_freezes_at_once_and_a_quiet_moment_settles() -> None:
    async def run() -> tuple[int, int, int]:
        heap = ChurningHeap(settle=0.05, collect_every=60)
        kept = [object() for _ in range(1000)]
        gc.unfreeze()
        heap.changed()
        frozen = gc.get_freeze_count()
        for _ in range(5):  # a burst, with no turn of the loop in between: nothing can settle during it
            heap.changed()
        before = heap.settles
        for _ in range(1000):  # polled: the settle is a timer of the loop, with nothing to await
            if heap.settles:
                break
            await asyncio.sleep(0.01)
        await asyncio.sleep(0.1)  # and no second settle without a change
        assert kept
        return frozen, before, heap.settles

    try:
        frozen, before, after = asyncio.run(run())
    finally:
        gc.unfreeze()
    assert frozen > 1000  # rule 4: frozen by the change itself, before any settle
    assert (before, after) == (0, 1)


def test_a_churning_heap_settles_by_its_deadline_while_changes_never_stop() -> None:
    async def run() -> tuple[int, bool, bool]:
        heap = ChurningHeap(settle=10.0, collect_every=0.1)
        cycle = Cycle()
        ref = weakref.ref(cycle)
        heap.changed()
        del cycle  # cyclic garbage, frozen: only a settle reclaims it
        gc.collect()
        frozen_alive = ref() is not None
        started = asyncio.get_running_loop().time()
        while heap.settles < 2 and asyncio.get_running_loop().time() - started < 9:  # never quiet for 10 s
            heap.changed()
            await asyncio.sleep(0.01)
        heap.close()
        return heap.settles, frozen_alive, ref() is None

    try:
        settles, frozen_alive, reclaimed = asyncio.run(run())
    finally:
        gc.unfreeze()
    assert frozen_alive and reclaimed  # rule 5: the deadline's settle collected what freezing kept
    assert settles == 2  # again and again, every collect_every, while the changes never left 10 s of quiet


def test_a_churning_heap_outside_a_loop_freezes_and_schedules_nothing_and_close_cancels() -> None:
    try:
        heap = ChurningHeap(settle=0.01)
        heap.changed()
        assert heap.freezes == 1 and gc.get_freeze_count() > 0

        async def run() -> int:
            heap.changed()
            heap.close()
            await asyncio.sleep(0.05)
            return heap.settles

        assert asyncio.run(run()) == 0
    finally:
        gc.unfreeze()


def test_tune_collector_raises_the_young_threshold_and_keeps_the_older_ones() -> None:
    before = gc.get_threshold()
    try:
        gc.set_threshold(700, 7, 9)
        tune_collector()
        assert gc.get_threshold() == (YOUNG_THRESHOLD, 7, 9)
        tune_collector(2_000)
        assert gc.get_threshold() == (2_000, 7, 9)
    finally:
        gc.set_threshold(*before)
