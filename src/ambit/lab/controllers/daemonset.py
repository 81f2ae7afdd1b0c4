"""The DaemonSet controller: one pod per eligible node, rolled over by the update strategy, with its
ControllerRevision history. Decisions are :mod:`daemon_rollout`'s and :mod:`revisions`'; this is the I/O.

A reconcile, for one DaemonSet (nothing while it is being deleted: the garbage collector removes its pods and
revisions):

1. Claims pods in its namespace (:mod:`ownership`: adopt matching orphans, release pods that stopped matching).
2. Sorts out its revisions (those it controls) with :mod:`revision_history`: deletes duplicates of the current
   one, creates the current one when missing (``AlreadyExists`` with another template bumps
   ``status.collisionCount`` and retries), renumbers it when it is not the newest. The current revision's hash is
   the ``controller-revision-hash`` of new pods.
3. If its expectations (:mod:`expectations`) are satisfied: runs manage and, for RollingUpdate, the rolling
   update step on the same snapshot, then creates and deletes pods (Events ``SuccessfulCreate``,
   ``SuccessfulDelete``; ``FailedCreate`` on failure).
4. Deletes old revisions beyond ``revisionHistoryLimit`` that no pod uses.
5. Writes status (through the status subresource) when it changed; pods ready but not yet for
   ``minReadySeconds`` make it look again when they become available.

Every pod, node or revision change queues the DaemonSets it concerns: a pod's controller, every DaemonSet when a
node's labels, taints, readiness or schedulability change.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
from typing import Any

from ambit.k8s import Informer, KubeClientError, KubeNotFoundError, kinds
from ambit.lab.controllers import daemon_rollout, revisions
from ambit.lab.controllers import pods as podstate
from ambit.lab.controllers.controller import PodOwner
from ambit.lab.controllers.ownership import Object, controller_key, is_deleting, key_of, name_of
from ambit.lab.controllers.reconcile import SyncError
from ambit.lab.controllers.revision_history import sync_history
from ambit.lab.controllers.selectors import labels_of
from ambit.lab.controllers.workqueue import Key

log = logging.getLogger("ambit.lab.controllers.daemonset")


def _node_inputs(node: Object) -> tuple[Any, ...]:
    ready = (podstate.condition(node, "Ready") or {}).get("status")
    return (node.get("spec"), labels_of(node), ready)


class DaemonSetController(PodOwner):
    name = "daemonset-controller"
    owner_kind = "DaemonSet"

    def setup(self) -> None:
        super().setup()
        self.watch_objects(on_delete=self._ds_deleted)
        informers = self.informers
        informers.nodes.add_handler(on_add=self._all_changed, on_update=self._node_updated, on_delete=self._all_changed)
        informers.controllerrevisions.add_handler(
            on_add=self._owned_changed,
            on_update=lambda old, new: self._owned_changed(new),
            on_delete=self._owned_changed,
        )

    @property
    def objects(self) -> Informer:
        return self.informers.daemonsets

    # -- events ---------------------------------------------------------------------------------------------
    def _ds_deleted(self, ds: Object) -> None:
        self.expectations.forget(key_of(ds))

    def _all_changed(self, _: Object) -> None:
        for key in self.all_keys():
            self.queue.add(key)

    def _node_updated(self, old: Object, new: Object) -> None:
        if _node_inputs(old) != _node_inputs(new):
            self._all_changed(new)

    def _owned_changed(self, obj: Object) -> None:
        owner = controller_key(obj, "DaemonSet")
        if owner is not None:
            self.queue.add(owner)

    # -- reconcile ------------------------------------------------------------------------------------------
    async def reconcile(self, key: Key) -> float | None:
        ds = self.find(key)
        if ds is None:
            self.expectations.forget(key)
            return None
        if is_deleting(ds):
            return None
        namespace = key[0]
        satisfied = self.expectations.satisfied(key)  # before the pods are read, as the ReplicaSet controller
        owned = await self.claim(ds, kinds.PODS, self.informers.pods)
        current, old = await sync_history(self.client, self.informers.controllerrevisions, ds, kinds.DAEMON_SETS)
        pod_hash = revisions.hash_of(current) or name_of(current)
        nodes = self.informers.nodes.items()
        by_node = daemon_rollout.by_node(owned)
        now = self.clock()
        if satisfied:
            plan = daemon_rollout.manage(ds, nodes, by_node, pod_hash, now)
            if daemon_rollout.strategy_type(ds) == "RollingUpdate":
                step = daemon_rollout.rolling_update(ds, nodes, by_node, pod_hash, now)
                plan.create_on.extend(n for n in step.create_on if n not in plan.create_on)
                for pod in step.delete:
                    plan.add_delete(pod)
            await self.delete_pods(key, ds, plan.delete)
            await self._create(key, ds, plan.create_on, pod_hash)
        live = {labels_of(p).get(revisions.HASH_LABEL, "") for p in owned} - {""}
        for revision in revisions.to_prune(ds, old, live):
            with contextlib.suppress(KubeNotFoundError):
                await self.client.delete(kinds.CONTROLLER_REVISIONS, name_of(revision), namespace)
        return await self._sync_status(ds, nodes, by_node, pod_hash, now)

    async def _create(self, key: Key, ds: Object, nodes: list[str], pod_hash: str) -> None:
        if not nodes:
            return
        nodes = nodes[: self.settings.burst_replicas]
        self.expectations.expect_creations(key, len(nodes))
        results = await asyncio.gather(
            *(self.client.create(kinds.PODS, daemon_rollout.new_pod(ds, n, pod_hash), key[0]) for n in nodes),
            return_exceptions=True,
        )
        failure: BaseException | None = None
        for result in results:
            if isinstance(result, dict):
                self.recorder.record(ds, "Normal", "SuccessfulCreate", f"Created pod: {name_of(result)}", "Create")
            else:
                self.expectations.creation_observed(key)
                failure = failure or result
        if failure is not None:
            if not isinstance(failure, KubeClientError):
                raise failure
            raise SyncError("FailedCreate", f"Error creating: {failure}") from failure

    async def _sync_status(
        self, ds: Object, nodes: list[Object], by_node: dict[str, list[Object]], pod_hash: str, now: float
    ) -> float | None:
        status = daemon_rollout.daemon_status(ds, nodes, by_node, pod_hash, now)
        current = ds.get("status") or {}
        if any(current.get(k, 0) != v for k, v in status.items()):
            namespace, name = key_of(ds)
            await self.client.patch_status(kinds.DAEMON_SETS, name, {"status": status}, namespace)
        min_ready = daemon_rollout.min_ready_seconds(ds)
        waits = [
            podstate.unavailable_for(p, min_ready, now) for pods in by_node.values() for p in pods if not is_deleting(p)
        ]
        pending = [w for w in waits if w]
        return min(pending) + 0.05 if pending else None
