"""X.509 certificates for Ambit: a self-signed CA and the server and client certificates it issues.

Theory of operation: every key is ECDSA P-256 and every signature ECDSA-SHA256, which is what kube-apiserver,
kubectl and Istio all accept. A :class:`KeyPair` is two PEM blobs (certificate and PKCS#8 private key); it is
the unit that is written to disk, put in a kubeconfig or handed to ``ssl.SSLContext.load_cert_chain``.

Invariants:

- Nothing here reads the clock; ``now`` (seconds since the epoch) is always passed in. Validity starts
  :data:`CLOCK_SKEW` before ``now`` so a peer whose clock is a little behind still accepts a fresh certificate.
- An issued certificate never outlives its CA: ``notAfter`` is clamped to the CA's.
- Leaf certificates carry ``BasicConstraints(ca=False)``, a critical ``KeyUsage(digitalSignature)``, one
  extended key usage (serverAuth or clientAuth), a SubjectKeyIdentifier and an AuthorityKeyIdentifier that
  names the CA's key, so both OpenSSL and strict (web-PKI) verifiers build the chain.
- Client certificates follow Kubernetes' convention: the common name is the user name and each organization
  is a group.

Only :func:`load_or_create_ca` touches the filesystem; every other function is pure apart from the randomness
of fresh keys and serial numbers.
"""

from __future__ import annotations

import datetime
import ipaddress
import os
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path

from cryptography import x509
from cryptography.exceptions import UnsupportedAlgorithm
from cryptography.hazmat.primitives import hashes, serialization
from cryptography.hazmat.primitives.asymmetric import ec
from cryptography.x509.oid import ExtendedKeyUsageOID, NameOID

from ambit.tls.errors import CertificateError as CertificateError  # noqa: PLC0414 (re-exported for its older callers)

CLOCK_SKEW = datetime.timedelta(minutes=5)
"""How far before ``now`` a new certificate becomes valid."""


@dataclass(frozen=True, slots=True)
class KeyPair:
    """A PEM certificate and its PEM (PKCS#8, unencrypted) ECDSA P-256 private key."""

    cert_pem: bytes
    key_pem: bytes

    @property
    def certificate(self) -> x509.Certificate:
        try:
            return x509.load_pem_x509_certificate(self.cert_pem)
        except ValueError as exc:
            raise CertificateError(f"malformed PEM certificate: {exc}") from None

    @property
    def private_key(self) -> ec.EllipticCurvePrivateKey:
        try:
            key = serialization.load_pem_private_key(self.key_pem, password=None)
        except (ValueError, TypeError, UnsupportedAlgorithm) as exc:
            raise CertificateError(f"malformed PEM private key: {exc}") from None
        if not isinstance(key, ec.EllipticCurvePrivateKey) or not isinstance(key.curve, ec.SECP256R1):
            raise CertificateError("private key is not an ECDSA P-256 key")
        return key

    def check(self) -> None:
        """Raise :class:`CertificateError` unless both halves parse and the key belongs to the certificate."""
        cert_key = self.certificate.public_key()
        if cert_key != self.private_key.public_key():
            raise CertificateError("private key does not match the certificate's public key")


def new_ca(common_name: str, *, now: float, days: int = 3650, organization: str | None = None) -> KeyPair:
    """A fresh self-signed CA that may sign certificates (and CRLs), valid for ``days`` from ``now``."""
    key = ec.generate_private_key(ec.SECP256R1())
    name = _name(common_name, [organization] if organization else [])
    not_before = _at(now) - CLOCK_SKEW
    builder = (
        x509.CertificateBuilder()
        .subject_name(name)
        .issuer_name(name)
        .public_key(key.public_key())
        .serial_number(x509.random_serial_number())
        .not_valid_before(not_before)
        .not_valid_after(_at(now) + datetime.timedelta(days=days))
        .add_extension(x509.BasicConstraints(ca=True, path_length=None), critical=True)
        .add_extension(
            _key_usage(digital_signature=True, key_cert_sign=True, crl_sign=True),
            critical=True,
        )
        .add_extension(x509.SubjectKeyIdentifier.from_public_key(key.public_key()), critical=False)
    )
    return _pair(builder.sign(key, hashes.SHA256()), key)


