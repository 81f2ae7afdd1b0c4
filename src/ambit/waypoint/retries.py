"""One request's tries under a route's :class:`RetryPolicy` and :class:`Timeouts`: a table-driven state machine.

The shell forwards a request as :class:`~ambit.waypoint.decisions.Forward` says, feeds this machine what happens
(events, each a past-tense fact with the time where it matters) and carries out the commands it returns. The machine
owns no clock and no timer: it says when a timer is due (``Arm*Timer``) and the shell reports when one fired.

Rules:

1. :meth:`RetryMachine.begin` starts the exchange: the request deadline is ``now + timeouts.request``
   (:class:`ArmRequestTimer`; no timer without a request timeout) and the first try starts at once.
2. :class:`StartAttempt` asks the shell to send the request (replayed from its buffer from the second try on) to an
   endpoint picked anew, after ``delay`` seconds. The shell reports :class:`AttemptStarted` as it starts (before it
   connects, so that a connection failure is that try's); the try's
   deadline is then ``now + timeouts.backend_request``, capped by the request deadline (:class:`ArmAttemptTimer`),
   and it bounds the try until its response is complete (Gateway API ``backendRequest``).
3. A try fails in a retriable way when its response head has a status in ``retry.codes``, when it could not connect
   (:class:`ConnectFailed`, if ``retry.on_connect_failure``), or when its deadline passed (:class:`AttemptTimedOut`,
   counted as a 504: retriable when 504 is one of the codes). A stream the upstream refused before doing anything
   with it (:class:`StreamRefused`, HTTP/2 ``REFUSED_STREAM``) is retriable like a connection failure (Istio's
   default ``refused-stream``, under the same ``on_connect_failure`` switch here). Any other reset before the
   response head (:class:`UpstreamReset`) is not retried (Istio's default conditions do not include ``reset``).
4. A retriable failure is retried while all hold: fewer than ``retry.attempts`` retries were made, the request body
   can still be replayed (rule 6), and the retry would start before the request deadline.
5. Retry ``n`` (1-based) waits ``retry.backoff * 2**(n-1)`` seconds, at most ``10 * retry.backoff`` (Envoy's default
   ceiling). There is no jitter: the machine is deterministic; the shell may add its own.
6. The request body can be replayed while the shell has all of it buffered: :class:`RequestBodySent` reports the
   bytes sent so far; past :data:`REPLAY_LIMIT` (64 KiB, Envoy's default per-request buffer) nothing is retried any
   more and the shell drops the buffer (:class:`ReleaseBody`).
7. When a failure is not retried: a response head is forwarded (:class:`ForwardResponse`, also for a retriable
   status on the last try, as Envoy does); a connection failure answers 503 (:data:`CONNECT_FAILURE_BODY`, flag
   ``UF``; Envoy's reset reason ``remote connection failure``, and, as for the other resets, ``retried and the
   latest reset reason`` once the request was retried: :func:`after_retries`); a name that did not resolve
   (:class:`DnsFailed`, a ``DYNAMIC_DNS`` host or a ``resolution: DNS`` endpoint resolved per request) 503
   :data:`DNS_FAILURE_BODY` with flag ``DF``, never retried (Envoy answers it in its dynamic forward proxy filter,
   before the router that retries); a refused stream 503 (flag ``UR``); a reset before headers 503 (flag ``UC``);
   a passed try deadline 504 "upstream request timeout" (``UT``). A try that is given up while its stream is open
   is cancelled (:class:`CancelAttempt`: reset it, drop its answer).
8. Once a response head is forwarded, nothing is retried: the client has the status. The request deadline or the
   try's deadline passing then, or the upstream resetting, aborts the client's stream (:class:`AbortResponse`).
   :class:`BodyStarted` (response bytes went to the client) and :class:`ResponseCompleted` are accepted there.
9. An event naming a try other than the current one is stale (a timer that fired as the try was replaced) and is
   ignored, as is every event once the exchange is done.
10. Any other (state, event) pair is the shell's mistake and raises :class:`RetryStateError`: the table below lists
    every pair that is allowed.
11. The steps of a try that succeeds (the first try started, a head that is not retried forwarded, the response
    body started and completed, a replayable body piece sent) are taken without classifying the event and looking
    up the table (:meth:`RetryMachine.handle`'s fast path): they are the table's own entries, written out, and
    give the same state and commands as :meth:`RetryMachine.handle_by_table`, which every other step takes.
"""

from __future__ import annotations

import enum
from dataclasses import dataclass

