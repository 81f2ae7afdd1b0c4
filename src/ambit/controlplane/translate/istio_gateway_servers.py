"""One server of an Istio ``Gateway`` (``networking.istio.io``) → a :class:`GatewayServer`, or the field and reason
it is not served: its protocol and TLS mode, its hosts, its certificate and client verification (istiod's
``pilot/pkg/model/gateway.go`` ``MergeGateways``, ``networking/core/gateway.go``), where its listener binds and which
servers may share a port. How servers become listeners filled with the bound VirtualServices is
:mod:`ambit.controlplane.translate.istio_gateways`'s business. Pure: a server that cannot be served is a reason,
never an exception.

Rules (numbered with :mod:`ambit.controlplane.translate.istio_gateways`'s: 1 and 2 are
:mod:`ambit.controlplane.translate.istio_gateway_pods`'s, 5 and 6 are
:mod:`~ambit.controlplane.translate.istio_gateways`'s):

3. Servers, merged over the Gateways of a group ordered by creation time, then namespace/name: ``port.number``
   1-65535; ``protocol`` (case-insensitive) ``HTTP``, ``HTTP2``, ``GRPC`` serve HTTP; ``HTTPS`` terminates TLS
   with ``tls.mode`` ``SIMPLE``, ``MUTUAL``, ``OPTIONAL_MUTUAL`` or ``ISTIO_MUTUAL`` (rule 7); ``HTTPS`` or
   ``TLS`` with mode ``PASSTHROUGH`` (the API's default) relay TLS routed by SNI; ``TCP`` relays. ``TLS`` with a
   terminating mode terminates TLS as ``HTTPS`` does (rule 7) and relays the plain bytes by the VirtualServices'
   ``tcp`` rules (``TLS_TERMINATE``, istiod's TCP server with TLS termination; Istio's validation refuses TLS
   settings on a ``TCP`` server). Other protocols and modes (``AUTO_PASSTHROUGH``) are skipped with the reason.
   TLS servers (``HTTPS`` or ``TLS``, passing through or terminating) may share a port, as istiod puts their filter
   chains side by side on one listener, told apart by SNI: a TLS server naming a host another TLS server on that
   port has already is left out whole (istiod's duplicate host check). Otherwise a port serves one kind of
   listener: the first server on a port fixes it and later servers of another kind (HTTP beside TLS, TCP beside
   anything else) are skipped.
   The port a server names is a Service port (istiod's ``resolvePorts`` with the legacy selector): when a Service
   of the gateway pods' namespace selects them and has that port, the listener binds its numeric ``targetPort``
   (the first such Service by name; ``istio-ingressgateway`` maps 80 to 8080, so the proxy needs no privilege),
   else the port itself. Rules match (``match.port``) against the server's port as written.
4. Hosts: ``namespace/host``; a host without ``/`` is ``*/host``; ``.`` is the Gateway's namespace. A VirtualService
   of namespace N sees the server hosts of namespace ``*`` or N.
7. TLS settings of an HTTPS (or terminating TLS) server, read as istiod reads the ``credentialName`` Secret in the
   gateway pods' namespace (:func:`~ambit.tls.credentials.read_istio_credential`): ``SIMPLE`` needs the
   certificate and key.
   ``MUTUAL`` and ``OPTIONAL_MUTUAL`` need them and a CA bundle (``cacert`` or ``ca.crt``) from the Secret
   ``<credentialName>-cacert`` when it exists, else from the Secret itself (istiod's ``GetCaCert``).
   ``ISTIO_MUTUAL`` takes no ``credentialName`` (the gateway serves its mesh certificate and trusts the mesh
   roots). ``subjectAltNames``,
   ``verifyCertificateSpki`` (base64 SHA-256 of the public key) and ``verifyCertificateHash`` (hex SHA-256 of the
   certificate, ``:`` allowed) restrict the clients of ``MUTUAL``, ``OPTIONAL_MUTUAL`` and ``ISTIO_MUTUAL``
   servers. ``OPTIONAL_MUTUAL`` is ``MUTUAL`` for a client that presents a certificate and serves one that
   presents none (Envoy's ``require_client_certificate: false`` with a validation context, as istiod builds it).
   ``minProtocolVersion`` / ``maxProtocolVersion`` (``TLS_AUTO``, ``TLSV1_2``, ``TLSV1_3``) bound the version and
   ``cipherSuites`` the TLS 1.2 suites of any terminating server: names outside Istio's list and duplicates are
   dropped, as istiod's ``FilterCipherSuites`` drops them (its validation only warns), and none left means the
   defaults; TLS below 1.2 is not served, so ``TLSV1_0`` and ``TLSV1_1`` are refused. A missing or bad Secret, CA,
   pin or version skips the server with the reason (the Gateway's status shows it), as for ``SIMPLE``.
"""

