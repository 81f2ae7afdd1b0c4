"""Istio Gateway servers with ``tls.mode: MUTUAL`` and ``ISTIO_MUTUAL`` and an HTTP server with ``httpsRedirect``,
translated by the control plane's pure translation and served by a real :class:`IngressGateway` on loopback, with
real TLS clients (Python's ``ssl``) holding certificates made here.

One HTTPS port carries four listeners, picked by SNI: ``mutual.example.com`` (MUTUAL, CA and certificate from one
generic Secret as Istio's documentation creates it, ``subjectAltNames: [client.example]``), ``optional.example.com``
(OPTIONAL_MUTUAL, the same Secret and names), ``mesh.example.com`` (ISTIO_MUTUAL) and ``simple.example.com``
(SIMPLE). A DENY policy at the gateway refuses ``/mesh-only`` to any
principal but ``cluster.local/ns/app/sa/client``. Attacks: no certificate, a self-signed certificate naming the
right SAN, a certificate from another CA, the right CA with the wrong SAN, a mesh certificate on the MUTUAL listener
and the MUTUAL client on the ISTIO_MUTUAL one, no SNI, and SNI of the SIMPLE listener with the Host of the MUTUAL
one; on the OPTIONAL_MUTUAL listener, a certificate from another CA (the handshake itself fails), a self-signed one
and one of the right CA with the wrong SAN. None of them reaches the mesh.
"""

from __future__ import annotations

import asyncio
import dataclasses
import json
import socket
import ssl
import time
from collections.abc import AsyncIterator
from pathlib import Path
from typing import Any

import pytest
from tests.ingress_pki import client_cert, opaque_secret, self_signed_client
from tests.integration.ingress_rig import TD, IngressRig, ingress_rig
from tests.integration.waypoint_rig import free_port
from tests.upstream_objects import ingress_gateway

from ambit.controlplane.translate import translate_all
from ambit.controlplane.translate.istio_gateway_servers import CIPHER_SUITES
from ambit.identity.localca import LocalCa
from ambit.model.identity import SpiffeId
from ambit.model.ingress import GatewayConfig
from ambit.tls.certs import KeyPair, issue_server_cert, new_ca
from ambit.tls.contexts import _memory_file

Obj = dict[str, Any]
NOW = time.time()
SERVER_CA = new_ca("gateway server CA", now=NOW)
CLIENT_CA = new_ca("partner client CA", now=NOW)
OTHER_CA = new_ca("some other CA", now=NOW)
SERVER = issue_server_cert(SERVER_CA, common_name="example.com", dns_names=["*.example.com"], ip_addresses=[], now=NOW)
GOOD_CLIENT = client_cert(CLIENT_CA, dns=("client.example",))
REFUSED = None


GATEWAY_POD = {
    "metadata": {
        "name": "istio-ingressgateway-0",
        "namespace": "istio-system",
        "labels": {"app": "istio-ingressgateway", "istio": "ingressgateway"},
    },
    "spec": {"serviceAccountName": "istio-ingressgateway-service-account"},
}
WEB = {"metadata": {"name": "web", "namespace": "app"}, "spec": {"clusterIP": "198.18.2.4", "ports": [{"port": 80}]}}


