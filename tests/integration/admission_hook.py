"""A real HTTPS admission webhook for tests that need the API server to wait inside a write: the handler is a
coroutine, so a test can hold a request there (a barrier) or write to the API server before it answers (a
concurrent writer between a request's read and its write)."""

from __future__ import annotations

import base64
import socket
import ssl
import time
from collections.abc import AsyncIterator, Awaitable, Callable
from contextlib import asynccontextmanager
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from aiohttp import web

from ambit.tls.certs import issue_server_cert, new_ca

JsonObject = dict[str, Any]
Handler = Callable[[JsonObject], Awaitable[JsonObject]]


@dataclass(frozen=True)
class HookAddress:
    url: str
    ca_bundle: str


def allow(review: JsonObject) -> JsonObject:
    return {
        "apiVersion": "admission.k8s.io/v1",
        "kind": "AdmissionReview",
        "response": {"uid": review["request"]["uid"], "allowed": True},
    }


def validating_configuration(
    name: str, hook: HookAddress, *, group: str, resource: str, operations: tuple[str, ...] = ("UPDATE",)
) -> JsonObject:
    """A ValidatingWebhookConfiguration sending ``operations`` on ``group``'s ``resource`` (``pods/status``)."""
    rule = {"operations": list(operations), "apiGroups": [group], "apiVersions": ["v1"], "resources": [resource]}
    webhook = {
        "name": name,
        "clientConfig": {"url": hook.url, "caBundle": hook.ca_bundle},
        "rules": [rule],
        "sideEffects": "None",
        "admissionReviewVersions": ["v1"],
        "timeoutSeconds": 20,
        "failurePolicy": "Fail",
    }
    return {"metadata": {"name": name}, "webhooks": [webhook]}


@asynccontextmanager
async def serving(tmp_path: Path, handler: Handler) -> AsyncIterator[HookAddress]:
    """Serve ``handler`` on a loopback port with a certificate from a fresh CA (its bundle in the address)."""
    now = time.time()
    ca = new_ca("webhook-ca", now=now)
    cert = issue_server_cert(ca, common_name="webhook", dns_names=[], ip_addresses=["127.0.0.1"], now=now)
    (tmp_path / "hook.crt").write_bytes(cert.cert_pem)
    (tmp_path / "hook.key").write_bytes(cert.key_pem)
    context = ssl.SSLContext(ssl.PROTOCOL_TLS_SERVER)
    context.load_cert_chain(tmp_path / "hook.crt", tmp_path / "hook.key")

    async def serve(request: web.Request) -> web.Response:
        return web.json_response(await handler(await request.json()))

    app = web.Application()
    app.router.add_post("/validate", serve)
    runner = web.AppRunner(app, shutdown_timeout=0.1)
    await runner.setup()
    sock = socket.socket()
    try:
        sock.bind(("127.0.0.1", 0))
        await web.SockSite(runner, sock, ssl_context=context).start()
        address = HookAddress(
            f"https://127.0.0.1:{sock.getsockname()[1]}/validate", base64.b64encode(ca.cert_pem).decode()
        )
        yield address
    finally:
        await runner.cleanup()
        sock.close()
