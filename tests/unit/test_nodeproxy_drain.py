"""The node proxy's drain: its deadline from flags and ztunnel's environment, its rules, and the drain signal."""

from __future__ import annotations

import pytest
from hypothesis import given
from hypothesis import strategies as st

from ambit.inpod.drain import (
    ConnectionsCounted,
    Drain,
    DrainRequested,
    Exit,
    ExtendDrain,
    ForceClose,
    Phase,
    StopAccepting,
    SuccessorChanged,
)
from ambit.inpod.settings import NodeProxySettingsError, parse_drain_deadline, parse_drain_max
from ambit.proxy.drain import DrainSignal

DEADLINE_ENV, GRACE_ENV = "CONNECTION_TERMINATION_DEADLINE", "TERMINATION_GRACE_PERIOD_SECONDS"
MAX_ENV = "DRAIN_MAX"


@pytest.mark.parametrize(
    ("flag", "environ", "seconds"),
    [
        (None, {}, 5.0),  # ztunnel's default
        ("12", {DEADLINE_ENV: "3s", GRACE_ENV: "30"}, 12.0),  # the flag wins
        (None, {DEADLINE_ENV: "3s", GRACE_ENV: "30"}, 3.0),  # then the explicit deadline
        (None, {DEADLINE_ENV: "1m"}, 60.0),
        (None, {DEADLINE_ENV: "0"}, 0.0),  # close at once
        (None, {GRACE_ENV: "30"}, 25.0),  # above 10 s: 5 s left for closing
        (None, {GRACE_ENV: "11"}, 6.0),
        (None, {GRACE_ENV: "10"}, 9.0),  # 10 s or less: 1 s left
        (None, {GRACE_ENV: "2"}, 1.0),
        (None, {GRACE_ENV: "1"}, 1.0),  # at least 1 s
        (None, {GRACE_ENV: "0"}, 1.0),
    ],
)
def test_the_drain_deadline_follows_ztunnels_order(flag: str | None, environ: dict[str, str], seconds: float) -> None:
    assert parse_drain_deadline(flag, environ) == seconds


@pytest.mark.parametrize(
    ("flag", "environ", "message"),
    [
        ("soon", {}, "--drain-deadline: expected seconds"),
        ("-5", {}, "--drain-deadline: expected 0 seconds or more"),
        (None, {DEADLINE_ENV: "1e999"}, "$CONNECTION_TERMINATION_DEADLINE: expected seconds"),
        (None, {GRACE_ENV: "thirty"}, "$TERMINATION_GRACE_PERIOD_SECONDS: expected whole seconds"),
        (None, {GRACE_ENV: "-3"}, "$TERMINATION_GRACE_PERIOD_SECONDS: expected whole seconds"),
        (None, {GRACE_ENV: "9" * 40}, "$TERMINATION_GRACE_PERIOD_SECONDS: expected whole seconds"),
    ],
)
def test_a_bad_deadline_is_one_clear_line(flag: str | None, environ: dict[str, str], message: str) -> None:
    with pytest.raises(NodeProxySettingsError, match=message.replace("$", r"\$")):
        parse_drain_deadline(flag, environ)


@given(st.text(max_size=30), st.text(max_size=30))
def test_any_environment_gives_a_deadline_or_a_settings_error(deadline: str, grace: str) -> None:
    try:
        seconds = parse_drain_deadline(None, {DEADLINE_ENV: deadline} if deadline else {GRACE_ENV: grace})
    except NodeProxySettingsError as exc:
        assert "\n" not in str(exc)
    else:
        assert seconds >= 0


def test_a_drain_with_connections_left_waits_and_exits_once_they_end() -> None:
    drain = Drain(deadline=25.0)
    assert drain.handle(ConnectionsCounted(1.0, 3)) == []  # rule 5: serving
    assert drain.handle(DrainRequested(10.0, "SIGTERM")) == [StopAccepting(35.0)]
    assert drain.phase is Phase.DRAINING
    assert drain.handle(ConnectionsCounted(20.0, 2)) == []
    assert drain.handle(ConnectionsCounted(30.0, 0)) == [Exit("every connection ended")]
    assert drain.phase is Phase.DONE
    assert drain.handle(ConnectionsCounted(31.0, 5)) == []
    assert drain.handle(DrainRequested(32.0, "SIGTERM")) == []