def gateway_config() -> GatewayConfig:
    gateway = ingress_gateway("app")
    gateway["spec"]["servers"] = [
        {
            "port": {"number": 443, "name": "https-mutual", "protocol": "HTTPS"},
            "hosts": ["mutual.example.com"],
            "tls": {"mode": "MUTUAL", "credentialName": "partner", "subjectAltNames": ["client.example"]},
        },
        {
            "port": {"number": 443, "name": "https-optional", "protocol": "HTTPS"},
            "hosts": ["optional.example.com"],
            "tls": {"mode": "OPTIONAL_MUTUAL", "credentialName": "partner", "subjectAltNames": ["client.example"]},
        },
        {
            "port": {"number": 443, "name": "https-mesh", "protocol": "HTTPS"},
            "hosts": ["mesh.example.com"],
            "tls": {"mode": "ISTIO_MUTUAL"},
        },
        {
            "port": {"number": 443, "name": "https-simple", "protocol": "HTTPS"},
            "hosts": ["simple.example.com"],
            "tls": {"mode": "SIMPLE", "credentialName": "partner"},
        },
        {
            "port": {"number": 80, "name": "http", "protocol": "HTTP"},
            "hosts": ["*.example.com"],
            "tls": {"httpsRedirect": True},
        },
    ]
    route = {
        "metadata": {"name": "web", "namespace": "app"},
        "spec": {
            "gateways": ["gateway"],
            "hosts": ["*.example.com"],
            "http": [{"route": [{"destination": {"host": "web"}}]}],
        },
    }
    secret = opaque_secret(
        "partner", "istio-system", tls_crt=SERVER.cert_pem, tls_key=SERVER.key_pem, ca_crt=CLIENT_CA.cert_pem
    )
    deny = {
        "metadata": {"name": "mesh-only", "namespace": "istio-system"},
        "spec": {
            "selector": {"matchLabels": {"istio": "ingressgateway"}},
            "action": "DENY",
            "rules": [
                {
                    "from": [{"source": {"notPrincipals": ["cluster.local/ns/app/sa/client"]}}],
                    "to": [{"operation": {"paths": ["/mesh-only"]}}],
                }
            ],
        },
    }
    translation = translate_all(
        pods=[GATEWAY_POD],
        services=[WEB],
        endpoint_slices=(),
        namespaces=[{"metadata": {"name": "app"}}, {"metadata": {"name": "istio-system"}}],
        istio_gateways=[gateway],
        virtual_services=[route],
        secrets=[secret],
        authorization_policies=[deny],
    )
    assert not [s for s in translation.skipped if s.kind == "Gateway"], translation.skipped
    (config,) = translation.gateway_configs
    ports = {443: free_port(), 80: free_port()}
    return dataclasses.replace(
        config, listeners=tuple(dataclasses.replace(i, port=ports[i.port]) for i in config.listeners)
    )


@pytest.fixture
async def rig(tmp_path: Path) -> AsyncIterator[tuple[IngressRig, GatewayConfig, LocalCa]]:
    config = gateway_config()
    async with ingress_rig(tmp_path, config) as running:
        yield running, config, LocalCa(tmp_path / "ca", trust_domain=TD)


def port_of(config: GatewayConfig, protocol: str) -> int:
    return next(i.port for i in config.listeners if i.protocol.value == protocol)


def client_context(server_roots: bytes, cert: KeyPair | None, tls12: bool = False, ciphers: str = "") -> ssl.SSLContext:
    context = ssl.create_default_context(cadata=server_roots.decode())
    context.check_hostname = False  # the mesh certificate names a SPIFFE id; the roots are what is checked here
    if tls12:
        context.maximum_version = ssl.TLSVersion.TLSv1_2
    if ciphers:
        context.set_ciphers(ciphers)
    if cert is not None:
        with _memory_file(cert.cert_pem) as chain, _memory_file(cert.key_pem) as key:
            context.load_cert_chain(chain, key)
    return context


async def https_get(
    port: int,
    sni: str | None,
    path: str,
    cert: KeyPair | None,
    *,
    roots: bytes = SERVER_CA.cert_pem,
    host: str = "",
    tls12: bool = False,
    ciphers: str = "",
) -> tuple[int, Obj] | None:
    """One HTTP/1.1 request over TLS: (status, JSON body), or None when the gateway refused the client (the
    handshake failed or the connection closed before an answer)."""
    context = client_context(roots, cert, tls12, ciphers)
    try:
        async with asyncio.timeout(10):
            reader, writer = await asyncio.open_connection("127.0.0.1", port, ssl=context, server_hostname=sni or None)
            try:
                writer.write(f"GET {path} HTTP/1.1\r\nHost: {host or sni}\r\n\r\n".encode())
                await writer.drain()
                return await read_response(reader)
            finally:
                writer.close()
    except (ssl.SSLError, ConnectionError, asyncio.IncompleteReadError, OSError):
        return REFUSED


