"""An ingress Gateway's listeners judged: which are served, with which certificates, and why not (pure).

Theory of operation: :func:`judge_listeners` reads ``spec.listeners`` of a Gateway of class ``istio`` and, with a
lookup of Secrets, returns one :class:`JudgedListener` per listener with a string name. The gateway's status
(:mod:`ambit.controlplane.gateway.ingress_status`) reports the judgements; the translation of the gateway's
configuration (:mod:`ambit.controlplane.translate.ingress`) serves only the listeners that are ``ready``, with the
credentials found here. Both read the same judgement, so a listener is served exactly when its status says
Programmed.

Rules:

1. Protocols served: ``HTTP``; ``HTTPS`` with ``tls.mode`` ``Terminate`` (the default); ``TLS`` with ``tls.mode``
   ``Terminate`` (the default: the gateway terminates TLS, as on HTTPS, then relays the decrypted stream by the
   listener's TLSRoutes and TCPRoutes, istiod's TLS server in mode ``SIMPLE``) or ``Passthrough`` (no
   certificates: the backend terminates); ``TCP``. Any other protocol is ``UnsupportedProtocol`` (an HTTPS
   listener in another mode too), a TLS listener in another mode ``UnsupportedValue``. The port is an integer
   1-65535.
2. A listener that terminates TLS (HTTPS, TLS ``Terminate``) needs one or two ``certificateRefs``: more than two is
   ``InvalidCertificateRef`` "TLS mode can only support up to 2 server certificates", as istiod writes it. Each
   reference is judged on its own, as istiod judges it: one to another namespace is ``RefNotPermitted`` unless a
   ReferenceGrant there lets a ``Gateway`` of the Gateway's namespace refer to that ``Secret`` (all of them or by
   name; :mod:`ambit.controlplane.translate.reference_grants`), decided before the Secret is looked up so the
   status never tells whether it exists; then it must be a core ``Secret`` (group ``""``, kind ``Secret``, the
   defaults) that exists and holds a valid ``kubernetes.io/tls`` credential
   (:func:`ambit.tls.credentials.read_tls_secret`), else ``InvalidCertificateRef`` with istiod's message. The
   listener serves the references that pass; when none does it is not ready, with ``ResolvedRefs`` False: the
   first problem's reason and every problem's message joined by ``; ``. With two, the gateway serves both (SNI
   and the client's signature algorithms choose: :mod:`ambit.waypoint.ingress_tls`).
3. Conflicts, as istiod computes them for class ``istio`` before it judges anything else: the listeners are taken
   in ``spec`` order, each compared with the listeners taken before it that won (a conflicted listener frees its
   slot). Two listeners on different ports never conflict. On one port: TCP or UDP beside anything HTTP-like
   (``HTTP``, ``HTTPS``, ``TLS``) conflicts, and two TCP/UDP listeners conflict whatever their protocols; two
   HTTP-like listeners conflict exactly when their hostnames are the same (none counts as ``*``), whatever their
   protocols (``HTTPS`` ``a.com`` beside ``TLS`` ``b.com``, or ``HTTP`` beside ``HTTPS`` with other hostnames,
   are distinct); listeners of other protocols conflict when their protocols are the same. The loser's reason is
   ``ProtocolConflict`` when both are TCP/UDP or their protocols differ, else ``HostnameConflict``. A conflicted
   listener is not judged further (no reference is looked up) and not served: ``Accepted`` False, ``Programmed``
   False and ``Conflicted`` True, all with that reason and istiod's message "Listener has a conflict with another
   listener attached to the same Gateway", and no ``ResolvedRefs``. TLS listeners of both modes may share a port,
   as istiod lets them: the ClientHello's server name picks the listener, and with it whether the gateway
   terminates or passes the connection through (:mod:`ambit.waypoint.ingress`). A Gateway that names a port
   both in plain ``HTTP`` listeners and in TLS-carrying ones (``HTTPS``, ``TLS``) keeps istiod's status; which of
   them are served is :mod:`ambit.controlplane.translate.ingress` rule 8.
4. ``hostname`` is kept lower-case; absent or empty means any host.
5. Client certificates (Gateway API's frontend TLS validation, as istiod converts it): the Gateway's
   ``spec.tls.frontend`` gives the validation of each terminating listener (its ``perPort`` entry for the listener's
   port, else its ``default``). With ``validation.caCertificateRefs`` (exactly one: a core ``ConfigMap`` whose
   ``ca.crt``, or a ``Secret`` whose ``ca.crt``/``cacert``, holds PEM certificates, in the Gateway's namespace)
   the listener is ``MUTUAL`` (``mode: AllowValidOnly``, the default) or ``OPTIONAL_MUTUAL``
   (``mode: AllowInsecureFallback``); the listener's ``tls.options`` ``gateway.istio.io/tls-terminate-mode``
   ``MUTUAL`` or ``OPTIONAL_MUTUAL`` overrides the mode. ``AllowInsecureFallback`` is served as
   ``OPTIONAL_MUTUAL`` that still verifies a certificate when one is presented: Python's ``ssl`` cannot ask for a
   certificate without verifying it, so a client presenting an invalid certificate is refused where istiod's
   Envoy (``insecureSkipVerify``) would let it through; clients without one are served. A reference that is not
   one (more than one, another kind, not found, no PEM CA, another namespace without a ReferenceGrant as in rule
   2) leaves the listener not ``Accepted`` (``NoValidCACertificate``) with ``ResolvedRefs`` False
   (``InvalidCACertificateRef``, ``InvalidCACertificateKind`` or ``RefNotPermitted``), as istiod reports it. A
   TLS ``Terminate`` listener takes client validation as an HTTPS one does. The option ``ISTIO_MUTUAL`` makes the
   listener serve the gateway's mesh certificate to mesh clients, as istiod's does, with no ``certificateRefs``
   read (``ISTIO_SIMPLE`` is not served: it is taken as ``SIMPLE``, needing ``certificateRefs``).
6. The Gateway itself has ``ResolvedRefs`` True ("All references resolved") unless its
   ``spec.tls.backend.clientCertificateRef`` (the certificate it would present to backends) does not resolve:
   ``InvalidClientCertificateRef`` (not a core Secret, not found, not a valid ``kubernetes.io/tls`` credential)
   or ``RefNotPermitted`` (another namespace without a ReferenceGrant), with istiod's messages. The grant is
   checked first, as for ``certificateRefs``, so the status never tells whether a Secret of another namespace
   exists (istiod looks the Secret up first here). Listener problems stay on the listeners, as istiod keeps them.
   A listener whose ``certificateRefs`` are all refused for want of a ReferenceGrant is not ``Accepted``
   (``NoValidCACertificate``, the refusal's message), as istiod's ``buildListener`` reports it.
7. A ``clientCertificateRef`` that resolves (rule 6) is what the gateway presents when it originates TLS to a
   backend by a BackendTLSPolicy (:func:`resolve_backend_client_certificate`;
   :func:`ambit.controlplane.translate.backendtls.with_gateway_client_certificate`); one that does not resolves to
   nothing, and the gateway presents no certificate.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
from typing import Any

from ambit.controlplane.translate.reference_grants import NO_GRANTS, ReferenceGrants
from ambit.model.ingress import ListenerTls, TlsMode
from ambit.tls.credentials import (
    CredentialProblem,
    TlsCredential,
    read_ca_bundle,
    read_ca_config_map,
    read_tls_secret,
)

__all__ = [
    "CONFLICT_MESSAGE",
    "GATEWAY_ORIGIN",
    "INGRESS_CLASS",
    "JudgedListener",
    "Origin",
    "SecretLookup",
    "backend_client_certificate",
    "conflict_reason",
    "deployed_name",
    "is_ingress",
    "judge_items",
    "judge_listeners",
    "listener_conflicts",
    "listener_items",
    "listeners_distinct",
    "no_config_maps",
    "resolve_backend_client_certificate",
]

INGRESS_CLASS = "istio"
"""The GatewayClass of ingress gateways."""

SecretLookup = Callable[[str, str], Mapping[str, Any] | None]
"""``(namespace, name)`` → the Secret, or None."""
Origin = tuple[str, str]
"""(group, kind) of the object that holds a listener: what a ReferenceGrant's ``from`` must name."""
SERVED_PROTOCOLS = ("HTTP", "HTTPS", "TLS", "TCP")
GATEWAY_GROUP = "gateway.networking.k8s.io"
GATEWAY_ORIGIN: Origin = (GATEWAY_GROUP, "Gateway")


