"""The controllers' pure parts without a server: rollout steps, placement, slice planning, the work queue and the
reconcile loop's error handling."""

from __future__ import annotations

import asyncio
import copy
from typing import Any

import pytest

from ambit.k8s import KubeConflictError
from ambit.lab.controllers import rollout
from ambit.lab.controllers.endpoints import PodEndpoint
from ambit.lab.controllers.placement import place
from ambit.lab.controllers.reconcile import ReconcileLoop, SyncError
from ambit.lab.controllers.slicing import plan_slices
from ambit.lab.controllers.workqueue import Key, WorkQueue

Obj = dict[str, Any]


# -- rollout ----------------------------------------------------------------------------------------------------
def deployment(replicas: int, image: str = "app:1", strategy: Obj | None = None) -> Obj:
    template = {"metadata": {"labels": {"app": "web"}}, "spec": {"containers": [{"name": "c", "image": image}]}}
    spec: Obj = {"replicas": replicas, "selector": {"matchLabels": {"app": "web"}}, "template": template}
    if strategy is not None:
        spec["strategy"] = strategy
    return {"apiVersion": "apps/v1", "kind": "Deployment", "metadata": {"name": "web", "uid": "d-1"}, "spec": spec}


def replica_set(d: Obj, name: str, replicas: int, created: str) -> Obj:
    rs = rollout.new_replica_set(d, name, 1, replicas)
    rs["metadata"]["name"] = name
    rs["metadata"]["creationTimestamp"] = created
    rs["status"] = {"replicas": replicas, "availableReplicas": replicas}
    return rs


def settle(rs: Obj) -> None:
    """Every pod of ``rs`` comes up and becomes available (the kubelet and ReplicaSet controller's part)."""
    rs["status"] = {"replicas": rs["spec"]["replicas"], "availableReplicas": rs["spec"]["replicas"]}


def test_a_rolling_update_never_exceeds_surge_nor_drops_below_availability() -> None:
    old_d = deployment(4)
    old = replica_set(old_d, "web-old", 4, "2024-01-01T00:00:00Z")
    d = deployment(4, image="app:2")  # maxSurge 25% of 4 = 1, maxUnavailable 25% of 4 = 1
    assert rollout.split(d, [old]) == (None, [old])
    new = replica_set(d, "web-new", rollout.new_replicas(d, 0, [old]), "2024-01-02T00:00:00Z")
    assert new["spec"]["replicas"] == 1
    new["status"] = {}
    for _ in range(20):
        for step in rollout.rolling_step(d, new, [old]):
            step.replica_set["spec"]["replicas"] = step.replicas
        total = new["spec"]["replicas"] + old["spec"]["replicas"]
        available = sum(rs["status"].get("availableReplicas", 0) for rs in (new, old))
        assert total <= 4 + 1
        assert available >= 4 - 1 or old["spec"]["replicas"] == 4
        settle(new)
        settle(old)
        if old["spec"]["replicas"] == 0 and new["spec"]["replicas"] == 4:
            break
    assert (new["spec"]["replicas"], old["spec"]["replicas"]) == (4, 0)


def test_rolling_scales_old_unhealthy_replicas_down_first() -> None:
    d = deployment(2, image="app:2", strategy={"type": "RollingUpdate", "rollingUpdate": {"maxSurge": 0}})
    old_a = replica_set(deployment(2), "web-a", 1, "2024-01-01T00:00:00Z")
    old_b = replica_set(deployment(2, image="app:0"), "web-b", 1, "2024-01-02T00:00:00Z")
    old_b["status"]["availableReplicas"] = 0
    new = replica_set(d, "web-new", 0, "2024-01-03T00:00:00Z")
    steps = rollout.rolling_step(d, new, [old_a, old_b])
    assert [(s.replica_set["metadata"]["name"], s.replicas) for s in steps] == [("web-b", 0)]


def test_a_scale_changes_only_the_new_replica_set() -> None:
    d = deployment(5)
    new = replica_set(d, "web-new", 2, "2024-01-01T00:00:00Z")
    assert [(s.replica_set is new, s.replicas) for s in rollout.rolling_step(d, new, [])] == [(True, 5)]
    d = deployment(1)
    assert [(s.replica_set is new, s.replicas) for s in rollout.rolling_step(d, new, [])] == [(True, 1)]


