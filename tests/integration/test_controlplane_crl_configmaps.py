"""The plug-in CA's CRL as istiod replicates it: ``ca-crl.pem`` next to the CA files becomes ConfigMap
``istio-ca-crl`` (key ``ca-crl.pem``) in every namespace, follows the file's changes, and keeps the last good content
when the file turns bad or goes away. Against the embedded API server, with the control plane in-process."""

from __future__ import annotations

import asyncio
import time
from collections.abc import AsyncIterator, Awaitable, Callable
from pathlib import Path
from typing import Any

import pytest
from tests import crl_pki

from ambit.apiserver.server import ApiServer, ApiServerSettings
from ambit.controlplane.process import ControlPlane, ControlPlaneSettings
from ambit.k8s import KubeClient, KubeNotFoundError, kinds

CRL_MAP = "istio-ca-crl"
NAMESPACES = ("istio-system", "shop", "books")


async def eventually(predicate: Callable[[], Awaitable[Any]], what: str, within: float = 15.0) -> Any:
    deadline = time.monotonic() + within
    while True:
        try:
            value = await predicate()
        except KubeNotFoundError:
            value = None
        if value:
            return value
        assert time.monotonic() < deadline, f"timed out waiting for {what}"
        await asyncio.sleep(0.05)


class Cluster:
    def __init__(self, client: KubeClient, cacerts: Path) -> None:
        self.client = client
        self.cacerts = cacerts
        self.root = crl_pki.root("Plug-in root")
        self.signer = crl_pki.intermediate(self.root)
        (cacerts / "ca-cert.pem").write_bytes(self.signer.cert_pem)
        (cacerts / "ca-key.pem").write_bytes(self.signer.key_pem)
        (cacerts / "root-cert.pem").write_bytes(self.root.cert_pem)

    async def crl_in(self, namespace: str) -> str | None:
        try:
            found = await self.client.get(kinds.CONFIG_MAPS, CRL_MAP, namespace)
        except KubeNotFoundError:
            return None
        value = (found.get("data") or {}).get("ca-crl.pem")
        return value if isinstance(value, str) else None

    async def everywhere(self, pem: bytes) -> bool:
        return all([await self.crl_in(namespace) == pem.decode() for namespace in NAMESPACES])

    def write_crl(self, data: bytes) -> None:
        staged = self.cacerts / ".ca-crl.pem.new"
        staged.write_bytes(data)
        staged.replace(self.cacerts / "ca-crl.pem")  # as a Secret volume update swaps the file


@pytest.fixture
async def cluster(tmp_path: Path) -> AsyncIterator[tuple[Cluster, ControlPlane]]:
    cacerts = tmp_path / "cacerts"
    cacerts.mkdir()
    settings = ApiServerSettings(data_dir=tmp_path / "api", port=0)
    async with ApiServer(settings) as server, KubeClient.from_kubeconfig(server.kubeconfig) as client:
        for namespace in NAMESPACES:
            await client.create(kinds.NAMESPACES, {"metadata": {"name": namespace}})
        cluster = Cluster(client, cacerts)
        plane = ControlPlane(
            ControlPlaneSettings(
                kubeconfig=server.kubeconfig,
                host="127.0.0.1",
                port=0,
                webhook_port=None,
                cacerts_dir=cacerts,
                debounce=0.05,
                crl_poll_interval=0.05,
                deploy_waypoints=False,
            ),
            client,
        )
        await plane.start()
        try:
            yield cluster, plane
        finally:
            await plane.aclose()


async def test_the_crl_file_is_replicated_to_every_namespace_and_follows_its_changes(
    cluster: tuple[Cluster, ControlPlane],
) -> None:
    c, plane = cluster
    # No file yet: no ConfigMaps (meshes without CRLs get none).
    await asyncio.sleep(0.3)
    assert [await c.crl_in(namespace) for namespace in NAMESPACES] == [None, None, None]

    first = crl_pki.crl(c.signer, [1234])
    c.write_crl(first)
    await eventually(lambda: c.everywhere(first), "the first CRL in every namespace")

    await c.client.create(kinds.NAMESPACES, {"metadata": {"name": "late"}})
    await eventually(lambda: _equals(c.crl_in("late"), first.decode()), "the CRL in a namespace made later")

    second = crl_pki.crl(c.signer, [1234, 5678]) + crl_pki.crl(c.root, [crl_pki.serial_of(c.signer.cert_pem)])
    c.write_crl(second)
    await eventually(lambda: c.everywhere(second), "the updated CRL in every namespace")

    # A tampered map is put right again.
    await c.client.patch(kinds.CONFIG_MAPS, CRL_MAP, {"data": {"ca-crl.pem": "tampered"}}, "shop")
    await eventually(lambda: c.everywhere(second), "the tampered map restored")
    assert plane.crl_watcher is not None and plane.crl_watcher.error == ""


async def test_a_bad_or_missing_crl_file_leaves_the_last_good_crl_published(
    cluster: tuple[Cluster, ControlPlane],
) -> None:
    c, plane = cluster
    good = crl_pki.crl(c.signer, [42])
    c.write_crl(good)
    await eventually(lambda: c.everywhere(good), "the good CRL in every namespace")
    assert plane.crl_watcher is not None

    c.write_crl(b"-----BEGIN X509 CRL-----\nnot base64\n-----END X509 CRL-----\n")
    await eventually(lambda: _true(bool(plane.crl_watcher and plane.crl_watcher.error)), "the bad file noticed")
    assert "not a readable CRL" in plane.crl_watcher.error
    assert await c.everywhere(good)

    (c.cacerts / "ca-crl.pem").unlink()
    await eventually(lambda: _true("gone" in (plane.crl_watcher.error if plane.crl_watcher else "")), "removal")
    assert await c.everywhere(good)

    empty = b""
    c.write_crl(empty)  # an empty file is how revocations are withdrawn
    await eventually(lambda: c.everywhere(empty), "the empty CRL in every namespace")


async def _equals(value: Awaitable[str | None], expected: str) -> bool:
    return await value == expected


async def _true(value: bool) -> bool:
    return value