@dataclass(frozen=True, slots=True)
class JudgedListener:
    name: str
    port: int
    protocol: str
    hostname: str = ""
    credentials: tuple[TlsCredential, ...] = ()
    accepted: tuple[bool, str, str] = (True, "Accepted", "No errors found")
    """(status, reason, message) of the listener's ``Accepted`` condition."""
    resolved: tuple[bool, str, str] = (True, "ResolvedRefs", "No errors found")
    conflicted: tuple[bool, str, str] = (False, "NoConflicts", "No errors found")
    tls_mode: str = ""
    """A TLS listener's ``tls.mode`` as written (empty: the default, Terminate)."""
    client_tls: ListenerTls = field(default_factory=ListenerTls)
    """A terminating listener's client verification (rule 5)."""
    bad_tls: bool = False
    """Not programmed for want of TLS settings (a ListenerSet's HTTPS listener without ``tls``): istiod's
    "Bad TLS configuration" though its references resolved."""

    @property
    def terminates_tls(self) -> bool:
        """HTTPS, or TLS in mode ``Terminate``: the gateway holds the certificates."""
        return self.protocol == "HTTPS" or self.tls_mode == "Terminate"

    @property
    def ready(self) -> bool:
        return self.accepted[0] and self.resolved[0] and not self.conflicted[0]


