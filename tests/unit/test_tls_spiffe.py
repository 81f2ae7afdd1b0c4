from __future__ import annotations

import datetime

import pytest
from cryptography import x509
from cryptography.hazmat.primitives import hashes, serialization
from cryptography.hazmat.primitives.asymmetric import ec, rsa
from cryptography.x509.oid import ExtendedKeyUsageOID
from hypothesis import given, settings
from hypothesis import strategies as st

from ambit.model.identity import SpiffeId
from ambit.tls.certs import CertificateError, KeyPair, issue_client_cert, new_ca
from ambit.tls.issuance import sign_csr
from ambit.tls.spiffe import PeerIdentityError, check_peer, identity_of, make_csr

NOW = 1_700_000_000.0
TTL = 3600
ALICE = SpiffeId("cluster.local", "shop", "alice")
BOB = SpiffeId("cluster.local", "shop", "bob")
STRANGER = SpiffeId("other.local", "shop", "alice")


@pytest.fixture(scope="module")
def ca() -> KeyPair:
    return new_ca("test mesh root", now=NOW)


def _der(pem: bytes) -> bytes:
    return x509.load_pem_x509_certificate(pem).public_bytes(serialization.Encoding.DER)


def _leaf_der(ca: KeyPair, identity: SpiffeId) -> bytes:
    csr, _ = make_csr(identity)
    return _der(sign_csr(ca, csr, now=NOW, ttl_seconds=TTL)[0])


def _csr(names: list[x509.GeneralName] | None, key: ec.EllipticCurvePrivateKey | None = None) -> bytes:
    key = key or ec.generate_private_key(ec.SECP256R1())
    builder = x509.CertificateSigningRequestBuilder().subject_name(x509.Name([]))
    if names is not None:
        builder = builder.add_extension(x509.SubjectAlternativeName(names), critical=True)
    return builder.sign(key, hashes.SHA256()).public_bytes(serialization.Encoding.PEM)


def _cert_with_sans(ca: KeyPair, names: list[x509.GeneralName]) -> bytes:
    key = ec.generate_private_key(ec.SECP256R1())
    at = datetime.datetime.fromtimestamp(NOW, tz=datetime.UTC)
    cert = (
        x509.CertificateBuilder()
        .subject_name(x509.Name([]))
        .issuer_name(ca.certificate.subject)
        .public_key(key.public_key())
        .serial_number(x509.random_serial_number())
        .not_valid_before(at)
        .not_valid_after(at + datetime.timedelta(hours=1))
        .add_extension(x509.SubjectAlternativeName(names), critical=True)
        .sign(ca.private_key, hashes.SHA256())
    )
    return cert.public_bytes(serialization.Encoding.DER)


def test_csr_has_an_empty_subject_one_spiffe_uri_and_a_fresh_p256_key() -> None:
    csr_pem, key_pem = make_csr(ALICE)
    csr = x509.load_pem_x509_csr(csr_pem)
    assert csr.is_signature_valid
    assert csr.subject == x509.Name([])
    assert isinstance(csr.signature_hash_algorithm, hashes.SHA256)
    san = csr.extensions.get_extension_for_class(x509.SubjectAlternativeName).value
    assert list(san) == [x509.UniformResourceIdentifier(str(ALICE))]
    key = serialization.load_pem_private_key(key_pem, password=None)
    assert isinstance(key, ec.EllipticCurvePrivateKey) and isinstance(key.curve, ec.SECP256R1)
    assert key.public_key() == csr.public_key()
    assert make_csr(ALICE)[1] != key_pem


def test_signed_chain_is_leaf_then_root_and_the_leaf_is_a_spiffe_workload_cert(ca: KeyPair) -> None:
    csr_pem, key_pem = make_csr(ALICE)
    chain = sign_csr(ca, csr_pem, now=NOW, ttl_seconds=TTL, identity=ALICE)
    assert len(chain) == 2 and chain[-1] == ca.cert_pem
    leaf = x509.load_pem_x509_certificate(chain[0])
    leaf.verify_directly_issued_by(ca.certificate)
    KeyPair(cert_pem=chain[0], key_pem=key_pem).check()
    assert leaf.subject == x509.Name([])
    san = leaf.extensions.get_extension_for_class(x509.SubjectAlternativeName)
    assert san.critical and list(san.value) == [x509.UniformResourceIdentifier(str(ALICE))]
    assert leaf.extensions.get_extension_for_class(x509.BasicConstraints).value.ca is False
    usage = leaf.extensions.get_extension_for_class(x509.KeyUsage).value
    assert usage.digital_signature and usage.key_encipherment and not usage.key_cert_sign
    eku = leaf.extensions.get_extension_for_class(x509.ExtendedKeyUsage).value
    assert set(eku) == {ExtendedKeyUsageOID.SERVER_AUTH, ExtendedKeyUsageOID.CLIENT_AUTH}
    aki = leaf.extensions.get_extension_for_class(x509.AuthorityKeyIdentifier).value
    ski = ca.certificate.extensions.get_extension_for_class(x509.SubjectKeyIdentifier).value
    assert aki.key_identifier == ski.digest
    leaf.extensions.get_extension_for_class(x509.SubjectKeyIdentifier)
    assert leaf.not_valid_before_utc.timestamp() == NOW - 300
    assert leaf.not_valid_after_utc.timestamp() == NOW + TTL
    assert identity_of(_der(chain[0])) == ALICE


