"""BackendTLSPolicy ``status.ancestors`` planning (controlplane/status.py rule 9): ours replaced, others' kept."""

from __future__ import annotations

from typing import Any

from hypothesis import given, settings
from hypothesis import strategies as st

from ambit.controlplane.status import plan_policy_ancestors
from ambit.controlplane.translate.backendtls import AncestorStatus, BackendTlsPolicyStatus
from ambit.controlplane.translate.routes import RouteCondition

NOW, LATER = "2026-01-01T00:00:00Z", "2026-01-02T00:00:00Z"
MESH = {"group": "", "kind": "Service", "name": "backend"}
OK = (RouteCondition("Accepted", True, "Accepted", "ok"), RouteCondition("ResolvedRefs", True, "ResolvedRefs", "ok"))


def wanted(*conditions: RouteCondition, generation: int = 1) -> BackendTlsPolicyStatus:
    ancestor = AncestorStatus(tuple(MESH.items()), "istio.io/mesh-controller", conditions or OK)
    return BackendTlsPolicyStatus("app", "p", generation, (ancestor,))


OTHER = {"ancestorRef": {"group": "", "kind": "Service", "name": "backend"}, "controllerName": "example.com/other",
         "conditions": [{"type": "Accepted", "status": "False", "reason": "Theirs"}]}  # fmt: skip


def test_first_write_adds_our_ancestor_after_another_controllers_and_then_settles() -> None:
    planned = plan_policy_ancestors([OTHER], wanted(), "app", NOW)
    assert planned is not None and planned[0] == OTHER
    assert planned[1]["ancestorRef"] == MESH and planned[1]["controllerName"] == "istio.io/mesh-controller"
    assert [(c["type"], c["status"], c["observedGeneration"]) for c in planned[1]["conditions"]] == [
        ("Accepted", "True", 1),
        ("ResolvedRefs", "True", 1),
    ]
    assert plan_policy_ancestors(planned, wanted(), "app", LATER) is None


def test_a_flip_rewrites_our_entry_and_a_stale_one_of_ours_is_dropped() -> None:
    planned = plan_policy_ancestors([], wanted(), "app", NOW)
    assert planned is not None
    stale = {"ancestorRef": {"group": "gateway.networking.k8s.io", "kind": "Gateway", "name": "gone"},
             "controllerName": "istio.io/gateway-controller", "conditions": []}  # fmt: skip
    bad = RouteCondition("Accepted", False, "NoValidCACertificate", "no CA")
    again = plan_policy_ancestors([*planned, stale], wanted(bad, generation=2), "app", LATER)
    assert again is not None and len(again) == 1
    (accepted,) = again[0]["conditions"]
    assert (accepted["status"], accepted["reason"], accepted["lastTransitionTime"]) == (
        "False",
        "NoValidCACertificate",
        LATER,
    )
    assert plan_policy_ancestors(again, None, "app", LATER) == []


@settings(max_examples=200, deadline=None)
@given(st.lists(st.dictionaries(st.sampled_from(["ancestorRef", "controllerName", "conditions"]),
                                st.none() | st.text(max_size=4) | st.lists(st.integers(), max_size=2)
                                | st.dictionaries(st.text(max_size=4), st.text(max_size=4), max_size=2)),
                max_size=20))  # fmt: skip
def test_any_current_ancestors_plan_without_error_within_the_bound_and_settle(current: list[Any]) -> None:
    planned = plan_policy_ancestors(current, wanted(), "app", NOW)
    result = current if planned is None else planned
    assert len(result) <= max(16, len(current))
    if planned is not None:
        assert len(planned) <= 16
        assert plan_policy_ancestors(planned, wanted(), "app", LATER) is None
