"""What a gRPC authorizer's ``HeaderValueOption`` does to the request, the response and a denial
(waypoint.ext_authz_edits rules 1-4, waypoint.ext_authz rules 8 and 11), and what it does to the route match
(waypoint.ext_authz rule 12)."""

from __future__ import annotations

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from ambit.model.envoyfilter import HeaderAction, HeaderOp
from ambit.model.extauthz import ExtAuthzProvider, ProviderKind
from ambit.model.route_matches import RouteMatch, ValueMatch
from ambit.model.routes import BackendService, RouteRule, RouteTable, WeightedBackend
from ambit.waypoint.decisions import Forward, RequestHead
from ambit.waypoint.envoy_patches import apply_header_ops
from ambit.waypoint.ext_authz import CheckAllowed, CheckDenied, apply_allowed, judge_grpc_answer
from ambit.waypoint.ext_authz_edits import RequestEdit, Write, edit_request_headers, request_edit, response_op
from ambit.waypoint.ext_authz_wire import (
    ADD_IF_ABSENT,
    APPEND_IF_EXISTS_OR_ADD,
    OVERWRITE_IF_EXISTS,
    OVERWRITE_IF_EXISTS_OR_ADD,
    CheckAnswer,
    HeaderOption,
    decode_check_response,
    encode_check_response,
)
from ambit.waypoint.routing import waypoint_route

GRPC = ExtAuthzProvider("g", ProviderKind.GRPC, "authz", 9000)
CLIENT = (("x-user", "mallory"), ("x-tag", "a"), ("accept", "*/*"))
AS_BOB = (("x-user", "bob"), ("x-tag", "a"), ("accept", "*/*"))
TAG_B = (("x-user", "mallory"), ("x-tag", "b"), ("accept", "*/*"))


def _allowed(*ok: HeaderOption, remove: tuple[str, ...] = (), response: tuple[HeaderOption, ...] = ()) -> CheckAllowed:
    """The verdict of an OK answer, after a trip over the wire."""
    answer = CheckAnswer(0, ok_headers=ok, ok_headers_to_remove=remove, ok_response_headers=response)
    verdict = judge_grpc_answer(GRPC, decode_check_response(encode_check_response(answer)))
    assert isinstance(verdict, CheckAllowed) and not verdict.reason
    return verdict


def _forwarded(*ok: HeaderOption, remove: tuple[str, ...] = ()) -> tuple[tuple[str, str], ...]:
    head = RequestHead("GET", "/", "svc:80", CLIENT)
    return apply_allowed(head, _allowed(*ok, remove=remove), ())[0].headers


@pytest.mark.parametrize(
    ("option", "expected"),
    [
        # neither field set: the message documents append as false, so the authorizer's value replaces the client's
        (HeaderOption("x-user", "bob"), AS_BOB),
        (HeaderOption("X-User", "bob", False), AS_BOB),
        (HeaderOption("x-tag", "b", True), (("x-user", "mallory"), ("x-tag", "a,b"), ("accept", "*/*"))),
        (HeaderOption("x-new", "n", True), (*CLIENT, ("x-new", "n"))),
        (HeaderOption("x-tag", "b", None, ADD_IF_ABSENT), CLIENT),
        (HeaderOption("x-new", "n", None, ADD_IF_ABSENT), (*CLIENT, ("x-new", "n"))),
        (HeaderOption("x-tag", "b", None, OVERWRITE_IF_EXISTS), TAG_B),
        (HeaderOption("x-new", "n", None, OVERWRITE_IF_EXISTS), CLIENT),
        (HeaderOption("x-new", "n", None, OVERWRITE_IF_EXISTS_OR_ADD), (*CLIENT, ("x-new", "n"))),
        (HeaderOption("x-user", "bob", None, APPEND_IF_EXISTS_OR_ADD), AS_BOB),
        (HeaderOption("x-user", "bob", None, 9), AS_BOB),
        (HeaderOption("x-tag", "b", False, ADD_IF_ABSENT), TAG_B),
    ],
)
def test_an_ok_answers_request_headers_are_written_as_their_option_says(
    option: HeaderOption, expected: tuple[tuple[str, str], ...]
) -> None:
    assert _forwarded(option) == expected


