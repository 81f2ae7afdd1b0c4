"""Which pods a StatefulSet makes, deletes and replaces, and what its status says, as kube's StatefulSet controller
decides it (pure: decisions, no I/O; time comes in as ``now``). The shell is :mod:`statefulset`.

Identity. A set's pods are *members*: named ``<set>-<ordinal>`` (the ordinal a decimal without leading zeros).
The set *wants* ordinals ``start .. start + replicas - 1`` (``start`` is ``spec.ordinals.start``, default 0);
members outside that range are *condemned*. A member carries the template's labels plus
``controller-revision-hash`` (the name of the revision it was made from), ``statefulset.kubernetes.io/pod-name``
and ``apps.kubernetes.io/pod-index``; ``spec.hostname`` is its name, ``spec.subdomain`` the set's
``serviceName``; its controller reference names the set.

Health. A pod is *ready* when Running with a True ``Ready`` condition, *available* when ready for
``minReadySeconds``, *healthy* when available and not terminating.

Rules, applied in order within one reconcile; "stop" ends the reconcile's pod changes (OrderedReady), while
Parallel carries on wherever a rule says "wait":

1. Wanted ordinals, lowest first: a missing pod is created (stop: it must become healthy before the next);
   a Failed or Succeeded pod is deleted, to come back with the same name once it is gone (stop); a terminating
   pod is waited for (stop); a pod not healthy is waited for (stop). A pod missing an identity label gets it.
2. Condemned pods, highest ordinal first, once rule 1 went through: a terminating one is waited for (stop); an
   unhealthy one is waited for (stop) unless it is the *first unhealthy pod* (the lowest unhealthy wanted one,
   else the highest unhealthy condemned one); otherwise it is deleted (stop: one at a time).
3. A new pod is made from the *current* revision when the strategy is RollingUpdate and its ordinal is below
   ``start + partition``; from the *update* revision otherwise (OnDelete: every pod made anew is updated).
4. RollingUpdate, once rules 1 and 2 went through: wanted ordinals from the highest down to ``start +
   partition``: a pod of another revision that is not terminating is deleted (rule 1 then makes it again from the
   update revision) and the walk stops; an unhealthy pod stops the walk. One pod at a time, in both policies.
   ``maxUnavailable`` (alpha in kube, behind a feature gate that is off by default) is ignored.
5. OnDelete: nothing is replaced; a pod someone deleted comes back from the update revision (rules 1 and 3).
6. Status, over every member: ``replicas`` counts them, ``readyReplicas`` the ready ones, ``availableReplicas``
   the available ones, ``currentReplicas``/``updatedReplicas`` those not terminating of the current/update
   revision. When every member is updated and ready, the rollout is complete: ``currentRevision`` becomes the
   update revision and ``currentReplicas`` the updated count (kube does this for RollingUpdate only, and an
   OnDelete set keeps its old ``currentRevision`` forever; here both strategies complete alike).
"""

from __future__ import annotations

import copy
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any

from ambit.lab.controllers import pods as podstate
from ambit.lab.controllers import stateful_claims
from ambit.lab.controllers.ownership import Object, is_deleting, key_of, name_of, owner_reference
from ambit.lab.controllers.revisions import HASH_LABEL
from ambit.lab.controllers.selectors import labels_of

POD_NAME_LABEL = "statefulset.kubernetes.io/pod-name"
POD_INDEX_LABEL = "apps.kubernetes.io/pod-index"


def _int(value: Any, default: int) -> int:
    return value if isinstance(value, int) and not isinstance(value, bool) and value >= 0 else default


def _spec(sts: Mapping[str, Any]) -> Mapping[str, Any]:
    spec = sts.get("spec")
    return spec if isinstance(spec, Mapping) else {}


def replicas(sts: Mapping[str, Any]) -> int:
    return _int(_spec(sts).get("replicas", 1), 1)


def start_ordinal(sts: Mapping[str, Any]) -> int:
    ordinals = _spec(sts).get("ordinals")
    return _int(ordinals.get("start", 0), 0) if isinstance(ordinals, Mapping) else 0


def is_parallel(sts: Mapping[str, Any]) -> bool:
    return _spec(sts).get("podManagementPolicy") == "Parallel"


def strategy_type(sts: Mapping[str, Any]) -> str:
    strategy = _spec(sts).get("updateStrategy")
    return "OnDelete" if isinstance(strategy, Mapping) and strategy.get("type") == "OnDelete" else "RollingUpdate"