def _text(value: Any) -> str:
    return value if isinstance(value, str) else ""


def is_ingress(gateway: Mapping[str, Any]) -> bool:
    spec = gateway.get("spec")
    return isinstance(spec, Mapping) and spec.get("gatewayClassName") == INGRESS_CLASS


def deployed_name(gateway: Mapping[str, Any]) -> str:
    """The name of what ``gateway`` deploys: ``<name>-istio`` for an ingress gateway (istiod's ``<name>-<class>``),
    the Gateway's own name for a waypoint; not validated."""
    meta = gateway.get("metadata")
    name = _text(meta.get("name")) if isinstance(meta, Mapping) else ""
    return f"{name}-{INGRESS_CLASS}" if is_ingress(gateway) else name


MAX_CERTIFICATES = 2
"""istiod serves at most two certificates on a listener (one RSA and one ECDSA, as Envoy pairs them)."""


def _ref_string(ref: Mapping[str, Any]) -> str:
    """A certificateRef as istiod writes it in messages: ``group/kind/name.namespace``, as written."""
    return f"{_text(ref.get('group'))}/{_text(ref.get('kind'))}/{_text(ref.get('name'))}.{_text(ref.get('namespace'))}"


def _certificate(
    ref: Mapping[str, Any], namespace: str, find_secret: SecretLookup, grants: ReferenceGrants, origin: Origin
) -> TlsCredential | tuple[str, str]:
    """Rule 2 for one certificateRef: its credential, or (reason, message)."""
    name, ref_ns, permitted = _secret_ref(ref, namespace, grants, origin)
    if not permitted:
        # Before anything is looked up: without a grant, nothing says whether the Secret exists.
        message = (
            f'certificateRef {name}/{ref_ns} not accessible to a Gateway in namespace "{namespace}"'
            " (missing a ReferenceGrant?)"
        )
        return "RefNotPermitted", message
    written = _ref_string(ref)
    if _text(ref.get("group")) not in ("", "core") or (_text(ref.get("kind")) or "Secret") != "Secret":
        return "InvalidCertificateRef", f"invalid certificate reference {written}, only secret is allowed"
    secret = find_secret(ref_ns, name) if name else None
    if secret is None:
        return "InvalidCertificateRef", f"invalid certificate reference {written}, secret {ref_ns}/{name} not found"
    credential = read_tls_secret(secret)
    if isinstance(credential, CredentialProblem):
        return "InvalidCertificateRef", f"invalid certificate reference {written}, {credential.message}"
    return credential


def _secret_ref(
    ref: Mapping[str, Any], namespace: str, grants: ReferenceGrants, origin: Origin
) -> tuple[str, str, bool]:
    """A Secret reference's name and namespace, and whether an object of kind ``origin`` in ``namespace`` may
    read it: always in its own namespace, elsewhere only under a ReferenceGrant."""
    name = _text(ref.get("name"))
    ref_ns = _text(ref.get("namespace")) or namespace
    permitted = ref_ns == namespace or grants.permits(
        from_group=origin[0],
        from_kind=origin[1],
        from_namespace=namespace,
        to_group=_text(ref.get("group")),
        to_kind=_text(ref.get("kind")) or "Secret",
        to_namespace=ref_ns,
        to_name=name,
    )
    return name, ref_ns, permitted


