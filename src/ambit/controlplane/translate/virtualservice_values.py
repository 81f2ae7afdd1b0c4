"""Reading a VirtualService's values (plain API dicts, as the API server stores them): objects, lists, strings,
integers, ``Percent``, protobuf ``Duration`` text and ``StringMatch``, each checked so that what comes out is
something the waypoint's decoder (:mod:`ambit.xds.routes`) accepts.

Rules:

1. A value of the wrong type, or one the waypoint could not take (unprintable text, a weight beyond int32, a
   duration beyond :data:`MAX_DURATION`, a header value with CR, LF or NUL, a regular expression RE2 would refuse),
   raises :class:`BadField` naming the field; the caller drops the rule or match it belongs to and reports it.
2. Absent values read as empty (``None`` for integers and percents).
3. ``StringMatch``: ``exact``, ``prefix``, ``regex``; an empty one or ``regex: "*"`` means present (istiod's
   ``present_match``); two kinds at once are refused.
"""

from __future__ import annotations

import re
from collections.abc import Mapping
from typing import Any

from ambit.controlplane.translate.routerules import regex_problem
from ambit.model.route_matches import ValueMatch, ValueMatchType

__all__ = [
    "MAX_DURATION",
    "MAX_WEIGHT",
    "BadField",
    "parse_duration",
    "read_header_value",
    "read_int",
    "read_list",
    "read_mapping",
    "read_percent",
    "read_printable",
    "read_string_match",
    "read_text",
    "read_weight",
]

MAX_DURATION = 366 * 24 * 3600.0
"""A year: longer timeouts and delays are surely mistakes, and they must fit a protobuf Duration."""
MAX_WEIGHT = 2**31 - 1
_DURATION_PART = re.compile(r"([0-9]+(?:\.[0-9]*)?|\.[0-9]+)(h|ms|m|s|us|µs|ns)")
_UNIT = {"h": 3600.0, "m": 60.0, "s": 1.0, "ms": 1e-3, "us": 1e-6, "µs": 1e-6, "ns": 1e-9}


class BadField(Exception):
    """A part of a VirtualService that cannot be used: the field and why."""

    def __init__(self, field: str, reason: str) -> None:
        super().__init__(reason)
        self.field = field
        self.reason = reason


def read_mapping(value: Any, field: str) -> Mapping[str, Any]:
    if value is None:
        return {}
    if not isinstance(value, Mapping):
        raise BadField(field, "expected an object")
    return value


def read_list(value: Any, field: str) -> list[Any]:
    if value is None:
        return []
    if not isinstance(value, list):
        raise BadField(field, "expected a list")
    return value


def read_text(value: Any, field: str) -> str:
    if value is None:
        return ""
    if not isinstance(value, str):
        raise BadField(field, "expected a string")
    return value


def read_printable(value: Any, field: str) -> str:
    """A string the waypoint's decoder accepts as text (no control characters): anything else would make it
    refuse the whole config (a NACK), so it is refused here, for this rule only."""
    text = read_text(value, field)
    if not text.isprintable():
        raise BadField(field, "has unprintable characters")
    return text


def read_int(value: Any, field: str) -> int | None:
    if value is None:
        return None
    if isinstance(value, bool) or not isinstance(value, int):
        raise BadField(field, "expected an integer")
    return value


def read_weight(value: Any, field: str) -> int:
    weight = read_int(value, field) or 0
    if not 0 <= weight <= MAX_WEIGHT:
        raise BadField(field, f"expected 0 to {MAX_WEIGHT}")
    return weight


def read_percent(value: Any, field: str) -> float | None:
    """A ``Percent`` (``{value: 12.5}``); None when absent."""
    if value is None:
        return None
    raw = read_mapping(value, field).get("value", 0.0)
    if isinstance(raw, bool) or not isinstance(raw, int | float) or not 0.0 <= raw <= 100.0:
        raise BadField(f"{field}.value", "expected a number from 0 to 100")
    return float(raw)


def parse_duration(value: Any, field: str) -> float:
    """A protobuf Duration as YAML writes it (``10s``, ``0.5s``, ``250ms``, ``1m30s``), in seconds, at most
    :data:`MAX_DURATION`."""
    text = read_text(value, field)
    parts = _DURATION_PART.findall(text)
    if not text or len(text) > 64 or "".join(n + u for n, u in parts) != text:
        raise BadField(field, f"invalid duration {text[:64]!r} (expected e.g. 10s, 0.5s, 250ms)")
    seconds = sum(float(n) * _UNIT[u] for n, u in parts)
    if not seconds <= MAX_DURATION:
        raise BadField(field, f"longer than {MAX_DURATION:.0f} seconds")
    return seconds


def read_header_value(value: Any, field: str) -> str:
    text = read_text(value, field)
    if any(c in text for c in "\r\n\0"):
        raise BadField(field, "a header value may not hold CR, LF or NUL")
    return text


def read_string_match(name: str, value: Any, field: str) -> ValueMatch:
    spec = read_mapping(value, field)
    known = [k for k in ("exact", "prefix", "regex") if k in spec]
    if len(known) > 1:
        raise BadField(field, "only one of exact, prefix, regex")
    if not known or (known == ["regex"] and spec["regex"] == "*"):
        return ValueMatch(name, "", ValueMatchType.PRESENT)
    kind = known[0]
    text = read_header_value(spec[kind], f"{field}.{kind}")
    if kind == "regex":
        problem = regex_problem(text)
        if problem is not None:
            raise BadField(f"{field}.regex", problem)
        return ValueMatch(name, text, ValueMatchType.REGULAR_EXPRESSION)
    return ValueMatch(name, text, ValueMatchType.EXACT if kind == "exact" else ValueMatchType.PREFIX)
