"""The timers of a forwarded request (ambit.waypoint.forwarding rules 1, 2 and 7), driven in memory: a request
timer and a try timer each one loop timer handle, fired once or cancelled when the exchange ends; a try given up
by a timer is stopped, a retried one returns; a cancellation from elsewhere is passed on."""

from __future__ import annotations

import asyncio
import ipaddress
import time
from collections.abc import Iterable
from dataclasses import dataclass, field
from typing import Any

import pytest

from ambit.model.routes import RetryPolicy, Timeouts
from ambit.model.workload import Workload
from ambit.waypoint.decisions import RequestHead
from ambit.waypoint.destinations import Endpoint
from ambit.waypoint.downstream import Outcome
from ambit.waypoint.forwarded_request import Plan
from ambit.waypoint.forwarding import forward
from ambit.waypoint.http1 import BodyData, Event, MessageEnded, RequestStarted, ResponseStarted
from ambit.waypoint.upstream import UpstreamExchange

HEAD = RequestHead("GET", "/", "echo.app")
ENDPOINT = Endpoint(
    Workload("Kubernetes//Pod/app/echo-0", "echo-0", "app", (ipaddress.ip_address("198.18.0.9"),)),
    ipaddress.ip_address("198.18.0.9"),
    8080,
    None,
)
NO_RETRIES = RetryPolicy(attempts=0)
NO_TIMEOUTS = Timeouts()


@dataclass
class Down:
    """The client's end: a bodiless request; what was answered."""

    status: int = 0
    body: bytes = b""
    aborted: bool = False
    started: bool = False

    async def next_event(self, *, head: bool = False) -> Event:
        return MessageEnded(())

    async def continue_if_waited(self) -> None:
        return None

    async def start_response(
        self,
        status: int,
        headers: Iterable[tuple[str, str]],
        reason: str = "",
        *,
        body: bytes = b"",
        end: bool = False,
        trailers: Iterable[tuple[str, str]] = (),
    ) -> None:
        self.status, self.started = status, True
        self.body += body

    async def send_body(self, data: bytes) -> None:
        self.body += data

    async def end_response(self, trailers: Iterable[tuple[str, str]] = ()) -> None:
        return None

    async def answer(self, status: int, headers: Iterable[tuple[str, str]], body: bytes) -> None:
        self.status, self.body = status, body

    def abort(self) -> None:
        self.aborted = True

    @property
    def response_started(self) -> bool:
        return self.started


@dataclass
class Up:
    """One try's upstream: answers ``status`` after ``head_delay`` seconds, its body after ``body_delay``."""

    status: int = 200
    head_delay: float = 0.0
    body_delay: float = 0.0
    aborted: bool = False
    finished: bool = False
    events: list[str] = field(default_factory=lambda: ["head", "body", "end"])
    sent: list[RequestHead] = field(default_factory=list)

    @property
    def reused(self) -> bool:
        return False

    @property
    def duplex(self) -> bool:
        return False

    async def send_request(self, head: RequestHead, *, upgrade: bool = False, body: bool = False) -> None:
        self.sent.append(head)

    async def send_body(self, data: bytes) -> None:
        return None

    async def end_request(self, trailers: Iterable[tuple[str, str]] = ()) -> None:
        return None

    async def next_event(self) -> Event:
        step = self.events.pop(0)
        if step == "head":
            await asyncio.sleep(self.head_delay)
            return ResponseStarted(self.status, [("content-length", "2")])
        if step == "body":
            await asyncio.sleep(self.body_delay)
            return BodyData(b"ok")
        return MessageEnded(())

    def next_event_nowait(self) -> Event | None:
        return None  # every event of this upstream comes after a sleep: none is here without waiting

    def abort(self) -> None:
        self.aborted = True

    def finish(self, now: float) -> None:
        self.finished = True


@dataclass
class Context:
    """What forward() reads of the waypoint's context here: the clock (a single endpoint: no picking)."""

    clock: Any = time.monotonic


