"""The regular expressions of routes, made safe to run on what clients send.

Istio's Envoy runs route regular expressions with RE2, in time linear in the input. Python's :mod:`re` backtracks:
a pattern like ``(a+)+b`` takes exponential time on ``aaaa…a!``, and the waypoint's event loop would stall for
every service it serves. A client chooses the input; a route author chooses the pattern; neither may stall the
waypoint. So:

1. A pattern must compile with :mod:`re` (whose syntax RE2's common subset shares), without a warning that its
   meaning may change (``[[`` is a possible nested set).
2. Constructs RE2 does not have are refused, as Envoy refuses them: backreferences, conditionals, lookahead and
   lookbehind, atomic groups and possessive repeats.
3. A repeat that may run more than once cannot contain another such repeat, or an alternation of several-character
   branches (``(a+)+``, ``(a{1,5})*``, ``(ab|a)+``): these are the shapes whose backtracking is exponential.
   Stricter than Istio; the refusal says which part and why.
4. A pattern tests at most :data:`SUBJECT_LIMIT` characters: a longer path or header value does not match it.
   Rule 3 removes exponential shapes; this bounds the polynomial ones (``.*a.*a.*b``) a route author can still
   write to milliseconds-to-a-second at worst, rather than minutes.

:func:`pattern_problem` says what is wrong with a pattern (None: it may run); the control plane's translator can
report the same text in a route's status.
"""

from __future__ import annotations

import re
import warnings
from re import _parser  # type: ignore[attr-defined]
from typing import Any

__all__ = ["SUBJECT_LIMIT", "pattern_problem", "safe_pattern"]

SUBJECT_LIMIT = 2048
"""The longest path or header value a route's regular expression is tested against."""

_REPEATS = frozenset({"MAX_REPEAT", "MIN_REPEAT"})
_REFUSED = {
    "GROUPREF": "a backreference",
    "GROUPREF_EXISTS": "a conditional group",
    "ASSERT": "a lookahead or lookbehind",
    "ASSERT_NOT": "a negative lookahead or lookbehind",
    "ATOMIC_GROUP": "an atomic group",
    "POSSESSIVE_REPEAT": "a possessive repeat",
}


def _children(op: str, av: Any) -> list[Any]:
    """The sub-patterns of one parsed item."""
    if op == "SUBPATTERN":
        return [av[3]]
    if op in _REPEATS:
        return [av[2]]
    if op == "BRANCH":
        return list(av[1])
    return []


def _walk(items: Any, inside_repeat: bool) -> str | None:
    for op_code, av in items:
        op = str(op_code)
        if op in _REFUSED:
            return f"{_REFUSED[op]} (not in RE2's syntax)"
        repeats = op in _REPEATS and av[1] > 1
        if inside_repeat and repeats:
            return "a repeat inside a repeat (exponential backtracking)"
        if inside_repeat and op == "BRANCH":
            return "an alternation inside a repeat (exponential backtracking)"
        for child in _children(op, av):
            problem = _walk(child, inside_repeat or repeats)
            if problem is not None:
                return problem
    return None


def pattern_problem(text: str) -> str | None:
    """Why ``text`` may not be run (rules 1 to 3), or None."""
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        try:
            parsed = _parser.parse(text)
        except (re.error, OverflowError, RecursionError, ValueError) as exc:
            return f"does not compile: {exc}"
    if caught:
        return f"ambiguous syntax: {caught[0].message}"
    return _walk(parsed.data, False)


def safe_pattern(text: str) -> re.Pattern[str] | str:
    """``text`` compiled, or why it may not run."""
    problem = pattern_problem(text)
    if problem is not None:
        return problem
    try:
        return re.compile(text)
    except (re.error, OverflowError, RecursionError, ValueError) as exc:
        return f"does not compile: {exc}"
