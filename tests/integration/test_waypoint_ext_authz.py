"""AuthorizationPolicy CUSTOM in the waypoint process on loopback: requests matching the policy's rules are checked
with an HTTP authorizer that behaves as Istio's ``samples/extauthz`` server (allow with ``x-ext-authz: allow``,
else 403 naming the header), reached through the mesh like any backend (the rig's ``h2c`` Service, HBONE to its
endpoints); then with a gRPC authorizer, the lab's ``ext-authz`` app; see :mod:`ambit.waypoint.ext_authz`."""

from __future__ import annotations

import asyncio
import hashlib
import json
from collections.abc import AsyncIterator
from pathlib import Path

import pytest
from aiohttp import web
from tests.integration.waypoint_rig import (
    ECHO_VIP,
    H2C_TARGET_PORT,
    RAW_VIP,
    HttpOverTunnel,
    Rig,
    free_port,
    http_get,
    read_until_eof,
    started_rig,
)

from ambit.lab.ext_authz_app import serve
from ambit.model.extauthz import ExtAuthzProvider, HeaderPattern, ProviderKind
from ambit.model.policy import Action, Clause, Match, Policy, Rule, Scope, StringMatch
from ambit.model.route_matches import RouteMatch, ValueMatch
from ambit.model.routes import BackendService, DirectResponse, RouteRule, RouteTable, WaypointConfig, WeightedBackend
from ambit.proxy.hbone_client import TunnelRefusedError
from ambit.waypoint.settings import WaypointLimits

LIMITS = WaypointLimits(max_head_bytes=8 * 1024, head_timeout=0.5, sniff_timeout=0.5, startup_wait=5.0)
DENY_BODY = "denied by ext_authz for not found header `x-ext-authz: allow` in the request"


class Authorizer:
    """The sample's HTTP behaviour, plus ``x-mode: slow`` (answers after 5 s) and ``x-mode: boom`` (500)."""

    def __init__(self) -> None:
        self.checks: list[tuple[str, str, dict[str, str]]] = []
        self.bodies: list[bytes] = []

    async def start(self) -> int:
        app = web.Application()
        app.router.add_route("*", "/{tail:.*}", self._check)
        self._runner = web.AppRunner(app, access_log=None, shutdown_timeout=0.1)
        await self._runner.setup()
        port = free_port()
        await web.TCPSite(self._runner, "127.0.0.1", port).start()
        return port

    async def _check(self, request: web.Request) -> web.Response:
        self.checks.append((request.method, request.path_qs, {k.lower(): v for k, v in request.headers.items()}))
        self.bodies.append(await request.read())
        mode = request.headers.get("x-mode", "")
        if mode == "slow":
            await asyncio.sleep(5)
        if mode == "boom":
            return web.Response(status=500, text="boom")
        received = f"{request.method} {request.host}{request.path_qs}"
        if request.headers.get("x-ext-authz") == "allow":
            return web.Response(headers={"x-ext-authz-check-result": "allowed", "x-ext-authz-check-received": received})
        return web.Response(
            status=403,
            text=DENY_BODY,
            headers={"x-ext-authz-check-result": "denied", "x-ext-authz-check-received": received},
        )

    async def aclose(self) -> None:
        await self._runner.cleanup()


@pytest.fixture
async def rig(tmp_path: Path) -> AsyncIterator[tuple[Rig, Authorizer]]:
    authorizer = Authorizer()
    port = await authorizer.start()
    try:
        async with started_rig(tmp_path, LIMITS) as rig:
            for endpoint in rig.endpoints:  # the h2c Service's endpoints answer on the authorizer
                endpoint.extra[H2C_TARGET_PORT] = port
            yield rig, authorizer
    finally:
        await authorizer.aclose()


def provider(**fields: object) -> ExtAuthzProvider:
    base: dict[str, object] = {
        "name": "sample-ext-authz-http",
        "kind": ProviderKind.HTTP,
        "service": "app/h2c.app.svc.cluster.local",
        "port": 80,
        "path_prefix": "/check",
        "include_request_headers": (HeaderPattern("x-ext-authz"), HeaderPattern("x-mode")),
        "headers_to_upstream_on_allow": (HeaderPattern("x-ext-authz-check-result"),),
        "headers_to_downstream_on_allow": (HeaderPattern("x-ext-authz-check-received"),),
    }
    return ExtAuthzProvider(**(base | fields))  # type: ignore[arg-type]


