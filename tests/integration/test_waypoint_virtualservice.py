"""VirtualServices at a real waypoint (istio TestServerRouting "set header", TestTrafficSplit's header match):
upstream's objects are translated by the control plane's pure translator against the rig's services and the
resulting tables installed in a running waypoint; requests then go over HBONE through it to real endpoints."""

from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator
from pathlib import Path
from typing import Any

import pytest
import yaml
from tests.integration.waypoint_rig import (
    ECHO_VIP,
    HttpOverTunnel,
    Rig,
    echo_of,
    mesh_config,
    started_rig,
)

from ambit.controlplane.translate.virtualservices import RouteBlock, translate_virtual_services
from ambit.model.route_matches import ValueMatch
from ambit.model.routes import RouteTable, WaypointConfig
from ambit.waypoint.settings import WaypointLimits

LIMITS = WaypointLimits(max_head_bytes=8 * 1024, head_timeout=0.5, sniff_timeout=0.5, startup_wait=5.0)
ECHO = "app/echo.app.svc.cluster.local"

# Upstream's objects (tests/integration/ambient/baseline_test.go) with {{.Destination}} = echo, in namespace app.
SET_HEADER = """apiVersion: networking.istio.io/v1
kind: VirtualService
metadata:
  name: route
  namespace: app
spec:
  hosts:
  - "echo"
  http:
  - headers:
      request:
        add:
          istio-custom-header: user-defined-value
    route:
    - destination:
        host: "echo"
"""
# TestTrafficSplit's shape; the subsets become two Services with one endpoint each (the subset endpoint filter is
# the DestinationRule work), so that where a request went shows which rule took it.
HEADER_SPLIT = """apiVersion: networking.istio.io/v1
kind: VirtualService
metadata:
  name: route
  namespace: app
spec:
  hosts:
  - "echo"
  http:
  - match:
    - headers:
        user:
          exact: istio-custom-user
    route:
    - destination:
        host: "raw-two"
  - route:
    - destination:
        host: "tcp"
"""


@pytest.fixture
async def rig(tmp_path: Path) -> AsyncIterator[Rig]:
    async with started_rig(tmp_path, LIMITS) as rig:
        yield rig


def install(rig: Rig, text: str) -> RouteTable:
    """``text`` translated against the rig's services (each bound to its waypoint) and installed in the waypoint."""
    obj: dict[str, Any] = yaml.safe_load(text)
    services = mesh_config().services
    bound = {s.key: "app/waypoint" for s in services if s.waypoint is not None}
    routes = translate_virtual_services([obj], services, bound)
    blocks: tuple[RouteBlock, ...] = routes.http[(ECHO, 80)]
    table = RouteTable(ECHO, 80, http=tuple(rule for block in blocks for rule in block.rules))
    rig.waypoint.context.routes.replace(WaypointConfig("app/waypoint", (table,)))
    return table


async def test_upstream_set_header_reaches_every_endpoint_of_the_service(rig: Rig) -> None:
    install(rig, SET_HEADER)
    client, stream = await rig.tunnel(f"{ECHO_VIP}:80")
    http = HttpOverTunnel(stream)
    seen = set()
    for _ in range(4):
        status, _, body = await http.request("GET", "/echo")
        echo = echo_of(body)
        assert status == 200
        headers = echo["headers"]
        assert isinstance(headers, dict) and headers["istio-custom-header"] == "user-defined-value"
        seen.add(echo["endpoint"])
    assert seen == {"echo-1", "echo-2"}  # the one destination is the Service itself, balanced per request
    await client.aclose()


async def test_a_header_match_routes_in_written_order(rig: Rig) -> None:
    install(rig, HEADER_SPLIT)
    client, stream = await rig.tunnel(f"{ECHO_VIP}:80")
    http = HttpOverTunnel(stream)
    for _ in range(3):
        _, _, body = await http.request("GET", "/echo", headers=[("user", "istio-custom-user")])
        assert echo_of(body)["endpoint"] == "echo-2"
        _, _, body = await http.request("GET", "/echo")
        assert echo_of(body)["endpoint"] == "echo-1"
        _, _, body = await http.request("GET", "/echo", headers=[("user", "someone-else")])
        assert echo_of(body)["endpoint"] == "echo-1"
    await client.aclose()


