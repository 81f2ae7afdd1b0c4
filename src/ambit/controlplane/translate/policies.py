"""AuthorizationPolicy → the node proxy's L4 :class:`Policy` (spec §7.1, §7.2), with its ``ZtunnelAccepted`` status.

Theory of operation: :func:`translate_authorization_policy` turns one AuthorizationPolicy (security.istio.io v1 or
v1beta1; one schema) into at most one policy for the node proxies and the status condition istiod would report for
it. It follows istiod's ``authorization.go`` case for case; where we differ it is said below.

Rules:

1. Dry run: the annotation ``istio.io/dry-run`` is read as Go's ``ParseBool`` reads it (an unparsable value is
   false). A dry-run policy is sent with ``dry_run`` set only when dry run is enabled (istiod's
   ``AMBIENT_ENABLE_DRY_RUN_AUTHORIZATION_POLICY``, off by default); otherwise it is not sent and its status is
   False/UnsupportedValue. This is checked first, as istiod does.
2. A policy with ``targetRef`` or ``targetRefs`` belongs to a waypoint: not sent, and no ztunnel status.
3. Scope: a ``selector`` (even an empty one) → WORKLOAD_SELECTOR; none → NAMESPACE, or GLOBAL in the root
   namespace. Only a selector with labels lists the policy on workloads (:class:`PolicySelection`): those of its
   namespace whose labels contain them, and for the root namespace those of every namespace.
4. Action: ALLOW (the default) and DENY are sent; AUDIT and CUSTOM are not, status False/UnsupportedValue
   "ztunnel does not support the <X> action".
5. Each rule becomes one rule of clauses, in istiod's order: ``to`` (one Match per operation: ports, notPorts),
   ``from`` (one Match per source: ipBlocks, notIpBlocks, namespaces, notNamespaces, serviceAccounts,
   notServiceAccounts, principals, notPrincipals), then one clause per ``when`` (one Match for its key's values
   and notValues). A rule with no ``from``, ``to`` or ``when`` has no clause and matches every connection.
6. Values: strings by :meth:`StringMatch.of_pattern`; a service account without ``/`` is qualified with the
   policy's namespace; ports are decimal 1..65535 (anything else is dropped, port 0 too since no connection has
   it); IPs and CIDRs become networks (a bare address /32 or /128, host bits cleared), unparsable ones dropped.
7. HTTP attributes (operation hosts/methods/paths and their nots, source requestPrincipals/remoteIpBlocks and
   their nots, any ``when`` key but the five L4 ones) cannot be enforced by the node proxy. In an ALLOW, a rule
   with any of them is dropped whole (an ALLOW left without rules denies everything it covers); in a DENY, only the
   attributes go and the L4 rest of the rule stays. The status is then ``UnsupportedValue`` with istiod's message,
   True since the policy is still sent.
8. Matches with no field never match, and a clause with no other match never matches (spec §4.3); we leave such
   matches out and drop rules that could never fire (istiod sends them and relies on ztunnel skipping them: the
   effect is the same, and no proxy can get it wrong).
9. An object whose spec does not have the schema's shape (a list where a string belongs, an unknown action) is not
   sent and is reported as :class:`Skipped`, as istiod's informer cannot decode it at all.
"""

from __future__ import annotations

import ipaddress
import re
from collections.abc import Callable, Iterable, Mapping
from dataclasses import dataclass
from typing import Any, TypeVar

from ambit.controlplane.translate import shapes
from ambit.controlplane.translate.skips import ObjectKind, Skipped, skipped
from ambit.model.labels import LabelSelector, selector_from_map
from ambit.model.policy import Action, Cidr, Clause, Match, Policy, Rule, Scope, ServiceAccountMatch, StringMatch

__all__ = [
    "AUTHORIZATION_POLICY",
    "DEFAULT_ROOT_NAMESPACE",
    "DRY_RUN_ANNOTATION",
    "PolicySelection",
    "PolicyStatus",
    "PolicyTranslation",
    "translate_authorization_policy",
]

