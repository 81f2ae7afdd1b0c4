"""The DATA frames of attached streams parsed in C (``ambit.native._hbone_data``, issue 23 step 2) against the
Python engine they stand in for.

Differential: two servers in the same state get the same bytes, cut at the same points; one parses every read with
``receive_data``, the other as the native transport does (``DataPath.feed`` first, then ``receive_data`` with the
rest). They must report the same events, hand their sinks the same bytes, send the same bytes (WINDOW_UPDATE,
GOAWAY, RST_STREAM...) and end in the same flow-control state, whatever the frames are: DATA of every size, with
END_STREAM, padding or flags nobody uses, empty, over a window, over SETTINGS_MAX_FRAME_SIZE, for streams that are
unknown, other frames between them, sinks that detach or close the connection from inside.

The flood and overrun rules stay the core's: a frame over SETTINGS_MAX_FRAME_SIZE and a window overrun end the
connection with the same GOAWAY on both paths; a flood of empty DATA frames is parsed by the core on both (C hands
every empty frame back), with the same outcome.
"""

from __future__ import annotations

import itertools
import os
import ssl
import struct
from collections.abc import Iterator
from types import ModuleType

import pytest
from hypothesis import HealthCheck, example, given, settings
from hypothesis import strategies as st
from tests.conftest import hbone_data_or_skip

from ambit.hbone import DataReceived, Event, HboneClientConnection, HboneServerConnection, HboneSettings, wire
from ambit.hbone.budgets import MAX_EMPTY_DATA
from ambit.tls.write_backlog import WriteBacklog

KiB = 1024
SETTINGS = HboneSettings(stream_window=64 * KiB, connection_window=128 * KiB, max_frame_size=32 * KiB)


@pytest.fixture(scope="module")
def hbone_data() -> Iterator[ModuleType]:
    yield hbone_data_or_skip()


class Shell:
    """What a DataPath needs of its session: ``received`` and ``flush`` (here into a list)."""

    def __init__(self, core: HboneServerConnection) -> None:
        self.core = core
        self.received = False
        self.sent = bytearray()

    def flush(self) -> None:
        self.sent += self.core.data_to_send()


class Sink:
    """Keeps what its stream delivers; may detach after ``detach_after`` octets or close the connection."""

    def __init__(self, core: HboneServerConnection, stream_id: int, detach_after: int, close_after: int) -> None:
        self.core, self.stream_id = core, stream_id
        self.detach_after, self.close_after = detach_after, close_after
        self.data = bytearray()
        self.pieces: list[bytes | memoryview] = []  # kept, as a socket's backlog keeps them: they must stay valid

    def __call__(self, piece: bytes | memoryview) -> None:
        assert not isinstance(piece, memoryview) or piece.readonly
        self.data += piece
        self.pieces.append(piece)
        if len(self.data) >= self.close_after:
            self.core.close(wire.NO_ERROR)
        elif len(self.data) >= self.detach_after:
            self.core.detach(self.stream_id)


