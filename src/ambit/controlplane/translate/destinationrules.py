"""Istio ``DestinationRule`` objects → the :class:`~ambit.model.destination_policy.DestinationPolicy` each waypoint
applies to each Service it serves.

Theory of operation: :func:`parse_destination_rules` reads every rule once (a rule with a bad field is skipped
whole, with a :class:`~ambit.controlplane.translate.skips.Skipped` naming the field; a setting a waypoint cannot
honour is dropped from the rule with a note, the rest kept). :class:`DestinationRuleIndex` then files them the way
istiod's ``PushContext.setDestinationRules`` does, and :meth:`DestinationRuleIndex.find` answers istiod's
``destinationRule(proxyNamespace, service)`` for a waypoint, and for an ingress gateway (its pods' namespace and
the backend Services of its routes; istiod's cluster builder applies the same lookup to a gateway's clusters).
:func:`destination_policies` resolves the chosen rule's subsets to workload uids. Pure: no I/O, deterministic
output.

Rules (istiod: pilot/pkg/model/push_context.go ``setDestinationRules``, ``destinationRule``; destination_rule.go
``mergeDestinationRule``; sidecar.go ``DestinationRule``; networking/core/cluster_waypoint.go; rule 7, the traffic
policies read, is :mod:`ambit.controlplane.translate.destinationrule_traffic`'s):

1. ``spec.host``: a short name (no dot) means ``<host>.<rule namespace>.svc.<domain>``; anything else is taken as
   written (an FQDN, ``*.example.com``, ``*``). A wildcard matches a hostname that ends with its suffix after the
   ``*``; ``*`` matches every host. Lookup takes an exact host first, else the most specific (longest) wildcard.
2. A rule with a ``workloadSelector`` never applies at a waypoint: istiod looks rules up for a waypoint in the
   inbound direction, where only rules without a selector are returned. It is still filed (private to its
   namespace, never merged with others), so, as in istiod, a selector rule in the waypoint's namespace for a host
   hides the wider rules for that host (step 1 of rule 4 matches, and gives nothing). An ingress gateway looks
   rules up in the outbound direction: there a selector rule of the gateway's own namespace whose
   ``workloadSelector.matchLabels`` its pods' labels all hold applies before the rules without a selector (the
   first such rule filed); one that does not match is passed over as at a waypoint.
3. ``exportTo`` (default: the mesh config's ``defaultDestinationRuleExportTo``, else ``*``): a rule is *local*
   to its namespace unless its ``exportTo`` leaves its own namespace out; it is *exported* unless its ``exportTo``
   is just ``.`` or its own namespace. Exported rules are visible to a namespace when ``exportTo`` is empty,
   holds ``*``, or names that namespace.
4. Lookup for a waypoint (or an ingress gateway) in namespace W and a Service in namespace N: the rules local to
   W (when W is the root namespace: the root namespace's private rules); else the rules N exports visible to W;
   else the rules the root namespace exports visible to W. The first step that matches the host decides, even if
   its rule has nothing for the Service.
5. Several rules for one host in one namespace with the same ``exportTo`` merge, oldest first (creation time, then
   name, then namespace): subsets are concatenated (a later subset with a name already taken is dropped), the
   top-level ``trafficPolicy`` is the first rule's that has one. Rules with different ``exportTo`` stay apart; of
   those visible, the last filed applies.
6. A subset selects the Service's workloads (pods, WorkloadEntries, a ServiceEntry's inline endpoints by their own
   ``labels``) whose labels hold all of its ``labels``; its
   uids are sent, so the configuration changes when such a workload comes, goes or is relabelled.
8. A Secret's certificate and key go only to waypoints of the Secret's (the rule's) namespace, as istiod serves a
   ``credentialName`` only from the proxy's own namespace: a waypoint elsewhere that applies an exported rule gets
   its TLS settings without the key material, and so refuses MUTUAL traffic (503).
"""

from __future__ import annotations

