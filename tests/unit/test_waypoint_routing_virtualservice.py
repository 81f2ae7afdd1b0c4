"""The routing engine with what VirtualServices add (ambit.waypoint.matching rule 5, ambit.waypoint.routing rule
10): string prefixes, Present and Prefix values, ignoreUriCase, withoutHeaders, faults, direct responses, 503 for
an unknown destination, and first-match-wins in written order."""

from __future__ import annotations

import pytest

from ambit.model.route_matches import PathMatch, PathMatchType, RouteMatch, ValueMatch, ValueMatchType
from ambit.model.routes import (
    BackendService,
    DirectResponse,
    Fault,
    PathModifier,
    PathModifierType,
    RegexRewrite,
    RequestRedirect,
    RouteRule,
    RouteTable,
    URLRewrite,
    WeightedBackend,
)
from ambit.waypoint.decisions import Forward, RequestHead, Respond
from ambit.waypoint.routing import route

DEST = BackendService("app", "b.app.svc.cluster.local", 80)
V1 = BackendService("app", "b.app.svc.cluster.local", 80, "v1")
V2 = BackendService("app", "b.app.svc.cluster.local", 80, "v2")


def req(path: str = "/", headers: tuple[tuple[str, str], ...] = (), method: str = "GET") -> RequestHead:
    return RequestHead(method, path, "b", headers)


ANY = RouteMatch()


def rule(name: str, match: RouteMatch = ANY, backend: BackendService | None = DEST, **kw: object) -> RouteRule:
    kw.setdefault("backends", (WeightedBackend(backend, 100),))
    return RouteRule(route=f"VirtualService/app/{name}", match=match, missing_backend_status=503, **kw)  # type: ignore[arg-type]


def taken(request: RequestHead, *rules: RouteRule, random: float = 0.0) -> str:
    decision = route(RouteTable(DEST.service_key, DEST.port, http=rules), DEST, request, random)
    return decision.route.rpartition("/")[2] if isinstance(decision, Forward) else str(decision.status)


@pytest.mark.parametrize(
    ("match", "path", "holds"),
    [
        (RouteMatch(path=PathMatch(PathMatchType.PREFIX, "/foo")), "/foobar", True),
        (RouteMatch(path=PathMatch(PathMatchType.PREFIX, "/foo")), "/fo", False),
        (RouteMatch(path=PathMatch(PathMatchType.PREFIX, "/Foo"), ignore_path_case=True), "/fOO/x", True),
        (RouteMatch(path=PathMatch(PathMatchType.EXACT, "/A"), ignore_path_case=True), "/a?q=1", True),
        (RouteMatch(path=PathMatch(PathMatchType.EXACT, "/A")), "/a", False),
        (RouteMatch(path=PathMatch(PathMatchType.REGULAR_EXPRESSION, "/[a-z]+"), ignore_path_case=True), "/ABC", False),
    ],
)
def test_virtual_service_path_matches(match: RouteMatch, path: str, holds: bool) -> None:
    assert taken(req(path), rule("m", match)) == ("m" if holds else "404")


@pytest.mark.parametrize(
    ("matches", "headers", "holds"),
    [
        ((ValueMatch("user", "istio-", ValueMatchType.PREFIX),), (("user", "istio-custom-user"),), True),
        ((ValueMatch("user", "istio-", ValueMatchType.PREFIX),), (("user", "other"),), False),
        ((ValueMatch("user", "", ValueMatchType.PRESENT),), (("user", ""),), True),
        ((ValueMatch("user", "", ValueMatchType.PRESENT),), (), False),
    ],
)
def test_prefix_and_present_header_matches(
    matches: tuple[ValueMatch, ...], headers: tuple[tuple[str, str], ...], holds: bool
) -> None:
    assert taken(req(headers=headers), rule("m", RouteMatch(headers=matches))) == ("m" if holds else "404")