def _certificates(
    listener: Mapping[str, Any], namespace: str, find_secret: SecretLookup, grants: ReferenceGrants, origin: Origin
) -> tuple[tuple[TlsCredential, ...], tuple[bool, str, str]]:
    """Rule 2: the credentials served, and the listener's ``ResolvedRefs``."""
    tls = listener.get("tls")
    refs = tls.get("certificateRefs") if isinstance(tls, Mapping) else None
    if not isinstance(refs, list) or not refs:
        return (), (False, "InvalidCertificateRef", "a listener terminating TLS needs a certificateRef")
    if len(refs) > MAX_CERTIFICATES:
        return (), (False, "InvalidCertificateRef", "TLS mode can only support up to 2 server certificates")
    found: list[TlsCredential] = []
    problems: list[tuple[str, str]] = []
    for ref in refs:
        judged = (
            _certificate(ref, namespace, find_secret, grants, origin)
            if isinstance(ref, Mapping)
            else ("InvalidCertificateRef", "invalid certificate reference, not an object")
        )
        if isinstance(judged, TlsCredential):
            found.append(judged)
        else:
            problems.append(judged)
    if not found:
        return (), (False, problems[0][0], "; ".join(message for _, message in problems))
    return tuple(found), (True, "ResolvedRefs", "No errors found")


def backend_client_certificate(
    gateway: Mapping[str, Any], find_secret: SecretLookup, grants: ReferenceGrants = NO_GRANTS
) -> tuple[bool, str, str]:
    """Rule 6: the Gateway's own ``ResolvedRefs`` (status, reason, message), from ``spec.tls.backend``'s
    ``clientCertificateRef``."""
    found = _backend_client_credential(gateway, find_secret, grants)
    return (True, "ResolvedRefs", "All references resolved") if isinstance(found, TlsCredential | None) else found


def resolve_backend_client_certificate(
    gateway: Mapping[str, Any], find_secret: SecretLookup, grants: ReferenceGrants = NO_GRANTS
) -> TlsCredential | None:
    """Rule 7: the certificate and key the gateway presents to backends, when rule 6 resolves them, else None."""
    found = _backend_client_credential(gateway, find_secret, grants)
    return found if isinstance(found, TlsCredential) else None


def _backend_client_credential(
    gateway: Mapping[str, Any], find_secret: SecretLookup, grants: ReferenceGrants
) -> TlsCredential | tuple[bool, str, str] | None:
    """Rules 6-7: the credential, None without a reference, or the ``ResolvedRefs`` problem."""
    tls = _mapping_of(_mapping_of(gateway.get("spec")).get("tls"))
    ref = _mapping_of(tls.get("backend")).get("clientCertificateRef")
    if not isinstance(ref, Mapping):
        return None
    namespace = _text(_mapping_of(gateway.get("metadata")).get("namespace"))
    name, ref_ns, permitted = _secret_ref(ref, namespace, grants, GATEWAY_ORIGIN)
    written = _ref_string(ref)
    if not permitted:
        message = (
            f'clientCertificateRef {name}/{ref_ns} not accessible to a Gateway in namespace "{namespace}"'
            " (missing a ReferenceGrant?)"
        )
        return False, "RefNotPermitted", message
    if _text(ref.get("group")) not in ("", "core") or (_text(ref.get("kind")) or "Secret") != "Secret":
        return False, "InvalidClientCertificateRef", f"invalid clientCertificateRef {written}, only secret is allowed"
    secret = find_secret(ref_ns, name) if name else None
    if secret is None:
        message = f"invalid clientCertificateRef {written}, secret {ref_ns}/{name} not found"
        return False, "InvalidClientCertificateRef", message
    credential = read_tls_secret(secret)
    if isinstance(credential, CredentialProblem):
        return False, "InvalidClientCertificateRef", f"invalid clientCertificateRef {written}, {credential.message}"
    return credential


def _mapping_of(value: Any) -> Mapping[str, Any]:
    return value if isinstance(value, Mapping) else {}


TERMINATE_MODE_OPTION = "gateway.istio.io/tls-terminate-mode"
INSECURE_FALLBACK = "AllowInsecureFallback"


