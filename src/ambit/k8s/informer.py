"""List, then watch, one resource kind into a local cache, and tell handlers what changed (client-go's reflector
and indexer in one).

Rules, in the order the loop applies them:

1. Start by listing (in pages). The list replaces the cache; handlers see the difference between the old cache
   and the list: ``on_add`` for new keys, ``on_update`` for keys whose ``resourceVersion`` changed, ``on_delete``
   for keys that are gone. A key whose ``uid`` changed was deleted and created again while we were away: its
   handlers see ``on_delete(old)`` then ``on_add(new)``. After the first list, ``synced`` is true.
2. Then watch from the last version seen, with bookmarks. Each event updates the cache first, then calls the
   handlers, so a handler's ``find()`` already sees the change. Bookmarks only move the version forward.
3. A watch that ends cleanly (its timeout passed, the server closed it) is reopened at once from the last version.
   One that ends within ``quiet_watch`` seconds without delivering an event counts as a failure (rule 5), so
   that a server that keeps closing watches is not hammered.
4. ``410 Gone`` (as HTTP 410 or as an ERROR event) means the server no longer has the history since our version:
   go back to rule 1 at once.
5. A transport failure (connection refused, reset, timeout) waits a backoff delay, then re-watches from the last
   version (which may lead to rule 4). Any other error Status waits the delay, then relists (rule 1). A failed
   list waits the delay and lists again. Delays grow exponentially with jitter up to a cap, and start over once
   a list succeeds or a watch delivers an event.

6. A ``transform`` (when given) is applied to every object listed or sent in an event, before it is cached and
   before any handler sees it (client-go's ``SetTransform``): a cache may keep only the fields its readers read
   (:mod:`ambit.controlplane.cached_fields`). Keys and versions are read from the transformed object, so a
   transform keeps ``metadata.namespace``, ``name``, ``uid`` and ``resourceVersion``.

Handlers run in the informer's task, one at a time, in event order; they may be plain functions or coroutine
functions. A handler that raises is logged and the informer carries on. Cached objects are shared with the
handlers: treat them as read-only.
"""

from __future__ import annotations

import asyncio
import contextlib
import enum
import inspect
import logging
import random
import time
from collections.abc import Awaitable, Callable
from dataclasses import dataclass, field
from types import TracebackType
from typing import Any

from ambit.k8s.client import KubeClient, Selector
from ambit.k8s.errors import KubeApiStatusError, KubeClientError, KubeGoneError
from ambit.k8s.kinds import ResourceKind
from ambit.k8s.watch import WatchEvent, WatchEventType

log = logging.getLogger("ambit.k8s.informer")

Object = dict[str, Any]
Key = tuple[str, str]  # (namespace, name); namespace "" for cluster-scoped kinds
OnAdd = Callable[[Object], Awaitable[None] | None]
OnUpdate = Callable[[Object, Object], Awaitable[None] | None]
OnDelete = Callable[[Object], Awaitable[None] | None]
Transform = Callable[[Object], Object]


@dataclass(frozen=True, slots=True)
class InformerSettings:
    """How an informer lists, watches and backs off (defaults follow client-go's reflector)."""

    page_size: int = 500
    """Objects per list request."""
    watch_timeout: float = 300.0
    """Each watch asks the server to end it after a random time in [t, 2t) seconds, so that the watches of many
    clients do not all end together."""
    quiet_watch: float = 1.0
    """A watch that ends within this many seconds without delivering an event counts as a failure."""
    backoff_initial: float = 0.8
    backoff_max: float = 30.0
    backoff_factor: float = 2.0
    backoff_jitter: float = 1.0
    """Each delay is the exponential base times a random factor in [1, 1 + jitter)."""


class Backoff:
    """Exponential delays with jitter; pure bookkeeping, the caller sleeps."""

    def __init__(self, settings: InformerSettings, rand: Callable[[], float]) -> None:
        self._settings = settings
        self._rand = rand
        self._attempt = 0

    def next_delay(self) -> float:
        s = self._settings
        base = min(s.backoff_initial * s.backoff_factor**self._attempt, s.backoff_max)
        if base < s.backoff_max:
            self._attempt += 1
        return base * (1.0 + s.backoff_jitter * self._rand())

    def reset(self) -> None:
        self._attempt = 0


class _WatchEnd(enum.Enum):
    CLOSED = "closed"
    QUIET = "closed quickly with no events"
    GONE = "expired (410)"
    TRANSPORT = "transport failure"
    STATUS = "error status"


@dataclass(slots=True)
class InformerStats:
    """Counters, for metrics and tests."""

    lists: int = 0
    watches: int = 0
    gone: int = 0
    failures: int = 0
    handler_errors: int = 0