@pytest.mark.parametrize(
    ("without", "headers", "holds"),
    [
        (ValueMatch("x-debug", "", ValueMatchType.PRESENT), (), True),
        (ValueMatch("x-debug", "", ValueMatchType.PRESENT), (("x-debug", "1"),), False),
        (ValueMatch("x-env", "prod"), (("x-env", "prod"),), False),
        (ValueMatch("x-env", "prod"), (("x-env", "dev"),), True),
        (ValueMatch("x-env", "prod"), (), True),
        (ValueMatch("x-env", ""), (), False),  # a missing header reads as empty, which equals ""
        (ValueMatch("x-env", "(", ValueMatchType.REGULAR_EXPRESSION), (), False),  # refused pattern: never holds
    ],
)
def test_without_headers_must_not_hold(without: ValueMatch, headers: tuple[tuple[str, str], ...], holds: bool) -> None:
    assert taken(req(headers=headers), rule("m", RouteMatch(without_headers=(without,)))) == ("m" if holds else "404")


def test_upstream_traffic_split_first_match_wins_in_written_order() -> None:
    rules = (
        rule("v2", RouteMatch(headers=(ValueMatch("user", "istio-custom-user"),)), V2),
        rule("v1", RouteMatch(), V1),
    )
    assert taken(req(headers=(("user", "istio-custom-user"),)), *rules) == "v2"
    assert taken(req(), *rules) == "v1"
    decision = route(RouteTable(DEST.service_key, 80, http=rules), DEST, req(), 0.5)
    assert isinstance(decision, Forward) and decision.backend == V1


def test_an_unknown_destination_answers_the_rules_missing_backend_status() -> None:
    assert taken(req(), rule("m", backend=None)) == "503"


def test_a_direct_response_answers_with_its_status_and_body() -> None:
    decision = route(
        RouteTable(
            DEST.service_key, 80, http=(rule("d", direct_response=DirectResponse(418, b"teapot"), backends=()),)
        ),
        DEST,
        req(),
        0.0,
    )
    assert isinstance(decision, Respond)
    assert (decision.status, decision.body, decision.route) == (418, b"teapot", "VirtualService/app/d")


def test_fault_abort_and_delay_apply_to_their_share_of_requests() -> None:
    aborting = rule("f", fault=Fault(abort_status=503, abort_percent=100.0))
    assert taken(req(), aborting) == "503"
    abort = route(RouteTable(DEST.service_key, 80, http=(aborting,)), DEST, req(), 0.3)
    assert isinstance(abort, Respond) and abort.flags == "FI"  # Envoy's flag: fault injected
    delayed = rule("f", fault=Fault(delay=0.25, delay_percent=100.0))
    decision = route(RouteTable(DEST.service_key, 80, http=(delayed,)), DEST, req(), 0.3)
    assert isinstance(decision, Forward) and decision.delay == 0.25
    half = rule("f", fault=Fault(abort_status=500, abort_percent=50.0))
    draws = [i / 1000 for i in range(1000)]
    aborted = sum(taken(req(), half, random=r) == "500" for r in draws)
    assert 400 < aborted < 600
    rare = rule("f", fault=Fault(abort_status=500, abort_percent=1.0, delay=1.0, delay_percent=1.0))
    for r in (0.0, 1e-9, 1e-7, 0.5):  # small draws are not read as negative ones
        decision = route(RouteTable(DEST.service_key, 80, http=(rare,)), DEST, req(), r)
        assert isinstance(decision, Forward) and decision.delay == 0.0, r
    never = rule("f", fault=Fault(abort_status=500, abort_percent=0.0, delay=1.0, delay_percent=0.0))
    decision = route(RouteTable(DEST.service_key, 80, http=(never,)), DEST, req(), 0.7)
    assert isinstance(decision, Forward) and decision.delay == 0.0


GRPC_REQUEST = (("content-type", "application/grpc"), ("te", "trailers"))


