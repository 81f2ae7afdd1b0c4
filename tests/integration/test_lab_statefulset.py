"""The StatefulSet controller against the real embedded API server, with the scheduler and a stand-in kubelet
(:mod:`tests.integration.lab_cluster`): ordered and parallel pod management, scaling, replacement of deleted and
failed pods, rolling updates with partitions, OnDelete, status and revisions, stable network identity, garbage
collection, and the members' volume claims."""

from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator
from typing import Any

import pytest
from tests.integration.lab_cluster import NS, Kubelet, Obj, add_node, set_pod_status, settings, until

from ambit.apiserver.server import ApiServer
from ambit.k8s import KubeApiStatusError, KubeClient, KubeNotFoundError, kinds
from ambit.lab.controllers import ControllerManager

IMAGE = "registry.example/web:1"
HOLD = "example.com/hold"
"""A finalizer the test puts on a pod so that it stays terminating until the test lets it go."""


@pytest.fixture
async def kube(apiserver: ApiServer) -> AsyncIterator[KubeClient]:
    async with KubeClient.from_kubeconfig(apiserver.kubeconfig) as client:
        await add_node(client, "node-a")
        yield client


@pytest.fixture
async def controllers(kube: KubeClient) -> AsyncIterator[ControllerManager]:
    async with ControllerManager(kube, settings(disruption=False)) as manager:
        yield manager


def stateful_set(name: str = "web", replicas: int = 3, image: str = IMAGE, **spec: Any) -> Obj:
    labels = {"app": name}
    return {
        "metadata": {"name": name, "namespace": NS},
        "spec": {
            "replicas": replicas,
            "serviceName": name,
            "selector": {"matchLabels": labels},
            "template": {
                "metadata": {"labels": labels},
                "spec": {"containers": [{"name": "web", "image": image}]},
            },
            **spec,
        },
    }


async def live_pods(kube: KubeClient, name: str = "web") -> dict[str, Obj]:
    """The set's pods that are not being deleted, by name."""
    items = (await kube.list(kinds.PODS, NS, label_selector={"app": name}))[0]
    return {p["metadata"]["name"]: p for p in items if not p["metadata"].get("deletionTimestamp")}


async def running(kube: KubeClient, count: int, name: str = "web", image: str | None = None) -> dict[str, Obj]:
    """The set's pods once exactly ``<name>-0 .. <name>-<count-1>`` exist, Running and ready (and of ``image``)."""
    pods = await live_pods(kube, name)
    want = {f"{name}-{i}" for i in range(count)}
    ok = set(pods) == want and all(
        p["status"].get("phase") == "Running"
        and any(c.get("type") == "Ready" and c.get("status") == "True" for c in p["status"].get("conditions") or [])
        and (image is None or image_of(p) == image)
        for p in pods.values()
    )
    return pods if ok else {}


async def settled(kube: KubeClient, name: str = "web", **want: Any) -> Obj:
    sts = await kube.get(kinds.STATEFUL_SETS, name, NS)
    status = sts.get("status") or {}
    if status.get("observedGeneration") == sts["metadata"]["generation"] and all(
        status.get(k) == v for k, v in want.items()
    ):
        return sts
    return {}


def image_of(pod: Obj) -> str:
    return str(pod["spec"]["containers"][0]["image"])


def ordinals(names: Any) -> list[int]:
    return sorted(int(str(n).rsplit("-", 1)[1]) for n in names)


async def stays_absent(kube: KubeClient, pod: str, seconds: float = 0.6) -> bool:
    """True when ``pod`` does not appear within ``seconds`` (the controller had time to act, and did not)."""
    loop = asyncio.get_running_loop()
    deadline = loop.time() + seconds
    while loop.time() < deadline:
        if pod in await live_pods(kube):
            return False
        await asyncio.sleep(0.05)
    return True


