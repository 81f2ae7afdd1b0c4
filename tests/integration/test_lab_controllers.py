"""The lab's controllers against the real embedded API server: scheduler, Deployments and ReplicaSets, Services.

The test plays the kubelet where the controllers need one (``lab_cluster.Kubelet``): it marks bound pods Running
and Ready with a pod IP, and finishes the deletion of terminating pods, as a node would.
"""

from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator, Awaitable
from typing import Any

import pytest
from tests.integration.lab_cluster import NS, Kubelet, Obj, add_node, set_pod_status, settings, until

from ambit.apiserver.server import ApiServer
from ambit.k8s import KubeClient, KubeNotFoundError, kinds
from ambit.lab.controllers import ControllerError, ControllerManager, run_controllers
from ambit.lab.controllers import pods as podstate
from ambit.lab.controllers.replicaset import ReplicaSetController
from ambit.lab.controllers.settings import ENDPOINTS


# -- plumbing ---------------------------------------------------------------------------------------------------
@pytest.fixture
async def kube(apiserver: ApiServer) -> AsyncIterator[KubeClient]:
    async with KubeClient.from_kubeconfig(apiserver.kubeconfig) as client:
        yield client


@pytest.fixture
async def controllers(kube: KubeClient) -> AsyncIterator[ControllerManager]:
    async with ControllerManager(kube, settings()) as manager:
        yield manager


def pod_body(name: str, labels: dict[str, str] | None = None, *, ports: list[Obj] | None = None, **spec: Any) -> Obj:
    container: Obj = {"name": "app", "image": "registry.example/app:1"}
    if ports:
        container["ports"] = ports
    return {
        "metadata": {"name": name, "namespace": NS, "labels": labels or {}},
        "spec": {"containers": [container], **spec},
    }


def deployment_body(name: str, replicas: int, image: str = "registry.example/web:1") -> Obj:
    labels = {"app": name}
    container = {"name": "web", "image": image, "ports": [{"name": "http", "containerPort": 8080}]}
    return {
        "metadata": {"name": name, "namespace": NS},
        "spec": {
            "replicas": replicas,
            "selector": {"matchLabels": labels},
            "template": {"metadata": {"labels": labels}, "spec": {"containers": [container]}},
        },
    }


async def pods(kube: KubeClient, **labels: str) -> list[Obj]:
    return (await kube.list(kinds.PODS, NS, label_selector=labels or None))[0]


def active(items: list[Obj]) -> list[Obj]:
    return [
        p
        for p in items
        if not p["metadata"].get("deletionTimestamp") and p["status"].get("phase") not in ("Failed", "Succeeded")
    ]


async def events(kube: KubeClient, reason: str, name: str | None = None) -> list[Obj]:
    items = (await kube.list(kinds.EVENTS, NS))[0]
    return [e for e in items if e.get("reason") == reason and (name is None or e["regarding"].get("name") == name)]


def condition(obj: Obj, kind: str) -> Obj:
    return next((c for c in (obj.get("status") or {}).get("conditions") or [] if c["type"] == kind), {})


def controller_of(obj: Obj) -> Obj:
    return next(r for r in obj["metadata"].get("ownerReferences") or [] if r.get("controller"))


