from __future__ import annotations

import datetime
import ipaddress
import ssl
import stat
import time
from pathlib import Path
from typing import TypeVar

import pytest
from cryptography import x509
from cryptography.hazmat.primitives import serialization
from cryptography.hazmat.primitives.asymmetric import ec
from cryptography.x509 import DNSName, IPAddress
from cryptography.x509.oid import ExtendedKeyUsageOID, NameOID
from cryptography.x509.verification import PolicyBuilder, Store, VerificationError

from ambit.errors import AmbitError
from ambit.tls.certs import (
    CertificateError,
    KeyPair,
    issue_client_cert,
    issue_server_cert,
    load_or_create_ca,
    new_ca,
)

NOW = 1_700_000_000.0
E = TypeVar("E", bound=x509.ExtensionType)


def _at(seconds: float) -> datetime.datetime:
    return datetime.datetime.fromtimestamp(seconds, tz=datetime.UTC)


def _ext(cert: x509.Certificate, kind: type[E]) -> x509.Extension[E]:
    return cert.extensions.get_extension_for_class(kind)


@pytest.fixture(scope="module")
def ca() -> KeyPair:
    return new_ca("ambit-ca", now=NOW, organization="ambit")


@pytest.fixture(scope="module")
def server(ca: KeyPair) -> KeyPair:
    return issue_server_cert(
        ca,
        common_name="kube-apiserver",
        dns_names=["kubernetes.default.svc", "localhost"],
        ip_addresses=["127.0.0.1", "::1"],
        now=NOW,
    )


def _verifier(ca: KeyPair, at: float = NOW + 60) -> PolicyBuilder:
    return PolicyBuilder().store(Store([ca.certificate])).time(_at(at))


def test_new_ca_is_a_self_signed_p256_ca(ca: KeyPair) -> None:
    cert = ca.certificate
    cert.verify_directly_issued_by(cert)
    assert isinstance(ca.private_key.curve, ec.SECP256R1)
    assert cert.subject.get_attributes_for_oid(NameOID.COMMON_NAME)[0].value == "ambit-ca"
    assert cert.subject.get_attributes_for_oid(NameOID.ORGANIZATION_NAME)[0].value == "ambit"
    constraints = _ext(cert, x509.BasicConstraints)
    assert constraints.critical and constraints.value.ca
    usage = _ext(cert, x509.KeyUsage).value
    assert usage.key_cert_sign and usage.crl_sign and usage.digital_signature
    ski = _ext(cert, x509.SubjectKeyIdentifier).value
    assert ski == x509.SubjectKeyIdentifier.from_public_key(ca.private_key.public_key())
    assert cert.not_valid_after_utc == _at(NOW) + datetime.timedelta(days=3650)
    ca.check()


def test_server_cert_chain_verifies_for_every_name_and_address(ca: KeyPair, server: KeyPair) -> None:
    for subject in (
        DNSName("kubernetes.default.svc"),
        DNSName("localhost"),
        IPAddress(ipaddress.ip_address("127.0.0.1")),
        IPAddress(ipaddress.ip_address("::1")),
    ):
        chain = _verifier(ca).build_server_verifier(subject).verify(server.certificate, [])
        assert chain[-1] == ca.certificate


def test_server_cert_does_not_verify_for_other_names_or_other_cas(ca: KeyPair, server: KeyPair) -> None:
    with pytest.raises(VerificationError):
        _verifier(ca).build_server_verifier(DNSName("example.com")).verify(server.certificate, [])
    other = new_ca("other-ca", now=NOW)
    with pytest.raises(VerificationError):
        _verifier(other).build_server_verifier(DNSName("localhost")).verify(server.certificate, [])


def test_server_cert_carries_sans_eku_and_authority_key_id(ca: KeyPair, server: KeyPair) -> None:
    cert = server.certificate
    sans = _ext(cert, x509.SubjectAlternativeName).value
    assert sans.get_values_for_type(x509.DNSName) == ["kubernetes.default.svc", "localhost"]
    assert sans.get_values_for_type(x509.IPAddress) == [
        ipaddress.ip_address("127.0.0.1"),
        ipaddress.ip_address("::1"),
    ]
    assert list(_ext(cert, x509.ExtendedKeyUsage).value) == [ExtendedKeyUsageOID.SERVER_AUTH]
    assert not _ext(cert, x509.BasicConstraints).value.ca
    aki = _ext(cert, x509.AuthorityKeyIdentifier).value
    assert aki.key_identifier == _ext(ca.certificate, x509.SubjectKeyIdentifier).value.digest
    assert cert.issuer == ca.certificate.subject
    server.check()


