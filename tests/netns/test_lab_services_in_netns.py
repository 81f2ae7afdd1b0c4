"""Service rules in real namespaces: pods and the node reach a VIP, across nodes too, and a Service scaled to zero
refuses at once.

The topology is this test's own (names ``svt<4 hex>-*``), built from namespaces only: nothing in the root
namespace is created or changed, so it can run next to labs and other tests::

    svt..-cli 198.18.200.10 ┐                                       ┌ svt..-rem 198.18.201.20
    svt..-cl2 198.18.200.11 ┤
    svt..-srv 198.18.200.20 ┴ cni0 198.18.200.1 [svt..-node1] eth1 ─ eth1 [svt..-node2] cni0 198.18.201.1
                                                198.18.202.1/30      198.18.202.2/30

Each node has a route for the Service range (198.19.0.0/16) on ``cni0``: the node's own connections to a VIP are
routed before the output hook DNATs them, so without one they fail with ENETUNREACH. Nodes send no ICMP redirects
(``send_redirects=0``, as lab nodes should): a hairpin connection leaves ``cni0`` the way it came in, so the node
would send the pod a redirect, and a redirect resets the kernel's per-host ICMP rate limit, suppressing any ICMP
reject to that pod within the next second. Servers answer
``"<pod> <payload> from <peer address>"`` on TCP 8080 and UDP 8053, so a test sees who answered and whom the
server saw (the node's ``cni0`` address when the connection was hairpin-SNATed).
"""

from __future__ import annotations

import asyncio
import json
import secrets
import subprocess
import sys
from collections.abc import AsyncIterator, Callable, Iterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import pytest

from ambit.apiserver.server import ApiServer, ApiServerSettings
from ambit.commands import SubprocessRunner
from ambit.k8s import InformerSettings, KubeClient, kinds
from ambit.lab.network.services import TABLE, render_service_rules
from ambit.lab.network.services_apply import ServiceProxy, ServiceProxySettings, apply_rules, remove_rules

pytestmark = [pytest.mark.root, pytest.mark.timeout(60)]  # conftest skips without root (fails in CI)

NODE1_PODS = "198.18.200.0/24"
NODE1_GATEWAY = "198.18.200.1"
CLIENT_IP = "198.18.200.10"
CLIENT2_IP = "198.18.200.11"
SERVER_IP = "198.18.200.20"
REMOTE_IP = "198.18.201.20"
VIP = "198.19.200.5"

SERVER = r"""
import socket, sys, threading
name = sys.argv[1]
tcp = socket.socket()
tcp.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
tcp.bind(("0.0.0.0", 8080))
tcp.listen(64)
udp = socket.socket(socket.AF_INET, socket.SOCK_DGRAM)
udp.bind(("0.0.0.0", 8053))

def answer(data, peer):
    return f"{name} {data.decode(errors='replace')} from {peer[0]}".encode()

def serve_udp():
    while True:
        data, peer = udp.recvfrom(2048)
        udp.sendto(answer(data, peer), peer)

threading.Thread(target=serve_udp, daemon=True).start()
print("ready", flush=True)
while True:
    conn, peer = tcp.accept()
    with conn:
        conn.sendall(answer(conn.recv(2048), peer))
"""

CLIENT = r"""
import errno, json, socket, sys, time
ip, port, proto, count = sys.argv[1], int(sys.argv[2]), sys.argv[3], int(sys.argv[4])
results = []
for _ in range(count):
    start = time.monotonic()
    try:
        if proto == "tcp":
            s = socket.create_connection((ip, port), timeout=3)
            s.sendall(b"hi")
        else:
            s = socket.socket(socket.AF_INET, socket.SOCK_DGRAM)
            s.settimeout(3)
            s.connect((ip, port))
            s.send(b"hi")
        with s:
            out = {"reply": s.recv(2048).decode()}
    except OSError as exc:
        out = {"error": errno.errorcode.get(exc.errno, type(exc).__name__) if exc.errno else type(exc).__name__}
    out["seconds"] = time.monotonic() - start
    results.append(out)
print(json.dumps(results))
"""


