"""``ambit dashboard``'s JSON API over a real node proxy's admin port: the graph, an edge's flows, policy explain;
bad input is 400, a foreign Host header (DNS rebinding) is refused, nothing changes state."""

from __future__ import annotations

import asyncio
import time
from collections.abc import AsyncIterator
from contextlib import asynccontextmanager
from pathlib import Path
from typing import Any

import aiohttp
import pytest
from aiohttp import web
from tests.integration.dashboard_rig import HOSTILE, Dashboard, load, running_dashboard

from ambit.observe.dashboard import DashboardState
from ambit.observe.scraper import MAX_BODY, MetricsScraper, fixed_targets


@pytest.fixture
async def dash(tmp_path: Path) -> AsyncIterator[Dashboard]:
    async with running_dashboard(tmp_path) as running:
        yield running


async def get(url: str, **headers: str) -> tuple[int, Any, aiohttp.typedefs.LooseHeaders]:
    async with aiohttp.ClientSession() as session, session.get(url, headers=headers) as response:
        body = await response.read()
        kind = response.headers.get("Content-Type", "")
        value: Any = await response.json() if kind.startswith("application/json") else body
        return response.status, value, response.headers


async def test_the_graph_shows_the_proxys_workloads_and_the_edges_of_its_flows(dash: Dashboard) -> None:
    status, graph, headers = await get(f"{dash.url}/api/graph")
    assert status == 200
    nodes = {n["id"]: n for n in graph["nodes"]}
    assert {"wl:apps/client", "wl:apps/server", "wl:apps/legacy", "svc:echo.apps.svc.cluster.local"} <= set(nodes)
    assert nodes["wl:apps/client"]["details"]["identity"] == "spiffe://cluster.local/ns/apps/sa/client"
    assert nodes[f"wl:apps/{HOSTILE}"]["known"] is False
    edges = {(e["src"], e["dst"]): e for e in graph["edges"]}
    good = edges["wl:apps/client", "wl:apps/server"]
    assert (good["flows"], good["mtls"], good["denied"], good["bytes"]) == (3, 3, 0, 4500)
    bad = edges["wl:apps/legacy", "wl:apps/server"]
    assert (bad["flows"], bad["plaintext"], bad["denied"]) == (1, 1, 1)
    assert edges["ip:198.18.0.77", "svc:echo.apps.svc.cluster.local"]["failed"] == 1
    assert graph["explain"] is True
    assert "script-src 'self'" in headers["Content-Security-Policy"]


async def test_an_edge_lists_its_flows_with_their_verdicts(dash: Dashboard) -> None:
    query = "src=wl%3Aapps%2Flegacy&dst=wl%3Aapps%2Fserver"
    status, answer, _ = await get(f"{dash.url}/api/edge?{query}")
    assert status == 200
    (flow,) = answer["flows"]
    assert flow["verdict"] == "denied" and flow["reason"] == "allow policies exist, but none allowed"
    assert flow["proxy"] == "node-1" and flow["mtls"] is False


async def test_explain_gives_the_node_proxys_verdict_for_a_pair(dash: Dashboard) -> None:
    status, answer, _ = await get(f"{dash.url}/api/explain?src=apps/client&dst=apps/server&port=8080")
    assert status == 200 and answer["verdict"] == "ALLOW"
    assert [p["matchedRule"] for p in answer["destinations"][0]["policies"]] == [0, None]
    status, answer, _ = await get(f"{dash.url}/api/explain?src=apps/legacy&dst=apps/server&port=8080")
    assert status == 200 and answer["verdict"] == "DENY"  # the denied edge's verdict, explained
    assert answer["destinations"][0]["reason"] == "allow policies exist, but none allowed"
    status, answer, _ = await get(f"{dash.url}/api/explain?src=apps/nobody&dst=apps/server&port=8080")
    assert status == 422 and "nobody" in answer["error"]


async def test_without_a_kubeconfig_explain_says_it_is_not_available(tmp_path: Path) -> None:
    async with running_dashboard(tmp_path, explainer=False) as dash:
        status, answer, _ = await get(f"{dash.url}/api/explain?src=apps/client&dst=apps/server&port=80")
        assert status == 404 and "--kubeconfig" in answer["error"]


@pytest.mark.parametrize(
    ("path", "message"),
    [
        ("/api/graph?window=0", "window"),
        ("/api/graph?window=99999999999999999999", "window"),
        ("/api/graph?window=-5", "window"),
        ("/api/edge?src=wl:a/b", "dst is required"),
        ("/api/edge?src=evil&dst=wl:a/b", "node id"),
        ("/api/edge?src=wl:a/b&dst=wl:" + "x" * 3000, "node id"),
        ("/api/edge?src=wl:a/b&dst=wl:a%0Ab", "node id"),
        ("/api/explain?src=apps/client&dst=apps/server&port=0", "port"),
        ("/api/explain?src=apps/client&dst=apps/server&port=1e3", "port"),
        ("/api/explain?src=apps&dst=apps/server&port=80", "src must be NAMESPACE/NAME"),
        ("/api/explain?src=apps/client&dst=Apps/../x&port=80", "dst must be NAMESPACE/NAME"),
    ],
)
async def test_bad_input_is_a_400_with_one_line(dash: Dashboard, path: str, message: str) -> None:
    status, answer, _ = await get(dash.url + path)
    assert status == 400
    assert message in answer["error"] and "\n" not in answer["error"]


