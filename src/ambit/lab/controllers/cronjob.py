"""The CronJob controller: Jobs made on a cron schedule. Decisions are :mod:`cron_runs`' (its docstring has the
rules); this is the I/O.

A reconcile, for one CronJob:

1. Its Jobs are those in its namespace whose controller reference names it (by uid); a CronJob adopts nothing.
2. Plans (:func:`cron_runs.plan`) with the time from its clock (injected: tests fire schedules without waiting),
   then deletes the Jobs the plan names (``propagation: Background``, so their pods go too; Event
   ``SuccessfulDelete``), creates the Job (a 409 AlreadyExists is that run made before: not an error), writes
   the status through the status subresource (a PUT conditional on the resourceVersion it was planned from) and
   records the plan's Events.
3. Looks again at the next firing; a Job's change (it finishing) queues its CronJob at once.
"""

from __future__ import annotations

import contextlib
import logging

from ambit.k8s import Informer, KubeAlreadyExistsError, KubeNotFoundError, kinds
from ambit.lab.controllers import cron_runs
from ambit.lab.controllers.controller import Controller
from ambit.lab.controllers.ownership import Object, controller_key, is_controlled_by, key_of, name_of
from ambit.lab.controllers.workqueue import Key

log = logging.getLogger("ambit.lab.controllers.cronjob")


class CronJobController(Controller):
    name = "cronjob-controller"

    def setup(self) -> None:
        self.watch_objects(on_delete=lambda cron: None)
        self.informers.jobs.add_handler(
            on_add=self._job_changed,
            on_update=lambda old, new: self._job_changed(new),
            on_delete=self._job_changed,
        )

    @property
    def objects(self) -> Informer:
        return self.informers.cronjobs

    def _job_changed(self, job: Object) -> None:
        owner = controller_key(job, "CronJob")
        if owner is not None:
            self.queue.add(owner)

    async def reconcile(self, key: Key) -> float | None:
        cron = self.find(key)
        if cron is None:
            return None
        jobs = [j for j in self.informers.jobs.items() if key_of(j)[0] == key[0] and is_controlled_by(j, cron)]
        plan = cron_runs.plan(cron, jobs, self.clock())
        for job in plan.delete:
            with contextlib.suppress(KubeNotFoundError):
                await self.client.delete(kinds.JOBS, name_of(job), key[0], propagation_policy="Background")
                self.recorder.record(cron, "Normal", "SuccessfulDelete", f"Deleted job {name_of(job)}", "Delete")
        if plan.create is not None:
            try:
                await self.client.create(kinds.JOBS, plan.create, key[0])
            except KubeAlreadyExistsError:  # made by a reconcile whose Job the cache does not show yet
                log.debug("cronjob %s/%s: job %s exists already", *key, name_of(plan.create))
                plan.events = [e for e in plan.events if e[1] != "SuccessfulCreate"]
        if plan.status is not None:
            await self.client.replace(kinds.CRON_JOBS, {**cron, "status": plan.status}, key[0], subresource="status")
        for kind, reason, note in plan.events:
            self.recorder.record(cron, kind, reason, note, "Sync")
        return None if plan.wait is None else plan.wait + 0.05
