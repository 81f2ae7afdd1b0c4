"""The validation webhook for real: ``ambit apiserver`` as a subprocess calls our HTTPS server on 127.0.0.1.

The API server is this module's own (not the session's): the webhook is registered with ``failurePolicy: Fail``,
so once the webhook server stops, every Istio write to that API server would be refused.
"""

from __future__ import annotations

import asyncio
import json
import ssl
import time
from collections.abc import AsyncIterator, Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import aiohttp
import pytest
from tests.harness import ServerProcess, free_port

from ambit.controlplane.webhook import (
    CONFIGURATION_NAME,
    ValidationWebhookServer,
    WebhookServerSettings,
    register_webhook,
    unregister_webhook,
)
from ambit.k8s.client import KubeClient
from ambit.k8s.kinds import VALIDATING_WEBHOOK_CONFIGURATIONS
from ambit.tls.certs import KeyPair, issue_server_cert, new_ca

pytestmark = pytest.mark.kubectl


@dataclass(frozen=True)
class Pki:
    ca: KeyPair
    cert_file: Path
    key_file: Path


@pytest.fixture(scope="module")
def pki(tmp_path_factory: pytest.TempPathFactory) -> Pki:
    now = time.time()
    ca = new_ca("ambit-webhook-test-ca", now=now)
    cert = issue_server_cert(
        ca, common_name="istiod", dns_names=["istiod.istio-system.svc"], ip_addresses=["127.0.0.1"], now=now
    )
    directory = tmp_path_factory.mktemp("webhook-pki")
    (directory / "tls.crt").write_bytes(cert.cert_pem)
    (directory / "tls.key").write_bytes(cert.key_pem)
    return Pki(ca, directory / "tls.crt", directory / "tls.key")


@pytest.fixture(scope="module")
def apiserver(tmp_path_factory: pytest.TempPathFactory) -> Iterator[ServerProcess]:
    server = ServerProcess(tmp_path_factory.mktemp("webhook-apiserver"), free_port())
    server.start()
    try:
        yield server
    finally:
        if server.proc is not None:
            server.stop()


@pytest.fixture
async def kube(apiserver: ServerProcess) -> AsyncIterator[KubeClient]:
    async with KubeClient.from_kubeconfig(apiserver.kubeconfig) as client:
        yield client


@pytest.fixture
async def webhook(pki: Pki, kube: KubeClient) -> AsyncIterator[ValidationWebhookServer]:
    settings = WebhookServerSettings(cert_file=pki.cert_file, key_file=pki.key_file, host="127.0.0.1", port=0)
    async with ValidationWebhookServer(settings) as server:
        await register_webhook(kube, server.url("127.0.0.1"), pki.ca.cert_pem, timeout_seconds=5)
        try:
            yield server
        finally:
            await unregister_webhook(kube)


async def kubectl(apiserver: ServerProcess, *args: str, manifest: dict[str, Any] | None = None) -> str:
    """kubectl in a thread: the webhook server it reaches runs on this event loop."""
    text = json.dumps(manifest) if manifest is not None else None
    return await asyncio.to_thread(apiserver.kubectl, *args, input=text, check=False)


def policy(name: str, spec: dict[str, Any]) -> dict[str, Any]:
    return {
        "apiVersion": "security.istio.io/v1",
        "kind": "AuthorizationPolicy",
        "metadata": {"name": name, "namespace": "default"},
        "spec": spec,
    }


BAD_PORTS = {"action": "ALLOW", "rules": [{"to": [{"operation": {"ports": ["8080", "http"]}}]}]}
GOOD = {"selector": {"matchLabels": {"app": "web"}}, "rules": [{"to": [{"operation": {"ports": ["8080"]}}]}]}


async def test_kubectl_apply_of_an_invalid_policy_is_refused_naming_the_field(
    apiserver: ServerProcess, webhook: ValidationWebhookServer
) -> None:
    out = await kubectl(apiserver, "apply", "-f", "-", manifest=policy("bad-ports", BAD_PORTS))

    assert 'admission webhook "validation.istio.io" denied the request' in out
    assert "configuration is invalid: spec.rules[0].to[0].operation.ports[1]: 'http' is not a port number" in out
    assert "NotFound" in await kubectl(apiserver, "get", "authorizationpolicy", "bad-ports", "-n", "default")


async def test_valid_policy_is_stored_and_an_invalid_update_is_refused(
    apiserver: ServerProcess, webhook: ValidationWebhookServer
) -> None:
    out = await kubectl(apiserver, "apply", "-f", "-", manifest=policy("good", GOOD))
    assert "authorizationpolicy.security.istio.io/good created" in out
    stored = json.loads(await kubectl(apiserver, "get", "authorizationpolicy", "good", "-n", "default", "-o", "json"))
    assert stored["spec"] == GOOD

    out = await kubectl(apiserver, "apply", "-f", "-", manifest=policy("good", {**GOOD, "action": "CUSTOM"}))
    assert "spec.provider.name: required field is missing" in out
    stored = json.loads(await kubectl(apiserver, "get", "authorizationpolicy", "good", "-n", "default", "-o", "json"))
    assert stored["spec"] == GOOD
    await kubectl(apiserver, "delete", "authorizationpolicy", "good", "-n", "default")


