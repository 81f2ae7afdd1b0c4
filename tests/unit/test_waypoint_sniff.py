"""The waypoint's local protocol sniff (TODO-replace with the engine's): HTTP/1.1 by its method, HTTP/2 by its
preface, anything else TCP; undecided only while the bytes could still be either."""

from __future__ import annotations

import pytest
from hypothesis import given
from hypothesis import strategies as st

from ambit.model.workload import AppProtocol
from ambit.waypoint.inbound import H2_PREFACE, classify


@pytest.mark.parametrize(
    ("prefix", "expected"),
    [
        (b"GET / HTTP/1.1\r\n", AppProtocol.HTTP11),
        (b"POST ", AppProtocol.HTTP11),
        (b"GE", None),
        (b"", None),
        (H2_PREFACE, AppProtocol.HTTP2),
        (H2_PREFACE[:10], None),
        (b"\x16\x03\x01\x00", AppProtocol.TCP),  # TLS
        (b"SSH-2.0-OpenSSH", AppProtocol.TCP),
        (b"get / HTTP/1.1", AppProtocol.TCP),
        (b"ABCDEFGHIJKLMNOPQRSTU", AppProtocol.TCP),  # no method is that long
    ],
)
def test_classify(prefix: bytes, expected: AppProtocol | None) -> None:
    assert classify(prefix) == expected


@given(st.binary(max_size=64))
def test_classify_decides_once_enough_bytes_are_seen(prefix: bytes) -> None:
    verdict = classify(prefix)
    if len(prefix) >= len(H2_PREFACE):
        assert verdict is not None
