"""The HBONE listeners the flood tests attack (``test_listener_floods.py``), each with its gate and a way to open a
legitimate tunnel that relays to an echo server: a pod's 15008 as the node proxy runs it (the pod accept loop of
:mod:`ambit.inpod.workloads` with its gate, then :func:`ambit.proxy.inbound.serve_hbone`), the node proxy's
self-proxy 15008 (:mod:`ambit.inpod.self_inbound`) and a waypoint's 15008 (:mod:`tests.integration.waypoint_rig`).
Each gate's refusals are counted in the listener's metrics, as the node proxy counts them (:func:`refusals`).
"""

from __future__ import annotations

import asyncio
import contextlib
import errno
import hashlib
import json
import logging
import socket
import time
from collections.abc import AsyncIterator, Awaitable, Callable, Coroutine
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from tests.integration.inbound_rig import POD_IP, inbound_proxy
from tests.integration.waypoint_rig import ECHO_VIP, HttpOverTunnel, Rig, started_rig
from tests.security.listener_flood import dial_from
from tests.unit.workload_builders import pod, state_with

from ambit.identity.localca import LocalCa
from ambit.identity.manager import CertificateManager
from ambit.inpod.self_inbound import SelfInbound
from ambit.inpod.workloads import PodListenerManager, PodProxy
from ambit.model.identity import SpiffeId
from ambit.model.workload import TunnelProtocol
from ambit.proxy.admission import ListenerGate, ListenerLimits, NodeBudget, Ticket, refusal_reporter
from ambit.proxy.context import ProxyContext
from ambit.proxy.hbone_client import HboneClient
from ambit.proxy.hbone_stream import HboneStream
from ambit.proxy.inbound import serve_hbone
from ambit.proxy.pool import ConnectionPool
from ambit.proxy.settings import ProxySettings
from ambit.telemetry.accesslog import AccessLog
from ambit.telemetry.metrics import ProxyMetrics
from ambit.tls.workload import WorkloadCertificate
from ambit.waypoint.settings import WaypointLimits
from ambit.zds.protocol import WorkloadInfo

TD = "cluster.local"
CLIENT = SpiffeId(TD, "apps", "client")
LIMITS = ListenerLimits(max_connections=256, max_pending=32, max_pending_per_peer=8, handshake_timeout=5.0)
"""Small bounds, so that a flood is several times them; a handshake timeout well above the flood's own time."""


@dataclass
class Target:
    """An HBONE listener under test, with a way to open a legitimate tunnel relaying to an echo server."""

    addr: tuple[str, int]
    gate: ListenerGate
    metrics: ProxyMetrics
    tunnel: Callable[..., Awaitable[tuple[HboneClient, Callable[[bytes], Awaitable[bytes]]]]]
    client_cert: WorkloadCertificate
    """A mesh client's certificate the listener accepts (what an attacker with a compromised workload holds)."""


def round_trips(stream: HboneStream) -> Callable[[bytes], Awaitable[bytes]]:
    async def once(payload: bytes) -> bytes:
        await stream.write(payload)
        got = b""
        while len(got) < len(payload):
            chunk = await stream.read()
            assert chunk, "the tunnel ended"
            got += chunk
        return got

    return once


