"""The ReplicaSet controller: keep ``spec.replicas`` active pods from the template, and report them in status.

Every ReplicaSet is reconciled, owned by a Deployment or standalone. A reconcile, for one ReplicaSet:

1. Claims pods in its namespace (:mod:`ownership`): adopts matching orphans, releases owned pods that stopped
   matching. Its pods are those it controls.
2. Counts *active* pods (not terminal, not terminating). A deleted pod (terminating or gone) and a Failed pod
   are not active, so they are replaced. Failed pods are left in place, as Kubernetes leaves them to its pod
   garbage collector (Ambit has none: delete them by hand).
3. If its expectations (:mod:`expectations`) are satisfied, creates the missing pods (``<rs>-<5 random>`` by
   ``generateName``, labels and spec from the template, a controller reference to the ReplicaSet) in batches of
   1, 2, 4... stopping at the first failure (kube's slow start), or deletes the surplus, worst first
   (:func:`pods.deletion_rank`: unbound, pending, not ready, newest).
4. Writes ``status`` (replicas, fullyLabeledReplicas, readyReplicas, availableReplicas, observedGeneration)
   through the status subresource when it changed. Pods ready but not yet for ``minReadySeconds`` make the
   reconcile ask to run again when they become available.
"""

from __future__ import annotations

import asyncio
import copy
import logging
from typing import Any

from ambit.k8s import Informer, KubeClientError, kinds
from ambit.lab.controllers import pods as podstate
from ambit.lab.controllers.controller import PodOwner
from ambit.lab.controllers.ownership import Object, is_deleting, key_of, name_of, owner_reference
from ambit.lab.controllers.reconcile import SyncError
from ambit.lab.controllers.selectors import labels_of
from ambit.lab.controllers.workqueue import Key
from ambit.model.labels import map_matches

log = logging.getLogger("ambit.lab.controllers.replicaset")


class ReplicaSetController(PodOwner):
    name = "replicaset-controller"
    owner_kind = "ReplicaSet"

    def setup(self) -> None:
        super().setup()
        self.watch_objects(on_delete=self._rs_deleted)

    @property
    def objects(self) -> Informer:
        return self.informers.replicasets

    # -- events ---------------------------------------------------------------------------------------------
    def _rs_deleted(self, rs: Object) -> None:
        self.expectations.forget(key_of(rs))
        self.queue.add(key_of(rs))

    # -- reconcile ------------------------------------------------------------------------------------------
    async def reconcile(self, key: Key) -> float | None:
        rs = self.find(key)
        if rs is None:
            self.expectations.forget(key)
            return None
        # Expectations are read before the pods (kube's order): a creation observed while the claim awaits would
        # satisfy them after a cache read that missed its pod, and the pod would be made twice.
        satisfied = self.expectations.satisfied(key)
        owned = await self.claim(rs, kinds.PODS, self.informers.pods)
        active = [p for p in owned if podstate.is_active(p)]
        if satisfied and not is_deleting(rs):
            await self._manage(key, rs, active)
        return await self._update_status(rs, active)

    async def _manage(self, key: Key, rs: Object, active: list[Object]) -> None:
        replicas = _replicas(rs)
        diff = len(active) - replicas
        if diff < 0:
            await self._create(key, rs, min(-diff, self.settings.burst_replicas))
        elif diff > 0:
            victims = sorted(active, key=podstate.deletion_rank)[: min(diff, self.settings.burst_replicas)]
            await self.delete_pods(key, rs, victims)

    async def _create(self, key: Key, rs: Object, count: int) -> None:
        self.expectations.expect_creations(key, count)
        body = pod_from_template(rs)
        batch, left = 1, count
        while left > 0:
            size = min(batch, left)
            results = await asyncio.gather(
                *(self.client.create(kinds.PODS, copy.deepcopy(body), key[0]) for _ in range(size)),
                return_exceptions=True,
            )
            left -= size
            errors = [r for r in results if isinstance(r, BaseException)]
            for result in results:
                if isinstance(result, dict):
                    self.recorder.record(rs, "Normal", "SuccessfulCreate", f"Created pod: {name_of(result)}", "Create")
            if errors:
                for _ in range(len(errors) + left):  # these will never show up in the informer
                    self.expectations.creation_observed(key)
                first = errors[0]
                if not isinstance(first, KubeClientError):
                    raise first
                raise SyncError("FailedCreate", f"Error creating: {first}") from first
            batch *= 2

    async def _update_status(self, rs: Object, active: list[Object]) -> float | None:
        spec = rs.get("spec") or {}
        min_ready = int(spec.get("minReadySeconds") or 0)
        template_labels = ((spec.get("template") or {}).get("metadata") or {}).get("labels") or {}
        now = self.clock()
        waits = [podstate.unavailable_for(p, min_ready, now) for p in active]
        status = {
            "replicas": len(active),
            "fullyLabeledReplicas": sum(1 for p in active if map_matches(template_labels, labels_of(p))),
            "readyReplicas": sum(1 for p in active if podstate.is_ready(p)),
            "availableReplicas": sum(1 for w in waits if w == 0.0),
            "observedGeneration": (rs.get("metadata") or {}).get("generation", 0),
        }
        current = rs.get("status") or {}
        if any(current.get(k, 0) != v for k, v in status.items()):
            namespace, name = key_of(rs)
            await self.client.patch_status(kinds.REPLICA_SETS, name, {"status": status}, namespace)
        pending = [w for w in waits if w]
        return min(pending) + 0.05 if pending else None


def _replicas(obj: Object) -> int:
    value = (obj.get("spec") or {}).get("replicas", 1)
    return value if isinstance(value, int) and value >= 0 else 1


def pod_from_template(rs: Object) -> dict[str, Any]:
    """A new pod of ``rs`` (the server picks the name's random suffix)."""
    template = (rs.get("spec") or {}).get("template") or {}
    meta = template.get("metadata") or {}
    pod_meta: dict[str, Any] = {
        "generateName": f"{name_of(rs)}-",
        "namespace": key_of(rs)[0],
        "ownerReferences": [owner_reference(rs)],
    }
    for field in ("labels", "annotations"):
        if meta.get(field):
            pod_meta[field] = copy.deepcopy(meta[field])
    return {"apiVersion": "v1", "kind": "Pod", "metadata": pod_meta, "spec": copy.deepcopy(template.get("spec") or {})}