def test_a_grpc_status_abort_answers_a_grpc_request_200_with_that_status_trailers_only() -> None:
    """istio routing.go "fault abort gRPC": grpcStatus UNAVAILABLE gives gRPC status 14 (Envoy's fault filter
    answers HTTP 200 with the gRPC status)."""
    aborting = rule("f", fault=Fault(abort_grpc_status=14, abort_percent=100.0))
    decision = route(RouteTable(DEST.service_key, 80, http=(aborting,)), DEST, req(headers=GRPC_REQUEST), 0.0)
    assert isinstance(decision, Respond)
    assert decision.status == 200 and decision.body == b""
    assert dict(decision.headers) == {
        "content-type": "application/grpc",
        "grpc-status": "14",
        "grpc-message": "fault filter abort",
    }
    proto = req(headers=(("content-type", "application/grpc+proto"),))
    decision = route(RouteTable(DEST.service_key, 80, http=(aborting,)), DEST, proto, 0.0)
    assert isinstance(decision, Respond) and dict(decision.headers)["grpc-status"] == "14"


def test_a_grpc_status_abort_answers_another_request_200_with_the_text() -> None:
    aborting = rule("f", fault=Fault(abort_grpc_status=0, abort_percent=100.0))  # OK is a status too
    decision = route(RouteTable(DEST.service_key, 80, http=(aborting,)), DEST, req(), 0.0)
    assert isinstance(decision, Respond)
    assert (decision.status, decision.body, decision.flags) == (200, b"fault filter abort", "FI")
    assert "grpc-status" not in dict(decision.headers)


def test_a_grpc_status_abort_applies_to_its_share_of_requests_only() -> None:
    half = rule("f", fault=Fault(abort_grpc_status=14, abort_percent=50.0))
    draws = [i / 1000 for i in range(1000)]
    aborted = sum(
        isinstance(route(RouteTable(DEST.service_key, 80, http=(half,)), DEST, req(headers=GRPC_REQUEST), r), Respond)
        for r in draws
    )
    assert 400 < aborted < 600
    never = rule("f", fault=Fault(abort_grpc_status=14, abort_percent=0.0))
    assert taken(req(headers=GRPC_REQUEST), never) == "f"


def test_a_regex_rewrite_replaces_every_match_in_the_path_and_keeps_the_query() -> None:
    rewriting = rule("r", regex_rewrite=RegexRewrite("/v1/([a-z]+)", "/v2/\\1/x"))
    decision = route(RouteTable(DEST.service_key, 80, http=(rewriting,)), DEST, req("/v1/abc/v1/de?q=/v1/z"), 0.0)
    assert isinstance(decision, Forward) and decision.request.path == "/v2/abc/x/v2/de/x?q=/v1/z"


@pytest.mark.parametrize(
    "rewrite",
    [RegexRewrite("(a", "b"), RegexRewrite("(a)", "\\2"), RegexRewrite("(a)", "\\d"), RegexRewrite("a", "a b")],
)
def test_a_regex_rewrite_that_cannot_work_answers_500(rewrite: RegexRewrite) -> None:
    table = RouteTable(DEST.service_key, 80, http=(rule("r", regex_rewrite=rewrite),))
    assert isinstance(route(table, DEST, req("/a"), 0.0), Respond)
    assert respond_status(table) == 500


def respond_status(table: RouteTable) -> int:
    decision = route(table, DEST, req("/a"), 0.0)
    assert isinstance(decision, Respond)
    return decision.status


@pytest.mark.parametrize(
    ("name", "value", "request_", "holds"),
    [
        (":method", "GET", RequestHead("GET", "/", "b"), True),
        (":method", "GET", RequestHead("POST", "/", "b"), False),
        (":authority", "b:80", RequestHead("GET", "/", "b:80"), True),
        (":path", "/x?y=1", RequestHead("GET", "/x?y=1", "b"), True),
        (":path", "/x", RequestHead("GET", "/x?y=1", "b"), False),
        (":scheme", "https", RequestHead("GET", "/", "b", scheme="https"), True),
        (":scheme", "https", RequestHead("GET", "/", "b"), False),
    ],
)
def test_a_pseudo_header_match_reads_that_part_of_the_request(
    name: str, value: str, request_: RequestHead, holds: bool
) -> None:
    assert taken(request_, rule("m", RouteMatch(headers=(ValueMatch(name, value),)))) == ("m" if holds else "404")


