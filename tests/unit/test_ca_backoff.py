"""The CA client's retry policy (ambit.identity.caclient.Backoff): capped exponential back-off with jitter."""

from __future__ import annotations

import pytest
from hypothesis import given
from hypothesis import strategies as st

from ambit.identity.caclient import CA_BACKOFF, Backoff


def test_the_delay_doubles_from_half_a_second_and_stops_growing_at_five_seconds() -> None:
    without_jitter = [CA_BACKOFF.delay(n, 0.0) for n in range(1, 9)]
    assert without_jitter == [0.5, 1.0, 2.0, 4.0, 5.0, 5.0, 5.0, 5.0]


def test_jitter_takes_at_most_a_fifth_off_each_delay() -> None:
    assert CA_BACKOFF.delay(3, 0.5) == pytest.approx(2.0 * 0.9)
    assert CA_BACKOFF.delay(10, 0.999999) == pytest.approx(5.0 * 0.8, rel=1e-5)


@given(
    failures=st.integers(min_value=1, max_value=10**9), draw=st.floats(min_value=0.0, max_value=1.0, exclude_max=True)
)
def test_every_delay_is_within_the_jitter_band_below_its_capped_base(failures: int, draw: float) -> None:
    delay = CA_BACKOFF.delay(failures, draw)
    assert 0 < delay <= CA_BACKOFF.cap
    base = min(CA_BACKOFF.cap, CA_BACKOFF.initial * 2 ** min(failures - 1, 64))
    assert base * (1 - CA_BACKOFF.jitter) <= delay <= base


@given(failures=st.integers(min_value=1, max_value=200))
def test_the_delay_never_shrinks_as_failures_go_on(failures: int) -> None:
    assert CA_BACKOFF.delay(failures + 1, 0.0) >= CA_BACKOFF.delay(failures, 0.0)


@pytest.mark.parametrize(
    ("kwargs", "message"),
    [
        ({"initial": 0.0}, "initial"),
        ({"initial": 6.0, "cap": 5.0}, "initial"),
        ({"multiplier": 0.5}, "multiplier"),
        ({"jitter": 1.0}, "jitter"),
        ({"jitter": float("nan")}, "jitter"),
    ],
)
def test_a_policy_that_could_spin_or_shrink_is_refused_with_a_clear_error(
    kwargs: dict[str, float], message: str
) -> None:
    with pytest.raises(ValueError, match=message):
        Backoff(**kwargs)


@pytest.mark.parametrize(("failures", "draw"), [(0, 0.0), (-1, 0.0), (1, 1.0), (1, -0.1), (1, float("nan"))])
def test_a_delay_asked_for_no_failure_or_with_a_draw_outside_zero_to_one_is_an_error(
    failures: int, draw: float
) -> None:
    with pytest.raises(ValueError, match="back-off"):
        CA_BACKOFF.delay(failures, draw)
