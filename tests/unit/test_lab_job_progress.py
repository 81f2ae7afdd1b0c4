"""The Job controller's decisions (``job_progress``), without an API server: the three counting steps, success and
failure criteria with their condition order, suspension, Indexed pods and completed indexes, the back-off, and
that no Job or pod shape makes the plan raise."""

from __future__ import annotations

import copy
from typing import Any

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from ambit.lab.controllers import job_progress as jp

Obj = dict[str, Any]
NOW = 1_800_000_000.0
BACKOFF = jp.Backoff(base=10.0, maximum=360.0)


def job(status: Obj | None = None, **spec: Any) -> Obj:
    body = {
        "apiVersion": "batch/v1",
        "kind": "Job",
        "metadata": {"name": "pi", "namespace": "default", "uid": "job-uid", "resourceVersion": "7"},
        "spec": {
            "parallelism": 1,
            "completions": 1,
            "backoffLimit": 6,
            "completionMode": "NonIndexed",
            "template": {
                "metadata": {"labels": {"job-name": "pi"}},
                "spec": {"restartPolicy": "Never", "containers": [{"name": "main", "image": "busybox"}]},
            },
            **spec,
        },
    }
    body["status"] = status or {}
    return body


def pod(uid: str, phase: str = "Running", *, finalizer: bool = True, deleting: bool = False, **extra: Any) -> Obj:
    meta: Obj = {"name": f"pi-{uid}", "uid": uid, "namespace": "default", "creationTimestamp": "2027-01-15T08:00:00Z"}
    if finalizer:
        meta["finalizers"] = [jp.TRACKING_FINALIZER]
    if deleting:
        meta["deletionTimestamp"] = "2027-01-15T08:00:05Z"
    meta.update(extra)
    return {"metadata": meta, "status": {"phase": phase}}


def types(status: Obj | None) -> list[str]:
    return [c["type"] for c in (status or {}).get("conditions") or ()]


def test_a_new_job_starts_and_makes_one_pod_with_the_finalizer_and_a_controller_reference() -> None:
    plan = jp.plan(job(), [], NOW, BACKOFF)
    assert plan.status is not None and plan.status["startTime"]
    [made] = plan.create
    meta = made["metadata"]
    assert (meta["generateName"], meta["finalizers"]) == ("pi-", [jp.TRACKING_FINALIZER])
    ref = meta["ownerReferences"][0]
    assert (ref["kind"], ref["uid"], ref["controller"], ref["blockOwnerDeletion"]) == ("Job", "job-uid", True, True)
    assert made["spec"]["restartPolicy"] == "Never" and meta["labels"] == {"job-name": "pi"}


def test_counting_takes_three_steps_and_never_counts_a_pod_twice() -> None:
    spec = {"completions": 2}
    done = pod("a", "Succeeded")
    # Step 1: the finished pod joins the uncounted list; its finalizer is not taken off in the same write.
    first = jp.plan(job(**spec), [done], NOW, BACKOFF)
    assert first.status is not None
    assert first.status["uncountedTerminatedPods"] == {"succeeded": ["a"]}
    assert first.status["succeeded"] == 0 and first.release == [done]
    # Step 2 happened (the finalizer is off); step 3 moves the uid to the counter.
    stored = job(first.status, **spec)
    released = pod("a", "Succeeded", finalizer=False)
    second = jp.plan(stored, [released], NOW, BACKOFF)
    assert second.status is not None
    assert (second.status["succeeded"], second.status["uncountedTerminatedPods"]) == (1, {})
    # Afterwards the pod is neither listed nor counted again.
    third = jp.plan(job(second.status, **spec), [released], NOW, BACKOFF)
    assert third.status is None or third.status["succeeded"] == 1
    # A uid whose pod still carries the finalizer stays listed (step 2 not done yet).
    waiting = jp.plan(stored, [done], NOW, BACKOFF)
    assert waiting.status is None or waiting.status["uncountedTerminatedPods"] == {"succeeded": ["a"]}


