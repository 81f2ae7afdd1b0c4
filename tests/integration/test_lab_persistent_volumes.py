"""Claims, volumes and the local-path provisioner against the real embedded API server, with the scheduler, the PV
controller, the provisioner (over a real directory standing for the lab's) and the stand-in kubelet of
:mod:`tests.integration.lab_cluster`."""

from __future__ import annotations

from collections.abc import AsyncIterator
from pathlib import Path
from typing import Any

import pytest
from tests.integration.lab_cluster import NS, Kubelet, Obj, add_node, settings, until

from ambit.apiserver.server import ApiServer
from ambit.k8s import KubeClient, KubeNotFoundError, kinds
from ambit.lab.controllers import ControllerManager
from ambit.lab.controllers.provisioner import install_default_storage_class

NODES = ("node-a", "node-b")


@pytest.fixture
async def kube(apiserver: ApiServer) -> AsyncIterator[KubeClient]:
    async with KubeClient.from_kubeconfig(apiserver.kubeconfig) as client:
        for node in NODES:
            await add_node(client, node)
        await install_default_storage_class(client)
        yield client


@pytest.fixture
async def controllers(kube: KubeClient, tmp_path: Path) -> AsyncIterator[ControllerManager]:
    async with ControllerManager(kube, settings(disruption=False, local_path_dir=tmp_path / "lab")) as manager:
        yield manager


def claim(name: str, size: str = "1Gi", **spec: Any) -> Obj:
    return {
        "metadata": {"name": name, "namespace": NS},
        "spec": {"accessModes": ["ReadWriteOnce"], "resources": {"requests": {"storage": size}}, **spec},
    }


def pod(name: str, claim_name: str, **spec: Any) -> Obj:
    return {
        "metadata": {"name": name, "namespace": NS},
        "spec": {
            "containers": [{"name": "app", "image": "example.com/app:1"}],
            "volumes": [{"name": "data", "persistentVolumeClaim": {"claimName": claim_name}}],
            **spec,
        },
    }


def static_volume(name: str, size: str = "2Gi", path: str = "/srv/static", **spec: Any) -> Obj:
    return {
        "metadata": {"name": name},
        "spec": {
            "capacity": {"storage": size},
            "accessModes": ["ReadWriteOnce"],
            "hostPath": {"path": path},
            "storageClassName": "",
            **spec,
        },
    }


async def bound_claim(kube: KubeClient, name: str) -> Obj | None:
    found = await kube.get(kinds.PERSISTENT_VOLUME_CLAIMS, name, NS)
    return found if (found.get("status") or {}).get("phase") == "Bound" else None


async def node_of(kube: KubeClient, name: str) -> str | None:
    found = await kube.get(kinds.PODS, name, NS)
    return (found.get("spec") or {}).get("nodeName")


async def gone(kube: KubeClient, kind: kinds.ResourceKind, name: str, namespace: str | None = None) -> bool:
    try:
        await kube.get(kind, name, namespace)
    except KubeNotFoundError:
        return True
    return False


async def scheduling_message(kube: KubeClient, name: str) -> str:
    found = await kube.get(kinds.PODS, name, NS)
    for condition in (found.get("status") or {}).get("conditions") or []:
        if condition.get("type") == "PodScheduled" and condition.get("status") == "False":
            return str(condition.get("message") or "")
    return ""


async def test_a_claim_of_the_default_class_is_provisioned_on_the_pods_node_and_bound(
    kube: KubeClient, controllers: ControllerManager, tmp_path: Path
) -> None:
    made = await kube.create(kinds.PERSISTENT_VOLUME_CLAIMS, claim("data"), NS)
    assert made["spec"]["storageClassName"] == "standard"
    assert "kubernetes.io/pvc-protection" in made["metadata"]["finalizers"]
    async with Kubelet(kube):
        await kube.create(kinds.PODS, pod("app", "data", nodeSelector={"kubernetes.io/hostname": "node-b"}), NS)
        bound = await until(lambda: bound_claim(kube, "data"), "the claim bound")
        node = await until(lambda: node_of(kube, "app"), "the pod scheduled")
    assert node == "node-b"
    uid = made["metadata"]["uid"]
    assert bound["spec"]["volumeName"] == f"pvc-{uid}"
    assert bound["metadata"]["annotations"]["volume.kubernetes.io/selected-node"] == "node-b"
    assert bound["status"]["capacity"] == {"storage": "1Gi"}
    assert bound["status"]["accessModes"] == ["ReadWriteOnce"]
    volume = await kube.get(kinds.PERSISTENT_VOLUMES, f"pvc-{uid}")
    assert volume["metadata"]["annotations"]["pv.kubernetes.io/provisioned-by"] == "rancher.io/local-path"
    assert volume["spec"]["persistentVolumeReclaimPolicy"] == "Delete"
    assert volume["spec"]["hostPath"]["path"] == f"/var/local-path-provisioner/pvc-{uid}_{NS}_data"
    term = volume["spec"]["nodeAffinity"]["required"]["nodeSelectorTerms"][0]
    assert term["matchExpressions"] == [{"key": "kubernetes.io/hostname", "operator": "In", "values": ["node-b"]}]
    assert "kubernetes.io/pv-protection" in volume["metadata"]["finalizers"]
    directory = tmp_path / "lab/nodes/node-b/root/var/local-path-provisioner" / f"pvc-{uid}_{NS}_data"
    assert directory.is_dir()
    assert not (tmp_path / "lab/nodes/node-a").exists()


