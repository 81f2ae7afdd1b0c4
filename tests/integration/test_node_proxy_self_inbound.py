"""The node proxy's self-proxy listener (:mod:`ambit.inpod.self_inbound`) on loopback: a meshed client reaches the
proxy's own metrics port over HBONE, with the proxy's own identity, and nothing else of the proxy.

The proxy's "own pod" is ``istio-system/ztunnel-abc`` at a loopback address; a plain HTTP server on that address's
port 15020 stands in for the proxy's metrics endpoint (the real one listens on 0.0.0.0:15020).
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import os
import socket
from collections.abc import AsyncIterator
from pathlib import Path

import pytest
from tests.unit.workload_builders import pod, state_with

from ambit.identity.localca import LocalCa
from ambit.identity.manager import CertificateManager
from ambit.inpod.self_inbound import SelfInbound
from ambit.model.identity import SpiffeId
from ambit.model.policy import Action, Clause, Match, Policy, Rule, Scope, StringMatch
from ambit.model.workload import TunnelProtocol
from ambit.proxy.context import ProxyContext
from ambit.proxy.hbone_client import HboneClient, TunnelRefusedError
from ambit.proxy.pool import ConnectionPool
from ambit.proxy.settings import ProxySettings
from ambit.proxy.sockets import HostSocketFactory
from ambit.telemetry.accesslog import AccessLog
from ambit.telemetry.metrics import ProxyMetrics
from ambit.zds.protocol import WorkloadInfo

pytestmark = pytest.mark.timeout(30)

TD = "cluster.local"
OWN_IP = f"127.0.61.{1 + int(os.environ.get('PYTEST_XDIST_WORKER', 'gw0').removeprefix('gw') or 0)}"
"""The proxy's own address, one per xdist worker: three tests bind its port 15020, and a worker runs them one at a
time while another worker may run one of them at once (a shared address collided, EADDRINUSE)."""
CLIENT_IP = "127.0.0.63"
ZTUNNEL = SpiffeId(TD, "istio-system", "ztunnel")
CLIENT = SpiffeId(TD, "apps", "client")
FACTORY = HostSocketFactory(mark=None)


@contextlib.asynccontextmanager
async def self_proxy(tmp_path: Path) -> AsyncIterator[tuple[SelfInbound, ProxyContext, LocalCa]]:
    ca = LocalCa(tmp_path / "ca", trust_domain=TD)
    own = pod(
        "ztunnel-abc",
        OWN_IP,
        uid="Kubernetes//Pod/istio-system/ztunnel-abc",
        namespace="istio-system",
        service_account="ztunnel",
        services={},
        tunnel_protocol=TunnelProtocol.HBONE,
    )
    ctx = ProxyContext(
        settings=ProxySettings(node="node-1", trust_domain=TD),
        state=state_with(own),
        certs=CertificateManager(ca),
        pool=ConnectionPool(),
        metrics=ProxyMetrics(),
        access_log=AccessLog(logger=logging.getLogger("tests.self_inbound.access")),
    )
    listener = SelfInbound(ctx, WorkloadInfo("ztunnel-abc", "istio-system", "ztunnel"), OWN_IP, port=0)
    await listener.start()
    try:
        yield listener, ctx, ca
    finally:
        await listener.aclose()
        await ctx.pool.aclose()
        await ctx.certs.aclose()


@contextlib.asynccontextmanager
async def metrics_stand_in() -> AsyncIterator[list[str]]:
    """An HTTP server on OWN_IP:15020 answering one line; yields the peer addresses it saw."""
    peers: list[str] = []

    async def answer(reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        peers.append(writer.get_extra_info("peername")[0])
        await reader.readuntil(b"\r\n\r\n")
        writer.write(b"HTTP/1.1 200 OK\r\ncontent-length: 34\r\n\r\n# TYPE istio_build gauge\nfake 1\n\n")
        await writer.drain()
        writer.close()

    server = await asyncio.start_server(answer, OWN_IP, 15020)
    try:
        yield peers
    finally:
        server.close()
        await server.wait_closed()


async def client(listener: SelfInbound, ca: LocalCa, identity: SpiffeId = CLIENT) -> HboneClient:
    """An HBONE connection from CLIENT_IP, the server checked for the proxy's own identity only."""
    cert = await ca.fetch_certificate(identity)
    tcp = socket.socket()
    tcp.setblocking(False)
    tcp.bind((CLIENT_IP, 0))
    await asyncio.get_running_loop().sock_connect(tcp, listener.address)
    return await HboneClient.connect(tcp, cert, frozenset({ZTUNNEL}), trust_domain=TD)


async def test_a_meshed_client_scrapes_the_proxys_own_metrics_over_hbone_and_is_counted(tmp_path: Path) -> None:
    async with self_proxy(tmp_path) as (listener, ctx, ca), metrics_stand_in() as peers:
        hbone = await client(listener, ca)  # the server proved the proxy's own identity (expected: ZTUNNEL only)
        try:
            stream = await hbone.open_tunnel(f"{OWN_IP}:15020", [])
            await stream.write(b"GET /metrics HTTP/1.1\r\nhost: x\r\n\r\n")
            got = b""
            async with asyncio.timeout(5):
                while chunk := await stream.read():
                    got += chunk
            assert got.startswith(b"HTTP/1.1 200 OK") and b"# TYPE" in got
        finally:
            await hbone.aclose()
        assert peers and CLIENT_IP not in peers  # dialled from the proxy's own side, never as the client
        text = ctx.metrics.render().decode()
        opened = [line for line in text.splitlines() if line.startswith("istio_tcp_connections_opened_total{")]
        assert opened and 'reporter="destination"' in opened[0]
        assert 'destination_workload="ztunnel-abc"' in opened[0]
        assert f'destination_principal="{ZTUNNEL}"' in opened[0] and f'source_principal="{CLIENT}"' in opened[0]


@pytest.mark.parametrize("port", [15008, 15001, 15006, 15000, 15080])
async def test_no_other_port_of_the_proxy_is_reachable_through_it(tmp_path: Path, port: int) -> None:
    async with self_proxy(tmp_path) as (listener, _, ca):
        hbone = await client(listener, ca)
        try:
            with pytest.raises(TunnelRefusedError) as refused:
                await hbone.open_tunnel(f"{OWN_IP}:{port}", [])
            assert refused.value.status == 400
        finally:
            await hbone.aclose()


async def test_a_tunnel_to_another_address_is_refused(tmp_path: Path) -> None:
    """The authority must be the proxy's own address (an open relay otherwise)."""
    async with self_proxy(tmp_path) as (listener, _, ca), metrics_stand_in():
        hbone = await client(listener, ca)
        try:
            with pytest.raises(TunnelRefusedError) as refused:
                await hbone.open_tunnel("127.0.0.62:15020", [])
            assert refused.value.status == 400
        finally:
            await hbone.aclose()


async def test_policies_for_the_proxys_own_workload_apply(tmp_path: Path) -> None:
    async with self_proxy(tmp_path) as (listener, ctx, ca), metrics_stand_in():
        scrapers = Match(namespaces=(StringMatch.exact("apps"),))
        deny = Policy("deny-scrapers", "istio-system", Scope.NAMESPACE, Action.DENY, (Rule((Clause((scrapers,)),)),))
        ctx.policies.replace_all((deny,))
        hbone = await client(listener, ca)
        try:
            with pytest.raises(TunnelRefusedError) as refused:
                await hbone.open_tunnel(f"{OWN_IP}:15020", [])
            assert refused.value.status == 401
        finally:
            await hbone.aclose()
