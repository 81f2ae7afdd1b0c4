"""Istio's TestServices port matrix (tests/integration/ambient/baseline_test.go:202-273, ``allCalls`` :119-142): every
source x destination x port of the echo app's common ports (pkg/test/framework/components/echo/common/ports), each
called by the Service's name, with upstream's expectation per cell:

- ``L7`` (the server saw ``X-Request-Id``) when a waypoint is on the path and the call's scheme is HTTP or gRPC
  (``supportsL7``, baseline_test.go:156-168: the port's protocol is HTTP or GRPC, ``auto-*`` included since the
  call sends HTTP, except ``tcp-for-http``, whose Service port name declares TCP); ``L4`` otherwise (TCP, HTTPS,
  server-first);
- a workload-addressed waypoint is bypassed when calling by Service (``L4``), and an uncaptured client bypasses every
  waypoint (``L4``);
- ``http-localhost`` (an app bound to 127.0.0.1 only): an error or a 503, never the app's answer;
- no ``X-Envoy-Peer-Metadata`` reaches the app;
- the original source IP is kept on every path without a waypoint (upstream checks it in its multi-network run,
  ``OriginalSourceCheck``, baseline_test.go:214-223; it notes that a waypoint does not keep it, so paths through
  one are not checked).

``auto-tcp-server`` is served (Istio's echo serves it) and called on paths without a waypoint; upstream's
``allCalls`` leaves it out (a server-first protocol on a port whose protocol is sniffed), so the service
waypoint's cell is not judged.

Runs on the shared mesh lab: namespace ``ambient`` with one ``multi-echo`` pod per destination serving every port
(``captured``: no waypoint; ``service-addressed-waypoint``: its Service labelled for a waypoint ``--for service``;
``workload-addressed-waypoint``: its pod labelled for a waypoint ``--for workload``), Services with upstream's port
names and numbers, a captured ``client`` and an uncaptured ``uncaptured``. The clients and ``captured`` are on
node-1, the two others on node-2: an original source is checked across nodes and on one node (where the node's
Service rules must not SNAT the caller). Each row (source x destination) is one
``lab exec`` running all its calls in one Python process.
"""

from __future__ import annotations

import json
from collections.abc import Iterator
from typing import Any

import pytest
from tests.e2e.lab_driver import TEST_TIMEOUT, Lab, ambit, module_on_shared_lab, pod_manifest, sleeper, wait_until

pytestmark = [pytest.mark.root, pytest.mark.kubectl, pytest.mark.timeout(TEST_TIMEOUT)]
SHARES_THE_MESH_LAB = True  # tests/e2e/lab_driver.py shared_mesh_lab: one lab for the modules that share it

NS = "ambient"
CAPTURED, SERVICE_WP, WORKLOAD_WP = "captured", "service-addressed-waypoint", "workload-addressed-waypoint"
DESTINATIONS = (CAPTURED, SERVICE_WP, WORKLOAD_WP)
SOURCES = ("client", "uncaptured")

PORTS: tuple[tuple[str, int, int, str], ...] = (
    # Service port name (upstream's, as its Service template writes them), port, target, multi-echo listener
    ("http", 80, 18080, "http:18080"),
    ("grpc", 7070, 17070, "grpc:17070"),
    ("http2", 85, 18085, "http:18085"),
    ("tcp", 9090, 19090, "tcp:19090"),
    ("https", 443, 18443, "https:18443"),
    ("tcp-server", 9091, 16060, "server-first:16060"),
    ("auto-tcp", 9092, 19091, "tcp:19091"),
    ("auto-tcp-server", 9093, 16061, "server-first:16061"),
    ("auto-http", 81, 18081, "http:18081"),
    ("auto-grpc", 7071, 17071, "grpc:17071"),
    ("auto-https", 9443, 19443, "https:19443"),
    ("http-instance", 82, 18082, "http:18082@pod"),
    ("http-localhost", 84, 18084, "http:18084@127.0.0.1"),
    ("tcp-for-http", 86, 18086, "http:18086"),
)
CALL_KIND = {"http": "http", "https": "https", "grpc": "grpc", "tcp": "tcp", "server-first": "server-first"}
L7_PORTS = frozenset({"http", "grpc", "http2", "auto-http", "auto-grpc", "http-instance"})
"""Ports whose call upstream's ``supportsL7`` counts as L7 (scheme HTTP or gRPC; not ``tcp-for-http``)."""
COUNT = 2

