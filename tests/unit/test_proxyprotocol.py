"""The PROXY protocol codec (:mod:`ambit.proxyprotocol`): round trips, the decoder's rules, hostile input."""

from __future__ import annotations

import contextlib
import ipaddress
import struct

import pytest
from hypothesis import given
from hypothesis import strategies as st

from ambit.proxyprotocol import (
    SIGNATURE,
    TLV_PEER_IDENTITY,
    Command,
    ProxyHeader,
    ProxyHeaderDecoder,
    ProxyHeaderError,
    ProxyProtocolError,
    encode_v1,
    encode_v2,
    encode_v2_local,
)

V4 = (ipaddress.IPv4Address("10.0.0.1"), 5000)
V4_DST = (ipaddress.IPv4Address("10.0.0.2"), 80)
V6 = (ipaddress.IPv6Address("fd00::1"), 5000)
IDENTITY = b"spiffe://cluster.local/ns/app/sa/client"

ports = st.integers(0, 65535)
v4 = st.tuples(st.builds(ipaddress.IPv4Address, st.integers(0, 2**32 - 1)), ports)
v6 = st.tuples(st.builds(ipaddress.IPv6Address, st.integers(0, 2**128 - 1)), ports)
tlv_lists = st.lists(st.tuples(st.integers(0, 255), st.binary(max_size=300)), max_size=6, unique_by=lambda t: t[0])


def decode_all(data: bytes) -> ProxyHeader | None:
    return ProxyHeaderDecoder().receive_data(data)


def test_a_header_with_the_identity_tlv_is_the_bytes_ztunnel_writes() -> None:
    header = encode_v2(V4, V4_DST, ((TLV_PEER_IDENTITY, IDENTITY),))
    body = V4[0].packed + V4_DST[0].packed + struct.pack("!HH", 5000, 80)
    body += bytes((0xD0,)) + struct.pack("!H", len(IDENTITY)) + IDENTITY
    assert header == SIGNATURE + b"\x21\x11" + struct.pack("!H", len(body)) + body


@given(st.one_of(st.tuples(v4, v4), st.tuples(v6, v6)), tlv_lists, st.binary(max_size=40))
def test_round_trip(
    addresses: tuple[tuple[ipaddress.IPv4Address, int], ...], tlvs: list[tuple[int, bytes]], rest: bytes
) -> None:
    source, destination = addresses
    decoder = ProxyHeaderDecoder()
    header = decoder.receive_data(encode_v2(source, destination, tuple(tlvs)) + rest)
    assert header == ProxyHeader(Command.PROXY, source, destination, tuple(tlvs))
    assert decoder.trailing == rest
    for kind, value in tlvs:
        assert header.tlv(kind) == value


@given(st.one_of(st.tuples(v4, v4), st.tuples(v6, v6)), tlv_lists, st.data())
def test_a_truncated_header_asks_for_more_and_completes_in_any_pieces(
    addresses: tuple[tuple[ipaddress.IPv4Address, int], ...], tlvs: list[tuple[int, bytes]], data: st.DataObject
) -> None:
    encoded = encode_v2(*addresses, tuple(tlvs))
    cut = data.draw(st.integers(0, len(encoded) - 1))
    assert ProxyHeaderDecoder().receive_data(encoded[:cut]) is None
    decoder = ProxyHeaderDecoder()
    cuts = sorted(data.draw(st.sets(st.integers(1, len(encoded) - 1), max_size=5)))
    results = [decoder.receive_data(encoded[a:b]) for a, b in zip([0, *cuts], [*cuts, len(encoded)], strict=True)]
    assert results[-1] is not None and all(r is None for r in results[:-1])


@given(st.binary(max_size=200))
def test_any_bytes_give_a_header_more_please_or_the_codecs_own_error(data: bytes) -> None:
    with contextlib.suppress(ProxyHeaderError):
        decode_all(data)


@given(st.binary(max_size=120), st.integers(0, 0xFF), st.integers(0, 0xFF))
def test_any_body_after_a_valid_start_never_raises_anything_else(body: bytes, command: int, family: int) -> None:
    with contextlib.suppress(ProxyHeaderError):
        decode_all(SIGNATURE + bytes((command, family)) + struct.pack("!H", len(body)) + body)


def test_the_local_form_decodes_without_addresses() -> None:
    assert decode_all(encode_v2_local()) == ProxyHeader(Command.LOCAL)


