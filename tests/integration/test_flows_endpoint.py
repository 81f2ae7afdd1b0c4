"""``GET /flows`` on a proxy's admin server and ``ambit flows --admin-url`` reading it, as real processes on loopback;
a hostile admin port gets a one-line error, not a traceback."""

from __future__ import annotations

import asyncio
import json
import sys
from collections.abc import AsyncIterator

import aiohttp
import pytest
from aiohttp import web

from ambit.telemetry.accesslog import ConnectionRecord
from ambit.telemetry.endpoints import ProxyEndpoints
from ambit.telemetry.flows import FlowRing
from ambit.telemetry.metrics import ProxyMetrics
from ambit.telemetry.readiness import Readiness

LOOPBACK = "127.0.0.1"
TOKEN = "test-admin-token-0123456789"


def denied(i: int) -> ConnectionRecord:
    return ConnectionRecord(
        "inbound",
        f"198.18.0.{i}:40000",
        "198.18.1.1:8080",
        src_workload=f"cli-{i}",
        src_namespace="x",
        dst_workload="srv",
        dst_namespace="pol",
        error="explicitly denied by: pol/deny-x",
    )


def allowed(i: int) -> ConnectionRecord:
    return ConnectionRecord(
        "inbound",
        f"198.18.0.{i}:40000",
        "198.18.1.1:8080",
        src_workload=f"cli-{i}",
        src_namespace="pol",
        src_identity="spiffe://cluster.local/ns/pol/sa/alpha",
        dst_workload="srv",
        dst_namespace="pol",
        bytes_sent=5,
    )


async def endpoints_with(ring: FlowRing | None) -> ProxyEndpoints:
    endpoints = ProxyEndpoints(
        metrics=ProxyMetrics(build_version="test"),
        readiness=Readiness(),
        config_dump=dict,
        quit=lambda: None,
        admin_token=TOKEN,
        admin_address=(LOOPBACK, 0),
        stats_address=(LOOPBACK, 0),
        readiness_address=(LOOPBACK, 0),
        flows=ring,
    )
    await endpoints.start()
    return endpoints


@pytest.fixture
async def ring_and_url() -> AsyncIterator[tuple[FlowRing, str]]:
    ring = FlowRing(capacity=50)
    endpoints = await endpoints_with(ring)
    try:
        yield ring, f"http://{LOOPBACK}:{endpoints.ports['admin']}"
    finally:
        await endpoints.aclose()


async def cli(*args: str, within: float = 60) -> tuple[int, str, str]:
    child = await asyncio.create_subprocess_exec(
        sys.executable,
        "-m",
        "ambit.cli",
        "flows",
        *args,
        stdout=asyncio.subprocess.PIPE,
        stderr=asyncio.subprocess.PIPE,
    )
    out, err = await asyncio.wait_for(child.communicate(), within)
    assert child.returncode is not None
    return child.returncode, out.decode(), err.decode()


async def test_pages_over_http_and_bad_queries(ring_and_url: tuple[FlowRing, str]) -> None:
    ring, url = ring_and_url
    for i in range(3):
        ring.add(denied(i), "DENY")
    async with aiohttp.ClientSession() as session:
        async with session.get(f"{url}/flows?after=1&limit=1") as response:
            page = await response.json()
        assert response.status == 200 and page["next"] == 2 and [f["seq"] for f in page["flows"]] == [2]
        assert page["flows"][0]["verdict"] == "denied" and page["flows"][0]["flag"] == "DENY"
        for query in ("after=-1", "limit=0", "after=x", "limit=99999"):
            async with session.get(f"{url}/flows?{query}") as response:
                assert response.status == 400, query


async def test_a_proxy_without_a_ring_answers_404() -> None:
    endpoints = await endpoints_with(None)
    try:
        url = f"http://{LOOPBACK}:{endpoints.ports['admin']}/flows"
        async with aiohttp.ClientSession() as session, session.get(url) as response:
            assert response.status == 404
    finally:
        await endpoints.aclose()


async def test_the_cli_filters_and_prints_what_the_proxy_holds(ring_and_url: tuple[FlowRing, str]) -> None:
    ring, url = ring_and_url
    for i in range(60):  # more than the ring holds: the oldest ten fell out
        ring.add(allowed(i) if i % 2 else denied(i), "" if i % 2 else "DENY")
    code, out, err = await cli("--admin-url", url, "--verdict", "denied", "-o", "json", "--proxy-name", "node-1")
    assert code == 0, err
    flows = [json.loads(line) for line in out.splitlines()]
    assert len(flows) == 25 and {f["verdict"] for f in flows} == {"denied"} and flows[0]["proxy"] == "node-1"
    assert [f["seq"] for f in flows] == sorted(f["seq"] for f in flows)
    code, out, _ = await cli("--admin-url", url, "--namespace", "pol", "--pod", "cli-59", "--last", "5")
    assert code == 0 and "pol/cli-59 -> pol/srv ALLOWED mTLS" in out and len(out.splitlines()) == 1


async def test_follow_prints_flows_as_they_come(ring_and_url: tuple[FlowRing, str]) -> None:
    ring, url = ring_and_url
    ring.add(allowed(1))
    child = asyncio.create_task(cli("--admin-url", url, "--follow", "--for", "3", "--interval", "0.2", "-o", "json"))
    await asyncio.sleep(1.0)
    ring.add(denied(2), "DENY")
    code, out, err = await child
    assert code == 0, err
    assert [json.loads(line)["verdict"] for line in out.splitlines()] == ["allowed", "denied"]


@pytest.mark.parametrize(
    "body",
    [b"not json", b"[]", b'{"flows": "x"}', b'{"flows": [{"seq": -1}]}', b'{"flows": [], "next": true}', b"{" * 5000],
)
async def test_a_hostile_admin_port_gets_a_one_line_error(body: bytes) -> None:
    async def answer(request: web.Request) -> web.Response:
        return web.Response(body=body)

    app = web.Application()
    app.router.add_get("/flows", answer)
    runner = web.AppRunner(app)
    await runner.setup()
    site = web.TCPSite(runner, LOOPBACK, 0)
    await site.start()
    port = runner.addresses[0][1]
    try:
        code, out, err = await cli("--admin-url", f"http://{LOOPBACK}:{port}")
    finally:
        await runner.cleanup()
    assert code == 1 and out == ""
    assert err.startswith("ambit flows: ") and "Traceback" not in err and len(err.splitlines()) == 1, err