def frontend_validation(gateway_spec: Mapping[str, Any], port: int) -> Mapping[str, Any] | None:
    """Rule 5: the ``validation`` of ``spec.tls.frontend`` that applies to listeners on ``port``, or None."""
    tls = gateway_spec.get("tls")
    frontend = tls.get("frontend") if isinstance(tls, Mapping) else None
    if not isinstance(frontend, Mapping):
        return None
    per_port = frontend.get("perPort")
    chosen = frontend.get("default")
    for item in per_port if isinstance(per_port, list) else ():
        if isinstance(item, Mapping) and item.get("port") == port:
            chosen = item.get("tls")
            break
    validation = chosen.get("validation") if isinstance(chosen, Mapping) else None
    return validation if isinstance(validation, Mapping) else None


def frontend_config_maps(gateway: Mapping[str, Any]) -> frozenset[tuple[str, str]]:
    """(namespace, name) of every ConfigMap the Gateway's ``spec.tls.frontend`` names: a change to one changes the
    judgement of its listeners."""
    spec = gateway.get("spec")
    meta = gateway.get("metadata")
    namespace = _text(meta.get("namespace")) if isinstance(meta, Mapping) else ""
    tls = spec.get("tls") if isinstance(spec, Mapping) else None
    frontend = tls.get("frontend") if isinstance(tls, Mapping) else None
    if not isinstance(frontend, Mapping):
        return frozenset()
    per_port = frontend.get("perPort")
    configs = [frontend.get("default")]
    configs += [p.get("tls") for p in (per_port if isinstance(per_port, list) else ()) if isinstance(p, Mapping)]
    found: set[tuple[str, str]] = set()
    for config in configs:
        validation = config.get("validation") if isinstance(config, Mapping) else None
        refs = validation.get("caCertificateRefs") if isinstance(validation, Mapping) else None
        for ref in refs if isinstance(refs, list) else ():
            if isinstance(ref, Mapping) and ref.get("kind") == "ConfigMap":
                found.add((_text(ref.get("namespace")) or namespace, _text(ref.get("name"))))
    return frozenset(found)


def _client_validation(
    listener: Mapping[str, Any],
    validation: Mapping[str, Any],
    namespace: str,
    find_secret: SecretLookup,
    find_config_map: SecretLookup,
    grants: ReferenceGrants,
    origin: Origin,
) -> ListenerTls | tuple[str, str]:
    """Rule 5: the listener's client verification, or (ResolvedRefs reason, message)."""
    refs = validation.get("caCertificateRefs")
    if not isinstance(refs, list) or not refs:
        return ListenerTls()
    if len(refs) > 1:
        return "InvalidCACertificateRef", "only one caCertificateRef is supported"
    ref = refs[0] if isinstance(refs[0], Mapping) else {}
    group, kind, name = _text(ref.get("group")), _text(ref.get("kind")), _text(ref.get("name"))
    ref_ns = _text(ref.get("namespace")) or namespace
    written = f"{group}/{kind}/{name}.{_text(ref.get('namespace'))}"
    if ref_ns != namespace and not grants.permits(
        from_group=origin[0],
        from_kind=origin[1],
        from_namespace=namespace,
        to_group=group,
        to_kind=kind,
        to_namespace=ref_ns,
        to_name=name,
    ):
        message = (
            f'caCertificateRef {ref_ns}/{name} not accessible to a Gateway in namespace "{namespace}"'
            " (missing a ReferenceGrant?)"
        )
        return "RefNotPermitted", message
    if group not in ("", "core") or kind not in ("ConfigMap", "Secret"):
        return (
            "InvalidCACertificateKind",
            f"invalid CA certificate reference {written}, only secret and configmap are allowed",
        )
    found = (find_config_map if kind == "ConfigMap" else find_secret)(ref_ns, name) if name else None
    if found is None:
        return (
            "InvalidCACertificateRef",
            f"invalid CA certificate reference {written}, {kind.lower()} {ref_ns}/{name} not found",
        )
    ca = read_ca_config_map(found) if kind == "ConfigMap" else read_ca_bundle(found)
    if isinstance(ca, CredentialProblem):
        return "InvalidCACertificateRef", f"invalid CA certificate reference {written}, {ca.message}"
    mode = TlsMode.OPTIONAL_MUTUAL if validation.get("mode") == INSECURE_FALLBACK else TlsMode.MUTUAL
    tls = listener.get("tls")
    options = tls.get("options") if isinstance(tls, Mapping) else None
    wanted = options.get(TERMINATE_MODE_OPTION) if isinstance(options, Mapping) else None
    if wanted in ("MUTUAL", "OPTIONAL_MUTUAL"):
        mode = TlsMode(wanted)
    return ListenerTls(mode, ca)