async def test_an_unknown_destination_answers_503_and_a_fault_delay_is_waited_out(rig: Rig) -> None:
    install(
        rig,
        """apiVersion: networking.istio.io/v1
kind: VirtualService
metadata: {name: faults, namespace: app}
spec:
  hosts: [echo]
  http:
  - match: [{uri: {prefix: /gone}}]
    route: [{destination: {host: nowhere}}]
  - match: [{uri: {prefix: /ech}}]
    fault: {delay: {fixedDelay: 200ms, percentage: {value: 100}}}
    route: [{destination: {host: echo}}]
  - match: [{uri: {prefix: /teapot}}]
    directResponse: {status: 418, body: {string: short and stout}}
""",
    )
    client, stream = await rig.tunnel(f"{ECHO_VIP}:80")
    http = HttpOverTunnel(stream)
    assert (await http.request("GET", "/gone"))[0] == 503
    loop = asyncio.get_running_loop()
    started = loop.time()
    status, _, _ = await http.request("GET", "/echo")  # a plain string prefix: /ech matches /echo
    assert status == 200 and loop.time() - started >= 0.2
    status, _, body = await http.request("GET", "/teapot")
    assert (status, body) == (418, b"short and stout")
    assert (await http.request("GET", "/other"))[0] == 404
    await client.aclose()


# Upstream's "cors" case (tests/integration/pilot/common/routing.go), {{ .dstSvc }} = echo, in namespace app.
CORS = """apiVersion: networking.istio.io/v1
kind: VirtualService
metadata:
  name: default
  namespace: app
spec:
  hosts:
    - echo
  http:
  - corsPolicy:
      allowOrigins:
      - exact: cors.com
      allowMethods:
      - POST
      - GET
      allowCredentials: false
      allowHeaders:
      - X-Foo-Bar
      - X-Foo-Baz
      maxAge: "24h"
    route:
    - destination:
        host: echo
"""
CORS_HEADERS = (
    "access-control-allow-origin",
    "access-control-allow-methods",
    "access-control-allow-headers",
    "access-control-max-age",
    "access-control-allow-credentials",
    "access-control-expose-headers",
)


def cors_headers(headers: dict[str, str]) -> dict[str, str]:
    return {k: v for k, v in headers.items() if k in CORS_HEADERS}


async def test_upstream_cors_preflight_is_answered_and_a_matching_get_gets_allow_origin(rig: Rig) -> None:
    install(rig, CORS)
    client, stream = await rig.tunnel(f"{ECHO_VIP}:80")
    http = HttpOverTunnel(stream)
    preflight = [("origin", "cors.com"), ("access-control-request-method", "DELETE")]
    status, headers, body = await http.request("OPTIONS", "/echo", headers=preflight)
    assert (status, body) == (200, b"")
    assert cors_headers(headers) == {
        "access-control-allow-origin": "cors.com",
        "access-control-allow-methods": "POST,GET",
        "access-control-allow-headers": "X-Foo-Bar,X-Foo-Baz",
        "access-control-max-age": "86400",
    }
    assert not any(e.seen for e in rig.endpoints)  # answered by the waypoint itself

    status, headers, body = await http.request("GET", "/echo", headers=[("origin", "cors.com")])
    assert status == 200 and echo_of(body)["endpoint"] in {"echo-1", "echo-2"}
    assert cors_headers(headers) == {"access-control-allow-origin": "cors.com"}

    status, headers, _ = await http.request("GET", "/echo")  # "get no origin match"
    assert status == 200 and cors_headers(headers) == {}
    await client.aclose()


async def test_a_foreign_origin_gets_no_cors_header_and_its_preflight_reaches_the_backend(rig: Rig) -> None:
    install(rig, CORS)
    client, stream = await rig.tunnel(f"{ECHO_VIP}:80")
    http = HttpOverTunnel(stream)
    status, headers, _ = await http.request("GET", "/echo", headers=[("origin", "https://evil.example")])
    assert status == 200 and cors_headers(headers) == {}
    preflight = [("origin", "https://evil.example"), ("access-control-request-method", "GET")]
    status, headers, _ = await http.request("OPTIONS", "/echo", headers=preflight)
    assert status == 200 and cors_headers(headers) == {}
    assert [s for e in rig.endpoints for s in e.seen] == ["GET /echo", "OPTIONS /echo"]  # forwarded (FORWARD)
    # An origin that only starts like the allowed one is another origin.
    status, headers, _ = await http.request("GET", "/echo", headers=[("origin", "cors.com.evil.example")])
    assert status == 200 and cors_headers(headers) == {}
    await client.aclose()


# Upstream's "pseudo header matches" case (tests/integration/pilot/common/routing.go), {{ .dstSvc }} = echo.
PSEUDO_HEADER = """apiVersion: networking.istio.io/v1
kind: VirtualService
metadata:
  name: default
  namespace: app
spec:
  hosts:
    - echo
  http:
  - match:
    - headers:
        :method:
          exact: GET
    route:
    - destination:
        host: echo
"""


