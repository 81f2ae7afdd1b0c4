"""The store's reads in (namespace, name) order stay exact while objects come and go, and a create or a deletion
does not sort a type's keys again: the sorted keys follow each write (an insertion or a removal in place)."""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from ambit.apiserver import store as store_module
from ambit.apiserver.store import Store

PODS = ("", "pods")


def _pod(namespace: str, name: str) -> dict[str, Any]:
    return {"apiVersion": "v1", "kind": "Pod", "metadata": {"name": name, "namespace": namespace}}


@pytest.fixture
def store(tmp_path: Path) -> Iterator[Store]:
    opened = Store(tmp_path / "state.db")
    yield opened
    opened.close()


# A write: (True to put, False to remove; namespace; name), then whether to read in between.
writes = st.lists(
    st.tuples(st.booleans(), st.sampled_from(["a", "b", "b-1", "c"]), st.sampled_from(["p", "q", "p-2", "r"])),
    max_size=40,
)


@settings(max_examples=60, suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(writes, st.lists(st.booleans(), min_size=40, max_size=40))
def test_items_follow_every_create_and_deletion_in_order(
    store: Store, ops: list[tuple[bool, str, str]], reads: list[bool]
) -> None:
    for key in list(store.items(PODS)):  # the fixture's store is shared by hypothesis's examples: start empty
        store.remove(PODS, key.namespace, key.obj["metadata"]["name"], key.obj)
    model: set[tuple[str, str]] = set()
    for (put, namespace, name), read in zip(ops, reads, strict=False):
        if put:
            etype = "MODIFIED" if (namespace, name) in model else "ADDED"
            store.put(etype, PODS, namespace, name, _pod(namespace, name))
            model.add((namespace, name))
        elif (namespace, name) in model:
            store.remove(PODS, namespace, name, _pod(namespace, name))
            model.discard((namespace, name))
        if read:
            assert [(i.namespace, i.obj["metadata"]["name"]) for i in store.items(PODS)] == sorted(model)
    assert [(i.namespace, i.obj["metadata"]["name"]) for i in store.items(PODS)] == sorted(model)
    for namespace in ("a", "b", "b-1", "c", "d"):
        expected = sorted(k for k in model if k[0] == namespace)
        assert [(i.namespace, i.obj["metadata"]["name"]) for i in store.items(PODS, namespace)] == expected
        after = (namespace, "p")
        tail = [k for k in expected if k > after]
        assert [(i.namespace, i.obj["metadata"]["name"]) for i in store.items(PODS, namespace, after=after)] == tail


def test_creates_and_deletions_between_reads_do_not_sort_the_keys_again(
    store: Store, monkeypatch: pytest.MonkeyPatch
) -> None:
    for i in range(50):
        store.put("ADDED", PODS, f"ns-{i % 5}", f"pod-{i:03d}", _pod(f"ns-{i % 5}", f"pod-{i:03d}"))
    assert len(store.items(PODS)) == 50  # the first read sorts
    sorts: list[int] = []

    def counting_sorted(keys: Any) -> list[Any]:
        sorts.append(1)
        return sorted(keys)

    monkeypatch.setattr(store_module, "sorted", counting_sorted, raising=False)
    store.put("ADDED", PODS, "ns-2", "pod-new", _pod("ns-2", "pod-new"))
    gone = store.get(PODS, "ns-3", "pod-003")
    assert gone is not None
    store.remove(PODS, "ns-3", "pod-003", gone.obj)
    names = [i.obj["metadata"]["name"] for i in store.items(PODS, "ns-2")]
    assert names == sorted([f"pod-{i:03d}" for i in range(2, 50, 5)] + ["pod-new"])
    assert "pod-003" not in [i.obj["metadata"]["name"] for i in store.items(PODS, "ns-3")]
    assert sorts == []