# -- scheduler --------------------------------------------------------------------------------------------------
async def test_pods_are_bound_to_the_least_loaded_ready_schedulable_node(kube: KubeClient) -> None:
    for name in ("node-a", "node-b"):
        await add_node(kube, name)
    await add_node(kube, "node-c", ready=False)
    await add_node(kube, "node-d", unschedulable=True)
    await kube.create(kinds.PODS, pod_body("already-there", nodeName="node-a"))
    async with ControllerManager(kube, settings()):
        for i in range(3):
            await kube.create(kinds.PODS, pod_body(f"p{i}"))

        async def placed() -> dict[str, int]:
            counts: dict[str, int] = {}
            for pod in await pods(kube):
                node = pod["spec"].get("nodeName")
                if not node or condition(pod, "PodScheduled").get("status") != "True":
                    return {}
                counts[node] = counts.get(node, 0) + 1
            return counts

        assert await until(placed, "every pod bound") == {"node-a": 2, "node-b": 2}
        scheduled = await until(lambda: _all(events(kube, "Scheduled"), 3), "a Scheduled event per bound pod")
    p0 = await kube.get(kinds.PODS, "p0", NS)
    assert p0["spec"]["nodeName"] == "node-b"  # node-a already had a pod
    note = next(e["note"] for e in scheduled if e["regarding"]["name"] == "p0")
    assert note == "Successfully assigned default/p0 to node-b"
    assert {e["type"] for e in scheduled} == {"Normal"}
    assert {e["reportingController"] for e in scheduled} == {"default-scheduler"}


async def _all(items: Awaitable[list[Obj]], count: int) -> list[Obj]:
    got = await items
    return got if len(got) >= count else []


async def test_a_pod_no_node_fits_stays_pending_until_a_matching_node_appears(
    kube: KubeClient, controllers: ControllerManager
) -> None:
    await add_node(kube, "node-a")
    await kube.create(kinds.PODS, pod_body("wants-ssd", nodeSelector={"disk": "ssd"}))
    await kube.create(kinds.PODS, pod_body("pinned", nodeName="node-z"))

    async def unschedulable(name: str) -> Obj:
        cond = condition(await kube.get(kinds.PODS, name, NS), "PodScheduled")
        return cond if cond.get("status") == "False" else {}

    cond = await until(lambda: unschedulable("wants-ssd"), "PodScheduled=False on wants-ssd")
    assert cond["reason"] == "Unschedulable"
    assert cond["message"] == "0/1 nodes are available: 1 node(s) didn't match Pod's node affinity/selector."
    cond = await until(lambda: unschedulable("pinned"), "PodScheduled=False on pinned")
    assert cond["message"] == 'node "node-z" not found'
    failed = await until(lambda: events(kube, "FailedScheduling", "wants-ssd"), "FailedScheduling event")
    assert failed[0]["type"] == "Warning"
    assert "didn't match Pod's node affinity/selector" in failed[0]["note"]
    assert (await kube.get(kinds.PODS, "wants-ssd", NS))["status"]["phase"] == "Pending"

    await add_node(kube, "node-ssd", disk="ssd")
    await add_node(kube, "node-z")

    async def bound(name: str) -> str:
        pod = await kube.get(kinds.PODS, name, NS)
        return pod["spec"].get("nodeName", "") if condition(pod, "PodScheduled").get("status") == "True" else ""

    assert await until(lambda: bound("wants-ssd"), "wants-ssd bound") == "node-ssd"
    assert await until(lambda: bound("pinned"), "pinned scheduled") == "node-z"
    assert await until(lambda: events(kube, "Scheduled", "wants-ssd"), "Scheduled event")


async def test_a_pod_for_another_scheduler_is_left_alone(kube: KubeClient, controllers: ControllerManager) -> None:
    await add_node(kube, "node-a")
    await kube.create(kinds.PODS, pod_body("theirs", schedulerName="other-scheduler"))
    await kube.create(kinds.PODS, pod_body("ours"))
    await until(lambda: _bound_name(kube, "ours"), "ours bound")
    theirs = await kube.get(kinds.PODS, "theirs", NS)
    assert "nodeName" not in theirs["spec"]
    assert condition(theirs, "PodScheduled") == {}


async def _bound_name(kube: KubeClient, name: str) -> str:
    return str((await kube.get(kinds.PODS, name, NS))["spec"].get("nodeName") or "")


# -- Deployments and ReplicaSets --------------------------------------------------------------------------------
async def replica_sets(kube: KubeClient) -> list[Obj]:
    return (await kube.list(kinds.REPLICA_SETS, NS))[0]


