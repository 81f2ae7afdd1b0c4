from __future__ import annotations

from collections.abc import Mapping
from typing import Any

import pytest
from hypothesis import given
from hypothesis import strategies as st

from ambit.apiserver.selectors import label_selector_from_spec, parse_label_selector
from ambit.model.labels import map_matches, selector_from_spec, selector_matches

_keys = st.sampled_from(["app", "tier", "zone", "example.com/team"])
_values = st.sampled_from(["", "web", "db", "a", "b"])
_labels = st.dictionaries(_keys, _values, max_size=4)


@st.composite
def _expressions(draw: st.DrawFn) -> dict[str, Any]:
    operator = draw(st.sampled_from(["In", "NotIn", "Exists", "DoesNotExist"]))
    expr: dict[str, Any] = {"key": draw(_keys), "operator": operator}
    if operator in ("In", "NotIn"):
        expr["values"] = draw(st.lists(_values, min_size=1, max_size=3))
    return expr


_specs = st.fixed_dictionaries(
    {},
    optional={
        "matchLabels": st.dictionaries(_keys, _values, max_size=3),
        "matchExpressions": st.lists(_expressions(), max_size=3),
    },
)


def _reference(spec: Mapping[str, Any], labels: Mapping[str, str]) -> bool:
    """apimachinery's rules, written out as plainly as possible."""
    for key, value in (spec.get("matchLabels") or {}).items():
        if key not in labels or labels[key] != value:
            return False
    for expr in spec.get("matchExpressions") or []:
        key, operator, values = expr["key"], expr["operator"], expr.get("values") or []
        if operator == "In" and not (key in labels and labels[key] in values):
            return False
        if operator == "NotIn" and key in labels and labels[key] in values:
            return False
        if operator == "Exists" and key not in labels:
            return False
        if operator == "DoesNotExist" and key in labels:
            return False
    return True


@given(_specs, _labels)
def test_label_selector_agrees_with_the_plain_reference(spec: dict[str, Any], labels: dict[str, str]) -> None:
    assert selector_matches(spec, labels) == _reference(spec, labels)


@given(_specs, _labels)
def test_the_api_servers_text_and_object_forms_evaluate_as_the_model_does(
    spec: dict[str, Any], labels: dict[str, str]
) -> None:
    from_object = label_selector_from_spec(spec)
    assert from_object.matches(labels) == selector_matches(spec, labels)
    assert parse_label_selector(str(from_object)).matches(labels) == selector_matches(spec, labels)


@given(st.dictionaries(_keys, _values, max_size=3), _labels)
def test_a_plain_map_is_match_labels_alone(selector: dict[str, str], labels: dict[str, str]) -> None:
    assert map_matches(selector, labels) == selector_matches({"matchLabels": selector}, labels)


@pytest.mark.parametrize("spec", [None, {}, {"matchLabels": None, "matchExpressions": None}])
def test_an_empty_label_selector_selects_everything(spec: Any) -> None:
    assert selector_matches(spec or {}, {"app": "web"})
    assert selector_matches(spec or {}, {})


@pytest.mark.parametrize(
    "spec",
    [
        "app=web",
        {"matchLabels": ["app"]},
        {"matchExpressions": {"key": "app"}},
        {"matchExpressions": ["app"]},
        {"matchExpressions": [{"key": 1, "operator": "Exists"}]},
        {"matchExpressions": [{"key": "app", "operator": "Gt", "values": ["1"]}]},
        {"matchExpressions": [{"key": "app", "operator": "In", "values": "web"}]},
    ],
)
def test_a_malformed_label_selector_selects_nothing(spec: Any) -> None:
    assert selector_from_spec(spec) is None
    assert not selector_matches(spec, {"app": "web"})


def test_not_in_selects_objects_without_the_label() -> None:
    assert selector_matches({"matchExpressions": [{"key": "app", "operator": "NotIn", "values": ["web"]}]}, {})
    assert not selector_matches({"matchExpressions": [{"key": "app", "operator": "In", "values": ["web"]}]}, {})
