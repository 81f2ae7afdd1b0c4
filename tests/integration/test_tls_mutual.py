"""HBONE mutual TLS over real loopback sockets: the contexts, no SNI, and the SPIFFE checks on both sides.

The certificates each side presents are read off one handshake over memory BIOs, through the handshake messages
OpenSSL reports (``SSLContext._msg_callback``: TLS 1.3 encrypts the Certificate message on the wire).
"""

from __future__ import annotations

import asyncio
import dataclasses
import datetime
import ssl
import time
from collections.abc import AsyncIterator, Callable
from pathlib import Path

import pytest
from cryptography import x509
from cryptography.hazmat.primitives import hashes, serialization
from cryptography.hazmat.primitives.asymmetric import ec

from ambit.identity.localca import LocalCa
from ambit.model.identity import SpiffeId
from ambit.tls import contexts
from ambit.tls.certs import KeyPair, load_or_create_ca
from ambit.tls.issuance import sign_csr
from ambit.tls.spiffe import PeerIdentityError, check_peer, make_csr
from ambit.tls.workload import WorkloadCertificate

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


def _presented(client: WorkloadCertificate, server: WorkloadCertificate) -> tuple[list[bytes], list[bytes]]:
    """One handshake between fresh contexts of ``client`` and ``server``: the DER certificates each one sent."""
    client_context = dataclasses.replace(client).client_context()
    server_context = dataclasses.replace(server).server_context()
    sent: dict[bool, list[bytes]] = {}

    def record(server_side: bool) -> Callable[..., None]:
        def callback(_conn: object, direction: str, _version: object, _type: object, msg: object, data: bytes) -> None:
            if direction == "write" and msg == ssl._TLSMessageType.CERTIFICATE:  # type: ignore[attr-defined]
                sent[server_side] = _certificate_list(data)

        return callback

    client_context._msg_callback = record(False)  # type: ignore[attr-defined]
    server_context._msg_callback = record(True)  # type: ignore[attr-defined]
    c_in, c_out, s_in, s_out = ssl.MemoryBIO(), ssl.MemoryBIO(), ssl.MemoryBIO(), ssl.MemoryBIO()
    tls_client = client_context.wrap_bio(c_in, c_out)
    tls_server = server_context.wrap_bio(s_in, s_out, server_side=True)
    done = {tls_client: False, tls_server: False}
    while not all(done.values()):
        for tls, outgoing, incoming in ((tls_client, c_out, s_in), (tls_server, s_out, c_in)):
            if not done[tls]:
                try:
                    tls.do_handshake()
                    done[tls] = True
                except ssl.SSLWantReadError:
                    pass
            incoming.write(outgoing.read())
    assert check_peer(tls_client.getpeercert(True), trust_domain=TRUST_DOMAIN, expected=None) == server.identity
    assert check_peer(tls_server.getpeercert(True), trust_domain=TRUST_DOMAIN, expected=None) == client.identity
    return sent[False], sent[True]


def _certificate_list(message: bytes) -> list[bytes]:
    """The DER certificates of a TLS 1.3 Certificate handshake message (RFC 8446 §4.4.2)."""
    at = 4 + 1 + message[4]  # handshake header, certificate_request_context
    end = at + 3 + int.from_bytes(message[at : at + 3], "big")
    at += 3
    certs = []
    while at < end:
        size = int.from_bytes(message[at : at + 3], "big")
        certs.append(message[at + 3 : at + 3 + size])
        at += 3 + size
        at += 2 + int.from_bytes(message[at : at + 2], "big")  # the entry's extensions
    return certs


def _der(pem: bytes) -> bytes:
    return x509.load_pem_x509_certificate(pem).public_bytes(serialization.Encoding.DER)


