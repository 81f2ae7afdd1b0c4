"""TestWaypointEnvoyFilter on loopback, through the real waypoint process: the EnvoyFilter is translated by the
control plane's code, sent in its wire form, judged by the waypoint, and applied per request. The backend sees
both headers on every request of a kept connection; a Lua response hook edits the answer; the route match sees
what a Lua filter added; a client cannot pre-empt a ``replace``; an HTTP/2 cluster merge reaches the backends
istiod would patch and no others (see :mod:`tests.integration.waypoint_rig` for the addresses)."""

from __future__ import annotations

import asyncio
import copy
import dataclasses
import json
from collections.abc import AsyncIterator
from pathlib import Path
from typing import Any

import pytest
from tests.integration.waypoint_rig import (
    ECHO_VIP,
    HttpOverTunnel,
    Rig,
    echo_of,
    h2c_backends,
    started_rig,
)
from tests.upstream_objects import waypoint_envoy_filter

from ambit.controlplane.translate.envoyfilter_routes import merge_routes
from ambit.controlplane.translate.envoyfilters import translate_envoy_filters
from ambit.model.policy import Action, Clause, Match, Policy, Rule, Scope
from ambit.model.route_matches import PathMatch, PathMatchType, RouteMatch, ValueMatch
from ambit.model.routes import (
    BackendService,
    DirectResponse,
    Fault,
    HeaderModifier,
    RequestRedirect,
    RouteRule,
    RouteTable,
    WaypointConfig,
    WeightedBackend,
)
from ambit.waypoint.settings import WaypointLimits
from ambit.xds.routes import decode_waypoint_config, pack_waypoint_config, waypoint_config_to_proto

LIMITS = WaypointLimits(max_head_bytes=16 * 1024, head_timeout=2.0, sniff_timeout=2.0, startup_wait=5.0)
ECHO = "echo.app.svc.cluster.local"
H2C = "h2c.app.svc.cluster.local"
LUA_TYPE = "type.googleapis.com/envoy.extensions.filters.http.lua.v3.Lua"


@pytest.fixture
async def rig(tmp_path: Path) -> AsyncIterator[Rig]:
    async with started_rig(tmp_path, LIMITS) as rig:
        yield rig


def configure(
    rig: Rig, *filters: dict[str, Any], tables: tuple[RouteTable, ...] = (), services: tuple[str, ...] = ()
) -> None:
    """The waypoint's config as the control plane would serve it: translated, encoded, decoded by the waypoint."""
    translated = translate_envoy_filters(filters, ["app/waypoint"], root_namespace="istio-system", proxy_version="1")
    config = WaypointConfig(
        "app/waypoint", tables, services=services, envoy_patches=translated.for_waypoint("app/waypoint")
    )
    sent = pack_waypoint_config(waypoint_config_to_proto(config))
    rig.waypoint.context.routes.replace(decode_waypoint_config("app/waypoint", sent))


def lua_filter(code: str, name: str = "lua") -> dict[str, Any]:
    upstream = waypoint_envoy_filter("waypoint", "app", name=name)
    patch = copy.deepcopy(upstream["spec"]["configPatches"][0])
    patch["patch"]["value"]["typed_config"] = {"@type": LUA_TYPE, "inlineCode": code}
    return {**upstream, "spec": {**upstream["spec"], "configPatches": [patch]}}


async def requests(
    rig: Rig, count: int, headers: list[tuple[str, str]] | None = None
) -> list[tuple[int, dict[str, str], bytes]]:
    client, stream = await rig.tunnel(f"{ECHO_VIP}:80")
    try:
        http = HttpOverTunnel(stream, host=ECHO)
        return [await http.request("GET", "/echo", headers=headers) for _ in range(count)]
    finally:
        await client.aclose()


def seen_headers(body: bytes) -> dict[str, str]:
    headers = echo_of(body)["headers"]
    assert isinstance(headers, dict)
    return headers


