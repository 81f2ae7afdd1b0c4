"""A PodDisruptionBudget's status (ambit.lab.controllers.budgets), on the cases of kube-controller-manager's
disruption controller tests (``pkg/controller/disruption/disruption_test.go``: TestNoSelector, TestUnavailable,
TestIntegerMaxUnavailable, TestNakedPod, TestReplicaSet, TestTwoControllers, TestUpdateDisruptedPods, ...),
written from their semantics."""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

import pytest
from hypothesis import given
from hypothesis import strategies as st

from ambit.lab.controllers.budgets import (
    BudgetError,
    compute,
    failed_status,
    new_status,
    scaled_value,
)
from ambit.lab.controllers.pods import rfc3339
from ambit.model.disruption import DELETION_TIMEOUT

NOW = 1_800_000_000.0
NS = "default"
Obj = dict[str, Any]


def budget(generation: int = 1, status: Obj | None = None, selector: Any = ..., **spec: Any) -> Obj:
    body: Obj = {"metadata": {"name": "pdb", "namespace": NS, "generation": generation}, "spec": dict(spec)}
    body["spec"]["selector"] = {"matchLabels": {"app": "web"}} if selector is ... else selector
    if status is not None:
        body["status"] = status
    return body


def reference(owner: Obj) -> Obj:
    return {"apiVersion": "apps/v1", "controller": True, **owner}


def pod(name: str, ready: bool = True, owner: Obj | None = None, deleting: bool = False) -> Obj:
    meta: Obj = {"name": name, "namespace": NS, "labels": {"app": "web"}}
    if owner is not None:
        meta["ownerReferences"] = [
            {
                "apiVersion": "apps/v1",
                "kind": owner["kind"],
                "name": owner["name"],
                "uid": owner["uid"],
                "controller": True,
            }
        ]
    if deleting:
        meta["deletionTimestamp"] = rfc3339(NOW)
    cond = {"type": "Ready", "status": "True" if ready else "False"}
    return {"metadata": meta, "status": {"phase": "Running", "conditions": [cond]}}


class Cache:
    """ReplicaSets, Deployments and StatefulSets by (kind, namespace, name), as the informers hold them."""

    def __init__(self) -> None:
        self.objects: dict[tuple[str, str, str], Obj] = {}

    def add(self, kind: str, name: str, replicas: int, owner: Obj | None = None) -> Obj:
        meta: Obj = {"name": name, "namespace": NS, "uid": f"uid-{kind}-{name}"}
        if owner is not None:
            meta["ownerReferences"] = [
                {
                    "apiVersion": "apps/v1",
                    "kind": owner["kind"],
                    "name": owner["name"],
                    "uid": owner["uid"],
                    "controller": True,
                }
            ]
        self.objects[(kind, NS, name)] = {"metadata": meta, "spec": {"replicas": replicas}}
        return {"kind": kind, "name": name, "uid": meta["uid"]}

    def find(self, kind: str, namespace: str, name: str) -> Mapping[str, Any] | None:
        return self.objects.get((kind, namespace, name))


def counts(b: Obj, pods: list[Obj], cache: Cache | None = None) -> tuple[int, int, int, int]:
    """(disruptionsAllowed, currentHealthy, desiredHealthy, expectedPods), the order of kube's VerifyPdbStatus."""
    r = compute(b, pods, (cache or Cache()).find, NOW)
    return r.allowed, r.current, r.desired, r.expected


def test_no_pods_allow_no_disruption_and_the_first_pods_count_once_seen() -> None:
    b = budget(minAvailable=3)
    assert counts(b, []) == (0, 0, 3, 0)
    assert counts(b, [pod("p0")]) == (0, 1, 3, 1)


def test_an_integer_min_available_counts_selected_pods_and_healthy_ones() -> None:
    b = budget(minAvailable=3)
    pods = [pod(f"p{i}") for i in range(4)]
    assert counts(b, pods) == (1, 4, 3, 4)
    pods[0] = pod("p0", ready=False)
    assert counts(b, pods) == (0, 3, 3, 4)
    pods[1] = pod("p1", deleting=True)
    assert counts(b, pods) == (0, 2, 3, 4)


def test_an_integer_max_unavailable_is_taken_from_the_controllers_scale() -> None:
    cache = Cache()
    rs = cache.add("ReplicaSet", "web", 3)
    b = budget(maxUnavailable=1)
    assert counts(b, [pod(f"p{i}", owner=rs) for i in range(3)], cache) == (1, 3, 2, 3)
    assert counts(b, [pod(f"p{i}", owner=rs) for i in range(2)], cache) == (0, 2, 2, 3)


