"""Admission webhooks through the API server: configurations created over HTTP, a real HTTPS webhook on loopback.

The webhook is an aiohttp server with a certificate from its own CA, which reaches the API server only as the
``caBundle`` of the configuration, exactly as a cluster's webhooks are set up.
"""

from __future__ import annotations

import base64
import json
import socket
import ssl
import time
from collections.abc import AsyncIterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import pytest
from aiohttp import web
from apiserver_client import ApiClient, JsonObject, assert_status, configmap, pod
from bench.server_process import free_port as harness_free_port

from ambit.apiserver.server import ApiServer
from ambit.tls.certs import issue_server_cert, new_ca

PODS = "/api/v1/namespaces/default/pods"
CMS = "/api/v1/namespaces/default/configmaps"
VALIDATING = "/apis/admissionregistration.k8s.io/v1/validatingwebhookconfigurations"
MUTATING = "/apis/admissionregistration.k8s.io/v1/mutatingwebhookconfigurations"
DENIAL = "pods labelled deny=true are not allowed here"


@dataclass
class Webhook:
    """A running HTTPS webhook: ``/validate`` denies pods labelled ``deny=true``, ``/mutate`` adds a label."""

    url: str
    ca_bundle: str
    reviews: dict[str, list[JsonObject]] = field(default_factory=dict)

    def requests(self, path: str) -> list[JsonObject]:
        return [review["request"] for review in self.reviews.get(path, [])]


def answer(review: JsonObject, **response: Any) -> JsonObject:
    return {
        "apiVersion": "admission.k8s.io/v1",
        "kind": "AdmissionReview",
        "response": {"uid": review["request"]["uid"], **response},
    }


def validate(review: JsonObject) -> JsonObject:
    labels = (review["request"]["object"].get("metadata") or {}).get("labels") or {}
    if labels.get("deny") == "true":
        return answer(review, allowed=False, status={"code": 403, "message": DENIAL})
    return answer(review, allowed=True)


def mutate(review: JsonObject) -> JsonObject:
    meta = review["request"]["object"].get("metadata") or {}
    ops: list[JsonObject]
    if "labels" in meta:
        ops = [{"op": "add", "path": "/metadata/labels/injected", "value": "yes"}]
    else:
        ops = [{"op": "add", "path": "/metadata/labels", "value": {"injected": "yes"}}]
    return answer(
        review, allowed=True, patchType="JSONPatch", patch=base64.b64encode(json.dumps(ops).encode()).decode()
    )


def free_port() -> int:
    """Below the ephemeral range, so no outgoing connection takes it before the test binds it."""
    return harness_free_port()


@pytest.fixture
async def hook(tmp_path: Path) -> AsyncIterator[Webhook]:
    now = time.time()
    ca = new_ca("webhook-ca", now=now)
    cert = issue_server_cert(ca, common_name="webhook", dns_names=[], ip_addresses=["127.0.0.1"], now=now)
    (tmp_path / "tls.crt").write_bytes(cert.cert_pem)
    (tmp_path / "tls.key").write_bytes(cert.key_pem)
    context = ssl.SSLContext(ssl.PROTOCOL_TLS_SERVER)
    context.load_cert_chain(tmp_path / "tls.crt", tmp_path / "tls.key")
    sock = socket.socket()
    sock.bind(("127.0.0.1", 0))
    state = Webhook(f"https://127.0.0.1:{sock.getsockname()[1]}", base64.b64encode(ca.cert_pem).decode())
    handlers = {"/validate": validate, "/mutate": mutate}

    async def serve(request: web.Request) -> web.Response:
        review = await request.json()
        state.reviews.setdefault(request.path, []).append(review)
        return web.json_response(handlers[request.path](review))

    app = web.Application()
    app.router.add_post("/{name}", serve)
    runner = web.AppRunner(app, shutdown_timeout=0.1)
    await runner.setup()
    try:
        await web.SockSite(runner, sock, ssl_context=context).start()
        yield state
    finally:
        await runner.cleanup()
        sock.close()


