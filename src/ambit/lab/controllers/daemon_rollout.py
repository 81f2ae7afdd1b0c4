"""Which nodes run a DaemonSet's pod, and how a template change rolls over them, as kube's DaemonSet controller
decides it (pure: decisions, no I/O; time comes in as ``now``).

Rules:

1. *Should run* on a node: the template names no other node, the node matches the template's ``nodeSelector``
   and required node affinity, and the pod (with the tolerations every daemon pod gets, :data:`DAEMON_TOLERATIONS`)
   tolerates the node's NoSchedule and NoExecute taints (the implied not-ready taint included, as the scheduler
   sees it). *Should continue running*: the same, but only NoExecute taints count. ``desiredNumberScheduled`` counts
   the nodes where it should run.
2. A daemon pod is pinned to its node by required node affinity ``matchFields metadata.name In [node]`` (replacing
   the template's required terms, which rule 1 already checked) and goes through the scheduler, as kube >= 1.12.
   It carries the template's labels plus ``controller-revision-hash`` and ``pod-template-generation``.
3. Manage, per node: should run and no pod at all -> create one (a terminating pod still running holds its node
   until it is gone); otherwise terminating pods are ignored and terminal ones deleted;
   several pods -> keep the oldest (with surge: the oldest new and the oldest old, the old one going once it is
   not ready or the new one is available); should not continue running -> delete its pods. Pods whose node is
   gone are deleted.
4. RollingUpdate, no surge (``maxUnavailable`` as an int or a percentage of desired, rounded up): nodes whose pod
   is new but unavailable, or that should run one and have none (a terminating pod does not count), or that have
   both kinds, count as unavailable. Old pods that are
   unavailable are deleted at once; available old pods are deleted, in node name order, only while the
   unavailable count stays within ``maxUnavailable``. Manage then creates the new pods.
5. RollingUpdate with ``maxSurge``: a node whose old pod is unavailable gets its new pod at once; otherwise new
   pods are created on nodes with only an old pod while fewer than ``maxSurge`` new pods are waiting to become
   available; an old pod is deleted once the new one on its node is available.
6. OnDelete: only manage runs, so a node gets the new template when its pod is deleted.
7. A pod is *updated* when its hash label is the current revision's, or its ``pod-template-generation`` label
   the DaemonSet's ``deprecated.daemonset.template.generation``.
"""

from __future__ import annotations

import copy
import math
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any

from ambit.lab.controllers import pods as podstate
from ambit.lab.controllers.ownership import Object, is_deleting, key_of, name_of, owner_reference
from ambit.lab.controllers.placement import (
    Taint,
    affinity_matches,
    first_untolerated,
    taints_of,
    tolerations_of,
)
from ambit.lab.controllers.revisions import HASH_LABEL

GENERATION_ANNOTATION = "deprecated.daemonset.template.generation"
GENERATION_LABEL = "pod-template-generation"


def _tol(key: str, effect: str) -> dict[str, Any]:
    return {"key": f"node.kubernetes.io/{key}", "operator": "Exists", "effect": effect}


DAEMON_TOLERATIONS = (
    _tol("not-ready", "NoExecute"),
    _tol("unreachable", "NoExecute"),
    _tol("disk-pressure", "NoSchedule"),
    _tol("memory-pressure", "NoSchedule"),
    _tol("pid-pressure", "NoSchedule"),
    _tol("unschedulable", "NoSchedule"),
)
HOST_NETWORK_TOLERATIONS = (_tol("network-unavailable", "NoSchedule"),)


def with_daemon_tolerations(spec: dict[str, Any]) -> None:
    """Add kube's daemon pod tolerations to a pod spec in place (an equal one already there is kept)."""
    tolerations = [t for t in spec.get("tolerations") or [] if isinstance(t, dict)]
    extra = DAEMON_TOLERATIONS + (HOST_NETWORK_TOLERATIONS if spec.get("hostNetwork") is True else ())
    for wanted in extra:
        if not any(_same_toleration(t, wanted) for t in tolerations):
            tolerations.append(dict(wanted))
    spec["tolerations"] = tolerations


def _same_toleration(a: Mapping[str, Any], b: Mapping[str, Any]) -> bool:
    fields = ("key", "operator", "value", "effect")
    return all((a.get(f) or "") == (b.get(f) or "") for f in fields)


