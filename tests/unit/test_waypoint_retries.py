"""The waypoint's retry state machine (ambit.waypoint.retries): transitions, backoff, deadlines, the replay bound."""

from __future__ import annotations

import pytest
from hypothesis import given
from hypothesis import strategies as st

from ambit.model.routes import RetryPolicy, Timeouts
from ambit.waypoint.retries import (
    CONNECT_FAILURE_BODY,
    DNS_FAILURE_BODY,
    REFUSED_BODY,
    REPLAY_LIMIT,
    RESET_BODY,
    TIMEOUT_BODY,
    AbortResponse,
    ArmAttemptTimer,
    ArmRequestTimer,
    AttemptStarted,
    AttemptTimedOut,
    BodyStarted,
    CancelAttempt,
    ConnectFailed,
    DnsFailed,
    Event,
    ForwardResponse,
    ReleaseBody,
    RequestBodySent,
    RequestTimedOut,
    RespondLocally,
    ResponseCompleted,
    ResponseHead,
    RetryMachine,
    RetryState,
    RetryStateError,
    StartAttempt,
    StreamRefused,
    UpstreamReset,
    _Input,
    after_retries,
    backoff_delay,
)

DEFAULT = RetryPolicy()
NO_RETRY = RetryPolicy(attempts=0)
NO_TIMEOUTS = Timeouts()


def started(
    retry: RetryPolicy = DEFAULT, timeouts: Timeouts = NO_TIMEOUTS, now: float = 100.0
) -> tuple[RetryMachine, list[object]]:
    machine = RetryMachine(retry, timeouts, now)
    first = list(machine.begin())
    first += machine.handle(AttemptStarted(1, now))
    return machine, first


# Rules 1 and 2: beginning, timers


def test_begin_starts_the_first_try_at_once_and_arms_the_request_timer() -> None:
    machine = RetryMachine(DEFAULT, Timeouts(request=2.0), 100.0)
    assert machine.state is RetryState.IDLE
    assert machine.begin() == [ArmRequestTimer(102.0), StartAttempt(1, 0.0)]
    assert machine.state is RetryState.WAITING


def test_no_request_timeout_arms_no_timer() -> None:
    assert RetryMachine(DEFAULT, Timeouts(), 0.0).begin() == [StartAttempt(1, 0.0)]


def test_a_started_try_arms_its_own_deadline_capped_by_the_request_deadline() -> None:
    machine = RetryMachine(DEFAULT, Timeouts(request=2.0, backend_request=0.5), 100.0)
    machine.begin()
    assert machine.handle(AttemptStarted(1, 100.1)) == [ArmAttemptTimer(1, 100.6)]
    assert machine.state is RetryState.ATTEMPTING
    capped = RetryMachine(DEFAULT, Timeouts(request=2.0, backend_request=5.0), 100.0)
    capped.begin()
    assert capped.handle(AttemptStarted(1, 100.0)) == [ArmAttemptTimer(1, 102.0)]
    assert started(timeouts=Timeouts(request=1.0))[1][-1] == StartAttempt(1, 0.0)


def test_begin_twice_is_the_shells_mistake() -> None:
    machine = RetryMachine(DEFAULT, Timeouts(), 0.0)
    machine.begin()
    with pytest.raises(RetryStateError, match="begin is not expected"):
        machine.begin()


# Rules 3 to 5: what retries, how often, how long apart


def test_a_non_retriable_status_is_forwarded() -> None:
    machine, _ = started()
    assert machine.handle(ResponseHead(1, 200, 100.0)) == [ForwardResponse(1)]
    assert machine.state is RetryState.FORWARDING


def test_a_retriable_status_cancels_the_try_and_starts_the_next_after_the_backoff() -> None:
    machine, _ = started()
    assert machine.handle(ResponseHead(1, 503, 100.0)) == [CancelAttempt(1), StartAttempt(2, 0.025)]
    assert machine.state is RetryState.WAITING
    assert machine.handle(AttemptStarted(2, 100.03)) == []
    assert machine.handle(ResponseHead(2, 200, 100.05)) == [ForwardResponse(2)]


def test_the_last_try_forwards_a_retriable_status_as_it_is() -> None:
    machine, _ = started(RetryPolicy(attempts=1))
    machine.handle(ResponseHead(1, 503, 100.0))
    machine.handle(AttemptStarted(2, 100.1))
    assert machine.handle(ResponseHead(2, 503, 100.2)) == [ForwardResponse(2)]


def test_attempts_counts_retries_after_the_first_try() -> None:
    machine, _ = started(RetryPolicy(attempts=3, codes=(502,)))
    tries = 1
    while True:
        commands = machine.handle(ResponseHead(machine.attempt, 502, 100.0))
        if commands == [ForwardResponse(machine.attempt)]:
            break
        tries += 1
        machine.handle(AttemptStarted(machine.attempt, 100.0))
    assert tries == 4


