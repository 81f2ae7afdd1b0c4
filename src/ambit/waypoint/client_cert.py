"""The ``x-forwarded-client-cert`` (XFCC) header a waypoint or gateway forwards: who the client is, as the proxy
verified it, never as the client says.

Theory of operation: :func:`plan_client_cert` (a waypoint) and :func:`plan_forwarded_client_cert` (an ingress
gateway) are pure. Given a request head and what the proxy verified of its connection, they return the head to
authenticate, authorize, route and forward. The request path calls them first, so policies and routes see what the
backend will see (Istio puts its XFCC filter before authentication and authorization).

A waypoint's rules (Envoy's ``forward_client_cert_details`` as Istio configures a waypoint):

1. Every ``x-forwarded-client-cert`` header the client sent is removed, whatever its case or count: the peer of a
   waypoint's inner HTTP connection presents no certificate, so Envoy's default ``SANITIZE`` drops it; with the
   annotation ``ambient.istio.io/xfcc-include-client-identity: "true"``
   (:attr:`ambit.model.routes.WaypointConfig.xfcc_client_identity`) Istio overwrites it. A workload cannot pass
   an identity to the backend through this header.
2. With the annotation, and a peer identity verified by mutual TLS (the HBONE client: the node proxy speaking for
   the source workload), one header is added: ``By=<own SPIFFE id>;URI=<peer SPIFFE id>``, Envoy's XFCC element
   with the fields Istio fills from its filter state (``io.istio.local_principal``, ``io.istio.peer_principal``).
   SPIFFE ids have no ``,``, ``;``, ``=`` or ``"`` (:mod:`ambit.model.identity`), so no value needs quoting.
3. Without a verified peer nothing is added.
4. A head without the header, and nothing to add, is returned as it is (the common case costs one scan).

An ingress gateway's rules (Envoy's ``mutateXfccRequestHeader`` with the gateway's
:class:`~ambit.model.ingress.ForwardClientCert`, ProxyConfig ``gatewayTopology.forwardClientCertDetails``, and the
details istiod asks of a gateway's connection manager: ``Subject``, ``Cert``, ``URI`` and ``DNS``):

5. ``ALWAYS_FORWARD_ONLY``: the head goes on as it came.
6. ``SANITIZE``, or a connection that is not mutual TLS (plain HTTP, TLS without a client certificate, a
   connection the node proxy tunnelled to the gateway): every ``x-forwarded-client-cert`` is removed.
7. ``FORWARD_ONLY`` over mutual TLS: the head goes on as it came.
8. ``SANITIZE_SET`` over mutual TLS: the client's headers are replaced by one holding the verified certificate's
   element; ``APPEND_FORWARD``: the element is appended to the client's values (``,`` between elements, the
   client's lines joined into one header in their order).
9. The element, in Envoy's order: ``By=<uri>`` for each URI SAN of the certificate the gateway presented on the
   connection; ``Hash=<hex SHA-256 of the client's DER certificate>``; ``Cert="<the PEM certificate,
   URL-encoded>"``; ``Subject="<its subject, RFC 4514>"`` (present even when empty); ``URI=<uri>`` for each URI SAN
   (``URI=`` when there is none); ``DNS=<name>`` for each DNS SAN. Joined with ``;``.
10. No client can inject an element or a header line: a value made of anything but printable ASCII other than
    ``,;="\\`` and space is double-quoted, with ``"`` and ``\\`` escaped by a backslash and every other character
    outside printable ASCII written as ``%XX`` of its UTF-8 bytes (the subject is escaped the RFC 4514 way first:
    its control and non-ASCII characters as ``\\XX``). Envoy writes ``URI`` and ``DNS`` unquoted whatever they hold
    (a TODO of its own); here the certificate's names can never split the element the backend parses.
"""

from __future__ import annotations

import functools
import hashlib
import re
import urllib.parse
from dataclasses import dataclass

from cryptography import x509
from cryptography.hazmat.primitives import serialization

from ambit.model.identity import SpiffeId
from ambit.model.ingress import ForwardClientCert
from ambit.waypoint.decisions import RequestHead

__all__ = [
    "XFCC",
    "ClientCertificate",
    "client_cert_element",
    "describe_client_certificate",
    "edge_element",
    "plan_client_cert",
    "plan_forwarded_client_cert",
]

XFCC = "x-forwarded-client-cert"


@functools.lru_cache(maxsize=1024)
def client_cert_element(local: SpiffeId, peer: SpiffeId) -> str:
    """Rule 2's XFCC element."""
    return f"By={local};URI={peer}"


def plan_client_cert(
    head: RequestHead, *, include_identity: bool, local: SpiffeId | None, peer: SpiffeId | None
) -> RequestHead:
    """The head as it goes on (rules 1-4). Header names in ``head`` are lower-case already."""
    present = False
    for name, _ in head.headers:  # a plain loop: this runs for every request
        if name == XFCC:
            present = True
            break
    add = include_identity and local is not None and peer is not None
    if not present and not add:
        return head
    headers = [(name, value) for name, value in head.headers if name != XFCC] if present else list(head.headers)
    if add:
        assert local is not None and peer is not None
        headers.append((XFCC, client_cert_element(local, peer)))
    # Every field spelled out: dataclasses.replace would cost more than the rest of this function.
    return RequestHead(head.method, head.path, head.authority, tuple(headers), head.scheme)