def test_the_template_hash_is_stable_short_and_moves_with_the_collision_count() -> None:
    template = deployment(1)["spec"]["template"]
    first = rollout.template_hash(template)
    assert first == rollout.template_hash(copy.deepcopy(template))
    assert set(first) <= set("bcdfghjklmnpqrstvwxz2456789") and 1 <= len(first) <= 10
    assert rollout.template_hash(template, 1) != first
    assert rollout.template_hash(deployment(1, image="app:2")["spec"]["template"]) != first


def test_a_replica_set_made_from_the_template_is_new_even_if_the_server_defaulted_it() -> None:
    d = deployment(1)
    rs = rollout.new_replica_set(d, rollout.current_hash(d), 1, 1)
    rs["spec"]["template"]["spec"]["restartPolicy"] = "Always"
    assert rollout.is_new(rs, d)
    assert not rollout.is_new(rs, deployment(1, image="app:2"))


def test_old_idle_replica_sets_beyond_the_history_limit_are_cleaned_up() -> None:
    d = deployment(1)
    d["spec"]["revisionHistoryLimit"] = 1
    old = [replica_set(d, f"web-{i}", 0, f"2024-01-0{i}T00:00:00Z") for i in range(1, 4)]
    assert [rs["metadata"]["name"] for rs in rollout.cleanup(d, old)] == ["web-1", "web-2"]


# -- placement --------------------------------------------------------------------------------------------------
def node(name: str, ready: bool = True, unschedulable: bool = False, **labels: str) -> Obj:
    return {
        "metadata": {"name": name, "labels": labels},
        "spec": {"unschedulable": True} if unschedulable else {},
        "status": {"conditions": [{"type": "Ready", "status": "True" if ready else "False"}]},
    }


def test_placement_prefers_the_least_loaded_node_and_breaks_ties_by_name() -> None:
    pod: Obj = {"spec": {}}
    nodes = [node("n3"), node("n1"), node("n2")]
    assert place(pod, nodes, {"n1": 2, "n2": 1, "n3": 1}).node == "n2"
    assert place(pod, nodes, {}).node == "n1"


def test_placement_explains_why_no_node_fits() -> None:
    pod: Obj = {"spec": {"nodeSelector": {"disk": "ssd"}}}
    nodes = [node("a"), node("b", ready=False, disk="ssd"), node("c", unschedulable=True, disk="ssd")]
    assert place(pod, nodes, {}).message == (
        "0/3 nodes are available: 1 node(s) didn't match Pod's node affinity/selector, "
        "1 node(s) had untolerated taint {node.kubernetes.io/not-ready: }, 1 node(s) were unschedulable."
    )
    assert place(pod, [], {}).message == "no nodes available to schedule pods"


# -- slice planning ---------------------------------------------------------------------------------------------
SERVICE: Obj = {"apiVersion": "v1", "kind": "Service", "metadata": {"name": "web", "namespace": "ns", "uid": "s-1"}}
PORTS = [{"name": "http", "port": 8080, "protocol": "TCP"}]


def endpoint(i: int) -> PodEndpoint:
    ep = {
        "addresses": [f"10.0.0.{i}"],
        "conditions": {"ready": True, "serving": True, "terminating": False},
        "targetRef": {"kind": "Pod", "namespace": "ns", "name": f"p{i}", "uid": f"u{i}"},
    }
    return PodEndpoint(ep, PORTS)


def stored(plan_bodies: list[Obj], start: int = 0) -> list[Obj]:
    """What the server would hold after creating ``plan_bodies``."""
    result = []
    for i, body in enumerate(plan_bodies, start):
        obj = copy.deepcopy(body)
        obj["metadata"]["name"] = f"web-{i}"
        obj["metadata"]["resourceVersion"] = str(i + 1)
        result.append(obj)
    return result


def test_slices_hold_at_most_max_endpoints_and_an_unchanged_service_plans_nothing() -> None:
    endpoints = [endpoint(i) for i in range(5)]
    plan = plan_slices(SERVICE, endpoints, [], max_per_slice=2)
    assert [len(s["endpoints"]) for s in plan.create] == [2, 2, 1]
    assert not plan.update and not plan.delete
    assert not plan_slices(SERVICE, endpoints, stored(plan.create), max_per_slice=2)


