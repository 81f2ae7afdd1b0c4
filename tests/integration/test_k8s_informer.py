"""Informer against the real embedded API server: sync, handlers, 410 relist, reconnect after a restart."""

from __future__ import annotations

import asyncio
import dataclasses
from collections.abc import AsyncIterator, Callable
from pathlib import Path
from typing import Any

import pytest

from ambit.apiserver.server import ApiServer, ApiServerSettings
from ambit.k8s import Informer, InformerSettings, KubeClient, kinds
from ambit.k8s.informer import Backoff

NS = "default"
FAST = InformerSettings(backoff_initial=0.02, backoff_max=0.1, watch_timeout=30)


@pytest.fixture
async def server(tmp_path: Path) -> AsyncIterator[ApiServer]:
    async with ApiServer(ApiServerSettings(data_dir=tmp_path / "api", port=0, crd_dir=None)) as started:
        yield started


@pytest.fixture
async def kube(server: ApiServer) -> AsyncIterator[KubeClient]:
    async with KubeClient.from_kubeconfig(server.kubeconfig) as client:
        yield client


class Recorder:
    """Handlers that log what they saw as (verb, name, detail)."""

    def __init__(self) -> None:
        self.seen: list[tuple[str, str, str]] = []
        self.changed = asyncio.Event()

    def _log(self, verb: str, obj: dict[str, Any]) -> None:
        self.seen.append((verb, obj["metadata"]["name"], (obj.get("data") or {}).get("k", "")))
        self.changed.set()

    def on_add(self, obj: dict[str, Any]) -> None:
        self._log("add", obj)

    async def on_update(self, old: dict[str, Any], new: dict[str, Any]) -> None:
        self._log("update", new)

    def on_delete(self, obj: dict[str, Any]) -> None:
        self._log("delete", obj)

    def handlers(self) -> dict[str, Any]:
        return {"on_add": self.on_add, "on_update": self.on_update, "on_delete": self.on_delete}

    async def wait_for(self, predicate: Callable[[], bool]) -> None:
        async with asyncio.timeout(5):
            while not predicate():
                self.changed.clear()
                await self.changed.wait()


def configmap(name: str, value: str = "1", **labels: str) -> dict[str, Any]:
    return {"metadata": {"name": name, "namespace": NS, "labels": labels}, "data": {"k": value}}


async def test_informer_syncs_then_reports_adds_updates_and_deletes(kube: KubeClient) -> None:
    await kube.create(kinds.CONFIG_MAPS, configmap("before"))
    rec = Recorder()
    async with Informer(kube, kinds.CONFIG_MAPS, namespace=NS, settings=FAST, **rec.handlers()) as informer:
        async with asyncio.timeout(5):
            await informer.wait_synced()
        assert informer.synced
        assert ("add", "before", "1") in rec.seen
        assert informer.find("before", NS) is not None
        assert informer.find("kube-root-ca.crt", NS) is not None
        assert informer.find("before") is None  # the key is (namespace, name)

        await kube.create(kinds.CONFIG_MAPS, configmap("new"))
        await kube.patch(kinds.CONFIG_MAPS, "new", {"data": {"k": "2"}}, NS)
        await kube.delete(kinds.CONFIG_MAPS, "before", NS)
        await rec.wait_for(lambda: ("delete", "before", "1") in rec.seen)

        assert rec.seen[-3:] == [("add", "new", "1"), ("update", "new", "2"), ("delete", "before", "1")]
        assert informer.find("before", NS) is None
        found = informer.find("new", NS)
        assert found is not None and found["data"] == {"k": "2"}
        assert {o["metadata"]["name"] for o in informer.items()} == {"new", "kube-root-ca.crt"}
        assert informer.stats.lists == 1


async def test_informer_with_a_label_selector_sees_objects_leave_as_deletes(kube: KubeClient) -> None:
    rec = Recorder()
    informer = Informer(kube, kinds.CONFIG_MAPS, label_selector={"mesh": "yes"}, settings=FAST, **rec.handlers())
    async with informer:
        await informer.wait_synced()
        assert rec.seen == []
        await kube.create(kinds.CONFIG_MAPS, configmap("in", mesh="yes"))
        await kube.create(kinds.CONFIG_MAPS, configmap("out", mesh="no"))
        await kube.patch(kinds.CONFIG_MAPS, "in", {"metadata": {"labels": {"mesh": "no"}}}, NS)
        await rec.wait_for(lambda: len(rec.seen) >= 2)
    assert rec.seen == [("add", "in", "1"), ("delete", "in", "1")]
    assert len(informer) == 0


