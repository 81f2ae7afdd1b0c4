"""Signing a workload's CSR: the CA's half of SPIFFE workload certificates (spec §5.2-§5.3).

Theory of operation: a CA (the control plane's, or a node proxy's local one) receives a PEM CSR made by
:func:`ambit.tls.spiffe.make_csr`, checks that it is self-consistent, holds a P-256 key and names exactly one
SPIFFE id, and issues a leaf for it signed by its own key (:func:`sign_csr`). This side uses cryptography's X.509
stack; the node proxy's data path does not import this module.

Invariants:

- A CSR carrying anything besides the one SPIFFE URI is refused.
- Issued leaves are usable on both ends of HBONE (serverAuth and clientAuth); their SAN is critical because
  the subject is empty (RFC 5280 §4.2.1.6).
- Validity is ``[now - CLOCK_SKEW, now + ttl]`` clamped to the CA's own validity; nothing here reads the clock.
- Every failure is a :class:`~ambit.tls.errors.CertificateError`; foreign parser errors never escape.

Apart from serial numbers every function here is pure.
"""

from __future__ import annotations

import datetime

from cryptography import x509
from cryptography.hazmat.primitives import hashes, serialization
from cryptography.hazmat.primitives.asymmetric import ec
from cryptography.utils import CryptographyDeprecationWarning
from cryptography.x509.oid import ExtendedKeyUsageOID

from ambit.model.identity import IdentityError, SpiffeId
from ambit.tls.certs import CLOCK_SKEW, KeyPair
from ambit.tls.errors import CertificateError

_SCHEME = "spiffe://"
_PARSE_ERRORS = (
    ValueError,
    TypeError,
    x509.DuplicateExtension,
    x509.UnsupportedGeneralNameType,
    x509.InvalidVersion,
    CryptographyDeprecationWarning,
)


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
