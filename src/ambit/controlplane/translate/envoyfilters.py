"""EnvoyFilters → the patches each waypoint honours (:class:`~ambit.model.envoyfilter.ProxyPatches`), and a note
for every patch it does not.

Theory of operation: :func:`translate_envoy_filters` reads every EnvoyFilter once into the patches Ambit can
honour (each configuration patch read by :mod:`ambit.controlplane.translate.envoyfilter_patches`) and a
:class:`PatchNote` for each it cannot; then it picks, for each waypoint, the EnvoyFilters istiod would give that
waypoint and merges their honoured patches in istiod's order. Pure.

Rules (istiod's ``PushContext.EnvoyFilters`` with ``WorkloadPolicyMatcher`` for a waypoint):

1. Candidates: the EnvoyFilters of the root namespace and of the waypoint's namespace.
2. A waypoint takes an EnvoyFilter only by ``targetRefs`` (``targetRef`` when there are none): one naming
   ``gateway.networking.k8s.io`` ``Gateway`` with the waypoint's name, when the filter is in the waypoint's
   namespace and the target names that namespace or none; or, from the root namespace, one naming the
   ``GatewayClass`` ``istio-waypoint``. A filter without targets (``workloadSelector`` or nothing) never applies
   to a waypoint, nor does a filter of another namespace, whatever namespace its target names. Service and
   ServiceEntry targets match nothing here (istiod asks without the services).
3. Order: ``priority`` (lower first), then root-namespace filters first, then creation time, then
   ``name.namespace``; each filter's patches in the order written.
4. Ingress gateways: a Gateway API gateway takes a filter of its namespace whose targetRefs name its Gateway, or a
   filter of its namespace or the root namespace without targets whose ``workloadSelector`` (none: every
   workload) its pods' labels satisfy (istiod's selector-based gateway policy, on by default); an Istio Gateway's
   pods take only the selector kind. What a gateway honours of them:
   :mod:`~ambit.controlplane.translate.envoyfilter_patches` rule 5.
5. What each patch does, at a waypoint and at an ingress gateway, is
   :mod:`~ambit.controlplane.translate.envoyfilter_patches`'s (rules 1-5 there); its effects merge in rule 3's
   order when their ``proxyVersion`` matches, virtual-host header merges before route-configuration ones, the
   last connection-manager merge winning.
6. A refused patch is noted with the object, its generation and the patch (``spec.configPatches[i]``), for each
   kind of proxy that takes the object; an object no proxy takes is noted once, and one whose spec has not the
   schema's shape once.
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping
from dataclasses import dataclass, field
from typing import Any

from ambit.controlplane.translate import shapes
from ambit.controlplane.translate.envoyfilter_patches import Effect, read_effect
from ambit.controlplane.translate.envoyfilter_routes import RouteMerge
from ambit.controlplane.translate.envoyfilter_values import PatchRefused
from ambit.model.envoyfilter import NO_PATCHES, HeaderPatch, PatchScope, ProxyPatches, version_matches

__all__ = ["EnvoyFilterTranslation", "IngressProxy", "PatchNote", "translate_envoy_filters"]

GATEWAY_GROUP = "gateway.networking.k8s.io"
WAYPOINT_CLASS = "istio-waypoint"


@dataclass(frozen=True, slots=True, order=True)
class PatchNote:
    """One patch (or one object) that Ambit does not apply, and why."""

    namespace: str
    name: str
    field: str
    """``spec.configPatches[i]`` (or ``spec``)."""
    reason: str
    uid: str = ""
    generation: int = 0


@dataclass(frozen=True, slots=True)
class _Filter:
    namespace: str
    name: str
    priority: int
    created: str
    targets: tuple[tuple[str, str, str, str], ...]
    """(group, kind, name, namespace) of each target."""
    selector: Mapping[str, str] | None
    """``workloadSelector.labels``; None: no selector (every workload)."""
    effects: Mapping[bool, tuple[Effect, ...]]
    """What it does at a waypoint (False) and at an ingress gateway (True)."""
    notes: Mapping[bool, tuple[PatchNote, ...]]
    """What it does not, at each."""
    uid: str = ""
    generation: int = 0

    def sort_key(self, root: str) -> tuple[int, int, str, str]:
        return (self.priority, 0 if self.namespace == root else 1, self.created, f"{self.name}.{self.namespace}")

    def attaches_to(self, waypoint: str, root: str) -> bool:
        """Rule 2."""
        namespace, _, name = waypoint.partition("/")
        for group, kind, target, target_ns in self.targets:
            if self.namespace == root and (group, kind, target) == (GATEWAY_GROUP, "GatewayClass", WAYPOINT_CLASS):
                return True
            if self.namespace != namespace or target_ns not in ("", namespace):
                continue
            if group == GATEWAY_GROUP and kind == "Gateway" and target == name:
                return True
        return False

    def attaches_to_gateway(self, gateway: IngressProxy, root: str) -> bool:
        """Rule 4."""
        namespace, _, name = gateway.key.partition("/")
        if self.namespace not in (namespace, root):
            return False
        if not self.targets:
            return self.selector is None or all(gateway.labels.get(k) == v for k, v in self.selector.items())
        if not gateway.gateway_api or self.namespace != namespace:
            return False
        return any(
            (group, kind, target) == (GATEWAY_GROUP, "Gateway", name) and target_ns in ("", namespace)
            for group, kind, target, target_ns in self.targets
        )


@dataclass(frozen=True, slots=True)
class IngressProxy:
    """An ingress gateway as EnvoyFilter selection sees it."""

    key: str
    """``namespace/name`` of its config (:class:`~ambit.model.ingress.GatewayConfig`)."""
    labels: Mapping[str, str]
    """Its pods' labels."""
    gateway_api: bool
    """A Gateway API Gateway (its pods carry ``gateway.networking.k8s.io/gateway-name``), not an Istio Gateway's
    selected pods."""


