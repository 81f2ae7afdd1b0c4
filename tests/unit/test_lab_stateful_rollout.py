"""A StatefulSet's pod decisions and status (ambit.lab.controllers.stateful_rollout): the rules of its docstring
as table tests, and properties over any spec and pods."""

from __future__ import annotations

from typing import Any

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from ambit.lab.controllers.ownership import claim, owner_reference
from ambit.lab.controllers.pods import rfc3339
from ambit.lab.controllers.stateful_rollout import (
    Plan,
    Revisions,
    new_pod,
    next_check,
    ordinal_of,
    plan,
    status,
)

NOW = 1_800_000_000.0
NS = "default"
Obj = dict[str, Any]
OLD, NEW = "web-old", "web-new"
REVS = Revisions(
    current=OLD,
    update=NEW,
    current_template={"metadata": {"labels": {"app": "web"}}, "spec": {"containers": [{"name": "c", "image": "v1"}]}},
    update_template={"metadata": {"labels": {"app": "web"}}, "spec": {"containers": [{"name": "c", "image": "v2"}]}},
)
SAME = Revisions(NEW, NEW, REVS.update_template, REVS.update_template)


def sts(replicas: int = 3, **spec: Any) -> Obj:
    return {
        "apiVersion": "apps/v1",
        "kind": "StatefulSet",
        "metadata": {"name": "web", "namespace": NS, "uid": "uid-web", "generation": 4},
        "spec": {"replicas": replicas, "serviceName": "web", **spec},
    }


def pod(
    ordinal: int,
    *,
    ready: bool = True,
    phase: str = "Running",
    revision: str = NEW,
    deleting: bool = False,
    ready_since: float = NOW - 3600,
    labels: bool = True,
) -> Obj:
    name = f"web-{ordinal}"
    meta: Obj = {"name": name, "namespace": NS, "labels": {"app": "web", "controller-revision-hash": revision}}
    if labels:
        meta["labels"].update(
            {"statefulset.kubernetes.io/pod-name": name, "apps.kubernetes.io/pod-index": str(ordinal)}
        )
    if deleting:
        meta["deletionTimestamp"] = rfc3339(NOW)
    condition = {"type": "Ready", "status": "True" if ready else "False", "lastTransitionTime": rfc3339(ready_since)}
    return {"metadata": meta, "status": {"phase": phase, "conditions": [condition]}}


def names(pods: list[Obj]) -> list[str]:
    return [p["metadata"]["name"] for p in pods]


def shown(result: Plan) -> tuple[list[str], list[str]]:
    return names(result.create), names(result.delete)


@pytest.mark.parametrize(
    ("name", "ordinal"),
    [
        ("web-0", 0),
        ("web-12", 12),
        ("web-01", None),
        ("web-", None),
        ("web", None),
        ("webx-1", None),
        ("web-a-1", None),
    ],
)
def test_only_pods_named_set_dash_ordinal_are_members(name: str, ordinal: int | None) -> None:
    assert ordinal_of("web", {"metadata": {"name": name}}) == ordinal


def test_a_set_adopts_and_keeps_only_selected_pods_named_as_its_members() -> None:
    owned_member = pod(0)
    owned_member["metadata"]["ownerReferences"] = [owner_reference(sts())]
    owned_stranger = {
        "metadata": {"name": "web-x", "labels": {"app": "web"}, "ownerReferences": [owner_reference(sts())]}
    }
    orphan_member, orphan_stranger = pod(1), {"metadata": {"name": "other-1", "labels": {"app": "web"}}}
    result = claim(
        sts(),
        [owned_member, owned_stranger, orphan_member, orphan_stranger],
        lambda labels: labels.get("app") == "web",
        lambda p: ordinal_of("web", p) is not None,
    )
    assert (names(result.owned), names(result.adopt), names(result.release)) == (["web-0"], ["web-1"], ["web-x"])