async def test_a_static_volume_binds_an_immediate_claim_and_pins_the_pod_to_its_node(
    kube: KubeClient, controllers: ControllerManager
) -> None:
    affinity = {
        "required": {
            "nodeSelectorTerms": [
                {"matchExpressions": [{"key": "kubernetes.io/hostname", "operator": "In", "values": ["node-a"]}]}
            ]
        }
    }
    await kube.create(kinds.PERSISTENT_VOLUMES, static_volume("small", "1Gi", nodeAffinity=affinity))
    await kube.create(kinds.PERSISTENT_VOLUMES, static_volume("big", "5Gi", nodeAffinity=affinity))
    await kube.create(kinds.PERSISTENT_VOLUME_CLAIMS, claim("fixed", "512Mi", storageClassName=""), NS)
    bound = await until(lambda: bound_claim(kube, "fixed"), "the claim bound")
    assert bound["spec"]["volumeName"] == "small"  # the smallest volume that fits
    volume = await until(lambda: _phase(kube, "small", "Bound"), "the volume Bound")
    assert volume["spec"]["claimRef"]["uid"] == bound["metadata"]["uid"]
    assert (await kube.get(kinds.PERSISTENT_VOLUMES, "big"))["status"]["phase"] == "Available"
    async with Kubelet(kube):
        await kube.create(kinds.PODS, pod("app", "fixed"), NS)
        assert await until(lambda: node_of(kube, "app"), "the pod scheduled") == "node-a"


async def _phase(kube: KubeClient, name: str, phase: str) -> Obj | None:
    found = await kube.get(kinds.PERSISTENT_VOLUMES, name)
    return found if (found.get("status") or {}).get("phase") == phase else None


async def test_a_pod_whose_claim_is_missing_or_unbound_stays_pending_with_kubes_message(
    kube: KubeClient, controllers: ControllerManager
) -> None:
    await kube.create(kinds.PODS, pod("orphan", "nothing"), NS)
    message = await until(lambda: scheduling_message(kube, "orphan"), "FailedScheduling")
    assert message == '0/2 nodes are available: persistentvolumeclaim "nothing" not found.'
    await kube.create(kinds.PERSISTENT_VOLUME_CLAIMS, claim("waiting", storageClassName=""), NS)
    await kube.create(kinds.PODS, pod("stuck", "waiting"), NS)
    message = await until(lambda: scheduling_message(kube, "stuck"), "FailedScheduling")
    assert message == "0/2 nodes are available: pod has unbound immediate PersistentVolumeClaims."
    assert await node_of(kube, "stuck") is None


async def test_a_claim_in_use_stays_until_its_pod_goes_then_its_volume_and_directory_are_reclaimed(
    kube: KubeClient, controllers: ControllerManager, tmp_path: Path
) -> None:
    made = await kube.create(kinds.PERSISTENT_VOLUME_CLAIMS, claim("data"), NS)
    uid = made["metadata"]["uid"]
    async with Kubelet(kube):
        await kube.create(kinds.PODS, pod("app", "data"), NS)
        await until(lambda: bound_claim(kube, "data"), "the claim bound")
        node = await until(lambda: node_of(kube, "app"), "the pod scheduled")
        directory = tmp_path / f"lab/nodes/{node}/root/var/local-path-provisioner/pvc-{uid}_{NS}_data"
        assert directory.is_dir()
        (directory / "file").write_text("kept while the claim lives")
        await kube.delete(kinds.PERSISTENT_VOLUME_CLAIMS, "data", NS)
        held = await kube.get(kinds.PERSISTENT_VOLUME_CLAIMS, "data", NS)
        assert held["metadata"].get("deletionTimestamp")
        assert held["metadata"]["finalizers"] == ["kubernetes.io/pvc-protection"]
        assert directory.is_dir()
        await kube.delete(kinds.PODS, "app", NS)
        await until(lambda: gone(kube, kinds.PERSISTENT_VOLUME_CLAIMS, "data", NS), "the claim gone")
        await until(lambda: gone(kube, kinds.PERSISTENT_VOLUMES, f"pvc-{uid}"), "the volume gone")
    assert not directory.exists()


