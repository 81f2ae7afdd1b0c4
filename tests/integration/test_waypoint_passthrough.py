"""A ``resolution: NONE`` ServiceEntry bound to an egress waypoint (upstream TestWaypointAsEgressGateway "resolution
none"): the real waypoint process on loopback serves a CONNECT to the entry's address at L7 and forwards to that
same address and port (Envoy's ORIGINAL_DST), where an "external" HTTP server outside the mesh listens.

The attacks: the waypoint must not become an open proxy. A trap server listens on another loopback address at the
same port; a CONNECT naming it, a CONNECT naming the entry's hostname, and a request whose headers name the trap
(``Host``, ``x-envoy-original-dst-host``) must never reach it.
"""

from __future__ import annotations

import asyncio
import dataclasses
import ipaddress
import socket
from collections.abc import AsyncIterator
from dataclasses import dataclass
from pathlib import Path

import pytest
from aiohttp import web
from tests.integration.proxy_rig import read_all
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
from ambit.model.workload import (
    AppProtocol,
    HealthPolicy,
    LoadBalancingMode,
    NetworkAddress,
    PortMapping,
    Service,
    TunnelProtocol,
    Workload,
)
from ambit.proxy.hbone_client import HboneClient, TunnelRefusedError
from ambit.waypoint.process import Waypoint
from ambit.waypoint.settings import WaypointLimits

pytestmark = pytest.mark.timeout(60)

EXTERNAL_IP, TRAP_IP, CLIENT_IP = "127.0.0.77", "127.0.0.78", "127.0.0.4"
IN_RANGE_IP, RANGE = "127.0.1.9", "127.0.1.0/24"  # a second entry's CIDR address ("resolution none CIDR")
HOST = "fake-passthrough.example.com"
LIMITS = WaypointLimits(max_head_bytes=8 * 1024, head_timeout=2.0, sniff_timeout=0.5, startup_wait=5.0)


def mesh(port: int, tcp_port: int) -> LocalConfig:
    client = Workload(
        uid="Kubernetes//Pod/app/client",
        name="client",
        namespace="app",
        addresses=(ipaddress.ip_address(CLIENT_IP),),
        tunnel_protocol=TunnelProtocol.HBONE,
        service_account=CLIENT_ID.service_account,
    )
    entry = Service(
        name="external-resolution-none",
        namespace="app",
        hostname=HOST,
        vips=(NetworkAddress("", ipaddress.ip_address(EXTERNAL_IP)),),
        ports=(PortMapping(port, port, AppProtocol.HTTP11), PortMapping(tcp_port, tcp_port, AppProtocol.TCP)),
        waypoint=WAYPOINT_ADDR,
        load_balancing_mode=LoadBalancingMode.PASSTHROUGH,
        health_policy=HealthPolicy.ALLOW_ALL,
    )
    ranged = dataclasses.replace(
        entry, name="external-cidr", hostname="fake-cidr.example.com", vips=(NetworkAddress.of_cidr("", RANGE),)
    )
    return LocalConfig(workloads=(client,), services=(entry, ranged))


@dataclass
class Egress:
    waypoint: Waypoint
    ca: LocalCa
    port: int
    seen: dict[str, list[dict[str, str]]]
    tcp_port: int

    async def relay(self, authority: str, payload: bytes) -> bytes:
        """Bytes through a CONNECT to ``authority`` (a TCP port): what comes back."""
        loop = asyncio.get_running_loop()
        sock = socket.socket()
        sock.setblocking(False)
        sock.bind((CLIENT_IP, 0))
        await loop.sock_connect(sock, ("127.0.0.1", self.waypoint.settings.hbone_port))
        cert = await self.ca.fetch_certificate(CLIENT_ID)
        client = await HboneClient.connect(sock, cert, frozenset({WAYPOINT_ID}), trust_domain=TD)
        try:
            stream = await client.open_tunnel(authority, [("forwarded", f'for="{CLIENT_IP}:1"')])
            await stream.write(payload)
            stream.write_eof()
            return await read_all(stream)
        finally:
            await client.aclose()

    async def request(self, authority: str, headers: list[tuple[str, str]] | None = None) -> tuple[int, bytes]:
        """One GET through a CONNECT to ``authority``; a refused CONNECT is its status and no body."""
        loop = asyncio.get_running_loop()
        sock = socket.socket()
        sock.setblocking(False)
        sock.bind((CLIENT_IP, 0))
        await loop.sock_connect(sock, ("127.0.0.1", self.waypoint.settings.hbone_port))
        cert = await self.ca.fetch_certificate(CLIENT_ID)
        client = await HboneClient.connect(sock, cert, frozenset({WAYPOINT_ID}), trust_domain=TD)
        try:
            try:
                stream = await client.open_tunnel(authority, [("forwarded", f'for="{CLIENT_IP}:1"')])
            except TunnelRefusedError as exc:
                return exc.status, b""
            status, _, body = await HttpOverTunnel(stream, host=HOST).request("GET", "/echo", headers=headers)
            return status, body
        finally:
            await client.aclose()


