"""Gateway API ``BackendTLSPolicy`` → the DestinationRules istiod generates from it (TLS origination to a backend),
and the policy's ``status.ancestors`` as istiod writes them.

Theory of operation: istiod does not apply a BackendTLSPolicy itself; it turns the policies into DestinationRule
objects (``pilot/pkg/config/kube/gateway/backend_policies.go``) that then take part in the DestinationRule lookup
like any other. :func:`translate_backend_tls` does the same, as plain DestinationRule objects, and computes each
policy's ancestor status (:class:`BackendTlsPolicyStatus`, written by the control plane's status writer);
:func:`config_map_credential` answers the ``credentialName`` the rules carry for a CA held in a ConfigMap. Pure:
no I/O.

Rules:

1. Each ``spec.targetRefs`` entry names, in the policy's namespace, a Service (group ``""`` or ``core``) or a
   ServiceEntry (group ``networking.istio.io``); anything else, or a target that does not exist, is skipped with
   a reason (status: ``Accepted`` False, ``TargetNotFound``). Its hosts: a Service's
   ``<name>.<namespace>.svc.<domain>``, a ServiceEntry's ``spec.hosts``.
2. ``sectionName`` names a port of the target (by its ``name``): the TLS settings are port-level for that port's
   number; a name the target does not have skips that target (``TargetNotFound``). Without it they apply to the
   whole host.
3. The TLS settings: mode ``SIMPLE``; ``sni`` is ``validation.hostname``; ``subjectAltNames`` are the
   ``validation.subjectAltNames`` of type Hostname or URI (when there are none, the waypoint checks the SNI name);
   the trust anchors are the system's with ``wellKnownCACertificates: System`` (another value: ``Accepted`` False,
   ``Invalid``, no rule), else the first of ``caCertificateRefs`` (more: a warning in the ``Accepted`` message),
   which must be a ConfigMap of the policy's own namespace (a ref carries no namespace) whose ``ca.crt`` holds PEM
   certificates, carried as ``credentialName: configmap://<namespace>/<name>`` (istiod's form). Neither given:
   the system's trust store, as istiod does.
4. A CA ref that cannot be used fails closed, never open: a Secret or any other kind (``ResolvedRefs`` False,
   ``InvalidKind``), a missing ConfigMap or one without a parseable ``ca.crt`` (``InvalidCACertificateRef``) each
   give ``Accepted`` False with ``NoValidCACertificate`` and TLS settings whose ``credentialName`` is
   :data:`INVALID_CREDENTIAL`, which resolves to nothing: the waypoint refuses the backend (503) rather than send
   plaintext or trust the system's store.
5. Two policies (not ignored, rule 8) with the same target ref (group, kind, name and sectionName): the older
   (creation time, then name) wins; the other is ``Conflicted`` for that target and generates nothing for it.
   Policies of one target and host are merged into one DestinationRule, oldest first: the first port-level
   setting for a port and the first whole-host setting win.
6. The generated rule lives in the target's namespace, named ``<target>~gateway`` (a ServiceEntry's:
   ``<target>~<host with dots as dashes>~gateway``), with no creation time, so that istiod's ordering (oldest
   first, generated rules having none) puts it ahead of user rules of the same namespace and host: its traffic
   policy is the one kept when they merge.
7. Status ancestors, in this order: one per target ref, the ref itself (group, kind, name, sectionName) with
   ``controllerName: istio.io/mesh-controller`` and that target's ``Accepted`` and ``ResolvedRefs``; then, for
   every Gateway (by name, sorted) that a route (HTTP, gRPC, TCP or TLS) attaches to and that route has a
   backendRef to a resolved target, ``{group: gateway.networking.k8s.io, kind: Gateway, name}`` (no namespace,
   as istiod writes it) with ``controllerName: istio.io/gateway-controller`` and the policy-wide conditions
   (rules 3-4). At most :data:`MAX_ANCESTORS` in all; ancestors of other controllers are the writer's to keep.
8. A policy annotated ``istio.io/ignore-policy-attachment: "true"`` is left out of rules and conflicts; its
   ancestors (one per target ref) say ``Accepted`` False, ``IgnoredByIstio``.
9. An ingress Gateway's ``spec.tls.backend.clientCertificateRef`` (GEP-3155: the certificate the gateway presents to
   every backend it originates TLS to), when it resolves
   (:func:`ambit.controlplane.translate.listeners.resolve_backend_client_certificate`): in that gateway's
   configuration only, each destination policy that a generated rule (rule 6: a name with ``~``, which no
   Kubernetes object name can hold) takes part in has its ``SIMPLE`` TLS settings (the rule-wide one and each
   port's) made ``MUTUAL`` with that certificate chain and key, carried to the gateway as DestinationRule keys are
   (only to the gateway's own service account). A DestinationRule of the user's that merges into a generated rule
   for the same host keeps its own settings where the generated rule gives none; a waypoint's policies and
   DestinationRules the user wrote alone are not touched.
"""

