"""The TLS side of an ingress gateway's HTTPS port: which context each handshake uses, and whether the client it
ends with is served.

Theory of operation: one :class:`PortTls` per HTTPS port, built with each
:class:`~ambit.model.ingress.GatewayConfig` (a new config replaces it whole; handshakes under way keep theirs).
Every connection starts on the port's dispatch context (:func:`~ambit.tls.contexts.edge_dispatch_context`); its
server-name callback (given the connection's ``SSLSocket`` on the socket TLS transport, an ``SSLObject`` on the
loop's) picks the listener (:meth:`~ambit.waypoint.ingress_routing.IngressRouter.pick_listener`) and
switches to that listener's context: for ``SIMPLE``, ``MUTUAL`` and ``OPTIONAL_MUTUAL`` the first of its
certificates whose names cover the server name (else its first), a ``MUTUAL`` or ``OPTIONAL_MUTUAL`` one trusting
the listener's CA; for ``ISTIO_MUTUAL`` the context of the gateway's current mesh certificate (built once per
certificate, so a rotated certificate is served from the next handshake). After the handshake
:meth:`PortTls.admit` judges the client with :func:`~ambit.tls.client_auth.judge_client`.

Rules:

1. A port any of whose listeners verifies clients ("a verifying port") asks every client for a certificate
   (optionally: a client without one completes the handshake and is judged by the picked listener, which serves
   it only under ``OPTIONAL_MUTUAL``; a certificate presented that does not chain to the picked listener's CA
   fails the handshake) and resumes no session (OpenSSL keeps the first context's verify mode and session
   settings across the switch: see :func:`~ambit.tls.contexts.edge_dispatch_context`).
2. A handshake whose server name picks no listener fails (``unrecognized_name``), except on a port that verifies
   no clients, where a client sending no server name gets the first listener's first certificate and its
   requests are routed by their host among the port's listeners (as before client verification existed). On a
   verifying port every served connection belongs to the listener its handshake picked, so no request can reach a
   mutual-TLS listener's routes through another listener's handshake.
3. An ``ISTIO_MUTUAL`` listener whose mesh certificate is not there yet fails the handshake (``internal_error``).
4. :meth:`PortTls.admit`: the picked listener's verdict on the client; a refused client's connection is closed
   before any byte of HTTP is read. The verdict names the anchors of the context the handshake really used.
   A handshake whose TLS version, or TLS 1.2 cipher suite, is outside the picked listener's bounds is refused
   there too: the port's dispatch context offers the widest range its listeners allow (OpenSSL settles the
   version before the server name is known), so a listener's narrower bounds hold only after the handshake.
5. A certificate that does not load leaves its listener without it (logged); a listener left with none is not
   served (rule 2 then applies to its names).
6. A listener's certificates: the first whose names cover the server name is served, else the first. A listener
   with two certificates of different key types (RSA and ECDSA, as istiod pairs them) serves both from one
   context when both cover the server name (or neither does): OpenSSL then presents the one the client's
   signature algorithms accept, as Envoy does.
7. Only the port's terminating listeners (HTTPS, TLS_TERMINATE) are served here: on a port shared with TLS
   passthrough listeners, a server name that picks a passthrough listener never reaches a handshake (the gateway
   reads the ClientHello first, :mod:`ambit.waypoint.ingress`), and if it did, the handshake would fail as for
   a name no listener takes (rule 2).
8. ALPN: an HTTPS listener offers ``h2`` then ``http/1.1``; a TLS_TERMINATE listener none (the client's list is
   not answered), as istiod builds the TLS context of a TCP server terminating TLS: it relays bytes, so a client
   offering ``h2`` must not be told the gateway speaks it.
9. A client served over mutual TLS (it presented a certificate the picked listener verified) is described for
   the XFCC header (:func:`~ambit.waypoint.client_cert.describe_client_certificate`), with the URI SANs of the
   certificate served as ``By``: the listener's certificate that the server name picked, the mesh certificate's
   SPIFFE id on ``ISTIO_MUTUAL``; a listener serving two certificates from one context (rule 6) names the URI SANs
   they share, since OpenSSL does not say which one it presented.
"""

from __future__ import annotations

