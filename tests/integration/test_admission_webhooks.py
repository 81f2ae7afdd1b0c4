"""Admission webhooks called over real HTTPS: aiohttp servers on 127.0.0.1 with certificates from our own CA."""

from __future__ import annotations

import asyncio
import base64
import json
import socket
import ssl
import time
from collections.abc import AsyncIterator, Awaitable, Callable
from dataclasses import dataclass, field, replace
from pathlib import Path
from typing import Any

import pytest
from aiohttp import web
from bench.server_process import free_port as harness_free_port

from ambit.apiserver.admission import (
    AdmissionAttributes,
    AdmissionController,
    AdmissionError,
)
from ambit.tls.certs import KeyPair, issue_server_cert, new_ca

Handler = Callable[[dict[str, Any]], Awaitable[dict[str, Any] | web.StreamResponse]]

POD = AdmissionAttributes(
    operation="CREATE",
    group="",
    version="v1",
    resource="pods",
    kind_group="",
    kind_version="v1",
    kind="Pod",
    namespace="default",
    name="web-1",
    object={"apiVersion": "v1", "kind": "Pod", "metadata": {"name": "web-1", "namespace": "default"}},
    user_info={"username": "alice", "groups": ["devs"]},
    namespace_labels={"env": "prod"},
)


@dataclass
class Received:
    path: str
    query: dict[str, str]
    review: dict[str, Any]


@dataclass
class WebhookServer:
    """One HTTPS server; each path is one webhook whose handler turns a review into an answer."""

    base_url: str
    ca_bundle: str
    handlers: dict[str, Handler] = field(default_factory=dict)
    received: list[Received] = field(default_factory=list)

    def route(self, path: str, handler: Handler) -> str:
        self.handlers[path] = handler
        return f"{self.base_url}{path}"

    def calls(self, path: str) -> list[dict[str, Any]]:
        return [r.review for r in self.received if r.path == path]


@dataclass(frozen=True)
class Pki:
    ca: KeyPair
    cert_file: Path
    key_file: Path

    @property
    def ca_bundle(self) -> str:
        return base64.b64encode(self.ca.cert_pem).decode()


@pytest.fixture(scope="module")
def pki(tmp_path_factory: pytest.TempPathFactory) -> Pki:
    now = time.time()
    ca = new_ca("webhook-test-ca", now=now)
    server = issue_server_cert(
        ca, common_name="webhook", dns_names=["webhook.default.svc"], ip_addresses=["127.0.0.1"], now=now
    )
    directory = tmp_path_factory.mktemp("webhook-pki")
    (directory / "tls.crt").write_bytes(server.cert_pem)
    (directory / "tls.key").write_bytes(server.key_pem)
    return Pki(ca, directory / "tls.crt", directory / "tls.key")


@pytest.fixture
async def server(pki: Pki) -> AsyncIterator[WebhookServer]:
    context = ssl.SSLContext(ssl.PROTOCOL_TLS_SERVER)
    context.load_cert_chain(pki.cert_file, pki.key_file)
    sock = socket.socket()
    sock.bind(("127.0.0.1", 0))
    port = sock.getsockname()[1]
    state = WebhookServer(f"https://127.0.0.1:{port}", pki.ca_bundle)

    async def dispatch(request: web.Request) -> web.StreamResponse:
        review = await request.json()
        state.received.append(Received(request.path, dict(request.query), review))
        answer = await state.handlers[request.path](review)
        return answer if isinstance(answer, web.StreamResponse) else web.json_response(answer)

    app = web.Application()
    app.router.add_post("/{name}", dispatch)
    runner = web.AppRunner(app, handler_cancellation=True, shutdown_timeout=0.1)
    try:
        await runner.setup()
        await web.SockSite(runner, sock, ssl_context=context).start()
        yield state
    finally:
        await runner.cleanup()
        sock.close()


@pytest.fixture
async def controller() -> AsyncIterator[AdmissionController]:
    async with AdmissionController() as owned:
        yield owned


