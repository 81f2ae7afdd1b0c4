"""``ambit dashboard``'s server over a real node proxy, without a lab.

:func:`running_dashboard` starts the node proxy of :mod:`tests.proxyconfig_rig` (its admin port serves its real
``config_dump`` and ``/flows``), puts known flows into its flow ring (as its access log does when connections end),
and serves a :class:`~ambit.observe.dashboard.DashboardApp` on a kernel-picked loopback port, its
:class:`~ambit.observe.dashboard.AdminSource` polling that admin port. The policy view is ``ambit policy explain``'s
engine over the same local config. The flows:

- ``apps/client`` → ``apps/server``: three allowed, mutual TLS;
- ``apps/legacy`` → ``apps/server``: one denied (``apps/allow-client`` does not allow it), plaintext;
- 198.18.0.77 → service ``echo``: one failed, plaintext;
- :data:`HOSTILE` (a name a hostile proxy could report) → ``apps/server``: one allowed, plaintext.

A :class:`~ambit.observe.scraper.MetricsScraper` reads the proxy's own ``/metrics`` (its stats port) every 0.2 s for
the edges' rates; :func:`load` moves bytes on a metered ``apps/client`` → ``apps/server`` connection, as the
proxy's copy loop does.
"""

from __future__ import annotations

import asyncio
import time
from collections.abc import AsyncIterator
from contextlib import asynccontextmanager
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from tests.proxyconfig_rig import LOCAL_CONFIG, running_node_proxy

from ambit.controlplane.explain import explain
from ambit.model.localconfig import parse_local_config
from ambit.observe.dashboard import AdminSource, DashboardApp, DashboardState, serve
from ambit.observe.scraper import MetricsScraper, fixed_targets
from ambit.telemetry.accesslog import ConnectionRecord
from ambit.telemetry.metrics import ConnectionMetrics, Reporter, SecurityPolicy, TrafficLabels

HOSTILE = '<img src=x onerror="window.__pwned=1"><script>window.__pwned=2</script>'
CLIENT_ID = "spiffe://cluster.local/ns/apps/sa/client"
SERVER_ID = "spiffe://cluster.local/ns/apps/sa/server"


def _records() -> list[tuple[ConnectionRecord, str]]:
    allowed = ConnectionRecord(
        "inbound",
        "198.18.16.5:40112",
        "198.18.17.7:15008",
        src_workload="client",
        src_namespace="apps",
        src_identity=CLIENT_ID,
        dst_workload="server",
        dst_namespace="apps",
        dst_identity=SERVER_ID,
        bytes_sent=1200,
        bytes_recv=300,
        duration_seconds=0.02,
    )
    denied = ConnectionRecord(
        "inbound",
        "198.18.16.9:40300",
        "198.18.17.7:8080",
        src_workload="legacy",
        src_namespace="apps",
        dst_workload="server",
        dst_namespace="apps",
        error="allow policies exist, but none allowed",
    )
    failed = ConnectionRecord(
        "outbound",
        "198.18.0.77:5555",
        "198.19.0.20:80",
        dst_service="echo.apps.svc.cluster.local",
        error="connection refused",
    )
    hostile = ConnectionRecord(
        "inbound",
        "198.18.16.66:1",
        "198.18.17.7:8080",
        src_workload=HOSTILE,
        src_namespace="apps",
        dst_workload="server",
        dst_namespace="apps",
    )
    return [(allowed, ""), (allowed, ""), (allowed, ""), (denied, "DENY"), (failed, "CONNECT"), (hostile, "")]


@dataclass
class Dashboard:
    url: str
    port: int
    state: DashboardState
    proxy: Any


async def _explainer(source: str, destination: str, port: int) -> dict[str, Any]:
    return explain(parse_local_config(LOCAL_CONFIG), source, destination, port).to_json()


@asynccontextmanager
async def running_dashboard(tmp_path: Path, *, explainer: bool = True) -> AsyncIterator[Dashboard]:
    async with running_node_proxy(tmp_path) as proxy:
        assert proxy.flows is not None
        for record, flag in _records():
            proxy.flows.add(record, flag)
        state = DashboardState()
        source = AdminSource(f"http://127.0.0.1:{proxy.endpoints.ports['admin']}", "node-1", interval=0.2)
        app = DashboardApp(state, explainer=_explainer if explainer else None)
        runner, port = await serve(app, "127.0.0.1", 0)
        task = asyncio.create_task(source.run(state), name="dashboard source node-1")
        metrics_url = f"http://127.0.0.1:{proxy.endpoints.ports['stats']}/metrics"
        scraper = MetricsScraper(fixed_targets([("node-1", metrics_url)]), interval=0.2)
        scraping = asyncio.create_task(scraper.run(state), name="dashboard metrics node-1")
        try:
            deadline = time.monotonic() + 30
            while len(state.store) < 6 or "node-1" not in state.inventories:
                assert time.monotonic() < deadline, f"the dashboard never read the proxy: {state.sources}"
                await asyncio.sleep(0.05)
            yield Dashboard(f"http://127.0.0.1:{port}", port, state, proxy)
        finally:
            task.cancel()
            scraping.cancel()
            await runner.cleanup()


def metered_connection(proxy: Any) -> ConnectionMetrics:
    """A connection ``apps/client`` → ``apps/server`` as the server's node proxy meters it (mutual TLS)."""
    labels = TrafficLabels(
        Reporter.DESTINATION,
        source_workload="client",
        source_workload_namespace="apps",
        source_principal=CLIENT_ID,
        destination_workload="server",
        destination_workload_namespace="apps",
        destination_principal=SERVER_ID,
        destination_service="server.apps.svc.cluster.local",
        connection_security_policy=SecurityPolicy.MUTUAL_TLS,
    )
    return proxy.context.metrics.connection_opened(labels)  # type: ignore[no-any-return]


async def load(proxy: Any, seconds: float, *, per_tick: int = 10_000) -> None:
    """Traffic on ``apps/client`` → ``apps/server`` for ``seconds``: a new connection and ``per_tick`` bytes each
    50 ms."""
    end = time.monotonic() + seconds
    while time.monotonic() < end:
        conn = metered_connection(proxy)
        conn.add_received(per_tick // 2)
        conn.add_sent(per_tick - per_tick // 2)
        conn.close()
        await asyncio.sleep(0.05)


__all__ = ["CLIENT_ID", "HOSTILE", "Dashboard", "load", "metered_connection", "running_dashboard"]
