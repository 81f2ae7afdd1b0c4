"""Istio Gateway servers of protocol ``TLS`` that terminate TLS (``SIMPLE``, ``MUTUAL``, ``OPTIONAL_MUTUAL``) and the
VirtualServices' ``tcp`` rules behind them, translated by the control plane's pure translation and served by a real
:class:`IngressGateway` on loopback (:mod:`tests.integration.ingress_rig`), with real TLS clients (Python's
``ssl``).

One port carries three servers picked by SNI: ``echo.example.com`` (SIMPLE), ``partner.example.com`` (MUTUAL, CA and
certificate from one generic Secret) and ``maybe.example.com`` (OPTIONAL_MUTUAL); each VirtualService relays to the
mesh's TCP echo server. A client that completes the TLS handshake against the gateway's certificate and reads its
own bytes back proves the gateway terminated TLS (the echo server speaks no TLS). Attacks: no certificate and a
certificate from another CA on the MUTUAL server, another CA's certificate on the OPTIONAL_MUTUAL one, and an
unknown server name; none reaches the mesh.
"""

from __future__ import annotations

import asyncio
import dataclasses
import ssl
import time
from collections.abc import AsyncIterator
from pathlib import Path
from typing import Any

import pytest
from tests.ingress_pki import client_cert, opaque_secret
from tests.integration.ingress_rig import GATEWAY_ID, IngressRig, ingress_rig
from tests.integration.waypoint_rig import free_port

from ambit.controlplane.translate import translate_all
from ambit.model.ingress import GatewayConfig, ListenerProtocol
from ambit.tls.certs import KeyPair, issue_server_cert, new_ca
from ambit.tls.contexts import _memory_file
from ambit.xds.gateway import decode_gateway_config, gateway_config_to_proto, pack_gateway_config

Obj = dict[str, Any]
NOW = time.time()
SERVER_CA = new_ca("gateway server CA", now=NOW)
CLIENT_CA = new_ca("partner client CA", now=NOW)
OTHER_CA = new_ca("some other CA", now=NOW)
SERVER = issue_server_cert(SERVER_CA, common_name="example.com", dns_names=["*.example.com"], ip_addresses=[], now=NOW)
GOOD_CLIENT = client_cert(CLIENT_CA, dns=("client.example",))
FOREIGN_CLIENT = client_cert(OTHER_CA, dns=("client.example",))
GATEWAY_POD = {
    "metadata": {
        "name": "istio-ingressgateway-0",
        "namespace": "istio-system",
        "labels": {"app": "istio-ingressgateway", "istio": "ingressgateway"},
    },
    "spec": {"serviceAccountName": "istio-ingressgateway-service-account"},
}
TCP_SERVICE = {
    "metadata": {"name": "tcp", "namespace": "app"},
    "spec": {"clusterIP": "198.18.2.3", "ports": [{"name": "tcp", "port": 9000}]},
}