async def read_response(reader: asyncio.StreamReader) -> tuple[int, Obj]:
    """Status and JSON body (empty when it is not JSON) of one response with a Content-Length."""
    head = (await reader.readuntil(b"\r\n\r\n")).decode("latin-1")
    length = next(
        (int(line.split(":", 1)[1]) for line in head.split("\r\n") if line.lower().startswith("content-length:")), 0
    )
    body = await reader.readexactly(length)
    return int(head.split(" ", 2)[1]), (json.loads(body) if body.startswith(b"{") else {})


def mesh_pair(cert: Any) -> KeyPair:
    return KeyPair(b"".join(cert.chain_pem[:-1]), cert.key_pem)


async def test_mutual_serves_a_client_of_its_ca_with_an_accepted_san(
    rig: tuple[IngressRig, GatewayConfig, LocalCa],
) -> None:
    running, config, _ = rig
    port = port_of(config, "HTTPS")
    answer = await https_get(port, "mutual.example.com", "/hello", GOOD_CLIENT)
    assert answer is not None and answer[0] == 200 and answer[1]["path"] == "/hello"
    # MUTUAL names no principal: the DENY on /mesh-only holds for a partner certificate too
    assert (await https_get(port, "mutual.example.com", "/mesh-only", GOOD_CLIENT) or (0,))[0] == 403
    assert running.proc.connection_refusals["client tls"] == 0


async def test_mutual_refuses_missing_forged_foreign_and_misnamed_client_certificates(
    rig: tuple[IngressRig, GatewayConfig, LocalCa],
) -> None:
    running, config, ca = rig
    port = port_of(config, "HTTPS")
    mesh = mesh_pair(await ca.fetch_certificate(SpiffeId(TD, "app", "client")))
    attacks = {
        "no certificate": None,
        "self-signed with the accepted SAN": self_signed_client(dns=("client.example",)),
        "another CA": client_cert(OTHER_CA, dns=("client.example",)),
        "the right CA, another SAN": client_cert(CLIENT_CA, dns=("intruder.example",)),
        "a mesh certificate": mesh,
    }
    for name, cert in attacks.items():
        assert await https_get(port, "mutual.example.com", "/hello", cert) is REFUSED, name
    assert running.endpoint.peers == []  # nothing reached the mesh
    assert (await https_get(port, "mutual.example.com", "/hello", GOOD_CLIENT) or (0,))[0] == 200


async def test_optional_mutual_serves_clients_with_and_without_a_certificate_of_its_ca(
    rig: tuple[IngressRig, GatewayConfig, LocalCa],
) -> None:
    running, config, _ = rig
    port = port_of(config, "HTTPS")
    for tls12 in (False, True):
        answer = await https_get(port, "optional.example.com", "/hello", None, tls12=tls12)
        assert answer is not None and answer[0] == 200 and "client" not in answer[1], tls12
        answer = await https_get(port, "optional.example.com", "/hello", GOOD_CLIENT, tls12=tls12)
        assert answer is not None and answer[0] == 200, tls12
    # neither gives a principal: the DENY on /mesh-only holds for both
    for cert in (None, GOOD_CLIENT):
        assert (await https_get(port, "optional.example.com", "/mesh-only", cert) or (0,))[0] == 403
    assert running.proc.connection_refusals["client tls"] == 0


