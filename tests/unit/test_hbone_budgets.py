"""The server's budgets against floods (rules A-C of ``ambit.hbone.budgets``), driven by a raw attacker in memory.

The attacker writes frames by hand (hpack for the header blocks), as the published attacks do: "MadeYouReset"
(CVE-2025-8671) pairs of CONNECT and an invalid WINDOW_UPDATE, PING and SETTINGS floods against blocked output,
and CONTINUATION floods.
"""

from __future__ import annotations

import struct

import h2.config
import h2.connection
import h2.events
import pytest
from hpack import Encoder
from hypothesis import given
from hypothesis import strategies as st

from ambit.hbone import ConnectionTerminated, Event, HboneServerConnection, StreamReset, TunnelRequested, wire
from ambit.hbone.budgets import MAX_CONTINUATIONS, MAX_EARLY_RESETS, MAX_EMPTY_DATA, MAX_QUEUED_CONTROL

AUTHORITY = "198.18.200.7:8080"


class Attacker:
    """A raw HTTP/2 client of one :class:`HboneServerConnection`; collects what the server reports and sends."""

    def __init__(self) -> None:
        self.server = HboneServerConnection()
        self.encoder = Encoder()
        self.events: list[Event] = []
        self.next_id = 1
        self.send(wire.PREFACE + wire.settings_frame([]))
        self.server.data_to_send()

    def send(self, data: bytes) -> list[Event]:
        new = self.server.receive_data(data)
        self.events += new
        return new

    def connect_block(self) -> bytes:
        return bytes(self.encoder.encode([(":method", "CONNECT"), (":authority", AUTHORITY)], huffman=False))

    def connect(self) -> tuple[int, bytes]:
        """The frames of the next CONNECT, and its stream id."""
        stream_id, self.next_id = self.next_id, self.next_id + 2
        return stream_id, wire.frame(wire.HEADERS, wire.END_HEADERS, stream_id, self.connect_block())

    def terminated(self) -> ConnectionTerminated | None:
        return next((e for e in self.events if isinstance(e, ConnectionTerminated)), None)


def made_you_reset(attacker: Attacker, invalid: bytes = struct.pack(">L", 0)) -> bytes:
    """One MadeYouReset pair: CONNECT, then a WINDOW_UPDATE the server must answer with RST_STREAM."""
    stream_id, headers = attacker.connect()
    return headers + wire.frame(wire.WINDOW_UPDATE, 0, stream_id, invalid)


# --- rule A: resets we were made to send -----------------------------------------------------------------------


@pytest.mark.parametrize(
    "invalid", [struct.pack(">L", 0), struct.pack(">L", wire.LARGEST_WINDOW)], ids=["zero", "overflow"]
)
def test_made_you_reset_pairs_end_the_connection_with_enhance_your_calm_past_the_reset_budget(invalid: bytes) -> None:
    attacker = Attacker()
    for _ in range(MAX_EARLY_RESETS):
        attacker.send(made_you_reset(attacker, invalid))
    assert attacker.terminated() is None
    resets = [e for e in attacker.events if isinstance(e, StreamReset)]
    assert len(resets) == MAX_EARLY_RESETS and not any(e.remote for e in resets)
    attacker.send(made_you_reset(attacker, invalid))
    terminated = attacker.terminated()
    assert terminated is not None and terminated.error_code == wire.ENHANCE_YOUR_CALM
    assert attacker.server.closed and attacker.server.active_streams == 0
    assert wire.goaway(MAX_EARLY_RESETS * 2 + 1, wire.ENHANCE_YOUR_CALM)[9:17] in attacker.server.data_to_send()


def test_a_flood_of_pairs_in_one_read_stops_at_the_budget() -> None:
    attacker = Attacker()
    events = attacker.send(b"".join(made_you_reset(attacker) for _ in range(15_000)))
    requested = [e for e in events if isinstance(e, TunnelRequested)]
    assert len(requested) == MAX_EARLY_RESETS + 1  # the read is abandoned at the GOAWAY
    assert attacker.terminated() is not None


