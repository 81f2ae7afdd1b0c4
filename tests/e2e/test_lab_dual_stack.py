"""A dual-stack lab (``ambit lab up --ip-family dual``, kind's ``networking.ipFamily: dual``) with the mesh: pods and
nodes get IPv4 and IPv6, a PreferDualStack Service two cluster IPs and a slice per family, and an ambient client
reaches an ambient server on the other node by the Service's IPv6 cluster IP and by its AAAA name through HBONE
over IPv6, with the SPIFFE identities checked in the destination proxy's metrics; IPv4 keeps working, and a
SingleStack Service gets one family.

One lab of its own for the module (the shared mesh lab is IPv4-only). Namespace ``ds-amb`` is ambient: ``server``
(http-echo on 8080) on node 1 behind Services ``dual`` (PreferDualStack) and ``single`` (the default), and
``client`` on node 2.
"""

from __future__ import annotations

import ipaddress
import json
import select
import signal
import subprocess
from collections.abc import Iterator
from dataclasses import dataclass
from typing import Any

import pytest
from tests.e2e.lab_driver import TEST_TIMEOUT, Lab, pod_manifest, running_lab, sleeper, wait_until

pytestmark = [pytest.mark.root, pytest.mark.kubectl, pytest.mark.timeout(TEST_TIMEOUT)]

NS = "ds-amb"
ID = f"spiffe://cluster.local/ns/{NS}/sa/default"
MARKER = "ambit-dual-stack-marker-5e1d"

# GET over the family asked for: a name is resolved with getaddrinfo in that family only (AAAA for 6), so the
# answer says which address the client dialled; the body is http-echo's JSON plus that address.
HTTP_GET = """
import http.client, json, socket, sys
host, family, path, marker = sys.argv[1], sys.argv[2], sys.argv[3], sys.argv[4]
fam = socket.AF_INET6 if family == "6" else socket.AF_INET
address = socket.getaddrinfo(host, 80, fam, socket.SOCK_STREAM)[0][4][0]
conn = http.client.HTTPConnection(address, 80, timeout=5)
conn.request("GET", path, headers={"X-Marker": marker})
body = json.loads(conn.getresponse().read())
print(json.dumps({**body, "dialled": address}))
"""
RESOLVE = """
import json, socket, sys
out = {}
for family, fam in (("4", socket.AF_INET), ("6", socket.AF_INET6)):
    try:
        out[family] = sorted({a[4][0] for a in socket.getaddrinfo(sys.argv[1], 80, fam, socket.SOCK_STREAM)})
    except OSError:
        out[family] = []
print(json.dumps(out))
"""


@dataclass
class DualLab:
    lab: Lab
    pods: dict[str, dict[str, Any]]

    def ips(self, pod: str) -> list[str]:
        return [entry["ip"] for entry in self.pods[pod]["status"]["podIPs"]]

    def service(self, name: str) -> dict[str, Any]:
        spec: dict[str, Any] = self.lab.get("service", name, "-n", NS)["spec"]
        return spec

    def get(self, host: str, family: int, path: str = "/") -> dict[str, Any]:
        out = self.lab.exec("client", NS, "python3", "-c", HTTP_GET, host, str(family), path, MARKER, timeout=20)
        answer: dict[str, Any] = json.loads(out)
        return answer

    def try_get(self, host: str, family: int) -> dict[str, Any] | None:
        try:
            return self.get(host, family)
        except (AssertionError, ValueError):
            return None


def _server(node: str) -> dict[str, Any]:
    container = {
        "name": "http",
        "image": "none",
        "command": ["python3", "-m", "ambit.lab.apps", "http-echo", "--port", "8080"],
        "readinessProbe": {"tcpSocket": {"port": 8080}, "periodSeconds": 1},
    }
    return pod_manifest("server", [container], node=node, labels={"app": "server"})


def _service(name: str, **spec: Any) -> dict[str, Any]:
    return {
        "apiVersion": "v1",
        "kind": "Service",
        "metadata": {"name": name},
        "spec": {"selector": {"app": "server"}, "ports": [{"name": "http", "port": 80, "targetPort": 8080}], **spec},
    }