def review_answer(review: dict[str, Any], **response: Any) -> dict[str, Any]:
    return {
        "apiVersion": "admission.k8s.io/v1",
        "kind": "AdmissionReview",
        "response": {"uid": review["request"]["uid"], **response},
    }


def allow(**response: Any) -> Handler:
    async def handler(review: dict[str, Any]) -> dict[str, Any]:
        return review_answer(review, allowed=True, **response)

    return handler


def deny(**response: Any) -> Handler:
    async def handler(review: dict[str, Any]) -> dict[str, Any]:
        return review_answer(review, allowed=False, **response)

    return handler


def patch(make_ops: Callable[[dict[str, Any]], list[dict[str, Any]]]) -> Handler:
    async def handler(review: dict[str, Any]) -> dict[str, Any]:
        ops = json.dumps(make_ops(review["request"]["object"])).encode()
        return review_answer(review, allowed=True, patchType="JSONPatch", patch=base64.b64encode(ops).decode())

    return handler


def webhook(name: str, url: str, ca_bundle: str, **fields: Any) -> dict[str, Any]:
    return {
        "name": name,
        "clientConfig": {"url": url, "caBundle": ca_bundle},
        "rules": [
            {"operations": ["CREATE", "UPDATE"], "apiGroups": [""], "apiVersions": ["v1"], "resources": ["pods"]}
        ],
        "sideEffects": "None",
        "admissionReviewVersions": ["v1"],
        **fields,
    }


def config(name: str, *webhooks: dict[str, Any]) -> dict[str, Any]:
    return {"metadata": {"name": name}, "webhooks": list(webhooks)}


def free_port() -> int:
    """Below the ephemeral range, so no outgoing connection takes it before the test binds it."""
    return harness_free_port()


async def test_allowing_webhook_receives_the_review_and_its_warnings_come_back(
    server: WebhookServer, controller: AdmissionController
) -> None:
    url = server.route("/allow", allow(warnings=["pods without limits are deprecated"]))
    warnings = await controller.validate([config("policy", webhook("allow.example.com", url, server.ca_bundle))], POD)

    assert warnings == ["pods without limits are deprecated"]
    [received] = server.received
    assert received.query == {"timeout": "10s"}
    request = received.review["request"]
    assert received.review["apiVersion"] == "admission.k8s.io/v1"
    assert len(request["uid"]) == 36
    assert request["kind"] == {"group": "", "version": "v1", "kind": "Pod"}
    assert request["resource"] == {"group": "", "version": "v1", "resource": "pods"}
    assert (request["operation"], request["namespace"], request["name"]) == ("CREATE", "default", "web-1")
    assert request["userInfo"] == {"username": "alice", "groups": ["devs"]}
    assert request["object"] == POD.object
    assert request["oldObject"] is None
    assert request["dryRun"] is False
    assert request["options"] == {"kind": "CreateOptions", "apiVersion": "meta.k8s.io/v1"}


async def test_denying_webhook_message_and_code_reach_the_client(
    server: WebhookServer, controller: AdmissionController
) -> None:
    url = server.route(
        "/deny", deny(status={"code": 403, "reason": "Forbidden", "message": "no pods on Tuesdays"}, warnings=["w"])
    )
    with pytest.raises(AdmissionError) as caught:
        await controller.validate([config("policy", webhook("deny.example.com", url, server.ca_bundle))], POD)

    assert caught.value.code == 403
    assert caught.value.reason == "Forbidden"
    assert caught.value.message == 'admission webhook "deny.example.com" denied the request: no pods on Tuesdays'
    assert caught.value.warnings == ["w"]


async def test_denial_without_a_code_is_400(server: WebhookServer, controller: AdmissionController) -> None:
    url = server.route("/deny", deny())
    allowed_url = server.route("/allow", allow())
    configs = [
        config("a", webhook("allow.example.com", allowed_url, server.ca_bundle)),
        config("b", webhook("deny.example.com", url, server.ca_bundle)),
    ]
    with pytest.raises(AdmissionError) as caught:
        await controller.validate(configs, POD)

    assert caught.value.code == 400
    assert caught.value.message == 'admission webhook "deny.example.com" denied the request without explanation'
    assert len(server.received) == 2