from __future__ import annotations

import base64
from collections.abc import Iterable, Mapping
from dataclasses import dataclass, field, replace
from typing import Any

from ambit.controlplane.translate.routes import RouteCondition
from ambit.controlplane.translate.skips import ObjectKind, Skipped, skipped
from ambit.model.destination_policy import ClientTls, DestinationPolicy, TlsMode, TrafficPolicy
from ambit.tls.credentials import CredentialProblem, TlsCredential, read_ca_config_map

__all__ = [
    "BACKEND_TLS_POLICY",
    "CONFIG_MAP_CREDENTIAL",
    "GATEWAY_CONTROLLER",
    "INVALID_CREDENTIAL",
    "MAX_ANCESTORS",
    "MESH_CONTROLLER",
    "AncestorStatus",
    "BackendTlsPolicyStatus",
    "BackendTlsTranslation",
    "config_map_credential",
    "generated_destination_rules",
    "translate_backend_tls",
    "with_gateway_client_certificate",
]

Obj = Mapping[str, Any]

BACKEND_TLS_POLICY = ObjectKind("gateway.networking.k8s.io/v1", "BackendTLSPolicy")
CONFIG_MAP_CREDENTIAL = "configmap://"
"""The ``credentialName`` prefix istiod gives a CA held in a ConfigMap (``credentials.KubernetesConfigMapTypeURI``)."""
INVALID_CREDENTIAL = "invalid://"
"""Rule 4: the ``credentialName`` of a policy whose CA ref is unusable; it names no Secret, so nothing trusts."""
MESH_CONTROLLER = "istio.io/mesh-controller"
GATEWAY_CONTROLLER = "istio.io/gateway-controller"
MAX_ANCESTORS = 16
"""Gateway API's bound on ``status.ancestors``."""
IGNORE_ANNOTATION = "istio.io/ignore-policy-attachment"
ACCEPTED, RESOLVED_REFS = "Accepted", "ResolvedRefs"
_VALID = "Configuration is valid"


@dataclass(frozen=True, slots=True)
class AncestorStatus:
    """One entry of a policy's ``status.ancestors`` that we own (rule 7)."""

    ancestor_ref: tuple[tuple[str, Any], ...]
    controller: str
    conditions: tuple[RouteCondition, ...]

    def ancestor_ref_dict(self) -> dict[str, Any]:
        return dict(self.ancestor_ref)


@dataclass(frozen=True, slots=True)
class BackendTlsPolicyStatus:
    """The ancestors we own of one BackendTLSPolicy, with the generation the translation saw."""

    namespace: str
    name: str
    generation: int
    ancestors: tuple[AncestorStatus, ...]

    @property
    def key(self) -> str:
        return f"{self.namespace}/{self.name}"


@dataclass(frozen=True, slots=True)
class BackendTlsTranslation:
    rules: list[dict[str, Any]] = field(default_factory=list)
    """The generated DestinationRule objects (rules 5-6)."""
    status: tuple[BackendTlsPolicyStatus, ...] = ()
    """Each policy's ancestors, by key."""


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


@dataclass(slots=True)
class _Conditions:
    """``Accepted`` and ``ResolvedRefs`` as (status, reason, message), the policy-wide ones first (rules 3-4)."""

    accepted: tuple[bool, str, str] = (True, "Accepted", _VALID)
    resolved: tuple[bool, str, str] = (True, "ResolvedRefs", _VALID)

    def as_tuple(self) -> tuple[RouteCondition, ...]:
        return (RouteCondition(ACCEPTED, *self.accepted), RouteCondition(RESOLVED_REFS, *self.resolved))