from __future__ import annotations

import base64
import binascii
from collections.abc import Mapping
from dataclasses import dataclass, replace
from typing import Any

from ambit.controlplane.translate.fields import mapping as _mapping
from ambit.controlplane.translate.fields import object_key as _key
from ambit.controlplane.translate.fields import text as _text
from ambit.controlplane.translate.listeners import SecretLookup
from ambit.controlplane.translate.virtualservice_values import BadField
from ambit.model.ingress import IngressCertificate, ListenerProtocol, ListenerTls, TlsMode
from ambit.tls.credentials import CredentialProblem, read_ca_bundle, read_istio_credential

__all__ = ["CIPHER_SUITES", "TLS_FAMILY", "GatewayServer", "duplicate_hosts", "read_server", "target_port"]

_HTTP_PROTOCOLS = frozenset({"HTTP", "HTTP2", "GRPC"})
Obj = Mapping[str, Any]
_NO_CLIENT_TLS = ListenerTls()


@dataclass(frozen=True, slots=True)
class GatewayServer:
    """One server of a Gateway that can be served (rule 3), with its hosts (rule 4) and TLS settings (rule 7)."""

    gateway: Obj
    gateway_key: str
    index: int
    port: int
    """The port as written (a Service port): what ``match.port`` is compared with."""
    protocol: ListenerProtocol
    hosts: tuple[tuple[str, str], ...]
    """(namespace or ``*``, host) of each of its hosts (rule 4)."""
    certificate: IngressCertificate | None = None
    tls: ListenerTls = _NO_CLIENT_TLS
    https_redirect: bool = False
    bind: int = 0
    """Where the listener binds (rule 3's target port)."""

    @property
    def field(self) -> str:
        return f"spec.servers[{self.index}]"


def _hosts(server: Obj, gateway_ns: str) -> tuple[tuple[str, str], ...]:
    out: list[tuple[str, str]] = []
    raw = server.get("hosts")
    for entry in raw if isinstance(raw, list) else ():
        if not isinstance(entry, str) or not entry:
            continue
        namespace, slash, host = entry.rpartition("/")
        if not host:
            continue
        namespace = (gateway_ns if namespace == "." else namespace) if slash else "*"
        out.append((namespace, host.lower()))
    return tuple(dict.fromkeys(out))


def read_server(
    gateway: Obj, index: int, raw: Any, pods_ns: str, find_secret: SecretLookup
) -> GatewayServer | tuple[str, str]:
    """Rule 3: one server, or (field, reason) why it is not served."""
    where = f"spec.servers[{index}]"
    server = _mapping(raw)
    port_spec = _mapping(server.get("port"))
    number = port_spec.get("number")
    if not isinstance(number, int) or isinstance(number, bool) or not 1 <= number <= 65535:
        return f"{where}.port.number", "a port number 1-65535 is required"
    protocol = _text(port_spec.get("protocol")).upper()
    tls = _mapping(server.get("tls"))
    mode = _text(tls.get("mode")).upper() or "PASSTHROUGH"
    hosts = _hosts(server, _text(_mapping(gateway.get("metadata")).get("namespace")))
    if not hosts:
        return f"{where}.hosts", "a server needs at least one host"
    key = _key(gateway)
    if protocol in _HTTP_PROTOCOLS:
        redirect = tls.get("httpsRedirect") is True
        return GatewayServer(gateway, key, index, number, ListenerProtocol.HTTP, hosts, https_redirect=redirect)
    if protocol == "TLS" and mode in _TERMINATING:
        try:
            certificate, settings = _terminating_tls(tls, TlsMode(mode), f"{where}.tls", pods_ns, find_secret)
        except BadField as bad:
            return bad.field, bad.reason
        return GatewayServer(gateway, key, index, number, ListenerProtocol.TLS_TERMINATE, hosts, certificate, settings)
    if protocol == "TCP":
        return GatewayServer(gateway, key, index, number, ListenerProtocol.TCP, hosts)
    if protocol in ("HTTPS", "TLS") and mode == "PASSTHROUGH":
        return GatewayServer(gateway, key, index, number, ListenerProtocol.TLS, hosts)
    if protocol == "HTTPS" and mode in _TERMINATING:
        try:
            certificate, settings = _terminating_tls(tls, TlsMode(mode), f"{where}.tls", pods_ns, find_secret)
        except BadField as bad:
            return bad.field, bad.reason
        return GatewayServer(gateway, key, index, number, ListenerProtocol.HTTPS, hosts, certificate, settings)
    if protocol in ("HTTPS", "TLS"):
        supported = "SIMPLE, MUTUAL, OPTIONAL_MUTUAL, ISTIO_MUTUAL or PASSTHROUGH"
        return f"{where}.tls.mode", f"TLS mode {mode} is not supported on {protocol}: {supported}"
    return f"{where}.port.protocol", f"protocol {protocol or '(none)'} is not supported: HTTP, HTTPS, GRPC, TCP, TLS"


