"""The lab's network on real namespaces: nodes, pods attached by the real CNI chain, traffic, and clean removal."""

from __future__ import annotations

import asyncio
import json
import subprocess
import sys
import uuid
from collections.abc import AsyncIterator, Callable
from contextlib import asynccontextmanager
from ipaddress import ip_address, ip_network

import pytest

from ambit.commands import SubprocessRunner
from ambit.lab.cluster.record import Record
from ambit.lab.network.bridge import (
    CONFLIST_NAME,
    LabNetworkError,
    create_network,
    destroy_network,
    node_conflist,
    write_node_cni_files,
)
from ambit.lab.network.congestion import SYSCTL as CONGESTION
from ambit.lab.network.congestion import lab_congestion_sysctls
from ambit.lab.network.plugins import CniInvocationError
from ambit.lab.network.topology import BRIDGE_ADDRESS, Topology
from ambit.lab.runtime.sandbox import PodSandboxes

pytestmark = [pytest.mark.root, pytest.mark.timeout(60)]

PYTHON = [sys.executable, "-I", "-S"]
# Answers every connection with the address it came from, so callers see whether their source was rewritten.
SERVER = """
import socket, sys
s = socket.socket()
s.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
s.bind(("0.0.0.0", int(sys.argv[1])))
s.listen(16)
print("ready", flush=True)
while True:
    c, peer = s.accept()
    c.sendall(peer[0].encode())
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


def in_netns(netns: str | None, argv: list[str]) -> list[str]:
    return ["ip", "netns", "exec", netns, *argv] if netns else argv


async def connect(netns: str | None, host: str, port: int) -> str:
    """Connect from inside ``netns`` (None: the root namespace); the peer address the server saw, or 'error N'."""
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


@asynccontextmanager
async def server_on_lab_bridge() -> AsyncIterator[int]:
    """A listener in the root namespace on the lab bridge's address (where the API server listens)."""

    async def answer(reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        writer.write(writer.get_extra_info("peername")[0].encode())
        await writer.drain()
        writer.close()

    server = await asyncio.start_server(answer, BRIDGE_ADDRESS, 0)
    try:
        yield server.sockets[0].getsockname()[1]
    finally:
        server.close()
        await server.wait_closed()


def snapshot(topology: Topology) -> dict[str, list[str]]:
    """The root namespace's namespaces, links and routes that concern this lab (others may run beside us)."""
    ours = [topology.prefix, *(node.pod_cidr for node in topology.all_nodes()), f"{BRIDGE_ADDRESS} "]
    out: dict[str, list[str]] = {}
    for argv in (["ip", "netns", "list"], ["ip", "-br", "link"], ["ip", "route"], ["ip", "-br", "addr"]):
        text = subprocess.run(argv, capture_output=True, text=True, check=True).stdout
        out[" ".join(argv)] = sorted(line for line in text.splitlines() if any(word in line for word in ours))
    return out


def pod(name: str) -> tuple[str, dict[str, dict[str, str]]]:
    uid = str(uuid.uuid4())
    return uid, {"metadata": {"name": name, "namespace": "default", "uid": uid}}


def netns_names() -> list[str]:
    text = subprocess.run(["ip", "netns", "list"], capture_output=True, text=True, check=True).stdout
    return [line.split()[0] for line in text.splitlines() if line.strip()]


def sysctl(netns: str | None, key: str) -> str:
    argv = in_netns(netns, ["sysctl", "-n", key])
    return subprocess.run(argv, capture_output=True, text=True, check=True).stdout.strip()


async def test_pods_on_two_nodes_reach_each_other_their_nodes_and_the_lab_bridge(
    new_lab: Callable[[int], Topology], root_lab_lock: None, lab_leftovers: Callable[[Topology], list[str]]
) -> None:
    topology = new_lab(2)
    runner, record = SubprocessRunner(), Record(topology.record_file)
    before = snapshot(topology)
    root_forwarding = sysctl(None, "net.ipv4.ip_forward")

    create_network(topology, record, runner)

    other = new_lab(2)
    with pytest.raises(LabNetworkError, match="in use"):  # one lab's network at a time: no stolen routes
        create_network(other, Record(other.record_file), runner)
    assert Record(other.record_file).entries() == []

    node1, node2 = topology.all_nodes()
    assert sysctl(node1.netns, "net.ipv4.ip_forward") == "1"
    assert sysctl(node1.netns, "net.ipv4.conf.all.rp_filter") == "0"
    assert sysctl(None, "net.ipv4.ip_forward") == root_forwarding
    assert (topology.cni_conf_dir("node-1") / CONFLIST_NAME).exists()

    sandboxes1 = PodSandboxes(topology, "node-1", record, runner)
    sandboxes2 = PodSandboxes(topology, "node-2", record, runner, congestion=(f"{CONGESTION}=reno",))
    (uid1, pod1), (uid2, pod2) = pod("client"), pod("server")
    box1 = await sandboxes1.create(pod1)
    box2 = await sandboxes2.create(pod2)
    # A lab's pods do not pace where the machine's default does (this machine's answer), nodes keep the default
    # (their kubelets read it there), and a sandbox sets what it is given.
    machine = sysctl(None, CONGESTION)
    lab_default = lab_congestion_sysctls(machine, sysctl(None, "net.ipv4.tcp_available_congestion_control").split())
    expected = lab_default[0].split("=")[1] if lab_default else machine
    assert (sysctl(node1.netns, CONGESTION), sysctl(box1.netns, CONGESTION)) == (machine, expected)
    assert sysctl(box2.netns, CONGESTION) == "reno"
    ip1, ip2 = box1.ips[0], box2.ips[0]
    assert ip_address(ip1) in ip_network(node1.pod_cidr) and ip1 != node1.pod_gateway
    assert ip_address(ip2) in ip_network(node2.pod_cidr) and ip2 != node2.pod_gateway
    assert box1.netns == topology.pod_netns(uid1)

    async with server_in(box2.netns, 8080):
        assert await connect(box1.netns, ip2, 8080) == ip1  # pod → pod across nodes, source kept (no NAT)
        assert await connect(node1.netns, ip2, 8080) == node1.address  # node → pod on another node
        assert await connect(node2.netns, ip2, 8080) == node2.pod_gateway  # node → its own pod, from cni0
        assert await connect(None, ip2, 8080) == BRIDGE_ADDRESS  # root namespace → pod
    async with server_on_lab_bridge() as port:
        assert await connect(box1.netns, BRIDGE_ADDRESS, port) == ip1  # pod → API server's address
    # Nothing leaves the lab: the node has no route towards the machine's own network.
    assert (await connect(box1.netns, "192.0.2.1", 9)).startswith("error")

    await sandboxes2.check(uid2)
    ipam = topology.node_dir("node-1") / "ipam" / "ambit-lab"
    assert (ipam / ip1).exists()
    await sandboxes1.destroy(uid1)
    assert not (ipam / ip1).exists()  # CNI DEL released the address
    await sandboxes1.destroy(uid1)  # idempotent
    assert box1.netns not in netns_names()

    removed = destroy_network(topology, record, runner)
    assert f"link {topology.bridge}" in removed
    assert f"netns {box2.netns}" in removed
    assert snapshot(topology) == before
    assert lab_leftovers(topology) == []
    assert destroy_network(topology, record, runner) == []


async def test_a_failing_plugin_fails_create_with_its_message_and_leaves_no_namespace(
    new_lab: Callable[[int], Topology],
) -> None:
    # Only the node's namespace is needed (the plugins run there): nothing of this test is in the root namespace.
    topology = new_lab(1)
    runner, record = SubprocessRunner(), Record(topology.record_file)
    node = topology.node(1)
    record.note("netns", name=node.netns)
    runner.run(["ip", "netns", "add", node.netns])
    write_node_cni_files(topology, node, record)
    fake = topology.cni_bin_dir("node-1") / "ambit-test-deny"
    fake.write_text(
        "#!/bin/sh\n"
        'if [ "$CNI_COMMAND" = ADD ]; then\n'
        '  echo \'{"cniVersion": "1.0.0", "code": 101, "msg": "denied by test", "details": "fake plugin"}\'\n'
        "  exit 1\n"
        "fi\n"
    )
    fake.chmod(0o755)
    conflist = node_conflist(topology, node)
    conflist["plugins"].append({"type": "ambit-test-deny"})
    (topology.cni_conf_dir("node-1") / CONFLIST_NAME).write_text(json.dumps(conflist))

    sandboxes = PodSandboxes(topology, "node-1", record, runner)
    uid, doomed = pod("doomed")
    with pytest.raises(CniInvocationError, match="denied by test") as caught:
        await sandboxes.create(doomed)
    error = caught.value
    assert (error.error.code, error.plugin, error.error.details) == (101, "ambit-test-deny", "fake plugin")
    netns = topology.pod_netns(uid)
    assert netns not in netns_names()
    # bridge had taken an address before the failure (host-local noted it); the teardown DEL gave it back.
    ipam = topology.node_dir("node-1") / "ipam" / "ambit-lab"
    assert (ipam / "last_reserved_ip.0").read_text() == "198.18.1.2"
    assert [p.name for p in ipam.glob("198.*")] == []