def _template_pod(ds: Mapping[str, Any]) -> Object:
    template = (ds.get("spec") or {}).get("template") or {}
    spec = copy.deepcopy(template.get("spec") or {})
    with_daemon_tolerations(spec)
    return {"metadata": copy.deepcopy(template.get("metadata") or {}), "spec": spec}


@dataclass(frozen=True, slots=True)
class Fit:
    should_run: bool
    should_continue: bool


def node_fit(ds: Mapping[str, Any], node: Mapping[str, Any], pod: Mapping[str, Any] | None = None) -> Fit:
    """Rule 1 (``pod``: the DaemonSet's template pod, when the caller has it already)."""
    pod = pod if pod is not None else _template_pod(ds)
    wanted = (pod.get("spec") or {}).get("nodeName")
    if (wanted and wanted != name_of(node)) or not affinity_matches(pod, node):
        return Fit(False, False)
    tolerations = tolerations_of(pod)
    taints: list[Taint] = taints_of(node)
    if first_untolerated(tolerations, taints) is None:
        return Fit(True, True)
    return Fit(False, first_untolerated(tolerations, taints, ("NoExecute",)) is None)


def template_generation(ds: Mapping[str, Any]) -> str:
    return str(((ds.get("metadata") or {}).get("annotations") or {}).get(GENERATION_ANNOTATION) or "")


def is_updated(pod: Mapping[str, Any], pod_hash: str, generation: str) -> bool:
    """Rule 7."""
    labels = (pod.get("metadata") or {}).get("labels") or {}
    return (bool(pod_hash) and labels.get(HASH_LABEL) == pod_hash) or (
        bool(generation) and labels.get(GENERATION_LABEL) == generation
    )


def new_pod(ds: Mapping[str, Any], node: str, pod_hash: str) -> Object:
    """A daemon pod for ``node`` (rule 2); the server picks the name's suffix."""
    pod = _template_pod(ds)
    labels = dict(pod["metadata"].get("labels") or {})
    labels[HASH_LABEL] = pod_hash
    if template_generation(ds):
        labels[GENERATION_LABEL] = template_generation(ds)
    meta: dict[str, Any] = {
        "generateName": f"{name_of(ds)}-",
        "namespace": key_of(ds)[0],
        "labels": labels,
        "ownerReferences": [owner_reference(ds)],
    }
    if pod["metadata"].get("annotations"):
        meta["annotations"] = dict(pod["metadata"]["annotations"])
    spec = pod["spec"]
    pin = {"matchFields": [{"key": "metadata.name", "operator": "In", "values": [node]}]}
    affinity: dict[str, Any] = spec["affinity"] if isinstance(spec.get("affinity"), dict) else {}
    node_affinity: dict[str, Any] = affinity["nodeAffinity"] if isinstance(affinity.get("nodeAffinity"), dict) else {}
    before = node_affinity.get("requiredDuringSchedulingIgnoredDuringExecution")
    required: dict[str, Any] = dict(before) if isinstance(before, dict) else {}
    required["nodeSelectorTerms"] = [pin]
    node_affinity["requiredDuringSchedulingIgnoredDuringExecution"] = required
    affinity["nodeAffinity"] = node_affinity
    spec["affinity"] = affinity
    return {"apiVersion": "v1", "kind": "Pod", "metadata": meta, "spec": spec}


def target_node(pod: Mapping[str, Any]) -> str:
    """The node a daemon pod is for: where it is bound, else the node its affinity pins it to."""
    spec = pod.get("spec") or {}
    if spec.get("nodeName"):
        return str(spec["nodeName"])
    affinity = spec.get("affinity") or {}
    required = ((affinity.get("nodeAffinity") or {}) if isinstance(affinity, Mapping) else {}).get(
        "requiredDuringSchedulingIgnoredDuringExecution"
    )
    for term in (required or {}).get("nodeSelectorTerms") or []:
        for expr in term.get("matchFields") or []:
            values = expr.get("values") or []
            if expr.get("key") == "metadata.name" and expr.get("operator") == "In" and len(values) == 1:
                return str(values[0])
    return ""


