"""Crash durability: ``ambit apiserver`` as a subprocess, killed with SIGKILL, restarted on the same data directory.

What must hold (the store's invariants, seen from a client): every write the server acknowledged is there after
the crash, with the resourceVersion it was acknowledged with; versions keep increasing after the restart; a
watch resumed from a version before the crash gets exactly the events after it, or 410 when the log no longer
reaches back that far; the PKI and the signing key survive, so old kubeconfigs and tokens keep working.
"""

from __future__ import annotations

import asyncio
import sqlite3
from collections.abc import AsyncIterator
from pathlib import Path

import aiohttp
import pytest
from apiserver_client import ApiClient, JsonObject, assert_status, configmap, ssl_context_from_kubeconfig
from tests.harness import ServerProcess, free_port

CMS = "/api/v1/namespaces/default/configmaps"
REVIEWS = "/apis/authentication.k8s.io/v1/tokenreviews"


class Crashable:
    """One data directory, served by successive ``ambit apiserver`` processes."""

    def __init__(self, data_dir: Path) -> None:
        self.process = ServerProcess(data_dir, free_port())

    async def start(self) -> ApiClient:
        await asyncio.to_thread(self.process.start)
        token = (self.process.data_dir / "admin.token").read_text().strip()
        context = ssl_context_from_kubeconfig(self.process.kubeconfig)
        return ApiClient(f"https://127.0.0.1:{self.process.port}", context, token)

    async def kill(self) -> None:
        code = await asyncio.to_thread(self.process.stop, kill=True)
        assert code == -9

    async def stop(self) -> None:
        if self.process.proc is not None:
            await asyncio.to_thread(self.process.stop)


@pytest.fixture
async def crashable(tmp_path: Path) -> AsyncIterator[Crashable]:
    server = Crashable(tmp_path / "state")
    try:
        yield server
    finally:
        await server.stop()


async def test_acknowledged_writes_survive_kill_9(crashable: Crashable) -> None:
    async with await crashable.start() as api:
        await api.create("/api/v1/namespaces", {"metadata": {"name": "team"}})
        acked: dict[str, str] = {}
        for i in range(20):
            created = await api.create(CMS, configmap(f"seq-{i:02d}", labels={"i": str(i)}))
            acked[created["metadata"]["name"]] = created["metadata"]["resourceVersion"]
        updated = (await api.patch(f"{CMS}/seq-00", {"data": {"key": "updated"}})).body
        acked["seq-00"] = updated["metadata"]["resourceVersion"]
        await api.delete(f"{CMS}/seq-01")
        del acked["seq-01"]

        # Then a burst of concurrent writes, with the kill landing while some are still in flight.
        enough = asyncio.Event()
        done: list[str] = []

        async def write(i: int) -> JsonObject:
            reply = await api.post(CMS, configmap(f"burst-{i:03d}"))
            assert reply.status == 201, reply.body
            done.append(reply.body["metadata"]["name"])
            if len(done) >= 40:
                enough.set()
            created: JsonObject = reply.body
            return created

        tasks = [asyncio.create_task(write(i)) for i in range(150)]
        await enough.wait()
        await crashable.kill()
        outcomes = await asyncio.gather(*tasks, return_exceptions=True)
        last_acked = max(int(v) for v in acked.values())
        for outcome in outcomes:
            if isinstance(outcome, dict):
                acked[outcome["metadata"]["name"]] = outcome["metadata"]["resourceVersion"]
                last_acked = max(last_acked, int(outcome["metadata"]["resourceVersion"]))
            else:
                assert isinstance(outcome, aiohttp.ClientError), repr(outcome)  # cut off, never answered
        assert sum(isinstance(o, dict) for o in outcomes) >= 40

    # The old kubeconfig's CA and token still work: the PKI is in the data directory.
    async with await crashable.start() as api:
        listed = await api.get(CMS)
        stored = {i["metadata"]["name"]: i["metadata"]["resourceVersion"] for i in listed.body["items"]}
        missing = {name for name in acked if name not in stored}
        assert not missing, f"acknowledged writes lost in the crash: {sorted(missing)}"
        assert all(stored[name] == rv for name, rv in acked.items())
        assert "seq-01" not in stored
        assert (await api.must_get(f"{CMS}/seq-00"))["data"] == {"key": "updated"}
        assert await api.exists("/api/v1/namespaces/team")
        assert listed.rv >= last_acked
        after = await api.create(CMS, configmap("after-crash"))
        assert int(after["metadata"]["resourceVersion"]) > listed.rv
        assert int(after["metadata"]["resourceVersion"]) > max(int(v) for v in stored.values())

    # A graceful stop (SIGTERM) exits 0 and keeps everything too.
    assert await asyncio.to_thread(crashable.process.stop) == 0
    async with await crashable.start() as api:
        assert (await api.must_get(f"{CMS}/after-crash"))["metadata"]["uid"] == after["metadata"]["uid"]
        assert_status(await api.post(CMS, configmap("after-crash")), 409, "AlreadyExists")


