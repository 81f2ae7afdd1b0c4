"""The fault suite's load generator (tests/faults/load.py): its target syntax and how failures are classified."""

from __future__ import annotations

import argparse
import asyncio

import pytest
from hypothesis import given
from hypothesis import strategies as st
from tests.faults.load import PAYLOAD, Target, classify, payload

NAMES = st.text(st.characters(min_codepoint=33, max_codepoint=126, exclude_characters="="), min_size=1, max_size=20)


@given(NAMES, st.ip_addresses(v=4).map(str), st.integers(1, 65535))
def test_a_target_round_trips(name: str, host: str, port: int) -> None:
    assert Target.parse(f"{name}={host}:{port}") == Target(name, host, port)


@given(st.text(max_size=40) | st.sampled_from(["a=b:\u00b2", "a=b:0", "a=b:65536", "a=:80", "=b:80", "a=b:x"]))
def test_any_text_is_a_target_or_a_clear_argument_error(text: str) -> None:
    try:
        target = Target.parse(text)
    except argparse.ArgumentTypeError as exc:
        assert "NAME=HOST:PORT" in str(exc)
    else:
        assert target.name and target.host and 0 < target.port < 65536


@pytest.mark.parametrize(
    ("exc", "outcome"),
    [
        (ConnectionRefusedError(), "refused"),
        (ConnectionResetError(), "reset"),
        (BrokenPipeError(), "reset"),
        (asyncio.IncompleteReadError(b"", 10), "eof"),
        (TimeoutError(), "timeout"),
        (OSError("no route"), "error"),
    ],
)
def test_failures_are_classified_as_the_application_sees_them(exc: BaseException, outcome: str) -> None:
    assert classify(exc) == outcome


def test_every_payload_starts_with_the_marker_and_has_the_set_size() -> None:
    data = payload("MARK", Target("a>b", "198.18.1.2", 9000), 7, PAYLOAD)
    assert data.startswith(b"MARK a>b 7 ") and len(data) == PAYLOAD and data.endswith(b"\n")