def sh(*argv: str, check: bool = True, stdin: str | None = None) -> subprocess.CompletedProcess[str]:
    result = subprocess.run(argv, input=stdin, capture_output=True, text=True, timeout=30, check=False)
    if check and result.returncode != 0:
        raise RuntimeError(f"{' '.join(argv)} exited {result.returncode}: {result.stderr.strip()}")
    return result


def our_namespaces(prefix: str) -> list[str]:
    listed = sh("ip", "netns", "list").stdout.split("\n")
    return [line.split()[0] for line in listed if line.startswith(f"{prefix}-")]


@dataclass
class Topology:
    prefix: str
    servers: list[subprocess.Popen[str]] = field(default_factory=list)

    def ns(self, role: str) -> str:
        return f"{self.prefix}-{role}"

    @property
    def node1(self) -> str:
        return self.ns("node1")

    def build(self) -> None:
        node1, node2 = self.node1, self.ns("node2")
        for ns in (node1, node2, self.ns("cli"), self.ns("cl2"), self.ns("srv"), self.ns("rem")):
            sh("ip", "netns", "add", ns)
            sh("ip", "-n", ns, "link", "set", "lo", "up")
        for node, gateway in ((node1, NODE1_GATEWAY), (node2, "198.18.201.1")):
            self.redirects(node, False)
            sh("ip", "-n", node, "link", "add", "cni0", "type", "bridge")
            sh("ip", "-n", node, "addr", "add", f"{gateway}/24", "dev", "cni0")
            sh("ip", "-n", node, "link", "set", "cni0", "up")
            sh("ip", "netns", "exec", node, "sysctl", "-qw", "net.ipv4.ip_forward=1")
            sh("ip", "-n", node, "route", "add", "198.19.0.0/16", "dev", "cni0")
        self.bridge_netfilter(False)
        sh("ip", "-n", node1, "link", "add", "eth1", "type", "veth", "peer", "name", "eth1", "netns", node2)
        for node, address in ((node1, "198.18.202.1/30"), (node2, "198.18.202.2/30")):
            sh("ip", "-n", node, "addr", "add", address, "dev", "eth1")
            sh("ip", "-n", node, "link", "set", "eth1", "up")
        sh("ip", "-n", node1, "route", "add", "198.18.201.0/24", "via", "198.18.202.2")
        sh("ip", "-n", node2, "route", "add", NODE1_PODS, "via", "198.18.202.1")
        for role, node, address, gateway in (
            ("cli", node1, CLIENT_IP, NODE1_GATEWAY),
            ("cl2", node1, CLIENT2_IP, NODE1_GATEWAY),
            ("srv", node1, SERVER_IP, NODE1_GATEWAY),
            ("rem", node2, REMOTE_IP, "198.18.201.1"),
        ):
            pod, host_end = self.ns(role), f"{self.prefix}{role}"
            sh("ip", "-n", node, "link", "add", host_end, "type", "veth", "peer", "name", "eth0", "netns", pod)
            sh("ip", "-n", node, "link", "set", host_end, "master", "cni0", "up")
            sh("ip", "-n", pod, "addr", "add", f"{address}/24", "dev", "eth0")
            sh("ip", "-n", pod, "link", "set", "eth0", "up")
            sh("ip", "-n", pod, "route", "add", "default", "via", gateway)
        for role in ("srv", "rem"):
            proc = subprocess.Popen(
                ["ip", "netns", "exec", self.ns(role), sys.executable, "-c", SERVER, role],
                stdout=subprocess.PIPE,
                text=True,
            )
            self.servers.append(proc)
            assert proc.stdout is not None and proc.stdout.readline().strip() == "ready"

    def teardown(self) -> None:
        """Idempotent: stop our servers (by their Popen), delete our namespaces, check none is left."""
        for proc in self.servers:
            if proc.poll() is None:
                proc.kill()
            proc.wait(timeout=10)
            if proc.stdout is not None:
                proc.stdout.close()
        self.servers.clear()
        for ns in our_namespaces(self.prefix):
            sh("ip", "netns", "del", ns, check=False)
        assert our_namespaces(self.prefix) == []

    def redirects(self, node: str, on: bool) -> None:
        for conf in ("all", "default", "cni0"):
            sh(
                "ip",
                "netns",
                "exec",
                node,
                "sysctl",
                "-qw",
                f"net.ipv4.conf.{conf}.send_redirects={int(on)}",
                check=False,
            )

    def bridge_netfilter(self, on: bool) -> bool:
        """Turn br_netfilter's IPv4 hook on or off in node1; False when the module is not loaded."""
        result = sh(
            "ip",
            "netns",
            "exec",
            self.node1,
            "sysctl",
            "-qw",
            f"net.bridge.bridge-nf-call-iptables={int(on)}",
            check=False,
        )
        return result.returncode == 0

    def connect(self, role: str, ip: str, port: int, proto: str = "tcp", count: int = 1) -> list[dict[str, Any]]:
        out = sh("ip", "netns", "exec", self.ns(role), sys.executable, "-c", CLIENT, ip, str(port), proto, str(count))
        results: list[dict[str, Any]] = json.loads(out.stdout)
        return results

    def tables(self) -> str:
        return sh("ip", "netns", "exec", self.node1, "nft", "list", "tables").stdout