import re
from collections.abc import Iterable, Mapping
from dataclasses import dataclass, replace
from typing import Any

from ambit.controlplane.translate import shapes
from ambit.controlplane.translate.destinationrule_traffic import SecretFinder, TrafficPolicyReader
from ambit.controlplane.translate.skips import ObjectKind, Skipped, skipped
from ambit.model.destination_policy import ClientTls, DestinationPolicy, Subset, TrafficPolicy
from ambit.model.workload import Service

__all__ = [
    "DESTINATION_RULE",
    "DestinationRuleIndex",
    "ParsedRule",
    "destination_policies",
    "parse_destination_rules",
]

Obj = Mapping[str, Any]
DESTINATION_RULE = ObjectKind("networking.istio.io/v1", "DestinationRule")
_DNS_LABEL = re.compile(r"[a-z0-9]([-a-z0-9]{0,61}[a-z0-9])?")


@dataclass(frozen=True, slots=True)
class ParsedSubset:
    name: str
    labels: tuple[tuple[str, str], ...]
    traffic_policy: TrafficPolicy | None


@dataclass(frozen=True, slots=True)
class ParsedRule:
    namespace: str
    name: str
    host: str
    """Resolved (rule 1)."""
    export_to: frozenset[str]
    created: str
    traffic_policy: TrafficPolicy | None
    subsets: tuple[ParsedSubset, ...]
    origins: tuple[str, ...] = ()
    """``namespace/name`` of every rule merged into this one (rule 5)."""
    selector: bool = False
    """It has a ``workloadSelector`` (rule 2)."""
    selector_labels: tuple[tuple[str, str], ...] = ()
    """Its ``workloadSelector.matchLabels``, sorted (rule 2: matched against an ingress gateway's pod labels)."""

    @property
    def key(self) -> str:
        return ", ".join(self.origins) or f"{self.namespace}/{self.name}"


# Parsing.


def resolve_host(host: str, namespace: str, domain: str) -> str:
    """Istio's ``ResolveShortnameToFQDN`` (rule 1)."""
    if host == "*" or "." in host or ":" in host:
        return host
    return f"{host}.{namespace}.svc.{domain}"


def parse_destination_rule(
    obj: Obj,
    *,
    domain: str,
    skips: list[Skipped],
    find_secret: SecretFinder,
    default_export_to: tuple[str, ...] | None = None,
) -> ParsedRule | None:
    """One rule as a waypoint may apply it; None (and a skip) when it is malformed. ``default_export_to`` is the
    mesh config's ``defaultDestinationRuleExportTo``, for a rule without ``exportTo``."""
    meta = obj.get("metadata") or {}
    namespace, name = str(meta.get("namespace") or ""), str(meta.get("name") or "")
    reader = TrafficPolicyReader(namespace, find_secret)
    try:
        spec = shapes.mapping(obj.get("spec"), "spec", required=True)
        selector = spec.get("workloadSelector") is not None
        selector_spec = shapes.mapping(spec.get("workloadSelector"), "spec.workloadSelector")
        match_labels = shapes.mapping(selector_spec.get("matchLabels"), "spec.workloadSelector.matchLabels")
        selector_labels = tuple(sorted((str(k), str(v)) for k, v in match_labels.items()))
        host = shapes.text(spec.get("host"), "spec.host", required=True)
        export_to = frozenset(shapes.strings(spec.get("exportTo"), "spec.exportTo")) or frozenset(
            default_export_to or ()
        )
        top = reader.traffic_policy(spec.get("trafficPolicy"), "spec.trafficPolicy")
        subsets: list[ParsedSubset] = []
        seen: set[str] = set()
        for i, item in enumerate(shapes.list_of(spec.get("subsets"), "spec.subsets")):
            at = f"spec.subsets[{i}]"
            subset = shapes.mapping(item, at, required=True)
            subset_name = shapes.text(subset.get("name"), f"{at}.name", required=True)
            if subset_name in seen:
                raise shapes.ShapeError(f"{at}.name", f"subset name {subset_name!r} is not unique")
            if not _DNS_LABEL.fullmatch(subset_name):
                raise shapes.ShapeError(f"{at}.name", f"{subset_name!r} is not a DNS label")
            seen.add(subset_name)
            labels = shapes.mapping(subset.get("labels"), f"{at}.labels")
            if not all(isinstance(k, str) and isinstance(v, str) for k, v in labels.items()):
                raise shapes.ShapeError(f"{at}.labels", "label keys and values must be strings")
            subsets.append(
                ParsedSubset(
                    subset_name,
                    tuple(sorted(labels.items())),
                    reader.traffic_policy(subset.get("trafficPolicy"), f"{at}.trafficPolicy"),
                )
            )
    except shapes.ShapeError as exc:
        skips.append(skipped(DESTINATION_RULE, obj, exc.field, exc.reason))
        return None
    for at, reason in reader.notes:
        skips.append(skipped(DESTINATION_RULE, obj, at, reason))
    return ParsedRule(
        namespace=namespace,
        name=name,
        host=resolve_host(host, namespace, domain),
        export_to=export_to,
        created=str(meta.get("creationTimestamp") or ""),
        traffic_policy=top,
        subsets=tuple(subsets),
        origins=(f"{namespace}/{name}",),
        selector=selector,
        selector_labels=selector_labels,
    )