def test_a_client_header_of_the_authorizers_name_never_survives_beside_its_value() -> None:
    head = RequestHead("GET", "/", "svc:80", (("x-user", "mallory"), ("x-user", "eve")))
    edited = apply_allowed(head, _allowed(HeaderOption("x-user", "bob")), ())[0]
    assert [v for n, v in edited.headers if n == "x-user"] == ["bob"]


def test_request_edits_apply_in_order_then_the_removals() -> None:
    forwarded = _forwarded(
        HeaderOption("x-new", "1", None, ADD_IF_ABSENT),
        HeaderOption("x-new", "2", None, ADD_IF_ABSENT),  # present by now: not added
        HeaderOption("x-new", "3", True),
        HeaderOption("x-gone", "g"),
        remove=("x-gone", "Accept"),
    )
    assert forwarded == (("x-user", "mallory"), ("x-tag", "a"), ("x-new", "1,3"))


def test_an_ok_answers_response_headers_are_added_unless_their_option_says_otherwise() -> None:
    allowed = _allowed(
        response=(
            HeaderOption("set-cookie", "a=1"),  # neither set: APPEND_IF_EXISTS_OR_ADD, one more value
            HeaderOption("set-cookie", "b=2", True),
            HeaderOption("cache-control", "no-store", False),
            HeaderOption("x-seen", "1", None, ADD_IF_ABSENT),
            HeaderOption("server", "authz", None, OVERWRITE_IF_EXISTS),
            HeaderOption("x-absent", "1", None, OVERWRITE_IF_EXISTS),
            HeaderOption("vary", "accept", None, OVERWRITE_IF_EXISTS_OR_ADD),
        )
    )
    backend = [("set-cookie", "z=0"), ("cache-control", "max-age=60"), ("x-seen", "0"), ("server", "app")]
    assert apply_header_ops(backend, allowed.downstream) == [
        ("set-cookie", "z=0"),
        ("cache-control", "no-store"),
        ("x-seen", "0"),
        ("server", "authz"),
        ("set-cookie", "a=1"),
        ("set-cookie", "b=2"),
        ("vary", "accept"),
    ]


def test_a_denials_headers_are_written_in_order_on_the_answer() -> None:
    answer = CheckAnswer(
        7,
        denied_status=401,
        denied_headers=(
            HeaderOption("set-cookie", "a=1"),
            HeaderOption("set-cookie", "b=2"),
            HeaderOption("www-authenticate", "Basic", False),
            HeaderOption("www-authenticate", "Bearer", False),
            HeaderOption("x-reason", "r1", None, ADD_IF_ABSENT),
            HeaderOption("x-reason", "r2", None, ADD_IF_ABSENT),
            HeaderOption("x-absent", "1", None, OVERWRITE_IF_EXISTS),
            HeaderOption("content-length", "99"),  # the waypoint frames its answer itself
        ),
    )
    denied = judge_grpc_answer(GRPC, decode_check_response(encode_check_response(answer)))
    assert isinstance(denied, CheckDenied) and denied.status == 401
    assert denied.headers == (
        ("set-cookie", "a=1"),
        ("set-cookie", "b=2"),
        ("www-authenticate", "Bearer"),
        ("x-reason", "r1"),
    )


def test_the_options_map_to_edits_one_for_one() -> None:
    assert request_edit(HeaderOption("X-A", "1", True)) == RequestEdit("x-a", "1", Write.JOIN)
    assert request_edit(HeaderOption("x-a", "1", None, OVERWRITE_IF_EXISTS)).write is Write.OVERWRITE_IF_EXISTS
    assert response_op(HeaderOption("X-A", "1")) == HeaderOp(HeaderAction.APPEND, "x-a", "1")
    assert response_op(HeaderOption("x-a", "1", None, -1)).action is HeaderAction.OVERWRITE