def gateway_config() -> GatewayConfig:
    def server(host: str, **tls: str) -> Obj:
        return {"port": {"number": 9443, "name": "tls", "protocol": "TLS"}, "hosts": [host], "tls": tls}

    gateway = {
        "apiVersion": "networking.istio.io/v1",
        "kind": "Gateway",
        "metadata": {"name": "gateway", "namespace": "app"},
        "spec": {
            "selector": {"istio": "ingressgateway"},
            "servers": [
                server("echo.example.com", mode="SIMPLE", credentialName="edge"),
                server("partner.example.com", mode="MUTUAL", credentialName="edge"),
                server("maybe.example.com", mode="OPTIONAL_MUTUAL", credentialName="edge"),
            ],
        },
    }
    route = {
        "apiVersion": "networking.istio.io/v1",
        "kind": "VirtualService",
        "metadata": {"name": "echo", "namespace": "app"},
        "spec": {
            "gateways": ["gateway"],
            "hosts": ["*.example.com"],
            "tcp": [{"match": [{"port": 9443}], "route": [{"destination": {"host": "tcp", "port": {"number": 9000}}}]}],
        },
    }
    secret = opaque_secret(
        "edge", "istio-system", tls_crt=SERVER.cert_pem, tls_key=SERVER.key_pem, ca_crt=CLIENT_CA.cert_pem
    )
    translation = translate_all(
        pods=[GATEWAY_POD],
        services=[TCP_SERVICE],
        endpoint_slices=(),
        namespaces=[{"metadata": {"name": "app"}}, {"metadata": {"name": "istio-system"}}],
        istio_gateways=[gateway],
        virtual_services=[route],
        secrets=[secret],
    )
    assert not translation.skipped, translation.skipped
    (config,) = translation.gateway_configs
    # what the gateway gets is what its xDS client decodes
    assert decode_gateway_config(config.gateway, pack_gateway_config(gateway_config_to_proto(config))) == config
    assert {i.protocol for i in config.listeners} == {ListenerProtocol.TLS_TERMINATE}
    port = free_port()
    return dataclasses.replace(config, listeners=tuple(dataclasses.replace(i, port=port) for i in config.listeners))


@pytest.fixture
async def rig(tmp_path: Path) -> AsyncIterator[tuple[IngressRig, int]]:
    config = gateway_config()
    async with ingress_rig(tmp_path, config) as running:
        yield running, config.listeners[0].port


def client_context(cert: KeyPair | None, tls12: bool) -> ssl.SSLContext:
    context = ssl.create_default_context(cadata=SERVER_CA.cert_pem.decode())
    if tls12:
        context.maximum_version = ssl.TLSVersion.TLSv1_2
    if cert is not None:
        with _memory_file(cert.cert_pem) as chain, _memory_file(cert.key_pem) as key:
            context.load_cert_chain(chain, key)
    return context


async def echo(port: int, sni: str, cert: KeyPair | None = None, *, tls12: bool = False) -> bytes | None:
    """Send a line over TLS to ``sni`` and read it back: what came back, or None when the gateway refused (the
    handshake failed or the connection closed before an answer)."""
    try:
        async with asyncio.timeout(10):
            reader, writer = await asyncio.open_connection(
                "127.0.0.1", port, ssl=client_context(cert, tls12), server_hostname=sni
            )
            try:
                writer.write(b"hello through the gateway\n")
                await writer.drain()
                line = await reader.readline()
                return line or None
            finally:
                writer.close()
    except (ssl.SSLError, ConnectionError, OSError):
        return None


async def test_a_terminated_tls_connection_is_relayed_in_plain_text_to_the_tcp_route(
    rig: tuple[IngressRig, int],
) -> None:
    running, port = rig
    for tls12 in (False, True):
        assert await echo(port, "echo.example.com", tls12=tls12) == b"hello through the gateway\n", tls12
    assert set(running.endpoint.peers) == {GATEWAY_ID}  # over HBONE, with the gateway's identity


async def test_mutual_and_optional_mutual_servers_verify_their_clients_before_relaying(
    rig: tuple[IngressRig, int],
) -> None:
    running, port = rig
    line = b"hello through the gateway\n"
    assert await echo(port, "partner.example.com", GOOD_CLIENT) == line
    assert await echo(port, "maybe.example.com", GOOD_CLIENT) == line
    assert await echo(port, "maybe.example.com", None) == line  # optional: a client without a certificate
    reached = len(running.endpoint.peers)
    attacks = [
        ("partner.example.com", None),
        ("partner.example.com", FOREIGN_CLIENT),
        ("maybe.example.com", FOREIGN_CLIENT),
        ("unknown.example.com", GOOD_CLIENT),
    ]
    for sni, cert in attacks:
        for tls12 in (False, True):
            assert await echo(port, sni, cert, tls12=tls12) is None, (sni, cert is not None, tls12)
    assert len(running.endpoint.peers) == reached  # none of them reached the mesh
