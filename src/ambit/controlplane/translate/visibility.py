"""``exportTo`` becomes a Service's visibility (spec §4.1 ``Service.visibility``, §9).

The Workload API says only PUBLIC or NAMESPACE, so a list of namespaces has to become one of the two. Rules:

1. Absent or empty (a ServiceEntry's ``spec.exportTo``, a Service's ``networking.istio.io/exportTo`` annotation,
   comma-separated): PUBLIC. Ambit has no mesh-wide ``defaultServiceExportTo``, so Istio's default, ``*``, holds.
2. ``*`` anywhere: PUBLIC.
3. Only ``.``, the object's own namespace, or ``~`` (exported nowhere; the narrowest the API can say is the
   object's own namespace): NAMESPACE.
4. Any other namespace named: PUBLIC, reported. Narrowing to NAMESPACE would cut off the namespaces the object was
   exported to; ztunnel cannot enforce a list.

Upstream note: istiod's ambient index does not read ``exportTo`` at all (its ServiceEntry visibility comes from the
mesh config's ``serviceEntryVisibility`` policies on namespace labels); Ambit maps ``exportTo`` so that a
namespace-scoped entry is not visible, or resolvable, elsewhere.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

from ambit.controlplane.translate.skips import ObjectKind, Skipped, skipped
from ambit.model.workload import Visibility

EXPORT_TO_ANNOTATION = "networking.istio.io/exportTo"


def export_visibility(
    kind: ObjectKind, obj: Mapping[str, Any], field: str, raw: Any, skips: list[Skipped]
) -> Visibility:
    """The visibility ``raw`` (a list, or a comma-separated string) gives an object of its namespace."""
    namespace = str((obj.get("metadata") or {}).get("namespace") or "")
    if isinstance(raw, str):
        values = [part.strip() for part in raw.split(",") if part.strip()]
    elif isinstance(raw, list):
        values = [str(v).strip() for v in raw]
    else:
        values = []
    if not values or "*" in values:
        return Visibility.PUBLIC
    others = [v for v in values if v not in (".", "~", namespace)]
    if others:
        reason = (
            f"exported to other namespaces ({', '.join(sorted(others))}); the Workload API says only public or "
            "own namespace, so the service is public"
        )
        skips.append(skipped(kind, obj, field, reason))
        return Visibility.PUBLIC
    return Visibility.NAMESPACE