@pytest.fixture
async def api(apiserver: ApiServer) -> AsyncIterator[ApiClient]:
    async with ApiClient.for_server(apiserver) as client:
        yield client


def configuration(
    name: str, url: str, ca_bundle: str, *, resources: tuple[str, ...] = ("pods",), **fields: Any
) -> JsonObject:
    return {
        "metadata": {"name": name},
        "webhooks": [
            {
                "name": name,
                "clientConfig": {"url": url, "caBundle": ca_bundle},
                "rules": [
                    {
                        "operations": ["CREATE", "UPDATE"],
                        "apiGroups": [""],
                        "apiVersions": ["v1"],
                        "resources": list(resources),
                    }
                ],
                "sideEffects": "None",
                "admissionReviewVersions": ["v1"],
                "timeoutSeconds": 5,
                **fields,
            }
        ],
    }


async def test_validating_webhook_denial_reaches_the_client_and_nothing_is_stored(
    apiserver: ApiServer, api: ApiClient, hook: Webhook
) -> None:
    assert apiserver.manager is not None
    await api.create(VALIDATING, configuration("deny.example.com", f"{hook.url}/validate", hook.ca_bundle))
    before = apiserver.manager.store.resource_version
    reply = await api.post(PODS, pod("bad", labels={"deny": "true"}))
    assert_status(reply, 403, message=f'admission webhook "deny.example.com" denied the request: {DENIAL}')
    assert apiserver.manager.store.resource_version == before
    assert not await api.exists(f"{PODS}/bad")
    (request,) = hook.requests("/validate")
    assert request["operation"] == "CREATE" and request["name"] == "bad" and request["namespace"] == "default"
    assert request["kind"] == {"group": "", "version": "v1", "kind": "Pod"}
    assert request["userInfo"]["username"] == "kubernetes-admin"
    # Allowed pods pass, and an update into the denied state is refused with the object left as it was.
    assert (await api.post(PODS, pod("good"))).status == 201
    refused = await api.patch(f"{PODS}/good", {"metadata": {"labels": {"deny": "true"}}})
    assert_status(refused, 403, message="denied the request")
    assert "labels" not in (await api.must_get(f"{PODS}/good"))["metadata"]
    assert hook.requests("/validate")[-1]["operation"] == "UPDATE"
    # Other kinds are not sent to the webhook at all.
    calls = len(hook.requests("/validate"))
    assert (await api.post(CMS, configmap("cm", labels={"deny": "true"}))).status == 201
    assert len(hook.requests("/validate")) == calls
    # Without the configuration, the same pod is accepted.
    await api.delete(f"{VALIDATING}/deny.example.com")
    assert (await api.post(PODS, pod("bad", labels={"deny": "true"}))).status == 201


async def test_mutating_webhook_patch_is_stored_and_seen_by_validation(api: ApiClient, hook: Webhook) -> None:
    await api.create(
        MUTATING,
        configuration("inject.example.com", f"{hook.url}/mutate", hook.ca_bundle, resources=("pods", "configmaps")),
    )
    await api.create(VALIDATING, configuration("deny.example.com", f"{hook.url}/validate", hook.ca_bundle))
    created = await api.create(PODS, pod("bare"))
    assert created["metadata"]["labels"] == {"injected": "yes"}
    assert (await api.must_get(f"{PODS}/bare"))["metadata"]["labels"] == {"injected": "yes"}
    labelled = await api.create(CMS, configmap("cm", labels={"team": "a"}))
    assert labelled["metadata"]["labels"] == {"team": "a", "injected": "yes"}
    # Validation runs after mutation, on the mutated object.
    (validated,) = hook.requests("/validate")
    assert validated["object"]["metadata"]["labels"] == {"injected": "yes"}


