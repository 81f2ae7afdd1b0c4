"""``POST .../pods/<name>/eviction``: carries out the decisions of :mod:`ambit.apiserver.eviction` against the store,
as kube-apiserver's ``EvictionREST.Create`` does (its rules are numbered there).

The Eviction passes mutating and validating admission first (webhooks see ``CREATE`` of ``pods/eviction`` with the
Eviction as object; PodSecurity ignores the subresource, as kube's does). The budget's status is written through the
``status`` subresource as the API server itself (kube's loopback client), with the version it was read at: a
concurrent write makes it a 409, and the budget is read again, up to :data:`BUDGET_ATTEMPTS` times. The pod's
condition and delete go through the verbs as the requesting user, so admission sees who evicted; the requester's
right to evict was checked by RBAC (``create`` on ``pods/eviction``) before anything here runs, and it needs no
right to delete pods or write budgets.
"""

from __future__ import annotations

import copy
import dataclasses
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
BUDGET_ATTEMPTS = 5
SERVER = User("system:apiserver", groups=("system:masters",))


async def evict(
    manager: ResourceManager, namespace: str, name: str, body: Any, user: User, *, dry_run: bool
) -> JsonObject:
    eviction = parse_eviction(body, namespace, name, dry_run)
    pods = manager.registry.find(*PODS)
    assert pods is not None
    eviction = await _admit(manager, pods, namespace, name, body, user, eviction.options.dry_run, dry_run)
    pod = manager.get(pods, namespace, name)
    options = eviction.options
    if ignores_budgets(pod.obj):
        if enforces_resource_version(pod.obj):
            options = with_resource_version(options, str(pod.rv))
        await _delete(manager, pod, options, user)
        return success()
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
    for _ in range(BUDGET_ATTEMPTS):
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
        budget = manager.get(rtype, budget.namespace, name)
    raise errors.timeout(f'couldn\'t update PodDisruptionBudget "{name}" due to conflicts')


async def _delete(manager: ResourceManager, pod: StoredObject, options: DeleteOptions, user: User) -> None:
    """Rule 6: the condition, then the delete (whose preconditions the condition's write must meet first)."""
    pods = manager.registry.find(*PODS)
    assert pods is not None
    name = str(pod.obj["metadata"]["name"])
    if not options.dry_run:
        current = manager.get(pods, pod.namespace, name)
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
        if not any(c.get("type") == "DisruptionTarget" and c.get("status") == "True" for c in conditions):
            kept = [c for c in conditions if c.get("type") != "DisruptionTarget"]
            body["status"]["conditions"] = [*kept, disruption_target(rfc3339(manager.now()))]
            body["metadata"]["resourceVersion"] = str(current.rv)
            updated = await manager.update(pods, "v1", pod.namespace, name, body, user, subresource="status")
            if options.precondition_rv:
                options = dataclasses.replace(options, precondition_rv=str(updated["metadata"]["resourceVersion"]))
    await manager.delete(pods, "v1", pod.namespace, name, options, user)