def _judge(
    listener: Mapping[str, Any],
    namespace: str,
    find_secret: SecretLookup,
    find_config_map: SecretLookup,
    validation: Mapping[str, Any] | None,
    grants: ReferenceGrants,
    origin: Origin = GATEWAY_ORIGIN,
) -> JudgedListener | None:
    name = listener.get("name")
    if not isinstance(name, str):
        return None
    port = listener.get("port")
    port = port if isinstance(port, int) and not isinstance(port, bool) and 1 <= port <= 65535 else 0
    protocol = _text(listener.get("protocol"))
    hostname = _text(listener.get("hostname")).lower()
    judged = JudgedListener(name, port, protocol, hostname)
    if protocol not in SERVED_PROTOCOLS or port == 0:
        message = f'protocol "{protocol}" is not supported: ingress listeners serve HTTP, HTTPS, TLS and TCP'
        return JudgedListener(name, port, protocol, hostname, accepted=(False, "UnsupportedProtocol", message))
    tls = listener.get("tls")
    mode = _text(tls.get("mode")) if isinstance(tls, Mapping) else ""
    if protocol == "TLS":
        judged = dataclasses.replace(judged, tls_mode=mode or "Terminate")
        if mode == "Passthrough":
            return judged
        if mode not in ("", "Terminate"):
            message = f'TLS mode "{mode}" is not supported on TLS: only Terminate and Passthrough'
            return dataclasses.replace(judged, accepted=(False, "UnsupportedValue", message))
    if protocol == "HTTPS" and mode not in ("", "Terminate"):
        message = f'TLS mode "{mode}" is not supported on HTTPS: only Terminate'
        return JudgedListener(name, port, protocol, hostname, accepted=(False, "UnsupportedProtocol", message))
    if protocol not in ("HTTPS", "TLS"):
        return judged
    options = tls.get("options") if isinstance(tls, Mapping) else None
    if isinstance(options, Mapping) and options.get(TERMINATE_MODE_OPTION) == "ISTIO_MUTUAL":
        return dataclasses.replace(judged, client_tls=ListenerTls(TlsMode.ISTIO_MUTUAL))
    if not isinstance(tls, Mapping) and origin != GATEWAY_ORIGIN:
        # istiod builds no server for it; on a ListenerSet it says so (on a Gateway, rule 2 reports it)
        message = f"protocol is {protocol} but no TLS section is defined"
        return dataclasses.replace(judged, accepted=(False, "UnsupportedProtocol", message), bad_tls=True)
    credentials, resolved = _certificates(listener, namespace, find_secret, grants, origin)
    judged = dataclasses.replace(judged, credentials=credentials, resolved=resolved)
    if not resolved[0] and resolved[1] == "RefNotPermitted":
        # istiod's buildListener: a reference not permitted leaves the listener not Accepted
        return dataclasses.replace(judged, accepted=(False, "NoValidCACertificate", resolved[2]))
    if validation is None or not resolved[0]:
        return judged
    client = _client_validation(listener, validation, namespace, find_secret, find_config_map, grants, origin)
    if isinstance(client, ListenerTls):
        return dataclasses.replace(judged, client_tls=client)
    reason, message = client
    return dataclasses.replace(
        judged, accepted=(False, "NoValidCACertificate", message), resolved=(False, reason, message)
    )


def no_config_maps(namespace: str, name: str) -> Mapping[str, Any] | None:
    return None


def _validation_of(spec: Any, listener: Mapping[str, Any]) -> Mapping[str, Any] | None:
    port = listener.get("port")
    if not isinstance(spec, Mapping) or not isinstance(port, int):
        return None
    return frontend_validation(spec, port)


def judge_listeners(
    gateway: Mapping[str, Any],
    find_secret: SecretLookup,
    find_config_map: SecretLookup = no_config_maps,
    grants: ReferenceGrants = NO_GRANTS,
) -> tuple[JudgedListener, ...]:
    """Rules 1-5, in the listeners' order."""
    items = listener_items(gateway)
    return judge_items(
        items,
        namespace=_namespace_of(gateway),
        spec=gateway.get("spec"),
        conflicts=listener_conflicts(items),
        find_secret=find_secret,
        find_config_map=find_config_map,
        grants=grants,
    )


