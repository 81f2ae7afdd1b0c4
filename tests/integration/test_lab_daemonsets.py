"""The DaemonSet controller, the scheduler's taint and affinity filters and the NoExecute taint manager against the
real embedded API server, with a stand-in kubelet (:mod:`tests.integration.lab_cluster`)."""

from __future__ import annotations

import copy
from collections.abc import AsyncIterator
from typing import Any

import pytest
from tests.integration.lab_cluster import NS, Kubelet, Obj, add_node, set_pod_status, settings, until

from ambit.apiserver.server import ApiServer
from ambit.k8s import KubeClient, kinds
from ambit.lab.controllers import ControllerManager


@pytest.fixture
async def kube(apiserver: ApiServer) -> AsyncIterator[KubeClient]:
    async with KubeClient.from_kubeconfig(apiserver.kubeconfig) as client:
        yield client


@pytest.fixture
async def controllers(kube: KubeClient) -> AsyncIterator[ControllerManager]:
    async with ControllerManager(kube, settings(endpoints=False)) as manager:
        yield manager


def daemon_set(name: str = "agent", image: str = "registry.example/agent:1", **spec: Any) -> Obj:
    labels = {"app": name}
    pod_spec: Obj = {"containers": [{"name": "agent", "image": image}], **spec.pop("pod", {})}
    return {
        "metadata": {"name": name, "namespace": NS},
        "spec": {
            "selector": {"matchLabels": labels},
            "template": {"metadata": {"labels": labels}, "spec": pod_spec},
            **spec,
        },
    }


async def daemon_pods(kube: KubeClient, name: str = "agent") -> list[Obj]:
    items = (await kube.list(kinds.PODS, NS, label_selector={"app": name}))[0]
    return [p for p in items if not p["metadata"].get("deletionTimestamp")]


async def revisions(kube: KubeClient) -> list[Obj]:
    return sorted((await kube.list(kinds.CONTROLLER_REVISIONS, NS))[0], key=lambda r: r["revision"])


def image_of(pod: Obj) -> str:
    return str(pod["spec"]["containers"][0]["image"])


async def placed(kube: KubeClient, count: int, name: str = "agent", image: str | None = None) -> dict[str, Obj]:
    """The DaemonSet's pods by node, once there are ``count`` of them, all bound, Running and ready (and all of
    ``image`` when given); else empty."""
    pods = await daemon_pods(kube, name)
    by_node = {p["spec"].get("nodeName", ""): p for p in pods}
    ready = all(p["status"].get("phase") == "Running" and (image is None or image_of(p) == image) for p in pods)
    return by_node if len(pods) == count == len(by_node) and "" not in by_node and ready else {}


async def settled(kube: KubeClient, name: str = "agent", **want: int) -> Obj:
    """The DaemonSet once its status has caught up with its generation and shows ``want``; else its status, which
    is falsy only when empty (so a timeout shows it)."""
    ds = await kube.get(kinds.DAEMON_SETS, name, NS)
    status = ds.get("status") or {}
    if status.get("observedGeneration") == ds["metadata"]["generation"] and all(
        status.get(k) == v for k, v in want.items()
    ):
        return ds
    return {}


