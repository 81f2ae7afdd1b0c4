"""Watches over HTTP: replay from a version, initial events, selector boundaries, bookmarks, 410, timeouts.

Every test reads the chunked stream line by line as client-go does. Where a test must show that an event did
*not* arrive, it writes a sentinel object afterwards and checks that the sentinel's event is the next one: the
server sends events in version order, so nothing can be still on its way.
"""

from __future__ import annotations

import time
from collections.abc import AsyncIterator
from pathlib import Path

import pytest
from apiserver_client import CRDS, WIDGETS, ApiClient, JsonObject, configmap, pod, widget, widget_crd

from ambit.apiserver.server import ApiServer, ApiServerSettings

CMS = "/api/v1/namespaces/default/configmaps"
PODS = "/api/v1/namespaces/default/pods"


@pytest.fixture
async def api(apiserver: ApiServer) -> AsyncIterator[ApiClient]:
    async with ApiClient.for_server(apiserver) as client:
        yield client


def summary(events: list[JsonObject]) -> list[tuple[str, str]]:
    return [(e["type"], e["object"]["metadata"].get("name", "")) for e in events]


async def test_watch_from_a_resource_version_replays_what_came_after_it(api: ApiClient) -> None:
    a = await api.create(CMS, configmap("a"))
    start = a["metadata"]["resourceVersion"]
    await api.create(CMS, configmap("b"))
    await api.patch(f"{CMS}/a", {"data": {"key": "2"}})
    await api.delete(f"{CMS}/b")
    await api.create(PODS, pod("other-kind"))
    async with api.watch(CMS, resourceVersion=start) as watch:
        replayed = await watch.take(3)
        assert summary(replayed) == [("ADDED", "b"), ("MODIFIED", "a"), ("DELETED", "b")]
        assert replayed[1]["object"]["data"] == {"key": "2"}
        versions = [int(e["object"]["metadata"]["resourceVersion"]) for e in replayed]
        assert versions == sorted(versions) and versions[0] > int(start)
        await api.create(CMS, configmap("c"))
        live = await watch.next()
        assert live is not None and summary([live]) == [("ADDED", "c")]
        assert int(live["object"]["metadata"]["resourceVersion"]) > versions[-1]


async def test_watch_from_the_current_version_sends_only_new_events(api: ApiClient) -> None:
    await api.create(CMS, configmap("old"))
    listed = await api.get(CMS)
    async with api.watch(CMS, resourceVersion=str(listed.rv)) as watch:
        await api.create(CMS, configmap("new"))
        assert summary(await watch.take(1)) == [("ADDED", "new")]


async def test_watch_without_a_resource_version_starts_with_the_current_objects(api: ApiClient) -> None:
    await api.create(CMS, configmap("a", labels={"w": "1"}))
    await api.create(CMS, configmap("b", labels={"w": "1"}))
    await api.create(CMS, configmap("unlabelled"))
    async with api.watch(CMS, labelSelector="w") as watch:
        assert summary(await watch.take(2)) == [("ADDED", "a"), ("ADDED", "b")]
        await api.patch(f"{CMS}/a", {"data": {"k": "v"}})
        assert summary(await watch.take(1)) == [("MODIFIED", "a")]


async def test_watch_across_namespaces_and_of_one_object(api: ApiClient) -> None:
    await api.create("/api/v1/namespaces", {"metadata": {"name": "other"}})
    async with (
        api.watch("/api/v1/configmaps", resourceVersion=str((await api.get(CMS)).rv)) as everywhere,
        api.watch(CMS, fieldSelector="metadata.name=one", resourceVersion="0") as one,
    ):
        await api.create("/api/v1/namespaces/other/configmaps", configmap("x", namespace="other"))
        await api.create(CMS, configmap("two"))
        await api.create(CMS, configmap("one"))
        got = await everywhere.take(3)
        assert [(e["object"]["metadata"]["namespace"], e["object"]["metadata"]["name"]) for e in got] == [
            ("other", "x"),
            ("default", "two"),
            ("default", "one"),
        ]
        assert summary(await one.take(1)) == [("ADDED", "one")]