from ambit.errors import AmbitError
from ambit.model.routes import RetryPolicy, Timeouts

__all__ = [
    "BACKOFF_CEILING",
    "CONNECT_FAILURE_BODY",
    "DNS_FAILURE_BODY",
    "REFUSED_BODY",
    "REPLAY_LIMIT",
    "RESET_BODY",
    "TIMEOUT_BODY",
    "AbortResponse",
    "ArmAttemptTimer",
    "ArmRequestTimer",
    "AttemptStarted",
    "AttemptTimedOut",
    "BodyStarted",
    "CancelAttempt",
    "Command",
    "ConnectFailed",
    "DnsFailed",
    "Event",
    "ForwardResponse",
    "ReleaseBody",
    "RequestBodySent",
    "RequestTimedOut",
    "RespondLocally",
    "ResponseCompleted",
    "ResponseHead",
    "RetryMachine",
    "RetryState",
    "RetryStateError",
    "StartAttempt",
    "StreamRefused",
    "UpstreamReset",
    "backoff_delay",
]

REPLAY_LIMIT = 64 * 1024
"""Request body bytes the shell buffers for replay; a longer body is never retried (rule 6)."""
BACKOFF_CEILING = 10
"""The longest wait between tries, in multiples of the policy's backoff (rule 5)."""
RESET_PREFIX = b"upstream connect error or disconnect/reset before headers. "
RETRIED = b"retried and the latest "
"""Envoy's router says so in a reset's answer once the request was retried (``Filter::onUpstreamReset``)."""
CONNECT_FAILURE_BODY = RESET_PREFIX + b"reset reason: remote connection failure"
DNS_FAILURE_BODY = b"DNS resolution failure"
RESET_BODY = RESET_PREFIX + b"reset reason: connection termination"
REFUSED_BODY = RESET_PREFIX + b"reset reason: remote refused stream reset"
TIMEOUT_BODY = b"upstream request timeout"


def after_retries(body: bytes) -> bytes:
    """A reset's answer (:data:`CONNECT_FAILURE_BODY`, :data:`REFUSED_BODY`, :data:`RESET_BODY`) as the router
    writes it when the failed try was a retry: ``... before headers. retried and the latest reset reason: ...``."""
    return RESET_PREFIX + RETRIED + body.removeprefix(RESET_PREFIX)


class RetryStateError(AmbitError):
    """The shell fed an event the machine cannot take in its state (local misuse, rule 10)."""


# Events (what happened)


@dataclass(frozen=True, slots=True)
class AttemptStarted:
    attempt: int
    now: float


@dataclass(frozen=True, slots=True)
class ResponseHead:
    attempt: int
    status: int
    now: float


@dataclass(frozen=True, slots=True)
class ConnectFailed:
    attempt: int
    now: float


@dataclass(frozen=True, slots=True)
class DnsFailed:
    """The try's endpoint is a name that did not resolve: nothing was dialled (rule 7)."""

    attempt: int


@dataclass(frozen=True, slots=True)
class AttemptTimedOut:
    attempt: int
    now: float


@dataclass(frozen=True, slots=True)
class StreamRefused:
    attempt: int
    now: float


@dataclass(frozen=True, slots=True)
class UpstreamReset:
    attempt: int


@dataclass(frozen=True, slots=True)
class RequestTimedOut:
    pass


@dataclass(frozen=True, slots=True)
class RequestBodySent:
    total: int
    """Request body bytes sent upstream so far (the size of the replay buffer)."""


@dataclass(frozen=True, slots=True)
class BodyStarted:
    pass


@dataclass(frozen=True, slots=True)
class ResponseCompleted:
    pass


Event = (
    AttemptStarted
    | ResponseHead
    | ConnectFailed
    | DnsFailed
    | AttemptTimedOut
    | StreamRefused
    | UpstreamReset
    | RequestTimedOut
    | RequestBodySent
    | BodyStarted
    | ResponseCompleted
)


# Commands (what to do)


@dataclass(frozen=True, slots=True)
class ArmRequestTimer:
    deadline: float


@dataclass(frozen=True, slots=True)
class StartAttempt:
    attempt: int
    delay: float
    """Seconds to wait before sending (the backoff); 0 for the first try."""


@dataclass(frozen=True, slots=True)
class ArmAttemptTimer:
    attempt: int
    deadline: float


@dataclass(frozen=True, slots=True)
class CancelAttempt:
    attempt: int


@dataclass(frozen=True, slots=True)
class ForwardResponse:
    attempt: int