def _meta(obj: Obj) -> Mapping[str, Any]:
    meta = obj.get("metadata")
    return meta if isinstance(meta, Mapping) else {}


def _spec(obj: Obj) -> Mapping[str, Any]:
    spec = obj.get("spec")
    return spec if isinstance(spec, Mapping) else {}


def _key(obj: Obj) -> tuple[str, str]:
    meta = _meta(obj)
    return str(meta.get("namespace") or ""), str(meta.get("name") or "")


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


def _ignored(policy: Obj) -> bool:
    annotations = _meta(policy).get("annotations")
    return isinstance(annotations, Mapping) and str(annotations.get(IGNORE_ANNOTATION, "")).lower() == "true"


def _trust(
    policy: Obj, validation: Mapping[str, Any], config_maps: Mapping[tuple[str, str], Obj], conds: _Conditions,
    skips: list[Skipped],
) -> str | None:  # fmt: skip
    """Rules 3-4: the ``credentialName`` ("" for the system's store), or None when the policy is invalid."""
    namespace = _key(policy)[0]
    at = "spec.validation.caCertificateRefs"
    well_known = validation.get("wellKnownCACertificates")
    if well_known is not None:
        if well_known != "System":
            reason = f"unknown wellKnownCACertificates: {well_known!r}"
            conds.accepted = (False, "Invalid", f"Unknown wellKnownCACertificates: {well_known}")
            skips.append(skipped(BACKEND_TLS_POLICY, policy, "spec.validation.wellKnownCACertificates", reason))
            return None
        return ""
    refs = validation.get("caCertificateRefs")
    if not isinstance(refs, list) or not refs:
        return ""
    if len(refs) > 1:
        conds.accepted = (True, "Accepted", f"{_VALID}; warning: only the first caCertificateRefs will be used")
        skips.append(skipped(BACKEND_TLS_POLICY, policy, at, "only the first caCertificateRefs is used"))
    first = refs[0] if isinstance(refs[0], Mapping) else {}
    group, kind, name = str(first.get("group") or ""), str(first.get("kind") or ""), first.get("name")
    problem: str
    if group in ("", "core") and kind == "ConfigMap" and isinstance(name, str) and name:
        config_map = config_maps.get((namespace, name))
        read = read_ca_config_map(config_map) if config_map is not None else CredentialProblem("not found")
        if not isinstance(read, CredentialProblem):
            return f"{CONFIG_MAP_CREDENTIAL}{namespace}/{name}"
        problem = f"ConfigMap {namespace}/{name}: {read.message}"
        verb = "not found" if config_map is None else "invalid"
        conds.resolved = (False, "InvalidCACertificateRef", f"Certificate reference {verb}: {problem}")
    else:
        problem = f"unsupported reference kind: {group + '/' if group else ''}{kind or '(none)'}"
        conds.resolved = (False, "InvalidKind", f"Certificate reference invalid: {problem}")
    conds.accepted = (False, "NoValidCACertificate", f"Certificate reference invalid: {problem}")
    skips.append(skipped(BACKEND_TLS_POLICY, policy, at, f"{problem}; the backend is refused (fail closed)"))
    return INVALID_CREDENTIAL


def _tls(
    policy: Obj, config_maps: Mapping[tuple[str, str], Obj], conds: _Conditions, skips: list[Skipped]
) -> dict[str, Any] | None:
    """Rules 3-4: the DestinationRule ``tls`` of the policy, or None (skipped) when its validation is unusable."""
    validation = _spec(policy).get("validation")
    if not isinstance(validation, Mapping):
        conds.accepted = (False, "Invalid", "spec.validation is required")
        skips.append(skipped(BACKEND_TLS_POLICY, policy, "spec.validation", "required"))
        return None
    hostname = validation.get("hostname")
    if not isinstance(hostname, str) or not hostname:
        conds.accepted = (False, "Invalid", "spec.validation.hostname is required")
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
    credential = _trust(policy, validation, config_maps, conds, skips)
    if credential is None:
        return None
    if credential:
        tls["credentialName"] = credential
    return tls