async def test_upstreams_filter_puts_both_headers_on_every_request(rig: Rig) -> None:
    configure(rig, waypoint_envoy_filter("waypoint", "app"))
    answers = await requests(rig, 5)
    for status, _, body in answers:
        assert status == 200, body
        headers = seen_headers(body)
        assert (headers["x-lua-inbound"], headers["x-vhost-inbound"]) == ("hello world", "hello world")
    # the inbound cluster merge patches nothing at a waypoint (istiod's behaviour): the HTTP/1.1 echo still answers
    dumped = rig.waypoint.config_dump()["routes"]["envoyFilterPatches"]  # what `proxy-config` shows
    assert dumped == {"httpFilters": ["app/inbound[0]"], "routes": ["app/inbound[1]"], "http2Backends": []}


async def test_without_the_filter_the_backend_sees_neither_header(rig: Rig) -> None:
    configure(rig)
    ((status, answer, body),) = await requests(rig, 1)
    assert status == 200 and {"x-lua-inbound", "x-vhost-inbound"}.isdisjoint(seen_headers(body))
    assert {"server", "content-type"} <= {k.lower() for k in answer}  # what the response merge below removes


async def test_a_lua_response_hook_and_a_route_merge_edit_the_answer(rig: Rig) -> None:
    code = (
        "function envoy_on_response(response_handle)\n"
        '  response_handle:headers():add("x-lua-outbound", "bye")\n'
        '  response_handle:headers():replace("x-route", "lua wins")\n'
        "end\n"
    )
    merge = waypoint_envoy_filter("waypoint", "app", name="merge")
    merge["spec"]["configPatches"] = [
        {
            "applyTo": "VIRTUAL_HOST",
            "match": {"context": "SIDECAR_INBOUND"},
            "patch": {
                "operation": "MERGE",
                "value": {
                    "response_headers_to_add": [{"header": {"key": "x-route", "value": "vhost"}}],
                    "response_headers_to_remove": ["server", "content-type"],
                },
            },
        }
    ]
    configure(rig, lua_filter(code), merge)
    ((status, headers, _),) = await requests(rig, 1)
    assert status == 200
    assert (headers["x-lua-outbound"], headers["x-route"]) == ("bye", "lua wins")
    assert "content-type" not in {k.lower() for k in headers}
    assert headers["server"] == "istio-envoy"  # the connection manager writes it after the route's edits


async def test_the_route_match_sees_what_a_lua_filter_added(rig: Rig) -> None:
    code = 'function envoy_on_request(h) h:headers():replace("x-tier", "gold") end'
    gold = RouteRule(
        "HTTPRoute/app/gold",
        RouteMatch(headers=(ValueMatch("x-tier", "gold"),)),
        direct_response=DirectResponse(418, b"gold"),
    )
    table = RouteTable(f"app/{ECHO}", 80, http=(gold,))
    configure(rig, tables=(table,))
    ((status, _, _),) = await requests(rig, 1)
    assert status == 404  # no route matched without the filter
    configure(rig, lua_filter(code), tables=(table,))
    ((status, _, body),) = await requests(rig, 1)
    assert (status, body) == (418, b"gold")


async def test_a_client_cannot_pre_empt_a_replace_and_a_removed_header_never_arrives(rig: Rig) -> None:
    code = (
        "function envoy_on_request(h)\n"
        "  h:headers():replace('x-trusted', 'waypoint') -- the client's values go\n"
        '  h:headers():remove("x-secret")\n'
        "end"
    )
    configure(rig, lua_filter(code))
    forged = [("x-trusted", "client"), ("X-Trusted", "client-2"), ("x-secret", "s3cr3t")]
    ((status, _, body),) = await requests(rig, 1, forged)
    assert status == 200
    headers = seen_headers(body)
    assert headers["x-trusted"] == "waypoint" and "x-secret" not in headers


async def test_a_filter_of_another_namespace_changes_nothing_here(rig: Rig) -> None:
    hostile = waypoint_envoy_filter("waypoint", "attacker")
    hostile["spec"]["targetRefs"][0]["namespace"] = "app"
    configure(rig, hostile)
    ((status, _, body),) = await requests(rig, 1)
    assert status == 200 and "x-lua-inbound" not in seen_headers(body)


def _cluster_filter(context: str) -> dict[str, Any]:
    obj = waypoint_envoy_filter("waypoint", "app", name="h2")
    obj["spec"]["configPatches"] = [
        {
            "applyTo": "CLUSTER",
            "match": {"context": context, "cluster": {"service": H2C}},
            "patch": {"operation": "MERGE", "value": {"http2_protocol_options": {}}},
        }
    ]
    return obj