def issue_server_cert(
    ca: KeyPair,
    *,
    common_name: str,
    dns_names: Sequence[str],
    ip_addresses: Sequence[str],
    now: float,
    days: int = 365,
) -> KeyPair:
    """A serverAuth certificate for the given DNS names and IP addresses (at least one is required)."""
    if not dns_names and not ip_addresses:
        raise ValueError("a server certificate needs at least one DNS name or IP address")
    sans: list[x509.GeneralName] = [x509.DNSName(dns) for dns in dns_names]
    for text in ip_addresses:
        try:
            sans.append(x509.IPAddress(ipaddress.ip_address(text)))
        except ValueError:
            raise ValueError(f"not an IP address: {text!r}") from None
    return _issue(
        ca,
        subject=_name(common_name, []),
        usage=ExtendedKeyUsageOID.SERVER_AUTH,
        sans=sans,
        now=now,
        days=days,
    )


def issue_client_cert(
    ca: KeyPair,
    *,
    common_name: str,
    organizations: Sequence[str] = (),
    now: float,
    days: int = 365,
) -> KeyPair:
    """A clientAuth certificate; Kubernetes reads ``common_name`` as the user and ``organizations`` as groups."""
    return _issue(
        ca,
        subject=_name(common_name, organizations),
        usage=ExtendedKeyUsageOID.CLIENT_AUTH,
        sans=[],
        now=now,
        days=days,
    )


def load_or_create_ca(directory: Path, name: str, common_name: str, now: float) -> KeyPair:
    """The CA stored as ``<directory>/<name>.crt`` and ``<name>.key``, created (key mode 0600) if neither exists.

    Exactly one of the two files existing is an error rather than a reason to start over: replacing a CA
    that clients already trust would silently break them.
    """
    cert_path = directory / f"{name}.crt"
    key_path = directory / f"{name}.key"
    cert_exists, key_exists = cert_path.exists(), key_path.exists()
    if cert_exists and key_exists:
        return _read_ca(cert_path, key_path)
    if cert_exists or key_exists:
        present, missing = (cert_path, key_path) if cert_exists else (key_path, cert_path)
        raise CertificateError(f"{present} exists but {missing} does not; restore it or remove both")
    ca = new_ca(common_name, now=now)
    directory.mkdir(mode=0o700, parents=True, exist_ok=True)
    # The key goes first: a crash in between leaves a lone key, which the check above reports.
    _write_atomically(key_path, ca.key_pem, mode=0o600)
    _write_atomically(cert_path, ca.cert_pem, mode=0o644)
    return ca


def _read_ca(cert_path: Path, key_path: Path) -> KeyPair:
    try:
        cert_pem, key_pem = cert_path.read_bytes(), key_path.read_bytes()
    except OSError as exc:
        raise CertificateError(f"cannot read CA: {exc}") from None
    pair = KeyPair(cert_pem=cert_pem, key_pem=key_pem)
    try:
        cert = pair.certificate
    except CertificateError as exc:
        raise CertificateError(f"{cert_path}: {exc}") from None
    try:
        key = pair.private_key
    except CertificateError as exc:
        raise CertificateError(f"{key_path}: {exc}") from None
    if cert.public_key() != key.public_key():
        raise CertificateError(f"{key_path} is not the private key of the certificate in {cert_path}")
    try:
        is_ca = cert.extensions.get_extension_for_class(x509.BasicConstraints).value.ca
    except x509.ExtensionNotFound:
        is_ca = False
    if not is_ca:
        raise CertificateError(f"{cert_path}: certificate is not a CA (BasicConstraints ca=True is missing)")
    return pair


