"""The CRL file's parser and the revocation verdict (ambit.tls.revocation), rule by rule."""

from __future__ import annotations

import contextlib
import datetime

import pytest
from cryptography import x509
from cryptography.hazmat.primitives import hashes, serialization
from hypothesis import given
from hypothesis import strategies as st
from tests import crl_pki

from ambit.model.identity import SpiffeId
from ambit.tls.revocation import CrlStatus, RevocationError, RevocationList, parse_crls

ALICE = SpiffeId("cluster.local", "ns", "alice")
BOB = SpiffeId("cluster.local", "ns", "bob")

ROOT = crl_pki.root()
INTER = crl_pki.intermediate(ROOT)
OTHER_INTER = crl_pki.intermediate(ROOT, "Other intermediate")
ALICE_CERT = crl_pki.workload(INTER, ALICE)
BOB_CERT = crl_pki.workload(INTER, BOB)
ALICE_CHAIN = crl_pki.der_chain(ALICE_CERT)
BOB_CHAIN = crl_pki.der_chain(BOB_CERT)
ALICE_SERIAL = crl_pki.serial_of(ALICE_CERT.chain_pem[0])
INTER_SERIAL = crl_pki.serial_of(INTER.cert_pem)


def test_an_empty_or_blank_file_holds_no_crls() -> None:
    for data in (b"", b"\n  \n"):
        table = RevocationList.parse(data)
        assert len(table) == 0
        assert table.find_revoked(ALICE_CHAIN) is None


def test_a_revoked_leaf_is_found_and_its_sibling_is_not() -> None:
    table = RevocationList.parse(crl_pki.crl(INTER, [ALICE_SERIAL]), anchors=[ROOT.cert_pem])
    revoked = table.find_revoked(ALICE_CHAIN)
    assert revoked is not None
    assert revoked.position == 0
    assert revoked.serial == ALICE_SERIAL
    assert "Plug-in intermediate" in revoked.issuer
    assert "leaf" in str(revoked)
    assert table.find_revoked(BOB_CHAIN) is None


def test_a_revoked_intermediate_revokes_every_leaf_under_it() -> None:
    table = RevocationList.parse(crl_pki.crl(ROOT, [INTER_SERIAL]), anchors=[ROOT.cert_pem])
    assert table.infos[0].status is CrlStatus.VERIFIED
    for chain in (ALICE_CHAIN, BOB_CHAIN):
        revoked = table.find_revoked(chain)
        assert revoked is not None and revoked.position == 1
    other = crl_pki.der_chain(crl_pki.workload(OTHER_INTER, ALICE))
    assert table.find_revoked(other) is None


def test_a_bundle_of_crls_from_root_and_intermediate_applies_each_to_its_own_certificates() -> None:
    bundle = b"some text openssl wrote\n" + crl_pki.crl(ROOT, []) + crl_pki.crl(INTER, [ALICE_SERIAL])
    table = RevocationList.parse(bundle, anchors=[ROOT.cert_pem])
    assert [info.status for info in table.infos] == [CrlStatus.VERIFIED, CrlStatus.UNVERIFIED]
    assert table.find_revoked(ALICE_CHAIN) is not None
    assert table.find_revoked(BOB_CHAIN) is None


def test_a_forged_crl_naming_the_intermediate_revokes_nothing() -> None:
    # Someone who can write the file but holds no CA key signs a CRL in the intermediate's name.
    forger = crl_pki.root("Forger")
    forged = crl_pki.crl(INTER, [ALICE_SERIAL], signer=forger)
    table = RevocationList.parse(forged, anchors=[ROOT.cert_pem])
    assert table.find_revoked(ALICE_CHAIN) is None


def test_a_forged_crl_naming_a_known_root_is_dropped_with_an_error() -> None:
    forged = crl_pki.crl(ROOT, [INTER_SERIAL], signer=crl_pki.root("Forger"))
    table = RevocationList.parse(forged, anchors=[ROOT.cert_pem])
    assert len(table) == 0
    assert "not signed by that CA" in table.errors[0]
    assert table.find_revoked(ALICE_CHAIN) is None


def test_a_sibling_intermediate_cannot_revoke_its_siblings_leaves() -> None:
    # OTHER_INTER is a real CA of the mesh, but it did not issue Alice's certificate.
    sibling = crl_pki.crl(INTER, [ALICE_SERIAL], signer=OTHER_INTER)
    assert RevocationList.parse(sibling).find_revoked(ALICE_CHAIN) is None


def test_a_namesake_root_with_another_key_does_not_make_its_crl_apply() -> None:
    namesake = crl_pki.root("Test root")  # same subject as ROOT, different key
    table = RevocationList.parse(crl_pki.crl(namesake, [INTER_SERIAL]))
    assert table.find_revoked(ALICE_CHAIN) is None