async def test_other_groups_are_validated_too(apiserver: ServerProcess, webhook: ValidationWebhookServer) -> None:
    entry = {
        "apiVersion": "networking.istio.io/v1",
        "kind": "ServiceEntry",
        "metadata": {"name": "static-without-endpoints", "namespace": "default"},
        "spec": {"hosts": ["db.example.com"], "resolution": "STATIC", "ports": [{"number": 5432, "name": "pg"}]},
    }
    out = await kubectl(apiserver, "apply", "-f", "-", manifest=entry)
    assert "spec.endpoints: resolution STATIC needs endpoints" in out

    route = {
        "apiVersion": "gateway.networking.k8s.io/v1",
        "kind": "HTTPRoute",
        "metadata": {"name": "portless", "namespace": "default"},
        "spec": {"parentRefs": [{"name": "waypoint"}], "rules": [{"backendRefs": [{"name": "web"}]}]},
    }
    out = await kubectl(apiserver, "apply", "-f", "-", manifest=route)
    assert "spec.rules[0].backendRefs[0].port: required for a Service backend" in out


UPSTREAM_DESTINATION_RULE = """
apiVersion: networking.istio.io/{version}
kind: DestinationRule
metadata:
  name: {name}
  namespace: default
spec:
  host: "*.svc.cluster.local"
  trafficPolicy:
    connectionPool:
      http:
        maxRequestsPerConnection: 1
"""


TO_REVIEWS = {"route": [{"destination": {"host": "reviews"}}]}


async def test_destination_rules_and_virtual_services_are_accepted_validated_and_stored(
    apiserver: ServerProcess, webhook: ValidationWebhookServer
) -> None:
    """The DestinationRule five upstream ambient tests apply first (in each served version), a VirtualService, and
    the webhook's refusals of broken ones."""
    for version in ("v1", "v1beta1", "v1alpha3"):
        text = UPSTREAM_DESTINATION_RULE.format(version=version, name=f"one-request-{version}")
        out = await asyncio.to_thread(apiserver.kubectl, "apply", "-f", "-", input=text, check=False)
        assert out.strip() == f"destinationrule.networking.istio.io/one-request-{version} created", out
    stored = json.loads(await kubectl(apiserver, "get", "dr", "one-request-v1beta1", "-n", "default", "-o", "json"))
    assert stored["apiVersion"] == "networking.istio.io/v1"
    assert stored["spec"] == {
        "host": "*.svc.cluster.local",
        "trafficPolicy": {"connectionPool": {"http": {"maxRequestsPerConnection": 1}}},
    }
    table = (await kubectl(apiserver, "get", "destinationrules", "-n", "default")).splitlines()
    assert table[0].split() == ["NAME", "HOST", "AGE"]
    assert table[1].split()[:2] == ["one-request-v1", "*.svc.cluster.local"]

    service = {
        "apiVersion": "networking.istio.io/v1",
        "kind": "VirtualService",
        "metadata": {"name": "reviews", "namespace": "default"},
        "spec": {
            "hosts": ["reviews"],
            "http": [{"route": [{"destination": {"host": "reviews", "subset": "v1"}, "weight": 100}]}],
        },
    }
    out = await kubectl(apiserver, "apply", "-f", "-", manifest=service)
    assert out.strip() == "virtualservice.networking.istio.io/reviews created", out
    assert (await kubectl(apiserver, "get", "vs", "-n", "default")).splitlines()[0].split() == [
        "NAME",
        "GATEWAYS",
        "HOSTS",
        "AGE",
    ]

    hostless = {
        "apiVersion": "networking.istio.io/v1",
        "kind": "DestinationRule",
        "metadata": {"name": "hostless", "namespace": "default"},
        "spec": {"trafficPolicy": {"loadBalancer": {"simple": "FASTEST"}}},
    }
    out = await kubectl(apiserver, "apply", "-f", "-", manifest=hostless)
    assert "denied the request" in out and "spec.host" in out, out
    assert "NotFound" in await kubectl(apiserver, "get", "dr", "hostless", "-n", "default")
    nowhere = {
        **service,
        "metadata": {"name": "nowhere", "namespace": "default"},
        "spec": {"hosts": ["reviews"], "http": [{}]},
    }
    out = await kubectl(apiserver, "apply", "-f", "-", manifest=nowhere)
    assert "denied the request" in out, out
    unclosed = {
        **service,
        "metadata": {"name": "unclosed", "namespace": "default"},
        "spec": {"hosts": ["reviews"], "http": [{"match": [{"headers": {"x": {"regex": "[unclosed"}}}], **TO_REVIEWS}]},
    }
    out = await kubectl(apiserver, "apply", "-f", "-", manifest=unclosed)
    assert "denied the request" in out and "spec.http[0].match[0].headers[x].regex" in out, out
    assert "NotFound" in await kubectl(apiserver, "get", "vs", "unclosed", "-n", "default")
    for kind, name in [("dr", f"one-request-{v}") for v in ("v1", "v1beta1", "v1alpha3")] + [("vs", "reviews")]:
        await kubectl(apiserver, "delete", kind, name, "-n", "default")


