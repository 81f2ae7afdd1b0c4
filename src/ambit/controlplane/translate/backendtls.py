"""Gateway API ``BackendTLSPolicy`` → the DestinationRules istiod generates from it (TLS origination to a backend).

Theory of operation: istiod does not apply a BackendTLSPolicy itself; it turns the policies into DestinationRule
objects (``pilot/pkg/config/kube/gateway/backend_policies.go``) that then take part in the DestinationRule lookup
like any other. :func:`generated_destination_rules` does the same, as plain DestinationRule objects, and
:func:`config_map_credential` answers the ``credentialName`` they carry for a CA held in a ConfigMap. Pure: no I/O.

Rules:

1. Each ``spec.targetRefs`` entry names, in the policy's namespace, a Service (group ``""`` or ``core``) or a
   ServiceEntry (group ``networking.istio.io``); anything else, or a target that does not exist, is skipped with
   a reason. Its hosts: a Service's ``<name>.<namespace>.svc.<domain>``, a ServiceEntry's ``spec.hosts``.
2. ``sectionName`` names a port of the target (by its ``name``): the TLS settings are port-level for that port's
   number; a name the target does not have skips that target. Without it they apply to the whole host.
3. The TLS settings: mode ``SIMPLE``; ``sni`` is ``validation.hostname``; ``subjectAltNames`` are the
   ``validation.subjectAltNames`` of type Hostname or URI (when there are none, the waypoint checks the SNI name);
   the trust anchors are the system's with ``wellKnownCACertificates: System``, else the first of
   ``caCertificateRefs`` (a ConfigMap of the policy's namespace whose ``ca.crt`` holds PEM certificates), carried
   as ``credentialName: configmap://<namespace>/<name>`` (istiod's form). A ConfigMap that is missing or holds no
   certificate is noted: the waypoint then has no trust anchors for it and refuses to connect (fail closed).
4. Two policies for one target and section: the older (creation time, then name) wins; the other is skipped as
   ``Conflicted``. Policies of one target and host are merged into one DestinationRule, oldest first: the first
   port-level setting for a port and the first whole-host setting win.
5. The generated rule lives in the target's namespace, named ``<target>~gateway`` (a ServiceEntry's:
   ``<target>~<host with dots as dashes>~gateway``), with no creation time, so that istiod's ordering (oldest
   first, generated rules having none) puts it ahead of user rules of the same namespace and host: its traffic
   policy is the one kept when they merge.
6. A policy annotated ``istio.io/ignore-policy-attachment: "true"`` is left out.
"""

from __future__ import annotations

import base64
from collections.abc import Iterable, Mapping
from dataclasses import dataclass
from typing import Any

from ambit.controlplane.translate.skips import ObjectKind, Skipped, skipped

__all__ = [
    "BACKEND_TLS_POLICY",
    "CONFIG_MAP_CREDENTIAL",
    "config_map_credential",
    "generated_destination_rules",
]

Obj = Mapping[str, Any]

BACKEND_TLS_POLICY = ObjectKind("gateway.networking.k8s.io/v1", "BackendTLSPolicy")
CONFIG_MAP_CREDENTIAL = "configmap://"
"""The ``credentialName`` prefix istiod gives a CA held in a ConfigMap (``credentials.KubernetesConfigMapTypeURI``)."""
IGNORE_ANNOTATION = "istio.io/ignore-policy-attachment"
_PEM_MARKER = "-----BEGIN CERTIFICATE-----"


@dataclass(frozen=True, slots=True)
class _Attachment:
    """One accepted target of one policy (rules 1-3)."""

    namespace: str
    target_kind: str
    target: str
    hosts: tuple[str, ...]
    port: int | None
    tls: dict[str, Any]
    order: tuple[str, str]


def _meta(obj: Obj) -> Mapping[str, Any]:
    meta = obj.get("metadata")
    return meta if isinstance(meta, Mapping) else {}


def _spec(obj: Obj) -> Mapping[str, Any]:
    spec = obj.get("spec")
    return spec if isinstance(spec, Mapping) else {}


def _ports(target: Obj, kind: str) -> dict[str, int]:
    """The target's named ports: a Service's ``spec.ports[].port``, a ServiceEntry's ``spec.ports[].number``."""
    out: dict[str, int] = {}
    ports = _spec(target).get("ports")
    for port in ports if isinstance(ports, list) else ():
        if isinstance(port, Mapping) and isinstance(port.get("name"), str):
            number = port.get("port" if kind == "Service" else "number")
            if isinstance(number, int) and not isinstance(number, bool) and 0 < number < 65536:
                out[port["name"]] = number
    return out