def configure(rig: Rig, ext: ExtAuthzProvider, *others: Policy) -> None:
    rules = (Rule((Clause((Match(paths=(StringMatch.prefix("/echo"),)),)),)),)
    custom = Policy("ext-authz", "app", Scope.WAYPOINT, Action.CUSTOM, rules, ext_authz=ext)
    rig.waypoint.context.routes.replace(WaypointConfig("app/waypoint", policies=(custom, *others)))


async def call(
    rig: Rig, path: str, headers: list[tuple[str, str]] | None = None, body: bytes = b""
) -> tuple[int, dict[str, str], bytes]:
    client, stream = await rig.tunnel(f"{ECHO_VIP}:80")
    try:
        return await HttpOverTunnel(stream).request("POST" if body else "GET", path, body, headers=headers)
    finally:
        await client.aclose()


async def test_the_sample_authorizer_allows_and_denies_by_its_header(
    rig: tuple[Rig, Authorizer], caplog: pytest.LogCaptureFixture
) -> None:
    waypoint, authorizer = rig
    caplog.set_level("INFO", logger="access")
    configure(waypoint, provider())

    status, headers, body = await call(waypoint, "/echo?x=1", [("x-ext-authz", "allow"), ("cookie", "c")])
    assert status == 200
    echoed = json.loads(body)["headers"]
    assert echoed["x-ext-authz-check-result"] == "allowed"  # headersToUpstreamOnAllow
    assert headers["x-ext-authz-check-received"] == "GET echo.app.svc.cluster.local/check/echo?x=1"  # OnAllow down
    method, path, sent = authorizer.checks[-1]
    assert (method, path, sent["host"], sent["x-ext-authz"], sent["content-length"]) == (
        "GET",
        "/check/echo?x=1",
        "echo.app.svc.cluster.local",
        "allow",
        "0",
    )
    assert "cookie" not in sent  # only the headers the provider names

    status, headers, body = await call(waypoint, "/echo", [("x-ext-authz", "deny")])
    assert (status, body.decode()) == (403, DENY_BODY)
    assert headers["x-ext-authz-check-result"] == "denied"  # every answer header goes down with a denial
    lines = [r.getMessage() for r in caplog.records if r.getMessage().startswith("request ")]
    assert any("response_code=403" in line and "response_flags=UAEX" in line for line in lines), lines
    _, metrics = await http_get(f"http://127.0.0.1:{waypoint.settings.stats_port}/metrics")
    assert any(
        line.startswith("istio_requests_total{") and 'response_flags="UAEX"' in line and 'response_code="403"' in line
        for line in metrics.splitlines()
    ), metrics


async def test_requests_outside_the_custom_rules_are_not_checked(rig: tuple[Rig, Authorizer]) -> None:
    waypoint, authorizer = rig
    configure(waypoint, provider())
    status, _, _ = await call(waypoint, "/other")
    assert status == 404 and authorizer.checks == []  # the echo server has no /other: it was forwarded unchecked


async def test_an_allowed_request_still_meets_the_deny_policies(rig: tuple[Rig, Authorizer]) -> None:
    waypoint, _ = rig
    deny = Policy("deny-all", "app", Scope.WAYPOINT, Action.DENY, (Rule(),))
    configure(waypoint, provider(), deny)
    status, _, body = await call(waypoint, "/echo", [("x-ext-authz", "allow")])
    assert (status, body) == (403, b"RBAC: access denied")


async def test_errors_answer_status_on_error_unless_fail_open(rig: tuple[Rig, Authorizer]) -> None:
    waypoint, _ = rig
    configure(waypoint, provider(status_on_error=503))
    status, _, body = await call(waypoint, "/echo", [("x-ext-authz", "allow"), ("x-mode", "boom")])
    assert (status, body) == (503, b"")
    configure(waypoint, provider(timeout=0.3))
    status, _, body = await call(waypoint, "/echo", [("x-ext-authz", "allow"), ("x-mode", "slow")])
    assert (status, body) == (403, b"")
    configure(waypoint, provider(timeout=0.3, fail_open=True))
    status, _, _ = await call(waypoint, "/echo", [("x-ext-authz", "deny"), ("x-mode", "slow")])
    assert status == 200  # failOpen: the authorizer's silence lets it through
    configure(waypoint, provider(service="app/nothing.app.svc.cluster.local"))
    status, _, _ = await call(waypoint, "/echo", [("x-ext-authz", "allow")])
    assert status == 403  # nowhere to ask: an error


