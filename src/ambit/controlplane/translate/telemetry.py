"""Telemetry (telemetry.istio.io v1, v1alpha1) → the metric overrides each waypoint applies, per destination service.

Theory of operation: :func:`translate_telemetry` reads one object once (its scope and its ``metrics``);
:func:`waypoint_metrics` then gives each ready waypoint one :class:`~ambit.model.metric_overrides.ServiceMetrics`
for the requests without a service of their own (key ``""``) and one for each service bound to it whose result
differs, as istiod computes a waypoint's stats filter per service (pilot/pkg/model/telemetry.go). Pure.

Rules:

1. Which Telemetries apply to a waypoint's requests for service S, in this order (later ones override earlier):
   the root namespace's namespace-wide one (neither ``selector`` nor ``targetRefs``), the waypoint namespace's
   namespace-wide one (unless that is the root), S's namespace's namespace-wide one (when S lives elsewhere);
   then, in S's namespace (or the waypoint's, without S), in creation order, each one whose ``targetRefs`` name
   the waypoint's Gateway (same namespace as the waypoint), S (a core Service, or a ServiceEntry, in the
   Telemetry's namespace), or the GatewayClass ``istio-waypoint`` (from the root namespace; as istiod only looks
   in that one namespace, such a Telemetry reaches the waypoints whose requests' namespace is the root). A
   namespace's namespace-wide Telemetry is its oldest. A ``selector`` never reaches a waypoint, as istiod's
   policy matcher says ("waypoints never use selector").
2. Providers: a ``metrics`` entry without ``providers`` inherits the previous entry's (the mesh default,
   ``prometheus``, first); the last non-empty list decides which providers are configured at all. Without
   ``prometheus`` there, the waypoint reports no request metrics (``disabled``). Entries for other providers
   are ignored.
3. A waypoint reports as a server (istiod builds its HTTP chain with the inbound listener class): an override
   whose ``match.mode`` is ``CLIENT`` does not apply; ``SERVER``, ``CLIENT_AND_SERVER`` and none do.
4. Overrides merge in order per metric (``match.metric`` absent or ``ALL_METRICS``: every standard metric):
   ``disabled`` when given replaces the earlier value, ``tagOverrides`` replace tags by name. ``ALL_METRICS``
   with ``disabled: true`` disables everything until a later override names a metric again.
5. What is skipped, with a reason (a Warning Event): the whole object when it has both ``selector`` and
   ``targetRefs`` or a field of the wrong shape; a target of another kind; an override matching a
   ``customMetric`` or with an unknown metric or mode; a tag whose name is not a Prometheus label name, whose
   operation is unknown, whose UPSERT has no value, or whose value is an expression Ambit cannot evaluate
   (:func:`~ambit.model.metric_overrides.parse_expression`). The rest of the object still applies.
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping
from dataclasses import dataclass, field
from typing import Any

from ambit.controlplane.translate import shapes
from ambit.controlplane.translate.skips import ObjectKind, Skipped, skipped
from ambit.model.metric_overrides import (
    Expression,
    ExpressionError,
    IstioMetric,
    MetricOverride,
    ServiceMetrics,
    TagOverride,
    parse_expression,
    tag_name_problem,
)

__all__ = [
    "TELEMETRY",
    "ServiceRef",
    "TelemetryTranslation",
    "metrics_for",
    "translate_telemetry",
    "waypoint_metrics",
]

TELEMETRY = ObjectKind("telemetry.istio.io/v1", "Telemetry")
PROMETHEUS = "prometheus"
WAYPOINT_CLASS = "istio-waypoint"
_GATEWAY_GROUP = "gateway.networking.k8s.io"
_TARGET_KINDS = {
    (_GATEWAY_GROUP, "Gateway"),
    (_GATEWAY_GROUP, "GatewayClass"),
    ("", "Service"),
    ("core", "Service"),
    ("networking.istio.io", "ServiceEntry"),
}
_MODES = {"CLIENT": frozenset({"CLIENT"}), "SERVER": frozenset({"SERVER"})}
_BOTH = frozenset({"CLIENT", "SERVER"})

Obj = Mapping[str, Any]


@dataclass(frozen=True, slots=True)
class _Override:
    metrics: tuple[IstioMetric, ...]
    all_metrics: bool
    modes: frozenset[str]
    disabled: bool | None
    tags: tuple[TagOverride, ...]


@dataclass(frozen=True, slots=True)
class _Metrics:
    providers: tuple[str, ...]
    overrides: tuple[_Override, ...]


@dataclass(frozen=True, slots=True)
class TelemetryTranslation:
    namespace: str
    name: str
    created: str
    """``metadata.creationTimestamp`` (RFC 3339 sorts as text): the order Telemetries apply in."""
    namespace_wide: bool
    """Neither ``selector`` nor ``targetRefs``."""
    targets: tuple[tuple[str, str, str], ...] = ()
    """(kind, namespace, name); a GatewayClass has no namespace."""
    metrics: tuple[_Metrics, ...] = ()


@dataclass(frozen=True, slots=True)
class ServiceRef:
    """A destination service as rule 1 matches it."""

    kind: str
    """``Service`` or ``ServiceEntry``."""
    namespace: str
    name: str


def _target(ref: Any, where: str, namespace: str) -> tuple[str, str, str]:
    ref = shapes.mapping(ref, where, required=True)
    group = shapes.text(ref.get("group"), f"{where}.group")
    kind = shapes.text(ref.get("kind"), f"{where}.kind", required=True)
    name = shapes.text(ref.get("name"), f"{where}.name", required=True)
    ref_namespace = shapes.text(ref.get("namespace"), f"{where}.namespace")
    if (group, kind) not in _TARGET_KINDS:
        raise shapes.ShapeError(f"{where}.kind", f"unsupported target {kind!r} in group {group!r}")
    if ref_namespace and ref_namespace != namespace:
        raise shapes.ShapeError(f"{where}.namespace", "cross-namespace references are not supported")
    return (kind, "" if kind == "GatewayClass" else namespace, name)


def _tags(value: Any, where: str, obj: Obj, skips: list[Skipped]) -> tuple[TagOverride, ...]:
    out: list[TagOverride] = []
    for name, item in shapes.mapping(value, where).items():
        at = f"{where}.{name}"
        try:
            problem = tag_name_problem(name)
            if problem is not None:
                raise shapes.ShapeError(at, problem)
            tag = shapes.mapping(item, at)
            operation = shapes.text(tag.get("operation"), f"{at}.operation") or "UPSERT"
            if operation == "REMOVE":
                out.append(TagOverride(name))
                continue
            if operation != "UPSERT":
                raise shapes.ShapeError(f"{at}.operation", f"unknown operation {operation!r} (UPSERT or REMOVE)")
            text = shapes.text(tag.get("value"), f"{at}.value", required=True)
            try:
                expression: Expression = parse_expression(text)
            except ExpressionError as exc:
                raise shapes.ShapeError(f"{at}.value", exc.reason) from None
            out.append(TagOverride(name, expression))
        except shapes.ShapeError as exc:
            skips.append(skipped(TELEMETRY, obj, exc.field, exc.reason))
    return tuple(sorted(out, key=lambda t: t.name))


def _override(value: Any, where: str, obj: Obj, skips: list[Skipped]) -> _Override:
    item = shapes.mapping(value, where, required=True)
    match = shapes.mapping(item.get("match"), f"{where}.match")
    if match.get("customMetric") is not None:
        raise shapes.ShapeError(f"{where}.match.customMetric", "custom metrics are not supported at waypoints")
    metric = shapes.text(match.get("metric"), f"{where}.match.metric") or "ALL_METRICS"
    mode = shapes.text(match.get("mode"), f"{where}.match.mode") or "CLIENT_AND_SERVER"
    if mode not in (*_MODES, "CLIENT_AND_SERVER"):
        raise shapes.ShapeError(f"{where}.match.mode", f"unknown mode {mode!r}")
    if metric == "ALL_METRICS":
        metrics, every = tuple(IstioMetric), True
    elif metric in IstioMetric.__members__:
        metrics, every = (IstioMetric[metric],), False
    else:
        raise shapes.ShapeError(f"{where}.match.metric", f"unknown metric {metric!r}")
    disabled = item.get("disabled")
    if disabled is not None and not isinstance(disabled, bool):
        raise shapes.ShapeError(f"{where}.disabled", f"expected a boolean, got {type(disabled).__name__}")
    tags = _tags(item.get("tagOverrides"), f"{where}.tagOverrides", obj, skips)
    return _Override(metrics, every, _MODES.get(mode, _BOTH), disabled, tags)


def _metrics(value: Any, where: str, obj: Obj, skips: list[Skipped]) -> _Metrics:
    item = shapes.mapping(value, where, required=True)
    providers = tuple(
        shapes.text(shapes.mapping(p, f"{where}.providers[{i}]", required=True).get("name"), f"{where}.providers[{i}]")
        for i, p in enumerate(shapes.list_of(item.get("providers"), f"{where}.providers"))
    )
    overrides = []
    for i, o in enumerate(shapes.list_of(item.get("overrides"), f"{where}.overrides")):
        try:
            overrides.append(_override(o, f"{where}.overrides[{i}]", obj, skips))
        except shapes.ShapeError as exc:
            skips.append(skipped(TELEMETRY, obj, exc.field, exc.reason))
    return _Metrics(tuple(p for p in providers if p), tuple(overrides))


def translate_telemetry(obj: Obj, *, skips: list[Skipped]) -> TelemetryTranslation | None:
    """One object's scope and metrics (rule 5 for what is left out); None when the whole object is invalid."""
    meta = obj.get("metadata") or {}
    namespace, name = str(meta.get("namespace") or ""), str(meta.get("name") or "")
    try:
        spec = shapes.mapping(obj.get("spec") or {}, "spec", required=True)
        refs = shapes.list_of(spec.get("targetRefs"), "spec.targetRefs")
        single = spec.get("targetRef")
        if single is not None:
            if refs:
                raise shapes.ShapeError("spec.targetRef", "only one of targetRef or targetRefs can be set")
            refs = [single]
        selector = shapes.mapping(spec.get("selector"), "spec.selector")
        labels = shapes.mapping(selector.get("matchLabels"), "spec.selector.matchLabels")
        if labels and refs:
            raise shapes.ShapeError("spec.selector", "only one of selector or targetRefs can be set")
        entries = shapes.list_of(spec.get("metrics"), "spec.metrics")
    except shapes.ShapeError as exc:
        skips.append(skipped(TELEMETRY, obj, exc.field, exc.reason))
        return None
    targets = set()
    for i, ref in enumerate(refs):
        try:
            targets.add(_target(ref, f"spec.targetRefs[{i}]", namespace))
        except shapes.ShapeError as exc:
            skips.append(skipped(TELEMETRY, obj, exc.field, exc.reason))
    metrics = []
    for i, entry in enumerate(entries):
        try:
            metrics.append(_metrics(entry, f"spec.metrics[{i}]", obj, skips))
        except shapes.ShapeError as exc:
            skips.append(skipped(TELEMETRY, obj, exc.field, exc.reason))
    return TelemetryTranslation(
        namespace,
        name,
        str(meta.get("creationTimestamp") or ""),
        namespace_wide=not labels and not refs,
        targets=tuple(sorted(targets)),
        metrics=tuple(metrics),
    )


