"""The waypoint's routing engine (ambit.waypoint.routing, ambit.waypoint.filters): table tests for each rule."""

from __future__ import annotations

import dataclasses
import random as stdlib_random

import pytest
from hypothesis import given
from hypothesis import strategies as st

from ambit.model.route_matches import PathMatch, PathMatchType, RouteMatch, ValueMatch, ValueMatchType
from ambit.model.routes import (
    BackendService,
    HeaderModifier,
    PathModifier,
    PathModifierType,
    RequestMirror,
    RequestRedirect,
    RetryPolicy,
    RouteRule,
    RouteTable,
    Timeouts,
    URLRewrite,
    WeightedBackend,
)
from ambit.waypoint.decisions import Forward, RequestHead, Respond
from ambit.waypoint.filters import (
    apply_header_modifier,
    chained,
    clean_modifier,
    normalize_path,
    replace_prefix,
    split_authority,
)
from ambit.waypoint.patterns import SUBJECT_LIMIT, pattern_problem
from ambit.waypoint.routing import compile_table, route, route_tcp, waypoint_route, with_request_id

DEST = BackendService("app", "reviews.app.svc.cluster.local", 9080)
V1 = BackendService("app", "reviews-v1.app.svc.cluster.local", 9080)
V2 = BackendService("app", "reviews-v2.app.svc.cluster.local", 9080)
SHADOW = BackendService("app", "reviews-shadow.app.svc.cluster.local", 9080)


def req(
    path: str = "/",
    method: str = "GET",
    headers: tuple[tuple[str, str], ...] = (),
    authority: str = "reviews:9080",
    scheme: str = "http",
) -> RequestHead:
    return RequestHead(method, path, authority, headers, scheme)


def prefix(value: str) -> PathMatch:
    return PathMatch(PathMatchType.PATH_PREFIX, value)


def exact(value: str) -> PathMatch:
    return PathMatch(PathMatchType.EXACT, value)


def regex(value: str) -> PathMatch:
    return PathMatch(PathMatchType.REGULAR_EXPRESSION, value)


def rule(name: str, match: RouteMatch | None = None, backend: BackendService = V1, **kw: object) -> RouteRule:
    kw.setdefault("backends", (WeightedBackend(backend),))
    return RouteRule(route=f"HTTPRoute/app/{name}", match=match or RouteMatch(), **kw)  # type: ignore[arg-type]


def table(*rules: RouteRule) -> RouteTable:
    return RouteTable(DEST.service_key, DEST.port, http=rules)


def forward(decision: object) -> Forward:
    assert isinstance(decision, Forward), decision
    return decision


def respond(decision: object) -> Respond:
    assert isinstance(decision, Respond), decision
    return decision


def routed(t: RouteTable, request: RequestHead, random: float = 0.0) -> str:
    """The route that took ``request``, or the status answered."""
    decision = route(t, DEST, request, random)
    return decision.route if isinstance(decision, Forward) else str(decision.status)


# Rule 1: default route, 404


def test_no_table_forwards_to_the_destination_unchanged_with_the_default_retries() -> None:
    request = req("/x?y=1", headers=(("a", "b"),))
    decision = forward(route(None, DEST, request, 0.5))
    assert decision == Forward(DEST, request)
    assert decision.retry == RetryPolicy() and decision.route == ""


def test_the_waypoint_adds_x_forwarded_proto_http_when_the_request_has_none() -> None:
    """Rule 12: Envoy's connection manager without the remote address sets it only when absent; route matches see
    it; a gateway's value is kept."""
    claims = {"sub": "me"}
    request = RequestHead("GET", "/", "reviews:9080", (("a", "b"),), "http", claims)
    forwarded = forward(waypoint_route(None, DEST, request, 0.0)).request
    assert forwarded.headers == (("a", "b"), ("x-forwarded-proto", "http"))
    assert forwarded.jwt_claims is claims  # what authentication found stays with the request
    matching = table(rule("h", RouteMatch(headers=(ValueMatch("x-forwarded-proto", "http"),))))
    assert forward(waypoint_route(matching, DEST, request, 0.0)).route == "HTTPRoute/app/h"
    assert respond(route(matching, DEST, request, 0.0)).status == 404  # the plain engine leaves headers as they are
    from_gateway = RequestHead("GET", "/", "reviews:9080", (("x-forwarded-proto", "https"),), "http")
    assert forward(waypoint_route(None, DEST, from_gateway, 0.0)).request.headers == (("x-forwarded-proto", "https"),)


def test_a_table_without_http_rules_is_the_default_route() -> None:
    assert forward(route(table(), DEST, req(), 0.3)).backend == DEST


def test_http_rules_present_and_none_matching_answer_404() -> None:
    assert respond(route(table(rule("a", RouteMatch(path=exact("/a")))), DEST, req("/b"), 0.0)) == Respond(
        404,
        flags="NR",
        by_router=False,  # Envoy's flag: no route
    )


# Rule 2: method and path