def test_a_max_unavailable_above_the_scale_desires_no_healthy_pod() -> None:
    cache = Cache()
    rs = cache.add("ReplicaSet", "web", 2)
    assert counts(budget(maxUnavailable=5), [pod("p0", owner=rs)], cache) == (1, 1, 0, 2)


def test_a_percentage_is_of_the_replica_sets_scale_rounded_up() -> None:
    cache = Cache()
    rs = cache.add("ReplicaSet", "web", 10)
    assert counts(budget(minAvailable="20%"), [pod("p0", owner=rs)], cache) == (0, 1, 2, 10)
    pods = [pod(f"p{i}", owner=rs) for i in range(3)]
    assert counts(budget(minAvailable="21%"), pods, cache) == (0, 3, 3, 10)
    assert counts(budget(maxUnavailable="15%"), pods, cache) == (0, 3, 8, 10)


def test_pods_of_a_deployment_are_counted_against_the_deployments_scale_once() -> None:
    cache = Cache()
    deployment = cache.add("Deployment", "web", 4)
    old = cache.add("ReplicaSet", "web-1", 1, owner=deployment)
    new = cache.add("ReplicaSet", "web-2", 3, owner=deployment)
    pods = [pod("a", owner=old), pod("b", owner=new), pod("c", owner=new), pod("d", owner=new)]
    assert counts(budget(minAvailable="50%"), pods, cache) == (2, 4, 2, 4)


def test_two_controllers_add_their_scales() -> None:
    cache = Cache()
    one, two = cache.add("ReplicaSet", "one", 11), cache.add("ReplicaSet", "two", 11)
    pods = [pod(f"a{i}", owner=one) for i in range(11)] + [pod(f"b{i}", owner=two) for i in range(11)]
    assert counts(budget(minAvailable="28%"), pods, cache) == (15, 22, 7, 22)


def test_a_naked_pod_is_unmanaged_and_a_percentage_budget_over_it_allows_nothing() -> None:
    result = compute(budget(minAvailable="28%"), [pod("naked")], Cache().find, NOW)
    assert (result.allowed, result.current, result.desired, result.expected) == (0, 1, 0, 0)
    assert result.unmanaged == ("naked",)


def owned_by(name: str, api_version: str, kind: str, owner: str, uid: str) -> Obj:
    body = pod(name)
    ref = {"apiVersion": api_version, "kind": kind, "name": owner, "uid": uid, "controller": True}
    body["metadata"]["ownerReferences"] = [ref]
    return body


@pytest.mark.parametrize(
    ("api_version", "kind", "why"),
    [
        ("apps/v1", "DaemonSet", "daemonsets.apps does not implement the scale subresource"),
        ("v1", "ReplicationController", 'no matches for kind "ReplicationController" in version "v1"'),
        ("example.com/v1", "Widget", 'no matches for kind "Widget" in version "example.com/v1"'),
    ],
)
def test_a_controller_the_lab_cannot_scale_fails_the_sync_with_kubes_reason(
    api_version: str, kind: str, why: str
) -> None:
    pods = [owned_by("p0", api_version, kind, "owner", "uid-owner")]
    for spec in ({"maxUnavailable": 1}, {"minAvailable": "50%"}):
        with pytest.raises(BudgetError) as caught:
            compute(budget(**spec), pods, Cache().find, NOW)
        assert str(caught.value) == why
    # An integer minAvailable needs no scale: the same pods are counted.
    assert counts(budget(minAvailable=1), pods) == (0, 1, 1, 1)


def test_a_stateful_sets_pods_are_counted_against_its_scale() -> None:
    cache = Cache()
    db = cache.add("StatefulSet", "db", 3)
    pods = [pod(f"db-{i}", owner=db, ready=i < 2) for i in range(3)]
    # maxUnavailable 1 of a scale of 3: 2 must stay healthy, and 2 are.
    assert counts(budget(maxUnavailable=1), pods, cache) == (0, 2, 2, 3)
    missing = owned_by("db-9", "apps/v1", "StatefulSet", "gone", "uid-gone")
    with pytest.raises(BudgetError, match=r'^found no controllers for pod "db-9"$'):
        compute(budget(maxUnavailable=1), [missing], cache.find, NOW)


