"""The Services and ServiceEntries that ``ambit waypoint status`` shows under its waypoints: who each shown waypoint
fronts, as the primary waypoint or as a canary of a weighted set (``Service.weighted_waypoints``).

Theory of operation: pure. :func:`service_rows` binds every Service and ServiceEntry it is given with the control
plane's own rules (:class:`~ambit.controlplane.translate.waypoints.WaypointIndex`: the binding labels, the
namespace default, allowedRoutes, traffic type, canary label and weight, a ServiceEntry's ``exportTo`` and the mesh
config's ``serviceEntryVisibility`` for its namespace), so the
table says what the node proxies are told, not what the labels ask for. istioctl's ``waypoint status`` has no such
table; it is printed after istioctl's only when some shown waypoint fronts something.

Rules:

1. A row per Service or ServiceEntry whose primary or canary waypoint is among ``shown`` (``ns/name`` keys), in
   namespace, name, kind order. Unbound objects, and those bound elsewhere only, have none.
2. WAYPOINT is the primary's ``ns/name``; WEIGHTED WAYPOINTS is ``primary=<100-w>%,canary=<w>%`` with a canary,
   else ``None``. A refused canary is not shown (its reason is on the object's ``istio.io/WaypointBound``).
3. Only ready waypoints bind (a Gateway with an address), as in the control plane.
4. ``mesh_config_maps`` holds the control plane's ``istio`` ConfigMap when it could be read
   (:mod:`~ambit.controlplane.translate.meshconfig`; a text that does not parse counts as no mesh config here, the
   control plane keeping its last good one, which the CLI cannot know). A ServiceEntry the mesh config makes
   ``NONE`` is sent to no one and has no row.
"""

from __future__ import annotations

from collections.abc import Collection, Iterable, Mapping
from typing import Any

from ambit.controlplane.translate import DEFAULT_ROOT_NAMESPACE
from ambit.controlplane.translate.fields import object_annotations, object_labels
from ambit.controlplane.translate.meshconfig import MeshConfig, mesh_config_of
from ambit.controlplane.translate.skips import SERVICE_ENTRY
from ambit.controlplane.translate.visibility import entry_visibility, export_visibility
from ambit.controlplane.translate.waypoints import WaypointIndex
from ambit.model.workload import Visibility

__all__ = ["SERVICE_COLUMNS", "service_rows"]

Obj = Mapping[str, Any]
SERVICE_COLUMNS = ("NAMESPACE", "NAME", "KIND", "WAYPOINT", "WEIGHTED WAYPOINTS")


def service_rows(
    shown: Collection[str],
    *,
    gateways: Iterable[Obj],
    gateway_classes: Iterable[Obj],
    namespaces: Iterable[Obj],
    services: Iterable[Obj],
    service_entries: Iterable[Obj],
    mesh_config_maps: Iterable[Obj] = (),
    system_namespace: str = DEFAULT_ROOT_NAMESPACE,
) -> list[tuple[str, ...]]:
    """Rules 1-4."""
    namespaces = list(namespaces)
    index = WaypointIndex.build(gateways, gateway_classes, namespaces, network="")
    mesh = mesh_config_of(mesh_config_maps, namespace=system_namespace, memo=None, skips=[])
    labels_of = {_name(ns): object_labels(ns) for ns in namespaces}
    kinds = [("Service", s) for s in services] + [("ServiceEntry", e) for e in service_entries]
    rows: list[tuple[str, ...]] = []
    for kind, obj in kinds:
        meta = obj.get("metadata")
        if not isinstance(meta, Mapping):
            continue  # the API server would not have stored it
        namespace, name = str(meta.get("namespace") or ""), str(meta.get("name") or "")
        visibility = _entry_visibility(obj, mesh, labels_of.get(namespace) or {}) if kind == "ServiceEntry" else None
        if kind == "ServiceEntry" and visibility is None:
            continue  # NONE: sent to no one (rule 4)
        namespace_only = visibility is Visibility.NAMESPACE
        binding = index.find_for_service(
            namespace, object_labels(obj), object_annotations(obj), namespace_only=namespace_only
        )
        if binding.waypoint is None or not any(key in shown for key in binding.keys):
            continue
        weighted = "None"
        if binding.canary is not None:
            weighted = (
                f"{binding.waypoint.key}={100 - binding.canary_weight}%,{binding.canary.key}={binding.canary_weight}%"
            )
        rows.append((namespace, name, kind, binding.waypoint.key, weighted))
    return sorted(rows, key=lambda row: (row[0], row[1], row[2]))


def _name(obj: Obj) -> str:
    meta = obj.get("metadata")
    return str(meta.get("name") or "") if isinstance(meta, Mapping) else ""


def _entry_visibility(entry: Obj, mesh: MeshConfig, namespace_labels: Mapping[str, str]) -> Visibility | None:
    spec = entry.get("spec")
    raw = spec.get("exportTo") if isinstance(spec, Mapping) else None
    export = export_visibility(SERVICE_ENTRY, entry, "spec.exportTo", raw, [], default=mesh.default_service_export_to)
    return entry_visibility(export, mesh.entry_visibility(namespace_labels))