def test_backoff_doubles_up_to_ten_times_the_base() -> None:
    policy = RetryPolicy(attempts=8, backoff=0.1)
    assert [round(backoff_delay(policy, n), 6) for n in range(1, 8)] == [0.1, 0.2, 0.4, 0.8, 1.0, 1.0, 1.0]
    machine, _ = started(policy)
    delays = []
    for _ in range(5):
        start = machine.handle(ConnectFailed(machine.attempt, 100.0))[-1]
        assert isinstance(start, StartAttempt)
        delays.append(round(start.delay, 6))
        machine.handle(AttemptStarted(start.attempt, 100.0))
    assert delays == [0.1, 0.2, 0.4, 0.8, 1.0]


def test_connect_failures_retry_then_answer_503() -> None:
    machine, _ = started(RetryPolicy(attempts=1))
    assert machine.handle(ConnectFailed(1, 100.0)) == [StartAttempt(2, 0.025)]
    machine.handle(AttemptStarted(2, 100.1))
    retried = b"upstream connect error or disconnect/reset before headers. retried and the latest reset reason: "
    assert machine.handle(ConnectFailed(2, 100.1)) == [
        RespondLocally(503, retried + b"remote connection failure", "UF")
    ]
    assert machine.done
    assert CONNECT_FAILURE_BODY == (
        b"upstream connect error or disconnect/reset before headers. reset reason: remote connection failure"
    )


def test_connect_failures_are_not_retried_when_the_policy_says_so() -> None:
    machine, _ = started(RetryPolicy(on_connect_failure=False))
    assert machine.handle(ConnectFailed(1, 100.0)) == [RespondLocally(503, CONNECT_FAILURE_BODY, "UF")]


def test_a_name_that_did_not_resolve_answers_503_df_and_is_never_retried() -> None:
    machine, _ = started(RetryPolicy(attempts=3))
    assert machine.handle(DnsFailed(1)) == [RespondLocally(503, DNS_FAILURE_BODY, "DF")]
    assert machine.done and machine.attempt == 1
    assert machine.handle(DnsFailed(1)) == []  # once done, events are ignored (rule 9)


def test_a_try_timeout_answers_504_unless_504_is_retriable() -> None:
    machine, _ = started(timeouts=Timeouts(backend_request=1.0))
    assert machine.handle(AttemptTimedOut(1, 101.0)) == [
        CancelAttempt(1),
        RespondLocally(504, TIMEOUT_BODY, "UT"),
    ]
    retrying, _ = started(RetryPolicy(codes=(503, 504)), Timeouts(backend_request=1.0))
    assert retrying.handle(AttemptTimedOut(1, 101.0)) == [CancelAttempt(1), StartAttempt(2, 0.025)]
    assert retrying.handle(AttemptStarted(2, 101.1)) == [ArmAttemptTimer(2, 102.1)]


def test_a_refused_stream_retries_like_a_connect_failure_then_answers_503() -> None:
    machine, _ = started(RetryPolicy(attempts=1))
    assert machine.handle(StreamRefused(1, 100.0)) == [StartAttempt(2, 0.025)]
    machine.handle(AttemptStarted(2, 100.1))
    assert machine.handle(StreamRefused(2, 100.1)) == [RespondLocally(503, after_retries(REFUSED_BODY), "UR")]
    assert after_retries(REFUSED_BODY).endswith(
        b"headers. retried and the latest reset reason: remote refused stream reset"
    )
    off, _ = started(RetryPolicy(on_connect_failure=False))
    assert off.handle(StreamRefused(1, 100.0)) == [RespondLocally(503, REFUSED_BODY, "UR")]


def test_a_reset_before_the_head_answers_503_and_is_not_retried() -> None:
    machine, _ = started()
    assert machine.handle(UpstreamReset(1)) == [RespondLocally(503, RESET_BODY, "UC")]


def test_no_retry_starts_at_or_after_the_request_deadline() -> None:
    machine, _ = started(RetryPolicy(backoff=0.5), Timeouts(request=1.0), now=100.0)
    assert machine.handle(ResponseHead(1, 503, 100.4)) == [CancelAttempt(1), StartAttempt(2, 0.5)]
    machine.handle(AttemptStarted(2, 100.9))
    assert machine.handle(ResponseHead(2, 503, 100.95)) == [ForwardResponse(2)]


def test_zero_attempts_never_retries() -> None:
    machine, _ = started(NO_RETRY)
    assert machine.handle(ConnectFailed(1, 100.0)) == [RespondLocally(503, CONNECT_FAILURE_BODY, "UF")]


# Rule 6: the request body


