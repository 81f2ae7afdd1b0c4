"""GRPCRoutes through the ingress gateway on loopback: a Gateway of class ``istio`` and GRPCRoutes as users write
them, translated by the control plane's pure translation (``translate_all``) and served by a real
:class:`IngressGateway`; a real gRPC client (grpcio) speaks HTTP/2 with prior knowledge (h2c) to the HTTP listener
and HTTP/2 over TLS (ALPN ``h2``) to the HTTPS listener; a real gRPC server (grpcio) answers behind the mesh
endpoint, reached over HBONE with the gateway's identity (:mod:`tests.integration.ingress_rig`).

What crosses end to end: the response message, the ``grpc-status`` and ``grpc-message`` trailers, trailing
metadata, a bidirectional stream, and the header the route's filter sets. Attacks: a GRPCRoute from a namespace
the listener's ``allowedRoutes`` does not admit routes nothing (the call is UNIMPLEMENTED, the gateway's 404), and
nothing reaches the mesh for an unrouted method or host.
"""

from __future__ import annotations

import time
from collections.abc import AsyncIterator
from pathlib import Path
from typing import Any

import grpc
import grpc.aio
import pytest
from tests.ingress_pki import opaque_secret
from tests.integration.ingress_rig import GATEWAY_ID, IngressRig, as_served, ingress_rig

from ambit.controlplane.translate import translate_all
from ambit.model.ingress import GatewayConfig
from ambit.tls.certs import issue_server_cert, new_ca

Obj = dict[str, Any]
NOW = time.time()
SERVER_CA = new_ca("gateway server CA", now=NOW)
SERVER = issue_server_cert(SERVER_CA, common_name="example.com", dns_names=["*.example.com"], ip_addresses=[], now=NOW)
GRPC_SERVICE = {
    "metadata": {"name": "grpc", "namespace": "app"},
    "spec": {"clusterIP": "198.18.2.9", "ports": [{"name": "grpc", "port": 9090, "appProtocol": "grpc"}]},
}
INTRUDER_SERVICE = {
    "metadata": {"name": "grpc", "namespace": "intruder"},
    "spec": {"clusterIP": "198.18.2.10", "ports": [{"name": "grpc", "port": 9090}]},
}


def edge_gateway() -> Obj:
    same = {"namespaces": {"from": "Selector", "selector": {"matchLabels": {"ingress": "allowed"}}}}
    return {
        "apiVersion": "gateway.networking.k8s.io/v1",
        "kind": "Gateway",
        "metadata": {"name": "edge", "namespace": "edge"},
        "spec": {
            "gatewayClassName": "istio",
            "listeners": [
                {"name": "http", "port": 80, "protocol": "HTTP", "hostname": "*.example.com", "allowedRoutes": same},
                {
                    "name": "https",
                    "port": 443,
                    "protocol": "HTTPS",
                    "hostname": "*.example.com",
                    "tls": {"certificateRefs": [{"name": "edge-cert"}]},
                    "allowedRoutes": same,
                },
            ],
        },
    }


def grpc_route(name: str, namespace: str, hostname: str) -> Obj:
    return {
        "apiVersion": "gateway.networking.k8s.io/v1",
        "kind": "GRPCRoute",
        "metadata": {"name": name, "namespace": namespace, "generation": 1},
        "spec": {
            "parentRefs": [{"name": "edge", "namespace": "edge"}],
            "hostnames": [hostname],
            "rules": [
                {
                    "matches": [{"method": {"service": "echo.Echo", "method": "Say"}}],
                    "filters": [
                        {
                            "type": "RequestHeaderModifier",
                            "requestHeaderModifier": {"set": [{"name": "x-route", "value": name}]},
                        }
                    ],
                    "backendRefs": [{"name": "grpc", "port": 9090}],
                },
                {
                    "matches": [{"method": {"service": "echo.Echo", "method": "Chat"}}],
                    "backendRefs": [{"name": "grpc", "port": 9090}],
                },
            ],
        },
    }


def gateway_config() -> GatewayConfig:
    translation = translate_all(
        pods=(),
        services=[GRPC_SERVICE, INTRUDER_SERVICE],
        endpoint_slices=(),
        namespaces=[
            {"metadata": {"name": "app", "labels": {"ingress": "allowed"}}},
            {"metadata": {"name": "intruder"}},
            {"metadata": {"name": "edge"}},
        ],
        gateways=[edge_gateway()],
        grpc_routes=[
            grpc_route("echo", "app", "grpc.example.com"),
            grpc_route("hijack", "intruder", "hijack.example.com"),
        ],
        secrets=[
            opaque_secret("edge-cert", "edge", "kubernetes.io/tls", tls_crt=SERVER.cert_pem, tls_key=SERVER.key_pem)
        ],
    )
    reasons = {
        s.name: [(c.type, c.status, c.reason) for c in s.parents[0].conditions] for s in translation.route_status
    }
    assert reasons["echo"] == [("Accepted", True, "Accepted"), ("ResolvedRefs", True, "ResolvedRefs")]
    assert reasons["hijack"][0] == ("Accepted", False, "NotAllowedByListeners")
    (config,) = translation.gateway_configs
    return as_served(config)  # what the gateway gets is what its xDS client decodes