async def test_ordered_ready_creates_each_pod_only_once_the_one_before_is_ready(
    kube: KubeClient, controllers: ControllerManager
) -> None:
    async with Kubelet(kube, auto_ready=False):
        await kube.create(kinds.STATEFUL_SETS, stateful_set())
        await until(lambda: _running_not_ready(kube, "web-0"), "web-0 running")
        assert await stays_absent(kube, "web-1")
        await set_pod_status(kube, "web-0", ready=True)
        await until(lambda: _running_not_ready(kube, "web-1"), "web-1 running")
        assert await stays_absent(kube, "web-2")
        await set_pod_status(kube, "web-1", ready=True)
        await until(lambda: _running_not_ready(kube, "web-2"), "web-2 running")
        await set_pod_status(kube, "web-2", ready=True)
        await until(lambda: running(kube, 3), "three ready pods")

        pods = await live_pods(kube)
        pod = pods["web-1"]
        sts = await kube.get(kinds.STATEFUL_SETS, "web", NS)
        labels = pod["metadata"]["labels"]
        assert labels["app"] == "web"
        assert labels["statefulset.kubernetes.io/pod-name"] == "web-1"
        assert labels["apps.kubernetes.io/pod-index"] == "1"
        assert labels["controller-revision-hash"].startswith("web-")
        assert (pod["spec"]["hostname"], pod["spec"]["subdomain"]) == ("web-1", "web")
        [ref] = pod["metadata"]["ownerReferences"]
        assert (ref["kind"], ref["name"], ref["uid"], ref["controller"]) == (
            "StatefulSet",
            "web",
            sts["metadata"]["uid"],
            True,
        )


async def _running_not_ready(kube: KubeClient, name: str) -> bool:
    pods = await live_pods(kube)
    return name in pods and pods[name]["status"].get("phase") == "Running"


async def test_parallel_creates_every_pod_without_waiting_for_readiness(
    kube: KubeClient, controllers: ControllerManager
) -> None:
    async with Kubelet(kube, auto_ready=False):
        await kube.create(kinds.STATEFUL_SETS, stateful_set(podManagementPolicy="Parallel"))
        pods = await until(lambda: _all_running(kube, 3), "three running pods, none of them ready", within=10)
        assert ordinals(pods) == [0, 1, 2]
        sts = await until(lambda: settled(kube, replicas=3, readyReplicas=0), "status: three pods, none ready")
        assert sts["status"]["availableReplicas"] == 0


async def _all_running(kube: KubeClient, count: int) -> dict[str, Obj]:
    pods = await live_pods(kube)
    ok = len(pods) == count and all(p["status"].get("phase") == "Running" for p in pods.values())
    return pods if ok else {}


async def test_scaling_up_adds_the_next_ordinals_and_down_removes_the_highest_one_at_a_time(
    kube: KubeClient, controllers: ControllerManager
) -> None:
    async with Kubelet(kube):
        await kube.create(kinds.STATEFUL_SETS, stateful_set(replicas=2))
        await until(lambda: running(kube, 2), "web-0 and web-1")
        await kube.patch(kinds.STATEFUL_SETS, "web", {"spec": {"replicas": 4}}, NS)
        await until(lambda: running(kube, 4), "web-0 .. web-3")

        # web-3 is held terminating: web-2 must not go until it is gone.
        await kube.patch(kinds.PODS, "web-3", {"metadata": {"finalizers": [HOLD]}}, NS)
        await kube.patch(kinds.STATEFUL_SETS, "web", {"spec": {"replicas": 1}}, NS)
        await until(lambda: _deleting(kube, "web-3"), "web-3 terminating")
        await asyncio.sleep(0.5)
        assert set(await live_pods(kube)) == {"web-0", "web-1", "web-2"}
        await kube.patch(kinds.PODS, "web-3", {"metadata": {"finalizers": None}}, NS)
        await until(lambda: running(kube, 1), "only web-0 left")
        sts = await until(lambda: settled(kube, replicas=1, readyReplicas=1), "status after scaling down")
        assert sts["status"]["currentReplicas"] == sts["status"]["updatedReplicas"] == 1


async def test_scaling_down_waits_while_a_remaining_pod_is_unhealthy(
    kube: KubeClient, controllers: ControllerManager
) -> None:
    async with Kubelet(kube):
        await kube.create(kinds.STATEFUL_SETS, stateful_set(replicas=3))
        await until(lambda: running(kube, 3), "three pods")
        await set_pod_status(kube, "web-0", ready=False)
        await until(lambda: settled(kube, readyReplicas=2), "web-0 seen unready")
        await kube.patch(kinds.STATEFUL_SETS, "web", {"spec": {"replicas": 1}}, NS)
        await asyncio.sleep(0.6)
        assert set(await live_pods(kube)) == {"web-0", "web-1", "web-2"}
        await set_pod_status(kube, "web-0", ready=True)
        await until(lambda: running(kube, 1), "only web-0 left")


