"""A dual-stack lab's network on real namespaces: every pod gets an IPv4 and an IPv6 address from host-local's two
ranges, IPv6 crosses nodes through the node namespaces only, and the machine's own IPv6 is left alone."""

from __future__ import annotations

import asyncio
import subprocess
import sys
import uuid
from collections.abc import AsyncIterator, Callable
from contextlib import asynccontextmanager
from ipaddress import ip_address, ip_network

import pytest

from ambit.commands import SubprocessRunner
from ambit.lab.cluster.record import Record
from ambit.lab.network.bridge import create_network, destroy_network
from ambit.lab.network.topology import Topology
from ambit.lab.runtime.sandbox import PodSandboxes

pytestmark = [pytest.mark.root, pytest.mark.timeout(90)]

PYTHON = [sys.executable, "-I", "-S"]
# One socket for both families (v6 with v4-mapped addresses): answers each connection with the peer it saw.
SERVER = """
import socket, sys
s = socket.socket(socket.AF_INET6)
s.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
s.setsockopt(socket.IPPROTO_IPV6, socket.IPV6_V6ONLY, 0)
s.bind(("::", int(sys.argv[1])))
s.listen(16)
print("ready", flush=True)
while True:
    c, peer = s.accept()
    c.sendall(peer[0].removeprefix("::ffff:").encode())
    c.close()
"""
CLIENT = """
import socket, sys
try:
    with socket.create_connection((sys.argv[1], int(sys.argv[2])), timeout=2) as s:
        print(s.recv(100).decode())
except OSError as exc:
    print(f"error {exc.errno}")
"""
HOST_SYSCTLS = (
    "net.ipv6.conf.all.forwarding",
    "net.ipv6.conf.default.forwarding",
    "net.ipv6.conf.all.accept_ra",
    "net.ipv6.conf.default.accept_ra",
    "net.ipv6.conf.all.disable_ipv6",
    "net.ipv6.conf.default.disable_ipv6",
)


def in_netns(netns: str | None, argv: list[str]) -> list[str]:
    return ["ip", "netns", "exec", netns, *argv] if netns else argv


async def connect(netns: str | None, host: str, port: int) -> str:
    result = await SubprocessRunner().run_async(in_netns(netns, [*PYTHON, "-c", CLIENT, host, str(port)]))
    return result.text.strip()


@asynccontextmanager
async def server_in(netns: str, port: int) -> AsyncIterator[None]:
    proc = await asyncio.create_subprocess_exec(
        *in_netns(netns, [*PYTHON, "-c", SERVER, str(port)]), stdout=subprocess.PIPE
    )
    try:
        assert proc.stdout is not None
        assert await asyncio.wait_for(proc.stdout.readline(), 5) == b"ready\n"
        yield
    finally:
        proc.kill()
        await proc.wait()


def sysctl(netns: str | None, key: str) -> str:
    argv = in_netns(netns, ["sysctl", "-n", key])
    return subprocess.run(argv, capture_output=True, text=True, check=True).stdout.strip()


def root_v6_routes() -> list[str]:
    text = subprocess.run(["ip", "-6", "route", "show"], capture_output=True, text=True, check=True).stdout
    return [line for line in text.splitlines() if line.startswith("fd00:ab")]


def pod(name: str) -> tuple[str, dict[str, dict[str, str]]]:
    uid = str(uuid.uuid4())
    return uid, {"metadata": {"name": name, "namespace": "default", "uid": uid}}


async def test_dual_stack_pods_on_two_nodes_reach_each_other_over_ipv6_without_touching_the_hosts_ipv6(
    new_lab: Callable[..., Topology], root_lab_lock: None, lab_leftovers: Callable[[Topology], list[str]]
) -> None:
    topology = new_lab(2, "dual")
    runner, record = SubprocessRunner(), Record(topology.record_file)
    host_before = {key: sysctl(None, key) for key in HOST_SYSCTLS}
    routes_before = root_v6_routes()

    create_network(topology, record, runner)

    node1, node2 = topology.all_nodes()
    assert sysctl(node1.netns, "net.ipv6.conf.all.forwarding") == "1"
    assert sysctl(node1.netns, "net.ipv6.conf.all.accept_ra") == "0"
    # The root namespace's ends of the lab's links carry IPv6 frames at L2 only.
    for link in (topology.bridge, node1.root_link, node2.root_link):
        assert sysctl(None, f"net.ipv6.conf.{link}.disable_ipv6") == "1"
    assert {key: sysctl(None, key) for key in HOST_SYSCTLS} == host_before
    assert root_v6_routes() == routes_before  # no lab prefix routed in the root namespace

    sandboxes1 = PodSandboxes(topology, "node-1", record, runner)
    sandboxes2 = PodSandboxes(topology, "node-2", record, runner)
    (uid1, pod1), (_, pod2) = pod("client"), pod("server")
    box1, box2 = await sandboxes1.create(pod1), await sandboxes2.create(pod2)
    assert [ip_address(ip).version for ip in box1.ips] == [4, 6]  # IPv4 first, as kind's dual-stack pods
    v6_1, v6_2 = box1.ips[1], box2.ips[1]
    assert ip_address(v6_1) in ip_network(node1.pod_cidr6) and v6_1 != node1.pod_gateway6
    assert ip_address(v6_2) in ip_network(node2.pod_cidr6)

    async with server_in(box2.netns, 8080):
        assert await connect(box1.netns, v6_2, 8080) == v6_1  # pod → pod across nodes over IPv6, no NAT
        assert await connect(box1.netns, box2.ips[0], 8080) == box1.ips[0]  # IPv4 as before
        assert await connect(node1.netns, v6_2, 8080) == node1.address6  # node → pod on another node
        assert (await connect(None, v6_2, 8080)).startswith("error")  # the root namespace has no IPv6 path
    assert (await connect(box1.netns, "2001:db8::1", 9)).startswith("error")  # nothing leaves the lab

    await sandboxes1.destroy(uid1)
    ipam = topology.node_dir("node-1") / "ipam" / "ambit-lab"
    assert not (ipam / v6_1).exists()  # CNI DEL released the IPv6 address too
    destroy_network(topology, record, runner)
    assert lab_leftovers(topology) == []
    assert {key: sysctl(None, key) for key in HOST_SYSCTLS} == host_before
    assert root_v6_routes() == routes_before
