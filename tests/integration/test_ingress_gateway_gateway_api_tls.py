"""Gateway API TLS listeners through the ingress gateway on loopback (issue 18): a Gateway of class ``istio`` with a TLS
``Terminate`` listener and a TLS ``Passthrough`` listener on one port, and a second terminating listener with an
ECDSA and an RSA certificate, translated by ``translate_all`` (certificate from another namespace, allowed by a
ReferenceGrant) and served by a real :class:`IngressGateway` (:mod:`tests.integration.ingress_rig`) to real TLS
clients.

``echo.example.com`` is terminated by the gateway and relayed in plain text by a TCPRoute to the mesh's TCP echo
server (a client reading its own bytes back through TLS proves the gateway terminated: the echo server speaks no
TLS); ``a.example.com`` is passed through by a TLSRoute to the mesh's TLS server ``one``, whose certificate the
gateway does not hold (a client verifying it proves the gateway did not terminate). Attacks: a ClientHello naming the
passthrough listener followed by garbage (relayed to the backend, never terminated by the gateway), a ClientHello
naming the terminating listener followed by garbage (nothing reaches the mesh), a hello that never completes, and
the same Gateway without the ReferenceGrant (the terminating listener is not served: no handshake reveals anything).
"""

from __future__ import annotations

import asyncio
import contextlib
import ssl
import time
from collections.abc import AsyncIterator
from pathlib import Path
from typing import Any

import pytest
from tests.ingress_pki import opaque_secret, rsa_server_cert
from tests.integration.ingress_rig import BACKEND_CERT, EDGE_CA, GATEWAY_ID, IngressRig, as_served, ingress_rig, tls_ask

from ambit.controlplane.translate import translate_all
from ambit.model.ingress import GatewayConfig, ListenerProtocol
from ambit.tls.certs import KeyPair, issue_server_cert, new_ca

Obj = dict[str, Any]
NOW = time.time()
SERVER_CA = new_ca("gateway server CA", now=NOW)
ECDSA = issue_server_cert(SERVER_CA, common_name="example.com", dns_names=["*.example.com"], ip_addresses=[], now=NOW)
RSA = rsa_server_cert(SERVER_CA, "*.example.com")
GROUP = "gateway.networking.k8s.io"


def _der(pair: KeyPair) -> bytes:
    return ssl.PEM_cert_to_DER_cert(pair.cert_pem.decode())


def _objects(with_grant: bool) -> dict[str, Any]:
    def tls(name: str, port: int, mode: str, hostname: str | None = None, refs: list[Obj] | None = None) -> Obj:
        listener: Obj = {
            "name": name,
            "port": port,
            "protocol": "TLS",
            "allowedRoutes": {"namespaces": {"from": "All"}},
            "tls": {"mode": mode, **({"certificateRefs": refs} if refs else {})},
        }
        if hostname:
            listener["hostname"] = hostname
        return listener

    gateway = {
        "apiVersion": f"{GROUP}/v1",
        "kind": "Gateway",
        "metadata": {"name": "edge", "namespace": "edge"},
        "spec": {
            "gatewayClassName": "istio",
            "listeners": [
                tls("terminate", 443, "Terminate", "echo.example.com", [{"name": "shared", "namespace": "certs"}]),
                tls("passthrough", 443, "Passthrough"),
                tls("paired", 9443, "Terminate", "*.example.com", [{"name": "ecdsa"}, {"name": "rsa"}]),
            ],
        },
    }

    def route(kind: str, name: str, section: str, service: str, port: int, hostnames: list[str] | None = None) -> Obj:
        spec: Obj = {
            "parentRefs": [{"name": "edge", "namespace": "edge", "sectionName": section}],
            "rules": [{"backendRefs": [{"name": service, "port": port}]}],
        }
        if hostnames:
            spec["hostnames"] = hostnames
        return {
            "apiVersion": f"{GROUP}/v1alpha2",
            "kind": kind,
            "metadata": {"name": name, "namespace": "app"},
            "spec": spec,
        }

    grant = {
        "apiVersion": f"{GROUP}/v1beta1",
        "kind": "ReferenceGrant",
        "metadata": {"name": "edge-may-read", "namespace": "certs"},
        "spec": {
            "from": [{"group": GROUP, "kind": "Gateway", "namespace": "edge"}],
            "to": [{"group": "", "kind": "Secret", "name": "shared"}],
        },
    }
    return {
        "pods": (),
        "services": [
            {
                "metadata": {"name": "tcp", "namespace": "app"},
                "spec": {"clusterIP": "198.18.2.3", "ports": [{"port": 9000}]},
            },
            {
                "metadata": {"name": "one", "namespace": "app"},
                "spec": {"clusterIP": "198.18.2.1", "ports": [{"port": 443}]},
            },
        ],
        "endpoint_slices": (),
        "namespaces": [{"metadata": {"name": n}} for n in ("app", "edge", "certs")],
        "gateways": [gateway],
        "tcp_routes": [
            route("TCPRoute", "echo", "terminate", "tcp", 9000),
            route("TCPRoute", "paired", "paired", "tcp", 9000),
        ],
        "tls_routes": [route("TLSRoute", "one", "passthrough", "one", 443, ["a.example.com"])],
        "reference_grants": [grant] if with_grant else [],
        "secrets": [
            opaque_secret("shared", "certs", "kubernetes.io/tls", tls_crt=ECDSA.cert_pem, tls_key=ECDSA.key_pem),
            opaque_secret("ecdsa", "edge", "kubernetes.io/tls", tls_crt=ECDSA.cert_pem, tls_key=ECDSA.key_pem),
            opaque_secret("rsa", "edge", "kubernetes.io/tls", tls_crt=RSA.cert_pem, tls_key=RSA.key_pem),
        ],
    }