async def test_mutating_webhooks_run_in_configuration_order_each_seeing_the_last_patch(
    server: WebhookServer, controller: AdmissionController
) -> None:
    first = server.route("/first", patch(lambda obj: [{"op": "add", "path": "/metadata/labels", "value": {"a": "1"}}]))
    second = server.route(
        "/second",
        patch(lambda obj: [{"op": "add", "path": "/metadata/labels/b", "value": obj["metadata"]["labels"]["a"] + "+"}]),
    )
    configs = [
        config("b-second", webhook("second.example.com", second, server.ca_bundle)),
        config("a-first", webhook("first.example.com", first, server.ca_bundle)),
    ]
    patched, warnings = await controller.mutate(configs, POD)

    assert patched is not None
    assert patched["metadata"]["labels"] == {"a": "1", "b": "1+"}
    assert [r.path for r in server.received] == ["/first", "/second"]
    assert server.calls("/second")[0]["request"]["object"]["metadata"]["labels"] == {"a": "1"}
    assert POD.object is not None and "labels" not in POD.object["metadata"]
    assert warnings == []


@pytest.mark.parametrize(("later_changes", "calls"), [(True, 2), (False, 1)])
async def test_if_needed_webhook_is_reinvoked_only_after_a_later_change(
    server: WebhookServer, controller: AdmissionController, later_changes: bool, calls: int
) -> None:
    def count(obj: dict[str, Any]) -> list[dict[str, Any]]:
        seen = int(obj["metadata"].get("annotations", {}).get("calls", "0"))
        return [{"op": "add", "path": "/metadata/annotations", "value": {"calls": str(seen + 1)}}]

    early = server.route("/early", patch(count))
    late = server.route(
        "/late",
        patch(lambda obj: [{"op": "add", "path": "/metadata/labels", "value": {"late": "yes"}}])
        if later_changes
        else allow(),
    )
    configs = [
        config(
            "hooks",
            webhook("early.example.com", early, server.ca_bundle, reinvocationPolicy="IfNeeded"),
            webhook("late.example.com", late, server.ca_bundle),
        )
    ]
    patched, _ = await controller.mutate(configs, POD)

    assert patched is not None
    assert len(server.calls("/early")) == calls
    assert len(server.calls("/late")) == 1
    assert patched["metadata"]["annotations"] == {"calls": str(calls)}


@pytest.mark.parametrize("policy", ["Fail", "Ignore"])
async def test_unreachable_webhook_follows_failure_policy(controller: AdmissionController, policy: str) -> None:
    url = f"https://127.0.0.1:{free_port()}/validate"
    configs = [config("policy", webhook("down.example.com", url, "", failurePolicy=policy))]
    if policy == "Ignore":
        assert await controller.validate(configs, POD) == []
        assert await controller.mutate(configs, POD) == (POD.object, [])
        return
    failures = []
    for admit in (controller.validate, controller.mutate):
        with pytest.raises(AdmissionError) as caught:
            await admit(configs, POD)
        failures.append(caught.value)
    for failure in failures:
        assert failure.code == 500
        assert failure.reason == "InternalError"
        assert failure.message.startswith(
            f'Internal error occurred: failed calling webhook "down.example.com": failed to call webhook: Post "{url}'
        )


@pytest.mark.parametrize("policy", ["Fail", "Ignore"])
async def test_slow_webhook_times_out_and_follows_failure_policy(
    server: WebhookServer, controller: AdmissionController, policy: str
) -> None:
    async def slow(review: dict[str, Any]) -> dict[str, Any]:
        await asyncio.sleep(10)
        return review_answer(review, allowed=True)

    url = server.route("/slow", slow)
    configs = [
        config("policy", webhook("slow.example.com", url, server.ca_bundle, timeoutSeconds=1, failurePolicy=policy))
    ]
    started = time.monotonic()
    if policy == "Ignore":
        assert await controller.validate(configs, POD) == []
    else:
        with pytest.raises(AdmissionError) as caught:
            await controller.validate(configs, POD)
        assert caught.value.code == 500
        assert caught.value.message.endswith("context deadline exceeded")
    assert time.monotonic() - started < 3
    assert server.received[0].query == {"timeout": "1s"}