def test_a_connection_that_never_ends_is_closed_at_the_deadline() -> None:
    drain = Drain(deadline=5.0)
    drain.handle(DrainRequested(100.0, "SIGTERM"))
    assert drain.handle(ConnectionsCounted(104.9, 1)) == []
    reason = "drain deadline (no successor) of 5 s reached"
    assert drain.handle(ConnectionsCounted(105.0, 1)) == [ForceClose(1, reason), Exit(reason)]


@pytest.mark.parametrize(
    ("flag", "environ", "deadline", "seconds"),
    [
        (None, {}, 5.0, 3600.0),  # one hour by default
        ("90", {MAX_ENV: "2h"}, 5.0, 90.0),  # the flag wins
        (None, {MAX_ENV: "2h"}, 5.0, 7200.0),
        (None, {MAX_ENV: "2h", GRACE_ENV: "3605"}, 25.0, 3600.0),  # the kubelet would kill it: grace less 5
        (None, {GRACE_ENV: "30"}, 25.0, 25.0),  # ztunnel's chart, grace only: the same drain as without a successor
        (None, {MAX_ENV: "1"}, 25.0, 25.0),  # never shorter than the drain without a successor
    ],
)
def test_drain_max_is_the_flag_or_environment_within_the_grace_period_and_never_below_the_deadline(
    flag: str | None, environ: dict[str, str], deadline: float, seconds: float
) -> None:
    assert parse_drain_max(flag, environ, deadline) == seconds


@pytest.mark.parametrize(
    ("flag", "environ", "message"),
    [
        ("forever", {}, "--drain-max: expected seconds"),
        (None, {MAX_ENV: "-1h"}, r"\$DRAIN_MAX: expected 0 seconds or more"),
        (None, {GRACE_ENV: "long"}, r"\$TERMINATION_GRACE_PERIOD_SECONDS: expected whole seconds"),
    ],
)
def test_a_bad_drain_max_is_one_clear_line(flag: str | None, environ: dict[str, str], message: str) -> None:
    with pytest.raises(NodeProxySettingsError, match=message):
        parse_drain_max(flag, environ, 5.0)


def test_a_stop_after_a_successor_took_over_keeps_connections_up_to_drain_max() -> None:
    drain = Drain(deadline=5.0, drain_max=3600.0)
    assert drain.handle(SuccessorChanged(1.0, True)) == []
    assert drain.handle(DrainRequested(10.0, "SIGTERM")) == [StopAccepting(3610.0, handover=True)]
    assert drain.handle(ConnectionsCounted(16.0, 1)) == []  # past the no-successor bound: still relaying
    assert drain.handle(ConnectionsCounted(600.0, 0)) == [Exit("every connection ended")]


def test_connections_left_at_drain_max_are_closed_and_the_reason_names_it() -> None:
    drain = Drain(deadline=5.0, drain_max=60.0)
    drain.handle(SuccessorChanged(0.0, True))
    drain.handle(DrainRequested(0.0, "SIGTERM"))
    assert drain.handle(ConnectionsCounted(59.9, 2)) == []
    reason = "drain-max (hand-over) of 60 s reached"
    assert drain.handle(ConnectionsCounted(60.0, 2)) == [ForceClose(2, reason), Exit(reason)]


def test_a_stop_with_no_successor_keeps_istios_short_bound_whatever_drain_max_is() -> None:
    drain = Drain(deadline=5.0, drain_max=3600.0)
    assert drain.handle(DrainRequested(10.0, "SIGTERM")) == [StopAccepting(15.0, handover=False)]
    reason = "drain deadline (no successor) of 5 s reached"
    assert drain.handle(ConnectionsCounted(15.0, 1)) == [ForceClose(1, reason), Exit(reason)]


def test_a_successor_gone_before_the_stop_means_the_short_bound() -> None:
    drain = Drain(deadline=5.0, drain_max=3600.0)
    drain.handle(SuccessorChanged(1.0, True))
    drain.handle(SuccessorChanged(2.0, False))
    assert drain.handle(DrainRequested(10.0, "SIGTERM")) == [StopAccepting(15.0, handover=False)]


