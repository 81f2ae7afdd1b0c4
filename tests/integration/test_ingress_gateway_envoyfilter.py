"""EnvoyFilter at a real ingress gateway (context GATEWAY): upstream's TestIngress Gateway and route to ``web``,
with an EnvoyFilter of the root namespace selecting the ``istio: ingressgateway`` pods, translated by the control
plane's pure translation and applied to an :class:`~ambit.waypoint.ingress.IngressGateway` on loopback as its
xDS client would (the config passes through its wire form). The backend sees the Lua filter's and the virtual
host's headers; the client sees the response edits; a filter written for waypoints (``SIDECAR_INBOUND``) changes
nothing here."""

from __future__ import annotations

import copy
import dataclasses
import json
from pathlib import Path
from typing import Any

import aiohttp
from tests.integration.ingress_rig import ingress_rig
from tests.integration.waypoint_rig import free_port
from tests.upstream_objects import ingress_gateway, ingress_route, waypoint_envoy_filter

from ambit.controlplane.translate import translate_all
from ambit.model.ingress import GatewayConfig
from ambit.xds.gateway import gateway_config_from_proto, gateway_config_to_proto

Obj = dict[str, Any]
LUA_TYPE = "type.googleapis.com/envoy.extensions.filters.http.lua.v3.Lua"


def gateway_filter(context: str) -> Obj:
    """Upstream's EnvoyFilter, moved to the root namespace with a workloadSelector for the gateway pods and
    ``context``; its Lua also edits the response."""
    obj = waypoint_envoy_filter("unused", "istio-system", name="edge")
    spec = obj["spec"]
    del spec["targetRefs"]
    spec["workloadSelector"] = {"labels": {"istio": "ingressgateway"}}
    lua, vhost, _ = copy.deepcopy(spec["configPatches"])
    lua["patch"]["value"]["typed_config"] = {
        "@type": LUA_TYPE,
        "inlineCode": (
            'function envoy_on_request(h) h:headers():add("x-lua-inbound", "hello world") end\n'
            'function envoy_on_response(h) h:headers():add("x-lua-outbound", "bye") end\n'
        ),
    }
    vhost["patch"]["value"]["response_headers_to_add"] = [{"header": {"key": "x-vhost-outbound", "value": "v"}}]
    for patch in (lua, vhost):
        patch["match"]["context"] = context
    spec["configPatches"] = [lua, vhost]
    return obj


def gateway_config(*filters: Obj, route: Obj | None = None, gateway: Obj | None = None) -> GatewayConfig:
    gateway_pod = {
        "metadata": {
            "name": "istio-ingressgateway-0",
            "namespace": "istio-system",
            "labels": {"app": "istio-ingressgateway", "istio": "ingressgateway"},
        },
        "spec": {"serviceAccountName": "istio-ingressgateway-service-account"},
    }
    backend_pod = {
        "metadata": {"name": "multi-1", "namespace": "app", "uid": "multi-1", "labels": {"app": "web"}},
        "spec": {"nodeName": "n1", "serviceAccountName": "multi"},
        "status": {"phase": "Running", "podIP": "127.0.0.2", "podIPs": [{"ip": "127.0.0.2"}]},
    }
    web = {
        "metadata": {"name": "web", "namespace": "app"},
        "spec": {
            "clusterIP": "198.18.2.4",
            "selector": {"app": "web"},
            "ports": [{"name": "http", "port": 80, "targetPort": 8080}],
        },
    }
    translation = translate_all(
        pods=[gateway_pod, backend_pod],
        services=[web],
        endpoint_slices=(),
        namespaces=[{"metadata": {"name": "app"}}, {"metadata": {"name": "istio-system"}}],
        istio_gateways=[gateway or ingress_gateway("app")],
        virtual_services=[route or ingress_route("web", "app")],
        envoy_filters=filters,
    )
    (config,) = translation.gateway_configs
    sent = gateway_config_from_proto(gateway_config_to_proto(config), config.gateway)
    port = free_port()
    return dataclasses.replace(sent, listeners=tuple(dataclasses.replace(i, port=port) for i in sent.listeners))


async def get(port: int) -> tuple[int, dict[str, str], dict[str, Any]]:
    async with (
        aiohttp.ClientSession(timeout=aiohttp.ClientTimeout(total=5)) as client,
        client.get(f"http://127.0.0.1:{port}/", headers={"Host": "captured"}) as response,
    ):
        body = json.loads(await response.text())
        return response.status, {k.lower(): v for k, v in response.headers.items()}, body