def _live_timers() -> int:
    loop = asyncio.get_running_loop()
    return sum(1 for handle in loop._scheduled if not handle.cancelled())  # type: ignore[attr-defined]


async def _forward(
    ups: list[Up], *, timeouts: Timeouts = NO_TIMEOUTS, retry: RetryPolicy = NO_RETRIES, attempt_count: bool = False
) -> tuple[Down, Outcome]:
    down, outcome = Down(), Outcome(request_id="r-1")
    script = iter(ups)

    async def connector(endpoint: Endpoint, fresh: bool) -> UpstreamExchange:
        return next(script)

    plan = Plan(HEAD, timeouts=timeouts, retry=retry, attempt_count=attempt_count)
    started = RequestStarted(HEAD, "1.1", upgrade=False, has_body=False)
    await forward(Context(), None, down, started, plan, ENDPOINT, outcome, connector)  # type: ignore[arg-type]
    return down, outcome


async def test_without_timeouts_no_timer_is_armed_and_the_response_is_forwarded() -> None:
    before = _live_timers()
    up = Up()
    down, outcome = await _forward([up])
    assert (down.status, down.body, outcome.attempts, outcome.flags) == (200, b"ok", 1, "-")
    assert up.finished and not up.aborted
    assert _live_timers() == before


async def test_timers_that_did_not_fire_are_cancelled_when_the_exchange_ends() -> None:
    before = _live_timers()
    down, outcome = await _forward([Up()], timeouts=Timeouts(request=30.0, backend_request=10.0))
    assert down.status == 200 and outcome.flags == "-"
    assert _live_timers() == before


async def test_the_try_timer_fires_once_and_answers_504_when_not_retried() -> None:
    before = _live_timers()
    slow = Up(head_delay=5.0)
    down, outcome = await asyncio.wait_for(_forward([slow], timeouts=Timeouts(backend_request=0.05)), 3.0)
    assert (down.status, outcome.flags, outcome.attempts) == (504, "UT", 1)
    assert slow.aborted
    assert _live_timers() == before


async def test_a_timed_out_try_is_stopped_and_the_next_one_answers() -> None:
    slow, fast = Up(head_delay=5.0), Up()
    retry = RetryPolicy(attempts=1, codes=(504,), backoff=0.0)
    down, outcome = await asyncio.wait_for(
        _forward([slow, fast], timeouts=Timeouts(backend_request=0.05), retry=retry), 3.0
    )
    assert (down.status, down.body, outcome.attempts) == (200, b"ok", 2)
    assert slow.aborted and fast.finished


async def test_the_request_timer_bounds_every_try_and_its_backoff() -> None:
    failing = [Up(status=503), Up(status=503), Up(status=503)]
    retry = RetryPolicy(attempts=2, codes=(503,), backoff=10.0)  # the backoff outlasts the request timeout
    down, outcome = await asyncio.wait_for(_forward(failing, timeouts=Timeouts(request=0.1), retry=retry), 3.0)
    assert (down.status, outcome.flags) == (503, "-")  # the retry would start after the deadline: forwarded
    retry = RetryPolicy(attempts=2, codes=(503,), backoff=0.05)
    slow_second = [Up(status=503), Up(head_delay=5.0)]
    down, outcome = await asyncio.wait_for(_forward(slow_second, timeouts=Timeouts(request=0.2), retry=retry), 3.0)
    assert (down.status, outcome.flags, outcome.attempts) == (504, "UT", 2)
    assert slow_second[1].aborted


async def test_a_retried_status_ends_its_try_without_a_timer() -> None:
    first, second = Up(status=503), Up()
    retry = RetryPolicy(attempts=1, codes=(503,), backoff=0.0)
    down, outcome = await _forward([first, second], retry=retry)
    assert (down.status, outcome.attempts) == (200, 2)
    assert first.aborted and second.finished


