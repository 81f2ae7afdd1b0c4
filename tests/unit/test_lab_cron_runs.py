"""The CronJob controller's decisions (``cron_runs``), without an API server: which firing runs, the Job it makes,
the concurrency policies, suspension, the starting deadline, history limits, status, and Events for a schedule
or zone that cannot be read."""

from __future__ import annotations

from datetime import UTC, datetime
from typing import Any

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from ambit.lab.controllers import cron_runs

Obj = dict[str, Any]
CREATED = "2027-01-15T08:00:10Z"
T0 = datetime(2027, 1, 15, 8, 0, 10, tzinfo=UTC).timestamp()


def cron(status: Obj | None = None, **spec: Any) -> Obj:
    return {
        "apiVersion": "batch/v1",
        "kind": "CronJob",
        "metadata": {"name": "tick", "namespace": "default", "uid": "cron-uid", "creationTimestamp": CREATED},
        "spec": {
            "schedule": "*/5 * * * *",
            "concurrencyPolicy": "Allow",
            "jobTemplate": {"metadata": {"labels": {"a": "b"}}, "spec": {"template": {"spec": {"containers": []}}}},
            **spec,
        },
        "status": status or {},
    }


def job(name: str, condition: str | None = None, scheduled: str = "2027-01-15T08:05:00Z", **status: Any) -> Obj:
    body: Obj = {
        "metadata": {"name": name, "namespace": "default", "uid": f"uid-{name}", "resourceVersion": "3"},
        "status": dict(status),
    }
    body["metadata"]["annotations"] = {cron_runs.SCHEDULED_TIMESTAMP: scheduled}
    if condition:
        body["status"]["conditions"] = [{"type": condition, "status": "True"}]
    return body


def test_nothing_runs_before_the_first_firing_and_the_plan_waits_for_it() -> None:
    plan = cron_runs.plan(cron(), [], T0 + 60)
    assert plan.create is None and plan.wait == pytest.approx(230.0)  # 08:05:00


def test_a_firing_makes_the_job_named_by_its_minute_with_the_scheduled_time() -> None:
    plan = cron_runs.plan(cron(), [], T0 + 300)  # 08:05:10
    assert plan.create is not None
    meta = plan.create["metadata"]
    assert meta["name"] == f"tick-{int(datetime(2027, 1, 15, 8, 5, tzinfo=UTC).timestamp()) // 60}"
    assert meta["annotations"] == {cron_runs.SCHEDULED_TIMESTAMP: "2027-01-15T08:05:00Z"}
    assert meta["labels"] == {"a": "b"}
    assert meta["ownerReferences"][0]["kind"] == "CronJob" and meta["ownerReferences"][0]["controller"] is True
    assert plan.status is not None and plan.status["lastScheduleTime"] == "2027-01-15T08:05:00Z"
    assert plan.events == [("Normal", "SuccessfulCreate", f"Created job {meta['name']}")]


def test_the_scheduled_time_is_written_in_the_cron_jobs_zone() -> None:
    plan = cron_runs.plan(cron(timeZone="Asia/Kolkata", schedule="30 14 * * *"), [], T0 + 3600)  # 09:00 UTC
    assert plan.create is not None
    assert plan.create["metadata"]["annotations"][cron_runs.SCHEDULED_TIMESTAMP] == "2027-01-15T14:30:00+05:30"


def test_a_run_already_made_is_not_made_again() -> None:
    name = cron_runs.job_name(cron(), datetime(2027, 1, 15, 8, 5, tzinfo=UTC))
    plan = cron_runs.plan(cron(), [job(name)], T0 + 300)
    assert plan.create is None
    assert plan.status is not None and [r["name"] for r in plan.status["active"]] == [name]


def test_forbid_skips_while_a_job_is_active_and_replace_deletes_it() -> None:
    running = job("tick-1")
    assert cron_runs.plan(cron(concurrencyPolicy="Forbid"), [running], T0 + 300).create is None
    replace = cron_runs.plan(cron(concurrencyPolicy="Replace"), [running], T0 + 300)
    assert replace.create is not None and replace.delete == [running]
    allow = cron_runs.plan(cron(), [running], T0 + 300)
    assert allow.create is not None and not allow.delete


