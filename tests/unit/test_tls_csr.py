"""The node proxy's own CSR encoder (:mod:`ambit.tls.csr`) and P-256 keys (:mod:`ambit.tls.eckey`), held to what
cryptography writes and to what our CA accepts, on both key back-ends."""

from __future__ import annotations

from collections.abc import Iterator

import pytest
from cryptography import x509
from cryptography.hazmat.primitives import hashes, serialization
from cryptography.hazmat.primitives.asymmetric import ec
from hypothesis import given, settings
from hypothesis import strategies as st

from ambit.model.identity import SpiffeId
from ambit.tls import csr, der, eckey
from ambit.tls.certs import new_ca
from ambit.tls.issuance import sign_csr
from ambit.tls.spiffe import identity_of, make_csr

NOW = 1_800_000_000.0
CA = new_ca("csr test root", now=NOW)

identities = st.builds(
    SpiffeId,
    st.from_regex(r"[a-z0-9._-]{1,40}", fullmatch=True),
    st.from_regex(r"[A-Za-z0-9_-][A-Za-z0-9._-]{0,62}", fullmatch=True),
    st.from_regex(r"[A-Za-z0-9_-][A-Za-z0-9._-]{0,62}", fullmatch=True),
)


@pytest.fixture(params=["libcrypto", "cryptography"])
def key_backend(request: pytest.FixtureRequest, monkeypatch: pytest.MonkeyPatch) -> Iterator[str]:
    """Each test runs with the process's libcrypto and with the cryptography fallback."""
    if request.param == "libcrypto":
        assert eckey._libcrypto() is not None, "this Python's libcrypto should be reachable"
    else:
        monkeypatch.setattr(eckey, "_libcrypto", lambda: None)
    yield request.param


def _our_csr(identity: SpiffeId) -> x509.CertificateSigningRequest:
    pem, _ = make_csr(identity)
    assert pem.startswith(b"-----BEGIN CERTIFICATE REQUEST-----\n")
    return x509.load_pem_x509_csr(pem)


def test_a_csr_parses_with_cryptography_verifies_and_names_only_the_identity(key_backend: str) -> None:
    identity = SpiffeId("cluster.local", "shop", "alice")
    request = _our_csr(identity)
    assert request.is_signature_valid
    assert request.subject == x509.Name([])
    assert request.signature_hash_algorithm is not None and request.signature_hash_algorithm.name == "sha256"
    public_key = request.public_key()
    assert isinstance(public_key, ec.EllipticCurvePublicKey) and isinstance(public_key.curve, ec.SECP256R1)
    san = request.extensions.get_extension_for_class(x509.SubjectAlternativeName)
    assert san.critical
    assert list(san.value) == [x509.UniformResourceIdentifier(str(identity))]
    assert len(request.extensions) == 1


def test_the_key_pem_is_pkcs8_and_matches_the_csr(key_backend: str) -> None:
    pem, key_pem = make_csr(SpiffeId("cluster.local", "shop", "alice"))
    assert key_pem.startswith(b"-----BEGIN PRIVATE KEY-----\n")
    key = serialization.load_pem_private_key(key_pem, password=None)
    assert isinstance(key, ec.EllipticCurvePrivateKey)
    assert key.public_key() == x509.load_pem_x509_csr(pem).public_key()


def test_each_csr_has_a_fresh_key(key_backend: str) -> None:
    identity = SpiffeId("cluster.local", "shop", "alice")
    assert _our_csr(identity).public_key() != _our_csr(identity).public_key()


def test_our_ca_signs_it_for_the_right_identity(key_backend: str) -> None:
    identity = SpiffeId("cluster.local", "shop", "alice")
    pem, _ = make_csr(identity)
    chain = sign_csr(CA, pem, now=NOW, ttl_seconds=3600, identity=identity)
    leaf = x509.load_pem_x509_certificate(chain[0])
    assert identity_of(leaf.public_bytes(serialization.Encoding.DER)) == identity


@settings(max_examples=50, deadline=None)
@given(identities)
def test_the_request_info_is_byte_for_byte_cryptographys(identity: SpiffeId) -> None:
    key = ec.generate_private_key(ec.SECP256R1())
    spki = key.public_key().public_bytes(serialization.Encoding.DER, serialization.PublicFormat.SubjectPublicKeyInfo)
    theirs = (
        x509.CertificateSigningRequestBuilder()
        .subject_name(x509.Name([]))
        .add_extension(x509.SubjectAlternativeName([x509.UniformResourceIdentifier(str(identity))]), critical=True)
        .sign(key, hashes.SHA256())
    )
    ours = x509.load_der_x509_csr(csr.signing_request(str(identity), spki, lambda data: key.sign(data, _ECDSA)))
    assert csr.request_info(str(identity), spki) == theirs.tbs_certrequest_bytes == ours.tbs_certrequest_bytes
    assert ours.is_signature_valid


@settings(max_examples=25, deadline=None)
@given(identities)
def test_the_ca_issues_exactly_the_identity_asked_for(identity: SpiffeId) -> None:
    pem, key_pem = make_csr(identity)
    chain = sign_csr(CA, pem, now=NOW, ttl_seconds=3600, identity=identity)
    leaf = x509.load_pem_x509_certificate(chain[0])
    assert identity_of(leaf.public_bytes(serialization.Encoding.DER)) == identity
    key = serialization.load_pem_private_key(key_pem, password=None)
    assert isinstance(key, ec.EllipticCurvePrivateKey) and key.public_key() == leaf.public_key()


def test_a_non_ascii_uri_is_refused_before_encoding() -> None:
    spki = eckey.new_key().public_key_der()
    with pytest.raises(ValueError, match="ASCII"):
        csr.request_info("spiffe://cluster.local/ns/caf\u00e9/sa/x", spki)


def test_a_libcrypto_signature_verifies_with_cryptography() -> None:
    key = eckey.new_key()
    assert isinstance(key, eckey._OpenSslKey)
    public_key = serialization.load_der_public_key(key.public_key_der())
    assert isinstance(public_key, ec.EllipticCurvePublicKey)
    public_key.verify(key.sign_sha256(b"to be signed"), b"to be signed", _ECDSA)


@settings(max_examples=200)
@given(st.integers(0, 0xFF), st.binary(max_size=70_000))
def test_der_elements_read_back_as_written(tag: int, content: bytes) -> None:
    if tag & 0x1F == 0x1F:
        return
    encoded = der.encode(tag, content)
    found, start, end = der.read(encoded)
    assert (found, encoded[start:end], end) == (tag, content, len(encoded))


@pytest.mark.parametrize(
    "encoded",
    [
        b"\x30\x80\x00\x00",  # indefinite length
        b"\x04\x81\x05hello",  # long form for a short length
        b"\x04\x82\x00\x85" + bytes(0x85),  # a length in more bytes than it needs
        b"\x04\x05abc",  # runs past the buffer
        b"\x1f\x01\x00",  # a multi-byte tag
        b"\x04",  # truncated
    ],
)
def test_der_reading_refuses_what_is_not_strict_der(encoded: bytes) -> None:
    with pytest.raises(der.DerError):
        der.read(encoded)


_ECDSA = ec.ECDSA(hashes.SHA256())