@pytest.mark.parametrize(
    ("match", "path", "holds"),
    [
        (exact("/foo"), "/foo", True),
        (exact("/foo"), "/foo/", False),
        (exact("/foo"), "/foo?x=1", True),
        (exact("/foo"), "/FOO", False),
        (prefix("/foo"), "/foo", True),
        (prefix("/foo"), "/foo/", True),
        (prefix("/foo"), "/foo/bar", True),
        (prefix("/foo"), "/foobar", False),
        (prefix("/foo/"), "/foo", True),
        (prefix("/foo/"), "/foo/bar", True),
        (prefix("/foo/"), "/foobar", False),
        (prefix("/"), "/anything/at/all", True),
        (prefix("/"), "*", True),
        (prefix("/foo"), "/foo?bar", True),
        (regex(r"/v[0-9]+/.*"), "/v1/x", True),
        (regex(r"/v[0-9]+"), "/v1/x", False),
        (regex(r"/v[0-9]+"), "/xv1", False),
        (regex(r"/v[0-9]+"), "/v12?q=1", True),
    ],
)
def test_path_matches(match: PathMatch, path: str, holds: bool) -> None:
    assert (routed(table(rule("r", RouteMatch(path=match))), req(path)) == "HTTPRoute/app/r") is holds


def test_method_match_is_exact_and_case_sensitive() -> None:
    t = table(rule("post", RouteMatch(method="POST")))
    assert routed(t, req(method="POST")) == "HTTPRoute/app/post"
    assert routed(t, req(method="post")) == "404"
    assert routed(t, req(method="GET")) == "404"


def test_a_rule_without_matches_stands_for_prefix_slash() -> None:
    assert routed(table(rule("all")), req("/deep/path?q")) == "HTTPRoute/app/all"


# Rule 3: headers and query parameters


@pytest.mark.parametrize(
    ("match", "headers", "holds"),
    [
        (ValueMatch("X-Version", "v2"), (("x-version", "v2"),), True),
        (ValueMatch("x-version", "v2"), (("X-Version", "v2"),), True),
        (ValueMatch("x-version", "v2"), (("x-version", "V2"),), False),
        (ValueMatch("x-version", "v2"), (), False),
        (ValueMatch("x-version", ""), (("x-version", ""),), True),
        (ValueMatch("x-version", "v1,v2"), (("x-version", "v1"), ("x-version", "v2")), True),
        (ValueMatch("x-version", "v1, v2"), (("x-version", "v1"), ("x-version", "v2")), False),
        (ValueMatch("x-version", "v2"), (("x-version", "v1"), ("x-version", "v2")), False),
        (ValueMatch("x-version", "v[0-9]", ValueMatchType.REGULAR_EXPRESSION), (("x-version", "v7"),), True),
        (ValueMatch("x-version", "v[0-9]", ValueMatchType.REGULAR_EXPRESSION), (("x-version", "v77"),), False),
        (ValueMatch("host", "reviews:9080"), (), True),
        (ValueMatch("host", "other"), (("host", "other"),), True),
    ],
)
def test_header_matches(match: ValueMatch, headers: tuple[tuple[str, str], ...], holds: bool) -> None:
    t = table(rule("h", RouteMatch(headers=(match,))))
    assert (routed(t, req(headers=headers)) == "HTTPRoute/app/h") is holds


def test_all_header_matches_must_hold() -> None:
    t = table(rule("h", RouteMatch(headers=(ValueMatch("a", "1"), ValueMatch("b", "2")))))
    assert routed(t, req(headers=(("a", "1"), ("b", "2")))) == "HTTPRoute/app/h"
    assert routed(t, req(headers=(("a", "1"),))) == "404"


def test_only_the_first_match_entry_of_a_header_name_counts() -> None:
    t = table(rule("h", RouteMatch(headers=(ValueMatch("A", "1"), ValueMatch("a", "2")))))
    assert routed(t, req(headers=(("a", "1"),))) == "HTTPRoute/app/h"


@pytest.mark.parametrize(
    ("match", "query", "holds"),
    [
        (ValueMatch("v", "2"), "?v=2", True),
        (ValueMatch("v", "2"), "?V=2", False),
        (ValueMatch("v", "2"), "?v=1&v=2", False),
        (ValueMatch("v", "1"), "?v=1&v=2", True),
        (ValueMatch("v", ""), "?v", True),
        (ValueMatch("v", ""), "?v=", True),
        (ValueMatch("v", "a b"), "?v=a%20b", True),
        (ValueMatch("v", "a b"), "?v=a+b", True),
        (ValueMatch("v", "2"), "", False),
        (ValueMatch("v", "[0-9]+", ValueMatchType.REGULAR_EXPRESSION), "?x=1&v=42", True),
        (ValueMatch("v", "[0-9]+", ValueMatchType.REGULAR_EXPRESSION), "?v=4a", False),
    ],
)
def test_query_param_matches(match: ValueMatch, query: str, holds: bool) -> None:
    t = table(rule("q", RouteMatch(query_params=(match,))))
    assert (routed(t, req("/p" + query)) == "HTTPRoute/app/q") is holds