async def _deleting(kube: KubeClient, name: str) -> bool:
    try:
        pod = await kube.get(kinds.PODS, name, NS)
    except KubeNotFoundError:
        return False
    return bool(pod["metadata"].get("deletionTimestamp"))


async def test_a_deleted_or_failed_pod_comes_back_with_the_same_name(
    kube: KubeClient, controllers: ControllerManager
) -> None:
    async with Kubelet(kube):
        await kube.create(kinds.STATEFUL_SETS, stateful_set(replicas=2))
        before = await until(lambda: running(kube, 2), "two pods")
        await kube.delete(kinds.PODS, "web-1", NS)
        after = await until(lambda: _replaced(kube, "web-1", before["web-1"]["metadata"]["uid"]), "web-1 made again")
        assert after["spec"]["hostname"] == "web-1"
        await set_pod_status(kube, "web-0", ready=False, phase="Failed")
        await until(lambda: _replaced(kube, "web-0", before["web-0"]["metadata"]["uid"]), "web-0 made again")
        await until(lambda: running(kube, 2), "two pods again")


async def _replaced(kube: KubeClient, name: str, old_uid: str) -> Obj:
    pods = await live_pods(kube)
    pod = pods.get(name)
    if pod and pod["metadata"]["uid"] != old_uid and pod["status"].get("phase") == "Running":
        return pod
    return {}


async def _watch_update_order(kube: KubeClient, image: str, count: int) -> list[list[int]]:
    """Sample the ordinals already on ``image`` until all ``count`` are; each sample must be a top slice."""
    samples: list[list[int]] = []
    loop = asyncio.get_running_loop()
    deadline = loop.time() + 20
    while loop.time() < deadline:
        pods = await live_pods(kube)
        updated = ordinals(n for n, p in pods.items() if image_of(p) == image)
        if not samples or samples[-1] != updated:
            samples.append(updated)
        if len(updated) == count and len(pods) == count:
            return samples
        await asyncio.sleep(0.01)
    raise AssertionError(f"the rollout did not finish; samples {samples}")


async def test_a_rolling_update_replaces_pods_from_the_highest_ordinal_down(
    kube: KubeClient, controllers: ControllerManager
) -> None:
    async with Kubelet(kube):
        await kube.create(kinds.STATEFUL_SETS, stateful_set(replicas=3))
        await until(lambda: running(kube, 3), "three pods")
        first = await until(lambda: settled(kube, readyReplicas=3, updatedReplicas=3), "first revision rolled out")
        old_revision = first["status"]["updateRevision"]
        assert first["status"]["currentRevision"] == old_revision

        new_image = "registry.example/web:2"
        template = {"spec": {"containers": [{"name": "web", "image": new_image}]}}
        await kube.patch(kinds.STATEFUL_SETS, "web", {"spec": {"template": template}}, NS, patch_type="strategic")
        samples = await _watch_update_order(kube, new_image, 3)
        for sample in samples:
            assert sample == list(range(3 - len(sample), 3)), samples
        sts = await until(
            lambda: settled(kube, readyReplicas=3, updatedReplicas=3, currentReplicas=3), "rollout complete"
        )
        status = sts["status"]
        assert status["currentRevision"] == status["updateRevision"] != old_revision
        assert status["replicas"] == status["availableReplicas"] == 3
        assert status["collisionCount"] == 0
        assert status["observedGeneration"] == sts["metadata"]["generation"] == 2
        pods = await live_pods(kube)
        assert {p["metadata"]["labels"]["controller-revision-hash"] for p in pods.values()} == {
            status["updateRevision"]
        }

        history = sorted((await kube.list(kinds.CONTROLLER_REVISIONS, NS))[0], key=lambda r: r["revision"])
        assert [(r["metadata"]["name"], r["revision"]) for r in history] == [
            (old_revision, 1),
            (status["updateRevision"], 2),
        ]
        for revision in history:
            ref = revision["metadata"]["ownerReferences"][0]
            assert (ref["kind"], ref["name"], ref["controller"]) == ("StatefulSet", "web", True)
            assert revision["data"]["spec"]["template"]["$patch"] == "replace"


