"""A captured waypoint ("sandwich" mode) takes CONNECTs for what it fronts (spec §6.5 step 3), with real sockets, TLS
and HBONE on loopback.

The node proxy serves pod ``apps/web`` at ``POD_IP`` (:mod:`tests.integration.inbound_rig`); here that pod is an
instance of waypoint ``apps/waypoint``, and service ``web`` (VIP ``198.19.0.10``) uses that waypoint. A CONNECT whose
authority is the VIP, not the pod's own address, is dialled to the pod on the authority's port; anything else that
names another address is still the 400 "ip mismatch" of a pod that is no waypoint.
"""

from __future__ import annotations

import asyncio
import contextlib
from collections.abc import AsyncIterator
from pathlib import Path

import pytest
from tests.integration.inbound_rig import POD_IP, SERVER, TD, InboundProxy, inbound_proxy
from tests.unit.workload_builders import WAYPOINT_BY_HOST, WAYPOINT_KEY, pod, waypoint_service, web_service

from ambit.model.identity import SpiffeId
from ambit.proxy.hbone_client import HboneClient, TunnelRefusedError
from ambit.proxy.sockets import HostSocketFactory, connect

pytestmark = pytest.mark.timeout(30)

FACTORY = HostSocketFactory(mark=None)
CLIENT = SpiffeId(TD, "apps", "client")
VIP = "198.19.0.10"


@contextlib.asynccontextmanager
async def echo_app() -> AsyncIterator[int]:
    async def echo(reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        with contextlib.suppress(ConnectionError):
            while data := await reader.read(65536):
                writer.write(data)
                await writer.drain()
        writer.close()

    server = await asyncio.start_server(echo, POD_IP, 0)
    try:
        yield server.sockets[0].getsockname()[1]
    finally:
        server.close()
        await server.wait_closed()


@contextlib.asynccontextmanager
async def captured_waypoint(tmp_path: Path) -> AsyncIterator[InboundProxy]:
    # The served pod (uid .../apps/web, identity apps/web) is the waypoint's one instance.
    instance = pod("web", POD_IP, services={WAYPOINT_KEY: ()}, node="node-1")
    fronted = pod("web-0", "198.18.17.5")  # an endpoint of web, with no workload waypoint of its own
    async with inbound_proxy(tmp_path, instance) as proxy:
        proxy.ctx.state.replace_all([instance, fronted], [web_service(waypoint=WAYPOINT_BY_HOST), waypoint_service()])
        yield proxy


async def status_of(proxy: InboundProxy, authority: str) -> int:
    """200 when the tunnel opens and echoes, else the refusal's status."""
    cert = await proxy.ca.fetch_certificate(CLIENT)
    client = await HboneClient.connect(await connect(FACTORY, proxy.hbone), cert, frozenset({SERVER}), trust_domain=TD)
    try:
        stream = await client.open_tunnel(authority, [])
        await stream.write(b"ping")
        async with asyncio.timeout(5):
            assert await stream.read() == b"ping"
        stream.abort()
        return 200
    except TunnelRefusedError as exc:
        return exc.status
    finally:
        await client.aclose()


async def test_a_connect_to_the_vip_of_a_service_using_this_waypoint_reaches_the_waypoint_pod(tmp_path: Path) -> None:
    async with echo_app() as port, captured_waypoint(tmp_path) as proxy:
        assert await status_of(proxy, f"{VIP}:{port}") == 200


async def test_a_captured_waypoint_refuses_addresses_it_does_not_front(tmp_path: Path) -> None:
    async with echo_app() as port, captured_waypoint(tmp_path) as proxy:
        assert await status_of(proxy, f"198.18.17.5:{port}") == 400  # web-0's service, not web-0, uses the waypoint
        assert await status_of(proxy, f"198.18.99.9:{port}") == 400  # nothing the state knows
        assert await status_of(proxy, f"{VIP}:15020") == 400  # never into the proxy's own ports


async def test_a_pod_that_is_no_waypoint_refuses_the_vip_authority(tmp_path: Path) -> None:
    async with echo_app() as port, inbound_proxy(tmp_path) as proxy:
        web = proxy.workload
        proxy.ctx.state.replace_all([web], [web_service(waypoint=WAYPOINT_BY_HOST), waypoint_service()])
        assert await status_of(proxy, f"{VIP}:{port}") == 400
