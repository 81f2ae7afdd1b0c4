"""Test processes running at once never hand out the same port: each share of ``make test`` (and each xdist worker
of the rest share) gets a slice of its own (:func:`bench.server_process._worker_share`)."""

from __future__ import annotations

import itertools

import pytest
from bench.server_process import _worker_share

FIRST, LAST = 10_000, 32_768


def slice_of(monkeypatch: pytest.MonkeyPatch, share: str, worker: str = "", count: int = 1) -> range:
    monkeypatch.setenv("AMBIT_TEST_SHARE", share)
    monkeypatch.setenv("PYTEST_XDIST_WORKER", worker)
    monkeypatch.setenv("PYTEST_XDIST_WORKER_COUNT", str(count))
    return range(*_worker_share(FIRST, LAST))


def test_shares_that_run_at_once_get_disjoint_slices(monkeypatch: pytest.MonkeyPatch) -> None:
    at_once = [
        slice_of(monkeypatch, "lab"),
        slice_of(monkeypatch, "host"),
        slice_of(monkeypatch, "rest", "gw0", 2),
        slice_of(monkeypatch, "rest", "gw1", 2),
    ]
    for a, b in itertools.combinations(at_once, 2):
        assert not set(a) & set(b), (a, b)
    assert all(len(each) > 2000 for each in at_once)
    assert all(each.start >= FIRST and each.stop <= LAST for each in at_once)


def test_the_machine_share_alone_covers_the_lab_and_host_slices(monkeypatch: pytest.MonkeyPatch) -> None:
    machine = slice_of(monkeypatch, "machine")
    assert machine.start == slice_of(monkeypatch, "lab").start
    assert machine.stop == slice_of(monkeypatch, "host").stop


def test_outside_make_test_the_whole_range_is_used(monkeypatch: pytest.MonkeyPatch) -> None:
    assert slice_of(monkeypatch, "") == range(FIRST, LAST)
