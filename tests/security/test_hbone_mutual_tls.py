"""HBONE mutual TLS refuses what the adversarial review of issue 14 found it refusing (the "held up" list), replayed
over real sockets on loopback, so that it keeps refusing it:

- the server (:meth:`ambit.proxy.hbone_server.HboneServer.serve`, the one HBONE server of the node proxy's port
  15008 and of the waypoint's) refuses a client presenting an expired certificate or a leaf-signed one (a mesh
  workload's own leaf used as a CA to mint another identity), a client that speaks only TLS 1.2, and a client
  offering an ALPN other than ``h2`` or none at all;
- the client (:meth:`ambit.proxy.hbone_client.HboneClient.connect`) refuses a server presenting an expired or a
  leaf-signed certificate.

The hostile client is a raw TLS client built from the HBONE client context and changed only where the attack says
so; once its handshake is through it writes the HTTP/2 preface and a CONNECT to the upstream listener behind the
server, as a real client would. A refusal is asserted precisely: the connection is closed before the server sent a
single HTTP/2 byte (over the loop's TLS transport the server sends no TLS alert: asyncio closes the socket on a
failed handshake without flushing the alert OpenSSL wrote; over TLS on the socket OpenSSL sends it itself; every
test here runs over both transports; the TLS 1.2 client's handshake fails outright, a TLS 1.3 client's only after it has
finished, as the server judges its certificate then), the server reports the exact reason (OpenSSL's verification
error, the protocol, the ALPN), and nothing was relayed: the upstream listener saw no connection. A control case shows
that the same raw client with a good certificate does get its CONNECT answered and reach the upstream, so the
refusals are not the raw client's own failures.
"""

from __future__ import annotations

import asyncio
import contextlib
import ssl
import time
from collections.abc import AsyncIterator, Awaitable, Callable
from dataclasses import dataclass, field
from pathlib import Path

import pytest
from hpack import Encoder
from tests.integration.hbone_mesh import CLIENT, SERVER, TD, Mesh, until

from ambit.hbone import wire
from ambit.identity.localca import LocalCa
from ambit.model.identity import SpiffeId
from ambit.proxy.errors import ResponseFlag
from ambit.proxy.hbone_client import HboneConnectError
from ambit.tls import contexts
from ambit.tls.certs import KeyPair
from ambit.tls.issuance import sign_csr
from ambit.tls.socket_transport import TlsTransportKind
from ambit.tls.spiffe import make_csr
from ambit.tls.workload import WorkloadCertificate

ATTACKER = SpiffeId(TD, "evil", "default")
"""A workload of the mesh with a genuine certificate of its own, which it abuses as a CA."""


class Pki:
    """The mesh root of one :class:`LocalCa` directory and the certificates the tests present."""

    def __init__(self, directory: Path) -> None:
        self.directory = directory
        # The root is made first, dated three days back, so that it can sign the expired certificates.
        self._past = LocalCa(directory, trust_domain=TD, ttl_seconds=3600, clock=lambda: time.time() - 3 * 86400)
        self.ca = LocalCa(directory, trust_domain=TD, ttl_seconds=3600)

    async def good(self, identity: SpiffeId) -> WorkloadCertificate:
        return await self.ca.fetch_certificate(identity)

    async def expired(self, identity: SpiffeId) -> WorkloadCertificate:
        """Signed by the mesh root three days ago for an hour."""
        cert = await self._past.fetch_certificate(identity)
        assert cert.not_after < time.time() - 86400
        return cert

    async def other_ca(self, identity: SpiffeId) -> WorkloadCertificate:
        """A leaf for ``identity`` from a CA the mesh does not trust (its own root)."""
        return await LocalCa(self.directory / "other-ca", trust_domain=TD, ttl_seconds=3600).fetch_certificate(identity)

    async def leaf_signed(self, identity: SpiffeId) -> WorkloadCertificate:
        """A leaf for ``identity`` signed with the key of the attacker's own genuine leaf (not a CA); the chain
        presented is that leaf followed by the attacker's, so the root is reachable only through a non-CA."""
        own = await self.ca.fetch_certificate(ATTACKER)
        signer = KeyPair(cert_pem=own.chain_pem[0] + self.ca.roots_pem, key_pem=own.key_pem)
        csr_pem, key_pem = make_csr(identity)
        chain = sign_csr(signer, csr_pem, now=time.time(), ttl_seconds=3600)
        assert len(chain) == 3  # forged leaf, attacker's leaf, root
        return WorkloadCertificate.from_chain(identity, chain, key_pem)


