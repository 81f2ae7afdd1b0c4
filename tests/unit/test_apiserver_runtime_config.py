"""kube-apiserver's ``--runtime-config`` on the embedded server's built-in kinds (apiserver/registry.py)."""

from __future__ import annotations

import dataclasses

import pytest
from hypothesis import given
from hypothesis import strategies as st

from ambit.apiserver.registry import (
    BUILTINS,
    Registry,
    RuntimeConfigError,
    enabled_builtins,
    runtime_config,
)


def test_turning_a_group_version_off_stops_serving_its_kinds_and_nothing_else() -> None:
    off = runtime_config(["policy/v1=false"])
    assert off == {("policy", "v1")}
    registry = Registry(enabled_builtins(off))
    assert registry.find("policy", "poddisruptionbudgets") is None
    assert registry.find_served("apps", "v1", "deployments") is not None
    assert len(list(registry)) == len(BUILTINS) - 1


def test_comma_lists_and_later_entries_win_as_in_kube() -> None:
    assert runtime_config(["policy/v1=false,policy/v1=true"]) == frozenset()
    assert runtime_config(["policy/v1=false", " ", "policy/v1"]) == frozenset()
    assert runtime_config(["policy/v1=FALSE"]) == {("policy", "v1")}


@pytest.mark.parametrize(
    ("entry", "says"),
    [
        ("api/v1=false", "the server itself needs"),
        ("v1=false", "not a built-in"),
        ("rbac.authorization.k8s.io/v1=false", "the server itself needs"),
        ("apiextensions.k8s.io/v1=false", "the server itself needs"),
        ("policy/v9=false", "not a built-in"),
        ("example.com/v1=false", "not a built-in"),
        ("policy/v1=maybe", "true or false"),
        ("=false", "not a built-in"),
    ],
)
def test_bad_entries_are_refused_naming_them(entry: str, says: str) -> None:
    with pytest.raises(RuntimeConfigError, match=says) as caught:
        runtime_config([entry])
    assert repr(entry) in str(caught.value)


def test_a_storage_version_goes_only_with_the_other_versions_of_its_kinds() -> None:
    pdb = next(t for t in BUILTINS if t.plural == "poddisruptionbudgets")
    two = dataclasses.replace(pdb, versions=("v1", "v1beta1"))  # storage version first
    with pytest.raises(RuntimeConfigError, match="stored"):
        runtime_config(["policy/v1=false"], [two])
    older_off = runtime_config(["policy/v1beta1=false"], [two])
    assert [t.versions for t in enabled_builtins(older_off, [two])] == [("v1",)]
    assert enabled_builtins(runtime_config(["policy/v1=false,policy/v1beta1=false"], [two]), [two]) == ()


@given(st.lists(st.text(max_size=40), max_size=4))
def test_any_input_is_a_set_of_pairs_or_a_runtime_config_error(entries: list[str]) -> None:
    try:
        off = runtime_config(entries)
    except RuntimeConfigError:
        return
    assert all(isinstance(group, str) and isinstance(version, str) for group, version in off)
    enabled_builtins(off)