import logging
import ssl
import weakref
from collections.abc import Callable
from dataclasses import dataclass

from cryptography import x509

from ambit.model.ingress import IngressListener, ListenerTls, TlsMode
from ambit.tls.certs import CertificateError
from ambit.tls.client_auth import ClientAccepted, ClientRefused, anchors_of, judge_client
from ambit.tls.contexts import (
    edge_add_certificate,
    edge_client_ca,
    edge_dispatch_context,
    edge_mesh_context,
    edge_protocol,
    edge_server_context,
)
from ambit.tls.contexts import verified_chain as read_verified_chain
from ambit.tls.credentials import TlsCredential, read_pem_pair
from ambit.tls.workload import WorkloadCertificate
from ambit.waypoint.client_cert import ClientCertificate, describe_client_certificate
from ambit.waypoint.ingress_routing import IngressRouter

__all__ = ["Admitted", "PortTls"]

log = logging.getLogger("ambit.waypoint.ingress")

MeshCertificate = Callable[[], WorkloadCertificate | None]
"""The gateway's current mesh certificate, or None before the first one arrives."""
TlsSession = ssl.SSLSocket | ssl.SSLObject
"""One connection's TLS: the socket transport's ``SSLSocket`` (what the server-name callback gets for it too), or an
``SSLObject`` of the loop's own TLS."""


@dataclass(frozen=True, slots=True)
class Admitted:
    """A client served on ``listener`` (empty: rule 2's fallback), with its verdict."""

    listener: str
    verdict: ClientAccepted
    mutual: bool = False
    """The listener verified the client's certificate (``MUTUAL``, ``ISTIO_MUTUAL``; ``OPTIONAL_MUTUAL`` when the
    client presented one)."""
    server_name: str = ""
    """The server name the client asked for (lower-case), empty for none."""
    client_certificate: ClientCertificate | None = None
    """``mutual``: what the XFCC header says of the client's certificate (rule 9)."""


@dataclass(frozen=True, slots=True)
class _Picked:
    listener: IngressListener
    anchors: frozenset[bytes]
    server_name: str = ""
    by: tuple[str, ...] = ()
    """The URI SANs of the certificate served (the XFCC element's ``By``)."""


def _uri_names(cert_pem: bytes) -> tuple[str, ...]:
    """The leaf's URI SANs, or none."""
    try:
        san = x509.load_pem_x509_certificate(cert_pem).extensions.get_extension_for_class(x509.SubjectAlternativeName)
    except (ValueError, x509.ExtensionNotFound):
        return ()
    return tuple(san.value.get_values_for_type(x509.UniformResourceIdentifier))


def _static_contexts(listener: IngressListener) -> list[tuple[TlsCredential, ssl.SSLContext]]:
    loaded = []
    for i, cert in enumerate(listener.certificates):
        try:
            context = edge_server_context(cert.cert_pem, cert.key_pem)
            _no_http_alpn(context, listener)
            _bound(context, listener.tls)
            if listener.tls.mode.takes_ca:
                edge_client_ca(context, listener.tls.ca_pem, required=listener.tls.mode.requires_client_certificate)
        except CertificateError as exc:
            log.warning("listener %s: certificate %d not served: %s", listener.name, i, exc)
            continue
        judged = read_pem_pair(cert.cert_pem, cert.key_pem)
        credential = judged if isinstance(judged, TlsCredential) else TlsCredential(cert.cert_pem, cert.key_pem)
        loaded.append((credential, context))
    return loaded


def _no_http_alpn(context: ssl.SSLContext, listener: IngressListener) -> None:
    """Rule 8: a listener that relays bytes (TLS_TERMINATE) negotiates no application protocol."""
    if not listener.protocol.carries_http:
        context.set_alpn_protocols([])


def _key_type(cert_pem: bytes) -> str:
    """The leaf's public key algorithm (``RSAPublicKey``, ``EllipticCurvePublicKey``...), or empty."""
    try:
        return type(x509.load_pem_x509_certificate(cert_pem).public_key()).__name__
    except ValueError:
        return ""


