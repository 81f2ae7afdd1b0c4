"""Istio ``DestinationRule`` objects → the :class:`~ambit.model.routes.DestinationPolicy` each waypoint applies to
each Service it serves.

Theory of operation: :func:`parse_destination_rules` reads every rule once (a rule with a bad field is skipped
whole, with a :class:`~ambit.controlplane.translate.skips.Skipped` naming the field; a setting a waypoint cannot
honour is dropped from the rule with a note, the rest kept). :class:`DestinationRuleIndex` then files them the way
istiod's ``PushContext.setDestinationRules`` does, and :meth:`DestinationRuleIndex.find` answers istiod's
``destinationRule(proxyNamespace, service)`` for a waypoint, and for an ingress gateway (its pods' namespace and
the backend Services of its routes; istiod's cluster builder applies the same lookup to a gateway's clusters).
:func:`destination_policies` resolves the chosen rule's subsets to workload uids. Pure: no I/O, deterministic
output.

Rules (istiod: pilot/pkg/model/push_context.go ``setDestinationRules``, ``destinationRule``; destination_rule.go
``mergeDestinationRule``; sidecar.go ``DestinationRule``; networking/core/cluster_waypoint.go):

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
7. Settings a waypoint does not honour are dropped with a note: ``tls.caCrl``, the ``consistentHash`` kinds other
   than header, query parameter and source IP, ``tunnel``. (``localityLbSetting`` is honoured:
   :mod:`.locality_lb` reads it, :mod:`ambit.model.locality_lb` applies it.) TLS material, as istiod hands it to
   a waypoint:
   ``credentialName`` names a Secret of the rule's namespace (of any type the control plane watches:
   :data:`~ambit.controlplane.view.CREDENTIAL_SECRETS`) whose ``ca.crt`` (or ``cacert``) becomes the trust
   anchors and, for ``MUTUAL``, whose ``tls.crt``/``tls.key`` (or ``cert``/``key``) the client certificate and key
   (the file fields are then ignored, with a note); a ``credentialName`` that names no Secret marks the settings
   ``trust_unresolved``: the waypoint refuses the endpoint rather than verify it against its system trust store;
   without it ``caCertificates``, ``clientCertificate`` and
   ``privateKey`` are paths the waypoint reads itself. Anything missing is noted and left empty: the waypoint
   then refuses MUTUAL traffic (503) rather than send it without the certificate asked for. ``ISTIO_MUTUAL`` is
   kept and changes nothing at a waypoint (HBONE already is mutual TLS; istiod builds no context for it either).
8. A Secret's certificate and key go only to waypoints of the Secret's (the rule's) namespace, as istiod serves a
   ``credentialName`` only from the proxy's own namespace: a waypoint elsewhere that applies an exported rule gets
   its TLS settings without the key material, and so refuses MUTUAL traffic (503).
"""

from __future__ import annotations

import base64
import binascii
import re
from collections.abc import Callable, Iterable, Mapping
from dataclasses import dataclass, field, replace
from typing import Any

from ambit.controlplane.translate import shapes
from ambit.controlplane.translate.locality_lb import failover_note, read_locality_lb
from ambit.controlplane.translate.requestauth import parse_duration
from ambit.controlplane.translate.skips import ObjectKind, Skipped, skipped
from ambit.model.routes import (
    ClientTls,
    ConnectionPool,
    ConsistentHash,
    DestinationPolicy,
    H2Upgrade,
    LoadBalancer,
    LoadBalancerType,
    OutlierDetection,
    PortTrafficPolicy,
    ProxyProtocolVersion,
    Subset,
    TlsMode,
    TrafficPolicy,
)
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
MAX_COUNT = 2**32 - 1
_DNS_LABEL = re.compile(r"[a-z0-9]([-a-z0-9]{0,61}[a-z0-9])?")
_LB = {
    "UNSPECIFIED": LoadBalancerType.LEAST_REQUEST,
    "LEAST_CONN": LoadBalancerType.LEAST_REQUEST,
    "LEAST_REQUEST": LoadBalancerType.LEAST_REQUEST,
    "ROUND_ROBIN": LoadBalancerType.ROUND_ROBIN,
    "RANDOM": LoadBalancerType.RANDOM,
    "PASSTHROUGH": LoadBalancerType.PASSTHROUGH,
}
_H2 = {"DEFAULT": H2Upgrade.DEFAULT, "DO_NOT_UPGRADE": H2Upgrade.DO_NOT_UPGRADE, "UPGRADE": H2Upgrade.UPGRADE}
_TLS = {m.value: m for m in TlsMode}
_PROXY = {"V1": ProxyProtocolVersion.V1, "V2": ProxyProtocolVersion.V2}
SecretFinder = Callable[[str, str], Obj | None]
"""``find_secret(namespace, name)``: a Secret object, or None."""


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


