"""A route's CORS policy at the waypoint (ambit.waypoint.cors, ambit.waypoint.routing rule 11): upstream's
expectations from istio tests/integration/pilot/common/routing.go ("cors"), each rule of the module, the interplay
with routing, faults, redirects and direct responses, then hostile requests (hypothesis): never a traceback, and
nothing a client sends with CR, LF or another control character reaches a response."""

from __future__ import annotations

import re

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from ambit.model.route_matches import RouteMatch, ValueMatch, ValueMatchType
from ambit.model.routes import (
    BackendService,
    CorsPolicy,
    DirectResponse,
    Fault,
    HeaderModifier,
    RequestRedirect,
    RouteRule,
    RouteTable,
    WeightedBackend,
)
from ambit.waypoint.cors import AddCorsHeaders, AnswerPreflight, compile_cors, plan_cors
from ambit.waypoint.decisions import Decision, Forward, RequestHead, Respond
from ambit.waypoint.routing import compile_table, route

DEST = BackendService("app", "b.app.svc.cluster.local", 80)
UPSTREAM = CorsPolicy(
    allow_origins=(ValueMatch("origin", "cors.com"),),
    allow_methods="POST,GET",
    allow_headers="X-Foo-Bar,X-Foo-Baz",
    max_age=86400,
)


def req(method: str = "GET", *headers: tuple[str, str], path: str = "/") -> RequestHead:
    return RequestHead(method, path, "b", headers)


def preflight(origin: str = "cors.com", method: str = "DELETE", *more: tuple[str, str]) -> RequestHead:
    return req("OPTIONS", ("origin", origin), ("access-control-request-method", method), *more)


def origins(*matches: tuple[ValueMatchType, str]) -> tuple[ValueMatch, ...]:
    return tuple(ValueMatch("origin", value, kind) for kind, value in matches)


def decide(request: RequestHead, *rules: RouteRule, random: float = 0.0) -> Decision:
    return route(RouteTable(DEST.service_key, DEST.port, http=rules), DEST, request, random)


def rule(name: str = "r", cors: CorsPolicy | None = UPSTREAM, **kw: object) -> RouteRule:
    kw.setdefault("backends", (WeightedBackend(DEST, 100),))
    return RouteRule(route=f"VirtualService/app/{name}", match=RouteMatch(), cors=cors, **kw)  # type: ignore[arg-type]


def answer_headers(decision: Decision) -> dict[str, str]:
    """The headers the waypoint itself puts on the answer: a Respond's, or a Forward's response ``set``."""
    if isinstance(decision, Respond):
        return dict(decision.headers)
    return dict(decision.response_headers.set) if decision.response_headers is not None else {}


# Upstream's three calls.


def test_upstream_preflight_is_answered_200_with_the_configured_headers() -> None:
    decision = decide(preflight("cors.com", "DELETE"), rule())
    assert isinstance(decision, Respond) and decision.status == 200 and decision.body == b""
    assert dict(decision.headers) == {
        "access-control-allow-origin": "cors.com",
        "access-control-allow-methods": "POST,GET",
        "access-control-allow-headers": "X-Foo-Bar,X-Foo-Baz",
        "access-control-max-age": "86400",
    }
    assert decision.route == "VirtualService/app/r"


def test_upstream_get_with_a_matching_origin_gets_allow_origin_on_the_answer() -> None:
    decision = decide(req("GET", ("origin", "cors.com")), rule())
    assert isinstance(decision, Forward) and decision.backend == DEST
    assert answer_headers(decision) == {"access-control-allow-origin": "cors.com"}


def test_upstream_get_without_an_origin_gets_no_cors_header() -> None:
    decision = decide(req("GET"), rule())
    assert isinstance(decision, Forward) and decision.response_headers is None


# The module's rules.