def test_ttl_is_clamped_to_the_ca_validity() -> None:
    short_ca = new_ca("short-lived root", now=NOW, days=1)
    chain = sign_csr(short_ca, make_csr(ALICE)[0], now=NOW + 3600, ttl_seconds=10 * 86400)
    leaf = x509.load_pem_x509_certificate(chain[0])
    assert leaf.not_valid_after_utc == short_ca.certificate.not_valid_after_utc
    # Right after the CA was made, the back-dated start is clamped to the CA's start as well.
    young = sign_csr(short_ca, make_csr(ALICE)[0], now=NOW, ttl_seconds=60)
    assert x509.load_pem_x509_certificate(young[0]).not_valid_before_utc == short_ca.certificate.not_valid_before_utc


def test_an_expired_ca_cannot_sign() -> None:
    old_ca = new_ca("old root", now=NOW, days=1)
    with pytest.raises(CertificateError, match="not valid"):
        sign_csr(old_ca, make_csr(ALICE)[0], now=NOW + 3 * 86400, ttl_seconds=60)


@pytest.mark.parametrize(
    ("names", "message"),
    [
        (None, "no subject alternative name"),
        (
            [x509.UniformResourceIdentifier(str(ALICE)), x509.UniformResourceIdentifier(str(BOB))],
            "exactly one",
        ),
        ([x509.DNSName("alice.shop.svc")], "exactly one"),
        ([x509.UniformResourceIdentifier(str(ALICE)), x509.DNSName("alice.shop.svc")], "exactly one"),
        ([x509.UniformResourceIdentifier("https://example.com/alice")], "not a SPIFFE id"),
        ([x509.UniformResourceIdentifier("spiffe://cluster.local/alice")], "malformed SPIFFE id"),
    ],
    ids=["no-san", "two-uris", "dns", "uri-and-dns", "https-uri", "bad-spiffe-path"],
)
def test_sign_rejects_csrs_that_do_not_name_exactly_one_spiffe_id(
    ca: KeyPair, names: list[x509.GeneralName] | None, message: str
) -> None:
    with pytest.raises(CertificateError, match=message):
        sign_csr(ca, _csr(names), now=NOW, ttl_seconds=TTL)


def test_sign_rejects_a_csr_whose_signature_does_not_verify(ca: KeyPair) -> None:
    csr = x509.load_pem_x509_csr(make_csr(SpiffeId("cluster.local", "shop", "bobby"))[0])
    der = csr.public_bytes(serialization.Encoding.DER)
    tampered = der.replace(b"sa/bobby", b"sa/bobbz")  # same length: still parses, no longer signed
    assert tampered != der
    pem = x509.load_der_x509_csr(tampered).public_bytes(serialization.Encoding.PEM)
    with pytest.raises(CertificateError, match="signature"):
        sign_csr(ca, pem, now=NOW, ttl_seconds=TTL)


def test_sign_rejects_a_csr_for_another_identity_than_the_caller_may_get(ca: KeyPair) -> None:
    with pytest.raises(CertificateError, match="may only get"):
        sign_csr(ca, make_csr(BOB)[0], now=NOW, ttl_seconds=TTL, identity=ALICE)


def test_sign_rejects_non_p256_keys_garbage_and_a_non_positive_ttl(ca: KeyPair) -> None:
    rsa_key = rsa.generate_private_key(public_exponent=65537, key_size=2048)
    rsa_csr = (
        x509.CertificateSigningRequestBuilder()
        .subject_name(x509.Name([]))
        .add_extension(x509.SubjectAlternativeName([x509.UniformResourceIdentifier(str(ALICE))]), critical=True)
        .sign(rsa_key, hashes.SHA256())
        .public_bytes(serialization.Encoding.PEM)
    )
    with pytest.raises(CertificateError, match="P-256"):
        sign_csr(ca, rsa_csr, now=NOW, ttl_seconds=TTL)
    with pytest.raises(CertificateError, match="malformed CSR"):
        sign_csr(ca, b"not a csr", now=NOW, ttl_seconds=TTL)
    with pytest.raises(CertificateError, match="positive"):
        sign_csr(ca, make_csr(ALICE)[0], now=NOW, ttl_seconds=0)


