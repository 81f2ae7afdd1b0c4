"""NetworkPolicy rules in real namespaces: real TCP (and UDP) connections across a node's bridge, judged by the
rendered ``inet ambit-lab-netpol`` table in the node's ``forward`` hook (br_netfilter on in the node, as lab nodes
have it).

The topology is this test's own (names ``npt<4 hex>-*``), built from namespaces only: nothing in the root namespace
is created or changed, so it can run next to labs and other tests::

    npt..-srv 198.18.210.20 ┐  (app=httpbin; TCP 8080, 9090; UDP 8053)
    npt..-cli 198.18.210.10 ┼ cni0 198.18.210.1 [npt..-node]
    npt..-oth 198.18.210.30 ┘  (cli and oth: app=client / app=other; TCP 8080)

Servers answer ``"<pod> <payload> from <peer address>"``. Every test removes the table it applied; the module's
fixture deletes the namespaces (and stops the servers) whatever happened, and checks that none is left.
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
from ambit.lab.network.policies import TABLE, render_policy_rules
from ambit.lab.network.policies_apply import (
    PolicyAgent,
    PolicyAgentSettings,
    apply_policy_rules,
    remove_policy_rules,
)
from ambit.lab.network.services import render_service_rules
from ambit.lab.network.services_apply import apply_rules, remove_rules

pytestmark = [pytest.mark.root, pytest.mark.timeout(90)]  # conftest skips without root (fails in CI)

PODS = "198.18.210.0/24"
GATEWAY = "198.18.210.1"
ADDRESSES = {"cli": "198.18.210.10", "srv": "198.18.210.20", "oth": "198.18.210.30"}
LABELS = {"cli": "client", "srv": "httpbin", "oth": "other"}
PORTS = {"srv": ("8080", "9090"), "cli": ("8080",), "oth": ("8080",)}
VIP = "198.19.210.5"
NODE = "node-1"

SERVER = r"""
import socket, sys, threading
name, ports = sys.argv[1], [int(p) for p in sys.argv[2:]]

def answer(data, peer):
    return f"{name} {data.decode(errors='replace')} from {peer[0]}".encode()

def serve_tcp(listener):
    while True:
        conn, peer = listener.accept()
        with conn:
            conn.sendall(answer(conn.recv(2048), peer))

for port in ports:
    listener = socket.socket()
    listener.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
    listener.bind(("0.0.0.0", port))
    listener.listen(64)
    threading.Thread(target=serve_tcp, args=(listener,), daemon=True).start()
udp = socket.socket(socket.AF_INET, socket.SOCK_DGRAM)
udp.bind(("0.0.0.0", 8053))
print("ready", flush=True)
while True:
    data, peer = udp.recvfrom(2048)
    udp.sendto(answer(data, peer), peer)
"""

CLIENT = r"""
import errno, json, socket, sys, time
ip, port, proto = sys.argv[1], int(sys.argv[2]), sys.argv[3]
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
print(json.dumps(out))
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
    def node(self) -> str:
        return self.ns("node")

    def build(self) -> None:
        node = self.node
        for ns in (node, *(self.ns(role) for role in ADDRESSES)):
            sh("ip", "netns", "add", ns)
            sh("ip", "-n", ns, "link", "set", "lo", "up")
        sh("ip", "-n", node, "link", "add", "cni0", "type", "bridge")
        sh("ip", "-n", node, "addr", "add", f"{GATEWAY}/24", "dev", "cni0")
        sh("ip", "-n", node, "link", "set", "cni0", "up")
        sh("ip", "-n", node, "route", "add", "198.19.0.0/16", "dev", "cni0")
        for setting in ("net.ipv4.ip_forward=1", *(f"net.ipv4.conf.{c}.send_redirects=0" for c in ("all", "cni0"))):
            sh("ip", "netns", "exec", node, "sysctl", "-qw", setting)
        for role, address in ADDRESSES.items():
            pod, host_end = self.ns(role), f"{self.prefix}{role}"
            sh("ip", "-n", node, "link", "add", host_end, "type", "veth", "peer", "name", "eth0", "netns", pod)
            sh("ip", "-n", node, "link", "set", host_end, "master", "cni0", "up")
            sh("ip", "-n", pod, "addr", "add", f"{address}/24", "dev", "eth0")
            sh("ip", "-n", pod, "link", "set", "eth0", "up")
            sh("ip", "-n", pod, "route", "add", "default", "via", GATEWAY)
            proc = subprocess.Popen(
                ["ip", "netns", "exec", pod, sys.executable, "-c", SERVER, role, *PORTS[role]],
                stdout=subprocess.PIPE,
                text=True,
            )
            self.servers.append(proc)
            assert proc.stdout is not None and proc.stdout.readline().strip() == "ready"

    def bridge_netfilter(self) -> bool:
        """Turn br_netfilter's IPv4 hook on in the node; False when the module is not loaded."""
        setting = "net.bridge.bridge-nf-call-iptables=1"
        return sh("ip", "netns", "exec", self.node, "sysctl", "-qw", setting, check=False).returncode == 0

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

    def connect(self, source: str, ip: str, port: int, proto: str = "tcp") -> dict[str, Any]:
        """A connection from a pod (``source`` a role) or the node itself (``"node"``)."""
        out = sh("ip", "netns", "exec", self.ns(source), sys.executable, "-c", CLIENT, ip, str(port), proto)
        result: dict[str, Any] = json.loads(out.stdout)
        return result

    def tables(self) -> str:
        return sh("ip", "netns", "exec", self.node, "nft", "list", "tables").stdout


