"""A small HTTP client for the API server tests (:class:`ApiClient`) and the objects they create.

It speaks to a real server over TLS, trusting only the CA in the server's kubeconfig, with a bearer token; it
never raises on an HTTP error code, so tests can look at every ``Status`` the server answers with.
"""

from __future__ import annotations

import asyncio
import base64
import io
import ssl
from collections.abc import AsyncIterator
from contextlib import asynccontextmanager
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import aiohttp
import msgspec
import yaml

from ambit.apiserver.server import ApiServer

JsonObject = dict[str, Any]


CRDS = "/apis/apiextensions.k8s.io/v1/customresourcedefinitions"


WIDGETS = "/apis/example.com/v1/namespaces/default/widgets"


@dataclass(frozen=True)
class Reply:
    """One HTTP answer: its code and its body, decoded from JSON when it is JSON."""

    status: int
    body: Any
    content_type: str

    @property
    def rv(self) -> int:
        return int(self.body["metadata"]["resourceVersion"])

    def names(self) -> list[str]:
        return [item["metadata"]["name"] for item in self.body["items"]]


def ssl_context_from_kubeconfig(path: Path) -> ssl.SSLContext:
    config = yaml.safe_load(path.read_text())
    ca_pem = base64.b64decode(config["clusters"][0]["cluster"]["certificate-authority-data"]).decode()
    return ssl.create_default_context(cadata=ca_pem)


class WatchStream:
    """The events of one open watch, one JSON document a line."""

    def __init__(self, response: aiohttp.ClientResponse) -> None:
        self.response = response

    async def next(self, within: float = 5.0) -> JsonObject | None:
        """The next event, or None when the server ended the stream."""
        line = await asyncio.wait_for(self.response.content.readline(), within)
        if not line:
            return None
        event: JsonObject = msgspec.json.decode(line)
        return event

    async def take(self, count: int, within: float = 5.0) -> list[JsonObject]:
        events: list[JsonObject] = []
        for _ in range(count):
            event = await self.next(within)
            assert event is not None, f"the watch ended after {events}"
            events.append(event)
        return events

    async def rest(self, within: float = 5.0) -> list[JsonObject]:
        """Every event until the server ends the stream."""
        events: list[JsonObject] = []
        while (event := await self.next(within)) is not None:
            events.append(event)
        return events


class ApiClient:
    """Requests to one server as one bearer token; ``token=""`` sends no Authorization header."""

    def __init__(self, url: str, context: ssl.SSLContext, token: str) -> None:
        self.url = url
        self.token = token
        self._session = aiohttp.ClientSession(connector=aiohttp.TCPConnector(ssl=context))

    @classmethod
    def for_server(cls, server: ApiServer, token: str | None = None) -> ApiClient:
        return cls(
            server.url, ssl_context_from_kubeconfig(server.kubeconfig), server.admin_token if token is None else token
        )

    async def aclose(self) -> None:
        await self._session.close()

    async def __aenter__(self) -> ApiClient:
        return self

    async def __aexit__(self, *exc: object) -> None:
        await self.aclose()

    def _headers(self, content_type: str | None, token: str | None) -> dict[str, str]:
        headers = {"Accept": "application/json"}
        token = self.token if token is None else token
        if token:
            headers["Authorization"] = f"Bearer {token}"
        if content_type:
            headers["Content-Type"] = content_type
        return headers

    async def request(
        self,
        method: str,
        path: str,
        body: Any = None,
        *,
        data: bytes | None = None,
        content_type: str | None = None,
        params: dict[str, str] | None = None,
        token: str | None = None,
        headers: dict[str, str] | None = None,
    ) -> Reply:
        if body is not None:
            data = msgspec.json.encode(body)
            content_type = content_type or "application/json"
        payload = io.BytesIO(data) if data is not None else None  # aiohttp warns about large raw bytes
        async with self._session.request(
            method,
            self.url + path,
            data=payload,
            params=params,
            headers=self._headers(content_type, token) | (headers or {}),
        ) as response:
            raw = await response.read()
            kind = response.headers.get("Content-Type", "").split(";")[0]
            decoded: Any = msgspec.json.decode(raw) if kind == "application/json" and raw else raw.decode()
            return Reply(response.status, decoded, kind)

    async def get(self, path: str, **params: str) -> Reply:
        return await self.request("GET", path, params=params)

    async def post(self, path: str, body: Any, **params: str) -> Reply:
        return await self.request("POST", path, body, params=params)

    async def put(self, path: str, body: Any, **params: str) -> Reply:
        return await self.request("PUT", path, body, params=params)

    async def patch(self, path: str, body: Any, content_type: str = "application/merge-patch+json") -> Reply:
        return await self.request("PATCH", path, body, content_type=content_type)

    async def delete(self, path: str, body: Any = None, **params: str) -> Reply:
        return await self.request("DELETE", path, body, params=params)

    async def create(self, path: str, body: Any) -> JsonObject:
        """POST that must succeed; returns the stored object."""
        reply = await self.post(path, body)
        assert reply.status == 201, reply.body
        created: JsonObject = reply.body
        return created

    async def must_get(self, path: str) -> JsonObject:
        reply = await self.get(path)
        assert reply.status == 200, reply.body
        found: JsonObject = reply.body
        return found

    async def exists(self, path: str) -> bool:
        reply = await self.get(path)
        assert reply.status in (200, 404), reply.body
        return reply.status == 200

    @asynccontextmanager
    async def watch(self, path: str, **params: str) -> AsyncIterator[WatchStream]:
        params = {"watch": "true", **params}
        async with self._session.get(
            self.url + path, params=params, headers=self._headers(None, None), timeout=aiohttp.ClientTimeout(total=30)
        ) as response:
            assert response.status == 200, await response.text()
            yield WatchStream(response)