async def test_legacy_watch_path(api: ApiClient) -> None:
    rv = str((await api.get(CMS)).rv)
    async with api.watch("/api/v1/watch/namespaces/default/configmaps/solo", resourceVersion=rv) as watch:
        await api.create(CMS, configmap("not-solo"))
        await api.create(CMS, configmap("solo"))
        assert summary(await watch.take(1)) == [("ADDED", "solo")]


async def test_selector_boundary_crossings_are_added_and_deleted(api: ApiClient) -> None:
    await api.create(CMS, configmap("mover", labels={"app": "x"}))
    async with api.watch(CMS, labelSelector="app=x") as watch:
        assert summary(await watch.take(1)) == [("ADDED", "mover")]
        await api.patch(f"{CMS}/mover", {"metadata": {"labels": {"app": "y"}}})
        left = await watch.next()
        assert left is not None and summary([left]) == [("DELETED", "mover")]
        assert left["object"]["metadata"]["labels"] == {"app": "y"}
        await api.patch(f"{CMS}/mover", {"data": {"k": "outside"}})  # not in the selection: no event
        await api.patch(f"{CMS}/mover", {"metadata": {"labels": {"app": "x"}}})
        assert summary(await watch.take(1)) == [("ADDED", "mover")]
        await api.patch(f"{CMS}/mover", {"data": {"k": "inside"}})
        assert summary(await watch.take(1)) == [("MODIFIED", "mover")]
        await api.delete(f"{CMS}/mover")
        assert summary(await watch.take(1)) == [("DELETED", "mover")]


async def test_selector_boundary_crossings_in_a_replay(api: ApiClient) -> None:
    start = (await api.create(CMS, configmap("mover", labels={"app": "x"})))["metadata"]["resourceVersion"]
    await api.patch(f"{CMS}/mover", {"metadata": {"labels": {"app": "y"}}})
    await api.patch(f"{CMS}/mover", {"data": {"k": "outside"}})
    await api.patch(f"{CMS}/mover", {"metadata": {"labels": {"app": "x"}}})
    async with api.watch(CMS, labelSelector="app=x", resourceVersion=start) as watch:
        assert summary(await watch.take(2)) == [("DELETED", "mover"), ("ADDED", "mover")]


async def test_field_selector_boundary_for_pods_on_a_node(api: ApiClient) -> None:
    rv = str((await api.get(PODS)).rv)
    async with api.watch("/api/v1/pods", fieldSelector="spec.nodeName=node-1", resourceVersion=rv) as watch:
        await api.create(PODS, pod("elsewhere", node="node-2"))
        await api.create(PODS, pod("here", node="node-1"))
        assert summary(await watch.take(1)) == [("ADDED", "here")]
        await api.delete(f"{PODS}/here")
        event = await watch.next()
        assert event is not None and event["type"] == "MODIFIED"
        assert event["object"]["metadata"]["deletionTimestamp"]
        await api.delete(f"{PODS}/here", gracePeriodSeconds="0")
        assert summary(await watch.take(1)) == [("DELETED", "here")]


async def test_send_initial_events_ends_with_an_annotated_bookmark(api: ApiClient) -> None:
    await api.create(CMS, configmap("a"))
    await api.create(CMS, configmap("b"))
    rv = (await api.get(CMS)).rv
    async with api.watch(
        CMS, sendInitialEvents="true", resourceVersionMatch="NotOlderThan", allowWatchBookmarks="true"
    ) as watch:
        initial = await watch.take(4)
        assert summary(initial[:3]) == [("ADDED", "a"), ("ADDED", "b"), ("ADDED", "kube-root-ca.crt")]
        bookmark = initial[3]
        assert bookmark["type"] == "BOOKMARK"
        assert bookmark["object"]["kind"] == "ConfigMap" and bookmark["object"]["apiVersion"] == "v1"
        assert bookmark["object"]["metadata"]["annotations"] == {"k8s.io/initial-events-end": "true"}
        assert int(bookmark["object"]["metadata"]["resourceVersion"]) >= rv
        await api.create(CMS, configmap("c"))
        assert summary(await watch.take(1)) == [("ADDED", "c")]