async def test_the_body_goes_to_the_authorizer_and_on_to_the_backend_whole(rig: tuple[Rig, Authorizer]) -> None:
    """includeRequestBodyInCheck: the body read ahead for the check is handed on untouched."""
    waypoint, authorizer = rig
    allow = [("x-ext-authz", "allow")]
    body_header = (*provider().include_request_headers, HeaderPattern("x-envoy-auth-partial-body"))
    configure(waypoint, provider(max_request_bytes=16, include_request_headers=body_header))
    status, _, body = await call(waypoint, "/echo", allow, b"hello")
    assert status == 200 and json.loads(body)["sha256"] == hashlib.sha256(b"hello").hexdigest()
    assert authorizer.bodies[-1] == b"hello"
    assert authorizer.checks[-1][2]["x-envoy-auth-partial-body"] == "false"

    long = bytes(range(100))
    checks = len(authorizer.checks)
    status, _, body = await call(waypoint, "/echo", allow, long)
    assert (status, body, len(authorizer.checks)) == (413, b"Payload Too Large", checks)  # not asked

    configure(waypoint, provider(max_request_bytes=16, allow_partial_message=True, include_request_headers=body_header))
    status, _, body = await call(waypoint, "/echo", allow, long)
    assert status == 200 and json.loads(body)["sha256"] == hashlib.sha256(long).hexdigest()
    assert authorizer.bodies[-1] == long[:16]
    assert authorizer.checks[-1][2]["x-envoy-auth-partial-body"] == "true"


# --- a gRPC provider: the lab's ext-authz app (Istio's sample) as the authorizer ----------------------------------


async def test_the_route_is_picked_on_the_headers_before_the_check(rig: tuple[Rig, Authorizer]) -> None:
    """istiod leaves ``clear_route_cache`` off: the authorizer's header reaches the backend but not the route match
    (ext_authz rule 12)."""
    waypoint, _ = rig
    echo = "echo.app.svc.cluster.local"
    marked = RouteRule(
        "HTTPRoute/app/marked",
        RouteMatch(headers=(ValueMatch("x-ext-authz-check-result", "allowed"),)),
        direct_response=DirectResponse(418, b"marked"),
    )
    rest = RouteRule("HTTPRoute/app/rest", RouteMatch(), backends=(WeightedBackend(BackendService("app", echo, 80)),))
    rules = (Rule((Clause((Match(paths=(StringMatch.prefix("/echo"),)),)),)),)
    custom = Policy("ext-authz", "app", Scope.WAYPOINT, Action.CUSTOM, rules, ext_authz=provider())
    table = RouteTable(f"app/{echo}", 80, http=(marked, rest))
    waypoint.waypoint.context.routes.replace(WaypointConfig("app/waypoint", (table,), policies=(custom,)))
    status, _, body = await call(waypoint, "/echo", [("x-ext-authz", "allow")])
    assert status == 200  # the route for the headers as they arrived, not the one the authorizer's header would pick
    assert json.loads(body)["headers"]["x-ext-authz-check-result"] == "allowed"  # yet the backend sees it
    status, _, body = await call(waypoint, "/echo", [("x-ext-authz", "allow"), ("x-ext-authz-check-result", "allowed")])
    assert (status, body) == (418, b"marked")  # the client's own header picks it, before the authorizer's replaces it


@pytest.fixture
async def grpc_rig(tmp_path: Path, request: pytest.FixtureRequest) -> AsyncIterator[Rig]:
    """The rig with the lab's authorizer on the h2c Service; it allows gRPC checks from the service account
    ``request.param`` (default none) when no ``x-ext-authz`` header decides."""
    account = getattr(request, "param", "nobody")
    started: asyncio.Future[tuple[int, int]] = asyncio.get_running_loop().create_future()
    server = asyncio.create_task(serve(0, 0, host="127.0.0.1", allowed_account=account, started=started))
    try:
        _, grpc_port = await asyncio.wait_for(started, 10)
        async with started_rig(tmp_path, LIMITS) as rig:
            for endpoint in rig.endpoints:
                endpoint.extra[H2C_TARGET_PORT] = grpc_port
            yield rig
    finally:
        server.cancel()
        await asyncio.gather(server, return_exceptions=True)


