"""The TTL-after-finished controller: a finished Job with ``ttlSecondsAfterFinished`` is deleted that long after it
finished, with its pods (propagation Background: the API server's collector deletes them).

Rules:

1. A Job finished when it got its ``Complete`` or ``Failed`` condition: the finish time is that condition's
   ``lastTransitionTime`` (for ``Complete``, ``completionTime`` when set). A Job without the field, unfinished, or
   being deleted is left alone.
2. It expires at finish time + ``ttlSecondsAfterFinished``. Before that, the reconcile asks to run again then.
3. At expiry the Job is read again from the API server (the cache may be behind a change of the field) and deleted
   only if rule 2 still says it has expired, with the uid it was read with as a precondition, so a Job of the same
   name made since is never deleted.
"""

from __future__ import annotations

import contextlib
from collections.abc import Mapping
from typing import Any

from ambit.k8s import Informer, KubeNotFoundError, kinds
from ambit.lab.controllers import job_progress
from ambit.lab.controllers import pods as podstate
from ambit.lab.controllers.controller import Controller
from ambit.lab.controllers.ownership import is_deleting, key_of
from ambit.lab.controllers.workqueue import Key


def expires_at(job: Mapping[str, Any]) -> float | None:
    """Rules 1 and 2: when ``job`` may be deleted, or None."""
    ttl = (job.get("spec") or {}).get("ttlSecondsAfterFinished")
    finished = job_progress.finished_condition(job)
    if not isinstance(ttl, int) or isinstance(ttl, bool) or ttl < 0 or finished is None or is_deleting(job):
        return None
    stamp = (job.get("status") or {}).get("completionTime") if finished.get("type") == "Complete" else None
    at = podstate.parse_time(stamp) or podstate.parse_time(finished.get("lastTransitionTime"))
    return None if at is None else at + ttl


class TtlAfterFinishedController(Controller):
    name = "ttl-after-finished-controller"

    def setup(self) -> None:
        self.watch_objects(on_delete=lambda job: None)

    @property
    def objects(self) -> Informer:
        return self.informers.jobs

    def all_keys(self) -> list[Key]:
        return [key_of(job) for job in self.objects.items() if expires_at(job) is not None]

    async def reconcile(self, key: Key) -> float | None:
        job = self.find(key)
        if job is None or (expiry := expires_at(job)) is None:
            return None
        if expiry > self.clock():
            return expiry - self.clock() + 0.05
        with contextlib.suppress(KubeNotFoundError):
            fresh = await self.client.get(kinds.JOBS, key[1], key[0])
            expiry = expires_at(fresh)
            if expiry is None:
                return None
            if expiry > self.clock():
                return expiry - self.clock() + 0.05
            uid = fresh["metadata"]["uid"]
            await self.client.delete(kinds.JOBS, key[1], key[0], propagation_policy="Background", uid=uid)
        return None