@pytest.fixture
async def egress(tmp_path: Path) -> AsyncIterator[Egress]:
    seen: dict[str, list[dict[str, str]]] = {EXTERNAL_IP: [], TRAP_IP: [], IN_RANGE_IP: []}

    async def echo(request: web.Request) -> web.Response:
        local = request.transport.get_extra_info("sockname")[0] if request.transport else ""
        answer = {
            "at": str(local),
            "host": request.headers.get("host", ""),
            "id": request.headers.get("x-request-id", ""),
        }
        seen[str(local)].append(answer)
        return web.json_response(answer)

    app = web.Application()
    app.router.add_get("/echo", echo)
    runner = web.AppRunner(app, access_log=None, shutdown_timeout=0.1)
    await runner.setup()
    port = free_port(EXTERNAL_IP)
    await web.TCPSite(runner, EXTERNAL_IP, port).start()
    await web.TCPSite(runner, TRAP_IP, port).start()
    await web.TCPSite(runner, IN_RANGE_IP, port).start()
    config = tmp_path / "mesh.yaml"

    async def tcp_echo(reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        writer.write(b"tcp:" + await reader.read(1024))
        await writer.drain()
        writer.close()

    tcp_server = await asyncio.start_server(tcp_echo, EXTERNAL_IP, 0)
    tcp_port = tcp_server.sockets[0].getsockname()[1]
    config.write_text(render_local_config(mesh(port, tcp_port)), encoding="utf-8")
    waypoint = Waypoint(waypoint_settings(config, tmp_path / "ca", LIMITS))
    await waypoint.start()
    try:
        yield Egress(waypoint, LocalCa(tmp_path / "ca", trust_domain=TD), port, seen, tcp_port)
    finally:
        await waypoint.aclose()
        await runner.cleanup()
        tcp_server.close()
        await tcp_server.wait_closed()


async def test_a_connect_to_the_entrys_address_is_served_at_l7_and_sent_to_that_address(egress: Egress) -> None:
    status, body = await egress.request(f"{EXTERNAL_IP}:{egress.port}")
    assert status == 200
    answer = echo_of(body)
    assert answer["at"] == EXTERNAL_IP and answer["host"] == HOST
    assert answer["id"]  # the waypoint handled it at L7 (IsL7)


async def test_a_connect_naming_any_other_address_is_refused_and_nothing_is_dialled(egress: Egress) -> None:
    for authority in (f"{TRAP_IP}:{egress.port}", f"{EXTERNAL_IP}:{egress.port + 1}", f"10.255.0.1:{egress.port}"):
        status, _ = await egress.request(authority)
        assert status == 400, authority
    assert egress.seen[TRAP_IP] == []


async def test_a_connect_naming_the_hostname_has_no_original_destination(egress: Egress) -> None:
    status, _ = await egress.request(f"{HOST}:{egress.port}")
    assert status == 503
    assert egress.seen == {EXTERNAL_IP: [], TRAP_IP: [], IN_RANGE_IP: []}


async def test_headers_naming_another_destination_do_not_move_the_connection(egress: Egress) -> None:
    trap = f"{TRAP_IP}:{egress.port}"
    headers = [("x-envoy-original-dst-host", trap), ("x-forwarded-host", trap)]
    status, body = await egress.request(f"{EXTERNAL_IP}:{egress.port}", headers=headers)
    assert status == 200 and echo_of(body)["at"] == EXTERNAL_IP
    assert egress.seen[TRAP_IP] == []


async def test_any_address_in_an_entrys_cidr_range_is_that_entry_and_goes_where_it_was_sent(egress: Egress) -> None:
    status, body = await egress.request(f"{IN_RANGE_IP}:{egress.port}")
    assert status == 200 and echo_of(body)["at"] == IN_RANGE_IP
    status, _ = await egress.request(f"127.0.2.9:{egress.port}")  # just outside the range
    assert status == 400
    assert egress.seen[TRAP_IP] == []


async def test_a_tcp_port_of_the_entry_is_relayed_to_the_address_the_connect_named(egress: Egress) -> None:
    assert await egress.relay(f"{EXTERNAL_IP}:{egress.tcp_port}", b"bytes") == b"tcp:bytes"
