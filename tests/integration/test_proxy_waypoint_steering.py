"""The node proxy sends a service's traffic through its waypoint (spec §6.3 step 3), with real sockets, TLS and HBONE
on loopback.

The rig is one node proxy serving pod ``apps/client-0`` (at ``127.0.0.31``): its outbound handler
(:func:`ambit.proxy.outbound.serve_outbound`) gets each connection the pod opens, with the original destination the
kernel's REDIRECT would have given (the rig stands in for it, as ``inbound_rig`` does). The workload state says
service ``web`` (VIP ``198.19.0.10``) uses waypoint ``apps/waypoint``, whose one instance is a test HBONE server at
``127.0.0.32`` holding the waypoint's certificate (from the same CA) and echoing what it gets. The waypoint
Service maps its HBONE port 15008 to the port that server listens on, as a Service's ``targetPort`` would.
"""

from __future__ import annotations

import asyncio
import contextlib
import dataclasses
import logging
import socket
from collections.abc import AsyncIterator, Sequence
from pathlib import Path
from typing import Any
from unittest import mock

import pytest
from tests.integration.fake_waypoint import FakeWaypoint, call_outbound
from tests.integration.proxy_rig import until
from tests.unit.workload_builders import (
    WAYPOINT_BY_HOST,
    WEB_KEY,
    pod,
    state_with,
    waypoint_pod,
    waypoint_service,
    web_service,
)

from ambit.hbone.headers import parse_authority
from ambit.identity.localca import LocalCa
from ambit.identity.manager import CertificateManager
from ambit.model.identity import SpiffeId
from ambit.model.workload import GatewayAddress, NamespacedHostname, PortMapping, Service, TunnelProtocol, Workload
from ambit.proxy import outbound, sockets
from ambit.proxy.context import LocalPod, ProxyContext
from ambit.proxy.hbone_server import InboundRequest
from ambit.proxy.pool import ConnectionPool
from ambit.proxy.settings import ProxySettings
from ambit.proxy.sockets import HostSocketFactory
from ambit.telemetry.accesslog import AccessLog
from ambit.telemetry.metrics import ProxyMetrics
from ambit.zds.protocol import WorkloadInfo

pytestmark = pytest.mark.timeout(30)

TD = "cluster.local"
CLIENT_IP, WAYPOINT_IP, LEGACY_IP = "127.0.0.31", "127.0.0.32", "127.0.0.33"
VIP = "198.19.0.10"
CLIENT_ID = SpiffeId(TD, "apps", "client")
WAYPOINT_ID = SpiffeId(TD, "apps", "waypoint")
WEB_ID = SpiffeId(TD, "apps", "web")
ACCESS_LOGGER = "tests.waypoint_steering.access"
FACTORY = HostSocketFactory(mark=None)


@dataclasses.dataclass
class Rig:
    ctx: ProxyContext
    pod: LocalPod
    waypoint: FakeWaypoint
    ca: LocalCa

    def set_state(
        self,
        *workloads: Workload,
        web_waypoint: GatewayAddress | None = WAYPOINT_BY_HOST,
        waypoint_port: int | None = None,
    ) -> None:
        """Client, waypoint instance and ``workloads``; ``web`` uses ``web_waypoint``, whose HBONE port is the fake
        waypoint's unless ``waypoint_port`` says otherwise."""
        client = pod("client-0", CLIENT_IP, services={}, service_account="client")
        instance = waypoint_pod("waypoint-0", WAYPOINT_IP)
        services = [
            web_service(waypoint=web_waypoint),
            waypoint_service(ports=(PortMapping(15008, waypoint_port or self.waypoint.port),)),
        ]
        self.ctx.state.replace_all([client, instance, *workloads], services)
        self.ctx.state_changed()

    async def call(self, dst: tuple[str, int], payload: bytes) -> bytes:
        """What the pod gets back from a connection to ``dst`` carried by the node proxy (b"" if reset)."""
        return await call_outbound(self.ctx, self.pod, CLIENT_IP, dst, payload)

    def metric_lines(self, name: str) -> list[str]:
        text = self.ctx.metrics.render().decode()
        return [line for line in text.splitlines() if line.startswith(name + "{")]


