"""The CronJob controller against the real embedded API server, with the Job controller, the scheduler and a
stand-in kubelet (:mod:`tests.integration.lab_cluster`), on an injected clock the tests move: a schedule firing
makes its Job (named by the scheduled minute, annotated with the scheduled time), status, concurrency policies
(Allow, Forbid, Replace), suspension and the history limits."""

from __future__ import annotations

import asyncio
import itertools
import time
from collections.abc import AsyncIterator
from typing import Any

import pytest
from tests.integration.lab_cluster import NS, Kubelet, Obj, add_node, settings, until

from ambit.apiserver.server import ApiServer
from ambit.k8s import KubeClient, kinds
from ambit.lab.controllers import ControllerManager
from ambit.lab.controllers.pods import parse_time

SCHEDULED = "batch.kubernetes.io/cronjob-scheduled-timestamp"


class Clock:
    """The CronJob controller's time: it stands still until a test moves it."""

    def __init__(self) -> None:
        self.now = float(int(time.time()) // 60 * 60 + 30)  # half past a minute: firings are clear of it

    def __call__(self) -> float:
        return self.now

    def anchor(self, created: float) -> None:
        """Stand at half past the minute the CronJob was created in: its first firing is the next minute's. (The
        minute the clock was made in is not enough: a create made a moment later can fall in the next minute, and
        a firing is only ever after the creation.)"""
        self.now = float(int(created) // 60 * 60 + 30)


@pytest.fixture
async def kube(apiserver: ApiServer) -> AsyncIterator[KubeClient]:
    async with KubeClient.from_kubeconfig(apiserver.kubeconfig) as client:
        await add_node(client, "node-a")
        yield client


@pytest.fixture
def clock() -> Clock:
    return Clock()


async def start(kube: KubeClient, clock: Clock, finish: str | None) -> AsyncIterator[ControllerManager]:
    lab = settings(disruption=False, endpoints=False, job_backoff_base=0.05, job_backoff_max=0.2)
    async with ControllerManager(kube, lab, schedule_clock=clock) as manager, Kubelet(kube, finish=finish):
        yield manager


@pytest.fixture
async def succeeding(kube: KubeClient, clock: Clock) -> AsyncIterator[ControllerManager]:
    """Controllers whose pods succeed as soon as they run."""
    async for manager in start(kube, clock, "Succeeded"):
        yield manager


@pytest.fixture
async def lingering(kube: KubeClient, clock: Clock) -> AsyncIterator[ControllerManager]:
    """Controllers whose pods keep running."""
    async for manager in start(kube, clock, None):
        yield manager


def cron_job(name: str = "tick", schedule: str = "* * * * *", **spec: Any) -> Obj:
    container = {"name": "main", "image": "busybox", "command": ["echo", "hi"]}
    return {
        "metadata": {"name": name, "namespace": NS},
        "spec": {
            "schedule": schedule,
            "jobTemplate": {
                "metadata": {"labels": {"team": "batch"}},
                "spec": {"template": {"spec": {"restartPolicy": "Never", "containers": [container]}}},
            },
            **spec,
        },
    }


_touches = itertools.count()


async def create(kube: KubeClient, clock: Clock, cron: Obj) -> None:
    made = await kube.create(kinds.CRON_JOBS, cron, NS)
    created = parse_time(made["metadata"]["creationTimestamp"])
    assert created is not None
    clock.anchor(created)


async def advance(kube: KubeClient, clock: Clock, seconds: float, name: str = "tick") -> None:
    """Move the clock and make the CronJob look again (a label change queues it, as a resync would)."""
    clock.now += seconds
    await kube.patch(kinds.CRON_JOBS, name, {"metadata": {"labels": {"touched": str(next(_touches))}}}, NS)


async def jobs_of(kube: KubeClient, name: str = "tick") -> list[Obj]:
    items = (await kube.list(kinds.JOBS, NS))[0]
    mine = [j for j in items if any(r.get("name") == name for r in j["metadata"].get("ownerReferences") or ())]
    return sorted(mine, key=lambda j: j["metadata"]["name"])


async def job_names(kube: KubeClient, count: int, name: str = "tick") -> list[str]:
    found = [j["metadata"]["name"] for j in await jobs_of(kube, name) if not j["metadata"].get("deletionTimestamp")]
    return found if len(found) == count else []


def minute_of(clock: Clock) -> int:
    return int(clock.now) // 60


def complete(job: Obj) -> bool:
    return any(c["type"] == "Complete" and c["status"] == "True" for c in job["status"].get("conditions") or ())


async def test_a_firing_makes_a_job_named_by_its_minute_and_the_status_follows_it(
    kube: KubeClient, clock: Clock, succeeding: ControllerManager
) -> None:
    await create(kube, clock, cron_job())
    assert not await jobs_of(kube)  # nothing fires before the next minute
    await advance(kube, clock, 60)
    [name] = await until(lambda: job_names(kube, 1), "the first Job")
    assert name == f"tick-{minute_of(clock)}"
    [job] = await jobs_of(kube)
    scheduled = job["metadata"]["annotations"][SCHEDULED]
    assert scheduled == time.strftime("%Y-%m-%dT%H:%M:00Z", time.gmtime(minute_of(clock) * 60))
    assert job["metadata"]["labels"]["team"] == "batch"
    ref = job["metadata"]["ownerReferences"][0]
    assert (ref["kind"], ref["name"], ref["controller"]) == ("CronJob", "tick", True)
    cron = await until(lambda: _status_with(kube, "lastSuccessfulTime"), "the run to succeed")
    assert cron["status"]["lastScheduleTime"] == scheduled
    assert not cron["status"].get("active")
    await advance(kube, clock, 60)
    names = await until(lambda: job_names(kube, 2), "the second Job")
    assert names[1] == f"tick-{minute_of(clock)}"


async def _status_with(kube: KubeClient, field: str, name: str = "tick") -> Obj:
    cron = await kube.get(kinds.CRON_JOBS, name, NS)
    return cron if cron["status"].get(field) else {}


async def test_forbid_skips_a_firing_while_a_job_runs(
    kube: KubeClient, clock: Clock, lingering: ControllerManager
) -> None:
    await create(kube, clock, cron_job(concurrencyPolicy="Forbid"))
    await advance(kube, clock, 60)
    [first] = await until(lambda: job_names(kube, 1), "the first Job")
    cron = await until(lambda: _status_with(kube, "active"), "the Job listed as active")
    assert [r["name"] for r in cron["status"]["active"]] == [first]
    await advance(kube, clock, 60)
    await advance(kube, clock, 0)
    await asyncio.sleep(0.3)  # time to act, were it going to
    assert await job_names(kube, 1) == [first]


async def test_replace_deletes_the_running_job_for_the_new_one(
    kube: KubeClient, clock: Clock, lingering: ControllerManager
) -> None:
    await create(kube, clock, cron_job(concurrencyPolicy="Replace"))
    await advance(kube, clock, 60)
    [first] = await until(lambda: job_names(kube, 1), "the first Job")
    await advance(kube, clock, 60)
    second = f"tick-{minute_of(clock)}"
    await until(lambda: _only(kube, second), "the replacement alone")
    assert second != first


async def _only(kube: KubeClient, name: str) -> bool:
    return await job_names(kube, 1) == [name]


async def test_allow_runs_beside_an_active_job_and_suspend_stops_new_ones(
    kube: KubeClient, clock: Clock, lingering: ControllerManager
) -> None:
    await create(kube, clock, cron_job())
    await advance(kube, clock, 60)
    await until(lambda: job_names(kube, 1), "the first Job")
    await advance(kube, clock, 60)
    await until(lambda: job_names(kube, 2), "a second Job beside the first")
    await kube.patch(kinds.CRON_JOBS, "tick", {"spec": {"suspend": True}}, NS)
    await asyncio.sleep(0.3)  # the controller's cache shows the suspension before the clock moves
    await advance(kube, clock, 120)
    await advance(kube, clock, 0)
    await asyncio.sleep(0.3)  # time to act, were it going to
    assert len(await job_names(kube, 2)) == 2


async def test_finished_jobs_beyond_the_history_limit_are_deleted(
    kube: KubeClient, clock: Clock, succeeding: ControllerManager
) -> None:
    await create(kube, clock, cron_job(successfulJobsHistoryLimit=1))
    for _ in range(3):
        await advance(kube, clock, 60)
        latest = f"tick-{minute_of(clock)}"
        await until(lambda n=latest: _completed(kube, n), f"{latest} to complete")  # type: ignore[misc]
    await advance(kube, clock, 0)
    await asyncio.sleep(0.3)  # time to act, were it going to
    assert await until(lambda: job_names(kube, 1), "the older Jobs to go") == [latest]


async def _completed(kube: KubeClient, name: str) -> bool:
    return any(j["metadata"]["name"] == name and complete(j) for j in await jobs_of(kube))


async def test_a_missed_firing_older_than_the_starting_deadline_is_not_run(
    kube: KubeClient, clock: Clock, lingering: ControllerManager
) -> None:
    await create(kube, clock, cron_job(schedule="0 * * * *", startingDeadlineSeconds=10))
    await advance(kube, clock, 3600)  # an hour later: the firing on the hour is more than 10 s ago
    await advance(kube, clock, 0)
    await asyncio.sleep(0.3)  # time to act, were it going to
    assert not await jobs_of(kube)