async def test_wrong_response_uid_is_a_failure_to_call(server: WebhookServer, controller: AdmissionController) -> None:
    async def confused(review: dict[str, Any]) -> dict[str, Any]:
        answer = review_answer(review, allowed=True)
        answer["response"]["uid"] = "not-the-request"
        return answer

    url = server.route("/confused", confused)
    with pytest.raises(AdmissionError) as caught:
        await controller.validate([config("c", webhook("confused.example.com", url, server.ca_bundle))], POD)

    assert caught.value.code == 500
    assert 'received invalid webhook response: expected response.uid="' in caught.value.message
    assert caught.value.message.endswith('got "not-the-request"')


async def test_error_status_and_malformed_json_are_failures_to_call(
    server: WebhookServer, controller: AdmissionController
) -> None:
    async def broken(review: dict[str, Any]) -> web.StreamResponse:
        return web.Response(status=503, text="upstream unavailable")

    async def garbled(review: dict[str, Any]) -> web.StreamResponse:
        return web.Response(text="{not json", content_type="application/json")

    for path, handler, why in [
        ("/broken", broken, "the server responded with HTTP 503: upstream unavailable"),
        ("/garbled", garbled, "the response is not JSON"),
    ]:
        url = server.route(path, handler)
        configs = [config("c", webhook("bad.example.com", url, server.ca_bundle))]
        with pytest.raises(AdmissionError) as caught:
            await controller.validate(configs, POD)
        assert caught.value.code == 500
        assert why in caught.value.message
        ignoring = [config("c", webhook("bad.example.com", url, server.ca_bundle, failurePolicy="Ignore"))]
        assert await controller.validate(ignoring, POD) == []


async def test_certificate_from_another_ca_is_rejected(server: WebhookServer, controller: AdmissionController) -> None:
    url = server.route("/allow", allow())
    stranger = base64.b64encode(new_ca("someone-else", now=time.time()).cert_pem).decode()
    with pytest.raises(AdmissionError) as caught:
        await controller.validate([config("c", webhook("tls.example.com", url, stranger))], POD)

    assert caught.value.code == 500
    assert "certificate verify failed" in caught.value.message
    assert server.received == []


async def test_namespace_selector_filters_webhooks(server: WebhookServer, controller: AdmissionController) -> None:
    url = server.route("/allow", allow())
    selector = {"matchExpressions": [{"key": "env", "operator": "In", "values": ["prod"]}]}
    configs = [config("c", webhook("ns.example.com", url, server.ca_bundle, namespaceSelector=selector))]

    await controller.validate(configs, replace(POD, namespace_labels={"env": "dev"}))
    assert server.received == []
    await controller.validate(configs, POD)
    assert len(server.received) == 1


async def test_object_selector_filters_webhooks(server: WebhookServer, controller: AdmissionController) -> None:
    url = server.route("/deny", deny(status={"message": "labelled pods are refused"}))
    configs = [
        config("c", webhook("obj.example.com", url, server.ca_bundle, objectSelector={"matchLabels": {"x": "y"}}))
    ]

    assert await controller.validate(configs, POD) == []
    labelled = replace(POD, object={"metadata": {"name": "web-1", "labels": {"x": "y"}}})
    with pytest.raises(AdmissionError, match="labelled pods are refused"):
        await controller.validate(configs, labelled)
    assert len(server.received) == 1


async def test_no_webhook_is_called_for_a_resource_no_rule_names(
    server: WebhookServer, controller: AdmissionController
) -> None:
    url = server.route("/deny", deny())
    configs = [config("c", webhook("pods-only.example.com", url, server.ca_bundle))]
    service = replace(POD, resource="services", kind_group="", kind_version="v1", kind="Service")

    assert await controller.validate(configs, service) == []
    assert await controller.mutate(configs, service) == (service.object, [])
    assert server.received == []