def test_check_peer_accepts_an_expected_identity_in_the_trust_domain(ca: KeyPair) -> None:
    der = _leaf_der(ca, ALICE)
    assert check_peer(der, trust_domain="cluster.local", expected=None) == ALICE
    assert check_peer(der, trust_domain="cluster.local", expected=frozenset()) == ALICE
    assert check_peer(der, trust_domain="cluster.local", expected=frozenset({BOB, ALICE})) == ALICE


def test_check_peer_refuses_another_trust_domain_even_under_the_same_root(ca: KeyPair) -> None:
    with pytest.raises(PeerIdentityError, match="outside trust domain"):
        check_peer(_leaf_der(ca, STRANGER), trust_domain="cluster.local", expected=None)


def test_check_peer_refuses_an_unexpected_identity(ca: KeyPair) -> None:
    with pytest.raises(PeerIdentityError, match="expected one of"):
        check_peer(_leaf_der(ca, ALICE), trust_domain="cluster.local", expected=frozenset({BOB}))


def test_check_peer_refuses_a_missing_certificate() -> None:
    with pytest.raises(PeerIdentityError, match="no certificate"):
        check_peer(None, trust_domain="cluster.local", expected=None)


def test_identity_of_refuses_certificates_without_exactly_one_valid_spiffe_san(ca: KeyPair) -> None:
    no_san = _der(issue_client_cert(ca, common_name="alice", now=NOW).cert_pem)
    with pytest.raises(PeerIdentityError, match="no subject alternative names"):
        identity_of(no_san)
    dns_only = _cert_with_sans(ca, [x509.DNSName("alice.shop.svc")])
    with pytest.raises(PeerIdentityError, match="found 0"):
        identity_of(dns_only)
    two = _cert_with_sans(ca, [x509.UniformResourceIdentifier(str(ALICE)), x509.UniformResourceIdentifier(str(BOB))])
    with pytest.raises(PeerIdentityError, match="found 2"):
        identity_of(two)
    malformed = _cert_with_sans(ca, [x509.UniformResourceIdentifier("spiffe://cluster.local/ns/shop")])
    with pytest.raises(PeerIdentityError, match="malformed SPIFFE id"):
        identity_of(malformed)
    with pytest.raises(PeerIdentityError, match="malformed peer certificate"):
        identity_of(b"\x30\x03garbage")


def test_identity_of_ignores_other_uri_and_dns_sans(ca: KeyPair) -> None:
    mixed = _cert_with_sans(
        ca,
        [
            x509.DNSName("alice.shop.svc"),
            x509.UniformResourceIdentifier("https://example.com/"),
            x509.UniformResourceIdentifier(str(ALICE)),
        ],
    )
    assert identity_of(mixed) == ALICE


@settings(max_examples=300)
@given(st.binary(max_size=600))
def test_identity_of_random_bytes_raise_only_peer_identity_error(data: bytes) -> None:
    with pytest.raises(PeerIdentityError):
        identity_of(data)


@settings(max_examples=300, deadline=None)
@given(st.data())
def test_identity_of_corrupted_certificates_give_an_identity_or_peer_identity_error(data: st.DataObject) -> None:
    der = bytearray(_GOOD_LEAF)
    for _ in range(data.draw(st.integers(1, 4))):
        position = data.draw(st.integers(0, len(der) - 1))
        der[position] = data.draw(st.integers(0, 255))
    try:
        result = identity_of(bytes(der))
    except PeerIdentityError:
        return
    assert isinstance(result, SpiffeId)


@settings(max_examples=200, deadline=None)
@given(st.binary(max_size=400))
def test_sign_csr_of_random_bytes_raises_only_certificate_error(data: bytes) -> None:
    pem = b"-----BEGIN CERTIFICATE REQUEST-----\n" + data + b"\n-----END CERTIFICATE REQUEST-----\n"
    with pytest.raises(CertificateError):
        sign_csr(_MODULE_CA, pem, now=NOW, ttl_seconds=TTL)
    with pytest.raises(CertificateError):
        sign_csr(_MODULE_CA, data, now=NOW, ttl_seconds=TTL)


_MODULE_CA = new_ca("hypothesis root", now=NOW)
_GOOD_LEAF = _leaf_der(_MODULE_CA, ALICE)


def test_check_peer_judges_a_remembered_certificate_again_for_each_trust_domain_and_expected_set(ca: KeyPair) -> None:
    from ambit.tls import spiffe

    der = _leaf_der(ca, ALICE)
    for _ in range(2):  # the second round is served from the cache of parsed certificates
        assert check_peer(der, trust_domain="cluster.local", expected=frozenset({ALICE})) == ALICE
        with pytest.raises(PeerIdentityError):
            check_peer(der, trust_domain="other.domain", expected=None)
        with pytest.raises(PeerIdentityError):
            check_peer(der, trust_domain="cluster.local", expected=frozenset({BOB}))
    assert spiffe._KNOWN_PEERS[der] == ALICE
