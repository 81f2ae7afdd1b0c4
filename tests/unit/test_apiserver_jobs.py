"""Jobs and CronJobs in the embedded API server, without HTTP: kube's defaults, the generated selector, the
validation rules and their field paths, which spec fields an update may change, the ``kubectl get`` rows; and that
no spec, however malformed, makes any of them raise anything but a 422."""

from __future__ import annotations

import copy
from typing import Any

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from ambit.apiserver.defaults import apply_defaults
from ambit.apiserver.errors import ApiError
from ambit.apiserver.printers import PRINTERS
from ambit.apiserver.registry import Registry
from ambit.apiserver.strategies import JobStrategy, StrategyContext
from ambit.apiserver.validation import validate_object

Obj = dict[str, Any]
UID = "0b5c3d0e-1111-2222-3333-444455556666"
POD_SPEC = {"restartPolicy": "Never", "containers": [{"name": "main", "image": "busybox"}]}


def job(**spec: Any) -> Obj:
    return {
        "apiVersion": "batch/v1",
        "kind": "Job",
        "metadata": {"name": "pi", "namespace": "default", "uid": UID},
        "spec": {"template": {"spec": copy.deepcopy(POD_SPEC)}, **spec},
    }


def cron_job(**spec: Any) -> Obj:
    return {
        "apiVersion": "batch/v1",
        "kind": "CronJob",
        "metadata": {"name": "nightly", "namespace": "default"},
        "spec": {
            "schedule": "*/5 * * * *",
            "jobTemplate": {"spec": {"template": {"spec": copy.deepcopy(POD_SPEC)}}},
            **spec,
        },
    }


def _strategy() -> JobStrategy:
    def commit(*_: Any) -> None:
        raise AssertionError("nothing is stored")

    return JobStrategy(StrategyContext(None, Registry(), None, lambda: 0.0, commit))  # type: ignore[arg-type]


def _rtype() -> Any:
    found = Registry().find("batch", "jobs")
    assert found is not None
    return found


def created(obj: Obj) -> Obj:
    """``obj`` as the server stores it on create: defaults, then the strategy's derived fields."""
    apply_defaults("batch", obj["kind"], obj)
    if obj["kind"] == "Job":
        _strategy().derive(_rtype(), None, obj)
    return obj


def causes(obj: Obj) -> dict[str, str]:
    return dict(validate_object(obj["kind"], "batch", obj))


def test_both_kinds_are_served_in_the_batch_group_with_kubes_names() -> None:
    registry = Registry()
    jobs, cron = registry.find("batch", "jobs"), registry.find("batch", "cronjobs")
    assert jobs is not None and cron is not None
    assert (jobs.kind, jobs.categories, jobs.subresources, jobs.versions) == ("Job", ("all",), {"status"}, ("v1",))
    assert (cron.kind, cron.short_names, cron.categories, cron.subresources) == (
        "CronJob",
        ("cj",),
        ("all",),
        {"status"},
    )
    assert registry.groups()["batch"] == ["v1"]


def test_a_job_gets_kubes_defaults_and_a_selector_of_its_uid() -> None:
    obj = created(job())
    spec = obj["spec"]
    assert {k: spec[k] for k in ("parallelism", "completions", "backoffLimit", "completionMode", "suspend")} == {
        "parallelism": 1,
        "completions": 1,
        "backoffLimit": 6,
        "completionMode": "NonIndexed",
        "suspend": False,
    }
    assert (spec["podReplacementPolicy"], spec["manualSelector"]) == ("TerminatingOrFailed", False)
    assert spec["selector"] == {"matchLabels": {"batch.kubernetes.io/controller-uid": UID}}
    assert spec["template"]["metadata"]["labels"] == {
        "batch.kubernetes.io/controller-uid": UID,
        "batch.kubernetes.io/job-name": "pi",
        "controller-uid": UID,
        "job-name": "pi",
    }
    assert causes(obj) == {}