def test_a_successor_ready_during_a_short_drain_lengthens_it_from_the_drains_start() -> None:
    drain = Drain(deadline=5.0, drain_max=100.0)
    drain.handle(DrainRequested(10.0, "SIGTERM"))
    assert drain.handle(SuccessorChanged(12.0, True)) == [ExtendDrain(110.0)]
    assert drain.handle(ConnectionsCounted(20.0, 1)) == []
    assert drain.handle(SuccessorChanged(13.0, True)) == []  # once


def test_a_successor_lost_during_a_hand_over_does_not_shorten_it() -> None:
    drain = Drain(deadline=5.0, drain_max=100.0)
    drain.handle(SuccessorChanged(0.0, True))
    drain.handle(DrainRequested(10.0, "SIGTERM"))
    assert drain.handle(SuccessorChanged(11.0, False)) == []
    assert drain.handle(ConnectionsCounted(50.0, 1)) == [] and drain.deadline == 110.0


def test_drain_max_below_the_deadline_is_raised_to_it() -> None:
    drain = Drain(deadline=30.0, drain_max=10.0)
    drain.handle(SuccessorChanged(0.0, True))
    assert drain.handle(DrainRequested(0.0, "SIGTERM")) == [StopAccepting(30.0, handover=True)]


events = st.one_of(
    st.builds(DrainRequested, st.floats(0, 200), st.just("x")),
    st.builds(ConnectionsCounted, st.floats(0, 200), st.integers(0, 3)),
    st.builds(SuccessorChanged, st.floats(0, 200), st.booleans()),
)


@given(st.lists(events, max_size=30))
def test_no_connection_is_closed_before_its_bound_nor_a_drain_held_past_drain_max(steps: list[object]) -> None:
    drain = Drain(deadline=5.0, drain_max=50.0)
    for event in steps:
        assert isinstance(event, DrainRequested | ConnectionsCounted | SuccessorChanged)
        commands = drain.handle(event)
        if drain.started_at is not None and drain.deadline is not None:
            lasts = drain.deadline - drain.started_at
            assert lasts == pytest.approx(5.0) or lasts == pytest.approx(50.0), lasts
        for command in commands:
            if isinstance(command, ForceClose) and isinstance(event, ConnectionsCounted):
                assert drain.deadline is not None and event.now >= drain.deadline


def test_a_second_request_cuts_the_drain_short() -> None:
    drain = Drain(deadline=3600.0)
    drain.handle(DrainRequested(0.0, "SIGTERM"))
    commands = drain.handle(DrainRequested(1.0, "SIGINT"))
    assert [type(c) for c in commands] == [ForceClose, Exit]
    assert drain.phase is Phase.DONE


@given(st.lists(st.tuples(st.floats(0, 100), st.integers(0, 5), st.booleans()), max_size=30))
def test_the_drain_stops_accepting_once_and_exits_once_after_it(steps: list[tuple[float, int, bool]]) -> None:
    drain = Drain(deadline=10.0)
    commands = []
    for now, live, request in steps:
        commands += drain.handle(DrainRequested(now, "x") if request else ConnectionsCounted(now, live))
    kinds = [type(c) for c in commands]
    assert kinds.count(StopAccepting) <= 1 and kinds.count(Exit) <= 1
    if Exit in kinds:
        assert kinds.index(StopAccepting) < kinds.index(Exit) and kinds[-1] is Exit


def test_the_drain_signal_reaches_watchers_once_late_ones_at_once_and_not_cancelled_ones() -> None:
    signal = DrainSignal()
    heard: list[str] = []
    signal.watch(lambda: heard.append("a"))
    cancel = signal.watch(lambda: heard.append("b"))
    cancel()

    def broken() -> None:
        raise RuntimeError("bug")

    signal.watch(broken)
    signal.watch(lambda: heard.append("c"))
    failures = signal.start()
    assert heard == ["a", "c"] and [str(f) for f in failures] == ["bug"]
    assert signal.start() == [] and heard == ["a", "c"]
    signal.watch(lambda: heard.append("late"))
    assert heard == ["a", "c", "late"] and signal.watchers == 0
