"""SPIFFE workload certificates: the CSR a node proxy sends, the leaf a CA signs, and the peer check after TLS.

Theory of operation (spec §5.2-§5.4): a workload identity is a SPIFFE id ``spiffe://<td>/ns/<ns>/sa/<sa>`` carried
as the one URI subject alternative name of an X.509 leaf whose subject is empty. The node proxy makes a fresh
ECDSA P-256 key per request and a CSR naming the identity (:func:`make_csr`); the CA checks the CSR and returns
the chain leaf first, root last (:func:`ambit.tls.issuance.sign_csr`). After a mutual TLS handshake each side
reads the peer's identity from its leaf (:func:`identity_of`) and checks the trust domain and, on the client
side, that the peer is one of the identities it meant to reach (:func:`check_peer`). Chain building up to the
root is OpenSSL's job (the TLS contexts trust only the mesh roots); this module only judges names.

Invariants:

- An identity-bearing certificate has exactly one ``spiffe://`` URI SAN; other URI, DNS or IP SANs are ignored
  when reading a peer, but a CSR carrying anything besides the one SPIFFE URI is refused.
- Every failure is a :class:`PeerIdentityError` (a peer's certificate does not name an acceptable identity);
  parser errors never escape.
- The module imports no X.509 library: the CSR is encoded by :mod:`ambit.tls.csr` with a key from
  :mod:`ambit.tls.eckey`, and certificates are read by :mod:`ambit.tls.certinfo`, so the node proxy's data path does
  not load cryptography (about 10 MiB per process).

Apart from fresh keys every function here is pure.
"""

from __future__ import annotations

from ambit.model.identity import IdentityError, SpiffeId
from ambit.tls import csr, der, eckey
from ambit.tls.certinfo import read_certificate
from ambit.tls.der import DerError
from ambit.tls.errors import PeerIdentityError as PeerIdentityError  # noqa: PLC0414 (re-exported for its older callers)

_SCHEME = "spiffe://"


def make_csr(identity: SpiffeId) -> tuple[bytes, bytes]:
    """A PEM CSR for ``identity`` (empty subject, one URI SAN, ECDSA-SHA256) and its fresh PEM P-256 key."""
    key = eckey.new_key()
    request = csr.signing_request(str(identity), key.public_key_der(), key.sign_sha256)
    return der.pem(b"CERTIFICATE REQUEST", request), key.private_key_pem()


def identity_of(cert_der: bytes) -> SpiffeId:
    """The SPIFFE id named by the one ``spiffe://`` URI SAN of a DER certificate, else :class:`PeerIdentityError`."""
    try:
        uris = read_certificate(cert_der).uris
    except DerError as exc:
        raise PeerIdentityError(f"malformed peer certificate: {exc}") from None
    if uris is None:
        raise PeerIdentityError("peer certificate has no subject alternative names")
    spiffe = [uri for uri in uris if uri[: len(_SCHEME)].lower() == _SCHEME]
    if len(spiffe) != 1:
        raise PeerIdentityError(f"peer certificate must name exactly one SPIFFE id, found {len(spiffe)}")
    try:
        return SpiffeId.parse(spiffe[0])
    except IdentityError as exc:
        raise PeerIdentityError(f"peer certificate has a malformed SPIFFE id: {exc}") from None


_KNOWN_PEERS: dict[bytes, SpiffeId] = {}
"""DER certificate → the identity it names: each handshake with a peer we met before skips parsing its certificate
(about 60 µs, twice per new HBONE connection). A pure function of the bytes, so a cache cannot change a verdict."""
_KNOWN_PEERS_MAX = 1024


def check_peer(cert_der: bytes | None, *, trust_domain: str, expected: frozenset[SpiffeId] | None) -> SpiffeId:
    """The verified peer's identity, if it is in ``trust_domain`` and (when ``expected`` is non-empty) expected.

    ``cert_der`` is ``SSLObject.getpeercert(binary_form=True)``; ``None`` means the peer sent no certificate.
    """
    if cert_der is None:
        raise PeerIdentityError("peer presented no certificate")
    peer = _KNOWN_PEERS.get(cert_der)
    if peer is None:
        peer = identity_of(cert_der)  # raises for a certificate that names no usable identity (never cached)
        if len(_KNOWN_PEERS) >= _KNOWN_PEERS_MAX:
            del _KNOWN_PEERS[next(iter(_KNOWN_PEERS))]  # the oldest
        _KNOWN_PEERS[cert_der] = peer
    if peer.trust_domain != trust_domain:
        raise PeerIdentityError(f"peer {peer} is outside trust domain {trust_domain!r}")
    if expected and peer not in expected:
        wanted = ", ".join(sorted(str(identity) for identity in expected))
        raise PeerIdentityError(f"peer is {peer}, expected one of: {wanted}")
    return peer
