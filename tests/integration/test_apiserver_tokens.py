"""TokenRequest and TokenReview over HTTP, and service-account tokens as API credentials.

Time is the server's injected clock (``manager.clock``): a TokenRequest may not be shorter than ten minutes, so
expiry is shown by moving the clock, not by waiting.
"""

from __future__ import annotations

import base64
import datetime
import json
import time
from collections.abc import AsyncIterator
from typing import Any

import pytest
from apiserver_client import ApiClient, JsonObject, assert_status, configmap, grant, pod

from ambit.apiserver.server import ApiServer
from ambit.apiserver.tokens import DEFAULT_ISSUER

NS = "/api/v1/namespaces/mesh"
REVIEWS = "/apis/authentication.k8s.io/v1/tokenreviews"
POD_NAME = "authentication.kubernetes.io/pod-name"
POD_UID = "authentication.kubernetes.io/pod-uid"


@pytest.fixture
async def api(apiserver: ApiServer) -> AsyncIterator[ApiClient]:
    async with ApiClient.for_server(apiserver) as client:
        await client.create("/api/v1/namespaces", {"metadata": {"name": "mesh"}})
        await client.create(f"{NS}/serviceaccounts", {"metadata": {"name": "ztunnel"}})
        ztunnel = pod("ztunnel-abc", namespace="mesh", node="node-1")
        ztunnel["spec"]["serviceAccountName"] = "ztunnel"
        await client.create(f"{NS}/pods", ztunnel)
        await client.create(f"{NS}/pods", pod("app-1", namespace="mesh", node="node-1"))  # runs as default
        yield client


def token_request(
    audiences: list[str] | None = None, *, pod_ref: JsonObject | None = None, seconds: int = 3600
) -> JsonObject:
    spec: JsonObject = {"expirationSeconds": seconds}
    if audiences is not None:
        spec["audiences"] = audiences
    if pod_ref is not None:
        spec["boundObjectRef"] = pod_ref
    return {"apiVersion": "authentication.k8s.io/v1", "kind": "TokenRequest", "spec": spec}


async def pod_ref(api: ApiClient, name: str = "ztunnel-abc") -> JsonObject:
    found = await api.must_get(f"{NS}/pods/{name}")
    return {"kind": "Pod", "apiVersion": "v1", "name": name, "uid": found["metadata"]["uid"]}


async def request_token(api: ApiClient, body: JsonObject, sa: str = "ztunnel") -> str:
    reply = await api.post(f"{NS}/serviceaccounts/{sa}/token", body)
    assert reply.status == 201, reply.body
    token: str = reply.body["status"]["token"]
    return token


async def review(api: ApiClient, token: str, audiences: list[str] | None = None) -> JsonObject:
    spec: JsonObject = {"token": token}
    if audiences is not None:
        spec["audiences"] = audiences
    reply = await api.post(REVIEWS, {"apiVersion": "authentication.k8s.io/v1", "kind": "TokenReview", "spec": spec})
    assert reply.status == 201, reply.body
    assert reply.body["kind"] == "TokenReview"
    status: JsonObject = reply.body["status"]
    return status


def freeze_clock(apiserver: ApiServer) -> float:
    """Stop the server's clock at the current second's start; move_clock then counts from there.

    Tokens carry whole seconds (``iat = int(now)``), so a running clock that crosses a second between issuing and
    reviewing a token would shorten its life by up to a second: a test that moves the clock to one second before
    expiry must not depend on the machine's speed.
    """
    assert apiserver.manager is not None
    base = float(int(time.time()))
    apiserver.manager.clock = lambda: base
    return base


def move_clock(apiserver: ApiServer, base: float, seconds: float) -> None:
    assert apiserver.manager is not None
    apiserver.manager.clock = lambda: base + seconds


