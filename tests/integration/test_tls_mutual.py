"""HBONE mutual TLS over real loopback sockets: the contexts, no SNI, and the SPIFFE checks on both sides."""

from __future__ import annotations

import asyncio
import dataclasses
import ssl
import time
from collections.abc import AsyncIterator
from pathlib import Path

import pytest

from ambit.identity.localca import LocalCa
from ambit.identity.manager import WorkloadCertificate
from ambit.model.identity import SpiffeId
from ambit.tls.certs import load_or_create_ca
from ambit.tls.spiffe import PeerIdentityError, check_peer, make_csr, sign_csr

TRUST_DOMAIN = "cluster.local"
CLIENT = SpiffeId(TRUST_DOMAIN, "shop", "frontend")
SERVER = SpiffeId(TRUST_DOMAIN, "shop", "backend")


@dataclasses.dataclass
class Accepted:
    """What the server saw of one connection that completed the handshake."""

    sni: list[str | None]
    peer: SpiffeId | None = None
    refusal: PeerIdentityError | None = None
    alpn: str | None = None
    version: str | None = None


@dataclasses.dataclass
class Server:
    port: int
    accepted: list[Accepted]


@pytest.fixture
def mesh_ca(tmp_path: Path) -> LocalCa:
    return LocalCa(tmp_path / "mesh-ca", ttl_seconds=3600)


