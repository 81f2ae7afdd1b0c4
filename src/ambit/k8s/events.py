"""Recording ``events.k8s.io/v1`` Events about objects, folding repeats into a series as client-go does.

Theory of operation: :meth:`EventRecorder.record` is synchronous and never raises for API trouble: it builds the
occurrence and puts it on a bounded queue (a full queue drops it and counts the drop). One writer task sends
occurrences in order. Occurrences are *isomorphic* when they agree on regarding object (by apiVersion, kind,
namespace, name and uid), related object, type, reason, action, note and reporting controller. The first one of a
kind is created as a new Event; an isomorphic one observed within ``series_window`` of the last is folded into
the existing Event by a merge patch of ``series`` (``count`` is the number of occurrences, 2 on the first repeat,
and ``lastObservedTime``), instead of creating another Event. If that Event has gone (deleted, expired by its
TTL), a fresh one is created.

The cache of Events it may fold into is an LRU of ``cache_size`` entries. A failed API call is logged and the
occurrence dropped: recording events must never stall or break the component that records them.

Events of cluster-scoped objects go to the ``default`` namespace, as client-go puts them. Names are
``<regarding name>.<event time in ns, hex>`` like client-go's, so a retried create cannot duplicate an Event.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import time
from collections import OrderedDict
from collections.abc import Callable, Mapping
from dataclasses import dataclass
from datetime import UTC, datetime
from types import TracebackType
from typing import Any, Literal

from ambit.k8s.client import KubeClient
from ambit.k8s.errors import KubeAlreadyExistsError, KubeClientError, KubeNotFoundError
from ambit.k8s.kinds import EVENTS

log = logging.getLogger("ambit.k8s.events")

EventType = Literal["Normal", "Warning"]
MAX_NOTE_BYTES = 1024
MAX_FIELD = 128  # reason, action and reportingInstance


@dataclass(frozen=True, slots=True)
class EventRecorderSettings:
    reporting_controller: str
    """Who reports, e.g. ``ambit.dev/controlplane`` (``reportingController``)."""
    reporting_instance: str
    """Which replica reports, e.g. the pod name (``reportingInstance``)."""
    series_window: float = 360.0
    """Seconds after the last occurrence within which an isomorphic one joins the series (client-go: 6 min)."""
    cache_size: int = 4096
    """Events remembered for folding."""
    queue_size: int = 1000
    """Occurrences waiting to be written; more are dropped."""
    close_timeout: float = 5.0
    """Seconds ``aclose()`` waits for queued occurrences to be written."""


@dataclass(slots=True)
class EventRecorderStats:
    created: int = 0
    patched: int = 0
    dropped: int = 0
    failed: int = 0


@dataclass(frozen=True, slots=True)
class _Occurrence:
    key: tuple[Any, ...]
    namespace: str
    body: dict[str, Any]
    time: float


@dataclass(slots=True)
class _Series:
    namespace: str
    name: str
    count: int
    last_observed: float


def micro_time(ts: float) -> str:
    """Kubernetes MicroTime: ``2006-01-02T15:04:05.000000Z``."""
    return datetime.fromtimestamp(ts, UTC).strftime("%Y-%m-%dT%H:%M:%S.%fZ")


def object_reference(obj: Mapping[str, Any]) -> dict[str, Any]:
    """An ObjectReference to ``obj`` (apiVersion, kind, namespace, name, uid, resourceVersion when known)."""
    meta = obj.get("metadata") or {}
    ref: dict[str, Any] = {"apiVersion": obj.get("apiVersion", ""), "kind": obj.get("kind", "")}
    for field in ("namespace", "name", "uid", "resourceVersion"):
        if meta.get(field):
            ref[field] = meta[field]
    return ref


def _identity(ref: Mapping[str, Any] | None) -> tuple[str, ...]:
    if ref is None:
        return ()
    return tuple(str(ref.get(k, "")) for k in ("apiVersion", "kind", "namespace", "name", "uid"))


def _truncate(text: str, limit: int) -> str:
    data = text.encode()
    return text if len(data) <= limit else data[:limit].decode("utf-8", "ignore")


class EventRecorder:
    """Writes Events for one reporting controller; ``async with`` it (or ``start()`` / ``aclose()``)."""

    def __init__(
        self, client: KubeClient, settings: EventRecorderSettings, *, clock: Callable[[], float] = time.time
    ) -> None:
        self.client = client
        self.settings = settings
        self.stats = EventRecorderStats()
        self._clock = clock
        self._queue: asyncio.Queue[_Occurrence] = asyncio.Queue(maxsize=settings.queue_size)
        self._series: OrderedDict[tuple[Any, ...], _Series] = OrderedDict()
        self._task: asyncio.Task[None] | None = None
        self._closed = False

    def record(
        self,
        regarding: Mapping[str, Any],
        type: EventType,
        reason: str,
        note: str,
        action: str,
        related: Mapping[str, Any] | None = None,
    ) -> None:
        """Queue an Event about ``regarding`` (the object itself); returns at once.

        A ``type`` other than Normal or Warning is a programming error (``ValueError``); everything that goes wrong
        later is logged and dropped.
        """
        if type not in ("Normal", "Warning"):
            raise ValueError(f"event type must be Normal or Warning, not {type!r}")
        if self._closed:
            self.stats.dropped += 1
            return
        now = self._clock()
        s = self.settings
        ref = object_reference(regarding)
        related_ref = object_reference(related) if related is not None else None
        reason, action, note = (
            _truncate(reason, MAX_FIELD),
            _truncate(action, MAX_FIELD),
            _truncate(note, MAX_NOTE_BYTES),
        )
        namespace = str(ref.get("namespace") or "default")
        name = f"{str(ref.get('name') or 'unnamed')[:230]}.{int(now * 1e9):x}"
        body: dict[str, Any] = {
            "apiVersion": EVENTS.api_version,
            "kind": EVENTS.kind,
            "metadata": {"name": name, "namespace": namespace},
            "eventTime": micro_time(now),
            "reportingController": s.reporting_controller,
            "reportingInstance": _truncate(s.reporting_instance, MAX_FIELD),
            "action": action,
            "reason": reason,
            "note": note,
            "type": type,
            "regarding": ref,
        }
        if related_ref is not None:
            body["related"] = related_ref
        key = (_identity(ref), _identity(related_ref), type, reason, action, note, s.reporting_controller)
        try:
            self._queue.put_nowait(_Occurrence(key, namespace, body, now))
        except asyncio.QueueFull:
            self.stats.dropped += 1
            log.warning("event queue full; dropped %s %s about %s/%s", type, reason, namespace, ref.get("name"))

    # -- lifecycle ------------------------------------------------------------------------------------------
    def start(self) -> asyncio.Task[None]:
        if self._task is None:
            name = f"event recorder {self.settings.reporting_controller}"
            self._task = asyncio.get_running_loop().create_task(self.run(), name=name)
        return self._task

    async def flush(self) -> None:
        """Wait until every queued occurrence has been written (or dropped)."""
        await self._queue.join()

    async def aclose(self) -> None:
        self._closed = True
        task, self._task = self._task, None
        if task is None:
            return
        with contextlib.suppress(TimeoutError):
            await asyncio.wait_for(self._queue.join(), self.settings.close_timeout)
        task.cancel()
        with contextlib.suppress(asyncio.CancelledError):
            await task

    async def __aenter__(self) -> EventRecorder:
        self.start()
        return self

    async def __aexit__(
        self, exc_type: type[BaseException] | None, exc: BaseException | None, tb: TracebackType | None
    ) -> None:
        await self.aclose()

    async def run(self) -> None:
        while True:
            occurrence = await self._queue.get()
            try:
                await self._write(occurrence)
            except Exception:  # our bug; the recorder must outlive it
                self.stats.failed += 1
                log.exception("recording an event failed")
            finally:
                self._queue.task_done()

    # -- writing --------------------------------------------------------------------------------------------
    async def _write(self, occ: _Occurrence) -> None:
        series = self._series.get(occ.key)
        if series is not None and occ.time - series.last_observed <= self.settings.series_window:
            series.count += 1
            series.last_observed = occ.time
            self._series.move_to_end(occ.key)
            patch = {"series": {"count": series.count, "lastObservedTime": micro_time(occ.time)}}
            try:
                await self.client.patch(EVENTS, series.name, patch, namespace=series.namespace)
            except KubeNotFoundError:
                del self._series[occ.key]  # it expired: start a new Event below
            except KubeClientError as exc:
                self.stats.failed += 1
                log.warning("cannot update event %s/%s: %s", series.namespace, series.name, exc)
                return
            else:
                self.stats.patched += 1
                return
        body = occ.body
        try:
            created = await self._create(body)
        except KubeClientError as exc:
            self.stats.failed += 1
            log.warning("cannot create event %s %s about %s: %s", body["type"], body["reason"], body["regarding"], exc)
            return
        self.stats.created += 1
        self._series[occ.key] = _Series(occ.namespace, str(created["metadata"]["name"]), 1, occ.time)
        self._series.move_to_end(occ.key)
        while len(self._series) > self.settings.cache_size:
            self._series.popitem(last=False)

    async def _create(self, body: dict[str, Any]) -> dict[str, Any]:
        try:
            return await self.client.create(EVENTS, body)
        except KubeAlreadyExistsError:
            # Another Event got the same name (same object, same nanosecond): let the server pick one.
            meta = dict(body["metadata"])
            meta["generateName"] = meta.pop("name") + "."
            return await self.client.create(EVENTS, {**body, "metadata": meta})
