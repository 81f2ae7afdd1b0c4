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
  foreign parser errors never escape.

Apart from fresh keys every function here is pure.
"""

from __future__ import annotations

import warnings

from cryptography import x509
from cryptography.hazmat.primitives import hashes, serialization
from cryptography.hazmat.primitives.asymmetric import ec
from cryptography.utils import CryptographyDeprecationWarning

from ambit.model.identity import IdentityError, SpiffeId
from ambit.tls.errors import PeerIdentityError as PeerIdentityError  # noqa: PLC0414 (re-exported for its older callers)

_SCHEME = "spiffe://"
_PARSE_ERRORS = (
    ValueError,
    TypeError,
    x509.DuplicateExtension,
    x509.UnsupportedGeneralNameType,
    x509.InvalidVersion,
    CryptographyDeprecationWarning,
)


def make_csr(identity: SpiffeId) -> tuple[bytes, bytes]:
    """A PEM CSR for ``identity`` (empty subject, one URI SAN, ECDSA-SHA256) and its fresh PEM P-256 key."""
    key = ec.generate_private_key(ec.SECP256R1())
    csr = (
        x509.CertificateSigningRequestBuilder()
        .subject_name(x509.Name([]))
        .add_extension(x509.SubjectAlternativeName([x509.UniformResourceIdentifier(str(identity))]), critical=True)
        .sign(key, hashes.SHA256())
    )
    key_pem = key.private_bytes(
        serialization.Encoding.PEM, serialization.PrivateFormat.PKCS8, serialization.NoEncryption()
    )
    return csr.public_bytes(serialization.Encoding.PEM), key_pem


def identity_of(cert_der: bytes) -> SpiffeId:
    """The SPIFFE id named by the one ``spiffe://`` URI SAN of a DER certificate, else :class:`PeerIdentityError`."""
    try:
        with warnings.catch_warnings():
            # cryptography warns (and will refuse) on certificates RFC 5280 forbids, e.g. a non-positive serial
            warnings.simplefilter("error", CryptographyDeprecationWarning)
            cert = x509.load_der_x509_certificate(cert_der)
        san = cert.extensions.get_extension_for_class(x509.SubjectAlternativeName).value
        uris = san.get_values_for_type(x509.UniformResourceIdentifier)
    except x509.ExtensionNotFound:
        raise PeerIdentityError("peer certificate has no subject alternative names") from None
    except _PARSE_ERRORS as exc:
        raise PeerIdentityError(f"malformed peer certificate: {exc}") from None
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