async def deployment_settled(kube: KubeClient, name: str, replicas: int) -> Obj:
    """The Deployment once its status shows ``replicas`` pods, all updated, ready and available."""
    d = await kube.get(kinds.DEPLOYMENTS, name, NS)
    status = d.get("status") or {}
    want = {"replicas": replicas, "updatedReplicas": replicas, "readyReplicas": replicas}
    want |= {"availableReplicas": replicas, "observedGeneration": d["metadata"]["generation"]}
    return d if all(status.get(k) == v for k, v in want.items()) else {}


async def test_a_deployment_makes_a_replica_set_and_pods_and_scales_both_ways(
    kube: KubeClient, controllers: ControllerManager
) -> None:
    await add_node(kube, "node-a")
    await add_node(kube, "node-b")
    async with Kubelet(kube):
        d = await kube.create(kinds.DEPLOYMENTS, deployment_body("web", 3))
        await until(lambda: deployment_settled(kube, "web", 3), "web at 3 replicas")
        (rs,) = await replica_sets(kube)
        pod_hash = rs["metadata"]["labels"]["pod-template-hash"]
        assert rs["metadata"]["name"] == f"web-{pod_hash}"
        assert controller_of(rs) | {"apiVersion": "apps/v1"} == {
            "apiVersion": "apps/v1",
            "kind": "Deployment",
            "name": "web",
            "uid": d["metadata"]["uid"],
            "controller": True,
            "blockOwnerDeletion": True,
        }
        assert rs["spec"]["selector"]["matchLabels"] == {"app": "web", "pod-template-hash": pod_hash}
        assert rs["metadata"]["annotations"]["deployment.kubernetes.io/revision"] == "1"
        web = active(await pods(kube, app="web"))
        assert len(web) == 3
        for pod in web:
            assert pod["metadata"]["name"].startswith(f"web-{pod_hash}-")
            assert len(pod["metadata"]["name"]) == len(f"web-{pod_hash}-") + 5
            assert pod["metadata"]["labels"] == {"app": "web", "pod-template-hash": pod_hash}
            assert controller_of(pod)["uid"] == rs["metadata"]["uid"]
            assert controller_of(pod)["kind"] == "ReplicaSet"
        assert {p["spec"]["nodeName"] for p in web} == {"node-a", "node-b"}

        deployed = await until(lambda: deployment_settled(kube, "web", 3), "status")
        assert condition(deployed, "Available")["status"] == "True"
        assert condition(deployed, "Progressing")["reason"] == "NewReplicaSetAvailable"
        rs = await kube.get(kinds.REPLICA_SETS, rs["metadata"]["name"], NS)
        assert {k: rs["status"][k] for k in ("replicas", "readyReplicas", "availableReplicas")} == {
            "replicas": 3,
            "readyReplicas": 3,
            "availableReplicas": 3,
        }
        assert rs["status"]["observedGeneration"] == rs["metadata"]["generation"]

        await kube.patch(kinds.DEPLOYMENTS, "web", {"spec": {"replicas": 1}}, NS)
        await until(lambda: deployment_settled(kube, "web", 1), "web at 1 replica")
        assert await until(lambda: _count(pods(kube, app="web"), 1), "the surplus pods gone")
        await kube.patch(kinds.DEPLOYMENTS, "web", {"spec": {"replicas": 5}}, NS)
        await until(lambda: deployment_settled(kube, "web", 5), "web at 5 replicas")
        assert len(active(await pods(kube, app="web"))) == 5
        assert len(await replica_sets(kube)) == 1
        scaling = await events(kube, "ScalingReplicaSet", "web")
        notes = {e["note"] for e in scaling}
        assert f"Scaled down replica set web-{pod_hash} from 3 to 1" in notes
        assert f"Scaled up replica set web-{pod_hash} from 1 to 5" in notes
        assert await events(kube, "SuccessfulCreate", f"web-{pod_hash}")


