"""The Job controller: pods run to completion, counted once each, retried with back-off until the Job succeeds or
fails. Decisions are :mod:`job_progress`'s (its docstring has the rules); this is the I/O.

A reconcile, for one Job:

1. A Job that is gone or being deleted makes nothing; the tracking finalizer comes off each of its pods (found by
   their controller reference), so the garbage collector's deletion of them completes; so it does off the pods of
   an earlier Job of the same name (another uid), and off pods a deletion with ``propagationPolicy: Orphan`` left
   without a controller (found by their ``batch.kubernetes.io/job-name`` label). The API server's
   collector deletes a deleted Job's pods (they name it as controller, with ``blockOwnerDeletion``), as it does a
   ReplicaSet's.
2. Claims pods in its namespace that its selector selects (:meth:`Controller.claim`).
3. Plans (:func:`job_progress.plan`); a plan that makes or deletes pods is made again on the Job read afresh from
   the API server (the cache may be behind this controller's last status write, and a pod counted since would
   look uncounted). Then it carries the plan out in its order: the status, through the status subresource (a
   PUT of the whole status) and conditional on the resourceVersion it was planned from (a stale cache gets a 409
   and a retry, never a double count); then the finalizers off counted pods; then deletes (``SuccessfulDelete``) and
   creates (``SuccessfulCreate``, ``FailedCreate``), with expectations (:mod:`expectations`) so that a cache
   behind the writes does not make pods twice; then the Job's Events (``Completed``, ``BackoffLimitExceeded``,
   ``DeadlineExceeded``, ``Suspended``, ``Resumed``).
4. Looks again when the plan says (a back-off or a deadline running out).

Finalizer removal is a JSON patch that tests the finalizer list it replaces, so a concurrent change to the list
(another finalizer added) makes it fail instead of being lost.
"""

from __future__ import annotations

import asyncio
import logging

from ambit.k8s import Informer, KubeClientError, KubeNotFoundError, kinds
from ambit.lab.controllers import job_progress
from ambit.lab.controllers.controller import PodOwner
from ambit.lab.controllers.ownership import Object, controller_key, is_controlled_by, is_deleting, key_of, name_of
from ambit.lab.controllers.reconcile import SyncError
from ambit.lab.controllers.workqueue import Key

log = logging.getLogger("ambit.lab.controllers.job")

JOB_NAME = "batch.kubernetes.io/job-name"


class JobController(PodOwner):
    name = "job-controller"
    owner_kind = "Job"

    def setup(self) -> None:
        super().setup()
        self.backoff = job_progress.Backoff(self.settings.job_backoff_base, self.settings.job_backoff_max)
        self.watch_objects(on_delete=self._job_deleted)
        self.informers.pods.add_handler(on_add=self._maybe_orphan, on_update=lambda old, new: self._maybe_orphan(new))

    @property
    def objects(self) -> Informer:
        return self.informers.jobs

    def _job_deleted(self, job: Object) -> None:
        self.expectations.forget(key_of(job))
        self.queue.add(key_of(job))

    def _maybe_orphan(self, pod: Object) -> None:
        """A pod with the tracking finalizer and no Job controlling it (orphaned by its Job's deletion) queues the
        key its ``job-name`` label names, whose reconcile takes the finalizer off."""
        if job_progress.has_finalizer(pod) and controller_key(pod, self.owner_kind) is None:
            name = ((pod.get("metadata") or {}).get("labels") or {}).get(JOB_NAME)
            if isinstance(name, str) and name:
                self.queue.add((key_of(pod)[0], name))

    # -- reconcile ------------------------------------------------------------------------------------------
    async def reconcile(self, key: Key) -> float | None:
        job = self.find(key)
        if job is None or is_deleting(job):
            if job is None:
                self.expectations.forget(key)
            await self._release(key, self._orphans(key))
            return None
        # Judged before the pods are read: a creation observed after that read must not make the read look whole.
        satisfied = self.expectations.satisfied(key)
        owned = await self.claim(job, kinds.PODS, self.informers.pods)
        # Pods of an earlier Job of this name (deleted, then made again) are nobody's to count.
        await self._release(key, [p for p in self._orphans(key) if not is_controlled_by(p, job)])
        plan = job_progress.plan(job, owned, self.clock(), self.backoff, burst=self.settings.burst_replicas)
        if plan.create or plan.delete:
            # Pods are made and deleted on the counts as the server holds them: the cache may be behind this
            # controller's own status write, and a pod counted since would look uncounted (rule 3).
            job = await self.client.get(kinds.JOBS, key[1], key[0])
            plan = job_progress.plan(job, owned, self.clock(), self.backoff, burst=self.settings.burst_replicas)
        if plan.status is not None:
            # A PUT of the whole status: a merge patch could not empty uncountedTerminatedPods' lists.
            await self.client.replace(kinds.JOBS, {**job, "status": plan.status}, key[0], subresource="status")
        await self._release(key, plan.release)
        if satisfied:
            await self.delete_pods(key, job, plan.delete)
            await self._create(key, job, plan.create)
        for kind, reason, note in plan.events:
            self.recorder.record(job, kind, reason, note, "Sync")
        return None if plan.wait is None else plan.wait + 0.05

    def _orphans(self, key: Key) -> list[Object]:
        """The pods with the tracking finalizer that name the Job ``key`` as controller, or that no Job controls
        and whose ``job-name`` label names it (rule 1)."""
        found = []
        for pod in self.informers.pods.items():
            if not job_progress.has_finalizer(pod) or key_of(pod)[0] != key[0]:
                continue
            owner = controller_key(pod, self.owner_kind)
            labels = (pod.get("metadata") or {}).get("labels") or {}
            if owner == key or (owner is None and labels.get(JOB_NAME) == key[1]):
                found.append(pod)
        return found

    async def _release(self, key: Key, pods: list[Object]) -> None:
        for pod in pods:
            finalizers = list((pod.get("metadata") or {}).get("finalizers") or ())
            if job_progress.TRACKING_FINALIZER not in finalizers:
                continue
            kept = [f for f in finalizers if f != job_progress.TRACKING_FINALIZER]
            patch = [
                {"op": "test", "path": "/metadata/finalizers", "value": finalizers},
                {"op": "replace", "path": "/metadata/finalizers", "value": kept},
            ]
            try:
                await self.client.patch(kinds.PODS, name_of(pod), patch, key[0], patch_type="json")
            except KubeNotFoundError:
                continue

    async def _create(self, key: Key, job: Object, pods: list[Object]) -> None:
        if not pods:
            return
        self.expectations.expect_creations(key, len(pods))
        results = await asyncio.gather(
            *(self.client.create(kinds.PODS, pod, key[0]) for pod in pods), return_exceptions=True
        )
        failure: BaseException | None = None
        for result in results:
            if isinstance(result, dict):
                self.recorder.record(job, "Normal", "SuccessfulCreate", f"Created pod: {name_of(result)}", "Create")
                continue
            self.expectations.creation_observed(key)
            if isinstance(result, KubeClientError):
                failure = failure or SyncError("FailedCreate", f"Error creating: {result}")
            else:
                failure = failure or result
        if failure is not None:
            raise failure
