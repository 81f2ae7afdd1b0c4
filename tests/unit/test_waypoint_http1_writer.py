"""The HTTP/1.1 head writer's checks of rule 1 (:mod:`ambit.waypoint.http1_writer`): the names and values it
remembers as checked are judged as a fresh check judges them, whatever came before and however full its memory;
and a body's framing read off the headers as rule 2 states it."""

from __future__ import annotations

import re

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from ambit.waypoint import http1_writer
from ambit.waypoint.http1_writer import Framing, FramingError, body_framing, response_head

TOKEN = re.compile(r"[-!#$%&'*+.^_`|~0-9A-Za-z]+")
VALUE = re.compile(r"(?:[\x21-\x7e\x80-\xff](?:[ \t]*[\x21-\x7e\x80-\xff])*)?")


def reference(headers: list[tuple[str, str]]) -> bytes | None:
    """The head each field checked afresh gives, or None where rule 1 refuses it."""
    if not all(TOKEN.fullmatch(n) and VALUE.fullmatch(v) for n, v in headers):
        return None
    return b"HTTP/1.1 200 OK\r\n" + "".join(f"{n}: {v}\r\n" for n, v in headers).encode("latin-1") + b"\r\n"


_TEXT = st.one_of(
    st.sampled_from(["host", "content-type", "x-id", "keep-alive", "a b", " x", "x ", "", "é", "\t", "n\r\nx: y"]),
    st.text(st.characters(max_codepoint=0xFF), max_size=70),
)
_HEADS = st.lists(st.lists(st.tuples(_TEXT, _TEXT), max_size=4), min_size=1, max_size=12)


def written(headers: list[tuple[str, str]]) -> bytes | None:
    try:
        return response_head(200, "OK", headers)
    except FramingError:
        return None


@settings(max_examples=300)
@given(_HEADS, st.sampled_from([2, 512]))
def test_remembered_names_and_values_are_judged_as_fresh_checks_judge_them(
    heads: list[list[tuple[str, str]]], most: int
) -> None:
    with pytest.MonkeyPatch.context() as patch:
        patch.setattr(http1_writer, "_REMEMBERED_MOST", most)
        patch.setattr(http1_writer, "_GOOD_NAMES", set())
        patch.setattr(http1_writer, "_GOOD_VALUES", set())
        for headers in heads + heads:  # each head again, once its parts may be remembered
            assert written(headers) == reference(headers)
        assert len(http1_writer._GOOD_NAMES) <= most and len(http1_writer._GOOD_VALUES) <= most


def test_long_values_are_checked_every_time_and_never_remembered() -> None:
    value = "v" * 65
    assert written([("x-long", value)]) is not None
    assert value not in http1_writer._GOOD_VALUES and "x-long" in http1_writer._GOOD_NAMES


def framing_reference(headers: list[tuple[str, str]]) -> tuple[Framing | None, int, list[tuple[str, str]]] | None:
    """Rule 2 as stated: one final ``chunked`` coding wins (lengths dropped); else equal lengths of digits; or None
    where the writer refuses the headers."""
    codings = [v for n, v in headers if n == "transfer-encoding"]
    lengths = {v.strip() for n, v in headers if n == "content-length"}
    if codings:
        if len(codings) != 1 or codings[0].strip().lower() != "chunked":
            return None
        return Framing.CHUNKED, 0, [(n, v) for n, v in headers if n != "content-length"]
    if not lengths:
        return None, 0, headers
    if len(lengths) > 1 or not all(c in "0123456789" for c in next(iter(lengths))) or not next(iter(lengths)):
        return None
    return Framing.LENGTH, int(next(iter(lengths))), headers


_FRAMING_FIELDS = st.lists(
    st.tuples(
        st.sampled_from(["content-length", "transfer-encoding", "host", "x-id"]),
        st.sampled_from(["5", " 5", "5 ", "6", "", "05", "1a", "-1", "\u0663", "chunked", " Chunked", "gzip"]),
    ),
    max_size=6,
)


@settings(max_examples=500)
@given(_FRAMING_FIELDS)
def test_body_framing_follows_rule_2(headers: list[tuple[str, str]]) -> None:
    try:
        got: tuple[Framing | None, int, list[tuple[str, str]]] | None = body_framing(headers)
    except FramingError:
        got = None
    assert got == framing_reference(headers)
