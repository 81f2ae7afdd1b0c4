"""A VirtualService's HTTP match conditions and rewrite at admission, as istiod's webhook judges them
(:mod:`ambit.controlplane.webhook.http_match`, :mod:`ambit.controlplane.webhook.re2_syntax`): istiod's own test cases
(``virtualservice_test.go`` TestValidateRootHTTPRoute's match cases, ``validation_test.go`` TestValidateHTTPHeaderName,
TestValidateHTTPRewrite, TestValidateUriRegexRewrite) written as the JSON a user sends, RE2 syntax Python lacks
admitted and what RE2 refuses refused, and arbitrary input never raising."""

from __future__ import annotations

from typing import Any

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st
from json_strategies import json_values

from ambit.controlplane.webhook import FieldError, validate
from ambit.controlplane.webhook.fields import Fields
from ambit.controlplane.webhook.http_match import REGEX_BUDGET, MatchChecker, header_name_problem
from ambit.controlplane.webhook.re2_syntax import MAX_PATTERN, re2_problem

Obj = dict[str, Any]
TO_B = [{"destination": {"host": "b"}}]
REDIRECT = {"uri": "/", "authority": "foo.biz"}


def errors(*http: Obj) -> list[FieldError]:
    vs = {"kind": "VirtualService", "metadata": {"name": "x", "namespace": "default"}, "spec": {"hosts": ["b"]}}
    vs["spec"]["http"] = list(http)
    return [e for e in validate("VirtualService", vs) if not e.warning]


def matching(match: Obj, **rule: Any) -> list[FieldError]:
    return errors({"match": [match], **(rule or {"route": TO_B})})


# --- istiod's cases -----------------------------------------------------------------------------------------------

ISTIOD_MATCHES: list[tuple[str, Obj, bool]] = [
    ("exact header match", {"headers": {"header": {"exact": "test"}}}, True),
    ("regex header match", {"headers": {"header": {"regex": "test"}}}, True),
    ("exact without headers match", {"withoutHeaders": {"header": {"exact": "test"}}}, True),
    ("regex without headers match", {"withoutHeaders": {"header": {"regex": "test"}}}, True),
    ("regex without headers match ?", {"withoutHeaders": {"header": {"regex": "?"}}}, False),
    ("regex without headers match *", {"withoutHeaders": {"header": {"regex": "*"}}}, True),
    ("regex uri match", {"uri": {"regex": "test"}}, True),
    ("prefix uri match", {"uri": {"prefix": "test"}}, True),
    ("exact uri match", {"uri": {"exact": "test"}}, True),
    ("prefix queryParams match", {"queryParams": {"q": {"prefix": "test"}}}, True),
    ("exact queryParams match", {"queryParams": {"q": {"exact": "test"}}}, True),
    ("regex queryParams match", {"headers": {"q": {"regex": "test"}}}, True),
    ("empty prefix match in method", {"method": {"prefix": ""}}, False),
    ("empty regex match in method", {"method": {"regex": ""}}, False),
    ("empty prefix match in uri", {"uri": {"prefix": ""}}, True),
    ("empty regex match in uri", {"uri": {"regex": ""}}, False),
    ("empty regex match in query", {"queryParams": {"q": {"regex": ""}}}, False),
    ("empty regex match in scheme", {"scheme": {"regex": ""}}, False),
    ("empty prefix match in scheme", {"scheme": {"prefix": ""}}, False),
    ("empty prefix header match", {"headers": {"header": {"prefix": ""}}}, False),
]


@pytest.mark.parametrize(("match", "valid"), [c[1:] for c in ISTIOD_MATCHES], ids=[c[0] for c in ISTIOD_MATCHES])
def test_istiods_match_cases_are_judged_as_istiod_judges_them(match: Obj, valid: bool) -> None:
    assert (matching(match, redirect=REDIRECT) == []) == valid


@pytest.mark.parametrize(
    ("name", "valid"),
    [
        ("header1", True),
        ("X-Requested-With", True),
        (":authority", True),
        ("funky!$#_", True),
        ("", False),
        ("::", False),
        ('illegal"char', False),
        # the JWT claim forms istiod's ToRoutingClaim reads, and what it does not
        ("@request.auth.claims.groups", True),
        ("@Request.Auth.Claims[nested][key]", True),
        ("@request.auth.claims.", False),
        ("@request.auth.claims[]", False),
        (":status", True),
        (":unknown", False),
    ],
)
def test_header_names_are_tokens_pseudo_headers_or_jwt_claims(name: str, valid: bool) -> None:
    assert (header_name_problem(name) is None) == valid
    found = matching({"headers": {name: {"exact": "v"}}, "withoutHeaders": {name: {"exact": "v"}}})
    assert len(found) == (0 if valid else 2)
    assert all(e.path.endswith(f"[{name}]") for e in found)


