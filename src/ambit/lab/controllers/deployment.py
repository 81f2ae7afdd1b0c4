"""The Deployment controller: one ReplicaSet per pod template, scaled by the strategy of :mod:`rollout`.

A reconcile, for one Deployment (nothing while it is being deleted: the API server's garbage collector removes
its ReplicaSets, and theirs their pods):

1. Claims ReplicaSets in its namespace (adopt matching orphans, release those that stopped matching).
2. Unless ``spec.paused``: runs one step of its strategy (creating the new ReplicaSet when the template has none
   yet, with a controller reference to the Deployment), deletes old empty ReplicaSets beyond
   ``revisionHistoryLimit``, and keeps the ``deployment.kubernetes.io/revision`` annotations current (the new
   ReplicaSet's revision is one more than any old one's; the Deployment carries its new ReplicaSet's).
3. Writes status (replicas, updatedReplicas, readyReplicas, availableReplicas, unavailableReplicas,
   observedGeneration and the ``Available`` and ``Progressing`` conditions) when it changed. The figures are
   summed from the ReplicaSets' status, which the ReplicaSet controller keeps; each ReplicaSet change queues its
   Deployment again, and so drives the next rollout step.
"""

from __future__ import annotations

import logging
from typing import Any

from ambit.k8s import Informer, KubeAlreadyExistsError, kinds
from ambit.lab.controllers import pods as podstate
from ambit.lab.controllers import rollout
from ambit.lab.controllers.controller import Controller
from ambit.lab.controllers.ownership import (
    Object,
    controller_key,
    controller_ref,
    is_controlled_by,
    is_deleting,
    key_of,
    name_of,
    uid_of,
)
from ambit.lab.controllers.reconcile import SyncError
from ambit.lab.controllers.workqueue import Key

log = logging.getLogger("ambit.lab.controllers.deployment")


class DeploymentController(Controller):
    name = "deployment-controller"

    def setup(self) -> None:
        self.watch_objects()
        self.informers.replicasets.add_handler(
            on_add=self._rs_changed, on_update=self._rs_updated, on_delete=self._rs_changed
        )
        self.informers.pods.add_handler(on_delete=self._pod_deleted)

    @property
    def objects(self) -> Informer:
        return self.informers.deployments

    # -- events ---------------------------------------------------------------------------------------------
    def _rs_changed(self, rs: Object) -> None:
        owner = controller_key(rs, "Deployment")
        if owner is not None:
            self.queue.add(owner)
        elif controller_ref(rs) is None:
            self.enqueue_selecting(rs)

    def _rs_updated(self, old: Object, new: Object) -> None:
        old_owner = controller_key(old, "Deployment")
        if old_owner is not None and old_owner != controller_key(new, "Deployment"):
            self.queue.add(old_owner)
        self._rs_changed(new)

    def _pod_deleted(self, pod: Object) -> None:
        """A Recreate rollout waits for the old pods to be gone."""
        rs_key = controller_key(pod, "ReplicaSet")
        rs = self.informers.replicasets.find(rs_key[1], rs_key[0]) if rs_key else None
        owner = controller_key(rs, "Deployment") if rs is not None else None
        if owner is not None:
            self.queue.add(owner)

    # -- reconcile ------------------------------------------------------------------------------------------
    async def reconcile(self, key: Key) -> float | None:
        d = self.find(key)
        if d is None or is_deleting(d):
            return None
        namespace = key[0]
        owned = await self.claim(d, kinds.REPLICA_SETS, self.informers.replicasets)
        new, old = rollout.split(d, owned)
        created: Object | None = None
        if not (d.get("spec") or {}).get("paused"):
            if rollout.strategy_type(d) == "Recreate":
                new, created = await self._recreate(d, new, old)
            else:
                if new is None:
                    new = created = await self._create(d, old, rollout.new_replicas(d, 0, old))
                for step in rollout.rolling_step(d, new, old):
                    await self._scale(d, step.replica_set, step.replicas)
            for rs in rollout.cleanup(d, old):
                await self.client.delete(kinds.REPLICA_SETS, name_of(rs), namespace)
            if new is not None:
                await self._sync_revision(d, new, old)
        await self._sync_status(d, new, old, created)
        return None

    async def _recreate(self, d: Object, new: Object | None, old: list[Object]) -> tuple[Object | None, Object | None]:
        for rs in old:
            if rollout.replicas_of(rs):
                await self._scale(d, rs, 0)
        if self._old_pods_running(old):
            return new, None
        desired = rollout.replicas_of(d)
        if new is None:
            created = await self._create(d, old, desired)
            return created, created
        if rollout.replicas_of(new) != desired:
            await self._scale(d, new, desired)
        return new, None

    def _old_pods_running(self, old: list[Object]) -> bool:
        if any(rollout.status_count(rs, "replicas") for rs in old):
            return True
        uids = {uid_of(rs) for rs in old}
        namespace = key_of(old[0])[0] if old else ""
        for pod in self.informers.pods.items():
            ref = controller_ref(pod)
            if ref and ref.get("uid") in uids and key_of(pod)[0] == namespace and not podstate.is_terminal(pod):
                return True
        return False

    async def _create(self, d: Object, old: list[Object], replicas: int) -> Object:
        namespace = key_of(d)[0]
        collisions = (d.get("status") or {}).get("collisionCount")
        collisions = collisions if isinstance(collisions, int) else 0
        pod_hash = rollout.current_hash(d)
        revision = max((rollout.revision_of(rs) for rs in old), default=0) + 1
        body = rollout.new_replica_set(d, pod_hash, revision, replicas)
        try:
            created = await self.client.create(kinds.REPLICA_SETS, body, namespace)
        except KubeAlreadyExistsError:
            existing = await self.client.get(kinds.REPLICA_SETS, body["metadata"]["name"], namespace)
            if is_controlled_by(existing, d) and rollout.is_new(existing, d):
                return existing  # we made it; the cache has not shown it yet
            patch = {"status": {"collisionCount": collisions + 1}}
            await self.client.patch_status(kinds.DEPLOYMENTS, name_of(d), patch, namespace)
            raise SyncError(
                "FailedCreate",
                f"replica set {name_of(existing)} exists with another template; collisionCount now {collisions + 1}",
            ) from None
        if replicas:
            note = f"Scaled up replica set {name_of(created)} from 0 to {replicas}"
            self.recorder.record(d, "Normal", "ScalingReplicaSet", note, "Scale")
        return created

    async def _scale(self, d: Object, rs: Object, replicas: int) -> None:
        before = rollout.replicas_of(rs)
        meta = rs.get("metadata") or {}
        patch = {"metadata": {"resourceVersion": meta.get("resourceVersion")}, "spec": {"replicas": replicas}}
        await self.client.patch(kinds.REPLICA_SETS, name_of(rs), patch, key_of(rs)[0])
        way = "up" if replicas > before else "down"
        note = f"Scaled {way} replica set {name_of(rs)} from {before} to {replicas}"
        self.recorder.record(d, "Normal", "ScalingReplicaSet", note, "Scale")

    async def _sync_revision(self, d: Object, new: Object, old: list[Object]) -> None:
        namespace = key_of(d)[0]
        revision = rollout.revision_of(new)
        newest_old = max((rollout.revision_of(rs) for rs in old), default=0)
        if revision <= newest_old:  # a rollback to an old template: it becomes the latest revision
            revision = newest_old + 1
            patch = {"metadata": {"annotations": {rollout.REVISION: str(revision)}}}
            await self.client.patch(kinds.REPLICA_SETS, name_of(new), patch, namespace)
        if rollout.revision_of(d) != revision:
            patch = {"metadata": {"annotations": {rollout.REVISION: str(revision)}}}
            await self.client.patch(kinds.DEPLOYMENTS, name_of(d), patch, namespace)

    async def _sync_status(self, d: Object, new: Object | None, old: list[Object], created: Object | None) -> None:
        status = deployment_status(d, new, old, created is not None, self.clock())
        current = d.get("status") or {}
        if any(current.get(k) != v for k, v in status.items()):
            await self.client.patch_status(kinds.DEPLOYMENTS, name_of(d), {"status": status}, key_of(d)[0])


