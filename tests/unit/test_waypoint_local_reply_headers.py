"""An HTTPRoute's ResponseHeaderModifier on the waypoint's own answers, as Envoy applies a route's response header
changes to local replies: the router's direct responses and redirects (``direct_response->finalizeResponseHeaders``),
and every other local reply of a stream whose route matched (the filter manager runs the route entry's
``finalizeResponseHeaders``; a fault abort, 500/503/504), before the body's ``content-type`` and ``content-length``
are set; never on 404 with no route, nor on a CORS preflight (the CORS filter encodes that answer itself)."""

from __future__ import annotations

import asyncio
from collections.abc import Iterable

import pytest

from ambit.model.route_matches import PathMatch, PathMatchType, RouteMatch
from ambit.model.routes import (
    BackendService,
    DirectResponse,
    Fault,
    HeaderModifier,
    RequestRedirect,
    RouteRule,
    RouteTable,
    WeightedBackend,
)
from ambit.waypoint.decisions import Forward, RequestHead, Respond
from ambit.waypoint.downstream import Outcome, respond
from ambit.waypoint.routing import route

DEST = BackendService("app", "reviews.app.svc.cluster.local", 9080)
MODIFIER = HeaderModifier(set=(("x-route", "set"),), add=(("x-added", "a"),), remove=("x-gone",))


def table(**kw: object) -> RouteTable:
    kw.setdefault("backends", (WeightedBackend(DEST),))
    match = RouteMatch(path=PathMatch(PathMatchType.PATH_PREFIX, "/a"))
    rule = RouteRule("HTTPRoute/app/r", match, response_headers=MODIFIER, **kw)  # type: ignore[arg-type]
    return RouteTable(DEST.service_key, DEST.port, http=(rule,))


def decide(t: RouteTable, path: str = "/a", headers: tuple[tuple[str, str], ...] = (), method: str = "GET") -> object:
    return route(t, DEST, RequestHead(method, path, "reviews:9080", headers), 0.5)


@pytest.mark.parametrize(
    "kw",
    [
        {"redirect": RequestRedirect(scheme="https")},
        {"direct_response": DirectResponse(418, b"teapot")},
        {"fault": Fault(abort_status=503, abort_percent=100.0)},
        {"backends": (WeightedBackend(None),)},  # a missing backend: 500
    ],
    ids=["redirect", "direct response", "fault abort", "missing backend"],
)
def test_every_answer_of_a_matched_rule_carries_its_response_modifier(kw: dict[str, object]) -> None:
    decision = decide(table(**kw))
    assert isinstance(decision, Respond) and decision.response_headers == MODIFIER


def test_a_forwarded_request_carries_it_for_the_upstream_answer_and_the_router_s_own() -> None:
    decision = decide(table())
    assert isinstance(decision, Forward) and decision.response_headers == MODIFIER


def test_an_answer_with_no_route_carries_none() -> None:
    no_route = decide(table(), path="/else")
    assert isinstance(no_route, Respond) and no_route.status == 404 and no_route.response_headers is None


class Answered:
    """The client's side of one request, recording the local answer."""

    def __init__(self) -> None:
        self.answers: list[tuple[int, list[tuple[str, str]], bytes]] = []

    async def answer(self, status: int, headers: Iterable[tuple[str, str]], body: bytes) -> None:
        self.answers.append((status, list(headers), body))


def answer(headers: tuple[tuple[str, str], ...], body: bytes, modifier: HeaderModifier | None) -> list[tuple[str, str]]:
    down = Answered()
    asyncio.run(respond(down, 503, headers, body, Outcome("rid"), flags="UH", route=modifier))  # type: ignore[arg-type]
    ((_, fields, _),) = down.answers
    return fields


def test_a_local_answer_gets_the_route_s_changes_but_keeps_its_content_type_and_length() -> None:
    modifier = HeaderModifier(set=(("content-type", "text/html"), ("x-route", "1")), remove=("x-gone",))
    fields = answer((("x-gone", "1"),), b"no healthy upstream", modifier)
    assert dict(fields) == {
        "x-route": "1",
        "content-type": "text/plain",
        "content-length": "19",
    }
    # with no body the route may set a content-type, as Envoy lets it
    assert ("content-type", "text/html") in answer((), b"", modifier)
    # a redirect's location is there before the route's changes, which may replace it
    relocated = answer((("location", "https://a/"),), b"", HeaderModifier(set=(("location", "https://b/"),)))
    assert ("location", "https://b/") in relocated and ("location", "https://a/") not in relocated


def test_without_a_route_modifier_a_local_answer_is_unchanged() -> None:
    assert answer((("x-gone", "1"),), b"body", None) == [
        ("x-gone", "1"),
        ("content-type", "text/plain"),
        ("content-length", "4"),
    ]
