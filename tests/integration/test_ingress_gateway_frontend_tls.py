"""Gateway API frontend TLS validation through the ingress gateway on loopback: a Gateway of class ``istio`` whose
``spec.tls.frontend`` names a client CA (a ConfigMap) by default and validates port 8443 with
``AllowInsecureFallback``, and an HTTPRoute to the mesh's ``web`` Service, translated by ``translate_all`` and served
by a real :class:`IngressGateway` (:mod:`tests.integration.ingress_rig`) to real TLS clients.

Port 443 (``AllowValidOnly``) serves only clients with a certificate of the CA; port 8443 also serves clients without
one. Attacks: no certificate on 443, a certificate from another CA on either port (refused on 8443 too: the gateway
verifies what is presented, stricter than Envoy's ``insecureSkipVerify``), a self-signed one; none reaches the mesh.
"""

from __future__ import annotations

import asyncio
import json
import ssl
import time
from collections.abc import AsyncIterator
from pathlib import Path
from typing import Any

import pytest
from tests.ingress_pki import client_cert, self_signed_client
from tests.integration.ingress_rig import IngressRig, as_served, ingress_rig, translate_edge

from ambit.model.ingress import GatewayConfig, TlsMode
from ambit.tls.certs import KeyPair, issue_server_cert, new_ca
from ambit.tls.contexts import _memory_file

Obj = dict[str, Any]
NOW = time.time()
SERVER_CA = new_ca("gateway server CA", now=NOW)
CLIENT_CA = new_ca("frontend client CA", now=NOW)
OTHER_CA = new_ca("another CA", now=NOW)
SERVER = issue_server_cert(SERVER_CA, common_name="example.com", dns_names=["*.example.com"], ip_addresses=[], now=NOW)
GOOD = client_cert(CLIENT_CA, dns=("client.example",))
REFUSED = None


def gateway_config() -> GatewayConfig:
    def listener(name: str, port: int) -> Obj:
        return {
            "name": name,
            "port": port,
            "protocol": "HTTPS",
            "hostname": "web.example.com",
            "tls": {"certificateRefs": [{"name": "edge-cert"}]},
            "allowedRoutes": {"namespaces": {"from": "All"}},
        }

    ca_ref = {"caCertificateRefs": [{"group": "", "kind": "ConfigMap", "name": "client-ca"}]}
    gateway = {
        "apiVersion": "gateway.networking.k8s.io/v1",
        "kind": "Gateway",
        "metadata": {"name": "edge", "namespace": "edge"},
        "spec": {
            "gatewayClassName": "istio",
            "tls": {
                "frontend": {
                    "default": {"validation": ca_ref},
                    "perPort": [{"port": 8443, "tls": {"validation": {**ca_ref, "mode": "AllowInsecureFallback"}}}],
                }
            },
            "listeners": [listener("strict", 443), listener("optional", 8443)],
        },
    }
    config = translate_edge(gateway, SERVER, CLIENT_CA)
    assert {i.name: i.tls.mode for i in config.listeners} == {
        "strict": TlsMode.MUTUAL,
        "optional": TlsMode.OPTIONAL_MUTUAL,
    }
    return as_served(config)  # what the gateway gets is what its xDS client decodes


@pytest.fixture
async def rig(tmp_path: Path) -> AsyncIterator[IngressRig]:
    async with ingress_rig(tmp_path, gateway_config()) as running:
        yield running


async def https_get(port: int, cert: KeyPair | None, *, tls12: bool = False) -> int | None:
    """The status of one HTTP/1.1 request over TLS, or None when the gateway refused the client."""
    context = ssl.create_default_context(cadata=SERVER_CA.cert_pem.decode())
    if tls12:
        context.maximum_version = ssl.TLSVersion.TLSv1_2
    if cert is not None:
        with _memory_file(cert.cert_pem) as chain, _memory_file(cert.key_pem) as key:
            context.load_cert_chain(chain, key)
    try:
        async with asyncio.timeout(10):
            reader, writer = await asyncio.open_connection(
                "127.0.0.1", port, ssl=context, server_hostname="web.example.com"
            )
            try:
                writer.write(b"GET /hello HTTP/1.1\r\nHost: web.example.com\r\n\r\n")
                await writer.drain()
                head = (await reader.readuntil(b"\r\n\r\n")).decode("latin-1")
                length = next(
                    int(h.split(":", 1)[1]) for h in head.split("\r\n") if h.lower().startswith("content-length:")
                )
                body = json.loads(await reader.readexactly(length))
                assert body["path"] == "/hello"
                return int(head.split(" ", 2)[1])
            finally:
                writer.close()
    except (ssl.SSLError, ConnectionError, asyncio.IncompleteReadError, OSError):
        return REFUSED


async def test_allow_valid_only_serves_only_clients_of_the_ca(rig: IngressRig) -> None:
    port = rig.port("strict")
    assert await https_get(port, GOOD) == 200
    reached = len(rig.endpoint.peers)
    for name, cert in {"none": None, "other CA": client_cert(OTHER_CA), "self-signed": self_signed_client()}.items():
        for tls12 in (False, True):
            assert await https_get(port, cert, tls12=tls12) is REFUSED, (name, tls12)
    assert len(rig.endpoint.peers) == reached  # none of them reached the mesh


async def test_allow_insecure_fallback_serves_clients_without_a_certificate_but_never_a_bad_one(
    rig: IngressRig,
) -> None:
    port = rig.port("optional")
    assert await https_get(port, None) == 200
    assert await https_get(port, GOOD) == 200
    reached = len(rig.endpoint.peers)
    for name, cert in {"other CA": client_cert(OTHER_CA), "self-signed": self_signed_client()}.items():
        for tls12 in (False, True):
            assert await https_get(port, cert, tls12=tls12) is REFUSED, (name, tls12)
    assert len(rig.endpoint.peers) == reached  # none of them reached the mesh
