"""Where one watch stands: what it has sent, what comes next, when it bookmarks and when it ends.

Theory of operation: the HTTP shell only encodes and writes what the cursor hands it; the cursor decides.

1. :meth:`WatchCursor.open` subscribes and reads the backlog with no ``await`` in between, so no committed event
   can fall between the backlog and the live queue. The backlog is the current list (a watch from version 0, or
   one that asked for initial events) or the events after the requested version, as this watcher sees them.
2. The deadline and the bookmark interval count from the first :meth:`WatchCursor.next`, once the backlog is
   sent. :meth:`WatchCursor.next` waits for the next step: :class:`Events` (everything queued, in order, at most once:
   an event at or below the last version sent is dropped), a :class:`Bookmark` when bookmarks were asked for and
   the interval passed with nothing to send, or None when the watch is over (its deadline passed, or the hub
   closed the watcher because its client fell behind or its type went away).
3. Cancellation is never swallowed: a cancelled ``next`` raises :class:`asyncio.CancelledError` to its caller.
   :meth:`WatchCursor.close` unsubscribes; the shell calls it in ``finally``.

Time comes from ``clock`` (the event loop's monotonic time in the shell), so tests can drive deadlines.
"""

from __future__ import annotations

import asyncio
from collections.abc import Callable
from dataclasses import dataclass

from ambit.apiserver.store import Store, StoredObject, TypeKey
from ambit.apiserver.watch import ObjectFilter, Watcher, WatchHub, translate

Seen = tuple[str, StoredObject]
"""An event as the watcher sees it: (ADDED | MODIFIED | DELETED, object)."""


@dataclass(frozen=True, slots=True)
class Events:
    items: list[Seen]


@dataclass(frozen=True, slots=True)
class Bookmark:
    resource_version: int


@dataclass(frozen=True, slots=True)
class WatchSettings:
    timeout: float
    """Seconds until the watch ends (the client's ``timeoutSeconds`` or the server's default)."""
    bookmark_interval: float | None = None
    """Seconds of quiet before a bookmark; None when the client did not ask for bookmarks."""


class WatchCursor:
    def __init__(
        self,
        hub: WatchHub,
        watcher: Watcher,
        *,
        last_rv: int,
        settings: WatchSettings,
        current_rv: Callable[[], int],
        clock: Callable[[], float],
    ) -> None:
        self.hub = hub
        self.watcher = watcher
        self.last_rv = last_rv
        self.subscribed_rv = last_rv
        self.initial: list[StoredObject] = []
        self.replay: list[Seen] = []
        self._current_rv = current_rv
        self._clock = clock
        self._settings = settings
        self._deadline: float | None = None
        self._next_bookmark: float | None = None
        self._closed = False

    @classmethod
    def open(
        cls,
        hub: WatchHub,
        store: Store,
        key: TypeKey,
        selection: ObjectFilter,
        *,
        start_rv: int,
        send_initial: bool,
        list_items: Callable[[], list[StoredObject]],
        settings: WatchSettings,
        clock: Callable[[], float],
    ) -> WatchCursor:
        """Subscribe and read the backlog; the caller checked that ``start_rv`` is within the store's log."""
        watcher = hub.subscribe(key, selection)
        cursor = cls(
            hub,
            watcher,
            last_rv=store.resource_version,
            settings=settings,
            current_rv=lambda: store.resource_version,
            clock=clock,
        )
        if send_initial or not start_rv:
            cursor.initial = list_items()
        else:
            for event in store.events_after(start_rv):
                if event.key != key:  # the log holds every type's events
                    continue
                seen = translate(event, selection)
                if seen is not None:
                    cursor.replay.append(seen)
            if cursor.replay:
                cursor.last_rv = max(cursor.last_rv, cursor.replay[-1][1].rv)
        return cursor

    async def next(self) -> Events | Bookmark | None:
        """The next thing to send, or None when the watch is over."""
        queue = self.watcher.queue
        watcher = self.watcher
        if self._deadline is None:  # the clocks start once the backlog is out
            started = self._clock()
            self._deadline = started + self._settings.timeout
            if self._settings.bookmark_interval is not None:
                self._next_bookmark = started + self._settings.bookmark_interval
        while not self._closed:
            now = self._clock()
            if now >= self._deadline:
                return None
            batch: list[Seen | None] = []
            if queue.empty():
                due = self._deadline if self._next_bookmark is None else min(self._deadline, self._next_bookmark)
                try:
                    batch.append(await asyncio.wait_for(watcher.get(), timeout=max(due - now, 0.0)))
                except TimeoutError:
                    bookmark = self._bookmark_due()
                    if bookmark is not None:
                        return bookmark
                    continue
            while not queue.empty():  # under load, everything queued goes out in one write
                batch.append(watcher.get_nowait())
            fresh: list[Seen] = []
            for got in batch:
                if got is None:
                    self._closed = True
                    break
                if got[1].rv <= self.last_rv:
                    continue
                fresh.append(got)
                self.last_rv = got[1].rv
            if fresh:
                return Events(fresh)
        return None

    def close(self) -> None:
        self.hub.unsubscribe(self.watcher)

    def _bookmark_due(self) -> Bookmark | None:
        interval = self._settings.bookmark_interval
        if self._next_bookmark is None or interval is None or self._clock() < self._next_bookmark:
            return None
        self._next_bookmark = self._clock() + interval
        return Bookmark(max(self.last_rv, self._current_rv()))
