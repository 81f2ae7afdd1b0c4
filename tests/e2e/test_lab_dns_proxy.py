"""The node proxy's DNS proxy on a 2-node lab (spec §9, §11.3 TestServiceEntryDNSWithAutoAssign): an enrolled pod
resolves ServiceEntry hosts, with and without explicit addresses, connects through the mesh to the endpoint behind
them, and the name fails again once the entry is deleted. A namespace-visible entry (``exportTo: ["."]``,
TestServiceEntryVisibility) resolves in its own namespace only; a ``resolution: DNS`` entry's hostname endpoint is
resolved on demand by the node proxy (from the lab's zone) and reached.

One lab for the module. Namespace ``dnsp`` is ambient: client ``cli`` (node 1) and server ``srv`` (node 2, tcp-echo
on 9000); namespace ``dnsq`` is ambient too, with client ``cli`` (node 1). The pod's queries go to whatever
nameserver its resolv.conf names: DNS capture sends port 53 to the node proxy's 15053 in the pod anyway, which
answers the entries' hosts from the mesh. A name the mesh does not know is forwarded to the pod's resolvers, which
do not know it either: it fails.
"""

from __future__ import annotations

import json
from collections.abc import Iterator
from dataclasses import dataclass
from typing import Any

import pytest
from tests.e2e.lab_driver import (
    LARGE_DNS_ANSWER,
    TEST_TIMEOUT,
    Lab,
    module_on_shared_lab,
    pod_manifest,
    sleeper,
    wait_until,
)

pytestmark = [pytest.mark.root, pytest.mark.kubectl, pytest.mark.timeout(TEST_TIMEOUT)]
SHARES_THE_MESH_LAB = True  # tests/e2e/lab_driver.py shared_mesh_lab: one lab for the modules that share it

NS = "dnsp"
OTHER = "dnsq"
EXPLICIT_VIP = "198.19.250.10"

RESOLVE_AND_CONNECT = """
import json, socket, sys
out = {}
for host in sys.argv[1:]:
    try:
        ip = socket.getaddrinfo(host, 9000, socket.AF_INET, socket.SOCK_STREAM)[0][4][0]
    except socket.gaierror as exc:
        out[host] = {"error": str(exc)}
        continue
    try:
        with socket.create_connection((ip, 9000), timeout=5) as s:
            s.settimeout(5)
            s.sendall(b"ping")
            echoed = s.recv(4).decode()
    except OSError as exc:
        echoed = f"error {exc}"
    out[host] = {"ip": ip, "echo": echoed}
print(json.dumps(out))
"""


def service_entry(
    name: str, host: str, server_ip: str, addresses: list[str] | None = None, **extra: Any
) -> dict[str, Any]:
    spec: dict[str, Any] = {
        "hosts": [host],
        "location": "MESH_EXTERNAL",
        "resolution": "STATIC",
        "ports": [{"number": 9000, "name": "tcp", "protocol": "TCP"}],
        "endpoints": [{"address": server_ip}],
        **extra,
    }
    if addresses:
        spec["addresses"] = addresses
    return {
        "apiVersion": "networking.istio.io/v1",
        "kind": "ServiceEntry",
        "metadata": {"name": name, "namespace": NS},
        "spec": spec,
    }


@dataclass
class DnsLab:
    lab: Lab
    server_ip: str

    def resolve(self, *hosts: str, namespace: str = NS) -> dict[str, dict[str, str]]:
        out = self.lab.exec("cli", namespace, "python3", "-c", RESOLVE_AND_CONNECT, *hosts, timeout=60)
        result: dict[str, dict[str, str]] = json.loads(out)
        return result


@pytest.fixture(scope="module")
def dns_lab(tmp_path_factory: pytest.TempPathFactory) -> Iterator[DnsLab]:
    with module_on_shared_lab(tmp_path_factory) as lab:
        n1, n2 = (node.name for node in lab.topology.all_nodes())
        for ns in (NS, OTHER):
            lab.namespace(ns)
            lab.kubectl("label", "namespace", ns, "istio.io/dataplane-mode=ambient")
        server = {
            "name": "echo",
            "image": "none",
            "command": ["python3", "-m", "ambit.lab.apps", "tcp-echo", "--port", "9000"],
            "readinessProbe": {"tcpSocket": {"port": 9000}, "periodSeconds": 1},
        }
        lab.apply(
            pod_manifest("srv", [server], node=n2),
            pod_manifest("cli", [sleeper()], node=n1),
            namespace=NS,
        )
        lab.apply(pod_manifest("cli", [sleeper()], node=n1), namespace=OTHER)
        lab.wait_pods_ready(NS, "", 2, timeout=90)
        lab.wait_pods_ready(OTHER, "", 1, timeout=90)
        yield DnsLab(lab, lab.pod("srv", NS)["status"]["podIP"])
        assert lab.log_tracebacks() == []


