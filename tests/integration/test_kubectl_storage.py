"""The real kubectl against the embedded API server on claims, volumes and classes: ``apply`` a claim and a
Deployment that mounts it (as one would on kind), ``get pvc,pv,sc`` (the server's tables), ``describe pvc``, and a
refused claim, with the lab's controllers, the local-path provisioner over a real directory and a stand-in
kubelet."""

from __future__ import annotations

from collections.abc import AsyncIterator
from pathlib import Path

import pytest
from tests.integration.lab_cluster import NS, Kubelet, add_node, kubectl, settings, until

from ambit.apiserver.server import ApiServer
from ambit.k8s import KubeClient, kinds
from ambit.lab.controllers import ControllerManager
from ambit.lab.controllers.provisioner import install_default_storage_class

pytestmark = pytest.mark.kubectl

MANIFEST = """
apiVersion: v1
kind: PersistentVolumeClaim
metadata: {name: data, namespace: default}
spec:
  accessModes: [ReadWriteOnce]
  resources: {requests: {storage: 1Gi}}
---
apiVersion: apps/v1
kind: Deployment
metadata: {name: app, namespace: default}
spec:
  replicas: 1
  selector: {matchLabels: {app: app}}
  template:
    metadata: {labels: {app: app}}
    spec:
      containers:
      - name: app
        image: example.com/app:1
        volumeMounts: [{name: data, mountPath: /data}]
      volumes:
      - name: data
        persistentVolumeClaim: {claimName: data}
"""


@pytest.fixture
async def cluster(apiserver: ApiServer, tmp_path: Path) -> AsyncIterator[tuple[KubeClient, Path]]:
    async with (
        KubeClient.from_kubeconfig(apiserver.kubeconfig) as kube,
        ControllerManager(kube, settings(disruption=False, local_path_dir=tmp_path / "lab")),
        Kubelet(kube),
    ):
        await add_node(kube, "node-a")
        await install_default_storage_class(kube)
        yield kube, apiserver.kubeconfig


async def _bound(kube: KubeClient) -> bool:
    claim = await kube.get(kinds.PERSISTENT_VOLUME_CLAIMS, "data", NS)
    return (claim.get("status") or {}).get("phase") == "Bound"


async def test_apply_a_claim_with_its_deployment_and_get_pvc_pv_sc(cluster: tuple[KubeClient, Path]) -> None:
    kube, config = cluster
    out = await kubectl(config, "apply", "-f", "-", stdin=MANIFEST)
    assert "persistentvolumeclaim/data created" in out and "deployment.apps/app created" in out
    await until(lambda: _bound(kube), "the claim bound")
    claim = await kube.get(kinds.PERSISTENT_VOLUME_CLAIMS, "data", NS)
    volume = claim["spec"]["volumeName"]

    table = (await kubectl(config, "get", "pvc")).splitlines()
    assert table[0].split() == [
        "NAME", "STATUS", "VOLUME", "CAPACITY", "ACCESS", "MODES", "STORAGECLASS", "VOLUMEATTRIBUTESCLASS", "AGE"
    ]  # fmt: skip
    assert table[1].split()[:7] == ["data", "Bound", volume, "1Gi", "RWO", "standard", "<unset>"]

    both = await kubectl(config, "get", "pvc,pv,sc")
    assert f"persistentvolume/{volume}" in both
    assert "persistentvolumeclaim/data" in both
    classes = [line.split() for line in both.splitlines() if line.startswith("storageclass")]
    assert classes[0][:6] == [
        "storageclass.storage.k8s.io/standard", "(default)", "rancher.io/local-path", "Delete",
        "WaitForFirstConsumer", "false",
    ]  # fmt: skip
    volumes = (await kubectl(config, "get", "pv")).splitlines()
    assert volumes[0].split()[:8] == ["NAME", "CAPACITY", "ACCESS", "MODES", "RECLAIM", "POLICY", "STATUS", "CLAIM"]
    assert volumes[1].split()[:7] == [volume, "1Gi", "RWO", "Delete", "Bound", "default/data", "standard"]
    wide = (await kubectl(config, "get", "pvc", "-o", "wide")).splitlines()
    assert wide[0].split()[-1] == "VOLUMEMODE" and wide[1].split()[-1] == "Filesystem"

    described = await kubectl(config, "describe", "pvc", "data")
    assert "StorageClass:" in described and "standard" in described and "Bound" in described
    short = await kubectl(config, "get", "sc", "standard", "-o", "jsonpath={.volumeBindingMode}")
    assert short == "WaitForFirstConsumer"


async def test_a_claim_with_a_bad_size_is_refused_with_kubes_field(cluster: tuple[KubeClient, Path]) -> None:
    _kube, config = cluster
    bad = MANIFEST.split("---", maxsplit=1)[0].replace("storage: 1Gi", "storage: lots")
    out = await kubectl(config, "apply", "-f", "-", stdin=bad, check=False)
    assert 'PersistentVolumeClaim "data" is invalid' in out
    assert "spec.resources[storage]" in out
