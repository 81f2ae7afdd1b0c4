"""Reading certificates without an X.509 library (:mod:`ambit.tls.certinfo`), held to cryptography's reading, and
the peer check built on it never more lenient than one built on cryptography."""

from __future__ import annotations

import datetime
import ipaddress
import warnings

import pytest
from cryptography import x509
from cryptography.hazmat.primitives import hashes, serialization
from cryptography.hazmat.primitives.asymmetric import ec
from cryptography.utils import CryptographyDeprecationWarning
from hypothesis import given, settings
from hypothesis import strategies as st

from ambit.model.identity import IdentityError, SpiffeId
from ambit.tls import der
from ambit.tls.certinfo import pem_blocks, read_certificate
from ambit.tls.certs import CertificateError, new_ca
from ambit.tls.der import DerError
from ambit.tls.issuance import sign_csr
from ambit.tls.spiffe import PeerIdentityError, identity_of, make_csr
from ambit.tls.workload import WorkloadCertificate

NOW = 1_800_000_000.0
CA = new_ca("certinfo test root", now=NOW)
KEY = ec.generate_private_key(ec.SECP256R1())
ALICE = SpiffeId("cluster.local", "shop", "alice")
CRYPTOGRAPHY_REFUSALS = (ValueError, x509.DuplicateExtension, x509.UnsupportedGeneralNameType, x509.InvalidVersion)


def reference_identity(cert_der: bytes) -> SpiffeId:
    """The peer check as it was with cryptography's parser: the one ``spiffe://`` URI SAN, or PeerIdentityError."""
    try:
        with warnings.catch_warnings():
            warnings.simplefilter("error", CryptographyDeprecationWarning)
            cert = x509.load_der_x509_certificate(cert_der)
        uris = cert.extensions.get_extension_for_class(x509.SubjectAlternativeName).value.get_values_for_type(
            x509.UniformResourceIdentifier
        )
    except (*CRYPTOGRAPHY_REFUSALS, TypeError, x509.ExtensionNotFound, CryptographyDeprecationWarning):
        raise PeerIdentityError("refused") from None
    spiffe = [uri for uri in uris if uri[:9].lower() == "spiffe://"]
    if len(spiffe) != 1:
        raise PeerIdentityError("refused")
    try:
        return SpiffeId.parse(spiffe[0])
    except IdentityError:
        raise PeerIdentityError("refused") from None


def verdict(check: object, cert_der: bytes) -> SpiffeId | None:
    try:
        result = check(cert_der)  # type: ignore[operator]
    except PeerIdentityError:
        return None
    assert isinstance(result, SpiffeId)
    return result


uris = st.one_of(
    st.builds(str, st.builds(SpiffeId, st.sampled_from(["cluster.local", "other.td"]), st.just("ns1"), st.just("sa"))),
    st.sampled_from(["spiffe://cluster.local/ns/shop", "SPIFFE://cluster.local/ns/a/sa/b", "https://example.com/"]),
    st.from_regex(r"[a-z]{1,6}://[a-z./]{0,20}", fullmatch=True),
)
general_names = st.lists(
    st.one_of(
        st.builds(x509.UniformResourceIdentifier, uris),
        st.builds(x509.DNSName, st.from_regex(r"[a-z]{1,10}\.svc", fullmatch=True)),
        st.builds(x509.IPAddress, st.ip_addresses().map(lambda a: ipaddress.ip_address(int(a)))),
        st.builds(x509.RFC822Name, st.just("a@b.example")),
    ),
    max_size=4,
)
moments = st.integers(0, 4_000_000_000)  # 1970 to 2096: UTCTime before 2050, GeneralizedTime after


def _certificate(names: list[x509.GeneralName] | None, serial: int, not_before: int, not_after: int) -> bytes:
    builder = (
        x509.CertificateBuilder()
        .subject_name(x509.Name([]))
        .issuer_name(CA.certificate.subject)
        .public_key(KEY.public_key())
        .serial_number(serial)
        .not_valid_before(datetime.datetime.fromtimestamp(not_before, tz=datetime.UTC))
        .not_valid_after(datetime.datetime.fromtimestamp(not_after, tz=datetime.UTC))
        .add_extension(x509.BasicConstraints(ca=False, path_length=None), critical=True)
    )
    if names is not None:
        builder = builder.add_extension(x509.SubjectAlternativeName(names), critical=True)
    return builder.sign(CA.private_key, hashes.SHA256()).public_bytes(serialization.Encoding.DER)


