"""ServiceEntry address auto-allocation through the real control plane and API server: an entry without addresses
gets them in its ``status.addresses`` and its Service carries them as VIPs; a restarted control plane keeps them.
"""

from __future__ import annotations

import asyncio
import contextlib
import ipaddress
from collections.abc import AsyncIterator, Callable
from typing import Any

import pytest
from tests.harness import ServerProcess

from ambit.api import workload_pb2 as pb
from ambit.controlplane.process import ControlPlane, ControlPlaneSettings
from ambit.k8s import KubeAlreadyExistsError, KubeClient, kinds


@pytest.fixture
async def kube(server_process: ServerProcess) -> AsyncIterator[KubeClient]:
    async with KubeClient.from_kubeconfig(server_process.kubeconfig) as client:
        yield client


def settings(server_process: ServerProcess) -> ControlPlaneSettings:
    return ControlPlaneSettings(
        kubeconfig=server_process.kubeconfig,
        host="127.0.0.1",
        port=0,
        webhook_port=None,
        debounce=0.05,
        deploy_waypoints=False,
    )


async def poll(predicate: Callable[[], Any], within: float = 20.0) -> Any:
    async with asyncio.timeout(within):
        while not (value := await predicate()):  # noqa: ASYNC110 (polls the API server, nothing to wait on)
            await asyncio.sleep(0.05)
    return value


def service_vips(plane: ControlPlane, key: str) -> list[str]:
    """The VIPs of Service ``key`` as the control plane serves it over xDS."""
    resource = plane.table.current.by_name.get(key)
    if resource is None:
        return []
    address = pb.Address()
    resource.body.Unpack(address)
    return [str(ipaddress.ip_address(a.address)) for a in address.service.addresses]


async def test_an_entry_without_addresses_gets_stable_allocated_vips(
    kube: KubeClient, server_process: ServerProcess
) -> None:
    for kind, obj in (
        (kinds.NAMESPACES, {"metadata": {"name": "istio-system"}}),
        (kinds.NAMESPACES, {"metadata": {"name": "shop"}}),
    ):
        with contextlib.suppress(KubeAlreadyExistsError):
            await kube.create(kind, obj)
    await kube.create(
        kinds.SERVICE_ENTRIES,
        {
            "apiVersion": "networking.istio.io/v1",
            "kind": "ServiceEntry",
            "metadata": {"name": "api", "namespace": "shop"},
            "spec": {
                "hosts": ["api.example.com"],
                "resolution": "STATIC",
                "ports": [{"number": 80, "name": "http"}],
                "endpoints": [{"address": "198.18.40.4"}],
            },
        },
    )

    async def addresses() -> list[dict[str, str]]:
        obj = await kube.get(kinds.SERVICE_ENTRIES, "api", "shop")
        return list((obj.get("status") or {}).get("addresses") or [])

    plane = ControlPlane(settings(server_process), kube)
    await plane.start()
    try:
        allocated = await poll(addresses)
        assert allocated == [
            {"value": "240.240.0.1", "host": "api.example.com"},
            {"value": "2001:2::1", "host": "api.example.com"},
        ]

        async def vips() -> list[str]:
            return service_vips(plane, "shop/api.example.com")

        assert await poll(vips) == ["240.240.0.1", "2001:2::1"]
    finally:
        await plane.aclose()

    restarted = ControlPlane(settings(server_process), kube)
    await restarted.start()
    try:

        async def restarted_vips() -> list[str]:
            return service_vips(restarted, "shop/api.example.com")

        assert await poll(restarted_vips) == ["240.240.0.1", "2001:2::1"]
        await restarted.entry_addresses.write_once()
        assert restarted.entry_addresses.writes == 0
        assert await addresses() == allocated
    finally:
        await restarted.aclose()
