"""The Kubernetes REST client: verbs on any resource kind, objects as plain dicts.

Every request goes through :meth:`KubeClient._request`, the one place where httpx exceptions become
:class:`KubeClientError` and error answers become :class:`KubeApiStatusError` subclasses. Bodies are encoded and
decoded with msgspec.

Namespaces: for get, create, replace, patch and delete of a namespaced kind, ``namespace=None`` means the object's
own ``metadata.namespace`` (create and replace), else the client's default namespace (the kubeconfig context's, or
the pod's); for list and watch it means all namespaces. Passing a namespace for a cluster-scoped kind is a
``ValueError``.

List items from kube-apiserver carry no ``apiVersion``/``kind``; the client fills both in, so every object a
caller sees has them.
"""

from __future__ import annotations

import asyncio
import logging
import os
import time
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path
from types import TracebackType
from typing import Any, Literal

import httpx2 as httpx
import msgspec

from ambit.k8s import connection
from ambit.k8s.connection import Connection
from ambit.k8s.errors import KubeApiStatusError, KubeClientError, KubeGoneError, response_error
from ambit.k8s.kinds import PODS, SERVICE_ACCOUNTS, TOKEN_REVIEWS, ResourceKind
from ambit.k8s.sockets import TrackedSockets, tracked_transport
from ambit.k8s.throttle import RequestBudget, retry_after
from ambit.k8s.watch import Watch

log = logging.getLogger("ambit.k8s")

PatchType = Literal["merge", "json", "strategic"]
Selector = str | Mapping[str, str] | None
"""A selector string (``app=web,tier!=db``) or a mapping of labels that must all be equal."""

_PATCH_CONTENT_TYPES: dict[str, str] = {
    "merge": "application/merge-patch+json",
    "json": "application/json-patch+json",
    "strategic": "application/strategic-merge-patch+json",
}
_JSON = "application/json"
_encode = msgspec.json.Encoder().encode
_decode = msgspec.json.Decoder().decode


@dataclass(frozen=True, slots=True)
class KubeClientSettings:
    """Transport knobs; the defaults suit both the embedded server and a real cluster."""

    timeout: float = 10.0
    """Seconds to connect, and to wait for any response that is not a watch."""
    trust_env: bool = True
    """Honour ``HTTPS_PROXY``/``NO_PROXY`` as kubectl does."""
    user_agent: str = "ambit/0.1"
    max_keepalive_connections: int = 20
    """Idle connections kept for reuse; open connections are unbounded because every watch holds one."""
    qps: float | None = None
    """Requests per second this client sends at most, on average (client-go's QPS; :mod:`ambit.k8s.throttle`
    rule 1); None: no budget. Watches are not counted."""
    burst: int = 1
    """Requests sent at once after being idle (client-go's Burst); only with ``qps``."""
    max_retries: int = 10
    """Times a request refused with 429 and Retry-After is sent again (client-go's; throttle rule 2)."""