async def test_a_failing_handler_does_not_stop_the_informer(kube: KubeClient) -> None:
    rec = Recorder()

    def broken(obj: dict[str, Any]) -> None:
        raise RuntimeError("handler bug")

    informer = Informer(kube, kinds.SECRETS, namespace=NS, settings=FAST, on_add=broken)
    informer.add_handler(on_add=rec.on_add)
    async with informer:
        await informer.wait_synced()
        await kube.create(kinds.SECRETS, {"metadata": {"name": "s1"}, "data": {}})
        await rec.wait_for(lambda: any(name == "s1" for _, name, _ in rec.seen))
        with pytest.raises(RuntimeError, match="before the informer starts"):
            informer.add_handler(on_add=rec.on_add)
    assert informer.stats.handler_errors == 1


async def test_informer_relists_after_410_and_reports_what_changed_meanwhile(
    server: ApiServer, kube: KubeClient
) -> None:
    """The informer is held inside a handler while its watch is closed, the objects change and the server forgets
    the history: when it resumes, its re-watch gets 410, and the relist must yield exactly the changes missed."""
    for name in ("keep", "change", "drop", "recreate", "gate"):
        await kube.create(kinds.CONFIG_MAPS, configmap(name))
    rec = Recorder()
    entered, release = asyncio.Event(), asyncio.Event()

    async def on_update(old: dict[str, Any], new: dict[str, Any]) -> None:
        await rec.on_update(old, new)
        if new["metadata"]["name"] == "gate":
            entered.set()
            await release.wait()

    handlers = {**rec.handlers(), "on_update": on_update}
    async with Informer(kube, kinds.CONFIG_MAPS, namespace=NS, settings=FAST, **handlers) as informer:
        await informer.wait_synced()
        await kube.patch(kinds.CONFIG_MAPS, "gate", {"data": {"k": "2"}}, NS)
        async with asyncio.timeout(5):
            await entered.wait()
        old_uid = informer.find("recreate", NS)["metadata"]["uid"]  # type: ignore[index]

        assert server.manager is not None
        server.manager.hub.close_all()  # ends the informer's watch; it is busy and will notice later
        await kube.patch(kinds.CONFIG_MAPS, "change", {"data": {"k": "2"}}, NS)
        await kube.delete(kinds.CONFIG_MAPS, "drop", NS)
        await kube.delete(kinds.CONFIG_MAPS, "recreate", NS)
        await kube.create(kinds.CONFIG_MAPS, configmap("recreate", "3"))
        await kube.create(kinds.CONFIG_MAPS, configmap("added"))
        for i in range(20):
            await kube.patch(kinds.CONFIG_MAPS, "keep", {"metadata": {"labels": {"i": str(i)}}}, NS)
        server.manager.store.compact(0)
        rec.seen.clear()
        release.set()

        await rec.wait_for(lambda: informer.stats.lists == 2 and ("add", "added", "1") in rec.seen)
        assert informer.stats.gone == 1
        assert sorted(rec.seen) == sorted(
            [
                ("update", "change", "2"),
                ("delete", "drop", "1"),
                ("delete", "recreate", "1"),  # a new uid under the same name: delete, then add
                ("add", "recreate", "3"),
                ("add", "added", "1"),
                ("update", "keep", "1"),
            ]
        )
        recreated = informer.find("recreate", NS)
        assert recreated is not None and recreated["metadata"]["uid"] != old_uid
        # and it watches again from the relisted version
        await kube.patch(kinds.CONFIG_MAPS, "added", {"data": {"k": "after"}}, NS)
        await rec.wait_for(lambda: ("update", "added", "after") in rec.seen)