def test_a_suspended_cron_job_makes_nothing() -> None:
    assert cron_runs.plan(cron(suspend=True), [], T0 + 3000).create is None


def test_only_the_latest_missed_firing_runs_and_the_starting_deadline_drops_late_ones() -> None:
    plan = cron_runs.plan(cron(), [], T0 + 3000)  # 08:50:10: ten firings missed, the 08:50 one runs
    assert plan.create is not None
    assert plan.create["metadata"]["annotations"][cron_runs.SCHEDULED_TIMESTAMP] == "2027-01-15T08:50:00Z"
    late = cron_runs.plan(cron(startingDeadlineSeconds=5), [], T0 + 3000)  # 10 s after 08:50
    assert late.create is None


def test_too_many_missed_firings_are_reported() -> None:
    plan = cron_runs.plan(cron(schedule="* * * * *"), [], T0 + 200 * 60)
    assert plan.create is not None
    assert [e[1] for e in plan.events] == ["TooManyMissedTimes", "SuccessfulCreate"]


def test_finished_jobs_beyond_the_limits_go_oldest_first() -> None:
    done = [job(f"ok-{i}", "Complete", f"2027-01-15T08:0{i}:00Z") for i in range(5)]
    failed = [job(f"bad-{i}", "Failed", f"2027-01-15T07:0{i}:00Z") for i in range(3)]
    plan = cron_runs.plan(cron(successfulJobsHistoryLimit=2, failedJobsHistoryLimit=1), done + failed, T0)
    assert [j["metadata"]["name"] for j in plan.delete] == ["ok-0", "ok-1", "ok-2", "bad-0", "bad-1"]


def test_last_successful_time_follows_the_latest_completion_and_never_goes_back() -> None:
    jobs = [
        job("a", "Complete", completionTime="2027-01-15T08:01:00Z"),
        job("b", "Complete", completionTime="2027-01-15T08:03:00Z"),
    ]
    plan = cron_runs.plan(cron(), jobs, T0)
    assert plan.status is not None and plan.status["lastSuccessfulTime"] == "2027-01-15T08:03:00Z"
    later = cron_runs.plan(cron({"lastSuccessfulTime": "2027-01-15T09:00:00Z"}), jobs, T0)
    assert later.status is None or later.status["lastSuccessfulTime"] == "2027-01-15T09:00:00Z"


@pytest.mark.parametrize(
    ("spec", "reason"),
    [({"schedule": "61 * * * *"}, "UnparseableSchedule"), ({"timeZone": "Mars/Olympus"}, "UnknownTimeZone")],
)
def test_a_schedule_or_zone_that_cannot_be_read_is_an_event_not_a_job(spec: Obj, reason: str) -> None:
    plan = cron_runs.plan(cron(**spec), [], T0 + 3000)
    assert plan.create is None and plan.wait is None
    assert [e[:2] for e in plan.events] == [("Warning", reason)]


JSON = st.recursive(
    st.none() | st.booleans() | st.integers(-3, 10**6) | st.text(max_size=12),
    lambda inner: st.lists(inner, max_size=3) | st.dictionaries(st.text(max_size=8), inner, max_size=3),
    max_leaves=10,
)


@settings(max_examples=200, deadline=None)
@given(
    spec=st.dictionaries(
        st.sampled_from(
            ["schedule", "timeZone", "concurrencyPolicy", "startingDeadlineSeconds", "suspend", "jobTemplate"]
        ),
        JSON,
        max_size=4,
    ),
    status=st.dictionaries(st.sampled_from(["lastScheduleTime", "lastSuccessfulTime", "active"]), JSON),
)
def test_no_cron_job_shape_makes_the_plan_raise(spec: Obj, status: Obj) -> None:
    cron_runs.plan(cron(status, **spec), [job("x", "Complete")], T0 + 3000)
