"""The eviction subresource's decisions (ambit.apiserver.eviction): the body, which pods skip budgets, charging a
budget, as kube-apiserver's EvictionREST decides them."""

from __future__ import annotations

from typing import Any

import pytest
from hypothesis import given
from hypothesis import strategies as st

from ambit.apiserver.errors import ApiError
from ambit.apiserver.eviction import (
    VIOLATION,
    charge,
    enforces_resource_version,
    ignores_budgets,
    parse_eviction,
    passes_unready,
)
from ambit.model.disruption import MAX_DISRUPTED_PODS, covers

NOW = "2026-12-04T16:00:00Z"


def eviction(**extra: Any) -> dict[str, Any]:
    return {"apiVersion": "policy/v1", "kind": "Eviction", "metadata": {"name": "web", "namespace": "apps"}, **extra}


def pod(phase: str = "Running", ready: bool = True, deleting: bool = False, labels: Any = None) -> dict[str, Any]:
    meta: dict[str, Any] = {"name": "web", "namespace": "apps", "labels": {"app": "web"} if labels is None else labels}
    if deleting:
        meta["deletionTimestamp"] = NOW
    cond = {"type": "Ready", "status": "True" if ready else "False"}
    return {"metadata": meta, "status": {"phase": phase, "conditions": [cond]}}


def budget(allowed: int, generation: int = 1, observed: int = 1, **status: Any) -> dict[str, Any]:
    return {
        "metadata": {"name": "pdb", "namespace": "apps", "generation": generation},
        "spec": {"selector": {"matchLabels": {"app": "web"}}},
        "status": {"disruptionsAllowed": allowed, "observedGeneration": observed, **status},
    }


def test_an_eviction_body_gives_the_pods_delete_options() -> None:
    options = {"gracePeriodSeconds": 7, "preconditions": {"uid": "u1", "resourceVersion": "9"}}
    parsed = parse_eviction(eviction(deleteOptions=options), "apps", "web", False)
    assert (parsed.options.grace_period, parsed.options.precondition_uid, parsed.options.precondition_rv) == (
        7,
        "u1",
        "9",
    )
    assert parse_eviction(eviction(apiVersion="policy/v1beta1"), "apps", "web", True).options.dry_run
    assert parse_eviction({"metadata": {"name": "web"}}, "apps", "web", False).name == "web"


@pytest.mark.parametrize(
    ("body", "message"),
    [
        ({"apiVersion": "v1", "kind": "Pod", "metadata": {"name": "web"}}, "must be of type Eviction"),
        (eviction(kind="Binding"), "must be of type Eviction"),
        (eviction(metadata={"name": "web", "namespace": "kube-system"}), "does not match the namespace"),
        (eviction(metadata={"name": "other"}), "name in URL does not match"),
        (eviction(metadata="web"), "metadata must be an object"),
        (eviction(deleteOptions=[1]), "deleteOptions must be an object"),
        (eviction(deleteOptions={"propagationPolicy": "Now"}), "unknown propagationPolicy"),
        ("web", "not an Eviction object"),
    ],
)
def test_bodies_that_are_not_an_eviction_of_the_urls_pod_are_400(body: Any, message: str) -> None:
    with pytest.raises(ApiError) as caught:
        parse_eviction(body, "apps", "web", False)
    assert caught.value.code == 400 and message in caught.value.message


json_values = st.recursive(
    st.none() | st.booleans() | st.integers() | st.text(max_size=8),
    lambda inner: st.lists(inner, max_size=3) | st.dictionaries(st.text(max_size=8), inner, max_size=3),
    max_leaves=12,
)


@given(json_values)
def test_any_json_body_is_an_eviction_or_a_400(body: Any) -> None:
    try:
        parse_eviction(body, "apps", "web", False)
    except ApiError as exc:
        assert exc.code == 400


@given(st.dictionaries(st.sampled_from(["apiVersion", "kind", "metadata", "deleteOptions"]), json_values))
def test_any_eviction_shaped_body_is_an_eviction_or_a_400(body: dict[str, Any]) -> None:
    try:
        parse_eviction(body, "apps", "web", False)
    except ApiError as exc:
        assert exc.code == 400


def test_pods_that_are_not_running_or_are_terminating_skip_budgets() -> None:
    assert [ignores_budgets(pod(p)) for p in ("Pending", "Running", "Succeeded", "Failed", "Unknown")] == [
        True,
        False,
        True,
        True,
        False,
    ]
    assert ignores_budgets(pod(deleting=True))
    assert enforces_resource_version(pod("Pending")) and not enforces_resource_version(pod("Failed"))
    assert not enforces_resource_version(pod(deleting=True))


def test_unready_pods_pass_only_a_budget_with_its_healthy_pods_or_one_that_always_allows() -> None:
    assert not passes_unready(pod(ready=True), budget(0, currentHealthy=5, desiredHealthy=1))
    assert passes_unready(pod(ready=False), budget(0, currentHealthy=2, desiredHealthy=2))
    assert not passes_unready(pod(ready=False), budget(0, currentHealthy=1, desiredHealthy=2))
    assert not passes_unready(pod(ready=False), budget(0, currentHealthy=0, desiredHealthy=0))
    always = budget(0)
    always["spec"]["unhealthyPodEvictionPolicy"] = "AlwaysAllow"
    assert passes_unready(pod(ready=False), always)


def test_budgets_cover_pods_of_their_namespace_through_a_non_empty_selector() -> None:
    assert covers(budget(1), pod())
    assert not covers(budget(1), pod(labels={"app": "db"}))
    other = budget(1)
    other["metadata"]["namespace"] = "elsewhere"
    assert not covers(other, pod())
    for selector in ({}, None, {"matchLabels": "app"}):
        b = budget(1)
        b["spec"]["selector"] = selector
        assert not covers(b, pod())


def test_charging_a_budget_takes_one_disruption_and_records_the_pod() -> None:
    status = charge(budget(2, disruptedPods={"old": NOW}), "web", NOW, False)
    assert status["disruptionsAllowed"] == 1 and status["disruptedPods"] == {"old": NOW, "web": NOW}
    last = charge(budget(1), "web", NOW, False)
    cond = last["conditions"][0]
    assert (last["disruptionsAllowed"], cond["status"], cond["reason"]) == (0, "False", "InsufficientPods")
    assert "disruptedPods" not in charge(budget(1), "web", NOW, True)


def test_a_budget_that_cannot_be_charged_says_why_as_kube_does() -> None:
    cases = [
        (budget(0, desiredHealthy=3, currentHealthy=3), 429, "needs 3 healthy pods and has 3 currently"),
        (budget(1, generation=2, observed=1), 429, "is still being processed by the server"),
        (budget(-1), 403, "pdb disruptions allowed is negative"),
        (budget(1, disruptedPods={f"p{i}": NOW for i in range(MAX_DISRUPTED_PODS + 1)}), 403, "map too big"),
    ]
    for b, code, text in cases:
        with pytest.raises(ApiError) as caught:
            charge(b, "web", NOW, False)
        error = caught.value
        assert error.code == code
        detail = str(error.details)
        assert text in detail or text in error.message
        if code == 429:
            assert error.message == VIOLATION
            assert error.details is not None and error.details["causes"][0]["reason"] == "DisruptionBudget"