def partition(sts: Mapping[str, Any]) -> int:
    strategy = _spec(sts).get("updateStrategy")
    rolling = strategy.get("rollingUpdate") if isinstance(strategy, Mapping) else None
    return _int(rolling.get("partition", 0), 0) if isinstance(rolling, Mapping) else 0


def min_ready_seconds(sts: Mapping[str, Any]) -> int:
    return _int(_spec(sts).get("minReadySeconds", 0), 0)


def service_name(sts: Mapping[str, Any]) -> str:
    value = _spec(sts).get("serviceName")
    return value if isinstance(value, str) else ""


def claim_names(sts: Mapping[str, Any]) -> list[str]:
    """The names of the set's ``volumeClaimTemplates``."""
    claims = _spec(sts).get("volumeClaimTemplates")
    names = []
    for claim in claims if isinstance(claims, list) else ():
        meta = claim.get("metadata") if isinstance(claim, Mapping) else None
        name = meta.get("name") if isinstance(meta, Mapping) else None
        if isinstance(name, str) and name:
            names.append(name)
    return names


def ordinal_of(set_name: str, pod: Mapping[str, Any]) -> int | None:
    """The pod's ordinal when it is named as a member of the set ``set_name``, else None."""
    prefix, dash, number = name_of(pod).rpartition("-")
    if not dash or prefix != set_name or not number.isdigit() or number != str(int(number)):
        return None
    return int(number)


def revision_of(pod: Mapping[str, Any]) -> str:
    return str(labels_of(pod).get(HASH_LABEL) or "")


def is_healthy(pod: Mapping[str, Any], min_ready: int, now: float) -> bool:
    return podstate.phase(pod) == "Running" and podstate.is_available(pod, min_ready, now) and not is_deleting(pod)


@dataclass(frozen=True, slots=True)
class Revisions:
    """The set's two revisions: *current* (what ``status.currentRevision`` names; the update revision when it
    names none that exists) and *update* (the set's template now), by name and pod template."""

    current: str
    update: str
    current_template: Mapping[str, Any]
    update_template: Mapping[str, Any]


def identity_labels(sts: Mapping[str, Any], ordinal: int) -> dict[str, str]:
    return {POD_NAME_LABEL: f"{name_of(sts)}-{ordinal}", POD_INDEX_LABEL: str(ordinal)}


def new_pod(sts: Mapping[str, Any], ordinal: int, revision: str, template: Mapping[str, Any]) -> Object:
    """The member ``ordinal`` of ``sts`` from ``template`` (the pod template of the revision named ``revision``);
    each volume claim template becomes a volume of its name on the member's claim (:mod:`stateful_claims`)."""
    template = copy.deepcopy(dict(template))
    meta: dict[str, Any] = template["metadata"] if isinstance(template.get("metadata"), dict) else {}
    name = f"{name_of(sts)}-{ordinal}"
    labels = dict(meta.get("labels") or {})
    labels.update({HASH_LABEL: revision, **identity_labels(sts, ordinal)})
    pod_meta: dict[str, Any] = {
        "name": name,
        "namespace": key_of(sts)[0],
        "labels": labels,
        "ownerReferences": [owner_reference(sts)],
    }
    if meta.get("annotations"):
        pod_meta["annotations"] = dict(meta["annotations"])
    spec: dict[str, Any] = template["spec"] if isinstance(template.get("spec"), dict) else {}
    spec["hostname"] = name
    if service_name(sts):
        spec["subdomain"] = service_name(sts)
    claims = claim_names(sts)
    if claims:
        volumes = [v for v in spec.get("volumes") or [] if isinstance(v, dict) and v.get("name") not in claims]
        spec["volumes"] = stateful_claims.pod_volumes(sts, ordinal) + volumes
    return {"apiVersion": "v1", "kind": "Pod", "metadata": pod_meta, "spec": spec}


@dataclass(slots=True)
class Plan:
    """What one reconcile does, in this order: relabel, delete, create."""

    create: list[Object] = field(default_factory=list)
    delete: list[Object] = field(default_factory=list)
    relabel: list[tuple[Object, dict[str, str]]] = field(default_factory=list)
    waiting_for: str = ""
    """The pod whose progress the set waits for ("" when nothing blocks)."""


def members(sts: Mapping[str, Any], pods: Iterable[Object]) -> dict[int, Object]:
    """The set's members by ordinal."""
    out: dict[int, Object] = {}
    for pod in pods:
        ordinal = ordinal_of(name_of(sts), pod)
        if ordinal is not None:
            out[ordinal] = pod
    return out