def test_a_header_sent_under_a_pseudo_header_s_name_is_not_read_as_it() -> None:
    forged = RequestHead("POST", "/", "b", ((":method", "GET"),))
    assert taken(forged, rule("m", RouteMatch(headers=(ValueMatch(":method", "GET"),)))) == "404"


@pytest.mark.parametrize(
    ("prefix", "replacement", "path", "rewritten"),
    [
        ("/foo/", "/ec", "/foo/ho?k=v", "/echo?k=v"),
        ("/foo", "/x", "/foobar", "/xbar"),
        ("/foo/", "/new/", "/foo/bar", "/new/bar"),
        ("/foo", "", "/foo", "/"),
    ],
)
def test_a_rewrite_after_a_string_prefix_replaces_exactly_the_matched_characters(
    prefix: str, replacement: str, path: str, rewritten: str
) -> None:
    rewrite = URLRewrite(path=PathModifier(PathModifierType.REPLACE_PREFIX_MATCH, replacement))
    matched = rule("m", RouteMatch(path=PathMatch(PathMatchType.PREFIX, prefix)), rewrite=rewrite)
    decision = route(RouteTable(DEST.service_key, DEST.port, http=(matched,)), DEST, req(path), 0.0)
    assert isinstance(decision, Forward) and decision.request.path == rewritten
    redirect = RequestRedirect(path=PathModifier(PathModifierType.REPLACE_PREFIX_MATCH, replacement))
    moved = rule("m", RouteMatch(path=PathMatch(PathMatchType.PREFIX, prefix)), backend=None, redirect=redirect)
    answer = route(RouteTable(DEST.service_key, DEST.port, http=(moved,)), DEST, req(path), 0.0)
    assert isinstance(answer, Respond) and dict(answer.headers)["location"] == f"http://b{rewritten}"


@pytest.mark.parametrize(
    ("redirect", "authority", "location"),
    [
        # upstream routing.go "redirect request port": derivePort FROM_REQUEST_PORT on port 80 (istiod: no port)
        (RequestRedirect(port=80, keeps_host_port=True), "b", "http://b/foo"),
        (RequestRedirect(port=80, keeps_host_port=True), "b:80", "http://b:80/foo"),
        # ... on the http2 port 85
        (RequestRedirect(port=85, keeps_host_port=True), "b", "http://b:85/foo"),
        (RequestRedirect(port=85, keeps_host_port=True), "b:85", "http://b:85/foo"),
        # "redirect port and scheme": scheme https with the request port 80
        (RequestRedirect(scheme="https", port=80, keeps_host_port=True), "b", "https://b:80/foo"),
        # a scheme change drops the old scheme's default port the Host names; other ports stay
        (RequestRedirect(scheme="https", keeps_host_port=True), "b:80", "https://b/foo"),
        (RequestRedirect(scheme="https", keeps_host_port=True), "b:8080", "https://b:8080/foo"),
        (RequestRedirect(hostname="x.example", keeps_host_port=True), "b:80", "http://x.example/foo"),
        # Gateway API's rules, unchanged: the listener port, left out when it is the scheme's default
        (RequestRedirect(), "b:80", "http://b/foo"),
    ],
)
def test_a_virtual_service_redirect_keeps_the_hosts_port_as_envoy_does(
    redirect: RequestRedirect, authority: str, location: str
) -> None:
    moved = rule("m", backend=None, redirect=redirect)
    answer = route(
        RouteTable(DEST.service_key, DEST.port, http=(moved,)), DEST, RequestHead("GET", "/foo", authority), 0.0
    )
    assert isinstance(answer, Respond) and dict(answer.headers)["location"] == location
