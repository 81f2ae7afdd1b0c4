"""Istio's TestSimpleHTTPSandwich on loopback (the rig and its objects: :mod:`tests.integration.sandwich_rig`).

The path: a client's node proxy steers a connection to the VIP to the gateway pod's HBONE port (the outbound plan,
checked on the same translated state); the gateway pod's node proxy terminates the tunnel and dials the gateway on
the authority's port; the gateway routes by the Host header, adds the header, and sends the request in plain text
(its node proxy would tunnel it: the gateway knows its pod is captured) to the endpoint.
"""

from __future__ import annotations

import asyncio
import ipaddress
from pathlib import Path

import pytest
from tests.integration.inbound_rig import POD_IP, SERVER, TD, InboundProxy
from tests.integration.sandwich_rig import CLIENT, FACTORY, HOSTS, OTHER_VIP, VIP, sandwich

from ambit.model.workload import NamespacedHostname
from ambit.proxy.hbone_client import HboneClient, TunnelRefusedError
from ambit.proxy.plans import NodeView, OutboundFacts, Tunnel, plan_outbound
from ambit.proxy.sockets import connect

pytestmark = pytest.mark.timeout(60)


async def call(proxy: InboundProxy, authority: str, host: str) -> tuple[int, bytes]:
    """What a client's node proxy does for a request to ``authority``: an HBONE tunnel to the gateway pod with that
    authority, carrying one HTTP/1.1 request with Host ``host``; the tunnel's refusal status, else the response's
    status and head."""
    cert = await proxy.ca.fetch_certificate(CLIENT)
    client = await HboneClient.connect(await connect(FACTORY, proxy.hbone), cert, frozenset({SERVER}), trust_domain=TD)
    try:
        try:
            stream = await client.open_tunnel(authority, [])
        except TunnelRefusedError as exc:
            return exc.status, b""
        await stream.write(f"GET /sandwich HTTP/1.1\r\nhost: {host}\r\nconnection: close\r\n\r\n".encode())
        response = b""
        async with asyncio.timeout(10):
            while chunk := await stream.read():
                response += chunk
        stream.abort()
        head = response.partition(b"\r\n\r\n")[0]
        return int(head.split(b" ", 2)[1]), head.lower()
    finally:
        await client.aclose()


async def test_every_hostname_variant_traverses_the_gateway_and_reaches_the_service(tmp_path: Path) -> None:
    async with sandwich(tmp_path) as rig:
        proxy, proc, translation, port, seen = rig.proxy, rig.gateway, rig.translation, rig.port, rig.seen
        # The control plane bound the Service to the Gateway, as a waypoint given by hostname.
        captured = next(s for s in translation.config.services if s.name == "captured")
        assert captured.waypoint is not None
        assert captured.waypoint.destination == NamespacedHostname(
            "apps", "simple-http-waypoint-istio.apps.svc.cluster.local"
        )
        # A client's node proxy tunnels a connection to the VIP to the gateway pod, the authority the VIP.
        state = proxy.ctx.state
        client = next(w for w in state.find_workloads_on_node("node-2") if w.name == "client")
        plan = plan_outbound(
            OutboundFacts(ipaddress.ip_address(VIP), VIP, port, client),
            state,
            NodeView("", "node-2", {client.uid}),
            lambda candidates: candidates[0],
        )
        assert isinstance(plan, Tunnel)
        assert plan.address == (POD_IP, 15008) and plan.authority == f"{VIP}:{port}"
        assert proc.captured()
        for host in HOSTS:
            status, head = await call(proxy, f"{VIP}:{port}", host)
            assert status == 200, (host, head)
            assert b"\r\ntraversed-waypoint: captured-gateway" in head, (host, head)
        assert seen == list(HOSTS)  # plain text to the endpoint (no tunnel of its own: its node proxy's job)


async def test_a_host_the_gateway_has_no_listener_for_is_not_forwarded(tmp_path: Path) -> None:
    async with sandwich(tmp_path) as rig:
        proxy, port, seen = rig.proxy, rig.port, rig.seen
        status, _head = await call(proxy, f"{VIP}:{port}", "other.apps.svc.cluster.local")
        assert status == 404
        assert seen == []


async def test_a_service_not_bound_to_the_gateway_cannot_be_tunnelled_to_it(tmp_path: Path) -> None:
    async with sandwich(tmp_path) as rig:
        proxy, translation, port, seen = rig.proxy, rig.translation, rig.port, rig.seen
        other = next(s for s in translation.config.services if s.name == "other")
        assert other.waypoint is None
        status, _head = await call(proxy, f"{OTHER_VIP}:{port}", "captured")
        assert status == 400  # the gateway pod's node proxy: "ip mismatch", not a Service it fronts
        assert seen == []
