"""Istio's TestSimpleHTTPSandwich on loopback: an ingress Gateway (class ``istio``) whose pod is captured by the node
proxy serves, as a waypoint, a Service labelled ``istio.io/use-waypoint`` with its name, real sockets throughout.

The objects are those of the upstream test, translated by the control plane's own :func:`translate_all`: Gateway
``simple-http-waypoint`` (labelled ``istio.io/dataplane-mode: ambient``, annotated ``service-type: ClusterIP``,
one HTTP listener per hostname variant of ``captured`` plus the fake 15008 TCP listener), the HTTPRoute adding
``traversed-waypoint``, Service ``captured`` bound to the Gateway. Its pod ``apps/web`` at ``127.0.0.2`` (the
:mod:`tests.integration.inbound_rig` pod, enrolled) runs the real :class:`IngressGateway`; its node proxy's inbound
is the rig's. ``captured``'s pod at ``127.0.0.3`` is a plain HTTP server that echoes the Host header.

The path: a client's node proxy steers a connection to the VIP to the gateway pod's HBONE port (the outbound plan,
checked on the same translated state); the gateway pod's node proxy terminates the tunnel and dials the gateway on
the authority's port; the gateway routes by the Host header, adds the header, and sends the request in plain text
(its node proxy would tunnel it: the gateway knows its pod is captured) to the endpoint.
"""

from __future__ import annotations

import asyncio
import contextlib
import ipaddress
from collections.abc import AsyncIterator
from pathlib import Path
from typing import Any

import pytest
import yaml
from aiohttp import web
from tests.integration.inbound_rig import POD_IP, SERVER, TD, InboundProxy, inbound_proxy
from tests.integration.waypoint_rig import free_port

from ambit.controlplane.translate import Translation, translate_all
from ambit.model.identity import SpiffeId
from ambit.model.localconfig import render_local_config
from ambit.model.workload import NamespacedHostname
from ambit.proxy.hbone_client import HboneClient, TunnelRefusedError
from ambit.proxy.plans import NodeView, OutboundFacts, Tunnel, plan_outbound
from ambit.proxy.sockets import HostSocketFactory, connect
from ambit.waypoint.ingress import IngressGateway
from ambit.waypoint.settings import WaypointSettings

pytestmark = pytest.mark.timeout(60)

FACTORY = HostSocketFactory(mark=None)
CLIENT = SpiffeId(TD, "apps", "client")
VIP = "198.19.0.10"
OTHER_VIP = "198.19.0.11"
BACKEND_IP = "127.0.0.3"
HOSTS = ("captured", "captured.apps", "captured.apps.svc", "captured.apps.svc.cluster.local")
"""The upstream test's ``HostnameVariants()``: what a client's Host header says."""


def objects(port: int, target_port: int) -> dict[str, list[Any]]:
    listeners = "".join(
        f"""
  - name: {name}
    hostname: {host}
    port: {port}
    protocol: HTTP
    allowedRoutes:
      namespaces:
        from: Same"""
        for name, host in zip(("short", "namespace", "svc", "fqdn"), HOSTS, strict=True)
    )
    docs = list(
        yaml.safe_load_all(
            f"""
apiVersion: gateway.networking.k8s.io/v1
kind: Gateway
metadata:
  name: simple-http-waypoint
  namespace: apps
  uid: gw-uid
  labels:
    istio.io/dataplane-mode: ambient
  annotations:
    networking.istio.io/service-type: ClusterIP
spec:
  gatewayClassName: istio
  listeners:{listeners}
  - name: fake-hbone-port
    port: 15008
    protocol: TCP
status:
  addresses:
  - type: Hostname
    value: simple-http-waypoint-istio.apps.svc.cluster.local
---
apiVersion: gateway.networking.k8s.io/v1
kind: HTTPRoute
metadata:
  name: captured-httproute
  namespace: apps
spec:
  parentRefs:
  - name: simple-http-waypoint
  hostnames: [{", ".join(HOSTS)}]
  rules:
  - matches:
    - path:
        type: PathPrefix
        value: /
    filters:
    - type: ResponseHeaderModifier
      responseHeaderModifier:
        add:
        - name: traversed-waypoint
          value: captured-gateway
    backendRefs:
    - name: captured
      port: {port}
---
apiVersion: v1
kind: Service
metadata:
  name: captured
  namespace: apps
  uid: captured-uid
  labels:
    istio.io/use-waypoint: simple-http-waypoint
spec:
  clusterIP: {VIP}
  selector:
    app: captured
  ports:
  - name: http
    port: {port}
    targetPort: {target_port}
---
apiVersion: v1
kind: Service
metadata:
  name: other
  namespace: apps
  uid: other-uid
spec:
  clusterIP: {OTHER_VIP}
  selector:
    app: captured
  ports:
  - name: http
    port: {port}
    targetPort: {target_port}
---
apiVersion: v1
kind: Service
metadata:
  name: simple-http-waypoint-istio
  namespace: apps
  uid: gw-svc-uid
spec:
  type: ClusterIP
  clusterIP: 198.19.0.20
  selector:
    gateway.networking.k8s.io/gateway-name: simple-http-waypoint
  ports:
  - name: http
    port: {port}
  - name: fake-hbone-port
    port: 15008
---
apiVersion: v1
kind: Pod
metadata:
  name: web
  namespace: apps
  uid: web-uid
  labels:
    gateway.networking.k8s.io/gateway-name: simple-http-waypoint
    istio.io/dataplane-mode: ambient
  annotations:
    ambient.istio.io/redirection: enabled
spec:
  serviceAccountName: web
  nodeName: node-1
status:
  phase: Running
  podIP: {POD_IP}
  conditions: [{{type: Ready, status: "True"}}]
---
apiVersion: v1
kind: Pod
metadata:
  name: captured-1
  namespace: apps
  uid: captured-1-uid
  labels:
    app: captured
  annotations:
    ambient.istio.io/redirection: enabled
spec:
  serviceAccountName: captured
  nodeName: node-2
status:
  phase: Running
  podIP: {BACKEND_IP}
  conditions: [{{type: Ready, status: "True"}}]
---
apiVersion: v1
kind: Pod
metadata:
  name: client
  namespace: apps
  uid: client-uid
  annotations:
    ambient.istio.io/redirection: enabled
spec:
  serviceAccountName: client
  nodeName: node-2
status:
  phase: Running
  podIP: 127.0.0.4
  conditions: [{{type: Ready, status: "True"}}]
"""
        )
    )
    out: dict[str, list[Any]] = {}
    for doc in docs:
        out.setdefault(doc["kind"], []).append(doc)
    return out