@pytest.fixture(scope="module")
def topology() -> Iterator[Topology]:
    topo = Topology(f"svt{secrets.token_hex(2)}")
    try:
        topo.build()
        yield topo
    finally:
        topo.teardown()


def service(name: str, vip: str, *ports: dict[str, Any]) -> dict[str, Any]:
    return {"metadata": {"namespace": "default", "name": name}, "spec": {"clusterIP": vip, "ports": list(ports)}}


def endpoint_slice(svc: str, ports: list[dict[str, Any]], *ips: str, ready: bool = True) -> dict[str, Any]:
    return {
        "metadata": {"namespace": "default", "name": f"{svc}-a", "labels": {"kubernetes.io/service-name": svc}},
        "addressType": "IPv4",
        "ports": ports,
        "endpoints": [{"addresses": [ip], "conditions": {"ready": ready}} for ip in ips],
    }


WEB = service("web", VIP, {"name": "http", "port": 80}, {"name": "dns", "port": 53, "protocol": "UDP"})
WEB_PORTS = [{"name": "http", "port": 8080}, {"name": "dns", "port": 8053, "protocol": "UDP"}]


Apply = Callable[..., None]
"""apply(services, slices, **render options)"""


@pytest.fixture
def rules(topology: Topology) -> Iterator[Apply]:
    """Apply rules rendered from objects in node1; the table is removed after the test."""
    runner = SubprocessRunner()

    def apply(services: list[dict[str, Any]], slices: list[dict[str, Any]], **options: Any) -> None:
        rendered = render_service_rules(
            services, slices, node_pod_cidr=NODE1_PODS, node_gateway=NODE1_GATEWAY, **options
        )
        assert rendered.skipped == []
        asyncio.run(apply_rules(topology.node1, rendered.script, runner))

    try:
        yield apply
    finally:
        asyncio.run(remove_rules(topology.node1, runner))
        topology.bridge_netfilter(False)
        topology.redirects(topology.node1, False)


@pytest.mark.parametrize("redirects", [False, True], ids=["no-redirects", "redirects"])
def test_a_pod_reaches_a_service_on_its_own_node_without_br_netfilter(
    topology: Topology, rules: Apply, redirects: bool
) -> None:
    topology.bridge_netfilter(False)
    topology.redirects(topology.node1, redirects)
    rules([WEB], [endpoint_slice("web", WEB_PORTS, SERVER_IP)])
    # The reply would cross the bridge untranslated: the hairpin SNAT makes the server answer the node. With
    # redirects the node also sends the client ICMP redirects, which hold back ICMP rejects to that client for
    # about a second: a client of its own keeps that away from the other tests.
    for result in topology.connect("cl2" if redirects else "cli", VIP, 80, count=3):
        assert result["reply"] == f"srv hi from {NODE1_GATEWAY}"


def test_a_pod_reaches_a_service_on_its_own_node_with_br_netfilter(topology: Topology, rules: Apply) -> None:
    if not topology.bridge_netfilter(True):
        pytest.skip("br_netfilter is not loaded")
    rules([WEB], [endpoint_slice("web", WEB_PORTS, SERVER_IP)])
    assert topology.connect("cli", VIP, 80)[0]["reply"] == f"srv hi from {NODE1_GATEWAY}"


