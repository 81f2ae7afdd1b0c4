"""OpenAPI v3 documents, as much as kubectl needs of them.

kubectl (``--validate=strict``, its default) reads ``/openapi/v3`` to learn whether the server validates fields
itself: it looks for the PATCH operation of each kind (tagged with ``x-kubernetes-group-version-kind``) and for a
``fieldValidation`` query parameter on it. When it finds one it leaves validation to the server, which is what we
want (the server validates every write). The documents carry no schemas; ``kubectl explain`` has nothing to show.
"""

from __future__ import annotations

import hashlib
from typing import Any

from ambit.apiserver.registry import Registry, ResourceType
from ambit.apiserver.store import encode

JsonObject = dict[str, Any]

_QUERY_PARAMS = ("dryRun", "fieldManager", "fieldValidation", "force")


def _gv_path(group: str, version: str) -> str:
    return f"api/{version}" if not group else f"apis/{group}/{version}"


def _operation(rtype: ResourceType, version: str, action: str) -> JsonObject:
    return {
        "operationId": f"{action}{rtype.kind}",
        "x-kubernetes-action": action,
        "x-kubernetes-group-version-kind": {"group": rtype.group, "version": version, "kind": rtype.kind},
        "parameters": [{"name": name, "in": "query", "schema": {"type": "string"}} for name in _QUERY_PARAMS],
        "responses": {"200": {"description": "OK"}},
    }


def group_version_document(registry: Registry, group: str, version: str) -> JsonObject | None:
    paths: JsonObject = {}
    for rtype in registry:
        if rtype.group != group or version not in rtype.versions or "patch" not in rtype.verbs:
            continue
        base = "/" + _gv_path(group, version)
        prefix = f"{base}/namespaces/{{namespace}}" if rtype.namespaced else base
        item = {
            "get": _operation(rtype, version, "get"),
            "put": _operation(rtype, version, "put"),
            "patch": _operation(rtype, version, "patch"),
            "delete": _operation(rtype, version, "delete"),
        }
        paths[f"{prefix}/{rtype.plural}/{{name}}"] = item
        paths[f"{prefix}/{rtype.plural}"] = {"post": _operation(rtype, version, "post")}
    if not paths:
        return None
    return {
        "openapi": "3.0.0",
        "info": {"title": "Ambit embedded API server", "version": version},
        "paths": paths,
        "components": {"schemas": {}},
    }


def root_document(registry: Registry) -> JsonObject:
    pairs: set[tuple[str, str]] = set()
    for rtype in registry:
        for version in rtype.versions:
            pairs.add((rtype.group, version))
    out: JsonObject = {}
    for group, version in sorted(pairs):
        doc = group_version_document(registry, group, version)
        if doc is None:
            continue
        digest = hashlib.sha256(encode(doc)).hexdigest()[:32].upper()
        path = _gv_path(group, version)
        out[path] = {"serverRelativeURL": f"/openapi/v3/{path}?hash={digest}"}
    return {"paths": out}
