"""The scheduler: bind pods that name ``default-scheduler`` (or no scheduler) and no node to a node.

Binding is a merge patch of ``spec.nodeName`` that carries the pod's ``resourceVersion`` as a precondition. The
embedded API server has no ``pods/binding`` subresource; the precondition gives the same guarantee: if the pod
changed since we read it — another scheduler bound it first — the server answers 409 and the pod is looked at
again, so two schedulers never double-bind a pod.

Rules:

1. One worker, so placements are decided one after the other. Pods we bound are *assumed* on their node until
   the informer shows the binding, so a burst of pods spreads over the nodes instead of piling onto the one the
   cache still thinks is empty (kube-scheduler's assume cache).
2. A pod that cannot be placed (:mod:`placement`), or whose ``spec.nodeName`` names a node that does not exist,
   stays Pending with condition ``PodScheduled=False`` (reason ``Unschedulable``, written through pods/status
   only when it changes) and a Warning Event ``FailedScheduling``. Every node change queues such pods again.
3. A bound pod gets ``PodScheduled=True``, and, when we bound it, a Normal Event ``Scheduled``.
4. Conditions are written with a strategic merge patch (merge key ``type``), so the kubelet's conditions stay.
5. Volumes (kube-scheduler's VolumeBinding, :mod:`volume_scheduling`): a pod whose claims stop it everywhere
   stays Pending with kube's message; otherwise the node is chosen with the volume filter, the chosen node's
   static volumes are pre-bound to the pod's late-binding claims and its provisioned claims annotated
   ``volume.kubernetes.io/selected-node``, and the pod is bound only once every claim is Bound (a claim's change
   queues its waiting pods; :data:`VOLUME_WAIT` is the fallback).
"""

from __future__ import annotations

import logging
from typing import Any

from ambit.k8s import Informer, kinds
from ambit.lab.controllers import pods as podstate
from ambit.lab.controllers import volume_binding as binding
from ambit.lab.controllers import volume_scheduling as volumes
from ambit.lab.controllers.controller import Controller
from ambit.lab.controllers.ownership import Object, is_deleting, key_of, name_of
from ambit.lab.controllers.placement import place
from ambit.lab.controllers.workqueue import Key

log = logging.getLogger("ambit.lab.controllers.scheduler")

SCHEDULER_NAME = "default-scheduler"
VOLUME_WAIT = 0.5
"""Seconds before a pod whose claims are being bound or provisioned is looked at again (rule 5)."""


def is_ours(pod: Object) -> bool:
    name = (pod.get("spec") or {}).get("schedulerName")
    return name in (None, "", SCHEDULER_NAME) and not podstate.is_terminal(pod) and not is_deleting(pod)


def _inputs(pod: Object) -> tuple[Any, ...]:
    """What scheduling depends on: a pod update that changes none of it (a status write) is not a reason."""
    meta = pod.get("metadata") or {}
    return (meta.get("uid"), meta.get("deletionTimestamp"), pod.get("spec"))


def _node_inputs(node: Object) -> tuple[Any, ...]:
    ready = (podstate.condition(node, "Ready") or {}).get("status")
    return (node.get("spec"), (node.get("metadata") or {}).get("labels"), ready)