@dataclass(frozen=True, slots=True)
class RespondLocally:
    status: int
    body: bytes
    flag: str
    """Envoy's response flag for logs and metrics: ``UF`` connect failure, ``DF`` DNS resolution failed, ``UC``
    reset, ``UT`` timeout."""


@dataclass(frozen=True, slots=True)
class AbortResponse:
    flag: str


@dataclass(frozen=True, slots=True)
class ReleaseBody:
    pass


Command = (
    ArmRequestTimer
    | StartAttempt
    | ArmAttemptTimer
    | CancelAttempt
    | ForwardResponse
    | RespondLocally
    | AbortResponse
    | ReleaseBody
)


class RetryState(enum.Enum):
    IDLE = "idle"
    WAITING = "waiting for a try to start"
    ATTEMPTING = "try in flight"
    FORWARDING = "response forwarded"
    DONE = "done"

    # Members are singletons: the identity hash (in C) serves the table's keys; Enum's own hashes the name in Python.
    __hash__ = object.__hash__


class _Input(enum.Enum):
    BEGIN = "begin"
    STARTED = "try started"
    HEAD_RETRY = "retriable response head"
    HEAD_FINAL = "response head"
    CONNECT_RETRY = "retriable connect failure"
    CONNECT_FINAL = "connect failure"
    DNS_FAILED = "name did not resolve"
    TRY_TIMEOUT_RETRY = "retriable try timeout"
    TRY_TIMEOUT_FINAL = "try timeout"
    REFUSED_RETRY = "retriable refused stream"
    REFUSED_FINAL = "refused stream"
    RESET = "upstream reset"
    REQUEST_TIMEOUT = "request timeout"
    BODY_SMALL = "request body replayable"
    BODY_LARGE = "request body too long to replay"
    BODY_STARTED = "response body started"
    COMPLETED = "response completed"

    __hash__ = object.__hash__  # as RetryState's


class _Act(enum.Enum):
    ARM_REQUEST = enum.auto()
    START_FIRST = enum.auto()
    ARM_ATTEMPT = enum.auto()
    CANCEL = enum.auto()
    START_NEXT = enum.auto()
    FORWARD = enum.auto()
    RESPOND_CONNECT = enum.auto()
    RESPOND_DNS = enum.auto()
    RESPOND_REFUSED = enum.auto()
    RESPOND_RESET = enum.auto()
    RESPOND_TIMEOUT = enum.auto()
    ABORT_RESET = enum.auto()
    ABORT_TIMEOUT = enum.auto()
    RELEASE = enum.auto()


_S = RetryState
_I = _Input
_A = _Act
_TABLE: dict[tuple[RetryState, _Input], tuple[RetryState, tuple[_Act, ...]]] = {
    (_S.IDLE, _I.BEGIN): (_S.WAITING, (_A.ARM_REQUEST, _A.START_FIRST)),
    (_S.WAITING, _I.STARTED): (_S.ATTEMPTING, (_A.ARM_ATTEMPT,)),
    (_S.WAITING, _I.REQUEST_TIMEOUT): (_S.DONE, (_A.RESPOND_TIMEOUT,)),
    (_S.WAITING, _I.BODY_SMALL): (_S.WAITING, ()),
    (_S.WAITING, _I.BODY_LARGE): (_S.WAITING, (_A.RELEASE,)),
    (_S.ATTEMPTING, _I.HEAD_RETRY): (_S.WAITING, (_A.CANCEL, _A.START_NEXT)),
    (_S.ATTEMPTING, _I.HEAD_FINAL): (_S.FORWARDING, (_A.FORWARD,)),
    (_S.ATTEMPTING, _I.CONNECT_RETRY): (_S.WAITING, (_A.START_NEXT,)),
    (_S.ATTEMPTING, _I.CONNECT_FINAL): (_S.DONE, (_A.RESPOND_CONNECT,)),
    (_S.ATTEMPTING, _I.DNS_FAILED): (_S.DONE, (_A.RESPOND_DNS,)),
    (_S.ATTEMPTING, _I.TRY_TIMEOUT_RETRY): (_S.WAITING, (_A.CANCEL, _A.START_NEXT)),
    (_S.ATTEMPTING, _I.TRY_TIMEOUT_FINAL): (_S.DONE, (_A.CANCEL, _A.RESPOND_TIMEOUT)),
    (_S.ATTEMPTING, _I.REFUSED_RETRY): (_S.WAITING, (_A.START_NEXT,)),
    (_S.ATTEMPTING, _I.REFUSED_FINAL): (_S.DONE, (_A.RESPOND_REFUSED,)),
    (_S.ATTEMPTING, _I.RESET): (_S.DONE, (_A.RESPOND_RESET,)),
    (_S.ATTEMPTING, _I.REQUEST_TIMEOUT): (_S.DONE, (_A.CANCEL, _A.RESPOND_TIMEOUT)),
    (_S.ATTEMPTING, _I.BODY_SMALL): (_S.ATTEMPTING, ()),
    (_S.ATTEMPTING, _I.BODY_LARGE): (_S.ATTEMPTING, (_A.RELEASE,)),
    (_S.FORWARDING, _I.BODY_STARTED): (_S.FORWARDING, ()),
    (_S.FORWARDING, _I.BODY_SMALL): (_S.FORWARDING, ()),
    (_S.FORWARDING, _I.BODY_LARGE): (_S.FORWARDING, (_A.RELEASE,)),
    (_S.FORWARDING, _I.COMPLETED): (_S.DONE, ()),
    (_S.FORWARDING, _I.RESET): (_S.DONE, (_A.ABORT_RESET,)),
    (_S.FORWARDING, _I.TRY_TIMEOUT_FINAL): (_S.DONE, (_A.CANCEL, _A.ABORT_TIMEOUT)),
    (_S.FORWARDING, _I.REQUEST_TIMEOUT): (_S.DONE, (_A.CANCEL, _A.ABORT_TIMEOUT)),
}
"""(state, input) → (next state, actions in order). A pair missing here is :class:`RetryStateError` (rule 10)."""


