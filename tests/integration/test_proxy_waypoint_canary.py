"""A Service's traffic split between two real waypoints by the node proxy (upstream TestWeightedWaypointTrafficShift
and TestWeightedWaypointCanaryNotReady, on loopback with real TLS and HBONE).

The rig is one node proxy serving pod ``apps/client-0`` (``127.0.0.31``); service ``web`` (VIP ``198.19.0.10``) uses
waypoint ``apps/waypoint`` (one instance, a test HBONE server at ``127.0.0.32``) and names ``apps/canary`` (at
``127.0.0.34``, its own identity) as its canary with a weight the test sets. Each connection is echoed by the
waypoint it reached, which records the CONNECT; the draw is the proxy's own ``random.random``, so the split is
checked as upstream checks it: all to one side at weights 0 and 100, some to each at 50.
"""

from __future__ import annotations

import contextlib
import dataclasses
import ipaddress
import logging
from collections.abc import AsyncIterator
from pathlib import Path

import pytest
from tests.integration.fake_waypoint import FakeWaypoint, call_outbound
from tests.integration.proxy_rig import until
from tests.unit.workload_builders import WAYPOINT_BY_HOST, pod, waypoint_pod, waypoint_service, web_service

from ambit.identity.localca import LocalCa
from ambit.identity.manager import CertificateManager
from ambit.model.identity import SpiffeId
from ambit.model.state import WorkloadState
from ambit.model.workload import GatewayAddress, NamespacedHostname, NetworkAddress, PortMapping, WeightedWaypoint
from ambit.proxy.context import LocalPod, ProxyContext
from ambit.proxy.pool import ConnectionPool
from ambit.proxy.settings import ProxySettings
from ambit.proxy.sockets import HostSocketFactory
from ambit.telemetry.accesslog import AccessLog
from ambit.telemetry.metrics import ProxyMetrics
from ambit.zds.protocol import WorkloadInfo

pytestmark = pytest.mark.timeout(60)

TD = "cluster.local"
CLIENT_IP, PRIMARY_IP, CANARY_IP = "127.0.0.31", "127.0.0.32", "127.0.0.34"
VIP = "198.19.0.10"
CANARY_HOST = "canary.apps.svc.cluster.local"
CANARY_BY_HOST = GatewayAddress(NamespacedHostname("apps", CANARY_HOST))
CONNECTIONS = 40
"""Connections per split check: at weight 50 all of them landing on one side has probability 2**-39."""


@dataclasses.dataclass
class Rig:
    ctx: ProxyContext
    pod: LocalPod
    primary: FakeWaypoint
    canary: FakeWaypoint

    def set_weight(self, weight: int | None, *, canary_ready: bool = True) -> None:
        """``web`` with its canary at ``weight`` (None: no canary); without ``canary_ready`` the state knows no
        instance of the canary (its Deployment not up yet)."""
        client = pod("client-0", CLIENT_IP, services={}, service_account="client")
        primary = waypoint_pod("waypoint-0", PRIMARY_IP)
        canary = waypoint_pod("canary-0", CANARY_IP, services={f"apps/{CANARY_HOST}": ()}, service_account="canary")
        weighted = (
            ()
            if weight is None
            else (WeightedWaypoint(WAYPOINT_BY_HOST, 100 - weight), WeightedWaypoint(CANARY_BY_HOST, weight))
        )
        services = [
            web_service(waypoint=WAYPOINT_BY_HOST, weighted_waypoints=weighted),
            waypoint_service(ports=(PortMapping(15008, self.primary.port),)),
            waypoint_service(
                name="canary",
                hostname=CANARY_HOST,
                vips=(NetworkAddress("", ipaddress.ip_address("198.19.0.21")),),
                ports=(PortMapping(15008, self.canary.port),),
            ),
        ]
        workloads = [client, primary, *([canary] if canary_ready else [])]
        self.ctx.state.replace_all(workloads, services)
        self.ctx.state_changed()

    async def shift(self, connections: int = CONNECTIONS) -> tuple[int, int]:
        """Opens ``connections`` to the VIP one after another; how many reached (primary, canary)."""
        before = (len(self.primary.requests), len(self.canary.requests))
        for i in range(connections):
            payload = f"hello {i}".encode()
            assert await call_outbound(self.ctx, self.pod, CLIENT_IP, (VIP, 80), payload) == payload
        await until(lambda: not self.ctx.connections)
        return len(self.primary.requests) - before[0], len(self.canary.requests) - before[1]


@contextlib.asynccontextmanager
async def rig(tmp_path: Path) -> AsyncIterator[Rig]:
    ca = LocalCa(tmp_path / "ca", trust_domain=TD)
    primary = FakeWaypoint(await ca.fetch_certificate(SpiffeId(TD, "apps", "waypoint")), PRIMARY_IP)
    canary = FakeWaypoint(await ca.fetch_certificate(SpiffeId(TD, "apps", "canary")), CANARY_IP)
    await primary.start()
    await canary.start()
    ctx = ProxyContext(
        settings=ProxySettings(node="node1", trust_domain=TD),
        state=WorkloadState(),
        certs=CertificateManager(ca),
        pool=ConnectionPool(),
        metrics=ProxyMetrics(),
        access_log=AccessLog(logger=logging.getLogger("tests.waypoint_canary.access")),
    )
    local = LocalPod("uid-client", WorkloadInfo("client-0", "apps", "client"), HostSocketFactory(mark=None), TD)
    ctx.add_pod(local)
    the_rig = Rig(ctx, local, primary, canary)
    try:
        yield the_rig
    finally:
        await ctx.pool.aclose()
        await ctx.certs.aclose()
        await primary.aclose()
        await canary.aclose()


async def test_the_weight_shifts_new_connections_between_the_primary_and_the_canary(tmp_path: Path) -> None:
    async with rig(tmp_path) as r:
        r.set_weight(0)
        assert await r.shift(8) == (8, 0)  # weight 0: all primary
        r.set_weight(50)
        primary, canary = await r.shift()
        assert primary > 0 and canary > 0 and primary + canary == CONNECTIONS  # weight 50: both
        r.set_weight(100)
        assert await r.shift(8) == (0, 8)  # weight 100: all canary
        r.set_weight(None)
        assert await r.shift(8) == (8, 0)  # the canary label removed: a single waypoint again
        # The canary saw the same CONNECT as the primary: the VIP, from the pod's own identity.
        assert {req.authority for req in r.canary.requests} == {f"{VIP}:80"}
        assert {req.peer_identity for req in r.canary.requests} == {SpiffeId(TD, "apps", "client")}


async def test_a_canary_with_no_instance_leaves_every_connection_to_the_primary(tmp_path: Path) -> None:
    async with rig(tmp_path) as r:
        r.set_weight(100, canary_ready=False)
        assert await r.shift(8) == (8, 0)
        assert r.canary.handshakes == 0
