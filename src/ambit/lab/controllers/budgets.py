"""A PodDisruptionBudget's status (pure): kube-controller-manager's disruption controller's arithmetic. The shell
is :mod:`ambit.lab.controllers.disruption`; what both it and the API server's eviction handler read a budget as is
:mod:`ambit.model.disruption`.

Rules, for one budget and the pods its selector selects (a missing selector selects none, ``{}`` all of the
namespace):

1. ``maxUnavailable`` set: ``expectedPods`` is the *scale* of the pods' controllers (rule 4);
   ``desiredHealthy = expectedPods - maxUnavailable`` (a percentage of ``expectedPods``, rounded up), at least 0.
2. Else ``minAvailable`` an integer: ``desiredHealthy`` is it, ``expectedPods`` the number of selected pods.
   ``minAvailable`` a percentage: ``expectedPods`` is the scale (rule 4), ``desiredHealthy`` the percentage of
   it, rounded up. Neither set: both are 0.
3. A percentage is a string ``<int>%``; any other string fails the sync.
4. The scale is the sum, over the distinct controllers of the selected pods, of each controller's ``replicas``,
   found through :data:`SCALE_FINDERS` by the group and kind of the pod's controller reference (kube's
   ``finders()``). A pod with no controller is *unmanaged* (skipped, and reported). Any other pod's controller
   must be found, with the reference's uid, or the sync fails (the budget then reports that it cannot compute,
   rule 8): a kind the lab serves without a scale subresource (:data:`WITHOUT_SCALE`) fails with kube's
   ``<resource> does not implement the scale subresource``; a kind it does not serve at all (ReplicationController)
   with kube's REST mapper's ``no matches for kind``; a known kind
   whose object is missing or another (uid) with ``found no controllers for pod "<name>"``.
5. ``disruptedPods`` keeps an entry only for a selected pod that is not being deleted and whose entry is younger
   than :data:`~ambit.model.disruption.DELETION_TIMEOUT`; the budget is looked at again when the youngest kept
   entry expires.
6. ``currentHealthy`` counts the selected pods that are healthy (:func:`ambit.model.disruption.is_healthy`) and not
   in ``disruptedPods``.
7. ``disruptionsAllowed = currentHealthy - desiredHealthy``, but 0 when that is negative or ``expectedPods`` is 0
   (a budget whose first pods appear before the controller looks is safe).
8. The status is written only when a field, ``observedGeneration`` or the ``DisruptionAllowed`` condition would
   change; a failed sync writes ``disruptionsAllowed: 0`` with the condition ``False``/``SyncFailed`` (kube's
   fail-safe), leaving the other fields as they were.
"""

from __future__ import annotations

import copy
import math
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass
from typing import Any

from ambit.lab.controllers import pods as podstate
from ambit.lab.controllers.ownership import controller_ref
from ambit.model.disruption import (
    CONDITION,
    DELETION_TIMEOUT,
    SYNC_FAILED,
    condition_up_to_date,
    is_healthy,
    set_condition,
    update_allowed_condition,
)

FindObject = Callable[[str, str, str], Mapping[str, Any] | None]
"""``find(kind, namespace, name)``: a ReplicaSet, Deployment or StatefulSet from the caches, or None."""


class BudgetError(ValueError):
    """The budget's status cannot be computed (rule 3 or 4); its message becomes the SyncFailed condition's."""


@dataclass(frozen=True, slots=True)
class BudgetStatus:
    expected: int
    desired: int
    current: int
    allowed: int
    disrupted: dict[str, str]
    unmanaged: tuple[str, ...] = ()
    recheck_at: float | None = None
    """When the youngest ``disruptedPods`` entry expires (rule 5)."""


def scaled_value(value: Any, total: int) -> int:
    """Rule 3: an IntOrString against ``total``, percentages rounded up (apimachinery's
    ``GetScaledValueFromIntOrPercent(value, total, true)``)."""
    if isinstance(value, int) and not isinstance(value, bool):
        return value
    if isinstance(value, str) and value.endswith("%"):
        try:
            percent = int(value[:-1])
        except ValueError:
            raise BudgetError(f"invalid value for IntOrString: invalid value {value!r}") from None
        return math.ceil(percent * total / 100)
    raise BudgetError(f"invalid value for IntOrString: invalid type: string is not a percentage: {value!r}")