@pytest.fixture(scope="module")
def dual(tmp_path_factory: pytest.TempPathFactory) -> Iterator[DualLab]:
    with running_lab(tmp_path_factory.mktemp("e2e-ds"), mesh=True, ip_family="dual") as lab:
        lab.wait_mesh_ready()
        n1, n2 = (node.name for node in lab.topology.all_nodes())
        lab.namespace(NS)
        lab.kubectl("label", "namespace", NS, "istio.io/dataplane-mode=ambient")
        lab.apply(
            _server(n1),
            pod_manifest("client", [sleeper()], node=n2, labels={"app": "client"}),
            _service("dual", ipFamilyPolicy="PreferDualStack"),
            _service("single"),
            namespace=NS,
        )
        lab.wait_pods_ready(NS, "", 2, timeout=90)

        def enrolled() -> bool:
            return all(
                (p["metadata"].get("annotations") or {}).get("ambient.istio.io/redirection") == "enabled"
                for p in lab.pods(NS)
            )

        wait_until("both pods enrolled", enrolled, timeout=60)
        pods = {p["metadata"]["name"]: p for p in lab.pods(NS)}
        dual = DualLab(lab, pods)
        v6_vip = dual.service("dual")["clusterIPs"][1]
        wait_until("the client reaches the server by the IPv6 VIP", lambda: dual.try_get(v6_vip, 6), timeout=60)
        yield dual
        assert lab.log_tracebacks() == []


def test_pods_and_nodes_have_both_families_ipv4_first(dual: DualLab) -> None:
    for pod in ("server", "client"):
        assert [ipaddress.ip_address(ip).version for ip in dual.ips(pod)] == [4, 6]
        assert dual.pods[pod]["status"]["podIP"] == dual.ips(pod)[0]
    for node in dual.lab.items("nodes"):
        cidrs = node["spec"]["podCIDRs"]
        assert [ipaddress.ip_network(c).version for c in cidrs] == [4, 6] and node["spec"]["podCIDR"] == cidrs[0]
        internal = [a["address"] for a in node["status"]["addresses"] if a["type"] == "InternalIP"]
        assert [ipaddress.ip_address(a).version for a in internal] == [4, 6]


def test_a_prefer_dual_stack_service_gets_two_cluster_ips_and_a_slice_per_family(dual: DualLab) -> None:
    spec = dual.service("dual")
    assert spec["ipFamilyPolicy"] == "PreferDualStack" and spec["ipFamilies"] == ["IPv4", "IPv6"]
    v4, v6 = spec["clusterIPs"]
    assert spec["clusterIP"] == v4
    assert ipaddress.ip_address(v4) in ipaddress.ip_network("198.19.0.0/16")
    assert ipaddress.ip_address(v6) in ipaddress.ip_network("fd00:ab:ffff::/108")
    slices = dual.lab.items("endpointslices", "-n", NS, "-l", "kubernetes.io/service-name=dual")
    by_family = {s["addressType"]: [a for e in s.get("endpoints") or [] for a in e["addresses"]] for s in slices}
    assert by_family == {"IPv4": [dual.ips("server")[0]], "IPv6": [dual.ips("server")[1]]}


def test_a_single_stack_service_gets_one_ipv4_cluster_ip_one_slice_and_no_aaaa(dual: DualLab) -> None:
    spec = dual.service("single")
    assert spec["ipFamilyPolicy"] == "SingleStack" and spec["ipFamilies"] == ["IPv4"]
    assert len(spec["clusterIPs"]) == 1 and ipaddress.ip_address(spec["clusterIP"]).version == 4
    slices = dual.lab.items("endpointslices", "-n", NS, "-l", "kubernetes.io/service-name=single")
    assert [s["addressType"] for s in slices] == ["IPv4"]
    resolved = json.loads(dual.lab.exec("client", NS, "python3", "-c", RESOLVE, "single", timeout=20))
    assert resolved == {"4": [spec["clusterIP"]], "6": []}