async def test_token_request_answers_a_token_request_with_its_expiry(api: ApiClient) -> None:
    ref = await pod_ref(api)
    reply = await api.post(f"{NS}/serviceaccounts/ztunnel/token", token_request(["istio-ca"], pod_ref=ref))
    assert reply.status == 201, reply.body
    body = reply.body
    assert body["kind"] == "TokenRequest" and body["apiVersion"] == "authentication.k8s.io/v1"
    assert body["spec"]["audiences"] == ["istio-ca"] and body["spec"]["expirationSeconds"] == 3600
    assert body["spec"]["boundObjectRef"] == ref
    assert body["status"]["token"].count(".") == 2
    assert body["status"]["expirationTimestamp"].endswith("Z")


async def test_review_of_a_pod_bound_token(api: ApiClient) -> None:
    sa = await api.must_get(f"{NS}/serviceaccounts/ztunnel")
    ref = await pod_ref(api)
    token = await request_token(api, token_request(["istio-ca", "other"], pod_ref=ref))
    status = await review(api, token, ["istio-ca"])
    assert status["authenticated"] is True, status
    user = status["user"]
    assert user["username"] == "system:serviceaccount:mesh:ztunnel"
    assert user["uid"] == sa["metadata"]["uid"]
    assert user["groups"] == ["system:serviceaccounts", "system:serviceaccounts:mesh", "system:authenticated"]
    assert user["extra"][POD_NAME] == ["ztunnel-abc"]
    assert user["extra"][POD_UID] == [ref["uid"]]
    assert status["audiences"] == ["istio-ca"]
    assert "error" not in status


async def test_review_without_audiences_checks_the_api_servers_own(api: ApiClient) -> None:
    default = await request_token(api, token_request())
    status = await review(api, default)
    assert status["authenticated"] is True and status["audiences"] == [DEFAULT_ISSUER]
    istio = await request_token(api, token_request(["istio-ca"]))
    assert not (await review(api, istio)).get("authenticated")


async def test_review_with_the_wrong_audience_is_unauthenticated(api: ApiClient) -> None:
    token = await request_token(api, token_request(["istio-ca"]))
    status = await review(api, token, ["vault"])
    assert not status.get("authenticated")
    assert status["error"] == 'token audiences ["istio-ca"] is invalid for the target audiences ["vault"]'


async def test_expired_token(apiserver: ApiServer, api: ApiClient) -> None:
    base = freeze_clock(apiserver)
    token = await request_token(api, token_request(["istio-ca"], seconds=600))
    move_clock(apiserver, base, 599)
    assert (await review(api, token, ["istio-ca"]))["authenticated"] is True
    move_clock(apiserver, base, 601)
    status = await review(api, token, ["istio-ca"])
    assert not status.get("authenticated") and "expired" in status["error"]


async def test_token_of_a_deleted_pod_is_refused(api: ApiClient) -> None:
    token = await request_token(api, token_request(["istio-ca"], pod_ref=await pod_ref(api)))
    await api.delete(f"{NS}/pods/ztunnel-abc", gracePeriodSeconds="0")
    status = await review(api, token, ["istio-ca"])
    assert not status.get("authenticated")
    assert status["error"] == 'pods "ztunnel-abc" not found'


async def test_token_of_a_recreated_pod_is_refused(api: ApiClient) -> None:
    token = await request_token(api, token_request(["istio-ca"], pod_ref=await pod_ref(api)))
    await api.delete(f"{NS}/pods/ztunnel-abc", gracePeriodSeconds="0")
    await api.create(f"{NS}/pods", pod("ztunnel-abc", namespace="mesh"))
    status = await review(api, token, ["istio-ca"])
    assert not status.get("authenticated") and "pod UID" in status["error"]


async def test_token_of_a_pod_past_its_deletion_time_is_refused(apiserver: ApiServer, api: ApiClient) -> None:
    base = freeze_clock(apiserver)
    token = await request_token(api, token_request(["istio-ca"], pod_ref=await pod_ref(api)))
    await api.delete(f"{NS}/pods/ztunnel-abc")  # graceful: 30 s
    assert (await review(api, token, ["istio-ca"]))["authenticated"] is True
    move_clock(apiserver, base, 60)
    status = await review(api, token, ["istio-ca"])
    assert not status.get("authenticated") and status["error"] == "token has been invalidated"


