"""The store's event log is bounded in bytes as well as in count: large objects push old events out (the horizon
moves, so a watch from before it gets 410 Gone), the newest event always stays, and the bound holds across a
restart."""

from __future__ import annotations

from pathlib import Path
from typing import Any

from ambit.apiserver.store import Store

CMS = ("", "configmaps")


def _config_map(name: str, size: int) -> dict[str, Any]:
    return {
        "apiVersion": "v1",
        "kind": "ConfigMap",
        "metadata": {"name": name, "namespace": "ns"},
        "data": {"k": "x" * size},
    }


def test_large_objects_push_old_events_out_of_the_log(tmp_path: Path) -> None:
    store = Store(tmp_path / "state.db", log_capacity=1000, log_bytes=50_000)
    try:
        for i in range(40):
            store.put("ADDED", CMS, "ns", f"cm-{i}", _config_map(f"cm-{i}", 10_000))
        assert store.log_bytes <= 50_000
        kept = store.events_after(store.horizon)
        assert 1 < len(kept) < 40
        assert store.horizon > 0  # the oldest versions are gone: a watch from before them is answered 410
        assert kept[-1].item.rv == store.resource_version
        assert sum(len(e.item.raw) for e in kept) == store.log_bytes
        # Every object is still stored: only the log forgot.
        assert store.count(CMS, "ns") == 40
    finally:
        store.close()


def test_an_object_larger_than_the_bound_still_stays_as_the_newest_event(tmp_path: Path) -> None:
    store = Store(tmp_path / "state.db", log_bytes=1_000)
    try:
        store.put("ADDED", CMS, "ns", "a", _config_map("a", 10))
        store.put("ADDED", CMS, "ns", "big", _config_map("big", 5_000))
        kept = store.events_after(store.horizon)
        assert [e.name for e in kept] == ["big"]
    finally:
        store.close()


def test_the_byte_bound_applies_when_the_log_is_read_back(tmp_path: Path) -> None:
    store = Store(tmp_path / "state.db", log_bytes=10_000_000)
    for i in range(30):
        store.put("ADDED", CMS, "ns", f"cm-{i}", _config_map(f"cm-{i}", 10_000))
    store.close()
    reopened = Store(tmp_path / "state.db", log_bytes=50_000)
    try:
        assert reopened.log_bytes <= 50_000
        assert reopened.events_after(reopened.horizon)[-1].item.rv == reopened.resource_version
    finally:
        reopened.close()
