"""A work queue of object keys, as client-go's rate-limited workqueue.

Rules:

1. A key is queued at most once. Adding a key that is already waiting does nothing (changes coalesce: the
   reconcile that eventually runs reads the latest state from the informers' caches).
2. A key is processed by at most one worker at a time. Adding a key while a worker holds it marks it dirty;
   :meth:`WorkQueue.done` queues it again, so the change is not lost and two workers never race on one object.
3. :meth:`WorkQueue.retry` queues the key again after a per-key delay that doubles with each consecutive failure,
   from ``initial`` up to ``maximum``; :meth:`WorkQueue.forget` resets the count after a success.
   :meth:`WorkQueue.add_after` queues it after a fixed delay (for reconciles that must look again later).
4. After :meth:`WorkQueue.close`, adds are ignored and pending timers are cancelled.
"""

from __future__ import annotations

import asyncio
from collections.abc import Hashable

Key = tuple[str, str]
"""(namespace, name); the namespace is "" for cluster-scoped kinds."""


class WorkQueue:
    def __init__(self, name: str, *, initial: float = 0.05, maximum: float = 30.0) -> None:
        self.name = name
        self._initial = initial
        self._maximum = maximum
        self._queue: asyncio.Queue[Key] = asyncio.Queue()
        self._dirty: set[Key] = set()
        self._processing: set[Key] = set()
        self._failures: dict[Key, int] = {}
        self._timers: dict[Hashable, asyncio.TimerHandle] = {}
        self._closed = False

    def __len__(self) -> int:
        return self._queue.qsize()

    def idle(self) -> bool:
        """Nothing queued, nothing being processed, nothing waiting on a timer."""
        return not self._queue.qsize() and not self._processing and not self._timers

    def add(self, key: Key) -> None:
        if self._closed or key in self._dirty:
            return
        self._dirty.add(key)
        if key not in self._processing:
            self._queue.put_nowait(key)

    async def get(self) -> Key:
        """The next key; the caller must call :meth:`done` with it when finished."""
        key = await self._queue.get()
        self._dirty.discard(key)
        self._processing.add(key)
        return key

    def done(self, key: Key) -> None:
        self._processing.discard(key)
        if key in self._dirty:
            self._queue.put_nowait(key)

    def add_after(self, key: Key, delay: float) -> None:
        if self._closed:
            return
        if delay <= 0:
            self.add(key)
            return
        timer_id = (key, object())
        loop = asyncio.get_running_loop()
        self._timers[timer_id] = loop.call_later(delay, self._fire, timer_id, key)

    def retry(self, key: Key) -> float:
        """Queue ``key`` again after its back-off delay; returns the delay."""
        failures = self._failures.get(key, 0)
        self._failures[key] = failures + 1
        delay = min(self._initial * 2.0**failures, self._maximum)
        self.add_after(key, delay)
        return delay

    def failures(self, key: Key) -> int:
        return self._failures.get(key, 0)

    def forget(self, key: Key) -> None:
        self._failures.pop(key, None)

    def _fire(self, timer_id: Hashable, key: Key) -> None:
        self._timers.pop(timer_id, None)
        self.add(key)

    def close(self) -> None:
        self._closed = True
        for timer in self._timers.values():
            timer.cancel()
        self._timers.clear()