def test_parallelism_alone_makes_a_work_queue_and_a_per_index_limit_lifts_the_backoff_limit() -> None:
    queue = created(job(parallelism=3))["spec"]
    assert queue["parallelism"] == 3 and "completions" not in queue
    indexed = created(job(completionMode="Indexed", completions=4, backoffLimitPerIndex=1))["spec"]
    assert indexed["backoffLimit"] == 2**31 - 1
    assert created(job(completions=5))["spec"]["parallelism"] == 1


def test_a_manual_selector_is_the_clients_own() -> None:
    obj = job(manualSelector=True, selector={"matchLabels": {"app": "pi"}})
    obj["spec"]["template"]["metadata"] = {"labels": {"app": "pi"}}
    obj = created(obj)
    assert obj["spec"]["selector"] == {"matchLabels": {"app": "pi"}}
    assert obj["spec"]["template"]["metadata"]["labels"] == {"app": "pi"}
    assert causes(obj) == {}
    assert causes(created(job(manualSelector=True)))["spec.selector"] == "Required value"


@pytest.mark.parametrize(
    ("spec", "field", "message"),
    [
        ({"parallelism": -1}, "spec.parallelism", "Invalid value: -1: must be greater than or equal to 0"),
        ({"completions": -2}, "spec.completions", "Invalid value: -2: must be greater than or equal to 0"),
        ({"backoffLimit": -1}, "spec.backoffLimit", "Invalid value: -1: must be greater than or equal to 0"),
        ({"activeDeadlineSeconds": 0}, "spec.activeDeadlineSeconds", "Invalid value: 0: must be greater than 0"),
        ({"parallelism": 10**12}, "spec.parallelism", "must be less than or equal to 2147483647"),
        ({"backoffLimit": "six"}, "spec.backoffLimit", 'Invalid value: "six": must be an integer'),
        ({"completionMode": "Sometimes"}, "spec.completionMode", 'Unsupported value: "Sometimes"'),
        ({"completionMode": "Indexed", "parallelism": 2}, "spec.completions", "when completion mode is Indexed"),
        ({"completionMode": "Indexed", "completions": 100001}, "spec.completions", "less than or equal to 100000"),
        ({"podReplacementPolicy": "Never"}, "spec.podReplacementPolicy", 'Unsupported value: "Never"'),
        ({"suspend": "yes"}, "spec.suspend", "must be a boolean"),
        ({"backoffLimitPerIndex": 1}, "spec.completionMode", "must be Indexed"),
    ],
)
def test_a_malformed_job_spec_is_refused_with_kubes_field_path(spec: Obj, field: str, message: str) -> None:
    found = causes(created(job(**spec)))
    assert message in found.get(field, ""), found


@pytest.mark.parametrize("policy", ["Always", None])
def test_a_job_pod_must_end_so_restart_policy_always_is_refused(policy: str | None) -> None:
    obj = job()
    obj["spec"]["template"]["spec"]["restartPolicy"] = policy  # None: defaulted to Always, as kube does
    if policy is None:
        del obj["spec"]["template"]["spec"]["restartPolicy"]
    found = causes(created(obj))
    assert found["spec.template.spec.restartPolicy"] == (
        'Unsupported value: "Always": supported values: "OnFailure", "Never"'
    )


def test_a_selector_that_does_not_match_the_template_is_refused() -> None:
    obj = created(job(manualSelector=True, selector={"matchLabels": {"app": "other"}}))
    assert "`selector` does not match template `labels`" in causes(obj)["spec.template.metadata.labels"]


@pytest.mark.parametrize(
    ("change", "field"),
    [
        ({"selector": {"matchLabels": {"batch.kubernetes.io/controller-uid": "else"}}}, "spec.selector"),
        ({"completionMode": "Indexed"}, "spec.completionMode"),
        ({"completions": 3}, "spec.completions"),
    ],
)
def test_an_update_may_not_change_the_selector_mode_or_completions(change: Obj, field: str) -> None:
    old = created(job())
    new = copy.deepcopy(old)
    new["spec"].update(change)
    with pytest.raises(ApiError) as caught:
        _strategy().derive(_rtype(), old, new)
    assert caught.value.code == 422
    assert f"{field}: Invalid value" in str(caught.value.message)
    assert "field is immutable" in str(caught.value.message)


