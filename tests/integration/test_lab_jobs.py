"""The Job and TTL-after-finished controllers against the real embedded API server, with the scheduler and a
stand-in kubelet (:mod:`tests.integration.lab_cluster`) whose pods the tests make succeed or fail: completions and
parallelism, work queues, retries up to the back-off limit, the active deadline, suspension, Indexed Jobs, the
tracking finalizer, TTL after finished, and garbage collection of a deleted Job's pods."""

from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator
from typing import Any

import pytest
from tests.integration.lab_cluster import NS, Kubelet, Obj, add_node, finish_pod, settings, until

from ambit.apiserver.server import ApiServer
from ambit.k8s import KubeClient, KubeNotFoundError, kinds
from ambit.lab.controllers import ControllerManager

FINALIZER = "batch.kubernetes.io/job-tracking"
INDEX = "batch.kubernetes.io/job-completion-index"


@pytest.fixture
async def kube(apiserver: ApiServer) -> AsyncIterator[KubeClient]:
    async with KubeClient.from_kubeconfig(apiserver.kubeconfig) as client:
        await add_node(client, "node-a")
        yield client


@pytest.fixture
async def controllers(kube: KubeClient) -> AsyncIterator[ControllerManager]:
    lab = settings(disruption=False, endpoints=False, job_backoff_base=0.05, job_backoff_max=0.2)
    async with ControllerManager(kube, lab) as manager, Kubelet(kube):
        yield manager


def job(name: str = "pi", restart: str = "Never", **spec: Any) -> Obj:
    return {
        "metadata": {"name": name, "namespace": NS},
        "spec": {
            "template": {"spec": {"restartPolicy": restart, "containers": [{"name": "main", "image": "busybox"}]}},
            **spec,
        },
    }


async def pods_of(kube: KubeClient, name: str = "pi") -> list[Obj]:
    items = (await kube.list(kinds.PODS, NS, label_selector={"batch.kubernetes.io/job-name": name}))[0]
    return sorted(items, key=lambda p: p["metadata"]["creationTimestamp"] + p["metadata"]["name"])


def running(pods: list[Obj]) -> list[Obj]:
    return [p for p in pods if p["status"].get("phase") == "Running" and not p["metadata"].get("deletionTimestamp")]


async def running_pods(kube: KubeClient, count: int, name: str = "pi") -> list[Obj]:
    """Exactly ``count`` pods of the Job running (None of them terminating), once there are."""
    found = running(await pods_of(kube, name))
    return found if len(found) == count else []


def conditions(obj: Obj) -> list[tuple[str, str, str]]:
    return [(c["type"], c["status"], c.get("reason", "")) for c in obj["status"].get("conditions") or ()]


async def job_with(kube: KubeClient, name: str, kind: str) -> Obj:
    found = await kube.get(kinds.JOBS, name, NS)
    return found if any(c[0] == kind and c[1] == "True" for c in conditions(found)) else {}


async def reasons(kube: KubeClient, name: str = "pi") -> list[str]:
    items = (await kube.list(kinds.EVENTS, NS))[0]
    return [e.get("reason", "") for e in items if (e.get("regarding") or {}).get("name") == name]


async def test_completions_run_at_most_parallelism_at_once_and_complete(
    kube: KubeClient, controllers: ControllerManager
) -> None:
    await kube.create(kinds.JOBS, job(completions=3, parallelism=2), NS)
    first = await until(lambda: running_pods(kube, 2), "two pods running")
    for pod in first:
        assert pod["metadata"]["finalizers"] == [FINALIZER]
        ref = pod["metadata"]["ownerReferences"][0]
        assert (ref["kind"], ref["controller"], ref["blockOwnerDeletion"]) == ("Job", True, True)
        assert pod["metadata"]["generateName"] == "pi-"
        await finish_pod(kube, pod["metadata"]["name"])
    [third] = await until(lambda: running_pods(kube, 1), "the third pod")
    assert third["metadata"]["name"] not in {p["metadata"]["name"] for p in first}
    await finish_pod(kube, third["metadata"]["name"])
    done = await until(lambda: job_with(kube, "pi", "Complete"), "the Job to complete")
    status = done["status"]
    assert (status["succeeded"], status["failed"], status["active"]) == (3, 0, 0)
    assert conditions(done) == [
        ("SuccessCriteriaMet", "True", "CompletionsReached"),
        ("Complete", "True", "CompletionsReached"),
    ]
    assert status["completionTime"] >= status["startTime"]
    assert status.get("uncountedTerminatedPods") == {}
    pods = await pods_of(kube)
    assert len(pods) == 3 and all(p["status"]["phase"] == "Succeeded" for p in pods)
    assert all(not p["metadata"].get("finalizers") for p in pods)  # counted: the finalizer is off
    events = await until(lambda: _with(reasons(kube), "Completed"), "the Completed event")
    assert events.count("SuccessfulCreate") == 3


