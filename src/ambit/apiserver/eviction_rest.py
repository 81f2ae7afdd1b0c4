"""``POST .../pods/<name>/eviction``: carries out the decisions of :mod:`ambit.apiserver.eviction` against the store,
as kube-apiserver's ``EvictionREST.Create`` does (its rules are numbered there).

The Eviction passes mutating and validating admission first (webhooks see ``CREATE`` of ``pods/eviction`` with the
Eviction as object; PodSecurity ignores the subresource, as kube's does). The pod's condition and delete go through
the verbs as the requesting user, so admission sees who evicted; the requester's right to evict was checked by RBAC
(``create`` on ``pods/eviction``) before anything here runs, and it needs no right to delete pods or write budgets.

Conflicts (a concurrent writer between a read and the write computed from it), as kube's ``EvictionsRetry``:

1. A pod deleted without consulting a budget (rule 2) is deleted on the version read; when it changed meanwhile
   the pod is read and decided again, up to :data:`ATTEMPTS` times :data:`RETRY_DELAY` apart, unless the caller
   set its own ``resourceVersion`` precondition (then its 409 is the answer).
2. The budget's status is written through the ``status`` subresource as the API server itself (kube's loopback
   client) with the version it was read at; a 409 reads the budget again and charges the fresh one (which may now
   refuse), up to :data:`ATTEMPTS` times; then 504 ``Timeout``. A stale budget never lets two evictions through.
3. The pod's ``DisruptionTarget`` condition is written on the latest pod, its preconditions checked against it,
   read again on each conflict (kube's ``GuaranteedUpdate``); the delete that follows carries the condition's
   version when the caller's options had one.
"""

from __future__ import annotations

import asyncio
import copy
import dataclasses
import random
from typing import Any

from ambit.apiserver import errors
from ambit.apiserver.admission_chain import Request
from ambit.apiserver.eviction import (
    MULTIPLE,
    Eviction,
    charge,
    disruption_target,
    enforces_resource_version,
    ignores_budgets,
    parse_eviction,
    passes_unready,
    still_processing,
    success,
    with_resource_version,
)
from ambit.apiserver.registry import ResourceType
from ambit.apiserver.requests import DeleteOptions, JsonObject, User, rfc3339
from ambit.apiserver.store import StoredObject
from ambit.apiserver.verbs import ResourceManager
from ambit.apiserver.watch import ObjectFilter
from ambit.model.disruption import covers

PODS = ("", "pods")
BUDGETS = ("policy", "poddisruptionbudgets")
ATTEMPTS = 20
RETRY_DELAY = 0.5
"""Seconds between attempts after a conflict (kube's ``EvictionsRetry``: 20 steps of 500 ms, 10 % jitter)."""
BUDGET_RETRY_AFTER = 10
SERVER = User("system:apiserver", groups=("system:masters",))


async def _pause() -> None:
    await asyncio.sleep(RETRY_DELAY * random.uniform(1.0, 1.1))  # jitter, not a secret


async def evict(
    manager: ResourceManager, namespace: str, name: str, body: Any, user: User, *, dry_run: bool
) -> JsonObject:
    eviction = parse_eviction(body, namespace, name, dry_run)
    pods = manager.registry.find(*PODS)
    assert pods is not None
    eviction = await _admit(manager, pods, namespace, name, body, user, eviction.options.dry_run, dry_run)
    options = eviction.options
    for attempt in range(ATTEMPTS):  # rule 1 of the module docstring
        pod = manager.get(pods, namespace, name)
        if not ignores_budgets(pod.obj):
            break
        try:
            versioned = with_resource_version(options, str(pod.rv)) if enforces_resource_version(pod.obj) else options
            await _delete(manager, pod, versioned, user)
            return success()
        except errors.ApiError as exc:
            if exc.code != 409 or options.precondition_rv or attempt == ATTEMPTS - 1:
                raise
        await _pause()
    budgets = _covering(manager, pod)
    if len(budgets) > 1:
        raise errors.ApiError(500, "", MULTIPLE)
    conditional = False
    if budgets:
        if passes_unready(pod.obj, budgets[0].obj):
            conditional = True
        else:
            await _charge(manager, budgets[0], name, options.dry_run)
    if conditional:
        try:
            await _delete(manager, pod, with_resource_version(options, str(pod.rv)), user)
        except errors.ApiError as exc:
            if exc.code == 409 and not options.precondition_rv:
                raise still_processing(str(budgets[0].obj["metadata"]["name"])) from None
            raise
    else:
        await _delete(manager, pod, options, user)
    return success()


