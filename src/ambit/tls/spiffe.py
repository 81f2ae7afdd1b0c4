"""SPIFFE workload certificates: the CSR a node proxy sends, the leaf a CA signs, and the peer check after TLS.

Theory of operation (spec §5.2-§5.4): a workload identity is a SPIFFE id ``spiffe://<td>/ns/<ns>/sa/<sa>`` carried
as the one URI subject alternative name of an X.509 leaf whose subject is empty. The node proxy makes a fresh
ECDSA P-256 key per request and a CSR naming the identity (:func:`make_csr`); the CA checks the CSR and returns
the chain leaf first, root last (:func:`sign_csr`). After a mutual TLS handshake each side reads the peer's
identity from its leaf (:func:`identity_of`) and checks the trust domain and, on the client side, that the peer
is one of the identities it meant to reach (:func:`check_peer`). Chain building up to the root is OpenSSL's job
(the TLS contexts trust only the mesh roots); this module only judges names.

Invariants:

- An identity-bearing certificate has exactly one ``spiffe://`` URI SAN; other URI, DNS or IP SANs are ignored
  when reading a peer, but a CSR carrying anything besides the one SPIFFE URI is refused.
- Issued leaves are usable on both ends of HBONE (serverAuth and clientAuth); their SAN is critical because
  the subject is empty (RFC 5280 §4.2.1.6).
- Validity is ``[now - CLOCK_SKEW, now + ttl]`` clamped to the CA's own validity; nothing here reads the clock.
- Every failure is a :class:`~ambit.tls.certs.CertificateError` (our CA refusing a request) or a
  :class:`PeerIdentityError` (a peer's certificate does not name an acceptable identity); foreign parser errors
  never escape.

Apart from fresh keys and serial numbers every function here is pure.
"""

from __future__ import annotations

import datetime
import warnings

from cryptography import x509
from cryptography.hazmat.primitives import hashes, serialization
from cryptography.hazmat.primitives.asymmetric import ec
from cryptography.utils import CryptographyDeprecationWarning
from cryptography.x509.oid import ExtendedKeyUsageOID

from ambit.model.identity import IdentityError, SpiffeId
from ambit.tls.certs import CLOCK_SKEW, KeyPair
from ambit.tls.errors import CertificateError
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


def sign_csr(
    ca: KeyPair, csr_pem: bytes, *, now: float, ttl_seconds: int, identity: SpiffeId | None = None
) -> list[bytes]:
    """Sign ``csr_pem`` with ``ca`` and return the PEM chain ``[leaf, ..., root]``.

    The CSR must be self-consistent (its signature verifies), hold an ECDSA P-256 key and name exactly one
    SPIFFE URI (equal to ``identity`` when given) and nothing else; otherwise :class:`CertificateError`.
    ``ca.cert_pem`` may hold the signer followed by its own chain up to the root; it is appended as is.
    """
    if ttl_seconds <= 0:
        raise CertificateError(f"certificate TTL must be positive, not {ttl_seconds}")
    requested = _csr_identity(csr_pem)
    if identity is not None and requested != identity:
        raise CertificateError(f"CSR asks for {requested}, but the caller may only get {identity}")
    csr = x509.load_pem_x509_csr(csr_pem)  # parsed once already by _csr_identity, so this cannot fail
    ca_cert, ca_key = ca.certificate, ca.private_key
    if ca_cert.public_key() != ca_key.public_key():
        raise CertificateError("the CA's private key does not match its certificate")
    try:
        ca_chain = x509.load_pem_x509_certificates(ca.cert_pem)
    except ValueError as exc:
        raise CertificateError(f"malformed CA certificate chain: {exc}") from None
    not_before = max(_at(now) - CLOCK_SKEW, ca_cert.not_valid_before_utc)
    not_after = min(_at(now) + datetime.timedelta(seconds=ttl_seconds), ca_cert.not_valid_after_utc)
    if not_after <= not_before:
        raise CertificateError(f"the CA is not valid at {_at(now).isoformat()}; it cannot sign")
    public_key = csr.public_key()
    san = x509.SubjectAlternativeName([x509.UniformResourceIdentifier(str(requested))])
    leaf = (
        x509.CertificateBuilder()
        .subject_name(x509.Name([]))
        .issuer_name(ca_cert.subject)
        .public_key(public_key)
        .serial_number(x509.random_serial_number())
        .not_valid_before(not_before)
        .not_valid_after(not_after)
        .add_extension(san, critical=True)
        .add_extension(x509.BasicConstraints(ca=False, path_length=None), critical=True)
        .add_extension(_leaf_key_usage(), critical=True)
        .add_extension(
            x509.ExtendedKeyUsage([ExtendedKeyUsageOID.SERVER_AUTH, ExtendedKeyUsageOID.CLIENT_AUTH]),
            critical=False,
        )
        .add_extension(x509.SubjectKeyIdentifier.from_public_key(public_key), critical=False)
        .add_extension(_authority_key_id(ca_cert, ca_key), critical=False)
        .sign(ca_key, hashes.SHA256())
    )
    return [cert.public_bytes(serialization.Encoding.PEM) for cert in [leaf, *ca_chain]]


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


def _csr_identity(csr_pem: bytes) -> SpiffeId:
    try:
        csr = x509.load_pem_x509_csr(csr_pem)
        valid = csr.is_signature_valid
        public_key = csr.public_key()
        san = csr.extensions.get_extension_for_class(x509.SubjectAlternativeName).value
    except x509.ExtensionNotFound:
        raise CertificateError("CSR has no subject alternative name") from None
    except _PARSE_ERRORS as exc:
        raise CertificateError(f"malformed CSR: {exc}") from None
    if not valid:
        raise CertificateError("CSR signature does not verify")
    if not isinstance(public_key, ec.EllipticCurvePublicKey) or not isinstance(public_key.curve, ec.SECP256R1):
        raise CertificateError("CSR key is not an ECDSA P-256 key")
    names = list(san)
    if len(names) != 1 or not isinstance(names[0], x509.UniformResourceIdentifier):
        raise CertificateError(f"CSR must name exactly one SPIFFE URI and nothing else, found {len(names)} name(s)")
    uri = names[0].value
    if not uri.startswith(_SCHEME):
        raise CertificateError(f"CSR URI {uri!r} is not a SPIFFE id")
    try:
        return SpiffeId.parse(uri)
    except IdentityError as exc:
        raise CertificateError(f"CSR has a malformed SPIFFE id: {exc}") from None


def _leaf_key_usage() -> x509.KeyUsage:
    return x509.KeyUsage(
        digital_signature=True,
        content_commitment=False,
        key_encipherment=True,
        data_encipherment=False,
        key_agreement=False,
        key_cert_sign=False,
        crl_sign=False,
        encipher_only=False,
        decipher_only=False,
    )


def _authority_key_id(ca_cert: x509.Certificate, ca_key: ec.EllipticCurvePrivateKey) -> x509.AuthorityKeyIdentifier:
    try:
        ski = ca_cert.extensions.get_extension_for_class(x509.SubjectKeyIdentifier).value
    except x509.ExtensionNotFound:
        return x509.AuthorityKeyIdentifier.from_issuer_public_key(ca_key.public_key())
    return x509.AuthorityKeyIdentifier.from_issuer_subject_key_identifier(ski)


def _at(now: float) -> datetime.datetime:
    # X.509 times have whole seconds; truncating keeps notBefore/notAfter predictable.
    return datetime.datetime.fromtimestamp(int(now), tz=datetime.UTC)