async def _count(items: Awaitable[list[Obj]], count: int) -> bool:
    return len(await items) == count


async def test_a_template_change_rolls_over_to_a_new_replica_set(
    kube: KubeClient, controllers: ControllerManager
) -> None:
    await add_node(kube, "node-a")
    async with Kubelet(kube):
        await kube.create(kinds.DEPLOYMENTS, deployment_body("web", 3))
        await until(lambda: deployment_settled(kube, "web", 3), "web at 3 replicas")
        (old,) = await replica_sets(kube)
        template = deployment_body("web", 3, image="registry.example/web:2")["spec"]["template"]
        await kube.patch(kinds.DEPLOYMENTS, "web", {"spec": {"template": template}}, NS)
        d = await until(lambda: deployment_settled(kube, "web", 3), "web rolled over to the new template")

        async def rolled() -> list[Obj]:
            sets = await replica_sets(kube)
            done = len(sets) == 2 and all(rs["status"].get("replicas") == rs["spec"]["replicas"] for rs in sets)
            return sets if done else []

        sets = {rs["metadata"]["name"]: rs for rs in await until(rolled, "both replica sets settled")}
        assert sets[old["metadata"]["name"]]["spec"]["replicas"] == 0
        (new,) = (rs for name, rs in sets.items() if name != old["metadata"]["name"])
        assert new["spec"]["replicas"] == 3
        assert new["spec"]["template"]["spec"]["containers"][0]["image"] == "registry.example/web:2"
        assert new["metadata"]["annotations"]["deployment.kubernetes.io/revision"] == "2"
        assert d["metadata"]["annotations"]["deployment.kubernetes.io/revision"] == "2"
        web = await until(lambda: _count_list(pods(kube, app="web"), 3), "only the new pods left")
        assert {controller_of(p)["uid"] for p in web} == {new["metadata"]["uid"]}


async def _count_list(items: Awaitable[list[Obj]], count: int) -> list[Obj]:
    got = await items
    return got if len(got) == count else []


async def test_a_recreate_deployment_removes_the_old_pods_before_making_new_ones(
    kube: KubeClient, controllers: ControllerManager
) -> None:
    await add_node(kube, "node-a")
    body = deployment_body("web", 2)
    body["spec"]["strategy"] = {"type": "Recreate"}
    async with Kubelet(kube):
        await kube.create(kinds.DEPLOYMENTS, body)
        await until(lambda: deployment_settled(kube, "web", 2), "web at 2 replicas")
        (old,) = await replica_sets(kube)
        template = deployment_body("web", 2, image="registry.example/web:2")["spec"]["template"]
        await kube.patch(kinds.DEPLOYMENTS, "web", {"spec": {"template": template}}, NS)
        generations_seen: list[set[str]] = []

        async def rolled() -> list[Obj]:
            current = await pods(kube, app="web")
            generations_seen.append({controller_of(p)["uid"] for p in current})
            return current if generations_seen[-1] - {old["metadata"]["uid"]} and len(current) == 2 else []

        await until(rolled, "the pods replaced")
        assert all(len(generation) <= 1 for generation in generations_seen), "old and new pods ran together"
        await until(lambda: deployment_settled(kube, "web", 2), "web at 2 new replicas")
        assert len(await replica_sets(kube)) == 2


async def test_deleted_and_failed_pods_are_replaced(kube: KubeClient, controllers: ControllerManager) -> None:
    await add_node(kube, "node-a")
    async with Kubelet(kube):
        await kube.create(kinds.DEPLOYMENTS, deployment_body("web", 2))
        await until(lambda: deployment_settled(kube, "web", 2), "web at 2 replicas")
        first, second = active(await pods(kube, app="web"))
        await kube.delete(kinds.PODS, first["metadata"]["name"], NS)
        await set_pod_status(kube, second["metadata"]["name"], ready=False, phase="Failed")

        async def replaced() -> list[Obj]:
            current = active(await pods(kube, app="web"))
            names = {p["metadata"]["name"] for p in current}
            gone = {first["metadata"]["name"], second["metadata"]["name"]}
            return current if len(current) == 2 and not names & gone else []

        await until(replaced, "two fresh pods")
        await until(lambda: deployment_settled(kube, "web", 2), "web back at 2 ready replicas")
        failed = await kube.get(kinds.PODS, second["metadata"]["name"], NS)
        assert failed["status"]["phase"] == "Failed"  # left for the record, as kube does


