"""The verdict on a mutual-TLS ingress listener's client (ambit.tls.client_auth.judge_client): each rule, and the
forgeries it must refuse (no certificate, a chain ending elsewhere, a wrong name, a wrong pin, a forged SPIFFE id)."""

from __future__ import annotations

import hashlib
import time

import pytest
from cryptography import x509
from cryptography.hazmat.primitives import serialization
from hypothesis import given, settings
from hypothesis import strategies as st
from tests.ingress_pki import client_cert, self_signed_client

from ambit.model.identity import SpiffeId
from ambit.model.ingress import ListenerTls, TlsMode
from ambit.tls.certs import KeyPair, new_ca
from ambit.tls.client_auth import ClientAccepted, ClientRefused, anchors_of, judge_client

CA = new_ca("client CA", now=time.time())
OTHER_CA = new_ca("another CA", now=time.time())
ANCHORS = anchors_of(CA.cert_pem)
TD = "cluster.local"


def der(pair: KeyPair) -> bytes:
    return x509.load_pem_x509_certificate(pair.cert_pem).public_bytes(serialization.Encoding.DER)


def chain(pair: KeyPair, ca: KeyPair = CA) -> list[bytes]:
    return [der(pair), der(ca)]


def judge(tls: ListenerTls, pair: KeyPair | None, verified: list[bytes] | None = None) -> object:
    peer = der(pair) if pair is not None else None
    if verified is None and pair is not None:
        verified = chain(pair)
    return judge_client(tls, peer, verified, anchors=ANCHORS, trust_domain=TD)


MUTUAL = ListenerTls(TlsMode.MUTUAL, CA.cert_pem)


def test_simple_serves_anyone_without_identity() -> None:
    assert judge(ListenerTls(), None) == ClientAccepted()


def test_mutual_needs_a_certificate_chaining_to_the_listener_s_ca() -> None:
    good = client_cert(CA, dns=("client.example",))
    assert judge(MUTUAL, good) == ClientAccepted()  # MUTUAL names no principal
    assert judge(MUTUAL, None) == ClientRefused("no client certificate")
    foreign = client_cert(OTHER_CA)
    verdict = judge(MUTUAL, foreign, chain(foreign, OTHER_CA))
    assert isinstance(verdict, ClientRefused) and "does not chain" in verdict.reason
    forged = self_signed_client(dns=("client.example",))
    assert isinstance(judge(MUTUAL, forged, [der(forged)]), ClientRefused)
    # a verified chain of another certificate (or none at all: a resumed session) is not this client's
    assert isinstance(judge(MUTUAL, forged, chain(good)), ClientRefused)
    assert isinstance(judge_client(MUTUAL, der(good), None, anchors=ANCHORS, trust_domain=TD), ClientRefused)


def test_optional_mutual_serves_a_client_without_a_certificate_and_judges_one_that_has_one() -> None:
    tls = ListenerTls(TlsMode.OPTIONAL_MUTUAL, CA.cert_pem, ("client.example",))
    assert judge(tls, None) == ClientAccepted()  # no certificate: served, with no identity
    assert judge(tls, client_cert(CA, dns=("client.example",))) == ClientAccepted()
    foreign = client_cert(OTHER_CA, dns=("client.example",))
    assert isinstance(judge(tls, foreign, chain(foreign, OTHER_CA)), ClientRefused)
    forged = self_signed_client(dns=("client.example",))
    assert isinstance(judge(tls, forged, [der(forged)]), ClientRefused)
    assert isinstance(judge(tls, client_cert(CA, dns=("intruder.example",))), ClientRefused)
    # a presented certificate whose verified chain is not known (a resumed session) is refused: fail closed
    good = client_cert(CA, dns=("client.example",))
    assert isinstance(judge_client(tls, der(good), None, anchors=ANCHORS, trust_domain=TD), ClientRefused)


@pytest.mark.parametrize(
    ("wanted", "dns", "uris", "accepted"),
    [
        ("client.example", ("client.example",), (), True),
        ("CLIENT.example", ("client.example",), (), True),
        ("a.wild.example", ("*.wild.example",), (), True),
        ("a.b.wild.example", ("*.wild.example",), (), False),
        ("spiffe://partner/ns/x/sa/y", (), ("spiffe://partner/ns/x/sa/y",), True),
        ("spiffe://partner/ns/x/sa/y", (), ("spiffe://partner/ns/x/sa/z",), False),
        ("client.example", ("client.example.evil",), (), False),
        ("client.example", (), (), False),
    ],
)
def test_subject_alt_names_restrict_the_clients(
    wanted: str, dns: tuple[str, ...], uris: tuple[str, ...], accepted: bool
) -> None:
    tls = ListenerTls(TlsMode.MUTUAL, CA.cert_pem, (wanted,))
    verdict = judge(tls, client_cert(CA, dns=dns, uris=uris))
    assert isinstance(verdict, ClientAccepted) is accepted


def test_pins_accept_a_match_in_either_list_and_refuse_others() -> None:
    pinned, other = client_cert(CA), client_cert(CA)
    pinned_cert = x509.load_pem_x509_certificate(pinned.cert_pem)
    spki = pinned_cert.public_key().public_bytes(
        serialization.Encoding.DER, serialization.PublicFormat.SubjectPublicKeyInfo
    )
    by_key = ListenerTls(TlsMode.MUTUAL, CA.cert_pem, (), (hashlib.sha256(spki).digest(),))
    by_hash = ListenerTls(TlsMode.MUTUAL, CA.cert_pem, (), (b"\0" * 32,), (hashlib.sha256(der(pinned)).digest(),))
    for tls in (by_key, by_hash):
        assert judge(tls, pinned) == ClientAccepted()
        verdict = judge(tls, other)
        assert isinstance(verdict, ClientRefused) and "pinned" in verdict.reason


def test_istio_mutual_names_the_client_s_spiffe_id_in_the_mesh_only() -> None:
    tls = ListenerTls(TlsMode.ISTIO_MUTUAL)
    meshed = client_cert(CA, uris=("spiffe://cluster.local/ns/app/sa/client",))
    assert judge(tls, meshed) == ClientAccepted(SpiffeId(TD, "app", "client"))
    outsider = client_cert(CA, uris=("spiffe://elsewhere/ns/app/sa/client",))
    assert isinstance(judge(tls, outsider), ClientRefused)
    nameless = client_cert(CA, dns=("client.example",))
    assert isinstance(judge(tls, nameless), ClientRefused)
    # the same forged id on a certificate that does not chain to the mesh roots gets nothing
    forged = self_signed_client(uris=("spiffe://cluster.local/ns/app/sa/client",))
    assert isinstance(judge(tls, forged, [der(forged)]), ClientRefused)


@settings(max_examples=100, deadline=None)
@given(st.binary(max_size=300), st.lists(st.binary(max_size=40), max_size=3))
def test_any_bytes_get_a_verdict(peer: bytes, verified: list[bytes]) -> None:
    for tls in (MUTUAL, ListenerTls(TlsMode.ISTIO_MUTUAL, subject_alt_names=("x",), spki_sha256=(b"\0" * 32,))):
        verdict = judge_client(tls, peer, [peer, *verified, der(CA)], anchors=ANCHORS, trust_domain=TD)
        assert isinstance(verdict, ClientAccepted | ClientRefused)