def test_answers_pay_back_resets_we_were_made_to_send() -> None:
    attacker = Attacker()
    for round_ in range(3 * MAX_EARLY_RESETS):
        if round_ % 2:
            attacker.send(made_you_reset(attacker))
        else:
            stream_id, headers = attacker.connect()
            attacker.send(headers)
            attacker.server.respond(stream_id, 503)
    assert attacker.terminated() is None


def test_protocol_error_resets_of_answered_streams_count_too() -> None:
    attacker = Attacker()
    for _ in range(MAX_EARLY_RESETS + 1):
        stream_id, headers = attacker.connect()
        attacker.send(headers)
        attacker.server.respond(stream_id, 200)
        attacker.send(wire.frame(wire.WINDOW_UPDATE, 0, stream_id, struct.pack(">L", 0)))
    # Each answer pays back one unit (down to zero), each protocol error costs one: the budget never runs out.
    assert attacker.terminated() is None
    for _ in range(MAX_EARLY_RESETS + 1):
        stream_id, headers = attacker.connect()
        attacker.send(headers + wire.frame(wire.WINDOW_UPDATE, 0, stream_id, struct.pack(">L", 0)))
    terminated = attacker.terminated()
    assert terminated is not None and terminated.error_code == wire.ENHANCE_YOUR_CALM


def test_trailers_on_streams_we_finished_are_charged() -> None:
    attacker = Attacker()
    stream_id, headers = attacker.connect()
    attacker.send(headers)
    attacker.server.respond(stream_id, 400)
    trailer = wire.frame(wire.HEADERS, wire.END_HEADERS | wire.END_STREAM, stream_id, attacker.connect_block())
    for _ in range(MAX_EARLY_RESETS + 1):
        attacker.send(trailer)
    terminated = attacker.terminated()
    assert terminated is not None and terminated.error_code == wire.ENHANCE_YOUR_CALM


# --- rule B: control frames owed to a peer that does not read --------------------------------------------------

PING = wire.frame(wire.PING, 0, 0, b"12345678")
SETTINGS = wire.settings_frame([])


@pytest.mark.parametrize("frame", [PING, SETTINGS], ids=["ping", "settings"])
def test_a_control_flood_while_output_is_blocked_ends_with_enhance_your_calm(frame: bytes) -> None:
    attacker = Attacker()
    attacker.server.output_drained()  # the ACK of the handshake's SETTINGS went out
    assert attacker.server.output_blocked() == []
    attacker.send(frame * MAX_QUEUED_CONTROL)
    assert attacker.terminated() is None
    attacker.send(frame)
    terminated = attacker.terminated()
    assert terminated is not None and terminated.error_code == wire.ENHANCE_YOUR_CALM


def test_control_frames_owed_before_the_output_blocked_end_the_connection_when_it_blocks() -> None:
    attacker = Attacker()
    attacker.send(PING * (MAX_QUEUED_CONTROL + 1))
    assert attacker.terminated() is None  # nothing blocked: the peer may be reading them
    events = attacker.server.output_blocked()
    assert [type(e) for e in events] == [ConnectionTerminated]
    assert isinstance(events[0], ConnectionTerminated) and events[0].error_code == wire.ENHANCE_YOUR_CALM


def test_a_peer_that_reads_may_ping_as_it_likes() -> None:
    attacker = Attacker()
    for _ in range(3):
        attacker.send(PING * MAX_QUEUED_CONTROL)
        attacker.server.output_blocked()
        attacker.server.output_drained()  # our writes drained: the ACKs reached it
    assert attacker.terminated() is None


