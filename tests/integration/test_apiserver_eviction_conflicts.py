"""Evictions that meet a concurrent writer between their read and their write, as kube-apiserver's ``EvictionREST``
meets them: the pod's and the budget's writes are conditional on the version read, a conflict reads again and
retries, and a budget is never charged past zero nor a pod evicted twice.

The concurrent writer is real: a validating admission webhook (a real HTTPS server) holds the eviction's own write
in admission while another write lands, exactly the window in which kube-apiserver's etcd compare-and-swap fails."""

from __future__ import annotations

import asyncio
import contextlib
from collections.abc import AsyncIterator
from pathlib import Path

import pytest
from admission_hook import HookAddress, JsonObject, allow, serving, validating_configuration
from apiserver_client import ApiClient, pod

from ambit.apiserver.server import ApiServer

PODS = "/api/v1/namespaces/apps/pods"
PDBS = "/apis/policy/v1/namespaces/apps/poddisruptionbudgets"
VALIDATING = "/apis/admissionregistration.k8s.io/v1/validatingwebhookconfigurations"
HOLD = "example.com/hold"
BARRIER_SECONDS = 15.0
"""How long the first budget write waits in admission for the second; the webhook times out at 20 s."""


@pytest.fixture
async def api(apiserver: ApiServer) -> AsyncIterator[ApiClient]:
    async with ApiClient.for_server(apiserver) as client:
        assert (await client.post("/api/v1/namespaces", {"metadata": {"name": "apps"}})).status == 201
        yield client


async def held_pod(api: ApiClient, name: str, phase: str) -> None:
    """A pod with a finalizer, so that it stays readable (terminating) after its eviction."""
    await api.create(PODS, pod(name, "apps", labels={"app": "web"}, finalizers=[HOLD]))
    status = {"phase": phase, "conditions": [{"type": "Ready", "status": "True" if phase == "Running" else "False"}]}
    assert (await api.patch(f"{PODS}/{name}/status", {"status": status})).status == 200


async def evict(api: ApiClient, name: str) -> int:
    body = {"apiVersion": "policy/v1", "kind": "Eviction", "metadata": {"name": name, "namespace": "apps"}}
    return (await api.post(f"{PODS}/{name}/eviction", body)).status


def is_terminating(obj: JsonObject) -> bool:
    return bool(obj["metadata"].get("deletionTimestamp"))


@pytest.mark.parametrize("phase", ["Running", "Pending"])
async def test_a_pod_written_between_the_evictions_read_and_write_is_read_again_and_evicted_once(
    api: ApiClient, tmp_path: Path, phase: str
) -> None:
    await held_pod(api, "web-1", phase)
    writes: list[int] = []

    async def write_the_pod_first(review: JsonObject) -> JsonObject:
        if not writes:  # the eviction's first write of the pod: another writer gets there first
            reply = await api.patch(f"{PODS}/web-1", {"metadata": {"labels": {"writer": "concurrent"}}})
            writes.append(reply.status)
        return allow(review)

    async with serving(tmp_path, write_the_pod_first) as hook:
        await api.create(
            VALIDATING, validating_configuration("race.example.com", hook, group="", resource="pods/status")
        )
        assert await evict(api, "web-1") == 201
    assert writes == [200]
    evicted = await api.must_get(f"{PODS}/web-1")
    assert is_terminating(evicted)
    assert evicted["metadata"]["labels"]["writer"] == "concurrent", "the concurrent write was not overwritten"
    targets = [c for c in evicted["status"]["conditions"] if c["type"] == "DisruptionTarget"]
    assert [(c["status"], c["reason"]) for c in targets] == [("True", "EvictionByEvictionAPI")]


async def budget_allowing_one(api: ApiClient) -> None:
    body = {
        "apiVersion": "policy/v1",
        "kind": "PodDisruptionBudget",
        "metadata": {"name": "web"},
        "spec": {"minAvailable": 1, "selector": {"matchLabels": {"app": "web"}}},
    }
    await api.create(PDBS, body)
    status = {
        "disruptionsAllowed": 1,
        "currentHealthy": 2,
        "desiredHealthy": 1,
        "expectedPods": 2,
        "observedGeneration": 1,
    }
    assert (await api.patch(f"{PDBS}/web/status", {"status": status})).status == 200


async def both_in_flight(hook_seen: list[JsonObject], both: asyncio.Event, review: JsonObject) -> JsonObject:
    hook_seen.append(review)
    if len(hook_seen) >= 2:
        both.set()
    with contextlib.suppress(TimeoutError):
        async with asyncio.timeout(BARRIER_SECONDS):
            await both.wait()
    return allow(review)


async def configure_budget_barrier(api: ApiClient, hook: HookAddress) -> None:
    config = validating_configuration(
        "budget.example.com", hook, group="policy", resource="poddisruptionbudgets/status"
    )
    await api.create(VALIDATING, config)


async def test_two_concurrent_evictions_against_a_budget_allowing_one_evict_one_pod_and_refuse_the_other(
    api: ApiClient, tmp_path: Path
) -> None:
    await held_pod(api, "web-1", "Running")
    await held_pod(api, "web-2", "Running")
    await budget_allowing_one(api)
    seen: list[JsonObject] = []
    both = asyncio.Event()

    async def barrier(review: JsonObject) -> JsonObject:
        return await both_in_flight(seen, both, review)

    async with serving(tmp_path, barrier) as hook:
        await configure_budget_barrier(api, hook)
        answers = await asyncio.gather(evict(api, "web-1"), evict(api, "web-2"))
    # Both evictions had read the budget allowing one and were writing its status at the same time.
    assert len(seen) == 2 and both.is_set()
    assert sorted(answers) == [201, 429]
    pods = [await api.must_get(f"{PODS}/{name}") for name in ("web-1", "web-2")]
    evicted = [p["metadata"]["name"] for p in pods if is_terminating(p)]
    assert len(evicted) == 1
    status = (await api.must_get(f"{PDBS}/web"))["status"]
    assert status["disruptionsAllowed"] == 0
    assert list(status["disruptedPods"]) == evicted


async def test_a_budget_write_that_keeps_losing_to_concurrent_writers_fails_with_kubes_timeout_and_charges_nothing(
    api: ApiClient, tmp_path: Path
) -> None:
    await held_pod(api, "web-1", "Running")
    await budget_allowing_one(api)
    rewrites: list[int] = []

    async def rewrite_the_budget(review: JsonObject) -> JsonObject:
        if review["request"]["userInfo"]["username"] == "system:apiserver":  # the eviction's charge, not ours
            reply = await api.patch(f"{PDBS}/web", {"metadata": {"annotations": {"rewrites": str(len(rewrites))}}})
            rewrites.append(reply.status)
        return allow(review)

    async with serving(tmp_path, rewrite_the_budget) as hook:
        await configure_budget_barrier(api, hook)
        reply = await api.post(
            f"{PODS}/web-1/eviction",
            {"apiVersion": "policy/v1", "kind": "Eviction", "metadata": {"name": "web-1", "namespace": "apps"}},
        )
    assert (reply.status, reply.body["reason"]) == (504, "Timeout")
    assert reply.body["message"] == 'couldn\'t update PodDisruptionBudget "web" due to conflicts'
    assert rewrites == [200] * 20
    assert not is_terminating(await api.must_get(f"{PODS}/web-1"))
    status = (await api.must_get(f"{PDBS}/web"))["status"]
    assert status["disruptionsAllowed"] == 1 and not status.get("disruptedPods")
