"""Create-or-update of the objects a waypoint deploys, decided without I/O: :func:`plan_apply`.

Theory of operation: istiod server-side-applies its rendered objects with its own field manager; the API servers
Ambit runs against may not have server-side apply (the embedded one has not), so the controller plans a create or
a JSON merge patch of exactly the fields it renders, and the shell carries the plan out. A merge patch replaces
lists and merges maps, so a field the controller does not render (``spec.replicas``, a Service's ``clusterIP``, a
label someone added) is left as it is.

Rules:

1. No object yet: :class:`Create` it.
2. An object of that name without the label ``gateway.istio.io/managed`` carrying the value the rendered object
   carries (``istio.io-mesh-controller`` for a waypoint's, ``istio.io-gateway-controller`` for an ingress
   gateway's) belongs to someone else: :class:`Refuse`, never overwrite it (istiod's ``canManage``). A Gateway
   must not be a way to take over a Deployment or ServiceAccount that happens to have its name.
3. An object that already holds everything rendered (maps compared key by key, lists element by element with
   the same length, so that values the API server adds by default do not count as differences): :class:`Leave`
   it; nothing is written, so the controller's own writes cannot make it loop.
4. Otherwise :class:`Patch` it with the rendered ``metadata`` (labels, annotations, owner references) and
   ``spec``, carrying the ``resourceVersion`` it was decided on, so that a concurrent change makes the API server
   refuse it (409) and the next pass decides again.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

from ambit.controlplane.gateway.render import CONTROLLER_LABEL, MANAGED_LABEL

__all__ = ["Create", "Leave", "Patch", "Refuse", "contains", "plan_apply"]

Obj = Mapping[str, Any]


@dataclass(frozen=True, slots=True)
class Create:
    obj: dict[str, Any]


@dataclass(frozen=True, slots=True)
class Patch:
    patch: dict[str, Any]


@dataclass(frozen=True, slots=True)
class Leave:
    pass


@dataclass(frozen=True, slots=True)
class Refuse:
    message: str


ApplyPlan = Create | Patch | Leave | Refuse


def contains(have: Any, want: Any) -> bool:
    """Whether ``have`` holds everything of ``want`` (rule 3)."""
    if isinstance(want, Mapping):
        return isinstance(have, Mapping) and all(k in have and contains(have[k], v) for k, v in want.items())
    if isinstance(want, list):
        return (
            isinstance(have, list)
            and len(have) == len(want)
            and all(contains(h, w) for h, w in zip(have, want, strict=True))
        )
    return bool(have == want and type(have) is type(want))


def plan_apply(want: Obj, have: Obj | None) -> ApplyPlan:
    """What to do so that ``have`` (the object as the API server has it, or None) holds ``want``."""
    if have is None:
        return Create(dict(want))
    meta = have.get("metadata") or {}
    labels = meta.get("labels") or {}
    managed = ((want.get("metadata") or {}).get("labels") or {}).get(MANAGED_LABEL, CONTROLLER_LABEL)
    if not isinstance(labels, Mapping) or labels.get(MANAGED_LABEL) != managed:
        kind = want.get("kind", "object")
        name = (want.get("metadata") or {}).get("name", "")
        return Refuse(
            f"{kind} {name!r} already exists and is not managed by the mesh controller "
            f"(it lacks the label {MANAGED_LABEL}={managed}); rename the Gateway or remove the {kind}"
        )
    wanted_meta = want.get("metadata") or {}
    relevant = {k: want[k] for k in want if k not in ("apiVersion", "kind", "metadata")}
    relevant["metadata"] = {k: wanted_meta[k] for k in ("labels", "annotations", "ownerReferences") if k in wanted_meta}
    if contains(have, relevant):
        return Leave()
    patch: dict[str, Any] = {k: v for k, v in relevant.items() if k != "metadata"}
    patch["metadata"] = {**relevant["metadata"], "resourceVersion": meta.get("resourceVersion")}
    return Patch(patch)