@dataclass
class Outcome:
    """What the raw client saw: a failed handshake, or the bytes the server sent before it closed (or answered)."""

    handshake_error: BaseException | None = None
    received: bytes = b""
    closed: bool = False
    frames: list[int] = field(default_factory=list)


def raw_context(
    cert: WorkloadCertificate, *, alpn: list[str] | None = None, tls12_only: bool = False
) -> ssl.SSLContext:
    """A fresh HBONE client context presenting ``cert`` (TLS 1.3, ALPN h2, the mesh roots), with the ALPN offer
    replaced (``[]``: none) or the versions narrowed to TLS 1.2."""
    context = contexts.client_context(cert)
    if alpn is not None:
        context.set_alpn_protocols(alpn)
    if tls12_only:
        context.minimum_version = ssl.TLSVersion.TLSv1_2
        context.maximum_version = ssl.TLSVersion.TLSv1_2
    return context


def frame_types(data: bytes) -> list[int]:
    types, pos = [], 0
    while pos + 9 <= len(data):
        high, low, frame_type, _, _ = wire.HEADER.unpack_from(data, pos)
        types.append(frame_type)
        pos += 9 + ((high << 8) | low)
    return types


async def attempt(mesh: Mesh, context: ssl.SSLContext) -> Outcome:
    """Handshake with ``context``, send the preface and a CONNECT to the upstream, and read until the server closes
    or answers the CONNECT (10 s at most)."""
    try:
        async with asyncio.timeout(10):
            reader, writer = await asyncio.open_connection(*mesh.listener_addr, ssl=context, server_hostname="")
    except (ssl.SSLError, ConnectionError) as exc:
        return Outcome(handshake_error=exc, closed=True)
    block = Encoder().encode([(":method", "CONNECT"), (":authority", "{}:{}".format(*mesh.upstream_addr))])
    writer.write(wire.PREFACE + wire.settings_frame([]) + wire.frame(wire.HEADERS, wire.END_HEADERS, 1, bytes(block)))
    outcome = Outcome()
    try:
        async with asyncio.timeout(10):
            while chunk := await reader.read(65536):
                outcome.received += chunk
                outcome.frames = frame_types(outcome.received)
                if wire.HEADERS in outcome.frames:  # the CONNECT was answered
                    return outcome
            outcome.closed = True
    except (ssl.SSLError, ConnectionError):
        outcome.closed = True
    except TimeoutError:
        pass  # neither answered nor closed: the assertions say so
    finally:
        writer.transport.abort()
    return outcome


