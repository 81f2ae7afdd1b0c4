"""The HBONE data path on a 2-node lab with the mesh (spec §6, §11.1): what a user of ambient mode relies on.

One lab for the module. Namespace ``hb-amb`` is ambient: servers ``srv-1`` (node 1) and ``srv-2`` (node 2), both
behind Service ``echo``, and a client ``cli-1`` on node 1. Namespace ``hb-plain`` is not in the mesh: a server on
node 2 and a client on node 1. Each server pod runs http-echo (8080), tcp-echo (9000) and server-first (9100).
"""

from __future__ import annotations

import json
import os
import re
import signal
import subprocess
import time
from collections.abc import Iterator
from dataclasses import dataclass
from typing import Any

import pytest
from tests.e2e.hbone_peer import node_connect, workload_files
from tests.e2e.lab_driver import (
    TEST_TIMEOUT,
    Lab,
    ambit,
    module_on_shared_lab,
    pod_manifest,
    service_manifest,
    sleeper,
    wait_until,
)

from ambit import ISTIO_VERSION

pytestmark = [pytest.mark.root, pytest.mark.kubectl, pytest.mark.timeout(TEST_TIMEOUT)]
SHARES_THE_MESH_LAB = True  # tests/e2e/lab_driver.py shared_mesh_lab: one lab for the modules that share it

AMBIENT, PLAIN = "hb-amb", "hb-plain"
MARKER = "ambit-plaintext-marker-7f3c"


def _server(name: str, node: str, labels: dict[str, str]) -> dict[str, Any]:
    apps = [("http", "http-echo", 8080), ("tcp", "tcp-echo", 9000), ("first", "server-first", 9100)]
    containers = [
        {"name": cname, "image": "none", "command": ["python3", "-m", "ambit.lab.apps", app, "--port", str(port)]}
        for cname, app, port in apps
    ]
    containers[0]["readinessProbe"] = {"tcpSocket": {"port": 8080}, "periodSeconds": 1}
    return pod_manifest(name, containers, node=node, labels=labels)


@dataclass
class Mesh:
    lab: Lab
    ips: dict[str, str]
    vip: str

    def run(self, pod: str, namespace: str, script: str, *args: str, timeout: float = 20.0) -> str:
        """Run a Python script in the pod's network namespace; its stdout."""
        return self.lab.exec(pod, namespace, "python3", "-c", script, *args, timeout=timeout)

    def node_ip(self, index: int) -> str:
        """The address of node ``index``'s node proxy (its ztunnel pod's)."""
        return self.lab.node_proxy_address(self.lab.topology.node(index).name)

    def metrics(self, index: int) -> str:
        return self.lab.node_proxy_metrics(self.lab.topology.node(index).name)


HTTP_GET = """
import json, sys, urllib.request
req = urllib.request.Request(sys.argv[1], headers={"X-Marker": sys.argv[2]})
with urllib.request.urlopen(req, timeout=5) as r:
    print(r.read().decode())
"""


@pytest.fixture(scope="module")
def mesh(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Mesh]:
    with module_on_shared_lab(tmp_path_factory) as lab:
        n1, n2 = (node.name for node in lab.topology.all_nodes())
        lab.namespace(AMBIENT)
        lab.kubectl("label", "namespace", AMBIENT, "istio.io/dataplane-mode=ambient")
        lab.namespace(PLAIN)
        lab.apply(
            _server("srv-1", n1, {"app": "echo"}),
            _server("srv-2", n2, {"app": "echo"}),
            pod_manifest("cli-1", [sleeper()], node=n1, labels={"app": "cli"}),
            service_manifest("echo", {"app": "echo"}, 80, 8080),
            namespace=AMBIENT,
        )
        lab.apply(
            _server("plain-srv", n2, {"app": "plain"}),
            pod_manifest("plain-cli", [sleeper()], node=n1, labels={"app": "plain-cli"}),
            namespace=PLAIN,
        )
        lab.wait_pods_ready(AMBIENT, "", 3, timeout=60)
        lab.wait_pods_ready(PLAIN, "", 2, timeout=60)
        ips = {p["metadata"]["name"]: p["status"]["podIP"] for ns in (AMBIENT, PLAIN) for p in lab.pods(ns)}
        vip = lab.get("service", "echo", "-n", AMBIENT)["spec"]["clusterIP"]

        def enrolled() -> bool:
            return all(
                (p["metadata"].get("annotations") or {}).get("ambient.istio.io/redirection") == "enabled"
                for p in lab.pods(AMBIENT)
            )

        wait_until("every ambient pod enrolled", enrolled, timeout=30)
        mesh = Mesh(lab, ips, vip)
        # The node proxies learn the workloads from the lab's config file: wait until a call goes through.
        wait_until(
            "cli-1 reaches srv-2 through the mesh",
            lambda: _try(mesh, "cli-1", AMBIENT, f"http://{ips['srv-2']}:8080/warmup"),
            timeout=30,
        )
        yield mesh
        assert lab.log_tracebacks() == []


