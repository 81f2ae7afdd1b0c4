"""The Services and ServiceEntries that ``ambit waypoint status`` shows under its waypoints: who each shown waypoint
fronts, as the primary waypoint or as a canary of a weighted set (``Service.weighted_waypoints``).

Theory of operation: pure. :func:`service_rows` binds every Service and ServiceEntry it is given with the control
plane's own rules (:class:`~ambit.controlplane.translate.waypoints.WaypointIndex`: the binding labels, the
namespace default, allowedRoutes, traffic type, canary label and weight, a ServiceEntry's ``exportTo``), so the
table says what the node proxies are told, not what the labels ask for. istioctl's ``waypoint status`` has no such
table; it is printed after istioctl's only when some shown waypoint fronts something.

Rules:

1. A row per Service or ServiceEntry whose primary or canary waypoint is among ``shown`` (``ns/name`` keys), in
   namespace, name, kind order. Unbound objects, and those bound elsewhere only, have none.
2. WAYPOINT is the primary's ``ns/name``; WEIGHTED WAYPOINTS is ``primary=<100-w>%,canary=<w>%`` with a canary,
   else ``None``. A refused canary is not shown (its reason is on the object's ``istio.io/WaypointBound``).
3. Only ready waypoints bind (a Gateway with an address), as in the control plane.
"""

from __future__ import annotations

from collections.abc import Collection, Iterable, Mapping
from typing import Any

from ambit.controlplane.translate.skips import SERVICE_ENTRY
from ambit.controlplane.translate.visibility import export_visibility
from ambit.controlplane.translate.waypoints import WaypointIndex, object_annotations, object_labels
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
) -> list[tuple[str, ...]]:
    """Rules 1-3."""
    index = WaypointIndex.build(gateways, gateway_classes, namespaces, network="")
    kinds = [("Service", s) for s in services] + [("ServiceEntry", e) for e in service_entries]
    rows: list[tuple[str, ...]] = []
    for kind, obj in kinds:
        meta = obj.get("metadata")
        if not isinstance(meta, Mapping):
            continue  # the API server would not have stored it
        namespace, name = str(meta.get("namespace") or ""), str(meta.get("name") or "")
        namespace_only = kind == "ServiceEntry" and _namespace_only(obj)
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


def _namespace_only(entry: Obj) -> bool:
    spec = entry.get("spec")
    raw = spec.get("exportTo") if isinstance(spec, Mapping) else None
    return export_visibility(SERVICE_ENTRY, entry, "spec.exportTo", raw, []) is Visibility.NAMESPACE
