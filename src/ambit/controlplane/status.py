"""Status conditions the control plane owns (spec §10.3), written as istiod writes them: ``ZtunnelAccepted`` on
AuthorizationPolicies, ``istio.io/WaypointBound`` on Services and ServiceEntries.

Theory of operation: the translation computes each object's wanted condition (:class:`PolicyStatus`, whose
``type`` names it); :func:`plan_conditions` (pure) compares it with the conditions the object carries and returns
the new list only when something must change; :class:`PolicyStatusWriter` (the asyncio shell, one per kind and
condition type) keeps the latest wanted statuses, and one task patches the ``status`` subresource of each object
whose plan says so.

Rules:

1. A condition is ``type``, ``status`` ("True"/"False"), ``reason``, ``message``, ``observedGeneration`` (the
   object's ``metadata.generation`` the translation saw) and ``lastTransitionTime``.
2. Nothing is written when type, status, reason, message and observedGeneration are all as wanted.
3. ``lastTransitionTime`` changes only when ``status`` flips (or the condition is new); a changed message or
   generation keeps it, as Kubernetes' ``meta.SetStatusCondition`` does.
4. Other conditions (``WaypointAccepted``, written by whoever owns it) are kept as they are, in their place.
5. An object that no longer gets the condition (a policy moved to ``targetRefs``, a Service whose
   ``istio.io/use-waypoint`` label went) loses it; one that never had it is not written.
6. A patch carries the object's ``resourceVersion``: if someone else wrote in between, the API server refuses it
   (409) and the next translation, seeing the newer object, plans again. A failed write is retried after the next
   change or ``retry`` seconds; it never stops the writer.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
from collections.abc import Callable, Iterable, Mapping, Sequence
from datetime import UTC, datetime
from typing import Any

from ambit.controlplane.translate import PolicyStatus
from ambit.controlplane.translate.policies import ZTUNNEL_ACCEPTED
from ambit.k8s import KubeClient, KubeClientError, KubeNotFoundError, kinds

__all__ = ["PolicyStatusWriter", "plan_conditions", "rfc3339"]

log = logging.getLogger("ambit.controlplane.status")

Obj = Mapping[str, Any]


def rfc3339(now: float) -> str:
    """``now`` (seconds since the epoch) as Kubernetes writes times: whole seconds, UTC, ``Z``."""
    return datetime.fromtimestamp(int(now), UTC).strftime("%Y-%m-%dT%H:%M:%SZ")


def _condition(status: PolicyStatus, transition: str) -> dict[str, Any]:
    return {
        "type": status.type,
        "status": "True" if status.accepted else "False",
        "reason": status.reason,
        "message": status.message,
        "observedGeneration": status.generation,
        "lastTransitionTime": transition,
    }


def plan_conditions(
    current: Sequence[Obj] | None, wanted: PolicyStatus | None, now: str, condition_type: str = ZTUNNEL_ACCEPTED
) -> list[dict[str, Any]] | None:
    """The object's new ``status.conditions``, or None when nothing must be written (rules 1-5); the condition
    planned is ``condition_type`` (``wanted.type`` when given)."""
    conditions = [dict(c) for c in current or () if isinstance(c, Mapping)]
    owned = wanted.type if wanted is not None else condition_type
    index = next((i for i, c in enumerate(conditions) if c.get("type") == owned), None)
    if wanted is None:
        if index is None:
            return None
        del conditions[index]
        return conditions
    if index is None:
        conditions.append(_condition(wanted, now))
        return conditions
    old = conditions[index]
    new = _condition(wanted, now)
    if all(old.get(k) == new[k] for k in ("type", "status", "reason", "message", "observedGeneration")):
        return None
    if old.get("status") == new["status"] and old.get("lastTransitionTime"):
        new["lastTransitionTime"] = old["lastTransitionTime"]
    conditions[index] = new
    return conditions


class PolicyStatusWriter:
    """Writes the wanted statuses of :meth:`submit` to the objects ``objects()`` returns (the informer's cache):
    objects of ``kind``, condition ``condition_type``."""

    def __init__(
        self,
        client: KubeClient,
        objects: Callable[[], Iterable[Obj]],
        *,
        clock: Callable[[], float],
        retry: float = 2.0,
        kind: kinds.ResourceKind = kinds.AUTHORIZATION_POLICIES,
        condition_type: str = ZTUNNEL_ACCEPTED,
    ) -> None:
        self._client = client
        self._kind = kind
        self._condition_type = condition_type
        self._objects = objects
        self._clock = clock
        self._retry = retry
        self._wanted: dict[str, PolicyStatus] = {}
        self._dirty = asyncio.Event()
        self._task: asyncio.Task[None] | None = None
        self.writes = 0
        """Status patches that succeeded (for tests and metrics)."""
        self._written: dict[str, tuple[str, str, list[dict[str, Any]]]] = {}
        """Key → (resourceVersion before, after, conditions written): the informer may lag behind our own write."""

    def submit(self, statuses: Iterable[PolicyStatus]) -> None:
        """Make ``statuses`` the wanted ones (the latest translation's) and wake the writer."""
        self._wanted = {s.key: s for s in statuses}
        self._dirty.set()

    def start(self) -> None:
        if self._task is None:
            name = f"{self._kind.kind} {self._condition_type} status writer"
            self._task = asyncio.get_running_loop().create_task(self._run(), name=name)

    async def _run(self) -> None:
        while True:
            await self._dirty.wait()
            self._dirty.clear()
            if not await self.write_once():
                with contextlib.suppress(TimeoutError):
                    await asyncio.wait_for(self._dirty.wait(), self._retry)
                self._dirty.set()

    async def write_once(self) -> bool:
        """Plan and write every object once; False when some write failed (to be retried)."""
        ok = True
        now = rfc3339(self._clock())
        seen: set[str] = set()
        for obj in list(self._objects()):
            meta = obj.get("metadata") or {}
            key = f"{meta.get('namespace', '')}/{meta.get('name', '')}"
            seen.add(key)
            version = str(meta.get("resourceVersion") or "")
            current = (obj.get("status") or {}).get("conditions")
            written = self._written.get(key)
            if written is not None and version == written[0]:
                current = written[2]  # the cache has not seen our own write yet
            conditions = plan_conditions(
                current if isinstance(current, list) else None, self._wanted.get(key), now, self._condition_type
            )
            if conditions is None:
                continue
            try:
                patched = await self._client.patch_status(
                    self._kind,
                    str(meta.get("name", "")),
                    {"metadata": {"resourceVersion": version}, "status": {"conditions": conditions}},
                    str(meta.get("namespace", "")),
                )
            except KubeNotFoundError:
                continue  # deleted meanwhile
            except KubeClientError as exc:
                log.info("cannot write the status of %s %s: %s", self._kind.kind, key, exc)
                ok = False
                continue
            self.writes += 1
            after = str((patched.get("metadata") or {}).get("resourceVersion") or "")
            self._written[key] = (version, after, conditions)
        self._written = {k: v for k, v in self._written.items() if k in seen}
        return ok

    async def aclose(self) -> None:
        task, self._task = self._task, None
        if task is not None:
            task.cancel()
            with contextlib.suppress(asyncio.CancelledError):
                await task