def plan(sts: Mapping[str, Any], pods: Sequence[Object], revisions: Revisions, now: float) -> Plan:
    """Rules 1-5 on the set's pods (its members; others are ignored)."""
    result = Plan()
    by_ordinal = members(sts, pods)
    first, count = start_ordinal(sts), replicas(sts)
    wanted = range(first, first + count)
    condemned = sorted((o for o in by_ordinal if o not in wanted), reverse=True)
    ordered = not is_parallel(sts)
    min_ready = min_ready_seconds(sts)
    rolling = strategy_type(sts) == "RollingUpdate"

    def stop(pod_name: str) -> bool:
        result.waiting_for = result.waiting_for or pod_name
        return ordered

    for ordinal in wanted:
        pod = by_ordinal.get(ordinal)
        name = f"{name_of(sts)}-{ordinal}"
        if pod is None:
            use_current = rolling and ordinal < first + partition(sts)
            revision = revisions.current if use_current else revisions.update
            template = revisions.current_template if use_current else revisions.update_template
            result.create.append(new_pod(sts, ordinal, revision, template))
            if stop(name):
                return result
            continue
        want = identity_labels(sts, ordinal)
        if not is_deleting(pod) and any(labels_of(pod).get(k) != v for k, v in want.items()):
            result.relabel.append((pod, {**labels_of(pod), **want}))
        if podstate.is_terminal(pod) and not is_deleting(pod):
            result.delete.append(pod)
            if stop(name):
                return result
        elif not is_healthy(pod, min_ready, now) and stop(name):
            return result
    unhealthy = [by_ordinal[o] for o in wanted if o in by_ordinal and not is_healthy(by_ordinal[o], min_ready, now)]
    unhealthy += [by_ordinal[o] for o in condemned if not is_healthy(by_ordinal[o], min_ready, now)]
    first_unhealthy = name_of(unhealthy[0]) if unhealthy else ""
    for ordinal in condemned:
        pod = by_ordinal[ordinal]
        if is_deleting(pod):
            if stop(name_of(pod)):
                return result
            continue
        if ordered and not is_healthy(pod, min_ready, now) and name_of(pod) != first_unhealthy:
            stop(first_unhealthy)
            return result
        result.delete.append(pod)
        if stop(name_of(pod)):
            return result
    if not rolling:
        return result
    touched = {name_of(p) for p in result.create + result.delete}
    for ordinal in reversed(range(first + min(partition(sts), count), first + count)):
        pod = by_ordinal.get(ordinal)
        name = f"{name_of(sts)}-{ordinal}"
        if pod is None or name in touched:
            result.waiting_for = result.waiting_for or name
            return result
        if revision_of(pod) != revisions.update and not is_deleting(pod):
            result.delete.append(pod)
            result.waiting_for = result.waiting_for or name
            return result
        if not is_healthy(pod, min_ready, now):
            result.waiting_for = result.waiting_for or name
            return result
    return result


def status(sts: Mapping[str, Any], pods: Sequence[Object], revisions: Revisions, now: float) -> dict[str, Any]:
    """Rule 6: the status figures and revisions (``collisionCount`` and conditions are the shell's)."""
    min_ready = min_ready_seconds(sts)
    member_pods = list(members(sts, pods).values())
    ready = [p for p in member_pods if podstate.phase(p) == "Running" and podstate.is_ready(p)]
    live = [p for p in member_pods if not is_deleting(p)]
    current = sum(1 for p in live if revision_of(p) == revisions.current)
    updated = sum(1 for p in live if revision_of(p) == revisions.update)
    result: dict[str, Any] = {
        "observedGeneration": (sts.get("metadata") or {}).get("generation", 0),
        "replicas": len(member_pods),
        "readyReplicas": len(ready),
        "currentReplicas": current,
        "updatedReplicas": updated,
        "availableReplicas": sum(1 for p in ready if podstate.is_available(p, min_ready, now)),
        "currentRevision": revisions.current,
        "updateRevision": revisions.update,
    }
    if updated == len(member_pods) == len(ready):
        result["currentRevision"] = revisions.update
        result["currentReplicas"] = updated
    return result


def next_check(sts: Mapping[str, Any], pods: Iterable[Object], now: float) -> float | None:
    """Seconds until the first ready member becomes available (its readiness then unblocks the set), or None."""
    min_ready = min_ready_seconds(sts)
    waits = [podstate.unavailable_for(p, min_ready, now) for p in members(sts, pods).values() if not is_deleting(p)]
    pending = [w for w in waits if w]
    return min(pending) if pending else None
