"""Cluster DNS on a real 2-node lab: pods resolve Services by their short, namespaced and full names through the
kube-dns Service (198.19.0.10) that ``ambit lab up`` installs, and connect; headless Services follow readiness; SRV
names named ports; the lab zone answers its names; ``dnsPolicy: None`` takes ``dnsConfig``; garbage and a flood
leave the server answering."""

from __future__ import annotations

import json
import sys
from collections.abc import Iterator

import pytest
from tests.e2e.lab_driver import (
    LARGE_DNS_ANSWER,
    TEST_TIMEOUT,
    Lab,
    http_echo_container,
    pod_manifest,
    service_manifest,
    sleeper,
    wait_until,
)

pytestmark = [pytest.mark.root, pytest.mark.kubectl, pytest.mark.timeout(TEST_TIMEOUT)]
SHARES_THE_MESH_LAB = True  # tests/e2e/conftest.py lab: the shared mesh lab (these namespaces are not in the mesh)

PY = sys.executable
CLUSTER_DNS = "198.19.0.10"

RESOLVE = """
import json, socket, sys
out = {}
for name in sys.argv[1:]:
    try:
        out[name] = sorted({a[4][0] for a in socket.getaddrinfo(name, None, socket.AF_INET, socket.SOCK_STREAM)})
    except OSError as exc:
        out[name] = str(exc)
print(json.dumps(out))
"""

SRV = """
import json, sys
import dns.resolver
answer = dns.resolver.resolve(sys.argv[1], "SRV")
print(json.dumps(sorted(f"{r.port} {r.target}" for r in answer)))
"""

FLOOD = """
import os, socket, sys, time
import dns.message, dns.query
server = (sys.argv[1], 53)
good = dns.message.make_query(sys.argv[2], "A").to_wire()
garbage = [b"", b"\\x00", os.urandom(12), b"\\x12\\x34\\x81\\x80" + bytes(8)]
garbage.append(b"\\x00\\x01\\x00\\x00\\x00\\x09" + b"\\xc0" * 200)
sock = socket.socket(socket.AF_INET, socket.SOCK_DGRAM)
for i in range(4000):
    sock.sendto(garbage[i % len(garbage)] if i % 2 else good, server)
for i in range(200):
    sock.sendto(os.urandom(1 + i % 300), server)
# half-open and oversized TCP connections
held = [socket.create_connection(server, timeout=5) for _ in range(20)]
big = socket.create_connection(server, timeout=5)
big.sendall((60000).to_bytes(2, "big") + bytes(100))
print("closed" if big.recv(10) == b"" else "open")
for s in held:
    s.close()
answer = dns.query.tcp(dns.message.make_query(sys.argv[2], "A"), sys.argv[1], timeout=5)
print(" ".join(sorted(rd.to_text() for rrset in answer.answer for rd in rrset)))
"""


def run_py(lab: Lab, pod: str, namespace: str, script: str, *args: str) -> str:
    return lab.exec(pod, namespace, PY, "-c", script, *args, timeout=60).strip()


def resolve(lab: Lab, pod: str, namespace: str, *names: str) -> dict[str, object]:
    result: dict[str, object] = json.loads(run_py(lab, pod, namespace, RESOLVE, *names))
    return result


def http_ok(lab: Lab, pod: str, namespace: str, url: str) -> bool:
    out = lab.exec(pod, namespace, PY, "-m", "ambit.lab.apps", "client", "--url", url, "--count", "1", timeout=30)
    return " ok " in out


@pytest.fixture(scope="module")
def served(lab: Lab) -> Iterator[str]:
    """A namespace with an HTTP echo behind Service ``server`` (port 80, named ``p``) and a client pod."""
    namespace = "e2e-dns"
    lab.namespace(namespace)
    lab.apply(
        pod_manifest("server", [http_echo_container()], node="node-1"),
        service_manifest("server", {"app": "server"}, 80, 8080),
        pod_manifest("client", [sleeper()], node="node-2"),
        namespace=namespace,
    )
    lab.wait_pods_ready(namespace, "app in (server,client)", 2, timeout=60)
    try:
        yield namespace
    finally:
        lab.delete_namespace(namespace)


def test_cluster_dns_runs_at_its_fixed_address(lab: Lab) -> None:
    service = lab.get("service", "kube-dns", "-n", "kube-system")
    assert service["spec"]["clusterIP"] == CLUSTER_DNS
    lab.wait_pods_ready("kube-system", "k8s-app=kube-dns", 1)


def test_a_pod_resolves_and_connects_by_short_namespaced_and_full_names(lab: Lab, served: str) -> None:
    ns = served
    vip = lab.get("service", "server", "-n", ns)["spec"]["clusterIP"]
    resolv = lab.exec("client", ns, "cat", "/etc/resolv.conf")
    assert f"search {ns}.svc.cluster.local svc.cluster.local cluster.local" in resolv
    assert f"nameserver {CLUSTER_DNS}" in resolv and "options ndots:5" in resolv
    names = ("server", f"server.{ns}", f"server.{ns}.svc.cluster.local")
    assert resolve(lab, "client", ns, *names) == {name: [vip] for name in names}
    for name in names:
        assert wait_until(f"http://{name}/", lambda name=name: http_ok(lab, "client", ns, f"http://{name}/"), 30)
    missing = resolve(lab, "client", ns, "nothing-here", "www.example.org")
    assert all(isinstance(v, str) for v in missing.values()), missing