def by_node(pods: Iterable[Object]) -> dict[str, list[Object]]:
    """The DaemonSet's pods by target node, oldest first; a terminal pod that is being deleted is left out (a
    terminating pod that still runs counts: its node gets no new pod until it is gone)."""
    out: dict[str, list[Object]] = {}
    for pod in pods:
        if not (is_deleting(pod) and podstate.is_terminal(pod)):
            out.setdefault(target_node(pod), []).append(pod)
    for items in out.values():
        items.sort(key=_age_order)
    return out


def _age_order(pod: Mapping[str, Any]) -> tuple[float, str]:
    created = podstate.parse_time((pod.get("metadata") or {}).get("creationTimestamp")) or 0.0
    return (created, name_of(pod))


def _resolve(value: Any, total: int) -> int:
    if isinstance(value, int) and not isinstance(value, bool):
        return max(value, 0)
    if isinstance(value, str) and value.endswith("%") and value[:-1].isdigit():
        return math.ceil(int(value[:-1]) * total / 100)
    return 0


def strategy_type(ds: Mapping[str, Any]) -> str:
    strategy = (ds.get("spec") or {}).get("updateStrategy") or {}
    return "OnDelete" if strategy.get("type") == "OnDelete" else "RollingUpdate"


def surge_and_unavailable(ds: Mapping[str, Any], desired: int) -> tuple[int, int]:
    """``maxSurge`` and ``maxUnavailable`` in nodes (percentages of ``desired``, rounded up; both 0 means
    ``maxUnavailable`` 1)."""
    rolling = ((ds.get("spec") or {}).get("updateStrategy") or {}).get("rollingUpdate") or {}
    surge = _resolve(rolling.get("maxSurge", 0), desired)
    unavailable = _resolve(rolling.get("maxUnavailable", 1), desired)
    if surge == 0 and unavailable == 0:
        unavailable = 1
    return surge, unavailable


def min_ready_seconds(ds: Mapping[str, Any]) -> int:
    value = (ds.get("spec") or {}).get("minReadySeconds") or 0
    return value if isinstance(value, int) and value > 0 else 0


@dataclass(slots=True)
class Plan:
    """What one reconcile does: nodes to create a pod on, pods to delete."""

    create_on: list[str] = field(default_factory=list)
    delete: list[Object] = field(default_factory=list)

    def add_delete(self, pod: Object) -> None:
        if all(key_of(p) != key_of(pod) for p in self.delete):
            self.delete.append(pod)


def manage(
    ds: Mapping[str, Any],
    nodes: Sequence[Mapping[str, Any]],
    pods: Mapping[str, list[Object]],
    pod_hash: str,
    now: float,
) -> Plan:
    """Rule 3; ``pods`` from :func:`by_node`."""
    plan = Plan()
    template = _template_pod(ds)
    surge, _ = surge_and_unavailable(ds, 1)
    allows_surge = strategy_type(ds) == "RollingUpdate" and surge > 0
    min_ready = min_ready_seconds(ds)
    known = {name_of(n) for n in nodes}
    for node in sorted(nodes, key=name_of):
        name = name_of(node)
        fit = node_fit(ds, node, template)
        here = pods.get(name, [])
        if fit.should_run and not here:
            plan.create_on.append(name)
        elif fit.should_continue:
            running = []
            for pod in here:
                if is_deleting(pod):
                    continue
                if podstate.is_terminal(pod):
                    plan.add_delete(pod)
                else:
                    running.append(pod)
            if len(running) > 1:
                for pod in _surplus(running, pod_hash, allows_surge, min_ready, now):
                    plan.add_delete(pod)
        else:
            for pod in here:
                if not is_deleting(pod):
                    plan.add_delete(pod)
    for node_name, orphans in sorted(pods.items()):
        if node_name not in known:
            for pod in orphans:
                if not is_deleting(pod):
                    plan.add_delete(pod)
    return plan


def _surplus(running: Sequence[Object], pod_hash: str, allows_surge: bool, min_ready: int, now: float) -> list[Object]:
    """Of several pods on one node (oldest first), the ones to delete (rule 3)."""
    if not allows_surge:
        return list(running[1:])
    doomed: list[Object] = []
    oldest_new: Object | None = None
    oldest_old: Object | None = None
    for pod in running:
        is_new = ((pod.get("metadata") or {}).get("labels") or {}).get(HASH_LABEL) == pod_hash
        if is_new and oldest_new is None:
            oldest_new = pod
        elif not is_new and oldest_old is None:
            oldest_old = pod
        else:
            doomed.append(pod)
    if oldest_new is None or oldest_old is None:
        return doomed
    if not podstate.is_ready(oldest_old) or podstate.is_available(oldest_new, min_ready, now):
        doomed.append(oldest_old)
    return doomed


