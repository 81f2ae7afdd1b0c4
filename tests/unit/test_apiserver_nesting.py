"""The nesting bound: depth counted as documented, judged without recursion at any depth; documents within it
copied without sharing a mapping or list with the original."""

from __future__ import annotations

from typing import Any

import pytest
from hypothesis import given
from hypothesis import strategies as st

from ambit.apiserver.errors import ApiError
from ambit.apiserver.nesting import MAX_DEPTH, check_depth, copy_document, depth_exceeds


def nested(levels: int, leaf: Any = 1) -> Any:
    doc = leaf
    for i in range(levels):
        doc = {"a": doc} if i % 2 else [doc]
    return doc


@pytest.mark.parametrize(
    ("doc", "depth"),
    [(1, 0), ("s", 0), ({}, 1), ([], 1), ({"a": 1}, 1), ({"a": {"b": 1}}, 2), ([1, [2, [3]]], 3), ({"a": [{}]}, 3)],
)
def test_depth_counts_mappings_and_lists(doc: Any, depth: int) -> None:
    assert not depth_exceeds(doc, depth)
    assert depth_exceeds(doc, depth - 1) == (depth > 0)


def test_the_bound_is_exact_and_a_hundred_thousand_levels_are_judged_without_recursion() -> None:
    check_depth(nested(MAX_DEPTH), "the body")
    with pytest.raises(ApiError) as caught:
        check_depth(nested(MAX_DEPTH + 1), "the body")
    assert (caught.value.code, caught.value.reason) == (400, "BadRequest")
    assert caught.value.message == f"the body is nested more than {MAX_DEPTH} levels deep"
    assert depth_exceeds(nested(100_000))


json_values = st.recursive(
    st.none() | st.booleans() | st.integers() | st.text(max_size=3),
    lambda inner: st.lists(inner, max_size=3) | st.dictionaries(st.text(max_size=2), inner, max_size=3),
    max_leaves=30,
)


def _depth(doc: Any) -> int:
    if isinstance(doc, dict):
        return 1 + max(map(_depth, doc.values()), default=0)
    if isinstance(doc, list):
        return 1 + max(map(_depth, doc), default=0)
    return 0


@given(json_values, st.integers(min_value=0, max_value=8))
def test_depth_exceeds_agrees_with_the_recursive_definition(doc: Any, limit: int) -> None:
    assert depth_exceeds(doc, limit) == (_depth(doc) > limit)


def _containers(doc: Any) -> list[Any]:
    if isinstance(doc, dict):
        return [doc, *(c for v in doc.values() for c in _containers(v))]
    if isinstance(doc, list):
        return [doc, *(c for v in doc for c in _containers(v))]
    return []


@given(json_values)
def test_a_copied_document_is_equal_and_shares_no_mapping_or_list(doc: Any) -> None:
    copied = copy_document(doc)
    assert copied == doc
    assert not {id(c) for c in _containers(copied)} & {id(c) for c in _containers(doc)}


def test_a_document_at_the_bound_is_copied_and_changing_the_copy_leaves_the_original() -> None:
    doc = {"metadata": {"labels": {"app": "a"}}, "deep": nested(MAX_DEPTH - 1)}
    copied = copy_document(doc)
    copied["metadata"]["labels"]["app"] = "b"
    assert doc["metadata"]["labels"] == {"app": "a"}
    assert copied["deep"] == doc["deep"]