def test_old_pings_do_not_count_against_a_later_bulk_transfer() -> None:
    attacker = Attacker()
    big = [(wire.INITIAL_WINDOW_SIZE, wire.LARGEST_WINDOW)]
    attacker.send(wire.settings_frame(big) + wire.window_update(0, wire.LARGEST_WINDOW - wire.DEFAULT_WINDOW))
    for _ in range(2 * MAX_QUEUED_CONTROL):  # hours of keep-alive pings, each answered and flushed
        attacker.send(PING)
        attacker.server.data_to_send()
    stream_id, headers = attacker.connect()
    attacker.send(headers)
    attacker.server.respond(stream_id, 200)
    for _ in range(4):
        attacker.server.send_data(stream_id, bytes(128 * 1024))
        attacker.server.data_to_send()
    assert attacker.server.output_blocked() == []  # the peer is slow with the bulk data, not flooding
    assert attacker.terminated() is None


def test_a_flood_answered_in_many_flushes_still_counts_when_output_blocks() -> None:
    attacker = Attacker()
    for _ in range(40):
        attacker.send(PING * 1000)
        attacker.server.data_to_send()  # the ACKs went to a transport buffer the peer does not empty
    events = attacker.server.output_blocked()
    assert [type(e) for e in events] == [ConnectionTerminated]


# --- rule C: CONTINUATION frames per header block --------------------------------------------------------------


