"""The lab's load balancer against a real API server: a LoadBalancer Service gets an address of the range in its
status, keeps it across restarts of the controller, loses it when it becomes a ClusterIP; the address goes to the
next Service once it is free."""

from __future__ import annotations

from collections.abc import AsyncIterator
from typing import Any

import pytest
from tests.integration.lab_cluster import NS, settings, until

from ambit.apiserver.server import ApiServer
from ambit.k8s import KubeClient, kinds
from ambit.lab.controllers import ControllerManager
from ambit.lab.controllers.loadbalancer import status_ips

CIDR = "198.18.0.224/30"  # one usable address pair: .225, .226


def lb_settings() -> Any:
    return settings(scheduler=False, workloads=False, taint_eviction=False, endpoints=False, load_balancer_cidr=CIDR)


@pytest.fixture
async def kube(apiserver: ApiServer) -> AsyncIterator[KubeClient]:
    async with KubeClient.from_kubeconfig(apiserver.kubeconfig) as client:
        yield client


def service(name: str, kind: str = "LoadBalancer") -> dict[str, Any]:
    return {"metadata": {"name": name, "namespace": NS}, "spec": {"type": kind, "ports": [{"port": 80}]}}


async def ips(kube: KubeClient, name: str) -> list[str]:
    return status_ips(await kube.get(kinds.SERVICES, name, NS))


async def test_load_balancer_services_get_addresses_of_the_range_and_give_them_back(kube: KubeClient) -> None:
    async with ControllerManager(kube, lb_settings()):
        await kube.create(kinds.SERVICES, service("a"), NS)
        await kube.create(kinds.SERVICES, service("b"), NS)
        await kube.create(kinds.SERVICES, service("c"), NS)
        a = await until(lambda: ips(kube, "a"), "a has an address")
        b = await until(lambda: ips(kube, "b"), "b has an address")
        assert sorted(a + b) == ["198.18.0.225", "198.18.0.226"]
        assert await ips(kube, "c") == []  # the range is full: pending
    async with ControllerManager(kube, lb_settings()):  # a restart keeps what was given
        await kube.patch(kinds.SERVICES, "a", {"spec": {"type": "ClusterIP"}}, NS)

        async def released() -> bool:
            return await ips(kube, "a") == []

        await until(released, "a lost its address")
        c = await until(lambda: ips(kube, "c"), "c got the freed address")
        assert c == a
        assert await ips(kube, "b") == b