async def test_optional_mutual_refuses_a_presented_certificate_that_fails_verification(
    rig: tuple[IngressRig, GatewayConfig, LocalCa],
) -> None:
    running, config, ca = rig
    port = port_of(config, "HTTPS")
    attacks = {
        "another CA": client_cert(OTHER_CA, dns=("client.example",)),
        "self-signed with the accepted SAN": self_signed_client(dns=("client.example",)),
        "the right CA, another SAN": client_cert(CLIENT_CA, dns=("intruder.example",)),
        "a mesh certificate": mesh_pair(await ca.fetch_certificate(SpiffeId(TD, "app", "client"))),
    }
    for name, cert in attacks.items():
        for tls12 in (False, True):
            assert await https_get(port, "optional.example.com", "/hello", cert, tls12=tls12) is REFUSED, name
    assert running.endpoint.peers == []  # nothing reached the mesh
    # a certificate that does not chain to the listener's CA fails the handshake itself (with TLS 1.2 the client
    # sees it before the handshake completes), not only the verdict after it
    context = client_context(SERVER_CA.cert_pem, client_cert(OTHER_CA, dns=("client.example",)), tls12=True)
    with pytest.raises((ssl.SSLError, ConnectionResetError)):  # the alert, or the reset that follows it
        async with asyncio.timeout(10):
            await asyncio.open_connection("127.0.0.1", port, ssl=context, server_hostname="optional.example.com")
    refused_after_handshake = running.proc.connection_refusals["client tls"]
    assert refused_after_handshake == 2  # the wrong SAN, once per TLS version: judged after a good handshake
    assert (await https_get(port, "optional.example.com", "/hello", GOOD_CLIENT) or (0,))[0] == 200


async def test_istio_mutual_takes_the_mesh_client_s_spiffe_id_as_its_principal(
    rig: tuple[IngressRig, GatewayConfig, LocalCa],
) -> None:
    running, config, ca = rig
    port = port_of(config, "HTTPS")
    roots = ca.roots_pem
    allowed = mesh_pair(await ca.fetch_certificate(SpiffeId(TD, "app", "client")))
    other = mesh_pair(await ca.fetch_certificate(SpiffeId(TD, "app", "other")))
    assert (await https_get(port, "mesh.example.com", "/mesh-only", allowed, roots=roots) or (0,))[0] == 200
    assert (await https_get(port, "mesh.example.com", "/mesh-only", other, roots=roots) or (0,))[0] == 403
    assert (await https_get(port, "mesh.example.com", "/open", other, roots=roots) or (0,))[0] == 200
    reached = len(running.endpoint.peers)
    forged = self_signed_client(uris=("spiffe://cluster.local/ns/app/sa/client",))
    for name, cert in {"no certificate": None, "forged SPIFFE id": forged, "partner CA": GOOD_CLIENT}.items():
        assert await https_get(port, "mesh.example.com", "/mesh-only", cert, roots=roots) is REFUSED, name
    assert len(running.endpoint.peers) == reached


async def test_a_simple_listener_beside_mutual_ones_serves_without_a_certificate_but_never_their_routes(
    rig: tuple[IngressRig, GatewayConfig, LocalCa],
) -> None:
    running, config, _ = rig
    port = port_of(config, "HTTPS")
    assert (await https_get(port, "simple.example.com", "/x", None) or (0,))[0] == 200
    # the SIMPLE handshake does not open the MUTUAL listener's routes: its own hosts only
    answer = await https_get(port, "simple.example.com", "/x", None, host="mutual.example.com")
    assert answer is not None and answer[0] == 404
    # no server name on a port with mutual listeners: no listener, no handshake
    assert await https_get(port, None, "/x", GOOD_CLIENT, host="mutual.example.com") is REFUSED
    assert await https_get(port, "unknown.example.com", "/x", GOOD_CLIENT) is REFUSED
    assert len(running.endpoint.peers) == 1


async def test_https_redirect_answers_301_to_the_https_url_before_routing(
    rig: tuple[IngressRig, GatewayConfig, LocalCa],
) -> None:
    running, config, _ = rig
    port = port_of(config, "HTTP")
    reader, writer = await asyncio.open_connection("127.0.0.1", port)
    writer.write(b"GET /a/b?c=d HTTP/1.1\r\nHost: mutual.example.com\r\nConnection: close\r\n\r\n")
    await writer.drain()
    raw = await asyncio.wait_for(reader.read(), 10)
    writer.close()
    head = raw.partition(b"\r\n\r\n")[0].decode().lower()
    assert head.startswith("http/1.1 301")
    assert "location: https://mutual.example.com/a/b?c=d" in head
    assert running.endpoint.peers == []