async def test_a_daemon_set_runs_one_pinned_pod_per_node_and_a_new_node_gets_its_own(
    kube: KubeClient, controllers: ControllerManager
) -> None:
    async with Kubelet(kube):
        for name in ("node-a", "node-b"):
            await add_node(kube, name)
        privileged = {"metadata": {"labels": {"pod-security.kubernetes.io/enforce": "privileged"}}}
        await kube.patch(kinds.NAMESPACES, NS, privileged)  # host network, as node agents have
        await kube.create(kinds.DAEMON_SETS, daemon_set(pod={"hostNetwork": True}))
        pods = await until(lambda: placed(kube, 2), "a pod on each node")
        pod = pods["node-a"]
        terms = pod["spec"]["affinity"]["nodeAffinity"]["requiredDuringSchedulingIgnoredDuringExecution"]
        assert terms["nodeSelectorTerms"] == [
            {"matchFields": [{"key": "metadata.name", "operator": "In", "values": ["node-a"]}]}
        ]
        tolerated = {(t["key"], t["effect"]) for t in pod["spec"]["tolerations"]}
        assert tolerated == {
            ("node.kubernetes.io/not-ready", "NoExecute"),
            ("node.kubernetes.io/unreachable", "NoExecute"),
            ("node.kubernetes.io/disk-pressure", "NoSchedule"),
            ("node.kubernetes.io/memory-pressure", "NoSchedule"),
            ("node.kubernetes.io/pid-pressure", "NoSchedule"),
            ("node.kubernetes.io/unschedulable", "NoSchedule"),
            ("node.kubernetes.io/network-unavailable", "NoSchedule"),
        }
        ref = next(r for r in pod["metadata"]["ownerReferences"] if r.get("controller"))
        assert (ref["kind"], ref["name"]) == ("DaemonSet", "agent")
        [revision] = await revisions(kube)
        pod_hash = revision["metadata"]["labels"]["controller-revision-hash"]
        assert revision["metadata"]["name"] == f"agent-{pod_hash}"
        assert revision["revision"] == 1
        assert revision["data"]["spec"]["template"]["$patch"] == "replace"
        assert revision["data"]["spec"]["template"]["spec"]["containers"][0]["image"] == "registry.example/agent:1"
        assert pod["metadata"]["labels"]["controller-revision-hash"] == pod_hash
        assert pod["metadata"]["labels"]["pod-template-generation"] == "1"
        ds = await until(
            lambda: settled(kube, desiredNumberScheduled=2, currentNumberScheduled=2, numberReady=2),
            "status counts both nodes",
        )
        assert ds["metadata"]["annotations"]["deprecated.daemonset.template.generation"] == "1"
        assert ds["status"]["updatedNumberScheduled"] == ds["status"]["numberAvailable"] == 2
        assert ds["status"]["numberMisscheduled"] == ds["status"]["numberUnavailable"] == 0

        await add_node(kube, "node-c")
        pods = await until(lambda: placed(kube, 3), "a pod on the new node")
        assert set(pods) == {"node-a", "node-b", "node-c"}
        await until(lambda: settled(kube, desiredNumberScheduled=3, numberAvailable=3), "status counts node-c")


async def test_taints_and_node_selectors_decide_where_daemon_pods_go(
    kube: KubeClient, controllers: ControllerManager
) -> None:
    async with Kubelet(kube):
        await add_node(kube, "plain", role="worker")
        tainted = await add_node(kube, "tainted", role="worker")
        await kube.patch(
            kinds.NODES, "tainted", {"spec": {"taints": [{"key": "dedicated", "value": "db", "effect": "NoSchedule"}]}}
        )
        await add_node(kube, "other", role="edge")
        assert tainted
        await kube.create(kinds.DAEMON_SETS, daemon_set("plain", pod={"nodeSelector": {"role": "worker"}}))
        tolerant = {"tolerations": [{"key": "dedicated", "operator": "Exists", "effect": "NoSchedule"}]}
        await kube.create(kinds.DAEMON_SETS, daemon_set("tolerant", **{"pod": tolerant}))
        assert set(await until(lambda: placed(kube, 1, "plain"), "plain on the untainted worker")) == {"plain"}
        assert set(await until(lambda: placed(kube, 3, "tolerant"), "tolerant everywhere")) == {
            "plain",
            "tainted",
            "other",
        }
        await until(lambda: settled(kube, "plain", desiredNumberScheduled=1, numberAvailable=1), "plain status")

        # Removing the label makes the pod misplaced: the controller deletes it.
        await kube.patch(kinds.NODES, "plain", {"metadata": {"labels": {"role": "gone"}}})
        assert await until(lambda: _none(daemon_pods(kube, "plain")), "pod of the node that stopped matching gone")


async def _none(items: Any) -> bool:
    return not await items


