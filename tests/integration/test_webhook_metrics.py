"""The validating webhook counts its verdicts as istiod does (``galley_validation_passed`` / ``_failed``): each
AdmissionReview posted to the real aiohttp application on loopback, the counts read from the control plane's
metrics."""

from __future__ import annotations

import json
from collections.abc import AsyncIterator
from typing import Any

import pytest
from aiohttp.test_utils import TestClient, TestServer

from ambit.controlplane.monitoring import ControlPlaneMetrics
from ambit.controlplane.webhook import build_app

SECURITY = ("security.istio.io", "v1", "authorizationpolicies")


def review(operation: str, obj: Any, *, kind: str = "AuthorizationPolicy", dry_run: bool = False) -> bytes:
    group, version, resource = SECURITY
    request = {
        "uid": "u-1",
        "operation": operation,
        "kind": {"group": group, "version": version, "kind": kind},
        "resource": {"group": group, "version": version, "resource": resource},
        "object": obj,
        "dryRun": dry_run,
    }
    return json.dumps({"apiVersion": "admission.k8s.io/v1", "kind": "AdmissionReview", "request": request}).encode()


GOOD = {"metadata": {"name": "p", "namespace": "shop"}, "spec": {"action": "DENY", "rules": [{}]}}
BAD = {"metadata": {"name": "p", "namespace": "shop"}, "spec": {"action": "NOPE"}}


@pytest.fixture
async def posted() -> AsyncIterator[tuple[TestClient[Any, Any], ControlPlaneMetrics]]:
    metrics = ControlPlaneMetrics(version="x", process=False)
    async with TestClient(TestServer(build_app(observer=metrics))) as client:
        yield client, metrics


async def post(client: TestClient[Any, Any], body: bytes) -> dict[str, Any]:
    response = await client.post("/validate", data=body, headers={"Content-Type": "application/json"})
    assert response.status == 200, await response.text()
    answer: dict[str, Any] = (await response.json())["response"]
    return answer


async def test_each_verdict_is_counted_with_its_reason(
    posted: tuple[TestClient[Any, Any], ControlPlaneMetrics],
) -> None:
    client, metrics = posted
    assert (await post(client, review("CREATE", GOOD)))["allowed"]
    assert not (await post(client, review("CREATE", BAD)))["allowed"]
    assert not (await post(client, review("UPDATE", GOOD, kind="Mystery")))["allowed"]
    assert (await post(client, review("DELETE", None)))["allowed"]
    assert metrics.validation_passed[SECURITY].value == 1
    assert metrics.validation_failed[(*SECURITY, "invalid_resource")].value == 1
    assert metrics.validation_failed[(*SECURITY, "unknown_type")].value == 1
    assert metrics.validation_failed[(*SECURITY, "unsupported_operation")].value == 1
    text = metrics.render().decode()
    assert (
        'galley_validation_passed{group="security.istio.io",resource="authorizationpolicies",version="v1"} 1.0' in text
    )


async def test_dry_runs_and_malformed_reviews_are_not_counted(
    posted: tuple[TestClient[Any, Any], ControlPlaneMetrics],
) -> None:
    client, metrics = posted
    assert not (await post(client, review("CREATE", BAD, dry_run=True)))["allowed"]
    response = await client.post("/validate", data=b"{not json")
    assert response.status == 400
    assert metrics.validation_passed == {} and metrics.validation_failed == {}
