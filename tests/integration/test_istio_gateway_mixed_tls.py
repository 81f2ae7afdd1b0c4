"""An Istio Gateway port where a PASSTHROUGH server and terminating servers (SIMPLE, ISTIO_MUTUAL) meet, picked by
SNI as istiod's filter chains are: translated by the control plane's pure translation and served by a real
:class:`IngressGateway` on loopback (:mod:`tests.integration.ingress_rig`) with real TLS both ways.

``web.gateway.test`` (SIMPLE, the gateway's own certificate from :data:`SERVER_CA`) is terminated and its HTTP
routed to the mesh's ``web``; ``one.example.com`` (PASSTHROUGH) reaches the mesh's TLS server ``one``, whose
certificate (from the rig's ``EDGE_CA``, a key the gateway does not hold) the client verifies: the bytes went
through untouched. Attacks: garbage instead of a ClientHello, a truncated hello, a server name no server has, and a
passthrough name asked with a handshake the gateway would have to terminate: none reaches the mesh.
"""

from __future__ import annotations

import asyncio
import json
import socket
import ssl
import time
from collections.abc import AsyncIterator
from pathlib import Path
from typing import Any

import pytest
from tests.ingress_pki import opaque_secret
from tests.integration.ingress_rig import IngressRig, as_served, ingress_rig, tls_ask
from tests.tls_hello import record_with_name

from ambit.controlplane.translate import translate_all
from ambit.model.ingress import GatewayConfig, ListenerProtocol
from ambit.tls.certs import issue_server_cert, new_ca
from ambit.waypoint.http1_proxy import LINGER_SECONDS

Obj = dict[str, Any]
NOW = time.time()
SERVER_CA = new_ca("gateway server CA", now=NOW)
SERVER = issue_server_cert(
    SERVER_CA, common_name="web.gateway.test", dns_names=["web.gateway.test"], ip_addresses=[], now=NOW
)
GATEWAY_POD = {
    "metadata": {
        "name": "istio-ingressgateway-0",
        "namespace": "istio-system",
        "labels": {"app": "istio-ingressgateway", "istio": "ingressgateway"},
    },
    "spec": {"serviceAccountName": "istio-ingressgateway-service-account"},
}
SERVICES = [
    {"metadata": {"name": name, "namespace": "app"}, "spec": {"clusterIP": ip, "ports": [{"name": "p", "port": port}]}}
    for name, ip, port in (("web", "198.18.2.4", 80), ("one", "198.18.2.1", 443))
]


def gateway_config() -> GatewayConfig:
    def server(host: str, protocol: str, **tls: str) -> Obj:
        return {"port": {"number": 443, "name": f"p-{host}", "protocol": protocol}, "hosts": [host], "tls": tls}

    gateway = {
        "apiVersion": "networking.istio.io/v1",
        "kind": "Gateway",
        "metadata": {"name": "gateway", "namespace": "app"},
        "spec": {
            "selector": {"istio": "ingressgateway"},
            "servers": [
                server("web.gateway.test", "HTTPS", mode="SIMPLE", credentialName="edge"),
                server("one.example.com", "TLS", mode="PASSTHROUGH"),
            ],
        },
    }
    web = {
        "metadata": {"name": "web", "namespace": "app"},
        "spec": {
            "gateways": ["gateway"],
            "hosts": ["web.gateway.test"],
            "http": [{"route": [{"destination": {"host": "web", "port": {"number": 80}}}]}],
        },
    }
    passthrough = {
        "metadata": {"name": "one", "namespace": "app"},
        "spec": {
            "gateways": ["gateway"],
            "hosts": ["one.example.com"],
            "tls": [
                {
                    "match": [{"sniHosts": ["one.example.com"]}],
                    "route": [{"destination": {"host": "one", "port": {"number": 443}}}],
                }
            ],
        },
    }
    translation = translate_all(
        pods=[GATEWAY_POD],
        services=SERVICES,
        endpoint_slices=(),
        namespaces=[{"metadata": {"name": "app"}}, {"metadata": {"name": "istio-system"}}],
        istio_gateways=[gateway],
        virtual_services=[web, passthrough],
        secrets=[opaque_secret("edge", "istio-system", tls_crt=SERVER.cert_pem, tls_key=SERVER.key_pem)],
    )
    assert not translation.skipped, translation.skipped
    (config,) = translation.gateway_configs
    protocols = {i.hostname: i.protocol for i in config.listeners}
    assert protocols == {"web.gateway.test": ListenerProtocol.HTTPS, "one.example.com": ListenerProtocol.TLS}
    return as_served(config)


