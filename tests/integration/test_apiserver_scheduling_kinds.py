"""PriorityClasses, Priority admission, ControllerRevisions, PodDisruptionBudgets and DaemonSet defaults against the
embedded API server, through the client: what a user (or an attacker with create rights) can and cannot write."""

from __future__ import annotations

from collections.abc import AsyncIterator
from typing import Any

import pytest

from ambit.apiserver.server import ApiServer
from ambit.k8s import KubeApiStatusError, KubeClient, kinds

NS = "default"
Obj = dict[str, Any]
CONTAINERS = [{"name": "c", "image": "registry.example/c:1"}]


@pytest.fixture
async def kube(apiserver: ApiServer) -> AsyncIterator[KubeClient]:
    async with KubeClient.from_kubeconfig(apiserver.kubeconfig) as client:
        yield client


def pod(name: str, **spec: Any) -> Obj:
    return {"metadata": {"name": name, "namespace": NS}, "spec": {"containers": CONTAINERS, **spec}}


async def refused(write: Any) -> KubeApiStatusError:
    with pytest.raises(KubeApiStatusError) as caught:
        await write
    return caught.value


async def test_the_built_in_priority_classes_exist_and_pods_get_their_priority(kube: KubeClient) -> None:
    classes = {c["metadata"]["name"]: c for c in (await kube.list(kinds.PRIORITY_CLASSES))[0]}
    assert classes["system-node-critical"]["value"] == 2000001000
    assert classes["system-cluster-critical"]["value"] == 2000000000
    assert classes["system-node-critical"]["preemptionPolicy"] == "PreemptLowerPriority"
    critical = await kube.create(kinds.PODS, pod("critical", priorityClassName="system-node-critical"))
    assert (critical["spec"]["priority"], critical["spec"]["preemptionPolicy"]) == (2000001000, "PreemptLowerPriority")
    plain = await kube.create(kinds.PODS, pod("plain"))
    assert plain["spec"]["priority"] == 0

    await kube.create(kinds.PRIORITY_CLASSES, {"metadata": {"name": "normal"}, "value": 100, "globalDefault": True})
    defaulted = await kube.create(kinds.PODS, pod("defaulted"))
    assert (defaulted["spec"]["priority"], defaulted["spec"]["priorityClassName"]) == (100, "normal")
    second = {"metadata": {"name": "other"}, "value": 5, "globalDefault": True}
    error = await refused(kube.create(kinds.PRIORITY_CLASSES, second))
    assert error.status_code == 403
    assert "PriorityClass normal is already marked as default. Only one default can exist" in error.message


async def test_pods_cannot_claim_a_priority_or_class_they_were_not_given(kube: KubeClient) -> None:
    error = await refused(kube.create(kinds.PODS, pod("gold", priorityClassName="gold")))
    assert (error.status_code, error.message) == (
        403,
        'pods "gold" is forbidden: no PriorityClass with name gold was found',
    )
    error = await refused(kube.create(kinds.PODS, pod("sneaky", priority=2000001000)))
    assert error.status_code == 403
    forged = {"metadata": {"name": "system-node-critical-2"}, "value": 2000001000}
    error = await refused(kube.create(kinds.PRIORITY_CLASSES, forged))
    assert error.status_code == 422 and "reserved for system use only" in error.message
    greedy = {"metadata": {"name": "greedy"}, "value": 2000000000}
    assert (await refused(kube.create(kinds.PRIORITY_CLASSES, greedy))).status_code == 422
    await kube.create(kinds.PRIORITY_CLASSES, {"metadata": {"name": "batch"}, "value": 10})
    error = await refused(kube.patch(kinds.PRIORITY_CLASSES, "batch", {"value": 999999}))
    assert error.status_code == 422 and "value: Forbidden: may not be changed in an update." in error.message


async def test_a_controller_revision_keeps_its_data_but_may_be_renumbered(kube: KubeClient) -> None:
    body = {"metadata": {"name": "agent-1", "namespace": NS}, "data": {"spec": {"template": {}}}, "revision": 1}
    await kube.create(kinds.CONTROLLER_REVISIONS, body)
    renumbered = await kube.patch(kinds.CONTROLLER_REVISIONS, "agent-1", {"revision": 4}, NS)
    assert renumbered["revision"] == 4
    error = await refused(kube.patch(kinds.CONTROLLER_REVISIONS, "agent-1", {"data": {"spec": {"x": 1}}}, NS))
    assert error.status_code == 422 and "data: Invalid value" in error.message and "field is immutable" in error.message
    bad = {"metadata": {"name": "agent-2", "namespace": NS}, "data": {}, "revision": -1}
    assert (await refused(kube.create(kinds.CONTROLLER_REVISIONS, bad))).status_code == 422


async def test_daemon_sets_get_kubes_strategy_defaults_and_a_template_generation_nobody_can_forge(
    kube: KubeClient,
) -> None:
    labels = {"app": "agent"}
    body = {
        "metadata": {
            "name": "agent",
            "namespace": NS,
            "annotations": {"deprecated.daemonset.template.generation": "9"},
        },
        "spec": {
            "selector": {"matchLabels": labels},
            "template": {"metadata": {"labels": labels}, "spec": {"containers": CONTAINERS}},
        },
    }
    ds = await kube.create(kinds.DAEMON_SETS, body)
    assert ds["spec"]["updateStrategy"] == {
        "type": "RollingUpdate",
        "rollingUpdate": {"maxUnavailable": 1, "maxSurge": 0},
    }
    assert ds["spec"]["revisionHistoryLimit"] == 10
    assert ds["metadata"]["annotations"]["deprecated.daemonset.template.generation"] == "1"
    relabelled = await kube.patch(kinds.DAEMON_SETS, "agent", {"metadata": {"labels": {"x": "y"}}}, NS)
    assert relabelled["metadata"]["annotations"]["deprecated.daemonset.template.generation"] == "1"
    patch = {"spec": {"template": {"metadata": {"annotations": {"v": "2"}}}}}
    changed = await kube.patch(kinds.DAEMON_SETS, "agent", patch, NS, patch_type="strategic")
    assert changed["metadata"]["annotations"]["deprecated.daemonset.template.generation"] == "2"
    both = {"spec": {"updateStrategy": {"rollingUpdate": {"maxSurge": 1}}}}
    error = await refused(kube.patch(kinds.DAEMON_SETS, "agent", both, NS, patch_type="strategic"))
    assert "may not be set when maxUnavailable is non-zero" in error.message


async def test_a_disruption_budget_has_a_status_subresource_and_one_of_its_two_limits(kube: KubeClient) -> None:
    body = {
        "metadata": {"name": "web", "namespace": NS},
        "spec": {"minAvailable": 1, "selector": {"matchLabels": {"app": "web"}}},
    }
    created = await kube.create(kinds.POD_DISRUPTION_BUDGETS, body)
    assert created["status"]["disruptionsAllowed"] == 0
    ignored = await kube.patch(kinds.POD_DISRUPTION_BUDGETS, "web", {"status": {"disruptionsAllowed": 5}}, NS)
    assert ignored["status"]["disruptionsAllowed"] == 0
    written = await kube.patch_status(kinds.POD_DISRUPTION_BUDGETS, "web", {"status": {"disruptionsAllowed": 1}}, NS)
    assert written["status"]["disruptionsAllowed"] == 1
    both = {"spec": {"maxUnavailable": 1}}
    assert (await refused(kube.patch(kinds.POD_DISRUPTION_BUDGETS, "web", both, NS))).status_code == 422