@dataclass(frozen=True, slots=True)
class ClientCertificate:
    """What a gateway verified of a client's certificate on one connection (rule 9's fields)."""

    hash: str
    """Hex SHA-256 of the DER certificate."""
    cert: str
    """The PEM certificate, URL-encoded (Envoy's ``urlEncodedPemEncodedPeerCertificate``)."""
    subject: str
    """The subject, RFC 4514 (as OpenSSL's RFC 2253 printing gives it: most significant last)."""
    uris: tuple[str, ...] = ()
    dns: tuple[str, ...] = ()
    by: tuple[str, ...] = ()
    """The URI SANs of the certificate the gateway presented on this connection."""


_PLAIN = re.compile(r"[!#-+\--:<>-\[\]-~]+")
"""Printable ASCII but space and ``,;="\\``: a value made only of these goes unquoted."""
_ESCAPE = re.compile(r"[^ !#-\[\]-~]")
"""What rule 10 escapes inside quotes: ``"``, ``\\`` and anything outside printable ASCII."""


def _escaped(match: re.Match[str]) -> str:
    c = match.group()
    if c in ('"', "\\"):
        return "\\" + c
    return "".join(f"%{b:02X}" for b in c.encode("utf-8", "surrogatepass"))


def _value(text: str, *, quote: bool = False) -> str:
    """Rule 10: ``text`` as an XFCC value that cannot end its element early."""
    if not quote and _PLAIN.fullmatch(text):
        return text
    return '"' + _ESCAPE.sub(_escaped, text) + '"'


def _subject_text(name: x509.Name) -> str:
    """Rule 10's subject: RFC 4514 with control and non-ASCII characters escaped as ``\\XX`` (OpenSSL's
    ``ESC_CTRL`` and ``ESC_MSB``), so the quoted value holds printable ASCII only."""
    text = name.rfc4514_string()
    if all(" " <= c <= "~" for c in text):
        return text
    return "".join(
        c if " " <= c <= "~" else "".join(f"\\{b:02X}" for b in c.encode("utf-8", "surrogatepass")) for c in text
    )


def describe_client_certificate(der: bytes, by: tuple[str, ...] = ()) -> ClientCertificate | None:
    """Rule 9's fields of a verified client certificate (DER); None when it does not parse."""
    try:
        cert = x509.load_der_x509_certificate(der)
        pem = cert.public_bytes(serialization.Encoding.PEM).decode("ascii")
        subject = _subject_text(cert.subject)
        try:
            san = cert.extensions.get_extension_for_class(x509.SubjectAlternativeName).value
            uris = tuple(san.get_values_for_type(x509.UniformResourceIdentifier))
            dns = tuple(san.get_values_for_type(x509.DNSName))
        except x509.ExtensionNotFound:
            uris, dns = (), ()
    except (ValueError, TypeError, UnicodeError):
        return None
    return ClientCertificate(hashlib.sha256(der).hexdigest(), urllib.parse.quote(pem, safe=""), subject, uris, dns, by)


@functools.lru_cache(maxsize=1024)
def edge_element(client: ClientCertificate) -> str:
    """Rule 9's element, its values quoted by rule 10."""
    parts = [f"By={_value(uri)}" for uri in client.by]
    parts.append(f"Hash={_value(client.hash)}")
    parts.append(f"Cert={_value(client.cert, quote=True)}")
    parts.append(f"Subject={_value(client.subject, quote=True)}")
    parts += [f"URI={_value(uri)}" for uri in client.uris] or ["URI="]
    parts += [f"DNS={_value(name)}" for name in client.dns]
    return ";".join(parts)


def plan_forwarded_client_cert(
    head: RequestHead, mode: ForwardClientCert, client: ClientCertificate | None
) -> RequestHead:
    """The head as an ingress gateway forwards it (rules 5-10); ``client`` is None unless the connection is
    mutual TLS (the client presented a certificate the gateway verified)."""
    if mode is ForwardClientCert.ALWAYS_FORWARD_ONLY:
        return head
    if mode is ForwardClientCert.FORWARD_ONLY and client is not None:
        return head
    theirs = [value for name, value in head.headers if name == XFCC]
    kept = [(name, value) for name, value in head.headers if name != XFCC]
    if mode is ForwardClientCert.SANITIZE or client is None:
        if not theirs:
            return head
        return RequestHead(head.method, head.path, head.authority, tuple(kept), head.scheme)
    element = edge_element(client)
    if mode is ForwardClientCert.APPEND_FORWARD and theirs:
        element = ",".join([*theirs, element])
    kept.append((XFCC, element))
    return RequestHead(head.method, head.path, head.authority, tuple(kept), head.scheme)