async def _with(found: Any, reason: str) -> list[str]:
    items: list[str] = await found
    return items if reason in items else []


async def test_a_work_queue_stops_making_pods_once_one_succeeds(
    kube: KubeClient, controllers: ControllerManager
) -> None:
    await kube.create(kinds.JOBS, job(parallelism=2), NS)
    made = await kube.get(kinds.JOBS, "pi", NS)
    assert "completions" not in made["spec"]
    one, two = await until(lambda: running_pods(kube, 2), "two workers")
    await finish_pod(kube, one["metadata"]["name"])
    await asyncio.sleep(0.3)
    assert len(await pods_of(kube)) == 2  # no replacement: the queue is draining
    assert not await job_with(kube, "pi", "Complete")  # the other worker still runs
    await finish_pod(kube, two["metadata"]["name"])
    done = await until(lambda: job_with(kube, "pi", "Complete"), "the work queue to complete")
    assert done["status"]["succeeded"] == 2


async def test_failed_pods_are_retried_until_the_backoff_limit_then_the_job_fails(
    kube: KubeClient, controllers: ControllerManager
) -> None:
    await kube.create(kinds.JOBS, job(backoffLimit=2), NS)
    seen: set[str] = set()
    for attempt in range(3):
        [pod] = await until(lambda: running_pods(kube, 1), f"attempt {attempt + 1}")
        assert pod["metadata"]["name"] not in seen
        seen.add(pod["metadata"]["name"])
        await finish_pod(kube, pod["metadata"]["name"], succeeded=False)
    failed = await until(lambda: job_with(kube, "pi", "Failed"), "the Job to fail")
    assert conditions(failed) == [
        ("FailureTarget", "True", "BackoffLimitExceeded"),
        ("Failed", "True", "BackoffLimitExceeded"),
    ]
    assert (failed["status"]["failed"], failed["status"]["succeeded"], failed["status"]["active"]) == (3, 0, 0)
    assert "completionTime" not in failed["status"]
    await asyncio.sleep(0.3)
    assert len(await pods_of(kube)) == 3  # no fourth attempt
    assert "BackoffLimitExceeded" in await until(lambda: _with(reasons(kube), "BackoffLimitExceeded"), "the event")


async def test_the_active_deadline_deletes_the_running_pods_and_fails_the_job(
    kube: KubeClient, controllers: ControllerManager
) -> None:
    # 3 s: the pod must be seen running before the deadline deletes it (1 s lost that race once on a loaded CI).
    await kube.create(kinds.JOBS, job(activeDeadlineSeconds=3), NS)
    await until(lambda: running_pods(kube, 1), "the pod to run")
    failed = await until(lambda: job_with(kube, "pi", "Failed"), "the deadline to pass", within=15)
    assert conditions(failed) == [("FailureTarget", "True", "DeadlineExceeded"), ("Failed", "True", "DeadlineExceeded")]
    assert failed["status"]["active"] == 0
    message = failed["status"]["conditions"][1].get("message")
    assert message == "Job was active longer than specified deadline"
    await until(lambda: _no_pods(kube), "the deleted pod to go (its finalizer taken off)")


async def _no_pods(kube: KubeClient, name: str = "pi") -> bool:
    return not await pods_of(kube, name)


async def test_a_suspended_job_makes_no_pods_and_resumes(kube: KubeClient, controllers: ControllerManager) -> None:
    await kube.create(kinds.JOBS, job(suspend=True, completions=2, parallelism=2), NS)
    suspended = await until(lambda: job_with(kube, "pi", "Suspended"), "the Suspended condition")
    assert "startTime" not in suspended["status"] and not await pods_of(kube)
    await kube.patch(kinds.JOBS, "pi", {"spec": {"suspend": False}}, NS)
    await until(lambda: running_pods(kube, 2), "pods after resuming")
    resumed = await kube.get(kinds.JOBS, "pi", NS)
    assert ("Suspended", "False", "JobResumed") in conditions(resumed)
    assert resumed["status"]["startTime"]
    await kube.patch(kinds.JOBS, "pi", {"spec": {"suspend": True}}, NS)
    await until(lambda: _no_pods(kube), "the active pods to be deleted")
    again = await until(lambda: job_with(kube, "pi", "Suspended"), "suspended again")
    assert (again["status"]["active"], again["status"]["failed"]) == (0, 0)  # deleted by us: not failures
    for reason in ("Suspended", "Resumed", "SuccessfulDelete"):
        assert reason in await until(lambda r=reason: _with(reasons(kube), r), reason)  # type: ignore[misc]


