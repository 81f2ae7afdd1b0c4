"""A waypoint bound to ``resolution: DNS`` ServiceEntries (TestWaypointDNS, TestWaypointAsEgressGateway): the real
waypoint process on loopback resolves each hostname endpoint through a scripted DNS server
(:mod:`tests.integration.dns_upstream`) and forwards to an "external" echo server on 127.0.0.6 that is not in the
mesh (plain HTTP, no HBONE). Hostile answers (NXDOMAIN, garbage, ``0.0.0.0``, the waypoint's own admin port) end
in a 503 with the reason logged, never in a dial of the waypoint itself.
"""

from __future__ import annotations

import asyncio
import ipaddress
import logging
import socket
from collections.abc import AsyncIterator
from dataclasses import dataclass
from pathlib import Path

import pytest
from aiohttp import web
from tests.integration.dns_upstream import ScriptedDns, scripted_dns
from tests.integration.waypoint_rig import (
    CLIENT_ID,
    TD,
    WAYPOINT_ADDR,
    WAYPOINT_ID,
    HttpOverTunnel,
    echo_of,
    free_port,
    mirroring_router,
    waypoint_settings,
)

from ambit.hbone.headers import hostport
from ambit.identity.localca import LocalCa
from ambit.model.localconfig import LocalConfig, render_local_config
from ambit.model.policy import Action, Clause, Match, Policy, Rule, Scope
from ambit.model.routes import WaypointConfig
from ambit.model.workload import AppProtocol, NetworkAddress, PortMapping, Service, TunnelProtocol, Workload
from ambit.proxy.hbone_client import HboneClient
from ambit.proxy.hbone_stream import HboneStream
from ambit.waypoint.process import Waypoint
from ambit.waypoint.settings import WaypointLimits

EXTERNAL_IP = "127.0.0.6"
CLIENT_IP = "127.0.0.4"
# The rig dials one HBONE connection per request from 127.0.0.1 without a pool, so a 40-request burst is 40
# handshakes from one peer address: above the per-peer bound a node proxy's pooled connections never reach.
LIMITS = WaypointLimits(
    max_head_bytes=8 * 1024,
    head_timeout=2.0,
    sniff_timeout=0.5,
    startup_wait=5.0,
    max_pending_handshakes_per_peer=64,
)


@dataclass(frozen=True)
class Entry:
    """One ServiceEntry: its host, VIP, the name its one endpoint resolves, the target port, the protocol."""

    host: str
    vip: str
    endpoint: str
    protocol: AppProtocol = AppProtocol.HTTP11
    vip6: str = ""

    @property
    def key(self) -> str:
        return f"app/{self.host}"


def entries(echo_port: int, admin_port: int) -> tuple[tuple[Entry, int], ...]:
    """Each entry with its endpoint's target port."""
    return (
        (Entry("fake-egress.example.com", "240.240.0.1", "external.example.net"), echo_port),
        (Entry("fake-tcp.example.com", "240.240.0.2", "external.example.net", AppProtocol.TCP), echo_port),
        (Entry("nxdomain.example.com", "240.240.0.3", "missing.example.net"), echo_port),
        (Entry("garbage.example.com", "240.240.0.4", "garbage.example.net"), echo_port),
        (Entry("zero.example.com", "240.240.0.5", "zero.example.net"), echo_port),
        (Entry("admin.example.com", "240.240.0.6", "loopback.example.net"), admin_port),
        (Entry("v6only.example.com", "240.240.0.7", "v6only.example.net"), echo_port),
        (Entry("dual.example.com", "240.240.0.8", "dual.example.net", vip6="2001:2::8"), echo_port),
        (Entry("dual-tcp.example.com", "240.240.0.9", "dual.example.net", AppProtocol.TCP, "2001:2::9"), echo_port),
    )


SCRIPT: dict[str, list[str] | str] = {
    "external.example.net": [EXTERNAL_IP],
    "garbage.example.net": "garbage",
    "zero.example.net": ["0.0.0.0"],
    "loopback.example.net": ["127.0.0.1"],
    "v6only.example.net": ["::1"],
    "dual.example.net": [EXTERNAL_IP, "::1"],
}