async def test_mutation_with_dry_run_is_answered_but_not_stored(api: ApiClient, hook: Webhook) -> None:
    await api.create(MUTATING, configuration("inject.example.com", f"{hook.url}/mutate", hook.ca_bundle))
    reply = await api.post(PODS, pod("dry"), dryRun="All")
    assert reply.status == 201 and reply.body["metadata"]["labels"] == {"injected": "yes"}
    assert hook.requests("/mutate")[0]["dryRun"] is True
    assert not await api.exists(f"{PODS}/dry")


async def test_unreachable_webhook_with_failure_policy_ignore_lets_the_write_through(
    api: ApiClient, hook: Webhook
) -> None:
    url = f"https://127.0.0.1:{free_port()}/validate"
    await api.create(VALIDATING, configuration("gone.example.com", url, hook.ca_bundle, failurePolicy="Ignore"))
    await api.create(MUTATING, configuration("gone.example.com", url, hook.ca_bundle, failurePolicy="Ignore"))
    created = await api.create(PODS, pod("p", labels={"deny": "true"}))
    assert created["metadata"]["labels"] == {"deny": "true"}
    assert await api.exists(f"{PODS}/p")


@pytest.mark.parametrize("kind", [VALIDATING, MUTATING])
async def test_unreachable_webhook_with_failure_policy_fail_is_an_internal_error(
    apiserver: ApiServer, api: ApiClient, hook: Webhook, kind: str
) -> None:
    assert apiserver.manager is not None
    url = f"https://127.0.0.1:{free_port()}/validate"
    await api.create(kind, configuration("gone.example.com", url, hook.ca_bundle, failurePolicy="Fail"))
    before = apiserver.manager.store.resource_version
    reply = await api.post(PODS, pod("p"))
    status = assert_status(reply, 500, "InternalError", 'failed calling webhook "gone.example.com"')
    assert url in status["message"]
    assert apiserver.manager.store.resource_version == before
    assert not await api.exists(f"{PODS}/p")
    assert (await api.request("GET", "/readyz")).status == 200


async def test_webhook_with_an_untrusted_certificate_fails_closed(api: ApiClient, hook: Webhook) -> None:
    other_ca = base64.b64encode(new_ca("someone-else", now=time.time()).cert_pem).decode()
    await api.create(VALIDATING, configuration("mitm.example.com", f"{hook.url}/validate", other_ca))
    reply = await api.post(PODS, pod("p"))
    assert_status(reply, 500, "InternalError", 'failed calling webhook "mitm.example.com"')
    assert hook.requests("/validate") == []


async def test_an_eviction_is_admitted_as_a_create_of_pods_eviction(api: ApiClient, hook: Webhook) -> None:
    await api.create(
        VALIDATING,
        configuration("deny.example.com", f"{hook.url}/validate", hook.ca_bundle, resources=("pods/eviction",)),
    )
    assert (await api.post(PODS, pod("web"))).status == 201
    denied = {"apiVersion": "policy/v1", "kind": "Eviction", "metadata": {"name": "web", "labels": {"deny": "true"}}}
    reply = await api.post(f"{PODS}/web/eviction", denied)
    assert_status(reply, 403, message=f'admission webhook "deny.example.com" denied the request: {DENIAL}')
    assert not (await api.must_get(f"{PODS}/web"))["metadata"].get("deletionTimestamp")
    (request,) = hook.requests("/validate")
    assert (request["operation"], request["subResource"], request["name"]) == ("CREATE", "eviction", "web")
    assert request["kind"] == {"group": "policy", "version": "v1", "kind": "Eviction"}
    assert request["object"]["kind"] == "Eviction"
    allowed = {"apiVersion": "policy/v1", "kind": "Eviction", "metadata": {"name": "web"}}
    assert (await api.post(f"{PODS}/web/eviction", allowed)).status == 201
    assert len(hook.requests("/validate")) == 2