AUTHORIZATION_POLICY = ObjectKind("security.istio.io/v1", "AuthorizationPolicy")
DEFAULT_ROOT_NAMESPACE = "istio-system"
DRY_RUN_ANNOTATION = "istio.io/dry-run"
ZTUNNEL_ACCEPTED = "ZtunnelAccepted"
L4_WHEN_KEYS = ("source.ip", "source.namespace", "source.principal", "destination.ip", "destination.port")
_HTTP_OPERATION_FIELDS = ("hosts", "notHosts", "methods", "notMethods", "paths", "notPaths")
_HTTP_SOURCE_FIELDS = ("remoteIpBlocks", "notRemoteIpBlocks", "requestPrincipals", "notRequestPrincipals")
_GO_TRUE = frozenset({"1", "t", "T", "TRUE", "true", "True"})
_DECIMAL = re.compile(r"[0-9]{1,10}")

HTTP_RULE_MESSAGE = (
    "ztunnel does not support HTTP attributes (found: {found}). "
    "In ambient mode you must use a waypoint proxy to enforce HTTP rules. {explanation}"
)
HTTP_ALLOW_EXPLANATION = (
    "Within an ALLOW policy, rules matching HTTP attributes are omitted. This will be more restrictive than requested."
)
HTTP_DENY_EXPLANATION = (
    "DENY policy with HTTP attributes is enforced without the HTTP rules. This will be more restrictive than requested."
)
HTTP_DENY_NO_EFFECT_EXPLANATION = (
    "After omitting unsupported HTTP attributes, this DENY policy has no enforceable rules at ztunnel "
    "and will have no effect. Deploy a waypoint proxy and use a targetRef to enforce this policy."
)

Obj = Mapping[str, Any]
T = TypeVar("T")


@dataclass(frozen=True, slots=True)
class PolicyStatus:
    """The ``ZtunnelAccepted`` condition for one AuthorizationPolicy (spec §10.3), as istiod computes it."""

    namespace: str
    name: str
    generation: int
    accepted: bool
    """The condition's status (True when the policy is sent, even with a warning)."""
    reason: str
    message: str
    type: str = ZTUNNEL_ACCEPTED

    @property
    def key(self) -> str:
        return f"{self.namespace}/{self.name}"


@dataclass(frozen=True, slots=True)
class PolicySelection:
    """A WORKLOAD_SELECTOR policy's key and the labels a workload needs to list it (rule 3)."""

    key: str
    namespace: str
    selector: LabelSelector
    """Built once from ``matchLabels``."""
    everywhere: bool = False
    """A root-namespace policy: it selects in every namespace."""

    def selects(self, namespace: str, labels: Mapping[str, str]) -> bool:
        return (self.everywhere or namespace == self.namespace) and self.selector.matches(labels)


@dataclass(frozen=True, slots=True)
class PolicyTranslation:
    """What one AuthorizationPolicy gives: the policy to send (if any), its status (if any), its selection."""

    policy: Policy | None = None
    status: PolicyStatus | None = None
    selection: PolicySelection | None = None


def parse_go_bool(text: str) -> bool:
    """Go's ``strconv.ParseBool``, with an unparsable value read as false (istiod logs it and goes on)."""
    return text in _GO_TRUE


def string_matches(values: Iterable[str]) -> tuple[StringMatch, ...]:
    return tuple(StringMatch.of_pattern(v) for v in values)


def service_accounts(values: Iterable[str], namespace: str) -> tuple[ServiceAccountMatch, ...]:
    out = []
    for value in values:
        ns, slash, account = value.partition("/")
        out.append(ServiceAccountMatch(ns, account) if slash else ServiceAccountMatch(namespace, value))
    return tuple(out)


def ports(values: Iterable[str]) -> tuple[int, ...]:
    return tuple(int(v) for v in values if _DECIMAL.fullmatch(v) and 1 <= int(v) <= 65535)


def cidrs(values: Iterable[str]) -> tuple[Cidr, ...]:
    out: list[Cidr] = []
    for value in values:
        address, slash, length = value.partition("/")
        if "%" in value or (slash and not _DECIMAL.fullmatch(length)):
            continue  # zones and netmask forms: Go's netip refuses them
        try:
            ip = ipaddress.ip_address(address)
            out.append(ipaddress.ip_network(f"{ip}/{length if slash else ip.max_prefixlen}", strict=False))
        except ValueError:
            continue
    return tuple(out)


