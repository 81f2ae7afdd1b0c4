"""An HTTPRoute's CORS filter at a real waypoint: the route is translated by the control plane's pure rule converter
against the rig's ``echo`` Service and installed in a running waypoint; requests then go over HBONE through it.
HTTPRouteCORS's first route: an allowed preflight is answered by the waypoint with the expose headers too, an
unmatched preflight is answered without ``Access-Control-Allow-Origin`` and never reaches an endpoint (istiod's
IGNORE), and a simple request from a wildcard-matched origin reaches the endpoint and gets the headers back."""

from __future__ import annotations

from collections.abc import AsyncIterator
from pathlib import Path

import pytest
import yaml
from tests.integration.waypoint_rig import ECHO_VIP, HttpOverTunnel, Rig, echo_of, started_rig

from ambit.controlplane.translate.routerules import convert_route
from ambit.model.routes import BackendService, RouteTable, WaypointConfig
from ambit.waypoint.settings import WaypointLimits

LIMITS = WaypointLimits(max_head_bytes=8 * 1024, head_timeout=0.5, sniff_timeout=0.5, startup_wait=5.0)
ECHO = "app/echo.app.svc.cluster.local"
ROUTE = """apiVersion: gateway.networking.k8s.io/v1
kind: HTTPRoute
metadata: {name: cors, namespace: app}
spec:
  parentRefs: [{group: "", kind: Service, name: echo, port: 80}]
  rules:
  - filters:
    - type: CORS
      cors:
        allowOrigins: ["https://www.foo.com", "https://*.bar.com"]
        allowMethods: [GET, OPTIONS]
        allowHeaders: [x-header-1, x-header-2]
        exposeHeaders: [x-header-3, x-header-4]
        allowCredentials: true
        maxAge: 3600
    backendRefs: [{name: echo, port: 80}]
"""


@pytest.fixture
async def rig(tmp_path: Path) -> AsyncIterator[Rig]:
    async with started_rig(tmp_path, LIMITS) as rig:
        yield rig


def install(rig: Rig) -> None:
    def lookup(group: str, kind: str, name: str, namespace: str, route_kind: str) -> BackendService | str:
        return BackendService("app", f"{name}.app.svc.cluster.local", 80) if name == "echo" else "BackendNotFound"

    converted = convert_route("HTTPRoute", yaml.safe_load(ROUTE), lookup)
    assert not converted.problems
    table = RouteTable(ECHO, 80, http=tuple(entry.rule for entry in sorted(converted.http, key=lambda e: e.key)))
    rig.waypoint.context.routes.replace(WaypointConfig("app/waypoint", (table,)))


def cors_headers(headers: dict[str, str]) -> dict[str, str]:
    return {k: v for k, v in headers.items() if k.startswith("access-control-")}


async def test_an_httproute_cors_filter_answers_preflights_and_decorates_answers(rig: Rig) -> None:
    install(rig)
    client, stream = await rig.tunnel(f"{ECHO_VIP}:80")
    http = HttpOverTunnel(stream)
    asked = [("access-control-request-method", "GET"), ("access-control-request-headers", "x-header-1")]
    allowed, other = ("origin", "https://www.foo.com"), ("origin", "https://foobar.com")

    status, headers, body = await http.request("OPTIONS", "/echo", headers=[allowed, *asked])
    assert (status, body) == (200, b"")
    assert cors_headers(headers) == {
        "access-control-allow-origin": "https://www.foo.com",
        "access-control-allow-credentials": "true",
        "access-control-allow-methods": "GET,OPTIONS",
        "access-control-allow-headers": "x-header-1,x-header-2",
        "access-control-max-age": "3600",
        "access-control-expose-headers": "x-header-3,x-header-4",
    }

    status, headers, body = await http.request("OPTIONS", "/echo", headers=[other, *asked])
    assert (status, body) == (200, b"")
    assert "access-control-allow-origin" not in headers and "access-control-expose-headers" not in headers
    assert not any(e.seen for e in rig.endpoints)  # both preflights answered by the waypoint itself

    status, headers, body = await http.request("GET", "/echo", headers=[("origin", "https://xpto.www.bar.com")])
    assert status == 200 and echo_of(body)["endpoint"] in {"echo-1", "echo-2"}
    assert cors_headers(headers) == {
        "access-control-allow-origin": "https://xpto.www.bar.com",
        "access-control-allow-credentials": "true",
        "access-control-expose-headers": "x-header-3,x-header-4",
    }
    await client.aclose()