@dataclass(frozen=True, slots=True)
class _Target:
    """One target ref of a policy, resolved or not (rules 1-2)."""

    index: int
    ref: tuple[tuple[str, Any], ...]
    """The ref as the ancestor names it: group, kind, name and sectionName when given."""
    same: tuple[str, str, str, str]
    """(group, kind, name, sectionName) as rule 5 compares refs."""
    kind: str = ""
    hosts: tuple[str, ...] = ()
    port: int | None = None
    problem: str = ""


def _targets(
    policy: Obj,
    services: Mapping[tuple[str, str], Obj],
    entries: Mapping[tuple[str, str], Obj],
    domain: str,
    skips: list[Skipped],
) -> list[_Target]:
    """Rules 1-2 for one policy: every target ref that is a mapping with a name."""
    namespace = _key(policy)[0]
    refs = _spec(policy).get("targetRefs")
    out: list[_Target] = []
    for i, ref in enumerate(refs if isinstance(refs, list) else ()):
        at = f"spec.targetRefs[{i}]"
        if not isinstance(ref, Mapping) or not isinstance(ref.get("name"), str):
            skips.append(skipped(BACKEND_TLS_POLICY, policy, at, "a group, kind and name are required"))
            continue
        group, kind, name = str(ref.get("group") or ""), str(ref.get("kind") or ""), str(ref["name"])
        section = ref.get("sectionName") if isinstance(ref.get("sectionName"), str) else ""
        pairs: list[tuple[str, Any]] = [("group", group), ("kind", kind), ("name", name)]
        if section:
            pairs.append(("sectionName", section))
        base = _Target(i, tuple(pairs), (group, kind, name, section or ""))
        hosts: tuple[str, ...]
        if kind == "Service" and group in ("", "core"):
            target, hosts = services.get((namespace, name)), (f"{name}.{namespace}.svc.{domain}",)
        elif kind == "ServiceEntry" and group == "networking.istio.io":
            target = entries.get((namespace, name))
            raw = _spec(target).get("hosts") if target is not None else None
            hosts = tuple(h for h in (raw if isinstance(raw, list) else ()) if isinstance(h, str) and h)
        else:
            problem = f"unsupported reference kind: {group}/{kind}"
            skips.append(skipped(BACKEND_TLS_POLICY, policy, at, problem))
            out.append(_Target(base.index, base.ref, base.same, problem=problem))
            continue
        if target is None:
            problem = f"{kind} {namespace}/{name} not found"
            skips.append(skipped(BACKEND_TLS_POLICY, policy, at, problem))
            out.append(_Target(base.index, base.ref, base.same, problem=problem))
            continue
        port = None
        if section:
            port = _ports(target, kind).get(section)
            if port is None:
                problem = f"sectionName {section!r} does not exist in {kind} {namespace}/{name}"
                skips.append(skipped(BACKEND_TLS_POLICY, policy, f"{at}.sectionName", problem))
                out.append(_Target(base.index, base.ref, base.same, problem=problem))
                continue
        out.append(_Target(base.index, base.ref, base.same, kind, hosts, port))
    return out


def _order(policy: Obj) -> tuple[str, str]:
    return str(_meta(policy).get("creationTimestamp") or ""), _key(policy)[1]


def _gateways_by_backend(routes: Iterable[tuple[str, Obj]]) -> dict[tuple[str, str, str], set[str]]:
    """Rule 7: (namespace, kind, name) of each route backend → the names of the Gateways its route attaches to."""
    out: dict[tuple[str, str, str], set[str]] = {}
    for _kind, route in routes:
        namespace = _key(route)[0]
        spec = _spec(route)
        parents = spec.get("parentRefs")
        gateways = {
            str(p["name"])
            for p in (parents if isinstance(parents, list) else ())
            if isinstance(p, Mapping)
            and isinstance(p.get("name"), str)
            and (p.get("kind") or "Gateway") == "Gateway"
            and (p.get("group", "gateway.networking.k8s.io") or "gateway.networking.k8s.io")
            == "gateway.networking.k8s.io"
        }
        if not gateways:
            continue
        rules = spec.get("rules")
        for rule in rules if isinstance(rules, list) else ():
            backends = rule.get("backendRefs") if isinstance(rule, Mapping) else None
            for backend in backends if isinstance(backends, list) else ():
                if not isinstance(backend, Mapping) or not isinstance(backend.get("name"), str):
                    continue
                kind = str(backend.get("kind") or "Service")
                backend_namespace = str(backend.get("namespace") or namespace)
                out.setdefault((backend_namespace, kind, str(backend["name"])), set()).update(gateways)
    return out