class Twins:
    """Two servers in one state, with one tunnel from one client, its stream attached to a sink on each."""

    def __init__(self, hbone_data: ModuleType, detach_after: int = 1 << 40, close_after: int = 1 << 40) -> None:
        self.client = HboneClientConnection(HboneSettings())
        self.python = HboneServerConnection(SETTINGS)
        self.native = HboneServerConnection(SETTINGS)
        self.pump()
        self.stream_id = self.client.open_tunnel("198.18.200.7:8080")
        self.pump()
        self.python.respond(self.stream_id, 200)
        self.native.respond(self.stream_id, 200)
        self.pump()
        self.sinks = [Sink(core, self.stream_id, detach_after, close_after) for core in (self.python, self.native)]
        self.python.attach(self.stream_id, self.sinks[0])
        self.native.attach(self.stream_id, self.sinks[1])
        self.shell = Shell(self.native)
        self.path = hbone_data.DataPath(self.native, self.shell)
        self.sent = [bytearray(), bytearray()]

    def pump(self) -> None:
        while True:
            to_server = self.client.data_to_send()
            to_client = self.python.data_to_send()
            assert self.native.data_to_send() == to_client
            if not to_server and not to_client:
                return
            if to_server:
                assert _events(self.python.receive_data(to_server)) == _events(self.native.receive_data(to_server))
            if to_client:
                self.client.receive_data(to_client)

    def feed(self, data: bytes) -> tuple[list[object], list[object]]:
        """``data`` to each server, its way; the events of each."""
        python_events = self.python.receive_data(data)
        self.sent[0] += self.python.data_to_send()
        taken = self.path.feed(data)
        assert 0 <= taken <= len(data)
        native_events = self.native.receive_data(data[taken:]) if taken < len(data) else []
        self.sent[1] += self.shell.sent + self.native.data_to_send()
        self.shell.sent.clear()
        return _events(python_events), _events(native_events)

    def state(self, core: HboneServerConnection) -> tuple[object, ...]:
        stream = core._streams.get(self.stream_id)
        streams = None if stream is None else (stream.recv_window, stream.unacked, stream.remote_closed)
        return (
            core.closed,
            core._recv_window,
            core._recv_unacked,
            core._data_left,
            bytes(core._buf),
            sorted(core._streams),
            streams,
        )


def _events(events: list[Event]) -> list[object]:
    return [("data", e.stream_id, bytes(e.data), e.flow_length) if isinstance(e, DataReceived) else e for e in events]


def _frame(frame_type: int, flags: int, stream_id: int, payload: bytes) -> bytes:
    return struct.pack(">HBBBL", len(payload) >> 8, len(payload) & 0xFF, frame_type, flags, stream_id) + payload


def _frames(ops: list[tuple[str, int, int]], stream_id: int, inner_starts: list[int] | None = None) -> bytes:
    """The frames ``ops`` name, joined; ``inner_starts`` gets where each frame inside a "nested" payload starts."""
    out: list[bytes] = []
    for step, (kind, size, flags) in enumerate(ops):
        payload = bytes([step % 256]) * size
        if kind == "data":
            out.append(_frame(wire.DATA, flags, stream_id, payload))
        elif kind == "padded":
            out.append(_frame(wire.DATA, wire.PADDED, stream_id, bytes([3]) + payload + b"\0\0\0"))
        elif kind == "unknown-stream":
            out.append(_frame(wire.DATA, 0, stream_id + 2 * (1 + flags % 3), payload))
        elif kind == "stream-zero":
            out.append(_frame(wire.DATA, 0, 0, payload))
        elif kind == "oversized":
            out.append(_frame(wire.DATA, 0, stream_id, bytes(SETTINGS.max_frame_size + 1 + size % 64)))
        elif kind == "ping":
            out.append(_frame(wire.PING, 0, 0, payload[:8].ljust(8, b"p")))
        elif kind == "window-update":
            out.append(wire.window_update(stream_id, 1 + size))
        elif kind == "unknown-type":
            out.append(_frame(0xFA, flags, stream_id, payload[:100]))
        elif kind == "reset":
            out.append(wire.rst_stream(stream_id, wire.CANCEL))
        elif kind == "nested":  # a payload that reads as DATA frames of the stream: only a desync would parse it
            count = 1 + size % 8
            if inner_starts is not None:
                start = sum(map(len, out)) + 9
                inner_starts += [start + 14 * i for i in range(count)]
            inner = _frame(wire.DATA, 0, stream_id, b"inner") * count
            out.append(_frame(wire.DATA, flags & wire.END_STREAM, stream_id, inner))
    return b"".join(out)


def _split(data: bytes, cuts: list[int]) -> list[bytes]:
    points = sorted({0, len(data), *(c % (len(data) + 1) for c in cuts)})
    return [data[a:b] for a, b in itertools.pairwise(points)]


