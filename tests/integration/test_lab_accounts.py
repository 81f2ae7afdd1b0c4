"""The lab's system namespaces and the mesh components' credentials (:mod:`ambit.lab.mesh.accounts`) against a
real API server: privileged labels, a token per component that rotates in place, and least privilege."""

from __future__ import annotations

import os
from pathlib import Path

import pytest

from ambit.apiserver.server import ApiServer, write_kubeconfig
from ambit.cni.daemon import kubeconfig_parts
from ambit.k8s import KubeClient, kinds
from ambit.k8s.errors import KubeApiStatusError
from ambit.lab.mesh.accounts import (
    PRIVILEGED_LABELS,
    kubeconfig_path,
    prepare_system_namespaces,
    token_path,
    write_component_credentials,
)
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


async def test_each_component_gets_its_own_rotating_token_with_only_its_role(
    apiserver: ApiServer, topology: Topology
) -> None:
    async with KubeClient.from_kubeconfig(topology.kubeconfig) as admin:
        await prepare_system_namespaces(admin)
        await write_component_credentials(admin, topology)
        first = token_path(topology, "istiod").read_text()
        assert os.stat(token_path(topology, "istiod")).st_mode & 0o077 == 0
        assert os.stat(kubeconfig_path(topology, "istiod")).st_mode & 0o077 == 0
        async with KubeClient.from_kubeconfig(kubeconfig_path(topology, "istiod")) as istiod:
            await istiod.list(kinds.PODS)
            await istiod.list(kinds.NODES)  # node authorization reads nodes
            await istiod.list(kinds.SECRETS, namespace="istio-system")  # read only, for gateway certificates
            with pytest.raises(KubeApiStatusError) as refused:
                await istiod.create(kinds.SECRETS, {"metadata": {"name": "planted"}}, namespace="istio-system")
            assert refused.value.is_forbidden
            assert 'User "system:serviceaccount:istio-system:istiod"' in refused.value.message
        async with KubeClient.from_kubeconfig(kubeconfig_path(topology, "istio-cni")) as cni:
            await cni.list(kinds.NAMESPACES)
            with pytest.raises(KubeApiStatusError):
                await cni.list(kinds.CONFIG_MAPS, namespace="istio-system")
        await write_component_credentials(admin, topology)  # a refresh: a new token in the same file
        assert token_path(topology, "istiod").read_text() != first
        server, _, token = kubeconfig_parts(kubeconfig_path(topology, "istio-cni"))
        assert server == apiserver.url and token == token_path(topology, "istio-cni").read_text()
