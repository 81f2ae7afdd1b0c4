"""``istio.io/connect-strategy: RACE_FIRST_TCP_CONNECT`` at the waypoint (upstream TestWaypointDNSConnectStrategy):
the real waypoint process on loopback, a ``resolution: DNS`` ServiceEntry bound to it whose endpoint name resolves
(scripted DNS) to a dead address and a live one. With the strategy in its WaypointConfig the waypoint dials every
address at once and keeps the first connection, so every request arrives whatever the answer's order; addresses
the waypoint may not dial (``0.0.0.0``, which reaches loopback) are never tried.
"""

from __future__ import annotations

import asyncio
import contextlib
import ipaddress
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
    waypoint_settings,
)

from ambit.identity.localca import LocalCa
from ambit.model.localconfig import LocalConfig, render_local_config
from ambit.model.routes import WaypointConfig
from ambit.model.workload import AppProtocol, NetworkAddress, PortMapping, Service, TunnelProtocol, Workload
from ambit.proxy.hbone_client import HboneClient
from ambit.proxy.hostnames import HostnameCache
from ambit.proxy.sockets import HostSocketFactory
from ambit.waypoint.process import Waypoint
from ambit.waypoint.racing import MAX_RACE, RaceLostError, race_connect
from ambit.waypoint.settings import WaypointLimits

pytestmark = pytest.mark.timeout(60)

LIVE_IP, DEAD_IP, CLIENT_IP = "127.0.0.6", "127.0.0.8", "127.0.0.4"
VIP, HOST, KEY = "240.240.0.9", "race.example.com", "app/race.example.com"
LIMITS = WaypointLimits(max_head_bytes=8 * 1024, head_timeout=2.0, sniff_timeout=0.5, startup_wait=5.0)


def mesh(port: int) -> LocalConfig:
    client = Workload(
        uid="Kubernetes//Pod/app/client",
        name="client",
        namespace="app",
        addresses=(ipaddress.ip_address(CLIENT_IP),),
        tunnel_protocol=TunnelProtocol.HBONE,
        service_account=CLIENT_ID.service_account,
    )
    endpoint = Workload(
        uid="Kubernetes/networking.istio.io/ServiceEntry/app/race/race.example.net",
        name="race",
        namespace="app",
        addresses=(),
        hostname="race.example.net",
        services={KEY: (PortMapping(80, port),)},
    )
    service = Service(
        name="race",
        namespace="app",
        hostname=HOST,
        vips=(NetworkAddress("", ipaddress.ip_address(VIP)),),
        ports=(PortMapping(80, port, AppProtocol.HTTP11),),
        waypoint=WAYPOINT_ADDR,
    )
    return LocalConfig(workloads=(client, endpoint), services=(service,))


@dataclass
class Egress:
    waypoint: Waypoint
    dns: ScriptedDns
    ca: LocalCa
    hits: list[str]
    trapped: list[str]

    def forget(self) -> None:
        """Drop the waypoint's cached answers (the next request asks the scripted server again)."""
        resolver = self.waypoint.context.upstreams.hostnames
        assert resolver is not None
        resolver.cache = HostnameCache()

    def race(self, on: bool = True) -> None:
        self.waypoint.context.routes.replace(WaypointConfig("app/waypoint", race_first_connect=(KEY,) if on else ()))

    async def get(self) -> int:
        loop = asyncio.get_running_loop()
        sock = socket.socket()
        sock.setblocking(False)
        sock.bind((CLIENT_IP, 0))
        await loop.sock_connect(sock, ("127.0.0.1", self.waypoint.settings.hbone_port))
        cert = await self.ca.fetch_certificate(CLIENT_ID)
        client = await HboneClient.connect(sock, cert, frozenset({WAYPOINT_ID}), trust_domain=TD)
        try:
            stream = await client.open_tunnel(f"{VIP}:80", [("forwarded", f'for="{CLIENT_IP}:1"')])
            status, _, body = await HttpOverTunnel(stream, host=HOST).request("GET", "/echo")
            return status if status != 200 else {"live": 200, "trap": 299}[echo_of(body)["endpoint"]]
        finally:
            await client.aclose()