async def test_a_partition_keeps_the_lower_ordinals_on_the_current_revision(
    kube: KubeClient, controllers: ControllerManager
) -> None:
    async with Kubelet(kube):
        strategy = {"type": "RollingUpdate", "rollingUpdate": {"partition": 2}}
        await kube.create(kinds.STATEFUL_SETS, stateful_set(replicas=3, updateStrategy=strategy))
        await until(lambda: running(kube, 3), "three pods")
        first = await until(lambda: settled(kube, readyReplicas=3, updatedReplicas=3), "first revision")
        template = {"spec": {"containers": [{"name": "web", "image": "registry.example/web:2"}]}}
        await kube.patch(kinds.STATEFUL_SETS, "web", {"spec": {"template": template}}, NS, patch_type="strategic")
        sts = await until(
            lambda: settled(kube, updatedReplicas=1, currentReplicas=2, readyReplicas=3), "web-2 alone updated"
        )
        assert sts["status"]["currentRevision"] == first["status"]["currentRevision"]
        pods = await live_pods(kube)
        assert {n: image_of(p) for n, p in pods.items()} == {
            "web-0": IMAGE,
            "web-1": IMAGE,
            "web-2": "registry.example/web:2",
        }
        # Below the partition a deleted pod comes back on the current revision.
        old_uid = pods["web-0"]["metadata"]["uid"]
        await kube.delete(kinds.PODS, "web-0", NS)
        again = await until(lambda: _replaced(kube, "web-0", old_uid), "web-0 made again")
        assert image_of(again) == IMAGE
        # Lowering the partition to 0 finishes the rollout.
        await kube.patch(
            kinds.STATEFUL_SETS, "web", {"spec": {"updateStrategy": {"rollingUpdate": {"partition": 0}}}}, NS
        )
        await until(lambda: running(kube, 3, image="registry.example/web:2"), "all on the new image")
        done = await until(lambda: settled(kube, updatedReplicas=3, currentReplicas=3), "rollout complete")
        assert done["status"]["currentRevision"] == done["status"]["updateRevision"]


async def test_on_delete_replaces_only_the_pods_someone_deleted(
    kube: KubeClient, controllers: ControllerManager
) -> None:
    async with Kubelet(kube):
        await kube.create(kinds.STATEFUL_SETS, stateful_set(replicas=2, updateStrategy={"type": "OnDelete"}))
        await until(lambda: running(kube, 2), "two pods")
        template = {"spec": {"containers": [{"name": "web", "image": "registry.example/web:2"}]}}
        await kube.patch(kinds.STATEFUL_SETS, "web", {"spec": {"template": template}}, NS, patch_type="strategic")
        await until(lambda: settled(kube, updatedReplicas=0, currentReplicas=2), "new revision seen, nothing replaced")
        await asyncio.sleep(0.4)
        assert {image_of(p) for p in (await live_pods(kube)).values()} == {IMAGE}
        await kube.delete(kinds.PODS, "web-0", NS)
        await until(lambda: _on_image(kube, "web-0", "registry.example/web:2"), "web-0 on the new image")
        assert image_of((await live_pods(kube))["web-1"]) == IMAGE
        await until(lambda: settled(kube, updatedReplicas=1, currentReplicas=1), "one of each")


async def _on_image(kube: KubeClient, name: str, image: str) -> bool:
    pod = (await live_pods(kube)).get(name)
    return pod is not None and image_of(pod) == image and pod["status"].get("phase") == "Running"


async def test_a_headless_services_endpoint_slice_names_each_pods_hostname(
    kube: KubeClient, controllers: ControllerManager
) -> None:
    service = {
        "metadata": {"name": "web", "namespace": NS},
        "spec": {"clusterIP": "None", "selector": {"app": "web"}, "ports": [{"name": "http", "port": 80}]},
    }
    async with Kubelet(kube):
        await kube.create(kinds.SERVICES, service)
        await kube.create(kinds.STATEFUL_SETS, stateful_set(replicas=2))
        await until(lambda: running(kube, 2), "two pods")
        hostnames = await until(lambda: _slice_hostnames(kube), "both hostnames in the slice")
        assert hostnames == {"web-0", "web-1"}


async def _slice_hostnames(kube: KubeClient) -> set[str]:
    slices = (await kube.list(kinds.ENDPOINT_SLICES, NS, label_selector={"kubernetes.io/service-name": "web"}))[0]
    names = {e.get("hostname") for s in slices for e in s.get("endpoints") or []}
    return names if names == {"web-0", "web-1"} else set()


async def test_deleting_a_set_removes_its_pods_and_revisions(kube: KubeClient, controllers: ControllerManager) -> None:
    async with Kubelet(kube):
        await kube.create(kinds.STATEFUL_SETS, stateful_set(replicas=2))
        await until(lambda: running(kube, 2), "two pods")
        assert (await kube.list(kinds.CONTROLLER_REVISIONS, NS))[0]
        await kube.delete(kinds.STATEFUL_SETS, "web", NS)
        await until(lambda: _nothing_left(kube), "pods and revisions gone")