async def test_deleting_a_deployment_collects_its_replica_sets_and_pods(
    kube: KubeClient, controllers: ControllerManager
) -> None:
    await add_node(kube, "node-a")
    async with Kubelet(kube):
        await kube.create(kinds.DEPLOYMENTS, deployment_body("web", 2))
        await until(lambda: deployment_settled(kube, "web", 2), "web at 2 replicas")
        await kube.delete(kinds.DEPLOYMENTS, "web", NS)

        async def collected() -> bool:
            return not await replica_sets(kube) and not await pods(kube, app="web")

        await until(collected, "replica sets and pods gone")
        await asyncio.sleep(0.2)  # and nothing brings them back
        assert not await pods(kube, app="web")


async def test_deployment_and_replica_set_status_follow_pod_readiness(
    kube: KubeClient, controllers: ControllerManager
) -> None:
    await add_node(kube, "node-a")
    async with Kubelet(kube, auto_ready=False):
        await kube.create(kinds.DEPLOYMENTS, deployment_body("web", 2))

        async def status_is(**want: int) -> Obj:
            d = await kube.get(kinds.DEPLOYMENTS, "web", NS)
            status = d.get("status") or {}
            return d if all(status.get(k) == v for k, v in want.items()) else {}

        d = await until(lambda: status_is(replicas=2, readyReplicas=0, availableReplicas=0), "2 pods, none ready")
        assert condition(d, "Available")["status"] == "False"
        assert condition(d, "Available")["reason"] == "MinimumReplicasUnavailable"
        assert d["status"]["unavailableReplicas"] == 2

        async def running() -> list[Obj]:
            found = await pods(kube, app="web")
            return found if len(found) == 2 and all(p["status"].get("phase") == "Running" for p in found) else []

        web = await until(running, "2 pods started by the kubelet")  # it writes their status first
        await set_pod_status(kube, web[0]["metadata"]["name"], ready=True, ip="10.9.0.1")
        d = await until(lambda: status_is(readyReplicas=1, availableReplicas=1), "1 ready")
        assert condition(d, "Available")["status"] == "False"  # 2 replicas: maxUnavailable 25% rounds down to 0
        await set_pod_status(kube, web[1]["metadata"]["name"], ready=True, ip="10.9.0.2")
        d = await until(lambda: status_is(readyReplicas=2, availableReplicas=2, unavailableReplicas=0), "2 ready")
        assert condition(d, "Available")["status"] == "True"
        (rs,) = await replica_sets(kube)
        assert rs["status"]["readyReplicas"] == 2
        await set_pod_status(kube, web[0]["metadata"]["name"], ready=False)
        await until(lambda: status_is(readyReplicas=1, availableReplicas=1), "1 ready again")


