"""The waypoint inbound binding end to end on loopback: a sandwich ingress Gateway annotated
``ambient.istio.io/waypoint-inbound-binding: PROXY/<port>`` learns each client's identity from its node proxy's PROXY
header and authorizes by it, real sockets throughout.

The objects are those of :mod:`tests.integration.test_ingress_gateway_sandwich` (Istio's TestSimpleHTTPSandwich)
with the annotation and an AuthorizationPolicy on the Gateway (``targetRefs``) that allows only the client's SPIFFE
id, translated by :func:`translate_all`. The gateway pod's node proxy (the rig's inbound side) then delivers each
tunnel to ``127.0.0.1:<port>`` after a PROXY v2 header; the real :class:`IngressGateway` listens there (loopback
only), serves the request as if it had come to its listener port, and allows it for the client's identity (200) and
for no other (403). The attacks: a header of the client's own making (inside its tunnel, or sent straight to the
gateway's listener) is never read as an identity, and the tunnel port is not reachable at the gateway's address.
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
from tests.integration.waypoint_rig import free_port, http_get

from ambit.controlplane.translate import Translation, translate_all
from ambit.model.identity import SpiffeId
from ambit.model.localconfig import render_local_config
from ambit.model.workload import ApplicationTunnel, AppTunnelProtocol
from ambit.proxy.hbone_client import HboneClient, TunnelRefusedError
from ambit.proxy.sockets import HostSocketFactory, connect
from ambit.proxyprotocol import TLV_PEER_IDENTITY, encode_v2
from ambit.waypoint.ingress import IngressGateway
from ambit.waypoint.settings import WaypointSettings

pytestmark = pytest.mark.timeout(60)

FACTORY = HostSocketFactory(mark=None)
CLIENT = SpiffeId(TD, "apps", "client")
CLIENT_PRINCIPAL = f"{TD}/ns/apps/sa/client"
INTRUDER = SpiffeId(TD, "apps", "intruder")
VIP = "198.19.0.10"
OTHER_VIP = "198.19.0.11"
BACKEND_IP = "127.0.0.3"
HOSTS = ("captured", "captured.apps", "captured.apps.svc", "captured.apps.svc.cluster.local")


def objects(port: int, target_port: int, tunnel_port: int) -> dict[str, list[Any]]:
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
    ambient.istio.io/waypoint-inbound-binding: PROXY/{tunnel_port}
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
apiVersion: security.istio.io/v1
kind: AuthorizationPolicy
metadata:
  name: only-the-client
  namespace: apps
  uid: only-the-client-uid
spec:
  targetRefs:
  - group: gateway.networking.k8s.io
    kind: Gateway
    name: simple-http-waypoint
  action: ALLOW
  rules:
  - from:
    - source:
        principals: ["{CLIENT_PRINCIPAL}"]
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


def translate(port: int, target_port: int, tunnel_port: int) -> Translation:
    objs = objects(port, target_port, tunnel_port)
    return translate_all(
        objs["Pod"],
        objs["Service"],
        [],
        [{"metadata": {"name": "apps"}}],
        gateways=objs["Gateway"],
        http_routes=objs["HTTPRoute"],
        authorization_policies=objs["AuthorizationPolicy"],
    )


@contextlib.asynccontextmanager
async def backend(port: int) -> AsyncIterator[list[str]]:
    """``captured``'s pod: answers 200; the Host of each request is recorded."""
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
async def sandwich(tmp_path: Path) -> AsyncIterator[tuple[InboundProxy, IngressGateway, int, int, list[str]]]:
    port, target_port, tunnel_port = free_port(POD_IP), free_port(BACKEND_IP), free_port("127.0.0.1")
    translation = translate(port, target_port, tunnel_port)
    assert translation.skipped == ()
    state = tmp_path / "mesh.yaml"
    state.write_text(render_local_config(translation.config), encoding="utf-8")
    (gateway_config,) = translation.gateway_configs
    own = next(w for w in translation.config.workloads if w.name == "web")
    assert own.application_tunnel == ApplicationTunnel(AppTunnelProtocol.PROXY, tunnel_port)
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
            assert proc.tunnel_listening_ports() == [tunnel_port]
            yield proxy, proc, port, tunnel_port, seen
        finally:
            await proc.aclose()


def request(host: str) -> bytes:
    return f"GET /sandwich HTTP/1.1\r\nhost: {host}\r\nconnection: close\r\n\r\n".encode()


