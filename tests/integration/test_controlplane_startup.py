"""``ambit controlplane`` on a fresh cluster: an embedded API server started without ``istio-system`` (issue 24).

The real control plane (xDS and CA on an ephemeral loopback port, no webhook) against an in-process embedded API
server with nothing in it but what it makes itself (``default``, ``kube-system``, ...): it creates
``istio-system``, keeps its root there, publishes ``istio-ca-root-cert`` to every namespace (the new one included)
and serves. Once with Istio's CRDs installed, once without any.
"""

from __future__ import annotations

import asyncio
import time
from collections.abc import Awaitable, Callable
from pathlib import Path
from typing import Any

import pytest

from ambit.apiserver.server import ApiServer, ApiServerSettings
from ambit.controlplane.ca.root import ROOT_CONFIG_MAP, ROOT_SECRET, SYSTEM_NAMESPACE, root_from_secret
from ambit.controlplane.process import ControlPlane, ControlPlaneSettings
from ambit.k8s import KubeClient, KubeNotFoundError, kinds
from ambit.model.state import WorkloadState
from ambit.xds.client import Backoff, XdsClient


async def eventually(predicate: Callable[[], Awaitable[Any]], within: float = 15.0) -> Any:
    async with asyncio.timeout(within):
        while True:
            try:
                value = await predicate()
            except KubeNotFoundError:
                value = None
            if value:
                return value
            await asyncio.sleep(0.05)


@pytest.mark.parametrize("crds", [True, False], ids=["with-istio-crds", "no-crds"])
async def test_the_control_plane_starts_without_istio_system_and_creates_what_it_owns(
    tmp_path: Path, crds: bool
) -> None:
    settings = (
        ApiServerSettings(data_dir=tmp_path / "api", port=0)
        if crds
        else ApiServerSettings(data_dir=tmp_path / "api", port=0, crd_dir=None)
    )
    async with ApiServer(settings) as server, KubeClient.from_kubeconfig(server.kubeconfig) as client:
        names = {n["metadata"]["name"] for n in (await client.list(kinds.NAMESPACES))[0]}
        assert SYSTEM_NAMESPACE not in names
        plane = ControlPlane(
            ControlPlaneSettings(
                kubeconfig=server.kubeconfig, host="127.0.0.1", port=0, webhook_port=None, debounce=0.05
            ),
            client,
        )
        started = time.monotonic()
        await plane.start()
        try:
            assert plane.server is not None and plane.server.port > 0 and plane.root is not None
            print(f"started on a fresh API server in {time.monotonic() - started:.2f}s")
            await client.get(kinds.NAMESPACES, SYSTEM_NAMESPACE)
            secret = await client.get(kinds.SECRETS, ROOT_SECRET, SYSTEM_NAMESPACE)
            assert root_from_secret(secret).root_pem == plane.root.root_pem
            for namespace in (SYSTEM_NAMESPACE, "default"):
                published = await eventually(lambda ns=namespace: client.get(kinds.CONFIG_MAPS, ROOT_CONFIG_MAP, ns))  # type: ignore[misc]
                assert published["data"]["root-cert.pem"] == plane.root.root_pem.decode()
            # And it serves: a node proxy's xDS client (authenticated with a real service-account token) syncs.
            await client.create(kinds.SERVICE_ACCOUNTS, {"metadata": {"name": "ztunnel"}}, SYSTEM_NAMESPACE)
            token = await client.create_token(SYSTEM_NAMESPACE, "ztunnel", audiences=["istio-ca"])
            (tmp_path / "token").write_text(token["status"]["token"])
            (tmp_path / "root.pem").write_bytes(plane.root.root_pem)
            xds = XdsClient(
                f"127.0.0.1:{plane.server.port}",
                WorkloadState(),
                lambda: None,
                root_cert_file=tmp_path / "root.pem",
                token_file=tmp_path / "token",
                cluster_id="Kubernetes",
                backoff=Backoff(initial=0.05, maximum=0.3),
            )
            await xds.start()
            try:

                async def synced() -> bool:
                    return xds.synced

                await eventually(synced)
            finally:
                await xds.aclose()
        finally:
            await plane.aclose()


async def test_the_node_authorization_reads_the_views_pod_cache_not_a_second_one(tmp_path: Path) -> None:
    settings = ApiServerSettings(data_dir=tmp_path / "api", port=0, crd_dir=None)
    async with ApiServer(settings) as server, KubeClient.from_kubeconfig(server.kubeconfig) as client:
        plane = ControlPlane(
            ControlPlaneSettings(kubeconfig=server.kubeconfig, host="127.0.0.1", port=0, webhook_port=None),
            client,
        )
        # Before the start both are empty: an empty informer must not read as "no informer given".
        assert plane.pods.informer is plane.view.informer(kinds.PODS)
        assert plane.pods.informer.transform is not None, "the view's cache keeps only the fields its readers read"