def test_a_request_body_past_the_replay_limit_stops_retries_and_releases_the_buffer() -> None:
    machine, _ = started()
    assert machine.handle(RequestBodySent(REPLAY_LIMIT)) == []
    assert machine.handle(RequestBodySent(REPLAY_LIMIT + 1)) == [ReleaseBody()]
    assert machine.handle(RequestBodySent(REPLAY_LIMIT * 4)) == []
    assert machine.handle(ResponseHead(1, 503, 100.0)) == [ForwardResponse(1)]


def test_a_small_body_still_retries() -> None:
    machine, _ = started()
    machine.handle(RequestBodySent(1024))
    assert machine.handle(ResponseHead(1, 503, 100.0))[-1] == StartAttempt(2, 0.025)


# Rules 7 and 8: the request deadline; after the head is forwarded


def test_the_request_deadline_answers_504_before_a_head_was_forwarded() -> None:
    machine, _ = started(timeouts=Timeouts(request=1.0))
    assert machine.handle(RequestTimedOut()) == [CancelAttempt(1), RespondLocally(504, TIMEOUT_BODY, "UT")]
    waiting, _ = started(timeouts=Timeouts(request=1.0))
    waiting.handle(ResponseHead(1, 503, 100.1))
    assert waiting.handle(RequestTimedOut()) == [RespondLocally(504, TIMEOUT_BODY, "UT")]


def test_after_the_head_a_deadline_or_a_reset_aborts_the_client_stream() -> None:
    for event, commands in [
        (RequestTimedOut(), [CancelAttempt(1), AbortResponse("UT")]),
        (AttemptTimedOut(1, 101.0), [CancelAttempt(1), AbortResponse("UT")]),
        (UpstreamReset(1), [AbortResponse("UC")]),
    ]:
        machine, _ = started(RetryPolicy(codes=(504,)), Timeouts(backend_request=1.0))
        machine.handle(ResponseHead(1, 200, 100.0))
        machine.handle(BodyStarted())
        assert machine.handle(event) == commands
        assert machine.done


def test_a_forwarded_response_is_never_retried_and_completes() -> None:
    machine, _ = started()
    machine.handle(ResponseHead(1, 200, 100.0))
    assert machine.handle(BodyStarted()) == []
    assert machine.handle(RequestBodySent(REPLAY_LIMIT + 1)) == [ReleaseBody()]
    assert machine.handle(ResponseCompleted()) == []
    assert machine.state is RetryState.DONE


# Rules 9 and 10: stale and unexpected events


def test_events_of_a_replaced_try_and_after_the_end_are_ignored() -> None:
    machine, _ = started(timeouts=Timeouts(backend_request=1.0))
    machine.handle(ResponseHead(1, 503, 100.0))
    machine.handle(AttemptStarted(2, 100.1))
    assert machine.handle(AttemptTimedOut(1, 101.0)) == []
    assert machine.handle(ResponseHead(1, 200, 101.0)) == []
    machine.handle(ResponseHead(2, 200, 100.2))
    machine.handle(ResponseCompleted())
    assert machine.handle(RequestTimedOut()) == [] and machine.handle(AttemptTimedOut(2, 101.1)) == []


@pytest.mark.parametrize(
    "event",
    [ResponseHead(1, 200, 0.0), BodyStarted(), ResponseCompleted(), ConnectFailed(1, 0.0), StreamRefused(1, 0.0)],
)
def test_an_event_the_state_does_not_take_is_the_shells_mistake(event: Event) -> None:
    machine = RetryMachine(DEFAULT, Timeouts(), 0.0)
    machine.begin()
    with pytest.raises(RetryStateError):
        machine.handle(event)


def test_response_bytes_before_forwarding_are_the_shells_mistake() -> None:
    machine, _ = started()
    with pytest.raises(RetryStateError, match="response body started is not expected while try in flight"):
        machine.handle(BodyStarted())


# Property: whatever the upstream does, a correct shell gets exactly one outcome and never more tries than allowed.

_outcomes = st.sampled_from(["200", "503", "504", "connect", "refused", "timeout", "reset"])