@pytest.mark.parametrize(("context", "protocol"), [("SIDECAR_OUTBOUND", "HTTP/2.0"), ("SIDECAR_INBOUND", "HTTP/1.1")])
async def test_an_http2_cluster_merge_reaches_only_backends_the_waypoint_does_not_serve(
    rig: Rig, context: str, protocol: str
) -> None:
    """The echo Service is served by this waypoint; its route sends everything to the h2c Service, which the
    waypoint does not serve (an outbound cluster in istiod's terms): only an outbound merge upgrades it."""
    to_h2c = RouteRule(
        "HTTPRoute/app/to-h2c", RouteMatch(), backends=(WeightedBackend(BackendService("app", H2C, 80)),)
    )
    tables = (RouteTable(f"app/{ECHO}", 80, http=(to_h2c,)),)
    async with h2c_backends(rig) as backends:
        configure(rig, _cluster_filter(context), tables=tables, services=(f"app/{ECHO}",))
        answers = await requests(rig, 2)
    seen = [p for b in backends for p in b.protocols]
    assert seen == [protocol, protocol]
    if protocol == "HTTP/2.0":
        assert [(s, json.loads(b)["proto"]) for s, _, b in answers] == [(200, "HTTP/2.0")] * 2
    else:
        assert [s for s, _, _ in answers] == [505, 505]  # the h2c server refuses HTTP/1.1


LOCAL_LUA = (
    "function envoy_on_response(response_handle)\n"
    '  response_handle:headers():add("x-lua-outbound", "bye")\n'
    '  response_handle:headers():replace("content-type", "text/lua")\n'
    "end\n"
)


def _vhost_merge() -> dict[str, Any]:
    merge = waypoint_envoy_filter("waypoint", "app", name="merge")
    merge["spec"]["configPatches"] = [
        {
            "applyTo": "VIRTUAL_HOST",
            "match": {"context": "SIDECAR_INBOUND"},
            "patch": {
                "operation": "MERGE",
                "value": {"response_headers_to_add": [{"header": {"key": "x-route", "value": "vhost"}}]},
            },
        }
    ]
    return merge


def _local_answers_table() -> RouteTable:
    def on(path: str, **actions: Any) -> RouteRule:
        match = RouteMatch(path=PathMatch(PathMatchType.EXACT, path))
        return RouteRule(f"HTTPRoute/app/{path.strip('/')}", match, **actions)

    return RouteTable(
        f"app/{ECHO}",
        80,
        http=(
            on("/direct", direct_response=DirectResponse(418, b"short")),
            on("/redirect", redirect=RequestRedirect(hostname="elsewhere.example", status_code=301)),
            on("/missing", backends=(WeightedBackend(BackendService("app", "gone.app.svc.cluster.local", 80)),)),
            on("/nobody", backends=(WeightedBackend(None),)),
            on("/abort", fault=Fault(abort_status=503, abort_percent=100.0)),
        ),
    )


async def _answer(rig: Rig, path: str) -> tuple[int, dict[str, str]]:
    client, stream = await rig.tunnel(f"{ECHO_VIP}:80")
    try:
        status, headers, _ = await HttpOverTunnel(stream, host=ECHO).request("GET", path)
        return status, {k.lower(): v for k, v in headers.items()}
    finally:
        await client.aclose()


@pytest.mark.parametrize(
    ("path", "status", "route_level"),
    [
        # the router answers for a matched route, finalizing the answer with the route-level headers
        ("/direct", 418, True),  # a route's direct response
        ("/redirect", 301, True),  # a route's redirect
        ("/missing", 500, True),  # a backend the state does not know (istiod: cluster not found / 500)
        ("/nobody", 500, True),  # a backendRef that resolved to nothing
        # no route matched: nothing to finalize with, but the Lua filter still encodes the 404
        ("/none", 404, False),
        # the fault filter (before the router) answers, and the filter manager finalizes its local reply with the
        # stream's route, as it does every local reply of a routed stream
        ("/abort", 503, True),
    ],
)
async def test_answers_the_waypoint_makes_itself_get_the_edits_envoy_runs_on_local_replies(
    rig: Rig, path: str, status: int, route_level: bool
) -> None:
    """Exchange rule 7: Envoy encodes a local reply through every encoder filter (so the Lua response hook always
    runs), and finalizes every local reply of a stream whose route matched with that route's headers (the
    virtual-host and route-configuration merges): the router's own answers and a fault abort alike."""
    configure(rig, lua_filter(LOCAL_LUA), _vhost_merge(), tables=(_local_answers_table(),))
    got, headers = await _answer(rig, path)
    assert got == status
    assert headers["x-lua-outbound"] == "bye"
    assert headers.get("content-type", "text/lua") == "text/lua"  # replaced where the answer had one
    assert ("x-route" in headers) is route_level, headers


