"""The HTTP shell: Kubernetes REST paths onto :class:`ResourceManager`, JSON in and out, chunked watches.

Paths: ``/api/v1/...`` (core) and ``/apis/<group>/<version>/...``, then
``[namespaces/<ns>/]<plural>[/<name>[/<subresource>]]``; the legacy ``watch/`` prefix is accepted too. ``pods/log``,
``pods/exec``, ``pods/attach`` and ``pods/portforward`` go to the pod's node's kubelet
(:mod:`ambit.apiserver.pod_streams`). Every error leaves as a ``Status``; an exception that is not an
:class:`ApiError` is our bug, logged and answered with 500.
"""

from __future__ import annotations

import asyncio
import hmac
import logging
import time
from collections.abc import Awaitable, Callable, Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import yaml
from aiohttp import web

from ambit.apiserver import discovery, errors, eviction_rest, openapi, protobuf, scale, tables
from ambit.apiserver.authorizer import REVIEWS
from ambit.apiserver.limits import LimitSettings, UserLimiter
from ambit.apiserver.nesting import check_depth
from ambit.apiserver.node_authorizer import node_of
from ambit.apiserver.pod_streams import PodStreams
from ambit.apiserver.rbac_policy import request_attributes
from ambit.apiserver.registry import ResourceType
from ambit.apiserver.requests import DeleteOptions, User, request_warnings
from ambit.apiserver.store import StoredObject, decode, encode
from ambit.apiserver.token_file import StaticUser, find_user
from ambit.apiserver.tokens import TokenIdentity
from ambit.apiserver.verbs import ResourceManager
from ambit.apiserver.watch import ObjectFilter
from ambit.apiserver.watch_cursor import Bookmark, WatchCursor, WatchSettings
from ambit.model import untrusted_yaml

log = logging.getLogger("ambit.apiserver")

MAX_BODY = 3 * 1024 * 1024
WATCH_WRITE_BYTES = 256 * 1024
JSON = "application/json"
TABLE_MARK = "as=Table"
ADMIN = User("kubernetes-admin", groups=("system:masters", "system:authenticated"))
PUBLIC_PATHS = frozenset({"/version", "/healthz", "/livez", "/readyz"})
USER = web.RequestKey("user", User)
"""The authenticated user of a request (a typed key: aiohttp warns about string keys)."""


@dataclass(frozen=True, slots=True)
class Target:
    rtype: ResourceType
    version: str
    namespace: str  # "" for cluster-scoped or all namespaces
    all_namespaces: bool
    name: str
    subresource: str
    legacy_watch: bool


@dataclass(frozen=True, slots=True)
class HttpSettings:
    admin_token: str
    server_address: str
    static_tokens: Mapping[str, StaticUser] = field(default_factory=dict)
    """``--token-auth-file``'s users, by token."""
    git_version: str = "v1.32.0-ambit"
    bookmark_interval: float = 60.0
    default_watch_timeout: float = 1800.0
    limits: LimitSettings = field(default_factory=LimitSettings)
    kubelet_socket_dir: Path | None = None
    """Where nodes' kubelet sockets are (``DIR/<node>/kubelet.sock``) for pods/log, exec, portforward."""