_KINDS = st.sampled_from(
    ["data"] * 12
    + ["padded", "unknown-stream", "stream-zero", "oversized", "ping", "window-update", "unknown-type"]
    + ["reset"]
)
_SIZES = st.one_of(st.integers(0, 40), st.integers(0, 40 * KiB), st.sampled_from([1, 16 * KiB, 32 * KiB]))
_FLAGS = st.sampled_from([0, 0, 0, wire.END_STREAM, 0x2, 0x20, 0x40])


@settings(
    max_examples=int(os.environ.get("AMBIT_DATA_PATH_EXAMPLES", "300")),
    deadline=None,
    suppress_health_check=[HealthCheck.function_scoped_fixture],
)
@given(
    ops=st.lists(st.tuples(_KINDS, _SIZES, _FLAGS), max_size=25),
    cuts=st.lists(st.integers(0, 1 << 20), max_size=12),
    detach_after=st.sampled_from([1 << 40, 1, 20 * KiB]),
    close_after=st.sampled_from([1 << 40, 1 << 40, 50 * KiB]),
    at_inner_frames=st.booleans(),
)
@example(  # a frame the core began (END_STREAM: not C's) whose payload reads as frames, cut where one starts
    ops=[("nested", 1, wire.END_STREAM)], cuts=[], detach_after=1 << 40, close_after=1 << 40, at_inner_frames=True
)
def test_the_native_data_path_does_what_the_python_engine_does_with_any_frames_cut_anywhere(
    hbone_data: ModuleType,
    ops: list[tuple[str, int, int]],
    cuts: list[int],
    detach_after: int,
    close_after: int,
    at_inner_frames: bool,
) -> None:
    twins = Twins(hbone_data, detach_after, close_after)
    inner_starts: list[int] = []
    data = _frames(ops, twins.stream_id, inner_starts)
    if at_inner_frames:  # reads that start where a payload holds what looks like a frame
        cuts = cuts + inner_starts
    for piece in _split(data, cuts):
        python_events, native_events = twins.feed(piece)
        assert native_events == python_events
        assert twins.sent[1] == twins.sent[0]
        assert twins.sinks[1].data == twins.sinks[0].data
        assert twins.state(twins.native) == twins.state(twins.python)
    assert b"".join(twins.sinks[1].pieces) == b"".join(twins.sinks[0].pieces) == twins.sinks[0].data


def test_whole_data_frames_of_an_attached_stream_never_reach_receive_data(hbone_data: ModuleType) -> None:
    twins = Twins(hbone_data)
    data = _frames([("data", 1000, 0), ("data", 20 * KiB, 0), ("data", 1, 0)], twins.stream_id)
    assert twins.path.feed(data) == len(data)
    assert (twins.path.frames, twins.path.octets) == (3, 1000 + 20 * KiB + 1)
    assert twins.shell.received and bytes(twins.sinks[1].data) == b"\0" * 1000 + b"\1" * 20 * KiB + b"\2"


def test_a_frame_cut_by_the_read_goes_on_in_c_where_the_core_left_it(hbone_data: ModuleType) -> None:
    twins = Twins(hbone_data)
    data = _frames([("data", 30 * KiB, 0)], twins.stream_id)
    assert twins.path.feed(data[:100]) == 100 and twins.native._data_left == 30 * KiB - 91
    assert twins.path.feed(data[100:]) == len(data) - 100 and twins.native._data_left == 0
    assert len(twins.sinks[1].data) == 30 * KiB and twins.path.frames == 2


def test_a_window_half_used_up_is_given_back_by_c_with_the_window_update_the_core_would_send(
    hbone_data: ModuleType,
) -> None:
    twins = Twins(hbone_data)
    data = _frames([("data", 32 * KiB, 0)], twins.stream_id)
    python_events, native_events = twins.feed(data)
    assert python_events == native_events == []
    assert twins.sent[1] == twins.sent[0] == wire.window_update(twins.stream_id, 32 * KiB)
    assert twins.path.octets == 32 * KiB


