"""A dual-stack lab (``ambit lab up --ip-family dual``, kind's ``networking.ipFamily: dual``) with the mesh: pods and
nodes get IPv4 and IPv6, a PreferDualStack Service two cluster IPs and a slice per family, and an ambient client
reaches an ambient server on the other node by the Service's IPv6 cluster IP and by its AAAA name through HBONE
over IPv6, with the SPIFFE identities checked in the destination proxy's metrics; IPv4 keeps working, and a
SingleStack Service gets one family.

One lab of its own for the module (the shared mesh lab is IPv4-only). Namespace ``ds-amb`` is ambient: ``server``
(http-echo on 8080) on node 1 behind Services ``dual`` (PreferDualStack) and ``single`` (the default), and
``client`` on node 2. The last test (TestWaypointDNS) adds namespace ``ds-ext`` outside the mesh, a DNS
ServiceEntry and a waypoint.
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
from tests.e2e.lab_driver import TEST_TIMEOUT, Lab, ambit, pod_manifest, running_lab, sleeper, wait_until

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


EXTERNAL_NS = "ds-ext"
EXTERNAL_HOST = "fake.external.com"  # upstream's MockExternal host


def test_waypoint_dns_reaches_a_dns_entry_over_each_family_without_then_with_a_waypoint(dual: DualLab) -> None:
    """TestWaypointDNS (u:tests/integration/ambient/waypoint_test.go:407-462), both legs, on the dual-stack lab: a
    ``resolution: DNS`` ServiceEntry ``external-service`` (``exportTo: [.]``, its endpoint the name of a dual-stack
    Service in namespace ``ds-ext``, outside the mesh, as upstream's external app is) is called by its host over
    IPv4 and over IPv6 (the client resolves A, then AAAA: the entry's addresses auto-allocated from 240.240.0.0/16
    and 2001:2::/48), first without a waypoint (L4: the node proxy resolves the endpoint's name in the family the
    client dialled, and the server sees the client's own address), then with the entry bound to a waypoint in the
    namespace (``istio.io/use-waypoint``: L7, ``x-request-id`` reaches the server, whose peer is the waypoint pod;
    the node proxy reaches the waypoint in the family the client dialled, so the waypoint serves HBONE on both).
    Each answer must come over the family the client used: upstream's ``SourceIPv4``/``SourceIPv6`` (which read
    the address the server saw) and ``DestinationIPv4`` on the v4 leg.

    What differs: upstream calls from every ambient app of its suite; here one client on the other node. The
    waypoint is deployed by this test (``ambit waypoint apply``), the module's lab having none; the shared mesh lab
    is IPv4-only, so the v6 leg needs this module's own lab."""
    lab = dual.lab
    n1 = lab.topology.node(1).name
    lab.namespace(EXTERNAL_NS)  # not ambient
    container = {
        "name": "http",
        "image": "none",
        "command": ["python3", "-m", "ambit.lab.apps", "http-echo", "--port", "8080"],
        "readinessProbe": {"tcpSocket": {"port": 8080}, "periodSeconds": 1},
    }
    external_service = {
        "apiVersion": "v1",
        "kind": "Service",
        "metadata": {"name": "external"},
        "spec": {
            "selector": {"app": "external"},
            "ports": [{"name": "http", "port": 80, "targetPort": 8080}],
            "ipFamilyPolicy": "PreferDualStack",
        },
    }
    lab.apply(pod_manifest("external", [container], node=n1), external_service, namespace=EXTERNAL_NS)
    entry = {
        "apiVersion": "networking.istio.io/v1",
        "kind": "ServiceEntry",
        "metadata": {"name": "external-service"},
        "spec": {
            "exportTo": ["."],
            "hosts": [EXTERNAL_HOST],
            "location": "MESH_EXTERNAL",
            "resolution": "DNS",
            "ports": [{"name": "http", "number": 80, "protocol": "HTTP"}],
            "endpoints": [{"address": f"external.{EXTERNAL_NS}.svc.cluster.local"}],
        },
    }
    lab.apply(entry, namespace=NS)
    allocated = {4: ipaddress.ip_network("240.240.0.0/16"), 6: ipaddress.ip_network("2001:2::/48")}
    try:
        lab.wait_pods_ready(EXTERNAL_NS, "", 1, timeout=90)

        def answered(family: int, l7: bool) -> dict[str, Any] | None:
            answer = dual.try_get(EXTERNAL_HOST, family)
            if answer is None or answer.get("pod") != "external":
                return None
            seen_l7 = any(k.lower() == "x-request-id" for k in answer.get("headers") or {})
            return answer if seen_l7 == l7 else None

        def peer(answer: dict[str, Any]) -> ipaddress.IPv4Address | ipaddress.IPv6Address:
            return ipaddress.ip_address(str(answer["client"]).rsplit(":", 1)[0])

        for family in (4, 6):
            answer = wait_until(
                f"IPv{family} without a waypoint", lambda family=family: answered(family, False), 60, 1.0
            )
            assert ipaddress.ip_address(answer["dialled"]) in allocated[family], answer["dialled"]
            assert str(peer(answer)) == dual.ips("client")[{4: 0, 6: 1}[family]], answer["client"]  # the client's own

        done = ambit("waypoint", "apply", "-n", NS, "--wait", "--kubeconfig", str(lab.topology.kubeconfig),
                     timeout=240)  # fmt: skip
        assert "applied" in done.stdout, done.stdout
        lab.kubectl("label", "serviceentry", "external-service", "-n", NS, "istio.io/use-waypoint=waypoint")
        (waypoint,) = lab.wait_pods_ready(NS, "gateway.networking.k8s.io/gateway-name=waypoint", 1, timeout=90)
        waypoint_ips = [ipaddress.ip_address(e["ip"]) for e in waypoint["status"]["podIPs"]]
        for family in (4, 6):
            answer = wait_until(
                f"IPv{family} through the waypoint", lambda family=family: answered(family, True), 90, 1.0
            )
            assert ipaddress.ip_address(answer["dialled"]) in allocated[family], answer["dialled"]
            assert peer(answer) in waypoint_ips and peer(answer).version == family, (answer["client"], waypoint_ips)
    finally:
        lab.kubectl("delete", "serviceentry", "external-service", "-n", NS, "--ignore-not-found")
        lab.kubectl("delete", "gateway", "waypoint", "-n", NS, "--ignore-not-found")
        lab.kubectl("delete", "namespace", EXTERNAL_NS, "--ignore-not-found", "--wait=false")