def _count(value: Any, path: str) -> int:
    if value is None:
        return 0
    if isinstance(value, bool) or not isinstance(value, int) or not 0 <= value <= MAX_COUNT:
        raise shapes.ShapeError(path, f"expected a whole number 0..{MAX_COUNT}, got {value!r}")
    return value


def _flag(value: Any, path: str) -> bool:
    if value is not None and not isinstance(value, bool):
        raise shapes.ShapeError(path, f"expected true or false, got {value!r}")
    return bool(value)


def _seconds(value: Any, path: str) -> float | None:
    if value is None:
        return None
    seconds = parse_duration(value) if isinstance(value, str) else None
    if seconds is None or seconds <= 0:
        raise shapes.ShapeError(path, f"expected a positive duration such as 1s or 500ms, got {value!r}")
    return seconds


def _choice(value: Any, path: str, table: Mapping[str, Any], default: Any) -> Any:
    if value is None:
        return default
    if not isinstance(value, str) or value not in table:
        raise shapes.ShapeError(path, f"expected one of {', '.join(table)}, got {value!r}")
    return table[value]


_TLS_FILES = ("caCertificates", "clientCertificate", "privateKey")


@dataclass(frozen=True, slots=True)
class _Material:
    """What a ``credentialName`` Secret gave (rule 7)."""

    ca: str = ""
    certificate: str = ""
    key: str = field(default="", repr=False)
    unresolved: bool = False
    """The Secret does not exist: the proxy must refuse, not fall back to its system trust store."""


