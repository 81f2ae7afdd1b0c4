"""The kubelet's persistentVolumeClaim volumes on a real filesystem, against the real embedded API server: a bound
claim's hostPath or local volume lands in the node's private tree, whatever path the volume names; links out of
the tree and paths that map elsewhere are refused; an unbound or missing claim is a retried error in kube's
words. The local-path provisioner's directory work is held to the same tree."""

from __future__ import annotations

from collections.abc import AsyncIterator
from pathlib import Path
from typing import Any

import pytest

from ambit.apiserver.server import ApiServer
from ambit.k8s import KubeClient, kinds
from ambit.lab.controllers.provisioner import LocalPathError, make_directory, remove_directory
from ambit.lab.network.topology import HostPathLayout
from ambit.lab.runtime.volumes import VolumeError
from ambit.lab.runtime.volumes_apply import PodVolumes

NS = "default"


@pytest.fixture
async def kube(apiserver: ApiServer) -> AsyncIterator[KubeClient]:
    async with KubeClient.from_kubeconfig(apiserver.kubeconfig) as client:
        yield client


async def bind(kube: KubeClient, name: str, source: dict[str, Any], *, read_only: bool = False) -> None:
    """A claim ``name`` bound to a volume ``pv-<name>`` with ``source`` (a hostPath or local volume)."""
    claim = {
        "metadata": {"name": name, "namespace": NS},
        "spec": {
            "accessModes": ["ReadWriteOnce"],
            "resources": {"requests": {"storage": "1Gi"}},
            "storageClassName": "",
            "volumeName": f"pv-{name}",
        },
    }
    made = await kube.create(kinds.PERSISTENT_VOLUME_CLAIMS, claim, NS)
    affinity = {
        "required": {
            "nodeSelectorTerms": [
                {"matchExpressions": [{"key": "kubernetes.io/hostname", "operator": "In", "values": ["node-1"]}]}
            ]
        }
    }
    volume = {
        "metadata": {"name": f"pv-{name}"},
        "spec": {
            "capacity": {"storage": "1Gi"},
            "accessModes": ["ReadWriteOnce"],
            "storageClassName": "",
            "nodeAffinity": affinity,
            "claimRef": {"namespace": NS, "name": name, "uid": made["metadata"]["uid"]},
            **source,
        },
    }
    await kube.create(kinds.PERSISTENT_VOLUMES, volume)
    await kube.patch_status(kinds.PERSISTENT_VOLUME_CLAIMS, name, {"status": {"phase": "Bound"}}, NS)


def volumes_of(kube: KubeClient, tmp_path: Path, claim: str, *, read_only: bool = False) -> PodVolumes:
    pod = {
        "metadata": {"name": "app", "namespace": NS, "uid": "pod-uid"},
        "spec": {"volumes": [{"name": "data", "persistentVolumeClaim": {"claimName": claim, "readOnly": read_only}}]},
    }
    layout = HostPathLayout(tmp_path / "lab", "node-1")
    return PodVolumes(kube, pod, tmp_path / "pod", layout, allocatable={})


async def test_a_bound_claims_volume_is_its_directory_in_the_nodes_tree(kube: KubeClient, tmp_path: Path) -> None:
    await bind(kube, "data", {"hostPath": {"path": "/var/local-path-provisioner/pvc-1_default_data"}})
    volumes = volumes_of(kube, tmp_path, "data")
    await volumes.set_up()
    source = volumes.sources["data"]
    expected = tmp_path / "lab/nodes/node-1/root/var/local-path-provisioner/pvc-1_default_data"
    assert (source.path, source.read_only) == (str(expected), False)
    assert expected.is_dir()


async def test_a_claim_mounted_read_only_and_a_local_volume(kube: KubeClient, tmp_path: Path) -> None:
    (tmp_path / "lab/nodes/node-1/root/mnt/disks/ssd1").mkdir(parents=True)
    await bind(kube, "fast", {"local": {"path": "/mnt/disks/ssd1"}})
    volumes = volumes_of(kube, tmp_path, "fast", read_only=True)
    await volumes.set_up()
    assert volumes.sources["data"].path == str(tmp_path / "lab/nodes/node-1/root/mnt/disks/ssd1")
    assert volumes.sources["data"].read_only