def test_ordered_ready_makes_one_pod_at_a_time_and_waits_for_each_to_be_ready() -> None:
    assert shown(plan(sts(), [], SAME, NOW)) == (["web-0"], [])
    waiting = plan(sts(), [pod(0, ready=False)], SAME, NOW)
    assert shown(waiting) == ([], []) and waiting.waiting_for == "web-0"
    assert shown(plan(sts(), [pod(0, phase="Pending", ready=False)], SAME, NOW)) == ([], [])
    assert shown(plan(sts(), [pod(0)], SAME, NOW)) == (["web-1"], [])
    assert shown(plan(sts(), [pod(0), pod(1)], SAME, NOW)) == (["web-2"], [])
    assert shown(plan(sts(), [pod(0), pod(1), pod(2)], SAME, NOW)) == ([], [])


def test_ordered_ready_waits_for_min_ready_seconds_and_says_when_to_look_again() -> None:
    fresh = pod(0, ready_since=NOW - 4)
    assert shown(plan(sts(minReadySeconds=10), [fresh], SAME, NOW)) == ([], [])
    assert next_check(sts(minReadySeconds=10), [fresh], NOW) == pytest.approx(6)
    assert shown(plan(sts(minReadySeconds=10), [fresh], SAME, NOW + 6)) == (["web-1"], [])


def test_parallel_makes_and_removes_every_pod_at_once() -> None:
    assert shown(plan(sts(podManagementPolicy="Parallel"), [], SAME, NOW)) == (["web-0", "web-1", "web-2"], [])
    some = [pod(0, ready=False), pod(3, ready=False), pod(4)]
    assert shown(plan(sts(podManagementPolicy="Parallel"), some, SAME, NOW)) == (["web-1", "web-2"], ["web-4", "web-3"])


def test_ordinals_start_where_the_set_says() -> None:
    result = plan(sts(replicas=2, ordinals={"start": 5}, podManagementPolicy="Parallel"), [pod(0)], SAME, NOW)
    assert shown(result) == (["web-5", "web-6"], ["web-0"])


def test_scaling_down_removes_the_highest_ordinal_first_one_at_a_time_once_the_rest_are_healthy() -> None:
    healthy = [pod(i) for i in range(4)]
    assert shown(plan(sts(replicas=1), healthy, SAME, NOW)) == ([], ["web-3"])
    terminating = [*healthy[:3], pod(3, deleting=True)]
    assert shown(plan(sts(replicas=1), terminating, SAME, NOW)) == ([], [])
    unready_kept = [pod(0, ready=False), *healthy[1:]]
    assert shown(plan(sts(replicas=1), unready_kept, SAME, NOW)) == ([], [])


def test_the_first_unhealthy_condemned_pod_may_go_but_not_one_below_it() -> None:
    pods = [pod(0), pod(1, ready=False), pod(2, ready=False)]
    assert shown(plan(sts(replicas=1), pods, SAME, NOW)) == ([], ["web-2"])
    pods = [pod(0), pod(1, ready=False), pod(2)]
    assert shown(plan(sts(replicas=1), pods, SAME, NOW)) == ([], ["web-2"])
    assert shown(plan(sts(replicas=1), pods[:2], SAME, NOW)) == ([], ["web-1"])


def test_a_failed_or_succeeded_pod_is_deleted_to_be_made_again() -> None:
    for phase in ("Failed", "Succeeded"):
        result = plan(sts(), [pod(0), pod(1, phase=phase, ready=False), pod(2)], SAME, NOW)
        assert shown(result) == ([], ["web-1"])
    gone = plan(sts(), [pod(0), pod(2)], SAME, NOW)
    assert shown(gone) == (["web-1"], [])
    assert gone.create[0]["metadata"]["labels"]["controller-revision-hash"] == NEW


