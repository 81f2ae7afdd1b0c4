"""Where the scheduler puts a pod (pure): the feasible node with the fewest pods.

A node is feasible for a pod when it is schedulable (``spec.unschedulable`` not true), Ready (its ``Ready``
condition is True) and carries every label of the pod's ``spec.nodeSelector``. Among feasible nodes the one with
the fewest non-terminated pods wins; ties go to the first name. Taints, tolerations, affinity and resource
requests are not considered.

When no node is feasible the answer says why, in kube-scheduler's words: ``0/3 nodes are available: 1 node(s)
didn't match Pod's node affinity/selector, 2 node(s) were unschedulable.`` Each node is counted once, under the
first check it fails in the order above.
"""

from __future__ import annotations

from collections import Counter
from collections.abc import Iterable, Mapping
from dataclasses import dataclass
from typing import Any

from ambit.lab.controllers.ownership import name_of
from ambit.lab.controllers.pods import condition
from ambit.lab.controllers.selectors import labels_of
from ambit.model.labels import map_matches

NO_NODES = "no nodes available to schedule pods"
UNSCHEDULABLE = "node(s) were unschedulable"
NOT_READY = "node(s) were not ready"
SELECTOR = "node(s) didn't match Pod's node affinity/selector"


@dataclass(frozen=True, slots=True)
class Placement:
    node: str | None
    """The chosen node, or None when the pod cannot be placed now."""
    message: str = ""
    """Why not, when ``node`` is None."""


def is_node_ready(node: Mapping[str, Any]) -> bool:
    cond = condition(node, "Ready")
    return cond is not None and cond.get("status") == "True"


def node_selector(pod: Mapping[str, Any]) -> dict[str, str]:
    selector = (pod.get("spec") or {}).get("nodeSelector")
    return {str(k): str(v) for k, v in selector.items()} if isinstance(selector, dict) else {}


def place(pod: Mapping[str, Any], nodes: Iterable[Mapping[str, Any]], load: Mapping[str, int]) -> Placement:
    """Choose a node for ``pod``; ``load`` is the number of non-terminated pods per node name."""
    selector = node_selector(pod)
    candidates = sorted(nodes, key=name_of)
    if not candidates:
        return Placement(None, NO_NODES)
    fits: list[str] = []
    reasons: Counter[str] = Counter()
    for node in candidates:
        if (node.get("spec") or {}).get("unschedulable") is True:
            reasons[UNSCHEDULABLE] += 1
        elif not is_node_ready(node):
            reasons[NOT_READY] += 1
        elif not map_matches(selector, labels_of(node)):
            reasons[SELECTOR] += 1
        else:
            fits.append(name_of(node))
    if not fits:
        why = ", ".join(f"{count} {reason}" for reason, count in sorted(reasons.items()))
        return Placement(None, f"0/{len(candidates)} nodes are available: {why}.")
    return Placement(min(fits, key=lambda name: (load.get(name, 0), name)))