def mesh(echo_port: int, admin_port: int) -> LocalConfig:
    workloads = [
        Workload(
            uid=f"Kubernetes//Pod/app/{CLIENT_ID.service_account}",
            name="client",
            namespace="app",
            addresses=(ipaddress.ip_address(CLIENT_IP),),
            tunnel_protocol=TunnelProtocol.HBONE,
            service_account="client",
        )
    ]
    services = []
    for entry, target_port in entries(echo_port, admin_port):
        workloads.append(
            Workload(
                uid=f"Kubernetes/networking.istio.io/ServiceEntry/app/{entry.host}/{entry.endpoint}",
                name=entry.host,
                namespace="app",
                addresses=(),
                hostname=entry.endpoint,
                tunnel_protocol=TunnelProtocol.NONE,
                services={entry.key: (PortMapping(80, target_port),)},
            )
        )
        services.append(
            Service(
                name=entry.host,
                namespace="app",
                hostname=entry.host,
                vips=tuple(NetworkAddress("", ipaddress.ip_address(vip)) for vip in (entry.vip, entry.vip6) if vip),
                ports=(PortMapping(80, target_port, entry.protocol),),
                waypoint=WAYPOINT_ADDR,
            )
        )
    return LocalConfig(workloads=tuple(workloads), services=tuple(services))


@dataclass
class Egress:
    waypoint: Waypoint
    dns: ScriptedDns
    ca: LocalCa
    seen: list[dict[str, str]]

    async def tunnel(self, authority: str) -> tuple[HboneClient, HboneStream]:
        loop = asyncio.get_running_loop()
        sock = socket.socket()
        sock.setblocking(False)
        sock.bind((CLIENT_IP, 0))
        await loop.sock_connect(sock, ("127.0.0.1", self.waypoint.settings.hbone_port))
        cert = await self.ca.fetch_certificate(CLIENT_ID)
        client = await HboneClient.connect(sock, cert, frozenset({WAYPOINT_ID}), trust_domain=TD)
        return client, await client.open_tunnel(authority, [("forwarded", f'for="{CLIENT_IP}:1"')])

    async def request(
        self, vip: str, host: str, method: str = "GET", headers: list[tuple[str, str]] | None = None
    ) -> tuple[int, bytes]:
        client, stream = await self.tunnel(hostport(vip, 80))
        try:
            status, _, body = await HttpOverTunnel(stream, host=host).request(method, "/echo", headers=headers)
            return status, body
        finally:
            await client.aclose()


async def _external_echo(seen: list[dict[str, str]]) -> tuple[web.AppRunner, int]:
    async def echo(request: web.Request) -> web.Response:
        answer = {
            "endpoint": "external",
            "method": request.method,
            "host": request.headers.get("host", ""),
            "request_id": request.headers.get("x-request-id", ""),
            "peer": str(request.remote),
        }
        seen.append(answer)
        return web.json_response(answer)

    app = web.Application()
    app.router.add_route("*", "/echo", echo)
    runner = web.AppRunner(app, access_log=None, shutdown_timeout=0.1)
    await runner.setup()
    port = free_port(EXTERNAL_IP)
    await web.TCPSite(runner, EXTERNAL_IP, port).start()
    await web.TCPSite(runner, "::1", port).start()  # where v6only.example.net points
    return runner, port


@pytest.fixture
async def egress(tmp_path: Path) -> AsyncIterator[Egress]:
    seen: list[dict[str, str]] = []
    runner, echo_port = await _external_echo(seen)
    async with scripted_dns(SCRIPT, ttl=30) as dns:
        admin_port = free_port()
        config = tmp_path / "mesh.yaml"
        config.write_text(render_local_config(mesh(echo_port, admin_port)), encoding="utf-8")
        settings = waypoint_settings(
            config,
            tmp_path / "ca",
            LIMITS,
            admin_port=admin_port,
            dns_nameservers=("127.0.0.1",),
            dns_port=dns.port,
        )
        ca = LocalCa(tmp_path / "ca", trust_domain=TD)
        waypoint = Waypoint(settings)
        await waypoint.start()
        try:
            yield Egress(waypoint, dns, ca, seen)
        finally:
            await waypoint.aclose()
            await runner.cleanup()


async def test_a_dns_service_entry_is_reached_through_the_waypoint_at_l7(egress: Egress) -> None:
    status, body = await egress.request("240.240.0.1", "fake-egress.example.com")
    assert status == 200
    answer = echo_of(body)
    assert answer["endpoint"] == "external" and answer["host"] == "fake-egress.example.com"
    assert answer["request_id"]  # the waypoint handled it at L7 (IsL7)
    assert answer["peer"] == "127.0.0.1"  # plain TCP from the waypoint, no HBONE to an external host
    # a second request is answered from the cache
    assert (await egress.request("240.240.0.1", "fake-egress.example.com"))[0] == 200
    assert egress.dns.asked[("external.example.net", "A")] == 1
    resolver = egress.waypoint.context.upstreams.hostnames
    assert resolver is not None and resolver.requests >= 1


