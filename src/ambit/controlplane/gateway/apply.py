"""Create-or-update of the objects a waypoint deploys, decided without I/O: :func:`plan_apply`.

Theory of operation: istiod server-side-applies its rendered objects with its own field manager; the API servers
Ambit runs against may not have server-side apply (the embedded one has not), so the controller plans a create or
a JSON merge patch of exactly the fields it renders, and the shell carries the plan out. A merge patch replaces
lists and merges maps, so a field the controller does not render (``spec.replicas``, a Service's ``clusterIP``, a
label someone added) is left as it is. What the controller last applied is kept in the annotation
``gateway.ambit.io/last-applied`` (as ``kubectl apply`` keeps its own), so that a field it applied before and no
longer renders (a ``nodeSelector`` an overlay set, a label the Gateway no longer has) is removed, the way server-side
apply removes the fields its manager no longer sets.

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
5. Every created or patched object carries what was applied (the fields of rule 4, without this annotation) in
   the annotation ``gateway.ambit.io/last-applied`` (canonical JSON). A map key present there, absent from what is
   rendered now and still on the object is deleted by the patch (``null``); an object holding such a key is not
   left alone by rule 3. Lists need no such care: a merge patch replaces them whole. An annotation that is not a
   JSON object (someone edited it) counts as nothing applied before.
"""

from __future__ import annotations

import json
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any, Final

from ambit.controlplane.gateway.render import CONTROLLER_LABEL, MANAGED_LABEL
from ambit.k8s.patch import clone

__all__ = ["LAST_APPLIED", "Create", "Leave", "Patch", "Refuse", "contains", "plan_apply"]

Obj = Mapping[str, Any]

LAST_APPLIED: Final = "gateway.ambit.io/last-applied"


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


def _applied(want: Obj) -> dict[str, Any]:
    """Rule 4: the fields of ``want`` the controller applies (and remembers, rule 5)."""
    wanted_meta = want.get("metadata") or {}
    relevant = {k: want[k] for k in want if k not in ("apiVersion", "kind", "metadata")}
    relevant["metadata"] = {k: wanted_meta[k] for k in ("labels", "annotations", "ownerReferences") if k in wanted_meta}
    return relevant


def _stale(before: Any, now: Any, have: Any) -> dict[str, Any]:
    """Rule 5: ``{key: None}`` for each map key applied ``before``, not rendered ``now`` and still in ``have``,
    nested as the keys are: of a map applied before, only the keys applied are removed, not others' keys."""
    out: dict[str, Any] = {}
    if not (isinstance(before, Mapping) and isinstance(have, Mapping)):
        return out
    now = now if isinstance(now, Mapping) else {}
    for key, old in before.items():
        if key not in have:
            continue
        if (
            isinstance(old, Mapping)
            and isinstance(have[key], Mapping)
            and (key not in now or isinstance(now[key], Mapping))
        ):
            if deeper := _stale(old, now.get(key), have[key]):
                out[key] = deeper
        elif key not in now:
            out[key] = None
    return out


def _last_applied(have: Obj) -> Any:
    annotations = (have.get("metadata") or {}).get("annotations")
    text = annotations.get(LAST_APPLIED) if isinstance(annotations, Mapping) else None
    if not isinstance(text, str):
        return {}
    try:
        before = json.loads(text)
    except ValueError:
        return {}
    return before if isinstance(before, dict) else {}


def _merge(into: dict[str, Any], extra: Mapping[str, Any]) -> None:
    for key, value in extra.items():
        if isinstance(value, Mapping) and isinstance(into.get(key), dict):
            _merge(into[key], value)
        else:
            into[key] = value


def plan_apply(want: Obj, have: Obj | None) -> ApplyPlan:
    """What to do so that ``have`` (the object as the API server has it, or None) holds ``want``."""
    applied = _applied(want)
    record = json.dumps(applied, sort_keys=True, separators=(",", ":"))
    want = {**want, "metadata": {**(want.get("metadata") or {})}}
    want["metadata"]["annotations"] = {**(want["metadata"].get("annotations") or {}), LAST_APPLIED: record}
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
    relevant = _applied(want)
    stale = _stale(_last_applied(have), relevant, have)
    if contains(have, relevant) and not stale:
        return Leave()
    patch: dict[str, Any] = {k: clone(v) for k, v in relevant.items() if k != "metadata"}
    patch["metadata"] = {**clone(relevant["metadata"]), "resourceVersion": meta.get("resourceVersion")}
    _merge(patch, stale)
    return Patch(patch)
