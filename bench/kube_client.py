"""The benchmark's Kubernetes client: keep-alive HTTPS with aiohttp, TLS verified against the kubeconfig's CA.

Bodies are encoded and decoded with msgspec, and responses are decoded only as far as the benchmark needs (a name
and a resourceVersion), so the client spends as little of the machine's CPU as it can. Each concurrent creator
owns one session with one connection, as N separate clients would. Watch events are time-stamped when their
chunk arrives, before parsing, so client parsing time is not counted as delivery latency.
"""

from __future__ import annotations

import asyncio
import base64
import ssl
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import aiohttp
import msgspec
import yaml

NO_TIMEOUT = aiohttp.ClientTimeout(total=None, sock_read=None)
REQUEST_TIMEOUT = aiohttp.ClientTimeout(total=120)


class _Meta(msgspec.Struct):
    name: str = ""
    resourceVersion: str = ""  # the wire name


class _Object(msgspec.Struct):
    metadata: _Meta = msgspec.field(default_factory=_Meta)


class _Event(msgspec.Struct):
    type: str
    object: _Object


_decode_object = msgspec.json.Decoder(_Object).decode
_decode_event = msgspec.json.Decoder(_Event).decode
_encode = msgspec.json.Encoder().encode


@dataclass(frozen=True, slots=True)
class Endpoint:
    """Where a server is and how to trust and authenticate to it."""

    url: str
    ca_pem: bytes
    token: str

    @classmethod
    def from_kubeconfig(cls, path: Path) -> Endpoint:
        config = yaml.safe_load(path.read_text())
        cluster = config["clusters"][0]["cluster"]
        user = config["users"][0]["user"]
        return cls(cluster["server"], base64.b64decode(cluster["certificate-authority-data"]), user["token"])

    def session(self, connections: int) -> aiohttp.ClientSession:
        context = ssl.create_default_context(cadata=self.ca_pem.decode())
        return aiohttp.ClientSession(
            base_url=self.url,
            connector=aiohttp.TCPConnector(ssl=context, limit=connections),
            headers={"Authorization": f"Bearer {self.token}", "Accept": "application/json"},
            timeout=REQUEST_TIMEOUT,
        )


def pod_manifest(name: str, index: int) -> dict[str, Any]:
    """A small, realistic pod: a Deployment-style label set and one container with ports, env and resources."""
    app = f"app-{index % 10}"
    return {
        "apiVersion": "v1",
        "kind": "Pod",
        "metadata": {
            "name": name,
            "labels": {
                "app": app,
                "tier": ("frontend", "backend", "cache")[index % 3],
                "pod-template-hash": f"{(index * 2654435761) % 0xFFFFFFFF:08x}"[:10],
                "bench.ambit.dev/run": "apiserver",
            },
            "annotations": {"bench.ambit.dev/index": str(index)},
        },
        "spec": {
            "containers": [
                {
                    "name": "app",
                    "image": f"registry.example.com/{app}:1.{index % 7}.3",
                    "ports": [{"name": "http", "containerPort": 8080, "protocol": "TCP"}],
                    "env": [{"name": "APP", "value": app}, {"name": "LOG_LEVEL", "value": "info"}],
                    "resources": {"requests": {"cpu": "100m", "memory": "128Mi"}, "limits": {"memory": "256Mi"}},
                    "readinessProbe": {"httpGet": {"path": "/healthz", "port": 8080}, "periodSeconds": 10},
                }
            ],
            "nodeName": f"node-{index % 20}",
        },
    }


@dataclass
class CreateRun:
    """What a batch of creates did: per acknowledged name, the ack time (monotonic) and its resourceVersion."""

    acked: dict[str, tuple[float, int]] = field(default_factory=dict)
    failures: int = 0
    first_error: str = ""
    elapsed: float = 0.0

    @property
    def rate(self) -> float:
        return len(self.acked) / self.elapsed if self.elapsed > 0 else 0.0


async def create_pods(
    endpoint: Endpoint,
    namespace: str,
    names: Sequence[str],
    *,
    clients: int,
    on_ack: Callable[[CreateRun], None] | None = None,
) -> CreateRun:
    """POST one pod per name from ``clients`` concurrent keep-alive connections; a client stops at its first error."""
    run = CreateRun()
    bodies = [_encode(pod_manifest(name, i)) for i, name in enumerate(names)]
    queue = iter(zip(names, bodies, strict=True))
    path = f"/api/v1/namespaces/{namespace}/pods"
    headers = {"Content-Type": "application/json"}

    async def client() -> None:
        async with endpoint.session(1) as session:
            for name, body in queue:
                try:
                    async with session.post(path, data=body, headers=headers) as resp:
                        raw = await resp.read()
                        if resp.status != 201:
                            raise aiohttp.ClientResponseError(
                                resp.request_info, (), status=resp.status, message=raw[:300].decode(errors="replace")
                            )
                except (aiohttp.ClientError, TimeoutError) as exc:
                    run.failures += 1
                    run.first_error = run.first_error or f"{name}: {exc!r}"
                    return
                run.acked[name] = (time.monotonic(), int(_decode_object(raw).metadata.resourceVersion or 0))
                if on_ack is not None:
                    on_ack(run)

    began = time.monotonic()
    await asyncio.gather(*(client() for _ in range(clients)))
    run.elapsed = time.monotonic() - began
    return run


async def fetch_body(session: aiohttp.ClientSession, path: str) -> tuple[bytes, float]:
    """GET ``path``; the body and the seconds until its last byte arrived."""
    began = time.monotonic()
    async with session.get(path) as resp:
        resp.raise_for_status()
        body = await resp.read()
    return body, time.monotonic() - began


async def fetch_pages(session: aiohttp.ClientSession, path: str, limit: int) -> tuple[int, int, float]:
    """Page through a list with ``limit`` and ``continue``: (pages, items, seconds)."""
    pages = items = 0
    token = ""
    began = time.monotonic()
    while True:
        params = {"limit": str(limit)} | ({"continue": token} if token else {})
        async with session.get(path, params=params) as resp:
            resp.raise_for_status()
            doc = msgspec.json.decode(await resp.read())
        pages += 1
        items += len(doc["items"])
        token = doc["metadata"].get("continue", "")
        if not token:
            return pages, items, time.monotonic() - began


async def fetch_list(session: aiohttp.ClientSession, path: str) -> dict[str, Any]:
    async with session.get(path) as resp:
        resp.raise_for_status()
        doc: dict[str, Any] = msgspec.json.decode(await resp.read())
    return doc


async def follow_watch(
    session: aiohttp.ClientSession, path: str, want: frozenset[str], opened: Callable[[], None]
) -> dict[str, float]:
    """Watch until every name in ``want`` has been seen (or the stream ends): name -> arrival time (monotonic)."""
    seen: dict[str, float] = {}
    async with session.get(path, timeout=NO_TIMEOUT) as resp:
        resp.raise_for_status()
        opened()
        pending = b""
        async for chunk in resp.content.iter_any():
            arrived = time.monotonic()
            *lines, pending = (pending + chunk).split(b"\n")
            for line in lines:
                if line:
                    name = _decode_event(line).object.metadata.name
                    if name in want:
                        seen.setdefault(name, arrived)
            if len(seen) >= len(want):
                break
    return seen