def bounded_config(old_suites: tuple[str, ...] = ("ECDHE-ECDSA-AES256-GCM-SHA384",)) -> GatewayConfig:
    """SIMPLE servers bounded by ``minProtocolVersion`` / ``maxProtocolVersion`` / ``cipherSuites``: port 443 serves
    ``old.example.com`` (TLS 1.2 only, one suite) beside ``any.example.com`` (defaults); port 8443 serves
    ``new.example.com`` (TLS 1.3 only)."""
    gateway = ingress_gateway("app")
    simple = {"mode": "SIMPLE", "credentialName": "partner"}
    gateway["spec"]["servers"] = [
        {
            "port": {"number": 443, "name": "https-old", "protocol": "HTTPS"},
            "hosts": ["old.example.com"],
            "tls": {**simple, "maxProtocolVersion": "TLSV1_2", "cipherSuites": list(old_suites)},
        },
        {
            "port": {"number": 443, "name": "https-any", "protocol": "HTTPS"},
            "hosts": ["any.example.com"],
            "tls": simple,
        },
        {
            "port": {"number": 8443, "name": "https-new", "protocol": "HTTPS"},
            "hosts": ["new.example.com"],
            "tls": {**simple, "minProtocolVersion": "TLSV1_3"},
        },
    ]
    route = {
        "metadata": {"name": "web", "namespace": "app"},
        "spec": {
            "gateways": ["gateway"],
            "hosts": ["*.example.com"],
            "http": [{"route": [{"destination": {"host": "web"}}]}],
        },
    }
    secret = opaque_secret("partner", "istio-system", tls_crt=SERVER.cert_pem, tls_key=SERVER.key_pem)
    translation = translate_all(
        pods=[GATEWAY_POD],
        services=[WEB],
        endpoint_slices=(),
        namespaces=[{"metadata": {"name": "app"}}, {"metadata": {"name": "istio-system"}}],
        istio_gateways=[gateway],
        virtual_services=[route],
        secrets=[secret],
    )
    assert not [s for s in translation.skipped if s.kind == "Gateway"], translation.skipped
    (config,) = translation.gateway_configs
    ports = {443: free_port(), 8443: free_port()}
    return dataclasses.replace(
        config, listeners=tuple(dataclasses.replace(i, port=ports[i.port]) for i in config.listeners)
    )


async def test_versions_and_cipher_suites_bound_each_listener(tmp_path: Path) -> None:
    config = bounded_config()
    mixed = next(i.port for i in config.listeners if i.hostname == "old.example.com")
    new = next(i.port for i in config.listeners if i.hostname == "new.example.com")
    async with ingress_rig(tmp_path, config) as running:

        async def status(port: int, sni: str, **options: Any) -> int | None:
            answer = await https_get(port, sni, "/v", None, **options)
            return answer[0] if answer is not None else None

        listed, other = "ECDHE-ECDSA-AES256-GCM-SHA384", "ECDHE-ECDSA-AES128-GCM-SHA256"
        assert await status(mixed, "old.example.com", tls12=True, ciphers=listed) == 200
        assert await status(mixed, "old.example.com", tls12=True, ciphers=other) is REFUSED
        # the port also serves TLS 1.3 (any.example.com): a client that can speak it gets it, and old.example.com,
        # bound to TLS 1.2, refuses the connection rather than serve it outside its bounds
        assert await status(mixed, "old.example.com") is REFUSED
        assert await status(mixed, "any.example.com") == 200
        assert await status(mixed, "any.example.com", tls12=True, ciphers=other) == 200
        assert await status(new, "new.example.com") == 200
        assert await status(new, "new.example.com", tls12=True) is REFUSED
        assert running.proc.connection_refusals["client tls"] >= 1  # 1.3 on old.example.com: after the handshake


