from __future__ import annotations

import contextlib
from typing import Any

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st
from json_strategies import json_values

from ambit.apiserver.jsonpath import JsonPathError, parse

GATEWAY = {
    "metadata": {"name": "gw", "annotations": {"example.com/owner": "team-a"}},
    "spec": {"gatewayClassName": "istio", "listeners": [{"name": "http", "port": 80}, {"name": "tls", "port": 443}]},
    "status": {
        "addresses": [{"value": "10.0.0.9"}, {"value": "10.0.0.10"}],
        "conditions": [
            {"type": "Accepted", "status": "True"},
            {"type": "Programmed", "status": "False", "observedGeneration": 2},
        ],
    },
}


@pytest.mark.parametrize(
    ("path", "found"),
    [
        (".spec.gatewayClassName", ["istio"]),
        ("{.spec.gatewayClassName}", ["istio"]),
        (".spec.listeners[1].port", [443]),
        (".spec.listeners[-1].name", ["tls"]),
        (".spec.listeners[*].name", ["http", "tls"]),
        (".spec.listeners.*.port", [80, 443]),
        (".status.addresses[*].value", ["10.0.0.9", "10.0.0.10"]),
        ('.status.conditions[?(@.type=="Programmed")].status', ["False"]),
        (".status.conditions[?(@.type=='Accepted')].status", ["True"]),
        ('.status.conditions[?(@.type!="Accepted")].type', ["Programmed"]),
        (".status.conditions[?(@.observedGeneration==2)].type", ["Programmed"]),
        (".status.conditions[?(@.observedGeneration)].type", ["Programmed"]),
        (".metadata.annotations['example.com/owner']", ["team-a"]),
        ('.metadata.annotations["example.com/owner"]', ["team-a"]),
        (".metadata.labels.app", []),
        (".spec.listeners[7].name", []),
        (".spec.gatewayClassName.deeper", []),
        (".spec", [GATEWAY["spec"]]),
        (".", [GATEWAY]),
    ],
)
def test_supported_forms_select_what_kubectl_would(path: str, found: list[Any]) -> None:
    assert parse(path).find(GATEWAY) == found


def test_first_returns_a_default_when_nothing_matches() -> None:
    assert parse(".status.addresses[0].value").first(GATEWAY) == "10.0.0.9"
    assert parse(".status.missing").first(GATEWAY, "-") == "-"


def test_filters_do_not_confuse_booleans_with_numbers() -> None:
    items = {"items": [{"n": 1}, {"n": True}]}
    assert parse(".items[?(@.n==1)].n").find(items) == [1]
    assert parse(".items[?(@.n==true)].n").find(items) == [True]


@pytest.mark.parametrize("path", ["spec.hosts", ".spec..hosts", "..a", ".a[", ".a[?(@.x~1)]", ".a]", ".a[1:2]", "$"])
def test_unsupported_text_is_refused(path: str) -> None:
    with pytest.raises(JsonPathError):
        parse(path)


@settings(max_examples=300, deadline=None)
@given(text=st.text(alphabet=".[]?()@=!'\"*ab01- ", max_size=24))
def test_parse_accepts_or_refuses_but_never_crashes(text: str) -> None:
    with contextlib.suppress(JsonPathError):
        parse(text)


@settings(max_examples=300, deadline=None)
@given(
    path=st.sampled_from([".a", ".a.b", ".a[0]", ".a[*].b", '.a[?(@.type=="x")].b', ".a[?(@.b)]", ".*", ".a[-2]", "."]),
    value=json_values(),
)
def test_find_never_raises_on_any_json(path: str, value: Any) -> None:
    assert isinstance(parse(path).find(value), list)
