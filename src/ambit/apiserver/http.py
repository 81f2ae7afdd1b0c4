"""The HTTP shell: Kubernetes REST paths onto :class:`ResourceManager`, JSON in and out, chunked watches.

Paths: ``/api/v1/...`` (core) and ``/apis/<group>/<version>/...``, then
``[namespaces/<ns>/]<plural>[/<name>[/<subresource>]]``; the legacy ``watch/`` prefix is accepted too. ``pods/log``,
``pods/exec``, ``pods/attach`` and ``pods/portforward`` go to the pod's node's kubelet
(:mod:`ambit.apiserver.pod_streams`). Every error leaves as a ``Status``; an exception that is not an
:class:`ApiError` is our bug, logged and answered with 500.

This module holds the middlewares (errors, authentication, throttling, authorization, in that order) and the
routing from a path to a verb. Bodies are read by :mod:`ambit.apiserver.http_bodies`, responses are shaped by
:mod:`ambit.apiserver.http_responses` (with the :class:`~ambit.apiserver.http_responses.Target` a path names) and
watches are streamed by :mod:`ambit.apiserver.http_watch`.
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

from aiohttp import web

from ambit.apiserver import discovery, errors, eviction_rest, openapi, scale
from ambit.apiserver.authorizer import REVIEWS
from ambit.apiserver.http_bodies import MAX_BODY, decode_body, int_param, read_body
from ambit.apiserver.http_responses import Target, json_response, list_doc, list_response, object_response
from ambit.apiserver.http_watch import WatchServer
from ambit.apiserver.limits import LimitSettings, UserLimiter
from ambit.apiserver.node_authorizer import node_of
from ambit.apiserver.pod_streams import PodStreams
from ambit.apiserver.rbac_policy import request_attributes
from ambit.apiserver.requests import DeleteOptions, User, request_warnings
from ambit.apiserver.token_file import StaticUser, find_user
from ambit.apiserver.tokens import TokenIdentity
from ambit.apiserver.verbs import ResourceManager

log = logging.getLogger("ambit.apiserver")

ADMIN = User("kubernetes-admin", groups=("system:masters", "system:authenticated"))
PUBLIC_PATHS = frozenset({"/version", "/healthz", "/livez", "/readyz"})
USER = web.RequestKey("user", User)
"""The authenticated user of a request (a typed key: aiohttp warns about string keys)."""


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
        self.watch_server = WatchServer(
            manager,
            self.limiter,
            settings.limits,
            default_timeout=settings.default_watch_timeout,
            bookmark_interval=settings.bookmark_interval,
        )

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
            response = json_response(exc.to_status(), exc.code)
            retry = (exc.details or {}).get("retryAfterSeconds")
            if isinstance(retry, int):  # as kube-apiserver: the header says what the Status says
                response.headers["Retry-After"] = str(retry)
        except web.HTTPRequestEntityTooLarge:
            exc2 = errors.too_large(MAX_BODY)
            response = json_response(exc2.to_status(), 413)
        except (asyncio.CancelledError, ConnectionResetError):
            raise
        except Exception:
            log.exception("internal error serving %s %s", request.method, request.path)
            exc3 = errors.internal("an internal error occurred; see the API server's log")
            response = json_response(exc3.to_status(), 500)
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
            return json_response(discovery.version_info(self.settings.git_version))
        if method == "GET" and parts and parts[0] == "openapi":
            return self._openapi(parts, path)
        if method == "GET" and path == "/api":
            return json_response(discovery.api_versions(self.settings.server_address))
        if method == "GET" and path == "/apis":
            return json_response(discovery.api_group_list(self.manager.registry))
        if parts and parts[0] == "api" and len(parts) >= 2:
            group, version, rest = "", parts[1], parts[2:]
        elif parts and parts[0] == "apis" and len(parts) >= 2:
            if len(parts) == 2:
                found = discovery.api_group(self.manager.registry, parts[1])
                if found is None or method != "GET":
                    raise errors.no_such_path(path)
                return json_response(found)
            group, version, rest = parts[1], parts[2], parts[3:]
        else:
            raise errors.no_such_path(path)
        if not rest:
            doc = discovery.api_resource_list(self.manager.registry, group, version)
            if doc is None or method != "GET":
                raise errors.no_such_path(path)
            return json_response(doc)
        target = self._target(group, version, rest, path)
        return await self._serve(request, target)

    def _openapi(self, parts: list[str], path: str) -> web.Response:
        registry = self.manager.registry
        if parts == ["openapi", "v2"]:
            # An empty OpenAPI v2 document (protobuf, zero bytes): kubectl validates `kind: List` files against
            # v2 and, finding no schema for a kind, leaves its validation to the server, which does it.
            return web.Response(body=b"", content_type="application/com.github.proto-openapi.spec.v2.v1.0+protobuf")
        if parts == ["openapi", "v3"]:
            return json_response(openapi.root_document(registry))
        if len(parts) == 4 and parts[:3] == ["openapi", "v3", "api"]:
            doc = openapi.group_version_document(registry, "", parts[3])
        elif len(parts) == 5 and parts[:3] == ["openapi", "v3", "apis"]:
            doc = openapi.group_version_document(registry, parts[3], parts[4])
        else:
            doc = None
        if doc is None:
            raise errors.no_such_path(path)
        return json_response(doc)

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
            return await self.watch_server.serve(request, t, selection, user)
        if t.subresource == "scale":
            return await self._scale(request, t, user, dry_run)
        if t.subresource in ("log", "exec", "portforward", "attach") and t.rtype.key == ("", "pods"):
            return await self._pod_stream(request, t)
        if t.subresource == "eviction":
            if method != "POST":
                raise errors.method_not_allowed(f"{method} is not supported on {request.path}")
            body = await read_body(request)
            return json_response(await eviction_rest.evict(m, t.namespace, t.name, body, user, dry_run=dry_run), 201)
        if method == "GET":
            if t.name:
                item = m.get(t.rtype, t.namespace, t.name)
                return object_response(request, t, item.obj)
            selection = m.selection(
                t.rtype,
                None if t.all_namespaces else t.namespace,
                q.get("labelSelector", ""),
                q.get("fieldSelector", ""),
            )
            limit = int_param(q, "limit")
            result = m.list_items(t.rtype, selection, limit=limit, continue_token=q.get("continue", ""))
            return list_response(
                request, t, result.items, result.resource_version, result.continue_token, result.remaining
            )
        if method == "POST":
            body = await read_body(request)
            if t.rtype.key in REVIEWS and not t.name:
                return json_response(m.rbac.review(t.rtype, t.namespace, body, user), 201)
            if t.rtype.key == ("authentication.k8s.io", "tokenreviews") and not t.name:
                return json_response(m.tokens.token_review(body), 201)
            if t.subresource == "token":
                node = node_of(user.username, user.groups)
                return json_response(m.tokens.request(t.namespace, t.name, body, node), 201)
            if t.name or (t.all_namespaces and t.rtype.namespaced):
                raise errors.method_not_allowed(f"POST is not supported on {request.path}")
            obj = await m.create(t.rtype, t.version, t.namespace, body, user, dry_run=dry_run)
            return object_response(request, t, obj, 201)
        if method == "PUT" and t.name:
            body = await read_body(request)
            if t.subresource == "finalize":
                obj = await m.update(t.rtype, t.version, "", t.name, body, user, dry_run=dry_run)
            else:
                obj = await m.update(
                    t.rtype, t.version, t.namespace, t.name, body, user, subresource=t.subresource, dry_run=dry_run
                )
            return object_response(request, t, obj)
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
            return object_response(request, t, obj)
        if method == "DELETE":
            raw = await request.read()
            body = decode_body(raw, request.headers.get("Content-Type", "")) if raw.strip() else None
            options = DeleteOptions.from_body(body, q)
            if t.name:
                obj = await m.delete(t.rtype, t.version, t.namespace, t.name, options, user)
                return object_response(request, t, obj)
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
            return json_response(list_doc(t, deleted, m.store.resource_version, "", None))
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
            return json_response(scale.read_scale(m, t.rtype, t.namespace, t.name))
        if request.method == "PUT":
            body = await read_body(request)
            return json_response(
                await scale.update_scale(m, t.rtype, t.version, t.namespace, t.name, body, user, dry_run=dry_run)
            )
        if request.method == "PATCH":
            raw = await request.read()
            content_type = request.headers.get("Content-Type", "").split(";", maxsplit=1)[0].strip()
            return json_response(
                await scale.patch_scale(
                    m, t.rtype, t.version, t.namespace, t.name, content_type, raw, user, dry_run=dry_run
                )
            )
        raise errors.method_not_allowed(f"{request.method} is not supported on {request.path}")


def warning_header(text: str) -> str:
    """An RFC 7234 warning as kube-apiserver writes it: code 299, no agent, the text a quoted-string (backslash
    before ``\\`` and ``"``; a newline, which a header cannot hold, becomes a space). kubectl prints the text."""
    quoted = text.replace("\\", "\\\\").replace('"', '\\"').replace("\r", " ").replace("\n", " ")
    return f'299 - "{quoted}"'