def test_a_rolling_update_goes_from_the_highest_ordinal_down_one_ready_pod_at_a_time() -> None:
    old = [pod(i, revision=OLD) for i in range(3)]
    assert shown(plan(sts(), old, REVS, NOW)) == ([], ["web-2"])
    assert shown(plan(sts(), old[:2], REVS, NOW)) == (["web-2"], [])
    recreated = plan(sts(), old[:2], REVS, NOW).create[0]
    assert recreated["spec"]["containers"][0]["image"] == "v2"
    unready_new = [*old[:2], pod(2, ready=False)]
    assert shown(plan(sts(), unready_new, REVS, NOW)) == ([], [])
    assert shown(plan(sts(), [*old[:2], pod(2)], REVS, NOW)) == ([], ["web-1"])
    assert shown(plan(sts(), [old[0], pod(1), pod(2)], REVS, NOW)) == ([], ["web-0"])
    assert shown(plan(sts(), [pod(0), pod(1), pod(2)], REVS, NOW)) == ([], [])


def test_a_partition_stops_the_update_and_keeps_new_lower_pods_on_the_current_revision() -> None:
    strategy = {"type": "RollingUpdate", "rollingUpdate": {"partition": 2}}
    old = [pod(i, revision=OLD) for i in range(3)]
    assert shown(plan(sts(updateStrategy=strategy), old, REVS, NOW)) == ([], ["web-2"])
    assert shown(plan(sts(updateStrategy=strategy), [*old[:2], pod(2)], REVS, NOW)) == ([], [])
    [again] = plan(sts(updateStrategy=strategy), [old[1], pod(2)], REVS, NOW).create
    assert again["metadata"]["labels"]["controller-revision-hash"] == OLD
    assert again["spec"]["containers"][0]["image"] == "v1"
    beyond = {"type": "RollingUpdate", "rollingUpdate": {"partition": 7}}
    assert shown(plan(sts(updateStrategy=beyond), old, REVS, NOW)) == ([], [])


def test_on_delete_replaces_nothing_and_makes_deleted_pods_from_the_update_revision() -> None:
    old = [pod(i, revision=OLD) for i in range(3)]
    assert shown(plan(sts(updateStrategy={"type": "OnDelete"}), old, REVS, NOW)) == ([], [])
    [made] = plan(sts(updateStrategy={"type": "OnDelete"}), [old[0], old[2]], REVS, NOW).create
    assert made["metadata"]["labels"]["controller-revision-hash"] == NEW


def test_a_member_missing_its_identity_labels_gets_them() -> None:
    result = plan(sts(), [pod(0, labels=False)], SAME, NOW)
    [(target, labels)] = result.relabel
    assert target["metadata"]["name"] == "web-0"
    assert labels["statefulset.kubernetes.io/pod-name"] == "web-0"
    assert labels["apps.kubernetes.io/pod-index"] == "0"
    assert labels["app"] == "web"


def test_a_new_pod_has_the_stable_identity_and_its_members_claims() -> None:
    template = {
        "metadata": {"labels": {"app": "web"}, "annotations": {"a": "b"}},
        "spec": {
            "containers": [{"name": "c", "image": "v1"}],
            "volumes": [{"name": "data", "configMap": {"name": "x"}}, {"name": "conf", "configMap": {"name": "y"}}],
        },
    }
    claims = [{"metadata": {"name": "data"}}, {"metadata": {"name": "logs"}}, {"spec": {}}]
    made = new_pod(sts(volumeClaimTemplates=claims), 2, "web-abc", template)
    assert made["metadata"] == {
        "name": "web-2",
        "namespace": NS,
        "labels": {
            "app": "web",
            "controller-revision-hash": "web-abc",
            "statefulset.kubernetes.io/pod-name": "web-2",
            "apps.kubernetes.io/pod-index": "2",
        },
        "annotations": {"a": "b"},
        "ownerReferences": [
            {
                "apiVersion": "apps/v1",
                "kind": "StatefulSet",
                "name": "web",
                "uid": "uid-web",
                "controller": True,
                "blockOwnerDeletion": True,
            }
        ],
    }
    assert (made["spec"]["hostname"], made["spec"]["subdomain"]) == ("web-2", "web")
    assert made["spec"]["volumes"] == [
        {"name": "data", "persistentVolumeClaim": {"claimName": "data-web-2"}},
        {"name": "logs", "persistentVolumeClaim": {"claimName": "logs-web-2"}},
        {"name": "conf", "configMap": {"name": "y"}},
    ]
    assert template["spec"]["volumes"][0] == {"name": "data", "configMap": {"name": "x"}}
    without_service = new_pod(sts(serviceName=""), 0, "web-abc", template)
    assert "subdomain" not in without_service["spec"]