def status_of(response: bytes) -> int:
    head = response.partition(b"\r\n\r\n")[0]
    parts = head.split(b" ", 2)
    return int(parts[1]) if len(parts) > 1 and parts[1].isdigit() else 0


async def call(proxy: InboundProxy, identity: SpiffeId, port: int, first: bytes) -> int:
    """A client's node proxy: an HBONE tunnel as ``identity`` to the gateway pod for the VIP, carrying ``first``;
    the tunnel's refusal status, else the HTTP status the gateway answered (0: closed without an answer)."""
    cert = await proxy.ca.fetch_certificate(identity)
    client = await HboneClient.connect(await connect(FACTORY, proxy.hbone), cert, frozenset({SERVER}), trust_domain=TD)
    try:
        try:
            stream = await client.open_tunnel(f"{VIP}:{port}", [])
        except TunnelRefusedError as exc:
            return exc.status
        await stream.write(first)
        response = b""
        async with asyncio.timeout(10):
            while chunk := await stream.read():
                response += chunk
        stream.abort()
        return status_of(response)
    finally:
        await client.aclose()


async def plain_call(address: tuple[str, int], data: bytes) -> int:
    """Straight to the gateway, no node proxy: the HTTP status, 0 when closed without an answer."""
    reader, writer = await asyncio.open_connection(*address)
    try:
        writer.write(data)
        await writer.drain()
        async with asyncio.timeout(10):
            response = await reader.read()
        return status_of(response)
    except ConnectionResetError:  # closed with our bytes unread
        return 0
    finally:
        writer.close()
        with contextlib.suppress(ConnectionError):
            await writer.wait_closed()


def forged(identity: SpiffeId, port: int) -> bytes:
    source = (ipaddress.ip_address("127.0.0.4"), 40000)
    return encode_v2(source, (ipaddress.ip_address(VIP), port), ((TLV_PEER_IDENTITY, str(identity).encode()),))


async def test_the_client_named_by_the_policy_is_allowed_and_another_is_denied(tmp_path: Path) -> None:
    async with sandwich(tmp_path) as (proxy, proc, port, _tunnel_port, seen):
        for host in HOSTS:
            assert await call(proxy, CLIENT, port, request(host)) == 200, host
        assert await call(proxy, INTRUDER, port, request("captured")) == 403
        assert seen == list(HOSTS)  # the denied request never left the gateway
        assert proc.connection_refusals == {}
        # The gateway's telemetry names the client the header named, over mutual TLS (its node proxy's).
        status, text = await http_get(f"http://127.0.0.1:{proc.settings.stats_port}/metrics")
        assert status == 200
        lines = [line for line in text.splitlines() if line.startswith("istio_requests_total{")]
        allowed = [line for line in lines if 'response_code="200"' in line]
        denied = [line for line in lines if 'response_code="403"' in line]
        assert allowed and all(f'source_principal="spiffe://{CLIENT_PRINCIPAL}"' in line for line in allowed)
        assert all('connection_security_policy="mutual_tls"' in line for line in allowed)
        assert denied and all(f'source_principal="{INTRUDER}"' in line for line in denied)


async def test_a_header_the_client_wrote_itself_is_never_an_identity(tmp_path: Path) -> None:
    async with sandwich(tmp_path) as (proxy, _proc, port, tunnel_port, seen):
        # Inside its own tunnel: the node proxy's header (the intruder's verified identity) comes first; the
        # forgery is the start of the HTTP stream, which is no request.
        assert await call(proxy, INTRUDER, port, forged(CLIENT, port) + request("captured")) in (0, 400)
        # Straight to the gateway's listener: a PROXY header is not read there.
        assert await plain_call((POD_IP, port), forged(CLIENT, port) + request("captured")) in (0, 400)
        # Straight to the tunnel port at the gateway's address: nothing listens there (loopback only).
        with pytest.raises(ConnectionRefusedError):
            await plain_call((POD_IP, tunnel_port), forged(CLIENT, port) + request("captured"))
        assert seen == []


async def test_a_tunnel_connection_without_a_valid_header_is_closed_and_counted(tmp_path: Path) -> None:
    async with sandwich(tmp_path) as (_proxy, proc, _port, tunnel_port, seen):
        assert await plain_call(("127.0.0.1", tunnel_port), request("captured")) == 0
        assert proc.connection_refusals["tunnel bad header"] == 1
        assert seen == []