def _replicas(obj: Mapping[str, Any]) -> int:
    value = (obj.get("spec") or {}).get("replicas", 1)
    return value if isinstance(value, int) and not isinstance(value, bool) else 1


def _replica_set_scale(ref: Mapping[str, Any], namespace: str, find: FindObject) -> tuple[str, int] | None:
    """A ReplicaSet's own scale, or its Deployment's when a Deployment controls it (kube's ``getPodReplicaSet``
    and ``getPodDeployment``)."""
    rs = _found(find, "ReplicaSet", namespace, ref)
    if rs is None:
        return None
    owner = controller_ref(rs)
    if owner is not None and owner.get("kind") == "Deployment":
        deployment = _found(find, "Deployment", namespace, owner)
        return None if deployment is None else (str(owner["uid"]), _replicas(deployment))
    return str(ref["uid"]), _replicas(rs)


def _deployment_scale(ref: Mapping[str, Any], namespace: str, find: FindObject) -> tuple[str, int] | None:
    """A pod controlled by a Deployment itself: its ``deployments/scale`` (kube's ``getScaleController``)."""
    deployment = _found(find, "Deployment", namespace, ref)
    return None if deployment is None else (str(ref["uid"]), _replicas(deployment))


def _stateful_set_scale(ref: Mapping[str, Any], namespace: str, find: FindObject) -> tuple[str, int] | None:
    """A pod controlled by a StatefulSet: its ``statefulsets/scale`` (kube's ``getPodStatefulSet``)."""
    stateful_set = _found(find, "StatefulSet", namespace, ref)
    return None if stateful_set is None else (str(ref["uid"]), _replicas(stateful_set))


def _found(find: FindObject, kind: str, namespace: str, ref: Mapping[str, Any]) -> Mapping[str, Any] | None:
    obj = find(kind, namespace, str(ref.get("name") or ""))
    if obj is None or (obj.get("metadata") or {}).get("uid") != ref.get("uid"):
        return None
    return obj


ScaleFinder = Callable[[Mapping[str, Any], str, FindObject], tuple[str, int] | None]

SCALE_FINDERS: dict[tuple[str, str], ScaleFinder] = {
    ("apps", "ReplicaSet"): _replica_set_scale,
    ("extensions", "ReplicaSet"): _replica_set_scale,
    ("apps", "Deployment"): _deployment_scale,
    ("extensions", "Deployment"): _deployment_scale,
    ("apps", "StatefulSet"): _stateful_set_scale,
}
"""Rule 4: (group, kind) of a pod's controller → how its scale is found, as ``(controller uid, replicas)`` or None
when the controller is not in the caches (or is another object of that name)."""

WITHOUT_SCALE: dict[tuple[str, str], str] = {("apps", "DaemonSet"): "daemonsets.apps"}
"""Rule 4: controller kinds the lab serves that have no scale subresource, by the resource kube names them with."""


def controller_scale(pod: Mapping[str, Any], find: FindObject) -> tuple[str, int] | None:
    """Rule 4 for one pod with a controller: (controller uid, replicas); None when its controller is not found;
    BudgetError for a controller kind without a scale."""
    ref = controller_ref(pod)
    if ref is None:
        return None
    api_version = str(ref.get("apiVersion") or "")
    group = api_version.rpartition("/")[0]
    kind = str(ref.get("kind") or "")
    finder = SCALE_FINDERS.get((group, kind))
    if finder is not None:
        return finder(ref, str((pod.get("metadata") or {}).get("namespace") or ""), find)
    if (group, kind) in WITHOUT_SCALE:
        raise BudgetError(f"{WITHOUT_SCALE[(group, kind)]} does not implement the scale subresource")
    raise BudgetError(f'no matches for kind "{kind[:64]}" in version "{api_version[:64]}"')


def expected_scale(pods: Sequence[Mapping[str, Any]], find: FindObject) -> tuple[int, tuple[str, ...]]:
    """Rule 4: the summed scale and the unmanaged pods' names."""
    scales: dict[str, int] = {}
    unmanaged: list[str] = []
    for pod in pods:
        name = str((pod.get("metadata") or {}).get("name") or "")
        ref = controller_ref(pod)
        if ref is None:
            unmanaged.append(name)
            continue
        if ref.get("uid") in scales:
            continue
        found = controller_scale(pod, find)
        if found is None:
            raise BudgetError(f'found no controllers for pod "{name}"')
        scales[found[0]] = found[1]
    return sum(scales.values()), tuple(unmanaged)