class KubeClient:
    """Async client for one API server; ``async with`` it, or call ``aclose()``."""

    def __init__(
        self,
        conn: Connection,
        settings: KubeClientSettings | None = None,
        *,
        transport: httpx.AsyncBaseTransport | None = None,
    ) -> None:
        self.settings = settings or KubeClientSettings()
        self._budget = (
            RequestBudget(self.settings.qps, max(1, self.settings.burst)) if self.settings.qps is not None else None
        )
        self.throttled = 0.0
        """Seconds requests waited for the budget or a server's Retry-After (for tests and metrics)."""
        self.connection = conn
        self.namespace = conn.namespace
        """Default namespace of calls that name none."""
        limits = httpx.Limits(max_connections=None, max_keepalive_connections=self.settings.max_keepalive_connections)
        self._sockets: TrackedSockets | None = None
        if transport is None:
            transport, self._sockets = tracked_transport(
                verify=conn.verify, limits=limits, trust_env=self.settings.trust_env
            )
        self._http = httpx.AsyncClient(
            base_url=conn.server,
            verify=conn.verify,
            auth=conn.auth,
            timeout=httpx.Timeout(self.settings.timeout),
            trust_env=self.settings.trust_env,
            headers={"User-Agent": self.settings.user_agent, "Accept": _JSON},
            limits=limits,
            transport=transport,
        )

    # -- construction ---------------------------------------------------------------------------------------
    @classmethod
    def from_kubeconfig(
        cls, path: str | os.PathLike[str], context: str | None = None, settings: KubeClientSettings | None = None
    ) -> KubeClient:
        trust_env = (settings or KubeClientSettings()).trust_env
        return cls(connection.load_kubeconfig(path, context, trust_env=trust_env), settings)

    @classmethod
    def in_cluster(
        cls,
        service_account_dir: Path = connection.SERVICE_ACCOUNT_DIR,
        *,
        environ: Mapping[str, str] | None = None,
        settings: KubeClientSettings | None = None,
    ) -> KubeClient:
        return cls(connection.load_in_cluster(service_account_dir, environ=environ), settings)

    @classmethod
    def from_env(cls, settings: KubeClientSettings | None = None) -> KubeClient:
        """``$KUBECONFIG``, then ``~/.kube/config``, then the in-cluster service account."""
        trust_env = (settings or KubeClientSettings()).trust_env
        return cls(connection.load_from_env(trust_env=trust_env), settings)

    async def aclose(self) -> None:
        await self._http.aclose()
        if self._sockets is not None:
            await self._sockets.aclose()  # what the pool lost track of (see ambit.k8s.sockets)

    async def __aenter__(self) -> KubeClient:
        return self

    async def __aexit__(
        self, exc_type: type[BaseException] | None, exc: BaseException | None, tb: TracebackType | None
    ) -> None:
        await self.aclose()

    # -- reads ----------------------------------------------------------------------------------------------
    async def get(self, kind: ResourceKind, name: str, namespace: str | None = None) -> dict[str, Any]:
        obj = await self._request("GET", kind.path(self._scope(kind, namespace), name))
        return _typed(obj, kind)

    async def list(
        self,
        kind: ResourceKind,
        namespace: str | None = None,
        label_selector: Selector = None,
        field_selector: Selector = None,
        limit: int | None = None,
        transform: Callable[[dict[str, Any]], dict[str, Any]] | None = None,
    ) -> tuple[list[dict[str, Any]], str]:
        """All matching objects and the list's resourceVersion (to watch from); ``limit`` is the page size;
        ``transform`` (when given) is applied to each object as its page arrives, so that only what it keeps of the
        earlier pages is held while the later ones are read.

        Pages are fetched with ``continue`` tokens. If a token expires mid-way (410), the list starts over in
        one piece, as client-go's pager does, so the result is always one consistent snapshot.
        """
        path = kind.path(_collection_scope(kind, namespace))
        params = _params(labelSelector=_selector(label_selector), fieldSelector=_selector(field_selector))
        items: list[dict[str, Any]] = []
        version = ""
        token = ""
        while True:
            page_params = dict(params)
            if limit:
                page_params["limit"] = str(limit)
            if token:
                page_params["continue"] = token
            try:
                page = await self._request("GET", path, params=page_params)
            except KubeGoneError:
                if not token:
                    raise
                log.info("list %s: continue token expired; listing again in one request", kind)
                items, token, limit = [], "", None
                continue
            meta = page.get("metadata") or {}
            if not token:
                version = str(meta.get("resourceVersion") or "")
            page_items = page.get("items") or ()
            if transform is not None:
                for item in page_items:
                    _typed(item, kind)
                page_items = [transform(item) for item in page_items]
            items.extend(page_items)
            token = str(meta.get("continue") or "")
            if not token:
                break
        if transform is None:
            for item in items:
                _typed(item, kind)
        return items, version

    async def probe(self, kind: ResourceKind) -> None:
        """Whether the API server serves ``kind`` to us: one request for at most one object, whatever the collection
        holds (a list with ``limit`` follows every page); :class:`KubeNotFoundError` when the kind is not served,
        :class:`KubeForbiddenError` when we may not list it, like :meth:`list`."""
        await self._request("GET", kind.path(_collection_scope(kind, None)), params={"limit": "1"})

    def watch(
        self,
        kind: ResourceKind,
        namespace: str | None = None,
        *,
        resource_version: str | None = None,
        label_selector: Selector = None,
        field_selector: Selector = None,
        timeout_seconds: int | None = None,
        allow_bookmarks: bool = True,
    ) -> Watch:
        """Changes after ``resource_version`` (None or "": the current state as ADDED events, then changes).

        Returns at once; the request is sent when iteration starts. Use ``async with`` (or ``aclose()``) if you
        may stop before the stream ends. The stream ends by itself after ``timeout_seconds``.
        """
        path = kind.path(_collection_scope(kind, namespace))
        params = _params(
            watch="true",
            resourceVersion=resource_version or None,
            labelSelector=_selector(label_selector),
            fieldSelector=_selector(field_selector),
            timeoutSeconds=str(timeout_seconds) if timeout_seconds else None,
            allowWatchBookmarks="true" if allow_bookmarks else None,
        )
        # Without a read deadline a silently dead peer would hang the watch forever; with timeoutSeconds the
        # server ends the stream itself, so waiting longer than that (plus slack) means the peer is gone.
        read = float(timeout_seconds) + self.settings.timeout if timeout_seconds else None
        request = self._http.build_request(
            "GET", path, params=params, timeout=httpx.Timeout(self.settings.timeout, read=read)
        )
        return Watch(self._http, kind, request, resource_version or "")

    # -- writes ---------------------------------------------------------------------------------------------
    async def create(self, kind: ResourceKind, obj: Mapping[str, Any], namespace: str | None = None) -> dict[str, Any]:
        body = _with_type(obj, kind)
        created = await self._request("POST", kind.path(self._scope(kind, namespace, obj)), body=body)
        return _typed(created, kind)

    async def replace(
        self,
        kind: ResourceKind,
        obj: Mapping[str, Any],
        namespace: str | None = None,
        subresource: str | None = None,
    ) -> dict[str, Any]:
        """PUT the whole object; its ``metadata.resourceVersion``, when set, must be current (else 409)."""
        name = _name_of(obj)
        body = _with_type(obj, kind)
        path = kind.path(self._scope(kind, namespace, obj), name, subresource)
        return _typed(await self._request("PUT", path, body=body), kind)

    async def patch(
        self,
        kind: ResourceKind,
        name: str,
        patch: Any,
        namespace: str | None = None,
        patch_type: PatchType = "merge",
        subresource: str | None = None,
    ) -> dict[str, Any]:
        """Patch ``name``: a merge or strategic patch is a dict, a JSON patch a list of operations."""
        content_type = _PATCH_CONTENT_TYPES.get(patch_type)
        if content_type is None:
            raise ValueError(f"unknown patch type {patch_type!r}; expected one of {sorted(_PATCH_CONTENT_TYPES)}")
        path = kind.path(self._scope(kind, namespace), name, subresource)
        return _typed(await self._request("PATCH", path, body=patch, content_type=content_type), kind)

    async def patch_status(
        self,
        kind: ResourceKind,
        name: str,
        patch: Any,
        namespace: str | None = None,
        patch_type: PatchType = "merge",
    ) -> dict[str, Any]:
        return await self.patch(kind, name, patch, namespace, patch_type, subresource="status")

    async def delete(
        self,
        kind: ResourceKind,
        name: str,
        namespace: str | None = None,
        grace_period_seconds: int | None = None,
        propagation_policy: Literal["Background", "Foreground", "Orphan"] | None = None,
        uid: str | None = None,
    ) -> dict[str, Any]:
        """Delete ``name`` (only if its uid is ``uid``, when given: else 409); returns what the server answers (the
        object, perhaps marked for deletion, or a Status)."""
        options: dict[str, Any] = {"kind": "DeleteOptions", "apiVersion": "v1"}
        if uid is not None:
            options["preconditions"] = {"uid": uid}
        if grace_period_seconds is not None:
            options["gracePeriodSeconds"] = grace_period_seconds
        if propagation_policy is not None:
            options["propagationPolicy"] = propagation_policy
        return await self._request("DELETE", kind.path(self._scope(kind, namespace), name), body=options)

    async def evict(self, name: str, namespace: str, grace_period_seconds: int | None = None) -> dict[str, Any]:
        """Evict a pod (``policy/v1`` Eviction): the API server deletes it unless that would violate its
        PodDisruptionBudget, which is a ``429`` whose causes name the budget."""
        body: dict[str, Any] = {
            "apiVersion": "policy/v1",
            "kind": "Eviction",
            "metadata": {"name": name, "namespace": namespace},
        }
        if grace_period_seconds is not None:
            body["deleteOptions"] = {"gracePeriodSeconds": grace_period_seconds}
        return await self._request("POST", PODS.path(namespace, name, "eviction"), body=body)

    async def serves(self, kind: ResourceKind) -> bool:
        """Whether the server serves ``kind`` (API discovery of its group version, as kubectl looks up a kind)."""
        try:
            doc = await self._request("GET", kind.group_path)
        except KubeApiStatusError as exc:
            if exc.is_not_found:
                return False
            raise
        resources = doc.get("resources")
        if not isinstance(resources, list):
            return False
        return any(isinstance(r, dict) and r.get("name") == kind.plural for r in resources)

    # -- authentication -------------------------------------------------------------------------------------
    async def create_token(
        self,
        namespace: str,
        service_account: str,
        audiences: Sequence[str],
        expiration_seconds: int = 3600,
        bound_pod: Mapping[str, Any] | None = None,
    ) -> dict[str, Any]:
        """A TokenRequest for the service account; the token is ``result["status"]["token"]``.

        ``bound_pod`` (a Pod object) binds the token to that pod: it stops validating once the pod is gone.
        """
        spec: dict[str, Any] = {"audiences": list(audiences), "expirationSeconds": expiration_seconds}
        if bound_pod is not None:
            meta = bound_pod.get("metadata") or {}
            spec["boundObjectRef"] = {"kind": "Pod", "apiVersion": "v1", "name": meta.get("name")}
            if meta.get("uid"):
                spec["boundObjectRef"]["uid"] = meta["uid"]
        body = {"kind": "TokenRequest", "apiVersion": "authentication.k8s.io/v1", "spec": spec}
        path = SERVICE_ACCOUNTS.path(namespace, service_account, "token")
        return await self._request("POST", path, body=body)

    async def token_review(self, token: str, audiences: Sequence[str] | None = None) -> dict[str, Any]:
        """A TokenReview: ``result["status"]["authenticated"]`` and ``["user"]`` say who the token is."""
        spec: dict[str, Any] = {"token": token}
        if audiences:
            spec["audiences"] = list(audiences)
        body = {"kind": "TokenReview", "apiVersion": "authentication.k8s.io/v1", "spec": spec}
        return await self._request("POST", TOKEN_REVIEWS.path(), body=body)

    # -- the boundary ---------------------------------------------------------------------------------------
    async def _request(
        self,
        method: str,
        path: str,
        *,
        params: Mapping[str, str] | None = None,
        body: Any = None,
        content_type: str = _JSON,
    ) -> dict[str, Any]:
        if self._http.is_closed:
            raise KubeClientError(f"{method} {path}: the API client is closed")
        content = None if body is None else _encode(body)
        headers = None if content is None else {"Content-Type": content_type}
        retries = 0
        while True:
            await self._wait_for_budget()
            try:
                response = await self._http.request(method, path, params=params, content=content, headers=headers)
            except httpx.HTTPError as exc:
                raise KubeClientError(f"{method} {path}: {exc!r}") from exc
            if response.status_code != 429 or retries >= self.settings.max_retries:
                break
            wait = retry_after(response.headers.get("Retry-After"))
            if wait is None:
                break
            retries += 1
            log.debug("%s %s: 429, again in %.1f s (retry %d)", method, path, wait, retries)
            await self._sleep(wait)
        data = response.content
        if response.status_code >= 300:
            raise response_error(response.status_code, response.reason_phrase, data)
        try:
            doc = _decode(data)
        except msgspec.DecodeError as exc:
            raise KubeClientError(f"{method} {path}: the response is not JSON: {exc}") from exc
        if not isinstance(doc, dict):
            raise KubeClientError(f"{method} {path}: the response is not a JSON object")
        return doc

    async def _wait_for_budget(self) -> None:
        if self._budget is not None:
            wait = self._budget.reserve(time.monotonic())
            if wait > 0:
                await self._sleep(wait)

    async def _sleep(self, seconds: float) -> None:
        self.throttled += seconds
        await asyncio.sleep(seconds)

    def _scope(self, kind: ResourceKind, namespace: str | None, obj: Mapping[str, Any] | None = None) -> str | None:
        """The namespace a single-object call addresses (None for cluster-scoped kinds)."""
        if not kind.namespaced:
            return _collection_scope(kind, namespace)
        own = (obj.get("metadata") or {}).get("namespace") if obj is not None else None
        if namespace and own and own != namespace:
            raise ValueError(f"the object is in namespace {own!r}, not {namespace!r}")
        return namespace or own or self.namespace


