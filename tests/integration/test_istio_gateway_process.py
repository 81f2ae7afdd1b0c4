"""Istio's own Gateway at a real gateway: upstream's TestAuthorizationGateway objects (an Istio Gateway selecting
``istio: ingressgateway`` and the VirtualService routing ``/allowed`` and ``/deny``), with a DENY policy by path
on the gateway pods, translated by the control plane's pure translation and applied to an
:class:`~ambit.waypoint.ingress.IngressGateway` on loopback as its xDS client would: requests go over HBONE to the
mesh Service, ``/deny`` is refused at the gateway (403), a path no rule routes is 404, and an attack on the
listener (a Host header for a name no server serves, a huge path) gets an answer, not a crash. Then TLS passthrough
and TCP servers relay to the backends of the VirtualService's ``tls`` (by SNI) and ``tcp`` rules.
"""

from __future__ import annotations

import asyncio
import dataclasses
import ssl
from pathlib import Path
from typing import Any

import aiohttp
import pytest
from tests.integration.ingress_rig import GATEWAY_ID, ingress_rig, tls_ask
from tests.integration.waypoint_rig import free_port
from tests.upstream_objects import authorization_gateway_route, ingress_gateway, ingress_route

from ambit.controlplane.translate import translate_all
from ambit.model.ingress import GatewayConfig

Obj = dict[str, Any]


def gateway_config(route: Obj | None = None) -> GatewayConfig:
    pod = {
        "metadata": {
            "name": "istio-ingressgateway-0",
            "namespace": "istio-system",
            "labels": {"app": "istio-ingressgateway", "istio": "ingressgateway"},
        },
        "spec": {"serviceAccountName": "istio-ingressgateway-service-account"},
    }
    web = {
        "metadata": {"name": "web", "namespace": "app"},
        "spec": {"clusterIP": "198.18.2.4", "ports": [{"port": 80}]},
    }
    deny = {
        "metadata": {"name": "deny-path", "namespace": "istio-system"},
        "spec": {
            "selector": {"matchLabels": {"istio": "ingressgateway"}},
            "action": "DENY",
            "rules": [{"to": [{"operation": {"paths": ["/deny"]}}]}],
        },
    }
    translation = translate_all(
        pods=[pod],
        services=[web],
        endpoint_slices=(),
        namespaces=[{"metadata": {"name": "app"}}, {"metadata": {"name": "istio-system"}}],
        istio_gateways=[ingress_gateway("app")],
        virtual_services=[route or authorization_gateway_route("web", 80, 80, "app")],
        authorization_policies=[deny],
    )
    (config,) = translation.gateway_configs
    port = free_port()  # the server's port 80 on loopback
    return dataclasses.replace(config, listeners=tuple(dataclasses.replace(i, port=port) for i in config.listeners))


async def test_upstream_authorization_gateway_routes_and_denies_by_path_at_the_gateway(tmp_path: Path) -> None:
    config = gateway_config()
    port = config.listeners[0].port
    async with ingress_rig(tmp_path, config) as rig, aiohttp.ClientSession() as client:

        async def get(path: str, **headers: str) -> tuple[int, str]:
            async with client.get(f"http://127.0.0.1:{port}{path}", headers=headers) as response:
                return response.status, await response.text()

        status, body = await get("/allowed", Host="anything.example")
        assert status == 200 and '"path": "/allowed"' in body
        assert rig.endpoint.peers and all(p == GATEWAY_ID for p in rig.endpoint.peers)
        assert (await get("/deny"))[0] == 403
        assert (await get("/elsewhere"))[0] == 404
        before = len(rig.endpoint.peers)
        assert (await get("/deny", Host="evil.example"))[0] == 403  # the policy holds whatever the host
        assert (await get("/" + "a" * 60_000))[0] in (404, 414, 431)
        assert len(rig.endpoint.peers) == before  # neither reached the mesh
        assert (await get("/allowed"))[0] == 200  # and the gateway still serves