def continued(stream_id: int, block: bytes, pieces: int) -> bytes:
    """``block`` as HEADERS plus ``pieces`` CONTINUATION frames (the later ones empty when the block runs out)."""
    size = -(-len(block) // (pieces + 1))
    parts = [block[i * size : (i + 1) * size] for i in range(pieces + 1)]
    out = wire.frame(wire.HEADERS, 0 if pieces else wire.END_HEADERS, stream_id, parts[0])
    for index, part in enumerate(parts[1:], 1):
        out += wire.frame(wire.CONTINUATION, wire.END_HEADERS if index == pieces else 0, stream_id, part)
    return out


@given(pieces=st.integers(0, MAX_CONTINUATIONS))
def test_a_header_block_in_up_to_the_cap_of_continuations_is_a_request(pieces: int) -> None:
    attacker = Attacker()
    events = attacker.send(continued(1, attacker.connect_block(), pieces))
    assert events == [TunnelRequested(1, AUTHORITY, ())]


@given(pieces=st.integers(MAX_CONTINUATIONS + 1, 4 * MAX_CONTINUATIONS), split=st.integers(1, 30))
def test_a_continuation_flood_ends_with_enhance_your_calm(pieces: int, split: int) -> None:
    attacker = Attacker()
    data = continued(1, attacker.connect_block(), pieces)
    for start in range(0, len(data), split * 9):
        attacker.send(data[start : start + split * 9])
    terminated = attacker.terminated()
    assert terminated is not None and terminated.error_code == wire.ENHANCE_YOUR_CALM
    assert not any(isinstance(e, TunnelRequested) for e in attacker.events)


def test_an_endless_stream_of_empty_continuations_is_cut_off_early() -> None:
    attacker = Attacker()
    attacker.send(wire.frame(wire.HEADERS, 0, 1, attacker.connect_block()[:3]))
    sent = 0
    while attacker.terminated() is None and sent < 10_000:
        attacker.send(wire.frame(wire.CONTINUATION, 0, 1))
        sent += 1
    assert sent == MAX_CONTINUATIONS + 1


# --- rule D: empty DATA frames in a row --------------------------------------------------------------------------


def _empty(stream_id: int, padding: int = 0, flags: int = 0) -> bytes:
    if padding:  # the Pad Length octet and the padding, no data
        return wire.frame(wire.DATA, flags | wire.PADDED, stream_id, bytes([padding - 1]) + bytes(padding - 1))
    return wire.frame(wire.DATA, flags, stream_id)


@pytest.mark.parametrize("padding", [0, 1, 200], ids=["bare", "pad-length-only", "padded"])
@pytest.mark.parametrize("one_read", [True, False], ids=["one-read", "frame-by-frame"])
def test_empty_data_frames_in_a_row_end_the_connection_past_the_budget(padding: int, one_read: bool) -> None:
    attacker = Attacker()
    stream_id, headers = attacker.connect()
    attacker.send(headers)
    if one_read:
        attacker.send(_empty(stream_id, padding) * 200_000)
    else:
        for _ in range(MAX_EMPTY_DATA):
            attacker.send(_empty(stream_id, padding))
        assert attacker.terminated() is None
        attacker.send(_empty(stream_id, padding))
    terminated = attacker.terminated()
    assert terminated is not None and terminated.error_code == wire.ENHANCE_YOUR_CALM, attacker.events[-3:]
    assert attacker.server.closed


@given(st.lists(st.integers(0, MAX_EMPTY_DATA), min_size=1, max_size=60), st.sampled_from([0, 1, 30]))
def test_empty_data_frames_between_data_never_end_the_connection(runs: list[int], padding: int) -> None:
    attacker = Attacker()
    stream_id, headers = attacker.connect()
    attacker.send(headers)
    for run in runs:
        attacker.send(_empty(stream_id, padding) * run + wire.frame(wire.DATA, 0, stream_id, b"x"))
        attacker.server.consumed(stream_id, 1)  # keep the windows open: the bytes were read
        attacker.server.data_to_send()
    assert attacker.terminated() is None


def test_empty_data_frames_that_end_their_streams_are_requests_not_a_flood() -> None:
    attacker = Attacker()
    for _ in range(MAX_EMPTY_DATA * 3):
        stream_id, headers = attacker.connect()
        attacker.send(headers + _empty(stream_id, flags=wire.END_STREAM))
    assert attacker.terminated() is None


# --- h2 as the independent peer: it reads our resets and GOAWAY as HTTP/2 says -----------------------------------


def _h2_client() -> tuple[h2.connection.H2Connection, HboneServerConnection]:
    peer = h2.connection.H2Connection(h2.config.H2Configuration(client_side=True, header_encoding=None))
    peer.initiate_connection()
    server = HboneServerConnection()
    server.receive_data(peer.data_to_send())
    peer.receive_data(server.data_to_send())
    server.receive_data(peer.data_to_send())  # h2's SETTINGS ACK
    return peer, server


def test_h2_sees_each_made_you_reset_stream_reset_then_goaway_enhance_your_calm() -> None:
    peer, server = _h2_client()
    h2_events: list[h2.events.Event] = []
    for _ in range(MAX_EARLY_RESETS + 1):
        stream_id = peer.get_next_available_stream_id()
        peer.send_headers(stream_id, [(b":method", b"CONNECT"), (b":authority", AUTHORITY.encode())])
        # h2 will not send an increment of 0 itself: the attacker's frame is written by hand.
        server.receive_data(peer.data_to_send() + wire.frame(wire.WINDOW_UPDATE, 0, stream_id, struct.pack(">L", 0)))
        h2_events += peer.receive_data(server.data_to_send())
    resets = [e for e in h2_events if isinstance(e, h2.events.StreamReset)]
    assert len(resets) == MAX_EARLY_RESETS + 1 and all(e.error_code == wire.PROTOCOL_ERROR for e in resets)
    terminated = h2_events[-1]  # the last stream's reset, then GOAWAY
    assert isinstance(terminated, h2.events.ConnectionTerminated)
    assert terminated.error_code == wire.ENHANCE_YOUR_CALM and terminated.last_stream_id == resets[-1].stream_id


def test_h2_pinging_a_server_that_keeps_up_is_answered_every_time() -> None:
    peer, server = _h2_client()
    acks = 0
    for round_ in range(3):
        for index in range(MAX_QUEUED_CONTROL):
            peer.ping(struct.pack(">Q", round_ * MAX_QUEUED_CONTROL + index))
        server.receive_data(peer.data_to_send())
        acks += sum(isinstance(e, h2.events.PingAckReceived) for e in peer.receive_data(server.data_to_send()))
    assert acks == 3 * MAX_QUEUED_CONTROL and not server.closed