def _try(mesh: Mesh, pod: str, namespace: str, url: str) -> dict[str, Any] | None:
    try:
        return _get(mesh, pod, namespace, url)
    except (AssertionError, ValueError):
        return None


def _get(mesh: Mesh, pod: str, namespace: str, url: str) -> dict[str, Any]:
    answer: dict[str, Any] = json.loads(mesh.run(pod, namespace, HTTP_GET, url, MARKER))
    return answer


def _client_ip(answer: dict[str, Any]) -> str:
    return str(answer["client"]).rsplit(":", 1)[0]


def test_cross_node_call_by_pod_ip_is_mutual_tls_on_the_wire_and_keeps_the_client_ip(mesh: Mesh) -> None:
    capture = subprocess.Popen(
        ["tcpdump", "-i", mesh.lab.topology.bridge, "-nn", "-A", "-l", "-U", "tcp and net 198.18.0.0/15"],
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
    )
    try:
        # tcpdump says "listening on <link>" on stderr once it has attached: no sleep that assumes a speed.
        assert capture.stderr is not None
        wait_until("tcpdump attached", lambda: "listening on" in capture.stderr.readline(), timeout=30)
        answer = _get(mesh, "cli-1", AMBIENT, f"http://{mesh.ips['srv-2']}:8080/secret")
        time.sleep(0.5)
    finally:
        capture.send_signal(signal.SIGINT)
        out, _ = capture.communicate(timeout=10)
    assert answer["pod"] == "srv-2"
    assert answer["headers"].get("X-Marker") == MARKER
    assert _client_ip(answer) == mesh.ips["cli-1"]
    packets = [line for line in out.splitlines() if " IP " in line and " > " in line]
    between_pods = [p for p in packets if mesh.ips["srv-2"] in p]
    assert between_pods, "the capture saw no traffic to the server pod"
    assert all(f"{mesh.ips['srv-2']}.15008" in p for p in between_pods), between_pods[:5]
    assert MARKER not in out
    assert "/secret" not in out


def test_both_node_proxies_report_the_spiffe_principals_with_mutual_tls(mesh: Mesh) -> None:
    _get(mesh, "cli-1", AMBIENT, f"http://{mesh.ips['srv-2']}:8080/metrics-check")
    principal = f'source_principal="spiffe://cluster.local/ns/{AMBIENT}/sa/default"'

    def reported(index: int, reporter: str) -> bool:
        text = mesh.metrics(index)
        return any(
            line.startswith("istio_tcp_connections_opened_total{")
            and f'reporter="{reporter}"' in line
            and principal in line
            and f'destination_principal="spiffe://cluster.local/ns/{AMBIENT}/sa/default"' in line
            and 'connection_security_policy="mutual_tls"' in line
            for line in text.splitlines()
        )

    wait_until("node 1 reports as source", lambda: reported(1, "source"), timeout=10)
    wait_until("node 2 reports as destination", lambda: reported(2, "destination"), timeout=10)


def test_a_service_vip_spreads_connections_over_endpoints_on_both_nodes(mesh: Mesh) -> None:
    seen = {_get(mesh, "cli-1", AMBIENT, f"http://{mesh.vip}:80/")["pod"] for _ in range(12)}
    assert seen == {"srv-1", "srv-2"}


def test_same_node_pods_talk_and_keep_the_client_ip(mesh: Mesh) -> None:
    answer = _get(mesh, "cli-1", AMBIENT, f"http://{mesh.ips['srv-1']}:8080/local")
    assert answer["pod"] == "srv-1"
    assert _client_ip(answer) == mesh.ips["cli-1"]


def test_enrolled_client_reaches_an_unenrolled_server_in_plaintext(mesh: Mesh) -> None:
    answer = _get(mesh, "cli-1", AMBIENT, f"http://{mesh.ips['plain-srv']}:8080/out")
    assert answer["pod"] == "plain-srv"
    assert _client_ip(answer) == mesh.ips["cli-1"]