def test_a_headless_service_answers_every_ready_pod_and_drops_one_that_turns_unready(lab: Lab, served: str) -> None:
    ns = served
    gated = {
        "name": "main",
        "image": "none",
        "command": ["sh", "-c", "touch /tmp/ready; exec sleep 3600"],
        "readinessProbe": {"exec": {"command": ["test", "-f", "/tmp/ready"]}, "periodSeconds": 1},
    }
    headless = service_manifest("db", {"app": "db"}, 5432, 5432)
    headless["spec"]["clusterIP"] = "None"
    lab.apply(
        pod_manifest("db-0", [gated], labels={"app": "db"}, node="node-1"),
        pod_manifest("db-1", [gated], labels={"app": "db"}, node="node-2"),
        headless,
        namespace=ns,
    )
    pods = lab.wait_pods_ready(ns, "app=db", 2, timeout=60)
    ips = sorted(p["status"]["podIP"] for p in pods)
    name = f"db.{ns}.svc.cluster.local"
    wait_until("both endpoints", lambda: resolve(lab, "client", ns, name)[name] == ips, 30)

    lab.exec("db-1", ns, "rm", "/tmp/ready")
    kept = [p["status"]["podIP"] for p in pods if p["metadata"]["name"] == "db-0"]
    wait_until("the unready pod dropped", lambda: resolve(lab, "client", ns, name)[name] == kept, 30)


def test_srv_names_a_named_port(lab: Lab, served: str) -> None:
    ns = served
    answer = json.loads(run_py(lab, "client", ns, SRV, f"_p._tcp.server.{ns}.svc.cluster.local"))
    assert answer == [f"80 server.{ns}.svc.cluster.local."]


def test_the_lab_zone_answers_its_names(lab: Lab, served: str) -> None:
    ns = served
    server_ip = lab.pod("server", ns)["status"]["podIP"]
    patch = json.dumps({"data": {"api.example.com": server_ip}})
    lab.kubectl("patch", "configmap", "lab-dns-zone", "-n", "kube-system", "--type=merge", "-p", patch)
    try:
        wait_until(
            "api.example.com",
            lambda: resolve(lab, "client", ns, "api.example.com")["api.example.com"] == [server_ip],
            30,
        )
        assert http_ok(lab, "client", ns, "http://api.example.com:8080/")
    finally:  # the zone is the lab's: later modules on the shared lab must not find this name
        removal = json.dumps({"data": {"api.example.com": None}})
        lab.kubectl("patch", "configmap", "lab-dns-zone", "-n", "kube-system", "--type=merge", "-p", removal)


def test_a_large_answer_is_truncated_over_udp_and_whole_over_tcp(lab: Lab, served: str) -> None:
    """60 addresses (about 1 KiB of answer) do not fit the 512 bytes of plain UDP: the server sets TC, the whole
    answer comes over TCP, and the pod's own resolver (glibc) retries over TCP by itself."""
    ns = served
    addresses = [f"198.18.250.{n}" for n in range(1, 61)]
    patch = json.dumps({"data": {"many.example.com": " ".join(addresses)}})
    lab.kubectl("patch", "configmap", "lab-dns-zone", "-n", "kube-system", "--type=merge", "-p", patch)
    try:
        wait_until(
            "many.example.com",
            lambda: resolve(lab, "client", ns, "many.example.com")["many.example.com"] == sorted(addresses),
            30,
        )
        answer = json.loads(run_py(lab, "client", ns, LARGE_DNS_ANSWER, "many.example.com", CLUSTER_DNS))
        assert answer == {"udp_truncated": True, "tcp": sorted(addresses), "resolver": sorted(addresses)}
    finally:  # the zone is the lab's: later modules on the shared lab must not find this name
        removal = json.dumps({"data": {"many.example.com": None}})
        lab.kubectl("patch", "configmap", "lab-dns-zone", "-n", "kube-system", "--type=merge", "-p", removal)


def test_dns_policy_none_takes_the_dns_config(lab: Lab, served: str) -> None:
    ns = served
    config = {
        "nameservers": [CLUSTER_DNS],
        "searches": [f"{ns}.svc.cluster.local", "lab.example"],
        "options": [{"name": "ndots", "value": "2"}],
    }
    lab.apply(pod_manifest("custom", [sleeper()], dnsPolicy="None", dnsConfig=config), namespace=ns)
    lab.wait_pods_ready(ns, "app=custom", 1, timeout=60)
    assert lab.exec("custom", ns, "cat", "/etc/resolv.conf") == (
        f"search {ns}.svc.cluster.local lab.example\nnameserver {CLUSTER_DNS}\noptions ndots:2\n"
    )
    vip = lab.get("service", "server", "-n", ns)["spec"]["clusterIP"]
    assert resolve(lab, "custom", ns, "server") == {"server": [vip]}


def test_garbage_and_a_flood_leave_the_server_answering(lab: Lab, served: str) -> None:
    ns = served
    vip = lab.get("service", "server", "-n", ns)["spec"]["clusterIP"]
    (before,) = lab.pods("kube-system", "k8s-app=kube-dns")
    out = run_py(lab, "client", ns, FLOOD, CLUSTER_DNS, f"server.{ns}.svc.cluster.local").splitlines()
    assert out == ["closed", vip]
    name = f"server.{ns}.svc.cluster.local"
    wait_until("answers after the flood", lambda: resolve(lab, "client", ns, name)[name] == [vip], 30)
    (after,) = lab.pods("kube-system", "k8s-app=kube-dns")
    assert after["metadata"]["uid"] == before["metadata"]["uid"]
    assert after["status"]["containerStatuses"][0]["restartCount"] == 0
