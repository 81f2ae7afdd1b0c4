"""The node proxy's DNS proxy on a 2-node lab (spec §9, §11.3 TestServiceEntryDNSWithAutoAssign): an enrolled pod
resolves ServiceEntry hosts, with and without explicit addresses, connects through the mesh to the endpoint behind
them, and the name fails again once the entry is deleted.

One lab for the module. Namespace ``dnsp`` is ambient: client ``cli`` (node 1) and server ``srv`` (node 2, tcp-echo
on 9000). The pod's queries go to whatever nameserver its resolv.conf names: DNS capture sends port 53 to the node
proxy's 15053 in the pod anyway, which answers the entries' hosts from the mesh. A name the mesh does not know is
forwarded to the pod's resolvers, which nothing in the lab routes out: it fails.
"""

from __future__ import annotations

import json
from collections.abc import Iterator
from dataclasses import dataclass
from typing import Any

import pytest
from tests.e2e.lab_driver import TEST_TIMEOUT, Lab, module_on_shared_lab, pod_manifest, sleeper, wait_until

pytestmark = [pytest.mark.root, pytest.mark.kubectl, pytest.mark.timeout(TEST_TIMEOUT)]
SHARES_THE_MESH_LAB = True  # tests/e2e/lab_driver.py shared_mesh_lab: one lab for the modules that share it

NS = "dnsp"
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


def service_entry(name: str, host: str, server_ip: str, addresses: list[str] | None = None) -> dict[str, Any]:
    spec: dict[str, Any] = {
        "hosts": [host],
        "location": "MESH_EXTERNAL",
        "resolution": "STATIC",
        "ports": [{"number": 9000, "name": "tcp", "protocol": "TCP"}],
        "endpoints": [{"address": server_ip}],
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

    def resolve(self, *hosts: str) -> dict[str, dict[str, str]]:
        out = self.lab.exec("cli", NS, "python3", "-c", RESOLVE_AND_CONNECT, *hosts, timeout=60)
        result: dict[str, dict[str, str]] = json.loads(out)
        return result


@pytest.fixture(scope="module")
def dns_lab(tmp_path_factory: pytest.TempPathFactory) -> Iterator[DnsLab]:
    with module_on_shared_lab(tmp_path_factory) as lab:
        n1, n2 = (node.name for node in lab.topology.all_nodes())
        lab.namespace(NS)
        lab.kubectl("label", "namespace", NS, "istio.io/dataplane-mode=ambient")
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
        lab.wait_pods_ready(NS, "", 2, timeout=90)
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