@dataclass(frozen=True, slots=True)
class EnvoyFilterTranslation:
    """What each waypoint honours, and the notes on everything not applied."""

    by_waypoint: Mapping[str, ProxyPatches] = field(default_factory=dict)
    notes: tuple[PatchNote, ...] = ()
    by_gateway: Mapping[str, ProxyPatches] = field(default_factory=dict)
    route_merges: Mapping[str, tuple[RouteMerge, ...]] = field(default_factory=dict)
    """Each waypoint's HTTP_ROUTE merges, in order (:func:`.envoyfilter_routes.merge_routes` applies them)."""

    def for_waypoint(self, key: str) -> ProxyPatches:
        return self.by_waypoint.get(key, NO_PATCHES)

    def route_merges_for(self, key: str) -> tuple[RouteMerge, ...]:
        return self.route_merges.get(key, ())

    def for_gateway(self, key: str) -> ProxyPatches:
        return self.by_gateway.get(key, NO_PATCHES)


def _generation(meta: Mapping[str, Any]) -> int:
    value = meta.get("generation")
    return value if isinstance(value, int) and not isinstance(value, bool) else 0


def _targets(spec: Mapping[str, Any]) -> tuple[tuple[str, str, str, str], ...]:
    refs = shapes.list_of(spec.get("targetRefs"), "spec.targetRefs")
    if not refs and spec.get("targetRef") is not None:
        refs = [spec.get("targetRef")]
    out = []
    for i, raw in enumerate(refs):
        ref = shapes.mapping(raw, f"spec.targetRefs[{i}]")
        out.append(
            (
                shapes.text(ref.get("group"), f"spec.targetRefs[{i}].group"),
                shapes.text(ref.get("kind"), f"spec.targetRefs[{i}].kind"),
                shapes.text(ref.get("name"), f"spec.targetRefs[{i}].name"),
                shapes.text(ref.get("namespace"), f"spec.targetRefs[{i}].namespace"),
            )
        )
    return tuple(out)


def _read(obj: Mapping[str, Any], notes: list[PatchNote]) -> _Filter | None:
    """The object's targets, selector and, for each proxy kind, its effects and notes; None (and a note in
    ``notes``) when its spec has not the schema's shape."""
    meta = obj.get("metadata") or {}
    namespace, name = str(meta.get("namespace") or ""), str(meta.get("name") or "")
    generation = _generation(meta)
    uid = str(meta.get("uid") or "")

    def note(at: str, reason: str) -> PatchNote:
        return PatchNote(namespace, name, at, reason, uid, generation)

    try:
        spec = shapes.mapping(obj.get("spec"), "spec")
        targets = _targets(spec)
        priority = spec.get("priority", 0) or 0
        if not isinstance(priority, int) or isinstance(priority, bool):
            raise shapes.ShapeError("spec.priority", "expected an integer")
        patches = shapes.list_of(spec.get("configPatches"), "spec.configPatches")
        selector_spec = shapes.mapping(spec.get("workloadSelector"), "spec.workloadSelector")
        labels = shapes.mapping(selector_spec.get("labels"), "spec.workloadSelector.labels")
        selector = {str(k): str(v) for k, v in labels.items()} if "workloadSelector" in spec else None
    except shapes.ShapeError as exc:
        notes.append(note(exc.field, exc.reason))
        return None
    effects: dict[bool, tuple[Effect, ...]] = {}
    kind_notes: dict[bool, tuple[PatchNote, ...]] = {}
    for gateway in (False, True):
        found: list[Effect] = []
        refused: list[PatchNote] = []
        for i, raw in enumerate(patches):
            at = f"spec.configPatches[{i}]"
            try:
                effect = read_effect(raw, at, f"{namespace}/{name}[{i}]", gateway)
                found.append(effect)
                if effect.version_note:
                    refused.append(note(f"{at}.match.proxy.proxyVersion", effect.version_note))
            except PatchRefused as exc:
                refused.append(note(at, exc.reason.removeprefix(f"{at}.").removeprefix(f"{at}: ")))
            except shapes.ShapeError as exc:
                refused.append(note(at, f"{exc.field}: {exc.reason}"))
        effects[gateway], kind_notes[gateway] = tuple(found), tuple(refused)
    created = str(meta.get("creationTimestamp") or "")
    return _Filter(namespace, name, priority, created, targets, selector, effects, kind_notes, uid, generation)