@pytest.mark.parametrize(
    ("matches", "origin", "allowed"),
    [
        (origins((ValueMatchType.EXACT, "https://a.example")), "https://a.example", True),
        (origins((ValueMatchType.EXACT, "https://a.example")), "https://a.example.evil", False),
        (origins((ValueMatchType.EXACT, "https://a.example")), "HTTPS://A.EXAMPLE", False),
        (origins((ValueMatchType.PREFIX, "https://a.")), "https://a.example", True),
        (origins((ValueMatchType.PREFIX, "https://a.")), "http://a.example", False),
        (origins((ValueMatchType.REGULAR_EXPRESSION, r"https://[a-z]+\.example")), "https://x.example", True),
        (origins((ValueMatchType.REGULAR_EXPRESSION, r"https://[a-z]+\.example")), "https://x.example.evil", False),
        (origins((ValueMatchType.EXACT, "*")), "https://anything.example", True),
        (origins((ValueMatchType.REGULAR_EXPRESSION, ".*")), "null", True),
        (origins((ValueMatchType.REGULAR_EXPRESSION, "(a+)+b")), "aaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaa!", False),
        ((), "https://a.example", False),
    ],
)
def test_origins_are_allowed_by_exact_prefix_and_full_regex_matches(
    matches: tuple[ValueMatch, ...], origin: str, allowed: bool
) -> None:
    plan = plan_cors(compile_cors(CorsPolicy(allow_origins=matches)), req("GET", ("origin", origin)))
    assert plan == (AddCorsHeaders((("access-control-allow-origin", origin),)) if allowed else None)


def test_an_unsafe_origin_pattern_is_reported_and_never_holds() -> None:
    where = "VirtualService/app/r"
    compiled = compile_cors(CorsPolicy(allow_origins=origins((ValueMatchType.REGULAR_EXPRESSION, "(a+)+b"))), where)
    assert compiled.problems and compiled.problems[0].startswith(f"{where} CORS origin pattern '(a+)+b' refused")
    table = RouteTable(DEST.service_key, DEST.port, http=(rule(cors=compiled.policy),))
    assert compile_table(table).problems == compiled.problems


def test_credentials_and_expose_headers_go_on_a_normal_answer_and_on_an_allowed_preflight() -> None:
    """Envoy answers a preflight through its CORS filter's response path, which adds the expose headers too (the
    Gateway API conformance test HTTPRouteCORS expects them on the preflight)."""
    policy = CorsPolicy(
        allow_origins=origins((ValueMatchType.EXACT, "o")), expose_headers="X-A,X-B", allow_credentials=True
    )
    assert answer_headers(decide(req("POST", ("origin", "o")), rule(cors=policy))) == {
        "access-control-allow-origin": "o",
        "access-control-allow-credentials": "true",
        "access-control-expose-headers": "X-A,X-B",
    }
    assert answer_headers(decide(preflight("o"), rule(cors=policy))) == {
        "access-control-allow-origin": "o",
        "access-control-allow-credentials": "true",
        "access-control-expose-headers": "X-A,X-B",
    }


def test_a_non_matching_origin_gets_no_cors_header_and_its_preflight_is_forwarded_by_default() -> None:
    normal = decide(req("GET", ("origin", "evil.com")), rule())
    assert isinstance(normal, Forward) and normal.response_headers is None
    forwarded = decide(preflight("evil.com"), rule())
    assert isinstance(forwarded, Forward) and forwarded.response_headers is None
    assert forwarded.request.method == "OPTIONS"


def test_with_ignore_a_non_matching_preflight_is_answered_without_allow_origin_or_expose_headers() -> None:
    policy = CorsPolicy(
        allow_origins=UPSTREAM.allow_origins,
        allow_methods="GET",
        expose_headers="X-A",
        max_age=5,
        forward_unmatched_preflights=False,
    )
    decision = decide(preflight("evil.com"), rule(cors=policy))
    assert isinstance(decision, Respond) and decision.status == 200
    assert dict(decision.headers) == {"access-control-allow-methods": "GET", "access-control-max-age": "5"}
    normal = decide(req("GET", ("origin", "evil.com")), rule(cors=policy))
    assert isinstance(normal, Forward) and normal.response_headers is None


