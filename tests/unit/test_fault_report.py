"""The fault table's arithmetic (tests/faults/report.py): kept streams, failures in a window, recovery, data lost."""

from __future__ import annotations

from typing import Any

from hypothesis import given
from hypothesis import strategies as st
from tests.faults.report import fault_row, markdown_table, recovery_time, streams_up_at


def new(target: str, start: float, outcome: str = "ok") -> dict[str, Any]:
    return {"kind": "new", "target": target, "start": start, "end": start + 0.01, "outcome": outcome, "echoed": 0}


def stream(target: str, start: float, up: float, end: float, outcome: str) -> list[dict[str, Any]]:
    return [
        {"kind": "stream-up", "target": target, "start": start, "end": up, "outcome": "ok", "echoed": 64},
        {"kind": "stream", "target": target, "start": start, "end": end, "outcome": outcome, "echoed": 640},
    ]


def test_a_stream_broken_by_the_fault_is_not_kept_and_recovery_runs_to_the_first_success_after_the_last_failure() -> (
    None
):
    records = [
        *stream("a", 0.0, 0.1, 12.0, "reset"),  # up before the fault at 10, broken by it
        *stream("a", 12.2, 14.0, 20.0, "ok"),  # the reconnected one: not up at the fault
        *stream("b", 0.0, 0.1, 20.0, "ok"),  # untouched
        new("a", 9.0),
        new("a", 10.5, "refused"),
        new("a", 11.0, "reset"),
        new("a", 11.5),  # a first success, then one more failure: recovery is after the last failure
        new("a", 12.0, "timeout"),
        new("a", 13.0),
        new("b", 10.5),
    ]
    row = fault_row("x", records, fault_at=10.0, window_end=19.0, plaintext=0)
    assert (row.kept, row.established) == (1, 2)
    assert (row.failed, row.started) == (3, 6)
    assert row.recovery == 3.0
    assert row.lost == 0
    assert row.failed_by_target == {"a": 3}
    assert "| x | 1/2 | 3/6 | 3.00 s | 0 | 0 |" in markdown_table([row])


def test_a_stream_ended_on_purpose_after_the_fault_counts_as_kept_with_kept_until() -> None:
    records = stream("a", 0.0, 0.1, 15.0, "refused")
    assert fault_row("x", records, 10.0, 12.0, 0).kept == 0
    assert fault_row("x", records, 10.0, 12.0, 0, kept_until=12.0).kept == 1


def test_a_mismatched_echo_is_data_lost_and_a_target_that_never_recovers_has_no_recovery_time() -> None:
    records = [new("a", 11.0, "mismatch"), new("a", 12.0, "refused")]
    row = fault_row("x", records, 10.0, 13.0, 0)
    assert row.lost == 1
    assert row.recovery == float("inf")


@given(st.lists(st.tuples(st.floats(0, 100), st.sampled_from(["ok", "refused", "reset"])), max_size=30))
def test_recovery_is_zero_without_failures_and_never_before_the_fault(conns: list[tuple[float, str]]) -> None:
    records = [new("t", start, outcome) for start, outcome in conns]
    took = recovery_time(records, 50.0)
    if not any(o != "ok" and s >= 50.0 for s, o in conns):
        assert took == 0.0
    else:
        assert took > 0.0
    assert streams_up_at(records, 50.0) == []


def test_a_stream_that_ended_on_its_own_after_the_fault_is_kept_and_one_broken_is_not() -> None:
    records = [
        *stream("a", 0.0, 0.1, 15.0, "ended"),  # closed cleanly at the end of its lifetime, during the fault
        *stream("b", 0.0, 0.1, 15.0, "eof"),  # cut during the fault
    ]
    row = fault_row("x", records, fault_at=10.0, window_end=19.0, plaintext=0)
    assert (row.kept, row.established) == (1, 2)