async def test_a_pod_no_node_tolerates_is_unschedulable_with_kubes_message_until_the_taint_goes(
    kube: KubeClient, controllers: ControllerManager
) -> None:
    await add_node(kube, "node-a")
    await kube.patch(kinds.NODES, "node-a", {"spec": {"taints": [{"key": "k", "value": "v", "effect": "NoSchedule"}]}})
    await add_node(kube, "node-b", disk="hdd")
    pod = {
        "metadata": {"name": "picky", "namespace": NS},
        "spec": {"containers": [{"name": "c", "image": "registry.example/c:1"}], "nodeSelector": {"disk": "ssd"}},
    }
    pod["spec"]["nodeSelector"] = {}
    pod["spec"]["affinity"] = {
        "nodeAffinity": {
            "requiredDuringSchedulingIgnoredDuringExecution": {
                "nodeSelectorTerms": [{"matchExpressions": [{"key": "disk", "operator": "In", "values": ["ssd"]}]}]
            }
        }
    }
    await kube.create(kinds.PODS, pod)

    async def unschedulable() -> Obj:
        got = await kube.get(kinds.PODS, "picky", NS)
        cond = next((c for c in got["status"].get("conditions") or [] if c["type"] == "PodScheduled"), {})
        return cond if cond.get("status") == "False" else {}

    cond = await until(unschedulable, "PodScheduled=False")
    assert cond["reason"] == "Unschedulable"
    assert cond["message"] == (
        "0/2 nodes are available: 1 node(s) didn't match Pod's node affinity/selector, "
        "1 node(s) had untolerated taint {k: v}."
    )
    await kube.patch(kinds.NODES, "node-a", {"metadata": {"labels": {"disk": "ssd"}}, "spec": {"taints": None}})

    async def bound() -> str:
        return str((await kube.get(kinds.PODS, "picky", NS))["spec"].get("nodeName") or "")

    assert await until(bound, "bound once node-a fits") == "node-a"


async def test_a_no_execute_taint_evicts_pods_that_do_not_tolerate_it(
    kube: KubeClient, controllers: ControllerManager
) -> None:
    async with Kubelet(kube):
        await add_node(kube, "node-a")
        container = [{"name": "c", "image": "registry.example/c:1"}]
        for name, tolerations in (
            ("intolerant", []),
            ("patient", [{"key": "maintenance", "operator": "Exists", "effect": "NoExecute"}]),
            ("brief", [{"key": "maintenance", "operator": "Exists", "effect": "NoExecute", "tolerationSeconds": 1}]),
        ):
            body = {"metadata": {"name": name, "namespace": NS}, "spec": {"containers": container}}
            body["spec"]["tolerations"] = tolerations
            await kube.create(kinds.PODS, body)

        async def running() -> set[str]:
            items = (await kube.list(kinds.PODS, NS))[0]
            return {p["metadata"]["name"] for p in items if p["status"].get("phase") == "Running"}

        assert await until(lambda: _equal(running(), {"intolerant", "patient", "brief"}), "all three running")
        taint = {"key": "maintenance", "value": "", "effect": "NoExecute"}
        await kube.patch(kinds.NODES, "node-a", {"spec": {"taints": [taint]}})
        assert await until(lambda: _equal(running(), {"patient", "brief"}), "intolerant evicted at once")
        assert await until(lambda: _equal(running(), {"patient"}), "brief evicted after its tolerationSeconds")
        items = (await kube.list(kinds.EVENTS, NS))[0]
        notes = {e["note"] for e in items if e.get("reason") == "TaintManagerEviction"}
        assert notes == {"Marking for deletion Pod default/intolerant", "Marking for deletion Pod default/brief"}


async def _equal(value: Any, want: Any) -> bool:
    return bool(await value == want)


def is_ready(pod: Obj) -> bool:
    return any(c["type"] == "Ready" and c["status"] == "True" for c in pod["status"].get("conditions") or [])