@dataclass(slots=True)
class _Merged:
    disabled: bool | None = None
    tags: dict[str, TagOverride] = field(default_factory=dict)


def _namespace_wide(by_namespace: Mapping[str, list[TelemetryTranslation]], namespace: str) -> tuple[_Metrics, ...]:
    for t in by_namespace.get(namespace, ()):
        if t.namespace_wide:
            return t.metrics
    return ()


def _attached(
    t: TelemetryTranslation, waypoint: tuple[str, str], service: ServiceRef | None, root_namespace: str
) -> bool:
    for kind, namespace, name in t.targets:
        if kind in ("Service", "ServiceEntry"):
            if service is not None and (kind, t.namespace, name) == (service.kind, service.namespace, service.name):
                return True
        elif kind == "GatewayClass":
            if t.namespace == root_namespace and name == WAYPOINT_CLASS:
                return True
        elif t.namespace == waypoint[0] and namespace == waypoint[0] and name == waypoint[1]:
            return True
    return False


def metrics_for(
    by_namespace: Mapping[str, list[TelemetryTranslation]],
    waypoint: tuple[str, str],
    service: ServiceRef | None,
    *,
    service_key: str = "",
    root_namespace: str,
) -> ServiceMetrics:
    """The overrides of ``waypoint``'s (namespace, name) requests for ``service`` (rules 1-4); ``by_namespace``
    holds each namespace's translations in creation order."""
    applied: list[_Metrics] = list(_namespace_wide(by_namespace, root_namespace)) if root_namespace else []
    namespace = waypoint[0]
    if namespace != root_namespace:
        applied.extend(_namespace_wide(by_namespace, namespace))
    if service is not None and namespace != service.namespace:
        namespace = service.namespace
        applied.extend(_namespace_wide(by_namespace, namespace))
    for t in by_namespace.get(namespace, ()):
        if not t.namespace_wide and _attached(t, waypoint, service, root_namespace):
            applied.extend(t.metrics)
    in_scope: tuple[str, ...] = (PROMETHEUS,)
    for m in applied:
        in_scope = m.providers or in_scope
    if PROMETHEUS not in in_scope:
        return ServiceMetrics(service_key, disabled=True)
    parent: tuple[str, ...] = (PROMETHEUS,)
    all_disabled = False
    merged: dict[IstioMetric, _Merged] = {}
    for m in applied:
        parent = m.providers or parent
        if PROMETHEUS not in parent:
            continue
        for o in m.overrides:
            if "SERVER" not in o.modes:
                continue
            if o.all_metrics and o.disabled is True:
                all_disabled = True
                continue
            all_disabled = False
            for metric in o.metrics:
                entry = merged.setdefault(metric, _Merged())
                if o.disabled is not None:
                    entry.disabled = o.disabled
                entry.tags.update((t.name, t) for t in o.tags)
    if all_disabled:
        return ServiceMetrics(service_key, disabled=True)
    overrides = tuple(
        MetricOverride(metric, bool(entry.disabled), tuple(entry.tags[k] for k in sorted(entry.tags)))
        for metric, entry in sorted(merged.items(), key=lambda kv: kv[0].value)
        if entry.disabled or entry.tags
    )
    return ServiceMetrics(service_key, overrides=overrides)


