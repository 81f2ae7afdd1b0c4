"""Header fields as the HTTP/1.1 reader gives them (:mod:`ambit.waypoint.http1_reader` rule 5), with the names and
values it remembers by their bytes: the same fields as decoding each afresh, whatever came before and however
full its tables; and whether a head has a framing field."""

from __future__ import annotations

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from ambit.waypoint import http1_reader
from ambit.waypoint.errors import HttpProtocolError
from ambit.waypoint.http1_events import Signal
from ambit.waypoint.http1_reader import MessageReader, ParsedHead

_NAME = st.one_of(
    st.sampled_from([b"Host", b"host", b"HOST", b"Content-Type", b"X-Id", b"x-id", b"Accept"]),
    st.text("abcXYZ-_!#0123456789", min_size=1, max_size=70).map(str.encode),
)
_VALUE = st.one_of(
    st.sampled_from([b"a", b" a", b"a ", b"\ta\t", b"", b"keep-alive", b"\xe9t\xe9", b"x  y", b"Host", b"X-Id"]),
    st.binary(max_size=80).map(lambda v: bytes(c for c in v if (c >= 0x20 and c != 0x7F) or c == 0x09)),
)


def fields_read(headers: list[tuple[bytes, bytes]]) -> list[tuple[str, str]]:
    reader = MessageReader(response=False, max_head_bytes=1 << 20, error=HttpProtocolError)
    raw = b"".join(b"%s: %s\r\n" % (n, v) for n, v in headers)
    reader.receive(b"GET / HTTP/1.1\r\n" + raw + b"content-length: 0\r\n\r\n")
    head = reader.pop()
    assert isinstance(head, ParsedHead), head
    return head.headers


def reference(headers: list[tuple[bytes, bytes]]) -> list[tuple[str, str]]:
    return [(n.decode("latin-1").lower(), v.decode("latin-1").strip(" \t")) for n, v in headers] + [
        ("content-length", "0")
    ]


@settings(max_examples=200)
@given(st.lists(st.lists(st.tuples(_NAME, _VALUE), max_size=5), min_size=1, max_size=8), st.sampled_from([2, 512]))
def test_remembered_names_and_values_read_as_decoded_afresh(heads: list[list[tuple[bytes, bytes]]], most: int) -> None:
    with pytest.MonkeyPatch.context() as patch:
        patch.setattr(http1_reader, "_DECODED_MOST", most)
        patch.setattr(http1_reader, "_FIELDS", {})
        for headers in heads + heads:  # each head again, once its fields may be remembered
            assert fields_read(headers) == reference(headers)
        assert len(http1_reader._FIELDS) <= most
        assert all(len(n) + len(v) <= http1_reader._DECODED_LONGEST for n, v in http1_reader._FIELDS)


_FRAMING = ("content-length", "transfer-encoding")
_LOOKALIKES = st.lists(st.sampled_from([b"x-a: 1\r\n", b"Content-Type: t\r\n", b"Content-Lengths: 3\r\n"]), max_size=2)
_RESPONSES = st.lists(
    st.tuples(st.sampled_from(["length", "chunked", "no-content", "interim"]), _LOOKALIKES), max_size=6
)


def _response(kind: str, extra: bytes) -> bytes:
    if kind == "length":
        return b"HTTP/1.1 200 OK\r\n" + extra + b"Content-Length: 2\r\n\r\nok"
    if kind == "chunked":
        return b"HTTP/1.1 200 OK\r\n" + extra + b"Transfer-Encoding: chunked\r\n\r\n2\r\nok\r\n0\r\nx-t: 1\r\n\r\n"
    if kind == "no-content":
        return b"HTTP/1.1 204 No Content\r\n" + extra + b"\r\n"
    return b"HTTP/1.1 100 Continue\r\n" + extra + b"\r\n"


@settings(max_examples=200)
@given(_RESPONSES, st.booleans(), st.booleans())
def test_a_head_is_framed_when_a_framing_field_is_among_its_headers(
    responses: list[tuple[str, list[bytes]]], until_close: bool, bytewise: bool
) -> None:
    reader = MessageReader(response=True, max_head_bytes=1 << 20, error=HttpProtocolError)
    data = b"".join(_response(kind, b"".join(extra)) for kind, extra in responses)
    if until_close:
        data += b"HTTP/1.1 200 OK\r\nx-a: 1\r\n\r\nbody"
    for piece in [data[i : i + 1] for i in range(len(data))] if bytewise else [data]:
        reader.receive(piece)
    reader.receive(b"")
    heads = []
    while (item := reader.pop()) is not None and item is not Signal.CLOSED:
        assert not isinstance(item, HttpProtocolError), item
        if isinstance(item, ParsedHead):
            heads.append(item)
    assert len(heads) == len(responses) + until_close
    for head in heads:
        assert head.framed == any(n in _FRAMING for n, _ in head.headers)