@pytest.fixture
async def egress(tmp_path: Path) -> AsyncIterator[Egress]:
    hits: list[str] = []
    trapped: list[str] = []

    async def echo(request: web.Request) -> web.Response:
        trap = request.transport is not None and request.transport.get_extra_info("sockname")[0] != LIVE_IP
        (trapped if trap else hits).append(str(request.remote))
        response = web.json_response({"endpoint": "trap" if trap else "live"})
        response.force_close()  # every request makes the waypoint connect (and race) again
        return response

    app = web.Application()
    app.router.add_get("/echo", echo)
    runner = web.AppRunner(app, access_log=None, shutdown_timeout=0.1)
    await runner.setup()
    port = free_port("127.0.0.1")
    await web.TCPSite(runner, LIVE_IP, port).start()
    await web.TCPSite(runner, "127.0.0.1", port).start()  # what 0.0.0.0 would reach: a trap
    admin_port = free_port()
    script: dict[str, list[str] | str] = {"race.example.net": [DEAD_IP, LIVE_IP]}
    async with scripted_dns(script, ttl=30) as dns:
        config = tmp_path / "mesh.yaml"
        config.write_text(render_local_config(mesh(port)), encoding="utf-8")
        settings = waypoint_settings(
            config, tmp_path / "ca", LIMITS, admin_port=admin_port, dns_nameservers=("127.0.0.1",), dns_port=dns.port
        )
        waypoint = Waypoint(settings)
        await waypoint.start()
        try:
            yield Egress(waypoint, dns, LocalCa(tmp_path / "ca", trust_domain=TD), hits, trapped)
        finally:
            await waypoint.aclose()
            await runner.cleanup()


async def test_with_racing_every_request_reaches_the_live_address_whatever_the_order(egress: Egress) -> None:
    egress.race()
    for order in ([DEAD_IP, LIVE_IP], [LIVE_IP, DEAD_IP]):
        egress.dns.script["race.example.net"] = order
        egress.forget()
        assert [await egress.get() for _ in range(6)] == [200] * 6
    assert len(egress.hits) == 12


async def test_without_racing_one_address_is_dialled_so_the_dead_one_fails(egress: Egress) -> None:
    egress.race(on=False)
    egress.dns.script["race.example.net"] = [DEAD_IP]
    assert await egress.get() == 503


async def test_a_race_where_every_address_is_dead_is_a_503(egress: Egress) -> None:
    egress.race()
    egress.dns.script["race.example.net"] = [DEAD_IP, "127.0.0.9"]
    assert await egress.get() == 503
    assert egress.hits == []


async def test_addresses_the_waypoint_may_not_dial_never_join_the_race(egress: Egress) -> None:
    """A hostile answer with ``0.0.0.0`` (which the kernel turns into loopback, where a trap listens on the same
    port) beside a live address: only the live one is dialled; alone, it is a 503 and nothing is dialled."""
    egress.race()
    for _ in range(4):
        egress.dns.script["race.example.net"] = ["0.0.0.0", LIVE_IP]
        egress.forget()
        assert await egress.get() == 200
    egress.dns.script["race.example.net"] = ["0.0.0.0"]
    egress.forget()
    assert await egress.get() == 503
    assert egress.trapped == [] and len(egress.hits) == 4


async def test_race_connect_keeps_the_first_connection_and_closes_the_rest() -> None:
    port = free_port("127.0.0.8")
    live = [socket.create_server((a, port)) for a in ("127.0.0.6", "127.0.0.7")]
    try:
        addresses = [ipaddress.ip_address(a) for a in ("127.0.0.8", "127.0.0.6", "127.0.0.7")]
        sock, ip = await race_connect(HostSocketFactory(mark=None), addresses, port, timeout=2.0)
        with sock:
            assert str(ip) in ("127.0.0.6", "127.0.0.7") and sock.getpeername() == (str(ip), port)
        # a loser that connected too was closed: its accepted end reads EOF at once
        for server in live:
            server.setblocking(False)
            with contextlib.suppress(BlockingIOError):
                accepted, _ = server.accept()
                with accepted:
                    accepted.settimeout(2.0)
                    assert accepted.recv(1) == b""
    finally:
        for server in live:
            server.close()


async def test_race_connect_reports_every_failure_and_dials_at_most_max_race() -> None:
    port = free_port("127.0.0.8")
    dead = [ipaddress.ip_address(f"127.0.1.{i}") for i in range(1, MAX_RACE + 5)]
    with pytest.raises(RaceLostError) as raised:
        await race_connect(HostSocketFactory(mark=None), dead, port, timeout=2.0)
    assert str(raised.value).count("refused") == MAX_RACE
    with pytest.raises(RaceLostError, match="no address"):
        await race_connect(HostSocketFactory(mark=None), [], port, timeout=2.0)