def test_unenrolled_client_reaches_an_enrolled_server_through_inbound_plaintext(mesh: Mesh) -> None:
    answer = _get(mesh, "plain-cli", PLAIN, f"http://{mesh.ips['srv-2']}:8080/in")
    assert answer["pod"] == "srv-2"
    assert _client_ip(answer) == mesh.ips["plain-cli"]


HALF_CLOSE = """
import socket, sys
s = socket.create_connection((sys.argv[1], int(sys.argv[2])), timeout=5)
payload = b"x" * 300000
s.sendall(payload)
s.shutdown(socket.SHUT_WR)
got = bytearray()
while chunk := s.recv(65536):
    got += chunk
print(len(got), bytes(got) == payload)
"""


def test_half_close_from_the_client_still_delivers_the_whole_reply(mesh: Mesh) -> None:
    for target in ("srv-2", "srv-1", "plain-srv"):
        out = mesh.run("cli-1", AMBIENT, HALF_CLOSE, mesh.ips[target], "9000")
        assert out.split() == ["300000", "True"], target


SERVER_FIRST = """
import socket, sys
s = socket.create_connection((sys.argv[1], int(sys.argv[2])), timeout=5)
print(s.recv(1024).decode().strip())
"""


def test_a_server_first_protocol_works_through_the_tunnel(mesh: Mesh) -> None:
    assert mesh.run("cli-1", AMBIENT, SERVER_FIRST, mesh.ips["srv-2"], "9100").strip() == "HELLO from srv-2"


KEEPALIVE = """
import http.client, json, sys
conn = http.client.HTTPConnection(sys.argv[1], 8080, timeout=5)
clients = set()
for i in range(50):
    conn.request("GET", f"/r{i}")
    clients.add(json.loads(conn.getresponse().read())["client"])
print(len(clients))
"""


def test_many_http_requests_share_one_connection(mesh: Mesh) -> None:
    assert mesh.run("cli-1", AMBIENT, KEEPALIVE, mesh.ips["srv-2"]).strip() == "1"


SELF_CALL = """
import socket, sys
results = []
for host, port in [(sys.argv[1], 15001), ("127.0.0.1", 15001), (sys.argv[1], 15006), ("127.0.0.1", 15006),
                   (sys.argv[1], 15008), (sys.argv[2], 15000), ("127.0.0.1", 15000)]:
    try:
        s = socket.create_connection((host, port), timeout=3)
        s.sendall(b"GET / HTTP/1.0\\r\\n\\r\\n")
        data = s.recv(100)
        results.append(f"{host}:{port}=" + ("closed" if not data else "answered"))
    except OSError as exc:
        results.append(f"{host}:{port}=refused")
print(" ".join(results))
"""


def test_calls_to_the_proxy_own_ports_and_admin_are_refused(mesh: Mesh) -> None:
    out = mesh.run("cli-1", AMBIENT, SELF_CALL, mesh.ips["cli-1"], mesh.node_ip(1))
    results = dict(item.split("=") for item in out.split())
    assert "answered" not in results.values(), results
    assert results[f"{mesh.node_ip(1)}:15000"] == "refused"


FETCH = """
import sys, urllib.request
with urllib.request.urlopen(sys.argv[1], timeout=5) as r:
    print(r.status, r.read().decode()[:4000])
"""


def test_a_meshed_pod_scrapes_a_node_proxys_metrics_over_hbone(mesh: Mesh) -> None:
    """TestZtunnelSecureMetrics: the ztunnel pods carry networking.istio.io/tunnel: http, so a meshed client's call
    to a node proxy's 15020 is a tunnel to its self-proxy listener, reported as mutual TLS to the ztunnel."""
    address = mesh.node_ip(2)
    out = wait_until(
        "cli-1 reads node-2's node proxy metrics",
        lambda: _try_text(mesh, "cli-1", AMBIENT, f"http://{address}:15020/metrics"),
        timeout=30,
    )
    assert out.startswith("200 ") and "# TYPE" in out
    source = f'source_principal="spiffe://cluster.local/ns/{AMBIENT}/sa/default"'

    def reported() -> bool:
        return any(
            line.startswith("istio_tcp_connections_opened_total{")
            and 'reporter="destination"' in line
            and source in line
            and 'destination_workload="ztunnel"' in line
            and 'destination_principal="spiffe://cluster.local/ns/istio-system/sa/ztunnel"' in line
            and 'connection_security_policy="mutual_tls"' in line
            # the canonical labels of the ztunnel pods, from app.kubernetes.io/name and /version as Istio's chart
            and 'destination_canonical_service="ztunnel"' in line
            and f'destination_canonical_revision="{ISTIO_VERSION}"' in line
            for line in mesh.metrics(2).splitlines()
        )

    wait_until("node-2 reports the scrape as a mutual-TLS connection to the ztunnel", reported, timeout=15)


