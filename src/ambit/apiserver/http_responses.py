"""Responses of the HTTP shell (:mod:`ambit.apiserver.http`): the :class:`Target` a request names, and objects,
lists and tables in the version it asked for.

Theory of operation. A request path names a resource type, a version, a namespace (or all namespaces), an object and
a subresource: a :class:`Target`. Objects are stored in their type's storage version; each response converts them
(``from_storage``) and labels them with the version of the request. A list whose version is the storage version and
needs no conversion is written from the stored encodings as they are, with no re-encoding per object. A client that
asks for a Table (``Accept: ...;as=Table;g=meta.k8s.io``) gets one from :mod:`ambit.apiserver.tables` instead, for
objects, lists and watch events alike.
"""

from __future__ import annotations

import time
from dataclasses import dataclass
from typing import Any

from aiohttp import web

from ambit.apiserver import tables
from ambit.apiserver.registry import ResourceType
from ambit.apiserver.store import StoredObject, encode

JSON = "application/json"
TABLE_MARK = "as=Table"


@dataclass(frozen=True, slots=True)
class Target:
    """What a request path names: ``[namespaces/<ns>/]<plural>[/<name>[/<subresource>]]`` of one group version."""

    rtype: ResourceType
    version: str
    namespace: str  # "" for cluster-scoped or all namespaces
    all_namespaces: bool
    name: str
    subresource: str
    legacy_watch: bool


def object_response(request: web.Request, t: Target, obj: dict[str, Any], code: int = 200) -> web.Response:
    obj = as_version(obj, t)
    if wants_table(request):
        return json_response(table(request, t, [obj], str(obj["metadata"].get("resourceVersion", "")), ""), code)
    return json_response(obj, code)


def list_response(
    request: web.Request,
    t: Target,
    items: list[StoredObject],
    rv: int,
    token: str,
    remaining: int | None,
) -> web.Response:
    if wants_table(request):
        objs = [as_version(i.obj, t) for i in items]
        return json_response(table(request, t, objs, str(rv), token, remaining))
    meta: dict[str, Any] = {"resourceVersion": str(rv)}
    if token:
        meta["continue"] = token
    if remaining is not None:
        meta["remainingItemCount"] = remaining
    head = encode({"kind": t.rtype.list_kind, "apiVersion": t.rtype.api_version(t.version), "metadata": meta})
    if t.version == t.rtype.storage_version and t.rtype.from_storage is None:
        raws = [i.raw for i in items]
    else:
        raws = [encode(as_version(i.obj, t)) for i in items]
    body = head[:-1] + b',"items":[' + b",".join(raws) + b"]}"
    return web.Response(body=body, content_type=JSON)


def table(
    request: web.Request,
    t: Target,
    objs: list[dict[str, Any]],
    rv: str,
    token: str,
    remaining: int | None = None,
) -> dict[str, Any]:
    """The Table of ``objs`` (already in the request's version), with the list metadata a list response has."""
    include = request.query.get("includeObject", "Metadata")
    meta: dict[str, Any] = {"resourceVersion": rv}
    if token:
        meta["continue"] = token
    if remaining is not None:
        meta["remainingItemCount"] = remaining
    return tables.to_table(
        t.rtype.kind,
        t.rtype.group,
        objs,
        now=time.time(),
        list_metadata=meta,
        include_object=include,
        printer_columns=t.rtype.columns_for(t.version),
    )


def as_version(obj: dict[str, Any], t: Target) -> dict[str, Any]:
    if t.rtype.from_storage is not None:
        obj = t.rtype.from_storage(obj)
    wanted = t.rtype.api_version(t.version)
    if obj.get("apiVersion") == wanted:
        return obj
    out = dict(obj)
    out["apiVersion"] = wanted
    return out


def list_doc(t: Target, objs: list[dict[str, Any]], rv: int, token: str, remaining: int | None) -> dict[str, Any]:
    meta: dict[str, Any] = {"resourceVersion": str(rv)}
    return {
        "kind": t.rtype.list_kind,
        "apiVersion": t.rtype.api_version(t.version),
        "metadata": meta,
        "items": [as_version(o, t) for o in objs],
    }


def wants_table(request: web.Request) -> bool:
    accept = request.headers.get("Accept", "")
    return TABLE_MARK in accept and "g=meta.k8s.io" in accept


def json_response(doc: Any, code: int = 200) -> web.Response:
    return web.Response(body=encode(doc), status=code, content_type=JSON)