def test_status_counts_members_and_completes_the_rollout_once_all_are_updated_and_ready() -> None:
    pods = [pod(0, revision=OLD), pod(1, revision=OLD, ready=False), pod(2), pod(3, deleting=True)]
    assert status(sts(replicas=3), pods, REVS, NOW) == {
        "observedGeneration": 4,
        "replicas": 4,
        "readyReplicas": 3,
        "currentReplicas": 2,
        "updatedReplicas": 1,
        "availableReplicas": 3,
        "currentRevision": OLD,
        "updateRevision": NEW,
    }
    done = status(sts(replicas=3), [pod(0), pod(1), pod(2)], REVS, NOW)
    assert (done["currentRevision"], done["currentReplicas"], done["updatedReplicas"]) == (NEW, 3, 3)
    fresh = status(sts(replicas=1, minReadySeconds=60), [pod(0, ready_since=NOW - 5)], SAME, NOW)
    assert (fresh["readyReplicas"], fresh["availableReplicas"]) == (1, 0)
    empty = status(sts(replicas=0), [], REVS, NOW)
    assert (empty["replicas"], empty["currentRevision"]) == (0, NEW)


# ---- properties ----------------------------------------------------------------------------------------------

JSON = st.recursive(
    st.none() | st.booleans() | st.integers(-3, 8) | st.text(max_size=6),
    lambda inner: st.lists(inner, max_size=3) | st.dictionaries(st.text(max_size=6), inner, max_size=3),
    max_leaves=10,
)
SPEC_FIELDS = st.fixed_dictionaries(
    {},
    optional={
        "replicas": st.integers(-1, 6) | JSON,
        "podManagementPolicy": st.sampled_from(["OrderedReady", "Parallel"]) | JSON,
        "updateStrategy": st.fixed_dictionaries(
            {"type": st.sampled_from(["RollingUpdate", "OnDelete"]) | JSON},
            optional={"rollingUpdate": st.fixed_dictionaries({}, optional={"partition": st.integers(-1, 6) | JSON})},
        )
        | JSON,
        "ordinals": st.fixed_dictionaries({}, optional={"start": st.integers(-1, 3) | JSON}) | JSON,
        "minReadySeconds": st.integers(-1, 20) | JSON,
        "serviceName": st.text(max_size=5) | JSON,
        "volumeClaimTemplates": st.lists(st.fixed_dictionaries({"metadata": st.dictionaries(st.just("name"), JSON)}))
        | JSON,
    },
)
PODS = st.lists(
    st.builds(
        pod,
        st.integers(0, 7),
        ready=st.booleans(),
        phase=st.sampled_from(["Pending", "Running", "Failed", "Succeeded"]),
        revision=st.sampled_from([OLD, NEW]),
        deleting=st.booleans(),
        ready_since=st.floats(NOW - 30, NOW),
        labels=st.booleans(),
    ),
    max_size=8,
).map(lambda pods: list({p["metadata"]["name"]: p for p in pods}.values()))


@settings(max_examples=300)
@given(fields=SPEC_FIELDS, pods=PODS)
def test_any_spec_and_pods_give_a_plan_that_keeps_the_ordering_rules(fields: Obj, pods: list[Obj]) -> None:
    stateful = sts(**fields)
    stateful["spec"].setdefault("replicas", 3)
    result = plan(stateful, pods, REVS, NOW)
    status(stateful, pods, REVS, NOW)
    existing = set(names(pods))
    made = names(result.create)
    assert not set(made) & existing, "a pod is made only under a free name"
    assert set(names(result.delete)) <= existing
    assert all(ordinal_of("web", p) is not None for p in result.create)
    parallel = isinstance(stateful["spec"].get("podManagementPolicy"), str) and (
        stateful["spec"]["podManagementPolicy"] == "Parallel"
    )
    if not parallel:
        assert len(result.create) + len(result.delete) <= 1, "OrderedReady changes one pod at a time"
