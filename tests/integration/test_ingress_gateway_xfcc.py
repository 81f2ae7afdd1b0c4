"""``x-forwarded-client-cert`` through a real ingress gateway on loopback: a Gateway of class ``istio`` with an HTTPS
listener that validates clients (``spec.tls.frontend``, a ConfigMap CA) and a plain HTTP one, its XFCC mode from
the ``proxy.istio.io/config`` annotation (``gatewayTopology.forwardClientCertDetails``), translated by
``translate_all``, carried as its xDS client decodes it and served by :class:`IngressGateway`
(:mod:`tests.integration.ingress_rig`) to real TLS clients; the mesh's ``web`` backend echoes the headers it got.

What a backend sees is checked against the client certificate itself (its SHA-256, PEM, subject and names), and a
client's forged header against each mode: dropped in ``SANITIZE`` and ``SANITIZE_SET`` and on plain HTTP, kept only
where Envoy keeps it.
"""

from __future__ import annotations

import asyncio
import hashlib
import json
import ssl
import time
import urllib.parse
from collections.abc import AsyncIterator
from pathlib import Path
from typing import Any

import pytest
from cryptography import x509
from cryptography.hazmat.primitives import serialization
from tests.ingress_pki import client_cert
from tests.integration.ingress_rig import IngressRig, as_served, ingress_rig, translate_edge

from ambit.model.ingress import ForwardClientCert, GatewayConfig
from ambit.tls.certs import KeyPair, issue_server_cert, new_ca
from ambit.tls.contexts import _memory_file

Obj = dict[str, Any]
NOW = time.time()
SERVER_CA = new_ca("xfcc gateway server CA", now=NOW)
CLIENT_CA = new_ca("xfcc client CA", now=NOW)
SERVER = issue_server_cert(SERVER_CA, common_name="example.com", dns_names=["*.example.com"], ip_addresses=[], now=NOW)
PARTNER = client_cert(CLIENT_CA, "partner", dns=("partner.example",), uris=("spiffe://partner.example/ns/a/sa/b",))
FORGED = "By=spiffe://cluster.local/ns/edge/sa/edge-istio;URI=spiffe://cluster.local/ns/admin/sa/root"


def gateway_config(mode: str | None) -> GatewayConfig:
    meta: Obj = {"name": "edge", "namespace": "edge"}
    if mode is not None:
        meta["annotations"] = {"proxy.istio.io/config": f"gatewayTopology:\n  forwardClientCertDetails: {mode}\n"}
    gateway = {
        "apiVersion": "gateway.networking.k8s.io/v1",
        "kind": "Gateway",
        "metadata": meta,
        "spec": {
            "gatewayClassName": "istio",
            "tls": {
                "frontend": {
                    "default": {
                        "validation": {"caCertificateRefs": [{"group": "", "kind": "ConfigMap", "name": "client-ca"}]}
                    }
                }
            },
            "listeners": [
                {
                    "name": "mtls",
                    "port": 443,
                    "protocol": "HTTPS",
                    "hostname": "web.example.com",
                    "tls": {"certificateRefs": [{"name": "edge-cert"}]},
                    "allowedRoutes": {"namespaces": {"from": "All"}},
                },
                {
                    "name": "plain",
                    "port": 80,
                    "protocol": "HTTP",
                    "allowedRoutes": {"namespaces": {"from": "All"}},
                },
            ],
        },
    }
    config = translate_edge(gateway, SERVER, CLIENT_CA)
    assert config.forward_client_cert is ForwardClientCert(mode or "SANITIZE_SET")
    return as_served(config)


@pytest.fixture
async def rig(tmp_path: Path, request: pytest.FixtureRequest) -> AsyncIterator[IngressRig]:
    async with ingress_rig(tmp_path, gateway_config(request.param)) as running:
        yield running


async def seen_by_backend(
    port: int, cert: KeyPair | None, *, tls: bool = True, forged: str | None = FORGED
) -> list[str]:
    """The ``x-forwarded-client-cert`` the ``web`` backend received for one request (its header values; aiohttp
    joins repeated lines with ``,``)."""
    context = None
    if tls:
        context = ssl.create_default_context(cadata=SERVER_CA.cert_pem.decode())
        if cert is not None:
            with _memory_file(cert.cert_pem) as chain, _memory_file(cert.key_pem) as key:
                context.load_cert_chain(chain, key)
    async with asyncio.timeout(10):
        reader, writer = await asyncio.open_connection(
            "127.0.0.1", port, ssl=context, server_hostname="web.example.com" if tls else None
        )
        try:
            extra = f"X-Forwarded-Client-Cert: {forged}\r\n" if forged is not None else ""
            writer.write(f"GET /hello HTTP/1.1\r\nHost: web.example.com\r\n{extra}Connection: close\r\n\r\n".encode())
            await writer.drain()
            head = (await reader.readuntil(b"\r\n\r\n")).decode("latin-1")
            assert head.startswith("HTTP/1.1 200"), head
            length = next(
                int(h.split(":", 1)[1]) for h in head.split("\r\n") if h.lower().startswith("content-length:")
            )
            body = json.loads(await reader.readexactly(length))
        finally:
            writer.close()
    value = body["headers"].get("x-forwarded-client-cert")
    return [] if value is None else [value]