class Scheduler(Controller):
    name = SCHEDULER_NAME
    failure_reason = "FailedScheduling"

    def setup(self) -> None:
        self.assumed: dict[Key, str] = {}
        """Pods we bound that the informer still shows unbound, and their node."""
        self.informers.pods.add_handler(
            on_add=self._pod_added, on_update=self._pod_updated, on_delete=self._pod_deleted
        )
        self.informers.nodes.add_handler(
            on_add=self._nodes_changed, on_update=self._node_updated, on_delete=self._nodes_changed
        )
        self.informers.persistentvolumeclaims.add_handler(
            on_add=self._claim_changed, on_update=lambda old, new: self._claim_changed(new)
        )

    @property
    def objects(self) -> Informer:
        return self.informers.pods

    def all_keys(self) -> list[Key]:
        """Pods of ours not yet bound (bound ones need nothing more from the scheduler)."""
        return [
            key_of(p) for p in self.informers.pods.items() if is_ours(p) and not (p.get("spec") or {}).get("nodeName")
        ]

    # -- events ---------------------------------------------------------------------------------------------
    def _pod_added(self, pod: Object) -> None:
        if is_ours(pod):
            self.queue.add(key_of(pod))

    def _pod_updated(self, old: Object, new: Object) -> None:
        if (new.get("spec") or {}).get("nodeName"):
            self.assumed.pop(key_of(new), None)
        if is_ours(new) and _inputs(old) != _inputs(new):
            self.queue.add(key_of(new))

    def _pod_deleted(self, pod: Object) -> None:
        self.assumed.pop(key_of(pod), None)

    def _node_updated(self, old: Object, new: Object) -> None:
        if _node_inputs(old) != _node_inputs(new):  # not on every heartbeat
            self._nodes_changed(new)

    def _claim_changed(self, claim: Object) -> None:
        """Pods waiting for this claim look again."""
        namespace, name = key_of(claim)
        for pod in self.informers.pods.items():
            waiting = is_ours(pod) and not (pod.get("spec") or {}).get("nodeName")
            if waiting and key_of(pod)[0] == namespace and name in volumes.pod_claims(pod):
                self.queue.add(key_of(pod))

    def _nodes_changed(self, node: Object) -> None:
        """Pods waiting for a node look again."""
        for pod in self.informers.pods.items():
            if is_ours(pod) and (podstate.condition(pod, "PodScheduled") or {}).get("status") != "True":
                self.queue.add(key_of(pod))

    # -- reconcile ------------------------------------------------------------------------------------------
    async def reconcile(self, key: Key) -> float | None:
        pod = self.find(key)
        if pod is None:
            self.assumed.pop(key, None)
            return None
        if not is_ours(pod) or key in self.assumed:
            return None
        node_name = (pod.get("spec") or {}).get("nodeName")
        if node_name:
            if self.informers.nodes.find(node_name) is None:
                await self._unschedulable(pod, f'node "{node_name}" not found')
            else:
                await self._set_condition(pod, "True", None, None)
            return None
        nodes = self.informers.nodes.items()
        claims = volumes.pod_claims(pod)
        view = self._volume_view(pod)
        blocked = volumes.prefilter(pod, view) if claims else None
        if blocked is not None:
            await self._unschedulable(pod, f"0/{len(nodes)} nodes are available: {blocked}.")
            return None
        fits: dict[str, volumes.NodeFit] = {}

        def volume_filter(node: Object) -> str | None:
            fits[name_of(node)] = found = volumes.fit(pod, node, view)
            return found.reason

        placement = place(pod, nodes, self.load(), volume_filter if claims else None)
        if placement.node is None:
            await self._unschedulable(pod, placement.message)
            return None
        chosen = fits.get(placement.node)
        if chosen is not None and (chosen.prebind or chosen.select):
            await self._prepare_volumes(pod, placement.node, chosen)
        if claims and not volumes.all_bound(pod, view):
            return VOLUME_WAIT  # rule 5: the claims' binding queues the pod again; this is the fallback
        await self.bind(pod, placement.node)
        return None

    def _volume_view(self, pod: Object) -> volumes.VolumeView:
        namespace = key_of(pod)[0]
        inf = self.informers
        return volumes.VolumeView(
            claim=lambda name: inf.persistentvolumeclaims.find(name, namespace),
            volume=inf.persistentvolumes.find,
            storage_class=inf.storageclasses.find,
            volumes=inf.persistentvolumes.items(),
        )

    async def _prepare_volumes(self, pod: Object, node: str, fit: volumes.NodeFit) -> None:
        """Rule 5: pre-bind static volumes and tell provisioners the node."""
        namespace = key_of(pod)[0]
        for claim_name, volume_name in fit.prebind:
            claim = self.informers.persistentvolumeclaims.find(claim_name, namespace)
            volume = self.informers.persistentvolumes.find(volume_name)
            if claim is None or volume is None or binding.refers_to(volume, claim):
                continue
            rv = (volume.get("metadata") or {}).get("resourceVersion")
            body = {"metadata": {"resourceVersion": rv}, "spec": {"claimRef": binding.claim_ref_for(claim)}}
            await self.client.patch(kinds.PERSISTENT_VOLUMES, volume_name, body)
        for claim_name in fit.select:
            body = {"metadata": {"annotations": {binding.SELECTED_NODE: node}}}
            await self.client.patch(kinds.PERSISTENT_VOLUME_CLAIMS, claim_name, body, namespace)

    def load(self) -> dict[str, int]:
        """Non-terminated pods per node, counting the ones we assumed there."""
        counts: dict[str, int] = {}
        for pod in self.informers.pods.items():
            node = (pod.get("spec") or {}).get("nodeName")
            if node and not podstate.is_terminal(pod):
                counts[node] = counts.get(node, 0) + 1
        for node in self.assumed.values():
            counts[node] = counts.get(node, 0) + 1
        return counts

    async def bind(self, pod: Object, node: str) -> None:
        namespace, name = key_of(pod)
        rv = (pod.get("metadata") or {}).get("resourceVersion")
        bound = await self.client.patch(
            kinds.PODS, name, {"metadata": {"resourceVersion": rv}, "spec": {"nodeName": node}}, namespace
        )
        cached = self.find((namespace, name))
        if cached is None or not (cached.get("spec") or {}).get("nodeName"):
            self.assumed[(namespace, name)] = node
        log.info("bound %s/%s to %s", namespace, name, node)
        self.recorder.record(
            bound, "Normal", "Scheduled", f"Successfully assigned {namespace}/{name} to {node}", "Binding"
        )
        await self._set_condition(bound, "True", None, None)

    async def _unschedulable(self, pod: Object, message: str) -> None:
        log.info("cannot schedule %s/%s: %s", *key_of(pod), message)
        self.recorder.record(pod, "Warning", "FailedScheduling", message, "Scheduling")
        await self._set_condition(pod, "False", "Unschedulable", message)

    async def _set_condition(self, pod: Object, status: str, reason: str | None, message: str | None) -> None:
        current = podstate.condition(pod, "PodScheduled") or {}
        if (current.get("status"), current.get("reason"), current.get("message")) == (status, reason, message):
            return
        cond: dict[str, Any] = {"type": "PodScheduled", "status": status, "reason": reason, "message": message}
        if current.get("status") != status:
            cond["lastProbeTime"] = None
            cond["lastTransitionTime"] = podstate.rfc3339(self.clock())
        patch = {"status": {"conditions": [cond]}}
        await self.client.patch_status(kinds.PODS, name_of(pod), patch, key_of(pod)[0], patch_type="strategic")