def test_a_removed_endpoint_rewrites_only_its_slice_and_new_ones_fill_free_room() -> None:
    current = stored(plan_slices(SERVICE, [endpoint(i) for i in range(4)], [], max_per_slice=2).create)
    plan = plan_slices(SERVICE, [endpoint(i) for i in (0, 1, 3, 7)], current, max_per_slice=2)
    assert not plan.create and not plan.delete
    (update,) = plan.update
    assert update["metadata"]["name"] == "web-1"
    assert update["metadata"]["resourceVersion"] == "2"
    assert [e["targetRef"]["name"] for e in update["endpoints"]] == ["p3", "p7"]


def test_an_empty_service_keeps_one_placeholder_and_reuses_slices_it_would_delete() -> None:
    plan = plan_slices(SERVICE, [], [], max_per_slice=100)
    (placeholder,) = plan.create
    assert placeholder["endpoints"] == [] and placeholder["ports"] == []
    current = stored(plan_slices(SERVICE, [endpoint(1)], [], max_per_slice=100).create)
    plan = plan_slices(SERVICE, [], current, max_per_slice=100)
    assert not plan.create and not plan.delete
    assert plan.update[0]["metadata"]["name"] == "web-0"
    assert plan.update[0]["ports"] == []


# -- work queue and reconcile loop ------------------------------------------------------------------------------
async def test_a_key_is_queued_once_and_requeued_if_it_changed_while_processed() -> None:
    queue = WorkQueue("test")
    queue.add(("ns", "a"))
    queue.add(("ns", "a"))
    queue.add(("ns", "b"))
    assert len(queue) == 2
    key = await queue.get()
    queue.add(key)  # changed while a worker holds it: not handed to a second worker
    assert len(queue) == 1
    queue.done(key)
    assert len(queue) == 2


async def test_retries_back_off_per_key_and_forget_resets() -> None:
    queue = WorkQueue("test", initial=0.01, maximum=0.04)
    delays = [queue.retry(("ns", "a")) for _ in range(4)]
    assert delays == [0.01, 0.02, 0.04, 0.04]
    queue.forget(("ns", "a"))
    assert queue.retry(("ns", "a")) == 0.01
    queue.close()


class Recorder:
    def __init__(self) -> None:
        self.events: list[tuple[str, str, str, str]] = []

    def record(self, regarding: Obj, type: str, reason: str, note: str, action: str) -> None:
        self.events.append((regarding["metadata"]["name"], type, reason, note))


class Flaky:
    """Fails on ``bad`` (a bug), with a conflict on ``stale``, with a SyncError on ``denied``."""

    name = "flaky"
    failure_reason = "FailedSync"

    def __init__(self) -> None:
        self.queue = WorkQueue(self.name, initial=0.01, maximum=0.02)
        self.recorder = Recorder()
        self.done: list[str] = []

    def find(self, key: Key) -> Obj | None:
        return {"metadata": {"namespace": key[0], "name": key[1]}}

    async def reconcile(self, key: Key) -> float | None:
        if key[1] == "bad":
            raise ValueError("boom")
        if key[1] == "stale":
            raise KubeConflictError({"code": 409, "reason": "Conflict", "message": "stale"})
        if key[1] == "denied":
            raise SyncError("FailedCreate", "quota exceeded")
        self.done.append(key[1])
        return None


async def test_one_failing_object_is_retried_and_reported_while_the_others_go_through(
    caplog: pytest.LogCaptureFixture,
) -> None:
    flaky = Flaky()
    loop = ReconcileLoop(flaky, workers=2)  # type: ignore[arg-type]
    for name in ("bad", "good", "stale", "denied", "fine"):
        flaky.queue.add(("ns", name))
    loop.start()
    for _ in range(200):
        if flaky.queue.failures(("ns", "bad")) >= 2 and len(flaky.done) >= 2:
            break
        await asyncio.sleep(0.01)
    await loop.aclose()
    assert sorted(flaky.done) == ["fine", "good"]
    reported = {(name, type, reason) for name, type, reason, _ in flaky.recorder.events}
    assert reported == {("bad", "Warning", "FailedSync"), ("denied", "Warning", "FailedCreate")}
    assert ("bad", "Warning", "FailedSync", "internal error: ValueError('boom')") in flaky.recorder.events
    assert flaky.queue.failures(("ns", "stale")) >= 1
    assert "boom" in caplog.text