async def _serve(cert: WorkloadCertificate) -> tuple[asyncio.Server, Server]:
    # A fresh context per server so the SNI probe never leaks into the certificate's cached one.
    context = dataclasses.replace(cert).server_context()
    sni: list[str | None] = []
    context.sni_callback = lambda _sock, name, _ctx: sni.append(name)
    state = Server(port=0, accepted=[])

    async def handle(reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        tls = writer.get_extra_info("ssl_object")
        seen = Accepted(sni=list(sni), alpn=tls.selected_alpn_protocol(), version=tls.version())
        state.accepted.append(seen)
        try:
            seen.peer = check_peer(tls.getpeercert(binary_form=True), trust_domain=TRUST_DOMAIN, expected=None)
            writer.write(b"hello " + str(seen.peer).encode())
        except PeerIdentityError as exc:
            seen.refusal = exc
        writer.close()

    server = await asyncio.start_server(handle, "127.0.0.1", 0, ssl=context)
    state.port = server.sockets[0].getsockname()[1]
    return server, state


@pytest.fixture
async def backend(mesh_ca: LocalCa) -> AsyncIterator[Server]:
    server, state = await _serve(await mesh_ca.fetch_certificate(SERVER))
    async with server:
        yield state


async def _dial(port: int, context: ssl.SSLContext) -> tuple[asyncio.StreamReader, asyncio.StreamWriter]:
    # server_hostname="" is how asyncio connects over TLS without SNI (hostname checks are off in the context).
    return await asyncio.open_connection("127.0.0.1", port, ssl=context, server_hostname="")


async def _refused_by_server(port: int, context: ssl.SSLContext) -> None:
    """TLS 1.3 clients finish first; the server's refusal shows up as an alert or EOF on the first read."""
    reader, writer = await _dial(port, context)
    try:
        assert await reader.read() == b""
    except (ssl.SSLError, ConnectionResetError):
        pass
    finally:
        writer.close()


async def test_mutual_handshake_uses_tls13_alpn_h2_no_sni_and_both_sides_see_the_right_identity(
    mesh_ca: LocalCa, backend: Server
) -> None:
    client = await mesh_ca.fetch_certificate(CLIENT)
    reader, writer = await _dial(backend.port, client.client_context())
    tls = writer.get_extra_info("ssl_object")
    assert tls.version() == "TLSv1.3"
    assert tls.selected_alpn_protocol() == "h2"
    peer = check_peer(tls.getpeercert(binary_form=True), trust_domain=TRUST_DOMAIN, expected=frozenset({SERVER}))
    assert peer == SERVER
    assert await reader.read() == b"hello " + str(CLIENT).encode()
    writer.close()
    [seen] = backend.accepted
    assert seen.peer == CLIENT and seen.refusal is None
    assert seen.alpn == "h2" and seen.version == "TLSv1.3"
    assert seen.sni == [None]
    assert tls.session is None or not tls.session.has_ticket  # no resumption tickets were issued


async def test_client_certificate_from_another_root_is_rejected_by_the_server(
    tmp_path: Path, mesh_ca: LocalCa, backend: Server
) -> None:
    rogue = await LocalCa(tmp_path / "rogue-ca").fetch_certificate(CLIENT)
    # The rogue client trusts the mesh root so that only the server's verdict is on trial.
    trusting = dataclasses.replace(rogue, roots_pem=mesh_ca.roots_pem)
    await _refused_by_server(backend.port, trusting.client_context())
    assert backend.accepted == []


async def test_client_without_a_certificate_is_rejected_by_the_server(mesh_ca: LocalCa, backend: Server) -> None:
    context = ssl.SSLContext(ssl.PROTOCOL_TLS_CLIENT)
    context.check_hostname = False
    context.minimum_version = ssl.TLSVersion.TLSv1_3
    context.set_alpn_protocols(["h2"])
    context.load_verify_locations(cadata=mesh_ca.roots_pem.decode())
    await _refused_by_server(backend.port, context)
    assert backend.accepted == []


async def test_server_from_a_separate_ca_is_rejected_by_tls_and_by_check_peer_when_trusted(
    tmp_path: Path, mesh_ca: LocalCa
) -> None:
    other_ca = LocalCa(tmp_path / "other-ca", trust_domain="other.local")
    foreign = await other_ca.fetch_certificate(SpiffeId("other.local", "shop", "backend"))
    server, state = await _serve(foreign)
    port = state.port
    async with server:
        client = await mesh_ca.fetch_certificate(CLIENT)
        with pytest.raises(ssl.SSLCertVerificationError):
            await _dial(port, client.client_context())
        # Trusting both roots (as during a migration) gets through TLS, and the trust domain check still refuses.
        both = dataclasses.replace(client, roots_pem=mesh_ca.roots_pem + other_ca.roots_pem)
        _reader, writer = await _dial(port, both.client_context())
        tls = writer.get_extra_info("ssl_object")
        with pytest.raises(PeerIdentityError, match="outside trust domain"):
            check_peer(tls.getpeercert(binary_form=True), trust_domain=TRUST_DOMAIN, expected=None)
        writer.close()


async def test_another_trust_domain_under_the_same_root_is_refused_on_both_sides(
    tmp_path: Path, mesh_ca: LocalCa, backend: Server
) -> None:
    root = load_or_create_ca(tmp_path / "mesh-ca", "root", "Ambit mesh root", 0.0)
    stranger = SpiffeId("other.local", "shop", "frontend")
    csr, key = make_csr(stranger)
    chain = sign_csr(root, csr, now=time.time(), ttl_seconds=600)
    foreign = WorkloadCertificate.from_chain(stranger, chain, key)

    # Client side: a server in another trust domain is refused after the handshake.
    server, state = await _serve(foreign)
    async with server:
        client = await mesh_ca.fetch_certificate(CLIENT)
        _reader, writer = await _dial(state.port, client.client_context())
        tls = writer.get_extra_info("ssl_object")
        with pytest.raises(PeerIdentityError, match="outside trust domain"):
            check_peer(tls.getpeercert(binary_form=True), trust_domain=TRUST_DOMAIN, expected=None)
        writer.close()

    # Server side: a client in another trust domain completes TLS but is refused by the identity check.
    reader, writer = await _dial(backend.port, foreign.client_context())
    assert await reader.read() == b""
    writer.close()
    [seen] = backend.accepted
    assert seen.peer is None and seen.refusal is not None and "outside trust domain" in str(seen.refusal)


async def test_an_unexpected_server_identity_is_refused_by_the_client(mesh_ca: LocalCa, backend: Server) -> None:
    client = await mesh_ca.fetch_certificate(CLIENT)
    _reader, writer = await _dial(backend.port, client.client_context())
    tls = writer.get_extra_info("ssl_object")
    wanted = frozenset({SpiffeId(TRUST_DOMAIN, "shop", "payments")})
    with pytest.raises(PeerIdentityError, match="expected one of"):
        check_peer(tls.getpeercert(binary_form=True), trust_domain=TRUST_DOMAIN, expected=wanted)
    writer.close()