def partner_element() -> str:
    cert = x509.load_pem_x509_certificate(PARTNER.cert_pem)
    der = cert.public_bytes(serialization.Encoding.DER)
    pem = urllib.parse.quote(cert.public_bytes(serialization.Encoding.PEM).decode(), safe="")
    return (
        f'Hash={hashlib.sha256(der).hexdigest()};Cert="{pem}";Subject="CN=partner";'
        "URI=spiffe://partner.example/ns/a/sa/b;DNS=partner.example"
    )


@pytest.mark.parametrize("rig", [None], indirect=True)
async def test_by_default_the_backend_sees_only_the_verified_certificate_and_never_a_forgery(rig: IngressRig) -> None:
    assert await seen_by_backend(rig.port("mtls"), PARTNER) == [partner_element()]
    assert await seen_by_backend(rig.port("mtls"), PARTNER, forged=None) == [partner_element()]
    assert await seen_by_backend(rig.port("plain"), None, tls=False) == []  # plain HTTP: no certificate, no header


@pytest.mark.parametrize("rig", ["SANITIZE"], indirect=True)
async def test_sanitize_drops_the_header_even_over_mutual_tls(rig: IngressRig) -> None:
    assert await seen_by_backend(rig.port("mtls"), PARTNER) == []
    assert await seen_by_backend(rig.port("plain"), None, tls=False) == []


@pytest.mark.parametrize("rig", ["APPEND_FORWARD"], indirect=True)
async def test_append_forward_keeps_a_mutual_tls_client_s_header_and_appends_its_certificate(rig: IngressRig) -> None:
    assert await seen_by_backend(rig.port("mtls"), PARTNER) == [f"{FORGED},{partner_element()}"]
    assert await seen_by_backend(rig.port("plain"), None, tls=False) == []  # not mutual TLS: removed


@pytest.mark.parametrize("rig", ["ALWAYS_FORWARD_ONLY"], indirect=True)
async def test_always_forward_only_passes_the_client_s_header_untouched_even_on_plain_http(rig: IngressRig) -> None:
    assert await seen_by_backend(rig.port("mtls"), PARTNER) == [FORGED]
    assert await seen_by_backend(rig.port("plain"), None, tls=False) == [FORGED]


@pytest.mark.parametrize("rig", [None], indirect=True)
async def test_curl_over_http2_with_a_client_certificate_gets_the_same_element_and_never_its_forgery(
    rig: IngressRig, tmp_path: Path
) -> None:
    """The e2e's request on loopback: ``curl --http2`` (ALPN ``h2``, so the gateway's HTTP/2 shell) with the client
    certificate and a forged header."""
    files = {name: tmp_path / name for name in ("ca.pem", "client.crt", "client.key")}
    files["ca.pem"].write_bytes(SERVER_CA.cert_pem)
    files["client.crt"].write_bytes(PARTNER.cert_pem)
    files["client.key"].write_bytes(PARTNER.key_pem)
    port = rig.port("mtls")
    process = await asyncio.create_subprocess_exec(
        "curl", "-sS", "--http2", "--max-time", "10", "--cacert", str(files["ca.pem"]),
        "--cert", str(files["client.crt"]), "--key", str(files["client.key"]),
        "--resolve", f"web.example.com:{port}:127.0.0.1", "-H", f"X-Forwarded-Client-Cert: {FORGED}",
        "-w", "\n%{http_version}", f"https://web.example.com:{port}/h2",
        stdout=asyncio.subprocess.PIPE, stderr=asyncio.subprocess.PIPE,
    )  # fmt: skip
    out, err = await asyncio.wait_for(process.communicate(), 20)
    assert process.returncode == 0, err.decode()
    body, _, version = out.decode().rpartition("\n")
    assert version == "2"
    assert json.loads(body)["headers"].get("x-forwarded-client-cert") == partner_element()
