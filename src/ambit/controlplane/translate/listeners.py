"""An ingress Gateway's listeners judged: which are served, with which certificates, and why not (pure).

Theory of operation: :func:`judge_listeners` reads ``spec.listeners`` of a Gateway of class ``istio`` and, with a
lookup of Secrets, returns one :class:`JudgedListener` per listener with a string name. The gateway's status
(:mod:`ambit.controlplane.gateway.ingress_status`) reports the judgements; the translation of the gateway's
configuration (:mod:`ambit.controlplane.translate.ingress`) serves only the listeners that are ``ready``, with the
credentials found here. Both read the same judgement, so a listener is served exactly when its status says
Programmed.

Rules:

1. Protocols served: ``HTTP``; ``HTTPS`` with ``tls.mode`` ``Terminate`` (the default); ``TLS`` with ``tls.mode``
   ``Passthrough`` (no certificates: the backend terminates); ``TCP``. Any other protocol or TLS mode is not
   accepted (``UnsupportedProtocol``; a TLS listener in mode ``Terminate`` ``UnsupportedValue``, as Gateway API's
   conformance suite expects of an implementation without TLSRoute termination). The port is an integer 1-65535.
2. An HTTPS listener needs at least one ``certificateRef``. Each is a core ``Secret`` (group ``""``, kind
   ``Secret``, the defaults) in the Gateway's namespace (a cross-namespace reference is ``RefNotPermitted``:
   ReferenceGrants are not read for certificates), which exists and holds a valid ``kubernetes.io/tls``
   credential (:func:`ambit.tls.credentials.read_tls_secret`); the first that is not is ``InvalidCertificateRef``
   with what is wrong, and the listener is not ready.
3. Listeners on one port must agree on the protocol (else every one of them is ``Conflicted``
   ``ProtocolConflict``; TLS listeners of both modes on one port, a mix not supported, are moreover not
   ``Accepted``, reason ``ProtocolConflict``, as Gateway API's conformance suite expects), and must differ in
   hostname (a later one with the same hostname is ``Conflicted`` ``HostnameConflict``). A conflicted listener is
   not ready.
4. ``hostname`` is kept lower-case; absent or empty means any host.
5. Client certificates (Gateway API's frontend TLS validation, as istiod converts it): the Gateway's
   ``spec.tls.frontend`` gives the validation of each HTTPS listener (its ``perPort`` entry for the listener's
   port, else its ``default``). With ``validation.caCertificateRefs`` (exactly one: a core ``ConfigMap`` whose
   ``ca.crt``, or a ``Secret`` whose ``ca.crt``/``cacert``, holds PEM certificates, in the Gateway's namespace)
   the listener is ``MUTUAL`` (``mode: AllowValidOnly``, the default) or ``OPTIONAL_MUTUAL``
   (``mode: AllowInsecureFallback``); the listener's ``tls.options`` ``gateway.istio.io/tls-terminate-mode``
   ``MUTUAL`` or ``OPTIONAL_MUTUAL`` overrides the mode. ``AllowInsecureFallback`` is served as
   ``OPTIONAL_MUTUAL`` that still verifies a certificate when one is presented: Python's ``ssl`` cannot ask for a
   certificate without verifying it, so a client presenting an invalid certificate is refused where istiod's
   Envoy (``insecureSkipVerify``) would let it through; clients without one are served. A reference that is not
   one (more than one, another kind, another namespace, not found, no PEM CA) leaves the listener not
   ``Accepted`` (``NoValidCACertificate``) with ``ResolvedRefs`` False (``InvalidCACertificateRef``,
   ``InvalidCACertificateKind`` or ``RefNotPermitted``), as istiod reports it.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
from typing import Any

from ambit.model.ingress import ListenerTls, TlsMode
from ambit.tls.credentials import (
    CredentialProblem,
    TlsCredential,
    read_ca_bundle,
    read_ca_config_map,
    read_tls_secret,
)

__all__ = ["INGRESS_CLASS", "JudgedListener", "SecretLookup", "deployed_name", "is_ingress", "judge_listeners"]

INGRESS_CLASS = "istio"
"""The GatewayClass of ingress gateways."""

SecretLookup = Callable[[str, str], Mapping[str, Any] | None]
"""``(namespace, name)`` → the Secret, or None."""
SERVED_PROTOCOLS = ("HTTP", "HTTPS", "TLS", "TCP")


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
    """An HTTPS listener's client verification (rule 5)."""

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