def test_server_cert_is_backdated_five_minutes_for_clock_skew(server: KeyPair) -> None:
    cert = server.certificate
    assert cert.not_valid_before_utc == _at(NOW) - datetime.timedelta(minutes=5)
    assert cert.not_valid_after_utc == _at(NOW) + datetime.timedelta(days=365)


def test_leaf_never_outlives_its_ca() -> None:
    short_ca = new_ca("short", now=NOW, days=30)
    leaf = issue_server_cert(short_ca, common_name="x", dns_names=["x"], ip_addresses=[], now=NOW, days=365)
    assert leaf.certificate.not_valid_after_utc == short_ca.certificate.not_valid_after_utc


def test_server_cert_without_names_or_with_bad_address_is_refused(ca: KeyPair) -> None:
    with pytest.raises(ValueError, match="at least one"):
        issue_server_cert(ca, common_name="x", dns_names=[], ip_addresses=[], now=NOW)
    with pytest.raises(ValueError, match="not an IP address"):
        issue_server_cert(ca, common_name="x", dns_names=[], ip_addresses=["10.0.0.300"], now=NOW)


def test_client_cert_names_user_and_groups_like_kubernetes(ca: KeyPair) -> None:
    client = issue_client_cert(ca, common_name="admin", organizations=["system:masters", "ops"], now=NOW)
    cert = client.certificate
    cert.verify_directly_issued_by(ca.certificate)
    assert cert.subject.get_attributes_for_oid(NameOID.COMMON_NAME)[0].value == "admin"
    assert [a.value for a in cert.subject.get_attributes_for_oid(NameOID.ORGANIZATION_NAME)] == [
        "system:masters",
        "ops",
    ]
    assert list(_ext(cert, x509.ExtendedKeyUsage).value) == [ExtendedKeyUsageOID.CLIENT_AUTH]


def _handshake(server_ctx: ssl.SSLContext, client_ctx: ssl.SSLContext, hostname: str) -> ssl.SSLObject:
    """Run a TLS handshake between two in-memory endpoints; return the server side."""
    c_in, c_out, s_in, s_out = ssl.MemoryBIO(), ssl.MemoryBIO(), ssl.MemoryBIO(), ssl.MemoryBIO()
    client = client_ctx.wrap_bio(c_in, c_out, server_hostname=hostname)
    server = server_ctx.wrap_bio(s_in, s_out, server_side=True)
    done = {"client": False, "server": False}
    for _ in range(10):
        for side, obj in (("client", client), ("server", server)):
            if not done[side]:
                try:
                    obj.do_handshake()
                    done[side] = True
                except ssl.SSLWantReadError:
                    pass
        s_in.write(c_out.read())
        c_in.write(s_out.read())
        if all(done.values()):
            # TLS 1.3 checks the client's certificate after the client thinks it is done: push one record.
            client.write(b"ping")
            s_in.write(c_out.read())
            assert server.read(4) == b"ping"
            return server
    raise AssertionError("handshake did not finish")


def _files(tmp_path: Path, name: str, pair: KeyPair) -> tuple[str, str]:
    cert, key = tmp_path / f"{name}.crt", tmp_path / f"{name}.key"
    cert.write_bytes(pair.cert_pem)
    key.write_bytes(pair.key_pem)
    return str(cert), str(key)


def _contexts(tmp_path: Path, ca: KeyPair, client: KeyPair, now: float) -> tuple[ssl.SSLContext, ssl.SSLContext]:
    server = issue_server_cert(
        ca, common_name="apiserver", dns_names=["localhost"], ip_addresses=["127.0.0.1"], now=now
    )
    server_ctx = ssl.SSLContext(ssl.PROTOCOL_TLS_SERVER)
    server_ctx.load_cert_chain(*_files(tmp_path, "server", server))
    server_ctx.verify_mode = ssl.CERT_REQUIRED
    server_ctx.load_verify_locations(cadata=ca.cert_pem.decode())
    client_ctx = ssl.SSLContext(ssl.PROTOCOL_TLS_CLIENT)
    client_ctx.load_verify_locations(cadata=ca.cert_pem.decode())
    client_ctx.load_cert_chain(*_files(tmp_path, "client", client))
    return server_ctx, client_ctx