def parse_destination_rules(
    objects: Iterable[Obj],
    *,
    domain: str,
    skips: list[Skipped],
    find_secret: SecretFinder,
    default_export_to: tuple[str, ...] | None = None,
    generated: Iterable[Obj] = (),
) -> list[ParsedRule]:
    """Every usable rule, sorted as istiod sorts them (rule 5); ``generated`` rules (from BackendTLSPolicies) do
    not take the mesh's ``default_export_to``."""
    parsed = [
        rule
        for obj, default in [*((o, None) for o in generated), *((o, default_export_to) for o in objects)]
        if (
            rule := parse_destination_rule(
                obj, domain=domain, skips=skips, find_secret=find_secret, default_export_to=default
            )
        )
        is not None
    ]
    return sorted(parsed, key=lambda r: (r.created, r.name, r.namespace))


# Indexing and lookup.


def _merge(existing: ParsedRule, rule: ParsedRule) -> ParsedRule:
    names = {s.name for s in existing.subsets}
    return replace(
        existing,
        subsets=existing.subsets + tuple(s for s in rule.subsets if s.name not in names),
        traffic_policy=existing.traffic_policy if existing.traffic_policy is not None else rule.traffic_policy,
        origins=existing.origins + rule.origins,
    )


class _Bucket:
    """Rules of one namespace filed by host (istiod's ``consolidatedDestRules``)."""

    def __init__(self) -> None:
        self.by_host: dict[str, list[ParsedRule]] = {}

    def add(self, rule: ParsedRule) -> None:
        entries = self.by_host.setdefault(rule.host, [])
        for i, entry in enumerate(entries):
            if entry.export_to == rule.export_to and not entry.selector and not rule.selector:
                entries[i] = _merge(entry, rule)
                return
        entries.append(rule)

    def match(self, hostname: str) -> list[ParsedRule] | None:
        exact = self.by_host.get(hostname)
        if exact:
            return exact
        best: str | None = None
        for host in self.by_host:
            if _wildcard_matches(host, hostname) and (best is None or len(host) > len(best)):
                best = host
        return self.by_host[best] if best is not None else None


def _wildcard_matches(pattern: str, hostname: str) -> bool:
    if pattern == "*":
        return True
    return pattern.startswith("*") and hostname.endswith(pattern[1:])