async def test_a_virtual_service_cors_policy_answers_preflights_at_the_gateway(tmp_path: Path) -> None:
    route = ingress_route("web", "app")
    route["spec"]["http"][0]["corsPolicy"] = {
        "allowOrigins": [{"prefix": "https://app."}],
        "allowMethods": ["POST", "GET"],
        "exposeHeaders": ["X-Trace"],
        "allowCredentials": True,
        "maxAge": "10m",
    }
    config = gateway_config(route)
    port = config.listeners[0].port
    async with ingress_rig(tmp_path, config) as rig, aiohttp.ClientSession() as client:

        async def call(method: str, **headers: str) -> tuple[int, dict[str, str]]:
            async with client.request(method, f"http://127.0.0.1:{port}/api", headers=headers) as response:
                await response.read()
                cors = {k.lower(): v for k, v in response.headers.items() if k.lower().startswith("access-control-")}
                return response.status, cors

        origin = "https://app.example"
        assert await call("OPTIONS", Origin=origin, **{"Access-Control-Request-Method": "PUT"}) == (
            200,
            {
                "access-control-allow-origin": origin,
                "access-control-allow-credentials": "true",
                "access-control-allow-methods": "POST,GET",
                "access-control-max-age": "600",
                "access-control-expose-headers": "X-Trace",  # as Envoy's CORS filter adds to its own answer
            },
        )
        assert not rig.endpoint.peers  # the preflight never reached the mesh
        assert await call("GET", Origin=origin) == (
            200,
            {
                "access-control-allow-origin": origin,
                "access-control-allow-credentials": "true",
                "access-control-expose-headers": "X-Trace",
            },
        )
        assert await call("GET", Origin="https://evil.example") == (200, {})
        assert await call("GET") == (200, {})


def connection_config() -> GatewayConfig:
    """An Istio Gateway with a TLS passthrough server (``*.example.com``) and a TCP server, and a VirtualService
    sending SNI ``a.example.com`` to ``one``, any other covered name to ``two``, and the TCP port to ``tcp``."""
    services = [
        {"metadata": {"name": name, "namespace": "app"}, "spec": {"clusterIP": ip, "ports": [{"port": port}]}}
        for name, ip, port in (("one", "198.18.2.1", 443), ("two", "198.18.2.2", 443), ("tcp", "198.18.2.3", 9000))
    ]
    pod = {
        "metadata": {"name": "gw-0", "namespace": "edge", "labels": {"app": "edge", "istio": "ingressgateway"}},
        "spec": {"serviceAccountName": "edge-istio"},
    }
    gateway = ingress_gateway("app")
    gateway["spec"]["servers"] = [
        {
            "port": {"number": 443, "name": "tls", "protocol": "TLS"},
            "hosts": ["*.example.com"],
            "tls": {"mode": "PASSTHROUGH"},
        },
        {"port": {"number": 9000, "name": "tcp", "protocol": "TCP"}, "hosts": ["*"]},
    ]
    route = {
        "metadata": {"name": "conn", "namespace": "app"},
        "spec": {
            "gateways": ["gateway"],
            "hosts": ["*.example.com", "*"],
            "tls": [
                {"match": [{"sniHosts": ["a.example.com"]}], "route": [{"destination": {"host": "one"}}]},
                {"match": [{"sniHosts": ["*.example.com"]}], "route": [{"destination": {"host": "two"}}]},
            ],
            "tcp": [{"match": [{"port": 9000}], "route": [{"destination": {"host": "tcp"}}]}],
        },
    }
    translation = translate_all(
        pods=[pod],
        services=services,
        endpoint_slices=(),
        namespaces=[{"metadata": {"name": "app"}}, {"metadata": {"name": "edge"}}],
        istio_gateways=[gateway],
        virtual_services=[route],
    )
    (config,) = translation.gateway_configs
    return dataclasses.replace(
        config, listeners=tuple(dataclasses.replace(i, port=free_port()) for i in config.listeners)
    )


async def test_tls_passthrough_by_sni_and_tcp_servers_relay_to_their_virtual_service_backends(tmp_path: Path) -> None:
    config = connection_config()
    tls_port = next(i.port for i in config.listeners if i.name.startswith("tls"))
    tcp_port = next(i.port for i in config.listeners if i.name.startswith("tcp"))
    async with ingress_rig(tmp_path, config) as rig:
        assert await tls_ask(tls_port, "a.example.com") == "one hello"
        assert await tls_ask(tls_port, "z.example.com", "hi") == "two hi"
        reader, writer = await asyncio.open_connection("127.0.0.1", tcp_port)
        writer.write(b"ping\n")
        await writer.drain()
        assert await asyncio.wait_for(reader.readline(), 10) == b"ping\n"
        writer.close()
        assert rig.endpoint.peers == [GATEWAY_ID] * 3
        with pytest.raises((ssl.SSLError, ConnectionResetError, asyncio.IncompleteReadError, OSError)):
            await tls_ask(tls_port, "other.example.org")  # no server host covers it: closed, not relayed
        assert len(rig.endpoint.peers) == 3