async def test_too_old_resource_version_is_an_error_event_with_410(apiserver: ApiServer, api: ApiClient) -> None:
    assert apiserver.manager is not None
    old = (await api.create(CMS, configmap("a")))["metadata"]["resourceVersion"]
    await api.create(CMS, configmap("b"))
    apiserver.manager.store.compact(0)
    async with api.watch(CMS, resourceVersion=old) as watch:
        events = await watch.rest()
    assert len(events) == 1 and events[0]["type"] == "ERROR", events
    status = events[0]["object"]
    assert status["kind"] == "Status" and status["code"] == 410 and status["reason"] == "Expired"
    assert "too old resource version" in status["message"]
    # The client's recovery: relist, then watch from the list's version.
    listed = await api.get(CMS)
    async with api.watch(CMS, resourceVersion=str(listed.rv)) as watch:
        await api.create(CMS, configmap("c"))
        assert summary(await watch.take(1)) == [("ADDED", "c")]


async def test_timeout_seconds_ends_the_stream(api: ApiClient) -> None:
    started = time.monotonic()
    async with api.watch(CMS, resourceVersion=str((await api.get(CMS)).rv), timeoutSeconds="1") as watch:
        events = await watch.rest(within=5)
    elapsed = time.monotonic() - started
    assert events == []
    assert 0.9 <= elapsed < 4, elapsed


async def test_deleting_a_crd_ends_watches_on_its_kind(api: ApiClient) -> None:
    await api.create(CRDS, widget_crd())
    await api.create(WIDGETS, widget("w"))
    async with api.watch(WIDGETS) as watch:
        assert summary(await watch.take(1)) == [("ADDED", "w")]
        await api.delete(f"{CRDS}/widgets.example.com")
        rest = await watch.rest()
    assert summary(rest) == [("DELETED", "w")]


# -- bookmarks need a server with a short bookmark interval -----------------------------------------------------


@pytest.fixture
async def quick_bookmarks(tmp_path: Path) -> AsyncIterator[ApiClient]:
    settings = ApiServerSettings(data_dir=tmp_path / "bookmarks", port=0, crd_dir=None, bookmark_interval=0.2)
    async with ApiServer(settings) as server, ApiClient.for_server(server) as client:
        yield client


async def test_bookmarks_carry_the_current_resource_version(quick_bookmarks: ApiClient) -> None:
    api = quick_bookmarks
    rv = str((await api.get(CMS)).rv)
    async with api.watch(CMS, resourceVersion=rv, allowWatchBookmarks="true") as watch:
        first = await watch.next(within=3)
        assert first is not None and first["type"] == "BOOKMARK"
        assert first["object"]["kind"] == "ConfigMap"
        assert first["object"]["metadata"]["resourceVersion"] == rv
        assert "annotations" not in first["object"]["metadata"]
        added = await api.create(CMS, configmap("a"))
        # Bookmarks keep coming every 0.2 s, so one may arrive before the event: skip over them.
        event = await watch.next(within=3)
        while event is not None and event["type"] == "BOOKMARK":
            event = await watch.next(within=3)
        assert event is not None and summary([event]) == [("ADDED", "a")]
        elsewhere = await api.create(PODS, pod("elsewhere"))  # another kind moves the global version
        assert int(elsewhere["metadata"]["resourceVersion"]) > int(added["metadata"]["resourceVersion"])
        versions: list[int] = []
        while len(versions) < 20 and (not versions or versions[-1] < int(elsewhere["metadata"]["resourceVersion"])):
            bookmark = await watch.next(within=3)
            assert bookmark is not None and bookmark["type"] == "BOOKMARK", bookmark
            versions.append(int(bookmark["object"]["metadata"]["resourceVersion"]))
        assert versions[-1] == int(elsewhere["metadata"]["resourceVersion"]), versions
        assert versions == sorted(versions)


async def test_no_bookmarks_unless_asked(quick_bookmarks: ApiClient) -> None:
    api = quick_bookmarks
    rv = str((await api.get(CMS)).rv)
    async with api.watch(CMS, resourceVersion=rv, timeoutSeconds="1") as watch:
        assert await watch.rest(within=3) == []