async def test_an_indexed_job_gives_each_pod_its_index_and_completes_every_index(
    kube: KubeClient, controllers: ControllerManager
) -> None:
    await kube.create(kinds.JOBS, job(completionMode="Indexed", completions=3, parallelism=3), NS)
    pods = await until(lambda: running_pods(kube, 3), "one pod per index")
    by_index = {p["metadata"]["annotations"][INDEX]: p for p in pods}
    assert sorted(by_index) == ["0", "1", "2"]
    for index, pod in by_index.items():
        assert pod["metadata"]["labels"][INDEX] == index
        assert pod["metadata"]["generateName"] == f"pi-{index}-"
        assert pod["spec"]["hostname"] == f"pi-{index}"
        env = pod["spec"]["containers"][0]["env"][0]
        assert env == {
            "name": "JOB_COMPLETION_INDEX",
            "valueFrom": {"fieldRef": {"apiVersion": "v1", "fieldPath": f"metadata.annotations['{INDEX}']"}},
        }
    await finish_pod(kube, by_index["1"]["metadata"]["name"])
    await finish_pod(kube, by_index["0"]["metadata"]["name"], succeeded=False)
    retried = await until(lambda: _index_running(kube, "0", by_index["0"]["metadata"]["name"]), "index 0 again")
    job_now = await kube.get(kinds.JOBS, "pi", NS)
    assert job_now["status"]["completedIndexes"] == "1"
    await finish_pod(kube, retried["metadata"]["name"])
    await finish_pod(kube, by_index["2"]["metadata"]["name"])
    done = await until(lambda: job_with(kube, "pi", "Complete"), "every index to complete")
    assert (done["status"]["completedIndexes"], done["status"]["succeeded"], done["status"]["failed"]) == ("0-2", 3, 1)


async def _index_running(kube: KubeClient, index: str, old: str) -> Obj | None:
    for pod in running(await pods_of(kube)):
        if pod["metadata"]["labels"][INDEX] == index and pod["metadata"]["name"] != old:
            return pod
    return None


async def test_a_finished_job_with_a_ttl_is_deleted_with_its_pods(
    kube: KubeClient, controllers: ControllerManager
) -> None:
    await kube.create(kinds.JOBS, job(ttlSecondsAfterFinished=1), NS)
    [pod] = await until(lambda: running_pods(kube, 1), "the pod")
    await finish_pod(kube, pod["metadata"]["name"])
    await until(lambda: job_with(kube, "pi", "Complete"), "completion")
    await until(lambda: _job_gone(kube), "the TTL to delete the Job", within=10)
    await until(lambda: _no_pods(kube), "its pods to be collected")


async def _job_gone(kube: KubeClient, name: str = "pi") -> bool:
    try:
        await kube.get(kinds.JOBS, name, NS)
    except KubeNotFoundError:
        return True
    return False


async def test_deleting_a_job_collects_its_running_pods(kube: KubeClient, controllers: ControllerManager) -> None:
    await kube.create(kinds.JOBS, job(completions=2, parallelism=2), NS)
    await until(lambda: running_pods(kube, 2), "two pods")
    await kube.delete(kinds.JOBS, "pi", NS, propagation_policy="Background")
    await until(lambda: _no_pods(kube), "the pods to go with the Job (finalizers taken off)")


async def test_pods_orphaned_by_their_job_lose_the_tracking_finalizer(
    kube: KubeClient, controllers: ControllerManager
) -> None:
    await kube.create(kinds.JOBS, job(), NS)
    [pod] = await until(lambda: running_pods(kube, 1), "the pod")
    await kube.delete(kinds.JOBS, "pi", NS, propagation_policy="Orphan")
    await until(lambda: _finalizer_gone(kube, pod["metadata"]["name"]), "the orphan's finalizer to go")
    await kube.create(kinds.JOBS, job(), NS)  # a new Job of the same name does not count the old pod
    fresh = await until(lambda: _job_with_active(kube), "the new Job's own pod")
    assert fresh["status"]["failed"] == 0 and fresh["status"]["succeeded"] == 0


async def _finalizer_gone(kube: KubeClient, name: str) -> bool:
    found = await kube.get(kinds.PODS, name, NS)
    return not found["metadata"].get("finalizers") and not found["metadata"].get("ownerReferences")


async def _job_with_active(kube: KubeClient) -> Obj:
    found = await kube.get(kinds.JOBS, "pi", NS)
    return found if (found.get("status") or {}).get("active") == 1 else {}