def test_reaching_completions_adds_success_criteria_then_complete_once_drained() -> None:
    counted = {"succeeded": 1, "failed": 0, "startTime": "2027-01-15T08:00:00Z", "uncountedTerminatedPods": {}}
    plan = jp.plan(job(counted), [pod("a", "Succeeded", finalizer=False)], NOW, BACKOFF)
    assert plan.status is not None
    assert types(plan.status) == ["SuccessCriteriaMet", "Complete"]
    assert plan.status["completionTime"] and plan.events == [("Normal", "Completed", "Job completed")]
    # With a pod still running, only the success criteria: the pod is deleted first.
    running = jp.plan(job(counted, parallelism=2), [pod("b")], NOW, BACKOFF)
    assert running.status is not None and types(running.status) == ["SuccessCriteriaMet"]
    assert [p["metadata"]["uid"] for p in running.delete] == ["b"]


def test_more_failures_than_the_backoff_limit_fail_the_job_in_two_steps() -> None:
    failed = {"succeeded": 0, "failed": 2, "startTime": "2027-01-15T08:00:00Z"}
    plan = jp.plan(job(failed, backoffLimit=1, parallelism=2, completions=3), [pod("c")], NOW, BACKOFF)
    assert plan.status is not None and types(plan.status) == ["FailureTarget"]
    assert plan.status["conditions"][0]["reason"] == "BackoffLimitExceeded" and plan.delete and not plan.create
    target = plan.status
    drained = jp.plan(job(target, backoffLimit=1), [], NOW, BACKOFF)
    assert drained.status is not None and types(drained.status) == ["FailureTarget", "Failed"]
    assert drained.events == [("Warning", "BackoffLimitExceeded", "Job has reached the specified backoff limit")]
    assert "completionTime" not in drained.status


def test_container_restarts_count_against_the_limit_with_restart_policy_on_failure() -> None:
    restarting = pod("a")
    restarting["status"]["containerStatuses"] = [{"name": "main", "restartCount": 2}]
    spec = {"backoffLimit": 2, "template": {"spec": {"restartPolicy": "OnFailure", "containers": []}}}
    plan = jp.plan(job(**spec), [restarting], NOW, BACKOFF)
    assert plan.status is not None and types(plan.status) == ["FailureTarget"]


def test_the_active_deadline_fails_the_job_and_is_waited_for() -> None:
    started = {"startTime": jp.podstate.rfc3339(NOW - 30)}
    late = jp.plan(job(started, activeDeadlineSeconds=10), [pod("a")], NOW, BACKOFF)
    assert late.status is not None and late.status["conditions"][0]["reason"] == "DeadlineExceeded"
    assert [p["metadata"]["uid"] for p in late.delete] == ["a"]
    early = jp.plan(job(started, activeDeadlineSeconds=60), [pod("a")], NOW, BACKOFF)
    assert early.wait == pytest.approx(30.0)


def test_a_suspended_job_deletes_its_pods_without_counting_them_and_resumes() -> None:
    plan = jp.plan(job(suspend=True), [pod("a")], NOW, BACKOFF)
    assert plan.status is not None and types(plan.status) == ["Suspended"]
    assert [p["metadata"]["uid"] for p in plan.delete] == ["a"] and not plan.create
    deleting = pod("a", deleting=True)
    later = jp.plan(job(plan.status, suspend=True), [deleting], NOW, BACKOFF)
    assert later.release == [deleting]
    assert later.status is None or later.status["failed"] == 0
    stopped = pod("a", "Failed", deleting=True)  # its kubelet wrote Failed as it stopped it
    quiet = jp.plan(job(plan.status, suspend=True), [stopped], NOW, BACKOFF)
    assert quiet.release == [stopped] and (quiet.status is None or not quiet.status["uncountedTerminatedPods"])
    resumed = jp.plan(job(plan.status), [], NOW + 5, BACKOFF)
    assert resumed.status is not None
    assert resumed.status["conditions"][0]["status"] == "False" and resumed.create
    assert ("Normal", "Resumed", "Job resumed") in resumed.events