def deployment_status(d: Object, new: Object | None, old: list[Object], created: bool, now: float) -> dict[str, Any]:
    """The Deployment's status figures and conditions (times of unchanged conditions are kept)."""
    every = [*old, new] if new is not None else old
    desired = rollout.replicas_of(d)
    replicas = sum(rollout.status_count(rs, "replicas") for rs in every)
    updated = rollout.status_count(new, "replicas") if new is not None else 0
    available = sum(rollout.status_count(rs, "availableReplicas") for rs in every)
    generation = (d.get("metadata") or {}).get("generation", 0)
    _, max_unavailable = rollout.surge_and_unavailable(d)
    current = (d.get("status") or {}).get("conditions") or []
    if available >= desired - max_unavailable:
        available_cond = ("True", "MinimumReplicasAvailable", "Deployment has minimum availability.")
    else:
        available_cond = ("False", "MinimumReplicasUnavailable", "Deployment does not have minimum availability.")
    new_name = name_of(new) if new is not None else ""
    if (d.get("spec") or {}).get("paused"):
        progressing = ("Unknown", "DeploymentPaused", "Deployment is paused")
    elif created:
        progressing = ("True", "NewReplicaSetCreated", f'Created new replica set "{new_name}"')
    elif new is not None and updated == replicas == available == desired:
        progressing = ("True", "NewReplicaSetAvailable", f'ReplicaSet "{new_name}" has successfully progressed.')
    else:
        progressing = ("True", "ReplicaSetUpdated", f'ReplicaSet "{new_name}" is progressing.')
    return {
        "observedGeneration": generation,
        "replicas": replicas,
        "updatedReplicas": updated,
        "readyReplicas": sum(rollout.status_count(rs, "readyReplicas") for rs in every),
        "availableReplicas": available,
        "unavailableReplicas": max(desired - available, 0),
        "conditions": [
            _condition(current, "Available", *available_cond, now),
            _condition(current, "Progressing", *progressing, now),
        ],
    }


def _condition(current: list[Any], kind: str, status: str, reason: str, message: str, now: float) -> dict[str, Any]:
    before: dict[str, Any] = next((c for c in current if isinstance(c, dict) and c.get("type") == kind), {})
    if (before.get("status"), before.get("reason"), before.get("message")) == (status, reason, message):
        return dict(before)
    stamp = podstate.rfc3339(now)
    moved = before.get("status") != status
    return {
        "type": kind,
        "status": status,
        "lastUpdateTime": stamp,
        "lastTransitionTime": stamp if moved else before.get("lastTransitionTime", stamp),
        "reason": reason,
        "message": message,
    }
