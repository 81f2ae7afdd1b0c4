"""A forwarded response's pieces that are already here leave with its head (ambit.waypoint.forwarded_response rule 5):
one ``start_response`` carries the first body piece and the end when they came with the head; nothing is held
back waiting for more; an error met while taking them is acted on where the next read would have met it. And the
HTTP/1.1 client side writes, in one write, the bytes the piece-by-piece calls write."""

from __future__ import annotations

import asyncio
import ipaddress
import time
from collections.abc import Iterable
from dataclasses import dataclass, field
from types import SimpleNamespace
from typing import Any

from ambit.model.routes import RetryPolicy, Timeouts
from ambit.model.workload import Workload
from ambit.waypoint.decisions import RequestHead
from ambit.waypoint.destinations import Endpoint
from ambit.waypoint.downstream import Downstream, Outcome
from ambit.waypoint.errors import HttpProtocolError
from ambit.waypoint.forwarded_request import Plan
from ambit.waypoint.forwarding import forward
from ambit.waypoint.http1 import BodyData, Event, MessageEnded, RequestStarted, ResponseStarted, ServerSide
from ambit.waypoint.upstream import UpstreamExchange

HEAD = RequestHead("GET", "/", "echo.app")
ENDPOINT = Endpoint(
    Workload("Kubernetes//Pod/app/echo-0", "echo-0", "app", (ipaddress.ip_address("198.18.0.9"),)),
    ipaddress.ip_address("198.18.0.9"),
    8080,
    None,
)
ANSWER = ResponseStarted(200, (("content-length", "5"),))


@dataclass
class Client:
    """The client's end: every call, in order."""

    calls: list[tuple[Any, ...]] = field(default_factory=list)
    aborted: bool = False

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
        self.calls.append(("start", status, body, end, tuple(trailers)))

    async def send_body(self, data: bytes) -> None:
        self.calls.append(("body", data))

    async def end_response(self, trailers: Iterable[tuple[str, str]] = ()) -> None:
        self.calls.append(("end", tuple(trailers)))

    async def answer(self, status: int, headers: Iterable[tuple[str, str]], body: bytes) -> None:
        self.calls.append(("answer", status, body))

    def abort(self) -> None:
        self.aborted = True

    @property
    def response_started(self) -> bool:
        return bool(self.calls)


@dataclass
class Scripted:
    """An upstream whose events after the head are each either here already (``True``) or come after a wait;
    ``broken``: taking the event at that index raises instead. ``asked`` notes what the client had been sent
    each time the upstream was waited on."""

    after_head: list[tuple[Event, bool]]
    client: Client
    broken: int = -1
    asked: list[list[tuple[Any, ...]]] = field(default_factory=list)
    finished: bool = False
    aborted: bool = False
    _head_sent: bool = False
    _index: int = 0

    @property
    def reused(self) -> bool:
        return False

    @property
    def duplex(self) -> bool:
        return False

    async def send_request(self, head: RequestHead, *, upgrade: bool = False, body: bool = False) -> None:
        return None

    async def send_body(self, data: bytes) -> None:
        return None

    async def end_request(self, trailers: Iterable[tuple[str, str]] = ()) -> None:
        return None

    def _take(self) -> Event:
        if self._index == self.broken:
            raise HttpProtocolError("upstream broke its framing", 502, upstream=True)
        event, _ = self.after_head[self._index]
        self._index += 1
        return event

    async def next_event(self) -> Event:
        if not self._head_sent:
            self._head_sent = True
            return ANSWER
        self.asked.append(list(self.client.calls))
        await asyncio.sleep(0)
        return self._take()

    def next_event_nowait(self) -> Event | None:
        if self._index < len(self.after_head) and self.after_head[self._index][1]:
            return self._take()
        if self._index == self.broken:
            return self._take()
        return None

    def abort(self) -> None:
        self.aborted = True

    def finish(self, now: float) -> None:
        self.finished = True


@dataclass
class Context:
    """What forward() and the client side read of the waypoint's context here: the clock and the idle bound."""

    clock: Any = time.monotonic
    limits: Any = field(default_factory=lambda: SimpleNamespace(idle_timeout=5.0, head_timeout=5.0))


async def _forward(after_head: list[tuple[Event, bool]], *, broken: int = -1) -> tuple[Client, Scripted, Outcome]:
    client, outcome = Client(), Outcome(request_id="r-1")
    up = Scripted(after_head, client, broken=broken)

    async def connector(endpoint: Endpoint, fresh: bool) -> UpstreamExchange:
        return up

    plan = Plan(HEAD, timeouts=Timeouts(), retry=RetryPolicy(attempts=0))
    started = RequestStarted(HEAD, "1.1", upgrade=False, has_body=False)
    await forward(Context(), None, client, started, plan, ENDPOINT, outcome, connector)  # type: ignore[arg-type]
    return client, up, outcome


