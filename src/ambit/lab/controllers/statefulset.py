"""The StatefulSet controller: pods with stable names (``<set>-<ordinal>``) and hostnames, made and replaced in
order, rolled over by the update strategy, with a ControllerRevision history. Decisions are
:mod:`stateful_rollout`'s and :mod:`revisions`'; this is the I/O.

A reconcile, for one StatefulSet (nothing while it is being deleted: the API server's garbage collector removes
its pods and revisions through their owner references):

1. Claims pods in its namespace that its selector selects *and* that are named as its members (kube's claim
   filter); a pod it owns that stops being either is released.
2. Sorts out its revisions (:mod:`revision_history`): the update revision is the one holding the template now;
   the current revision is the one ``status.currentRevision`` names (the update revision when none does).
3. If its expectations (:mod:`expectations`) are satisfied: plans (:func:`stateful_rollout.plan`), then adds
   missing identity labels, deletes, and creates, each pod by its own name. Events as kube words them:
   ``SuccessfulCreate``/``SuccessfulDelete`` ("create Pod web-0 in StatefulSet web successful"),
   ``FailedCreate`` on failure. A create that finds the name taken (the old pod still there) waits for the next
   reconcile, which the pod's deletion queues.
4. Deletes old revisions beyond ``revisionHistoryLimit`` that neither a live pod nor the status uses.
5. Writes status (through the status subresource) when it changed; pods ready but not yet for
   ``minReadySeconds`` make it look again when they become available.

Volume claims (:mod:`stateful_claims`): before a member's pod is created, each of its claims
``<template>-<set>-<ordinal>`` that does not exist is made from its template; a claim that exists is reused, so a
recreated pod finds its data (and, through its volume's node affinity, its node). Each reconcile sets the claims'
owner references as ``persistentVolumeClaimRetentionPolicy`` says, before condemned pods are deleted, so that a
claim to be deleted with its scaled-away pod is owned by that pod when the pod goes.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
from typing import Any

from ambit.k8s import Informer, KubeAlreadyExistsError, KubeClientError, KubeNotFoundError, kinds
from ambit.lab.controllers import revisions, stateful_claims, stateful_rollout
from ambit.lab.controllers.controller import PodOwner
from ambit.lab.controllers.ownership import Object, controller_key, is_deleting, key_of, name_of
from ambit.lab.controllers.reconcile import SyncError
from ambit.lab.controllers.revision_history import sync_history
from ambit.lab.controllers.workqueue import Key

log = logging.getLogger("ambit.lab.controllers.statefulset")


def template_of(revision: Object) -> dict[str, Any]:
    """The pod template a revision holds (its ``$patch`` directive left out)."""
    template = dict(((revision.get("data") or {}).get("spec") or {}).get("template") or {})
    template.pop("$patch", None)
    return template


class StatefulSetController(PodOwner):
    name = "statefulset-controller"
    owner_kind = "StatefulSet"

    def setup(self) -> None:
        super().setup()
        self.watch_objects(on_delete=self._sts_deleted)
        self.informers.controllerrevisions.add_handler(
            on_add=self._owned_changed,
            on_update=lambda old, new: self._owned_changed(new),
            on_delete=self._owned_changed,
        )

    @property
    def objects(self) -> Informer:
        return self.informers.statefulsets

    def deleted_note(self, owner: Object, pod: Object) -> str:
        return f"delete Pod {name_of(pod)} in StatefulSet {name_of(owner)} successful"

    # -- events ---------------------------------------------------------------------------------------------
    def _sts_deleted(self, sts: Object) -> None:
        self.expectations.forget(key_of(sts))

    def _owned_changed(self, obj: Object) -> None:
        owner = controller_key(obj, self.owner_kind)
        if owner is not None:
            self.queue.add(owner)

    # -- reconcile ------------------------------------------------------------------------------------------
    async def reconcile(self, key: Key) -> float | None:
        sts = self.find(key)
        if sts is None:
            self.expectations.forget(key)
            return None
        if is_deleting(sts):
            return None
        set_name = key[1]
        satisfied = self.expectations.satisfied(key)  # before the pods are read, as the ReplicaSet controller
        owned = await self.claim(
            sts,
            kinds.PODS,
            self.informers.pods,
            lambda pod: stateful_rollout.ordinal_of(set_name, pod) is not None,
        )
        update, old = await sync_history(self.client, self.informers.controllerrevisions, sts, kinds.STATEFUL_SETS)
        wanted_current = str((sts.get("status") or {}).get("currentRevision") or "")
        current = next((r for r in [*old, update] if name_of(r) == wanted_current), update)
        revs = stateful_rollout.Revisions(
            current=name_of(current),
            update=name_of(update),
            current_template=template_of(current),
            update_template=template_of(update),
        )
        now = self.clock()
        if satisfied:
            plan = stateful_rollout.plan(sts, owned, revs, now)
            for pod, labels in plan.relabel:
                patch = {"metadata": {"labels": labels, "resourceVersion": pod["metadata"].get("resourceVersion")}}
                await self.client.patch(kinds.PODS, name_of(pod), patch, key[0])
            await self._sync_claim_owners(sts, owned)
            await self.delete_pods(key, sts, plan.delete)
            await self._create_claims(sts, plan.create)
            await self._create(key, sts, plan.create)
        in_use = {stateful_rollout.revision_of(p) for p in owned} | {revs.current, revs.update}
        live = {revisions.hash_of(r) for r in old if name_of(r) in in_use}
        for revision in revisions.to_prune(sts, old, live):
            with contextlib.suppress(KubeNotFoundError):
                await self.client.delete(kinds.CONTROLLER_REVISIONS, name_of(revision), key[0])
        await self._sync_status(sts, owned, revs, now)
        wait = stateful_rollout.next_check(sts, owned, now)
        return None if wait is None else wait + 0.05

    async def _create(self, key: Key, sts: Object, pods: list[Object]) -> None:
        if not pods:
            return
        self.expectations.expect_creations(key, len(pods))
        results = await asyncio.gather(
            *(self.client.create(kinds.PODS, pod, key[0]) for pod in pods), return_exceptions=True
        )
        failure: BaseException | None = None
        for pod, result in zip(pods, results, strict=True):
            name = name_of(pod)
            if isinstance(result, dict):
                note = f"create Pod {name} in StatefulSet {name_of(sts)} successful"
                self.recorder.record(sts, "Normal", "SuccessfulCreate", note, "Create")
                continue
            self.expectations.creation_observed(key)
            if isinstance(result, KubeAlreadyExistsError):
                log.debug("statefulset %s/%s: pod %s still exists; waiting for it to go", *key, name)
            elif isinstance(result, KubeClientError):
                note = f"create Pod {name} in StatefulSet {name_of(sts)} failed error: {result}"
                failure = failure or SyncError("FailedCreate", note)
            else:
                failure = failure or result
        if failure is not None:
            raise failure

    async def _sync_status(
        self, sts: Object, owned: list[Object], revs: stateful_rollout.Revisions, now: float
    ) -> None:
        status = stateful_rollout.status(sts, owned, revs, now)
        status["collisionCount"] = revisions.collision_count(sts)
        before = sts.get("status") or {}
        if any(before.get(k) != v for k, v in status.items()):
            namespace, name = key_of(sts)
            await self.client.patch_status(kinds.STATEFUL_SETS, name, {"status": status}, namespace)

    # -- claims ---------------------------------------------------------------------------------------------
    async def _create_claims(self, sts: Object, pods: list[Object]) -> None:
        """Rule 2 of :mod:`stateful_claims`: the missing claims of the members about to be made."""
        namespace = key_of(sts)[0]
        for pod in pods:
            ordinal = stateful_rollout.ordinal_of(name_of(sts), pod)
            if ordinal is None:
                continue
            for claim in stateful_claims.claims_for(sts, ordinal, None):
                if self.informers.persistentvolumeclaims.find(name_of(claim), namespace) is not None:
                    continue
                try:
                    await self.client.create(kinds.PERSISTENT_VOLUME_CLAIMS, claim, namespace)
                except KubeAlreadyExistsError:
                    continue
                except KubeClientError as exc:
                    note = (
                        f"create Claim {name_of(claim)} for Pod {name_of(pod)} in StatefulSet {name_of(sts)} "
                        f"failed error: {exc}"
                    )
                    raise SyncError("FailedCreate", note) from exc
                note = f"create Claim {name_of(claim)} Pod {name_of(pod)} in StatefulSet {name_of(sts)} success"
                self.recorder.record(sts, "Normal", "SuccessfulCreate", note, "Create")

    async def _sync_claim_owners(self, sts: Object, owned: list[Object]) -> None:
        """Rule 3 of :mod:`stateful_claims` for the claims of the set's members."""
        if not stateful_rollout.claim_names(sts):
            return
        namespace, set_name = key_of(sts)
        start = stateful_rollout.start_ordinal(sts)
        wanted = range(start, start + stateful_rollout.replicas(sts))
        for pod in owned:
            ordinal = stateful_rollout.ordinal_of(set_name, pod)
            if ordinal is None:
                continue
            for template in stateful_rollout.claim_names(sts):
                claim = self.informers.persistentvolumeclaims.find(
                    stateful_claims.claim_name(template, set_name, ordinal), namespace
                )
                if claim is None:
                    continue
                refs = stateful_claims.refs_update(claim, sts, pod, ordinal not in wanted)
                if refs is None:
                    continue
                rv = (claim.get("metadata") or {}).get("resourceVersion")
                body = {"metadata": {"ownerReferences": refs or None, "resourceVersion": rv}}
                with contextlib.suppress(KubeNotFoundError):
                    await self.client.patch(kinds.PERSISTENT_VOLUME_CLAIMS, name_of(claim), body, namespace)