@pytest.mark.parametrize(
    ("kind", "error_code"),
    [("oversized", wire.FRAME_SIZE_ERROR), ("overrun", wire.FLOW_CONTROL_ERROR)],
)
def test_a_frame_over_the_size_limit_or_a_window_overrun_ends_the_connection_on_both_paths(
    hbone_data: ModuleType, kind: str, error_code: int
) -> None:
    twins = Twins(hbone_data)
    if kind == "oversized":
        data = _frames([("oversized", 0, 0)], twins.stream_id)
    else:  # two frames within SETTINGS_MAX_FRAME_SIZE, the second over the 64 KiB stream window
        data = _frames([("data", 32 * KiB, 0), ("data", 32 * KiB, 0), ("data", 1, 0)], twins.stream_id)
        twins.python.detach(twins.stream_id)  # unconsumed: the window closes behind the reader
        twins.native.detach(twins.stream_id)
    python_events, native_events = twins.feed(data)
    assert native_events == python_events
    assert twins.python.closed and twins.native.closed
    goaway = wire.goaway(0, error_code)[:9]  # the header: GOAWAY on stream 0, whatever the debug text
    assert goaway[3:] in bytes(twins.sent[1]) and twins.sent[1] == twins.sent[0]


def test_a_flood_of_empty_data_frames_is_the_cores_to_judge_on_both_paths(hbone_data: ModuleType) -> None:
    twins = Twins(hbone_data)
    flood = _frames([("data", 0, 0)], twins.stream_id) * 20_000
    assert twins.path.feed(flood) == 0  # every empty frame goes to the core, which applies its own rules
    python_events, native_events = twins.feed(flood)
    assert native_events == python_events
    assert twins.state(twins.native) == twins.state(twins.python)
    assert twins.sent[1] == twins.sent[0]


def test_empty_data_frames_between_data_c_took_are_not_a_run_on_either_path(hbone_data: ModuleType) -> None:
    """Rule D counts empty DATA frames in a row with no DATA octet between them. Each read here starts with a 1-byte
    DATA frame, which C parses on the native path (the core never sees it), then a run of empty frames at the
    budget, which C hands to the core: the runs are still apart on both paths."""
    twins = Twins(hbone_data)
    piece = _frames([("data", 1, 0)] + [("data", 0, 0)] * MAX_EMPTY_DATA, twins.stream_id)
    assert Twins(hbone_data).path.feed(piece) == 10  # C takes the 1-byte frame and stops at the first empty one
    for _ in range(50):
        python_events, native_events = twins.feed(piece)
        assert native_events == python_events
    assert not twins.python.closed and not twins.native.closed
    assert twins.sinks[1].data == twins.sinks[0].data and len(twins.sinks[0].data) == 50
    python_events, native_events = twins.feed(_frames([("data", 0, 0)], twins.stream_id))
    assert native_events == python_events
    assert twins.python.closed and twins.native.closed  # one more in a row: past the budget, GOAWAY on both
    assert twins.sent[1] == twins.sent[0]


@pytest.mark.parametrize("flags", [wire.END_STREAM, 0])
@pytest.mark.parametrize("detach_after", [1, 1 << 40])
def test_a_payload_that_looks_like_frames_is_never_parsed_as_frames(
    hbone_data: ModuleType, flags: int, detach_after: int
) -> None:
    """A frame the core has begun and C does not continue (it ends the stream, or its sink detached) is the core's to
    the end: what its payload holds, even frames of the same stream, must not be parsed by C."""
    twins = Twins(hbone_data, detach_after=detach_after)
    inner = _frame(wire.DATA, 0, twins.stream_id, b"inner")
    data = _frame(wire.DATA, flags, twins.stream_id, inner * 4)
    cut = 9 + len(inner)  # the second read starts with a whole inner frame
    for piece in (data[:cut], data[cut:]):
        python_events, native_events = twins.feed(piece)
        assert native_events == python_events
    assert twins.sinks[1].data == twins.sinks[0].data
    assert twins.state(twins.native) == twins.state(twins.python)


