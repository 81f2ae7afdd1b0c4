"""A connection waits for a complete workload state (``ProxyContext.synced``) before it is planned (issue 21).

Before the control plane's first full view, the state may know the source pod but not the destination: a plan made
then would treat a meshed destination as outside the mesh and send the connection out in plaintext. So
``wait_local_workload`` (the first step of every handler) waits for both, and gives up (refusal) after its bound.
"""

from __future__ import annotations

import asyncio
import logging
from pathlib import Path

from tests.unit.workload_builders import pod, state_with

from ambit.identity.localca import LocalCa
from ambit.identity.manager import CertificateManager
from ambit.proxy.context import LocalPod, ProxyContext
from ambit.proxy.pool import ConnectionPool
from ambit.proxy.settings import ProxySettings
from ambit.proxy.sockets import HostSocketFactory
from ambit.telemetry.accesslog import AccessLog
from ambit.telemetry.metrics import ProxyMetrics
from ambit.zds.protocol import WorkloadInfo

TD = "cluster.local"


def context(tmp_path: Path, synced: list[bool]) -> tuple[ProxyContext, LocalPod]:
    web = pod("web", "198.18.16.5", service_account="web", node="node-1")
    ctx = ProxyContext(
        settings=ProxySettings(node="node-1", trust_domain=TD),
        state=state_with(web),
        certs=CertificateManager(LocalCa(tmp_path / "ca", trust_domain=TD)),
        pool=ConnectionPool(),
        metrics=ProxyMetrics(),
        access_log=AccessLog(logger=logging.getLogger("tests.context_sync.access")),
    )
    ctx.synced = lambda: synced[0]
    local = LocalPod("uid-web", WorkloadInfo("web", "apps", "web"), HostSocketFactory(mark=None), TD)
    ctx.add_pod(local)
    return ctx, local


async def test_a_connection_before_the_first_full_view_waits_for_it_and_then_goes_on(tmp_path: Path) -> None:
    synced = [False]
    ctx, local = context(tmp_path, synced)
    waiting = asyncio.create_task(ctx.wait_local_workload(local, wait=10.0))
    await asyncio.sleep(0.3)
    assert not waiting.done(), "the pod's workload is known, but the state is not complete yet"
    synced[0] = True  # no change of state comes with it: the wait looks again by itself
    workload = await asyncio.wait_for(waiting, 5.0)
    assert workload is not None and workload.name == "web"


async def test_a_connection_is_refused_when_the_first_full_view_does_not_come_in_time(tmp_path: Path) -> None:
    ctx, local = context(tmp_path, [False])
    assert await ctx.wait_local_workload(local, wait=0.3) is None