@pytest.fixture
async def rig(tmp_path: Path) -> AsyncIterator[IngressRig]:
    async with ingress_rig(tmp_path, gateway_config()) as running:
        yield running


def _raw(data: bytes) -> bytes:
    return data


def h2c_channel(rig: IngressRig, authority: str = "grpc.example.com") -> grpc.aio.Channel:
    """grpcio over cleartext: HTTP/2 with prior knowledge to the HTTP listener."""
    return grpc.aio.insecure_channel(f"127.0.0.1:{rig.port('http')}", options=[("grpc.default_authority", authority)])


def tls_channel(rig: IngressRig, authority: str = "grpc.example.com") -> grpc.aio.Channel:
    """grpcio over TLS (ALPN ``h2``) to the HTTPS listener, verifying the gateway's certificate."""
    credentials = grpc.ssl_channel_credentials(root_certificates=SERVER_CA.cert_pem)
    return grpc.aio.secure_channel(
        f"127.0.0.1:{rig.port('https')}", credentials, options=[("grpc.ssl_target_name_override", authority)]
    )


def say(channel: grpc.aio.Channel, service: str = "echo.Echo") -> grpc.aio.UnaryUnaryMultiCallable[bytes, bytes]:
    return channel.unary_unary(f"/{service}/Say", request_serializer=_raw, response_deserializer=_raw)


async def test_a_grpc_client_over_h2c_reaches_the_server_with_trailers_end_to_end(rig: IngressRig) -> None:
    async with h2c_channel(rig) as channel:
        call = say(channel)(b"hello", timeout=10)
        assert await call == b"said:hello"
        assert await call.code() is grpc.StatusCode.OK
        assert ("x-served", "yes") in tuple(await call.trailing_metadata() or ())
        with pytest.raises(grpc.aio.AioRpcError) as caught:
            await say(channel)(b"fail", timeout=10)
    assert caught.value.code() is grpc.StatusCode.NOT_FOUND
    assert caught.value.details() == "no such thing"
    assert ("x-why", "asked-to") in tuple(caught.value.trailing_metadata() or ())
    method, metadata = rig.grpc_calls.calls[0]
    assert method == "Say" and metadata.get("x-route") == "echo"  # the route's filter was applied
    assert set(rig.endpoint.peers) == {GATEWAY_ID}  # the mesh saw the gateway's identity


async def test_a_bidirectional_stream_crosses_the_gateway_message_by_message(rig: IngressRig) -> None:
    async with h2c_channel(rig) as channel:
        call = channel.stream_stream("/echo.Echo/Chat", request_serializer=_raw, response_deserializer=_raw)(timeout=10)
        for word in (b"one", b"two", b"three"):
            await call.write(word)
            assert await call.read() == b"chat:" + word
        await call.done_writing()
        assert await call.code() is grpc.StatusCode.OK


async def test_a_grpc_client_over_tls_with_alpn_h2_is_routed_the_same_way(rig: IngressRig) -> None:
    async with tls_channel(rig) as channel:
        call = say(channel)(b"secure", timeout=10)
        assert await call == b"said:secure"
        assert ("x-served", "yes") in tuple(await call.trailing_metadata() or ())


async def test_unrouted_methods_hosts_and_a_route_from_an_unadmitted_namespace_reach_nothing(rig: IngressRig) -> None:
    attempts = [
        (h2c_channel, "grpc.example.com", "other.Service"),  # no rule matches the method: 404 is UNIMPLEMENTED
        (h2c_channel, "unknown.example.com", "echo.Echo"),
        (h2c_channel, "hijack.example.com", "echo.Echo"),  # its GRPCRoute's namespace is not admitted
        (tls_channel, "hijack.example.com", "echo.Echo"),
    ]
    for open_channel, authority, service in attempts:
        async with open_channel(rig, authority) as channel:
            with pytest.raises(grpc.aio.AioRpcError) as caught:
                await say(channel, service)(b"x", timeout=10)
        assert caught.value.code() is grpc.StatusCode.UNIMPLEMENTED, (authority, service, caught.value)
    assert rig.grpc_calls.calls == [] and rig.endpoint.peers == []