def test_feed_refuses_anything_but_bytes(hbone_data: ModuleType) -> None:
    twins = Twins(hbone_data)
    for wrong in (bytearray(b"x" * 9), memoryview(b"x" * 9), "text"):
        with pytest.raises(TypeError):
            twins.path.feed(wrong)


# Sending: DataPath.send against send_data_now and the transport's write.


class Records:
    """The records' seam: ``write`` puts the frame on the wire and says the socket held ``holding`` octets of it,
    or raises ``refuse``."""

    def __init__(self, wire: bytearray) -> None:
        self.wire = wire
        self.holding = 0
        self.refuse: OSError | None = None
        self.writes = 0

    def write(self, frame: bytes) -> int:
        if self.refuse is not None:
            raise self.refuse
        self.wire += frame
        self.writes += 1
        return self.holding


class Transport:
    """The native transport's seam as ``send`` uses it: open or closing, its backlog (which ``_hold`` keeps as the
    transport's does), its records, and ``write`` (order kept: it queues behind what is held)."""

    def __init__(self, wire: bytearray) -> None:
        self.wire = wire
        self._closing = False
        self._backlog = WriteBacklog()
        self._records = Records(wire)
        self.held: list[int] = []

    def _hold(self, held: int) -> None:
        self.held.append(held)
        self._backlog.hold(held)

    def write(self, data: bytes) -> None:
        self.wire += data


class SendingShell:
    def __init__(self) -> None:
        self.held = False
        self.write_paused = False
        self.received = False

    def flush(self) -> None:
        pass


class SendingTwins:
    """Two clients in one state, one tunnel each to one server: one sends as write_nowait does on the Python path
    (send_data_now, then the transport), the other as it does with a data path (send, else the same)."""

    def __init__(self, hbone_data: ModuleType, settings: HboneSettings) -> None:
        self.python = HboneClientConnection(HboneSettings())
        self.native = HboneClientConnection(HboneSettings())
        self.server = HboneServerConnection(settings)
        self.sent = [bytearray(), bytearray()]
        self.stream_id = self.python.open_tunnel("198.18.200.7:8080")
        assert self.native.open_tunnel("198.18.200.7:8080") == self.stream_id
        out = self.python.data_to_send()
        assert self.native.data_to_send() == out
        self.server.receive_data(out)
        self.server.respond(self.stream_id, 200)
        self.to_both(self.server.data_to_send())
        self.sent = [bytearray(), bytearray()]
        self.transport = Transport(self.sent[1])
        self.shell = SendingShell()
        self.path = hbone_data.DataPath(self.native, self.shell, self.transport)

    def to_both(self, data: bytes) -> None:
        if data:
            assert _events(self.python.receive_data(data)) == _events(self.native.receive_data(data))
        self.sent[0] += self.python.data_to_send()
        self.sent[1] += self.native.data_to_send()

    def send(self, data: bytes) -> tuple[bool, bool]:
        """``data`` from each client; whether each writer may go on."""
        out, pending = self.python.send_data_now(self.stream_id, data)
        self.sent[0] += out
        python_ok = pending <= 64 * KiB
        below_bound = self.path.send(self.stream_id, data)
        if below_bound is not None:
            return python_ok, below_bound
        out, pending = self.native.send_data_now(self.stream_id, data)
        self.transport.write(out)
        return python_ok, pending <= 64 * KiB

    def state(self, core: HboneClientConnection) -> tuple[object, ...]:
        stream = core._streams.get(self.stream_id)
        streams = None if stream is None else (stream.send_window, stream.pending, stream.end_requested)
        return (core._send_window, core._bucket_out, core._acks_owed, core._acks_before, streams)


