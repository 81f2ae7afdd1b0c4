"""Where the scheduler puts a pod (pure): kube-scheduler's filter plugins, then the feasible node with the fewest
pods.

Filters, in kube-scheduler's order; a node is counted once, under the first filter it fails:

1. NodeUnschedulable: ``spec.unschedulable`` nodes only take pods that tolerate
   ``node.kubernetes.io/unschedulable:NoSchedule``.
2. NodeName: a pod that names a node (``spec.nodeName`` set before scheduling) fits only that node.
3. TaintToleration: every taint with effect NoSchedule or NoExecute must be tolerated (PreferNoSchedule is a
   preference, never a filter). A node whose Ready condition is not True carries, as kube's node lifecycle
   controller would give it, the taint ``node.kubernetes.io/not-ready:NoSchedule`` (``unreachable`` when its
   Ready status is Unknown) in addition to its own.
4. NodeAffinity: the labels of ``spec.nodeSelector`` and, when given, one of the
   ``requiredDuringSchedulingIgnoredDuringExecution`` node selector terms (all of a term's ``matchExpressions``
   on labels, In/NotIn/Exists/DoesNotExist/Gt/Lt, and ``matchFields`` on ``metadata.name``). A term with no
   requirement matches nothing.

5. VolumeBinding (when the scheduler passes it as ``more``): the pod's claims, :mod:`volume_scheduling`.

Toleration matching (kube's ``Toleration.ToleratesTaint``): the effects are equal or the toleration's is empty
(all effects); the keys are equal or the toleration's key is empty with operator Exists (all keys); operator
Exists ignores the value, Equal (the default) needs it equal.

When no node fits the answer says why, in kube-scheduler's words, reasons sorted as kube sorts them:
``0/2 nodes are available: 1 node(s) didn't match Pod's node affinity/selector, 1 node(s) had untolerated taint
{k: v}.`` Among feasible nodes the one with the fewest non-terminated pods wins; ties go to the first name.
Resource requests and inter-pod affinity are not considered.
"""

from __future__ import annotations

from collections import Counter
from collections.abc import Callable, Iterable, Mapping, Sequence
from dataclasses import dataclass
from typing import Any

from ambit.lab.controllers.ownership import name_of
from ambit.lab.controllers.pods import condition
from ambit.lab.controllers.selectors import labels_of
from ambit.model.labels import map_matches

NO_NODES = "no nodes available to schedule pods"
UNSCHEDULABLE = "node(s) were unschedulable"
NODE_NAME = "node(s) didn't match the requested node name"
SELECTOR = "node(s) didn't match Pod's node affinity/selector"

UNSCHEDULABLE_TAINT = "node.kubernetes.io/unschedulable"
NOT_READY_TAINT = "node.kubernetes.io/not-ready"
UNREACHABLE_TAINT = "node.kubernetes.io/unreachable"
FILTERED_EFFECTS = ("NoSchedule", "NoExecute")


@dataclass(frozen=True, slots=True)
class Taint:
    key: str
    value: str = ""
    effect: str = "NoSchedule"

    def describe(self) -> str:
        return f"{{{self.key}: {self.value}}}"


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


def tolerations_of(pod: Mapping[str, Any]) -> list[Mapping[str, Any]]:
    items = (pod.get("spec") or {}).get("tolerations") or []
    return [t for t in items if isinstance(t, Mapping)] if isinstance(items, list) else []


def taints_of(node: Mapping[str, Any]) -> list[Taint]:
    """The node's taints, with the ones its Ready condition implies (filter 3)."""
    out: list[Taint] = []
    for item in (node.get("spec") or {}).get("taints") or []:
        if isinstance(item, Mapping) and item.get("key"):
            out.append(Taint(str(item["key"]), str(item.get("value") or ""), str(item.get("effect") or "")))
    if not is_node_ready(node):
        ready = (condition(node, "Ready") or {}).get("status")
        key = UNREACHABLE_TAINT if ready == "Unknown" else NOT_READY_TAINT
        if not any(t.key == key and t.effect == "NoSchedule" for t in out):
            out.append(Taint(key, "", "NoSchedule"))
    return out


def tolerates(toleration: Mapping[str, Any], taint: Taint) -> bool:
    effect = toleration.get("effect") or ""
    if effect and effect != taint.effect:
        return False
    key = toleration.get("key") or ""
    operator = toleration.get("operator") or "Equal"
    if key and key != taint.key:
        return False
    if operator == "Exists":
        return True
    return bool(key) and operator == "Equal" and str(toleration.get("value") or "") == taint.value


