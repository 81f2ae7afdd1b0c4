"""The eviction subresource (``POST .../pods/<name>/eviction``) of the embedded API server, over HTTP: budgets
honoured as kube-apiserver honours them, and bad requests refused with nothing deleted.

The budgets' status is written here by hand (as the disruption controller would), so each case states exactly what
the budget allows."""

from __future__ import annotations

from collections.abc import AsyncIterator
from typing import Any

import pytest
from apiserver_client import ApiClient, JsonObject, grant, pod

from ambit.apiserver.server import ApiServer

PODS = "/api/v1/namespaces/apps/pods"
PDBS = "/apis/policy/v1/namespaces/apps/poddisruptionbudgets"


@pytest.fixture
async def api(apiserver: ApiServer) -> AsyncIterator[ApiClient]:
    async with ApiClient.for_server(apiserver) as client:
        for ns in ("apps", "other"):
            assert (await client.post("/api/v1/namespaces", {"metadata": {"name": ns}})).status == 201
        yield client


async def running_pod(api: ApiClient, name: str, *, ready: bool = True, phase: str = "Running") -> JsonObject:
    created = await api.create(PODS, pod(name, "apps", labels={"app": "web"}))
    status = {"phase": phase, "conditions": [{"type": "Ready", "status": "True" if ready else "False"}]}
    reply = await api.patch(f"{PODS}/{name}/status", {"status": status})
    assert reply.status == 200, reply.body
    return created


async def budget(api: ApiClient, name: str, allowed: int, *, healthy: int = 2, desired: int = 2, **spec: Any) -> None:
    body = {
        "apiVersion": "policy/v1",
        "kind": "PodDisruptionBudget",
        "metadata": {"name": name},
        "spec": {"minAvailable": desired, "selector": {"matchLabels": {"app": "web"}}, **spec},
    }
    await api.create(PDBS, body)
    status = {
        "disruptionsAllowed": allowed,
        "currentHealthy": healthy,
        "desiredHealthy": desired,
        "expectedPods": healthy,
        "observedGeneration": 1,
    }
    reply = await api.patch(f"{PDBS}/{name}/status", {"status": status})
    assert reply.status == 200, reply.body


def eviction(name: str, namespace: str = "apps", version: str = "policy/v1", **extra: Any) -> JsonObject:
    return {"apiVersion": version, "kind": "Eviction", "metadata": {"name": name, "namespace": namespace}, **extra}


async def gone_or_terminating(api: ApiClient, name: str) -> bool:
    reply = await api.get(f"{PODS}/{name}")
    return reply.status == 404 or bool(reply.body["metadata"].get("deletionTimestamp"))


async def test_discovery_lists_the_eviction_subresource_so_kubectl_uses_it(api: ApiClient) -> None:
    doc = await api.must_get("/api/v1")
    entry = next(r for r in doc["resources"] if r["name"] == "pods/eviction")
    assert entry["verbs"] == ["create"]
    assert (entry["group"], entry["version"], entry["kind"]) == ("policy", "v1", "Eviction")


async def test_a_pod_without_a_budget_is_evicted_and_marked_as_a_disruption_target(api: ApiClient) -> None:
    await running_pod(api, "web-1")
    reply = await api.post(f"{PODS}/web-1/eviction", eviction("web-1"))
    assert (reply.status, reply.body["kind"], reply.body["status"]) == (201, "Status", "Success")
    assert await gone_or_terminating(api, "web-1")


async def test_a_budget_with_no_disruptions_left_refuses_with_429_and_keeps_the_pod(api: ApiClient) -> None:
    await running_pod(api, "web-1")
    await budget(api, "web", 0, healthy=1, desired=1)
    reply = await api.post(f"{PODS}/web-1/eviction", eviction("web-1"))
    assert (reply.status, reply.body["reason"]) == (429, "TooManyRequests")
    assert reply.body["message"] == "Cannot evict pod as it would violate the pod's disruption budget."
    assert reply.body["details"]["causes"] == [
        {"reason": "DisruptionBudget", "message": "The disruption budget web needs 1 healthy pods and has 1 currently"}
    ]
    assert not await gone_or_terminating(api, "web-1")