def translate(port: int, target_port: int) -> Translation:
    objs = objects(port, target_port)
    return translate_all(
        objs["Pod"],
        objs["Service"],
        [],
        [{"metadata": {"name": "apps"}}],
        gateways=objs["Gateway"],
        http_routes=objs["HTTPRoute"],
    )


@contextlib.asynccontextmanager
async def backend(port: int) -> AsyncIterator[list[str]]:
    """``captured``'s pod: answers its Host header; what each request's Host was is recorded."""
    seen: list[str] = []

    async def answer(request: web.Request) -> web.Response:
        seen.append(request.headers.get("host", ""))
        return web.json_response({"host": request.headers.get("host", "")})

    app = web.Application()
    app.router.add_route("*", "/{tail:.*}", answer)
    runner = web.AppRunner(app, access_log=None, shutdown_timeout=0.1)
    await runner.setup()
    await web.TCPSite(runner, BACKEND_IP, port).start()
    try:
        yield seen
    finally:
        await runner.cleanup()


@contextlib.asynccontextmanager
async def sandwich(tmp_path: Path) -> AsyncIterator[tuple[InboundProxy, IngressGateway, Translation, int, list[str]]]:
    port, target_port = free_port(POD_IP), free_port(BACKEND_IP)
    translation = translate(port, target_port)
    state = tmp_path / "mesh.yaml"
    state.write_text(render_local_config(translation.config), encoding="utf-8")
    (gateway_config,) = translation.gateway_configs
    own = next(w for w in translation.config.workloads if w.name == "web")
    async with backend(target_port) as seen, inbound_proxy(tmp_path, own) as proxy:
        proxy.ctx.state.replace_all(translation.config.workloads, translation.config.services)
        settings = WaypointSettings(
            namespace="apps",
            gateway_name="simple-http-waypoint",
            service_account="web",
            pod_name="web",
            instance_ip=POD_IP,
            config_file=state,
            local_ca_dir=tmp_path / "ca",
            admin_port=free_port(),
            stats_port=free_port(),
            readiness_port=free_port(),
        )
        proc = IngressGateway(settings)
        proc.apply(gateway_config)
        await proc.start()
        try:
            async with asyncio.timeout(15):
                await proc.startup.ready.wait()
            yield proxy, proc, translation, port, seen
        finally:
            await proc.aclose()


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
    async with sandwich(tmp_path) as (proxy, proc, translation, port, seen):
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
    async with sandwich(tmp_path) as (proxy, _proc, _translation, port, seen):
        status, _head = await call(proxy, f"{VIP}:{port}", "other.apps.svc.cluster.local")
        assert status == 404
        assert seen == []


async def test_a_service_not_bound_to_the_gateway_cannot_be_tunnelled_to_it(tmp_path: Path) -> None:
    async with sandwich(tmp_path) as (proxy, _proc, translation, port, seen):
        other = next(s for s in translation.config.services if s.name == "other")
        assert other.waypoint is None
        status, _head = await call(proxy, f"{OTHER_VIP}:{port}", "captured")
        assert status == 400  # the gateway pod's node proxy: "ip mismatch", not a Service it fronts
        assert seen == []