async def rollout_step(kube: KubeClient, image: str) -> tuple[int, int]:
    """(pods of ``image``, nodes without a ready pod) right now."""
    pods = await daemon_pods(kube)
    new = sum(1 for p in pods if image_of(p) == image)
    ready_nodes = {p["spec"].get("nodeName") for p in pods if is_ready(p)}
    return new, 3 - len(ready_nodes)


async def test_a_template_change_rolls_node_by_node_with_a_new_revision_and_undo_returns(
    kube: KubeClient, controllers: ControllerManager
) -> None:
    async with Kubelet(kube) as kubelet:
        for name in ("node-a", "node-b", "node-c"):
            await add_node(kube, name)
        await kube.create(kinds.DAEMON_SETS, daemon_set())
        await until(lambda: placed(kube, 3), "three pods")
        await until(lambda: settled(kube, numberAvailable=3), "available")
        kubelet.auto_ready = False
        patch = {
            "spec": {"template": {"spec": {"containers": [{"name": "agent", "image": "registry.example/agent:2"}]}}}
        }
        await kube.patch(kinds.DAEMON_SETS, "agent", patch, NS, patch_type="strategic")
        for done in range(1, 4):

            async def one_more(done: int = done) -> Obj:
                pods = await daemon_pods(kube)
                fresh = [
                    p
                    for p in pods
                    if image_of(p) == "registry.example/agent:2" and p["status"].get("phase") == "Running"
                ]
                waiting = [p for p in fresh if not is_ready(p)]
                return waiting[0] if len(fresh) == done and len(waiting) == 1 else {}

            pod = await until(one_more, f"new pod {done}")
            new, unavailable = await rollout_step(kube, "registry.example/agent:2")
            assert (new, unavailable) == (done, 1)  # maxUnavailable 1: one node at a time
            await set_pod_status(kube, pod["metadata"]["name"], ready=True)
        ds = await until(lambda: settled(kube, updatedNumberScheduled=3, numberAvailable=3), "rolled out")
        assert ds["metadata"]["annotations"]["deprecated.daemonset.template.generation"] == "2"
        first, second = await revisions(kube)
        assert (first["revision"], second["revision"]) == (1, 2)
        new_hash = second["metadata"]["labels"]["controller-revision-hash"]
        assert {p["metadata"]["labels"]["controller-revision-hash"] for p in await daemon_pods(kube)} == {new_hash}

        kubelet.auto_ready = True
        # What `kubectl rollout undo` sends: the old revision's data as a strategic merge patch.
        await kube.patch(kinds.DAEMON_SETS, "agent", first["data"], NS, patch_type="strategic")
        await until(lambda: placed(kube, 3, image="registry.example/agent:1"), "back on the first template")

        async def renumbered() -> list[Obj]:
            revs = await revisions(kube)
            return (
                revs
                if [r["metadata"]["name"] for r in revs] == [second["metadata"]["name"], first["metadata"]["name"]]
                else []
            )

        revs = await until(renumbered, "the first revision renumbered as the newest")
        assert [r["revision"] for r in revs] == [2, 3]


async def test_max_surge_starts_the_new_pod_before_the_old_one_goes(
    kube: KubeClient, controllers: ControllerManager
) -> None:
    async with Kubelet(kube) as kubelet:
        await add_node(kube, "node-a")
        strategy = {"type": "RollingUpdate", "rollingUpdate": {"maxSurge": 1, "maxUnavailable": 0}}
        await kube.create(kinds.DAEMON_SETS, daemon_set(updateStrategy=strategy))
        await until(lambda: placed(kube, 1), "one pod")
        kubelet.auto_ready = False
        patch = {"spec": {"template": {"metadata": {"annotations": {"v": "2"}}}}}
        await kube.patch(kinds.DAEMON_SETS, "agent", patch, NS, patch_type="strategic")

        async def both() -> list[Obj]:
            pods = await daemon_pods(kube)
            running = [p for p in pods if p["status"].get("phase") == "Running"]
            return running if len(running) == 2 else []

        pods = await until(both, "old and new pod side by side")
        new = next(p for p in pods if (p["metadata"].get("annotations") or {}).get("v") == "2")
        await set_pod_status(kube, new["metadata"]["name"], ready=True)

        async def only_new() -> bool:
            names = [p["metadata"]["name"] for p in await daemon_pods(kube)]
            return names == [new["metadata"]["name"]]

        assert await until(only_new, "the old pod deleted once the new one is available")


