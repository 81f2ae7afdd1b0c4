"""The xDS server's admission of new streams (ambit.xds.admission): istiod's rate limit, a bound on streams held,
and spread retry hints; pure, with time and draws passed in."""

from __future__ import annotations

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from ambit.hbone.grpc_calls import MAX_PUSHBACK, StatusCode, call_status
from ambit.xds.admission import MIN_HINT, Admission, Admit, Refuse, default_rate


def test_istiods_default_rate_is_15_plus_5_per_cpu_at_most_100() -> None:
    assert default_rate(1) == 20 and default_rate(2) == 25 and default_rate(16) == 95 and default_rate(64) == 100


def test_a_burst_is_admitted_then_streams_wait_up_to_a_second_then_are_refused_with_the_time_to_a_token() -> None:
    admission = Admission(rate=10, max_streams=1000)
    decisions = [admission.arrive(100.0, 0.0) for _ in range(25)]
    assert decisions[:10] == [Admit(0.0)] * 10  # the bucket starts full
    waits = [d.wait for d in decisions[10:20] if isinstance(d, Admit)]
    assert waits == pytest.approx([0.1 * n for n in range(1, 11)])  # reserved tokens, one every 0.1 s
    refused = decisions[20:]
    assert all(isinstance(d, Refuse) and d.reason == "rate limited" for d in refused)
    assert refused[0].hint == pytest.approx(1.1)  # type: ignore[union-attr]
    assert admission.held == 20
    # A second later the ten reservations are paid off, and the bucket is empty: the next token in 0.1 s.
    assert admission.arrive(101.0, 0.0) == Admit(pytest.approx(0.1))  # type: ignore[arg-type]


def test_the_bound_on_streams_held_refuses_at_once_until_one_leaves() -> None:
    admission = Admission(rate=100, max_streams=2, full_hint=5.0)
    assert admission.arrive(0.0, 0.0) == Admit() and admission.arrive(0.0, 0.0) == Admit()
    full = admission.arrive(0.0, 0.5)
    assert isinstance(full, Refuse) and full.reason == "too many xDS clients" and full.hint == 7.5
    assert full.pushback_ms == "7500"
    admission.leave()
    assert admission.arrive(0.0, 0.0) == Admit()


def test_bad_settings_are_refused() -> None:
    for bad in ({"rate": 0}, {"max_streams": 0}, {"max_wait": -1}, {"burst": -1}):
        with pytest.raises(ValueError, match="admission needs"):
            Admission(**bad)  # type: ignore[arg-type]


@settings(max_examples=200, deadline=None)
@given(
    rate=st.floats(0.5, 200),
    burst=st.floats(0, 50),
    gaps=st.lists(st.floats(0, 2), min_size=1, max_size=200),
    draws=st.lists(st.floats(0, 1, exclude_max=True), min_size=1, max_size=200),
)
def test_admission_never_lets_more_in_than_the_bucket_allows_and_hints_are_spread_and_bounded_below(
    rate: float, burst: float, gaps: list[float], draws: list[float]
) -> None:
    admission = Admission(rate=rate, burst=burst, max_streams=10**9, max_wait=1.0)
    now, admitted_by = 0.0, []
    for i, gap in enumerate(gaps):
        now += gap
        decision = admission.arrive(now, draws[i % len(draws)])
        if isinstance(decision, Admit):
            assert 0 <= decision.wait <= 1.0 + 1e-9
            admitted_by.append(now + decision.wait)
        else:
            assert decision.hint >= MIN_HINT and int(decision.pushback_ms) >= 1
    # Streams admitted (at the time they go in) never outrun the bucket: capacity + rate x elapsed.
    capacity = burst or rate
    assert len(admitted_by) <= capacity + rate * (max(admitted_by, default=0.0)) + 1e-6 + 1


def test_a_pushback_trailer_is_read_as_seconds_and_nonsense_is_no_hint() -> None:
    def status(value: str) -> float | None:
        return call_status([("grpc-status", "8"), ("grpc-retry-pushback-ms", value)]).pushback

    head = call_status([("grpc-status", "8"), ("grpc-message", "xds: rate limited, retry later")])
    assert head.code is StatusCode.RESOURCE_EXHAUSTED and head.pushback is None
    assert status("1500") == 1.5 and status("0") == 0.0
    assert status("99999999999") is None and status("-5") is None and status("1.5") is None and status("") is None
    assert status("9999999999") == MAX_PUSHBACK


@given(st.text(max_size=20))
def test_any_pushback_text_gives_a_bounded_hint_or_none(value: str) -> None:
    pushback = call_status([("grpc-status", "14"), ("grpc-retry-pushback-ms", value)]).pushback
    assert pushback is None or 0 <= pushback <= MAX_PUSHBACK
