"""Status the control plane owns (spec §10.3), written as istiod writes it: ``ZtunnelAccepted`` and
``WaypointAccepted`` on AuthorizationPolicies, ``istio.io/WaypointBound`` on Services and ServiceEntries and
``istio.io/WaypointMissing`` and ``istio.io/VisibilityApplied`` on ServiceEntries, the
``status.parents`` entries of ``controllerName: istio.io/gateway-controller`` on HTTPRoutes, GRPCRoutes and
TCPRoutes, the ``status.ancestors`` of BackendTLSPolicies (:class:`AncestorStatusWriter`), and the
auto-allocated ``status.addresses`` of ServiceEntries (:class:`AddressStatusWriter`).

Theory of operation: the translation computes each object's wanted condition (:class:`PolicyStatus`, whose
``type`` names it) or a route's wanted parents (:class:`RouteStatus`); :func:`plan_conditions` and
:func:`plan_route_parents` (pure) compare it with what the object carries and return the new list only when
something must change; a :class:`StatusWriter` (the asyncio shell: :class:`PolicyStatusWriter` per kind and
condition type, :class:`RouteStatusWriter` per route kind) keeps the latest wanted statuses, and one task patches
the ``status`` subresource of each object whose plan says so.

Rules:

1. A condition is ``type``, ``status`` ("True"/"False"), ``reason``, ``message``, ``observedGeneration`` (the
   object's ``metadata.generation`` the translation saw) and ``lastTransitionTime``.
2. Nothing is written when type, status, reason, message and observedGeneration are all as wanted.
3. ``lastTransitionTime`` changes only when ``status`` flips (or the condition is new); a changed message or
   generation keeps it, as Kubernetes' ``meta.SetStatusCondition`` does.
4. Other conditions (``WaypointAccepted``, written by whoever owns it) are kept as they are, in their place.
5. An object that no longer gets the condition (a policy moved to ``targetRefs``, a Service whose
   ``istio.io/use-waypoint`` label went) loses it; one that never had it is not written.
6. Route parents (:func:`plan_route_parents`): entries of other controllers are kept as they are, in their place;
   ours (same ``controllerName``) are matched by parentRef (namespace defaulting to the route's), their conditions
   planned one by one as rules 1-3 say; ours no longer wanted are dropped, new ones appended. Nothing is written
   when the result equals what the route carries.
7. A patch carries the object's ``resourceVersion``: if someone else wrote in between, the API server refuses it
   (409) and the next translation, seeing the newer object, plans again. A failed write is retried after the next
   change or ``retry`` seconds; it never stops the writer, nor does a pass that fails by a defect planning one
   object's status (logged with its traceback, retried the same way).
8. One writer may own several condition types of a kind (a ServiceEntry's ``WaypointBound``, ``WaypointMissing``
   and ``VisibilityApplied``): each is planned as above, one after the other, and one patch carries them all, so the
   two never race each other's ``resourceVersion``.
9. Policy ancestors (:func:`plan_policy_ancestors`, a BackendTLSPolicy's ``status.ancestors``): as rule 6 by
   ``ancestorRef``, owning the entries of both istiod controllers (``istio.io/mesh-controller`` and
   ``istio.io/gateway-controller``); at most 16 entries are written, Gateway API's bound.
10. A pass plans only the objects that changed since their last plan wrote nothing: an object whose
    ``resourceVersion`` and wanted status (compared with ``==``) are those of that plan is skipped, since planning
    it again gives the same nothing (the clock only matters to what is written). Every configuration change wakes
    the writers, and re-planning 10,000 Services' ``WaypointBound`` per pod change was ~9% of the control plane's
    CPU under churn (issue 22).
11. A writer given a ``generation`` (what its objects' cache and filter are now, compared with ``==``: the
    informer's last resourceVersion and the discovery filter) skips a whole pass when that generation and its
    wanted statuses (a revision that :meth:`StatusWriter._want` bumps only when they differ, ``==``) are those of
    the start of its last pass that wrote nothing, failed nothing and waited on no write of its own to reach the
    cache: that pass found every object settled, and nothing it read has changed since. Rule 10 skips the plans;
    this skips the walk over 10,000 Services on each pod change (~10% of the control plane's CPU under churn).
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
from collections.abc import Callable, Iterable, Mapping, Sequence
from datetime import UTC, datetime
from typing import Any

from ambit.controlplane.translate import PolicyStatus, RouteStatus
from ambit.controlplane.translate.autoallocate import (
    AddressAllocator,
    entry_key,
    hosts_of,
    plan_addresses,
    qualifies,
)
from ambit.controlplane.translate.backendtls import (
    GATEWAY_CONTROLLER,
    MAX_ANCESTORS,
    MESH_CONTROLLER,
    BackendTlsPolicyStatus,
)
from ambit.controlplane.translate.policies import ZTUNNEL_ACCEPTED
from ambit.controlplane.translate.routes import CONTROLLER_NAME, RouteCondition
from ambit.k8s import KubeClient, KubeClientError, KubeNotFoundError, kinds

__all__ = [
    "AddressStatusWriter",
    "AncestorStatusWriter",
    "PolicyStatusWriter",
    "RouteStatusWriter",
    "StatusWriter",
    "plan_conditions",
    "plan_policy_ancestors",
    "plan_route_parents",
    "rfc3339",
]

log = logging.getLogger("ambit.controlplane.status")

Obj = Mapping[str, Any]
ANCESTOR_CONTROLLERS = frozenset((MESH_CONTROLLER, GATEWAY_CONTROLLER))
"""The ``controllerName`` values of the policy ancestors we own (istiod's two controllers)."""


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


def _route_condition(wanted: RouteCondition, generation: int, old: Obj | None, now: str) -> dict[str, Any]:
    new = {
        "type": wanted.type,
        "status": "True" if wanted.status else "False",
        "reason": wanted.reason,
        "message": wanted.message,
        "observedGeneration": generation,
        "lastTransitionTime": now,
    }
    if old is not None and old.get("status") == new["status"] and old.get("lastTransitionTime"):
        new["lastTransitionTime"] = old["lastTransitionTime"]
    return new


def _same_condition(old: Obj, new: Obj) -> bool:
    return all(old.get(k) == new[k] for k in ("type", "status", "reason", "message", "observedGeneration"))


def _plain(value: Any) -> Any:
    """A parentRef field as a dict key: what a status written by someone else holds may be anything."""
    return value if value is None or isinstance(value, str | int) else repr(value)


def _ref_key(ref: Any, namespace: str) -> tuple[Any, ...]:
    ref = ref if isinstance(ref, Mapping) else {}
    group = ref.get("group", "gateway.networking.k8s.io")
    return tuple(
        _plain(v)
        for v in (
            group,
            ref.get("kind") or "Gateway",
            ref.get("namespace") or namespace,
            ref.get("name"),
            ref.get("sectionName"),
            ref.get("port"),
        )
    )


def plan_route_parents(
    current: Sequence[Obj] | None, wanted: RouteStatus | None, namespace: str, now: str
) -> list[dict[str, Any]] | None:
    """A route's new ``status.parents``, or None when nothing must be written (rule 6)."""
    entries = [(p.parent_ref_dict(), CONTROLLER_NAME, p.conditions) for p in (wanted.parents if wanted else ())]
    generation = wanted.generation if wanted is not None else 0
    return _plan_entries(current, entries, generation, namespace, now, "parentRef", frozenset((CONTROLLER_NAME,)))


def plan_policy_ancestors(
    current: Sequence[Obj] | None, wanted: BackendTlsPolicyStatus | None, namespace: str, now: str
) -> list[dict[str, Any]] | None:
    """A policy's new ``status.ancestors``, or None when nothing must be written (rule 9)."""
    entries = [(a.ancestor_ref_dict(), a.controller, a.conditions) for a in (wanted.ancestors if wanted else ())]
    generation = wanted.generation if wanted is not None else 0
    planned = _plan_entries(current, entries, generation, namespace, now, "ancestorRef", ANCESTOR_CONTROLLERS)
    if planned is None:
        return None
    bounded = planned[:MAX_ANCESTORS]
    # Other controllers may already fill the bound: then ours never fit, and rewriting the same list would loop.
    return None if bounded == [dict(a) for a in current or () if isinstance(a, Mapping)] else bounded


def _plan_entries(
    current: Sequence[Obj] | None,
    wanted: Sequence[tuple[dict[str, Any], str, Sequence[RouteCondition]]],
    generation: int,
    namespace: str,
    now: str,
    ref_field: str,
    owned: frozenset[str],
) -> list[dict[str, Any]] | None:
    """Rules 6 and 9: entries of ``current`` whose ``controllerName`` is not ``owned`` are kept in their place; ours
    are matched with ``wanted`` by ``ref_field``; None when the result equals ``current``."""
    parents = [dict(p) for p in current or () if isinstance(p, Mapping)]
    want = {_ref_key(ref, namespace): (ref, controller, conds) for ref, controller, conds in wanted}
    out: list[dict[str, Any]] = []
    placed: set[tuple[Any, ...]] = set()
    changed = False
    for entry in parents:
        controller_now = entry.get("controllerName")
        if not isinstance(controller_now, str) or controller_now not in owned:
            out.append(entry)
            continue
        key = _ref_key(entry.get(ref_field), namespace)
        target = want.get(key)
        if target is None or key in placed:
            changed = True
            continue
        placed.add(key)
        ref, controller, wanted_conditions = target
        conditions_now = entry.get("conditions")
        olds = {
            c["type"]: c
            for c in (conditions_now if isinstance(conditions_now, list) else ())
            if isinstance(c, Mapping) and isinstance(c.get("type"), str)
        }
        conditions = [_route_condition(c, generation, olds.get(c.type), now) for c in wanted_conditions]
        same = len(olds) == len(conditions) and all(
            c["type"] in olds and _same_condition(olds[c["type"]], c) for c in conditions
        )
        if same and entry.get(ref_field) == ref and entry.get("controllerName") == controller:
            out.append(entry)
            continue
        changed = True
        out.append({ref_field: ref, "controllerName": controller, "conditions": conditions})
    for key, (ref, controller, wanted_conditions) in want.items():
        if key in placed:
            continue
        changed = True
        conditions = [_route_condition(c, generation, None, now) for c in wanted_conditions]
        out.append({ref_field: ref, "controllerName": controller, "conditions": conditions})
    return out if changed else None


_ALWAYS: object = object()
""":meth:`StatusWriter._wanted_of`'s answer for writers that plan every object on every pass."""


class StatusWriter:
    """Writes planned status to the objects ``objects()`` returns (the informer's cache), objects of ``kind``;
    subclasses plan (:meth:`_plan`) what one object's ``status`` should get."""

    def __init__(
        self,
        client: KubeClient,
        objects: Callable[[], Iterable[Obj]],
        *,
        clock: Callable[[], float],
        retry: float = 2.0,
        kind: kinds.ResourceKind,
        name: str,
        generation: Callable[[], object] | None = None,
    ) -> None:
        self._client = client
        self._generation = generation
        self._revision = 0
        """Bumped by :meth:`_want` when the wanted statuses changed (rule 11)."""
        self._quiet: tuple[object, int] | None = None
        """(generation, revision) at the start of the last pass that found everything settled (rule 11)."""
        self._kind = kind
        self._name = name
        self._objects = objects
        self._clock = clock
        self._retry = retry
        self._dirty = asyncio.Event()
        self._task: asyncio.Task[None] | None = None
        self.writes = 0
        """Status patches that succeeded (for tests and metrics)."""
        self._written: dict[str, tuple[str, str, dict[str, Any]]] = {}
        """Key → (resourceVersion before, after, status written): the informer may lag behind our own write."""
        self._settled: dict[str, tuple[str, object]] = {}
        """Key → (resourceVersion, what was wanted) of the objects whose last plan wrote nothing (rule 10)."""

    def _plan(self, status: Mapping[str, Any], key: str, namespace: str, now: str) -> dict[str, Any] | None:
        raise NotImplementedError

    def _wanted_of(self, key: str) -> object:
        """What :meth:`_plan` of ``key`` depends on besides the object (compared with ``==``): rule 10. The default
        (:data:`_ALWAYS`) plans every object on every pass."""
        return _ALWAYS

    def _wake(self) -> None:
        self._dirty.set()

    def _revise(self, changed: bool) -> None:
        """New wanted statuses were submitted: wake the writer; ``changed`` (they differ from the previous ones)
        moves the revision (rule 11)."""
        if changed:
            self._revision += 1
        self._wake()

    def start(self) -> None:
        if self._task is None:
            self._task = asyncio.get_running_loop().create_task(self._run(), name=self._name)

    async def _run(self) -> None:
        while True:
            await self._dirty.wait()
            self._dirty.clear()
            try:
                ok = await self.write_once()
            except Exception:  # a defect (planning one object's status): retried like a failed write, never the end
                log.exception("%s: status pass failed", self._name)
                ok = False
            if not ok:
                with contextlib.suppress(TimeoutError):
                    await asyncio.wait_for(self._dirty.wait(), self._retry)
                self._dirty.set()

    async def write_once(self) -> bool:
        """Plan and write every object once; False when some write failed (to be retried)."""
        start = None if self._generation is None else (self._generation(), self._revision)
        if start is not None and start == self._quiet:
            return True  # rule 11: nothing this writer reads changed since a pass found everything settled
        ok, settled = True, True
        now = rfc3339(self._clock())
        seen: set[str] = set()
        for obj in list(self._objects()):
            meta = obj.get("metadata") or {}
            namespace = str(meta.get("namespace", ""))
            key = f"{namespace}/{meta.get('name', '')}"
            seen.add(key)
            version = str(meta.get("resourceVersion") or "")
            status = obj.get("status")
            current: Mapping[str, Any] = status if isinstance(status, Mapping) else {}
            written = self._written.get(key)
            lagging = False
            if written is not None and version == written[0]:
                current, lagging = written[2], True  # the cache has not seen our own write yet
            wanted = self._wanted_of(key)
            memo = version and not lagging and wanted is not _ALWAYS
            if memo and self._settled.get(key) == (version, wanted):
                continue  # rule 10: the same object, the same wanted status: the same (empty) plan
            patch = self._plan(current, key, namespace, now)
            if patch is None:
                if memo:
                    self._settled[key] = (version, wanted)
                else:
                    settled = False  # planned from what the cache has not caught up with, or on every pass
                continue
            self._settled.pop(key, None)
            settled = False
            try:
                patched = await self._client.patch_status(
                    self._kind,
                    str(meta.get("name", "")),
                    {"metadata": {"resourceVersion": version}, "status": patch},
                    namespace,
                )
            except KubeNotFoundError:
                continue  # deleted meanwhile
            except KubeClientError as exc:
                log.info("cannot write the status of %s %s: %s", self._kind.kind, key, exc)
                ok = False
                continue
            self.writes += 1
            after = str((patched.get("metadata") or {}).get("resourceVersion") or "")
            self._written[key] = (version, after, {**current, **patch})
        self._written = {k: v for k, v in self._written.items() if k in seen}
        if len(self._settled) > len(seen):
            self._settled = {k: v for k, v in self._settled.items() if k in seen}
        self._quiet = start if ok and settled else None
        return ok

    async def aclose(self) -> None:
        task, self._task = self._task, None
        if task is not None:
            task.cancel()
            with contextlib.suppress(asyncio.CancelledError):
                await task


class PolicyStatusWriter(StatusWriter):
    """Writes the wanted conditions of :meth:`submit` (condition ``condition_type``, and ``more_types``: rule 8)
    to objects of ``kind``."""

    def __init__(
        self,
        client: KubeClient,
        objects: Callable[[], Iterable[Obj]],
        *,
        clock: Callable[[], float],
        retry: float = 2.0,
        kind: kinds.ResourceKind = kinds.AUTHORIZATION_POLICIES,
        condition_type: str = ZTUNNEL_ACCEPTED,
        more_types: tuple[str, ...] = (),
        generation: Callable[[], object] | None = None,
    ) -> None:
        super().__init__(
            client,
            objects,
            clock=clock,
            retry=retry,
            kind=kind,
            name=f"{kind.kind} {condition_type} status writer",
            generation=generation,
        )
        self._condition_types = (condition_type, *more_types)
        self._wanted: dict[tuple[str, str], PolicyStatus] = {}

    def submit(self, statuses: Iterable[PolicyStatus]) -> None:
        """Make ``statuses`` the wanted ones (the latest translation's) and wake the writer."""
        wanted = {(s.key, s.type): s for s in statuses if s.type in self._condition_types}
        changed, self._wanted = wanted != self._wanted, wanted
        self._revise(changed)

    def _wanted_of(self, key: str) -> object:
        return tuple(self._wanted.get((key, condition_type)) for condition_type in self._condition_types)

    def _plan(self, status: Mapping[str, Any], key: str, namespace: str, now: str) -> dict[str, Any] | None:
        current = status.get("conditions")
        conditions: list[dict[str, Any]] | None = None
        for condition_type in self._condition_types:
            base = conditions if conditions is not None else current if isinstance(current, list) else None
            planned = plan_conditions(base, self._wanted.get((key, condition_type)), now, condition_type)
            if planned is not None:
                conditions = planned
        return None if conditions is None else {"conditions": conditions}


class RouteStatusWriter(StatusWriter):
    """Writes the wanted parents of :meth:`submit` to routes of ``kind`` (HTTPRoute, GRPCRoute, TCPRoute or
    TLSRoute)."""

    def __init__(
        self,
        client: KubeClient,
        objects: Callable[[], Iterable[Obj]],
        *,
        clock: Callable[[], float],
        kind: kinds.ResourceKind,
        retry: float = 2.0,
        generation: Callable[[], object] | None = None,
    ) -> None:
        super().__init__(
            client,
            objects,
            clock=clock,
            retry=retry,
            kind=kind,
            name=f"{kind.kind} status writer",
            generation=generation,
        )
        self._wanted: dict[str, RouteStatus] = {}

    def submit(self, statuses: Iterable[RouteStatus]) -> None:
        """Make ``statuses`` (this writer's kind) the wanted ones and wake the writer."""
        wanted = {s.key: s for s in statuses if s.kind == self._kind.kind}
        changed, self._wanted = wanted != self._wanted, wanted
        self._revise(changed)

    def _wanted_of(self, key: str) -> object:
        return self._wanted.get(key)

    def _plan(self, status: Mapping[str, Any], key: str, namespace: str, now: str) -> dict[str, Any] | None:
        current = status.get("parents")
        parents = plan_route_parents(
            current if isinstance(current, list) else None, self._wanted.get(key), namespace, now
        )
        return None if parents is None else {"parents": parents}


class AncestorStatusWriter(StatusWriter):
    """Writes the wanted ancestors of :meth:`submit` to BackendTLSPolicies (rule 9)."""

    def __init__(
        self,
        client: KubeClient,
        objects: Callable[[], Iterable[Obj]],
        *,
        clock: Callable[[], float],
        kind: kinds.ResourceKind = kinds.BACKEND_TLS_POLICIES,
        retry: float = 2.0,
    ) -> None:
        super().__init__(client, objects, clock=clock, retry=retry, kind=kind, name=f"{kind.kind} status writer")
        self._wanted: dict[str, BackendTlsPolicyStatus] = {}

    def submit(self, statuses: Iterable[BackendTlsPolicyStatus]) -> None:
        """Make ``statuses`` the wanted ones (the latest translation's) and wake the writer."""
        self._wanted = {s.key: s for s in statuses}
        self._wake()

    def _plan(self, status: Mapping[str, Any], key: str, namespace: str, now: str) -> dict[str, Any] | None:
        current = status.get("ancestors")
        ancestors = plan_policy_ancestors(
            current if isinstance(current, list) else None, self._wanted.get(key), namespace, now
        )
        return None if ancestors is None else {"ancestors": ancestors}


class AddressStatusWriter(StatusWriter):
    """Writes each ServiceEntry's allocated addresses to its ``status.addresses``
    (:mod:`ambit.controlplane.translate.autoallocate`); :meth:`wake` after every translation.

    Before each pass the allocator is warmed with every entry as the cache (or our own newer write) shows it, so
    an address an entry's status holds is never given to another.
    """

    def __init__(
        self,
        client: KubeClient,
        objects: Callable[[], Iterable[Obj]],
        *,
        clock: Callable[[], float],
        retry: float = 2.0,
    ) -> None:
        super().__init__(
            client, objects, clock=clock, retry=retry, kind=kinds.SERVICE_ENTRIES, name="ServiceEntry address writer"
        )
        self._allocator = AddressAllocator()
        self._entries: dict[str, Obj] = {}

    def wake(self) -> None:
        self._wake()

    async def write_once(self) -> bool:
        entries: dict[str, Obj] = {}
        for cached in list(self._objects()):
            key = entry_key(cached)
            written = self._written.get(key)
            version = str((cached.get("metadata") or {}).get("resourceVersion") or "")
            if written is not None and version == written[0]:
                cached = {**cached, "status": written[2]}  # noqa: PLW2901 (the cache has not seen our write yet)
            entries[key] = cached
        self._allocator.warm(entries.values())
        self._entries = entries
        return await super().write_once()

    def _plan(self, status: Mapping[str, Any], key: str, namespace: str, now: str) -> dict[str, Any] | None:
        obj = self._entries.get(key)
        if obj is None:
            return None
        addresses = plan_addresses({**obj, "status": status}, self._allocator)
        if addresses is None:
            return None
        if qualifies(obj) and len(addresses) < 2 * len(hosts_of(obj)):
            log.warning("ServiceEntry %s: the auto-allocation ranges are full; some hosts have no address", key)
        return {"addresses": addresses or None}
