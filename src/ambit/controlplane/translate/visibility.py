"""``exportTo`` and the mesh config's ``serviceEntryVisibility`` become a Service's visibility (spec §4.1
``Service.visibility``, §9).

The Workload API says only PUBLIC or NAMESPACE, so a list of namespaces has to become one of the two. Rules:

1. Absent or empty (a ServiceEntry's ``spec.exportTo``, a Service's ``networking.istio.io/exportTo`` annotation,
   comma-separated): the mesh config's ``defaultServiceExportTo``, read by the same rules (rule 4 then reports
   nothing: the list is the mesh's, not the object's); unset, Istio's default ``*``: PUBLIC.
2. ``*`` anywhere: PUBLIC.
3. Only ``.``, the object's own namespace, or ``~`` (exported nowhere; the narrowest the API can say is the
   object's own namespace): NAMESPACE.
4. Any other namespace named: PUBLIC, reported. Narrowing to NAMESPACE would cut off the namespaces the object was
   exported to; ztunnel cannot enforce a list.
5. A ServiceEntry's visibility is the narrower of its ``exportTo`` one and the one the mesh config's
   ``serviceEntryVisibility`` resolves for its namespace's labels (:mod:`ambit.controlplane.translate.meshconfig`),
   when that is configured; ``NONE`` leaves the entry out altogether (istiod sends it to no one). istiod's ambient
   index reads only the mesh config; Ambit also honours ``exportTo``, so a namespace-scoped entry is not visible,
   or resolvable, elsewhere, whatever the mesh says.
6. Status (istiod's ``ServiceInfo.GetConditions``): while ``serviceEntryVisibility`` is configured, every
   translated ServiceEntry gets ``istio.io/VisibilityApplied``, status True, reason ``Public`` or ``Namespace``
   after the visibility its Services are sent with; while it is not, the condition is removed. An entry left out
   (``NONE``, no usable host) gets none, as in istiod.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from typing import Any

from ambit.controlplane.translate.meshconfig import MeshVisibility
from ambit.controlplane.translate.policies import PolicyStatus
from ambit.controlplane.translate.skips import ObjectKind, Skipped, skipped
from ambit.model.workload import Visibility

EXPORT_TO_ANNOTATION = "networking.istio.io/exportTo"
VISIBILITY_APPLIED = "istio.io/VisibilityApplied"
VISIBILITY_PUBLIC = "Public"
VISIBILITY_NAMESPACE = "Namespace"
PUBLIC_MESSAGE = "ServiceEntry is visible to the entire mesh (PUBLIC)."
NAMESPACE_MESSAGE = (
    "ServiceEntry is visible only within its own namespace (NAMESPACE), per mesh serviceEntryVisibility."
)


def export_visibility(
    kind: ObjectKind,
    obj: Mapping[str, Any],
    field: str,
    raw: Any,
    skips: list[Skipped],
    *,
    default: Sequence[str] | None = None,
) -> Visibility:
    """The visibility ``raw`` (a list, or a comma-separated string) gives an object of its namespace; ``default``
    is the mesh config's ``defaultServiceExportTo`` (rule 1)."""
    namespace = str((obj.get("metadata") or {}).get("namespace") or "")
    if isinstance(raw, str):
        values = [part.strip() for part in raw.split(",") if part.strip()]
    elif isinstance(raw, list):
        values = [str(v).strip() for v in raw]
    else:
        values = []
    from_default = not values and bool(default)
    if from_default:
        values = [v.strip() for v in default or () if v.strip()]
    if not values or "*" in values:
        return Visibility.PUBLIC
    others = [v for v in values if v not in (".", "~", namespace)]
    if others and from_default:
        return Visibility.PUBLIC  # the mesh's choice, not this object's: nothing to report on it
    if others:
        reason = (
            f"exported to other namespaces ({', '.join(sorted(others))}); the Workload API says only public or "
            "own namespace, so the service is public"
        )
        skips.append(skipped(kind, obj, field, reason))
        return Visibility.PUBLIC
    return Visibility.NAMESPACE


def entry_visibility(export: Visibility, mesh: MeshVisibility | None) -> Visibility | None:
    """A ServiceEntry's visibility from its ``exportTo`` one and the mesh config's, or None for none (rule 5)."""
    if mesh is MeshVisibility.NONE:
        return None
    if mesh is MeshVisibility.NAMESPACE:
        return Visibility.NAMESPACE
    return export


def visibility_status(obj: Mapping[str, Any], visibility: Visibility, configured: bool) -> PolicyStatus | None:
    """The ``istio.io/VisibilityApplied`` condition of a translated ServiceEntry, or None for none (rule 6)."""
    if not configured:
        return None
    meta = obj.get("metadata")
    meta = meta if isinstance(meta, Mapping) else {}
    generation = meta.get("generation")
    observed = generation if isinstance(generation, int) and not isinstance(generation, bool) else 0
    namespace, name = str(meta.get("namespace") or ""), str(meta.get("name") or "")
    if visibility is Visibility.NAMESPACE:
        reason, message = VISIBILITY_NAMESPACE, NAMESPACE_MESSAGE
    else:
        reason, message = VISIBILITY_PUBLIC, PUBLIC_MESSAGE
    return PolicyStatus(namespace, name, observed, True, reason, message, VISIBILITY_APPLIED)