async def test_a_selected_gateway_filter_edits_requests_and_responses(tmp_path: Path) -> None:
    config = gateway_config(gateway_filter("GATEWAY"))
    assert config.envoy_patches
    async with ingress_rig(tmp_path, config):
        for _ in range(3):
            status, headers, body = await get(config.listeners[0].port)
            assert status == 200
            assert (body["headers"]["x-lua-inbound"], body["headers"]["x-vhost-inbound"]) == ("hello world",) * 2
            assert (headers["x-lua-outbound"], headers["x-vhost-outbound"]) == ("bye", "v")


async def test_a_waypoint_filter_changes_nothing_at_the_gateway(tmp_path: Path) -> None:
    config = gateway_config(gateway_filter("SIDECAR_INBOUND"))
    assert not config.envoy_patches
    async with ingress_rig(tmp_path, config):
        status, headers, body = await get(config.listeners[0].port)
        assert status == 200 and "x-lua-inbound" not in body["headers"] and "x-lua-outbound" not in headers


async def test_the_gateways_404_gets_the_lua_edits_but_no_virtual_host_ones(tmp_path: Path) -> None:
    """A path no route matches: Envoy's router has no route to finalize the 404 with, but the Lua filter encodes
    it like any local reply (exchange rule 7)."""
    route = ingress_route("web", "app")
    route["spec"]["http"][0]["match"] = [{"uri": {"prefix": "/only"}}]
    config = gateway_config(gateway_filter("GATEWAY"), route=route)
    async with (
        ingress_rig(tmp_path, config),
        aiohttp.ClientSession(timeout=aiohttp.ClientTimeout(total=5)) as client,
        client.get(f"http://127.0.0.1:{config.listeners[0].port}/else", headers={"Host": "captured"}) as response,
    ):
        assert response.status == 404
        assert response.headers["x-lua-outbound"] == "bye"
        assert "x-vhost-outbound" not in response.headers


# Upstream routing.go "https with x-forwarded-proto": a port-80 server with tls.httpsRedirect, a route, and an
# EnvoyFilter (istio-system, selecting the gateway pods) merging xff_num_trusted_hops: 1 and normalize_path: true
# into the gateway's HTTP connection manager; a request an edge proxy marked X-Forwarded-Proto: https is routed.
TRUSTED_HOPS = {
    "apiVersion": "networking.istio.io/v1alpha3",
    "kind": "EnvoyFilter",
    "metadata": {"name": "ingressgateway-redirect-config", "namespace": "istio-system"},
    "spec": {
        "configPatches": [
            {
                "applyTo": "NETWORK_FILTER",
                "match": {
                    "context": "GATEWAY",
                    "listener": {"filterChain": {"filter": {"name": "envoy.filters.network.http_connection_manager"}}},
                },
                "patch": {
                    "operation": "MERGE",
                    "value": {
                        "typed_config": {
                            "@type": "type.googleapis.com/envoy.extensions.filters.network.http_connection_manager"
                            ".v3.HttpConnectionManager",
                            "xff_num_trusted_hops": 1,
                            "normalize_path": True,
                        }
                    },
                },
            }
        ],
        "workloadSelector": {"labels": {"istio": "ingressgateway"}},
    },
}


async def status_of(port: int, headers: dict[str, str]) -> tuple[int, str]:
    async with (
        aiohttp.ClientSession(timeout=aiohttp.ClientTimeout(total=5)) as client,
        client.get(f"http://127.0.0.1:{port}/", headers={"Host": "captured", **headers}, allow_redirects=False) as r,
    ):
        return r.status, r.headers.get("location", "")


async def test_upstream_https_redirect_spares_a_trusted_x_forwarded_proto_https(tmp_path: Path) -> None:
    redirecting = ingress_gateway("app")
    redirecting["spec"]["servers"][0]["tls"] = {"httpsRedirect": True}
    config = gateway_config(TRUSTED_HOPS, gateway=redirecting)
    assert config.envoy_patches.xff_trusted_hops == 1
    async with ingress_rig(tmp_path, config):
        port = config.listeners[0].port
        assert await status_of(port, {"X-Forwarded-Proto": "https"}) == (200, "")
        assert await status_of(port, {}) == (301, "https://captured/")
        assert await status_of(port, {"X-Forwarded-Proto": "http"}) == (301, "https://captured/")


async def test_without_trusted_hops_a_client_s_x_forwarded_proto_does_not_spare_the_redirect(tmp_path: Path) -> None:
    redirecting = ingress_gateway("app")
    redirecting["spec"]["servers"][0]["tls"] = {"httpsRedirect": True}
    config = gateway_config(gateway=redirecting)
    async with ingress_rig(tmp_path, config):
        assert await status_of(config.listeners[0].port, {"X-Forwarded-Proto": "https"}) == (301, "https://captured/")