@pytest.fixture
async def rig(tmp_path: Path) -> AsyncIterator[tuple[IngressRig, int]]:
    config = gateway_config()
    async with ingress_rig(tmp_path, config) as running:
        yield running, config.listeners[0].port


async def https_get(port: int, server_name: str) -> dict[str, Any] | None:
    """GET / over TLS verified against the gateway's CA: the JSON answer, or None when refused."""
    context = ssl.create_default_context(cadata=SERVER_CA.cert_pem.decode())
    try:
        async with asyncio.timeout(10):
            reader, writer = await asyncio.open_connection("127.0.0.1", port, ssl=context, server_hostname=server_name)
            try:
                writer.write(f"GET /mixed HTTP/1.1\r\nhost: {server_name}\r\nconnection: close\r\n\r\n".encode())
                await writer.drain()
                answer = await reader.read()
            finally:
                writer.close()
    except (ssl.SSLError, ConnectionError, OSError):
        return None
    head, _, body = answer.partition(b"\r\n\r\n")
    if not head.startswith(b"HTTP/1.1 200"):
        return {"status": head.split(b"\r\n", 1)[0].decode()}
    answer_json: dict[str, Any] = json.loads(body)
    return answer_json


async def raw_exchange(port: int, data: bytes, *, then_close: bool) -> bytes:
    """Send ``data`` as they are; what comes back before the gateway closes (``then_close``: we half-close first)."""
    loop = asyncio.get_running_loop()
    sock = socket.socket()
    sock.setblocking(False)
    try:
        await loop.sock_connect(sock, ("127.0.0.1", port))
        await loop.sock_sendall(sock, data)
        if then_close:
            sock.shutdown(socket.SHUT_WR)
        out = b""
        async with asyncio.timeout(10):
            while chunk := await loop.sock_recv(sock, 65536):
                out += chunk
        return out
    except ConnectionError:
        return b""
    finally:
        sock.close()


async def test_the_terminated_server_serves_http_and_the_passthrough_server_relays_tls_on_one_port(
    rig: tuple[IngressRig, int],
) -> None:
    running, port = rig
    answer = await https_get(port, "web.gateway.test")
    assert answer is not None and answer.get("path") == "/mixed" and answer["host"] == "web.gateway.test", answer
    assert await tls_ask(port, "one.example.com") == "one hello"  # the backend's own certificate: untouched
    assert await https_get(port, "web.gateway.test") is not None  # and again, in the other order
    assert len(running.endpoint.peers) >= 2


@pytest.mark.parametrize(
    "data",
    [
        b"GET / HTTP/1.1\r\nhost: web.gateway.test\r\n\r\n",  # plaintext on a TLS port
        b"\x16\x03\x01\xff\xff" + b"\x00" * 64,  # a record header that promises more than comes
        record_with_name(b"one.example.com")[:40],  # a hello cut short
    ],
    ids=["garbage", "oversized record", "truncated hello"],
)
async def test_what_is_no_whole_client_hello_is_closed_and_reaches_nothing(
    rig: tuple[IngressRig, int], data: bytes
) -> None:
    running, port = rig
    assert await raw_exchange(port, data, then_close=True) == b""
    assert running.endpoint.peers == []
    assert sum(running.proc.connection_refusals.values()) >= 1


async def test_an_unknown_server_name_is_refused_and_reaches_nothing(rig: tuple[IngressRig, int]) -> None:
    running, port = rig
    assert await https_get(port, "nobody.example.org") is None
    with pytest.raises((ssl.SSLError, ConnectionError, OSError, asyncio.TimeoutError)):
        await tls_ask(port, "two.example.com")  # a passthrough name no server has
    assert running.endpoint.peers == []


async def test_a_passthrough_name_cannot_be_terminated_by_the_gateway(rig: tuple[IngressRig, int]) -> None:
    """Asking for the passthrough host while trusting only the gateway's CA: the bytes go to the backend, whose
    certificate this client does not trust, so the handshake fails: the gateway never answers for that name."""
    running, port = rig
    assert await https_get(port, "one.example.com") is None
    assert len(running.endpoint.peers) == 1  # relayed to the backend, whose certificate the client refused


async def test_a_client_reading_to_eof_gets_the_end_at_once_not_after_the_lingering_close(
    rig: tuple[IngressRig, int],
) -> None:
    """TLS has no half-close: the gateway ends a ``connection: close`` answer with its close_notify rather than
    waiting out the HTTP/1.1 lingering close (which would hold every such client for its whole bound)."""
    _, port = rig
    async with asyncio.timeout(LINGER_SECONDS):  # the stall this guards against lasts exactly this long
        answer = await https_get(port, "web.gateway.test")
    assert answer is not None and answer.get("path") == "/mixed", answer