def test_with_br_netfilter_rules_a_pod_on_the_same_node_keeps_its_address(topology: Topology, rules: Apply) -> None:
    """Rules rendered for a bridge that passes its frames to netfilter (as Kubernetes nodes have): the reply is
    un-DNATed on the bridge, so the server sees the client's own address (Istio's TestServices checks the original
    source), while a pod calling its own Service is still SNATed (its reply would never leave it)."""
    if not topology.bridge_netfilter(True):
        pytest.skip("br_netfilter is not loaded")
    rules([WEB], [endpoint_slice("web", WEB_PORTS, SERVER_IP)], bridge_netfilter=True)
    for result in topology.connect("cli", VIP, 80, count=3):
        assert result["reply"] == f"srv hi from {CLIENT_IP}"
    port = f"{topology.prefix}srv"
    sh("ip", "-n", topology.node1, "link", "set", port, "type", "bridge_slave", "hairpin", "on")
    try:
        assert topology.connect("srv", VIP, 80)[0]["reply"] == f"srv hi from {NODE1_GATEWAY}"
    finally:
        sh("ip", "-n", topology.node1, "link", "set", port, "type", "bridge_slave", "hairpin", "off")


def test_a_pod_that_calls_its_own_service_gets_its_own_answer(topology: Topology, rules: Apply) -> None:
    rules([WEB], [endpoint_slice("web", WEB_PORTS, SERVER_IP)])
    assert topology.connect("srv", VIP, 80)[0]["reply"] == f"srv hi from {NODE1_GATEWAY}"


def test_with_br_netfilter_a_pod_calling_its_own_service_needs_hairpin_mode(topology: Topology, rules: Apply) -> None:
    # br_netfilter DNATs the pod's frame on the bridge and bridges it back out of the port it came in by, which
    # the bridge refuses unless the port is in hairpin mode (the CNI bridge plugin's "hairpinMode": true).
    if not topology.bridge_netfilter(True):
        pytest.skip("br_netfilter is not loaded")
    rules([WEB], [endpoint_slice("web", WEB_PORTS, SERVER_IP)])
    port = f"{topology.prefix}srv"
    sh("ip", "-n", topology.node1, "link", "set", port, "type", "bridge_slave", "hairpin", "on")
    try:
        assert topology.connect("srv", VIP, 80)[0]["reply"] == f"srv hi from {NODE1_GATEWAY}"
    finally:
        sh("ip", "-n", topology.node1, "link", "set", port, "type", "bridge_slave", "hairpin", "off")


def test_the_node_itself_reaches_the_service(topology: Topology, rules: Apply) -> None:
    rules([WEB], [endpoint_slice("web", WEB_PORTS, SERVER_IP)])
    assert topology.connect("node1", VIP, 80)[0]["reply"].startswith("srv hi from ")


def test_a_pod_reaches_an_endpoint_on_another_node_without_snat(topology: Topology, rules: Apply) -> None:
    rules([WEB], [endpoint_slice("web", WEB_PORTS, REMOTE_IP)])
    assert topology.connect("cli", VIP, 80)[0]["reply"] == f"rem hi from {CLIENT_IP}"
    assert topology.connect("cli", VIP, 53, "udp")[0]["reply"] == f"rem hi from {CLIENT_IP}"


def test_udp_service_reaches_a_local_endpoint(topology: Topology, rules: Apply) -> None:
    rules([WEB], [endpoint_slice("web", WEB_PORTS, SERVER_IP)])
    assert topology.connect("cli", VIP, 53, "udp")[0]["reply"] == f"srv hi from {NODE1_GATEWAY}"


def test_new_connections_are_spread_over_the_endpoints(topology: Topology, rules: Apply) -> None:
    rules([WEB], [endpoint_slice("web", WEB_PORTS, SERVER_IP, REMOTE_IP)])
    answers = {result["reply"].split()[0] for result in topology.connect("cli", VIP, 80, count=40)}
    assert answers == {"srv", "rem"}