async def test_a_denial_gets_the_lua_edits_and_the_route_level_ones_of_the_route_it_matched(rig: Rig) -> None:
    """RBAC comes before the Lua filter in istiod's waypoint chain; Envoy still encodes its 403 through the Lua
    filter, and its filter manager finalizes the local reply with the route the connection manager matched when
    the request arrived (here the destination's default route), so the virtual-host merge is on it too."""
    translated = translate_envoy_filters(
        [lua_filter(LOCAL_LUA), _vhost_merge()], ["app/waypoint"], root_namespace="istio-system", proxy_version="1"
    )
    deny = Policy("deny-all", "app", Scope.WAYPOINT, Action.DENY, (Rule((Clause((Match(methods=("GET",)),)),)),))
    config = WaypointConfig("app/waypoint", policies=(deny,), envoy_patches=translated.for_waypoint("app/waypoint"))
    rig.waypoint.context.routes.replace(
        decode_waypoint_config("app/waypoint", pack_waypoint_config(waypoint_config_to_proto(config)))
    )
    status, headers = await _answer(rig, "/echo")
    assert status == 403
    assert headers["x-lua-outbound"] == "bye" and headers["content-type"] == "text/lua"
    assert headers["x-route"] == "vhost"


ROUTE_MODIFIER = HeaderModifier(set=(("x-httproute", "set"), ("content-type", "text/html")), add=(("x-added", "1"),))


@pytest.mark.parametrize(
    ("path", "status", "modified"),
    [
        ("/direct", 418, True),
        ("/redirect", 301, True),
        ("/missing", 500, True),
        ("/nobody", 500, True),
        ("/abort", 503, True),
        ("/none", 404, False),  # no rule matched: no route to take a modifier from
    ],
)
async def test_an_httproute_response_modifier_is_on_the_waypoint_s_own_answers_as_envoy_finalizes_them(
    rig: Rig, path: str, status: int, modified: bool
) -> None:
    """Exchange rule 7: istiod makes a rule's ResponseHeaderModifier the route's ``response_headers_to_add``, which
    Envoy applies to every local reply of the matched route, before it sets the body's content-type."""
    table = _local_answers_table()
    table = dataclasses.replace(
        table, http=tuple(dataclasses.replace(r, response_headers=ROUTE_MODIFIER) for r in table.http)
    )
    configure(rig, tables=(table,))
    got, headers = await _answer(rig, path)
    assert got == status
    assert (headers.get("x-httproute"), headers.get("x-added")) == (("set", "1") if modified else (None, None))
    if modified and path in ("/direct", "/abort"):  # an answer with a body keeps its content-type
        assert headers["content-type"] == "text/plain", headers
    if path == "/missing":  # Envoy's cluster-not-found answer has no body, so nothing replaces the route's value
        assert headers["content-type"] == "text/html", headers


async def test_a_denial_of_a_request_that_matches_a_rule_carries_the_rule_s_response_modifier(rig: Rig) -> None:
    deny = Policy("deny-all", "app", Scope.WAYPOINT, Action.DENY, (Rule((Clause((Match(methods=("GET",)),)),)),))
    table = _local_answers_table()
    table = dataclasses.replace(
        table, http=tuple(dataclasses.replace(r, response_headers=ROUTE_MODIFIER) for r in table.http)
    )
    config = WaypointConfig("app/waypoint", (table,), policies=(deny,))
    rig.waypoint.context.routes.replace(
        decode_waypoint_config("app/waypoint", pack_waypoint_config(waypoint_config_to_proto(config)))
    )
    status, headers = await _answer(rig, "/direct")
    assert status == 403 and headers["x-httproute"] == "set" and headers["content-type"] == "text/plain"
    status, headers = await _answer(rig, "/none")  # denied, and no rule matches it: nothing to finalize with
    assert status == 403 and "x-httproute" not in headers