class DestinationRuleIndex:
    """The rules filed as istiod files them (rules 3-5)."""

    def __init__(self, rules: Iterable[ParsedRule], *, root_namespace: str) -> None:
        self.root_namespace = root_namespace
        self.local: dict[str, _Bucket] = {}
        self.exported: dict[str, _Bucket] = {}
        self.root_private = _Bucket()
        for rule in rules:
            own = rule.namespace
            export = frozenset({"."}) if rule.selector else rule.export_to  # never exported (istiod's Private)
            if not export or "*" in export or "." in export or own in export:
                self.local.setdefault(own, _Bucket()).add(rule)
            private_only = len(export) == 1 and ("." in export or own in export)
            if not private_only:
                self.exported.setdefault(own, _Bucket()).add(rule)
            elif own == root_namespace:
                self.root_private.add(rule)

    @property
    def has_rules(self) -> bool:
        """Whether any rule was filed (:meth:`find` finds nothing without one)."""
        return bool(self.local or self.exported or self.root_private.by_host)

    def find(
        self, waypoint_namespace: str, service: Service, proxy_labels: Mapping[str, str] | None = None
    ) -> ParsedRule | None:
        """The rule a waypoint in ``waypoint_namespace`` applies to ``service`` (rule 4); with ``proxy_labels``,
        the rule an ingress gateway whose pods carry those labels applies (rule 2's outbound lookup)."""
        if waypoint_namespace != self.root_namespace:
            bucket = self.local.get(waypoint_namespace)
            found = bucket.match(service.hostname) if bucket is not None else None
        else:
            found = self.root_private.match(service.hostname)
        if found:
            if proxy_labels is not None:
                for rule in found:
                    if rule.selector and all(proxy_labels.get(k) == v for k, v in rule.selector_labels):
                        return rule
            return next((r for r in reversed(found) if not r.selector), None)
        for owner in (service.namespace, self.root_namespace):
            bucket = self.exported.get(owner)
            candidates = bucket.match(service.hostname) if bucket is not None else None
            visible = [
                r
                for r in candidates or ()
                if not r.export_to or "*" in r.export_to or waypoint_namespace in r.export_to
            ]
            if visible:
                return visible[-1]
        return None


def destination_policies(
    index: DestinationRuleIndex,
    waypoint_namespace: str,
    services: Iterable[Service],
    workloads: Mapping[str, Iterable[tuple[str, Mapping[str, str]]]],
    proxy_labels: Mapping[str, str] | None = None,
) -> tuple[DestinationPolicy, ...]:
    """The policies of one waypoint: for each of ``services`` (those it serves) with a rule, that rule with its
    subsets resolved against ``workloads`` (service key → (uid, labels) of its workloads; rule 6). For an ingress
    gateway ``services`` are its routes' backends and ``proxy_labels`` its pods' labels (rule 2)."""
    out: list[DestinationPolicy] = []
    for service in sorted(services, key=lambda s: s.key):
        rule = index.find(waypoint_namespace, service, proxy_labels)
        if rule is None:
            continue
        members = list(workloads.get(service.key, ()))
        subsets = tuple(
            Subset(
                s.name,
                frozenset(uid for uid, labels in members if all(labels.get(k) == v for k, v in s.labels)),
                s.traffic_policy,
            )
            for s in rule.subsets
        )
        policy = DestinationPolicy(service.key, rule.key, rule.traffic_policy, subsets)
        out.append(policy if rule.namespace == waypoint_namespace else _without_keys(policy))
    return tuple(out)


def _without_keys(policy: DestinationPolicy) -> DestinationPolicy:
    """Rule 8: the policy with every Secret-given client certificate and key removed."""

    def tls(value: ClientTls | None) -> ClientTls | None:
        return None if value is None else replace(value, client_certificate="", private_key="")

    def traffic(value: TrafficPolicy | None) -> TrafficPolicy | None:
        if value is None:
            return None
        ports = tuple(replace(p, tls=tls(p.tls)) for p in value.port_level)
        return replace(value, tls=tls(value.tls), port_level=ports)

    subsets = tuple(replace(s, traffic_policy=traffic(s.traffic_policy)) for s in policy.subsets)
    return replace(policy, traffic_policy=traffic(policy.traffic_policy), subsets=subsets)