# Precedence: the translator orders; the engine takes the first entry that holds.


def test_gateway_api_precedence_on_a_pre_ordered_table() -> None:
    t = table(
        rule("exact", RouteMatch(path=exact("/api/login"))),
        rule("long-prefix", RouteMatch(path=prefix("/api/v2"))),
        rule("method", RouteMatch(path=prefix("/api"), method="POST")),
        rule("two-headers", RouteMatch(path=prefix("/api"), headers=(ValueMatch("a", "1"), ValueMatch("b", "1")))),
        rule("one-header", RouteMatch(path=prefix("/api"), headers=(ValueMatch("a", "1"),))),
        rule("query", RouteMatch(path=prefix("/api"), query_params=(ValueMatch("debug", "1"),))),
        rule("short-prefix", RouteMatch(path=prefix("/api"))),
        rule("catch-all"),
    )
    assert routed(t, req("/api/login", method="POST")) == "HTTPRoute/app/exact"
    assert routed(t, req("/api/v2/x", method="POST")) == "HTTPRoute/app/long-prefix"
    assert routed(t, req("/api/x", method="POST", headers=(("a", "1"), ("b", "1")))) == "HTTPRoute/app/method"
    assert routed(t, req("/api/x", headers=(("a", "1"), ("b", "1")))) == "HTTPRoute/app/two-headers"
    assert routed(t, req("/api/x", headers=(("a", "1"),))) == "HTTPRoute/app/one-header"
    assert routed(t, req("/api/x?debug=1")) == "HTTPRoute/app/query"
    assert routed(t, req("/api")) == "HTTPRoute/app/short-prefix"
    assert routed(t, req("/apix")) == "HTTPRoute/app/catch-all"


def test_ties_go_to_the_first_entry_as_the_translator_ordered_them() -> None:
    same = RouteMatch(path=prefix("/api"), headers=(ValueMatch("a", "1"),))
    t = table(rule("older", same, V1), rule("newer", same, V2))
    decision = forward(route(t, DEST, req("/api/x", headers=(("a", "1"),)), 0.0))
    assert decision.route == "HTTPRoute/app/older" and decision.backend == V1


def test_a_grpc_method_match_as_the_translator_writes_it() -> None:
    grpc = RouteRule(
        route="GRPCRoute/app/echo",
        match=RouteMatch(path=exact("/echo.v1.Echo/Say"), method="POST"),
        backends=(WeightedBackend(V1),),
    )
    t = table(grpc, rule("rest"))
    head = req("/echo.v1.Echo/Say", "POST", headers=(("content-type", "application/grpc"), ("te", "trailers")))
    assert routed(t, head) == "GRPCRoute/app/echo"
    assert routed(t, req("/echo.v1.Echo/Say", "GET")) == "HTTPRoute/app/rest"
    assert routed(t, req("/echo.v1.Echo/SayMore", "POST")) == "HTTPRoute/app/rest"


# Rule 4: regular expressions


def test_a_regex_that_does_not_compile_never_matches_and_is_reported() -> None:
    bad = rule("bad", RouteMatch(path=regex("/(unclosed")))
    bad_header = rule("bad-h", RouteMatch(headers=(ValueMatch("a", "*", ValueMatchType.REGULAR_EXPRESSION),)))
    t = table(bad, bad_header, rule("fallback"))
    assert routed(t, req("/(unclosed", headers=(("a", "*"),))) == "HTTPRoute/app/fallback"
    problems = compile_table(t).problems
    assert len(problems) == 2 and problems[0].startswith("HTTPRoute/app/bad path: regular expression")


@pytest.mark.parametrize(
    ("pattern", "problem"),
    [
        (r"/v[0-9]+/.*", None),
        (r".*\.(jpg|png)", None),
        (r"(a|b)+", None),
        (r"(?:ab)?c", None),
        (r"(a+)+b", "a repeat inside a repeat"),
        (r"(?:a{1,5})*", "a repeat inside a repeat"),
        (r"(/[a-z]+)+", "a repeat inside a repeat"),
        (r"(ab|a)+", "an alternation inside a repeat"),
        (r"(a)\1", "a backreference"),
        (r"(?=a)a", "a lookahead or lookbehind"),
        (r"(?<!a)b", "a negative lookahead or lookbehind"),
        (r"a++", "a possessive repeat"),
        (r"(?>a)", "an atomic group"),
        (r"(?P<x>a)(?(x)b|c)", "a conditional group"),
        (r"(", "does not compile"),
        (r"a{99999999999}", "does not compile"),
        (r"[[a]", "ambiguous syntax"),
    ],
)
def test_patterns_that_could_stall_the_waypoint_are_refused(pattern: str, problem: str | None) -> None:
    found = pattern_problem(pattern)
    assert (found is None) if problem is None else (found is not None and found.startswith(problem))