CALLS = """
import json, socket, ssl, sys, urllib.error, urllib.request
import grpc
calls, count = json.loads(sys.argv[1]), int(sys.argv[2])
TIMEOUT = 5
context = ssl.SSLContext(ssl.PROTOCOL_TLS_CLIENT)
context.check_hostname, context.verify_mode = False, ssl.CERT_NONE

def seen(answer, status):
    headers = {k.lower(): v for k, v in (answer.get("headers") or {}).items()}
    return {"status": status, "client": answer.get("client", "").rsplit(":", 1)[0], "pod": answer.get("pod", ""),
            "l7": "x-request-id" in headers, "peer_metadata": "x-envoy-peer-metadata" in headers}

def call_http(host, port, tls):
    url = f"{'https' if tls else 'http'}://{host}:{port}/"
    try:
        with urllib.request.urlopen(url, timeout=TIMEOUT, context=context if tls else None) as r:
            return seen(json.loads(r.read()), r.status)
    except urllib.error.HTTPError as exc:
        return {"status": exc.code, "error": f"HTTP {exc.code}"}

def call_grpc(host, port):
    with grpc.insecure_channel(f"{host}:{port}") as channel:
        try:
            return seen(json.loads(channel.unary_unary("/echo.Echo/Who")(b"", timeout=TIMEOUT)), 200)
        except grpc.RpcError as exc:
            return {"status": 0, "error": f"gRPC {exc.code().name}: {exc.details()}"}

def call_tcp(host, port, server_first):
    with socket.create_connection((host, port), timeout=TIMEOUT) as conn:
        stream = conn.makefile("rb")
        if server_first and not stream.readline().startswith(b"HELLO from "):
            return {"status": 0, "error": "no banner"}
        conn.sendall(b"whoami\\n")
        line = stream.readline()
        if not line:
            return {"status": 0, "error": "closed without an answer"}
        return seen(json.loads(line), 200)

out = {}
for name, kind, host, port in calls:
    results = []
    for _ in range(count):
        try:
            if kind in ("http", "https"):
                results.append(call_http(host, port, kind == "https"))
            elif kind == "grpc":
                results.append(call_grpc(host, port))
            else:
                results.append(call_tcp(host, port, kind == "server-first"))
        except Exception as exc:
            results.append({"status": 0, "error": f"{type(exc).__name__}: {exc}"})
    out[name] = results
print(json.dumps(out))
"""


def multi_echo_container() -> dict[str, Any]:
    listen = [arg for *_, spec in PORTS for arg in ("--listen", spec)]
    return {
        "name": "echo",
        "image": "none",
        "command": ["python3", "-m", "ambit.lab.apps", "multi-echo", *listen, "--hostname", "echo.example"],
        "readinessProbe": {"tcpSocket": {"port": 18080}, "periodSeconds": 1},
    }


def echo_service(name: str, labels: dict[str, str] | None = None) -> dict[str, Any]:
    ports = [{"name": n, "port": port, "targetPort": target} for n, port, target, _ in PORTS]
    return {
        "apiVersion": "v1",
        "kind": "Service",
        "metadata": {"name": name, "labels": {"app": name, **(labels or {})}},
        "spec": {"selector": {"app": name}, "ports": ports},
    }


@pytest.fixture(scope="module")
def lab(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Lab]:
    with module_on_shared_lab(tmp_path_factory) as up:
        up.namespace(NS)
        up.kubectl("label", "namespace", NS, "istio.io/dataplane-mode=ambient")
        kubeconfig = str(up.topology.kubeconfig)
        for name, kind in (("waypoint", "service"), ("workload-waypoint", "workload")):
            ambit("waypoint", "apply", "-n", NS, "--name", name, "--for", kind, "--kubeconfig", kubeconfig)
        wl_labels = {"app": WORKLOAD_WP, "istio.io/use-waypoint": "workload-waypoint"}
        uncaptured = {"app": "uncaptured", "istio.io/dataplane-mode": "none"}
        up.apply(
            pod_manifest(CAPTURED, [multi_echo_container()], node="node-1"),
            echo_service(CAPTURED),
            pod_manifest(SERVICE_WP, [multi_echo_container()], node="node-2"),
            echo_service(SERVICE_WP, {"istio.io/use-waypoint": "waypoint"}),
            pod_manifest(WORKLOAD_WP, [multi_echo_container()], labels=wl_labels, node="node-2"),
            echo_service(WORKLOAD_WP),
            pod_manifest("client", [sleeper()], labels={"app": "client"}, node="node-1"),
            pod_manifest("uncaptured", [sleeper()], labels=uncaptured, node="node-1"),
            namespace=NS,
        )
        up.wait_pods_ready(NS, "", 7, timeout=180)  # 5 of ours and the two waypoints
        yield up
        assert up.log_tracebacks() == []