@settings(max_examples=150, deadline=None)
@given(st.none() | general_names, st.integers(1, 2**159 - 1), moments, moments)
def test_fields_and_the_peer_verdict_are_cryptographys(
    names: list[x509.GeneralName] | None, serial: int, first: int, second: int
) -> None:
    not_before, not_after = min(first, second), max(first, second) + 1
    cert_der = _certificate(names, serial, not_before, not_after)
    fields = read_certificate(cert_der)
    theirs = x509.load_der_x509_certificate(cert_der)
    assert fields.serial == theirs.serial_number
    assert fields.not_before == theirs.not_valid_before_utc.timestamp() == not_before
    assert fields.not_after == theirs.not_valid_after_utc.timestamp() == not_after
    expected_uris = None if names is None else [n.value for n in names if isinstance(n, x509.UniformResourceIdentifier)]
    assert (None if fields.uris is None else list(fields.uris)) == expected_uris
    assert verdict(identity_of, cert_der) == verdict(reference_identity, cert_der)


_GOOD_LEAF = _certificate([x509.UniformResourceIdentifier(str(ALICE))], 12345, int(NOW), int(NOW) + 3600)


def cryptography_parses(cert_der: bytes) -> bool:
    try:
        with warnings.catch_warnings():
            warnings.simplefilter("error", CryptographyDeprecationWarning)
            x509.load_der_x509_certificate(cert_der).extensions  # noqa: B018 (parsing them is the point)
    except (*CRYPTOGRAPHY_REFUSALS, CryptographyDeprecationWarning):
        return False
    return True


@settings(max_examples=400, deadline=None)
@given(st.data())
def test_a_corrupted_certificate_gives_cryptographys_verdict_or_a_refusal(data: st.DataObject) -> None:
    """Where cryptography can read the corrupted certificate, ours refuses it or agrees (ours refuses a few that
    cryptography reads, such as two different signature algorithms, which OpenSSL's verification refuses too).
    Where cryptography cannot (a name's string or the key's parameters made invalid: fields the identity does not
    depend on, which OpenSSL parsed and the CA's signature covers before a peer's certificate is judged), ours may
    still read the SAN: the identity it gives is the one written there."""
    cert_der = bytearray(_GOOD_LEAF)
    for _ in range(data.draw(st.integers(1, 4))):
        cert_der[data.draw(st.integers(0, len(cert_der) - 1))] = data.draw(st.integers(0, 255))
    ours = verdict(identity_of, bytes(cert_der))
    if cryptography_parses(bytes(cert_der)):
        assert ours in (None, verdict(reference_identity, bytes(cert_der)))
    else:
        assert ours is None or str(ours).encode() in cert_der


@settings(max_examples=300)
@given(st.binary(max_size=600))
def test_random_bytes_raise_only_der_error(data: bytes) -> None:
    with pytest.raises(DerError):
        read_certificate(data)


def _hand_made(extensions: list[bytes], *, version: int = 2, serial: bytes = b"\x01") -> bytes:
    """A certificate assembled element by element (no signature check happens when reading)."""
    time = der.encode(der.UTC_TIME, b"300101000000Z")
    tbs = [
        der.encode(0xA0, der.encode(der.INTEGER, bytes([version]))),
        der.encode(der.INTEGER, serial),
        der.encode(der.SEQUENCE, der.encode(der.OBJECT_IDENTIFIER, bytes.fromhex("2a8648ce3d040302"))),
        der.encode(der.SEQUENCE),
        der.encode(der.SEQUENCE, time, time),
        der.encode(der.SEQUENCE),
        KEY.public_key().public_bytes(serialization.Encoding.DER, serialization.PublicFormat.SubjectPublicKeyInfo),
    ]
    if extensions:
        tbs.append(der.encode(0xA3, der.encode(der.SEQUENCE, *extensions)))
    algorithm = der.encode(der.SEQUENCE, der.encode(der.OBJECT_IDENTIFIER, bytes.fromhex("2a8648ce3d040302")))
    return der.encode(der.SEQUENCE, der.encode(der.SEQUENCE, *tbs), algorithm, der.encode(der.BIT_STRING, b"\x00"))


