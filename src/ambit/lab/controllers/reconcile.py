"""The loop every controller runs: take a key from the work queue, reconcile it, decide what happens next.

Rules, applied to the outcome of each ``reconcile(key)``:

1. Success: the key's failure count is reset. A returned delay queues the key again after it (a reconcile that
   must look again later, e.g. once a pod has been ready for ``minReadySeconds``).
2. ``409 Conflict`` or ``404 NotFound``: the cache was behind the server (someone wrote the object first, or it is
   gone). Queue again with back-off, quietly: the next reconcile reads a fresher cache.
3. Any other API failure (:class:`SyncError` or ``KubeClientError``): log it, record a Warning Event about the
   object (reason from the SyncError, else the controller's ``failure_reason``), queue again with back-off.
4. Any other exception is a bug in our code, triggered by this object: it is logged with its traceback and
   handled as in rule 3. One bad object never stops the loop or the other keys.

5. Resync: every ``resync`` seconds, every key the controller is responsible for is queued again (client-go's
   resync period). Reconciles are level-triggered (they read the whole current state from the caches), so a
   change whose event a handler missed, or whose reconcile acted on a cache that was behind, still converges.

Workers start only after every informer the controller reads has synced (the manager sees to it), so a reconcile
never acts on a partial cache.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
from typing import Any, Protocol

from ambit.errors import AmbitError
from ambit.k8s import EventRecorder, KubeClientError, KubeConflictError, KubeNotFoundError
from ambit.lab.controllers.workqueue import Key, WorkQueue

log = logging.getLogger("ambit.lab.controllers")


class ControllerError(AmbitError):
    """Base of the controllers' errors."""


class SyncError(ControllerError):
    """A reconcile failed for a reason worth telling the object's owner (a Warning Event with ``reason``)."""

    def __init__(self, reason: str, message: str) -> None:
        super().__init__(message)
        self.reason = reason
        self.message = message


class Reconciler(Protocol):
    name: str
    """The controller's name, as kube-controller-manager calls it (``replicaset-controller``)."""
    failure_reason: str
    """The Warning Event reason for failures that are not a :class:`SyncError`."""
    queue: WorkQueue
    recorder: EventRecorder

    def find(self, key: Key) -> dict[str, Any] | None:
        """The object ``key`` names, from the cache (what Warning Events are about)."""

    def all_keys(self) -> list[Key]:
        """Every key this controller is responsible for now, from the caches (what a resync queues)."""

    async def reconcile(self, key: Key) -> float | None:
        """Make the world match ``key``'s object; returns a delay after which to look again, or None."""


class ReconcileLoop:
    """``workers`` tasks draining one controller's queue (rules in the module docstring)."""

    def __init__(self, reconciler: Reconciler, workers: int, resync: float | None = None) -> None:
        self.reconciler = reconciler
        self.workers = workers
        self.resync = resync
        self.resyncs = 0
        self.reconciles = 0
        self.failures = 0
        self._tasks: list[asyncio.Task[None]] = []

    def start(self) -> None:
        loop = asyncio.get_running_loop()
        for i in range(self.workers):
            name = f"{self.reconciler.name} worker {i}"
            self._tasks.append(loop.create_task(self._work(), name=name))
        if self.resync:
            self._tasks.append(loop.create_task(self._resync(self.resync), name=f"{self.reconciler.name} resync"))

    async def aclose(self) -> None:
        self.reconciler.queue.close()
        tasks, self._tasks = self._tasks, []
        for task in tasks:
            task.cancel()
        for task in tasks:
            with contextlib.suppress(asyncio.CancelledError):
                await task

    async def _work(self) -> None:
        queue = self.reconciler.queue
        while True:
            key = await queue.get()
            try:
                await self.process(key)
            finally:
                queue.done(key)

    async def _resync(self, period: float) -> None:
        while True:
            await asyncio.sleep(period)
            self.resync_now()

    def resync_now(self) -> None:
        """Queue every key the controller is responsible for (rule 5)."""
        self.resyncs += 1
        for key in self.reconciler.all_keys():
            self.reconciler.queue.add(key)

    async def process(self, key: Key) -> None:
        r = self.reconciler
        self.reconciles += 1
        try:
            again = await r.reconcile(key)
        except asyncio.CancelledError:
            raise
        except (KubeConflictError, KubeNotFoundError) as exc:
            delay = r.queue.retry(key)
            log.debug("%s: %s: %s; again in %.2fs", r.name, _show(key), exc, delay)
        except Exception as exc:
            self.failures += 1
            delay = r.queue.retry(key)
            if isinstance(exc, SyncError):
                reason, message = exc.reason, exc.message
                log.warning("%s: %s: %s (again in %.2fs)", r.name, _show(key), message, delay)
            elif isinstance(exc, KubeClientError):
                reason, message = r.failure_reason, str(exc)
                log.warning("%s: %s: %s (again in %.2fs)", r.name, _show(key), message, delay)
            else:
                reason, message = r.failure_reason, f"internal error: {exc!r}"
                log.exception("%s: %s: reconcile failed (again in %.2fs)", r.name, _show(key), delay)
            obj = r.find(key)
            if obj is not None:
                r.recorder.record(obj, "Warning", reason, message, "Reconcile")
        else:
            r.queue.forget(key)
            if again is not None:
                r.queue.add_after(key, again)


def _show(key: Key) -> str:
    return f"{key[0]}/{key[1]}" if key[0] else key[1]
