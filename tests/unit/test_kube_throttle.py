"""The client's request budget and its reading of Retry-After (ambit.k8s.throttle)."""

from __future__ import annotations

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from ambit.k8s.throttle import DEFAULT_RETRY_AFTER, MAX_RETRY_AFTER, RequestBudget, retry_after


def test_a_burst_goes_at_once_and_the_next_requests_wait_their_turn_in_order() -> None:
    budget = RequestBudget(qps=10, burst=3)
    assert [budget.reserve(0.0) for _ in range(3)] == [0.0, 0.0, 0.0]
    waits = [budget.reserve(0.0) for _ in range(3)]
    assert waits == pytest.approx([0.1, 0.2, 0.3])


def test_an_idle_client_gets_its_burst_back_but_no_more() -> None:
    budget = RequestBudget(qps=10, burst=2)
    budget.reserve(0.0)
    budget.reserve(0.0)
    assert budget.reserve(0.05) == pytest.approx(0.05)  # half a token back: wait for the other half
    assert [budget.reserve(100.0) for _ in range(2)] == [0.0, 0.0]  # idle long: the bucket is full, not overfull
    assert budget.reserve(100.0) == pytest.approx(0.1)


@pytest.mark.parametrize(("qps", "burst"), [(0, 1), (-1, 1), (float("nan"), 1), (1, 0)])
def test_a_budget_needs_a_positive_rate_and_burst(qps: float, burst: int) -> None:
    with pytest.raises(ValueError, match="must be"):
        RequestBudget(qps=qps, burst=burst)


@given(
    st.floats(min_value=0.1, max_value=1000),
    st.integers(min_value=1, max_value=100),
    st.lists(st.floats(min_value=0, max_value=5), min_size=1, max_size=200),
)
@settings(max_examples=200, deadline=None)
def test_requests_sent_when_told_never_exceed_burst_plus_rate_times_time(
    qps: float, burst: int, gaps: list[float]
) -> None:
    """Whatever the arrival times, the send times the budget gives keep any window within client-go's bound."""
    budget = RequestBudget(qps=qps, burst=burst)
    now, sends = 0.0, []
    for gap in gaps:
        now += gap
        wait = budget.reserve(now)
        assert wait >= 0
        sends.append(now + wait)
    sends.sort()
    for i, start in enumerate(sends):
        for j in range(i, len(sends)):
            assert j - i + 1 <= burst + (sends[j] - start) * qps + 1e-6


@pytest.mark.parametrize(
    ("header", "wait"),
    [
        (None, None),
        ("1", 1.0),
        (" 2 ", 2.0),
        ("0.5", 0.5),
        ("0", 0.1),
        ("-3", 0.1),
        ("1e9", MAX_RETRY_AFTER),
        ("inf", MAX_RETRY_AFTER),
        ("nan", DEFAULT_RETRY_AFTER),
        ("Wed, 21 Oct 2015 07:28:00 GMT", DEFAULT_RETRY_AFTER),
        ("", DEFAULT_RETRY_AFTER),
    ],
)
def test_retry_after_is_seconds_within_bounds(header: str | None, wait: float | None) -> None:
    assert retry_after(header) == wait


@given(st.text(max_size=40))
def test_any_retry_after_header_gives_a_bounded_wait(header: str) -> None:
    wait = retry_after(header)
    assert wait is not None and 0.1 <= wait <= MAX_RETRY_AFTER
