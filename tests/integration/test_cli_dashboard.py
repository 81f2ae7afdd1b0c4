"""``ambit dashboard --admin-url`` as a process: it prints its URL, serves a real node proxy's flows on loopback,
and stops on SIGTERM (and SIGINT); bad arguments get one line, not a traceback."""

from __future__ import annotations

import asyncio
import re
import signal
import sys
from pathlib import Path

import aiohttp
from tests.integration.dashboard_rig import metered_connection
from tests.proxyconfig_rig import running_node_proxy

from ambit.telemetry.accesslog import ConnectionRecord


async def run(*args: str, within: float = 60) -> tuple[int, str, str]:
    child = await asyncio.create_subprocess_exec(
        sys.executable,
        "-m",
        "ambit.cli",
        "dashboard",
        *args,
        stdout=asyncio.subprocess.PIPE,
        stderr=asyncio.subprocess.PIPE,
    )
    out, err = await asyncio.wait_for(child.communicate(), within)
    assert child.returncode is not None
    return child.returncode, out.decode(), err.decode()


async def test_the_dashboard_serves_a_proxys_flows_on_loopback_until_interrupted(tmp_path: Path) -> None:
    async with running_node_proxy(tmp_path) as proxy:
        assert proxy.flows is not None
        proxy.flows.add(
            ConnectionRecord(
                "inbound",
                "198.18.16.5:1",
                "198.18.17.7:15008",
                src_workload="client",
                src_namespace="apps",
                src_identity="spiffe://cluster.local/ns/apps/sa/client",
                dst_workload="server",
                dst_namespace="apps",
            )
        )
        admin = f"http://127.0.0.1:{proxy.endpoints.ports['admin']}"
        conn = metered_connection(proxy)  # a connection that moves bytes while the dashboard scrapes
        child = await asyncio.create_subprocess_exec(
            sys.executable,
            "-m",
            "ambit.cli",
            "dashboard",
            "--admin-url",
            admin,
            "--metrics-url",
            f"http://127.0.0.1:{proxy.endpoints.ports['stats']}/metrics",
            "--port",
            "0",
            "--interval",
            "0.2",
            stdout=asyncio.subprocess.PIPE,
            stderr=asyncio.subprocess.PIPE,
        )
        try:
            assert child.stdout is not None
            line = (await asyncio.wait_for(child.stdout.readline(), 60)).decode()
            found = re.search(r"http://127\.0\.0\.1:(\d+)/", line)
            assert found, line
            url = found.group(0)
            async with aiohttp.ClientSession() as session:
                edges: list[dict[str, object]] = []
                for _ in range(600):  # until a poll and two scrapes landed; a bound, not a measurement
                    conn.add_sent(1000)
                    async with session.get(url + "api/graph") as response:
                        assert response.status == 200
                        edges = (await response.json())["edges"]
                    if edges and edges[0]["rate"] and edges[0]["rate"]["bytesPerSecond"] > 0:
                        break
                    await asyncio.sleep(0.1)
                assert [(e["src"], e["dst"], e["mtls"]) for e in edges] == [("wl:apps/client", "wl:apps/server", 1)]
                assert edges[0]["rate"]["mtls"] is True  # from the proxy's istio_tcp_* series
        finally:
            child.send_signal(signal.SIGTERM)  # as a service manager (or a shell's background job) stops it
            _, err = await asyncio.wait_for(child.communicate(), 60)
        assert child.returncode == 0, err.decode()
        assert b"Traceback" not in err


async def test_bad_arguments_get_one_line(tmp_path: Path) -> None:
    code, _, err = await run("--admin-url", "ftp://x", "--port", "0")
    assert code == 2 and "bad admin URL" in err and "Traceback" not in err
    code, _, err = await run("--metrics-url", "ftp://x/metrics", "--port", "0")
    assert code == 2 and "is not an http(s) URL" in err and "Traceback" not in err
    code, _, err = await run("--lab-dir", str(tmp_path / "nolab"), "--port", "0")
    assert (
        code == 1
        and err.strip()
        == f"ambit dashboard: no lab in {tmp_path / 'nolab'}: give --lab-dir, or "
        "--admin-url for any reachable admin port"
    )
    code, _, err = await run("--admin-url", "http://127.0.0.1:9", "--address", "198.51.100.1", "--port", "0")
    assert code == 1 and err.startswith("ambit dashboard: cannot serve on 198.51.100.1:0") and "Traceback" not in err