@settings(max_examples=200, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(
    ops=st.lists(
        st.one_of(
            st.tuples(st.just("send"), st.one_of(st.integers(0, 300), st.integers(1, 300 * KiB))),
            st.tuples(st.just("window"), st.integers(1, 200 * KiB)),
            st.tuples(st.just("hold"), st.integers(0, 3)),
            st.tuples(st.just("end"), st.just(0)),
        ),
        max_size=20,
    ),
    window=st.sampled_from([16 * KiB, 64 * KiB, 4 * 1024 * KiB]),
)
def test_send_writes_what_send_data_now_then_the_transport_would_write(
    hbone_data: ModuleType, ops: list[tuple[str, int]], window: int
) -> None:
    twins = SendingTwins(hbone_data, HboneSettings(stream_window=window))
    for kind, value in ops:
        if kind == "send":
            python_ok, native_ok = twins.send(bytes([value % 256]) * value)
            assert native_ok == python_ok
        elif kind == "window":  # the server reads and consumes: WINDOW_UPDATEs reach both clients
            twins.to_both(wire.window_update(0, value) + wire.window_update(twins.stream_id, value))
        elif kind == "hold":  # the socket takes everything from now on, or holds some of each write
            twins.transport._records.holding = value * 100
            if not value:
                twins.transport._hold(0)
        else:  # the last op: a write after it is the caller's error on either path
            twins.python.end_stream(twins.stream_id)
            twins.native.end_stream(twins.stream_id)
            twins.to_both(b"")
        assert twins.sent[1] == twins.sent[0]
        assert twins.state(twins.native) == twins.state(twins.python)
        if kind == "end":
            break


def test_send_frames_a_chunk_through_the_records_and_tells_the_transport_what_the_socket_held(
    hbone_data: ModuleType,
) -> None:
    twins = SendingTwins(hbone_data, HboneSettings())
    assert twins.send(b"hello") == (True, True)
    assert twins.transport._records.writes == 1
    assert bytes(twins.sent[1]) == bytes(twins.sent[0]) == wire.frame(wire.DATA, 0, twins.stream_id, b"hello")
    twins.transport._records.holding = 7
    assert twins.path.send(twins.stream_id, b"more") is True and twins.transport.held == [7]
    assert twins.path.send(twins.stream_id, b"later") is None  # held bytes: the transport queues what follows
    assert twins.transport._records.writes == 2


def test_send_leaves_everything_else_to_the_python_path(hbone_data: ModuleType) -> None:
    twins = SendingTwins(hbone_data, HboneSettings(max_frame_size=16 * KiB))
    refusals = {
        "empty": lambda: twins.path.send(twins.stream_id, b""),
        "unknown stream": lambda: twins.path.send(twins.stream_id + 2, b"x"),
        "stream 0": lambda: twins.path.send(0, b"x"),
        "over send_chunk": lambda: twins.path.send(twins.stream_id, bytes(256 * KiB + 1)),
        "over the peer's frame size": lambda: twins.path.send(twins.stream_id, bytes(16 * KiB + 1)),
    }
    for name, call in refusals.items():
        assert call() is None, name
    twins.shell.held = True
    assert twins.path.send(twins.stream_id, b"x") is None
    twins.shell.held = False
    twins.transport._closing = True
    assert twins.path.send(twins.stream_id, b"x") is None
    twins.transport._closing = False
    twins.native.ping(b"12345678")  # output queued in the core: it goes first, through the Python path
    assert twins.path.send(twins.stream_id, b"x") is None
    assert twins.transport._records.writes == 0 and twins.state(twins.native) == twins.state(twins.python)


def test_a_refused_write_goes_to_the_transport_whole(hbone_data: ModuleType) -> None:
    twins = SendingTwins(hbone_data, HboneSettings())
    twins.transport._records.refuse = ssl.SSLWantReadError(2, "a post-handshake message first")
    assert twins.path.send(twins.stream_id, b"kept") is True
    assert bytes(twins.sent[1]) == wire.frame(wire.DATA, 0, twins.stream_id, b"kept")
    assert twins.transport._records.writes == 0
    twins.transport._records.refuse = None
    twins.shell.write_paused = True
    assert twins.path.send(twins.stream_id, b"paused") is False