class _Reader:
    """Reads one rule's traffic policies; notes what it drops (rule 7)."""

    def __init__(self, namespace: str, find_secret: SecretFinder) -> None:
        self.namespace = namespace
        self.find_secret = find_secret
        self.notes: list[tuple[str, str]] = []

    def load_balancer(self, value: Any, path: str) -> LoadBalancer | None:
        if value is None:
            return None
        spec = shapes.mapping(value, path)
        simple = _choice(spec.get("simple"), f"{path}.simple", _LB, LoadBalancerType.LEAST_REQUEST)
        consistent = None
        if spec.get("consistentHash") is not None:
            at = f"{path}.consistentHash"
            hashed = shapes.mapping(spec.get("consistentHash"), at)
            header = shapes.text(hashed.get("httpHeaderName"), f"{at}.httpHeaderName")
            query = shapes.text(hashed.get("httpQueryParameterName"), f"{at}.httpQueryParameterName")
            source_ip = hashed.get("useSourceIp") is True
            if sum((bool(header), bool(query), source_ip)) == 1:
                consistent = ConsistentHash(header.lower(), query, source_ip)
            else:
                self.notes.append((at, "only httpHeaderName, httpQueryParameterName or useSourceIp is honoured"))
        locality = None
        if spec.get("localityLbSetting") is not None:
            locality, notes = read_locality_lb(spec.get("localityLbSetting"), f"{path}.localityLbSetting")
            self.notes.extend(notes)
        return LoadBalancer(simple, consistent, locality)

    def note_failover(self, policy: TrafficPolicy | PortTrafficPolicy, path: str) -> None:
        """istiod's warning for failover without outlier detection in the same policy."""
        locality = policy.load_balancer.locality if policy.load_balancer is not None else None
        self.notes.extend(failover_note(locality, policy.outlier_detection, f"{path}.loadBalancer.localityLbSetting"))

    def connection_pool(self, value: Any, path: str) -> ConnectionPool | None:
        if value is None:
            return None
        spec = shapes.mapping(value, path)
        tcp = shapes.mapping(spec.get("tcp"), f"{path}.tcp")
        http = shapes.mapping(spec.get("http"), f"{path}.http")
        return ConnectionPool(
            max_connections=_count(tcp.get("maxConnections"), f"{path}.tcp.maxConnections"),
            connect_timeout=_seconds(tcp.get("connectTimeout"), f"{path}.tcp.connectTimeout"),
            http1_max_pending_requests=_count(
                http.get("http1MaxPendingRequests"), f"{path}.http.http1MaxPendingRequests"
            ),
            http2_max_requests=_count(http.get("http2MaxRequests"), f"{path}.http.http2MaxRequests"),
            max_requests_per_connection=_count(
                http.get("maxRequestsPerConnection"), f"{path}.http.maxRequestsPerConnection"
            ),
            h2_upgrade=_choice(http.get("h2UpgradePolicy"), f"{path}.http.h2UpgradePolicy", _H2, H2Upgrade.DEFAULT),
            use_client_protocol=_flag(http.get("useClientProtocol"), f"{path}.http.useClientProtocol"),
        )

    def outlier(self, value: Any, path: str) -> OutlierDetection | None:
        if value is None:
            return None
        spec = shapes.mapping(value, path)
        errors = spec.get("consecutive5xxErrors", spec.get("consecutiveErrors"))
        percent = (
            _count(spec.get("maxEjectionPercent"), f"{path}.maxEjectionPercent")
            if (spec.get("maxEjectionPercent") is not None)
            else 10
        )
        if percent > 100:
            raise shapes.ShapeError(f"{path}.maxEjectionPercent", f"expected 0..100, got {percent}")
        return OutlierDetection(
            consecutive_5xx=_count(errors, f"{path}.consecutive5xxErrors") if errors is not None else 5,
            interval=_seconds(spec.get("interval"), f"{path}.interval") or 10.0,
            base_ejection_time=_seconds(spec.get("baseEjectionTime"), f"{path}.baseEjectionTime") or 30.0,
            max_ejection_percent=percent,
        )

    def tls(self, value: Any, path: str) -> ClientTls | None:
        if value is None:
            return None
        spec = shapes.mapping(value, path)
        mode = _choice(spec.get("mode"), f"{path}.mode", _TLS, TlsMode.DISABLE)
        if spec.get("caCrl"):
            self.notes.append((f"{path}.caCrl", "not honoured at a waypoint"))
        files = {name: shapes.text(spec.get(name), f"{path}.{name}") for name in _TLS_FILES}
        credential = shapes.text(spec.get("credentialName"), f"{path}.credentialName")
        material = _Material()
        if credential:
            for name in (n for n, given in files.items() if given):
                self.notes.append((f"{path}.{name}", "credentialName is set: the file is not read"))
            files = dict.fromkeys(files, "")
            material = self._from_secret(credential, f"{path}.credentialName", mutual=mode is TlsMode.MUTUAL)
        elif mode is TlsMode.MUTUAL and not (files["clientCertificate"] and files["privateKey"]):
            self.notes.append((path, "MUTUAL needs credentialName, or clientCertificate and privateKey"))
        skip = spec.get("insecureSkipVerify")
        if skip is not None and not isinstance(skip, bool):
            raise shapes.ShapeError(f"{path}.insecureSkipVerify", f"expected true or false, got {skip!r}")
        return ClientTls(
            mode=mode,
            sni=shapes.text(spec.get("sni"), f"{path}.sni"),
            insecure_skip_verify=bool(skip),
            ca_certificates=material.ca,
            subject_alt_names=tuple(shapes.strings(spec.get("subjectAltNames"), f"{path}.subjectAltNames")),
            client_certificate=material.certificate,
            private_key=material.key,
            ca_certificates_path=files["caCertificates"],
            client_certificate_path=files["clientCertificate"],
            private_key_path=files["privateKey"],
            trust_unresolved=material.unresolved,
        )

    def _from_secret(self, name: str, path: str, *, mutual: bool) -> _Material:
        """Rule 7: ``ca.crt`` (or ``cacert``), and for MUTUAL ``tls.crt``/``tls.key`` (or ``cert``/``key``)."""
        secret = self.find_secret(self.namespace, name)
        data = (secret or {}).get("data") if isinstance(secret, Mapping) else None
        if not isinstance(data, Mapping):
            self.notes.append((path, f"Secret {self.namespace}/{name} not found"))
            return _Material(unresolved=True)
        ca = self._secret_pem(data, ("ca.crt", "cacert"), name, path, "-----BEGIN CERTIFICATE-----")
        if not mutual:
            if ca is None:
                self.notes.append((path, f"Secret {self.namespace}/{name} with a ca.crt not found"))
            return _Material(ca or "")
        certificate = self._secret_pem(data, ("tls.crt", "cert"), name, path, "-----BEGIN CERTIFICATE-----")
        key = self._secret_pem(data, ("tls.key", "key"), name, path, "PRIVATE KEY-----")
        if certificate is None or key is None:
            self.notes.append((path, f"Secret {self.namespace}/{name}: MUTUAL needs tls.crt and tls.key"))
            return _Material(ca or "")
        return _Material(ca or "", certificate, key)

    def _secret_pem(
        self, data: Mapping[str, Any], keys: tuple[str, str], name: str, path: str, marker: str
    ) -> str | None:
        """The first of ``keys`` the Secret has, decoded; None when absent or not PEM (noted; never quoted)."""
        raw = next((data[k] for k in keys if k in data), None)
        if raw is None:
            return None
        try:
            text = base64.b64decode(raw, validate=True).decode("ascii") if isinstance(raw, str) else ""
        except (binascii.Error, UnicodeDecodeError):
            text = ""
        if marker not in text:
            self.notes.append((path, f"Secret {self.namespace}/{name}: {keys[0]} is not base64 PEM"))
            return None
        return text

    def port_level(self, value: Any, path: str) -> tuple[PortTrafficPolicy, ...]:
        out: dict[int, PortTrafficPolicy] = {}
        for i, item in enumerate(shapes.list_of(value, path)):
            at = f"{path}[{i}]"
            spec = shapes.mapping(item, at, required=True)
            number = shapes.mapping(spec.get("port"), f"{at}.port", required=True).get("number")
            if isinstance(number, bool) or not isinstance(number, int) or not 1 <= number <= 65535:
                raise shapes.ShapeError(f"{at}.port.number", f"expected a port 1..65535, got {number!r}")
            entry = PortTrafficPolicy(
                number,
                self.load_balancer(spec.get("loadBalancer"), f"{at}.loadBalancer"),
                self.connection_pool(spec.get("connectionPool"), f"{at}.connectionPool"),
                self.outlier(spec.get("outlierDetection"), f"{at}.outlierDetection"),
                self.tls(spec.get("tls"), f"{at}.tls"),
            )
            self.note_failover(entry, at)
            out.setdefault(number, entry)
        return tuple(out.values())

    def traffic_policy(self, value: Any, path: str) -> TrafficPolicy | None:
        if value is None:
            return None
        spec = shapes.mapping(value, path)
        if spec.get("tunnel") is not None:
            self.notes.append((f"{path}.tunnel", "not honoured at a waypoint"))
        proxy = None
        if spec.get("proxyProtocol") is not None:
            at = f"{path}.proxyProtocol"
            proxy = _choice(shapes.mapping(spec.get("proxyProtocol"), at).get("version"), f"{at}.version", _PROXY, None)
            proxy = proxy or ProxyProtocolVersion.V1
        policy = TrafficPolicy(
            load_balancer=self.load_balancer(spec.get("loadBalancer"), f"{path}.loadBalancer"),
            connection_pool=self.connection_pool(spec.get("connectionPool"), f"{path}.connectionPool"),
            outlier_detection=self.outlier(spec.get("outlierDetection"), f"{path}.outlierDetection"),
            tls=self.tls(spec.get("tls"), f"{path}.tls"),
            proxy_protocol=proxy,
            port_level=self.port_level(spec.get("portLevelSettings"), f"{path}.portLevelSettings"),
        )
        self.note_failover(policy, path)
        return policy


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
    reader = _Reader(namespace, find_secret)
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
