"""``ambit dashboard``'s JSON API over a real node proxy's admin port: the graph, an edge's flows, policy explain;
bad input is 400, a foreign Host header (DNS rebinding) is refused, nothing changes state."""

from __future__ import annotations

from collections.abc import AsyncIterator
from pathlib import Path
from typing import Any

import aiohttp
import pytest
from tests.integration.dashboard_rig import HOSTILE, Dashboard, running_dashboard


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