def _collection_scope(kind: ResourceKind, namespace: str | None) -> str | None:
    """The namespace of a list or watch: None is all namespaces (or a cluster-scoped kind)."""
    if namespace and not kind.namespaced:
        raise ValueError(f"{kind} are cluster-scoped: no namespace ({namespace!r}) applies")
    return namespace or None


def _params(**values: str | None) -> dict[str, str]:
    return {k: v for k, v in values.items() if v}


def _selector(selector: Selector) -> str | None:
    if selector is None or isinstance(selector, str):
        return selector or None
    return ",".join(f"{k}={v}" for k, v in selector.items()) or None


def _name_of(obj: Mapping[str, Any]) -> str:
    name = (obj.get("metadata") or {}).get("name")
    if not isinstance(name, str) or not name:
        raise ValueError("the object has no metadata.name")
    return name


def _with_type(obj: Mapping[str, Any], kind: ResourceKind) -> dict[str, Any]:
    body = dict(obj)
    body.setdefault("apiVersion", kind.api_version)
    body.setdefault("kind", kind.kind)
    return body


def _typed(obj: dict[str, Any], kind: ResourceKind) -> dict[str, Any]:
    obj.setdefault("apiVersion", kind.api_version)
    obj.setdefault("kind", kind.kind)
    return obj