REGEX_REWRITE = {"match": "^/service/([^/]+)(/.*)$", "rewrite": "\\2/instance/\\1"}


@pytest.mark.parametrize(
    ("rewrite", "valid"),
    [
        ({"uri": "/path/to/resource", "authority": "foobar.org"}, True),
        ({"uri": "/path/to/resource"}, True),
        ({"authority": "foobar.org"}, True),
        ({"uriRegexRewrite": REGEX_REWRITE}, True),
        ({"authority": "foobar.org", "uriRegexRewrite": REGEX_REWRITE}, True),
        ({"uri": "/path/to/resource", "uriRegexRewrite": REGEX_REWRITE}, False),
        ({}, False),
        ({"uriRegexRewrite": {"rewrite": "\\2/instance/\\1"}}, False),
        ({"uriRegexRewrite": {"match": "^/service/([^/]+)(/.*)$"}}, False),
        ({"uriRegexRewrite": {"match": "[", "rewrite": "["}}, False),
    ],
)
def test_istiods_rewrite_cases_are_judged_as_istiod_judges_them(rewrite: Obj, valid: bool) -> None:
    assert (errors({"route": TO_B, "rewrite": rewrite}) == []) == valid


# --- the reported case and the rest of the match fields -----------------------------------------------------------


def test_an_unclosed_bracket_in_a_header_regex_is_refused_with_its_field() -> None:
    (error,) = matching({"headers": {"x": {"regex": "[unclosed"}}})
    assert error.path == "spec.http[0].match[0].headers[x].regex"
    assert "missing closing ]" in error.message and "RE2" in error.message


@pytest.mark.parametrize("field", ["uri", "scheme", "method", "authority"])
def test_every_string_match_field_has_its_regex_checked(field: str) -> None:
    (error,) = matching({field: {"regex": "(a"}})
    assert error.path == f"spec.http[0].match[0].{field}.regex"
    (again,) = matching({"queryParams": {"q": {"regex": "a)"}}})
    assert again.path == "spec.http[0].match[0].queryParams[q].regex"


def test_string_match_shapes_follow_the_protobuf_oneof() -> None:
    assert matching({"uri": {}}) == [] and matching({"headers": {"x": {}}}) == []  # presence matches
    (two,) = matching({"uri": {"exact": "/a", "prefix": "/b"}})
    assert "only one of" in two.message
    (text,) = matching({"uri": {"exact": 7}})
    assert text.path.endswith("uri.exact") and "expected a string" in text.message
    (unknown,) = matching({"uri": {"suffix": "/a"}})
    assert unknown.path.endswith("uri.suffix") and "unknown field" in unknown.message
    (null,) = matching({"headers": {"x": None}})
    assert "cannot be null" in null.message
    assert matching({"withoutHeaders": {"x": None}}) == []
    (star,) = matching({"headers": {"x": {"regex": "*"}}})  # only withoutHeaders reads "*" as presence
    assert "missing" in star.message or "nothing to repeat" in star.message


def test_a_regex_over_1024_characters_is_too_large() -> None:
    assert matching({"uri": {"regex": "a" * MAX_PATTERN}}) == []
    (error,) = matching({"uri": {"regex": "a" * (MAX_PATTERN + 1)}})
    assert "too large" in error.message


# --- RE2 syntax ---------------------------------------------------------------------------------------------------