def test_a_client_cannot_stall_the_waypoint_with_a_catastrophic_route_regex() -> None:
    evil = table(
        rule("evil", RouteMatch(path=regex(r"/(a+)+b"))),
        rule("evil-h", RouteMatch(headers=(ValueMatch("x", r"(a|aa)+b", ValueMatchType.REGULAR_EXPRESSION),))),
        rule("fallback"),
    )
    attack = req("/" + "a" * 64 + "!", headers=(("x", "a" * 64 + "!"),))
    assert routed(evil, attack) == "HTTPRoute/app/fallback"
    assert len(compile_table(evil).problems) == 2


def test_a_subject_longer_than_the_limit_does_not_match_a_pattern() -> None:
    t = table(
        rule("path", RouteMatch(path=regex(r"/.*"))),
        rule("header", RouteMatch(headers=(ValueMatch("x", r".*", ValueMatchType.REGULAR_EXPRESSION),))),
        rule("fallback"),
    )
    assert routed(t, req("/" + "a" * (SUBJECT_LIMIT - 1))) == "HTTPRoute/app/path"
    assert routed(t, req("/" + "a" * SUBJECT_LIMIT, headers=(("x", "b" * SUBJECT_LIMIT),))) == "HTTPRoute/app/header"
    assert routed(t, req("/" + "a" * SUBJECT_LIMIT, headers=(("x", "b" * (SUBJECT_LIMIT + 1)),))) == (
        "HTTPRoute/app/fallback"
    )


def test_tables_are_compiled_once_per_table_object() -> None:
    t = table(rule("r", RouteMatch(path=regex("/x"))))
    assert compile_table(t) is compile_table(t)
    assert compile_table(table(*t.http)) is not compile_table(t)


# Rule 5: redirects


@pytest.mark.parametrize(
    ("redirect", "match", "head", "location"),
    [
        (RequestRedirect(), None, req("/a?b=c"), "http://reviews:9080/a?b=c"),
        (RequestRedirect(scheme="https"), None, req("/a"), "https://reviews/a"),
        (RequestRedirect(scheme="https", port=8443), None, req("/a"), "https://reviews:8443/a"),
        (RequestRedirect(hostname="example.com"), None, req("/a"), "http://example.com:9080/a"),
        (RequestRedirect(hostname="example.com", port=80), None, req("/a"), "http://example.com/a"),
        (RequestRedirect(port=443), None, req("/a", scheme="https"), "https://reviews/a"),
        (RequestRedirect(scheme="http"), None, req("/a", scheme="https"), "http://reviews/a"),
        (RequestRedirect(scheme="ftp"), None, req("/a"), "ftp://reviews:9080/a"),
        (
            RequestRedirect(path=PathModifier(PathModifierType.REPLACE_FULL_PATH, "/new")),
            None,
            req("/old/x?q=1"),
            "http://reviews:9080/new?q=1",
        ),
        (
            RequestRedirect(path=PathModifier(PathModifierType.REPLACE_PREFIX_MATCH, "/v2")),
            prefix("/v1"),
            req("/v1/books/1"),
            "http://reviews:9080/v2/books/1",
        ),
        (
            RequestRedirect(path=PathModifier(PathModifierType.REPLACE_PREFIX_MATCH, "/")),
            prefix("/v1"),
            req("/v1"),
            "http://reviews:9080/",
        ),
        (RequestRedirect(), None, req("/a", authority="[fd00::1]:9080"), "http://[fd00::1]:9080/a"),
        (RequestRedirect(), None, req("/a", authority=""), f"http://{DEST.hostname}:9080/a"),
    ],
)
def test_redirects(redirect: RequestRedirect, match: PathMatch | None, head: RequestHead, location: str) -> None:
    r = rule("redir", RouteMatch(path=match), redirect=redirect)
    assert respond(route(table(r), DEST, head, 0.0)) == Respond(302, (("location", location),), route=r.route)


def test_a_redirect_answers_its_status_code_and_nothing_else_runs() -> None:
    r = rule(
        "redir",
        redirect=RequestRedirect(hostname="x", status_code=301),
        request_headers=HeaderModifier(set=(("a", "1"),)),
        mirrors=(RequestMirror(SHADOW),),
    )
    assert respond(route(table(r), DEST, req("/"), 0.0)).status == 301


# Rule 6: weights


def test_weights_90_10_hold_within_one_percent_over_10000_draws() -> None:
    t = table(rule("split", backends=(WeightedBackend(V1, 90), WeightedBackend(V2, 10))))
    counts = {V1: 0, V2: 0}
    for i in range(10_000):
        counts[forward(route(t, DEST, req(), (i + 0.5) / 10_000)).backend] += 1
    assert abs(counts[V2] / 10_000 - 0.10) <= 0.01
    rng = stdlib_random.Random(17)
    seeded = sum(forward(route(t, DEST, req(), rng.random())).backend == V2 for _ in range(10_000))
    assert abs(seeded / 10_000 - 0.10) <= 0.01