def _tls(policy: Obj, skips: list[Skipped]) -> dict[str, Any] | None:
    """Rule 3: the DestinationRule ``tls`` of the policy, or None (skipped) when its validation is unusable."""
    meta = _meta(policy)
    namespace = str(meta.get("namespace") or "")
    validation = _spec(policy).get("validation")
    if not isinstance(validation, Mapping):
        skips.append(skipped(BACKEND_TLS_POLICY, policy, "spec.validation", "required"))
        return None
    hostname = validation.get("hostname")
    if not isinstance(hostname, str) or not hostname:
        skips.append(skipped(BACKEND_TLS_POLICY, policy, "spec.validation.hostname", "required"))
        return None
    tls: dict[str, Any] = {"mode": "SIMPLE", "sni": hostname}
    sans = validation.get("subjectAltNames")
    names = [
        str(san.get("hostname") if san.get("type") == "Hostname" else san.get("uri"))
        for san in (sans if isinstance(sans, list) else ())
        if isinstance(san, Mapping)
        and san.get("type") in ("Hostname", "URI")
        and isinstance(san.get("hostname" if san.get("type") == "Hostname" else "uri"), str)
    ]
    if names:
        tls["subjectAltNames"] = names
    well_known = validation.get("wellKnownCACertificates")
    if well_known is not None:
        if well_known != "System":
            reason = f"unknown wellKnownCACertificates: {well_known!r}"
            skips.append(skipped(BACKEND_TLS_POLICY, policy, "spec.validation.wellKnownCACertificates", reason))
            return None
        return tls  # the system's trust store
    refs = validation.get("caCertificateRefs")
    first = refs[0] if isinstance(refs, list) and refs else None
    if not isinstance(first, Mapping) or first.get("kind") != "ConfigMap" or first.get("group", "") not in ("", None):
        reason = "a ConfigMap in caCertificateRefs, or wellKnownCACertificates: System, is required"
        skips.append(skipped(BACKEND_TLS_POLICY, policy, "spec.validation.caCertificateRefs", reason))
        return None
    if isinstance(refs, list) and len(refs) > 1:
        reason = "only the first caCertificateRefs is used"
        skips.append(skipped(BACKEND_TLS_POLICY, policy, "spec.validation.caCertificateRefs", reason))
    tls["credentialName"] = f"{CONFIG_MAP_CREDENTIAL}{namespace}/{first.get('name')}"
    return tls


def _attachments(
    policy: Obj,
    services: Mapping[tuple[str, str], Obj],
    entries: Mapping[tuple[str, str], Obj],
    domain: str,
    skips: list[Skipped],
) -> list[tuple[tuple[str, str, str, str], _Attachment]]:
    """Rules 1-3 for one policy: (target key with section, attachment) per accepted target."""
    meta = _meta(policy)
    namespace, name = str(meta.get("namespace") or ""), str(meta.get("name") or "")
    tls = _tls(policy, skips)
    if tls is None:
        return []
    refs = _spec(policy).get("targetRefs")
    out: list[tuple[tuple[str, str, str, str], _Attachment]] = []
    for i, ref in enumerate(refs if isinstance(refs, list) else ()):
        at = f"spec.targetRefs[{i}]"
        if not isinstance(ref, Mapping) or not isinstance(ref.get("name"), str):
            skips.append(skipped(BACKEND_TLS_POLICY, policy, at, "a group, kind and name are required"))
            continue
        group, kind, target_name = str(ref.get("group") or ""), str(ref.get("kind") or ""), str(ref["name"])
        hosts: tuple[str, ...]
        if kind == "Service" and group in ("", "core"):
            target, hosts = services.get((namespace, target_name)), (f"{target_name}.{namespace}.svc.{domain}",)
        elif kind == "ServiceEntry" and group == "networking.istio.io":
            target = entries.get((namespace, target_name))
            raw = _spec(target).get("hosts") if target is not None else None
            hosts = tuple(h for h in (raw if isinstance(raw, list) else ()) if isinstance(h, str) and h)
        else:
            skips.append(skipped(BACKEND_TLS_POLICY, policy, at, f"unsupported reference kind: {group}/{kind}"))
            continue
        if target is None:
            skips.append(skipped(BACKEND_TLS_POLICY, policy, at, f"{kind} {namespace}/{target_name} not found"))
            continue
        section = ref.get("sectionName")
        port = None
        if isinstance(section, str) and section:
            port = _ports(target, kind).get(section)
            if port is None:
                reason = f"sectionName {section!r} does not exist in {kind} {namespace}/{target_name}"
                skips.append(skipped(BACKEND_TLS_POLICY, policy, f"{at}.sectionName", reason))
                continue
        key = (namespace, kind, target_name, section if isinstance(section, str) else "")
        created = str(meta.get("creationTimestamp") or "")
        out.append((key, _Attachment(namespace, kind, target_name, hosts, port, tls, (created, name))))
    return out