def expected_and_desired(
    budget: Mapping[str, Any], pods: Sequence[Mapping[str, Any]], find: FindObject
) -> tuple[int, int, tuple[str, ...]]:
    """Rules 1 and 2: (expectedPods, desiredHealthy, unmanaged pods)."""
    spec = budget.get("spec") or {}
    if spec.get("maxUnavailable") is not None:
        expected, unmanaged = expected_scale(pods, find)
        return expected, max(expected - scaled_value(spec["maxUnavailable"], expected), 0), unmanaged
    minimum = spec.get("minAvailable")
    if isinstance(minimum, int) and not isinstance(minimum, bool):
        return len(pods), minimum, ()
    if minimum is not None:
        expected, unmanaged = expected_scale(pods, find)
        return expected, scaled_value(minimum, expected), unmanaged
    return 0, 0, ()


def kept_disruptions(
    pods: Sequence[Mapping[str, Any]], disrupted: Mapping[str, Any], now: float
) -> tuple[dict[str, str], float | None]:
    """Rule 5."""
    kept: dict[str, str] = {}
    recheck: float | None = None
    for pod in pods:
        meta = pod.get("metadata") or {}
        name = str(meta.get("name") or "")
        if meta.get("deletionTimestamp") or name not in disrupted:
            continue
        at = podstate.parse_time(disrupted[name])
        if at is None:
            continue
        expires = at + DELETION_TIMEOUT
        if expires < now:
            continue
        kept[name] = str(disrupted[name])
        recheck = expires if recheck is None else min(recheck, expires)
    return kept, recheck


def count_healthy(pods: Sequence[Mapping[str, Any]], disrupted: Mapping[str, str], now: float) -> int:
    """Rule 6."""
    count = 0
    for pod in pods:
        name = str((pod.get("metadata") or {}).get("name") or "")
        at = podstate.parse_time(disrupted[name]) if name in disrupted else None
        if at is not None and at + DELETION_TIMEOUT > now:
            continue
        if is_healthy(pod):
            count += 1
    return count


def compute(budget: Mapping[str, Any], pods: Sequence[Mapping[str, Any]], find: FindObject, now: float) -> BudgetStatus:
    """Rules 1 to 7; BudgetError when the budget cannot be computed."""
    expected, desired, unmanaged = expected_and_desired(budget, pods, find)
    disrupted, recheck = kept_disruptions(pods, (budget.get("status") or {}).get("disruptedPods") or {}, now)
    current = count_healthy(pods, disrupted, now)
    allowed = current - desired
    if expected <= 0 or allowed <= 0:
        allowed = 0
    return BudgetStatus(expected, desired, current, allowed, disrupted, unmanaged, recheck)


def new_status(budget: Mapping[str, Any], result: BudgetStatus, now: str) -> dict[str, Any] | None:
    """Rule 8: the status to write, or None when the stored one already says it."""
    old = budget.get("status") or {}
    generation = int((budget.get("metadata") or {}).get("generation") or 0)
    same = (
        int(old.get("currentHealthy") or 0) == result.current
        and int(old.get("desiredHealthy") or 0) == result.desired
        and int(old.get("expectedPods") or 0) == result.expected
        and int(old.get("disruptionsAllowed") or 0) == result.allowed
        and (old.get("disruptedPods") or {}) == result.disrupted
        and int(old.get("observedGeneration") or 0) == generation
        and condition_up_to_date(budget)
    )
    if same:
        return None
    status: dict[str, Any] = {
        "currentHealthy": result.current,
        "desiredHealthy": result.desired,
        "expectedPods": result.expected,
        "disruptionsAllowed": result.allowed,
        "observedGeneration": generation,
        "conditions": copy.deepcopy(list(old.get("conditions") or [])),
    }
    if result.disrupted:
        status["disruptedPods"] = dict(result.disrupted)
    update_allowed_condition(status, now)
    return status


def failed_status(budget: Mapping[str, Any], error: str, now: str) -> dict[str, Any]:
    """Rule 8's fail-safe."""
    status = copy.deepcopy(dict(budget.get("status") or {}))
    status["disruptionsAllowed"] = 0
    condition = {
        "type": CONDITION,
        "status": "False",
        "reason": SYNC_FAILED,
        "message": error,
        "observedGeneration": int(status.get("observedGeneration") or 0),
    }
    set_condition(status, condition, now)
    return status