async def test_a_volume_naming_etc_is_the_nodes_etc_not_the_machines(kube: KubeClient, tmp_path: Path) -> None:
    await bind(kube, "sneaky", {"hostPath": {"path": "/etc"}})
    volumes = volumes_of(kube, tmp_path, "sneaky")
    await volumes.set_up()
    assert volumes.sources["data"].path == str(tmp_path / "lab/nodes/node-1/root/etc")
    assert volumes.sources["data"].path.startswith(str(tmp_path))


@pytest.mark.parametrize("path", ["/proc", "/run/netns", "/opt/cni/bin"])
async def test_a_volume_naming_paths_the_lab_maps_out_of_the_node_tree_is_refused(
    kube: KubeClient, tmp_path: Path, path: str
) -> None:
    await bind(kube, "host", {"hostPath": {"path": path}})
    volumes = volumes_of(kube, tmp_path, "host")
    with pytest.raises(VolumeError, match="not in the node's own filesystem") as refused:
        await volumes.set_up()
    assert not refused.value.retry


async def test_a_link_out_of_the_node_tree_is_refused(kube: KubeClient, tmp_path: Path) -> None:
    root = tmp_path / "lab/nodes/node-1/root"
    (root / "var").mkdir(parents=True)
    (tmp_path / "secret").mkdir()
    (root / "var" / "escape").symlink_to(tmp_path / "secret")
    await bind(kube, "linked", {"hostPath": {"path": "/var/escape"}})
    volumes = volumes_of(kube, tmp_path, "linked")
    with pytest.raises(VolumeError, match="leads outside the node's filesystem"):
        await volumes.set_up()


async def test_a_missing_or_unbound_claim_is_a_retried_error_in_kubes_words(kube: KubeClient, tmp_path: Path) -> None:
    volumes = volumes_of(kube, tmp_path, "absent")
    with pytest.raises(VolumeError, match='persistentvolumeclaim "absent" not found') as missing:
        await volumes.set_up()
    assert missing.value.retry
    claim = {
        "metadata": {"name": "later", "namespace": NS},
        "spec": {"accessModes": ["ReadWriteOnce"], "resources": {"requests": {"storage": "1Gi"}}},
    }
    await kube.create(kinds.PERSISTENT_VOLUME_CLAIMS, claim, NS)
    volumes = volumes_of(kube, tmp_path, "later")
    with pytest.raises(VolumeError) as unbound:
        await volumes.set_up()
    assert 'PVC default/later has non-bound phase ("Pending") or empty pvc.Spec.VolumeName ("")' in str(unbound.value)
    assert unbound.value.retry


def test_the_provisioner_makes_and_removes_directories_only_inside_the_nodes_tree(tmp_path: Path) -> None:
    layout = HostPathLayout(tmp_path / "lab", "node-1")
    made = make_directory(layout, "/var/local-path-provisioner/pvc-1_default_data")
    assert made == tmp_path / "lab/nodes/node-1/root/var/local-path-provisioner/pvc-1_default_data"
    (made / "file").write_text("data")
    remove_directory(layout, "/var/local-path-provisioner/pvc-1_default_data")
    assert not made.exists()
    remove_directory(layout, "/var/local-path-provisioner/pvc-1_default_data")  # gone already: fine
    outside = tmp_path / "precious"
    (outside / "pvc-2_default_data").mkdir(parents=True)
    (layout.root / "var/local-path-provisioner/planted").symlink_to(outside)
    for act in (make_directory, remove_directory):
        with pytest.raises(LocalPathError, match="leads outside the node's filesystem"):
            act(layout, "/var/local-path-provisioner/planted/pvc-2_default_data")
    assert (outside / "pvc-2_default_data").is_dir()
    with pytest.raises(LocalPathError, match="not in the node's own filesystem"):
        make_directory(layout, "/proc/pvc-3")
    with pytest.raises(LocalPathError, match="must not contain"):
        make_directory(layout, "/var/../../etc")