async def test_service_reference_goes_through_the_resolver_and_verifies_the_service_name(
    server: WebhookServer,
) -> None:
    server.route("/allow", allow(warnings=["via service"]))
    asked: list[tuple[str, str, int]] = []

    async def resolve(namespace: str, name: str, port: int) -> str:
        asked.append((namespace, name, port))
        return server.base_url

    def service_hook(name: str) -> dict[str, Any]:
        hook = webhook(f"{name}.example.com", "", server.ca_bundle)
        hook["clientConfig"] = {
            "service": {"namespace": "default", "name": name, "port": 8443, "path": "/allow"},
            "caBundle": server.ca_bundle,
        }
        return hook

    async with AdmissionController(service_resolver=resolve) as controller:
        assert await controller.validate([config("c", service_hook("webhook"))], POD) == ["via service"]
        # The certificate names webhook.default.svc (and 127.0.0.1), not other.default.svc.
        with pytest.raises(AdmissionError, match="certificate verify failed"):
            await controller.validate([config("c", service_hook("other"))], POD)
    assert asked == [("default", "webhook", 8443), ("default", "other", 8443)]

    async with AdmissionController() as unresolving:
        with pytest.raises(AdmissionError, match="no service resolver"):
            await unresolving.validate([config("c", service_hook("webhook"))], POD)


async def test_dry_run_skips_nothing_but_refuses_webhooks_with_side_effects(
    server: WebhookServer, controller: AdmissionController
) -> None:
    url = server.route("/allow", allow())
    dry = replace(POD, dry_run=True)

    with pytest.raises(AdmissionError) as caught:
        await controller.validate(
            [config("c", webhook("fx.example.com", url, server.ca_bundle, sideEffects="Some"))], dry
        )
    assert caught.value.code == 400
    assert caught.value.message == 'admission webhook "fx.example.com" does not support dry run'
    assert server.received == []

    hook = webhook("safe.example.com", url, server.ca_bundle, sideEffects="NoneOnDryRun")
    await controller.validate([config("c", hook)], dry)
    assert server.calls("/allow")[0]["request"]["dryRun"] is True


async def test_match_conditions_fail_closed_or_skip(server: WebhookServer, controller: AdmissionController) -> None:
    url = server.route("/allow", allow())
    conditions = [{"name": "not-system", "expression": "request.userInfo.username != 'system:admin'"}]

    failing = webhook("cel.example.com", url, server.ca_bundle, matchConditions=conditions)
    with pytest.raises(AdmissionError) as caught:
        await controller.validate([config("c", failing)], POD)
    assert caught.value.code == 500
    assert "matchConditions (CEL) are not supported" in caught.value.message

    ignoring = webhook("cel.example.com", url, server.ca_bundle, matchConditions=conditions, failurePolicy="Ignore")
    assert await controller.mutate([config("c", ignoring)], POD) == (POD.object, [])
    assert server.received == []


async def test_patch_that_does_not_apply_is_an_internal_error_even_when_ignored(
    server: WebhookServer, controller: AdmissionController
) -> None:
    url = server.route("/bad-patch", patch(lambda obj: [{"op": "remove", "path": "/spec/nothing"}]))
    hook = webhook("bad-patch.example.com", url, server.ca_bundle, failurePolicy="Ignore")
    with pytest.raises(AdmissionError) as caught:
        await controller.mutate([config("c", hook)], POD)
    assert caught.value.code == 500
    assert caught.value.message.startswith("Internal error occurred: ")


async def test_patch_for_a_delete_is_refused(server: WebhookServer, controller: AdmissionController) -> None:
    url = server.route("/patch", patch(lambda obj: [{"op": "add", "path": "/x", "value": 1}]))
    hook = webhook("delete.example.com", url, server.ca_bundle)
    hook["rules"][0]["operations"] = ["DELETE"]
    deleting = replace(POD, operation="DELETE", object=None, old_object=POD.object)
    with pytest.raises(AdmissionError) as caught:
        await controller.mutate([config("c", hook)], deleting)
    assert caught.value.code == 500
    assert "attempted to modify the object, which is not supported for this operation" in caught.value.message