def first_untolerated(
    tolerations: Sequence[Mapping[str, Any]], taints: Iterable[Taint], effects: Sequence[str] = FILTERED_EFFECTS
) -> Taint | None:
    """The first taint with one of ``effects`` that no toleration tolerates."""
    for taint in taints:
        if taint.effect in effects and not any(tolerates(t, taint) for t in tolerations):
            return taint
    return None


def _requirement_matches(req: Mapping[str, Any], values_of: Mapping[str, str]) -> bool:
    key, op = str(req.get("key") or ""), req.get("operator")
    wanted = [str(v) for v in req.get("values") or [] if isinstance(v, str)]
    present = key in values_of
    have = values_of.get(key, "")
    if op == "In":
        return present and have in wanted
    if op == "NotIn":
        return not present or have not in wanted
    if op == "Exists":
        return present
    if op == "DoesNotExist":
        return not present
    if op in ("Gt", "Lt") and present and len(wanted) == 1:
        try:
            left, right = int(have), int(wanted[0])
        except ValueError:
            return False
        return left > right if op == "Gt" else left < right
    return False


def term_matches(term: Mapping[str, Any], node: Mapping[str, Any]) -> bool:
    """One node selector term: all its requirements hold; an empty term matches nothing (kube's rule)."""
    exprs = [e for e in term.get("matchExpressions") or [] if isinstance(e, Mapping)]
    fields = [e for e in term.get("matchFields") or [] if isinstance(e, Mapping)]
    if not exprs and not fields:
        return False
    labels = labels_of(node)
    node_fields = {"metadata.name": name_of(node)}
    return all(_requirement_matches(e, labels) for e in exprs) and all(
        _requirement_matches(e, node_fields) for e in fields
    )


def required_terms(pod: Mapping[str, Any]) -> list[Mapping[str, Any]] | None:
    """The pod's required node selector terms, or None when it has no required node affinity."""
    affinity = (pod.get("spec") or {}).get("affinity") or {}
    node_affinity = affinity.get("nodeAffinity") if isinstance(affinity, Mapping) else None
    required = node_affinity.get("requiredDuringSchedulingIgnoredDuringExecution") if node_affinity else None
    if not isinstance(required, Mapping):
        return None
    return [t for t in required.get("nodeSelectorTerms") or [] if isinstance(t, Mapping)]


def affinity_matches(pod: Mapping[str, Any], node: Mapping[str, Any]) -> bool:
    """Filter 4: ``nodeSelector`` and the required node affinity."""
    if not map_matches(node_selector(pod), labels_of(node)):
        return False
    terms = required_terms(pod)
    return terms is None or any(term_matches(t, node) for t in terms)


def why_not(pod: Mapping[str, Any], node: Mapping[str, Any]) -> str | None:
    """The first filter ``node`` fails for ``pod`` (its kube-scheduler reason), or None when it fits."""
    tolerations = tolerations_of(pod)
    cordoned = (node.get("spec") or {}).get("unschedulable") is True
    if cordoned and first_untolerated(tolerations, [Taint(UNSCHEDULABLE_TAINT)]) is not None:
        return UNSCHEDULABLE
    wanted = (pod.get("spec") or {}).get("nodeName")
    if wanted and wanted != name_of(node):
        return NODE_NAME
    taint = first_untolerated(tolerations, taints_of(node))
    if taint is not None:
        return f"node(s) had untolerated taint {taint.describe()}"
    if not affinity_matches(pod, node):
        return SELECTOR
    return None


def place(
    pod: Mapping[str, Any],
    nodes: Iterable[Mapping[str, Any]],
    load: Mapping[str, int],
    more: Callable[[Any], str | None] | None = None,
) -> Placement:
    """Choose a node for ``pod``; ``load`` is the number of non-terminated pods per node name; ``more`` is a
    filter run after filters 1-4 (the scheduler's VolumeBinding, :mod:`volume_scheduling`)."""
    candidates = sorted(nodes, key=name_of)
    if not candidates:
        return Placement(None, NO_NODES)
    fits: list[str] = []
    reasons: Counter[str] = Counter()
    for node in candidates:
        reason = why_not(pod, node)
        if reason is None and more is not None:
            reason = more(node)
        if reason is None:
            fits.append(name_of(node))
        else:
            reasons[reason] += 1
    if not fits:
        why = ", ".join(sorted(f"{count} {reason}" for reason, count in reasons.items()))
        return Placement(None, f"0/{len(candidates)} nodes are available: {why}.")
    return Placement(min(fits, key=lambda name: (load.get(name, 0), name)))
