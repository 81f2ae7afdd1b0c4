"""SPDY/3.1 framing (:mod:`ambit.k8s.spdy`): round trips, bounds, and arbitrary bytes raising only the codec's error."""

from __future__ import annotations

import contextlib
import hashlib
import struct
import zlib

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from ambit.k8s import spdy

names = st.text(alphabet="abcdefghijklmnopqrstuvwxyz-0123456789", min_size=1, max_size=20)
header_blocks = st.dictionaries(names, st.text(max_size=40).map(lambda t: t.encode("utf-8").decode("latin-1"))).map(
    lambda d: tuple(d.items())
)
stream_ids = st.integers(1, spdy.MAX_STREAM_ID)


def test_the_dictionary_is_spdy3s() -> None:
    assert len(spdy.DICTIONARY) == 1423
    assert hashlib.sha256(spdy.DICTIONARY).hexdigest().startswith("51d27341373f923f")


def test_a_syn_stream_is_laid_out_as_the_spec_draws_it() -> None:
    raw = spdy.SpdySerializer().syn_stream(3, (("port", "80"),), fin=True, associated_to=1, priority=7)
    assert raw[:4] == bytes((0x80, 0x03, 0x00, 0x01))  # control bit, version 3, type SYN_STREAM
    assert raw[4] == spdy.FLAG_FIN
    assert int.from_bytes(raw[5:8], "big") == len(raw) - 8
    assert struct.unpack(">II", raw[8:16]) == (3, 1)
    assert raw[16] >> 5 == 7
    inflated = zlib.decompressobj(zdict=spdy.DICTIONARY).decompress(raw[18:])
    assert spdy.decode_header_block(inflated) == (("port", "80"),)


@given(st.lists(st.tuples(stream_ids, header_blocks, st.binary(max_size=300), st.booleans()), max_size=8))
def test_frames_round_trip_through_one_compression_context(frames: list[tuple[int, spdy.Headers, bytes, bool]]) -> None:
    out, parser = spdy.SpdySerializer(), spdy.SpdyParser()
    wire = b""
    expected: list[spdy.Event] = []
    for stream_id, headers, data, fin in frames:
        wire += out.syn_stream(stream_id, headers) + out.data(stream_id, data, fin=fin)
        wire += out.syn_reply(stream_id, headers, fin=fin) + out.headers(stream_id, headers)
        expected += [
            spdy.StreamOpened(stream_id, 0, 0, headers, False, False),
            spdy.DataReceived(stream_id, data, fin),
            spdy.ReplyReceived(stream_id, headers, fin),
            spdy.HeadersReceived(stream_id, headers, False),
        ]
    wire += out.rst_stream(5, spdy.RstStatus.CANCEL) + out.ping(7) + out.window_update(0, 100)
    wire += out.settings([(0, 7, 65536)], clear=True) + out.goaway(9, spdy.GoAwayStatus.OK)
    expected += [
        spdy.StreamReset(5, spdy.RstStatus.CANCEL),
        spdy.PingReceived(7),
        spdy.WindowUpdated(0, 100),
        spdy.SettingsReceived(((0, 7, 65536),), True),
        spdy.GoAwayReceived(9, 0),
    ]
    assert parser.feed(wire) == expected


@given(st.binary(max_size=3000), st.integers(1, 50))
def test_any_split_of_the_bytes_gives_the_same_frames(payload: bytes, step: int) -> None:
    out = spdy.SpdySerializer()
    wire = out.syn_stream(1, (("streamtype", "data"),)) + out.data(1, payload) + out.ping(1)
    parser = spdy.SpdyParser()
    events = [e for i in range(0, len(wire), step) for e in parser.feed(wire[i : i + step])]
    assert events == [
        spdy.StreamOpened(1, 0, 0, (("streamtype", "data"),), False, False),
        spdy.DataReceived(1, payload, False),
        spdy.PingReceived(1),
    ]


@settings(max_examples=400)
@given(st.lists(st.binary(max_size=200), max_size=6))
def test_arbitrary_bytes_raise_nothing_but_the_codecs_error(chunks: list[bytes]) -> None:
    parser = spdy.SpdyParser(max_frame=4096, max_header_block=1024)
    with contextlib.suppress(spdy.SpdyProtocolError):
        for chunk in chunks:
            parser.feed(chunk)


@given(st.binary(max_size=200))
def test_arbitrary_header_blocks_raise_nothing_but_the_codecs_error(block: bytes) -> None:
    with contextlib.suppress(spdy.SpdyProtocolError):
        spdy.decode_header_block(block)


