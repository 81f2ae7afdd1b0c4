"""Which namespaces the translation sees: the mesh config's ``discoverySelectors`` applied to the inputs, as istiod's
discovery namespaces filter applies them to its informers.

Theory of operation: pure. :meth:`DiscoveryFilter.build` reads the Namespaces once per translation with the mesh
config (:mod:`ambit.controlplane.translate.meshconfig`, rule 7); :meth:`DiscoveryFilter.keep` then drops the objects
of namespaces the selectors do not admit from any list of namespaced objects. The control plane translates again
on every Namespace change and every mesh config change, so a namespace labelled out disappears from the workload
API at the next translation and comes back when relabelled: nothing is remembered between calls. The filter is
part of the :class:`~ambit.controlplane.translate.Translation`, so the CA applies the same one to impersonation
(:mod:`ambit.controlplane.ca.nodeauth` rule 5), as istiod's node authorizer reads pods through the filtered informer.

Rules:

1. No selectors: every object is kept (istiod's filter permits everything).
2. With selectors, an object is kept when its namespace is discovered: a Namespace object of that name exists and
   one selector selects its labels. An object of a namespace that has no Namespace object is dropped (istiod's
   filter only knows namespaces its informer listed).
3. Cluster-scoped objects (no namespace: Nodes, GatewayClasses) and the Namespaces themselves are never filtered
   (istiod's Namespace informer is unfiltered: namespace labels still bind waypoints and networks).
4. Filtered, as istiod's informers are (``kube.Client.ObjectFilter``): Pods, Services, EndpointSlices,
   ServiceEntries, WorkloadEntries, AuthorizationPolicies, PeerAuthentications, RequestAuthentications,
   Telemetries, DestinationRules, VirtualServices, Istio and Kubernetes Gateways, HTTPRoutes, GRPCRoutes,
   TCPRoutes, TLSRoutes, ReferenceGrants, BackendTLSPolicies, and the Secrets and ConfigMaps credentials are read
   from. The mesh config's own ConfigMap is read before the filter (istiod's mesh watcher is separate).
5. The root namespace is always discovered. Here Ambit is stricter than istiod, which filters it like any other:
   its AuthorizationPolicies and PeerAuthentications apply to every namespace, so selectors that miss it would
   silently switch off mesh-wide policy (a mesh-wide DENY, STRICT mTLS) for the namespaces that are included.
   Policies of an included namespace live in that namespace, so excluding another never touches them.
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping
from dataclasses import dataclass
from typing import Any

from ambit.controlplane.translate.meshconfig import MeshConfig

Obj = Mapping[str, Any]


def _namespace_of(obj: Obj) -> str:
    meta = obj.get("metadata")
    namespace = meta.get("namespace") if isinstance(meta, Mapping) else None
    return namespace if isinstance(namespace, str) else ""


def _labels(namespace: Obj) -> dict[str, str]:
    meta = namespace.get("metadata")
    labels = meta.get("labels") if isinstance(meta, Mapping) else None
    if not isinstance(labels, Mapping):
        return {}
    return {str(k): str(v) for k, v in labels.items()}


@dataclass(frozen=True, slots=True)
class DiscoveryFilter:
    """The namespaces the translation sees; ``discovered`` None means all of them (rule 1)."""

    discovered: frozenset[str] | None = None

    @classmethod
    def build(cls, namespaces: Iterable[Obj], mesh: MeshConfig, *, root_namespace: str) -> DiscoveryFilter:
        if not mesh.discovery_selectors:
            return cls(None)
        names = {root_namespace}
        for ns in namespaces:
            meta = ns.get("metadata")
            name = meta.get("name") if isinstance(meta, Mapping) else None
            if isinstance(name, str) and mesh.discovers(_labels(ns)):
                names.add(name)
        return cls(frozenset(names))

    def admits_namespace(self, namespace: str) -> bool:
        """Whether the objects of ``namespace`` are seen (rules 1, 2, 5)."""
        return self.discovered is None or namespace in self.discovered

    def admits(self, obj: Obj) -> bool:
        """Whether ``obj`` is seen: cluster-scoped, no selectors, or in a discovered namespace (rules 1-3, 5)."""
        namespace = _namespace_of(obj)
        return not namespace or self.admits_namespace(namespace)

    def keep(self, objects: Iterable[Obj]) -> list[Obj]:
        """The objects of ``objects`` that are seen, in their order."""
        if self.discovered is None:
            return list(objects)
        return [obj for obj in objects if self.admits(obj)]


EVERY_NAMESPACE = DiscoveryFilter()
"""The filter without selectors: every object is seen."""