def test_service_entry_hosts_resolve_in_an_enrolled_pod_and_connect_through_the_mesh(dns_lab: DnsLab) -> None:
    lab = dns_lab.lab
    lab.apply(
        service_entry("auto", "api.example.com", dns_lab.server_ip),
        service_entry("explicit", "explicit.example.com", dns_lab.server_ip, [EXPLICIT_VIP]),
        namespace=NS,
    )

    def allocated() -> str | None:
        entry = lab.get("serviceentry", "auto", "-n", NS)
        v4 = [a["value"] for a in (entry.get("status") or {}).get("addresses") or () if ":" not in a["value"]]
        return v4[0] if v4 else None

    auto_vip = wait_until("an allocated address on the ServiceEntry", allocated, timeout=30)
    assert auto_vip.startswith("240.240.")
    expected = {
        "api.example.com": {"ip": auto_vip, "echo": "ping"},
        "explicit.example.com": {"ip": EXPLICIT_VIP, "echo": "ping"},
    }

    def answered() -> bool:
        return dns_lab.resolve(*expected) == expected

    wait_until("both hosts resolved and reached through the mesh", answered, timeout=60, interval=1.0)
    metrics = lab.node_proxy_metrics(lab.topology.all_nodes()[0].name)
    assert "istio_dns_requests_total{" in metrics

    lab.kubectl("delete", "serviceentry", "auto", "-n", NS)

    def gone() -> bool:
        return "error" in dns_lab.resolve("api.example.com")["api.example.com"]

    wait_until("the deleted entry's host no longer resolves", gone, timeout=60, interval=1.0)
    assert dns_lab.resolve("explicit.example.com") == {"explicit.example.com": expected["explicit.example.com"]}


def test_a_namespace_visible_entry_resolves_in_its_own_namespace_only(dns_lab: DnsLab) -> None:
    lab = dns_lab.lab
    lab.apply(service_entry("private", "private.example.com", dns_lab.server_ip, exportTo=["."]), namespace=NS)

    def own() -> bool:
        return dns_lab.resolve("private.example.com")["private.example.com"].get("echo") == "ping"

    wait_until("the namespace-visible host resolved and reached in its namespace", own, timeout=60, interval=1.0)
    other = dns_lab.resolve("private.example.com", namespace=OTHER)["private.example.com"]
    assert "error" in other, other  # dropped by the DNS proxy: forwarded, and nothing upstream knows it


def test_a_dns_entry_reaches_its_hostname_endpoint_resolved_on_demand(dns_lab: DnsLab) -> None:
    lab = dns_lab.lab
    patch = json.dumps({"data": {"echo.lab.example": dns_lab.server_ip}})
    lab.kubectl("patch", "configmap", "lab-dns-zone", "-n", "kube-system", "--type=merge", "-p", patch)
    entry = service_entry("by-name", "byname.example.com", "echo.lab.example", resolution="DNS")
    lab.apply(entry, namespace=NS)

    def reached() -> bool:
        return dns_lab.resolve("byname.example.com")["byname.example.com"].get("echo") == "ping"

    wait_until("the DNS entry reached through its hostname endpoint", reached, timeout=90, interval=1.0)
    metrics = lab.node_proxy_metrics(lab.topology.all_nodes()[0].name)
    assert "istio_on_demand_dns_total " in metrics and "istio_on_demand_dns_total 0.0" not in metrics


def test_a_workload_entry_named_by_a_host_name_is_reached_through_a_dns_entry(dns_lab: DnsLab) -> None:
    """TestServiceEntrySelectsWorkloadEntry "DNS hostname": a WorkloadEntry whose address is a name, selected by a
    DNS ServiceEntry, is an endpoint the node proxy resolves when it picks it."""
    lab = dns_lab.lab
    patch = json.dumps({"data": {"echo.lab.example": dns_lab.server_ip}})
    lab.kubectl("patch", "configmap", "lab-dns-zone", "-n", "kube-system", "--type=merge", "-p", patch)
    workload_entry = {
        "apiVersion": "networking.istio.io/v1",
        "kind": "WorkloadEntry",
        "metadata": {"name": "vm-by-name", "namespace": NS},
        "spec": {"address": "echo.lab.example", "ports": {"tcp": 9000}, "labels": {"app": "vm-by-name"}},
    }
    entry = service_entry("selects-vm", "vm.example.com", "unused", resolution="DNS")
    del entry["spec"]["endpoints"]
    entry["spec"]["workloadSelector"] = {"labels": {"app": "vm-by-name"}}
    lab.apply(workload_entry, entry, namespace=NS)

    def reached() -> bool:
        return dns_lab.resolve("vm.example.com")["vm.example.com"].get("echo") == "ping"

    wait_until("the WorkloadEntry reached through its host name", reached, timeout=90, interval=1.0)


def test_a_forwarded_answer_too_large_for_udp_is_truncated_and_whole_over_tcp(dns_lab: DnsLab) -> None:
    """An enrolled pod's query for a name the mesh does not know goes to the node proxy's DNS proxy (captured) and on
    to the pod's resolvers: 60 addresses do not fit plain UDP's 512 bytes, so the pod gets TC over UDP, the whole
    answer over TCP, and its own resolver (glibc) retries over TCP by itself."""
    lab = dns_lab.lab
    addresses = [f"198.18.249.{n}" for n in range(1, 61)]
    patch = json.dumps({"data": {"many.lab.example": " ".join(addresses)}})
    lab.kubectl("patch", "configmap", "lab-dns-zone", "-n", "kube-system", "--type=merge", "-p", patch)
    try:

        def answered() -> dict[str, Any] | None:
            out = lab.exec("cli", NS, "python3", "-c", LARGE_DNS_ANSWER, "many.lab.example", timeout=60)
            answer: dict[str, Any] = json.loads(out)
            return answer if answer["tcp"] == sorted(addresses) and answer["resolver"] == sorted(addresses) else None

        answer = wait_until("the large answer over TCP", answered, timeout=60, interval=1.0)
        assert answer == {"udp_truncated": True, "tcp": sorted(addresses), "resolver": sorted(addresses)}
    finally:  # the zone is the lab's: later modules on the shared lab must not find this name
        removal = json.dumps({"data": {"many.lab.example": None}})
        lab.kubectl("patch", "configmap", "lab-dns-zone", "-n", "kube-system", "--type=merge", "-p", removal)