def test_a_service_scaled_to_zero_refuses_at_once(topology: Topology, rules: Apply) -> None:
    rules([WEB], [endpoint_slice("web", WEB_PORTS, SERVER_IP, REMOTE_IP, ready=False)])
    for role in ("cli", "node1"):
        (tcp,) = topology.connect(role, VIP, 80)
        assert tcp["error"] == "ECONNREFUSED" and tcp["seconds"] < 1.0, (role, tcp)
    # UDP: port-unreachable reaches a pod's socket as ECONNREFUSED; the node's own send fails in its output hook
    (udp,) = topology.connect("cli", VIP, 53, "udp")
    assert udp["error"] == "ECONNREFUSED" and udp["seconds"] < 1.0, udp
    (udp,) = topology.connect("node1", VIP, 53, "udp")
    assert udp["error"] == "EPERM" and udp["seconds"] < 1.0, udp
    # a port the Service does not have is refused too (ICMP port-unreachable), not left to time out
    (other,) = topology.connect("cli", VIP, 8080)
    assert other["error"] == "ECONNREFUSED" and other["seconds"] < 1.0


def test_an_address_of_the_service_range_without_a_service_is_refused_when_the_range_is_given(
    topology: Topology, rules: Apply
) -> None:
    rules([WEB], [endpoint_slice("web", WEB_PORTS, SERVER_IP)], service_cidr="198.19.0.0/16")
    for role in ("cli", "node1"):
        (result,) = topology.connect(role, "198.19.200.99", 80)
        assert result["error"] == "ECONNREFUSED" and result["seconds"] < 1.0, (role, result)
    assert topology.connect("cli", VIP, 80)[0]["reply"] == f"srv hi from {NODE1_GATEWAY}"


def test_removing_the_rules_is_idempotent(topology: Topology, rules: Apply) -> None:
    rules([WEB], [endpoint_slice("web", WEB_PORTS, SERVER_IP)])
    assert TABLE in topology.tables()
    runner = SubprocessRunner()
    asyncio.run(remove_rules(topology.node1, runner))
    asyncio.run(remove_rules(topology.node1, runner))
    assert TABLE not in topology.tables()
    asyncio.run(remove_rules(f"{topology.prefix}-gone", runner))


# -- ServiceProxy: API server → informers → nft in the node ------------------------------------------------------


@pytest.fixture
async def kube(tmp_path: Path) -> AsyncIterator[KubeClient]:
    async with (
        ApiServer(ApiServerSettings(data_dir=tmp_path / "api", port=0, crd_dir=None)) as server,
        KubeClient.from_kubeconfig(server.kubeconfig) as client,
    ):
        yield client


async def test_service_proxy_follows_the_cluster_in_a_node(topology: Topology, kube: KubeClient) -> None:
    fast = ServiceProxySettings(debounce=0.02, informer=InformerSettings(backoff_initial=0.05, watch_timeout=30))
    proxy = ServiceProxy(
        kube, netns=topology.node1, node_pod_cidr=NODE1_PODS, node_gateway=NODE1_GATEWAY, settings=fast
    )

    async def connect() -> dict[str, Any]:
        (result,) = await asyncio.to_thread(topology.connect, "cli", "198.19.200.6", 80)
        return result

    async def until(predicate: Callable[[dict[str, Any]], bool]) -> dict[str, Any]:
        async with asyncio.timeout(10):
            while not predicate(result := await connect()):  # noqa: ASYNC110 (polls the network)
                await asyncio.sleep(0.05)
        return result

    await kube.create(kinds.SERVICES, service("api", "198.19.200.6", {"port": 80}))
    try:
        await proxy.start()
        assert (await connect())["error"] == "ECONNREFUSED"  # no endpoints yet: rejected

        slice_ = endpoint_slice("api", [{"port": 8080}], SERVER_IP)
        await kube.create(kinds.ENDPOINT_SLICES, slice_)
        assert (await until(lambda r: "reply" in r))["reply"] == f"srv hi from {NODE1_GATEWAY}"

        slice_["endpoints"][0]["conditions"]["ready"] = False
        await kube.patch(kinds.ENDPOINT_SLICES, "api-a", {"endpoints": slice_["endpoints"]}, "default")
        refused = await until(lambda r: r.get("error") == "ECONNREFUSED")
        assert refused["seconds"] < 1.0
    finally:
        await proxy.aclose()
    assert TABLE not in topology.tables()