def generated_destination_rules(
    policies: Iterable[Obj],
    services: Iterable[Obj],
    service_entries: Iterable[Obj],
    *,
    domain: str,
    skips: list[Skipped],
) -> list[dict[str, Any]]:
    """The DestinationRule objects istiod would generate from ``policies`` (the module rules)."""
    by_key = {(str(_meta(o).get("namespace")), str(_meta(o).get("name"))): o for o in services}
    entry_by_key = {(str(_meta(o).get("namespace")), str(_meta(o).get("name"))): o for o in service_entries}
    winners: dict[tuple[str, str, str, str], tuple[_Attachment, Obj]] = {}
    for policy in policies:
        annotations = _meta(policy).get("annotations")
        if isinstance(annotations, Mapping) and str(annotations.get(IGNORE_ANNOTATION, "")).lower() == "true":
            continue  # rule 6
        for key, attachment in _attachments(policy, by_key, entry_by_key, domain, skips):
            held = winners.get(key)
            if held is None or attachment.order < held[0].order:  # rule 4: the older wins
                if held is not None:
                    _conflicted(held[1], attachment, skips)
                winners[key] = (attachment, policy)
            else:
                _conflicted(policy, held[0], skips)
    rules: dict[tuple[str, str, str, str], dict[str, Any]] = {}
    for attachment, _ in sorted(winners.values(), key=lambda pair: pair[0].order):
        for host in attachment.hosts:
            rule_key = (attachment.namespace, attachment.target_kind, attachment.target, host)
            rule = rules.setdefault(rule_key, _rule(attachment, host))
            policy = rule["spec"]["trafficPolicy"]
            if attachment.port is None:
                policy.setdefault("tls", attachment.tls)  # rule 4: the first whole-host setting
                continue
            levels = policy.setdefault("portLevelSettings", [])
            if all(level["port"]["number"] != attachment.port for level in levels):
                levels.append({"port": {"number": attachment.port}, "tls": attachment.tls})
                levels.sort(key=lambda level: level["port"]["number"])
    return list(rules.values())


def _conflicted(loser: Obj, winner: _Attachment, skips: list[Skipped]) -> None:
    reason = f"Conflicted: BackendTLSPolicy {winner.order[1]!r} targets the same backend and is older"
    skips.append(skipped(BACKEND_TLS_POLICY, loser, "spec.targetRefs", reason))


def _rule(attachment: _Attachment, host: str) -> dict[str, Any]:
    """Rule 5: an empty generated DestinationRule for ``host``."""
    if attachment.target_kind == "ServiceEntry":
        name = f"{attachment.target}~{host.replace('.', '-')}~gateway"
    else:
        name = f"{attachment.target}~gateway"
    return {
        "apiVersion": "networking.istio.io/v1",
        "kind": "DestinationRule",
        "metadata": {"name": name, "namespace": attachment.namespace},
        "spec": {"host": host, "trafficPolicy": {}},
    }


def config_map_credential(name: str, config_maps: Mapping[tuple[str, str], Obj], namespace: str) -> Obj | None:
    """A ``configmap://<namespace>/<name>`` credential (rule 3) as the Secret shape the DestinationRule reader
    takes (``data`` base64), or None: not that form, another namespace than ``namespace`` (a rule reads only its
    own namespace's), no such ConfigMap, or no PEM certificate in its ``ca.crt``."""
    if not name.startswith(CONFIG_MAP_CREDENTIAL):
        return None
    owner, _, map_name = name[len(CONFIG_MAP_CREDENTIAL) :].partition("/")
    if owner != namespace or not map_name:
        return None
    config_map = config_maps.get((owner, map_name))
    data = config_map.get("data") if config_map is not None else None
    pem = data.get("ca.crt") if isinstance(data, Mapping) else None
    if not isinstance(pem, str) or _PEM_MARKER not in pem:
        return None
    return {"data": {"ca.crt": base64.b64encode(pem.encode()).decode("ascii")}}
