"""The rig of Istio's TestSimpleHTTPSandwich on loopback (tests/integration/test_ingress_gateway_sandwich.py and
test_ingress_gateway_app_tunnel.py): an ingress Gateway (class ``istio``) whose pod is captured by the node proxy
serves, as a waypoint, a Service labelled ``istio.io/use-waypoint`` with its name, real sockets throughout.

The objects are those of the upstream test, translated by the control plane's own :func:`translate_all`: Gateway
``simple-http-waypoint`` (labelled ``istio.io/dataplane-mode: ambient``, annotated ``service-type: ClusterIP``,
one HTTP listener per hostname variant of ``captured`` plus the fake 15008 TCP listener), the HTTPRoute adding
``traversed-waypoint``, Service ``captured`` bound to the Gateway. Its pod ``apps/web`` at ``127.0.0.2`` (the
:mod:`tests.integration.inbound_rig` pod, enrolled) runs the real :class:`IngressGateway`; its node proxy's inbound
is the rig's. ``captured``'s pod at ``127.0.0.3`` is a plain HTTP server that echoes the Host header.
"""

from __future__ import annotations

import asyncio
import contextlib
from collections.abc import AsyncIterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import yaml
from aiohttp import web
from tests.integration.inbound_rig import POD_IP, TD, InboundProxy, inbound_proxy
from tests.integration.waypoint_rig import free_port

from ambit.controlplane.translate import Translation, translate_all
from ambit.model.identity import SpiffeId
from ambit.model.localconfig import render_local_config
from ambit.model.workload import ApplicationTunnel, AppTunnelProtocol
from ambit.proxy.sockets import HostSocketFactory
from ambit.waypoint.ingress import IngressGateway
from ambit.waypoint.settings import WaypointSettings

FACTORY = HostSocketFactory(mark=None)
CLIENT = SpiffeId(TD, "apps", "client")
VIP = "198.19.0.10"
OTHER_VIP = "198.19.0.11"
BACKEND_IP = "127.0.0.3"
HOSTS = ("captured", "captured.apps", "captured.apps.svc", "captured.apps.svc.cluster.local")
"""The upstream test's ``HostnameVariants()``: what a client's Host header says."""


def objects(
    port: int, target_port: int, *, tunnel_port: int | None = None, allowed: str | None = None
) -> dict[str, list[Any]]:
    """The upstream test's objects; ``tunnel_port`` adds the PROXY inbound binding on that port to the Gateway,
    ``allowed`` an ALLOW policy on the Gateway for that principal only."""
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
    binding = f"\n    ambient.istio.io/waypoint-inbound-binding: PROXY/{tunnel_port}" if tunnel_port else ""
    policy = (
        f"""---
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
        principals: ["{allowed}"]
"""
        if allowed
        else ""
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
    networking.istio.io/service-type: ClusterIP{binding}
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
{policy}"""
        )
    )
    out: dict[str, list[Any]] = {}
    for doc in docs:
        out.setdefault(doc["kind"], []).append(doc)
    return out


def translate(
    port: int, target_port: int, *, tunnel_port: int | None = None, allowed: str | None = None
) -> Translation:
    objs = objects(port, target_port, tunnel_port=tunnel_port, allowed=allowed)
    return translate_all(
        objs["Pod"],
        objs["Service"],
        [],
        [{"metadata": {"name": "apps"}}],
        gateways=objs["Gateway"],
        http_routes=objs["HTTPRoute"],
        authorization_policies=objs.get("AuthorizationPolicy", []),
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


@dataclass
class Sandwich:
    proxy: InboundProxy
    """The gateway pod's node proxy (its inbound)."""
    gateway: IngressGateway
    translation: Translation
    port: int
    """The Gateway's HTTP listeners' port (on the pod address)."""
    tunnel_port: int | None
    """The PROXY inbound binding's port (on loopback), when the Gateway has one."""
    seen: list[str]
    """The Host of each request ``captured``'s pod answered."""


@contextlib.asynccontextmanager
async def sandwich(tmp_path: Path, *, tunnel: bool = False, allowed: str | None = None) -> AsyncIterator[Sandwich]:
    """The gateway pod and its node proxy, running; ``tunnel``: with a PROXY inbound binding; ``allowed``: an ALLOW
    policy on the Gateway for that principal only."""
    port, target_port = free_port(POD_IP), free_port(BACKEND_IP)
    tunnel_port = free_port("127.0.0.1") if tunnel else None
    translation = translate(port, target_port, tunnel_port=tunnel_port, allowed=allowed)
    assert translation.skipped == ()
    state = tmp_path / "mesh.yaml"
    state.write_text(render_local_config(translation.config), encoding="utf-8")
    (gateway_config,) = translation.gateway_configs
    own = next(w for w in translation.config.workloads if w.name == "web")
    if tunnel_port is not None:
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
            if tunnel_port is not None:
                assert proc.tunnel_listening_ports() == [tunnel_port]
            yield Sandwich(proxy, proc, translation, port, tunnel_port, seen)
        finally:
            await proc.aclose()