def _paired_context(listener: IngressListener) -> ssl.SSLContext | None:
    """Rule 6: one context holding both of a listener's two certificates when their key types differ, else None."""
    if len(listener.certificates) != 2:
        return None
    first, second = listener.certificates
    types = {_key_type(first.cert_pem), _key_type(second.cert_pem)}
    if len(types) != 2 or "" in types:
        return None
    try:
        context = edge_server_context(first.cert_pem, first.key_pem)
        _no_http_alpn(context, listener)
        edge_add_certificate(context, second.cert_pem, second.key_pem)
        _bound(context, listener.tls)
        if listener.tls.mode.takes_ca:
            edge_client_ca(context, listener.tls.ca_pem, required=listener.tls.mode.requires_client_certificate)
    except CertificateError as exc:
        log.warning("listener %s: its two certificates not served together: %s", listener.name, exc)
        return None
    return context


def _bound(context: ssl.SSLContext, tls: ListenerTls) -> None:
    edge_protocol(context, min_version=tls.min_version, max_version=tls.max_version, cipher_suites=tls.cipher_suites)


_VERSIONS = {"TLSv1.2": 0x0303, "TLSv1.3": 0x0304}


def _outside(tls: ListenerTls, session: TlsSession) -> str | None:
    """Why the negotiated version or cipher suite is outside ``tls``'s bounds, or None (rule 4)."""
    version = _VERSIONS.get(session.version() or "", 0)
    if not version or version < (tls.min_version or 0x0303) or version > (tls.max_version or 0x0304):
        return f"{session.version()} is outside this listener's TLS versions"
    cipher = session.cipher()
    if version == 0x0303 and tls.cipher_suites and (cipher is None or cipher[0] not in tls.cipher_suites):
        return f"cipher suite {cipher[0] if cipher else '?'} is not among this listener's"
    return None


def _widest(listeners: tuple[IngressListener, ...]) -> ListenerTls:
    """The bounds of a port's dispatch context: every version and TLS 1.2 suite some listener allows."""
    suites: dict[str, None] = {}
    for item in listeners:
        if not item.tls.cipher_suites:
            suites = {}
            break
        suites.update(dict.fromkeys(item.tls.cipher_suites))
    return ListenerTls(
        min_version=min(item.tls.min_version or 0x0303 for item in listeners),
        max_version=max(item.tls.max_version or 0x0304 for item in listeners),
        cipher_suites=tuple(suites),
    )