def assert_status(reply: Reply, code: int, reason: str | None = None, message: str | None = None) -> JsonObject:
    """``reply`` is a failure ``Status`` with this code (and reason, and a message containing ``message``)."""
    body = reply.body
    assert reply.status == code, (reply.status, body)
    assert isinstance(body, dict), body
    assert body.get("kind") == "Status", body
    assert body.get("apiVersion") == "v1", body
    assert body.get("status") == "Failure", body
    assert body.get("code") == code, body
    if reason is not None:
        assert body.get("reason") == reason, body
    if message is not None:
        assert message in body.get("message", ""), body
    return body


def configmap(name: str, namespace: str = "default", **meta: Any) -> JsonObject:
    return {
        "apiVersion": "v1",
        "kind": "ConfigMap",
        "metadata": {"name": name, "namespace": namespace, **meta},
        "data": {"key": "value"},
    }


def pod(name: str, namespace: str = "default", *, node: str = "", **meta: Any) -> JsonObject:
    spec: JsonObject = {"containers": [{"name": "app", "image": "example.com/app:1"}]}
    if node:
        spec["nodeName"] = node
    return {"apiVersion": "v1", "kind": "Pod", "metadata": {"name": name, "namespace": namespace, **meta}, "spec": spec}


def widget_crd(scope: str = "Namespaced") -> JsonObject:
    schema = {"openAPIV3Schema": {"type": "object", "x-kubernetes-preserve-unknown-fields": True}}
    return {
        "apiVersion": "apiextensions.k8s.io/v1",
        "kind": "CustomResourceDefinition",
        "metadata": {"name": "widgets.example.com"},
        "spec": {
            "group": "example.com",
            "names": {"kind": "Widget", "plural": "widgets", "singular": "widget", "listKind": "WidgetList"},
            "scope": scope,
            "versions": [
                {"name": "v1", "served": True, "storage": True, "schema": schema, "subresources": {"status": {}}}
            ],
        },
    }


def widget(name: str, size: int = 1, **meta: Any) -> JsonObject:
    return {
        "apiVersion": "example.com/v1",
        "kind": "Widget",
        "metadata": {"name": name, "namespace": "default", **meta},
        "spec": {"size": size},
    }


async def grant(
    api: ApiClient, cluster_role: str, namespace: str, account: str, *, account_namespace: str = ""
) -> None:
    """Bind ClusterRole ``cluster_role`` in ``namespace`` to a service account, as a cluster admin would."""
    body = {
        "apiVersion": "rbac.authorization.k8s.io/v1",
        "kind": "RoleBinding",
        "metadata": {"name": f"{account}-{cluster_role}"},
        "roleRef": {"apiGroup": "rbac.authorization.k8s.io", "kind": "ClusterRole", "name": cluster_role},
        "subjects": [{"kind": "ServiceAccount", "name": account, "namespace": account_namespace or namespace}],
    }
    reply = await api.post(f"/apis/rbac.authorization.k8s.io/v1/namespaces/{namespace}/rolebindings", body)
    assert reply.status == 201, reply.body
