"""Certificates for the ingress gateway's mutual-TLS tests: client certificates with the names a test wants (DNS,
URI, e-mail), issued by a given CA or self-signed, and Secrets holding them as Istio's documentation creates them.
"""

from __future__ import annotations

import base64
import datetime
import hashlib
from typing import Any

from cryptography import x509
from cryptography.hazmat.primitives import hashes, serialization
from cryptography.hazmat.primitives.asymmetric import ec, rsa
from cryptography.x509.oid import ExtendedKeyUsageOID, NameOID

from ambit.tls.certs import KeyPair

__all__ = [
    "cert_sha256_hex",
    "client_cert",
    "opaque_secret",
    "rsa_server_cert",
    "self_signed_client",
    "spki_sha256_b64",
]


def _names(dns: tuple[str, ...], uris: tuple[str, ...], emails: tuple[str, ...]) -> list[x509.GeneralName]:
    out: list[x509.GeneralName] = [x509.DNSName(d) for d in dns]
    out += [x509.UniformResourceIdentifier(u) for u in uris]
    out += [x509.RFC822Name(e) for e in emails]
    return out


def _build(
    subject: str,
    issuer: x509.Name,
    signer: ec.EllipticCurvePrivateKey,
    key: ec.EllipticCurvePrivateKey,
    sans: list[x509.GeneralName],
) -> x509.Certificate:
    now = datetime.datetime.now(datetime.UTC)
    builder = (
        x509.CertificateBuilder()
        .subject_name(x509.Name([x509.NameAttribute(NameOID.COMMON_NAME, subject)]))
        .issuer_name(issuer)
        .public_key(key.public_key())
        .serial_number(x509.random_serial_number())
        .not_valid_before(now - datetime.timedelta(minutes=5))
        .not_valid_after(now + datetime.timedelta(days=1))
        .add_extension(x509.BasicConstraints(ca=False, path_length=None), critical=True)
        .add_extension(x509.ExtendedKeyUsage([ExtendedKeyUsageOID.CLIENT_AUTH]), critical=False)
    )
    if sans:
        builder = builder.add_extension(x509.SubjectAlternativeName(sans), critical=False)
    return builder.sign(signer, hashes.SHA256())


def _pair(cert: x509.Certificate, key: ec.EllipticCurvePrivateKey) -> KeyPair:
    return KeyPair(
        cert.public_bytes(serialization.Encoding.PEM),
        key.private_bytes(serialization.Encoding.PEM, serialization.PrivateFormat.PKCS8, serialization.NoEncryption()),
    )


def client_cert(
    ca: KeyPair,
    subject: str = "client",
    *,
    dns: tuple[str, ...] = (),
    uris: tuple[str, ...] = (),
    emails: tuple[str, ...] = (),
) -> KeyPair:
    """A clientAuth certificate issued by ``ca`` with the given subjectAltNames."""
    ca_cert = x509.load_pem_x509_certificate(ca.cert_pem)
    ca_key = serialization.load_pem_private_key(ca.key_pem, password=None)
    assert isinstance(ca_key, ec.EllipticCurvePrivateKey)
    key = ec.generate_private_key(ec.SECP256R1())
    return _pair(_build(subject, ca_cert.subject, ca_key, key, _names(dns, uris, emails)), key)


def rsa_server_cert(ca: KeyPair, *dns: str) -> KeyPair:
    """A serverAuth certificate with an RSA 2048 key (the mesh's own are ECDSA), issued by ``ca`` for ``dns``: a
    listener's second certificate of another key type."""
    ca_cert = x509.load_pem_x509_certificate(ca.cert_pem)
    ca_key = serialization.load_pem_private_key(ca.key_pem, password=None)
    assert isinstance(ca_key, ec.EllipticCurvePrivateKey)
    key = rsa.generate_private_key(public_exponent=65537, key_size=2048)
    now = datetime.datetime.now(datetime.UTC)
    cert = (
        x509.CertificateBuilder()
        .subject_name(x509.Name([x509.NameAttribute(NameOID.COMMON_NAME, dns[0])]))
        .issuer_name(ca_cert.subject)
        .public_key(key.public_key())
        .serial_number(x509.random_serial_number())
        .not_valid_before(now - datetime.timedelta(minutes=5))
        .not_valid_after(now + datetime.timedelta(days=1))
        .add_extension(x509.BasicConstraints(ca=False, path_length=None), critical=True)
        .add_extension(x509.ExtendedKeyUsage([ExtendedKeyUsageOID.SERVER_AUTH]), critical=False)
        .add_extension(x509.SubjectAlternativeName([x509.DNSName(d) for d in dns]), critical=False)
        .sign(ca_key, hashes.SHA256())
    )
    return KeyPair(
        cert.public_bytes(serialization.Encoding.PEM),
        key.private_bytes(serialization.Encoding.PEM, serialization.PrivateFormat.PKCS8, serialization.NoEncryption()),
    )


def self_signed_client(subject: str = "client", *, dns: tuple[str, ...] = (), uris: tuple[str, ...] = ()) -> KeyPair:
    """A certificate that signs itself, carrying whatever names a forger likes."""
    key = ec.generate_private_key(ec.SECP256R1())
    name = x509.Name([x509.NameAttribute(NameOID.COMMON_NAME, subject)])
    return _pair(_build(subject, name, key, key, _names(dns, uris, ())), key)


def spki_sha256_b64(pair: KeyPair) -> str:
    cert = x509.load_pem_x509_certificate(pair.cert_pem)
    spki = cert.public_key().public_bytes(serialization.Encoding.DER, serialization.PublicFormat.SubjectPublicKeyInfo)
    return base64.b64encode(hashlib.sha256(spki).digest()).decode()


def cert_sha256_hex(pair: KeyPair, *, colons: bool = False) -> str:
    der = x509.load_pem_x509_certificate(pair.cert_pem).public_bytes(serialization.Encoding.DER)
    digest = hashlib.sha256(der).hexdigest().upper()
    return ":".join(digest[i : i + 2] for i in range(0, 64, 2)) if colons else digest


def opaque_secret(name: str, namespace: str, secret_type: str = "Opaque", **data: bytes) -> dict[str, Any]:
    """A Secret with ``data`` (keys with ``.`` written as ``_``: ``tls_crt`` is ``tls.crt``), base64-encoded."""
    return {
        "metadata": {"name": name, "namespace": namespace},
        "type": secret_type,
        "data": {key.replace("_", "."): base64.b64encode(value).decode() for key, value in data.items()},
    }