async def _admit(
    manager: ResourceManager,
    pods: ResourceType,
    namespace: str,
    name: str,
    body: JsonObject,
    user: User,
    dry_run: bool,
    dry_run_query: bool,
) -> Eviction:
    """Mutating, then validating admission of the Eviction (``CREATE pods/eviction``, kind ``policy/v1
    Eviction``), as kube-apiserver admits a subresource create; a mutation is parsed again (rule 1)."""
    obj = {"apiVersion": "policy/v1", "kind": "Eviction", **copy.deepcopy(body)}
    request = Request("CREATE", pods, "v1", namespace, name, user, "eviction", dry_run)
    attrs = manager.admission.attributes(request, obj, None, own_labels=False)
    attrs = dataclasses.replace(attrs, kind_group="policy", kind_version="v1", kind="Eviction")
    obj = await manager.admission.mutate(attrs, obj)
    await manager.admission.validate(attrs, obj)
    return parse_eviction(obj, namespace, name, dry_run_query)


def _covering(manager: ResourceManager, pod: StoredObject) -> list[StoredObject]:
    rtype = manager.registry.find(*BUDGETS)
    if rtype is None:
        return []
    items = manager.list_items(rtype, ObjectFilter(pod.namespace, None, None)).items
    return [b for b in items if covers(b.obj, pod.obj)]


async def _charge(manager: ResourceManager, budget: StoredObject, pod_name: str, dry_run: bool) -> None:
    rtype = manager.registry.find(*BUDGETS)
    assert rtype is not None
    name = str(budget.obj["metadata"]["name"])
    for attempt in range(ATTEMPTS):  # rule 2
        if attempt:
            await _pause()
            budget = manager.get(rtype, budget.namespace, name)
        status = charge(budget.obj, pod_name, rfc3339(manager.now()), dry_run)
        if dry_run:
            return
        body = copy.deepcopy(budget.obj)
        body["status"] = status
        body["metadata"]["resourceVersion"] = str(budget.rv)
        try:
            await manager.update(rtype, "v1", budget.namespace, name, body, SERVER, subresource="status")
            return
        except errors.ApiError as exc:
            if exc.code != 409:
                raise
    raise errors.ApiError(
        504,
        "Timeout",
        f'couldn\'t update PodDisruptionBudget "{name}" due to conflicts',
        details={"retryAfterSeconds": BUDGET_RETRY_AFTER},
    )


async def _delete(manager: ResourceManager, pod: StoredObject, options: DeleteOptions, user: User) -> None:
    """Rule 6: the condition, then the delete (whose preconditions the condition's write must meet first)."""
    pods = manager.registry.find(*PODS)
    assert pods is not None
    name = str(pod.obj["metadata"]["name"])
    if not options.dry_run:
        options = await _mark_disruption_target(manager, pods, pod.namespace, name, options, user)
    await manager.delete(pods, "v1", pod.namespace, name, options, user)


async def _mark_disruption_target(
    manager: ResourceManager, pods: ResourceType, namespace: str, name: str, options: DeleteOptions, user: User
) -> DeleteOptions:
    """Rule 3: the condition on the latest pod (read again on each conflict); the delete options that follow."""
    for attempt in range(ATTEMPTS):
        current = manager.get(pods, namespace, name)
        meta = current.obj["metadata"]
        if options.precondition_uid and options.precondition_uid != meta.get("uid"):
            raise errors.conflict(
                "pods",
                name,
                f"Precondition failed: UID in precondition: {options.precondition_uid}, "
                f"UID in object meta: {meta.get('uid')}",
            )
        if options.precondition_rv and options.precondition_rv != str(current.rv):
            raise errors.conflict(
                "pods",
                name,
                f"Precondition failed: ResourceVersion in precondition: {options.precondition_rv}, "
                f"ResourceVersion in object meta: {current.rv}",
            )
        body = copy.deepcopy(current.obj)
        conditions = [c for c in (body.setdefault("status", {}).get("conditions") or []) if isinstance(c, dict)]
        if any(c.get("type") == "DisruptionTarget" and c.get("status") == "True" for c in conditions):
            return options
        kept = [c for c in conditions if c.get("type") != "DisruptionTarget"]
        body["status"]["conditions"] = [*kept, disruption_target(rfc3339(manager.now()))]
        body["metadata"]["resourceVersion"] = str(current.rv)
        try:
            updated = await manager.update(pods, "v1", namespace, name, body, user, subresource="status")
        except errors.ApiError as exc:
            if exc.code != 409 or attempt == ATTEMPTS - 1:
                raise
            continue
        if options.precondition_rv:
            return dataclasses.replace(options, precondition_rv=str(updated["metadata"]["resourceVersion"]))
        return options
    raise AssertionError("unreachable")