_TERMINATING = frozenset(m.value for m in TlsMode)
TLS_FAMILY = frozenset({ListenerProtocol.TLS, ListenerProtocol.HTTPS, ListenerProtocol.TLS_TERMINATE})
"""Server kinds that may share a port, told apart by the ClientHello's server name (rule 3)."""


def _strings_of(tls: Obj, key: str, where: str) -> tuple[str, ...]:
    raw = tls.get(key)
    if raw is None:
        return ()
    if not isinstance(raw, list) or not all(isinstance(item, str) and item for item in raw):
        raise BadField(f"{where}.{key}", "expected a list of non-empty strings")
    return tuple(dict.fromkeys(raw))


def _spki_pin(text: str, where: str) -> bytes:
    """``verifyCertificateSpki``: base64 of a SHA-256 digest."""
    try:
        digest = base64.b64decode(text, validate=True)
    except (binascii.Error, ValueError):
        digest = b""
    if len(digest) != 32:
        raise BadField(where, "expected the base64 SHA-256 digest of a SubjectPublicKeyInfo (32 bytes)")
    return digest


def _hash_pin(text: str, where: str) -> bytes:
    """``verifyCertificateHash``: hex of a SHA-256 digest, optionally with ``:`` between bytes."""
    try:
        digest = bytes.fromhex(text.replace(":", ""))
    except ValueError:
        digest = b""
    if len(digest) != 32:
        raise BadField(where, "expected the hex SHA-256 digest of a certificate (64 hex digits, ':' allowed)")
    return digest


_VERSIONS = {"TLS_AUTO": 0, "TLSV1_2": 0x0303, "TLSV1_3": 0x0304}
CIPHER_SUITES = frozenset(
    {
        "ECDHE-ECDSA-AES128-GCM-SHA256",
        "ECDHE-RSA-AES128-GCM-SHA256",
        "ECDHE-ECDSA-AES256-GCM-SHA384",
        "ECDHE-RSA-AES256-GCM-SHA384",
        "ECDHE-ECDSA-CHACHA20-POLY1305",
        "ECDHE-RSA-CHACHA20-POLY1305",
        "ECDHE-ECDSA-AES128-SHA",
        "ECDHE-RSA-AES128-SHA",
        "ECDHE-ECDSA-AES256-SHA",
        "ECDHE-RSA-AES256-SHA",
        "AES128-GCM-SHA256",
        "AES256-GCM-SHA384",
        "AES128-SHA",
        "AES256-SHA",
        "DES-CBC3-SHA",
    }
)
"""The TLS 1.2 cipher suites a Gateway server may name (Istio's ``ValidCipherSuites``, OpenSSL spells them alike)."""


def _version(tls: Obj, key: str, where: str) -> int:
    raw = tls.get(key)
    if raw is None:
        return 0
    text = raw.upper() if isinstance(raw, str) else ""
    if text in ("TLSV1_0", "TLSV1_1"):
        raise BadField(f"{where}.{key}", f"{text} is not served: TLS below 1.2 is refused (TLS_AUTO, TLSV1_2, TLSV1_3)")
    if text not in _VERSIONS:
        raise BadField(f"{where}.{key}", f"expected TLS_AUTO, TLSV1_2 or TLSV1_3, got {raw!r}")
    return _VERSIONS[text]