def test_a_draw_just_below_one_still_lands_on_the_last_backend() -> None:
    below_one = 1.0 - 2.0**-53
    t = table(rule("big", backends=(WeightedBackend(V1, 1), WeightedBackend(V2, 1_000_000_007))))
    assert forward(route(t, DEST, req(), below_one)).backend == V2
    tcp = RouteTable("", 1, tcp_backends=(WeightedBackend(V1, 1), WeightedBackend(V2, 1_000_000_007)))
    assert route_tcp(tcp, DEST, below_one) == V2


def test_weight_zero_is_never_chosen() -> None:
    t = table(rule("z", backends=(WeightedBackend(V1, 0), WeightedBackend(V2, 1))))
    assert {forward(route(t, DEST, req(), r / 100)).backend for r in range(100)} == {V2}


@pytest.mark.parametrize(
    ("backends", "flags"),
    [
        ((), "-"),  # istiod's direct response 500
        ((WeightedBackend(V1, 0),), "-"),
        ((WeightedBackend(None, 1),), "NC"),  # a backendRef that resolved to nothing: Envoy finds no cluster
        ((WeightedBackend(V1, -3),), "-"),
    ],
)
def test_no_usable_backend_answers_500(backends: tuple[WeightedBackend, ...], flags: str) -> None:
    r = rule("none", backends=backends)
    assert route(table(r), DEST, req(), 0.5) == Respond(500, route=r.route, flags=flags)


def test_an_unresolved_backends_share_answers_500_and_the_rest_forwards() -> None:
    t = table(rule("half", backends=(WeightedBackend(V1, 1), WeightedBackend(None, 1))))
    assert forward(route(t, DEST, req(), 0.25)).backend == V1
    assert respond(route(t, DEST, req(), 0.75)).status == 500


@pytest.mark.parametrize("status", [500, 503])
def test_an_unresolved_backend_answers_the_rule_s_cluster_not_found_code_with_flag_nc(status: int) -> None:
    """Envoy's router: no cluster found (NC), the route's cluster_not_found_response_code, no body; the code
    travels with a Forward too, for a backend the waypoint's state turns out not to know."""
    r = dataclasses.replace(
        rule("half", backends=(WeightedBackend(V1, 1), WeightedBackend(None, 1))), missing_backend_status=status
    )
    answer = respond(route(table(r), DEST, req(), 0.75))
    assert (answer.status, answer.flags, answer.body) == (status, "NC", b"")
    assert forward(route(table(r), DEST, req(), 0.25)).missing_backend_status == status


@pytest.mark.parametrize("random", [float("nan"), -0.1, 1.0, 7.0, float("inf")])
def test_a_random_number_outside_the_unit_interval_is_read_as_zero(random: float) -> None:
    t = table(rule("split", backends=(WeightedBackend(V1, 1), WeightedBackend(V2, 1))))
    assert forward(route(t, DEST, req(), random)).backend == V1


# Rule 7: filters


@pytest.mark.parametrize(
    ("modifier", "headers", "expected"),
    [
        (HeaderModifier(set=(("X-A", "1"),)), (("x-a", "0"), ("b", "2")), (("x-a", "1"), ("b", "2"))),
        (HeaderModifier(set=(("x-a", "1"),)), (("b", "2"),), (("b", "2"), ("x-a", "1"))),
        (HeaderModifier(set=(("x-a", "1"),)), (("x-a", "0"), ("b", "2"), ("x-a", "9")), (("x-a", "1"), ("b", "2"))),
        (HeaderModifier(add=(("X-A", "1"),)), (("x-a", "0"),), (("x-a", "0"), ("x-a", "1"))),
        (HeaderModifier(remove=("X-A",)), (("x-a", "0"), ("b", "2"), ("x-a", "1")), (("b", "2"),)),
        (HeaderModifier(remove=("x-a",), add=(("x-a", "new"),)), (("x-a", "old"),), (("x-a", "new"),)),
        (
            HeaderModifier(
                set=(("bad name", "1"), ("ok", "a\r\nx: y"), ("fine", "v")),
            ),
            (),
            (("fine", "v"),),
        ),
    ],
)
def test_request_header_modifier(
    modifier: HeaderModifier, headers: tuple[tuple[str, str], ...], expected: tuple[tuple[str, str], ...]
) -> None:
    t = table(rule("hm", request_headers=modifier))
    assert forward(route(t, DEST, req(headers=headers), 0.0)).request.headers == expected


@pytest.mark.parametrize("name", ["Content-Length", "transfer-encoding", "connection", "upgrade", "te", "trailer"])
def test_a_route_cannot_touch_framing_or_hop_by_hop_headers(name: str) -> None:
    t = table(
        rule("smuggle", request_headers=HeaderModifier(set=((name, "0"),), add=((name, "chunked"),), remove=(name,)))
    )
    headers = ((name.lower(), "5"), ("a", "1"))
    assert forward(route(t, DEST, req(headers=headers), 0.0)).request.headers == headers
    assert clean_modifier(HeaderModifier(set=((name, "0"),))) is None