async def test_a_local_answer_without_filters_is_unchanged(rig: Rig) -> None:
    configure(rig, tables=(_local_answers_table(),))
    status, headers = await _answer(rig, "/direct")
    assert status == 418 and headers["content-type"] == "text/plain"
    assert {"x-lua-outbound", "x-route"}.isdisjoint(headers)


async def test_an_http_route_merge_gives_a_named_route_a_timeout_and_a_header(rig: Rig) -> None:
    """HTTP_ROUTE MERGE, made by the control plane on the rule named ``main`` (envoyfilter_routes): the merged
    timeout answers 504 for the slow path, and the merged header reaches the backend on the others."""
    main = RouteRule(
        "HTTPRoute/app/echo",
        RouteMatch(),
        backends=(WeightedBackend(BackendService("app", ECHO, 80)),),
        rule_name="main",
    )
    table = RouteTable(f"app/{ECHO}", 80, http=(main,))
    patch = waypoint_envoy_filter("waypoint", "app", name="route")
    patch["spec"]["configPatches"] = [
        {
            "applyTo": "HTTP_ROUTE",
            "match": {
                "context": "SIDECAR_INBOUND",
                "routeConfiguration": {"portNumber": 80, "vhost": {"route": {"name": "main", "action": "ROUTE"}}},
            },
            "patch": {
                "operation": "MERGE",
                "value": {
                    "route": {"timeout": "0.3s"},
                    "request_headers_to_add": [{"header": {"key": "x-route-merge", "value": "yes"}}],
                },
            },
        }
    ]
    translated = translate_envoy_filters([patch], ["app/waypoint"], root_namespace="istio-system", proxy_version="1")
    assert translated.notes == ()
    config = WaypointConfig("app/waypoint", merge_routes((table,), translated.route_merges_for("app/waypoint")))
    rig.waypoint.context.routes.replace(
        decode_waypoint_config("app/waypoint", pack_waypoint_config(waypoint_config_to_proto(config)))
    )
    ((status, _, body),) = await requests(rig, 1)
    assert status == 200 and seen_headers(body)["x-route-merge"] == "yes"
    client, stream = await rig.tunnel(f"{ECHO_VIP}:80")
    try:
        started = asyncio.get_running_loop().time()
        status, _, _ = await HttpOverTunnel(stream, host=ECHO).request("GET", "/slow")
        assert status == 504 and asyncio.get_running_loop().time() - started < 4.0  # the backend takes 5 s
    finally:
        await client.aclose()


async def test_an_http_route_merge_on_the_default_route_of_a_service_without_routes(rig: Rig) -> None:
    """No route attached: istiod's route is ``default``; the merged timeout reaches it and routing is unchanged."""
    patch = waypoint_envoy_filter("waypoint", "app", name="default-route")
    patch["spec"]["configPatches"] = [
        {
            "applyTo": "HTTP_ROUTE",
            "match": {"context": "SIDECAR_INBOUND", "routeConfiguration": {"vhost": {"route": {"name": "default"}}}},
            "patch": {"operation": "MERGE", "value": {"route": {"timeout": "0.3s"}}},
        }
    ]
    translated = translate_envoy_filters([patch], ["app/waypoint"], root_namespace="istio-system", proxy_version="1")
    tables = merge_routes((RouteTable(f"app/{ECHO}", 80),), translated.route_merges_for("app/waypoint"))
    config = WaypointConfig("app/waypoint", tables)
    rig.waypoint.context.routes.replace(
        decode_waypoint_config("app/waypoint", pack_waypoint_config(waypoint_config_to_proto(config)))
    )
    ((status, _, body),) = await requests(rig, 1)
    assert status == 200 and seen_headers(body)
    client, stream = await rig.tunnel(f"{ECHO_VIP}:80")
    try:
        status, _, _ = await HttpOverTunnel(stream, host=ECHO).request("GET", "/slow")
        assert status == 504
    finally:
        await client.aclose()