@dataclass(slots=True)
class _Handlers:
    on_add: list[OnAdd] = field(default_factory=list)
    on_update: list[OnUpdate] = field(default_factory=list)
    on_delete: list[OnDelete] = field(default_factory=list)


class Informer:
    """A cache of one kind (optionally one namespace and selectors), kept current by list and watch."""

    def __init__(
        self,
        client: KubeClient,
        kind: ResourceKind,
        *,
        namespace: str | None = None,
        label_selector: Selector = None,
        field_selector: Selector = None,
        on_add: OnAdd | None = None,
        on_update: OnUpdate | None = None,
        on_delete: OnDelete | None = None,
        settings: InformerSettings | None = None,
        transform: Transform | None = None,
        sleep: Callable[[float], Awaitable[None]] = asyncio.sleep,
        clock: Callable[[], float] = time.monotonic,
        rand: Callable[[], float] = random.random,
    ) -> None:
        if namespace and not kind.namespaced:
            raise ValueError(f"{kind} are cluster-scoped: an informer on them cannot take a namespace")
        self.client = client
        self.kind = kind
        self.namespace = namespace
        self.label_selector = label_selector
        self.field_selector = field_selector
        self.settings = settings or InformerSettings()
        self.transform = transform
        self.stats = InformerStats()
        self._handlers = _Handlers()
        self._task: asyncio.Task[None] | None = None
        self.add_handler(on_add=on_add, on_update=on_update, on_delete=on_delete)
        self._sleep = sleep
        self._clock = clock
        self._rand = rand
        self._backoff = Backoff(self.settings, rand)
        self._cache: dict[Key, Object] = {}
        self._synced = asyncio.Event()
        self.resource_version = ""
        """The version the cache reflects: the last list's, event's or bookmark's."""

    def add_handler(
        self, *, on_add: OnAdd | None = None, on_update: OnUpdate | None = None, on_delete: OnDelete | None = None
    ) -> None:
        """Add handlers; only before the informer starts, so that every handler sees every object."""
        if self._task is not None:
            raise RuntimeError("add handlers before the informer starts")
        if on_add is not None:
            self._handlers.on_add.append(on_add)
        if on_update is not None:
            self._handlers.on_update.append(on_update)
        if on_delete is not None:
            self._handlers.on_delete.append(on_delete)

    # -- cache lookups (synchronous) ------------------------------------------------------------------------
    @property
    def synced(self) -> bool:
        """True once the first list has been delivered to the handlers."""
        return self._synced.is_set()

    async def wait_synced(self) -> None:
        """Wait for the first list; raises if the informer's task ended first (cancelled, or a bug)."""
        task = self._task
        if task is None or self.synced:
            await self._synced.wait()
            return
        waiter = asyncio.ensure_future(self._synced.wait())
        try:
            await asyncio.wait({waiter, task}, return_when=asyncio.FIRST_COMPLETED)
        finally:
            waiter.cancel()
        if not self.synced:
            if not task.cancelled() and task.exception() is not None:
                raise RuntimeError(f"informer {self.kind} failed before it synced") from task.exception()
            raise RuntimeError(f"informer {self.kind} stopped before it synced")

    def find(self, name: str, namespace: str | None = None) -> Object | None:
        return self._cache.get((namespace or "", name))

    def items(self) -> list[Object]:
        return list(self._cache.values())

    def __len__(self) -> int:
        return len(self._cache)

    # -- lifecycle ------------------------------------------------------------------------------------------
    def start(self) -> asyncio.Task[None]:
        if self._task is None:
            where = self.namespace or "all namespaces"
            self._task = asyncio.get_running_loop().create_task(self.run(), name=f"informer {self.kind} {where}")
        return self._task

    async def aclose(self) -> None:
        task, self._task = self._task, None
        if task is not None:
            task.cancel()
            with contextlib.suppress(asyncio.CancelledError):
                await task

    async def __aenter__(self) -> Informer:
        self.start()
        return self

    async def __aexit__(
        self, exc_type: type[BaseException] | None, exc: BaseException | None, tb: TracebackType | None
    ) -> None:
        await self.aclose()

    async def run(self) -> None:
        """List and watch until cancelled (rules 1 to 5 of the module docstring)."""
        must_list = True
        while True:
            if must_list:
                try:
                    await self._list()
                except KubeClientError as exc:
                    self.stats.failures += 1
                    delay = self._backoff.next_delay()
                    log.warning("informer %s: list failed (retrying in %.1fs): %s", self.kind, delay, exc)
                    await self._sleep(delay)
                    continue
                must_list = False
            end = await self._watch()
            if end is _WatchEnd.CLOSED:
                continue
            if end is _WatchEnd.GONE:
                self.stats.gone += 1
                log.info("informer %s: version %s expired; relisting", self.kind, self.resource_version)
                must_list = True
                continue
            self.stats.failures += 1
            delay = self._backoff.next_delay()
            log.info("informer %s: watch %s; retrying in %.1fs", self.kind, end.value, delay)
            await self._sleep(delay)
            must_list = end is _WatchEnd.STATUS

    # -- list -----------------------------------------------------------------------------------------------
    async def _list(self) -> None:
        items, version = await self.client.list(
            self.kind,
            self.namespace,
            label_selector=self.label_selector,
            field_selector=self.field_selector,
            limit=self.settings.page_size,
            transform=self.transform,  # each page as it arrives (rule 6); None keeps objects whole
        )
        self.stats.lists += 1
        self._backoff.reset()
        old = self._cache
        self._cache = {_key(obj): obj for obj in items}
        self.resource_version = version
        for key, obj in self._cache.items():
            before = old.get(key)
            if before is None:
                await self._added(obj)
            elif _uid(before) != _uid(obj):
                await self._deleted(before)
                await self._added(obj)
            elif _version(before) != _version(obj):
                await self._updated(before, obj)
        for key, obj in old.items():
            if key not in self._cache:
                await self._deleted(obj)
        self._synced.set()

    # -- watch ----------------------------------------------------------------------------------------------
    async def _watch(self) -> _WatchEnd:
        timeout = int(self.settings.watch_timeout * (1.0 + self._rand())) or 1
        started = self._clock()
        delivered = 0
        self.stats.watches += 1
        try:
            async with self.client.watch(
                self.kind,
                self.namespace,
                resource_version=self.resource_version,
                label_selector=self.label_selector,
                field_selector=self.field_selector,
                timeout_seconds=timeout,
                allow_bookmarks=True,
            ) as watch:
                async for event in watch:
                    if not delivered:
                        self._backoff.reset()
                    delivered += 1
                    await self._apply(event)
        except KubeGoneError:
            return _WatchEnd.GONE
        except KubeApiStatusError as exc:
            log.warning("informer %s: watch refused: %s", self.kind, exc)
            return _WatchEnd.STATUS
        except KubeClientError as exc:
            log.info("informer %s: watch failed: %s", self.kind, exc)
            return _WatchEnd.TRANSPORT
        if not delivered and self._clock() - started < self.settings.quiet_watch:
            return _WatchEnd.QUIET
        return _WatchEnd.CLOSED

    async def _apply(self, event: WatchEvent) -> None:
        obj = event.object
        version = event.resource_version
        if event.type is WatchEventType.BOOKMARK:
            if version:
                self.resource_version = version
            return
        if self.transform is not None:
            obj = self.transform(obj)
        key = _key(obj)
        before = self._cache.get(key)
        if event.type is WatchEventType.DELETED:
            self._cache.pop(key, None)
        else:
            self._cache[key] = obj
        if version:
            self.resource_version = version
        if event.type is WatchEventType.DELETED:
            if before is not None:
                await self._deleted(obj)
        elif before is None:
            await self._added(obj)
        elif _uid(before) != _uid(obj):  # the delete happened while we were not watching
            await self._deleted(before)
            await self._added(obj)
        else:
            await self._updated(before, obj)

    # -- handlers -------------------------------------------------------------------------------------------
    async def _added(self, obj: Object) -> None:
        for handler in self._handlers.on_add:
            await self._call(handler, obj)

    async def _updated(self, old: Object, new: Object) -> None:
        for handler in self._handlers.on_update:
            await self._call(handler, old, new)

    async def _deleted(self, obj: Object) -> None:
        for handler in self._handlers.on_delete:
            await self._call(handler, obj)

    async def _call(self, handler: Callable[..., Awaitable[None] | None], *args: Object) -> None:
        try:
            result = handler(*args)
            if inspect.isawaitable(result):
                await result
        except asyncio.CancelledError:
            raise
        except Exception:
            self.stats.handler_errors += 1
            log.exception("informer %s: handler %r failed", self.kind, handler)


def _key(obj: Object) -> Key:
    meta = obj.get("metadata") or {}
    return (str(meta.get("namespace") or ""), str(meta.get("name") or ""))


def _uid(obj: Object) -> str:
    return str((obj.get("metadata") or {}).get("uid") or "")


def _version(obj: Object) -> str:
    return str((obj.get("metadata") or {}).get("resourceVersion") or "")