async def test_upstream_pseudo_header_match_on_the_method_routes_a_get_and_not_a_post(rig: Rig) -> None:
    table = install(rig, PSEUDO_HEADER)
    assert [rule.match.headers for rule in table.http] == [(ValueMatch(":method", "GET"),)]
    client, stream = await rig.tunnel(f"{ECHO_VIP}:80")
    http = HttpOverTunnel(stream)
    assert (await http.request("POST", "/echo"))[0] == 404  # "no match"
    status, _, body = await http.request("GET", "/echo")  # "match"
    assert status == 200 and echo_of(body)["method"] == "GET"
    assert [s for e in rig.endpoints for s in e.seen] == ["GET /echo"]
    await client.aclose()


# Upstream's "redirect prefix_rewrite" case (routing.go), with the target renamed so that the rig's echo serves it.
PREFIX_REDIRECT = """apiVersion: networking.istio.io/v1
kind: VirtualService
metadata:
  name: default
  namespace: app
spec:
  hosts:
    - echo
  http:
  - match:
    - uri:
        prefix: /foo/
    redirect:
      prefixRewrite: /ec
  - match:
    - uri:
        prefix: /ec
    route:
    - destination:
        host: echo
"""


async def test_upstream_redirect_prefix_rewrite_replaces_the_matched_string_prefix_and_keeps_the_query(
    rig: Rig,
) -> None:
    install(rig, PREFIX_REDIRECT)
    client, stream = await rig.tunnel(f"{ECHO_VIP}:80")
    http = HttpOverTunnel(stream)
    status, headers, _ = await http.request("GET", "/foo/ho?key=value")
    assert (status, headers["location"]) == (301, "http://echo.app.svc.cluster.local/echo?key=value")
    status, headers, _ = await http.request("GET", "/foo/")
    assert (status, headers["location"]) == (301, "http://echo.app.svc.cluster.local/ec")
    assert not any(e.seen for e in rig.endpoints)  # answered by the waypoint
    status, _, body = await http.request("GET", "/echo")  # where a client following the redirect lands
    assert status == 200 and echo_of(body)["endpoint"] in {"echo-1", "echo-2"}
    await client.aclose()


def multi_destination(route_headers: str) -> str:
    """Upstream's "set host header … multi destination" cases (routing.go): two destinations of one Service, 50/50,
    each setting ``Host: dest-authority``; ``route_headers`` the rule's own ``headers`` (or nothing)."""
    return f"""apiVersion: networking.istio.io/v1
kind: VirtualService
metadata:
  name: default
  namespace: app
spec:
  hosts:
  - echo
  http:
  - route:
    - destination:
        host: echo
      headers:
        request:
          set:
            Host: dest-authority
      weight: 50
    - destination:
        host: echo
      headers:
        request:
          set:
            :authority: dest-authority
      weight: 50
{route_headers}"""


@pytest.mark.parametrize(
    ("route_headers", "expected"),
    [
        ("", "dest-authority"),
        ("    headers:\n      request:\n        set:\n          :authority: route-authority\n", "route-authority"),
        ("    rewrite:\n      authority: route-authority\n", "route-authority"),
    ],
)
async def test_upstream_host_set_on_each_of_several_destinations_unless_the_route_sets_one(
    rig: Rig, route_headers: str, expected: str
) -> None:
    install(rig, multi_destination(route_headers))
    client, stream = await rig.tunnel(f"{ECHO_VIP}:80")
    http = HttpOverTunnel(stream)
    for _ in range(6):  # whichever destination the draw takes
        status, _, body = await http.request("GET", "/echo")
        assert status == 200 and echo_of(body)["host"] == expected
    await client.aclose()


# Upstream's "redirect request port" and "redirect port and scheme" cases (routing.go), on the rig's port 80.
def derived_port_redirect(extra: str = "") -> str:
    return f"""apiVersion: networking.istio.io/v1
kind: VirtualService
metadata:
  name: default
  namespace: app
spec:
  hosts:
    - echo
  http:
  - match:
    - uri:
        exact: /foo
    redirect:
      derivePort: FROM_REQUEST_PORT{extra}
"""


@pytest.mark.parametrize(
    ("extra", "host", "location"),
    [
        ("", "b", "http://b/foo"),  # "to default": 80 is the protocol default
        ("", "b:80", "http://b:80/foo"),  # "to default with host port": explicit in the Host, kept
        ("\n      scheme: https", "b", "https://b:80/foo"),  # "redirect port and scheme"
    ],
)
async def test_upstream_redirect_from_the_request_port_keeps_the_host_as_sent(
    rig: Rig, extra: str, host: str, location: str
) -> None:
    install(rig, derived_port_redirect(extra))
    client, stream = await rig.tunnel(f"{ECHO_VIP}:80")
    status, headers, _ = await HttpOverTunnel(stream, host=host).request("GET", "/foo")
    assert (status, headers["location"]) == (301, location)
    await client.aclose()