@pytest.fixture(scope="module")
def topology() -> Iterator[Topology]:
    topo = Topology(f"npt{secrets.token_hex(2)}")
    try:
        topo.build()
        if not topo.bridge_netfilter():
            pytest.skip("br_netfilter is not loaded: same-node frames would never pass the forward hook")
        yield topo
    finally:
        topo.teardown()


def pod(role: str) -> dict[str, Any]:
    ports = [{"name": "http", "containerPort": 8080}] if role == "srv" else []
    return {
        "metadata": {"namespace": "default", "name": role, "labels": {"app": LABELS[role]}},
        "spec": {"nodeName": NODE, "containers": [{"name": "c", "image": "i", "ports": ports}]},
        "status": {"phase": "Running", "podIP": ADDRESSES[role], "podIPs": [{"ip": ADDRESSES[role]}]},
    }


def policy(name: str, app: str, **spec: Any) -> dict[str, Any]:
    return {
        "metadata": {"namespace": "default", "name": name},
        "spec": {"podSelector": {"matchLabels": {"app": app}}, **spec},
    }


CLIENTS = {"podSelector": {"matchLabels": {"app": "client"}}}
SERVERS = {"podSelector": {"matchLabels": {"app": "httpbin"}}}
FROM_CLIENT_TO_HTTP = policy("from-client", "httpbin", ingress=[{"from": [CLIENTS], "ports": [{"port": "http"}]}])
CLIENT_TO_SERVER_ONLY = policy("client-out", "client", policyTypes=["Egress"], egress=[{"to": [SERVERS]}])

Apply = Callable[[list[dict[str, Any]]], None]


@pytest.fixture
def policies(topology: Topology) -> Iterator[Apply]:
    """Apply rules rendered from policies (over the three pods) in the node; the table is removed after the test."""
    runner = SubprocessRunner()

    def apply(objs: list[dict[str, Any]]) -> None:
        pods = [pod(role) for role in ADDRESSES]
        rendered = render_policy_rules(objs, pods, [], node_name=NODE, node_sources=(GATEWAY, "169.254.7.127"))
        assert rendered.skipped == []
        asyncio.run(apply_policy_rules(topology.node, rendered.script, runner))

    try:
        yield apply
    finally:
        asyncio.run(remove_policy_rules(topology.node, runner))


def reply(result: dict[str, Any]) -> str:
    assert "reply" in result, result
    return str(result["reply"])


def refused(result: dict[str, Any]) -> bool:
    """Refused at once (a TCP reset), not left to time out."""
    return result.get("error") == "ECONNREFUSED" and result["seconds"] < 1.0


def test_an_ingress_policy_opens_only_its_port_and_only_to_its_peers(topology: Topology, policies: Apply) -> None:
    srv = ADDRESSES["srv"]
    assert reply(topology.connect("oth", srv, 9090)) == f"srv hi from {ADDRESSES['oth']}"  # no policy: open
    policies([FROM_CLIENT_TO_HTTP])
    assert reply(topology.connect("cli", srv, 8080)) == f"srv hi from {ADDRESSES['cli']}"
    assert refused(topology.connect("cli", srv, 9090))
    assert refused(topology.connect("oth", srv, 8080))
    assert "error" in topology.connect("oth", srv, 8053, "udp")  # ICMP admin-prohibited (or nothing back)
    # pods the policy does not select stay open
    assert reply(topology.connect("oth", ADDRESSES["cli"], 8080)) == f"cli hi from {ADDRESSES['oth']}"