async def test_informer_resumes_from_its_version_after_the_server_restarts(server: ApiServer) -> None:
    port = int(server.url.rsplit(":", 1)[1])
    settings = dataclasses.replace(server.settings, port=port)
    kube = KubeClient.from_kubeconfig(server.kubeconfig)
    rec = Recorder()
    sleeps: list[float] = []
    retrying = asyncio.Event()

    async def sleep(delay: float) -> None:
        sleeps.append(delay)
        if len(sleeps) >= 2:
            retrying.set()
        await asyncio.sleep(0.02)

    informer = Informer(kube, kinds.CONFIG_MAPS, namespace=NS, settings=FAST, sleep=sleep, **rec.handlers())
    try:
        async with informer:
            await informer.wait_synced()
            await kube.create(kinds.CONFIG_MAPS, configmap("one"))
            await rec.wait_for(lambda: ("add", "one", "1") in rec.seen)

            await server.aclose()
            async with asyncio.timeout(5):
                await retrying.wait()  # it is retrying against a closed port

            async with ApiServer(settings) as restarted:
                await kube.create(kinds.CONFIG_MAPS, configmap("two"))
                await rec.wait_for(lambda: ("add", "two", "1") in rec.seen)
                await kube.patch(kinds.CONFIG_MAPS, "one", {"data": {"k": "2"}}, NS)
                await rec.wait_for(lambda: ("update", "one", "2") in rec.seen)
                assert restarted.url == server.url
            assert informer.stats.lists == 1  # resumed the watch: no relist was needed
            assert informer.stats.failures >= 2
            assert rec.seen.count(("add", "one", "1")) == 1
    finally:
        await kube.aclose()


async def test_informer_retries_a_failing_list_with_backoff(kube: KubeClient) -> None:
    """A kind the server does not serve (a CRD not installed yet) makes the list fail: retry, never give up."""
    sleeps: list[float] = []
    proceed = asyncio.Event()

    async def sleep(delay: float) -> None:
        sleeps.append(delay)
        if len(sleeps) >= 4:
            proceed.set()
        await asyncio.sleep(0)

    widgets = kinds.ResourceKind("example.com", "v1", "widgets", "Widget")
    informer = Informer(kube, widgets, settings=FAST, sleep=sleep, rand=lambda: 0.0)
    async with informer:
        async with asyncio.timeout(5):
            await proceed.wait()
        assert not informer.synced
    assert sleeps[:4] == pytest.approx([0.02, 0.04, 0.08, 0.1])


async def test_waiting_for_sync_fails_when_the_informer_stops_first(kube: KubeClient) -> None:
    widgets = kinds.ResourceKind("example.com", "v1", "widgets", "Widget")
    informer = Informer(kube, widgets, settings=FAST)
    informer.start()
    waiting = asyncio.ensure_future(informer.wait_synced())
    await asyncio.sleep(0.05)
    await informer.aclose()
    with pytest.raises(RuntimeError, match="stopped before it synced"):
        await waiting
    with pytest.raises(ValueError, match="cluster-scoped"):
        Informer(kube, kinds.NAMESPACES, namespace="default")


def test_backoff_grows_exponentially_with_jitter_up_to_a_cap() -> None:
    settings = InformerSettings(backoff_initial=1.0, backoff_max=8.0, backoff_factor=2.0, backoff_jitter=0.5)
    backoff = Backoff(settings, rand=lambda: 1.0)
    assert [backoff.next_delay() for _ in range(6)] == [1.5, 3.0, 6.0, 12.0, 12.0, 12.0]
    backoff.reset()
    assert backoff.next_delay() == 1.5


async def test_a_transform_applies_to_listed_and_watched_objects_before_handlers_and_cache(kube: KubeClient) -> None:
    await kube.create(kinds.CONFIG_MAPS, {**configmap("listed"), "binaryData": {}})
    seen: list[dict[str, Any]] = []
    five = asyncio.Event()

    def saw(obj: dict[str, Any]) -> None:
        seen.append(obj)
        if len(seen) >= 5:  # listed, kube-root-ca.crt, then add, update, delete
            five.set()

    def slim(obj: dict[str, Any]) -> dict[str, Any]:
        return {k: v for k, v in obj.items() if k != "data"} | {"slim": True}

    informer = Informer(
        kube, kinds.CONFIG_MAPS, namespace=NS, settings=dataclasses.replace(FAST, page_size=1), transform=slim,
        on_add=saw, on_update=lambda old, new: saw(new), on_delete=saw,
    )  # fmt: skip
    async with informer:
        async with asyncio.timeout(5):
            await informer.wait_synced()
            await kube.create(kinds.CONFIG_MAPS, configmap("watched"))
            await kube.patch(kinds.CONFIG_MAPS, "watched", {"data": {"k": "2"}}, NS)
            await kube.delete(kinds.CONFIG_MAPS, "watched", NS)
            await five.wait()
        assert all(obj["slim"] and "data" not in obj for obj in seen)
        listed = informer.find("listed", NS)
        assert listed is not None and listed["slim"] and listed["kind"] == "ConfigMap"