async def test_token_of_a_deleted_and_recreated_service_account_is_refused(api: ApiClient) -> None:
    token = await request_token(api, token_request(["istio-ca"]))
    await api.delete(f"{NS}/serviceaccounts/ztunnel")
    status = await review(api, token, ["istio-ca"])
    assert not status.get("authenticated") and status["error"] == 'serviceaccounts "ztunnel" not found'
    await api.create(f"{NS}/serviceaccounts", {"metadata": {"name": "ztunnel"}})
    status = await review(api, token, ["istio-ca"])
    assert not status.get("authenticated")
    assert "service account UID" in status["error"] and "does not match claim" in status["error"]


@pytest.mark.parametrize("token", ["", "garbage", "a.b.c", "eyJhbGciOiJub25lIn0.eyJzdWIiOiJ4In0."])
async def test_review_of_a_malformed_token(api: ApiClient, token: str) -> None:
    if not token:
        assert_status(await api.post(REVIEWS, {"spec": {"token": ""}}), 422, "Invalid", "spec.token")
        return
    status = await review(api, token)
    assert not status.get("authenticated") and status["error"]


@pytest.mark.parametrize(
    ("sa", "body", "code", "reason"),
    [
        ("missing", token_request(), 404, "NotFound"),
        ("ztunnel", token_request(seconds=60), 422, "Invalid"),
        ("ztunnel", token_request(["istio-ca"], pod_ref={"kind": "Pod", "name": "nope"}), 404, "NotFound"),
        ("ztunnel", token_request(pod_ref={"kind": "Pod", "name": "ztunnel-abc", "uid": "not-it"}), 409, "Conflict"),
        ("ztunnel", token_request(pod_ref={"kind": "Secret", "name": "s"}), 400, "BadRequest"),
        (
            "ztunnel",
            token_request(pod_ref={"kind": "Pod", "apiVersion": "apps/v1", "name": "ztunnel-abc"}),
            400,
            "BadRequest",
        ),
        ("ztunnel", token_request(pod_ref={"kind": "Pod", "name": "app-1"}), 400, "BadRequest"),
        ("default", token_request(pod_ref={"kind": "Pod", "name": "ztunnel-abc"}), 400, "BadRequest"),
        ("ztunnel", token_request(seconds=2**32 + 1), 422, "Invalid"),
        ("ztunnel", token_request(pod_ref={"kind": "Pod"}), 422, "Invalid"),
        ("ztunnel", {"spec": {"audiences": "istio-ca"}}, 422, "Invalid"),
        ("ztunnel", {"spec": ["audiences"]}, 400, "BadRequest"),
        ("ztunnel", {"spec": []}, 400, "BadRequest"),
    ],
    ids=[
        "no-service-account",
        "too-short",
        "missing-pod",
        "pod-uid-mismatch",
        "not-a-pod",
        "not-a-core-pod",
        "pod-of-another-service-account",
        "default-token-for-a-ztunnel-pod",
        "above-2^32",
        "pod-without-name",
        "audiences-not-list",
        "spec-not-object",
        "spec-empty-list",
    ],
)
async def test_bad_token_request(api: ApiClient, sa: str, body: Any, code: int, reason: str) -> None:
    assert_status(await api.post(f"{NS}/serviceaccounts/{sa}/token", body), code, reason)


async def test_binding_to_a_pod_of_another_service_account_is_refused_as_kube_does(api: ApiClient) -> None:
    reply = await api.post(
        f"{NS}/serviceaccounts/ztunnel/token", token_request(pod_ref={"kind": "Pod", "name": "app-1"})
    )
    assert_status(reply, 400, "BadRequest")
    assert reply.body["message"] == (
        'cannot bind token for serviceaccount "ztunnel" to pod running with different serviceaccount name.'
    )