def test_a_replacement_waits_for_the_backoff_after_recent_failures() -> None:
    failures = [pod(u, "Failed", finalizer=False) for u in "ab"]
    for p in failures:
        p["status"]["containerStatuses"] = [
            {"name": "main", "state": {"terminated": {"finishedAt": jp.podstate.rfc3339(NOW - 5)}}}
        ]
    status = {"failed": 2, "startTime": "2027-01-15T08:00:00Z"}
    waiting = jp.plan(job(status), failures, NOW, BACKOFF)
    assert not waiting.create and waiting.wait == pytest.approx(15.0)  # 20 s after the second failure
    ready = jp.plan(job(status), failures, NOW + 16, BACKOFF)
    assert len(ready.create) == 1


@pytest.mark.parametrize(("failures", "delay"), [(0, 0.0), (1, 10.0), (2, 20.0), (6, 320.0), (7, 360.0), (99, 360.0)])
def test_the_backoff_doubles_from_ten_seconds_up_to_six_minutes(failures: int, delay: float) -> None:
    assert BACKOFF.delay(failures) == delay


def test_an_indexed_job_makes_the_lowest_pending_indexes_with_their_index() -> None:
    status = {"completedIndexes": "0", "succeeded": 1, "startTime": "2027-01-15T08:00:00Z"}
    running = pod("b")
    running["metadata"]["annotations"] = {jp.COMPLETION_INDEX: "1"}
    plan = jp.plan(job(status, completionMode="Indexed", completions=4, parallelism=2), [running], NOW, BACKOFF)
    [made] = plan.create
    assert made["metadata"]["generateName"] == "pi-2-"
    assert made["metadata"]["labels"][jp.COMPLETION_INDEX] == "2"
    assert made["metadata"]["annotations"] == {jp.COMPLETION_INDEX: "2"}
    assert made["spec"]["hostname"] == "pi-2"
    assert made["spec"]["containers"][0]["env"][0]["name"] == "JOB_COMPLETION_INDEX"


@pytest.mark.parametrize(
    ("indexes", "text"),
    [([], ""), ([0], "0"), ([0, 1], "0,1"), ([1, 3, 4, 5, 7], "1,3-5,7"), ([2, 0, 1, 1], "0-2")],
)
def test_completed_indexes_are_written_as_kube_writes_them(indexes: list[int], text: str) -> None:
    assert jp.format_indexes(indexes) == text


@given(st.sets(st.integers(0, 300)))
def test_completed_indexes_read_back_what_was_written(indexes: set[int]) -> None:
    assert jp.parse_indexes(jp.format_indexes(indexes), 301) == indexes


@given(st.text(max_size=30), st.integers(0, 50))
def test_no_completed_indexes_text_makes_the_reader_raise(text: str, limit: int) -> None:
    assert all(0 <= i < max(limit, 1) for i in jp.parse_indexes(text, limit))


def test_a_finished_job_only_takes_finalizers_off() -> None:
    status = {"conditions": [{"type": "Complete", "status": "True"}], "succeeded": 1, "active": 0, "ready": 0}
    left = pod("z", "Running")
    plan = jp.plan(job(status), [left], NOW, BACKOFF)
    assert plan.release == [left] and not plan.create and not plan.delete


JSON = st.recursive(
    st.none() | st.booleans() | st.integers(-3, 5) | st.text(max_size=6),
    lambda inner: st.lists(inner, max_size=3) | st.dictionaries(st.text(max_size=8), inner, max_size=3),
    max_leaves=10,
)
KEYS = ("parallelism", "completions", "backoffLimit", "completionMode", "suspend", "activeDeadlineSeconds")


@settings(max_examples=200)
@given(
    spec=st.dictionaries(st.sampled_from(KEYS), JSON, max_size=4),
    status=st.dictionaries(st.sampled_from(["succeeded", "failed", "completedIndexes", "startTime"]), JSON),
    phases=st.lists(st.sampled_from(["Pending", "Running", "Succeeded", "Failed"]), max_size=4),
)
def test_no_job_or_pod_shape_makes_the_plan_raise(spec: Obj, status: Obj, phases: list[str]) -> None:
    pods = [pod(str(i), phase) for i, phase in enumerate(phases)]
    body = job(copy.deepcopy(status), **spec)
    try:
        jp.plan(body, pods, NOW, BACKOFF)
    except (TypeError, ValueError) as exc:  # a stored Job passed validation; this records what would break
        pytest.fail(f"plan raised {exc!r} for {spec} {status}")
