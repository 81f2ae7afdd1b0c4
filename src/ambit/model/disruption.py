"""PodDisruptionBudgets as both of their users read them (pure): the eviction subresource of the API server and the
disruption controller of the lab.

Rules (Kubernetes' ``policy/v1`` semantics; kube-apiserver's eviction handler and kube-controller-manager's
disruption controller, with ``k8s.io/component-helpers/apps/poddisruptionbudget``):

1. A pod is *healthy* when its ``Ready`` condition is ``True`` and it is not being deleted.
2. The disruption controller counts the pods a budget's selector selects: a missing selector selects nothing, an
   empty one (``{}``) every pod of the namespace; a malformed one is a sync failure.
3. The eviction handler looks for the budgets that cover a pod differently, as kube-apiserver does: a missing,
   empty or malformed selector covers no pod.
4. ``status.disruptedPods`` maps pod names to when an eviction was allowed; an entry counts for
   :data:`DELETION_TIMEOUT` seconds (kube's two minutes), after which the controller drops it.
5. The ``DisruptionAllowed`` condition is ``True``/``SufficientPods`` when ``disruptionsAllowed`` is above 0, else
   ``False``/``InsufficientPods``; ``False``/``SyncFailed`` (with the error as message) when the controller could
   not compute the status. Its ``lastTransitionTime`` changes only when its status does (``SetStatusCondition``).
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

from ambit.model.labels import LabelSelector, selector_from_spec

DELETION_TIMEOUT = 120.0
"""Seconds an entry of ``status.disruptedPods`` keeps its pod out of the healthy count (kube's DeletionTimeout)."""
MAX_DISRUPTED_PODS = 2000
"""Evictions waiting for the controller to notice them, beyond which the API server refuses more."""
CONDITION = "DisruptionAllowed"
SUFFICIENT_PODS = "SufficientPods"
INSUFFICIENT_PODS = "InsufficientPods"
SYNC_FAILED = "SyncFailed"


def is_ready(pod: Mapping[str, Any]) -> bool:
    for cond in (pod.get("status") or {}).get("conditions") or ():
        if isinstance(cond, Mapping) and cond.get("type") == "Ready":
            return cond.get("status") == "True"
    return False


def is_healthy(pod: Mapping[str, Any]) -> bool:
    """Rule 1."""
    return is_ready(pod) and not (pod.get("metadata") or {}).get("deletionTimestamp")


def controller_selector(budget: Mapping[str, Any]) -> LabelSelector | None:
    """Rule 2: the selector the controller counts pods with; None for a missing selector (selects nothing).
    ValueError for a malformed one."""
    spec = (budget.get("spec") or {}).get("selector")
    if spec is None:
        return None
    selector = selector_from_spec(spec)
    if selector is None:
        raise ValueError(f"invalid selector {spec!r}")
    return selector


def covers(budget: Mapping[str, Any], pod: Mapping[str, Any]) -> bool:
    """Rule 3: whether the eviction handler holds ``pod`` to ``budget``."""
    if (budget.get("metadata") or {}).get("namespace") != (pod.get("metadata") or {}).get("namespace"):
        return False
    selector = selector_from_spec((budget.get("spec") or {}).get("selector"))
    if selector is None or selector.selects_everything:
        return False
    labels = (pod.get("metadata") or {}).get("labels") or {}
    return selector.matches(labels if isinstance(labels, Mapping) else {})


def set_condition(status: dict[str, Any], condition: Mapping[str, Any], now: str) -> None:
    """apimachinery's ``SetStatusCondition``: replace the condition of the same type, keeping its
    ``lastTransitionTime`` unless its status changes."""
    conditions = [c for c in status.get("conditions") or () if isinstance(c, Mapping)]
    new = dict(condition)
    for index, old in enumerate(conditions):
        if old.get("type") == new["type"]:
            same = old.get("status") == new["status"] and old.get("lastTransitionTime")
            new["lastTransitionTime"] = old["lastTransitionTime"] if same else now
            conditions[index] = new
            break
    else:
        new["lastTransitionTime"] = now
        conditions.append(new)
    status["conditions"] = conditions


def update_allowed_condition(status: dict[str, Any], now: str) -> None:
    """Rule 5, from ``status.disruptionsAllowed``."""
    allowed = int(status.get("disruptionsAllowed") or 0) > 0
    condition = {
        "type": CONDITION,
        "status": "True" if allowed else "False",
        "reason": SUFFICIENT_PODS if allowed else INSUFFICIENT_PODS,
        "message": "",
        "observedGeneration": int(status.get("observedGeneration") or 0),
    }
    set_condition(status, condition, now)


def condition_up_to_date(budget: Mapping[str, Any]) -> bool:
    """Whether the ``DisruptionAllowed`` condition says what ``status`` says (component-helpers'
    ``ConditionsAreUpToDate``)."""
    status = budget.get("status") or {}
    generation = int((budget.get("metadata") or {}).get("generation") or 0)
    if int(status.get("observedGeneration") or 0) != generation:
        return False
    for cond in status.get("conditions") or ():
        if isinstance(cond, Mapping) and cond.get("type") == CONDITION:
            if int(status.get("disruptionsAllowed") or 0) > 0:
                return cond.get("status") == "True" and cond.get("reason") == SUFFICIENT_PODS
            return cond.get("status") == "False" and cond.get("reason") == INSUFFICIENT_PODS
    return False