async def test_a_retained_volume_is_released_and_kept_with_its_protection(
    kube: KubeClient, controllers: ControllerManager
) -> None:
    await kube.create(kinds.PERSISTENT_VOLUMES, static_volume("kept"))
    await kube.create(kinds.PERSISTENT_VOLUME_CLAIMS, claim("mine", storageClassName=""), NS)
    await until(lambda: bound_claim(kube, "mine"), "the claim bound")
    await kube.delete(kinds.PERSISTENT_VOLUMES, "kept")
    held = await kube.get(kinds.PERSISTENT_VOLUMES, "kept")
    assert held["metadata"]["finalizers"] == ["kubernetes.io/pv-protection"]  # bound: protected
    await kube.delete(kinds.PERSISTENT_VOLUME_CLAIMS, "mine", NS)
    await until(lambda: gone(kube, kinds.PERSISTENT_VOLUMES, "kept"), "the released volume removed")


def stateful_set(**spec: Any) -> Obj:
    labels = {"app": "db"}
    template = {"metadata": {"name": "data", "labels": {"tier": "storage"}}, "spec": claim("x")["spec"]}
    return {
        "metadata": {"name": "db", "namespace": NS},
        "spec": {
            "replicas": 2,
            "serviceName": "db",
            "selector": {"matchLabels": labels},
            "template": {
                "metadata": {"labels": labels},
                "spec": {"containers": [{"name": "db", "image": "example.com/db:1"}]},
            },
            "volumeClaimTemplates": [template],
            **spec,
        },
    }


async def _members_on_nodes(kube: KubeClient) -> dict[str, str] | None:
    items = (await kube.list(kinds.PODS, NS, label_selector={"app": "db"}))[0]
    placed = {
        p["metadata"]["name"]: p["spec"].get("nodeName")
        for p in items
        if not p["metadata"].get("deletionTimestamp") and (p.get("status") or {}).get("phase") == "Running"
    }
    return placed if set(placed) == {"db-0", "db-1"} and all(placed.values()) else None


async def test_a_stateful_sets_claims_outlive_a_pod_and_bring_it_back_to_its_node(
    kube: KubeClient, controllers: ControllerManager
) -> None:
    async with Kubelet(kube):
        await kube.create(kinds.STATEFUL_SETS, stateful_set(), NS)
        before = await until(lambda: _members_on_nodes(kube), "both members running")
        first = await kube.get(kinds.PERSISTENT_VOLUME_CLAIMS, "data-db-0", NS)
        assert first["metadata"]["labels"] == {"tier": "storage", "app": "db"}
        assert "ownerReferences" not in first["metadata"]  # Retain/Retain: nobody owns it
        assert first["status"]["phase"] == "Bound"
        old = await kube.get(kinds.PODS, "db-0", NS)
        for i in range(3):  # db-0's node is now the busiest: only its volume brings db-0 back there
            await kube.create(kinds.PODS, {**pod(f"filler-{i}", "none"), "spec": _filler(before["db-0"])}, NS)
        await kube.delete(kinds.PODS, "db-0", NS)

        async def replaced() -> dict[str, str] | None:
            try:
                fresh = await kube.get(kinds.PODS, "db-0", NS)
            except KubeNotFoundError:  # between the old pod's removal and the new one's creation
                return None
            return await _members_on_nodes(kube) if fresh["metadata"]["uid"] != old["metadata"]["uid"] else None

        after = await until(replaced, "db-0 back")
        assert after["db-0"] == before["db-0"]
        again = await kube.get(kinds.PERSISTENT_VOLUME_CLAIMS, "data-db-0", NS)
        assert again["metadata"]["uid"] == first["metadata"]["uid"]
        assert again["spec"]["volumeName"] == first["spec"]["volumeName"]


def _filler(node: str) -> Obj:
    return {"nodeName": node, "containers": [{"name": "app", "image": "example.com/app:1"}]}


async def test_retention_delete_removes_the_claims_with_the_set_and_with_scaled_away_members(
    kube: KubeClient, controllers: ControllerManager
) -> None:
    policy = {"whenDeleted": "Delete", "whenScaled": "Delete"}
    async with Kubelet(kube):
        created = await kube.create(kinds.STATEFUL_SETS, stateful_set(persistentVolumeClaimRetentionPolicy=policy), NS)
        await until(lambda: _members_on_nodes(kube), "both members running")
        claim0 = await kube.get(kinds.PERSISTENT_VOLUME_CLAIMS, "data-db-0", NS)
        [ref] = claim0["metadata"]["ownerReferences"]
        assert (ref["kind"], ref["name"], ref["uid"]) == ("StatefulSet", "db", created["metadata"]["uid"])
        await kube.patch(kinds.STATEFUL_SETS, "db", {"spec": {"replicas": 1}}, NS)
        await until(lambda: gone(kube, kinds.PERSISTENT_VOLUME_CLAIMS, "data-db-1", NS), "db-1's claim gone")
        assert not await gone(kube, kinds.PERSISTENT_VOLUME_CLAIMS, "data-db-0", NS)
        await kube.delete(kinds.STATEFUL_SETS, "db", NS)
        await until(lambda: gone(kube, kinds.PERSISTENT_VOLUME_CLAIMS, "data-db-0", NS), "db-0's claim gone")