def gateway_config(*, with_grant: bool = True) -> GatewayConfig:
    translation = translate_all(**_objects(with_grant))
    (config,) = translation.gateway_configs
    return as_served(config)  # what the gateway gets is what its xDS client decodes


@pytest.fixture
async def rig(tmp_path: Path) -> AsyncIterator[IngressRig]:
    async with ingress_rig(tmp_path, gateway_config()) as running:
        yield running


def server_context(*, tls12_cipher: str | None = None) -> ssl.SSLContext:
    context = ssl.create_default_context(cadata=SERVER_CA.cert_pem.decode())
    if tls12_cipher:
        context.maximum_version = ssl.TLSVersion.TLSv1_2
        context.set_ciphers(tls12_cipher)
    return context


async def echo(port: int, sni: str, context: ssl.SSLContext | None = None) -> tuple[bytes, bytes] | None:
    """A line over TLS to the gateway, read back: (the line, the DER certificate the gateway presented), or None
    when refused."""
    try:
        async with asyncio.timeout(10):
            reader, writer = await asyncio.open_connection(
                "127.0.0.1", port, ssl=context or server_context(), server_hostname=sni
            )
            try:
                writer.write(b"hello through the gateway\n")
                await writer.drain()
                line = await reader.readline()
                tls = writer.get_extra_info("ssl_object")
                assert tls.selected_alpn_protocol() is None
                return (line, tls.getpeercert(binary_form=True)) if line else None
            finally:
                writer.close()
    except (ssl.SSLError, ConnectionError, OSError):
        return None


async def raw_exchange(port: int, parts: list[bytes], *, eof: bool = False) -> bytes:
    """Send ``parts``, each after the answer to the one before has come (up to 1 s), then end the stream when
    ``eof``, and read what comes back until the gateway closes (bounded)."""
    reader, writer = await asyncio.open_connection("127.0.0.1", port)
    received = b""
    try:
        for i, part in enumerate(parts):
            if i:
                with contextlib.suppress(TimeoutError):
                    async with asyncio.timeout(1):
                        received += await reader.read(65536)
            writer.write(part)
            await writer.drain()
        if eof:
            writer.write_eof()
        async with asyncio.timeout(10):
            while chunk := await reader.read(65536):
                received += chunk
    except (ConnectionError, TimeoutError):
        pass
    finally:
        writer.close()
    return received


def client_hello(
    sni: str, ca: bytes, *, tls12: bool = False
) -> tuple[ssl.SSLObject, ssl.MemoryBIO, ssl.MemoryBIO, bytes]:
    """A real ClientHello for ``sni`` from a memory-BIO TLS client, and the client to go on with. With ``tls12`` the
    server's certificate will travel in clear, for a test to see whose it is."""
    context = ssl.create_default_context(cadata=ca.decode())
    if tls12:
        context.maximum_version = ssl.TLSVersion.TLSv1_2
    incoming, outgoing = ssl.MemoryBIO(), ssl.MemoryBIO()
    tls = context.wrap_bio(incoming, outgoing, server_hostname=sni)
    with pytest.raises(ssl.SSLWantReadError):
        tls.do_handshake()
    return tls, incoming, outgoing, outgoing.read()


async def split_hello_exchange(port: int, sni: str, ca: bytes) -> str:
    """A TLS client whose ClientHello goes in two segments 0.3 s apart (the gateway must wait for the whole hello
    before it picks), then a line and its answer."""
    tls, incoming, outgoing, hello = client_hello(sni, ca)
    reader, writer = await asyncio.open_connection("127.0.0.1", port)
    try:
        async with asyncio.timeout(10):
            writer.write(hello[:9])  # the record header and part of the handshake header
            await writer.drain()
            await asyncio.sleep(0.3)
            writer.write(hello[9:])
            await writer.drain()
            while True:
                try:
                    tls.do_handshake()
                    break
                except ssl.SSLWantReadError:
                    writer.write(outgoing.read())
                    await writer.drain()
                    data = await reader.read(65536)
                    assert data, "closed during the handshake"
                    incoming.write(data)
            tls.write(b"hello\n")
            writer.write(outgoing.read())
            await writer.drain()
            while True:
                try:
                    return tls.read(65536).decode().strip()
                except ssl.SSLWantReadError:
                    data = await reader.read(65536)
                    assert data, "closed before the answer"
                    incoming.write(data)
    finally:
        writer.close()


