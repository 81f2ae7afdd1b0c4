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
"""

from __future__ import annotations

import dataclasses
from collections.abc import Callable, Mapping
from dataclasses import dataclass
from typing import Any

from ambit.tls.credentials import CredentialProblem, TlsCredential, read_tls_secret

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


def _judge(listener: Mapping[str, Any], namespace: str, find_secret: SecretLookup) -> JudgedListener | None:
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
        return JudgedListener(name, port, protocol, hostname, credentials, resolved=resolved)
    return judged


def judge_listeners(gateway: Mapping[str, Any], find_secret: SecretLookup) -> tuple[JudgedListener, ...]:
    """Rules 1-4, in the listeners' order."""
    meta = gateway.get("metadata")
    namespace = _text(meta.get("namespace")) if isinstance(meta, Mapping) else ""
    spec = gateway.get("spec")
    raw = spec.get("listeners") if isinstance(spec, Mapping) else None
    judged = [
        j
        for item in (raw if isinstance(raw, list) else ())
        if isinstance(item, Mapping) and (j := _judge(item, namespace, find_secret)) is not None
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