async def _nothing_left(kube: KubeClient) -> bool:
    pods = (await kube.list(kinds.PODS, NS, label_selector={"app": "web"}))[0]
    return not pods and not (await kube.list(kinds.CONTROLLER_REVISIONS, NS))[0]


async def test_volume_claim_templates_become_claims_named_after_the_member(
    kube: KubeClient, controllers: ControllerManager
) -> None:
    claim = {"metadata": {"name": "data"}, "spec": {"accessModes": ["ReadWriteOnce"]}}
    claim["spec"]["resources"] = {"requests": {"storage": "1Gi"}}
    body = stateful_set(replicas=1, volumeClaimTemplates=[claim])
    body["spec"]["template"]["spec"]["containers"][0]["volumeMounts"] = [{"name": "data", "mountPath": "/data"}]
    await kube.create(kinds.STATEFUL_SETS, body)
    made = await until(lambda: _claim(kube, "data-web-0"), "the member's claim")
    assert made["metadata"]["labels"] == {"app": "web"}
    pod = await until(lambda: _pod(kube, "web-0"), "web-0")
    assert {"name": "data", "persistentVolumeClaim": {"claimName": "data-web-0"}} in pod["spec"]["volumes"]
    sts = await kube.get(kinds.STATEFUL_SETS, "web", NS)
    assert not (sts.get("status") or {}).get("conditions")
    assert not any(e.get("reason") == "NoPersistentVolumes" for e in await _warnings(kube))


async def _claim(kube: KubeClient, name: str) -> Obj | None:
    try:
        return await kube.get(kinds.PERSISTENT_VOLUME_CLAIMS, name, NS)
    except KubeNotFoundError:
        return None


async def _pod(kube: KubeClient, name: str) -> Obj | None:
    try:
        return await kube.get(kinds.PODS, name, NS)
    except KubeNotFoundError:
        return None


async def _warnings(kube: KubeClient) -> list[Obj]:
    items = (await kube.list(kinds.EVENTS, NS))[0]
    return [e for e in items if e.get("type") == "Warning" and (e.get("regarding") or {}).get("name") == "web"]


@pytest.mark.parametrize(
    ("spec", "field"),
    [
        ({"replicas": -1}, "spec.replicas"),
        ({"podManagementPolicy": "Sometimes"}, "spec.podManagementPolicy"),
        ({"updateStrategy": {"type": "Whenever"}}, "spec.updateStrategy"),
        ({"updateStrategy": {"type": "OnDelete", "rollingUpdate": {}}}, "spec.updateStrategy.rollingUpdate"),
        ({"updateStrategy": {"rollingUpdate": {"partition": -2}}}, "spec.updateStrategy.rollingUpdate.partition"),
        ({"serviceName": "Not_A_Label"}, "spec.serviceName"),
        ({"selector": {"matchLabels": {"app": "other"}}}, "spec.template.metadata.labels"),
        ({"volumeClaimTemplates": [{"spec": {}}]}, "spec.volumeClaimTemplates[0].metadata.name"),
        ({"template": "nope"}, "spec.template"),
    ],
)
async def test_a_malformed_stateful_set_is_refused_with_422_naming_the_field(
    kube: KubeClient, spec: Obj, field: str
) -> None:
    body = stateful_set()
    body["spec"].update(spec)
    with pytest.raises(KubeApiStatusError) as caught:
        await kube.create(kinds.STATEFUL_SETS, body)
    assert caught.value.status_code == 422
    causes = caught.value.details["causes"]
    assert field in {c["field"] for c in causes}, causes


async def test_only_the_mutable_spec_fields_may_change(kube: KubeClient) -> None:
    await kube.create(kinds.STATEFUL_SETS, stateful_set())
    with pytest.raises(KubeApiStatusError) as caught:
        await kube.patch(kinds.STATEFUL_SETS, "web", {"spec": {"serviceName": "other"}}, NS)
    assert caught.value.status_code == 422
    assert "updates to statefulset spec for fields other than" in str(caught.value)
    sts = await kube.patch(kinds.STATEFUL_SETS, "web", {"spec": {"replicas": 5, "minReadySeconds": 3}}, NS)
    assert sts["spec"]["replicas"] == 5