def test_the_control_plane_sends_both_addresses_of_the_workload_and_the_service(dual: DualLab) -> None:
    node = dual.lab.topology.node(2).name

    def pushed() -> bool:
        dump = json.loads(dual.lab.node_proxy_admin(node, "/config_dump"))
        workload = [w for w in dump["workloads"] if w["name"] == "server" and w["namespace"] == NS]
        service = [s for s in dump["services"] if s["name"] == "dual" and s["namespace"] == NS]
        if not workload or not service:
            return False
        ips = " ".join(workload[0]["workloadIps"])
        vips = " ".join(service[0]["vips"])
        return all(ip in ips for ip in dual.ips("server")) and all(
            v in vips for v in dual.service("dual")["clusterIPs"]
        )

    wait_until("the client's node proxy holds both families", pushed, timeout=30)


def test_the_ipv6_cluster_ip_reaches_the_server_through_hbone_over_ipv6_with_both_identities(dual: DualLab) -> None:
    v6_vip = dual.service("dual")["clusterIPs"][1]
    server_v6 = dual.ips("server")[1]
    metrics_node = dual.lab.topology.node(1).name
    # --immediate-mode: libpcap hands each packet over at once, not after its buffer timeout, so the packets of
    # the request are read (and waited for below) before tcpdump is stopped.
    argv = ["tcpdump", "-i", dual.lab.topology.bridge, "-nn", "-A", "-l", "-U", "--immediate-mode", "ip6 and tcp"]
    capture = subprocess.Popen(argv, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    seen: list[str] = []

    def tunnel_seen() -> bool:
        assert capture.stdout is not None
        while select.select([capture.stdout], [], [], 0.2)[0]:
            line = capture.stdout.readline()
            if not line:
                break
            seen.append(line)
        return any(f"{server_v6}.15008" in line for line in seen)

    try:
        assert capture.stderr is not None
        wait_until("tcpdump attached", lambda: "listening on" in capture.stderr.readline(), timeout=30)
        answer = dual.get(v6_vip, 6, "/six")
        wait_until("the tunnel's packets captured", tunnel_seen, timeout=20)
    finally:
        capture.send_signal(signal.SIGINT)
        rest, _ = capture.communicate(timeout=10)
    out = "".join(seen) + rest
    assert answer["pod"] == "server" and answer["dialled"] == v6_vip
    assert answer["client"].rsplit(":", 1)[0] == dual.ips("client")[1]  # the client's own IPv6 address, kept
    assert answer["headers"].get("X-Marker") == MARKER
    packets = [line for line in out.splitlines() if " IP6 " in line and " > " in line]
    to_server = [p for p in packets if f"{server_v6}." in p]
    assert to_server, "the capture saw no IPv6 traffic to the server pod"
    assert all(f"{server_v6}.15008" in p for p in to_server), to_server[:5]  # HBONE only, never 8080
    assert MARKER not in out  # the request crossed the nodes encrypted

    def reported() -> bool:
        return any(
            line.startswith("istio_tcp_connections_opened_total{")
            and 'reporter="destination"' in line
            and f'source_principal="{ID}"' in line
            and f'destination_principal="{ID}"' in line
            and 'connection_security_policy="mutual_tls"' in line
            for line in dual.lab.node_proxy_metrics(metrics_node).splitlines()
        )

    wait_until("the server's node proxy reports both SPIFFE identities", reported, timeout=20)


def test_the_aaaa_name_resolves_to_the_ipv6_cluster_ip_and_connects_through_the_mesh(dual: DualLab) -> None:
    v4_vip, v6_vip = dual.service("dual")["clusterIPs"]
    resolved = json.loads(dual.lab.exec("client", NS, "python3", "-c", RESOLVE, "dual", timeout=20))
    assert resolved == {"4": [v4_vip], "6": [v6_vip]}
    answer = dual.get(f"dual.{NS}.svc.cluster.local", 6, "/aaaa")
    assert answer["dialled"] == v6_vip and answer["pod"] == "server"
    assert answer["client"].rsplit(":", 1)[0] == dual.ips("client")[1]


def test_ipv4_still_reaches_the_server_by_both_services_and_keeps_the_client_ipv4(dual: DualLab) -> None:
    for name in ("dual", "single"):
        answer = dual.get(name, 4, "/four")
        assert answer["pod"] == "server" and answer["dialled"] == dual.service(name)["clusterIP"]
        assert answer["client"].rsplit(":", 1)[0] == dual.ips("client")[0]
