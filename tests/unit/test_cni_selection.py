"""Ambient pod selection (spec §1.2): the rules table, and totality on arbitrary objects."""

from __future__ import annotations

from typing import Any

import pytest
from hypothesis import given
from hypothesis import strategies as st

from ambit.cni.selection import Decision, is_ambient, split_namespaces

MODE = "istio.io/dataplane-mode"


def pod(
    namespace: str = "apps",
    labels: dict[str, str] | None = None,
    annotations: dict[str, str] | None = None,
    host_network: bool = False,
) -> dict[str, Any]:
    return {
        "metadata": {"name": "web", "namespace": namespace, "labels": labels or {}, "annotations": annotations or {}},
        "spec": {"hostNetwork": host_network},
    }


def namespace(name: str = "apps", mode: str | None = None) -> dict[str, Any]:
    return {"metadata": {"name": name, "labels": {MODE: mode} if mode else {}}}


CASES = [
    # (pod, namespace, enrolled, reason fragment)
    (pod(labels={MODE: "ambient"}), namespace(), True, "pod is labelled"),
    (pod(), namespace(mode="ambient"), True, "namespace is labelled"),
    (pod(labels={MODE: "none"}), namespace(mode="ambient"), False, "opted out"),
    (pod(labels={MODE: "sidecar"}), namespace(mode="ambient"), True, "namespace is labelled"),
    (pod(), namespace(), False, "neither"),
    (pod(), namespace(mode="none"), False, "neither"),
    (pod(labels={MODE: "Ambient"}), namespace(), False, "neither"),
    (pod(labels={MODE: "ambient"}, host_network=True), namespace(mode="ambient"), False, "host network"),
    (pod(annotations={"sidecar.istio.io/status": "{}"}, labels={MODE: "ambient"}), namespace(), False, "sidecar"),
    (pod("kube-system", labels={MODE: "ambient"}), namespace("kube-system", "ambient"), False, "excluded"),
    ({"metadata": {"labels": {MODE: "ambient"}}}, namespace("kube-system"), False, "excluded"),
    ({}, {}, False, "neither"),
]


@pytest.mark.parametrize(("pod_obj", "ns_obj", "enrolled", "reason"), CASES)
def test_selection_rules_table(pod_obj: dict[str, Any], ns_obj: dict[str, Any], enrolled: bool, reason: str) -> None:
    decision = is_ambient(pod_obj, ns_obj)
    assert decision.enrolled is enrolled
    assert reason in decision.reason


def test_custom_excluded_namespaces_replace_the_default() -> None:
    ambient = {MODE: "ambient"}
    assert not is_ambient(pod("infra", labels=ambient), namespace("infra"), excluded_namespaces={"infra"}).enrolled
    assert is_ambient(pod("kube-system", labels=ambient), namespace("kube-system"), excluded_namespaces=set()).enrolled


def test_host_network_must_be_literally_true() -> None:
    p = pod(labels={MODE: "ambient"})
    p["spec"]["hostNetwork"] = "true"
    assert is_ambient(p, namespace()).enrolled


def test_decisions_compare_by_value() -> None:
    assert Decision(True, "x") == Decision(True, "x")
    assert Decision(True, "x") != Decision(False, "x")
    assert "enrolled=True" in repr(Decision(True, "x"))


KEYS = st.sampled_from(["metadata", "spec", "labels", "annotations", "namespace", "name", "hostNetwork", MODE])
LEAVES = st.none() | st.booleans() | st.integers() | st.text(max_size=8) | st.sampled_from(["ambient", "none"])
JSON = st.recursive(LEAVES, lambda inner: st.lists(inner, max_size=3) | st.dictionaries(KEYS, inner, max_size=4))


@given(st.dictionaries(KEYS, JSON, max_size=4), st.dictionaries(KEYS, JSON, max_size=4))
def test_selection_never_raises_on_arbitrary_objects(pod_obj: dict[str, Any], ns_obj: dict[str, Any]) -> None:
    decision = is_ambient(pod_obj, ns_obj)
    assert isinstance(decision.enrolled, bool)
    assert decision.reason


def test_exclude_namespaces_is_read_as_istio_cni_reads_it() -> None:
    assert split_namespaces("kube-system") == ("kube-system",)
    assert split_namespaces(" kube-system , team-a,,team-a ,") == ("kube-system", "team-a")
    assert split_namespaces("") == ()


@given(st.text(max_size=200))
def test_exclude_namespaces_never_yields_blank_or_repeated_names(text: str) -> None:
    names = split_namespaces(text)
    assert all(name and name == name.strip() and "," not in name for name in names)
    assert len(set(names)) == len(names)