async def test_a_tcp_service_entry_is_relayed_to_the_resolved_address(egress: Egress) -> None:
    status, body = await egress.request("240.240.0.2", "fake-tcp.example.com")
    assert status == 200
    answer = echo_of(body)
    assert answer["endpoint"] == "external" and answer["request_id"] == ""  # L4: bytes relayed as they are


async def test_a_name_with_only_an_ipv6_address_is_reached_over_ipv6(egress: Egress) -> None:
    status, body = await egress.request("240.240.0.7", "v6only.example.com")
    assert status == 200 and echo_of(body)["peer"] == "::1"
    # IPv4 is asked first (as Istio's waypoint prefers it), then IPv6
    assert egress.dns.asked[("v6only.example.net", "A")] == 1
    assert egress.dns.asked[("v6only.example.net", "AAAA")] == 1


async def test_a_name_with_both_versions_is_dialled_in_the_family_of_the_vip_the_client_called(egress: Egress) -> None:
    """TestWaypointDNS's two legs on a dual-stack entry: a client that called the entry's IPv4 address reaches the
    server over IPv4, one that called its IPv6 address over IPv6 (the server sees the waypoint's address of that
    family), at L7 and as TCP; kept connections are never shared across the two."""
    for vip, host in (("240.240.0.8", "dual.example.com"), ("240.240.0.9", "dual-tcp.example.com")):
        for _ in range(2):  # the second call of each family on a kept connection, for HTTP
            for called, peer in ((vip, "127.0.0.1"), (vip.replace("240.240.0.", "2001:2::"), "::1")):
                status, body = await egress.request(called, host)
                assert status == 200 and echo_of(body)["peer"] == peer, (called, body)


async def test_a_mirrored_copy_goes_in_the_family_of_the_vip_the_client_called(egress: Egress) -> None:
    """A RequestMirror to a hostname entry resolves its name in the client's family, as the request itself does."""

    egress.waypoint.context.router = mirroring_router
    for called, peer in (("240.240.0.8", "127.0.0.1"), ("2001:2::8", "::1")):
        egress.seen.clear()
        status, body = await egress.request(called, "dual.example.com")
        assert status == 200 and echo_of(body)["peer"] == peer, (called, body)
        async with asyncio.timeout(10):
            while not any(s["host"].endswith("-shadow") for s in egress.seen):  # noqa: ASYNC110
                await asyncio.sleep(0.01)
        (shadow,) = [s for s in egress.seen if s["host"].endswith("-shadow")]
        assert shadow["peer"] == peer, (called, shadow)


async def test_an_authorization_policy_targeting_the_service_entry_is_enforced(egress: Egress) -> None:
    only_get = Policy(
        "only-get",
        "app",
        Scope.SERVICE,
        Action.ALLOW,
        (Rule((Clause((Match(methods=("GET",)),)),)),),
        services=("app/fake-egress.example.com",),
    )
    egress.waypoint.context.routes.replace(WaypointConfig("app/waypoint", policies=(only_get,)))
    assert await egress.request("240.240.0.1", "fake-egress.example.com", "POST") == (403, b"RBAC: access denied")
    assert (await egress.request("240.240.0.1", "fake-egress.example.com", "GET"))[0] == 200
    assert [a["method"] for a in egress.seen] == ["GET"]


@pytest.mark.parametrize(
    ("vip", "host", "reason"),
    [
        ("240.240.0.3", "nxdomain.example.com", "NXDOMAIN"),
        ("240.240.0.4", "garbage.example.com", "did not answer"),
        ("240.240.0.5", "zero.example.com", "cannot be dialled"),
        ("240.240.0.6", "admin.example.com", "one of the waypoint's own"),
    ],
)
async def test_a_hostile_or_failed_answer_is_a_503_with_the_reason_logged(
    egress: Egress, caplog: pytest.LogCaptureFixture, vip: str, host: str, reason: str
) -> None:
    caplog.set_level(logging.INFO, logger="access")
    status, body = await egress.request(vip, host)
    assert status == 503 and b"Traceback" not in body
    lines = [r.getMessage() for r in caplog.records if r.name == "access"]
    assert any(reason in line for line in lines), lines
    assert egress.seen == []
    # the waypoint still serves
    assert (await egress.request("240.240.0.1", "fake-egress.example.com"))[0] == 200


async def test_a_flood_of_requests_to_a_dead_name_asks_upstream_once(egress: Egress) -> None:
    results = await asyncio.gather(*(egress.request("240.240.0.3", "nxdomain.example.com") for _ in range(40)))
    assert {status for status, _ in results} == {503}
    assert egress.dns.asked[("missing.example.net", "A")] == 1  # concurrent misses share a lookup, then cached
    assert (await egress.request("240.240.0.1", "fake-egress.example.com"))[0] == 200