@contextlib.asynccontextmanager
async def rig(tmp_path: Path, waypoint_identity: SpiffeId = WAYPOINT_ID) -> AsyncIterator[Rig]:
    ca = LocalCa(tmp_path / "ca", trust_domain=TD)
    waypoint = FakeWaypoint(await ca.fetch_certificate(waypoint_identity), WAYPOINT_IP)
    await waypoint.start()
    ctx = ProxyContext(
        settings=ProxySettings(node="node1", trust_domain=TD),
        state=state_with(),
        certs=CertificateManager(ca),
        pool=ConnectionPool(),
        metrics=ProxyMetrics(),
        access_log=AccessLog(logger=logging.getLogger(ACCESS_LOGGER)),
    )
    local = LocalPod("uid-client", WorkloadInfo("client-0", "apps", "client"), FACTORY, TD)
    ctx.add_pod(local)
    the_rig = Rig(ctx, local, waypoint, ca)
    the_rig.set_state()
    try:
        yield the_rig
    finally:
        await ctx.pool.aclose()
        await ctx.certs.aclose()
        await waypoint.aclose()


async def _echo(reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
    writer.write(await reader.read())
    await writer.drain()
    writer.close()


async def legacy_echo_server() -> tuple[asyncio.Server, int]:
    """An echo server at ``LEGACY_IP`` (an uncaptured pod's app, reached in plaintext) and its port; the caller
    closes it."""
    app = await asyncio.start_server(_echo, LEGACY_IP, 0)
    return app, app.sockets[0].getsockname()[1]


async def test_a_connection_to_a_vip_with_a_waypoint_arrives_at_the_waypoint_as_a_connect_to_the_vip(
    tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    async with rig(tmp_path) as r:
        with caplog.at_level(logging.INFO, logger=ACCESS_LOGGER):
            assert await r.call((VIP, 80), b"hello waypoint") == b"hello waypoint"
            await until(lambda: not r.ctx.connections)
        (request,) = r.waypoint.requests
        assert request.authority == f"{VIP}:80"  # the original destination, for the waypoint to route
        assert request.peer_identity == CLIENT_ID  # the waypoint saw the pod's own certificate
        forwarded = dict(request.headers)["forwarded"]
        assert forwarded.startswith(f'for="{CLIENT_IP}:') and forwarded.endswith(";host=web.apps.svc.cluster.local")
        # Reported as ztunnel reports waypoint traffic: the waypoint as destination, for the original service.
        (opened,) = r.metric_lines("istio_tcp_connections_opened_total")
        assert 'destination_workload="waypoint-0"' in opened
        assert f'destination_principal="{WAYPOINT_ID}"' in opened
        assert 'destination_service="web.apps.svc.cluster.local"' in opened
        assert 'connection_security_policy="mutual_tls"' in opened
        lines = [rec.getMessage() for rec in caplog.records if rec.name == ACCESS_LOGGER]
        assert any(f"{WAYPOINT_IP}:{r.waypoint.port}" in line and f"{VIP}:80" in line for line in lines), lines


async def test_the_proxy_refuses_a_server_at_the_waypoints_address_without_the_waypoints_identity(
    tmp_path: Path,
) -> None:
    # Whoever answers at the waypoint's address with another mesh identity (here: web's) gets no CONNECT.
    async with rig(tmp_path, waypoint_identity=WEB_ID) as r:
        assert await r.call((VIP, 80), b"secret") == b""
        await until(lambda: not r.ctx.connections)
        assert r.waypoint.handshakes >= 1 and r.waypoint.requests == []
        (failed,) = r.metric_lines("istio_tcp_connections_failed_total")
        assert 'destination_workload="waypoint-0"' in failed and 'response_flags="IDENTITY_ERROR"' in failed


async def test_a_waypoint_that_does_not_resolve_refuses_the_connection_and_counts_it(
    tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    async with rig(tmp_path) as r:
        r.set_state(web_waypoint=GatewayAddress(NamespacedHostname("apps", "gone.apps.svc.cluster.local")))
        with caplog.at_level(logging.INFO, logger=ACCESS_LOGGER):
            assert await r.call((VIP, 80), b"secret") == b""
        assert r.waypoint.handshakes == 0
        (failed,) = r.metric_lines("istio_tcp_connections_failed_total")
        assert 'response_flags="NR"' in failed
        lines = [rec.getMessage() for rec in caplog.records if rec.name == ACCESS_LOGGER]
        assert any("waypoint apps/gone.apps.svc.cluster.local:15008 not found" in line for line in lines), lines


async def test_a_connection_to_a_pod_ip_without_a_waypoint_still_goes_straight_to_the_pod(tmp_path: Path) -> None:
    app, port = await legacy_echo_server()
    try:
        async with rig(tmp_path) as r:
            # The pod is an endpoint of web, whose waypoint is for the service only: pod-IP traffic skips it.
            legacy = pod("legacy-0", LEGACY_IP, tunnel_protocol=TunnelProtocol.NONE)
            r.set_state(legacy)
            assert await r.call((LEGACY_IP, port), b"direct") == b"direct"
            assert r.waypoint.handshakes == 0 and r.waypoint.requests == []
            # Through the VIP, the same pod is reached through the waypoint.
            assert await r.call((VIP, 80), b"via") == b"via"
            assert [req.authority for req in r.waypoint.requests] == [f"{VIP}:80"]
    finally:
        app.close()
        await app.wait_closed()


async def test_a_pod_ip_whose_workload_has_a_waypoint_arrives_at_the_waypoint_as_a_connect_to_the_pod(
    tmp_path: Path,
) -> None:
    async with rig(tmp_path) as r:
        fronted = pod("web-0", LEGACY_IP, waypoint=WAYPOINT_BY_HOST)
        r.set_state(fronted, web_waypoint=None)
        assert await r.call((LEGACY_IP, 8080), b"to the pod") == b"to the pod"
        (request,) = r.waypoint.requests
        assert request.authority == f"{LEGACY_IP}:8080" and parse_authority(request.authority)[1] == 8080


async def test_a_connection_the_waypoint_refuses_after_the_binding_moved_is_planned_again_and_goes_through(
    tmp_path: Path,
) -> None:
    """Rule 7 of the outbound module: the waypoint heard that web no longer uses it before this proxy did (it
    answers 400); once this proxy's state says so too, the same connection goes straight to web's pod."""

    app, port = await legacy_echo_server()
    legacy = pod(
        "legacy-0", LEGACY_IP, tunnel_protocol=TunnelProtocol.NONE, services={WEB_KEY: (PortMapping(80, port),)}
    )
    try:
        async with rig(tmp_path) as r:
            r.set_state(legacy)

            def moved_away(request: InboundRequest) -> int:
                r.set_state(legacy, web_waypoint=None)  # the update reaches this proxy just after the waypoint
                return 400

            r.waypoint.answer = moved_away
            assert await r.call((VIP, 80), b"moved") == b"moved"
            assert [req.authority for req in r.waypoint.requests] == [f"{VIP}:80"]
            await until(lambda: not r.ctx.connections)
            assert r.metric_lines("istio_tcp_connections_failed_total") == []
            (opened,) = r.metric_lines("istio_tcp_connections_opened_total")
            assert 'destination_workload="legacy-0"' in opened  # counted once, where it went
    finally:
        app.close()
        await app.wait_closed()


async def test_a_waypoint_that_has_not_heard_of_the_binding_yet_is_tried_again_until_it_has(tmp_path: Path) -> None:
    """Rule 7a the other way round: this proxy heard first that web uses the waypoint; the waypoint refuses as
    not served until its own update lands, and the same connection then goes through it."""
    async with rig(tmp_path) as r:
        r.waypoint.answer = lambda request: 400 if len(r.waypoint.requests) < 3 else 200
        assert await r.call((VIP, 80), b"late waypoint") == b"late waypoint"
        assert len(r.waypoint.requests) == 3
        await until(lambda: not r.ctx.connections)
        assert r.metric_lines("istio_tcp_connections_failed_total") == []
        (opened,) = r.metric_lines("istio_tcp_connections_opened_total")
        assert 'destination_workload="waypoint-0"' in opened and "} 1" in opened  # one connection, counted once


async def test_a_refusal_stands_when_the_state_does_not_change_or_the_waypoint_denies(tmp_path: Path) -> None:
    async with rig(tmp_path) as r:
        r.waypoint.answer = lambda request: 400
        started = asyncio.get_running_loop().time()
        assert await r.call((VIP, 80), b"no") == b""  # the waypoint never serves web: the refusal stands
        took = asyncio.get_running_loop().time() - started
        steps = sum(outbound.REPLAN_STEP * 2**n for n in range(outbound.REPLAN_TRIES - 1))
        assert min(steps, outbound.REPLAN_WAIT) * 0.9 <= took < outbound.REPLAN_WAIT + 1.0
        assert 2 <= len(r.waypoint.requests) <= outbound.REPLAN_TRIES  # bounded: tries, and the budget

        def denied_and_moved(request: InboundRequest) -> int:
            r.set_state(web_waypoint=None)
            return 401  # denied by policy: final, whatever the state says meanwhile

        r.set_state()
        tried = len(r.waypoint.requests)
        r.waypoint.answer = denied_and_moved
        assert await r.call((VIP, 80), b"no") == b""
        assert len(r.waypoint.requests) == tried + 1
        await until(lambda: not r.ctx.connections)
        failed = r.metric_lines("istio_tcp_connections_failed_total")
        assert failed and all('destination_workload="waypoint-0"' in line for line in failed)


async def test_an_unreachable_waypoint_is_left_once_the_state_sends_the_connection_elsewhere(tmp_path: Path) -> None:
    """Rule 7b: the waypoint is going away (nothing listens at its address: its Gateway was deleted, its pod is
    terminating); this proxy has not heard yet. Once it hears web has no waypoint any more, the same connection
    goes straight to web's pod. With no such news the connection fails within the budget, and the unreachable
    instance is dialled once, not again and again."""

    app, port = await legacy_echo_server()
    legacy = pod(
        "legacy-0", LEGACY_IP, tunnel_protocol=TunnelProtocol.NONE, services={WEB_KEY: (PortMapping(80, port),)}
    )
    closed = socket.create_server((WAYPOINT_IP, 0))
    gone = closed.getsockname()[1]
    closed.close()  # connections to it are refused
    try:
        async with rig(tmp_path) as r:
            r.set_state(legacy, waypoint_port=gone)
            loop = asyncio.get_running_loop()
            loop.call_later(0.3, lambda: r.set_state(legacy, web_waypoint=None))
            assert await r.call((VIP, 80), b"after the waypoint") == b"after the waypoint"
            await until(lambda: not r.ctx.connections)
            assert r.metric_lines("istio_tcp_connections_failed_total") == []
            (opened,) = r.metric_lines("istio_tcp_connections_opened_total")
            assert 'destination_workload="legacy-0"' in opened

            r.set_state(legacy, waypoint_port=gone)
            dials = 0
            real_connect = sockets.connect

            async def counting(*args: Any, **kwargs: Any) -> socket.socket:
                nonlocal dials
                dials += 1
                return await real_connect(*args, **kwargs)

            started = loop.time()
            with mock.patch.object(outbound, "connect", counting):
                # Unrelated updates meanwhile wake the connection, which must not dial the same instance again.
                for at in (0.2, 0.6, 1.0):
                    loop.call_later(at, lambda: r.set_state(legacy, waypoint_port=gone))
                assert await r.call((VIP, 80), b"no") == b""
            assert outbound.REPLAN_WAIT * 0.9 <= loop.time() - started < outbound.REPLAN_WAIT + 1.0
            assert dials == 1
    finally:
        app.close()
        await app.wait_closed()


# On demand (outbound rule 8): the state holds only the client until the control plane answers.


class FakeControlPlane:
    """Stands in for the xDS client's ``demand``: records what was asked and, per name, what the answer adds."""

    def __init__(self, r: Rig, answers: dict[str, tuple[Workload | Service, ...]], *, answered: bool = True) -> None:
        self.r, self.answers, self.answered = r, answers, answered
        self.asked: list[tuple[str, ...]] = []

    async def demand(self, names: Sequence[str], wait: float) -> bool:
        self.asked.append(tuple(names))
        if not self.answered:
            return False
        for name in names:
            for item in self.answers.get(name, ()):
                if isinstance(item, Workload):
                    self.r.ctx.state.upsert_workload(item)
                else:
                    self.r.ctx.state.upsert_service(item)
        self.r.ctx.state_changed()
        return True


def _only_the_client(r: Rig) -> None:
    r.ctx.state.replace_all([pod("client-0", CLIENT_IP, services={}, service_account="client")], [])
    r.ctx.state_changed()


async def test_on_demand_the_destination_then_its_waypoint_are_asked_for_before_the_connection_is_planned(
    tmp_path: Path,
) -> None:
    async with rig(tmp_path) as r:
        _only_the_client(r)
        instance = waypoint_pod("waypoint-0", WAYPOINT_IP)
        plane = FakeControlPlane(
            r,
            {
                f"/{VIP}": (web_service(waypoint=WAYPOINT_BY_HOST),),
                "apps/" + WAYPOINT_BY_HOST.destination.hostname: (  # type: ignore[union-attr]
                    waypoint_service(ports=(PortMapping(15008, r.waypoint.port),)),
                    instance,
                ),
            },
        )
        r.ctx.demand = plane.demand
        assert await r.call((VIP, 80), b"on demand") == b"on demand"
        assert plane.asked == [(f"/{VIP}",), (f"apps/{WAYPOINT_BY_HOST.destination.hostname}",)]  # type: ignore[union-attr]
        (request,) = r.waypoint.requests
        assert request.authority == f"{VIP}:80"
        assert await r.call((VIP, 80), b"again") == b"again"
        assert len(plane.asked) == 2  # known now: nothing asked


async def test_on_demand_an_address_known_absent_goes_as_outside_the_mesh_and_no_answer_fails_closed(
    tmp_path: Path,
) -> None:
    app, port = await legacy_echo_server()
    try:
        async with rig(tmp_path) as r:
            _only_the_client(r)
            plane = FakeControlPlane(r, {})
            r.ctx.demand = plane.demand
            assert await r.call((LEGACY_IP, port), b"outside") == b"outside"  # passthrough, after asking
            assert plane.asked == [(f"/{LEGACY_IP}",)]

            silent = FakeControlPlane(r, {}, answered=False)
            r.ctx.demand = silent.demand
            assert await r.call((VIP, 80), b"secret") == b""  # the control plane did not answer: reset
            assert silent.asked == [(f"/{VIP}",)]
            await until(lambda: not r.ctx.connections)
            (failed,) = r.metric_lines("istio_tcp_connections_failed_total")
            assert 'response_flags="NR"' in failed
    finally:
        app.close()
        await app.wait_closed()


async def test_on_demand_a_pod_handed_to_the_proxy_has_its_workload_asked_for_at_once(tmp_path: Path) -> None:
    async with rig(tmp_path) as r:
        _only_the_client(r)
        late = pod("late-0", "127.0.0.34", services={}, service_account="late")
        plane = FakeControlPlane(r, {late.uid: (late,)})
        r.ctx.demand = plane.demand
        local = LocalPod("uid-late", WorkloadInfo("late-0", "apps", "late"), FACTORY, TD)
        assert local.workload_uid == late.uid
        r.ctx.add_pod(local)
        await until(lambda: r.ctx.find_local_workload(local) == late)
        assert plane.asked == [(late.uid,)]
        r.ctx.add_pod(local)  # handed again (a snapshot after a reconnect): known, nothing asked
        await asyncio.sleep(0)
        assert plane.asked == [(late.uid,)]