@settings(max_examples=400)
@given(st.integers(0, 12), st.integers(0, 255), st.binary(max_size=300), st.booleans())
def test_control_frames_of_any_type_and_payload_raise_nothing_but_the_codecs_error(
    kind: int, flags: int, payload: bytes, compressed: bool
) -> None:
    if compressed and len(payload) >= 10:  # a header block that does inflate, so that the block parser sees it
        z = zlib.compressobj(zdict=spdy.DICTIONARY)
        payload = payload[:10] + z.compress(payload[10:]) + z.flush(zlib.Z_SYNC_FLUSH)
    frame = struct.pack(">IB", 0x80030000 | kind, flags) + len(payload).to_bytes(3, "big") + payload
    with contextlib.suppress(spdy.SpdyProtocolError):
        spdy.SpdyParser(max_header_block=1024).feed(frame)


def test_a_frame_longer_than_the_bound_is_refused_before_it_arrives() -> None:
    parser = spdy.SpdyParser(max_frame=1024)
    with pytest.raises(spdy.SpdyProtocolError, match="exceeds"):
        parser.feed(struct.pack(">IB", 1, 0) + (1025).to_bytes(3, "big"))
    with pytest.raises(spdy.SpdyProtocolError):  # the session is over: the next feed fails too
        parser.feed(spdy.SpdySerializer().ping(1))


def test_a_zlib_bomb_is_refused_at_the_cap() -> None:
    bomb_block = spdy.encode_header_block((("x", "a" * 1_000_000),))
    z = zlib.compressobj(9, zlib.DEFLATED, 15, 8, zlib.Z_DEFAULT_STRATEGY, spdy.DICTIONARY)
    compressed = z.compress(bomb_block) + z.flush(zlib.Z_SYNC_FLUSH)
    assert len(compressed) < 4096
    frame = struct.pack(">I", 0x80030001) + bytes((0,)) + (len(compressed) + 10).to_bytes(3, "big")
    frame += struct.pack(">IIBB", 1, 0, 0, 0) + compressed
    with pytest.raises(spdy.SpdyProtocolError, match="inflates beyond 65536"):
        spdy.SpdyParser().feed(frame)


def test_a_header_count_larger_than_the_block_is_refused_without_allocating() -> None:
    with pytest.raises(spdy.SpdyProtocolError, match="claims"):
        spdy.decode_header_block(struct.pack(">I", 0xFFFFFFFF))


@pytest.mark.parametrize(
    ("headers", "why"),
    [((("Port", "80"),), "lowercase"), ((("", "x"),), "empty"), ((("a", "1"), ("a", "2")), "repeated")],
)
def test_header_names_the_format_forbids_are_refused_both_ways(headers: spdy.Headers, why: str) -> None:
    with pytest.raises(spdy.SpdyUsageError):
        spdy.encode_header_block(headers)
    raw = struct.pack(">I", len(headers)) + b"".join(
        struct.pack(">I", len(n)) + n.encode() + struct.pack(">I", len(v)) + v.encode() for n, v in headers
    )
    with pytest.raises(spdy.SpdyProtocolError):
        spdy.decode_header_block(raw)


def test_unknown_control_frames_are_ignored_and_other_versions_refused() -> None:
    parser = spdy.SpdyParser()
    assert parser.feed(struct.pack(">IB", 0x80030005, 0) + (0).to_bytes(3, "big")) == []  # NOOP
    assert parser.feed(struct.pack(">IB", 0x8003FFFF, 0) + (2).to_bytes(3, "big") + b"xx") == []
    with pytest.raises(spdy.SpdyProtocolError, match="version 2"):
        parser.feed(struct.pack(">IB", 0x80020006, 0) + (4).to_bytes(3, "big") + b"\0\0\0\1")


@pytest.mark.parametrize(
    "frame",
    [
        struct.pack(">IB", 0x80030006, 0) + (3).to_bytes(3, "big") + b"abc",  # PING of 3 bytes
        struct.pack(">IB", 0x80030003, 0) + (8).to_bytes(3, "big") + bytes(8),  # RST_STREAM of stream 0
        struct.pack(">IB", 0x80030009, 0) + (8).to_bytes(3, "big") + bytes(8),  # WINDOW_UPDATE of 0
        struct.pack(">IB", 0, 0) + (1).to_bytes(3, "big") + b"x",  # data on stream 0
        struct.pack(">IB", 0x80030004, 0) + (4).to_bytes(3, "big") + b"\0\0\0\2",  # SETTINGS short of its entries
    ],
)
def test_malformed_frames_of_known_types_are_protocol_errors(frame: bytes) -> None:
    with pytest.raises(spdy.SpdyProtocolError):
        spdy.SpdyParser().feed(frame)


def test_header_value_ignores_the_case_kube_writes_names_in() -> None:
    assert spdy.header_value((("streamtype", "data"),), "streamType") == "data"
    assert spdy.header_value((), "port") is None