@pytest.mark.parametrize(
    ("redirect", "rewrite"),
    [
        (RequestRedirect(hostname="evil\r\nset-cookie: x=1"), None),
        (RequestRedirect(hostname="caf\u00e9.example"), None),
        (None, URLRewrite(hostname="a b")),
        (None, URLRewrite(hostname="a\nb")),
    ],
)
def test_a_location_or_authority_that_is_not_visible_ascii_answers_500(
    redirect: RequestRedirect | None, rewrite: URLRewrite | None
) -> None:
    r = rule("unsafe", redirect=redirect, rewrite=rewrite)
    assert route(table(r), DEST, req(), 0.0) == Respond(500, route=r.route)


def test_a_path_rewrite_keeps_an_empty_authority() -> None:
    r = rule("p", rewrite=URLRewrite(path=PathModifier(PathModifierType.REPLACE_FULL_PATH, "/x")))
    assert forward(route(table(r), DEST, req(authority=""), 0.0)).request == req("/x", authority="")


def test_setting_host_changes_the_authority() -> None:
    modifier = clean_modifier(HeaderModifier(set=(("Host", "other:1"),), remove=("host",)))
    assert modifier is not None
    assert apply_header_modifier(req(), modifier).authority == "other:1"


def test_a_modifier_with_only_unsafe_entries_cleans_to_nothing() -> None:
    assert clean_modifier(HeaderModifier(add=(("x", "a\nb"),), remove=("a:b",))) is None


PREFIX_XYZ = URLRewrite(path=PathModifier(PathModifierType.REPLACE_PREFIX_MATCH, "/xyz"))


@pytest.mark.parametrize(
    ("rewrite", "match", "path", "expected_path", "expected_authority"),
    [
        (URLRewrite(hostname="backend.internal"), None, "/a?q=1", "/a?q=1", "backend.internal"),
        (URLRewrite(path=PathModifier(PathModifierType.REPLACE_FULL_PATH, "/x")), None, "/a/b?q", "/x?q", None),
        (URLRewrite(path=PathModifier(PathModifierType.REPLACE_FULL_PATH, "")), None, "/a", "/", None),
        (PREFIX_XYZ, prefix("/foo"), "/foo/bar", "/xyz/bar", None),
        (PREFIX_XYZ, prefix("/"), "/foo", "/xyz/foo", None),
        (PREFIX_XYZ, None, "/foo", "/xyz/foo", None),
        (PREFIX_XYZ, exact("/foo"), "/foo", "/foo", None),
    ],
)  # fmt: skip
def test_url_rewrite(
    rewrite: URLRewrite, match: PathMatch | None, path: str, expected_path: str, expected_authority: str | None
) -> None:
    decision = forward(route(table(rule("rw", RouteMatch(path=match), rewrite=rewrite)), DEST, req(path), 0.0))
    assert decision.request.path == expected_path
    assert decision.request.authority == (expected_authority or "reviews:9080")


@pytest.mark.parametrize(
    ("matched", "path", "replacement", "result"),
    [
        ("/foo", "/foo/bar", "/xyz", "/xyz/bar"),
        ("/foo", "/foo/bar", "/xyz/", "/xyz/bar"),
        ("/foo/", "/foo/bar", "/xyz", "/xyz/bar"),
        ("/foo/", "/foo/bar", "/xyz/", "/xyz/bar"),
        ("/foo", "/foo", "/xyz", "/xyz"),
        ("/foo", "/foo/", "/xyz", "/xyz/"),
        ("/foo", "/foo/bar", "", "/bar"),
        ("/foo", "/foo/", "", "/"),
        ("/foo", "/foo", "", "/"),
        ("/foo", "/foo/", "/", "/"),
        ("/foo", "/foo", "/", "/"),
    ],
)
def test_replace_prefix_follows_gateway_apis_table(matched: str, path: str, replacement: str, result: str) -> None:
    assert replace_prefix(path, matched, replacement) == result


def test_filters_run_rule_header_modifier_then_rewrite_then_the_backends_own() -> None:
    r = rule(
        "order",
        RouteMatch(path=prefix("/api")),
        request_headers=HeaderModifier(set=(("x-stage", "rule"),), add=(("x-rule", "1"),)),
        rewrite=URLRewrite(hostname="v1.internal", path=PathModifier(PathModifierType.REPLACE_PREFIX_MATCH, "/")),
        backends=(WeightedBackend(V1, request_headers=HeaderModifier(set=(("x-stage", "backend"),))),),
        response_headers=HeaderModifier(add=(("x-served-by", "waypoint"),)),
        timeouts=Timeouts(request=3.0),
        retry=RetryPolicy(attempts=5),
    )
    decision = forward(route(table(r), DEST, req("/api/items?id=1", headers=(("x-stage", "client"),)), 0.0))
    assert decision.request == RequestHead(
        "GET", "/items?id=1", "v1.internal", (("x-stage", "backend"), ("x-rule", "1")), "http"
    )
    assert decision.response_headers == HeaderModifier(add=(("x-served-by", "waypoint"),))
    assert decision.timeouts == Timeouts(request=3.0) and decision.retry == RetryPolicy(attempts=5)
    assert decision.route == "HTTPRoute/app/order"


# Rule 8: mirrors