def translate_backend_tls(
    policies: Iterable[Obj],
    services: Iterable[Obj],
    service_entries: Iterable[Obj],
    *,
    domain: str,
    skips: list[Skipped],
    config_maps: Mapping[tuple[str, str], Obj] | None = None,
    routes: Iterable[tuple[str, Obj]] = (),
) -> BackendTlsTranslation:
    """The DestinationRule objects istiod would generate from ``policies`` and the policies' ancestor status (the
    module rules); ``routes`` are (kind, object) pairs of the Gateway API routes (rule 7)."""
    policy_list = [p for p in policies if isinstance(p, Mapping)]
    maps = config_maps or {}
    by_key = {_key(o): o for o in services}
    entry_by_key = {_key(o): o for o in service_entries}
    gateways_of = _gateways_by_backend(routes)
    live = [p for p in policy_list if not _ignored(p)]
    targets_of: dict[tuple[str, str], list[_Target]] = {}
    holders: dict[tuple[str, tuple[str, str, str, str]], list[Obj]] = {}
    for policy in live:
        targets = _targets(policy, by_key, entry_by_key, domain, skips)
        targets_of[_key(policy)] = targets
        for same in {t.same for t in targets}:
            holders.setdefault((_key(policy)[0], same), []).append(policy)
    winners: list[_Attachment] = []
    statuses: list[BackendTlsPolicyStatus] = []
    for policy in policy_list:
        namespace, name = _key(policy)
        generation = _meta(policy).get("generation")
        generation = generation if isinstance(generation, int) and not isinstance(generation, bool) else 0
        if _ignored(policy):
            statuses.append(BackendTlsPolicyStatus(namespace, name, generation, _ignored_ancestors(policy)))
            continue
        conds = _Conditions()
        tls = _tls(policy, maps, conds, skips)
        ancestors: list[AncestorStatus] = []
        gateways: set[str] = set()
        for target in targets_of[(namespace, name)]:
            own = _Conditions(conds.accepted, conds.resolved)
            if target.problem:
                own.accepted = (False, "TargetNotFound", f"targetRefs invalid: {target.problem}")
            else:
                gateways |= gateways_of.get((namespace, target.kind, target.same[2]), set())
                rivals = [p for p in holders[(namespace, target.same)] if p is not policy]
                older = min(rivals, key=_order, default=None)
                if older is not None and _order(older) < _order(policy):
                    own.accepted = (
                        False,
                        "Conflicted",
                        f"Conflicts with BackendTLSPolicy {_key(older)[1]!r} targeting the same backend",
                    )
                    reason = f"Conflicted: BackendTLSPolicy {_key(older)[1]!r} targets the same backend and is older"
                    skips.append(skipped(BACKEND_TLS_POLICY, policy, f"spec.targetRefs[{target.index}]", reason))
                elif tls is not None:
                    winners.append(
                        _Attachment(
                            namespace, target.kind, target.same[2], target.hosts, target.port, tls, _order(policy)
                        )
                    )
            ancestors.append(AncestorStatus(target.ref, MESH_CONTROLLER, own.as_tuple()))
        for gateway in sorted(gateways):
            ref = (("group", "gateway.networking.k8s.io"), ("kind", "Gateway"), ("name", gateway))
            ancestors.append(AncestorStatus(ref, GATEWAY_CONTROLLER, conds.as_tuple()))
        statuses.append(BackendTlsPolicyStatus(namespace, name, generation, tuple(ancestors[:MAX_ANCESTORS])))
    return BackendTlsTranslation(_merge(winners), tuple(sorted(statuses, key=lambda s: s.key)))