RE2_VALID = [
    "/foo.*",
    "\\pL+",
    "\\p{Greek}\\P{Han}",
    "\\PL",
    "\\p{^Greek}",
    "abc\\z",
    "(?U)a+b",
    "(?i)abc",
    "x(?is-U:y)",
    "[[:alpha:]]+[[:^digit:]]",
    "\\Qa.b*\\E+",
    "\\Qno end",
    "\\x{263a}\\x41",
    "\\012\\0",
    "(?P<1st>x)(?<name>y)",
    "[]a]",
    "[^]a]",
    "[a-][-a][\\d-z]",
    "a{2,3}?x{,3}a{",
    "^*\\b+",
    "()*",
    "[\\pL\\p{Greek}0-9]",
    "(a+)+",
    "(?)x",
    "[\\x{10FFFF}\\[\\]]",
    "x{1000}",
    "[[a]",
    "é+",
]
RE2_INVALID = [
    "[unclosed",
    "(unclosed",
    "unopened)",
    "*",
    "?",
    "a**",
    "a*+",
    "(?=a)",
    "(?!a)",
    "(?<=a)",
    "(?<!a)",
    "(a)\\1",
    "\\8",
    "(?P<n>a)(?P=n)",
    "\\Z",
    "\\C",
    "\\u0041",
    "\\e",
    "\\é",
    "a\\",
    "(?x)a",
    "(?#comment)",
    "(?>atomic)",
    "(?(1)a|b)",
    "[z-a]",
    "[[:foo:]]",
    "\\pX",
    "\\p{",
    "\\x{110000}",
    "\\x{}",
    "\\xg",
    "x{1001}",
    "x{2,1}",
    "(?P<n>a)(?P<n>b)",
    "(?P<>a)",
    "(?i-)",
    "a{2}{3}",
    "(?i",
    "[\\b]",
]


@pytest.mark.parametrize("pattern", RE2_VALID)
def test_re2_syntax_python_lacks_is_admitted(pattern: str) -> None:
    assert re2_problem(pattern) is None
    assert matching({"uri": {"regex": pattern}}) == []


@pytest.mark.parametrize("pattern", RE2_INVALID)
def test_what_re2_refuses_is_refused(pattern: str) -> None:
    problem = re2_problem(pattern)
    assert problem is not None and problem.startswith("error parsing regexp: ")
    assert len(matching({"uri": {"regex": pattern}})) == 1


@pytest.mark.parametrize(
    "pattern",
    [
        "[" + "[:" * 511,
        "\\p{" * 341,
        "(" * 512 + ")" * 512,
        "(" * 1024,
        "|" * 1024,
        "(a*)*" * 204,
        "\\Q" * 512,
        "(?" + "i" * 1021 + ")",
        "".join(f"(?P<n{i}>" for i in range(100)),
    ],
    ids=["posix", "unicode", "balanced", "open", "alternation", "repeats", "quotes", "flags", "names"],
)
def test_hostile_patterns_of_the_longest_length_get_an_answer(pattern: str) -> None:
    pattern = pattern[:MAX_PATTERN]
    problem = re2_problem(pattern)
    assert problem is None or problem.startswith("error parsing regexp: ")


def test_one_objects_regular_expressions_are_checked_within_a_budget() -> None:
    count = REGEX_BUDGET // MAX_PATTERN
    headers = {f"h{i}": {"regex": "a" * MAX_PATTERN} for i in range(count + 2)}
    found = matching({"headers": headers})
    assert len(found) == 2 and all("not checked" in e.message for e in found)


@given(st.text(max_size=80) | st.text(alphabet="\\()[]{}^$*+?|.-:PQEpxz0123456789<>=!aiUsm,", max_size=60))
@settings(max_examples=1500, deadline=None)
def test_no_pattern_makes_the_regex_check_raise(pattern: str) -> None:
    problem = re2_problem(pattern)
    assert problem is None or "\n" not in problem


_PATTERNS = st.text(alphabet="\\()[]{}^$*+?|.-:pQEz019<=!aiU", max_size=12)
_STRING_MATCH = st.dictionaries(st.sampled_from(["exact", "prefix", "regex", "suffix"]), _PATTERNS | json_values(4))
_BY_NAME = st.dictionaries(st.text(max_size=24), st.none() | _STRING_MATCH | json_values(4), max_size=4)
_MATCH = st.dictionaries(
    st.sampled_from(["uri", "scheme", "method", "authority", "headers", "withoutHeaders", "queryParams", "port"]),
    _STRING_MATCH | _BY_NAME | json_values(6),
)
_REWRITE = st.dictionaries(
    st.sampled_from(["uri", "authority", "uriRegexRewrite", "x"]),
    st.dictionaries(st.sampled_from(["match", "rewrite"]), _PATTERNS | json_values(3)) | json_values(4),
)


@given(match=_MATCH | json_values(), rewrite=_REWRITE | json_values())
@settings(max_examples=300, deadline=None)
def test_no_match_or_rewrite_makes_the_checker_raise(match: Any, rewrite: Any) -> None:
    f = Fields()
    checker = MatchChecker(f)
    if isinstance(match, dict):
        checker.match(match, "m")
    checker.rewrite(rewrite, "r")
    errors({"match": [match], "rewrite": rewrite, "route": TO_B})
