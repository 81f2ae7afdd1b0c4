"""Fuzz: nothing a peer sends makes ``receive_data`` raise, hang, or keep stream state after termination."""

from __future__ import annotations

import itertools
import struct
import time

from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from ambit.hbone import (
    ConnectionTerminated,
    DataReceived,
    Event,
    HboneClientConnection,
    HboneServerConnection,
    TunnelRequested,
)
from ambit.hbone.connection import HboneConnection

PREAMBLE = b"PRI * HTTP/2.0\r\n\r\nSM\r\n\r\n"
FUZZ = settings(max_examples=150, deadline=None, suppress_health_check=[HealthCheck.too_slow])


def feed(conn: HboneConnection, chunks: list[bytes]) -> list[Event]:
    """Feed chunks like a shell would (consuming data, answering tunnels) and check the invariants."""
    seen: list[Event] = []
    for chunk in chunks:
        start = time.perf_counter()
        events = conn.receive_data(chunk)
        assert time.perf_counter() - start < 2.0
        conn.data_to_send()
        seen += events
        for event in events:
            if isinstance(event, DataReceived):
                conn.consumed(event.stream_id, event.flow_length)
            elif isinstance(event, TunnelRequested) and isinstance(conn, HboneServerConnection):
                conn.respond(event.stream_id, 200)
                conn.send_data(event.stream_id, b"hello")
        assert conn.active_streams <= 100
        if any(isinstance(e, ConnectionTerminated) for e in events):
            assert conn.closed
        if conn.closed:
            assert conn._streams == {}
            assert conn._blocked == {}
            assert conn.receive_data(b"\x00" * 9) == []
    return seen


def frame(kind: int, flags: int, stream_id: int, payload: bytes) -> bytes:
    length = len(payload)
    return struct.pack(">HBBBL", length >> 8, length & 0xFF, kind, flags, stream_id) + payload


frames = st.builds(
    frame,
    kind=st.integers(0, 12),
    flags=st.integers(0, 255),
    stream_id=st.sampled_from([0, 1, 2, 3, 5, 7, 0x7FFFFFFF, 0x80000001]),
    payload=st.binary(max_size=64),
)


def split(data: bytes, cuts: list[int]) -> list[bytes]:
    points = sorted({c % (len(data) + 1) for c in cuts})
    edges = [0, *points, len(data)]
    return [data[a:b] for a, b in itertools.pairwise(edges) if b > a]


def client_conversation() -> bytes:
    """What a well-behaved client sends for three tunnels: data, half-close, reset, a non-CONNECT request."""
    client = HboneClientConnection()
    server = HboneServerConnection()
    wire = [client.data_to_send()]
    server.receive_data(wire[0])
    client.receive_data(server.data_to_send())
    first = client.open_tunnel("198.18.200.7:8080", [("baggage", "service.name=a")])
    second = client.open_tunnel("[fd00::7]:443")
    third = client.open_tunnel("echo.default.svc.cluster.local:80")
    wire.append(client.data_to_send())
    server.receive_data(wire[-1])
    for stream_id in (first, second, third):
        server.respond(stream_id, 200)
    client.receive_data(server.data_to_send())
    client.send_data(first, b"a" * 40_000)
    client.end_stream(first)
    client.send_data(second, b"b" * 100)
    client.reset_stream(third)
    wire.append(client.data_to_send())
    return b"".join(wire)


def frame_boundaries(data: bytes) -> list[bytes]:
    body = data[len(PREAMBLE) :]
    out = []
    while body:
        length = int.from_bytes(body[:3], "big")
        out.append(body[: 9 + length])
        body = body[9 + length :]
    return out


def handshake_bytes() -> bytes:
    return HboneClientConnection().data_to_send()


VALID = client_conversation()
VALID_FRAMES = frame_boundaries(VALID)


@FUZZ
@given(st.binary(max_size=2048), st.lists(st.integers(0, 4096), max_size=6))
def test_random_bytes_to_a_server_never_raise(data: bytes, cuts: list[int]) -> None:
    feed(HboneServerConnection(), split(data, cuts))


@FUZZ
@given(st.binary(max_size=2048))
def test_random_bytes_after_a_valid_preamble_never_raise(data: bytes) -> None:
    feed(HboneServerConnection(), [handshake_bytes(), data])


@FUZZ
@given(st.lists(frames, max_size=30), st.lists(st.integers(0, 4096), max_size=4))
def test_random_frames_after_a_valid_preamble_never_raise(chosen: list[bytes], cuts: list[int]) -> None:
    feed(HboneServerConnection(), [handshake_bytes(), *split(b"".join(chosen), cuts)])


@FUZZ
@given(
    st.lists(st.integers(0, len(VALID) * 8 - 1), max_size=4),
    st.integers(0, len(VALID)),
    st.lists(st.integers(0, len(VALID_FRAMES) - 1), max_size=3),
)
def test_mutated_valid_streams_never_raise(flips: list[int], cut: int, duplicates: list[int]) -> None:
    pieces = list(VALID_FRAMES)
    for index in sorted(duplicates, reverse=True):
        pieces.insert(index, pieces[index])
    data = bytearray(VALID[: len(PREAMBLE)] + b"".join(pieces))
    for bit in flips:
        if bit // 8 < len(data):
            data[bit // 8] ^= 1 << (bit % 8)
    feed(HboneServerConnection(), [bytes(data[:cut]), bytes(data[cut:])])


def test_the_unmutated_conversation_is_accepted() -> None:
    events = feed(HboneServerConnection(), [VALID])
    assert [e for e in events if isinstance(e, TunnelRequested)]
    assert not [e for e in events if isinstance(e, ConnectionTerminated)]


@FUZZ
@given(st.binary(max_size=2048), st.lists(frames, max_size=20))
def test_a_client_receiving_random_bytes_never_raises(data: bytes, chosen: list[bytes]) -> None:
    client = HboneClientConnection()
    client.open_tunnel("198.18.200.7:8080")
    server_settings = HboneServerConnection().data_to_send()
    feed(client, [server_settings, b"".join(chosen) + data])


@FUZZ
@given(st.binary(max_size=512))
def test_a_client_receiving_random_bytes_without_settings_never_raises(data: bytes) -> None:
    client = HboneClientConnection()
    client.open_tunnel("198.18.200.7:8080")
    feed(client, [data])


def test_an_announced_giant_frame_ends_the_connection_without_buffering_it() -> None:
    server = HboneServerConnection()
    events = server.receive_data(handshake_bytes() + frame(0, 0, 1, b"")[:3].replace(b"\0\0\0", b"\xff\xff\xff"))
    events += server.receive_data(b"\x00\x00\x00\x00\x01" + b"x" * 100)
    assert any(isinstance(e, ConnectionTerminated) for e in events)
    assert server.closed


def test_an_announced_giant_headers_frame_is_refused_before_its_body_arrives() -> None:
    server = HboneServerConnection()
    header = struct.pack(">HBBBL", 0xFFFF, 0xFF, 0x1, 0x4, 1)  # HEADERS, 16 MiB - 1 announced
    events = server.receive_data(handshake_bytes() + header + b"x" * 1000)
    assert [type(e) for e in events] == [ConnectionTerminated]
    assert server.closed
