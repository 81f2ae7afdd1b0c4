"""Whether a request holds a Gateway API ``HTTPRouteMatch``: the match compiled once, tested per request.

Rules:

1. Every present part must hold. Method: exact (methods are case-sensitive). Path (the target before ``?``):
   Exact is string equality; PathPrefix is element-wise (``/foo`` and ``/foo/`` match ``/foo``, ``/foo/bar``, not
   ``/foobar``); RegularExpression is :func:`re.fullmatch`. No path part means PathPrefix ``/``.
2. Header names compare case-insensitively; a header sent several times is matched as its values joined by ``,``
   (RFC 9110 §5.3 as Gateway API points to, and as Envoy joins them); ``host`` stands for the authority when no
   ``host`` header came; a pseudo-header name reads the request's method, authority, target (path and query) or
   scheme. Query parameters come from :func:`urllib.parse.parse_qsl` (percent-decoded, ``+`` read as
   a space, blank values kept, names exact); a repeated parameter is matched by its first value. In both, when a
   match lists one name twice only the first entry counts (Gateway API).
3. Regular expressions are compiled once, when the match is, by :mod:`ambit.waypoint.patterns`: one that does
   not compile or could backtrack without bound is refused, makes its part never hold and is reported in
   ``problems``; a path or header value longer than :data:`~ambit.waypoint.patterns.SUBJECT_LIMIT` does not match
   a pattern. Testing a request never raises.
4. :class:`RequestFacts` works each fact out once per request and only when a match asks for it.
5. VirtualService kinds: a plain string Prefix path (``/foo`` matches ``/foobar``); Prefix and Present values;
   ``ignore_path_case`` compares an Exact or Prefix path case-insensitively (Envoy's ``case_sensitive: false``,
   which leaves regular expressions alone); ``without_headers`` entries must each *not* hold, a missing header
   reading as empty (Envoy's ``treat_missing_header_as_empty``) and a Present entry meaning "absent".
6. Claim matches (:class:`~ambit.model.route_matches.ClaimMatch`) read the verified JWT's payload the authentication
   put on the request (:attr:`~ambit.waypoint.decisions.RequestHead.jwt_claims`), never a header: one holds when
   the claim at its path is a string that matches or a list holding such a string (Envoy's metadata matcher with
   istiod's list-or-string form); a Present one when the claim exists. Without a token, or with the claim absent,
   it does not hold; a ``without_claims`` entry then does.
"""

from __future__ import annotations

import re
from collections.abc import Callable, Mapping
from dataclasses import dataclass
from typing import Any
from urllib.parse import parse_qsl

from ambit.model.route_matches import ClaimMatch, PathMatchType, RouteMatch, ValueMatch, ValueMatchType
from ambit.waypoint.decisions import RequestHead
from ambit.waypoint.filters import split_target
from ambit.waypoint.patterns import SUBJECT_LIMIT, safe_pattern

__all__ = ["ClaimTest", "MatchTest", "RequestFacts", "ValueTest", "compile_match"]


@dataclass(frozen=True, slots=True)
class ValueTest:
    name: str
    exact: str | None
    pattern: re.Pattern[str] | None
    """Both None (and ``prefix`` None, ``present`` False): a regular expression that did not compile; the test
    never holds."""
    prefix: str | None = None
    present: bool = False

    def holds(self, value: str | None) -> bool:
        if value is None:
            return False
        if self.exact is not None:
            return value == self.exact
        if self.prefix is not None:
            return value.startswith(self.prefix)
        if self.present:
            return True
        return self.pattern is not None and len(value) <= SUBJECT_LIMIT and self.pattern.fullmatch(value) is not None

    def holds_without(self, value: str | None) -> bool:
        """Whether this ``without_headers`` entry is satisfied (rule 5)."""
        if self.present:
            return value is None
        if self.exact is None and self.prefix is None and self.pattern is None:
            return False  # a refused pattern never holds, inverted or not: no silent widening
        return not self.holds("" if value is None else value)


@dataclass(frozen=True, slots=True)
class ClaimTest:
    """A :class:`~ambit.model.route_matches.ClaimMatch` ready to test (rule 6)."""

    path: tuple[str, ...]
    value: ValueTest

    def holds(self, claims: Mapping[str, Any] | None) -> bool:
        found: Any = claims
        for step in self.path:
            if not isinstance(found, Mapping) or step not in found:
                return False
            found = found[step]
        if isinstance(found, str):
            return self.value.holds(found)
        if isinstance(found, list):
            return any(isinstance(item, str) and self.value.holds(item) for item in found)
        return self.value.present

    def holds_without(self, claims: Mapping[str, Any] | None) -> bool:
        test = self.value
        if not test.present and test.exact is None and test.prefix is None and test.pattern is None:
            return False  # a refused pattern never holds, inverted or not (rule 3)
        return not self.holds(claims)


@dataclass(frozen=True, slots=True)
class MatchTest:
    method: str | None
    path: Callable[[str], bool] | None
    """Whether a path holds; None: every path does (PathPrefix ``/``)."""
    headers: tuple[ValueTest, ...]
    query: tuple[ValueTest, ...]
    prefix: str | None
    """The prefix ReplacePrefixMatch replaces; None for Exact and RegularExpression matches."""
    without: tuple[ValueTest, ...] = ()
    claims: tuple[ClaimTest, ...] = ()
    without_claims: tuple[ClaimTest, ...] = ()
    literal_prefix: bool = False
    """``prefix`` is a plain string prefix (a VirtualService ``prefix``): a rewrite replaces exactly those
    characters, as Envoy's ``prefix_rewrite`` does, not path elements."""

    @property
    def needs_facts(self) -> bool:
        return bool(self.headers or self.query or self.without or self.claims or self.without_claims)

    def holds_for(self, facts: RequestFacts) -> bool:
        """Whether the header and query parts hold (the caller tests method and path first, inline)."""
        return (
            all(h.holds(facts.header(h.name)) for h in self.headers)
            and all(q.holds(facts.query(q.name)) for q in self.query)
            and all(w.holds_without(facts.header(w.name)) for w in self.without)
            and all(c.holds(facts.request.jwt_claims) for c in self.claims)
            and all(c.holds_without(facts.request.jwt_claims) for c in self.without_claims)
        )