@pytest.mark.parametrize("hostname", ["localhost", "127.0.0.1"])
def test_openssl_accepts_mutual_tls_between_issued_certs(tmp_path: Path, hostname: str) -> None:
    # OpenSSL checks validity against the real clock, so these certificates start now.
    now = time.time()
    ca = new_ca("ambit-ca", now=now)
    client = issue_client_cert(ca, common_name="admin", organizations=["system:masters"], now=now)
    server_ctx, client_ctx = _contexts(tmp_path, ca, client, now)
    peer = _handshake(server_ctx, client_ctx, hostname).getpeercert()
    assert peer is not None
    assert peer["subject"] == ((("organizationName", "system:masters"),), (("commonName", "admin"),))


def test_openssl_refuses_a_client_cert_from_another_ca(tmp_path: Path) -> None:
    now = time.time()
    ca = new_ca("ambit-ca", now=now)
    stranger = issue_client_cert(new_ca("other", now=now), common_name="mallory", now=now)
    server_ctx, client_ctx = _contexts(tmp_path, ca, stranger, now)
    with pytest.raises(ssl.SSLCertVerificationError):
        _handshake(server_ctx, client_ctx, "localhost")


def test_load_or_create_ca_creates_private_files_then_reads_them_back(tmp_path: Path) -> None:
    directory = tmp_path / "pki"
    first = load_or_create_ca(directory, "ca", "ambit-ca", NOW)
    assert stat.S_IMODE((directory / "ca.key").stat().st_mode) == 0o600
    assert (directory / "ca.crt").read_bytes() == first.cert_pem
    second = load_or_create_ca(directory, "ca", "ignored-when-present", NOW + 1000)
    assert second == first
    assert sorted(p.name for p in directory.iterdir()) == ["ca.crt", "ca.key"]


@pytest.mark.parametrize("broken", ["ca.crt", "ca.key"])
def test_load_or_create_ca_names_the_corrupted_file(tmp_path: Path, broken: str) -> None:
    load_or_create_ca(tmp_path, "ca", "ambit-ca", NOW)
    (tmp_path / broken).write_bytes(b"-----BEGIN GARBAGE-----\nnot base64\n")
    with pytest.raises(CertificateError, match=str(tmp_path / broken)) as caught:
        load_or_create_ca(tmp_path, "ca", "ambit-ca", NOW)
    assert isinstance(caught.value, AmbitError)
    assert "\n" not in str(caught.value)


def test_load_or_create_ca_refuses_a_key_that_is_not_the_certificates(tmp_path: Path) -> None:
    load_or_create_ca(tmp_path, "ca", "ambit-ca", NOW)
    (tmp_path / "ca.key").write_bytes(new_ca("other", now=NOW).key_pem)
    with pytest.raises(CertificateError, match="is not the private key"):
        load_or_create_ca(tmp_path, "ca", "ambit-ca", NOW)


def test_load_or_create_ca_refuses_a_leaf_certificate(tmp_path: Path) -> None:
    ca = new_ca("ambit-ca", now=NOW)
    leaf = issue_client_cert(ca, common_name="admin", now=NOW)
    (tmp_path / "ca.crt").write_bytes(leaf.cert_pem)
    (tmp_path / "ca.key").write_bytes(leaf.key_pem)
    with pytest.raises(CertificateError, match="not a CA"):
        load_or_create_ca(tmp_path, "ca", "ambit-ca", NOW)


def test_load_or_create_ca_refuses_to_replace_half_a_ca(tmp_path: Path) -> None:
    load_or_create_ca(tmp_path, "ca", "ambit-ca", NOW)
    (tmp_path / "ca.key").unlink()
    with pytest.raises(CertificateError, match=r"ca\.key does not"):
        load_or_create_ca(tmp_path, "ca", "ambit-ca", NOW)


def test_keypair_refuses_a_key_that_is_not_p256() -> None:
    key = ec.generate_private_key(ec.SECP384R1())
    pem = key.private_bytes(serialization.Encoding.PEM, serialization.PrivateFormat.PKCS8, serialization.NoEncryption())
    with pytest.raises(CertificateError, match="P-256"):
        _ = KeyPair(cert_pem=b"", key_pem=pem).private_key