_PER_TRY = (AttemptStarted, ResponseHead, ConnectFailed, DnsFailed, AttemptTimedOut, StreamRefused, UpstreamReset)
"""The events that name their try (rule 9)."""


def backoff_delay(policy: RetryPolicy, retry: int) -> float:
    """Seconds before retry number ``retry`` (1-based; rule 5)."""
    base = max(policy.backoff, 0.0)
    return float(min(base * 2 ** min(retry - 1, 64), BACKOFF_CEILING * base))


class RetryMachine:
    """The tries of one request. Call :meth:`begin` once, then :meth:`handle` with each event; carry out the
    commands returned, in order."""

    def __init__(self, retry: RetryPolicy, timeouts: Timeouts, now: float) -> None:
        self.retry = retry
        self.timeouts = timeouts
        self.state = RetryState.IDLE
        self.attempt = 0
        """The current try, 1-based; 0 before :meth:`begin`."""
        self.request_deadline = None if timeouts.request is None else now + max(timeouts.request, 0.0)
        self.replayable = True
        self._next_delay = 0.0

    @property
    def done(self) -> bool:
        return self.state is RetryState.DONE

    def begin(self) -> list[Command]:
        if self.state is not RetryState.IDLE:
            return self._step(_Input.BEGIN, None)  # raises (rule 10)
        self.state, self.attempt = RetryState.WAITING, 1  # the table's (IDLE, BEGIN), written out (rule 11)
        start = StartAttempt(1, 0.0)
        return [start] if self.request_deadline is None else [ArmRequestTimer(self.request_deadline), start]

    def handle(self, event: Event) -> list[Command]:
        """Rule 11's fast path for the steps of a try that succeeds, else :meth:`handle_by_table`."""
        state = self.state
        if state is RetryState.FORWARDING:
            if type(event) is ResponseCompleted:
                self.state = RetryState.DONE
                return []
            if type(event) is BodyStarted:
                return []
        elif state is RetryState.ATTEMPTING:
            if type(event) is ResponseHead and event.attempt == self.attempt and event.status not in self.retry.codes:
                self.state = RetryState.FORWARDING
                return [ForwardResponse(self.attempt)]
        elif state is RetryState.WAITING and type(event) is AttemptStarted and event.attempt == self.attempt:
            self.state = RetryState.ATTEMPTING
            timer = self._attempt_timer(event.now)
            return [] if timer is None else [timer]
        if (
            type(event) is RequestBodySent
            and state is not RetryState.IDLE
            and state is not RetryState.DONE
            and (event.total <= REPLAY_LIMIT or not self.replayable)
        ):
            return []
        return self.handle_by_table(event)

    def handle_by_table(self, event: Event) -> list[Command]:
        """Every step through the table (rules 9 and 10); :meth:`handle` takes rule 11's steps without it."""
        if self.state is RetryState.DONE:
            return []
        if isinstance(event, _PER_TRY) and event.attempt != self.attempt:
            return []
        return self._step(self._classify(event), event)

    def _classify(self, event: Event) -> _Input:
        attempting = self.state is RetryState.ATTEMPTING
        match event:  # the events of every request first
            case AttemptStarted():
                return _Input.STARTED
            case ResponseHead(status=status, now=now):
                retry = attempting and status in self.retry.codes and self._may_retry(now)
                return _Input.HEAD_RETRY if retry else _Input.HEAD_FINAL
            case ResponseCompleted():
                return _Input.COMPLETED
            case BodyStarted():
                return _Input.BODY_STARTED
            case ConnectFailed(now=now):
                retry = attempting and self.retry.on_connect_failure and self._may_retry(now)
                return _Input.CONNECT_RETRY if retry else _Input.CONNECT_FINAL
            case DnsFailed():
                return _Input.DNS_FAILED
            case AttemptTimedOut(now=now):
                retry = attempting and 504 in self.retry.codes and self._may_retry(now)
                return _Input.TRY_TIMEOUT_RETRY if retry else _Input.TRY_TIMEOUT_FINAL
            case StreamRefused(now=now):
                retry = attempting and self.retry.on_connect_failure and self._may_retry(now)
                return _Input.REFUSED_RETRY if retry else _Input.REFUSED_FINAL
            case UpstreamReset():
                return _Input.RESET
            case RequestTimedOut():
                return _Input.REQUEST_TIMEOUT
            case RequestBodySent(total=total):
                return _Input.BODY_LARGE if total > REPLAY_LIMIT and self.replayable else _Input.BODY_SMALL

    def _may_retry(self, now: float) -> bool:
        retries_made = self.attempt - 1
        if retries_made >= self.retry.attempts or not self.replayable:
            return False
        delay = backoff_delay(self.retry, retries_made + 1)
        if self.request_deadline is not None and now + delay >= self.request_deadline:
            return False
        self._next_delay = delay
        return True

    def _step(self, step: _Input, event: Event | None) -> list[Command]:
        entry = _TABLE.get((self.state, step))
        if entry is None:
            raise RetryStateError(f"retries: {step.value} is not expected while {self.state.value}")
        self.state, acts = entry
        return [command for act in acts if (command := self._command(act, event)) is not None]

    def _command(self, act: _Act, event: Event | None) -> Command | None:
        match act:
            case _Act.ARM_REQUEST:
                return None if self.request_deadline is None else ArmRequestTimer(self.request_deadline)
            case _Act.START_FIRST:
                self.attempt = 1
                return StartAttempt(1, 0.0)
            case _Act.ARM_ATTEMPT:
                assert isinstance(event, AttemptStarted)
                return self._attempt_timer(event.now)
            case _Act.CANCEL:
                return CancelAttempt(self.attempt)
            case _Act.START_NEXT:
                self.attempt += 1
                return StartAttempt(self.attempt, self._next_delay)
            case _Act.FORWARD:
                return ForwardResponse(self.attempt)
            case _Act.RESPOND_CONNECT:
                return RespondLocally(503, self._reset_body(CONNECT_FAILURE_BODY), "UF")
            case _Act.RESPOND_DNS:
                return RespondLocally(503, DNS_FAILURE_BODY, "DF")
            case _Act.RESPOND_REFUSED:
                return RespondLocally(503, self._reset_body(REFUSED_BODY), "UR")
            case _Act.RESPOND_RESET:
                return RespondLocally(503, self._reset_body(RESET_BODY), "UC")
            case _Act.RESPOND_TIMEOUT:
                return RespondLocally(504, TIMEOUT_BODY, "UT")
            case _Act.ABORT_RESET:
                return AbortResponse("UC")
            case _Act.ABORT_TIMEOUT:
                return AbortResponse("UT")
            case _Act.RELEASE:
                self.replayable = False
                return ReleaseBody()

    def _reset_body(self, body: bytes) -> bytes:
        """Rule 7: the reset's answer, saying the request was retried when the failed try was not the first."""
        return after_retries(body) if self.attempt > 1 else body

    def _attempt_timer(self, now: float) -> ArmAttemptTimer | None:
        if self.timeouts.backend_request is None:
            return None
        deadline = now + max(self.timeouts.backend_request, 0.0)
        if self.request_deadline is not None:
            deadline = min(deadline, self.request_deadline)
        return ArmAttemptTimer(self.attempt, deadline)