def run_row(lab: Lab, source: str, destination: str) -> dict[str, list[dict[str, Any]]]:
    calls = [[name, CALL_KIND[spec.split(":")[0]], destination, port] for name, port, _, spec in PORTS]
    out = lab.exec(source, NS, "python3", "-c", CALLS, json.dumps(calls), str(COUNT), timeout=180)
    answers: dict[str, list[dict[str, Any]]] = json.loads(out)
    return answers


def through_waypoint(source: str, destination: str) -> bool:
    """Whether upstream expects the calls to pass a waypoint: a captured client calling a Service bound to a
    service waypoint (a workload waypoint is bypassed when calling by Service; an uncaptured client bypasses all)."""
    return source == "client" and destination == SERVICE_WP


def expected_cell(source: str, destination: str, port: str) -> str:
    if port == "http-localhost":
        return "refused"
    if through_waypoint(source, destination):
        return "L7" if port in L7_PORTS else "L4"
    return "L4 +src"


def cell(answers: list[dict[str, Any]], source_ip: str, check_source: bool) -> str:
    """What a cell's calls show: ``L7``/``L4`` when every call succeeded (+src when the server saw the source's own
    IP, checked only where no waypoint is on the path; +peer-metadata when a metadata-exchange header leaked),
    ``refused`` when every call failed or got a 503, else the answers themselves."""
    if all(a.get("status") == 200 for a in answers):
        layers = {"L7" if a.get("l7") else "L4" for a in answers}
        if len(layers) == 1:
            text = layers.pop()
            if check_source:
                clients = sorted({str(a.get("client")) for a in answers})
                text += " +src" if clients == [source_ip] else f" src={','.join(clients)}"
            if any(a.get("peer_metadata") for a in answers):
                text += " +peer-metadata"
            return text
    elif all(a.get("status") in (0, 503) for a in answers):
        return "refused"
    return f"mixed: {answers}"


@pytest.fixture(scope="module")
def waypoints_bound(lab: Lab) -> None:
    """The waypoints become ready and get their bindings in their own time: wait until the service waypoint carries
    the http port at L7, and the workload waypoint's pod answers the workload's pod IP at L7."""
    script = CALLS
    for destination, host in ((SERVICE_WP, SERVICE_WP), (WORKLOAD_WP, lab.pod(WORKLOAD_WP, NS)["status"]["podIP"])):
        calls = json.dumps([["http", "http", host, 80 if host == destination else 18080]])

        def l7(calls: str = calls) -> bool:
            answers = json.loads(lab.exec("client", NS, "python3", "-c", script, calls, "1", timeout=60))["http"]
            return all(a.get("status") == 200 and a.get("l7") for a in answers)

        wait_until(f"a waypoint carries {destination} at L7", l7, 120, 1.0)


@pytest.mark.parametrize("destination", DESTINATIONS)
@pytest.mark.parametrize("source", SOURCES)
def test_services_port_matrix(lab: Lab, waypoints_bound: None, source: str, destination: str) -> None:
    """One row of TestServices: every port of ``destination`` called by Service name from ``source``."""
    source_pod, destination_pod = lab.pod(source, NS), lab.pod(destination, NS)
    source_ip = source_pod["status"]["podIP"]
    placement = f"{source} {source_ip} on {source_pod['spec'].get('nodeName')}, {destination} "
    placement += f"{destination_pod['status']['podIP']} on {destination_pod['spec'].get('nodeName')}"
    check_source = not through_waypoint(source, destination)
    expected = {
        name: expected_cell(source, destination, name)
        for name, *_ in PORTS
        if not (name == "auto-tcp-server" and through_waypoint(source, destination))
    }
    seen: dict[str, str] = {}

    def matches() -> bool:
        answers = run_row(lab, source, destination)
        seen.clear()
        seen.update({name: cell(answers[name], source_ip, check_source) for name in expected})
        return seen == expected

    # Upstream retries each call for up to 10 s; a row is tried again (bounded) for the same reason.
    try:
        wait_until(f"{source} -> {destination}: every port as upstream expects", matches, 20, 2.0)
    except pytest.fail.Exception:
        wrong = {
            name: {"expected": want, "seen": seen.get(name)}
            for name, want in expected.items()
            if seen.get(name) != want
        }
        pytest.fail(
            f"{source} -> {destination}: {len(wrong)} of {len(expected)} ports differ: {json.dumps(wrong, indent=1)}"
        )