def _certificates(
    listener: Mapping[str, Any], namespace: str, find_secret: SecretLookup
) -> tuple[tuple[TlsCredential, ...], tuple[bool, str, str]]:
    tls = listener.get("tls")
    refs = tls.get("certificateRefs") if isinstance(tls, Mapping) else None
    if not isinstance(refs, list) or not refs:
        return (), (False, "InvalidCertificateRef", "an HTTPS listener needs a certificateRef")
    found: list[TlsCredential] = []
    for i, ref in enumerate(refs):
        if not isinstance(ref, Mapping):
            return (), (False, "InvalidCertificateRef", f"certificateRefs[{i}] is not an object")
        group, kind, name = _text(ref.get("group")), _text(ref.get("kind")) or "Secret", _text(ref.get("name"))
        ref_ns = _text(ref.get("namespace")) or namespace
        if group not in ("", "core") or kind != "Secret":
            return (), (False, "InvalidCertificateRef", f"certificateRefs[{i}]: only core Secrets are supported")
        if ref_ns != namespace:
            message = f"certificateRefs[{i}]: Secret {ref_ns}/{name} is in another namespace"
            return (), (False, "RefNotPermitted", message)
        secret = find_secret(ref_ns, name) if name else None
        if secret is None:
            return (), (False, "InvalidCertificateRef", f"Secret {ref_ns}/{name} not found")
        credential = read_tls_secret(secret)
        if isinstance(credential, CredentialProblem):
            return (), (False, "InvalidCertificateRef", f"Secret {ref_ns}/{name}: {credential.message}")
        found.append(credential)
    return tuple(found), (True, "ResolvedRefs", "No errors found")


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
    if group not in ("", "core") or kind not in ("ConfigMap", "Secret"):
        return (
            "InvalidCACertificateKind",
            f"invalid CA certificate reference {written}, only secret and configmap are allowed",
        )
    if ref_ns != namespace:
        return "RefNotPermitted", f"caCertificateRef {ref_ns}/{name} is in another namespace"
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
    if protocol == "TLS" and mode != "Passthrough":
        message = f'TLS mode "{mode or "Terminate"}" is not supported on TLS: only Passthrough'
        return dataclasses.replace(judged, accepted=(False, "UnsupportedValue", message))
    if protocol == "HTTPS":
        if mode not in ("", "Terminate"):
            message = f'TLS mode "{mode}" is not supported on HTTPS: only Terminate'
            return JudgedListener(name, port, protocol, hostname, accepted=(False, "UnsupportedProtocol", message))
        credentials, resolved = _certificates(listener, namespace, find_secret)
        judged = JudgedListener(name, port, protocol, hostname, credentials, resolved=resolved)
        if validation is None or not resolved[0]:
            return judged
        client = _client_validation(listener, validation, namespace, find_secret, find_config_map)
        if isinstance(client, ListenerTls):
            return dataclasses.replace(judged, client_tls=client)
        reason, message = client
        return dataclasses.replace(
            judged, accepted=(False, "NoValidCACertificate", message), resolved=(False, reason, message)
        )
    return judged


def _no_config_maps(namespace: str, name: str) -> Mapping[str, Any] | None:
    return None


def _validation_of(spec: Any, listener: Mapping[str, Any]) -> Mapping[str, Any] | None:
    port = listener.get("port")
    if not isinstance(spec, Mapping) or not isinstance(port, int):
        return None
    return frontend_validation(spec, port)


def judge_listeners(
    gateway: Mapping[str, Any], find_secret: SecretLookup, find_config_map: SecretLookup = _no_config_maps
) -> tuple[JudgedListener, ...]:
    """Rules 1-5, in the listeners' order."""
    meta = gateway.get("metadata")
    namespace = _text(meta.get("namespace")) if isinstance(meta, Mapping) else ""
    spec = gateway.get("spec")
    raw = spec.get("listeners") if isinstance(spec, Mapping) else None
    judged = [
        j
        for item in (raw if isinstance(raw, list) else ())
        if isinstance(item, Mapping)
        and (j := _judge(item, namespace, find_secret, find_config_map, _validation_of(spec, item))) is not None
    ]
    protocols: dict[int, set[str]] = {}
    modes: dict[int, set[str]] = {}
    for item in judged:
        protocols.setdefault(item.port, set()).add(item.protocol)
        if item.tls_mode:
            modes.setdefault(item.port, set()).add(item.tls_mode)
    seen: set[tuple[int, str]] = set()
    out: list[JudgedListener] = []
    for item in judged:
        if item.tls_mode and len(modes[item.port]) > 1:
            message = f"port {item.port} has TLS listeners in both Terminate and Passthrough mode"
            conflict = (True, "ProtocolConflict", message)
            out.append(dataclasses.replace(item, accepted=(False, "ProtocolConflict", message), conflicted=conflict))
        elif len(protocols[item.port]) > 1:
            message = f"port {item.port} is used by listeners of different protocols"
            out.append(dataclasses.replace(item, conflicted=(True, "ProtocolConflict", message)))
        elif (item.port, item.hostname) in seen:
            message = f"another listener on port {item.port} has this hostname"
            out.append(dataclasses.replace(item, conflicted=(True, "HostnameConflict", message)))
        else:
            out.append(item)
        seen.add((item.port, item.hostname))
    return tuple(out)
