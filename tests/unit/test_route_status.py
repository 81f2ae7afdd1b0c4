"""Route status (Gateway API ``status.parents``) as the control plane plans it: :func:`plan_route_parents`."""

from __future__ import annotations

from typing import Any

from hypothesis import given, settings
from hypothesis import strategies as st

from ambit.controlplane.status import plan_route_parents
from ambit.controlplane.translate.routes import CONTROLLER_NAME, RouteCondition, RouteParentStatus, RouteStatus

Obj = dict[str, Any]
SERVICE_REF = {"group": "", "kind": "Service", "name": "reviews"}
OTHER = {
    "parentRef": {"name": "ingress"},
    "controllerName": "example.com/other",
    "conditions": [{"type": "Accepted", "status": "True", "reason": "Accepted"}],
}


def wanted(*parents: tuple[Obj, bool, str], generation: int = 1) -> RouteStatus:
    return RouteStatus(
        "HTTPRoute",
        "app",
        "reviews",
        generation,
        tuple(
            RouteParentStatus(
                tuple(sorted(ref.items())),
                (
                    RouteCondition("Accepted", ok, "Accepted" if ok else "NoMatchingParent", message),
                    RouteCondition("ResolvedRefs", True, "ResolvedRefs", "All references resolved"),
                ),
            )
            for ref, ok, message in parents
        ),
    )


def test_our_parents_are_appended_after_other_controllers_entries() -> None:
    parents = plan_route_parents([OTHER], wanted((SERVICE_REF, True, "Route was valid")), "app", "T1")
    assert parents is not None
    assert parents[0] == OTHER
    assert parents[1]["controllerName"] == CONTROLLER_NAME
    assert parents[1]["parentRef"] == SERVICE_REF
    assert [
        (c["type"], c["status"], c["observedGeneration"], c["lastTransitionTime"]) for c in parents[1]["conditions"]
    ] == [
        ("Accepted", "True", 1, "T1"),
        ("ResolvedRefs", "True", 1, "T1"),
    ]


def test_nothing_is_written_when_the_parents_are_as_wanted() -> None:
    want = wanted((SERVICE_REF, True, "Route was valid"))
    parents = plan_route_parents([OTHER], want, "app", "T1")
    assert plan_route_parents(parents, want, "app", "T2") is None


def test_a_parent_ref_written_with_the_default_namespace_matches_one_without() -> None:
    want = wanted((SERVICE_REF, True, "Route was valid"))
    parents = plan_route_parents(None, want, "app", "T1")
    assert parents is not None
    assert plan_route_parents(parents, want, "app", "T2") is None


def test_transition_time_moves_only_when_the_status_flips() -> None:
    parents = plan_route_parents(None, wanted((SERVICE_REF, True, "Route was valid")), "app", "T1")
    message = plan_route_parents(parents, wanted((SERVICE_REF, True, "valid again"), generation=2), "app", "T2")
    assert message is not None
    accepted = message[0]["conditions"][0]
    assert (accepted["message"], accepted["observedGeneration"], accepted["lastTransitionTime"]) == (
        "valid again",
        2,
        "T1",
    )
    flipped = plan_route_parents(message, wanted((SERVICE_REF, False, "not found"), generation=2), "app", "T3")
    assert flipped is not None
    assert flipped[0]["conditions"][0]["lastTransitionTime"] == "T3"
    assert flipped[0]["conditions"][1]["lastTransitionTime"] == "T1"


def test_our_parents_that_are_no_longer_wanted_are_dropped_and_others_kept() -> None:
    parents = plan_route_parents([OTHER], wanted((SERVICE_REF, True, "Route was valid")), "app", "T1")
    assert plan_route_parents(parents, None, "app", "T2") == [OTHER]
    assert plan_route_parents([OTHER], None, "app", "T2") is None


def test_garbage_in_our_entries_is_replaced_not_a_crash() -> None:
    garbage: list[Any] = [
        {"controllerName": CONTROLLER_NAME, "parentRef": {"name": ["x"], "port": {}}, "conditions": [{"type": []}]},
        {"controllerName": CONTROLLER_NAME, "parentRef": SERVICE_REF, "conditions": 5},
        "not an entry",
    ]
    parents = plan_route_parents(garbage, wanted((SERVICE_REF, True, "Route was valid")), "app", "T1")
    assert parents is not None
    assert [p["parentRef"] for p in parents] == [SERVICE_REF]
    assert plan_route_parents(parents, wanted((SERVICE_REF, True, "Route was valid")), "app", "T2") is None


@settings(max_examples=200, deadline=None)
@given(
    st.lists(
        st.recursive(
            st.none() | st.booleans() | st.integers() | st.text(max_size=6) | st.just(CONTROLLER_NAME),
            lambda inner: (
                st.lists(inner, max_size=3)
                | st.dictionaries(
                    st.sampled_from(["controllerName", "parentRef", "conditions", "type", "status", "name", "group"]),
                    inner,
                    max_size=4,
                )
            ),
            max_leaves=15,
        ),
        max_size=4,
    )
)
def test_any_current_status_plans_without_error_and_settles(current: list[Any]) -> None:
    want = wanted((SERVICE_REF, True, "Route was valid"))
    parents = plan_route_parents(current, want, "app", "T1")
    settled = parents if parents is not None else current
    assert plan_route_parents(settled, want, "app", "T2") is None
