"""How a Deployment moves its ReplicaSets, as kube's deployment controller does it (pure: decisions, no I/O).

A Deployment's *new* ReplicaSet is the one whose pod template equals the Deployment's (ignoring the
``pod-template-hash`` label); the others are *old*. Its name is ``<deployment>-<hash>``, the hash being
:func:`template_hash` of the template (and of ``status.collisionCount``, bumped when the name is taken by a
ReplicaSet with another template).

Strategies (``spec.strategy.type``):

- ``RollingUpdate`` (the default; ``maxSurge`` 25% rounded up, ``maxUnavailable`` 25% rounded down; both 0
  means ``maxUnavailable`` 1). One step per reconcile, as kube does: first scale the new ReplicaSet up as far as
  ``replicas + maxSurge`` pods in total allows (or down to ``replicas``); only when it needs no change, scale old
  ReplicaSets down — their unavailable pods first, then oldest ReplicaSet first — as far as keeping
  ``replicas - maxUnavailable`` pods available allows. Each ReplicaSet status change starts the next step.
- ``Recreate``: scale every old ReplicaSet to 0, wait until none of their pods is left running (terminating
  counts as running), then create or scale the new ReplicaSet to ``replicas``.

Changing only ``replicas`` scales the new ReplicaSet directly (kube's proportional scaling of a rollout in
progress is not done: the rollout converges at its own pace instead). ``paused`` stops rollouts and scaling
alike; only status is kept current. ``progressDeadlineSeconds`` is not enforced.
"""

from __future__ import annotations

import copy
import json
import math
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import Any

from ambit.lab.controllers.ownership import Object, key_of, name_of, owner_reference

HASH_LABEL = "pod-template-hash"
REVISION = "deployment.kubernetes.io/revision"
_SAFE = "bcdfghjklmnpqrstvwxz2456789"


def template_hash(template: Mapping[str, Any], collision_count: int = 0) -> str:
    """A short stable hash of a pod template: FNV-1a 32 of its canonical JSON, spelled as kube spells it."""
    data = json.dumps(template, sort_keys=True, separators=(",", ":")).encode()
    if collision_count:
        data += str(collision_count).encode()
    value = 0x811C9DC5
    for byte in data:
        value = ((value ^ byte) * 0x01000193) & 0xFFFFFFFF
    return "".join(_SAFE[ord(c) % len(_SAFE)] for c in str(value))


def _without_hash(template: Any) -> Any:
    template = copy.deepcopy(template) if isinstance(template, dict) else {}
    labels = (template.get("metadata") or {}).get("labels")
    if isinstance(labels, dict):
        labels.pop(HASH_LABEL, None)
        if not labels:
            template["metadata"].pop("labels")
    if template.get("metadata") == {}:
        template.pop("metadata")
    return template


def current_hash(deployment: Object) -> str:
    """The ``pod-template-hash`` of the Deployment's template now."""
    collisions = (deployment.get("status") or {}).get("collisionCount")
    template = (deployment.get("spec") or {}).get("template") or {}
    return template_hash(template, collisions if isinstance(collisions, int) else 0)


def is_new(rs: Object, deployment: Object) -> bool:
    """Whether ``rs`` runs the Deployment's current template: equal ignoring the hash label, or made from it.

    The second test matters when the server defaults the two templates differently (the embedded server
    defaults a Deployment's template on create only, not when a patch replaces it).
    """
    template = (deployment.get("spec") or {}).get("template")
    if _without_hash((rs.get("spec") or {}).get("template")) == _without_hash(template):
        return True
    labels = (rs.get("metadata") or {}).get("labels") or {}
    return bool(labels.get(HASH_LABEL)) and labels.get(HASH_LABEL) == current_hash(deployment)


def replicas_of(obj: Mapping[str, Any]) -> int:
    value = (obj.get("spec") or {}).get("replicas", 1)
    return value if isinstance(value, int) and value >= 0 else 1


def status_count(obj: Mapping[str, Any], field: str) -> int:
    value = (obj.get("status") or {}).get(field, 0)
    return value if isinstance(value, int) else 0


def revision_of(obj: Mapping[str, Any]) -> int:
    value = ((obj.get("metadata") or {}).get("annotations") or {}).get(REVISION, "0")
    try:
        return int(value)
    except (TypeError, ValueError):
        return 0


def _creation_order(rs: Object) -> tuple[str, str]:
    return (str((rs.get("metadata") or {}).get("creationTimestamp") or ""), name_of(rs))


def split(deployment: Object, owned: Sequence[Object]) -> tuple[Object | None, list[Object]]:
    """The new ReplicaSet (the oldest matching one, if several) and the old ones, oldest first."""
    ordered = sorted(owned, key=_creation_order)
    new = next((rs for rs in ordered if is_new(rs, deployment)), None)
    return new, [rs for rs in ordered if rs is not new]


def _resolve(value: Any, total: int, round_up: bool) -> int:
    if isinstance(value, int):
        return max(value, 0)
    if isinstance(value, str) and value.endswith("%"):
        try:
            fraction = int(value[:-1]) * total / 100
        except ValueError:
            return 0
        return max(math.ceil(fraction) if round_up else math.floor(fraction), 0)
    return 0