@pytest.mark.parametrize(
    "request_head",
    [
        req("OPTIONS", ("origin", "cors.com")),  # no Access-Control-Request-Method: not a preflight
        req("OPTIONS", ("origin", "cors.com"), ("access-control-request-method", "")),
        req("GET", ("origin", "cors.com"), ("access-control-request-method", "PUT")),
    ],
)
def test_only_options_with_a_requested_method_is_a_preflight(request_head: RequestHead) -> None:
    decision = decide(request_head, rule())
    assert isinstance(decision, Forward)
    assert answer_headers(decision) == {"access-control-allow-origin": "cors.com"}


def test_a_second_origin_field_does_not_smuggle_a_foreign_origin_past_the_match() -> None:
    decision = decide(req("GET", ("origin", "cors.com"), ("origin", "https://evil.example")), rule())
    assert isinstance(decision, Forward) and decision.response_headers is None
    assert isinstance(decide(preflight("cors.com", "GET", ("origin", "evil")), rule()), Forward)


def test_an_empty_origin_is_not_a_cors_request() -> None:
    assert plan_cors(compile_cors(UPSTREAM), req("GET", ("origin", ""))) is None
    assert plan_cors(compile_cors(UPSTREAM), preflight("")) is None


def test_a_star_echoes_the_preflights_requested_method_and_headers() -> None:
    policy = CorsPolicy(allow_origins=origins((ValueMatchType.EXACT, "o")), allow_methods="*", allow_headers="*")
    plan = plan_cors(compile_cors(policy), preflight("o", "PATCH", ("access-control-request-headers", "x-a, x-b")))
    assert plan == AnswerPreflight(
        (
            ("access-control-allow-origin", "o"),
            ("access-control-allow-methods", "PATCH"),
            ("access-control-allow-headers", "x-a, x-b"),
        )
    )


def test_the_cors_headers_replace_those_the_backend_or_the_rule_would_set() -> None:
    modifier = HeaderModifier(
        set=(("access-control-allow-origin", "*"), ("x-kept", "1")), add=(("access-control-allow-origin", "b"),)
    )
    decision = decide(req("GET", ("origin", "cors.com")), rule(response_headers=modifier))
    assert isinstance(decision, Forward) and decision.response_headers is not None
    assert decision.response_headers.set == (("x-kept", "1"), ("access-control-allow-origin", "cors.com"))
    assert decision.response_headers.add == ()


# Interplay with routing and the rule's other actions.


def test_a_preflight_takes_the_route_its_own_method_path_and_headers_match() -> None:
    get_only = RouteRule(
        route="VirtualService/app/get",
        match=RouteMatch(method="GET"),
        backends=(WeightedBackend(DEST, 100),),
        cors=UPSTREAM,
    )
    other = CorsPolicy(allow_origins=origins((ValueMatchType.EXACT, "other.com")), allow_methods="PUT")
    fallback = rule("rest", cors=other)
    on_get = decide(req("GET", ("origin", "cors.com")), get_only, fallback)
    assert isinstance(on_get, Forward) and on_get.route == "VirtualService/app/get"
    # The preflight is an OPTIONS request: it takes the catch-all rule, whose policy does not allow cors.com.
    assert isinstance(decide(preflight("cors.com"), get_only, fallback), Forward)
    answered = decide(preflight("other.com"), get_only, fallback)
    assert isinstance(answered, Respond) and answered.route == "VirtualService/app/rest"
    assert dict(answered.headers)["access-control-allow-methods"] == "PUT"


def test_no_matching_rule_is_still_404_without_cors() -> None:
    only = RouteRule(route="VirtualService/app/x", match=RouteMatch(method="GET"), cors=UPSTREAM)
    assert decide(preflight(), only) == Respond(404, flags="NR", by_router=False)


