"""Restart back-off without an immediate first restart (pure): 1 s doubling to 30 s, starting over after a stable
run (the kubelet's own, with an immediate first restart, is tested with the containers' state)."""

from __future__ import annotations

from ambit.lab.runtime.backoff import RestartBackoff


def test_delays_double_from_one_second_up_to_thirty() -> None:
    backoff = RestartBackoff(1.0, 30.0, reset_after=30.0)
    delays = [backoff.delay_after_exit(started=0.0, now=0.5) for _ in range(8)]
    assert delays == [1.0, 2.0, 4.0, 8.0, 16.0, 30.0, 30.0, 30.0]


def test_a_daemon_that_ran_long_enough_starts_the_sequence_over() -> None:
    backoff = RestartBackoff(1.0, 30.0, reset_after=30.0)
    for _ in range(4):
        backoff.delay_after_exit(started=0.0, now=1.0)
    assert backoff.delay_after_exit(started=100.0, now=130.0) == 1.0
    assert backoff.delay_after_exit(started=131.0, now=132.0) == 2.0


def test_a_crash_loop_of_any_length_waits_the_maximum() -> None:
    backoff = RestartBackoff(1.0, 30.0, reset_after=30.0)
    delays = [backoff.delay_after_exit(started=0.0, now=0.5) for _ in range(5000)]
    assert delays[-1] == 30.0