def test_the_node_itself_still_reaches_an_isolated_pod(topology: Topology, policies: Apply) -> None:
    policies([policy("deny-all", "httpbin", ingress=[])])
    assert reply(topology.connect("node", ADDRESSES["srv"], 9090)) == f"srv hi from {GATEWAY}"
    assert refused(topology.connect("cli", ADDRESSES["srv"], 8080))


def test_replies_to_an_isolated_pods_own_connections_pass(topology: Topology, policies: Apply) -> None:
    policies([policy("deny-all", "httpbin", ingress=[])])
    # the server opens a connection out: its reply comes back in, to a pod that admits nothing new
    assert reply(topology.connect("srv", ADDRESSES["oth"], 8080)) == f"oth hi from {ADDRESSES['srv']}"
    assert reply(topology.connect("srv", ADDRESSES["oth"], 8053, "udp")) == f"oth hi from {ADDRESSES['srv']}"


def test_an_egress_policy_blocks_a_pods_other_connections(topology: Topology, policies: Apply) -> None:
    policies([CLIENT_TO_SERVER_ONLY])
    assert reply(topology.connect("cli", ADDRESSES["srv"], 9090)) == f"srv hi from {ADDRESSES['cli']}"
    assert refused(topology.connect("cli", ADDRESSES["oth"], 8080))
    assert reply(topology.connect("oth", ADDRESSES["cli"], 8080)) == f"cli hi from {ADDRESSES['oth']}"  # ingress open


def test_a_policy_judges_the_endpoint_behind_a_service(topology: Topology, policies: Apply) -> None:
    """The Service table DNATs in prerouting; the policy sees the endpoint pod and its target port."""
    runner = SubprocessRunner()
    svc = {"metadata": {"namespace": "default", "name": "web"}, "spec": {"clusterIP": VIP, "ports": [{"port": 80}]}}
    slice_ = {
        "metadata": {"namespace": "default", "name": "web-a", "labels": {"kubernetes.io/service-name": "web"}},
        "addressType": "IPv4",
        "ports": [{"port": 8080}],
        "endpoints": [{"addresses": [ADDRESSES["srv"]]}],
    }
    services = render_service_rules([svc], [slice_], node_pod_cidr=PODS, node_gateway=GATEWAY, bridge_netfilter=True)
    asyncio.run(apply_rules(topology.node, services.script, runner))
    try:
        policies([FROM_CLIENT_TO_HTTP])
        assert reply(topology.connect("cli", VIP, 80)) == f"srv hi from {ADDRESSES['cli']}"
        # dropped: a reset would come from the endpoint's address, untranslatable for an unconfirmed connection
        assert topology.connect("oth", VIP, 80)["error"] == "TimeoutError"
    finally:
        asyncio.run(remove_rules(topology.node, runner))


# -- PolicyAgent: API server → informers → nft in the node -------------------------------------------------------


@pytest.fixture
async def kube(tmp_path: Path) -> AsyncIterator[KubeClient]:
    async with (
        ApiServer(ApiServerSettings(data_dir=tmp_path / "api", port=0, crd_dir=None)) as server,
        KubeClient.from_kubeconfig(server.kubeconfig) as client,
    ):
        yield client


async def test_the_policy_agent_follows_the_cluster_in_a_node(topology: Topology, kube: KubeClient) -> None:
    fast = PolicyAgentSettings(debounce=0.02, informer=InformerSettings(backoff_initial=0.05, watch_timeout=30))
    agent = PolicyAgent(kube, netns=topology.node, node_name=NODE, node_sources=(GATEWAY,), settings=fast)

    async def connect() -> dict[str, Any]:
        return await asyncio.to_thread(topology.connect, "oth", ADDRESSES["srv"], 8080)

    async def until(predicate: Callable[[dict[str, Any]], bool]) -> dict[str, Any]:
        async with asyncio.timeout(10):
            while not predicate(result := await connect()):  # noqa: ASYNC110 (polls the network)
                await asyncio.sleep(0.05)
        return result

    for role in ADDRESSES:
        created = await kube.create(kinds.PODS, pod(role))
        await kube.patch_status(kinds.PODS, created["metadata"]["name"], {"status": pod(role)["status"]}, "default")
    try:
        await agent.start()
        assert "reply" in await connect()
        await kube.create(kinds.NETWORK_POLICIES, FROM_CLIENT_TO_HTTP)
        assert refused(await until(lambda r: "error" in r))
        await kube.delete(kinds.NETWORK_POLICIES, "from-client", "default")
        await until(lambda r: "reply" in r)
    finally:
        await agent.aclose()
    assert TABLE not in topology.tables()