async def test_istio_s_own_gateway_is_validated_and_stored_and_gateways_still_means_gateway_api_s(
    apiserver: ServerProcess, webhook: ValidationWebhookServer
) -> None:
    istio_gateway = {
        "apiVersion": "networking.istio.io/v1",
        "kind": "Gateway",
        "metadata": {"name": "edge", "namespace": "default"},
        "spec": {
            "selector": {"istio": "ingressgateway"},
            "servers": [{"port": {"number": 80, "name": "http", "protocol": "HTTP"}, "hosts": ["*"]}],
        },
    }
    out = await kubectl(apiserver, "apply", "-f", "-", manifest=istio_gateway)
    assert out.strip() == "gateway.networking.istio.io/edge created", out
    waypoint = {
        "apiVersion": "gateway.networking.k8s.io/v1",
        "kind": "Gateway",
        "metadata": {"name": "waypoint", "namespace": "default"},
        "spec": {
            "gatewayClassName": "istio-waypoint",
            "listeners": [{"name": "mesh", "port": 15008, "protocol": "HBONE"}],
        },
    }
    out = await kubectl(apiserver, "apply", "-f", "-", manifest=waypoint)
    assert out.strip() == "gateway.gateway.networking.k8s.io/waypoint created", out
    listed = json.loads(await kubectl(apiserver, "get", "gateways", "-n", "default", "-o", "json"))
    assert [(g["apiVersion"], g["metadata"]["name"]) for g in listed["items"]] == [
        ("gateway.networking.k8s.io/v1", "waypoint")
    ]
    istio = json.loads(await kubectl(apiserver, "get", "gw", "-n", "default", "-o", "json"))
    assert [(g["apiVersion"], g["metadata"]["name"]) for g in istio["items"]] == [("networking.istio.io/v1", "edge")]
    not_a_map = {**istio_gateway, "metadata": {"name": "bad", "namespace": "default"}, "spec": {"servers": "all"}}
    out = await kubectl(apiserver, "apply", "-f", "-", manifest=not_a_map)
    assert "denied the request" in out and "spec.servers" in out, out
    assert "NotFound" in await kubectl(apiserver, "get", "gw", "bad", "-n", "default")
    await kubectl(apiserver, "delete", "gw", "edge", "-n", "default")
    await kubectl(apiserver, "delete", "gateways.gateway.networking.k8s.io", "waypoint", "-n", "default")


async def test_malformed_review_posted_directly_gets_400_with_a_clear_body(
    pki: Pki, webhook: ValidationWebhookServer
) -> None:
    context = ssl.create_default_context(cadata=pki.ca.cert_pem.decode())
    async with aiohttp.ClientSession() as session:
        for body, why in [
            (b"{not json", "the body is not JSON"),
            (b'{"apiVersion": "admission.k8s.io/v1", "kind": "AdmissionReview"}', "request is missing"),
        ]:
            async with session.post(webhook.url("127.0.0.1"), data=body, ssl=context) as response:
                text = await response.text()
                assert response.status == 400
                assert text.startswith("malformed AdmissionReview: ") and why in text
                assert "Traceback" not in text


async def test_registration_is_idempotent_and_updates_the_ca_bundle(
    kube: KubeClient, webhook: ValidationWebhookServer, pki: Pki
) -> None:
    other = new_ca("another", now=time.time()).cert_pem
    await register_webhook(kube, webhook.url("127.0.0.1"), other)
    stored = await kube.get(VALIDATING_WEBHOOK_CONFIGURATIONS, CONFIGURATION_NAME)
    assert len(stored["webhooks"]) == 1
    assert stored["webhooks"][0]["failurePolicy"] == "Fail"
    first_version = stored["metadata"]["resourceVersion"]

    await register_webhook(kube, webhook.url("127.0.0.1"), pki.ca.cert_pem)
    again = await kube.get(VALIDATING_WEBHOOK_CONFIGURATIONS, CONFIGURATION_NAME)
    assert again["metadata"]["resourceVersion"] != first_version
    assert again["webhooks"][0]["clientConfig"]["url"] == webhook.url("127.0.0.1")


async def test_writes_fail_closed_while_the_webhook_is_down(
    apiserver: ServerProcess, pki: Pki, kube: KubeClient
) -> None:
    settings = WebhookServerSettings(cert_file=pki.cert_file, key_file=pki.key_file, host="127.0.0.1", port=0)
    async with ValidationWebhookServer(settings) as server:
        url = server.url("127.0.0.1")
    try:
        await register_webhook(kube, url, pki.ca.cert_pem, timeout_seconds=2)
        out = await kubectl(apiserver, "apply", "-f", "-", manifest=policy("while-down", GOOD))
        assert 'failed calling webhook "validation.istio.io"' in out
        assert "NotFound" in await kubectl(apiserver, "get", "authorizationpolicy", "while-down", "-n", "default")
    finally:
        await unregister_webhook(kube)
    out = await kubectl(apiserver, "apply", "-f", "-", manifest=policy("while-down", GOOD))
    assert "created" in out
