"""Keeping the collector off the configuration: the heap of a process that holds a large configuration.

Why: with a large configuration (10,000 AuthorizationPolicies, 100,000 workloads) the node proxy holds millions of
long-lived objects, and the control plane more (its caches of every object, the translation, the encoded
resources: ~1 GiB at 100,000 pods). CPython's cyclic collector scans every tracked object on each full (generation
2) collection, which comes every so often as new objects survive: a pause of tens of milliseconds in the node
proxy's event loop (bench-policy measured new connections' p99 10.7x the empty configuration's at 10k policies),
and of a second or more in the control plane's, where every push waits for it.

How: ``gc.freeze()`` moves every tracked object to the permanent generation, which the collector never scans (a
constant-time move of its lists); ``gc.unfreeze(); gc.collect(); gc.freeze()`` is a settle: one full collection at
a moment we choose, then what survived is frozen. Two policies:

:class:`HeapSettler` (the node proxy, whose configuration changes now and then): once the configuration has been
quiet for ``settle`` seconds after a change, it settles.

1. At most one settle per ``settle`` seconds of quiet: a burst of changes settles once, after the burst.
2. ``unfreeze`` first: objects frozen by the previous settle that have since become garbage in a reference cycle
   (a closed connection's task and its callbacks) are collected then, so freezing leaks nothing beyond the next
   change.
3. Without changes nothing is frozen again; the collector then works as usual on what is new.

:class:`ChurningHeap` (the control plane, whose configuration may change every half second for minutes, so that a
quiet moment may never come):

4. Each change freezes at once: what the hand-over made long-lived (caches, translation, encoded resources) leaves
   the collector's generations before a full collection would walk it.
5. A settle runs ``settle`` seconds after the last change, and at the latest ``collect_every`` seconds after the
   previous one even while changes keep coming: reference cycles that became garbage after being frozen are
   reclaimed then, so what freezing keeps beyond its time is bounded by what ``collect_every`` seconds make.

:func:`tune_collector` (the node proxy, at start-up, beside the C allocator's thresholds):

6. A young collection starts once :data:`YOUNG_THRESHOLD` more container objects were made than freed (CPython's
   default is 700). A connection's set-up holds more than 700 young objects for a moment, all of them freed by
   reference counting a moment later (a connection leaves nothing in cycles: tests/integration/
   test_hbone_pool_cold.py), so at 700 the collector ran dozens of times a second under new connections and found
   nothing: 15-57 CPU-us per cold connection (bench/proxy_connections.py's collector figure), none at 10,000. What
   a cycle that does become garbage waits for is then at most 10,000 young objects, about a megabyte.
"""

from __future__ import annotations

import asyncio
import gc
import logging
import time
from collections.abc import Callable

log = logging.getLogger(__name__)

DEFAULT_SETTLE = 2.0

YOUNG_THRESHOLD = 10_000
"""Net new container objects that start a young collection (rule 6)."""


def tune_collector(young: int = YOUNG_THRESHOLD) -> None:
    """Rule 6: a young collection once ``young`` more container objects were made than freed; the older
    generations' thresholds are kept."""
    _, middle, old = gc.get_threshold()
    gc.set_threshold(young, middle, old)


def settle_now(level: int) -> float:
    """A settle (``unfreeze``, a full collection, ``freeze``), logged at ``level``; the seconds it held the loop."""
    started = time.perf_counter()
    gc.unfreeze()
    found = gc.collect()
    gc.freeze()
    pause = time.perf_counter() - started
    log.log(
        level, "heap settled in %.1f ms: %d unreachable, %d objects frozen", pause * 1e3, found, gc.get_freeze_count()
    )
    return pause


class HeapSettler:
    """Call :meth:`changed` on every configuration change; the settle runs on the event loop, debounced."""

    def __init__(self, settle: float = DEFAULT_SETTLE) -> None:
        self.settle = settle
        self.settles = 0
        self.last_pause = 0.0
        """Seconds the last settle held the event loop."""
        self._timer: asyncio.TimerHandle | None = None

    def changed(self) -> None:
        if self._timer is not None:
            self._timer.cancel()
        try:
            loop = asyncio.get_running_loop()
        except RuntimeError:  # no loop (a unit test applying state directly): nothing to schedule
            return
        self._timer = loop.call_later(self.settle, self._run)

    def _run(self) -> None:
        self._timer = None
        self.last_pause = settle_now(logging.DEBUG)
        self.settles += 1

    def close(self) -> None:
        if self._timer is not None:
            self._timer.cancel()
            self._timer = None


DEFAULT_COLLECT_EVERY = 600.0


class ChurningHeap:
    """Call :meth:`changed` after each configuration change (rules 4 and 5); settles run on the event loop."""

    def __init__(
        self,
        settle: float = DEFAULT_SETTLE,
        collect_every: float = DEFAULT_COLLECT_EVERY,
        clock: Callable[[], float] = time.monotonic,
    ) -> None:
        self.settle = settle
        self.collect_every = collect_every
        self._clock = clock
        self._settled_at = clock()
        self.settles = 0
        self.freezes = 0
        self.last_pause = 0.0
        """Seconds the last settle held the event loop."""
        self._timer: asyncio.TimerHandle | None = None

    def changed(self) -> None:
        gc.freeze()  # rule 4
        self.freezes += 1
        if self._timer is not None:
            self._timer.cancel()
            self._timer = None
        try:
            loop = asyncio.get_running_loop()
        except RuntimeError:  # no loop (a unit test applying state directly): the freeze only
            return
        overdue = self._settled_at + self.collect_every - self._clock()
        self._timer = loop.call_later(max(0.0, min(self.settle, overdue)), self._run)  # rule 5

    def _run(self) -> None:
        self._timer = None
        self.last_pause = settle_now(logging.INFO)
        self._settled_at = self._clock()
        self.settles += 1

    def close(self) -> None:
        if self._timer is not None:
            self._timer.cancel()
            self._timer = None