def test_mirrors_get_the_rewritten_request_without_the_backends_own_modifier_and_a_shadow_host() -> None:
    r = rule(
        "mirror",
        rewrite=URLRewrite(path=PathModifier(PathModifierType.REPLACE_FULL_PATH, "/m")),
        backends=(WeightedBackend(V1, request_headers=HeaderModifier(add=(("x-v1", "1"),))),),
        mirrors=(RequestMirror(SHADOW),),
    )
    decision = forward(route(table(r), DEST, req("/a"), 0.3))
    assert decision.mirrors == ((SHADOW, RequestHead("GET", "/m", "reviews-shadow:9080", (), "http")),)
    assert decision.request.headers == (("x-v1", "1"),)


@pytest.mark.parametrize("percent", [0.0, 10.0, 50.0, 100.0])
def test_mirror_percent_holds_within_one_percent_and_is_independent_of_the_backend_draw(percent: float) -> None:
    t = table(
        rule(
            "m",
            backends=(WeightedBackend(V1, 90), WeightedBackend(V2, 10)),
            mirrors=(RequestMirror(SHADOW, percent),),
        )
    )
    rng = stdlib_random.Random(42)
    mirrored = {V1: 0, V2: 0}
    chosen = {V1: 0, V2: 0}
    for _ in range(20_000):
        decision = forward(route(t, DEST, req(), rng.random()))
        chosen[decision.backend] += 1
        mirrored[decision.backend] += bool(decision.mirrors)
    for backend in (V1, V2):
        assert abs(mirrored[backend] / chosen[backend] - percent / 100) <= 0.02
    assert abs(sum(mirrored.values()) / 20_000 - percent / 100) <= 0.01


def test_two_mirrors_draw_differently() -> None:
    t = table(rule("m", mirrors=(RequestMirror(SHADOW, 50), RequestMirror(V2, 50))))
    rng = stdlib_random.Random(5)
    kinds = {tuple(b for b, _ in forward(route(t, DEST, req(), rng.random())).mirrors) for _ in range(200)}
    assert kinds == {(), (SHADOW,), (V2,), (SHADOW, V2)}


# TCP and x-request-id


def test_route_tcp() -> None:
    tcp = RouteTable(DEST.service_key, DEST.port, tcp_backends=(WeightedBackend(V1, 3), WeightedBackend(V2, 1)))
    assert route_tcp(None, DEST, 0.5) == DEST
    assert route_tcp(table(), DEST, 0.5) == DEST
    assert [route_tcp(tcp, DEST, r) for r in (0.0, 0.74, 0.75, 0.99)] == [V1, V1, V2, V2]
    broken = RouteTable(DEST.service_key, DEST.port, tcp_backends=(WeightedBackend(None, 1),))
    assert route_tcp(broken, DEST, 0.5) is None
    assert route_tcp(RouteTable("", 1, tcp_backends=(WeightedBackend(V1, 0),)), DEST, 0.5) is None


def test_x_request_id_is_added_when_missing_and_kept_when_present() -> None:
    added = with_request_id(req(headers=(("a", "1"),)), "gen-1")
    assert added.headers == (("a", "1"), ("x-request-id", "gen-1"))
    kept = req(headers=(("x-request-id", "client-7"),))
    assert with_request_id(kept, "gen-2") is kept
    assert with_request_id(req(headers=(("x-request-id", ""),)), "gen-3").headers == (("x-request-id", "gen-3"),)


@pytest.mark.parametrize(
    ("authority", "expected"),
    [
        ("a:80", ("a", 80)),
        ("a", ("a", None)),
        ("[::1]:8080", ("[::1]", 8080)),
        ("[::1]", ("[::1]", None)),
        ("a:b", ("a:b", None)),
        ("[::1", ("[::1", None)),
        ("", ("", None)),
    ],
)
def test_split_authority(authority: str, expected: tuple[str, int | None]) -> None:
    assert split_authority(authority) == expected


@pytest.mark.parametrize(
    ("target", "normalized"),
    [
        ("/a/b/../c", "/a/c"),
        ("/a/./b", "/a/b"),
        ("/../a", "/a"),
        ("/a/b/..", "/a/"),
        ("/a/b/.", "/a/b/"),
        ("/public/%2e%2E/admin", "/admin"),
        ("/public/%2e./admin?x=1", "/admin?x=1"),
        ("/a/.b/..c", "/a/.b/..c"),
        ("/a//b/../c", "/a//c"),
        ("/a%2fb/../c", "/c"),
        ("/..", "/"),
        ("/a/b/../../..", "/"),
        ("/a?x=/../", "/a?x=/../"),
        ("*", "*"),
        ("/plain/path", "/plain/path"),
    ],
)
def test_normalize_path_removes_dot_segments_as_istios_default_does(target: str, normalized: str) -> None:
    assert normalize_path(target) == normalized


def test_a_dot_dot_path_cannot_slip_past_a_prefix_route_once_normalized() -> None:
    t = table(rule("public", RouteMatch(path=prefix("/public")), V1), rule("rest", backend=V2))
    sneaky = req(normalize_path("/public/%2e%2e/admin"))
    assert forward(route(t, DEST, sneaky, 0.0)).backend == V2


