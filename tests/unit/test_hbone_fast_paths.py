"""The HBONE core's relay fast paths give the same wire and the same flow control as the general calls.

``send_data_now`` is ``send_data`` then ``data_to_send`` in one call: for any writes, windows and consumption in
between, the bytes it returns and the pending count are exactly those of the two calls on a twin connection.

An attached stream's DATA goes to its sink as it is parsed, consumed: in wire order however the bytes are split
into reads, never also as an event; after a detach (from inside the sink) the rest are events again, unconsumed, so
a sender stops after one window exactly as it does for a reader of events. A sink may reset its stream or close
the connection from inside the parse.
"""

from __future__ import annotations

import itertools

from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st
from tests.conftest import DataPathFactory

from ambit.hbone import (
    ConnectionDraining,
    DataReceived,
    HboneClientConnection,
    HboneServerConnection,
    HboneSettings,
    StreamEnded,
    StreamReset,
)

KiB = 1024
PROPERTY = settings(
    max_examples=150,
    deadline=None,
    suppress_health_check=[HealthCheck.too_slow, HealthCheck.function_scoped_fixture],
)


class Twin:
    """A client and a server joined in memory, with one open tunnel; the server consumes what it is told to."""

    def __init__(self, server_settings: HboneSettings, data_path: DataPathFactory | None = None) -> None:
        self.client = HboneClientConnection(HboneSettings())
        self.server = HboneServerConnection(server_settings)
        self.receive = self.server.receive_data if data_path is None else data_path(self.server)
        """The server's receive_data, on the path the test runs (the ``data_path`` fixture)."""
        self.unconsumed: list[DataReceived] = []
        self.received = b""
        self.pump()
        self.stream_id = self.client.open_tunnel("198.18.200.7:8080")
        self.pump()
        self.server.respond(self.stream_id, 200)
        self.pump()

    def pump(self) -> None:
        while True:
            to_server, to_client = self.client.data_to_send(), self.server.data_to_send()
            if not to_server and not to_client:
                return
            self.deliver(to_server)
            if to_client:
                self.client.receive_data(to_client)

    def deliver(self, data: bytes) -> None:
        """Give the server ``data``; keep the payload it reports."""
        for event in self.receive(data) if data else []:
            if isinstance(event, DataReceived):
                self.unconsumed.append(event)
                self.received += bytes(event.data)

    def consume(self) -> None:
        for event in self.unconsumed:
            self.server.consumed(event.stream_id, event.flow_length)
        self.unconsumed.clear()
        self.pump()


writes = st.lists(
    st.one_of(
        st.integers(0, 300 * KiB).map(lambda n: ("write", n)),
        st.just(("consume", 0)),
        st.just(("flush", 0)),
    ),
    max_size=12,
)


@PROPERTY
@given(ops=writes, window=st.sampled_from([16 * KiB, 64 * KiB, 4 * 1024 * KiB]), view=st.booleans())
def test_send_data_now_writes_what_send_data_then_data_to_send_write(
    ops: list[tuple[str, int]], window: int, view: bool
) -> None:
    general, fused = Twin(HboneSettings(stream_window=window)), Twin(HboneSettings(stream_window=window))
    sent = b""
    for step, (op, n) in enumerate(ops):
        if op == "consume":
            general.consume()
            fused.consume()
            continue
        if op == "flush":  # the peer sees what is on the wire so far (and may queue WINDOW_UPDATEs)
            general.pump()
            fused.pump()
            continue
        payload = bytes([step % 251]) * n
        data = memoryview(payload) if view else payload
        pending = general.client.send_data(general.stream_id, data)
        expected = general.client.data_to_send()
        out, fused_pending = fused.client.send_data_now(fused.stream_id, data)
        assert (out, fused_pending) == (expected, pending)
        sent += payload
        general.deliver(expected)
        fused.deliver(out)
    for twin in (general, fused):  # what the windows held back is framed as they reopen
        while twin.unconsumed or twin.client.pending_bytes(twin.stream_id):
            twin.consume()
    assert fused.received == general.received == sent


class Sink:
    """Takes attached DATA; detaches its stream after ``detach_after`` chunks (never if None)."""

    def __init__(self, twin: Twin, detach_after: int | None = None) -> None:
        self.twin = twin
        self.chunks: list[bytes] = []
        self.detach_after = detach_after

    def __call__(self, data: bytes | memoryview) -> None:
        assert isinstance(data, bytes) or data.readonly
        self.chunks.append(bytes(data))
        if self.detach_after is not None and len(self.chunks) >= self.detach_after:
            self.twin.server.detach(self.twin.stream_id)


def split(data: bytes, cuts: list[int]) -> list[bytes]:
    points = sorted({cut % (len(data) + 1) for cut in cuts} | {0, len(data)})
    return [data[a:b] for a, b in itertools.pairwise(points)]


