"""When a pod must leave its node because of a NoExecute taint (pure): kube's taint manager's decision.

Rules (kube-controller-manager's ``NoExecuteTaintManager``):

1. Only NoExecute taints count, and only the node's own (``spec.taints``): the lab has no node lifecycle
   controller, so a node that is not Ready carries no implied NoExecute taint.
2. A pod that does not tolerate one of them is evicted at once.
3. A pod that tolerates all of them stays for the smallest ``tolerationSeconds`` of the tolerations it uses
   (0 or less: at once), counted from when the taint appeared (its ``timeAdded``, else when the controller first
   saw it); a used toleration without ``tolerationSeconds`` does not limit the stay. With none limiting, the pod
   stays for good.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping, Sequence
from typing import Any

from ambit.lab.controllers.placement import Taint, tolerates


def no_execute_taints(node: Mapping[str, Any]) -> list[Taint]:
    out = []
    for item in (node.get("spec") or {}).get("taints") or []:
        if isinstance(item, Mapping) and item.get("key") and item.get("effect") == "NoExecute":
            out.append(Taint(str(item["key"]), str(item.get("value") or ""), "NoExecute"))
    return out


def eviction_time(
    tolerations: Sequence[Mapping[str, Any]], taints: Sequence[Taint], since: Callable[[Taint], float]
) -> float | None:
    """The time at which the pod must go (rules 2 and 3), or None when it may stay; ``since(taint)`` says when
    each taint appeared. A time in the past means now."""
    deadline: float | None = None
    for taint in taints:
        used = [t for t in tolerations if tolerates(t, taint)]
        if not used:
            return float("-inf")
        limits = [t.get("tolerationSeconds") for t in used]
        seconds = [int(s) for s in limits if isinstance(s, int) and not isinstance(s, bool)]
        if not seconds:
            continue  # tolerated for good
        at = since(taint) + max(min(seconds), 0)
        deadline = at if deadline is None else min(deadline, at)
    return deadline