def _terminating_tls(
    tls: Obj, mode: TlsMode, where: str, pods_ns: str, find_secret: SecretLookup
) -> tuple[IngressCertificate | None, ListenerTls]:
    """Rule 7: the certificate (None for ISTIO_MUTUAL) and client verification of an HTTPS server;
    :class:`BadField` when it cannot be served."""
    name = _text(tls.get("credentialName"))
    sans = _strings_of(tls, "subjectAltNames", where)
    spki = tuple(
        _spki_pin(p, f"{where}.verifyCertificateSpki[{i}]")
        for i, p in enumerate(_strings_of(tls, "verifyCertificateSpki", where))
    )
    hashes = tuple(
        _hash_pin(p, f"{where}.verifyCertificateHash[{i}]")
        for i, p in enumerate(_strings_of(tls, "verifyCertificateHash", where))
    )
    minimum, maximum = _version(tls, "minProtocolVersion", where), _version(tls, "maxProtocolVersion", where)
    if minimum and maximum and minimum > maximum:
        raise BadField(f"{where}.minProtocolVersion", "the minimum is above maxProtocolVersion")
    # istiod's FilterCipherSuites: a name outside its list is dropped (validation only warns), as are duplicates
    suites = tuple(dict.fromkeys(s for s in _strings_of(tls, "cipherSuites", where) if s in CIPHER_SUITES))
    bounds = ListenerTls(min_version=minimum, max_version=maximum, cipher_suites=suites)
    named = f"{where}.credentialName"
    if mode is TlsMode.ISTIO_MUTUAL:
        if name:
            raise BadField(named, "ISTIO_MUTUAL uses the gateway's mesh certificate: no credentialName")
        return None, replace(
            bounds, mode=TlsMode.ISTIO_MUTUAL, subject_alt_names=sans, spki_sha256=spki, cert_sha256=hashes
        )
    if not name:
        raise BadField(named, f"{mode.value} TLS needs a credentialName (a Secret with the certificate)")
    secret = find_secret(pods_ns, name)
    if secret is None:
        raise BadField(named, f"Secret {pods_ns}/{name} not found (in the gateway's namespace)")
    credential = read_istio_credential(secret)
    if isinstance(credential, CredentialProblem):
        raise BadField(named, f"Secret {pods_ns}/{name}: {credential.message}")
    certificate = IngressCertificate(credential.cert_pem, credential.key_pem)
    if mode is TlsMode.SIMPLE:
        return certificate, bounds
    ca_name = f"{name}-cacert"
    ca_secret = find_secret(pods_ns, ca_name)
    if ca_secret is None:
        ca_name, ca_secret = name, secret
    ca = read_ca_bundle(ca_secret)
    if isinstance(ca, CredentialProblem):
        raise BadField(named, f"{mode.value} needs a CA: Secret {pods_ns}/{ca_name}: {ca.message}")
    return certificate, replace(
        bounds, mode=mode, ca_pem=ca, subject_alt_names=sans, spki_sha256=spki, cert_sha256=hashes
    )


def target_port(port: int, services: list[Obj]) -> int:
    """Rule 3: the numeric ``targetPort`` of the first selecting Service's ``port``, else ``port``."""
    for svc in services:
        ports = _mapping(svc.get("spec")).get("ports")
        for item in ports if isinstance(ports, list) else ():
            entry = _mapping(item)
            if entry.get("port") != port:
                continue
            target = entry.get("targetPort", port)
            valid = isinstance(target, int) and not isinstance(target, bool) and 1 <= target <= 65535
            return target if valid else port
    return port


def duplicate_hosts(server: GatewayServer, on_port: list[GatewayServer]) -> list[str]:
    """Rule 3: the hosts of TLS ``server`` another TLS server on its port has already (istiod's ``CheckDuplicates``:
    one SNI, one filter chain)."""
    if server.protocol not in TLS_FAMILY:
        return []
    known = {host for other in on_port if other.protocol in TLS_FAMILY for _, host in other.hosts}
    return sorted({host for _, host in server.hosts if host in known})