_WHEN_FIELDS: Mapping[str, tuple[str, str, Callable[[Iterable[str]], tuple[Any, ...]]]] = {
    "source.namespace": ("namespaces", "not_namespaces", string_matches),
    "source.principal": ("principals", "not_principals", string_matches),
    "source.ip": ("source_ips", "not_source_ips", cidrs),
    "destination.port": ("destination_ports", "not_destination_ports", ports),
    "destination.ip": ("destination_ips", "not_destination_ips", cidrs),
}


def _rule(raw: object, path: str, namespace: str) -> tuple[Rule, list[str]]:
    """One rule (rule 5) and the HTTP attributes found in it (rule 7)."""
    rule = shapes.mapping(raw, path)
    http: list[str] = []
    clauses: list[Clause] = []
    to_matches = []
    for i, to in enumerate(shapes.list_of(rule.get("to"), f"{path}.to")):
        op_path = f"{path}.to[{i}].operation"
        op = shapes.mapping(shapes.mapping(to, f"{path}.to[{i}]").get("operation"), op_path)
        http.extend(f for f in _HTTP_OPERATION_FIELDS if shapes.strings(op.get(f), f"{op_path}.{f}"))
        to_matches.append(
            Match(
                destination_ports=ports(shapes.strings(op.get("ports"), f"{op_path}.ports")),
                not_destination_ports=ports(shapes.strings(op.get("notPorts"), f"{op_path}.notPorts")),
            )
        )
    if to_matches:
        clauses.append(Clause(tuple(to_matches)))
    from_matches = []
    for i, source_item in enumerate(shapes.list_of(rule.get("from"), f"{path}.from")):
        src_path = f"{path}.from[{i}].source"
        src = shapes.mapping(shapes.mapping(source_item, f"{path}.from[{i}]").get("source"), src_path)
        http.extend(f for f in _HTTP_SOURCE_FIELDS if shapes.strings(src.get(f), f"{src_path}.{f}"))

        def values(field: str, src: Mapping[str, Any] = src, src_path: str = src_path) -> list[str]:
            return shapes.strings(src.get(field), f"{src_path}.{field}")

        from_matches.append(
            Match(
                source_ips=cidrs(values("ipBlocks")),
                not_source_ips=cidrs(values("notIpBlocks")),
                namespaces=string_matches(values("namespaces")),
                not_namespaces=string_matches(values("notNamespaces")),
                service_accounts=service_accounts(values("serviceAccounts"), namespace),
                not_service_accounts=service_accounts(values("notServiceAccounts"), namespace),
                principals=string_matches(values("principals")),
                not_principals=string_matches(values("notPrincipals")),
            )
        )
    if from_matches:
        clauses.append(Clause(tuple(from_matches)))
    for i, raw_when in enumerate(shapes.list_of(rule.get("when"), f"{path}.when")):
        when_path = f"{path}.when[{i}]"
        when = shapes.mapping(raw_when, when_path)
        key = when.get("key")
        if not isinstance(key, str):
            raise shapes.ShapeError(f"{when_path}.key", "expected a string")
        values_, not_values = (
            shapes.strings(when.get("values"), f"{when_path}.values"),
            shapes.strings(when.get("notValues"), f"{when_path}.notValues"),
        )
        fields = _WHEN_FIELDS.get(key)
        if fields is None:
            http.append(key)
            clauses.append(Clause((Match(),)))
            continue
        positive, negative, convert = fields
        clauses.append(Clause((Match(**{positive: convert(values_), negative: convert(not_values)}),)))
    return Rule(tuple(clauses)), http


def _can_fire(rule: Rule) -> Rule | None:
    """``rule`` without matches that never match, or None when one of its clauses can then never match (rule 8)."""
    clauses = []
    for clause in rule.clauses:
        matches = tuple(m for m in clause.matches if not m.is_empty)
        if not matches:
            return None
        clauses.append(Clause(matches))
    return Rule(tuple(clauses))