async def test_a_timeout_while_the_body_streams_aborts_the_client() -> None:
    up = Up(body_delay=5.0)
    down, outcome = await asyncio.wait_for(_forward([up], timeouts=Timeouts(request=0.1)), 3.0)
    assert down.started and down.aborted and outcome.flags == "UT"
    assert up.aborted


async def test_a_cancellation_from_elsewhere_is_passed_on() -> None:
    up = Up(head_delay=5.0)
    task = asyncio.get_running_loop().create_task(_forward([up], timeouts=Timeouts(backend_request=10.0)))
    await asyncio.sleep(0.05)
    task.cancel()
    with pytest.raises(asyncio.CancelledError):
        await task
    assert up.aborted


@pytest.mark.parametrize("attempt_count", [True, False])
async def test_each_try_says_which_it_is_when_the_plan_asks(attempt_count: bool) -> None:
    """Envoy's include_request_attempt_count (a gateway's virtual hosts): 1 on the first try, 2 on the retry."""
    ups = [Up(status=503), Up()]
    retry = RetryPolicy(attempts=1, codes=(503,), backoff=0.0)
    down, _ = await asyncio.wait_for(_forward(ups, retry=retry, attempt_count=attempt_count), 3.0)
    assert down.status == 200
    counts = [[v for n, v in up.sent[0].headers if n == "x-envoy-attempt-count"] for up in ups]
    assert counts == ([["1"], ["2"]] if attempt_count else [[], []])


@dataclass
class SteppedClock:
    """A monotonic clock that moves only when a test says so."""

    now: float = 100.0

    def __call__(self) -> float:
        return self.now


@dataclass
class SlowUp(Up):
    """An upstream whose answer takes ``took`` seconds of ``clock``."""

    clock: SteppedClock = field(default_factory=SteppedClock)
    took: float = 0.0

    async def next_event(self) -> Event:
        if self.events[0] == "head":
            self.clock.now += self.took
        return await super().next_event()


def _expected(up: Up) -> list[str]:
    return [v for n, v in up.sent[0].headers if n == "x-envoy-expected-rq-timeout-ms"]


@pytest.mark.parametrize(
    ("timeouts", "expected"),
    [
        (Timeouts(request=5.0), ["5000"]),
        (Timeouts(request=5.0, backend_request=0.25), ["250"]),
        (Timeouts(backend_request=0.25), ["250"]),
        (Timeouts(request=1.0, backend_request=2.0), ["1000"]),
        (NO_TIMEOUTS, []),
    ],
)
async def test_a_try_says_how_long_the_endpoint_has_when_the_route_has_a_timeout(
    timeouts: Timeouts, expected: list[str]
) -> None:
    """The router's x-envoy-expected-rq-timeout-ms (its debug headers are on with istiod's defaults): the per-try
    timeout when it is shorter than the route's, else the route's; none without a timeout."""
    up = Up()
    down, _ = await asyncio.wait_for(_forward([up], timeouts=timeouts), 3.0)
    assert down.status == 200 and _expected(up) == expected


async def test_a_retry_is_told_what_is_left_of_the_route_timeout() -> None:
    """The first try took 700 ms of a 1 s route timeout: the retry's endpoint is told 300, not 1000."""
    clock = SteppedClock()
    ups = [SlowUp(status=503, clock=clock, took=0.7), SlowUp(clock=clock)]
    retry = RetryPolicy(attempts=1, codes=(503,), backoff=0.0)
    down, outcome = Down(), Outcome(request_id="r-1")
    script = iter(ups)

    async def connector(endpoint: Endpoint, fresh: bool) -> UpstreamExchange:
        return next(script)

    plan = Plan(HEAD, timeouts=Timeouts(request=1.0), retry=retry)
    started = RequestStarted(HEAD, "1.1", upgrade=False, has_body=False)
    context = Context(clock=clock)
    await asyncio.wait_for(forward(context, None, down, started, plan, ENDPOINT, outcome, connector), 3.0)  # type: ignore[arg-type]
    assert down.status == 200
    assert [_expected(up) for up in ups] == [["1000"], ["300"]]