def grpc_provider(**fields: object) -> ExtAuthzProvider:
    base: dict[str, object] = {
        "name": "sample-ext-authz-grpc",
        "kind": ProviderKind.GRPC,
        "service": "h2c.app.svc.cluster.local",
        "port": 80,
        "timeout": 5.0,
    }
    return ExtAuthzProvider(**(base | fields))  # type: ignore[arg-type]


async def test_a_grpc_authorizer_allows_and_denies_as_the_sample(
    grpc_rig: Rig, caplog: pytest.LogCaptureFixture
) -> None:
    caplog.set_level("INFO", logger="access")
    configure(grpc_rig, grpc_provider())
    status, _, body = await call(grpc_rig, "/echo", [("x-ext-authz", "allow")])
    assert status == 200
    echoed = json.loads(body)["headers"]
    assert echoed["x-ext-authz-check-result"] == "allowed"  # ok_response.headers go upstream
    assert echoed["x-ext-authz-check-received"] == "GET echo.app.svc.cluster.local/echo"

    status, headers, body = await call(grpc_rig, "/echo", [("x-ext-authz", "no")])
    assert (status, body.decode()) == (403, DENY_BODY)
    assert headers["x-ext-authz-check-result"] == "denied"
    lines = [r.getMessage() for r in caplog.records if r.getMessage().startswith("request ")]
    assert any("response_code=403" in line and "response_flags=UAEX" in line for line in lines), lines


async def test_a_grpc_authorizer_that_cannot_answer_is_an_error(grpc_rig: Rig) -> None:
    configure(grpc_rig, grpc_provider(service="app/nothing.app.svc.cluster.local", status_on_error=502))
    status, _, body = await call(grpc_rig, "/echo", [("x-ext-authz", "allow")])
    assert (status, body) == (502, b"")
    configure(grpc_rig, grpc_provider(service="app/nothing.app.svc.cluster.local", fail_open=True))
    assert (await call(grpc_rig, "/echo", [("x-ext-authz", "no")]))[0] == 200


@pytest.mark.parametrize("grpc_rig", ["client"], indirect=True)
async def test_a_tcp_connection_is_checked_by_a_grpc_authorizer_by_its_peer(grpc_rig: Rig) -> None:
    """Envoy's network ext_authz: the sample allows the source service account ``client``; an HTTP provider is not
    asked about TCP (istiod ignores it on a TCP chain)."""
    configure(grpc_rig, grpc_provider())
    assert await tcp_echo(grpc_rig) == "relayed"
    configure(grpc_rig, grpc_provider(service="app/nothing.app.svc.cluster.local"))
    assert await tcp_echo(grpc_rig) == "refused"  # an error, not failOpen
    configure(grpc_rig, provider(service="app/nothing.app.svc.cluster.local"))
    assert await tcp_echo(grpc_rig) == "relayed"  # an HTTP provider: not asked


async def test_a_tcp_connection_the_grpc_authorizer_denies_is_refused_with_uaex(
    grpc_rig: Rig, caplog: pytest.LogCaptureFixture
) -> None:
    caplog.set_level("INFO", logger="access")
    configure(grpc_rig, grpc_provider())
    assert await tcp_echo(grpc_rig) == "refused"
    messages = [r.getMessage() for r in caplog.records]
    assert any("connection failed" in m and "ext_authz_denied" in m for m in messages), messages
    _, metrics = await http_get(f"http://127.0.0.1:{grpc_rig.settings.stats_port}/metrics")
    assert any(line.startswith("istio_tcp_") and 'response_flags="UAEX"' in line for line in metrics.splitlines()), (
        metrics
    )


async def tcp_echo(rig: Rig) -> str:
    """One TCP connection to the raw Service through the waypoint: "relayed" or "refused"."""
    client = await rig.client()
    try:
        stream = await client.open_tunnel(f"{RAW_VIP}:80", [])
        await stream.write(b"GET /echo HTTP/1.0\r\n\r\n")
        answer = await read_until_eof(stream)
        return "relayed" if answer.startswith(b"HTTP/1.") else f"odd answer {answer[:40]!r}"
    except TunnelRefusedError:
        return "refused"
    finally:
        await client.aclose()