def _ignored_ancestors(policy: Obj) -> tuple[AncestorStatus, ...]:
    """Rule 8."""
    refs = _spec(policy).get("targetRefs")
    out: list[AncestorStatus] = []
    message = f"Ignored by Istio due to annotation {IGNORE_ANNOTATION}=true"
    for ref in refs if isinstance(refs, list) else ():
        if not isinstance(ref, Mapping) or not isinstance(ref.get("name"), str):
            continue
        pairs: list[tuple[str, Any]] = [
            ("group", str(ref.get("group") or "")),
            ("kind", str(ref.get("kind") or "")),
            ("name", ref["name"]),
        ]
        if isinstance(ref.get("sectionName"), str) and ref["sectionName"]:
            pairs.append(("sectionName", ref["sectionName"]))
        conditions = (RouteCondition(ACCEPTED, False, "IgnoredByIstio", message),)
        out.append(AncestorStatus(tuple(pairs), MESH_CONTROLLER, conditions))
    return tuple(out[:MAX_ANCESTORS])


def _merge(winners: list[_Attachment]) -> list[dict[str, Any]]:
    """Rule 5's merge: one DestinationRule per target and host, oldest policy first."""
    rules: dict[tuple[str, str, str, str], dict[str, Any]] = {}
    for attachment in sorted(winners, key=lambda a: a.order):
        for host in attachment.hosts:
            rule_key = (attachment.namespace, attachment.target_kind, attachment.target, host)
            rule = rules.setdefault(rule_key, _rule(attachment, host))
            policy = rule["spec"]["trafficPolicy"]
            if attachment.port is None:
                policy.setdefault("tls", attachment.tls)
                continue
            levels = policy.setdefault("portLevelSettings", [])
            if all(level["port"]["number"] != attachment.port for level in levels):
                levels.append({"port": {"number": attachment.port}, "tls": attachment.tls})
                levels.sort(key=lambda level: level["port"]["number"])
    return list(rules.values())


def generated_destination_rules(
    policies: Iterable[Obj],
    services: Iterable[Obj],
    service_entries: Iterable[Obj],
    *,
    domain: str,
    skips: list[Skipped],
    config_maps: Mapping[tuple[str, str], Obj] | None = None,
) -> list[dict[str, Any]]:
    """The DestinationRule objects istiod would generate from ``policies`` (the module rules)."""
    return translate_backend_tls(
        policies, services, service_entries, domain=domain, skips=skips, config_maps=config_maps
    ).rules


def _rule(attachment: _Attachment, host: str) -> dict[str, Any]:
    """Rule 6: an empty generated DestinationRule for ``host``."""
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
    pem = read_ca_config_map(config_map) if config_map is not None else None
    if not isinstance(pem, bytes):
        return None
    return {"data": {"ca.crt": base64.b64encode(pem).decode("ascii")}}


def _is_generated(rule_keys: str) -> bool:
    """Rule 9: one of the (comma-separated) ``namespace/name`` keys is a generated rule's."""
    return any("~" in key.partition("/")[2] for key in rule_keys.split(","))


def with_gateway_client_certificate(
    policies: tuple[DestinationPolicy, ...], credential: TlsCredential | None
) -> tuple[DestinationPolicy, ...]:
    """Rule 9: ``policies`` (one gateway's) with the gateway's client certificate presented by those a
    BackendTLSPolicy generated."""
    if credential is None:
        return policies
    chain, key = credential.cert_pem.decode("latin-1"), credential.key_pem.decode("latin-1")

    def tls(value: ClientTls | None) -> ClientTls | None:
        if value is None or value.mode is not TlsMode.SIMPLE:
            return value
        return replace(value, mode=TlsMode.MUTUAL, client_certificate=chain, private_key=key)

    def traffic(value: TrafficPolicy | None) -> TrafficPolicy | None:
        if value is None:
            return None
        ports = tuple(replace(p, tls=tls(p.tls)) for p in value.port_level)
        return replace(value, tls=tls(value.tls), port_level=ports)

    return tuple(replace(p, traffic_policy=traffic(p.traffic_policy)) if _is_generated(p.rule) else p for p in policies)
