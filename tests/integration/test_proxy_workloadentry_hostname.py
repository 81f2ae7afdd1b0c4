"""A WorkloadEntry whose address is a DNS name, selected by a ``resolution: DNS`` ServiceEntry (upstream
TestServiceEntrySelectsWorkloadEntry "DNS hostname"), from the API objects to bytes at the endpoint.

The objects are translated by the control plane (:func:`ambit.controlplane.translate.translate`), every Address
goes over the wire form (encoded and decoded as an xDS client reads it), and the node proxy's state is what that
gives, plus the client pod. The rig's outbound handler then carries a connection the pod opens to the entry's VIP:
the node proxy plans it to the hostname endpoint, resolves the name through a scripted DNS server on loopback and
dials the "VM" (a TCP echo server on ``127.0.0.6`` outside the mesh) at the port the WorkloadEntry's ``ports`` map
gives.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
from collections.abc import AsyncIterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import pytest
from tests.integration.dns_upstream import HOST, ScriptedDns, scripted_dns
from tests.integration.fake_waypoint import call_outbound
from tests.integration.proxy_rig import until
from tests.unit.workload_builders import pod

from ambit.controlplane.translate import translate_all
from ambit.identity.localca import LocalCa
from ambit.identity.manager import CertificateManager
from ambit.model.state import WorkloadState
from ambit.model.workload import Service, Workload
from ambit.proxy.context import LocalPod, ProxyContext
from ambit.proxy.hostnames import HostnameResolver, upstream_lookup
from ambit.proxy.pool import ConnectionPool
from ambit.proxy.settings import ProxySettings
from ambit.proxy.sockets import HostSocketFactory
from ambit.telemetry.accesslog import AccessLog
from ambit.telemetry.metrics import ProxyMetrics
from ambit.xds.convert import address_of, decode_address, pack_address, resource_name
from ambit.zds.protocol import WorkloadInfo

pytestmark = pytest.mark.timeout(30)

TD = "cluster.local"
CLIENT_IP, VM_IP = "127.0.0.31", "127.0.0.6"
VIP = "198.19.40.1"
VM_NAME = "vm-1.corp.example.net"


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


def over_the_wire(items: tuple[Workload | Service, ...]) -> list[Workload | Service]:
    """Each item as a node proxy's xDS client decodes it."""
    return [decode_address(resource_name(address_of(i)), pack_address(address_of(i))) for i in items]


@dataclass
class Rig:
    ctx: ProxyContext
    pod: LocalPod
    dns: ScriptedDns
    vm_port: int
    seen: list[str]

    def apply(self, vm_address: str) -> list[Workload | Service]:
        translation = translate_all([], [], [], [], **objects(vm_address, self.vm_port))
        items = over_the_wire((*translation.config.workloads, *translation.config.services))
        client = pod("client-0", CLIENT_IP, services={}, service_account="client")
        self.ctx.state.replace_all(
            [client, *(i for i in items if isinstance(i, Workload))], [i for i in items if isinstance(i, Service)]
        )
        self.ctx.state_changed()
        return items

    async def call(self, payload: bytes) -> bytes:
        return await call_outbound(self.ctx, self.pod, CLIENT_IP, (VIP, 80), payload)


@contextlib.asynccontextmanager
async def rig(tmp_path: Path) -> AsyncIterator[Rig]:
    seen: list[str] = []

    async def vm(reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        seen.append(str(writer.get_extra_info("peername")[0]))
        writer.write(b"vm:" + await reader.read(1024))
        await writer.drain()
        writer.close()

    server = await asyncio.start_server(vm, VM_IP, 0)
    vm_port = server.sockets[0].getsockname()[1]
    async with scripted_dns({VM_NAME: [VM_IP]}, ttl=30) as dns:
        ctx = ProxyContext(
            settings=ProxySettings(node="node1", trust_domain=TD),
            state=WorkloadState(),
            certs=CertificateManager(LocalCa(tmp_path / "ca", trust_domain=TD)),
            pool=ConnectionPool(),
            metrics=ProxyMetrics(),
            access_log=AccessLog(logger=logging.getLogger("tests.workloadentry_hostname.access")),
            hostnames=HostnameResolver(
                upstream_lookup((HOST,), port=dns.port, timeout=2.0), clock=asyncio.get_running_loop().time
            ),
        )
        local = LocalPod("uid-client", WorkloadInfo("client-0", "apps", "client"), HostSocketFactory(mark=None), TD)
        ctx.add_pod(local)
        try:
            yield Rig(ctx, local, dns, vm_port, seen)
        finally:
            await ctx.pool.aclose()
            await ctx.certs.aclose()
            server.close()
            await server.wait_closed()


async def test_a_workload_entry_named_by_a_host_name_is_reached_through_its_dns_service_entry(tmp_path: Path) -> None:
    async with rig(tmp_path) as r:
        items = r.apply(VM_NAME)
        (entry,) = [i for i in items if isinstance(i, Workload) and i.name == "test-we"]
        assert (entry.hostname, entry.addresses, entry.capacity) == (VM_NAME, (), 2)
        assert await r.call(b"hello vm") == b"vm:hello vm"
        await until(lambda: not r.ctx.connections)
        assert len(r.seen) == 1
        assert r.dns.asked[(VM_NAME, "A")] == 1


async def test_a_host_name_that_does_not_resolve_resets_the_connection_and_dials_nothing(tmp_path: Path) -> None:
    async with rig(tmp_path) as r:
        r.apply("gone.corp.example.net")
        assert await r.call(b"hello vm") == b""
        await until(lambda: not r.ctx.connections)
        assert r.seen == []
        assert r.dns.asked[("gone.corp.example.net", "A")] == 1


async def test_moving_the_entry_from_a_name_to_an_ip_needs_no_lookup(tmp_path: Path) -> None:
    async with rig(tmp_path) as r:
        r.apply(VM_IP)
        assert await r.call(b"by ip") == b"vm:by ip"
        assert sum(r.dns.asked.values()) == 0