@contextlib.asynccontextmanager
async def echo_server(host: str) -> AsyncIterator[int]:
    async def echo(reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        with contextlib.suppress(ConnectionError):
            while data := await reader.read(65536):
                writer.write(data)
                await writer.drain()
        writer.close()

    server = await asyncio.start_server(echo, host, 0)
    try:
        yield server.sockets[0].getsockname()[1]
    finally:
        server.close()


def gate_for(
    metrics: ProxyMetrics,
    kind: str = "hbone",
    limits: ListenerLimits = LIMITS,
    *,
    handshake: bool = True,
    per_peer: int | None = None,
) -> ListenerGate:
    """A listener's gate over a budget of its own, its refusals counted in ``metrics`` as the node proxy does."""
    report = refusal_reporter(metrics.connection_refused, time.monotonic, logging.getLogger())
    return ListenerGate(kind, limits, NodeBudget(4096, 1024, report, per_peer), handshake=handshake)


def refusals(metrics: ProxyMetrics, kind: str) -> dict[str, int]:
    found: dict[str, int] = {}
    for line in metrics.render().decode().splitlines():
        if line.startswith(f'ambit_listener_connections_refused_total{{listener="{kind}"'):
            labels, value = line.rsplit(" ", 1)
            reason = labels.split('reason="')[1].split('"')[0]
            found[reason] = int(float(value))
    return found


# --- the three listeners -----------------------------------------------------------------------------------------


@contextlib.asynccontextmanager
async def pod_listener(
    tmp_path: Path, per_peer: int | None = None, limits: ListenerLimits = LIMITS
) -> AsyncIterator[Target]:
    """A pod's 15008 as the node proxy runs it: the pod accept loop with its gate, then ``serve_hbone``; its
    ``tunnel`` takes the address to connect from."""
    async with inbound_proxy(tmp_path) as proxy, echo_server(POD_IP) as echo_port:
        ctx, local = proxy.ctx, proxy.ctx.pods["uid-web"]
        client_cert = await proxy.ca.fetch_certificate(CLIENT)
        gate = gate_for(ctx.metrics, limits=limits, per_peer=per_peer)
        listener = socket.create_server((POD_IP, 0), backlog=1024)
        listener.setblocking(False)
        pod_proxy = PodProxy("uid-web", local.info, listeners=[listener])

        def handler(sock: socket.socket, ticket: Ticket | None) -> Coroutine[Any, Any, None]:
            return serve_hbone(ctx, local, sock, ticket)

        pod_proxy.accept_tasks.append(
            asyncio.create_task(PodListenerManager._accept_loop(pod_proxy, listener, handler, gate))
        )
        addr = listener.getsockname()[:2]

        async def tunnel(source: str = "127.0.0.1") -> tuple[HboneClient, Callable[[bytes], Awaitable[bytes]]]:
            sock = await dial_from(source, addr)
            client = await HboneClient.connect(sock, client_cert, frozenset({local.identity}), trust_domain=TD)
            return client, round_trips(await client.open_tunnel(f"{POD_IP}:{echo_port}", []))

        try:
            yield Target(addr, gate, ctx.metrics, tunnel, client_cert)
        finally:
            await pod_proxy.aclose()


OWN_IP = "127.0.0.71"
"""The node proxy's own address in rigs that do not bind its ports (the self-proxy rig picks its own, below)."""
OWN_IPS = [f"127.0.71.{n}" for n in range(1, 251)]
"""Addresses the self-proxy rig tries for its stand-in 15020, one per rig at a time: the rig runs in parallel
workers (test_hbone_idle and test_listener_floods both use it), and one fixed address collided (EADDRINUSE)."""


async def _echo_on_metrics_port() -> tuple[asyncio.Server, str]:
    """An echo server on port 15020 of the first free address of :data:`OWN_IPS`."""
    for address in OWN_IPS:
        try:
            return await asyncio.start_server(_echo_handler, address, 15020), address
        except OSError as exc:
            if exc.errno != errno.EADDRINUSE:
                raise
    raise RuntimeError("port 15020 is taken on every address of OWN_IPS (a process listens on 0.0.0.0:15020?)")


@contextlib.asynccontextmanager
async def self_proxy_listener(tmp_path: Path, limits: ListenerLimits = LIMITS) -> AsyncIterator[Target]:
    """The node proxy's self-proxy 15008, its ports 15020/15021 stood in for by an echo server on 15020."""
    ca = LocalCa(tmp_path / "ca", trust_domain=TD)
    echo, own_ip = await _echo_on_metrics_port()
    own = pod(
        "ztunnel-abc",
        own_ip,
        uid="Kubernetes//Pod/istio-system/ztunnel-abc",
        namespace="istio-system",
        service_account="ztunnel",
        services={},
        tunnel_protocol=TunnelProtocol.HBONE,
    )
    metrics = ProxyMetrics()
    ctx = ProxyContext(
        settings=ProxySettings(node="node-1", trust_domain=TD),
        state=state_with(own),
        certs=CertificateManager(ca),
        pool=ConnectionPool(),
        metrics=metrics,
        access_log=AccessLog(logger=logging.getLogger("tests.listener_floods.access")),
    )
    gate = gate_for(metrics, "self_hbone", limits)
    listener = SelfInbound(ctx, WorkloadInfo("ztunnel-abc", "istio-system", "ztunnel"), own_ip, port=0, gate=gate)
    await listener.start()
    client_cert = await ca.fetch_certificate(CLIENT)

    async def tunnel() -> tuple[HboneClient, Callable[[bytes], Awaitable[bytes]]]:
        sock = await dial_from("127.0.0.1", listener.address)
        client = await HboneClient.connect(sock, client_cert, frozenset({listener.pod.identity}), trust_domain=TD)
        return client, round_trips(await client.open_tunnel(f"{own_ip}:15020", []))

    try:
        yield Target(listener.address, gate, metrics, tunnel, client_cert)
    finally:
        await listener.aclose()
        echo.close()
        await ctx.pool.aclose()
        await ctx.certs.aclose()


async def _echo_handler(reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
    with contextlib.suppress(ConnectionError):
        while data := await reader.read(65536):
            writer.write(data)
            await writer.drain()
    writer.close()


@contextlib.asynccontextmanager
async def waypoint_listener(tmp_path: Path, limits: ListenerLimits = LIMITS) -> AsyncIterator[Target]:
    """A waypoint's 15008 with the flood tests' bounds; the tunnel carries HTTP/1.1 to the rig's echo Service."""
    bounds = WaypointLimits(
        max_connections=limits.max_connections,
        max_pending_handshakes=limits.max_pending,
        max_pending_handshakes_per_peer=limits.max_pending_per_peer,
        handshake_timeout=limits.handshake_timeout,
        hbone_preface_timeout=limits.liveness.preface_timeout,
        hbone_idle_timeout=limits.liveness.idle_timeout,
        hbone_keepalive_interval=limits.liveness.keepalive_interval,
        hbone_keepalive_timeout=limits.liveness.keepalive_timeout,
    )
    async with started_rig(tmp_path, bounds) as rig:
        await _ready(rig)

        async def tunnel() -> tuple[HboneClient, Callable[[bytes], Awaitable[bytes]]]:
            client, stream = await rig.tunnel(f"{ECHO_VIP}:80")
            http = HttpOverTunnel(stream)

            async def once(payload: bytes) -> bytes:
                status, _, body = await http.request("POST", "/echo", payload)
                assert status == 200, status
                assert json.loads(body)["sha256"] == hashlib.sha256(payload).hexdigest()
                return payload

            return client, once

        yield Target(
            ("127.0.0.1", rig.settings.hbone_port),
            rig.waypoint.hbone_gate,
            rig.waypoint.metrics,
            tunnel,
            rig.client_cert,
        )


async def _ready(rig: Rig) -> None:
    async with asyncio.timeout(10):
        await rig.waypoint.startup.ready.wait()


LISTENERS = {"pod": pod_listener, "self_proxy": self_proxy_listener, "waypoint": waypoint_listener}