class ApiHttp:
    """Builds the aiohttp application for one :class:`ResourceManager`."""

    def __init__(self, manager: ResourceManager, settings: HttpSettings) -> None:
        self.manager = manager
        self.settings = settings
        self.watches: set[asyncio.Task[Any]] = set()
        self.limiter = UserLimiter(settings.limits)
        self.pod_streams = PodStreams(settings.kubelet_socket_dir)

    def app(self) -> web.Application:
        # The rate limit applies to the authenticated user (before impersonation, and before RBAC reads the store).
        middlewares = [self._errors, self._authenticate, self._throttle, self._authorize]
        app = web.Application(client_max_size=MAX_BODY, middlewares=middlewares)
        app.router.add_route("*", "/{tail:.*}", self._dispatch)
        return app

    # -- middlewares ----------------------------------------------------------------------------------------
    @web.middleware
    async def _errors(
        self, request: web.Request, handler: Callable[[web.Request], Awaitable[web.StreamResponse]]
    ) -> web.StreamResponse:
        warnings: list[str] = []
        request_warnings.set(warnings)
        try:
            response = await handler(request)
        except errors.ApiError as exc:
            response = _json(exc.to_status(), exc.code)
            retry = (exc.details or {}).get("retryAfterSeconds")
            if isinstance(retry, int):  # as kube-apiserver: the header says what the Status says
                response.headers["Retry-After"] = str(retry)
        except web.HTTPRequestEntityTooLarge:
            exc2 = errors.too_large(MAX_BODY)
            response = _json(exc2.to_status(), 413)
        except (asyncio.CancelledError, ConnectionResetError):
            raise
        except Exception:
            log.exception("internal error serving %s %s", request.method, request.path)
            exc3 = errors.internal("an internal error occurred; see the API server's log")
            response = _json(exc3.to_status(), 500)
        if warnings and not response.prepared:
            for text in warnings:
                response.headers.add("Warning", warning_header(text))
        return response

    @web.middleware
    async def _authenticate(
        self, request: web.Request, handler: Callable[[web.Request], Awaitable[web.StreamResponse]]
    ) -> web.StreamResponse:
        if request.path in PUBLIC_PATHS:
            request[USER] = User("system:anonymous", groups=("system:unauthenticated",))
            return await handler(request)
        header = request.headers.get("Authorization", "")
        scheme, _, token = header.partition(" ")
        token = token.strip()
        if scheme.lower() != "bearer" or not token:
            raise errors.unauthorized()
        if hmac.compare_digest(token.encode(), self.settings.admin_token.encode()):
            request[USER] = ADMIN
        elif (static := find_user(self.settings.static_tokens, token)) is not None:
            request[USER] = User(static.username, static.uid, (*static.groups, "system:authenticated"))
        else:
            result = self.manager.tokens.review(token, [])
            if not isinstance(result, TokenIdentity):
                raise errors.unauthorized()
            request[USER] = User(result.username, result.uid, tuple(result.groups), dict(result.extra))
        return await handler(request)

    @web.middleware
    async def _throttle(
        self, request: web.Request, handler: Callable[[web.Request], Awaitable[web.StreamResponse]]
    ) -> web.StreamResponse:
        """The user's request rate (see :mod:`ambit.apiserver.limits`); public paths are never throttled."""
        if request.path not in PUBLIC_PATHS:
            retry = self.limiter.admit(request[USER], time.monotonic())
            if retry is not None:
                raise errors.too_many_requests("Too many requests, please try again later.", retry)
        return await handler(request)

    @web.middleware
    async def _authorize(
        self, request: web.Request, handler: Callable[[web.Request], Awaitable[web.StreamResponse]]
    ) -> web.StreamResponse:
        """Impersonation, then RBAC on the request's attributes: before anything else is read or written."""
        rbac = self.manager.rbac
        user = request[USER] = rbac.impersonate(request.headers, request.headers.getall, request[USER])
        watch = request.query.get("watch") in ("true", "1")
        fields = request.query.get("fieldSelector", "")
        rbac.authorize(request_attributes(user.username, user.groups, request.method, request.path, watch, fields))
        return await handler(request)

    # -- routing --------------------------------------------------------------------------------------------
    async def _dispatch(self, request: web.Request) -> web.StreamResponse:
        path = request.path.rstrip("/") or "/"
        parts = [p for p in path.split("/") if p]
        method = request.method
        if path in ("/healthz", "/livez", "/readyz"):
            return web.Response(text="ok")
        if path == "/version":
            return _json(discovery.version_info(self.settings.git_version))
        if method == "GET" and parts and parts[0] == "openapi":
            return self._openapi(parts, path)
        if method == "GET" and path == "/api":
            return _json(discovery.api_versions(self.settings.server_address))
        if method == "GET" and path == "/apis":
            return _json(discovery.api_group_list(self.manager.registry))
        if parts and parts[0] == "api" and len(parts) >= 2:
            group, version, rest = "", parts[1], parts[2:]
        elif parts and parts[0] == "apis" and len(parts) >= 2:
            if len(parts) == 2:
                found = discovery.api_group(self.manager.registry, parts[1])
                if found is None or method != "GET":
                    raise errors.no_such_path(path)
                return _json(found)
            group, version, rest = parts[1], parts[2], parts[3:]
        else:
            raise errors.no_such_path(path)
        if not rest:
            doc = discovery.api_resource_list(self.manager.registry, group, version)
            if doc is None or method != "GET":
                raise errors.no_such_path(path)
            return _json(doc)
        target = self._target(group, version, rest, path)
        return await self._serve(request, target)

    def _openapi(self, parts: list[str], path: str) -> web.Response:
        registry = self.manager.registry
        if parts == ["openapi", "v2"]:
            # An empty OpenAPI v2 document (protobuf, zero bytes): kubectl validates `kind: List` files against
            # v2 and, finding no schema for a kind, leaves its validation to the server, which does it.
            return web.Response(body=b"", content_type="application/com.github.proto-openapi.spec.v2.v1.0+protobuf")
        if parts == ["openapi", "v3"]:
            return _json(openapi.root_document(registry))
        if len(parts) == 4 and parts[:3] == ["openapi", "v3", "api"]:
            doc = openapi.group_version_document(registry, "", parts[3])
        elif len(parts) == 5 and parts[:3] == ["openapi", "v3", "apis"]:
            doc = openapi.group_version_document(registry, parts[3], parts[4])
        else:
            doc = None
        if doc is None:
            raise errors.no_such_path(path)
        return _json(doc)

    def _target(self, group: str, version: str, rest: list[str], path: str) -> Target:
        legacy_watch = False
        if rest[0] == "watch":
            legacy_watch = True
            rest = rest[1:]
        namespace, all_namespaces = "", True
        if len(rest) >= 3 and rest[0] == "namespaces" and not (group == "" and rest[2] in ("status", "finalize")):
            namespace, all_namespaces = rest[1], False
            rest = rest[2:]
        if not rest or len(rest) > 3:
            raise errors.no_such_path(path)
        plural = rest[0]
        rtype = self.manager.registry.find_served(group, version, plural)
        if rtype is None:
            raise errors.no_such_path(path)
        name = rest[1] if len(rest) >= 2 else ""
        sub = rest[2] if len(rest) == 3 else ""
        if not rtype.namespaced and not all_namespaces:
            raise errors.no_such_path(path)
        if rtype.namespaced and name and all_namespaces:
            raise errors.no_such_path(path)
        if sub and sub not in rtype.subresources:
            raise errors.no_such_path(path)
        return Target(rtype, version, namespace, all_namespaces and rtype.namespaced, name, sub, legacy_watch)

    async def _serve(self, request: web.Request, t: Target) -> web.StreamResponse:
        q = request.query
        user: User = request[USER]
        m = self.manager
        method = request.method
        dry_run = q.get("dryRun") == "All"
        if t.legacy_watch or (method == "GET" and not t.name and q.get("watch") in ("true", "1")):
            if t.name:
                fields = f"metadata.name={t.name}" + (f",{q['fieldSelector']}" if q.get("fieldSelector") else "")
            else:
                fields = q.get("fieldSelector", "")
            selection = m.selection(
                t.rtype, None if t.all_namespaces else t.namespace, q.get("labelSelector", ""), fields
            )
            return await self._watch(request, t, selection)
        if t.subresource == "scale":
            return await self._scale(request, t, user, dry_run)
        if t.subresource in ("log", "exec", "portforward", "attach") and t.rtype.key == ("", "pods"):
            return await self._pod_stream(request, t)
        if t.subresource == "eviction":
            if method != "POST":
                raise errors.method_not_allowed(f"{method} is not supported on {request.path}")
            body = await _read_body(request)
            return _json(await eviction_rest.evict(m, t.namespace, t.name, body, user, dry_run=dry_run), 201)
        if method == "GET":
            if t.name:
                item = m.get(t.rtype, t.namespace, t.name)
                return self._object_response(request, t, item.obj)
            selection = m.selection(
                t.rtype,
                None if t.all_namespaces else t.namespace,
                q.get("labelSelector", ""),
                q.get("fieldSelector", ""),
            )
            limit = _int_param(q, "limit")
            result = m.list_items(t.rtype, selection, limit=limit, continue_token=q.get("continue", ""))
            return self._list_response(
                request, t, result.items, result.resource_version, result.continue_token, result.remaining
            )
        if method == "POST":
            body = await _read_body(request)
            if t.rtype.key in REVIEWS and not t.name:
                return _json(m.rbac.review(t.rtype, t.namespace, body, user), 201)
            if t.rtype.key == ("authentication.k8s.io", "tokenreviews") and not t.name:
                return _json(m.tokens.token_review(body), 201)
            if t.subresource == "token":
                node = node_of(user.username, user.groups)
                return _json(m.tokens.request(t.namespace, t.name, body, node), 201)
            if t.name or (t.all_namespaces and t.rtype.namespaced):
                raise errors.method_not_allowed(f"POST is not supported on {request.path}")
            obj = await m.create(t.rtype, t.version, t.namespace, body, user, dry_run=dry_run)
            return self._object_response(request, t, obj, 201)
        if method == "PUT" and t.name:
            body = await _read_body(request)
            if t.subresource == "finalize":
                obj = await m.update(t.rtype, t.version, "", t.name, body, user, dry_run=dry_run)
            else:
                obj = await m.update(
                    t.rtype, t.version, t.namespace, t.name, body, user, subresource=t.subresource, dry_run=dry_run
                )
            return self._object_response(request, t, obj)
        if method == "PATCH" and t.name:
            raw = await request.read()
            content_type = request.headers.get("Content-Type", "").split(";")[0].strip()
            obj = await m.patch(
                t.rtype,
                t.version,
                t.namespace,
                t.name,
                content_type,
                raw,
                user,
                subresource=t.subresource,
                dry_run=dry_run,
            )
            return self._object_response(request, t, obj)
        if method == "DELETE":
            raw = await request.read()
            body = _decode_body(raw, request.headers.get("Content-Type", "")) if raw.strip() else None
            options = DeleteOptions.from_body(body, q)
            if t.name:
                obj = await m.delete(t.rtype, t.version, t.namespace, t.name, options, user)
                return self._object_response(request, t, obj)
            selection = m.selection(
                t.rtype,
                None if t.all_namespaces else t.namespace,
                q.get("labelSelector", ""),
                q.get("fieldSelector", ""),
            )
            deleted = []
            for item in m.list_items(t.rtype, selection).items:
                name = item.obj["metadata"]["name"]
                deleted.append(await m.delete(t.rtype, t.version, item.namespace, name, options, user))
            return _json(_list_doc(t, deleted, m.store.resource_version, "", None))
        raise errors.method_not_allowed(f"{method} is not supported on {request.path}")

    async def _pod_stream(self, request: web.Request, t: Target) -> web.StreamResponse:
        """``pods/log`` (GET), ``pods/exec``, ``pods/attach`` and ``pods/portforward`` (GET upgraded to a WebSocket,
        or POST): :mod:`.pod_streams`; each open one counts against its user's bound of pod streams."""
        allowed = ("GET",) if t.subresource == "log" else ("GET", "POST")
        if request.method not in allowed:
            raise errors.method_not_allowed(f"{request.method} is not supported on {request.path}")
        pod = self.manager.get(t.rtype, t.namespace, t.name).obj
        user: User = request[USER]
        if not self.limiter.open_pod_stream(user):
            raise errors.too_many_requests(
                f"too many pod streams: {user.username} has {self.limiter.pod_streams(user)} open, "
                f"the limit is {self.settings.limits.max_pod_streams_per_user}",
                1,
            )
        try:
            if t.subresource == "log":
                return await self.pod_streams.logs(request, pod)
            if t.subresource == "exec":
                return await self.pod_streams.exec(request, pod)
            if t.subresource == "attach":
                return await self.pod_streams.attach(request, pod)
            return await self.pod_streams.port_forward(request, pod)
        finally:
            self.limiter.close_pod_stream(user)

    async def _scale(self, request: web.Request, t: Target, user: User, dry_run: bool) -> web.Response:
        m = self.manager
        if request.method == "GET":
            return _json(scale.read_scale(m, t.rtype, t.namespace, t.name))
        if request.method == "PUT":
            body = await _read_body(request)
            return _json(
                await scale.update_scale(m, t.rtype, t.version, t.namespace, t.name, body, user, dry_run=dry_run)
            )
        if request.method == "PATCH":
            raw = await request.read()
            content_type = request.headers.get("Content-Type", "").split(";", maxsplit=1)[0].strip()
            return _json(
                await scale.patch_scale(
                    m, t.rtype, t.version, t.namespace, t.name, content_type, raw, user, dry_run=dry_run
                )
            )
        raise errors.method_not_allowed(f"{request.method} is not supported on {request.path}")

    # -- responses ------------------------------------------------------------------------------------------
    def _object_response(self, request: web.Request, t: Target, obj: dict[str, Any], code: int = 200) -> web.Response:
        obj = _as_version(obj, t)
        if _wants_table(request):
            return _json(self._table(request, t, [obj], str(obj["metadata"].get("resourceVersion", "")), ""), code)
        return _json(obj, code)

    def _list_response(
        self,
        request: web.Request,
        t: Target,
        items: list[StoredObject],
        rv: int,
        token: str,
        remaining: int | None,
    ) -> web.Response:
        if _wants_table(request):
            objs = [_as_version(i.obj, t) for i in items]
            return _json(self._table(request, t, objs, str(rv), token, remaining))
        meta: dict[str, Any] = {"resourceVersion": str(rv)}
        if token:
            meta["continue"] = token
        if remaining is not None:
            meta["remainingItemCount"] = remaining
        head = encode({"kind": t.rtype.list_kind, "apiVersion": t.rtype.api_version(t.version), "metadata": meta})
        if t.version == t.rtype.storage_version and t.rtype.from_storage is None:
            raws = [i.raw for i in items]
        else:
            raws = [encode(_as_version(i.obj, t)) for i in items]
        body = head[:-1] + b',"items":[' + b",".join(raws) + b"]}"
        return web.Response(body=body, content_type=JSON)

    def _table(
        self,
        request: web.Request,
        t: Target,
        objs: list[dict[str, Any]],
        rv: str,
        token: str,
        remaining: int | None = None,
    ) -> dict[str, Any]:
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

    # -- watch ----------------------------------------------------------------------------------------------
    async def _watch(self, request: web.Request, t: Target, selection: ObjectFilter) -> web.StreamResponse:
        q = request.query
        m = self.manager
        rv_text = q.get("resourceVersion", "")
        send_initial = q.get("sendInitialEvents") == "true"
        bookmarks = q.get("allowWatchBookmarks") in ("true", "1")
        timeout = float(_int_param(q, "timeoutSeconds") or self.settings.default_watch_timeout)
        try:
            start_rv = int(rv_text) if rv_text else 0
        except ValueError:
            raise errors.bad_request(f"resourceVersion {rv_text!r} is not a valid version") from None
        if start_rv > m.store.resource_version:
            # As kube-apiserver: a version from the future means the client saw another server (or state).
            raise errors.ApiError(
                504,
                "Timeout",
                f"Too large resource version: {start_rv}, current: {m.store.resource_version}",
                details={
                    "causes": [{"reason": "ResourceVersionTooLarge", "message": "Too large resource version"}],
                    "retryAfterSeconds": 1,
                },
            )
        user: User = request[USER]
        if not self.limiter.open_watch(user):
            raise errors.too_many_requests(
                f"too many watches: {user.username} has {self.limiter.watches(user)} open, "
                f"the limit is {self.settings.limits.max_watches_per_user}",
                1,
            )
        try:
            settings = WatchSettings(timeout, self.settings.bookmark_interval if bookmarks else None)
            return await self._stream_watch(request, t, selection, start_rv, send_initial, settings)
        finally:
            self.limiter.close_watch(user)

    async def _stream_watch(
        self,
        request: web.Request,
        t: Target,
        selection: ObjectFilter,
        start_rv: int,
        send_initial: bool,
        settings: WatchSettings,
    ) -> web.StreamResponse:
        """Stream one watch; a write that makes no progress within ``watch_send_timeout`` ends it (slow client)."""
        m = self.manager
        response = web.StreamResponse(headers={"Content-Type": JSON, "Transfer-Encoding": "chunked"})
        await response.prepare(request)
        send_timeout = self.settings.limits.watch_send_timeout

        async def write(data: bytes) -> None:
            async with asyncio.timeout(send_timeout):
                await response.write(data)

        wants_table = _wants_table(request)

        same_version = t.version == t.rtype.storage_version and t.rtype.from_storage is None

        def frame(etype: str, item: StoredObject) -> bytes:
            if wants_table:
                obj: Any = self._table(request, t, [_as_version(item.obj, t)], str(item.rv), "")
                return encode({"type": etype, "object": obj}) + b"\n"
            if same_version:  # the stored encoding is what the client gets: no re-encoding per watcher
                return b'{"type":"' + etype.encode() + b'","object":' + item.raw + b"}\n"
            return encode({"type": etype, "object": _as_version(item.obj, t)}) + b"\n"

        async def send(etype: str, obj: dict[str, Any]) -> None:
            await write(encode({"type": etype, "object": obj}) + b"\n")

        if start_rv and start_rv < m.store.horizon and not send_initial:
            expired = errors.gone(f"too old resource version: {start_rv} ({m.store.horizon + 1})")
            await response.write(encode({"type": "ERROR", "object": expired.to_status()}) + b"\n")
            return response
        cursor = WatchCursor.open(
            m.hub,
            m.store,
            t.rtype.key,
            selection,
            start_rv=start_rv,
            send_initial=send_initial,
            list_items=lambda: m.list_items(t.rtype, selection).items,
            settings=settings,
            clock=asyncio.get_running_loop().time,
        )
        try:
            await _write_batched(write, (frame("ADDED", item) for item in cursor.initial))
            if send_initial:
                await send("BOOKMARK", _bookmark(t, cursor.subscribed_rv, initial_end=True))
            await _write_batched(write, (frame(etype, item) for etype, item in cursor.replay))
            while (step := await cursor.next()) is not None:
                if isinstance(step, Bookmark):
                    await send("BOOKMARK", _bookmark(t, step.resource_version))
                else:
                    await _write_batched(write, (frame(etype, item) for etype, item in step.items))
        except ConnectionResetError:
            pass  # the client went away; cancellation is not caught here and reaches aiohttp
        except TimeoutError:
            # The client does not read: drop the connection and what is buffered for it (a clean end would wait
            # for the same full buffer). Its client re-watches or relists, as after kube closes a slow watcher.
            log.info(
                "closing watch of %s on %s: no progress in %gs", request[USER].username, t.rtype.plural, send_timeout
            )
            if request.transport is not None:
                request.transport.abort()
        finally:
            cursor.close()
        return response