@given(
    attempts=st.integers(0, 4),
    codes=st.sampled_from([(503,), (503, 504), ()]),
    request_timeout=st.none() | st.floats(0.01, 5.0),
    script=st.lists(st.tuples(_outcomes, st.floats(0.0, 0.5)), min_size=1, max_size=8),
    big_body=st.booleans(),
)
def test_every_exchange_ends_in_one_outcome_within_the_retry_budget(
    attempts: int,
    codes: tuple[int, ...],
    request_timeout: float | None,
    script: list[tuple[str, float]],
    big_body: bool,
) -> None:
    machine = RetryMachine(RetryPolicy(attempts=attempts, codes=codes), Timeouts(request=request_timeout), 0.0)
    now = 0.0
    pending = machine.begin()
    outcomes: list[object] = []
    steps = iter(script)
    if big_body:
        pending += machine.handle(RequestBodySent(REPLAY_LIMIT + 1))
    while not machine.done:
        start = next((c for c in pending if isinstance(c, StartAttempt)), None)
        outcomes += [c for c in pending if isinstance(c, ForwardResponse | RespondLocally | AbortResponse)]
        if machine.state is RetryState.FORWARDING:
            pending = machine.handle(ResponseCompleted())
            continue
        step = next(steps, None)
        if step is None or (request_timeout is not None and now >= request_timeout):
            pending = machine.handle(RequestTimedOut())
            continue
        if start is not None:
            now += start.delay
            machine.handle(AttemptStarted(start.attempt, now))
        kind, took = step
        now += took
        attempt = machine.attempt
        event: Event = {
            "200": ResponseHead(attempt, 200, now),
            "503": ResponseHead(attempt, 503, now),
            "504": ResponseHead(attempt, 504, now),
            "connect": ConnectFailed(attempt, now),
            "refused": StreamRefused(attempt, now),
            "timeout": AttemptTimedOut(attempt, now),
            "reset": UpstreamReset(attempt),
        }[kind]
        pending = machine.handle(event)
    outcomes += [c for c in pending if isinstance(c, ForwardResponse | RespondLocally | AbortResponse)]
    assert len(outcomes) == 1
    assert machine.attempt <= (1 if big_body else attempts + 1)


# Rule 11: the fast path takes the table's own steps

_now = st.floats(0.0, 10.0)
_try = st.integers(0, 3)
_events = st.one_of(
    st.builds(AttemptStarted, _try, _now),
    st.builds(ResponseHead, _try, st.sampled_from([101, 200, 404, 503, 504]), _now),
    st.builds(ConnectFailed, _try, _now),
    st.builds(DnsFailed, _try),
    st.builds(AttemptTimedOut, _try, _now),
    st.builds(StreamRefused, _try, _now),
    st.builds(UpstreamReset, _try),
    st.just(RequestTimedOut()),
    st.builds(RequestBodySent, st.sampled_from([0, 1, REPLAY_LIMIT, REPLAY_LIMIT + 1])),
    st.just(BodyStarted()),
    st.just(ResponseCompleted()),
)


def _step(machine: RetryMachine, event: Event | None, *, by_table: bool) -> object:
    """The commands of one step, or the error it raised (``event`` None: begin)."""
    try:
        if event is None:
            return machine._step(_Input.BEGIN, None) if by_table else machine.begin()
        return machine.handle_by_table(event) if by_table else machine.handle(event)
    except RetryStateError as exc:
        return str(exc)


@given(
    attempts=st.integers(0, 3),
    codes=st.sampled_from([(503,), (503, 504), ()]),
    request_timeout=st.none() | st.floats(0.5, 5.0),
    backend_timeout=st.none() | st.floats(0.1, 2.0),
    script=st.lists(st.none() | _events, max_size=12),
)
def test_the_fast_path_gives_the_tables_state_and_commands_for_any_events(
    attempts: int,
    codes: tuple[int, ...],
    request_timeout: float | None,
    backend_timeout: float | None,
    script: list[Event | None],
) -> None:
    policy = RetryPolicy(attempts=attempts, codes=codes, on_connect_failure=attempts % 2 == 0)
    timeouts = Timeouts(request=request_timeout, backend_request=backend_timeout)
    fast, table = RetryMachine(policy, timeouts, 1.0), RetryMachine(policy, timeouts, 1.0)
    for event in [None, *script]:  # begin first, then anything, begin again included
        assert _step(fast, event, by_table=False) == _step(table, event, by_table=True)
        assert (fast.state, fast.attempt, fast.replayable) == (table.state, table.attempt, table.replayable)


def test_a_first_try_that_succeeds_takes_the_fast_path_only(monkeypatch: pytest.MonkeyPatch) -> None:
    machine = RetryMachine(DEFAULT, Timeouts(request=5.0, backend_request=1.0), 100.0)

    def no_table(*args: object) -> object:
        raise AssertionError("the table was looked up")

    monkeypatch.setattr(machine, "handle_by_table", no_table)
    monkeypatch.setattr(machine, "_step", no_table)
    assert machine.begin() == [ArmRequestTimer(105.0), StartAttempt(1, 0.0)]
    assert machine.handle(AttemptStarted(1, 100.0)) == [ArmAttemptTimer(1, 101.0)]
    assert machine.handle(RequestBodySent(10)) == []
    assert machine.handle(ResponseHead(1, 200, 100.5)) == [ForwardResponse(1)]
    assert machine.handle(BodyStarted()) == []
    assert machine.handle(ResponseCompleted()) == []
    assert machine.done