@PROPERTY
@given(
    sizes=st.lists(st.integers(1, 40 * KiB), min_size=1, max_size=8),
    cuts=st.lists(st.integers(0, 10**6), max_size=10),
    detach_after=st.one_of(st.none(), st.integers(1, 8)),
    end=st.booleans(),
)
def test_attached_data_reaches_the_sink_in_wire_order_however_it_is_split_and_detaching_brings_events_back(
    data_path: DataPathFactory,
    sizes: list[int],
    cuts: list[int],
    detach_after: int | None,
    end: bool,
) -> None:
    twin = Twin(HboneSettings(), data_path)
    sink = Sink(twin, detach_after)
    twin.server.attach(twin.stream_id, sink)
    sent = b""
    for i, size in enumerate(sizes):
        payload = bytes([i + 1]) * size
        twin.client.send_data(twin.stream_id, payload)
        sent += payload
    if end:
        twin.client.end_stream(twin.stream_id)
    events = []
    for piece in split(twin.client.data_to_send(), cuts):
        events += twin.receive(piece)
    as_events = [event for event in events if isinstance(event, DataReceived)]
    assert b"".join(sink.chunks) + b"".join(bytes(event.data) for event in as_events) == sent
    if detach_after is None or len(sink.chunks) < detach_after:
        assert as_events == []  # attached all along: nothing twice, nothing as an event
    assert [event for event in events if isinstance(event, StreamEnded)] == ([StreamEnded(twin.stream_id)] * end)


def test_attached_data_is_consumed_so_a_sender_never_stalls_and_a_detached_one_stalls_after_one_window(
    data_path: DataPathFactory,
) -> None:
    window = 16 * KiB
    for detach in (False, True):
        twin = Twin(HboneSettings(stream_window=window), data_path)
        sink = Sink(twin, 1 if detach else None)
        twin.server.attach(twin.stream_id, sink)
        for _ in range(256):  # 1 MiB in 4 KiB writes, the wire pumped after each
            twin.client.send_data(twin.stream_id, b"w" * (4 * KiB))
            twin.pump()
        taken = sum(map(len, sink.chunks)) + sum(len(event.data) for event in twin.unconsumed)
        if detach:
            assert taken == window  # one chunk to the sink, the rest of the window as events, nothing consumed
            assert twin.client.pending_bytes(twin.stream_id) == 1024 * KiB - window
            twin.consume()  # consuming the events reopens the window as it always did
            assert sum(len(event.data) for event in twin.unconsumed) == window
        else:
            assert taken == 1024 * KiB and twin.unconsumed == []
            assert twin.client.pending_bytes(twin.stream_id) == 0


def test_a_sink_that_resets_its_stream_gets_nothing_more_and_the_read_goes_on(
    data_path: DataPathFactory,
) -> None:
    twin = Twin(HboneSettings(), data_path)
    other = twin.client.open_tunnel("198.18.200.8:8080")
    twin.pump()
    twin.server.respond(other, 200)
    twin.pump()
    got: list[bytes] = []

    def resetting(data: bytes | memoryview) -> None:
        got.append(bytes(data))
        twin.server.reset_stream(twin.stream_id)

    twin.server.attach(twin.stream_id, resetting)
    twin.client.send_data(twin.stream_id, b"first")
    twin.client.send_data(twin.stream_id, b"second")
    twin.client.send_data(other, b"other stream")
    events = twin.receive(twin.client.data_to_send())
    assert got == [b"first"]
    assert [(e.stream_id, bytes(e.data)) for e in events if isinstance(e, DataReceived)] == [(other, b"other stream")]
    assert not twin.server.closed
    told = twin.client.receive_data(twin.server.data_to_send())
    assert [e.stream_id for e in told if isinstance(e, StreamReset)] == [twin.stream_id]


def test_a_sink_that_closes_the_connection_stops_the_parse_without_raising(
    data_path: DataPathFactory,
) -> None:
    twin = Twin(HboneSettings(), data_path)
    got: list[bytes] = []

    def closing(data: bytes | memoryview) -> None:
        got.append(bytes(data))
        twin.server.close()

    twin.server.attach(twin.stream_id, closing)
    twin.client.send_data(twin.stream_id, b"first")
    twin.client.send_data(twin.stream_id, b"second")
    twin.client.ping(b"12345678")
    assert twin.receive(twin.client.data_to_send()) == []
    assert got == [b"first"]
    assert twin.server.closed and twin.server.active_streams == 0
    assert twin.receive(b"more") == []
    events = twin.client.receive_data(twin.server.data_to_send())  # the GOAWAY close() queued, and no PING ACK
    assert [type(e) for e in events] == [ConnectionDraining]