@given(st.text(alphabet="/.%2eEab?", max_size=30))
def test_normalize_path_is_idempotent_and_leaves_no_dot_segment(target: str) -> None:
    once = normalize_path(target)
    assert normalize_path(once) == once
    path = once.partition("?")[0]
    if path.startswith("/"):
        dots = {".", "%2e", "%2E"}
        assert not (dots | {a + b for a in dots for b in dots}) & set(path.split("/"))


# Property tests: route() never raises.

_text = st.text(max_size=20)
_header_pairs = st.lists(st.tuples(st.text(max_size=10), st.text(max_size=20)), max_size=5).map(tuple)
_requests = st.builds(
    RequestHead,
    method=st.sampled_from(["GET", "POST", "get", ""]) | _text,
    path=st.text(max_size=40) | st.sampled_from(["/a?b=c&d", "/%zz?%%&=", "*", "http://x/y"]),
    authority=_text,
    headers=_header_pairs,
    scheme=st.sampled_from(["http", "https", ""]),
)
_backend = st.builds(BackendService, st.just("ns"), _text, st.integers(0, 70000))
_value_match = st.builds(ValueMatch, _text, st.text(max_size=10), st.sampled_from(ValueMatchType))
_path_modifier = st.builds(PathModifier, st.sampled_from(PathModifierType), _text)
_header_modifier = st.builds(HeaderModifier, _header_pairs, _header_pairs, st.lists(_text, max_size=3).map(tuple))
_rules = st.builds(
    RouteRule,
    route=_text,
    match=st.builds(
        RouteMatch,
        path=st.none() | st.builds(PathMatch, st.sampled_from(PathMatchType), st.text(max_size=12)),
        headers=st.lists(_value_match, max_size=3).map(tuple),
        query_params=st.lists(_value_match, max_size=3).map(tuple),
        method=st.none() | st.sampled_from(["GET", "POST"]),
    ),
    backends=st.lists(
        st.builds(WeightedBackend, st.none() | _backend, st.integers(-5, 100), st.none() | _header_modifier),
        max_size=4,
    ).map(tuple),
    request_headers=st.none() | _header_modifier,
    response_headers=st.none() | _header_modifier,
    redirect=st.none()
    | st.builds(
        RequestRedirect,
        st.none() | _text,
        st.none() | _text,
        st.none() | _path_modifier,
        st.none() | st.integers(0, 70000),
    ),
    rewrite=st.none() | st.builds(URLRewrite, st.none() | _text, st.none() | _path_modifier),
    mirrors=st.lists(st.builds(RequestMirror, _backend, st.floats(-10, 110)), max_size=2).map(tuple),
)
_tables = st.builds(RouteTable, st.just("app/reviews"), st.just(9080), st.lists(_rules, max_size=6).map(tuple))


@given(_tables, _requests, st.floats(allow_nan=True, allow_infinity=True))
def test_route_never_raises_on_arbitrary_requests_and_tables(
    t: RouteTable, request: RequestHead, random: float
) -> None:
    decision = route(t, DEST, request, random)
    assert isinstance(decision, Forward | Respond)
    if isinstance(decision, Respond):
        assert decision.status in {404, 500} or decision.headers[0][0] == "location"


@given(st.text(max_size=40) | st.from_regex(r"[()|*+?{}\[\]\\a-c0-9,.^$]{0,24}", fullmatch=True))
def test_pattern_problem_never_raises(pattern: str) -> None:
    assert pattern_problem(pattern) is None or isinstance(pattern_problem(pattern), str)


_NAMES = st.sampled_from(["a", "b", "c", "d"])
_ENTRIES = st.lists(st.tuples(_NAMES, st.sampled_from(["1", "2", "3"])), max_size=4).map(tuple)
_MODIFIERS = st.builds(HeaderModifier, set=_ENTRIES, add=_ENTRIES, remove=st.lists(_NAMES, max_size=3).map(tuple))


@given(first=st.one_of(st.none(), _MODIFIERS), then=st.one_of(st.none(), _MODIFIERS), headers=_ENTRIES)
def test_chained_modifiers_give_the_headers_of_one_then_the_other(
    first: HeaderModifier | None, then: HeaderModifier | None, headers: tuple[tuple[str, str], ...]
) -> None:
    """:func:`ambit.waypoint.filters.chained` (filters rule 2): the same values per name, in the same order, as
    applying ``first`` and then ``then``."""

    def by_name(items: list[tuple[str, str]]) -> dict[str, list[str]]:
        out: dict[str, list[str]] = {}
        for name, value in items:
            out.setdefault(name, []).append(value)
        return out

    expected = list(headers)
    for modifier in (first, then):
        if modifier is not None:
            expected = modifier.applied(expected)
    one = chained(first, then)
    got = list(headers) if one is None else one.applied(list(headers))
    assert by_name(got) == by_name(expected)