async def test_a_foreign_host_header_is_refused_against_dns_rebinding(dash: Dashboard) -> None:
    # A page on evil.example whose name now resolves to 127.0.0.1 sends its own name as Host.
    status, body, _ = await get(f"{dash.url}/api/graph", Host=f"evil.example:{dash.port}")
    assert status == 421 and b"flows" not in body
    status, _, _ = await get(f"{dash.url}/api/graph", Host=f"localhost:{dash.port}")
    assert status == 200


async def test_the_api_is_read_only(dash: Dashboard) -> None:
    async with aiohttp.ClientSession() as session:
        for method in ("POST", "PUT", "DELETE"):
            async with session.request(method, f"{dash.url}/api/graph", data=b"x") as response:
                assert response.status == 405


async def test_the_page_and_its_assets_are_served_from_the_package(dash: Dashboard) -> None:
    for path, kind in (("/", "text/html"), ("/app.js", "application/javascript"), ("/app.css", "text/css")):
        status, body, headers = await get(dash.url + path)
        assert status == 200 and headers["Content-Type"].startswith(kind) and body
    status, body, _ = await get(dash.url + "/app.js")
    assert b"innerHTML" not in body and b"insertAdjacentHTML" not in body and b"eval(" not in body
    status, _, _ = await get(dash.url + "/../pyproject.toml")
    assert status == 404


async def _edge_rate(dash: Dashboard, window: int) -> dict[str, Any] | None:
    status, graph, _ = await get(f"{dash.url}/api/graph?window={window}")
    assert status == 200 and graph["rateWindow"] == min(window, 60)
    edges = {(e["src"], e["dst"]): e for e in graph["edges"]}
    rate: dict[str, Any] | None = edges["wl:apps/client", "wl:apps/server"]["rate"]
    return rate


async def test_an_edges_rates_come_from_the_proxys_metrics_under_load_and_are_zero_after(dash: Dashboard) -> None:
    loading = asyncio.create_task(load(dash.proxy, 3.0))
    try:
        deadline = time.monotonic() + 30
        while not ((rate := await _edge_rate(dash, 2)) and rate["bytesPerSecond"] > 0):
            assert time.monotonic() < deadline, f"no rate under load: {rate}"
            await asyncio.sleep(0.2)
    finally:
        await loading
    # 10 kB and one connection every 50 ms: about 200 kB/s and 20 connections/s (generous bounds: a busy machine).
    assert 20_000 < rate["bytesPerSecond"] < 1_000_000 and 2 < rate["connectionsPerSecond"] < 100
    assert rate["mtls"] is True and rate["security"] == "mutual_tls" and rate["requestsPerSecond"] == 0
    deadline = time.monotonic() + 30
    while (rate := await _edge_rate(dash, 2)) is None or rate["bytesPerSecond"] > 0:
        assert time.monotonic() < deadline, f"the rate never fell to zero: {rate}"
        await asyncio.sleep(0.2)
    assert rate["connectionsPerSecond"] == 0  # the edge stays, at zero


@asynccontextmanager
async def hostile_metrics_server() -> AsyncIterator[str]:
    """``/huge`` (a body past the scraper's limit), ``/slow`` (a byte every second), ``/garbage`` (not Prometheus
    text), ``/binary`` (not UTF-8)."""

    async def huge(request: web.Request) -> web.StreamResponse:
        response = web.StreamResponse()
        await response.prepare(request)
        chunk = b'istio_requests_total{reporter="waypoint"} 1\n' * 20_000
        for _ in range(MAX_BODY // len(chunk) + 2):
            await response.write(chunk)
        return response

    async def slow(request: web.Request) -> web.StreamResponse:
        response = web.StreamResponse()
        await response.prepare(request)
        for _ in range(600):
            await response.write(b"#")
            await asyncio.sleep(1)
        return response

    async def garbage(request: web.Request) -> web.Response:
        return web.Response(text="istio_requests_total{{{{ ][ 1 2 3\n")

    async def binary(request: web.Request) -> web.Response:
        return web.Response(body=b"\xff\xfe" * 100)

    app = web.Application()
    for path, handler in (("/huge", huge), ("/slow", slow), ("/garbage", garbage), ("/binary", binary)):
        app.router.add_get(path, handler)
    runner = web.AppRunner(app)
    await runner.setup()
    site = web.TCPSite(runner, "127.0.0.1", 0)
    await site.start()
    try:
        yield f"http://127.0.0.1:{runner.addresses[0][1]}"
    finally:
        await runner.cleanup()


async def test_hostile_metrics_endpoints_give_an_error_each_and_no_edges() -> None:
    state = DashboardState()
    async with hostile_metrics_server() as base:
        targets = fixed_targets([(path, f"{base}/{path}") for path in ("huge", "slow", "garbage", "binary")])
        scraper = MetricsScraper(targets, interval=0.2, within=2.0)
        async with aiohttp.ClientSession() as session:
            started = time.monotonic()
            await scraper.scrape_all(state, session, set())
            assert time.monotonic() - started < 30  # the slow one is cut off at its deadline
    errors = {name: status.error for name, status in state.sources.items()}
    assert "bytes" in errors["metrics huge"] and "metrics slow" in errors and errors["metrics slow"]
    assert "not Prometheus text" in errors["metrics garbage"] and "UTF-8" in errors["metrics binary"]
    assert all("\n" not in e and "Traceback" not in e for e in errors.values())
    assert state.rates.rates(time.time(), 60) == []
