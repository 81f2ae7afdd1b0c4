"""ambit.hbone.hpack_blocks against the hpack package's own coding: the same octets, fields, tables and rejections."""

from __future__ import annotations

import contextlib

import pytest
from hpack import Decoder, Encoder, HPACKDecodingError, HPACKError
from hypothesis import given, settings
from hypothesis import strategies as st

from ambit.hbone import hpack_blocks
from ambit.hbone.messages import Http2ClientConnection, Http2ServerConnection

_NAMES = st.sampled_from(
    [":status", ":method", ":path", "content-type", "content-length", "date", "server", "x-request-id", "x-a", "x-b"]
)
_NAME = st.one_of(_NAMES, st.from_regex(r"[a-z0-9-]{1,40}", fullmatch=True))
_VALUE = st.one_of(st.sampled_from(["", "200", "404", "GET", "/", "text/plain", "1024"]), st.text(max_size=60))
_BLOCK = st.lists(st.tuples(_NAME, _VALUE), max_size=10)
_TABLE_SIZES = st.sampled_from([None, None, None, 0, 64, 256, 4096])
"""Before a block: no change (mostly), or a new table size, as a peer's SETTINGS_HEADER_TABLE_SIZE makes."""


def _table(coder: Encoder | Decoder) -> tuple[list[tuple[bytes, bytes]], int, int]:
    table = coder.header_table
    return list(table.dynamic_entries), table._current_size, table.maxsize


@given(st.lists(st.tuples(_TABLE_SIZES, _BLOCK), min_size=1, max_size=8))
def test_encoded_blocks_are_the_packages_octets_and_leave_the_same_table(
    blocks: list[tuple[int | None, list[tuple[str, str]]]],
) -> None:
    ours, theirs = Encoder(), Encoder()
    for size, fields in blocks:
        if size is not None:
            ours.header_table_size = theirs.header_table_size = size
        assert hpack_blocks.encode(ours, fields) == theirs.encode(fields, huffman=False)
        assert _table(ours) == _table(theirs)
        assert ours.header_table.resized == theirs.header_table.resized


def _field(name: str, value: str, how: int) -> tuple[str, str] | tuple[str, str, bool]:
    return (name, value, True) if how else (name, value)


_SENT_BLOCK = st.lists(st.builds(_field, _NAME, _VALUE, st.integers(0, 3).map(lambda n: n == 0)), max_size=10)


def _decode_both(ours: Decoder, theirs: Decoder, block: bytes) -> None:
    try:
        expected = [(bytes(n), bytes(v)) for n, v in theirs.decode(block, raw=True)]
    except HPACKError:
        with pytest.raises(HPACKDecodingError):
            hpack_blocks.decode(ours, block)
        raise
    assert hpack_blocks.decode(ours, block) == expected
    assert _table(ours) == _table(theirs)


@settings(max_examples=300)
@given(
    st.lists(st.tuples(_TABLE_SIZES, _SENT_BLOCK, st.booleans()), min_size=1, max_size=8),
    st.sampled_from([64, 300, 65536]),
)
def test_decoded_blocks_are_the_packages_fields_and_leave_the_same_table(
    blocks: list[tuple[int | None, list[tuple[str, str] | tuple[str, str, bool]], bool]], list_limit: int
) -> None:
    sender = Encoder()
    ours, theirs = Decoder(max_header_list_size=list_limit), Decoder(max_header_list_size=list_limit)
    for size, fields, huffman in blocks:
        if size is not None:
            sender.header_table_size = size
        try:
            _decode_both(ours, theirs, sender.encode(fields, huffman=huffman))
        except HPACKError:
            return  # both rejected it (a list above the limit): the connection ends there


_MUTATION = st.one_of(
    st.tuples(st.just("flip"), st.integers(0, 10_000), st.integers(1, 255)),
    st.tuples(st.just("cut"), st.integers(0, 10_000), st.just(0)),
    st.tuples(st.just("insert"), st.integers(0, 10_000), st.integers(0, 255)),
)


def _mutate(block: bytes, mutation: tuple[str, int, int]) -> bytes:
    kind, where, octet = mutation
    at = where % (len(block) + 1)
    if kind == "flip" and block:
        at %= len(block)
        return block[:at] + bytes((block[at] ^ octet,)) + block[at + 1 :]
    if kind == "cut":
        return block[:at]
    return block[:at] + bytes((octet,)) + block[at:]


@settings(max_examples=500)
@given(
    st.lists(st.tuples(_SENT_BLOCK, st.booleans(), st.lists(_MUTATION, max_size=3)), min_size=1, max_size=5),
    st.sampled_from([4096, 256, 0]),
)
def test_corrupted_blocks_are_rejected_exactly_when_the_package_rejects_them(
    blocks: list[tuple[list[tuple[str, str] | tuple[str, str, bool]], bool, list[tuple[str, str, int]]]],
    allowed_table: int,
) -> None:
    sender = Encoder()
    ours, theirs = Decoder(), Decoder()
    ours.max_allowed_table_size = theirs.max_allowed_table_size = allowed_table
    for fields, huffman, mutations in blocks:
        block = sender.encode(fields, huffman=huffman)
        for mutation in mutations:
            block = _mutate(block, mutation)
        try:
            _decode_both(ours, theirs, block)
        except HPACKError:
            return


@settings(max_examples=500)
@given(st.binary(max_size=80))
def test_arbitrary_octets_decode_alike_or_are_rejected_by_both(block: bytes) -> None:
    with contextlib.suppress(HPACKError):
        _decode_both(Decoder(), Decoder(), block)


def test_integers_of_more_than_five_continuation_octets_are_rejected() -> None:
    five = b"\xff" + b"\x80" * 4 + b"\x00"  # index 127 in five continuation octets: out of the tables, but read
    with pytest.raises(HPACKDecodingError, match="invalid table index 127"):
        hpack_blocks.decode(Decoder(), five)
    with pytest.raises(HPACKDecodingError, match="too long"):
        hpack_blocks.decode(Decoder(), b"\xff" + b"\x80" * 5 + b"\x00")


def test_a_table_size_update_after_a_field_is_rejected() -> None:
    with pytest.raises(HPACKDecodingError, match="not at the start"):
        hpack_blocks.decode(Decoder(), b"\x88\x20")
    assert hpack_blocks.decode(Decoder(), b"\x20\x88") == [(b":status", b"200")]


def test_a_response_head_crosses_the_engine_and_its_repeat_is_sent_indexed() -> None:
    client, server = Http2ClientConnection(), Http2ServerConnection()
    server.receive_data(client.data_to_send())
    client.receive_data(server.data_to_send())
    server.receive_data(client.data_to_send())
    sizes = []
    for _ in range(2):
        stream_id = client.send_request("GET", "http", "echo.bench", "/echo", [("x-a", "1")], end_stream=True)
        server.receive_data(client.data_to_send())
        server.respond(stream_id, 200, [("content-type", "text/plain"), ("x-request-id", "abc")], end_stream=True)
        out = server.data_to_send()
        sizes.append(len(out))
        client.receive_data(out)
    assert sizes[1] < sizes[0]  # the second head names its fields by their dynamic-table index


def test_the_header_list_limit_counts_32_octets_per_field_plus_its_name_and_value() -> None:
    status = b"\x88"  # :status 200: 32 + 7 + 3 = 42 octets
    assert hpack_blocks.decode(Decoder(max_header_list_size=42), status) == [(b":status", b"200")]
    with pytest.raises(HPACKDecodingError, match="larger than 41"):
        hpack_blocks.decode(Decoder(max_header_list_size=41), status)
