"""Judging the client certificate an ingress gateway's mutual-TLS listener was shown, after the handshake.

Theory of operation: OpenSSL proves the chain during the handshake (the listener's context trusts only its CA and
requires a certificate); :func:`judge_client` then decides, from the listener's
:class:`~ambit.model.ingress.ListenerTls`, the peer's DER certificate and the chain OpenSSL verified, whether the
client is served and under which SPIFFE identity. It is pure: no sockets, no clock. Checking again here what the
handshake should have ensured is deliberate: a port's listeners share one TLS session (the server name switches
contexts mid-handshake), so the verdict must name the listener's own trust, not whichever context happened to run.

Rules (Envoy's ``CertificateValidationContext`` as Istio fills it for a gateway server):

1. ``SIMPLE``: every client is served, with no identity.
2. Otherwise the client must have presented a certificate, and OpenSSL must have verified its chain to an anchor
   the listener trusts (``MUTUAL`` and ``OPTIONAL_MUTUAL``: one of ``ca_pem``'s certificates; ``ISTIO_MUTUAL``: one
   of the mesh roots). ``OPTIONAL_MUTUAL`` serves a client that presented none, with no identity; one that
   presented a certificate is judged by every rule here, as under ``MUTUAL``.
   A chain that cannot be read (a resumed session carries none) is refused: fail closed.
3. ``subject_alt_names``: one of the certificate's DNS, URI, e-mail or IP names equals one listed (DNS names
   compare case-insensitively, and a ``*.`` wildcard DNS name in the certificate covers one label, as Envoy's
   matcher does).
4. ``spki_sha256`` / ``cert_sha256``: when either is given, the SHA-256 of the certificate's SubjectPublicKeyInfo
   or of the certificate itself is among them (Envoy accepts a certificate that matches either list).
5. ``ISTIO_MUTUAL``: the certificate names exactly one SPIFFE id, in the mesh's trust domain; it is the client's
   identity (``source.principal`` for policies). ``MUTUAL`` gives no identity: a certificate from a CA outside
   the mesh does not speak for a mesh workload.
6. A certificate that does not parse is refused; nothing raises.
"""

from __future__ import annotations

import hashlib
import ipaddress
from collections.abc import Sequence
from dataclasses import dataclass

from cryptography import x509
from cryptography.hazmat.primitives import serialization

from ambit.model.identity import SpiffeId
from ambit.model.ingress import ListenerTls, TlsMode
from ambit.tls.credentials import server_name_matches
from ambit.tls.spiffe import PeerIdentityError, check_peer

__all__ = ["ClientAccepted", "ClientRefused", "anchors_of", "judge_client"]


@dataclass(frozen=True, slots=True)
class ClientAccepted:
    identity: SpiffeId | None = None
    """The client's SPIFFE id (``ISTIO_MUTUAL``), else None."""


@dataclass(frozen=True, slots=True)
class ClientRefused:
    reason: str


def anchors_of(pem: bytes) -> frozenset[bytes]:
    """The DER form of every certificate in a PEM bundle (the anchors rule 2 accepts); empty if none parse."""
    try:
        return frozenset(c.public_bytes(serialization.Encoding.DER) for c in x509.load_pem_x509_certificates(pem))
    except ValueError:
        return frozenset()


def _names(cert: x509.Certificate) -> tuple[list[str], list[str]]:
    """(DNS names, every other name as text) of the certificate's subjectAltName."""
    try:
        san = cert.extensions.get_extension_for_class(x509.SubjectAlternativeName).value
    except x509.ExtensionNotFound:
        return [], []
    dns = [name.lower() for name in san.get_values_for_type(x509.DNSName)]
    other: list[str] = list(san.get_values_for_type(x509.UniformResourceIdentifier))
    other += san.get_values_for_type(x509.RFC822Name)
    other += [str(ip) for ip in san.get_values_for_type(x509.IPAddress)]
    return dns, other


def _san_matches(wanted: str, dns: Sequence[str], other: Sequence[str]) -> bool:
    if wanted in other:
        return True
    try:
        if str(ipaddress.ip_address(wanted)) in other:
            return True
    except ValueError:
        pass
    return any(server_name_matches(name, wanted) for name in dns)


def judge_client(
    tls: ListenerTls,
    peer_der: bytes | None,
    verified: Sequence[bytes] | None,
    *,
    anchors: frozenset[bytes],
    trust_domain: str,
) -> ClientAccepted | ClientRefused:
    """Rules 1-6. ``verified`` is the chain OpenSSL verified (DER, leaf first, anchor last); ``anchors`` the DER
    certificates the listener trusts (:func:`anchors_of` its ``ca_pem``, or the mesh roots)."""
    if tls.mode is TlsMode.SIMPLE:
        return ClientAccepted()
    if peer_der is None:
        return ClientRefused("no client certificate") if tls.mode.requires_client_certificate else ClientAccepted()
    if not verified:
        return ClientRefused("the client certificate's verified chain is not known")
    if verified[-1] not in anchors or verified[0] != peer_der:
        return ClientRefused("the client certificate does not chain to this listener's CA")
    try:
        cert = x509.load_der_x509_certificate(peer_der)
        if tls.subject_alt_names:
            dns, other = _names(cert)
            if not any(_san_matches(wanted, dns, other) for wanted in tls.subject_alt_names):
                return ClientRefused("the client certificate names none of the accepted subjectAltNames")
        if tls.spki_sha256 or tls.cert_sha256:
            spki = cert.public_key().public_bytes(
                serialization.Encoding.DER, serialization.PublicFormat.SubjectPublicKeyInfo
            )
            pinned = hashlib.sha256(spki).digest() in tls.spki_sha256
            if not pinned and hashlib.sha256(peer_der).digest() not in tls.cert_sha256:
                return ClientRefused("the client certificate matches no pinned key or certificate hash")
    except ValueError as exc:
        return ClientRefused(f"the client certificate cannot be read: {exc}")
    if tls.mode is TlsMode.ISTIO_MUTUAL:
        try:
            return ClientAccepted(check_peer(peer_der, trust_domain=trust_domain, expected=None))
        except PeerIdentityError as exc:
            return ClientRefused(str(exc))
    return ClientAccepted()