class RequestFacts:
    """What the rules read from one request, each worked out once and only when a rule asks."""

    __slots__ = ("_headers", "_query", "path", "query_text", "request")

    def __init__(self, request: RequestHead) -> None:
        self.request = request
        self.path, self.query_text = split_target(request.path)
        self._headers: dict[str, str] | None = None
        self._query: dict[str, str] | None = None

    def header(self, name: str) -> str | None:
        if name.startswith(":"):  # rule 2: a pseudo-header
            return self._pseudo(name)
        if self._headers is None:
            joined: dict[str, str] = {}
            routed = self.request.route_headers
            for raw, value in self.request.headers if routed is None else routed:
                key = raw.lower()
                joined[key] = f"{joined[key]},{value}" if key in joined else value
            joined.setdefault("host", self.request.authority)
            self._headers = joined
        return self._headers.get(name)

    def _pseudo(self, name: str) -> str | None:
        request = self.request
        if name == ":method":
            return request.method
        if name == ":authority":
            return request.authority
        if name == ":path":
            return request.path
        if name == ":scheme":
            return request.scheme
        return None

    def query(self, name: str) -> str | None:
        if self._query is None:
            first: dict[str, str] = {}
            for key, value in parse_qsl(self.query_text[1:], keep_blank_values=True):
                first.setdefault(key, value)
            self._query = first
        return self._query.get(name)


def _compile_regex(text: str, problems: list[str], where: str) -> re.Pattern[str] | None:
    compiled = safe_pattern(text)
    if isinstance(compiled, str):
        problems.append(f"{where}: regular expression {text!r} refused: {compiled}")
        return None
    return compiled


def _value_tests(
    matches: tuple[ValueMatch, ...], fold_case: bool, problems: list[str], where: str
) -> tuple[ValueTest, ...]:
    tests: list[ValueTest] = []
    seen: set[str] = set()
    for match in matches:
        name = match.name.lower() if fold_case else match.name
        if name in seen:
            continue
        seen.add(name)
        if match.kind is ValueMatchType.EXACT:
            tests.append(ValueTest(name, match.value, None))
        elif match.kind is ValueMatchType.PREFIX:
            tests.append(ValueTest(name, None, None, prefix=match.value))
        elif match.kind is ValueMatchType.PRESENT:
            tests.append(ValueTest(name, None, None, present=True))
        else:
            tests.append(ValueTest(name, None, _compile_regex(match.value, problems, f"{where} {name}")))
    return tuple(tests)


def _claim_tests(matches: tuple[ClaimMatch, ...], problems: list[str], where: str) -> tuple[ClaimTest, ...]:
    return tuple(
        ClaimTest(m.path, _value_tests((ValueMatch(".".join(m.path), m.value, m.kind),), False, problems, where)[0])
        for m in matches
    )


def _never(path: str) -> bool:
    return False


def _path_test(
    kind: PathMatchType, value: str, problems: list[str], where: str, *, fold: bool = False
) -> Callable[[str], bool] | None:
    if fold and kind in (PathMatchType.EXACT, PathMatchType.PREFIX):
        folded = value.lower()
        if kind is PathMatchType.EXACT:
            return lambda path: path.lower() == folded
        return lambda path: path.lower().startswith(folded)
    if kind is PathMatchType.EXACT:
        return value.__eq__
    if kind is PathMatchType.PREFIX:
        return None if not value else lambda path: path.startswith(value)
    if kind is PathMatchType.REGULAR_EXPRESSION:
        pattern = _compile_regex(value, problems, f"{where} path")
        if pattern is None:
            return _never
        return lambda path: len(path) <= SUBJECT_LIMIT and pattern.fullmatch(path) is not None
    prefix = value.rstrip("/")
    if not prefix:
        return None
    below = prefix + "/"
    return lambda path: path == prefix or path.startswith(below)


def compile_match(match: RouteMatch, where: str) -> tuple[MatchTest, tuple[str, ...]]:
    """``match`` ready to test, and what in it cannot work (rule 3), each problem prefixed with ``where``."""
    problems: list[str] = []
    kind = PathMatchType.PATH_PREFIX if match.path is None else match.path.kind
    value = "/" if match.path is None else match.path.value
    test = MatchTest(
        method=match.method,
        path=_path_test(kind, value, problems, where, fold=match.ignore_path_case),
        headers=_value_tests(match.headers, True, problems, f"{where} header"),
        query=_value_tests(match.query_params, False, problems, f"{where} query parameter"),
        prefix=value if kind in (PathMatchType.PATH_PREFIX, PathMatchType.PREFIX) else None,
        without=_value_tests(match.without_headers, True, problems, f"{where} without header"),
        literal_prefix=kind is PathMatchType.PREFIX,
        claims=_claim_tests(match.claims, problems, f"{where} claim"),
        without_claims=_claim_tests(match.without_claims, problems, f"{where} without claim"),
    )
    return test, tuple(problems)
