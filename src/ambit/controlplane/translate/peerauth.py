"""PeerAuthentication → L4 DENY policies and the keys workloads list (spec §7.4, istiod's ``authorization.go``).

Theory of operation: the node proxy never sees a PeerAuthentication. :class:`PeerAuthIndex` reads them all once per
translation and answers two questions: which policies to send (:attr:`PeerAuthIndex.policies`) and which of them a
workload lists (:meth:`PeerAuthIndex.find_keys`).

Rules:

1. Levels: a PeerAuthentication without selector (or with empty ``matchLabels``) is its namespace's; in the root
   namespace it is the mesh's. One with labels applies to the workloads of its namespace whose labels contain them
   (selector policies in the root namespace apply to no one). At each level the oldest wins (creationTimestamp,
   then name).
2. The mode is resolved mesh → namespace → workload, UNSET inheriting from the level above. DISABLE acts as
   PERMISSIVE (ztunnel always uses mTLS between meshed workloads).
3. An effective STRICT lists the static policy ``<root>/istio_converted_static_strict`` (DENY when the peer has no
   identity). That policy is sent as soon as one PeerAuthentication exists anywhere.
4. A workload-level PeerAuthentication outside the root namespace with ``portLevelMtls`` becomes
   ``<ns>/converted_peer_authentication_<name>`` (DENY, WORKLOAD_SELECTOR) when it changes anything:

   - ports more permissive than an effective STRICT (STRICT at the workload, or UNSET under a STRICT namespace or
     mesh): one rule "no identity" AND "not one of those ports";
   - STRICT ports under a permissive workload mode: one rule per port, "no identity" AND "this port".

   The workload then lists this key instead of the static one. Port keys are the destination (container) ports
   the node proxy sees, used as written, as istiod does.
5. STRICT ports count under a top-level UNSET only when the namespace (or, without one, the mesh) is not STRICT:
   istiod's comment says so; its expression also skips them under a PERMISSIVE workload with a STRICT mesh, which
   would leave the port open, and we follow the comment.
6. A spec that does not have the schema's shape is left out and reported (:class:`Skipped`).
"""

from __future__ import annotations

import enum
from collections.abc import Iterable, Mapping
from dataclasses import dataclass
from typing import Any

from ambit.controlplane.translate import shapes
from ambit.controlplane.translate.skips import ObjectKind, Skipped, skipped
from ambit.model.labels import map_matches
from ambit.model.policy import Action, Clause, Match, Policy, Rule, Scope, StringMatch

__all__ = ["CONVERTED_PREFIX", "PEER_AUTHENTICATION", "STATIC_STRICT_NAME", "PeerAuthIndex", "static_strict_policy"]

PEER_AUTHENTICATION = ObjectKind("security.istio.io/v1", "PeerAuthentication")
STATIC_STRICT_NAME = "istio_converted_static_strict"
CONVERTED_PREFIX = "converted_peer_authentication_"

Obj = Mapping[str, Any]


class Mode(enum.Enum):
    UNSET = "UNSET"
    DISABLE = "DISABLE"
    PERMISSIVE = "PERMISSIVE"
    STRICT = "STRICT"

    @property
    def permissive(self) -> bool:
        return self in (Mode.PERMISSIVE, Mode.DISABLE)


NO_IDENTITY = Match(not_principals=(StringMatch.presence(),))


def static_strict_policy(root_namespace: str) -> Policy:
    """Deny every connection whose peer has no identity (rule 3)."""
    return Policy(
        STATIC_STRICT_NAME, root_namespace, Scope.WORKLOAD_SELECTOR, Action.DENY, (Rule((Clause((NO_IDENTITY,)),)),)
    )


@dataclass(frozen=True, slots=True)
class PeerAuth:
    name: str
    namespace: str
    created: str
    match_labels: Mapping[str, str] | None
    """None: namespace (or mesh) level."""
    mode: Mode
    port_modes: tuple[tuple[int, Mode], ...]
    """Sorted by port."""

    @property
    def age(self) -> tuple[str, str]:
        return (self.created, self.name)


def _mode(value: object, path: str) -> Mode:
    if value is None:
        return Mode.UNSET
    if not isinstance(value, dict):
        raise shapes.ShapeError(path, "expected a mapping")
    mode = value.get("mode") or "UNSET"
    if not isinstance(mode, str) or mode not in Mode.__members__:
        raise shapes.ShapeError(f"{path}.mode", f"expected UNSET, DISABLE, PERMISSIVE or STRICT, got {mode!r}")
    return Mode[mode]


def _parse(obj: Obj) -> PeerAuth:
    meta, spec = obj.get("metadata") or {}, obj.get("spec") or {}
    if not isinstance(meta, dict) or not isinstance(spec, dict):
        raise shapes.ShapeError("spec", "expected a mapping")
    selector = spec.get("selector")
    labels = selector.get("matchLabels") if isinstance(selector, dict) else None
    if (selector is not None and not isinstance(selector, dict)) or (
        labels is not None and not isinstance(labels, dict)
    ):
        raise shapes.ShapeError("spec.selector", "expected a mapping")
    port_modes = {}
    raw_ports = spec.get("portLevelMtls") or {}
    if not isinstance(raw_ports, dict):
        raise shapes.ShapeError("spec.portLevelMtls", "expected a mapping")
    for key, value in raw_ports.items():
        text = str(key)
        if not (text.isascii() and text.isdigit() and 1 <= int(text) <= 65535):
            raise shapes.ShapeError(f"spec.portLevelMtls[{key!r}]", "expected a port number 1..65535")
        port_modes[int(text)] = _mode(value, f"spec.portLevelMtls[{key}]")
    return PeerAuth(
        name=str(meta.get("name") or ""),
        namespace=str(meta.get("namespace") or ""),
        created=str(meta.get("creationTimestamp") or ""),
        match_labels={str(k): str(v) for k, v in labels.items()} if labels else None,
        mode=_mode(spec.get("mtls"), "spec.mtls"),
        port_modes=tuple(sorted(port_modes.items())),
    )