async def test_on_delete_replaces_only_pods_the_user_deleted(kube: KubeClient, controllers: ControllerManager) -> None:
    async with Kubelet(kube):
        for name in ("node-a", "node-b"):
            await add_node(kube, name)
        await kube.create(kinds.DAEMON_SETS, daemon_set(updateStrategy={"type": "OnDelete"}))
        pods = await until(lambda: placed(kube, 2), "two pods")
        patch = {
            "spec": {"template": {"spec": {"containers": [{"name": "agent", "image": "registry.example/agent:2"}]}}}
        }
        await kube.patch(kinds.DAEMON_SETS, "agent", patch, NS, patch_type="strategic")
        await until(lambda: _count(revisions(kube), 2), "a second revision")
        ds = await until(lambda: settled(kube, updatedNumberScheduled=0, numberAvailable=2), "nothing replaced yet")
        assert ds["spec"]["updateStrategy"] == {"type": "OnDelete"}
        await kube.delete(kinds.PODS, pods["node-a"]["metadata"]["name"], NS)

        async def replaced() -> dict[str, str]:
            now = await placed(kube, 2)
            return {node: image_of(p) for node, p in now.items()} if now else {}

        images = await until(
            lambda: _where(replaced(), lambda v: "registry.example/agent:2" in v.values()), "node-a replaced"
        )
        assert images == {"node-a": "registry.example/agent:2", "node-b": "registry.example/agent:1"}


async def _count(items: Any, count: int) -> bool:
    return len(await items) == count


async def _where(value: Any, check: Any) -> Any:
    got = await value
    return got if got and check(got) else None


async def test_old_revisions_beyond_the_history_limit_are_pruned(
    kube: KubeClient, controllers: ControllerManager
) -> None:
    async with Kubelet(kube):
        await add_node(kube, "node-a")
        body = daemon_set(revisionHistoryLimit=1)
        body["metadata"]["annotations"] = {"kubernetes.io/change-cause": "first"}
        await kube.create(kinds.DAEMON_SETS, body)
        await until(lambda: placed(kube, 1), "one pod")
        for version in (2, 3, 4):
            patch: Obj = {
                "metadata": {"annotations": {"kubernetes.io/change-cause": f"image {version}"}},
                "spec": {
                    "template": {
                        "spec": {"containers": [{"name": "agent", "image": f"registry.example/agent:{version}"}]}
                    }
                },
            }
            await kube.patch(kinds.DAEMON_SETS, "agent", patch, NS, patch_type="strategic")
            await until(lambda v=version: placed(kube, 1, image=f"registry.example/agent:{v}"), f"version {version}")

        async def pruned() -> list[Obj]:
            revs = await revisions(kube)
            return revs if len(revs) == 2 else []

        revs = await until(pruned, "one old revision kept besides the current one")
        assert [r["revision"] for r in revs] == [3, 4]
        assert [r["metadata"]["annotations"]["kubernetes.io/change-cause"] for r in revs] == ["image 3", "image 4"]
        assert all(r["data"] == copy.deepcopy(r["data"]) for r in revs)


async def test_deleting_a_daemon_set_collects_its_pods_and_revisions(
    kube: KubeClient, controllers: ControllerManager
) -> None:
    async with Kubelet(kube):
        await add_node(kube, "node-a")
        await kube.create(kinds.DAEMON_SETS, daemon_set())
        await until(lambda: placed(kube, 1), "one pod")
        await until(lambda: _count(revisions(kube), 1), "one revision")
        await kube.delete(kinds.DAEMON_SETS, "agent", NS)

        async def collected() -> bool:
            items = (await kube.list(kinds.PODS, NS, label_selector={"app": "agent"}))[0]
            return not items and not await revisions(kube)

        assert await until(collected, "pods and revisions gone")