_name = st.sampled_from(["x-a", "x-b", "set-cookie"])
_edit = st.builds(RequestEdit, _name, st.text(max_size=4), st.sampled_from(Write))
_headers = st.lists(st.tuples(_name, st.text(max_size=4)), max_size=5).map(tuple)


@given(_headers, st.lists(_edit, max_size=6).map(tuple))
@settings(max_examples=300, deadline=None)
def test_an_overwrite_leaves_one_value_and_nothing_else_is_lost(
    headers: tuple[tuple[str, str], ...], edits: tuple[RequestEdit, ...]
) -> None:
    out = edit_request_headers(headers, edits)
    touched = {e.name for e in edits}
    assert [h for h in out if h[0] not in touched] == [h for h in headers if h[0] not in touched]
    if edits and edits[-1].write is Write.OVERWRITE:
        assert [v for n, v in out if n == edits[-1].name] == [edits[-1].value]
    assert len(out) <= len(headers) + len(edits)


# --- the route cache (ext_authz rule 12) ----------------------------------------------------------------------------

ECHO = BackendService("app", "echo.app.svc.cluster.local", 80)
MARKED = RouteRule("HTTPRoute/app/marked", RouteMatch(headers=(ValueMatch("x-user", "bob"),)), backends=())
REST = RouteRule("HTTPRoute/app/rest", RouteMatch(), backends=(WeightedBackend(ECHO),))
TABLE = RouteTable("app/echo.app.svc.cluster.local", 80, http=(MARKED, REST))


def test_an_edited_request_is_routed_on_its_headers_as_they_were() -> None:
    head = RequestHead("GET", "/", "svc:80", CLIENT)
    edited = apply_allowed(head, _allowed(HeaderOption("x-user", "bob")), ())[0]
    assert (edited.headers, edited.route_headers) == (AS_BOB, CLIENT)
    again = apply_allowed(edited, _allowed(HeaderOption("x-user", "carol")), ())[0]
    assert again.route_headers == CLIENT  # still the headers the route was picked on
    decision = waypoint_route(TABLE, ECHO, edited, 0.5)
    assert isinstance(decision, Forward) and decision.route == "HTTPRoute/app/rest"
    assert ("x-user", "bob") in decision.request.headers and ("x-forwarded-proto", "http") in decision.request.headers
    assert waypoint_route(TABLE, ECHO, RequestHead("GET", "/", "svc:80", AS_BOB), 0.5).route == "HTTPRoute/app/marked"


def test_an_answer_that_changes_nothing_leaves_the_route_free() -> None:
    head = RequestHead("GET", "/", "svc:80", CLIENT)
    assert apply_allowed(head, _allowed(HeaderOption("x-tag", "b", None, ADD_IF_ABSENT)), ())[0].route_headers is None
    assert apply_allowed(head, CheckAllowed(), ())[0] is head


def test_edits_the_route_match_sees_go_to_both_header_lists() -> None:
    head = RequestHead("GET", "/", "svc:80", AS_BOB, route_headers=CLIENT)
    both = head.edit_headers(lambda headers: (*headers, ("x-forwarded-for", "10.0.0.1")))
    assert both.headers[-1] == both.route_headers[-1] == ("x-forwarded-for", "10.0.0.1")  # type: ignore[index]
    assert RequestHead("GET", "/", "h").edit_headers(lambda h: (*h, ("a", "1"))).route_headers is None


def test_the_route_match_sees_the_waypoints_forwarded_proto_even_when_the_authorizer_set_one() -> None:
    https = RouteRule("HTTPRoute/app/https", RouteMatch(headers=(ValueMatch("x-forwarded-proto", "https"),)))
    plain = RouteRule("HTTPRoute/app/http", RouteMatch(headers=(ValueMatch("x-forwarded-proto", "http"),)))
    table = RouteTable("app/echo.app.svc.cluster.local", 80, http=(https, plain))
    head = RequestHead("GET", "/", "svc:80", CLIENT)
    edited = apply_allowed(head, _allowed(HeaderOption("x-forwarded-proto", "https")), ())[0]
    assert waypoint_route(table, ECHO, edited, 0.5).route == "HTTPRoute/app/http"
