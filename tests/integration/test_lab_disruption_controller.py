"""The disruption controller against the embedded API server, with the lab's other controllers and a stand-in
kubelet: a percentage budget follows its Deployment's scale, and a budget it cannot compute fails safe."""

from __future__ import annotations

from collections.abc import AsyncIterator
from typing import Any

import pytest
from tests.integration.lab_cluster import NS, Kubelet, add_node, settings, until

from ambit.apiserver.server import ApiServer
from ambit.k8s import KubeClient, kinds
from ambit.lab.controllers import ControllerManager

TEMPLATE = {"spec": {"containers": [{"name": "c", "image": "example.com/c:1"}]}}


@pytest.fixture
async def kube(apiserver: ApiServer) -> AsyncIterator[KubeClient]:
    async with (
        KubeClient.from_kubeconfig(apiserver.kubeconfig) as client,
        ControllerManager(client, settings(endpoints=False)),
        Kubelet(client),
    ):
        await add_node(client, "node-a")
        yield client


async def create_budget(kube: KubeClient, name: str, app: str, **spec: Any) -> None:
    body = {"metadata": {"name": name, "namespace": NS}, "spec": {"selector": {"matchLabels": {"app": app}}, **spec}}
    await kube.create(kinds.POD_DISRUPTION_BUDGETS, body)


async def status_is(kube: KubeClient, name: str, **want: Any) -> dict[str, Any] | None:
    status = (await kube.get(kinds.POD_DISRUPTION_BUDGETS, name, NS)).get("status") or {}
    return status if all(status.get(k) == v for k, v in want.items()) else None


def condition(status: dict[str, Any]) -> tuple[str, str, str]:
    cond = next(c for c in status["conditions"] if c["type"] == "DisruptionAllowed")
    return cond["status"], cond["reason"], cond.get("message", "")


async def test_a_max_unavailable_percentage_follows_the_deployments_scale(kube: KubeClient) -> None:
    template = {"metadata": {"labels": {"app": "web"}}, **TEMPLATE}
    spec = {"replicas": 4, "selector": {"matchLabels": {"app": "web"}}, "template": template}
    await kube.create(kinds.DEPLOYMENTS, {"metadata": {"name": "web", "namespace": NS}, "spec": spec})
    await create_budget(kube, "web", "web", maxUnavailable="25%")
    status = await until(
        lambda: status_is(kube, "web", expectedPods=4, currentHealthy=4, desiredHealthy=3, disruptionsAllowed=1),
        "the budget at 4 replicas",
        within=30,
    )
    assert condition(status)[:2] == ("True", "SufficientPods")
    await kube.patch(kinds.DEPLOYMENTS, "web", {"spec": {"replicas": 8}}, NS)
    await until(
        lambda: status_is(kube, "web", expectedPods=8, currentHealthy=8, desiredHealthy=6, disruptionsAllowed=2),
        "the budget at 8 replicas",
        within=30,
    )


async def test_a_budget_over_daemon_set_pods_with_a_percentage_fails_safe(kube: KubeClient) -> None:
    template = {"metadata": {"labels": {"app": "agent"}}, **TEMPLATE}
    spec = {"selector": {"matchLabels": {"app": "agent"}}, "template": template}
    await kube.create(kinds.DAEMON_SETS, {"metadata": {"name": "agent", "namespace": NS}, "spec": spec})
    await create_budget(kube, "agent", "agent", minAvailable="50%")
    status = await until(lambda: _failed(kube), "the fail-safe status", within=30)
    assert status.get("disruptionsAllowed", 0) == 0
    event = await until(lambda: _event(kube, "CalculateExpectedPodCountFailed"), "the Warning Event", within=30)
    assert event["type"] == "Warning"
    assert event["note"] == (
        "Failed to calculate the number of expected pods: daemonsets.apps does not implement the scale subresource"
    )
    await create_budget(kube, "agent-count", "agent", minAvailable=0)
    await until(
        lambda: status_is(kube, "agent-count", expectedPods=1, currentHealthy=1, disruptionsAllowed=1),
        "an integer budget over the same pods",
        within=30,
    )


async def _failed(kube: KubeClient) -> dict[str, Any] | None:
    status = (await kube.get(kinds.POD_DISRUPTION_BUDGETS, "agent", NS)).get("status") or {}
    if not status.get("conditions"):
        return None
    state, reason, message = condition(status)
    ok = (state, reason) == (
        "False",
        "SyncFailed",
    ) and message == "daemonsets.apps does not implement the scale subresource"
    return status if ok else None


async def _event(kube: KubeClient, reason: str) -> dict[str, Any] | None:
    events, _ = await kube.list(kinds.EVENTS, NS)
    return next((e for e in events if e.get("reason") == reason), None)
