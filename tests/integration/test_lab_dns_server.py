"""The cluster DNS server on loopback, fed by a real embedded API server through informers: answers follow the
API, TCP is bounded, and garbage or a flood leave it answering."""

from __future__ import annotations

import asyncio
import contextlib
import socket
import time
from collections.abc import AsyncIterator, Awaitable, Callable
from typing import Any

import dns.asyncquery
import dns.exception
import dns.flags
import dns.message
import dns.rcode
import pytest
from tests.harness import free_port

from ambit.apiserver.server import ApiServer
from ambit.k8s import KubeClient, kinds
from ambit.lab.dns.server import ClusterDnsServer, ClusterDnsSettings, RecordsWatcher

pytestmark = pytest.mark.timeout(120)
HOST = "127.0.0.1"


@pytest.fixture
async def kube(apiserver: ApiServer) -> AsyncIterator[KubeClient]:
    async with KubeClient.from_kubeconfig(apiserver.kubeconfig) as client:
        yield client


@pytest.fixture
async def dns_server(kube: KubeClient) -> AsyncIterator[ClusterDnsServer]:
    watcher = RecordsWatcher(kube)
    await watcher.start()
    server = ClusterDnsServer(
        watcher.find_records,
        ClusterDnsSettings(host=HOST, port=free_port(), max_connections=4, idle_timeout=1.0),
    )
    await server.start()
    try:
        yield server
    finally:
        await server.aclose()
        await watcher.aclose()


async def eventually(check: Callable[[], Awaitable[bool]], seconds: float = 20.0) -> None:
    deadline = time.monotonic() + seconds
    while not await check():
        assert time.monotonic() < deadline, "condition not met in time"
        await asyncio.sleep(0.05)


async def query(server: ClusterDnsServer, name: str, rdtype: str = "A", *, tcp: bool = False) -> dns.message.Message:
    message = dns.message.make_query(name, rdtype)
    if tcp:
        return await dns.asyncquery.tcp(message, HOST, port=server.tcp_port, timeout=5)
    for _ in range(5):  # UDP is lossy under load: retry as a stub resolver does
        with contextlib.suppress(dns.exception.Timeout):
            return await dns.asyncquery.udp(message, HOST, port=server.udp_port, timeout=2)
    raise AssertionError(f"no UDP answer for {name}")


def texts(response: dns.message.Message) -> list[str]:
    return sorted(rd.to_text() for rrset in response.answer for rd in rrset)


async def namespace(kube: KubeClient, name: str) -> None:
    await kube.create(kinds.NAMESPACES, {"apiVersion": "v1", "kind": "Namespace", "metadata": {"name": name}})


def endpoint_slice(svc: str, ready: dict[str, bool]) -> dict[str, Any]:
    return {
        "apiVersion": "discovery.k8s.io/v1",
        "kind": "EndpointSlice",
        "metadata": {"name": f"{svc}-x", "labels": {"kubernetes.io/service-name": svc}},
        "addressType": "IPv4",
        "endpoints": [{"addresses": [ip], "conditions": {"ready": ok}} for ip, ok in ready.items()],
        "ports": [{"name": "pg", "port": 5432, "protocol": "TCP"}],
    }


async def test_answers_follow_services_endpoint_slices_and_the_lab_zone(
    kube: KubeClient, dns_server: ClusterDnsServer
) -> None:
    await namespace(kube, "apps")
    svc = {"apiVersion": "v1", "kind": "Service", "metadata": {"name": "server"}, "spec": {"ports": [{"port": 80}]}}
    created = await kube.create(kinds.SERVICES, svc, namespace="apps")
    cluster_ip = created["spec"]["clusterIP"]

    async def resolves() -> bool:
        return texts(await query(dns_server, "server.apps.svc.cluster.local")) == [cluster_ip]

    await eventually(resolves)
    assert texts(await query(dns_server, "server.apps.svc.cluster.local", tcp=True)) == [cluster_ip]

    headless = {
        "apiVersion": "v1",
        "kind": "Service",
        "metadata": {"name": "db"},
        "spec": {"clusterIP": "None", "ports": [{"name": "pg", "port": 5432}]},
    }
    await kube.create(kinds.SERVICES, headless, namespace="apps")
    await kube.create(
        kinds.ENDPOINT_SLICES, endpoint_slice("db", {"198.18.1.5": True, "198.18.2.6": True}), namespace="apps"
    )

    async def both() -> bool:
        return texts(await query(dns_server, "db.apps.svc.cluster.local")) == ["198.18.1.5", "198.18.2.6"]

    await eventually(both)
    await kube.replace(
        kinds.ENDPOINT_SLICES,
        endpoint_slice("db", {"198.18.1.5": True, "198.18.2.6": False}),
        namespace="apps",
    )

    async def one() -> bool:
        return texts(await query(dns_server, "db.apps.svc.cluster.local")) == ["198.18.1.5"]

    await eventually(one)

    zone = {
        "apiVersion": "v1",
        "kind": "ConfigMap",
        "metadata": {"name": "lab-dns-zone"},
        "data": {"api.example.com": "198.18.3.9"},
    }
    await kube.create(kinds.CONFIG_MAPS, zone, namespace="kube-system")

    async def zoned() -> bool:
        return texts(await query(dns_server, "api.example.com")) == ["198.18.3.9"]

    await eventually(zoned)
    assert (await query(dns_server, "www.example.org")).rcode() == dns.rcode.REFUSED

    await kube.delete(kinds.SERVICES, "server", namespace="apps")

    async def gone() -> bool:
        return (await query(dns_server, "server.apps.svc.cluster.local")).rcode() == dns.rcode.NXDOMAIN

    await eventually(gone)