def _status(meta: Obj, accepted: bool, reason: str, message: str) -> PolicyStatus:
    generation = meta.get("generation")
    return PolicyStatus(
        namespace=str(meta.get("namespace") or ""),
        name=str(meta.get("name") or ""),
        generation=generation if isinstance(generation, int) and not isinstance(generation, bool) else 0,
        accepted=accepted,
        reason=reason,
        message=message,
    )


def translate_authorization_policy(
    obj: Obj,
    *,
    root_namespace: str = DEFAULT_ROOT_NAMESPACE,
    enable_dry_run: bool = False,
    skips: list[Skipped] | None = None,
) -> PolicyTranslation:
    """The policy, status and selection of one AuthorizationPolicy (rules 1-9); problems of shape go to ``skips``."""
    try:
        return _translate(obj, root_namespace, enable_dry_run)
    except shapes.ShapeError as exc:
        if skips is not None:
            skips.append(skipped(AUTHORIZATION_POLICY, obj, exc.field, f"{exc.reason}; the policy is not sent"))
        return PolicyTranslation()


def _translate(obj: Obj, root_namespace: str, enable_dry_run: bool) -> PolicyTranslation:
    meta = shapes.mapping(obj.get("metadata"), "metadata")
    spec = shapes.mapping(obj.get("spec"), "spec")
    name, namespace = str(meta.get("name") or ""), str(meta.get("namespace") or "")
    if not name or not namespace:
        raise shapes.ShapeError("metadata", "name and namespace are required")
    annotations = shapes.mapping(meta.get("annotations"), "metadata.annotations")
    dry_run = parse_go_bool(str(annotations.get(DRY_RUN_ANNOTATION) or ""))
    if dry_run and not enable_dry_run:
        message = (
            f'found policy "{namespace}/{name}" using dry-run annotation, '
            "but support for ambient dry-run authorizationPolicies isn't enabled"
        )
        return PolicyTranslation(status=_status(meta, False, "UnsupportedValue", message))
    if spec.get("targetRef") or shapes.list_of(spec.get("targetRefs"), "spec.targetRefs"):
        return PolicyTranslation()
    action_name = spec.get("action") or "ALLOW"
    if action_name not in ("ALLOW", "DENY", "AUDIT", "CUSTOM"):
        raise shapes.ShapeError("spec.action", f"expected ALLOW, DENY, AUDIT or CUSTOM, got {action_name!r}")
    if action_name in ("AUDIT", "CUSTOM"):
        message = f"ztunnel does not support the {action_name} action"
        return PolicyTranslation(status=_status(meta, False, "UnsupportedValue", message))
    action = Action[action_name]
    selector = spec.get("selector")
    match_labels = shapes.mapping(
        shapes.mapping(selector, "spec.selector").get("matchLabels"), "spec.selector.matchLabels"
    )
    if selector is not None:
        scope = Scope.WORKLOAD_SELECTOR
    else:
        scope = Scope.GLOBAL if namespace == root_namespace else Scope.NAMESPACE
    rules: list[Rule] = []
    http: set[str] = set()
    for index, raw in enumerate(shapes.list_of(spec.get("rules"), "spec.rules")):
        rule, found = _rule(raw, f"spec.rules[{index}]", namespace)
        http.update(found)
        if found and action is Action.ALLOW:
            continue  # an HTTP rule can never match at L4 (rule 7)
        if (kept := _can_fire(rule)) is not None:
            rules.append(kept)
    policy = Policy(name, namespace, scope, action, tuple(rules), dry_run=dry_run)
    selection = None
    if scope is Scope.WORKLOAD_SELECTOR and match_labels:
        labels = {str(k): str(v) for k, v in match_labels.items()}
        selection = PolicySelection(
            policy.key, namespace, selector_from_map(labels), everywhere=namespace == root_namespace
        )
    if not http:
        return PolicyTranslation(policy, _status(meta, True, "Accepted", "attached to ztunnel"), selection)
    if action is Action.ALLOW:
        explanation = HTTP_ALLOW_EXPLANATION
    else:
        explanation = HTTP_DENY_EXPLANATION if rules else HTTP_DENY_NO_EFFECT_EXPLANATION
    message = HTTP_RULE_MESSAGE.format(found=", ".join(sorted(http)), explanation=explanation)
    return PolicyTranslation(policy, _status(meta, True, "UnsupportedValue", message), selection)