def test_a_redirect_or_direct_response_rule_bypasses_cors() -> None:
    redirect = decide(preflight(), rule(redirect=RequestRedirect(hostname="elsewhere")))
    assert isinstance(redirect, Respond) and redirect.status == 302
    assert "access-control-allow-origin" not in answer_headers(redirect)
    direct = decide(req("GET", ("origin", "cors.com")), rule(direct_response=DirectResponse(418, b"tea")))
    assert isinstance(direct, Respond) and direct.status == 418
    assert "access-control-allow-origin" not in answer_headers(direct)


def test_the_fault_runs_first_its_abort_has_no_cors_and_its_delay_holds_the_preflight() -> None:
    aborted = decide(preflight(), rule(fault=Fault(abort_status=503, abort_percent=100.0)))
    assert isinstance(aborted, Respond) and aborted.status == 503
    assert "access-control-allow-origin" not in answer_headers(aborted)
    delayed = decide(preflight(), rule(fault=Fault(delay=0.5, delay_percent=100.0)))
    assert isinstance(delayed, Respond) and delayed.status == 200 and delayed.delay == 0.5


def test_the_routers_own_missing_backend_answer_carries_the_cors_headers() -> None:
    decision = decide(req("GET", ("origin", "cors.com")), rule(backends=(WeightedBackend(None, 1),)))
    assert isinstance(decision, Respond) and decision.status == 500
    assert answer_headers(decision) == {"access-control-allow-origin": "cors.com"}


def test_the_policy_sees_the_request_as_received_not_after_the_rules_header_changes() -> None:
    strip = HeaderModifier(remove=("origin",))
    decision = decide(req("GET", ("origin", "cors.com")), rule(request_headers=strip))
    assert isinstance(decision, Forward) and decision.request.header("origin") is None
    assert answer_headers(decision) == {"access-control-allow-origin": "cors.com"}


# Hostile requests.

HOSTILE = st.text(st.characters(codec="utf-8"), max_size=40) | st.sampled_from(
    ["cors.com\r\nset-cookie: a=b", "cors.com\n", "\x00", "cors.com\x7f", " cors.com", "cors.com ", "é"]
)
BAD_CHARS = re.compile(r"[\x00-\x08\x0a-\x1f\x7f-\U0010ffff]")
ANY_ORIGIN = CorsPolicy(
    allow_origins=origins((ValueMatchType.REGULAR_EXPRESSION, ".*"), (ValueMatchType.PREFIX, "")),
    allow_methods="*",
    allow_headers="*",
    allow_credentials=True,
    expose_headers="X-A",
    max_age=1,
)


def test_an_origin_with_crlf_gets_no_cors_header_even_when_every_origin_is_allowed() -> None:
    for origin in ("cors.com\r\nset-cookie: a=b", "cors.com\n", "a\x00b"):
        decision = decide(req("GET", ("origin", origin)), rule(cors=ANY_ORIGIN))
        assert isinstance(decision, Forward) and decision.response_headers is None


@settings(max_examples=400, deadline=None)
@given(
    method=st.sampled_from(["GET", "OPTIONS", "POST"]) | HOSTILE,
    origin=HOSTILE,
    requested_method=HOSTILE,
    requested_headers=HOSTILE,
    policy=st.sampled_from([UPSTREAM, ANY_ORIGIN, CorsPolicy(), CorsPolicy(forward_unmatched_preflights=False)]),
)
def test_arbitrary_origins_methods_and_headers_never_raise_nor_reach_a_response_unclean(
    method: str, origin: str, requested_method: str, requested_headers: str, policy: CorsPolicy
) -> None:
    request = req(
        method,
        ("origin", origin),
        ("access-control-request-method", requested_method),
        ("access-control-request-headers", requested_headers),
    )
    decision = decide(request, rule(cors=policy))
    for name, value in answer_headers(decision).items():
        assert BAD_CHARS.search(value) is None, (name, value)
        assert value == value.strip() and value
    if isinstance(decision, Respond):
        assert decision.status == 200
