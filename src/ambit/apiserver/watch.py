"""Watch fan-out: committed store events go to the watchers of their type, filtered as each watcher asked.

A watcher with a selector sees an object enter (ADDED) or leave (DELETED) its selection when a write moves the
object across the selector's boundary, as kube-apiserver's watch cache does. A watcher that falls too far behind
(more events or more encoded bytes waiting than its bounds) is closed; its client re-watches from the last version
it saw (or relists on 410), which is the protocol's own recovery path.
"""

from __future__ import annotations

import asyncio
from dataclasses import dataclass
from typing import Any, Protocol

from ambit.apiserver.store import StoredObject, StoreEvent, TypeKey


class Selector(Protocol):
    def matches(self, value: Any, /) -> bool: ...


@dataclass(frozen=True, slots=True)
class ObjectFilter:
    """Which objects of a type a list or watch selects."""

    namespace: str | None = None
    labels: Selector | None = None
    fields: Selector | None = None

    def matches(self, item: StoredObject) -> bool:
        if self.namespace is not None and item.namespace != self.namespace:
            return False
        if self.labels is not None and not self.labels.matches(item.labels):
            return False
        return self.fields is None or self.fields.matches(item.obj)


def translate(event: StoreEvent, selection: ObjectFilter) -> tuple[str, StoredObject] | None:
    """The event as a watcher with ``selection`` sees it, or None when it does not concern that watcher."""
    if selection.namespace is not None and event.namespace != selection.namespace:
        return None
    new_ok = selection.matches(event.item)
    old_ok = new_ok if event.old is None else selection.matches(event.old)
    if event.type == "DELETED":
        return ("DELETED", event.item) if (old_ok or new_ok) else None
    if event.type == "ADDED":
        return ("ADDED", event.item) if new_ok else None
    if new_ok and old_ok:
        return ("MODIFIED", event.item)
    if new_ok:
        return ("ADDED", event.item)
    if old_ok:
        return ("DELETED", event.item)
    return None


class Watcher:
    """One client's watch: a queue of events bounded in count and in encoded bytes; ``None`` in the queue means the
    watch was closed. Take events with :meth:`get` and :meth:`get_nowait`, which keep the byte count."""

    def __init__(self, key: TypeKey, selection: ObjectFilter, capacity: int, capacity_bytes: int) -> None:
        self.key = key
        self.selection = selection
        self.queue: asyncio.Queue[tuple[str, StoredObject] | None] = asyncio.Queue()
        self._capacity = capacity
        self._capacity_bytes = capacity_bytes
        self.queued_bytes = 0
        self.closed = False

    async def get(self) -> tuple[str, StoredObject] | None:
        return self._taken(await self.queue.get())

    def get_nowait(self) -> tuple[str, StoredObject] | None:
        return self._taken(self.queue.get_nowait())

    def _taken(self, seen: tuple[str, StoredObject] | None) -> tuple[str, StoredObject] | None:
        if seen is not None:
            self.queued_bytes -= len(seen[1].raw)
        return seen

    def offer(self, event: StoreEvent) -> None:
        if self.closed:
            return
        seen = translate(event, self.selection)
        if seen is None:
            return
        size = len(seen[1].raw)
        if self.queue.qsize() >= self._capacity or self.queued_bytes + size > self._capacity_bytes:
            self.close()
            return
        self.queued_bytes += size
        self.queue.put_nowait(seen)

    def close(self) -> None:
        if not self.closed:
            self.closed = True
            self.queue.put_nowait(None)


class WatchHub:
    """Routes committed events to the watchers of their type."""

    def __init__(self, *, capacity: int = 100_000, capacity_bytes: int = 16 * 1024 * 1024) -> None:
        self._watchers: dict[TypeKey, set[Watcher]] = {}
        self._capacity = capacity
        self._capacity_bytes = capacity_bytes

    def subscribe(self, key: TypeKey, selection: ObjectFilter) -> Watcher:
        watcher = Watcher(key, selection, self._capacity, self._capacity_bytes)
        self._watchers.setdefault(key, set()).add(watcher)
        return watcher

    def unsubscribe(self, watcher: Watcher) -> None:
        watchers = self._watchers.get(watcher.key)
        if watchers is not None:
            watchers.discard(watcher)
        watcher.closed = True

    def publish(self, event: StoreEvent) -> None:
        for watcher in list(self._watchers.get(event.key, ())):
            watcher.offer(event)

    def close_type(self, key: TypeKey) -> None:
        """End every watch on a type (its CRD went away)."""
        for watcher in self._watchers.pop(key, set()):
            watcher.close()

    def close_all(self) -> None:
        for key in list(self._watchers):
            self.close_type(key)

    @property
    def count(self) -> int:
        return sum(len(w) for w in self._watchers.values())