def test_the_template_is_immutable_but_parallelism_suspend_and_the_deadline_may_change() -> None:
    old = created(job())
    new = copy.deepcopy(old)
    new["spec"]["template"]["spec"]["containers"][0]["image"] = "busybox:2"
    with pytest.raises(ApiError, match=r"spec\.template"):
        _strategy().derive(_rtype(), old, new)
    fine = copy.deepcopy(old)
    fine["spec"].update(parallelism=4, suspend=True, activeDeadlineSeconds=30, ttlSecondsAfterFinished=5)
    _strategy().derive(_rtype(), old, fine)


def test_an_elastic_indexed_job_may_change_completions_with_parallelism() -> None:
    old = created(job(completionMode="Indexed", completions=3, parallelism=3))
    new = copy.deepcopy(old)
    new["spec"].update(completions=5, parallelism=5)
    _strategy().derive(_rtype(), old, new)


def test_a_cron_job_gets_kubes_defaults_and_passes() -> None:
    obj = created(cron_job())
    spec = obj["spec"]
    assert (spec["concurrencyPolicy"], spec["suspend"]) == ("Allow", False)
    assert (spec["successfulJobsHistoryLimit"], spec["failedJobsHistoryLimit"]) == (3, 1)
    assert spec["jobTemplate"]["spec"]["template"]["spec"]["dnsPolicy"] == "ClusterFirst"
    assert causes(obj) == {}
    assert causes(created(cron_job(schedule="@hourly", timeZone="Europe/Paris"))) == {}


@pytest.mark.parametrize(
    ("spec", "field", "message"),
    [
        ({"schedule": "61 * * * *"}, "spec.schedule", "minute value 61 out of range [0, 59]"),
        ({"schedule": "* * *"}, "spec.schedule", "expected exactly 5 fields"),
        ({"schedule": "CRON_TZ=UTC 0 * * * *"}, "spec.schedule", "cannot use TZ or CRON_TZ in schedule"),
        ({"schedule": "TZ=UTC 0 * * * *"}, "spec.schedule", "use timeZone field instead"),
        ({"schedule": ""}, "spec.schedule", "Required value"),
        ({"timeZone": "Mars/Olympus"}, "spec.timeZone", "unknown time zone Mars/Olympus"),
        ({"timeZone": "Local"}, "spec.timeZone", "unknown time zone Local"),
        ({"concurrencyPolicy": "Sometimes"}, "spec.concurrencyPolicy", 'Unsupported value: "Sometimes"'),
        ({"startingDeadlineSeconds": -5}, "spec.startingDeadlineSeconds", "greater than or equal to 0"),
        ({"successfulJobsHistoryLimit": 10**11}, "spec.successfulJobsHistoryLimit", "less than or equal to"),
        ({"failedJobsHistoryLimit": -1}, "spec.failedJobsHistoryLimit", "greater than or equal to 0"),
    ],
)
def test_a_malformed_cron_job_is_refused_with_kubes_field_path(spec: Obj, field: str, message: str) -> None:
    found = causes(created(cron_job(**spec)))
    assert message in found.get(field, ""), found


def test_a_cron_jobs_template_is_checked_as_a_job_without_a_selector() -> None:
    obj = cron_job()
    obj["spec"]["jobTemplate"]["spec"].update(backoffLimit=-1, selector={"matchLabels": {"a": "b"}})
    obj["spec"]["jobTemplate"]["spec"]["template"]["spec"]["restartPolicy"] = "Always"
    found = causes(created(obj))
    assert "greater than or equal to 0" in found["spec.jobTemplate.spec.backoffLimit"]
    assert "`selector` will be auto-generated" in found["spec.jobTemplate.spec.selector"]
    assert 'supported values: "OnFailure", "Never"' in found["spec.jobTemplate.spec.template.spec.restartPolicy"]
    long = cron_job()
    long["metadata"]["name"] = "n" * 53
    assert "must be no more than 52 characters" in causes(created(long))["metadata.name"]