def waypoint_metrics(
    translations: Iterable[TelemetryTranslation],
    *,
    waypoints: Iterable[str],
    services: Mapping[str, ServiceRef],
    bound: Mapping[str, str],
    canaries: Mapping[str, str],
    root_namespace: str,
) -> dict[str, tuple[ServiceMetrics, ...]]:
    """Each ready waypoint's overrides: ``""`` first when it has any, then each bound service (primary or canary)
    whose result differs from ``""``'s, by key. ``services``: service key → what rule 1 matches it as; ``bound``,
    ``canaries``: service key → waypoint key. Waypoints with nothing to override are left out."""
    by_namespace: dict[str, list[TelemetryTranslation]] = {}
    for t in sorted(translations, key=lambda t: (t.created, t.name)):
        by_namespace.setdefault(t.namespace, []).append(t)
    if not by_namespace:
        return {}
    served: dict[str, list[str]] = {}
    for key in services:
        for waypoint in {bound.get(key), canaries.get(key)} - {None}:
            served.setdefault(str(waypoint), []).append(key)
    out: dict[str, tuple[ServiceMetrics, ...]] = {}
    for waypoint in sorted(set(waypoints)):
        at = tuple(waypoint.split("/", 1))
        where = (at[0], at[-1])
        default = metrics_for(by_namespace, where, None, root_namespace=root_namespace)
        entries = [default] if default.disabled or default.overrides else []
        for key in sorted(served.get(waypoint, ())):
            own = metrics_for(by_namespace, where, services[key], service_key=key, root_namespace=root_namespace)
            if (own.disabled, own.overrides) != (default.disabled, default.overrides):
                entries.append(own)
        if entries:
            out[waypoint] = tuple(entries)
    return out