async def _write_batched(
    write: Callable[[bytes], Awaitable[None]], frames: Any, limit: int = WATCH_WRITE_BYTES
) -> None:
    """Write frames in writes of about ``limit`` bytes (what one watch holds encoded at a time)."""
    pending: list[bytes] = []
    size = 0
    for chunk in frames:
        pending.append(chunk)
        size += len(chunk)
        if size >= limit:
            await write(b"".join(pending))
            pending, size = [], 0
    if pending:
        await write(b"".join(pending))


def _bookmark(t: Target, rv: int, *, initial_end: bool = False) -> dict[str, Any]:
    meta: dict[str, Any] = {"resourceVersion": str(rv)}
    if initial_end:
        meta["annotations"] = {"k8s.io/initial-events-end": "true"}
    return {"kind": t.rtype.kind, "apiVersion": t.rtype.api_version(t.version), "metadata": meta}


def _as_version(obj: dict[str, Any], t: Target) -> dict[str, Any]:
    if t.rtype.from_storage is not None:
        obj = t.rtype.from_storage(obj)
    wanted = t.rtype.api_version(t.version)
    if obj.get("apiVersion") == wanted:
        return obj
    out = dict(obj)
    out["apiVersion"] = wanted
    return out


def _list_doc(t: Target, objs: list[dict[str, Any]], rv: int, token: str, remaining: int | None) -> dict[str, Any]:
    meta: dict[str, Any] = {"resourceVersion": str(rv)}
    return {
        "kind": t.rtype.list_kind,
        "apiVersion": t.rtype.api_version(t.version),
        "metadata": meta,
        "items": [_as_version(o, t) for o in objs],
    }


