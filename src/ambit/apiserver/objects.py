"""The object a write stores, formed from what the client sent: body checks, update merging and patching.

Theory of operation: these are pure functions of the request and the stored object; the verbs call them before
admission. :func:`check_body` makes the sent object agree with the URL (kind, apiVersion, namespace) or refuses
it. :func:`merge_update` forms the object an update stores: the client cannot change the server's metadata
(uid, creation and deletion times, generation), nor add finalizers once deletion started; the kind's strategy
says what else is kept, and ``generation`` grows when anything but metadata and status changed. ``/status``
takes only status, labels and annotations from the client. :func:`apply_patch` applies a JSON, merge or
strategic merge patch to the stored object as seen in the requested version. :func:`unchanged` tells a write
that changes nothing, which is not stored.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

from ambit.apiserver import errors, patch
from ambit.apiserver.nesting import check_depth, copy_document
from ambit.apiserver.registry import ResourceType
from ambit.apiserver.requests import JsonObject
from ambit.apiserver.store import decode, encode
from ambit.apiserver.strategies import Strategy

PATCH_TYPES = frozenset(
    {"application/json-patch+json", "application/merge-patch+json", "application/strategic-merge-patch+json"}
)
_SERVER_METADATA = ("uid", "creationTimestamp", "deletionTimestamp", "deletionGracePeriodSeconds", "generation")


def check_body(rtype: ResourceType, version: str, namespace: str, body: Any) -> JsonObject:
    """The sent object, in storage form; ``body`` is a freshly decoded body and is changed in place."""
    if not isinstance(body, dict):
        raise errors.bad_request("the request body must be a JSON or YAML object")
    obj = body
    api_version = rtype.api_version(version)
    sent_version = obj.get("apiVersion")
    sent_kind = obj.get("kind")
    if sent_kind is not None and sent_kind != rtype.kind:
        raise errors.bad_request(f"the kind in the data ({sent_kind}) does not match the expected kind ({rtype.kind})")
    if sent_version is not None and sent_version != api_version:
        raise errors.bad_request(
            f"the API version in the data ({sent_version}) does not match the expected API version ({api_version})"
        )
    obj["apiVersion"] = api_version
    obj["kind"] = rtype.kind
    meta = obj.get("metadata", {})
    if not isinstance(meta, dict):
        raise errors.bad_request("metadata must be an object")
    obj["metadata"] = meta
    if rtype.namespaced:
        sent_ns = meta.get("namespace")
        if sent_ns and sent_ns != namespace:
            raise errors.bad_request(
                "the namespace of the provided object does not match the namespace sent on the request"
            )
        meta["namespace"] = namespace
    else:
        meta.pop("namespace", None)
    if rtype.to_storage is not None:
        obj = rtype.to_storage(obj)
    if not isinstance(obj.get("metadata"), dict):
        obj["metadata"] = {}
    return obj


def merge_update(
    rtype: ResourceType, strategy: Strategy, old: JsonObject, obj: JsonObject, subresource: str
) -> JsonObject:
    """The object an update of ``old`` with the sent ``obj`` stores (before defaults and admission)."""
    old_meta = old["metadata"]
    if subresource == "status":
        new = copy_document(old)
        new["apiVersion"] = rtype.storage_api_version
        if "status" in obj:
            new["status"] = obj["status"]
        else:
            new.pop("status", None)
        for key in ("labels", "annotations"):
            if key in obj["metadata"]:
                new["metadata"][key] = obj["metadata"][key]
            else:
                new["metadata"].pop(key, None)
        return new
    new = obj
    meta = new["metadata"]
    for key in _SERVER_METADATA:
        if key in old_meta:
            meta[key] = old_meta[key]
        else:
            meta.pop(key, None)
    if old_meta.get("deletionTimestamp"):
        added = set(meta.get("finalizers") or []) - set(old_meta.get("finalizers") or [])
        if added:
            raise errors.forbidden(
                f"no new finalizers can be added if the object is being deleted, found new finalizers {sorted(added)}"
            )
    strategy.prepare_for_update(rtype, old, new)
    if _content(new) != _content(old):
        meta["generation"] = int(old_meta.get("generation", 1)) + 1
    return new


def apply_patch(rtype: ResourceType, version: str, stored: JsonObject, content_type: str, body: bytes) -> Any:
    """``stored`` as seen in ``version``, patched; the media type is judged before the body is decoded."""
    if content_type == "application/apply-patch+yaml":
        raise errors.ApiError(
            415,
            "UnsupportedMediaType",
            "server-side apply (application/apply-patch+yaml) is not supported by the embedded API server; "
            "use client-side apply (kubectl apply without --server-side)",
        )
    if content_type == "application/strategic-merge-patch+json" and not rtype.builtin:
        raise errors.ApiError(
            415,
            "UnsupportedMediaType",
            f"strategic merge patch is not supported for custom resources ({rtype.kind}); use --type=merge",
        )
    if content_type not in PATCH_TYPES:
        raise errors.unsupported_media_type(content_type)
    try:
        patch_doc = decode(body)
    except Exception:
        raise errors.bad_request("the patch is not valid JSON") from None
    check_depth(patch_doc, "the patch")
    base = copy_document(stored)
    if rtype.from_storage is not None:
        base = rtype.from_storage(base)
    base["apiVersion"] = rtype.api_version(version)
    if content_type == "application/json-patch+json":
        patched = patch.json_patch(base, patch_doc)
    elif content_type == "application/merge-patch+json":
        patched = patch.json_merge_patch(base, patch_doc)
    elif not isinstance(patch_doc, dict):
        raise errors.bad_request("a strategic merge patch must be a JSON object")
    else:
        patched = patch.strategic_merge_patch(base, patch_doc, patch.merge_keys_for(rtype.group, rtype.kind))
    check_depth(patched, "the patched object")  # a JSON patch's path nests its value deeper than the patch
    return patched


def unchanged(old: JsonObject, new: JsonObject) -> bool:
    """Whether storing ``new`` over ``old`` changes nothing but the version fields."""
    old_cmp = dict(old)
    old_cmp["metadata"] = {k: v for k, v in old["metadata"].items() if k != "resourceVersion"}
    new_cmp = dict(new)
    new_cmp["metadata"] = {k: v for k, v in new["metadata"].items() if k != "resourceVersion"}
    new_cmp["apiVersion"] = old_cmp.get("apiVersion")
    return encode(old_cmp) == encode(new_cmp)


def _content(obj: Mapping[str, Any]) -> JsonObject:
    """What generation counts: everything but metadata and status."""
    return {k: v for k, v in obj.items() if k not in ("metadata", "status")}