def _namespace_of(obj: Mapping[str, Any]) -> str:
    meta = obj.get("metadata")
    return _text(meta.get("namespace")) if isinstance(meta, Mapping) else ""


def listener_items(holder: Mapping[str, Any]) -> list[Mapping[str, Any]]:
    """The listener objects of a Gateway's (or a ListenerSet's) ``spec.listeners``."""
    spec = holder.get("spec")
    raw = spec.get("listeners") if isinstance(spec, Mapping) else None
    return [item for item in (raw if isinstance(raw, list) else ()) if isinstance(item, Mapping)]


def judge_items(
    items: list[Mapping[str, Any]],
    *,
    namespace: str,
    spec: Any,
    conflicts: Mapping[int, str],
    find_secret: SecretLookup,
    find_config_map: SecretLookup = no_config_maps,
    grants: ReferenceGrants = NO_GRANTS,
    origin: Origin = GATEWAY_ORIGIN,
) -> tuple[JudgedListener, ...]:
    """Rules 1-5 for listeners held by an object of ``namespace`` and kind ``origin``; ``spec`` is the Gateway's
    (its ``tls.frontend``), ``conflicts`` rule 3's verdicts keyed by ``id`` of each item."""
    out: list[JudgedListener] = []
    for item in items:
        reason = conflicts.get(id(item))
        if reason is not None:
            if isinstance(item.get("name"), str):
                out.append(_conflicted(item, reason))
            continue
        judged = _judge(item, namespace, find_secret, find_config_map, _validation_of(spec, item), grants, origin)
        if judged is not None:
            out.append(judged)
    return tuple(out)


CONFLICT_MESSAGE = "Listener has a conflict with another listener attached to the same Gateway"
_L4 = frozenset({"TCP", "UDP"})
_HTTP_LIKE = frozenset({"HTTP", "HTTPS", "TLS"})


def _conflict_hostname(listener: Mapping[str, Any]) -> str:
    """Rule 3: the hostname compared, an absent or empty one being ``*``, as written otherwise."""
    return _text(listener.get("hostname")) or "*"


def listeners_distinct(a: Mapping[str, Any], b: Mapping[str, Any]) -> bool:
    """Rule 3: ``a`` and ``b`` may both be served by one Gateway."""
    if a.get("port") != b.get("port"):
        return True
    pa, pb = a.get("protocol"), b.get("protocol")
    if (pa in _L4 and pb in _HTTP_LIKE) or (pa in _HTTP_LIKE and pb in _L4) or (pa in _L4 and pb in _L4):
        return False
    if pa in _HTTP_LIKE and pb in _HTTP_LIKE:
        return _conflict_hostname(a) != _conflict_hostname(b)
    return bool(pa != pb)


def conflict_reason(a: Mapping[str, Any], b: Mapping[str, Any]) -> str:
    """Rule 3: the reason ``a`` loses to ``b``, an earlier listener it is not distinct from."""
    pa, pb = a.get("protocol"), b.get("protocol")
    if (pa in _L4 and pb in _L4) or pa != pb:
        return "ProtocolConflict"
    return "HostnameConflict"


def listener_conflicts(listeners: list[Mapping[str, Any]]) -> dict[int, str]:
    """Rule 3: the conflict reason of each listener that loses (keyed by ``id`` of its mapping in ``listeners``)."""
    winners: list[Mapping[str, Any]] = []
    out: dict[int, str] = {}
    for listener in listeners:
        prior = next((w for w in winners if not listeners_distinct(listener, w)), None)
        if prior is None:
            winners.append(listener)
        else:
            out[id(listener)] = conflict_reason(listener, prior)
    return out


def _conflicted(listener: Mapping[str, Any], reason: str) -> JudgedListener:
    port = listener.get("port")
    port = port if isinstance(port, int) and not isinstance(port, bool) and 1 <= port <= 65535 else 0
    tls = listener.get("tls")
    mode = _text(tls.get("mode")) if isinstance(tls, Mapping) else ""
    protocol = _text(listener.get("protocol"))
    return JudgedListener(
        _text(listener.get("name")),
        port,
        protocol,
        _text(listener.get("hostname")).lower(),
        accepted=(False, reason, CONFLICT_MESSAGE),
        conflicted=(True, reason, CONFLICT_MESSAGE),
        tls_mode=(mode or "Terminate") if protocol == "TLS" else "",
    )
