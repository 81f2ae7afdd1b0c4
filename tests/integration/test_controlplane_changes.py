"""The cluster view hands each translation what changed (issue 22): a pod change is translated by changes, the
result equals a translation of the caches from scratch, and the workload changes name that pod. An in-process
embedded API server; the real informers and translation."""

from __future__ import annotations

import asyncio
from collections.abc import Callable
from pathlib import Path
from typing import Any

from ambit.apiserver.server import ApiServer, ApiServerSettings
from ambit.controlplane.translate import WorkloadChanges, translate_all
from ambit.controlplane.view import ClusterView, ClusterViewSettings
from ambit.k8s import KubeClient, kinds
from ambit.model.localconfig import LocalConfig


async def _until(condition: Callable[[], bool], within: float = 10.0) -> None:
    deadline = asyncio.get_running_loop().time() + within
    while not condition():
        assert asyncio.get_running_loop().time() < deadline, "condition not met in time"
        await asyncio.sleep(0.02)


def _pod(name: str) -> dict[str, Any]:
    return {
        "metadata": {"name": name, "namespace": "default", "labels": {"app": "web"}},
        "spec": {"nodeName": "node-1", "containers": [{"name": "app", "image": "app"}]},
    }


def _status(ip: str, ready: bool) -> dict[str, Any]:
    condition = {"type": "Ready", "status": "True" if ready else "False"}
    return {"status": {"phase": "Running", "podIP": ip, "conditions": [condition]}}


async def test_a_pod_change_is_handed_over_as_a_change_and_translates_as_from_scratch(tmp_path: Path) -> None:
    configs: list[LocalConfig] = []
    changes: list[WorkloadChanges | None] = []
    async with (
        ApiServer(ApiServerSettings(data_dir=tmp_path / "api", port=0, crd_dir=None)) as server,
        KubeClient.from_kubeconfig(server.kubeconfig) as client,
    ):
        for i in range(3):
            await client.create(kinds.PODS, _pod(f"web-{i}"))
            await client.patch_status(kinds.PODS, f"web-{i}", _status(f"198.18.210.{i + 1}", True), namespace="default")
        settings = ClusterViewSettings(debounce=0.05, sync_timeout=10)
        async with ClusterView(client, settings, configs.append, on_workload_changes=changes.append) as view:
            assert changes == [None], "the first translation does not know what changed"
            await client.patch_status(kinds.PODS, "web-1", _status("198.18.210.2", False), namespace="default")
            await _until(lambda: len(configs) == 2)
            latest = changes[-1]
            assert latest is not None and latest.since is configs[0].workloads
            assert latest.uids == {"Kubernetes//Pod/default/web-1"}
            fresh = translate_all(
                view.items("pods"), view.items("services"), view.items("endpointslices"), view.items("namespaces")
            )
            assert configs[-1] == fresh.config

            await client.delete(kinds.PODS, "web-2", namespace="default")
            await _until(lambda: len(configs) == 3)
            latest = changes[-1]
            assert latest is not None and latest.uids == {"Kubernetes//Pod/default/web-2"}
            fresh = translate_all(
                view.items("pods"), view.items("services"), view.items("endpointslices"), view.items("namespaces")
            )
            assert configs[-1] == fresh.config


async def test_a_policys_status_write_is_not_a_change_to_translate(tmp_path: Path) -> None:
    """Our own status writes on policies: the next translation (for a pod) still reuses the policy and service
    stages, and a ConfigMap nothing reads (the CA's root in a namespace) reuses every stage."""
    configs: list[LocalConfig] = []
    policy = {
        "metadata": {"name": "allow", "namespace": "default"},
        "spec": {"selector": {"matchLabels": {"app": "web"}}, "rules": [{}]},
    }
    async with (
        ApiServer(ApiServerSettings(data_dir=tmp_path / "api", port=0)) as server,
        KubeClient.from_kubeconfig(server.kubeconfig) as client,
    ):
        await client.create(kinds.PODS, _pod("web-0"))
        await client.patch_status(kinds.PODS, "web-0", _status("198.18.210.1", True), namespace="default")
        await client.create(kinds.AUTHORIZATION_POLICIES, policy, "default")
        settings = ClusterViewSettings(debounce=0.05, sync_timeout=10)
        async with ClusterView(client, settings, configs.append) as view:
            stages = view._translation_memo.stages
            status = {"status": {"conditions": [{"type": "Accepted", "status": "True", "reason": "Accepted"}]}}
            await client.patch_status(kinds.AUTHORIZATION_POLICIES, "allow", status, namespace="default")
            await asyncio.sleep(0.3)
            await client.patch_status(kinds.PODS, "web-0", _status("198.18.210.1", False), namespace="default")
            await _until(lambda: len(configs) == 2)
            assert stages.policies.reused and stages.services.reused
            root = {"metadata": {"name": "istio-ca-root-cert", "namespace": "default"}, "data": {"root-cert.pem": "x"}}
            await client.create(kinds.CONFIG_MAPS, root, "default")
            await _until(lambda: len(configs) == 3)
            assert stages.policies.reused and stages.services.reused and stages.gateways.reused


async def test_a_consumer_that_fails_once_does_not_end_the_views_hand_overs(tmp_path: Path) -> None:
    """A defect in what the view hands a translation to (the xDS push) is logged and the change handed over again;
    before, it ended the view's task and the control plane pushed no later change of the cluster."""
    configs: list[LocalConfig] = []
    failures = 0

    def on_config(config: LocalConfig) -> None:
        nonlocal failures
        if len(configs) == 1 and failures == 0:
            failures += 1
            raise KeyError("a defect in the consumer")
        configs.append(config)

    async with (
        ApiServer(ApiServerSettings(data_dir=tmp_path / "api", port=0, crd_dir=None)) as server,
        KubeClient.from_kubeconfig(server.kubeconfig) as client,
    ):
        await client.create(kinds.PODS, _pod("web-0"))
        await client.patch_status(kinds.PODS, "web-0", _status("198.18.210.1", True), namespace="default")
        settings = ClusterViewSettings(debounce=0.05, sync_timeout=10)
        async with ClusterView(client, settings, on_config):
            await client.patch_status(kinds.PODS, "web-0", _status("198.18.210.1", False), namespace="default")
            await _until(lambda: failures == 1)
            await _until(lambda: len(configs) == 2)  # the same change, handed over again
            await client.delete(kinds.PODS, "web-0", namespace="default")
            await _until(lambda: len(configs) == 3)