async def test_a_readiness_change_the_controller_never_saw_is_reported_at_the_next_resync(
    kube: KubeClient, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Reconciles are level-triggered and every key is queued again each resync period (as kube's controllers), so
    a pod event the ReplicaSet controller drops still ends in the right status."""
    dropped: list[str] = []
    handle = ReplicaSetController._pod_updated

    def drop_readiness_changes(self: ReplicaSetController, old: Obj, new: Obj) -> None:
        if podstate.is_ready(old) != podstate.is_ready(new):
            dropped.append(new["metadata"]["name"])
            return
        handle(self, old, new)

    monkeypatch.setattr(ReplicaSetController, "_pod_updated", drop_readiness_changes)
    await add_node(kube, "node-a")
    spec = deployment_body("solo", 1)["spec"]
    async with ControllerManager(kube, settings(resync=1.0)) as manager, Kubelet(kube, auto_ready=False):
        (loop,) = [lp for lp in manager.loops if isinstance(lp.reconciler, ReplicaSetController)]
        await kube.create(kinds.REPLICA_SETS, {"metadata": {"name": "solo", "namespace": NS}, "spec": spec})

        async def started_and_quiet() -> Obj | None:
            (pod,) = await pods(kube, app="solo") or [None]
            if pod is None or pod["status"].get("phase") != "Running":
                return None
            cached = manager.informers.pods.find(pod["metadata"]["name"], NS)
            seen = cached is not None and cached["status"].get("phase") == "Running"
            return pod if seen and loop.reconciler.queue.idle() else None

        pod = await until(started_and_quiet, "the pod running and the controller idle")
        name = pod["metadata"]["name"]
        resyncs = loop.resyncs
        await set_pod_status(kube, name, ready=True, ip="10.9.0.1")

        async def reported() -> Obj:
            current = await kube.get(kinds.REPLICA_SETS, "solo", NS)
            return current if (current.get("status") or {}).get("readyReplicas") == 1 else {}

        await until(reported, "readyReplicas 1")
        assert dropped == [name]
        assert loop.resyncs > resyncs  # only a resync could have queued it


async def test_a_standalone_replica_set_adopts_a_matching_orphan_and_fills_up(
    kube: KubeClient, controllers: ControllerManager
) -> None:
    orphan = await kube.create(kinds.PODS, pod_body("orphan", {"app": "solo"}))
    body = deployment_body("solo", 3)
    rs = await kube.create(kinds.REPLICA_SETS, {"metadata": {"name": "solo", "namespace": NS}, "spec": body["spec"]})
    owned = await until(lambda: _count_list(pods(kube, app="solo"), 3), "3 pods")
    for pod in owned:
        assert controller_of(pod)["uid"] == rs["metadata"]["uid"]
    assert orphan["metadata"]["uid"] in {p["metadata"]["uid"] for p in owned}

    async def reported() -> Obj:
        current = await kube.get(kinds.REPLICA_SETS, "solo", NS)
        return current if (current.get("status") or {}).get("replicas") == 3 else {}

    assert (await until(reported, "status.replicas 3"))["status"]["readyReplicas"] == 0


# -- Services ---------------------------------------------------------------------------------------------------
SERVICE = {
    "metadata": {"name": "web", "namespace": NS, "labels": {"team": "a"}},
    "spec": {
        "selector": {"app": "web"},
        "ports": [
            {"name": "http", "port": 80, "targetPort": "http"},
            {"name": "metrics", "port": 9090, "targetPort": 9102},
        ],
    },
}


async def slices(kube: KubeClient, service: str = "web") -> list[Obj]:
    return (await kube.list(kinds.ENDPOINT_SLICES, NS, label_selector={"kubernetes.io/service-name": service}))[0]


async def endpoint_pod(kube: KubeClient, name: str, ip: str, *, http_port: int | None, ready: bool) -> None:
    ports = [{"name": "http", "containerPort": http_port}] if http_port else None
    await kube.create(kinds.PODS, pod_body(name, {"app": "web"}, ports=ports, nodeName="node-a"))
    await set_pod_status(kube, name, ready=ready, ip=ip)


def by_pod(items: list[Obj]) -> dict[str, tuple[Obj, Obj]]:
    """Each pod's endpoint and the slice holding it."""
    return {e["targetRef"]["name"]: (e, s) for s in items for e in s.get("endpoints") or []}


async def test_endpoint_slices_resolve_named_ports_and_follow_pod_conditions(kube: KubeClient) -> None:
    async with ControllerManager(kube, settings(scheduler=False, workloads=False)):
        await endpoint_pod(kube, "web-1", "10.1.0.11", http_port=8080, ready=False)
        await endpoint_pod(kube, "web-2", "10.1.0.12", http_port=8080, ready=True)
        await endpoint_pod(kube, "web-3", "10.1.0.13", http_port=None, ready=True)
        await kube.create(kinds.PODS, pod_body("no-ip-yet", {"app": "web"}))
        await kube.create(kinds.PODS, pod_body("other", {"app": "db"}))
        svc = await kube.create(kinds.SERVICES, SERVICE)

        async def grouped(count: int) -> list[Obj]:
            got = await slices(kube)
            return got if sum(len(s.get("endpoints") or []) for s in got) == count else []

        found = await until(lambda: grouped(3), "3 endpoints")
        assert len(found) == 2  # one slice per port list: web-3 does not define "http"
        for s in found:
            assert s["addressType"] == "IPv4"
            assert s["metadata"]["name"].startswith("web-")
            assert s["metadata"]["labels"] == {
                "team": "a",
                "kubernetes.io/service-name": "web",
                "endpointslice.kubernetes.io/managed-by": "endpointslice-controller.k8s.io",
            }
            assert controller_of(s)["uid"] == svc["metadata"]["uid"]
            assert controller_of(s)["kind"] == "Service"
        endpoints = by_pod(found)
        assert set(endpoints) == {"web-1", "web-2", "web-3"}
        ep1, slice1 = endpoints["web-1"]
        assert slice1["ports"] == [
            {"name": "http", "port": 8080, "protocol": "TCP"},
            {"name": "metrics", "port": 9102, "protocol": "TCP"},
        ]
        assert endpoints["web-3"][1]["ports"] == [{"name": "metrics", "port": 9102, "protocol": "TCP"}]
        assert ep1["addresses"] == ["10.1.0.11"]
        assert ep1["conditions"] == {"ready": False, "serving": False, "terminating": False}
        assert ep1["nodeName"] == "node-a"
        web1 = await kube.get(kinds.PODS, "web-1", NS)
        assert ep1["targetRef"] == {"kind": "Pod", "namespace": NS, "name": "web-1", "uid": web1["metadata"]["uid"]}
        assert endpoints["web-2"][0]["conditions"] == {"ready": True, "serving": True, "terminating": False}

        async def endpoint(name: str, **want: Any) -> Obj:
            got = by_pod(await slices(kube)).get(name)
            ep = got[0] if got else {}
            ok = all(ep.get("conditions", {}).get(k) == v for k, v in want.items() if k != "addresses")
            return ep if ep and ok and ep["addresses"] == want.get("addresses", ep["addresses"]) else {}

        await set_pod_status(kube, "web-1", ready=True)
        await until(lambda: endpoint("web-1", ready=True, serving=True), "web-1 ready")
        await set_pod_status(kube, "web-1", ready=True, ip="10.1.0.99")
        await until(lambda: endpoint("web-1", addresses=["10.1.0.99"]), "web-1's new address")

        # A slice is not rewritten when nothing it holds changed.
        before = {s["metadata"]["name"]: s["metadata"]["resourceVersion"] for s in await slices(kube)}
        await kube.patch(kinds.PODS, "web-2", {"metadata": {"annotations": {"note": "irrelevant"}}}, NS)
        await kube.patch(kinds.PODS, "web-1", {"metadata": {"annotations": {"note": "irrelevant"}}}, NS)
        await asyncio.sleep(0.3)
        assert {s["metadata"]["name"]: s["metadata"]["resourceVersion"] for s in await slices(kube)} == before

        await kube.delete(kinds.PODS, "web-2", NS)  # bound: it terminates gracefully, and stays meanwhile
        ep2 = await until(lambda: endpoint("web-2", terminating=True), "web-2 terminating")
        assert ep2["conditions"] == {"ready": False, "serving": True, "terminating": True}

        async def legacy() -> Obj:
            try:
                return await kube.get(ENDPOINTS, "web", NS)
            except KubeNotFoundError:
                return {}

        async def legacy_settled() -> Obj:
            ep = await legacy()
            addresses = [a["ip"] for s in ep.get("subsets") or [] for a in s.get("addresses") or []]
            return ep if sorted(addresses) == ["10.1.0.13", "10.1.0.99"] else {}

        ep = await until(legacy_settled, "the Endpoints object without the terminating pod")
        assert ep["metadata"]["labels"] == {"team": "a"}
        subsets = {tuple(p["port"] for p in s["ports"]): s for s in ep["subsets"]}
        assert set(subsets) == {(8080, 9102), (9102,)}
        assert subsets[(8080, 9102)]["addresses"][0]["targetRef"]["name"] == "web-1"
        assert subsets[(8080, 9102)]["ports"][0] == {"name": "http", "port": 8080, "protocol": "TCP"}

        await set_pod_status(kube, "web-3", ready=False)

        async def not_ready_listed() -> Obj:
            ep = await legacy()
            names = [a["targetRef"]["name"] for s in ep.get("subsets") or [] for a in s.get("notReadyAddresses") or []]
            return ep if names == ["web-3"] else {}

        await until(not_ready_listed, "web-3 among notReadyAddresses")

        await kube.delete(kinds.SERVICES, "web", NS)

        async def all_gone() -> bool:
            return not await slices(kube) and not await legacy()

        await until(all_gone, "slices and Endpoints removed with the Service")


async def test_a_service_losing_its_selector_loses_its_slices_and_an_empty_one_keeps_a_placeholder(
    kube: KubeClient,
) -> None:
    async with ControllerManager(kube, settings(scheduler=False, workloads=False)):
        await kube.create(kinds.SERVICES, SERVICE)
        (placeholder,) = await until(lambda: slices(kube), "a placeholder slice")
        assert placeholder["endpoints"] == []
        assert placeholder["ports"] == []
        ep = await until(lambda: _get_or_empty(kube, ENDPOINTS, "web"), "an Endpoints object")
        assert "subsets" not in ep

        await endpoint_pod(kube, "web-1", "10.1.0.11", http_port=8080, ready=True)
        (filled,) = await until(lambda: _with_endpoints(slices(kube)), "the pod's endpoint")
        assert filled["metadata"]["name"] == placeholder["metadata"]["name"]  # updated in place, not replaced

        await kube.patch(kinds.SERVICES, "web", {"spec": {"selector": None}}, NS)
        await until(lambda: _none(slices(kube)), "the slices deleted")


async def _get_or_empty(kube: KubeClient, kind: Any, name: str) -> Obj:
    try:
        return await kube.get(kind, name, NS)
    except KubeNotFoundError:
        return {}


async def _with_endpoints(items: Awaitable[list[Obj]]) -> list[Obj]:
    got = await items
    return got if got and all(s.get("endpoints") for s in got) else []


async def _none(items: Awaitable[list[Obj]]) -> bool:
    return not await items


# -- running --------------------------------------------------------------------------------------------------
async def test_run_controllers_runs_until_cancelled(kube: KubeClient) -> None:
    await add_node(kube, "node-a")
    task = asyncio.create_task(run_controllers(kube, settings(workloads=False, endpoints=False)))
    await kube.create(kinds.PODS, pod_body("p"))
    assert await until(lambda: _bound_name(kube, "p"), "p bound") == "node-a"
    task.cancel()
    with pytest.raises(asyncio.CancelledError):
        await task


async def test_start_fails_clearly_when_the_caches_cannot_sync(apiserver: ApiServer) -> None:
    async with KubeClient.from_kubeconfig(apiserver.kubeconfig) as client:
        await apiserver.aclose()
        manager = ControllerManager(client, settings(sync_timeout=0.3))
        with pytest.raises(ControllerError, match=r"did not sync within 0\.3s"):
            await manager.start()