async def test_an_allowed_eviction_charges_the_budget_and_records_the_pod(api: ApiClient) -> None:
    await running_pod(api, "web-1")
    await running_pod(api, "web-2")
    await budget(api, "web", 1, healthy=2, desired=1)
    assert (await api.post(f"{PODS}/web-1/eviction", eviction("web-1"))).status == 201
    assert await gone_or_terminating(api, "web-1")
    status = (await api.must_get(f"{PDBS}/web"))["status"]
    assert status["disruptionsAllowed"] == 0 and set(status["disruptedPods"]) == {"web-1"}
    cond = next(c for c in status["conditions"] if c["type"] == "DisruptionAllowed")
    assert (cond["status"], cond["reason"]) == ("False", "InsufficientPods")
    refused = await api.post(f"{PODS}/web-2/eviction", eviction("web-2"))
    assert refused.status == 429
    assert not await gone_or_terminating(api, "web-2")


async def test_a_budget_the_controller_has_not_caught_up_with_refuses_with_a_retry_after(api: ApiClient) -> None:
    await running_pod(api, "web-1")
    await budget(api, "web", 1, healthy=2, desired=1)
    reply = await api.patch(f"{PDBS}/web", {"spec": {"minAvailable": 0}})
    assert reply.body["metadata"]["generation"] == 2
    refused = await api.post(f"{PODS}/web-1/eviction", eviction("web-1"))
    assert (refused.status, refused.body["details"]["retryAfterSeconds"]) == (429, 10)
    assert "is still being processed by the server" in refused.body["details"]["causes"][0]["message"]


async def test_a_pod_under_two_budgets_is_not_evicted_and_the_answer_is_kubes_500(api: ApiClient) -> None:
    await running_pod(api, "web-1")
    await budget(api, "web", 1, healthy=2, desired=1)
    await budget(api, "web-too", 1, healthy=2, desired=1)
    reply = await api.post(f"{PODS}/web-1/eviction", eviction("web-1"))
    assert reply.status == 500
    assert reply.body["message"] == (
        "This pod has more than one PodDisruptionBudget, which the eviction subresource does not support."
    )
    assert not await gone_or_terminating(api, "web-1")


async def test_pending_and_unready_pods_pass_a_budget_with_nothing_left_as_kube_lets_them(api: ApiClient) -> None:
    await running_pod(api, "pending", phase="Pending", ready=False)
    await running_pod(api, "unready", ready=False)
    await budget(api, "web", 0, healthy=2, desired=2)
    assert (await api.post(f"{PODS}/pending/eviction", eviction("pending"))).status == 201
    assert (await api.post(f"{PODS}/unready/eviction", eviction("unready", version="policy/v1beta1"))).status == 201
    assert await gone_or_terminating(api, "pending") and await gone_or_terminating(api, "unready")
    assert (await api.must_get(f"{PDBS}/web"))["status"]["disruptionsAllowed"] == 0


async def test_an_unready_pod_is_held_when_the_budget_lacks_healthy_pods_unless_it_always_allows(
    api: ApiClient,
) -> None:
    await running_pod(api, "unready", ready=False)
    await budget(api, "web", 0, healthy=1, desired=2)
    assert (await api.post(f"{PODS}/unready/eviction", eviction("unready"))).status == 429
    assert (await api.patch(f"{PDBS}/web", {"spec": {"unhealthyPodEvictionPolicy": "AlwaysAllow"}})).status == 200
    assert (await api.post(f"{PODS}/unready/eviction", eviction("unready"))).status == 201