async def test_a_too_short_or_too_long_expiration_has_kubes_message(api: ApiClient) -> None:
    short = await api.post(f"{NS}/serviceaccounts/ztunnel/token", token_request(seconds=599))
    assert_status(short, 422, "Invalid")
    assert (
        "spec.expirationSeconds: Invalid value: 599: may not specify a duration less than 10 minutes"
        in (short.body["message"])
    )
    long = await api.post(f"{NS}/serviceaccounts/ztunnel/token", token_request(seconds=2**32 + 1))
    assert "may not specify a duration larger than 2^32 seconds" in long.body["message"]


async def test_a_long_token_is_capped_at_the_maximum_and_the_answer_says_so(api: ApiClient) -> None:
    before = time.time()
    reply = await api.post(f"{NS}/serviceaccounts/ztunnel/token", token_request(["istio-ca"], seconds=2**32))
    assert reply.status == 201, reply.body
    assert reply.body["spec"]["expirationSeconds"] == 48 * 3600
    expires = datetime.datetime.fromisoformat(reply.body["status"]["expirationTimestamp"]).timestamp()
    assert before + 48 * 3600 - 2 <= expires <= time.time() + 48 * 3600 + 2
    claims = json.loads(base64.urlsafe_b64decode(reply.body["status"]["token"].split(".")[1] + "=="))
    assert claims["exp"] - claims["iat"] == 48 * 3600


async def test_token_request_for_a_missing_namespace_is_404(api: ApiClient) -> None:
    reply = await api.post("/api/v1/namespaces/nowhere/serviceaccounts/default/token", token_request())
    assert_status(reply, 404, "NotFound")


# -- tokens as credentials ------------------------------------------------------------------------------------


async def test_service_account_token_for_the_api_server_authenticates_requests(
    apiserver: ApiServer, api: ApiClient
) -> None:
    token = await request_token(api, token_request())
    async with ApiClient.for_server(apiserver, token) as as_sa:
        assert_status(await as_sa.get("/api/v1/namespaces/mesh/pods"), 403, "Forbidden")  # authenticated, not allowed
        await grant(api, "edit", "mesh", "ztunnel")
        listed = await as_sa.get("/api/v1/namespaces/mesh/pods")
        assert listed.status == 200 and listed.names() == ["app-1", "ztunnel-abc"]
        created = await as_sa.post("/api/v1/namespaces/mesh/configmaps", configmap("by-sa", namespace="mesh"))
        assert created.status == 201


async def test_token_for_another_audience_does_not_authenticate_requests(apiserver: ApiServer, api: ApiClient) -> None:
    token = await request_token(api, token_request(["istio-ca"]))
    async with ApiClient.for_server(apiserver, token) as as_sa:
        assert_status(await as_sa.get("/api/v1/namespaces/mesh/pods"), 401, "Unauthorized")


async def test_expired_or_orphaned_token_does_not_authenticate_requests(apiserver: ApiServer, api: ApiClient) -> None:
    base = freeze_clock(apiserver)
    token = await request_token(api, token_request(pod_ref=await pod_ref(api)))
    await grant(api, "view", "mesh", "ztunnel")
    async with ApiClient.for_server(apiserver, token) as as_sa:
        assert (await as_sa.get("/api/v1/namespaces/mesh/pods")).status == 200
        move_clock(apiserver, base, 3600)
        assert_status(await as_sa.get("/api/v1/namespaces/mesh/pods"), 401)
        move_clock(apiserver, base, 0)
        assert (await as_sa.get("/api/v1/namespaces/mesh/pods")).status == 200
        await api.delete(f"{NS}/pods/ztunnel-abc", gracePeriodSeconds="0")
        assert_status(await as_sa.get("/api/v1/namespaces/mesh/pods"), 401)