def _intermediate(root: KeyPair) -> KeyPair:
    """A CA under ``root``; its ``cert_pem`` carries the root after it, so what it signs chains up to the root."""
    key = ec.generate_private_key(ec.SECP256R1())
    root_cert = root.certificate
    now = datetime.datetime.now(datetime.UTC)
    cert = (
        x509.CertificateBuilder()
        .subject_name(x509.Name([x509.NameAttribute(x509.NameOID.COMMON_NAME, "Ambit intermediate")]))
        .issuer_name(root_cert.subject)
        .public_key(key.public_key())
        .serial_number(x509.random_serial_number())
        .not_valid_before(now - datetime.timedelta(minutes=5))
        .not_valid_after(now + datetime.timedelta(days=1))
        .add_extension(x509.BasicConstraints(ca=True, path_length=0), critical=True)
        .add_extension(
            x509.KeyUsage(
                digital_signature=True,
                content_commitment=False,
                key_encipherment=False,
                data_encipherment=False,
                key_agreement=False,
                key_cert_sign=True,
                crl_sign=True,
                encipher_only=False,
                decipher_only=False,
            ),
            critical=True,
        )
        .add_extension(x509.SubjectKeyIdentifier.from_public_key(key.public_key()), critical=False)
        .sign(root.private_key, hashes.SHA256())
    )
    key_pem = key.private_bytes(
        serialization.Encoding.PEM, serialization.PrivateFormat.PKCS8, serialization.NoEncryption()
    )
    return KeyPair(cert.public_bytes(serialization.Encoding.PEM) + root.cert_pem, key_pem)


async def test_each_side_presents_only_its_leaf_never_the_root_and_both_still_verify(mesh_ca: LocalCa) -> None:
    client = await mesh_ca.fetch_certificate(CLIENT)
    server = await mesh_ca.fetch_certificate(SERVER)
    if contexts._libssl() is None:
        pytest.skip("this Python cannot reach OpenSSL's SSL_CTX (not CPython, or a static libssl)")
    client_sent, server_sent = _presented(client, server)
    assert client_sent == [_der(client.chain_pem[0])]
    assert server_sent == [_der(server.chain_pem[0])]


async def test_without_the_openssl_knob_the_root_is_named_explicitly_and_both_still_verify(
    mesh_ca: LocalCa, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setattr(contexts, "_no_auto_chain", lambda _context: False)
    client = await mesh_ca.fetch_certificate(CLIENT)
    server = await mesh_ca.fetch_certificate(SERVER)
    client_sent, server_sent = _presented(client, server)
    assert client_sent == [_der(pem) for pem in client.chain_pem]  # leaf and root, as OpenSSL's default sends
    assert server_sent == [_der(pem) for pem in server.chain_pem]


async def test_intermediates_are_presented_and_a_peer_trusting_only_the_root_accepts_them(
    tmp_path: Path, mesh_ca: LocalCa
) -> None:
    root = load_or_create_ca(tmp_path / "mesh-ca", "root", "Ambit mesh root", 0.0)
    csr, key = make_csr(CLIENT)
    chain = sign_csr(_intermediate(root), csr, now=time.time(), ttl_seconds=600)
    client = WorkloadCertificate.from_chain(CLIENT, chain, key)
    assert len(client.chain_pem) == 3 and client.roots_pem == mesh_ca.roots_pem
    server = await mesh_ca.fetch_certificate(SERVER)
    client_sent, _ = _presented(client, server)
    assert client_sent == [_der(pem) for pem in client.chain_pem[:2]]  # leaf and intermediate, no root


async def test_a_leaf_whose_intermediate_the_peer_lacks_is_refused(tmp_path: Path, mesh_ca: LocalCa) -> None:
    root = load_or_create_ca(tmp_path / "mesh-ca", "root", "Ambit mesh root", 0.0)
    csr, key = make_csr(CLIENT)
    leaf, _intermediate_pem, root_pem = sign_csr(_intermediate(root), csr, now=time.time(), ttl_seconds=600)
    # A chain without its intermediate: the peer, trusting only the root, cannot link the leaf to it.
    client = WorkloadCertificate.from_chain(CLIENT, [leaf, root_pem], key)
    server = await mesh_ca.fetch_certificate(SERVER)
    with pytest.raises(ssl.SSLError):
        _presented(client, server)


def test_the_chain_knob_leaves_alone_a_context_that_does_not_require_peer_certificates() -> None:
    context = ssl.SSLContext(ssl.PROTOCOL_TLS_SERVER)  # CERT_NONE: not one of ours, so not vouched for
    assert contexts._no_auto_chain(context) is False
