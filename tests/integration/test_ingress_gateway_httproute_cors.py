"""An HTTPRoute's CORS filter at the ingress gateway on loopback: a Gateway of class ``istio`` with an HTTP listener
and HTTPRouteCORS's wildcard-origin route (``*``, ``PUT``, credentials off), translated by ``translate_all``, carried
through the gateway's xDS encoding (:func:`~tests.integration.ingress_rig.as_served`) and served by a real
:class:`IngressGateway` to a real HTTP client: preflights from any well-formed origin (a port included) are answered
by the gateway without reaching the mesh (``Access-Control-Max-Age`` the CRD's default 5), one from ``null`` (no
scheme and host) is answered without ``Access-Control-Allow-Origin``, and a simple request reaches the mesh Service
and gets the origin echoed back."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import aiohttp
from tests.integration.ingress_rig import as_served, ingress_rig

from ambit.controlplane.translate import translate_all
from ambit.model.ingress import GatewayConfig


def gateway_config() -> GatewayConfig:
    gateway = {
        "apiVersion": "gateway.networking.k8s.io/v1",
        "kind": "Gateway",
        "metadata": {"name": "edge", "namespace": "edge"},
        "spec": {
            "gatewayClassName": "istio",
            "listeners": [
                {"name": "http", "port": 80, "protocol": "HTTP", "allowedRoutes": {"namespaces": {"from": "All"}}}
            ],
        },
    }
    cors = {"allowOrigins": ["*"], "allowMethods": ["PUT"], "allowCredentials": False}
    route = {
        "apiVersion": "gateway.networking.k8s.io/v1",
        "kind": "HTTPRoute",
        "metadata": {"name": "cors-wildcard-origin", "namespace": "app"},
        "spec": {
            "parentRefs": [{"name": "edge", "namespace": "edge"}],
            "rules": [{"filters": [{"type": "CORS", "cors": cors}], "backendRefs": [{"name": "web", "port": 80}]}],
        },
    }
    translation = translate_all(
        pods=(),
        services=[
            {
                "metadata": {"name": "web", "namespace": "app"},
                "spec": {"clusterIP": "198.18.2.4", "ports": [{"port": 80}]},
            }
        ],
        endpoint_slices=(),
        namespaces=[{"metadata": {"name": "app"}}, {"metadata": {"name": "edge"}}],
        gateways=[gateway],
        http_routes=[route],
    )
    (config,) = translation.gateway_configs
    return as_served(config)  # what the gateway gets is what its xDS client decodes


async def test_an_httproute_cors_filter_at_the_ingress_gateway(tmp_path: Path) -> None:
    config = gateway_config()
    port = config.listeners[0].port
    async with ingress_rig(tmp_path, config) as rig, aiohttp.ClientSession() as client:

        async def call(method: str, **headers: str) -> tuple[int, dict[str, str], Any]:
            async with client.request(method, f"http://127.0.0.1:{port}/cors", headers=headers) as response:
                body = await response.read()
                cors = {k.lower(): v for k, v in response.headers.items() if k.lower().startswith("access-control-")}
                return response.status, cors, body

        asked = {"Access-Control-Request-Method": "PUT"}
        answered = {"access-control-allow-methods": "PUT", "access-control-max-age": "5"}  # the CRD's default
        for origin in ("https://foobar.com", "https://foobar.com:12345"):
            status, cors, body = await call("OPTIONS", Origin=origin, **asked)
            assert (status, body) == (200, b"")
            assert cors == {"access-control-allow-origin": origin, **answered}
        status, cors, body = await call("OPTIONS", Origin="null", **asked)
        assert (status, body, cors) == (200, b"", answered)  # IGNORE: answered, not forwarded
        assert not rig.endpoint.peers  # no preflight reached the mesh

        status, cors, body = await call("PUT", Origin="https://foobar.com:12345")
        assert status == 200 and b"/cors" in body
        assert cors == {"access-control-allow-origin": "https://foobar.com:12345"}
        assert rig.endpoint.peers
