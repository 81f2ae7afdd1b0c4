"""The evictions of ``ambit lab node remove``'s drain (ambit.lab.cluster.leave.evict_pods) against the embedded API
server and the lab's controllers: a budget that cannot spare a pod stops the drain naming the pod and the budget
once its time is up; a refused eviction is tried again and goes through once the budget allows it."""

from __future__ import annotations

import asyncio
import time
from collections.abc import AsyncIterator
from typing import Any

import pytest
from tests.integration.lab_cluster import NS, Kubelet, add_node, settings, until

from ambit.apiserver.server import ApiServer
from ambit.k8s import KubeClient, kinds
from ambit.lab.cluster.leave import EVICTION_RETRY, evict_pods
from ambit.lab.cluster.lifecycle import LabError
from ambit.lab.controllers import ControllerManager

LABELS = {"app": "web"}


@pytest.fixture
async def kube(apiserver: ApiServer) -> AsyncIterator[KubeClient]:
    async with (
        KubeClient.from_kubeconfig(apiserver.kubeconfig) as client,
        ControllerManager(client, settings(endpoints=False)),
        Kubelet(client),
    ):
        await add_node(client, "node-a")
        yield client


async def web_with_budget(kube: KubeClient, min_available: int) -> list[dict[str, Any]]:
    template = {"metadata": {"labels": LABELS}, "spec": {"containers": [{"name": "web", "image": "example.com/w:1"}]}}
    spec = {"replicas": 2, "selector": {"matchLabels": LABELS}, "template": template}
    await kube.create(kinds.DEPLOYMENTS, {"metadata": {"name": "web", "namespace": NS}, "spec": spec})
    pdb = {"minAvailable": min_available, "selector": {"matchLabels": LABELS}}
    await kube.create(kinds.POD_DISRUPTION_BUDGETS, {"metadata": {"name": "web", "namespace": NS}, "spec": pdb})

    async def settled() -> bool:
        status = (await kube.get(kinds.POD_DISRUPTION_BUDGETS, "web", NS)).get("status") or {}
        return status.get("currentHealthy") == 2 and status.get("observedGeneration") == 1

    await until(settled, "the budget to count two healthy pods", within=30)
    return (await kube.list(kinds.PODS, NS, label_selector=LABELS))[0]


async def test_a_budget_that_cannot_spare_a_pod_stops_the_drain_naming_pod_and_budget(kube: KubeClient) -> None:
    pods = await web_with_budget(kube, 2)
    with pytest.raises(LabError) as caught:
        await evict_pods(kube, "node-a", pods, time.monotonic() + 1, 1)
    message = str(caught.value)
    assert "node-a is cordoned, not drained" in message
    assert f"{NS}/{pods[0]['metadata']['name']}" in message
    assert "The disruption budget web needs 2 healthy pods and has 2 currently" in message
    assert "--disable-eviction" in message
    assert len((await kube.list(kinds.PODS, NS, label_selector=LABELS))[0]) == 2


async def test_a_refused_eviction_is_retried_until_the_budget_allows_it(kube: KubeClient) -> None:
    pods = await web_with_budget(kube, 2)
    drain = asyncio.create_task(evict_pods(kube, "node-a", pods[:1], time.monotonic() + 60, 60))
    await asyncio.sleep(0.5)
    assert not drain.done()  # refused once, waiting to try again
    await kube.patch(kinds.POD_DISRUPTION_BUDGETS, "web", {"spec": {"minAvailable": 1}}, NS)
    await asyncio.wait_for(drain, EVICTION_RETRY * 4)
    evicted = pods[0]["metadata"]["uid"]

    async def gone() -> bool:
        live = (await kube.list(kinds.PODS, NS, label_selector=LABELS))[0]
        return evicted not in {p["metadata"]["uid"] for p in live}

    await until(gone, "the evicted pod gone")
