"""A WorkloadEntry whose address is a DNS name, selected by a ``resolution: DNS`` ServiceEntry (upstream
TestServiceEntrySelectsWorkloadEntry "DNS hostname"), from the API objects to bytes at the endpoint.

The objects are translated by the control plane and go over the wire form to the node proxy
(:mod:`tests.integration.translated_proxy`). A connection the pod opens to the entry's VIP is planned to the
hostname endpoint; the node proxy resolves the name through a scripted DNS server and dials the "VM" (a TCP echo
server on ``127.0.0.6`` outside the mesh) at the port the WorkloadEntry's ``ports`` map gives.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest
from tests.integration.proxy_rig import until
from tests.integration.translated_proxy import tcp_echo, translated_proxy

from ambit.model.workload import Workload

pytestmark = pytest.mark.timeout(30)

VM_IP, VIP, VM_NAME = "127.0.0.6", "198.19.40.1", "vm-1.corp.example.net"


def objects(vm_address: str, vm_port: int) -> dict[str, list[dict[str, Any]]]:
    """The upstream test's WorkloadEntry and ServiceEntry, as a user writes them."""
    workload_entry = {
        "apiVersion": "networking.istio.io/v1",
        "kind": "WorkloadEntry",
        "metadata": {"name": "test-we", "namespace": "apps"},
        "spec": {"address": vm_address, "ports": {"http": vm_port}, "labels": {"app": "selected"}, "weight": 2},
    }
    service_entry = {
        "apiVersion": "networking.istio.io/v1",
        "kind": "ServiceEntry",
        "metadata": {"name": "test-se", "namespace": "apps"},
        "spec": {
            "hosts": ["dummy.example.com"],
            "addresses": [VIP],
            "ports": [{"number": 80, "name": "http", "protocol": "HTTP"}],
            "resolution": "DNS",
            "location": "MESH_EXTERNAL",
            "workloadSelector": {"labels": {"app": "selected"}},
        },
    }
    return {"workload_entries": [workload_entry], "service_entries": [service_entry]}


async def test_a_workload_entry_named_by_a_host_name_is_reached_through_its_dns_service_entry(tmp_path: Path) -> None:
    async with tcp_echo(VM_IP, b"vm:") as (port, seen), translated_proxy(tmp_path, {VM_NAME: [VM_IP]}) as proxy:
        items = proxy.apply(objects(VM_NAME, port))
        (entry,) = [i for i in items if isinstance(i, Workload) and i.name == "test-we"]
        assert (entry.hostname, entry.addresses, entry.capacity) == (VM_NAME, (), 2)
        assert await proxy.call((VIP, 80), b"hello vm") == b"vm:hello vm"
        await until(lambda: not proxy.ctx.connections)
        assert len(seen) == 1
        assert proxy.dns.asked[(VM_NAME, "A")] == 1


async def test_a_host_name_that_does_not_resolve_resets_the_connection_and_dials_nothing(tmp_path: Path) -> None:
    async with tcp_echo(VM_IP, b"vm:") as (port, seen), translated_proxy(tmp_path) as proxy:
        proxy.apply(objects("gone.corp.example.net", port))
        assert await proxy.call((VIP, 80), b"hello vm") == b""
        await until(lambda: not proxy.ctx.connections)
        assert seen == []
        assert proxy.dns.asked[("gone.corp.example.net", "A")] == 1


async def test_moving_the_entry_from_a_name_to_an_ip_needs_no_lookup(tmp_path: Path) -> None:
    async with tcp_echo(VM_IP, b"vm:") as (port, _), translated_proxy(tmp_path) as proxy:
        proxy.apply(objects(VM_IP, port))
        assert await proxy.call((VIP, 80), b"by ip") == b"vm:by ip"
        assert sum(proxy.dns.asked.values()) == 0
