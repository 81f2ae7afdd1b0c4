"""The scale subresource (``autoscaling/v1`` Scale, what ``kubectl scale`` reads and writes).

Theory of operation: a Scale is a view of a workload: ``spec.replicas`` of the object, ``status.replicas`` and
its selector in selector-string form. Writing a Scale is an update of the workload's main resource that changes
only ``spec.replicas``, so it passes through the same defaults, admission and validation as any update; a
``resourceVersion`` in the Scale is a precondition on the workload. Patches of a Scale are JSON or merge
patches (a strategic merge patch of a Scale is a merge patch: it has no lists).
"""

from __future__ import annotations

import copy
from typing import Any

from ambit.apiserver import errors, patch
from ambit.apiserver.nesting import check_depth
from ambit.apiserver.registry import ResourceType
from ambit.apiserver.requests import JsonObject, User
from ambit.apiserver.selectors import label_selector_from_spec
from ambit.apiserver.store import decode
from ambit.apiserver.verbs import STALE, ResourceManager


def read_scale(manager: ResourceManager, rtype: ResourceType, namespace: str, name: str) -> JsonObject:
    obj = manager.get(rtype, namespace, name).obj
    meta, spec, status = obj["metadata"], obj.get("spec") or {}, obj.get("status") or {}
    selector = label_selector_from_spec(spec.get("selector")) if isinstance(spec.get("selector"), dict) else None
    return {
        "kind": "Scale",
        "apiVersion": "autoscaling/v1",
        "metadata": {
            k: meta[k] for k in ("name", "namespace", "uid", "resourceVersion", "creationTimestamp") if k in meta
        },
        "spec": {"replicas": int(spec.get("replicas", 1))},
        "status": {"replicas": int(status.get("replicas", 0)), "selector": str(selector or "")},
    }


async def update_scale(
    manager: ResourceManager,
    rtype: ResourceType,
    version: str,
    namespace: str,
    name: str,
    body: Any,
    user: User,
    *,
    dry_run: bool = False,
) -> JsonObject:
    current = manager.get(rtype, namespace, name)
    spec = body.get("spec") if isinstance(body, dict) else None
    replicas = spec.get("replicas") if isinstance(spec, dict) else None
    if not isinstance(replicas, int) or isinstance(replicas, bool) or replicas < 0:
        raise errors.invalid("Scale", name, [("spec.replicas", "must be a non-negative integer")], "autoscaling")
    sent_rv = (body.get("metadata") or {}).get("resourceVersion") if isinstance(body.get("metadata"), dict) else None
    if sent_rv and str(sent_rv) != str(current.rv):
        raise errors.conflict(rtype.plural, name, STALE, rtype.group)
    new = copy.deepcopy(current.obj)
    new.setdefault("spec", {})["replicas"] = replicas
    await manager.replace(rtype, version, current, new, user, "", dry_run)
    return read_scale(manager, rtype, namespace, name)


async def patch_scale(
    manager: ResourceManager,
    rtype: ResourceType,
    version: str,
    namespace: str,
    name: str,
    content_type: str,
    body: bytes,
    user: User,
    *,
    dry_run: bool = False,
) -> JsonObject:
    scale = read_scale(manager, rtype, namespace, name)
    try:
        doc = decode(body)
    except Exception:
        raise errors.bad_request("the patch is not valid JSON") from None
    check_depth(doc, "the patch")
    if content_type == "application/json-patch+json":
        patched = patch.json_patch(scale, doc)
    elif content_type in ("application/merge-patch+json", "application/strategic-merge-patch+json"):
        patched = patch.json_merge_patch(scale, doc)
    else:
        raise errors.unsupported_media_type(content_type)
    return await update_scale(manager, rtype, version, namespace, name, patched, user, dry_run=dry_run)