def _try_text(mesh: Mesh, pod: str, namespace: str, url: str) -> str | None:
    try:
        return mesh.run(pod, namespace, FETCH, url)
    except AssertionError:
        return None


def test_ztunnel_config_reads_a_node_proxy_pod_as_istioctl_zc_does(mesh: Mesh) -> None:
    """TestZtunnelConfig: ``zc all <ztunnel pod> --namespace istio-system -o json`` and each section alone."""
    lab = mesh.lab
    (pod,) = [p for p in lab.pods("istio-system", "app=ztunnel") if p["spec"]["nodeName"] == "node-1"]
    name, where = pod["metadata"]["name"], ("--lab-dir", str(lab.directory))
    dump = json.loads(ambit("zc", "all", name, "--namespace", "istio-system", "-o", "json", *where).stdout)
    assert all(dump.get(key) is not None for key in ("services", "workloads", "policies", "certificates")), dump
    assert mesh.ips["cli-1"] in {address for w in dump["workloads"] for address in w.get("workloadIps", [])}
    for section in ("services", "workloads", "policies", "certificates"):
        entries = json.loads(ambit("zc", section, f"{name}.istio-system", "-o", "json", *where).stdout)
        assert isinstance(entries, list), (section, entries)


def test_the_node_proxy_config_dump_shows_workloads_and_certificates(mesh: Mesh) -> None:
    dump = json.loads(mesh.lab.node_proxy_admin(mesh.lab.topology.node(1).name, "/config_dump"))
    names = {w["name"] for w in dump["workloads"]}
    assert {"srv-1", "srv-2", "cli-1"} <= names
    identities = {c["identity"] for c in dump["certificates"]}
    assert f"spiffe://cluster.local/ns/{AMBIENT}/sa/default" in identities
    assert re.match(r"\d{4}-", dump["certificates"][0]["certChain"][0]["expirationTime"])
    # The lab runs the deployed DaemonSet: HBONE on the socket transport, with the native TLS records in CI.
    assert dump["config"]["tlsTransport"] == "socket", dump["config"]
    if os.environ.get("CI") == "true":  # with the DATA frames of attached streams in C (AMBIT_NATIVE_DATA=1)
        assert dump["config"]["tlsRecords"].startswith("native"), dump["config"]
        assert "HBONE DATA frames in C" in dump["config"]["tlsRecords"], dump["config"]


def test_nodejs_http2_stack_tunnels_through_15008_with_a_workload_certificate(mesh: Mesh, tmp_path: Any) -> None:
    files = workload_files(tmp_path, mesh.lab.topology.mesh_ca_dir, AMBIENT, "default", "mesh")
    srv = mesh.ips["srv-2"]
    out = node_connect(srv, f"{srv}:8080", files)
    status, _, body = out.partition(" 200 ")
    assert status == "status", out
    answer = json.loads(body)
    assert answer["pod"] == "srv-2"
    assert answer["path"] == "/from-node"


def test_a_connect_whose_authority_is_another_ip_gets_400(mesh: Mesh, tmp_path: Any) -> None:
    files = workload_files(tmp_path, mesh.lab.topology.mesh_ca_dir, AMBIENT, "default", "mesh")
    assert node_connect(mesh.ips["srv-2"], f"{mesh.ips['srv-1']}:8080", files) == "status 400"


def test_a_client_certificate_from_another_root_is_refused(mesh: Mesh, tmp_path: Any) -> None:
    files = workload_files(tmp_path, tmp_path / "other-ca", AMBIENT, "default", "other")
    files[2] = str(mesh.lab.topology.mesh_ca_dir / "root.crt")  # the client trusts the mesh; the mesh must not trust it
    out = node_connect(mesh.ips["srv-2"], f"{mesh.ips['srv-2']}:8080", files)
    assert out.startswith(("error", "closed without an answer")), out