async def test_one_port_terminates_the_terminate_listener_s_name_and_passes_the_others_through(rig: IngressRig) -> None:
    port = rig.port("terminate")
    assert rig.port("passthrough") == port
    assert {i.name: i.protocol for i in rig.proc.router.config.listeners} == {
        "terminate": ListenerProtocol.TLS_TERMINATE,
        "passthrough": ListenerProtocol.TLS,
        "paired": ListenerProtocol.TLS_TERMINATE,
    }
    offers_h2 = server_context()
    offers_h2.set_alpn_protocols(["h2", "http/1.1"])  # as curl does: a relay must not claim h2
    answered = await echo(port, "echo.example.com", offers_h2)
    assert answered is not None and answered[0] == b"hello through the gateway\n"  # terminated: plain to the echo
    assert answered[1] == _der(ECDSA)  # the certificate of the other namespace, by the ReferenceGrant
    assert await tls_ask(port, "a.example.com") == "one hello"  # passed through: the backend's own certificate
    assert rig.endpoint.peers == [GATEWAY_ID] * 2  # both over HBONE with the gateway's own identity
    # a name neither listener routes: the passthrough listener (no hostname) takes it, no TLSRoute names it: closed
    with pytest.raises((ssl.SSLError, ConnectionError, OSError)):
        await tls_ask(port, "b.example.com")
    assert rig.endpoint.peers == [GATEWAY_ID] * 2
    assert rig.proc.config_dump()["gateway"]["connection_refusals"] == {"no route": 1}


async def test_a_client_hello_split_across_segments_is_routed_whole_either_way(rig: IngressRig) -> None:
    port = rig.port("terminate")
    assert await split_hello_exchange(port, "a.example.com", EDGE_CA.cert_pem) == "one hello"
    assert await split_hello_exchange(port, "echo.example.com", SERVER_CA.cert_pem) == "hello"
    assert rig.endpoint.peers == [GATEWAY_ID] * 2


async def test_garbage_after_a_hello_is_relayed_by_passthrough_and_refused_by_termination(rig: IngressRig) -> None:
    port = rig.port("terminate")
    garbage = b"\x16\x03\x03\x00\x05garbage that is no TLS record at all" * 4
    # SNI of the passthrough listener, then garbage: relayed untouched; what answers is the backend (its
    # certificate), never the gateway, which holds no key for it and decrypts nothing.
    *_, hello = client_hello("a.example.com", EDGE_CA.cert_pem, tls12=True)
    answer = await raw_exchange(port, [hello, garbage])
    assert _der(BACKEND_CERT) in answer
    assert _der(ECDSA) not in answer and _der(RSA) not in answer
    assert rig.endpoint.peers == [GATEWAY_ID]
    # SNI of the terminating listener, then garbage instead of the rest of the handshake: nothing reaches the mesh
    *_, hello = client_hello("echo.example.com", SERVER_CA.cert_pem, tls12=True)
    answer = await raw_exchange(port, [hello, garbage])
    assert _der(ECDSA) in answer and _der(BACKEND_CERT) not in answer  # the gateway's handshake, not relayed
    assert rig.endpoint.peers == [GATEWAY_ID]
    # a hello cut short by the client's end of stream: closed at once, counted, nothing relayed
    started = time.monotonic()
    assert await raw_exchange(port, [hello[:20]], eof=True) == b""
    assert time.monotonic() - started < 5
    assert rig.proc.config_dump()["gateway"]["connection_refusals"] == {"hello": 1}
    assert rig.endpoint.peers == [GATEWAY_ID]
    # the listeners still serve afterwards
    answered = await echo(port, "echo.example.com")
    assert answered is not None and answered[0] == b"hello through the gateway\n"


async def test_an_rsa_and_an_ecdsa_certificate_are_both_served_by_the_client_s_algorithms(rig: IngressRig) -> None:
    port = rig.port("paired")
    for cipher, pair in (("ECDHE-ECDSA-AES128-GCM-SHA256", ECDSA), ("ECDHE-RSA-AES128-GCM-SHA256", RSA)):
        answered = await echo(port, "x.example.com", server_context(tls12_cipher=cipher))
        assert answered is not None, cipher
        assert answered == (b"hello through the gateway\n", _der(pair)), cipher
    answered = await echo(port, "x.example.com")  # TLS 1.3, both offered: either, served
    assert answered is not None and answered[1] in (_der(ECDSA), _der(RSA))


async def test_without_the_reference_grant_the_terminating_listener_is_not_served(tmp_path: Path) -> None:
    config = gateway_config(with_grant=False)
    assert [i.name for i in config.listeners] == ["passthrough", "paired"]
    async with ingress_rig(tmp_path, config) as running:
        port = running.port("passthrough")
        # the name goes to the passthrough listener, which routes nothing there: no handshake with the Secret's key
        assert await echo(port, "echo.example.com") is None
        *_, hello = client_hello("echo.example.com", SERVER_CA.cert_pem, tls12=True)
        answer = await raw_exchange(port, [hello])
        assert _der(ECDSA) not in answer
        assert running.endpoint.peers == []