async def test_delete_options_preconditions_and_dry_run_are_honoured(api: ApiClient) -> None:
    await running_pod(api, "web-1")
    await budget(api, "web", 1, healthy=2, desired=1)
    before = (await api.must_get(f"{PDBS}/web"))["metadata"]["resourceVersion"]
    dry = await api.request("POST", f"{PODS}/web-1/eviction", eviction("web-1"), params={"dryRun": "All"})
    assert dry.status == 201
    assert not await gone_or_terminating(api, "web-1")
    assert (await api.must_get(f"{PDBS}/web"))["metadata"]["resourceVersion"] == before
    # As in kube, the budget is charged before the delete's preconditions are checked: the controller gives the
    # disruption back once the entry in disruptedPods expires.
    stale = eviction("web-1", deleteOptions={"preconditions": {"uid": "not-the-pods-uid"}})
    reply = await api.post(f"{PODS}/web-1/eviction", stale)
    assert reply.status == 409 and "Precondition failed: UID" in reply.body["message"]
    assert not await gone_or_terminating(api, "web-1")


# -- attacks: each is refused with a clear 4xx and nothing is deleted ----------------------------------------------


async def test_an_eviction_naming_another_namespace_than_the_url_is_refused(api: ApiClient) -> None:
    await running_pod(api, "web-1")
    await api.create("/api/v1/namespaces/other/pods", pod("web-1", "other"))
    reply = await api.post(f"{PODS}/web-1/eviction", eviction("web-1", namespace="other"))
    assert reply.status == 400
    assert "does not match the namespace sent on the request" in reply.body["message"]
    assert not await gone_or_terminating(api, "web-1")
    assert (await api.get("/api/v1/namespaces/other/pods/web-1")).status == 200


async def test_bodies_that_are_not_an_eviction_of_the_urls_pod_are_refused(api: ApiClient) -> None:
    await running_pod(api, "web-1")
    for body in (
        pod("web-1", "apps"),
        {"apiVersion": "policy/v1", "kind": "Eviction", "metadata": {"name": "web-2"}},
        {"apiVersion": "policy/v1", "kind": "Eviction"},
        ["not", "an", "object"],
        eviction("web-1", deleteOptions="all"),
        eviction("web-1", deleteOptions={"gracePeriodSeconds": "soon"}),
    ):
        reply = await api.post(f"{PODS}/web-1/eviction", body)
        assert reply.status == 400, (body, reply.body)
        assert reply.body["kind"] == "Status" and reply.body["message"]
    reply = await api.request("POST", f"{PODS}/web-1/eviction", data=b"{not json", content_type="application/json")
    assert reply.status == 400
    assert (await api.get(f"{PODS}/web-1/eviction")).status == 405
    assert not await gone_or_terminating(api, "web-1")


async def test_an_oversized_eviction_is_refused_before_it_is_read(api: ApiClient) -> None:
    await running_pod(api, "web-1")
    padding = "x" * (4 * 1024 * 1024)
    reply = await api.post(f"{PODS}/web-1/eviction", eviction("web-1", padding=padding))
    assert reply.status == 413
    assert not await gone_or_terminating(api, "web-1")


async def test_only_users_allowed_to_create_pods_eviction_may_evict(apiserver: ApiServer, api: ApiClient) -> None:
    await running_pod(api, "web-1")
    assert (await api.post("/api/v1/namespaces/apps/serviceaccounts", {"metadata": {"name": "viewer"}})).status == 201
    assert (await api.post("/api/v1/namespaces/apps/serviceaccounts", {"metadata": {"name": "editor"}})).status == 201
    await grant(api, "view", "apps", "viewer")
    await grant(api, "edit", "apps", "editor")

    async def as_account(account: str) -> ApiClient:
        reply = await api.post(f"/api/v1/namespaces/apps/serviceaccounts/{account}/token", {"spec": {}})
        return ApiClient.for_server(apiserver, reply.body["status"]["token"])

    async with await as_account("viewer") as viewer:
        reply = await viewer.post(f"{PODS}/web-1/eviction", eviction("web-1"))
        assert reply.status == 403 and 'cannot create resource "pods/eviction"' in reply.body["message"]
    assert not await gone_or_terminating(api, "web-1")
    async with await as_account("editor") as editor:
        assert (await editor.post(f"{PODS}/web-1/eviction", eviction("web-1"))).status == 201
    assert await gone_or_terminating(api, "web-1")