async def test_watch_resumes_across_a_crash_or_is_told_410(crashable: Crashable) -> None:
    async with await crashable.start() as api:
        first = await api.create(CMS, configmap("a", labels={"app": "x"}))
        resume_from = first["metadata"]["resourceVersion"]
        await api.create(CMS, configmap("b"))
        await api.patch(f"{CMS}/a", {"data": {"key": "2"}})
        await api.delete(f"{CMS}/b")
        await api.patch(f"{CMS}/a", {"metadata": {"labels": {"app": "y"}}})  # leaves a selection
        await api.create("/api/v1/namespaces", {"metadata": {"name": "other-kind-event"}})
        token = (await api.post("/api/v1/namespaces/default/serviceaccounts/default/token", {"spec": {}})).body
        await crashable.kill()

    async with await crashable.start() as api:
        async with api.watch(CMS, resourceVersion=resume_from) as watch:
            replayed = await watch.take(4)
            assert [(e["type"], e["object"]["metadata"]["name"]) for e in replayed] == [
                ("ADDED", "b"),
                ("MODIFIED", "a"),
                ("DELETED", "b"),
                ("MODIFIED", "a"),
            ]
            after = await api.create(CMS, configmap("c"))
            live = await watch.next()
            assert live is not None and live["type"] == "ADDED"
            assert live["object"]["metadata"]["resourceVersion"] == after["metadata"]["resourceVersion"]
        # A selector watch sees the label change as the object leaving its selection, also after the restart.
        async with api.watch(CMS, resourceVersion=resume_from, labelSelector="app=x") as watch:
            assert [(e["type"], e["object"]["metadata"]["name"]) for e in await watch.take(2)] == [
                ("MODIFIED", "a"),
                ("DELETED", "a"),
            ]
        # The signing key survived too: a token issued before the crash still authenticates.
        review = await api.post(REVIEWS, {"spec": {"token": token["status"]["token"]}})
        assert review.body["status"]["authenticated"] is True
        horizon = int(after["metadata"]["resourceVersion"]) - 1
        await crashable.kill()

    # The log is trimmed on disk (as the server does every thousand writes): old versions are gone for good.
    with sqlite3.connect(crashable.process.data_dir / "state.db") as db:
        db.execute("DELETE FROM log WHERE rv <= ?", (horizon,))
    db.close()
    async with await crashable.start() as api:
        async with api.watch(CMS, resourceVersion=resume_from) as watch:
            events = await watch.rest()
        assert len(events) == 1 and events[0]["type"] == "ERROR"
        assert_status_object = events[0]["object"]
        assert assert_status_object["code"] == 410 and assert_status_object["reason"] == "Expired"
        async with api.watch(CMS, resourceVersion=str(horizon)) as watch:
            events = await watch.take(1)
            assert [(e["type"], e["object"]["metadata"]["name"]) for e in events] == [("ADDED", "c")]