def test_a_ca_without_crl_sign_usage_cannot_revoke() -> None:
    key = ROOT.private_key
    cert = ROOT.certificate
    usage = x509.KeyUsage(True, False, False, False, False, True, False, False, False)
    no_crl_sign = (
        x509.CertificateBuilder()
        .subject_name(cert.subject)
        .issuer_name(cert.subject)
        .public_key(key.public_key())
        .serial_number(cert.serial_number)
        .not_valid_before(cert.not_valid_before_utc)
        .not_valid_after(cert.not_valid_after_utc)
        .add_extension(x509.BasicConstraints(ca=True, path_length=None), critical=True)
        .add_extension(usage, critical=True)
        .sign(key, hashes.SHA256())
    )
    chain = [*ALICE_CHAIN[:-1], no_crl_sign.public_bytes(serialization.Encoding.DER)]
    table = RevocationList.parse(crl_pki.crl(ROOT, [INTER_SERIAL]))
    assert table.find_revoked(chain) is None
    assert table.find_revoked(ALICE_CHAIN) is not None


def test_an_expired_crl_still_applies_and_says_it_is_expired() -> None:
    stale = crl_pki.crl(INTER, [ALICE_SERIAL], now=crl_pki.NOW - 30 * 86400, next_update_days=1)
    table = RevocationList.parse(stale)
    assert table.find_revoked(ALICE_CHAIN) is not None
    dump = table.infos[0].to_dump(datetime.datetime.fromtimestamp(crl_pki.NOW, tz=datetime.UTC))
    assert dump["expired"] is True
    assert dump["revokedCertificates"] == 1


def test_the_trust_anchor_itself_is_never_judged() -> None:
    table = RevocationList.parse(crl_pki.crl(ROOT, [ROOT.certificate.serial_number]))
    assert table.find_revoked(ALICE_CHAIN) is None


def test_a_der_crl_is_read_too() -> None:
    pem = crl_pki.crl(INTER, [ALICE_SERIAL])
    der = x509.load_pem_x509_crl(pem).public_bytes(serialization.Encoding.DER)
    assert RevocationList.parse(der).find_revoked(ALICE_CHAIN) is not None


@pytest.mark.parametrize(
    ("data", "message"),
    [
        (b"hello", "neither PEM"),
        (ROOT.cert_pem, "PEM block 1 is a CERTIFICATE"),
        (crl_pki.crl(ROOT) + b"-----BEGIN X509 CRL-----\nAAAA\n-----END X509 CRL-----\n", "PEM block 2"),
        (b"\x30\x03\x02\x01\x00", "the DER CRL"),
    ],
)
def test_a_file_that_is_not_crls_is_refused_whole_with_a_clear_error(data: bytes, message: str) -> None:
    with pytest.raises(RevocationError, match=message):
        RevocationList.parse(data)


def test_a_delta_crl_is_refused() -> None:
    at = datetime.datetime.fromtimestamp(crl_pki.NOW, tz=datetime.UTC)
    delta = (
        x509.CertificateRevocationListBuilder()
        .issuer_name(ROOT.certificate.subject)
        .last_update(at)
        .next_update(at + datetime.timedelta(days=1))
        .add_extension(x509.DeltaCRLIndicator(1), critical=True)
        .sign(ROOT.private_key, hashes.SHA256())
        .public_bytes(serialization.Encoding.PEM)
    )
    with pytest.raises(RevocationError, match="delta CRL"):
        parse_crls(delta)


def test_a_peer_chain_that_cannot_be_read_is_an_error_not_a_pass() -> None:
    table = RevocationList.parse(crl_pki.crl(INTER, [ALICE_SERIAL]))
    with pytest.raises(RevocationError, match="cannot be read"):
        table.find_revoked([b"\x30\x00", ALICE_CHAIN[1]])


VALID = crl_pki.crl(INTER, [ALICE_SERIAL, 7, 8])


@given(st.binary(max_size=512))
def test_arbitrary_bytes_parse_or_fail_with_a_revocation_error(data: bytes) -> None:
    try:
        RevocationList.parse(data)
    except RevocationError as exc:
        assert str(exc)


@given(st.integers(min_value=0, max_value=len(VALID) - 1), st.binary(min_size=1, max_size=8))
def test_a_damaged_crl_parses_or_fails_with_a_revocation_error(at: int, junk: bytes) -> None:
    damaged = VALID[:at] + junk + VALID[at + len(junk) :]
    try:
        table = RevocationList.parse(damaged, anchors=[ROOT.cert_pem])
    except RevocationError:
        return
    table.find_revoked(ALICE_CHAIN)


@given(st.binary(min_size=1, max_size=300))
def test_a_damaged_der_crl_parses_or_fails_with_a_revocation_error(body: bytes) -> None:
    with contextlib.suppress(RevocationError):
        RevocationList.parse(b"\x30" + body)


@given(st.lists(st.binary(max_size=64), max_size=4))
def test_damaged_peer_chains_give_a_verdict_or_a_revocation_error(chain: list[bytes]) -> None:
    table = RevocationList.parse(VALID)
    with contextlib.suppress(RevocationError):
        table.find_revoked([*chain, *ALICE_CHAIN[1:]])