async def test_a_large_answer_is_truncated_over_udp_and_complete_over_tcp(
    kube: KubeClient, dns_server: ClusterDnsServer
) -> None:
    await namespace(kube, "apps")
    big = {
        "apiVersion": "v1",
        "kind": "Service",
        "metadata": {"name": "big"},
        "spec": {"clusterIP": "None", "ports": [{"name": "pg", "port": 5432}]},
    }
    await kube.create(kinds.SERVICES, big, namespace="apps")
    ready = {f"198.18.1.{i}": True for i in range(2, 62)}
    await kube.create(kinds.ENDPOINT_SLICES, endpoint_slice("big", ready), namespace="apps")

    async def complete() -> bool:
        return len(texts(await query(dns_server, "big.apps.svc.cluster.local", tcp=True))) == 60

    await eventually(complete)
    udp = await query(dns_server, "big.apps.svc.cluster.local")
    assert udp.flags & dns.flags.TC


def udp_socket() -> socket.socket:
    sock = socket.socket(socket.AF_INET, socket.SOCK_DGRAM)
    sock.setblocking(False)
    return sock


async def test_garbage_and_a_flood_leave_the_server_answering(kube: KubeClient, dns_server: ClusterDnsServer) -> None:
    await namespace(kube, "apps")
    await kube.create(
        kinds.SERVICES,
        {"apiVersion": "v1", "kind": "Service", "metadata": {"name": "server"}, "spec": {"ports": [{"port": 80}]}},
        namespace="apps",
    )

    async def resolves() -> bool:
        return bool(texts(await query(dns_server, "server.apps.svc.cluster.local")))

    await eventually(resolves)
    good = dns.message.make_query("server.apps.svc.cluster.local", "A").to_wire()
    garbage = [
        b"",
        b"\x00",
        b"\xff" * 12,
        b"\x12\x34\x81\x80" + b"\x00" * 8,
        b"\x00\x01\x00\x00\x00\x09" + b"\xc0" * 200,
    ]
    with udp_socket() as sock:
        for i in range(5000):
            packet = good if i % 2 else garbage[i % len(garbage)]
            sock.sendto(packet, (HOST, dns_server.udp_port))
            if i % 200 == 0:
                await asyncio.sleep(0)  # let the server's callbacks run: a flood, not a single burst
    assert dns_server.stats["dropped"] > 0
    # A query sent while the socket's buffer is full is lost, as under any flood: a client retries, and so does
    # this check; the server must come back to answering.
    await eventually(resolves)

    # A response sent to the server gets no reply (no loops between DNS servers).
    reply = await query(dns_server, "server.apps.svc.cluster.local")
    with udp_socket() as sock:
        sock.bind((HOST, 0))
        sock.sendto(reply.to_wire(), (HOST, dns_server.udp_port))
        sock.sendto(good, (HOST, dns_server.udp_port))
        loop = asyncio.get_running_loop()
        first = await asyncio.wait_for(loop.sock_recv(sock, 4096), 5)
        assert dns.message.from_wire(first).id == dns.message.from_wire(good).id


async def test_tcp_connections_are_bounded_in_number_size_and_idle_time(dns_server: ClusterDnsServer) -> None:
    port = dns_server.tcp_port
    held = [await asyncio.open_connection(HOST, port) for _ in range(4)]
    await eventually(lambda: _true(len(dns_server._connections) == 4))
    reader, writer = await asyncio.open_connection(HOST, port)
    assert await asyncio.wait_for(reader.read(), 5) == b""  # past the bound: closed at once
    writer.close()
    assert dns_server.stats["tcp_refused"] == 1
    for _, w in held:
        w.close()
    await eventually(lambda: _true(not dns_server._connections))

    reader, writer = await asyncio.open_connection(HOST, port)
    writer.write((60000).to_bytes(2, "big") + b"\x00" * 100)
    assert await asyncio.wait_for(reader.read(), 5) == b""  # too long a query: closed
    writer.close()

    reader, writer = await asyncio.open_connection(HOST, port)
    started = time.monotonic()
    assert await asyncio.wait_for(reader.read(), 10) == b""  # idle past the timeout: closed
    assert time.monotonic() - started >= 0.9
    writer.close()

    answer = await query(dns_server, "nothing.apps.svc.cluster.local", tcp=True)
    assert answer.rcode() == dns.rcode.NXDOMAIN


async def _true(value: bool) -> bool:
    return value