def test_a_controller_of_a_scaled_kind_that_is_missing_or_another_object_fails_the_sync() -> None:
    cache = Cache()
    cache.add("ReplicaSet", "web", 3)
    missing = owned_by("p0", "apps/v1", "ReplicaSet", "gone", "uid-gone")
    recreated = owned_by("p1", "apps/v1", "ReplicaSet", "web", "uid-of-the-deleted-web")
    for stray in (missing, recreated):
        name = stray["metadata"]["name"]
        with pytest.raises(BudgetError, match=f'^found no controllers for pod "{name}"$'):
            compute(budget(minAvailable="50%"), [stray], cache.find, NOW)


def test_the_scale_table_finds_replica_sets_of_both_groups_and_pods_a_deployment_controls_itself() -> None:
    cache = Cache()
    rs = cache.add("ReplicaSet", "old", 4)
    deployment = cache.add("Deployment", "web", 6)
    pods = [
        owned_by("a", "extensions/v1beta1", "ReplicaSet", "old", rs["uid"]),
        owned_by("b", "apps/v1", "Deployment", "web", deployment["uid"]),
    ]
    assert counts(budget(maxUnavailable=0), pods, cache) == (0, 2, 10, 10)


def test_disrupted_pods_stay_unhealthy_until_deleted_or_expired_then_are_dropped() -> None:
    fresh, old = rfc3339(NOW - 10), rfc3339(NOW - DELETION_TIMEOUT - 1)
    disrupted = {"p1": fresh, "p2": fresh, "p3": old, "gone": fresh}
    pods = [pod("p0"), pod("p1"), pod("p2", deleting=True), pod("p3")]
    result = compute(budget(minAvailable=1, status={"disruptedPods": disrupted}), pods, Cache().find, NOW)
    assert result.disrupted == {"p1": fresh}
    assert (result.current, result.allowed) == (2, 1)
    assert result.recheck_at == pytest.approx(NOW - 10 + DELETION_TIMEOUT, abs=1)


def test_a_missing_selector_selects_nothing_and_a_malformed_one_fails() -> None:
    from ambit.model.disruption import controller_selector

    assert controller_selector(budget(selector=None, minAvailable=1)) is None
    everything = controller_selector(budget(selector={}, minAvailable=1))
    assert everything is not None and everything.matches({"any": "pod"})
    with pytest.raises(ValueError):
        controller_selector(budget(selector={"matchExpressions": [{"key": "a", "operator": "Near"}]}))


def test_the_status_is_written_only_when_something_changes_and_carries_the_condition() -> None:
    b = budget(generation=2, minAvailable=1)
    status = new_status(b, compute(b, [pod("p0"), pod("p1")], Cache().find, NOW), rfc3339(NOW))
    assert status is not None
    assert (status["disruptionsAllowed"], status["observedGeneration"]) == (1, 2)
    cond = status["conditions"][0]
    assert (cond["type"], cond["status"], cond["reason"]) == ("DisruptionAllowed", "True", "SufficientPods")
    b["status"] = status
    assert new_status(b, compute(b, [pod("p0"), pod("p1")], Cache().find, NOW), rfc3339(NOW + 5)) is None
    later = new_status(b, compute(b, [pod("p0")], Cache().find, NOW), rfc3339(NOW + 5))
    assert later is not None
    cond = later["conditions"][0]
    assert (cond["status"], cond["reason"], cond["lastTransitionTime"]) == (
        "False",
        "InsufficientPods",
        rfc3339(NOW + 5),
    )


def test_a_failed_sync_allows_no_disruption_and_says_why() -> None:
    b = budget(status={"disruptionsAllowed": 3, "currentHealthy": 4, "observedGeneration": 1}, minAvailable="x")
    status = failed_status(b, "invalid value", rfc3339(NOW))
    assert (status["disruptionsAllowed"], status["currentHealthy"]) == (0, 4)
    cond = status["conditions"][0]
    assert (cond["status"], cond["reason"], cond["message"]) == ("False", "SyncFailed", "invalid value")


@pytest.mark.parametrize(
    ("value", "total", "expected"),
    [(3, 10, 3), ("20%", 10, 2), ("21%", 10, 3), ("0%", 7, 0), ("100%", 7, 7), ("1%", 1, 1), ("50%", 0, 0)],
)
def test_scaled_values_round_percentages_up(value: Any, total: int, expected: int) -> None:
    assert scaled_value(value, total) == expected


@given(st.text(max_size=12), st.integers(min_value=0, max_value=10_000))
def test_scaled_value_of_any_string_is_a_count_or_a_budget_error(value: str, total: int) -> None:
    try:
        result = scaled_value(value, total)
    except BudgetError:
        return
    assert isinstance(result, int)