class PortTls:
    """The TLS side of one port with terminating listeners (rules 1-8)."""

    def __init__(self, port: int, router: IngressRouter, mesh: MeshCertificate, trust_domain: str) -> None:
        self.port = port
        self.router = router
        self._mesh = mesh
        self._trust_domain = trust_domain
        self._mesh_context: tuple[WorkloadCertificate, ssl.SSLContext, frozenset[bytes]] | None = None
        self.by_listener: dict[str, list[tuple[TlsCredential, ssl.SSLContext]]] = {}
        self._anchors: dict[str, frozenset[bytes]] = {}
        self._paired: dict[str, ssl.SSLContext] = {}
        self._served_uris: dict[ssl.SSLContext, tuple[str, ...]] = {}
        """Rule 9: the URI SANs each static context serves."""
        """Listeners with an RSA and an ECDSA certificate: the context serving both (rule 6)."""
        listeners = tuple(item for item in router.listeners_on(port) if item.protocol.terminates_tls)
        self.verifies_clients = any(item.tls.mode.verifies_clients for item in listeners)
        self._istio_mutual = {item.name for item in listeners if item.tls.mode is TlsMode.ISTIO_MUTUAL}
        self._mesh_bounds = next(
            (item.tls for item in listeners if item.tls.mode is TlsMode.ISTIO_MUTUAL), ListenerTls()
        )
        for listener in listeners:
            if listener.name in self._istio_mutual:
                continue
            loaded = _static_contexts(listener)
            if loaded:
                self.by_listener[listener.name] = loaded
                for credential, context in loaded:
                    self._served_uris[context] = _uri_names(credential.cert_pem)
                self._anchors[listener.name] = anchors_of(listener.tls.ca_pem)
                paired = _paired_context(listener) if len(loaded) == 2 else None
                if paired is not None:
                    self._paired[listener.name] = paired
                    first_uris, second_uris = (self._served_uris[c] for _, c in loaded)
                    self._served_uris[paired] = tuple(u for u in first_uris if u in second_uris)
        self.picked: weakref.WeakKeyDictionary[TlsSession, _Picked] = weakref.WeakKeyDictionary()
        """The listener each handshake's server name picked; an entry goes with its TLS session, so handshakes
        that fail after the callback leave nothing behind."""
        first = next(iter(self.by_listener), None)
        self._fallback: tuple[ssl.SSLContext, IngressListener] | None = None
        if first is not None and not self.verifies_clients:
            self._fallback = (self.by_listener[first][0][1], next(i for i in listeners if i.name == first))
        self.default: ssl.SSLContext | None = None
        if self.by_listener or self._istio_mutual:
            self.default = edge_dispatch_context(verify_clients=self.verifies_clients)
            try:
                _bound(self.default, _widest(listeners))
            except CertificateError as exc:
                log.warning("port %d: listeners' cipher suites not applied: %s", port, exc)
            self.default.sni_callback = self._sni

    def _mesh_context_now(self) -> tuple[ssl.SSLContext, frozenset[bytes]] | None:
        cert = self._mesh()
        if cert is None:
            return None
        cached = self._mesh_context
        if cached is None or cached[0] is not cert:
            try:
                context = edge_mesh_context(cert)
                _bound(context, self._mesh_bounds)
                cached = (cert, context, anchors_of(cert.roots_pem))
            except CertificateError as exc:
                log.warning("port %d: the mesh certificate cannot be served: %s", self.port, exc)
                return None
            self._mesh_context = cached
        return cached[1], cached[2]

    def _sni(self, tls: TlsSession, server_name: str | None, _: ssl.SSLContext) -> int | None:
        listener = self.router.pick_listener(self.port, server_name or "")
        if listener is not None and listener.name in self._istio_mutual:
            found = self._mesh_context_now()
            if found is None:
                return ssl.ALERT_DESCRIPTION_INTERNAL_ERROR
            tls.context = found[0]
            served = self._mesh_context[0].identity if self._mesh_context is not None else None
            mesh_by: tuple[str, ...] = (str(served),) if served is not None else ()
            self.picked[tls] = _Picked(listener, found[1], (server_name or "").lower().rstrip("."), mesh_by)
            return None
        if listener is None or listener.name not in self.by_listener:
            if server_name or self._fallback is None:
                return ssl.ALERT_DESCRIPTION_UNRECOGNIZED_NAME
            tls.context = self._fallback[0]
            return None
        choices = self.by_listener[listener.name]
        covering = [c for cred, c in choices if server_name and cred.covers(server_name)]
        paired = self._paired.get(listener.name)
        if paired is not None and len(covering) != 1:  # both cover the name, or neither: the client's algorithms pick
            tls.context = paired
        else:
            tls.context = covering[0] if covering else choices[0][1]
        by = self._served_uris.get(tls.context, ())
        name = (server_name or "").lower().rstrip(".")
        self.picked[tls] = _Picked(listener, self._anchors[listener.name], name, by)
        return None

    def admit(self, tls: TlsSession) -> Admitted | ClientRefused:
        """Rule 4, once the handshake is done."""
        picked = self.picked.pop(tls, None)
        if picked is None:
            if self.verifies_clients or self._fallback is None:
                return ClientRefused("no listener was picked at the handshake")
            outside = _outside(self._fallback[1].tls, tls)
            return ClientRefused(outside) if outside else Admitted("", ClientAccepted())
        outside = _outside(picked.listener.tls, tls)
        if outside is not None:
            return ClientRefused(outside)
        verdict = judge_client(
            picked.listener.tls,
            tls.getpeercert(binary_form=True),
            read_verified_chain(tls) if picked.listener.tls.mode.verifies_clients else None,
            anchors=picked.anchors,
            trust_domain=self._trust_domain,
        )
        if isinstance(verdict, ClientRefused):
            return verdict
        der = tls.getpeercert(binary_form=True)
        mutual = picked.listener.tls.mode.verifies_clients and der is not None
        described = describe_client_certificate(der, picked.by) if mutual and der is not None else None
        return Admitted(picked.listener.name, verdict, mutual, picked.server_name, described)
