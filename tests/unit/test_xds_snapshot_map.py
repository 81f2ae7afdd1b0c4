"""SnapshotMap (ambit.xds.snapshot_map): a map changed through edits behaves as a dict changed the same way, and
every map made before a change reads as it did (rule 1), whatever the keys' buckets."""

from __future__ import annotations

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from ambit.xds.snapshot_map import SnapshotMap

KEYS = st.one_of(st.text(max_size=4), st.integers(-3, 600))
STEPS = st.lists(
    st.lists(st.tuples(st.booleans(), KEYS, st.integers()), max_size=12),
    max_size=12,
)


@settings(max_examples=200, deadline=None)
@given(st.dictionaries(KEYS, st.integers(), max_size=40), STEPS)
def test_edits_behave_as_a_dict_and_leave_earlier_maps_as_they_were(
    start: dict[object, int], changes: list[list[tuple[bool, object, int]]]
) -> None:
    current = SnapshotMap.of(start)
    truth = dict(start)
    history = [(current, dict(truth))]
    for change in changes:
        edit = current.edit()
        for put, key, value in change:
            if put:
                edit[key] = value
                truth[key] = value
            else:
                assert edit.pop(key) == truth.pop(key, None)
            assert edit.get(key) == truth.get(key)
        current = edit.freeze()
        history.append((current, dict(truth)))
        assert current == truth and len(current) == len(truth)
        assert sorted(map(repr, current)) == sorted(map(repr, truth))
        for key, value in truth.items():
            assert key in current and current[key] == value and current.get(key) == value
    for snapshot, held in history:
        assert dict(snapshot.items()) == held and len(snapshot) == len(held)


def test_a_frozen_edit_takes_no_more_writes_and_a_missing_key_is_a_key_error() -> None:
    edit = SnapshotMap.of({"a": 1}).edit()
    edit["b"] = 2
    frozen = edit.freeze()
    with pytest.raises(RuntimeError):
        edit["c"] = 3
    assert frozen == {"a": 1, "b": 2}
    with pytest.raises(KeyError):
        frozen["c"]
    assert frozen.get("c") is None and "c" not in frozen
