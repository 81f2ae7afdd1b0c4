"""AuthorizationPolicy path templates (:mod:`ambit.model.path_templates`): istiod's admission check (its own
CheckValidPathTemplate cases), Envoy's ``uri_template`` matching, and the bounds on hostile input."""

from __future__ import annotations

import time

import pytest
from hypothesis import given
from hypothesis import strategies as st

from ambit.model.path_templates import (
    MAX_TEMPLATE,
    admission_problem,
    is_path_template,
    path_matches_template,
    template_problem,
)

VALID = ["/{*}/foo", "/{*}/foo/", "/foo/{**}/bar", "/foo/bar/{**}", "/api/{*}/items/{*}", "/{**}"]
INVALID = [
    "/foo/{**}buzz/bar",
    "/{*}/foo/{}/bar",
    "/foo/{*}/bar/*",
    "/foo/{*}/bar/**/buzz",
    "/foo/{buzz}/bar/{**}",
    "/foo/{buzz=*}/bar/{**}",
    "/{*}/foo/{buzz=**}/bar",
    "/{*}/foo/{**}bar",
    "/{*}/foo/{*}.txt",
    "/{*}/foo/{temp",
    "/{*}/foo/temp}/*",
    "/{**}/foo/temp/{*}/bar",
    "/{**}/{**}",
    "/{**}/foo/temp/{**}/bar",
    "/{*}/foo/?abc",
    "/{*}//foo",
]


@pytest.mark.parametrize("entry", VALID)
def test_istiods_valid_templates_are_valid(entry: str) -> None:
    assert is_path_template(entry)
    assert admission_problem(entry) is None and template_problem(entry) is None


@pytest.mark.parametrize("entry", INVALID)
def test_istiods_invalid_templates_are_refused_at_admission(entry: str) -> None:
    assert admission_problem(entry) is not None, entry


@pytest.mark.parametrize("entry", ["/foo/{buzz}/bar", "/{buzz}", "/a}"])
def test_a_plain_path_with_braces_is_refused_too(entry: str) -> None:
    assert not is_path_template(entry) and admission_problem(entry) is not None


@pytest.mark.parametrize("entry", ["/exact", "/prefix/*", "*/suffix", "*", "/a/b c"])
def test_plain_paths_pass_admission_unchanged(entry: str) -> None:
    assert not is_path_template(entry) and admission_problem(entry) is None


def test_envoy_needs_a_leading_slash_and_we_bound_the_length() -> None:
    assert admission_problem("foo/{*}") is None, "istiod admits it"
    assert template_problem("foo/{*}") is not None, "Envoy's parser would refuse it: never compiled"
    assert template_problem("/" + "a/" * MAX_TEMPLATE + "{*}") is not None


@pytest.mark.parametrize(
    ("template", "path", "matches"),
    [
        ("/{*}/foo", "/x/foo", True),
        ("/{*}/foo", "/foo", False),  # {*} is one or more characters
        ("/{*}/foo", "/x/y/foo", False),  # one segment only
        ("/{*}/foo", "/x/foo/", False),  # the whole path
        ("/{*}/foo/", "/x/foo/", True),
        ("/foo/{**}/bar", "/foo/a/b/c/bar", True),
        ("/foo/{**}/bar", "/foo//bar", True),  # {**} may be empty: both slashes stay
        ("/foo/{**}/bar", "/foo/bar", False),
        ("/foo/bar/{**}", "/foo/bar/", True),
        ("/foo/bar/{**}", "/foo/bar/a/b.txt", True),
        ("/foo/bar/{**}", "/foo/bar", False),
        ("/api/{*}/items/{*}", "/api/v1/items/42", True),
        ("/api/{*}/items/{*}", "/API/v1/items/42", False),  # literals are case-sensitive
        ("/api/{*}/items/{*}", "/api/v1/items/", False),
        ("/{**}", "/", True),
        ("/{**}", "/anything/at/all", True),
        ("/a.b/{*}", "/aXb/c", False),  # literal characters are not regular expression syntax
        ("/{*}", "/a?b", False),  # '?' is no pchar (a query never reaches the matcher)
        ("/{*}", "/a%20b", True),
    ],
)
def test_matching_follows_envoys_uri_template(template: str, path: str, matches: bool) -> None:
    assert template_problem(template) is None
    assert path_matches_template(template, path) is matches


@given(st.text(max_size=200))
def test_any_entry_is_judged_without_an_exception(entry: str) -> None:
    admission_problem(entry)
    if is_path_template(entry) and template_problem(entry) is None:
        path_matches_template(entry, "/" + entry)


def test_a_hostile_template_and_path_match_in_linear_time() -> None:
    template = "/" + "/".join(["{*}"] * 200) + "/{**}/x"
    assert template_problem(template) is None
    path = "/" + "a/" * 200 + "b" * 100_000
    start = time.process_time()
    assert not path_matches_template(template, path)
    assert time.process_time() - start < 2.0, "no catastrophic backtracking"
