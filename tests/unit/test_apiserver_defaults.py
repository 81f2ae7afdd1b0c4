"""Defaulting of stored objects (:mod:`ambit.apiserver.defaults`): any JSON shape is defaulted or left alone, never
an exception (the API server would answer 500; its validation, later, says what is wrong)."""

from __future__ import annotations

import copy
from typing import Any

import pytest
from hypothesis import given
from hypothesis import strategies as st

from ambit.apiserver.defaults import apply_defaults

JSON = st.recursive(
    st.none() | st.booleans() | st.integers() | st.text(max_size=8),
    lambda inner: st.lists(inner, max_size=4) | st.dictionaries(st.text(max_size=8), inner, max_size=4),
    max_leaves=20,
)
KINDS = [
    ("", "Pod"),
    ("", "Service"),
    ("apps", "Deployment"),
    ("apps", "DaemonSet"),
    ("apps", "StatefulSet"),
    ("", "Namespace"),
    ("", "Secret"),
]


@pytest.mark.parametrize("kind", ["Pod", "Service", "Deployment"])
@pytest.mark.parametrize("odd", [True, 3, "x", {"a": 1}])
def test_a_list_field_of_another_type_is_left_alone(kind: str, odd: Any) -> None:
    spec: dict[str, Any] = {"containers": odd, "initContainers": odd, "ports": odd}
    obj: dict[str, Any] = {"kind": kind, "metadata": {"name": "x"}, "spec": spec}
    if kind == "Deployment":
        obj["spec"] = {"template": {"spec": copy.deepcopy(spec)}}
    apply_defaults("apps" if kind == "Deployment" else "", kind, obj)
    inner = obj["spec"]["template"]["spec"] if kind == "Deployment" else obj["spec"]
    assert inner.get("containers", odd) == odd and inner.get("ports", odd) == odd


@given(kind=st.sampled_from(KINDS), spec=JSON, creating=st.booleans())
def test_any_spec_is_defaulted_or_left_alone(kind: tuple[str, str], spec: Any, creating: bool) -> None:
    group, name = kind
    apply_defaults(group, name, {"kind": name, "metadata": {"name": "x"}, "spec": spec}, creating=creating)