async def test_upstream_cipher_suite_case_every_valid_suite_and_a_fake_one_serves(tmp_path: Path) -> None:
    # upstream routing.go "cipher suite": Istio's whole ValidCipherSuites list plus "fake", which istiod drops
    config = bounded_config((*sorted(CIPHER_SUITES), "fake"))
    old = next(i for i in config.listeners if i.hostname == "old.example.com")
    assert old.tls is not None and "fake" not in old.tls.cipher_suites
    async with ingress_rig(tmp_path, config):
        answer = await https_get(old.port, "old.example.com", "/v", None, tls12=True)
        assert answer is not None and answer[0] == 200


def _resume(port: int, first: str, second: str, cert: KeyPair | None, tls12: bool) -> tuple[bool, bytes] | None:
    """A client served on ``first`` that offers the same session (TLS 1.2 session id, or TLS 1.3 ticket) on a new
    connection to ``second``: (whether the session was resumed, what came back), or None when the second handshake
    failed."""
    context = client_context(SERVER_CA.cert_pem, cert, tls12=tls12)
    request = "GET /r HTTP/1.1\r\nHost: {}\r\n\r\n"
    with (
        socket.create_connection(("127.0.0.1", port), timeout=10) as raw,
        context.wrap_socket(raw, server_hostname=first) as tls,
    ):
        tls.sendall(request.format(first).encode())
        assert tls.recv(65536).startswith(b"HTTP/1.1 200")
        session = tls.session
    try:
        with (
            socket.create_connection(("127.0.0.1", port), timeout=10) as raw,
            context.wrap_socket(raw, server_hostname=second, session=session) as tls,
        ):
            tls.sendall(request.format(second).encode())
            return tls.session_reused, tls.recv(65536)
    except (ssl.SSLError, OSError):
        return None


async def test_no_session_is_resumed_on_a_port_with_mutual_listeners(
    rig: tuple[IngressRig, GatewayConfig, LocalCa],
) -> None:
    """A session from the SIMPLE listener (no client certificate) offered to the MUTUAL one must not carry the
    client past the certificate check; nor is any session resumed, so a verified client is verified again."""
    _, config, _ = rig
    port = port_of(config, "HTTPS")
    for tls12 in (True, False):
        crossed = await asyncio.to_thread(_resume, port, "simple.example.com", "mutual.example.com", None, tls12)
        assert crossed is None or (not crossed[0] and not crossed[1].startswith(b"HTTP/1.1 200")), crossed
        again = await asyncio.to_thread(_resume, port, "mutual.example.com", "mutual.example.com", GOOD_CLIENT, tls12)
        assert again is not None and again[0] is False and again[1].startswith(b"HTTP/1.1 200"), again


async def test_istio_mutual_forwards_the_mesh_client_s_certificate_with_the_gateway_s_id_as_by(
    rig: tuple[IngressRig, GatewayConfig, LocalCa],
) -> None:
    """XFCC at the gateway's default (``SANITIZE_SET``) on an ``ISTIO_MUTUAL`` server: ``By`` is the SPIFFE id of
    the mesh certificate the gateway served, ``URI`` the client's; a forged header is replaced."""
    _, config, ca = rig
    port = port_of(config, "HTTPS")
    client = mesh_pair(await ca.fetch_certificate(SpiffeId(TD, "app", "other")))
    context = client_context(ca.roots_pem, client)
    async with asyncio.timeout(10):
        reader, writer = await asyncio.open_connection(
            "127.0.0.1", port, ssl=context, server_hostname="mesh.example.com"
        )
        try:
            writer.write(
                b"GET /open HTTP/1.1\r\nHost: mesh.example.com\r\nX-Forwarded-Client-Cert: URI=spiffe://forged\r\n\r\n"
            )
            await writer.drain()
            status, body = await read_response(reader)
        finally:
            writer.close()
    assert status == 200
    fields = body["headers"]["x-forwarded-client-cert"].split(";")
    assert fields[0] == f"By=spiffe://{TD}/ns/edge/sa/edge-istio" and fields[1].startswith("Hash=")
    assert f"URI=spiffe://{TD}/ns/app/sa/other" in fields and "forged" not in body["headers"]["x-forwarded-client-cert"]