def strategy_type(deployment: Object) -> str:
    strategy = (deployment.get("spec") or {}).get("strategy") or {}
    return "Recreate" if strategy.get("type") == "Recreate" else "RollingUpdate"


def surge_and_unavailable(deployment: Object) -> tuple[int, int]:
    """``maxSurge`` and ``maxUnavailable`` in pods (0 and 0 for Recreate)."""
    if strategy_type(deployment) == "Recreate":
        return 0, 0
    rolling = ((deployment.get("spec") or {}).get("strategy") or {}).get("rollingUpdate") or {}
    replicas = replicas_of(deployment)
    surge = _resolve(rolling.get("maxSurge", "25%"), replicas, round_up=True)
    unavailable = _resolve(rolling.get("maxUnavailable", "25%"), replicas, round_up=False)
    if surge == 0 and unavailable == 0:
        unavailable = 1
    return surge, unavailable


@dataclass(frozen=True, slots=True)
class Scale:
    """Set ``replica_set``'s ``spec.replicas`` to ``replicas`` (a command for the shell)."""

    replica_set: Object
    replicas: int


def new_replicas(deployment: Object, new_current: int, all_sets: Sequence[Object]) -> int:
    """What the new ReplicaSet should be scaled to now (kube's ``NewRSNewReplicas``)."""
    desired = replicas_of(deployment)
    if strategy_type(deployment) == "Recreate":
        return desired
    surge, _ = surge_and_unavailable(deployment)
    total = sum(replicas_of(rs) for rs in all_sets)
    if total >= desired + surge:
        return new_current
    return new_current + min(desired + surge - total, desired - new_current)


def rolling_step(deployment: Object, new: Object, old: Sequence[Object]) -> list[Scale]:
    """The next step of a rolling update (see the module docstring); ``old`` oldest first."""
    desired = replicas_of(deployment)
    new_count = replicas_of(new)
    if new_count > desired:
        return [Scale(new, desired)]
    if new_count < desired:
        target = new_replicas(deployment, new_count, [new, *old])
        if target != new_count:
            return [Scale(new, target)]
    if not any(replicas_of(rs) for rs in old):
        return []
    _, unavailable = surge_and_unavailable(deployment)
    min_available = desired - unavailable
    counts = {name_of(rs): replicas_of(rs) for rs in old}
    total = new_count + sum(counts.values())
    budget = total - min_available - (new_count - status_count(new, "availableReplicas"))
    if budget <= 0:
        return []
    for rs in old:  # unhealthy replicas first: scaling them down costs no availability
        spare = counts[name_of(rs)] - status_count(rs, "availableReplicas")
        if budget <= 0:
            break
        if counts[name_of(rs)] and spare > 0:
            cut = min(budget, spare)
            counts[name_of(rs)] -= cut
            budget -= cut
    available = status_count(new, "availableReplicas") + sum(status_count(rs, "availableReplicas") for rs in old)
    cut_available = available - min_available
    for rs in old:
        if cut_available <= 0:
            break
        cut = min(counts[name_of(rs)], cut_available)
        counts[name_of(rs)] -= cut
        cut_available -= cut
    return [Scale(rs, counts[name_of(rs)]) for rs in old if counts[name_of(rs)] != replicas_of(rs)]


def new_replica_set(deployment: Object, pod_hash: str, revision: int, replicas: int) -> Object:
    spec = deployment.get("spec") or {}
    template = copy.deepcopy(spec.get("template") or {})
    template_meta = template.setdefault("metadata", {})
    labels = dict(template_meta.get("labels") or {})
    labels[HASH_LABEL] = pod_hash
    template_meta["labels"] = labels
    selector = copy.deepcopy(spec.get("selector") or {})
    selector["matchLabels"] = {**(selector.get("matchLabels") or {}), HASH_LABEL: pod_hash}
    rs_spec: dict[str, Any] = {"replicas": replicas, "selector": selector, "template": template}
    if spec.get("minReadySeconds"):
        rs_spec["minReadySeconds"] = spec["minReadySeconds"]
    return {
        "apiVersion": "apps/v1",
        "kind": "ReplicaSet",
        "metadata": {
            "name": f"{name_of(deployment)}-{pod_hash}",
            "namespace": key_of(deployment)[0],
            "labels": labels,
            "annotations": {REVISION: str(revision)},
            "ownerReferences": [owner_reference(deployment)],
        },
        "spec": rs_spec,
    }


def cleanup(deployment: Object, old: Sequence[Object]) -> list[Object]:
    """Old ReplicaSets beyond ``revisionHistoryLimit`` that are scaled to 0 and empty, oldest first."""
    limit = (deployment.get("spec") or {}).get("revisionHistoryLimit", 10)
    limit = limit if isinstance(limit, int) and limit >= 0 else 10
    idle = [rs for rs in old if replicas_of(rs) == 0 and status_count(rs, "replicas") == 0]
    return idle[: max(len(idle) - limit, 0)]
