"""Expectations: the creates and deletes a controller issued that its informer has not shown it yet.

Why: the informer's cache lags behind our own writes. A ReplicaSet that created 3 pods and is reconciled again
before the pods' ADDED events arrive would see 0 pods and create 3 more. So, as client-go's
ControllerExpectations:

1. Before creating ``n`` objects, :meth:`expect_creations` records ``n``; each ADDED event of an object the
   controller owns lowers the count (:meth:`creation_observed`), as does each create that failed.
2. Before deleting objects, :meth:`expect_deletions` records their keys; each is struck off when the informer
   shows it gone or terminating (:meth:`deletion_observed`), or when the delete failed.
3. A controller changes the number of its objects only while its expectations are *satisfied*: nothing is
   outstanding, or the record is older than ``timeout`` (an event was lost: trust the cache again).
"""

from __future__ import annotations

import time
from collections.abc import Callable, Iterable
from dataclasses import dataclass, field

from ambit.lab.controllers.workqueue import Key


@dataclass(slots=True)
class _Record:
    adds: int = 0
    deletes: set[Key] = field(default_factory=set)
    since: float = 0.0


class Expectations:
    def __init__(self, timeout: float = 300.0, clock: Callable[[], float] = time.monotonic) -> None:
        self._timeout = timeout
        self._clock = clock
        self._records: dict[Key, _Record] = {}

    def satisfied(self, controller: Key) -> bool:
        record = self._records.get(controller)
        if record is None:
            return True
        if record.adds <= 0 and not record.deletes:
            return True
        return self._clock() - record.since > self._timeout

    def expect_creations(self, controller: Key, count: int) -> None:
        record = self._records.setdefault(controller, _Record())
        record.adds = max(record.adds, 0) + count
        record.since = self._clock()

    def expect_deletions(self, controller: Key, keys: Iterable[Key]) -> None:
        record = self._records.setdefault(controller, _Record())
        record.deletes.update(keys)
        record.since = self._clock()

    def creation_observed(self, controller: Key) -> None:
        record = self._records.get(controller)
        if record is not None and record.adds > 0:
            record.adds -= 1

    def deletion_observed(self, controller: Key, key: Key) -> None:
        record = self._records.get(controller)
        if record is not None:
            record.deletes.discard(key)

    def forget(self, controller: Key) -> None:
        """The controller is gone: drop its record."""
        self._records.pop(controller, None)
