"""The watch cursor without HTTP: a store, a hub and the cursor, with the event loop's clock."""

from __future__ import annotations

import asyncio
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from ambit.apiserver.selectors import parse_label_selector
from ambit.apiserver.store import Store, StoredObject
from ambit.apiserver.watch import ObjectFilter, WatchHub
from ambit.apiserver.watch_cursor import Bookmark, Events, WatchCursor, WatchSettings

PODS = ("", "pods")
SERVICES = ("", "services")


@pytest.fixture
def store(tmp_path: Path) -> Iterator[Store]:
    opened = Store(tmp_path / "store.db")
    yield opened
    opened.close()


def _pod(name: str, **labels: str) -> dict[str, Any]:
    return {"apiVersion": "v1", "kind": "Pod", "metadata": {"name": name, "namespace": "ns", "labels": labels}}


def _write(store: Store, hub: WatchHub, etype: str, obj: dict[str, Any], key: tuple[str, str] = PODS) -> None:
    hub.publish(store.put(etype, key, "ns", obj["metadata"]["name"], obj))


def _open(
    store: Store,
    hub: WatchHub,
    *,
    start_rv: int = 0,
    send_initial: bool = False,
    selection: ObjectFilter | None = None,
    timeout: float = 5.0,
    bookmarks: float | None = None,
) -> WatchCursor:
    selected = selection or ObjectFilter()

    def list_items() -> list[StoredObject]:
        return [i for i in store.items(PODS) if selected.matches(i)]

    return WatchCursor.open(
        hub,
        store,
        PODS,
        selected,
        start_rv=start_rv,
        send_initial=send_initial,
        list_items=list_items,
        settings=WatchSettings(timeout, bookmarks),
        clock=asyncio.get_running_loop().time,
    )


def _names(step: Events | Bookmark | None) -> list[tuple[str, str]]:
    assert isinstance(step, Events)
    return [(etype, item.obj["metadata"]["name"]) for etype, item in step.items]


async def test_a_watch_from_zero_starts_with_the_current_list_and_then_follows_writes(store: Store) -> None:
    hub = WatchHub()
    _write(store, hub, "ADDED", _pod("a"))
    cursor = _open(store, hub)
    assert [i.obj["metadata"]["name"] for i in cursor.initial] == ["a"]
    _write(store, hub, "ADDED", _pod("b"))
    _write(store, hub, "MODIFIED", _pod("a", app="web"))
    assert _names(await cursor.next()) == [("ADDED", "b"), ("MODIFIED", "a")]
    cursor.close()
    assert hub.count == 0


async def test_a_watch_from_a_version_replays_only_its_type_after_that_version(store: Store) -> None:
    hub = WatchHub()
    _write(store, hub, "ADDED", _pod("a"))
    start = store.resource_version
    _write(store, hub, "ADDED", _pod("b"))
    _write(store, hub, "ADDED", _pod("svc"), key=SERVICES)
    cursor = _open(store, hub, start_rv=start)
    assert not cursor.initial
    assert [(etype, item.obj["metadata"]["name"]) for etype, item in cursor.replay] == [("ADDED", "b")]
    cursor.close()


async def test_events_already_sent_are_not_sent_again(store: Store) -> None:
    hub = WatchHub()
    cursor = _open(store, hub)
    _write(store, hub, "ADDED", _pod("a"))
    event = store.put("MODIFIED", PODS, "ns", "a", _pod("a", v="1"))
    hub.publish(event)
    hub.publish(event)  # a duplicate delivery carries a version the cursor has passed
    assert _names(await cursor.next()) == [("ADDED", "a"), ("MODIFIED", "a")]
    assert cursor.last_rv == event.item.rv
    cursor.close()


async def test_a_label_change_out_of_the_selection_is_a_deletion(store: Store) -> None:
    hub = WatchHub()
    cursor = _open(store, hub, selection=ObjectFilter(labels=parse_label_selector("app=web")))
    _write(store, hub, "ADDED", _pod("a", app="web"))
    _write(store, hub, "ADDED", _pod("b", app="db"))
    _write(store, hub, "MODIFIED", _pod("a", app="db"))
    assert _names(await cursor.next()) == [("ADDED", "a"), ("DELETED", "a")]
    cursor.close()


async def test_the_watch_ends_at_its_deadline(store: Store) -> None:
    hub = WatchHub()
    cursor = _open(store, hub, timeout=0.05)
    assert await cursor.next() is None
    cursor.close()


async def test_a_quiet_watch_with_bookmarks_sends_the_current_version(store: Store) -> None:
    hub = WatchHub()
    cursor = _open(store, hub, bookmarks=0.02)
    store.put("ADDED", PODS, "ns", "unseen", _pod("unseen"))  # committed but not published to this watcher
    step = await cursor.next()
    assert step == Bookmark(store.resource_version)
    cursor.close()


async def test_a_closed_watcher_delivers_what_it_queued_and_then_ends(store: Store) -> None:
    hub = WatchHub()
    cursor = _open(store, hub)
    _write(store, hub, "ADDED", _pod("a"))
    hub.close_type(PODS)
    assert _names(await cursor.next()) == [("ADDED", "a")]
    assert await cursor.next() is None
    cursor.close()


async def test_cancelling_a_waiting_cursor_raises_cancelled_error_to_its_caller(store: Store) -> None:
    hub = WatchHub()
    cursor = _open(store, hub)
    waiting = asyncio.create_task(cursor.next())
    await asyncio.sleep(0.01)
    assert not waiting.done()
    waiting.cancel()
    with pytest.raises(asyncio.CancelledError):
        await waiting
    assert waiting.cancelled()
    cursor.close()
    assert hub.count == 0