class Upstream:
    """Counts the connections the upstream listener behind the HBONE server accepts (and echoes on them)."""

    def __init__(self, mesh: Mesh) -> None:
        self.connections = 0
        mesh.upstream = self._serve

    async def _serve(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        self.connections += 1
        with contextlib.suppress(ConnectionError):
            await reader.read()


@pytest.fixture
async def pki(tmp_path: Path) -> Pki:
    return Pki(tmp_path / "ca")


@pytest.fixture
async def mesh(pki: Pki, tls_transport: TlsTransportKind) -> AsyncIterator[Mesh]:
    mesh = Mesh(pki.ca, await pki.good(CLIENT), await pki.good(SERVER))
    mesh.tls_transport = tls_transport
    await mesh.start()
    yield mesh
    await mesh.aclose()


async def test_the_raw_client_with_a_good_certificate_reaches_the_upstream(mesh: Mesh, pki: Pki) -> None:
    upstream = Upstream(mesh)
    outcome = await attempt(mesh, raw_context(await pki.good(CLIENT)))
    assert outcome.handshake_error is None
    assert outcome.frames[:1] == [wire.SETTINGS] and wire.HEADERS in outcome.frames, outcome
    await until(lambda: upstream.connections == 1)
    assert mesh.failures == []


async def _expired(pki: Pki) -> ssl.SSLContext:
    return raw_context(await pki.expired(CLIENT))


async def _leaf_signed(pki: Pki) -> ssl.SSLContext:
    return raw_context(await pki.leaf_signed(CLIENT))


async def _tls12(pki: Pki) -> ssl.SSLContext:
    return raw_context(await pki.good(CLIENT), tls12_only=True)


async def _alpn_http11(pki: Pki) -> ssl.SSLContext:
    return raw_context(await pki.good(CLIENT), alpn=["http/1.1"])


async def _alpn_h2c_http10(pki: Pki) -> ssl.SSLContext:
    return raw_context(await pki.good(CLIENT), alpn=["h2c", "http/1.0"])


async def _no_alpn(pki: Pki) -> ssl.SSLContext:
    return raw_context(await pki.good(CLIENT), alpn=[])


async def _no_certificate(pki: Pki) -> ssl.SSLContext:
    """A client that trusts the mesh roots and offers h2 over TLS 1.3 but presents no certificate of its own."""
    context = ssl.SSLContext(ssl.PROTOCOL_TLS_CLIENT)
    context.check_hostname = False
    context.minimum_version = ssl.TLSVersion.TLSv1_3
    context.set_alpn_protocols(["h2"])
    context.load_verify_locations(cadata=(await pki.good(CLIENT)).roots_pem.decode("ascii"))
    return context


@pytest.mark.parametrize(
    ("make", "reason"),
    [
        pytest.param(
            _expired,
            "TLS handshake failed: [SSL: CERTIFICATE_VERIFY_FAILED] certificate verify failed: certificate has expired",
            id="expired-certificate",
        ),
        pytest.param(
            _leaf_signed,
            "TLS handshake failed: [SSL: CERTIFICATE_VERIFY_FAILED] certificate verify failed: invalid CA certificate",
            id="leaf-signed-certificate",
        ),
        pytest.param(
            _tls12, "TLS handshake failed: [SSL: UNSUPPORTED_PROTOCOL] unsupported protocol", id="tls1.2-only"
        ),
        pytest.param(_alpn_http11, "client did not agree to ALPN h2 (got None)", id="alpn-http/1.1"),
        pytest.param(_alpn_h2c_http10, "client did not agree to ALPN h2 (got None)", id="alpn-h2c-http/1.0"),
        pytest.param(_no_alpn, "client did not agree to ALPN h2 (got None)", id="no-alpn"),
        pytest.param(
            _no_certificate,
            "TLS handshake failed: [SSL: PEER_DID_NOT_RETURN_A_CERTIFICATE] peer did not return a certificate",
            id="no-client-certificate",
        ),
    ],
)
async def test_the_hbone_server_refuses_the_client_and_relays_nothing(
    mesh: Mesh, pki: Pki, make: Callable[[Pki], Awaitable[ssl.SSLContext]], reason: str
) -> None:
    upstream = Upstream(mesh)
    context = await make(pki)
    outcome = await attempt(mesh, context)
    assert outcome.closed, f"the server neither refused nor closed within 10 s: {outcome}"
    assert outcome.received == b"", f"the server sent HTTP/2 to a client it should refuse: {outcome.frames}"
    if context.maximum_version == ssl.TLSVersion.TLSv1_2:  # refused during the handshake itself
        assert outcome.handshake_error is not None
    await until(lambda: bool(mesh.failures))
    assert len(mesh.failures) == 1 and mesh.failures[0].startswith(reason), mesh.failures
    await until(lambda: not mesh.serving)  # the server is done with the connection ...
    assert upstream.connections == 0  # ... and dialled nobody for it


@pytest.mark.parametrize(
    ("forge", "error"),
    [
        pytest.param(Pki.expired, "certificate has expired", id="expired-certificate"),
        pytest.param(Pki.leaf_signed, "invalid CA certificate", id="leaf-signed-certificate"),
        pytest.param(Pki.other_ca, "unable to get local issuer certificate", id="another-ca"),
    ],
)
async def test_the_hbone_client_refuses_a_server_whose_certificate_does_not_verify(
    mesh: Mesh,
    pki: Pki,
    forge: Callable[[Pki, SpiffeId], Awaitable[WorkloadCertificate]],
    error: str,
) -> None:
    """The forged server certificate names exactly the identity the client expects (``SERVER``): only the chain's
    verification stands between the client and an impersonator."""
    upstream = Upstream(mesh)
    mesh.server_cert = await forge(pki, SERVER)
    with pytest.raises(HboneConnectError) as caught:
        await mesh.dial(frozenset({SERVER}))
    assert caught.value.flag == ResponseFlag.TLS_FAILURE
    assert f"[SSL: CERTIFICATE_VERIFY_FAILED] certificate verify failed: {error}" in caught.value.reason
    await until(lambda: bool(mesh.failures))  # the client hung up on the server in the handshake
    assert len(mesh.failures) == 1 and mesh.failures[0].startswith("TLS handshake failed: "), mesh.failures
    assert mesh.failures[0] != "TLS handshake failed: ", "the server's reason is empty"
    assert upstream.connections == 0
    mesh.server_cert = await pki.good(SERVER)  # and the same client takes the genuine server
    client = await mesh.dial(frozenset({SERVER}))
    assert client.peer_identity == SERVER
    await client.aclose()


async def _other_ca_client(pki: Pki) -> ssl.SSLContext:
    """A client that trusts the mesh roots and offers h2 over TLS 1.3, presenting a certificate from another CA."""
    cert = await pki.other_ca(CLIENT)
    context = ssl.SSLContext(ssl.PROTOCOL_TLS_CLIENT)
    context.check_hostname = False
    context.minimum_version = ssl.TLSVersion.TLSv1_3
    context.set_alpn_protocols(["h2"])
    context.load_verify_locations(cadata=(await pki.good(CLIENT)).roots_pem.decode("ascii"))
    chain, key = pki.directory / "other-client.pem", pki.directory / "other-client.key"
    chain.write_bytes(b"".join(cert.chain_pem[:-1]))
    key.write_bytes(cert.key_pem)
    context.load_cert_chain(chain, key)
    return context


async def test_the_hbone_server_refuses_a_client_certificate_from_another_ca(mesh: Mesh, pki: Pki) -> None:
    upstream = Upstream(mesh)
    outcome = await attempt(mesh, await _other_ca_client(pki))
    assert outcome.closed and outcome.received == b"", outcome
    await until(lambda: bool(mesh.failures))
    reason = "TLS handshake failed: [SSL: CERTIFICATE_VERIFY_FAILED] certificate verify failed: unable to get local"
    assert len(mesh.failures) == 1 and mesh.failures[0].startswith(reason), mesh.failures
    await until(lambda: not mesh.serving)
    assert upstream.connections == 0


async def test_the_hbone_client_refuses_a_genuine_server_with_another_spiffe_id(mesh: Mesh, pki: Pki) -> None:
    """A server with a valid mesh certificate for another identity than the one expected: refused after the
    handshake by the identity check (``check_peer``), with nothing relayed."""
    upstream = Upstream(mesh)
    mesh.server_cert = await pki.good(ATTACKER)
    with pytest.raises(HboneConnectError) as caught:
        await mesh.dial(frozenset({SERVER}))
    assert caught.value.flag == ResponseFlag.IDENTITY_ERROR, caught.value
    assert str(ATTACKER) in caught.value.reason
    assert upstream.connections == 0