def _split(pods: Sequence[Object], pod_hash: str, generation: str) -> tuple[Object | None, Object | None, bool]:
    """(new pod, old pod, ok) on one node; not ok when there are several of either (manage sorts that out)."""
    new: list[Object] = []
    old: list[Object] = []
    for pod in pods:
        if not is_deleting(pod):
            (new if is_updated(pod, pod_hash, generation) else old).append(pod)
    if len(new) > 1 or len(old) > 1:
        return None, None, False
    return (new[0] if new else None), (old[0] if old else None), True


def rolling_update(
    ds: Mapping[str, Any],
    nodes: Sequence[Mapping[str, Any]],
    pods: Mapping[str, list[Object]],
    pod_hash: str,
    now: float,
) -> Plan:
    """Rules 4 and 5: the old pods to delete and, with surge, the nodes to create new pods on."""
    template = _template_pod(ds)
    wanted = {name_of(n) for n in nodes if node_fit(ds, n, template).should_run}
    surge, max_unavailable = surge_and_unavailable(ds, len(wanted))
    generation = template_generation(ds)
    min_ready = min_ready_seconds(ds)
    plan = Plan()
    if surge == 0:
        unavailable = 0
        replace_now: list[Object] = []
        candidates: list[Object] = []
        for node_name in sorted(wanted | set(pods)):
            new, old, ok = _split(pods.get(node_name, []), pod_hash, generation)
            if not ok or (new is None) == (old is None):
                unavailable += 1
            elif new is not None:
                if not podstate.is_available(new, min_ready, now):
                    unavailable += 1
            elif old is not None:
                if not podstate.is_available(old, min_ready, now):
                    replace_now.append(old)
                elif unavailable < max_unavailable:
                    candidates.append(old)
        room = min(max(max_unavailable - unavailable, 0), len(candidates))
        plan.delete = replace_now + candidates[:room]
        return plan
    waiting = 0
    allowed: list[str] = []
    candidate_nodes: list[str] = []
    for node_name in sorted(pods):
        new, old, ok = _split(pods[node_name], pod_hash, generation)
        if not ok or old is None:
            continue
        if new is None:
            if not podstate.is_available(old, min_ready, now):
                allowed.append(node_name)
            elif waiting < surge:
                candidate_nodes.append(node_name)
        elif not podstate.is_available(new, min_ready, now):
            waiting += 1
        else:
            plan.delete.append(old)
    room = min(max(surge - waiting, 0), len(candidate_nodes))
    plan.create_on = allowed + candidate_nodes[:room]
    return plan


def daemon_status(
    ds: Mapping[str, Any],
    nodes: Sequence[Mapping[str, Any]],
    pods: Mapping[str, list[Object]],
    pod_hash: str,
    now: float,
) -> dict[str, Any]:
    """The DaemonSet's status figures (kube's ``updateDaemonSetStatus``); each node is judged by its oldest pod."""
    template = _template_pod(ds)
    generation = template_generation(ds)
    min_ready = min_ready_seconds(ds)
    desired = current = misscheduled = ready = available = updated = 0
    for node in nodes:
        here = pods.get(name_of(node), [])
        if node_fit(ds, node, template).should_run:
            desired += 1
            if not here:
                continue
            current += 1
            pod = here[0]
            if podstate.is_ready(pod):
                ready += 1
                if podstate.is_available(pod, min_ready, now):
                    available += 1
            if is_updated(pod, pod_hash, generation):
                updated += 1
        elif here:
            misscheduled += 1
    return {
        "currentNumberScheduled": current,
        "numberMisscheduled": misscheduled,
        "desiredNumberScheduled": desired,
        "numberReady": ready,
        "updatedNumberScheduled": updated,
        "numberAvailable": available,
        "numberUnavailable": desired - available,
        "observedGeneration": (ds.get("metadata") or {}).get("generation", 0),
    }