def test_the_job_row_shows_status_completions_and_duration() -> None:
    printer = PRINTERS[("batch", "Job")]
    assert [c.name for c in printer.columns][:5] == ["Name", "Status", "Completions", "Duration", "Age"]
    obj = created(job(completions=3))
    obj["metadata"]["creationTimestamp"] = "2026-01-01T00:00:00Z"
    obj["status"] = {"startTime": "2026-01-01T00:00:00Z", "succeeded": 1}
    assert printer.cells(obj, 1767225690.0)[:5] == ["pi", "Running", "1/3", "90s", "90s"]
    obj["status"].update(
        succeeded=3,
        completionTime="2026-01-01T00:00:42Z",
        conditions=[
            {"type": "SuccessCriteriaMet", "status": "True"},
            {"type": "Complete", "status": "True"},
        ],
    )
    assert printer.cells(obj, 1767229200.0)[1:4] == ["Complete", "3/3", "42s"]
    queue = created(job(parallelism=4))
    assert printer.cells(queue, 0.0)[1:4] == ["Running", "0/1 of 4", ""]
    failing = created(job())
    failing["status"] = {"conditions": [{"type": "FailureTarget", "status": "True"}]}
    assert printer.cells(failing, 0.0)[1] == "FailureTarget"
    failing["metadata"]["deletionTimestamp"] = "2026-01-01T00:00:00Z"
    assert printer.cells(failing, 0.0)[1] == "Terminating"


def test_the_cron_job_row_shows_schedule_zone_suspend_active_and_last_schedule() -> None:
    printer = PRINTERS[("batch", "CronJob")]
    assert [c.name for c in printer.columns][:7] == [
        "Name",
        "Schedule",
        "Timezone",
        "Suspend",
        "Active",
        "Last Schedule",
        "Age",
    ]
    obj = created(cron_job())
    assert printer.cells(obj, 0.0)[:6] == ["nightly", "*/5 * * * *", "<none>", "False", 0, "<none>"]
    obj["spec"].update(timeZone="UTC", suspend=True)
    obj["status"] = {"active": [{"name": "nightly-1"}], "lastScheduleTime": "2026-01-01T00:00:00Z"}
    assert printer.cells(obj, 1767225900.0)[2:6] == ["UTC", "True", 1, "5m"]


JSON = st.recursive(
    st.none() | st.booleans() | st.integers(-3, 2**40) | st.text(max_size=12),
    lambda inner: st.lists(inner, max_size=3) | st.dictionaries(st.text(max_size=8), inner, max_size=3),
    max_leaves=12,
)
JOB_KEYS = (
    "parallelism",
    "completions",
    "backoffLimit",
    "activeDeadlineSeconds",
    "completionMode",
    "suspend",
    "manualSelector",
    "selector",
    "template",
    "ttlSecondsAfterFinished",
    "podReplacementPolicy",
    "backoffLimitPerIndex",
)
CRON_KEYS = (
    "schedule",
    "timeZone",
    "concurrencyPolicy",
    "startingDeadlineSeconds",
    "suspend",
    "jobTemplate",
    "successfulJobsHistoryLimit",
    "failedJobsHistoryLimit",
)


@settings(max_examples=300)
@given(values=st.dictionaries(st.sampled_from(JOB_KEYS), JSON, max_size=5))
def test_no_job_spec_makes_defaults_validation_or_the_update_rule_raise(values: Obj) -> None:
    obj = job(**values)
    apply_defaults("batch", "Job", obj)
    try:
        _strategy().derive(_rtype(), None, obj)
        validate_object("Job", "batch", obj)
        _strategy().derive(_rtype(), created(job()), obj)
    except ApiError as refused:
        assert refused.code == 422


@settings(max_examples=300)
@given(values=st.dictionaries(st.sampled_from(CRON_KEYS), JSON, max_size=5))
def test_no_cron_job_spec_makes_defaults_or_validation_raise(values: Obj) -> None:
    obj = cron_job(**values)
    apply_defaults("batch", "CronJob", obj)
    validate_object("CronJob", "batch", obj)
