"""A watcher's queue is bounded in encoded bytes as well as in events: past either bound the watch is closed."""

from __future__ import annotations

from ambit.apiserver.store import StoredObject, StoreEvent
from ambit.apiserver.watch import ObjectFilter, Watcher

KEY = ("", "configmaps")


def event(rv: int, size: int) -> StoreEvent:
    obj = {"metadata": {"name": "cm", "namespace": "default", "resourceVersion": str(rv)}}
    return StoreEvent("MODIFIED", KEY, "default", "cm", StoredObject(rv, obj, b"x" * size))


async def test_a_watcher_past_its_byte_bound_is_closed_and_taking_frees_bytes() -> None:
    watcher = Watcher(KEY, ObjectFilter(), capacity=1000, capacity_bytes=250)
    watcher.offer(event(1, 100))
    watcher.offer(event(2, 100))
    assert watcher.queued_bytes == 200 and not watcher.closed
    taken = watcher.get_nowait()
    assert taken is not None and taken[1].rv == 1
    assert watcher.queued_bytes == 100
    watcher.offer(event(3, 100))
    assert not watcher.closed
    watcher.offer(event(4, 100))  # 300 > 250
    assert watcher.closed
    assert [await watcher.get() for _ in range(3)] == [
        ("MODIFIED", event(2, 100).item),
        ("MODIFIED", event(3, 100).item),
        None,
    ]