@pytest.mark.parametrize(
    ("data", "reason"),
    [
        (b"GET / HTTP/1.1\r\n", "bad signature"),
        (b"\r\n\r\nX", "bad signature"),
        (b"PROXY TCP4 10.0.0.1 10.0.0.2 1 2\r\n", "bad signature"),
        (SIGNATURE + b"\x11\x11\x00\x0c" + bytes(12), "version 1, expected 2"),
        (SIGNATURE + b"\x22\x11\x00\x0c" + bytes(12), "unknown PROXY command 2"),
        (SIGNATURE + b"\x21\x12\x00\x0c" + bytes(12), "expected TCP over IP"),
        (SIGNATURE + b"\x21\x31\x00\x0c" + bytes(12), "expected TCP over IP"),
        (SIGNATURE + b"\x21\x11\x10\x01", "exceeds the limit"),
        (SIGNATURE + b"\x21\x11\x00\x08" + bytes(8), "too short for its addresses"),
        (SIGNATURE + b"\x21\x11\x00\x0e" + bytes(14), "inside a TLV"),
        (SIGNATURE + b"\x21\x11\x00\x10" + bytes(12) + b"\xd0\x00\x05x", "runs past the header's end"),
        (SIGNATURE + b"\x21\x11\x00\x14" + bytes(12) + b"\xd0\x00\x01a\xd0\x00\x01b", "appears twice"),
    ],
)
def test_malformed_headers_fail_with_a_clear_reason(data: bytes, reason: str) -> None:
    with pytest.raises(ProxyHeaderError, match=reason):
        decode_all(data)


def test_a_wrong_first_byte_fails_at_once() -> None:
    with pytest.raises(ProxyHeaderError):
        ProxyHeaderDecoder().receive_data(b"G")


def test_an_oversized_header_fails_before_its_body_arrives() -> None:
    decoder = ProxyHeaderDecoder(max_length=64)
    with pytest.raises(ProxyHeaderError, match="exceeds the limit of 64"):
        decoder.receive_data(SIGNATURE + b"\x21\x11\x00\x41")


def test_the_decoder_takes_nothing_after_its_header_or_an_error() -> None:
    decoder = ProxyHeaderDecoder()
    assert decoder.receive_data(encode_v2(V4, V4_DST)) is not None
    with pytest.raises(ProxyProtocolError, match="finished"):
        decoder.receive_data(b"x")


@pytest.mark.parametrize(
    ("source", "destination", "tlvs", "reason"),
    [
        (V4, V6, (), "different address families"),
        (V4, V4_DST, ((0xD0, bytes(65536)),), "cannot be encoded"),
        (V4, (V4_DST[0], 70000), (), "port out of range"),
        (V4, V4_DST, tuple((k, bytes(60000)) for k in (1, 2)), "does not fit"),
    ],
)
def test_unencodable_headers_raise_the_codecs_error(
    source: tuple[ipaddress.IPv4Address, int],
    destination: tuple[ipaddress.IPv4Address, int],
    tlvs: tuple[tuple[int, bytes], ...],
    reason: str,
) -> None:
    with pytest.raises(ProxyProtocolError, match=reason):
        encode_v2(source, destination, tlvs)


def test_v1_names_the_family_or_unknown() -> None:
    assert encode_v1(V4, V4_DST) == b"PROXY TCP4 10.0.0.1 10.0.0.2 5000 80\r\n"
    assert encode_v1(V4, V6) == b"PROXY UNKNOWN\r\n"
    assert encode_v1(None, V6) == b"PROXY UNKNOWN\r\n"


@given(st.one_of(st.tuples(v4, v4), st.tuples(v6, v6)), tlv_lists, st.binary(min_size=1, max_size=20))
def test_reading_only_what_is_needed_never_reads_past_the_header(
    addresses: tuple[tuple[ipaddress.IPv4Address, int], ...], tlvs: list[tuple[int, bytes]], payload: bytes
) -> None:
    wire = encode_v2(*addresses, tuple(tlvs)) + payload
    decoder, offset, header = ProxyHeaderDecoder(), 0, None
    while header is None:
        take = decoder.needed
        assert take > 0
        header = decoder.receive_data(wire[offset : offset + take])
        offset += take
    assert wire[offset:] == payload and decoder.trailing == b"" and decoder.needed == 0
