"""A small PKI for the revocation tests: a root, plug-in intermediates, SPIFFE leaves, and CRLs signed by anyone."""

from __future__ import annotations

import datetime
from collections.abc import Iterable

from cryptography import x509
from cryptography.hazmat.primitives import hashes, serialization
from cryptography.hazmat.primitives.asymmetric import ec

from ambit.model.identity import SpiffeId
from ambit.tls.certs import KeyPair, new_ca
from ambit.tls.issuance import sign_csr
from ambit.tls.spiffe import make_csr
from ambit.tls.workload import WorkloadCertificate

NOW = 1_800_000_000.0


def root(name: str = "Test root", now: float = NOW) -> KeyPair:
    return new_ca(name, now=now, days=365, organization="cluster.local")


def intermediate(parent: KeyPair, name: str = "Plug-in intermediate", now: float = NOW) -> KeyPair:
    """A CA certificate signed by ``parent``; ``cert_pem`` holds it followed by ``parent``'s chain (root last)."""
    key = ec.generate_private_key(ec.SECP256R1())
    start = datetime.datetime.fromtimestamp(now, tz=datetime.UTC) - datetime.timedelta(hours=1)
    cert = (
        x509.CertificateBuilder()
        .subject_name(x509.Name([x509.NameAttribute(x509.NameOID.COMMON_NAME, name)]))
        .issuer_name(parent.certificate.subject)
        .public_key(key.public_key())
        .serial_number(x509.random_serial_number())
        .not_valid_before(start)
        .not_valid_after(start + datetime.timedelta(days=30))
        .add_extension(x509.BasicConstraints(ca=True, path_length=None), critical=True)
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
        .sign(parent.private_key, hashes.SHA256())
    )
    key_pem = key.private_bytes(
        serialization.Encoding.PEM, serialization.PrivateFormat.PKCS8, serialization.NoEncryption()
    )
    return KeyPair(cert_pem=cert.public_bytes(serialization.Encoding.PEM) + parent.cert_pem, key_pem=key_pem)


def workload(ca: KeyPair, identity: SpiffeId, now: float = NOW, ttl: int = 86400) -> WorkloadCertificate:
    csr, key_pem = make_csr(identity)
    return WorkloadCertificate.from_chain(identity, sign_csr(ca, csr, now=now, ttl_seconds=ttl), key_pem)


def serial_of(pem: bytes) -> int:
    return x509.load_pem_x509_certificate(pem).serial_number


def crl(
    issuer: KeyPair,
    serials: Iterable[int] = (),
    *,
    signer: KeyPair | None = None,
    now: float = NOW,
    next_update_days: float = 7,
) -> bytes:
    """A PEM CRL naming ``issuer`` and listing ``serials``, signed by ``signer`` (default: the issuer itself)."""
    at = datetime.datetime.fromtimestamp(now, tz=datetime.UTC)
    builder = (
        x509.CertificateRevocationListBuilder()
        .issuer_name(issuer.certificate.subject)
        .last_update(at - datetime.timedelta(minutes=5))
        .next_update(at + datetime.timedelta(days=next_update_days))
    )
    for serial in serials:
        builder = builder.add_revoked_certificate(
            x509.RevokedCertificateBuilder().serial_number(serial).revocation_date(at).build()
        )
    return builder.sign((signer or issuer).private_key, hashes.SHA256()).public_bytes(serialization.Encoding.PEM)


def der_chain(cert: WorkloadCertificate) -> list[bytes]:
    """The chain a peer verified: leaf, intermediates, root, as DER."""
    return [x509.load_pem_x509_certificate(pem).public_bytes(serialization.Encoding.DER) for pem in cert.chain_pem]
