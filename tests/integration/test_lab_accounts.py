"""The lab's system namespaces (:mod:`ambit.lab.mesh.accounts`) against a real API server: privileged labels where
the mesh's node-level pods live, the default everywhere else."""

from __future__ import annotations

from pathlib import Path

import pytest

from ambit.apiserver.server import ApiServer, write_kubeconfig
from ambit.k8s import KubeClient, kinds
from ambit.k8s.errors import KubeApiStatusError
from ambit.lab.mesh.accounts import PRIVILEGED_LABELS, prepare_system_namespaces
from ambit.lab.network.topology import Topology


@pytest.fixture
def topology(tmp_path: Path, apiserver: ApiServer) -> Topology:
    topology = Topology.new(1, tmp_path / "lab")
    ca = (apiserver.settings.data_dir / "pki" / "ca.crt").read_bytes()
    write_kubeconfig(topology.kubeconfig, apiserver.url, ca, apiserver.admin_token)
    return topology


async def test_system_namespaces_are_privileged_and_the_others_keep_the_default(
    apiserver: ApiServer, topology: Topology
) -> None:
    async with KubeClient.from_kubeconfig(topology.kubeconfig) as admin:
        await prepare_system_namespaces(admin)
        await prepare_system_namespaces(admin)  # again: nothing changes, nothing fails
        for name in ("istio-system", "kube-system"):
            labels = (await admin.get(kinds.NAMESPACES, name))["metadata"]["labels"]
            assert {k: labels[k] for k in PRIVILEGED_LABELS} == PRIVILEGED_LABELS
        default = (await admin.get(kinds.NAMESPACES, "default"))["metadata"].get("labels") or {}
        assert not any(k.startswith("pod-security.kubernetes.io/") for k in default)
        node_level = {
            "metadata": {"name": "n"},
            "spec": {"hostNetwork": True, "containers": [{"name": "c", "image": "busybox"}]},
        }
        await admin.create(kinds.PODS, node_level, namespace="istio-system")
        with pytest.raises(KubeApiStatusError) as refused:
            await admin.create(kinds.PODS, node_level, namespace="default")
        assert refused.value.is_forbidden and "violates PodSecurity" in refused.value.message