def _san(*names: bytes) -> bytes:
    value = der.encode(der.SEQUENCE, *names)
    oid = der.encode(der.OBJECT_IDENTIFIER, bytes.fromhex("551d11"))
    return der.encode(der.SEQUENCE, oid, der.encode(der.OCTET_STRING, value))


ALICE_URI = der.encode(0x86, str(ALICE).encode())


def test_the_hand_made_certificate_is_read() -> None:
    assert identity_of(_hand_made([_san(ALICE_URI)])) == ALICE


@pytest.mark.parametrize(
    ("cert_der", "why"),
    [
        (_hand_made([_san(ALICE_URI), _san(ALICE_URI)]), "twice"),
        (_hand_made([_san(der.encode(0xA3, b""), ALICE_URI)]), "general name"),  # x400Address
        (_hand_made([_san(der.encode(0xA5, b""), ALICE_URI)]), "general name"),  # ediPartyName
        (_hand_made([_san(der.encode(0x86, b"spiffe://cluster.local/ns/caf\xc3\xa9/sa/x"))]), "ASCII"),
        (_hand_made([_san(ALICE_URI)], version=0), "v3"),
        (_hand_made([_san(ALICE_URI)], version=3), "version"),
        (_hand_made([_san(ALICE_URI)], serial=b"\xff"), "serial"),
        (_hand_made([_san(ALICE_URI)], serial=b"\x00\x01"), "shortest"),
        (_hand_made([_san(ALICE_URI)]) + b"\x00", "one element"),
    ],
)
def test_certificates_rfc_5280_forbids_are_refused(cert_der: bytes, why: str) -> None:
    with pytest.raises(DerError, match=why):
        read_certificate(cert_der)
    with pytest.raises(PeerIdentityError, match="malformed peer certificate"):
        identity_of(cert_der)
    with pytest.raises(PeerIdentityError):
        reference_identity(cert_der)


def test_pem_blocks_are_the_chains_certificates_in_order() -> None:
    csr, _ = make_csr(ALICE)
    chain = sign_csr(CA, csr, now=NOW, ttl_seconds=3600)
    blocks = pem_blocks(b"junk before\n" + b"".join(chain) + b"junk after")
    assert blocks == [x509.load_pem_x509_certificate(pem).public_bytes(serialization.Encoding.DER) for pem in chain]
    assert [der.pem(b"CERTIFICATE", block) for block in blocks] == chain


def test_the_workload_certificate_and_its_dump_read_what_cryptography_reads() -> None:
    csr, key = make_csr(ALICE)
    chain = sign_csr(CA, csr, now=NOW, ttl_seconds=3600)
    cert = WorkloadCertificate.from_chain(ALICE, chain, key)
    leaf = x509.load_pem_x509_certificate(chain[0])
    assert (cert.not_before, cert.not_after) == (
        leaf.not_valid_before_utc.timestamp(),
        leaf.not_valid_after_utc.timestamp(),
    )
    dump = cert.to_dump(NOW)
    assert dump["certChain"] == [
        {
            "pem": chain[0].decode(),
            "serialNumber": format(leaf.serial_number, "x"),
            "validFrom": leaf.not_valid_before_utc.strftime("%Y-%m-%dT%H:%M:%SZ"),
            "expirationTime": leaf.not_valid_after_utc.strftime("%Y-%m-%dT%H:%M:%SZ"),
        }
    ]
    assert [entry["pem"] for entry in dump["rootCerts"]] == [chain[-1].decode()]


@pytest.mark.parametrize(
    "leaf", [b"", b"not a certificate", b"-----BEGIN CERTIFICATE-----\nMAA=\n-----END CERTIFICATE-----\n"]
)
def test_a_ca_answer_without_a_readable_leaf_is_a_certificate_error(leaf: bytes) -> None:
    _, key = make_csr(ALICE)
    with pytest.raises(CertificateError, match="malformed leaf"):
        WorkloadCertificate.from_chain(ALICE, [leaf, CA.cert_pem], key)