def _wants_table(request: web.Request) -> bool:
    accept = request.headers.get("Accept", "")
    return TABLE_MARK in accept and "g=meta.k8s.io" in accept


def _json(doc: Any, code: int = 200) -> web.Response:
    return web.Response(body=encode(doc), status=code, content_type=JSON)


def _int_param(q: Any, name: str) -> int:
    text = q.get(name)
    if text in (None, ""):
        return 0
    try:
        value = int(text)
    except ValueError:
        raise errors.bad_request(f"{name} must be an integer, not {text!r}") from None
    if value < 0:
        raise errors.bad_request(f"{name} must not be negative")
    return value


async def _read_body(request: web.Request) -> Any:
    try:
        raw = await request.read()
    except ConnectionResetError:  # the client went away mid-body: nothing to store, nobody to answer
        raise errors.bad_request("the connection was lost while the request body was being read") from None
    return _decode_body(raw, request.headers.get("Content-Type", ""))


def _decode_body(raw: bytes, content_type: str) -> Any:
    doc = _decode_any(raw, content_type)
    check_depth(doc, "the request body")
    return doc


def _decode_any(raw: bytes, content_type: str) -> Any:
    if not raw.strip():
        raise errors.bad_request("the request body is empty")
    kind = content_type.split(";", maxsplit=1)[0].strip().lower()
    if kind == protobuf.CONTENT_TYPE:
        return protobuf.decode_protobuf_body(raw)
    if "yaml" in kind:
        try:
            return untrusted_yaml.load(raw)
        except untrusted_yaml.YamlAliasError as exc:
            mark = exc.problem_mark
            where = f" (line {mark.line + 1}, column {mark.column + 1})" if mark is not None else ""
            raise errors.bad_request(f"{untrusted_yaml.ALIAS_PROBLEM}{where}") from None
        except yaml.YAMLError as exc:
            raise errors.bad_request(f"the request body is not valid YAML: {exc}") from None
    if kind and kind not in (JSON, "*/*") and not kind.endswith("+json"):
        raise errors.unsupported_media_type(content_type)
    try:
        return decode(raw)
    except Exception as exc:
        raise errors.bad_request(f"the request body is not valid JSON: {exc}") from None


def warning_header(text: str) -> str:
    """An RFC 7234 warning as kube-apiserver writes it: code 299, no agent, the text a quoted-string (backslash
    before ``\\`` and ``"``; a newline, which a header cannot hold, becomes a space). kubectl prints the text."""
    quoted = text.replace("\\", "\\\\").replace('"', '\\"').replace("\r", " ").replace("\n", " ")
    return f'299 - "{quoted}"'