async def test_an_answer_that_arrived_whole_leaves_in_one_call_with_its_head() -> None:
    client, up, outcome = await _forward([(BodyData(b"hello"), True), (MessageEnded(()), True)])
    assert client.calls == [("start", 200, b"hello", True, ())]
    assert (outcome.status, outcome.bytes_out, outcome.flags) == (200, 5, "-")
    assert up.finished and not up.aborted and up.asked == []


async def test_a_body_piece_that_came_with_the_head_leaves_with_it_and_the_end_follows_when_it_comes() -> None:
    client, up, outcome = await _forward([(BodyData(b"hello"), True), (MessageEnded(()), False)])
    assert client.calls == [("start", 200, b"hello", False, ()), ("end", ())]
    assert outcome.bytes_out == 5 and up.finished


async def test_a_streamed_answer_is_not_held_back_waiting_for_its_next_piece() -> None:
    pieces: list[tuple[Event, bool]] = [(BodyData(b"he"), False), (BodyData(b"llo"), False), (MessageEnded(()), False)]
    client, up, outcome = await _forward(pieces)
    assert client.calls == [("start", 200, b"", False, ()), ("body", b"he"), ("body", b"llo"), ("end", ())]
    assert up.asked[1] == [("start", 200, b"", False, ()), ("body", b"he")]  # sent before waiting for "llo"
    assert outcome.bytes_out == 5


async def test_a_piece_taken_early_that_is_not_the_end_is_acted_on_first_and_in_order() -> None:
    pieces: list[tuple[Event, bool]] = [(BodyData(b"he"), True), (BodyData(b"llo"), True), (MessageEnded(()), False)]
    client, _, outcome = await _forward(pieces)
    assert client.calls == [("start", 200, b"he", False, ()), ("body", b"llo"), ("end", ())]
    assert outcome.bytes_out == 5


async def test_the_grpc_status_of_trailers_that_came_with_the_head_is_recorded_and_forwarded() -> None:
    trailers = (("grpc-status", "0"),)
    client, _, outcome = await _forward([(BodyData(b"hello"), True), (MessageEnded(trailers), True)])
    assert client.calls == [("start", 200, b"hello", True, trailers)]
    assert outcome.grpc_status == "0"


async def test_an_upstream_error_met_taking_the_early_pieces_aborts_after_what_came_before_it_was_sent() -> None:
    client, up, outcome = await _forward([(BodyData(b"hel"), True), (MessageEnded(()), True)], broken=1)
    assert client.calls == [("start", 200, b"hel", False, ())]
    assert client.aborted and up.aborted and not up.finished
    assert "upstream broke its framing" in outcome.error


class Written:
    """A byte stream that records each write."""

    def __init__(self) -> None:
        self.writes: list[bytes] = []

    async def read(self) -> bytes:
        return b""

    async def write(self, data: bytes | memoryview) -> None:
        self.writes.append(bytes(data))

    def write_eof(self) -> None: ...

    def abort(self) -> None: ...

    async def aclose(self) -> None: ...


def _server() -> ServerSide:
    server = ServerSide()
    server.receive_data(b"GET / HTTP/1.1\r\nhost: echo.app\r\n\r\n")
    assert isinstance(server.next_event(), RequestStarted)
    return server


async def test_the_http1_client_side_writes_head_body_and_end_at_once_as_the_same_bytes() -> None:
    headers = [("content-type", "text/plain"), ("transfer-encoding", "chunked")]
    piecewise = _server()
    base = [*headers, ("date", "Mon, 07 Dec 2026 10:00:00 GMT")]  # an endpoint's date is kept
    expected = (
        piecewise.send_response(200, [*base, ("server", "istio-envoy")], "OK")
        + piecewise.send_body(b"hello")
        + piecewise.end_response([("x-checksum", "1")])
    )
    stream = Written()
    down = Downstream(Context(), stream, _server())  # type: ignore[arg-type]
    await down.start_response(200, base, "OK", body=b"hello", end=True, trailers=[("x-checksum", "1")])
    assert stream.writes == [expected]
    assert b"0\r\nx-checksum: 1\r\n\r\n" in expected


async def test_the_http1_client_side_still_writes_the_head_when_the_first_piece_cannot_be_framed() -> None:
    stream = Written()
    down = Downstream(Context(), stream, _server())  # type: ignore[arg-type]
    raised = None
    try:
        await down.start_response(200, [("content-length", "2")], "OK", body=b"too long")
    except HttpProtocolError as exc:
        raised = exc
    assert raised is not None
    assert len(stream.writes) == 1 and stream.writes[0].startswith(b"HTTP/1.1 200 OK\r\n")