def _oldest(candidates: Iterable[PeerAuth]) -> PeerAuth | None:
    return min(candidates, key=lambda p: p.age, default=None)


def _strict_above(ns: PeerAuth | None, mesh: PeerAuth | None) -> bool:
    """Whether the namespace level, else the mesh level, resolves to STRICT (rule 2)."""
    strict = mesh is not None and mesh.mode is Mode.STRICT
    if ns is not None and ns.mode is not Mode.UNSET:
        strict = ns.mode is Mode.STRICT
    return strict


def convert(pa: PeerAuth, ns: PeerAuth | None, mesh: PeerAuth | None) -> Policy | None:
    """The converted policy of a workload-level PeerAuthentication with port modes (rule 4), if it changes anything."""
    strict_above = _strict_above(ns, mesh)
    effective_strict = pa.mode is Mode.STRICT or (pa.mode is Mode.UNSET and strict_above)
    rules: list[Rule] = []
    open_ports = [p for p, m in pa.port_modes if m.permissive]
    strict_ports = [p for p, m in pa.port_modes if m is Mode.STRICT]
    if effective_strict and open_ports:
        # Deny without identity unless the port is one of the exceptions (istiod: STRICT rule + notPorts rules, or
        # the namespace/mesh STRICT merged in; the same policy either way).
        exceptions = Match(not_destination_ports=tuple(open_ports))
        rules.append(Rule((Clause((NO_IDENTITY,)), Clause((exceptions,)))))
    elif not effective_strict:
        rules.extend(
            Rule((Clause((Match(not_principals=(StringMatch.presence(),), destination_ports=(port,)),)),))
            for port in strict_ports
        )
    if not rules:
        return None
    name = f"{CONVERTED_PREFIX}{pa.name}"
    return Policy(name, pa.namespace, Scope.WORKLOAD_SELECTOR, Action.DENY, tuple(rules))


@dataclass(frozen=True, slots=True)
class PeerAuthIndex:
    """The PeerAuthentications of the cluster by level, and the policies made from them."""

    root_namespace: str
    by_namespace: Mapping[str, tuple[PeerAuth, ...]]
    policies: tuple[Policy, ...]
    """The static strict policy (when any PeerAuthentication exists) and the converted ones, by key."""
    keys: frozenset[str] = frozenset()

    @classmethod
    def build(cls, objects: Iterable[Obj], *, root_namespace: str, skips: list[Skipped] | None = None) -> PeerAuthIndex:
        by_namespace: dict[str, list[PeerAuth]] = {}
        for obj in objects:
            try:
                pa = _parse(obj)
            except shapes.ShapeError as exc:
                if skips is not None:
                    skips.append(skipped(PEER_AUTHENTICATION, obj, exc.field, f"{exc.reason}; the policy is ignored"))
                continue
            if pa.name and pa.namespace:
                by_namespace.setdefault(pa.namespace, []).append(pa)
        frozen = {ns: tuple(items) for ns, items in by_namespace.items()}
        index = cls(root_namespace, frozen, ())
        policies: list[Policy] = [static_strict_policy(root_namespace)] if frozen else []
        for namespace, items in sorted(frozen.items()):
            if namespace == root_namespace:
                continue
            for pa in items:
                if pa.match_labels is not None and pa.port_modes:
                    converted = convert(pa, index._level(namespace), index._level(root_namespace))
                    if converted is not None:
                        policies.append(converted)
        ordered = tuple(sorted(policies, key=lambda p: p.key))
        return cls(root_namespace, frozen, ordered, frozenset(p.key for p in ordered))

    def _level(self, namespace: str) -> PeerAuth | None:
        return _oldest(p for p in self.by_namespace.get(namespace, ()) if p.match_labels is None)

    def find_keys(self, namespace: str, labels: Mapping[str, str]) -> tuple[str, ...]:
        """The keys a workload of ``namespace`` with ``labels`` lists (rules 1-4), sorted."""
        if not self.by_namespace:
            return ()
        mesh = self._level(self.root_namespace)
        ns = self._level(namespace) if namespace != self.root_namespace else None
        if namespace == self.root_namespace:
            ns, mesh = mesh, None
        workload = None
        if namespace != self.root_namespace:
            workload = _oldest(
                p
                for p in self.by_namespace.get(namespace, ())
                if p.match_labels is not None and map_matches(p.match_labels, labels)
            )
        strict = _strict_above(ns, mesh)
        keys: list[str] = []
        if workload is not None:
            if workload.mode is not Mode.UNSET:
                strict = workload.mode is Mode.STRICT
            converted = f"{workload.namespace}/{CONVERTED_PREFIX}{workload.name}"
            if converted in self.keys:
                keys.append(converted)
                strict = False  # the converted policy carries any STRICT default, with its exceptions
        if strict:
            keys.append(f"{self.root_namespace}/{STATIC_STRICT_NAME}")
        return tuple(sorted(keys))