def _write_atomically(path: Path, data: bytes, *, mode: int) -> None:
    tmp = path.with_name(f".{path.name}.tmp")
    fd = os.open(tmp, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, mode)
    try:
        os.fchmod(fd, mode)  # O_CREAT's mode is filtered by the umask and ignored for an existing file
        os.write(fd, data)
        os.fsync(fd)
    finally:
        os.close(fd)
    tmp.replace(path)


def _issue(
    ca: KeyPair,
    *,
    subject: x509.Name,
    usage: x509.ObjectIdentifier,
    sans: list[x509.GeneralName],
    now: float,
    days: int,
) -> KeyPair:
    ca_cert, ca_key = ca.certificate, ca.private_key
    if ca_cert.public_key() != ca_key.public_key():
        raise CertificateError("the CA's private key does not match its certificate")
    key = ec.generate_private_key(ec.SECP256R1())
    not_after = min(_at(now) + datetime.timedelta(days=days), ca_cert.not_valid_after_utc)
    builder = (
        x509.CertificateBuilder()
        .subject_name(subject)
        .issuer_name(ca_cert.subject)
        .public_key(key.public_key())
        .serial_number(x509.random_serial_number())
        .not_valid_before(_at(now) - CLOCK_SKEW)
        .not_valid_after(not_after)
        .add_extension(x509.BasicConstraints(ca=False, path_length=None), critical=True)
        .add_extension(_key_usage(digital_signature=True), critical=True)
        .add_extension(x509.ExtendedKeyUsage([usage]), critical=False)
        .add_extension(x509.SubjectKeyIdentifier.from_public_key(key.public_key()), critical=False)
        .add_extension(_authority_key_id(ca_cert, ca_key.public_key()), critical=False)
    )
    if sans:
        builder = builder.add_extension(x509.SubjectAlternativeName(sans), critical=False)
    return _pair(builder.sign(ca_key, hashes.SHA256()), key)


def _authority_key_id(
    ca_cert: x509.Certificate, ca_public_key: ec.EllipticCurvePublicKey
) -> x509.AuthorityKeyIdentifier:
    try:
        ski = ca_cert.extensions.get_extension_for_class(x509.SubjectKeyIdentifier).value
    except x509.ExtensionNotFound:
        # A CA made by another tool may lack one; derive the identifier the same way it would have been.
        return x509.AuthorityKeyIdentifier.from_issuer_public_key(ca_public_key)
    return x509.AuthorityKeyIdentifier.from_issuer_subject_key_identifier(ski)


def _key_usage(
    *, digital_signature: bool = False, key_cert_sign: bool = False, crl_sign: bool = False
) -> x509.KeyUsage:
    return x509.KeyUsage(
        digital_signature=digital_signature,
        content_commitment=False,
        key_encipherment=False,
        data_encipherment=False,
        key_agreement=False,
        key_cert_sign=key_cert_sign,
        crl_sign=crl_sign,
        encipher_only=False,
        decipher_only=False,
    )


def _name(common_name: str, organizations: Sequence[str]) -> x509.Name:
    attributes = [x509.NameAttribute(NameOID.ORGANIZATION_NAME, org) for org in organizations]
    attributes.append(x509.NameAttribute(NameOID.COMMON_NAME, common_name))
    return x509.Name(attributes)


def _at(now: float) -> datetime.datetime:
    # X.509 times have whole seconds; truncating here keeps notBefore/notAfter predictable.
    return datetime.datetime.fromtimestamp(int(now), tz=datetime.UTC)


def _pair(cert: x509.Certificate, key: ec.EllipticCurvePrivateKey) -> KeyPair:
    return KeyPair(
        cert_pem=cert.public_bytes(serialization.Encoding.PEM),
        key_pem=key.private_bytes(
            serialization.Encoding.PEM,
            serialization.PrivateFormat.PKCS8,
            serialization.NoEncryption(),
        ),
    )
