"""The node untaint controller's decisions (istiod's): which nodes lose ``cni.istio.io/not-ready``, and how."""

from __future__ import annotations

from typing import Any

from hypothesis import given, settings
from hypothesis import strategies as st

from ambit.controlplane.untaint import NOT_READY_TAINT, Untaint, untaint_patch, untaint_plan

NOT_READY = {"key": NOT_READY_TAINT, "effect": "NoSchedule"}
OTHER = {"key": "dedicated", "value": "gpu", "effect": "NoSchedule"}


def node(name: str, *taints: dict[str, Any]) -> dict[str, Any]:
    return {"metadata": {"name": name}, "spec": {"taints": list(taints)} if taints else {}}


def agent(node_name: str, ready: bool = True, deleting: bool = False) -> dict[str, Any]:
    meta: dict[str, Any] = {"name": f"istio-cni-node-{node_name}"}
    if deleting:
        meta["deletionTimestamp"] = "2026-12-02T00:00:00Z"
    return {
        "metadata": meta,
        "spec": {"nodeName": node_name},
        "status": {"conditions": [{"type": "Ready", "status": "True" if ready else "False"}]},
    }


def test_a_tainted_node_with_a_ready_agent_loses_only_the_not_ready_taint() -> None:
    plan = untaint_plan([node("n1", OTHER, NOT_READY)], [agent("n1")])
    assert plan == [Untaint("n1", (OTHER, NOT_READY), (OTHER,))]


def test_every_effect_of_the_not_ready_key_goes() -> None:
    both = [NOT_READY, {"key": NOT_READY_TAINT, "effect": "NoExecute"}]
    assert untaint_plan([node("n1", *both)], [agent("n1")]) == [Untaint("n1", tuple(both), ())]


def test_nothing_happens_without_a_ready_agent_on_that_node() -> None:
    nodes = [node("n1", NOT_READY), node("n2", NOT_READY)]
    assert untaint_plan(nodes, [agent("n1", ready=False), agent("n3")]) == []
    assert untaint_plan(nodes, [agent("n1", deleting=True)]) == []
    assert untaint_plan(nodes, []) == []


def test_an_untainted_node_or_one_with_other_taints_only_is_left_alone() -> None:
    assert untaint_plan([node("n1"), node("n2", OTHER)], [agent("n1"), agent("n2")]) == []


def test_the_patch_tests_the_list_it_read_before_changing_it() -> None:
    assert untaint_patch(Untaint("n1", (OTHER, NOT_READY), (OTHER,))) == [
        {"op": "test", "path": "/spec/taints", "value": [OTHER, NOT_READY]},
        {"op": "replace", "path": "/spec/taints", "value": [OTHER]},
    ]
    assert untaint_patch(Untaint("n1", (NOT_READY,), ()))[1] == {"op": "remove", "path": "/spec/taints"}


json_values = st.recursive(
    st.none() | st.booleans() | st.integers() | st.text(max_size=8),
    lambda inner: st.lists(inner, max_size=4) | st.dictionaries(st.text(max_size=8), inner, max_size=4),
    max_leaves=12,
)


objects = st.fixed_dictionaries(
    {},
    optional={
        "metadata": json_values
        | st.fixed_dictionaries({}, optional={"name": json_values, "deletionTimestamp": json_values}),
        "spec": json_values
        | st.fixed_dictionaries({}, optional={"taints": json_values | st.lists(json_values), "nodeName": json_values}),
        "status": json_values | st.fixed_dictionaries({}, optional={"conditions": json_values | st.lists(json_values)}),
    },
)


@settings(max_examples=150, deadline=None)
@given(st.lists(objects, max_size=4), st.lists(objects, max_size=4))
def test_objects_of_any_shape_never_raise(nodes: list[Any], pods: list[Any]) -> None:
    for untaint in untaint_plan(nodes, pods):
        assert untaint_patch(untaint)[0]["op"] == "test"