def _merge(filters: Iterable[_Filter], version: str, gateway: bool) -> ProxyPatches:
    lua: list[HeaderPatch] = []
    routes: list[HeaderPatch] = []
    h2: list[PatchScope] = []
    hops: int | None = None
    for f in filters:
        for effect in f.effects[gateway]:
            if not version_matches(effect.version_pattern, version):
                continue
            if effect.kind == "filter" and effect.patch is not None:
                lua.append(effect.patch)
            elif effect.kind == "route" and effect.patch is not None:
                routes.append(effect.patch)
            elif effect.kind == "cluster":
                h2.append(effect.scope)
            elif effect.kind == "hcm" and effect.trusted_hops is not None:
                hops = effect.trusted_hops  # merges apply in order: the last one wins
    routes.sort(key=lambda p: p.level)  # stable: the filters' order within a level
    return ProxyPatches(tuple(lua), tuple(routes), tuple(dict.fromkeys(h2)), hops)


def translate_envoy_filters(
    objects: Iterable[Mapping[str, Any]],
    waypoints: Iterable[str],
    *,
    root_namespace: str,
    proxy_version: str,
    gateways: Iterable[IngressProxy] = (),
) -> EnvoyFilterTranslation:
    """Rules 1-6 for every waypoint in ``waypoints`` (``namespace/name`` keys) and every ingress gateway in
    ``gateways``; ``proxy_version``: the version Ambit's proxies state (``ISTIO_VERSION``)."""
    notes: list[PatchNote] = []
    by_namespace: dict[str, list[_Filter]] = {}
    read: list[_Filter] = []
    for obj in objects:
        f = _read(obj, notes)
        if f is not None:
            by_namespace.setdefault(f.namespace, []).append(f)
            read.append(f)

    def candidates(namespace: str) -> list[_Filter]:
        found = [*by_namespace.get(root_namespace, ())]
        if namespace != root_namespace:
            found.extend(by_namespace.get(namespace, ()))
        return found

    attached: dict[tuple[str, str], set[bool]] = {}
    out: dict[str, ProxyPatches] = {}
    route_merges: dict[str, tuple[RouteMerge, ...]] = {}
    for key in sorted(set(waypoints)):
        chosen = [f for f in candidates(key.partition("/")[0]) if f.attaches_to(key, root_namespace)]
        chosen.sort(key=lambda f: f.sort_key(root_namespace))
        for f in chosen:
            attached.setdefault((f.namespace, f.name), set()).add(False)
        if merged := _merge(chosen, proxy_version, False):
            out[key] = merged
        merges = tuple(
            e.route_merge
            for f in chosen
            for e in f.effects[False]
            if e.route_merge is not None and version_matches(e.version_pattern, proxy_version)
        )
        if merges:
            route_merges[key] = merges
    out_gateways: dict[str, ProxyPatches] = {}
    for gateway in sorted(gateways, key=lambda g: g.key):
        chosen = [
            f for f in candidates(gateway.key.partition("/")[0]) if f.attaches_to_gateway(gateway, root_namespace)
        ]
        chosen.sort(key=lambda f: f.sort_key(root_namespace))
        for f in chosen:
            attached.setdefault((f.namespace, f.name), set()).add(True)
        if merged := _merge(chosen, proxy_version, True):
            out_gateways[gateway.key] = merged
    for f in read:
        kinds = attached.get((f.namespace, f.name))
        if kinds is None:
            notes.append(
                PatchNote(
                    f.namespace,
                    f.name,
                    "spec",
                    "applies to no Ambit proxy: waypoints take an EnvoyFilter only by targetRefs to their Gateway "
                    f"(same namespace) or to GatewayClass {WAYPOINT_CLASS} (root namespace), ingress gateways by "
                    "targetRefs or workloadSelector; Ambit runs no sidecars",
                    f.uid,
                    f.generation,
                )
            )
            continue
        for kind in sorted(kinds):
            notes.extend(f.notes[kind])
    return EnvoyFilterTranslation(out, tuple(sorted(set(notes))), out_gateways, route_merges)
