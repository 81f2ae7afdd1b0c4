"""Waypoints end to end on the lab (issue 17, "Done when"): a namespace enrolled in a waypoint with ``ambit waypoint
apply --enroll-namespace`` has its Service traffic carried at L7 by the waypoint pod the control plane deployed:
requests carry ``x-request-id``, the waypoint's metrics count them with ``reporter="waypoint"`` (relabelled per
Service by a Telemetry, spec §11.3 TestCustomizeMetrics), an HTTPRoute splits traffic by header and by weight, and
removing the label brings the traffic back to L4.

One lab for the module, the mesh installed from deploy/. Namespace ``wp-app`` is ambient: Deployments ``echo-v1``
(two replicas) and ``echo-v2`` (one), Service ``echo`` over both and Services ``echo-v1``/``echo-v2`` over each,
a gRPC Deployment ``grpc-echo`` (two replicas) with its Service (port ``grpc``), and a client pod.
"""

from __future__ import annotations

import contextlib
import ipaddress
import json
import subprocess
import sys
import time
import urllib.request
from collections import Counter
from collections.abc import Callable, Iterator
from typing import Any

import pytest
import yaml
from tests.e2e.lab_driver import (
    TEST_TIMEOUT,
    Lab,
    ambit,
    condition,
    http_echo_container,
    module_on_shared_lab,
    pod_manifest,
    sleeper,
    wait_until,
)
from tests.upstream_objects import customize_metrics_telemetry

pytestmark = [pytest.mark.root, pytest.mark.kubectl, pytest.mark.timeout(TEST_TIMEOUT)]
SHARES_THE_MESH_LAB = True  # tests/e2e/lab_driver.py shared_mesh_lab: one lab for the modules that share it

NS = "wp-app"
WAYPOINT = "gateway.networking.k8s.io/gateway-name=waypoint"

CALLS = """
import json, sys, urllib.request
url, count, header = sys.argv[1], int(sys.argv[2]), sys.argv[3]
out = []
for _ in range(count):
    request = urllib.request.Request(url)
    if header:
        name, _, value = header.partition(":")
        request.add_header(name, value)
    try:
        with urllib.request.urlopen(request, timeout=5) as r:
            answer = json.loads(r.read())
            headers = {k.lower(): v for k, v in answer["headers"].items()}
            rid = headers.get("x-request-id", "")
            custom = headers.get("istio-custom-header", "")
            out.append({"status": r.status, "pod": answer.get("pod", ""), "request_id": rid, "custom": custom})
    except Exception as exc:
        out.append({"status": getattr(exc, "code", 0), "error": type(exc).__name__})
print(json.dumps(out))
"""


GRPC_CALLS = """
import json, sys, asyncio
import grpc, grpc.aio
target, count = sys.argv[1], int(sys.argv[2])
async def main():
    async with grpc.aio.insecure_channel(target) as channel:  # one channel: one HTTP/2 connection
        say = channel.unary_unary("/echo.Echo/Say")
        pods = [(await say(b"hi", timeout=5)).decode().split(":")[0] for _ in range(count)]
        try:
            await say(b"fail", timeout=5)
            failed = {}
        except grpc.aio.AioRpcError as exc:
            failed = {"code": exc.code().name, "details": exc.details(), "trailers": dict(exc.trailing_metadata())}
    print(json.dumps({"pods": pods, "failed": failed}))
asyncio.run(main())
"""


# Calls given as JSON: each {"scheme": "http"|"https"|"tls", "host", "port", "path", "count", "headers", "sni"}; one
# connection per call. ``https`` is a GET over TLS the client starts itself (its SNI ``sni``, else the host), ``tls``
# the handshake alone. Each result: the status (0 on an error, 1 for a completed ``tls`` handshake), the pod and the
# request id the server saw, the ALPN it reports (``tls``: the server reported a TLS handshake), the HTTP version
# (``proto``) and PROXY line (``proxy``) it saw, and the common name of the certificate the client was shown.
PROBE = """
import http.client, json, socket, ssl, sys
from cryptography import x509
from cryptography.x509.oid import NameOID
def common_name(der):
    names = x509.load_der_x509_certificate(der).subject.get_attributes_for_oid(NameOID.COMMON_NAME)
    return names[0].value if names else ""
context = ssl.create_default_context()
context.check_hostname = False
context.verify_mode = ssl.CERT_NONE
context.set_alpn_protocols(["http/1.1"])
out = []
for call in json.loads(sys.argv[1]):
    for _ in range(call.get("count", 1)):
        row = {"status": 0, "pod": "", "request_id": "", "alpn": None, "cn": "", "proto": None, "proxy": None}
        row["tls"] = False
        try:
            host, port = call["host"], call["port"]
            connection = http.client.HTTPConnection(host, port, timeout=5)
            if call["scheme"] != "http":
                raw = socket.create_connection((host, port), timeout=5)
                tls = context.wrap_socket(raw, server_hostname=call.get("sni") or host)
                row["cn"] = common_name(tls.getpeercert(binary_form=True))
                if call["scheme"] == "tls":
                    tls.close()
                    row["status"] = 1
                    out.append(row)
                    continue
                connection.sock = tls
            connection.request("GET", call.get("path", "/"), headers=call.get("headers", {}))
            response = connection.getresponse()
            body = response.read()
            connection.close()
            row["status"] = response.status
            try:
                answer = json.loads(body)
            except ValueError:
                answer = {}
            seen = {k.lower(): v for k, v in (answer.get("headers") or {}).items()}
            row.update(pod=answer.get("pod", ""), request_id=seen.get("x-request-id", ""), alpn=answer.get("alpn"),
                       proto=answer.get("proto"), proxy=answer.get("proxy"), tls="alpn" in answer)
        except Exception as exc:
            row["error"] = f"{type(exc).__name__}: {exc}"
        out.append(row)
print(json.dumps(out))
"""


def probe(lab: Lab, *specs: dict[str, Any]) -> list[dict[str, Any]]:
    """Run :data:`PROBE` in the client pod: one result per connection, in order."""
    answers: list[dict[str, Any]] = json.loads(
        lab.exec("client", NS, "python3", "-c", PROBE, json.dumps(specs), timeout=120)
    )
    return answers


UNDISCOVERED = "e2e.ambit.dev/undiscovered"


@contextlib.contextmanager
def undiscovered(lab: Lab, *namespaces: str) -> Iterator[None]:
    """Hide ``namespaces`` from the mesh as upstream's install hides its external namespace: the mesh config's
    ``discoverySelectors`` admit every namespace but those labelled :data:`UNDISCOVERED`; the mesh config as it was
    is put back afterwards (the lab is shared)."""
    original = lab.get("configmap", "istio", "-n", "istio-system").get("data", {}).get("mesh", "")
    config = yaml.safe_load(original) or {}
    assert "discoverySelectors" not in config, config
    for namespace in namespaces:
        lab.kubectl("label", "namespace", namespace, f"{UNDISCOVERED}=true", "--overwrite")
    selectors = [{"matchExpressions": [{"key": UNDISCOVERED, "operator": "DoesNotExist"}]}]

    def set_mesh(text: str) -> None:
        patch = json.dumps({"data": {"mesh": text}})
        lab.kubectl("patch", "configmap", "istio", "-n", "istio-system", "--type", "merge", "-p", patch)

    set_mesh(json.dumps({**config, "discoverySelectors": selectors}))
    try:
        yield
    finally:
        set_mesh(original)


def deployment(name: str, version: str, replicas: int, container: dict[str, Any] | None = None) -> dict[str, Any]:
    labels = {"app": "echo", "version": version} if container is None else {"app": name}
    return {
        "apiVersion": "apps/v1",
        "kind": "Deployment",
        "metadata": {"name": name},
        "spec": {
            "replicas": replicas,
            "selector": {"matchLabels": labels},
            "template": {
                "metadata": {"labels": labels},
                "spec": {"terminationGracePeriodSeconds": 2, "containers": [container or http_echo_container(8080)]},
            },
        },
    }


def service(name: str, selector: dict[str, str], port: tuple[str, int, int] = ("http", 80, 8080)) -> dict[str, Any]:
    port_name, number, target = port
    return {
        "apiVersion": "v1",
        "kind": "Service",
        "metadata": {"name": name},
        "spec": {"selector": selector, "ports": [{"name": port_name, "port": number, "targetPort": target}]},
    }


GRPC_ECHO = {
    "name": "grpc",
    "image": "none",
    "command": ["python3", "-m", "ambit.lab.apps", "grpc-echo", "--port", "50051"],
    "readinessProbe": {"tcpSocket": {"port": 50051}, "periodSeconds": 1},
}


@pytest.fixture(scope="module")
def lab(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Lab]:
    with module_on_shared_lab(tmp_path_factory) as up:
        up.namespace(NS)
        up.kubectl("label", "namespace", NS, "istio.io/dataplane-mode=ambient")
        up.apply(
            deployment("echo-v1", "v1", 2),
            deployment("echo-v2", "v2", 1),
            service("echo", {"app": "echo"}),
            service("echo-v1", {"app": "echo", "version": "v1"}),
            service("echo-v2", {"app": "echo", "version": "v2"}),
            deployment("grpc-echo", "", 2, GRPC_ECHO),
            service("grpc-echo", {"app": "grpc-echo"}, ("grpc", 50051, 50051)),
            pod_manifest("client", [sleeper()], labels={"app": "client"}),
            namespace=NS,
        )
        up.wait_pods_ready(NS, "", 6, timeout=120)
        done = ambit(
            "waypoint", "apply", "-n", NS, "--enroll-namespace", "--wait", "--kubeconfig", str(up.topology.kubeconfig),
            timeout=240,
        )  # fmt: skip
        assert "applied" in done.stdout, done.stdout
        yield up
        assert up.log_tracebacks() == []


def calls(lab: Lab, url: str, count: int = 1, header: str = "") -> list[dict[str, Any]]:
    out = lab.exec("client", NS, "python3", "-c", CALLS, url, str(count), header, timeout=120)
    answers: list[dict[str, Any]] = json.loads(out)
    return answers


def vip(lab: Lab, name: str) -> str:
    return str(lab.get("service", name, "-n", NS)["spec"]["clusterIP"])


def waypoint_requests(lab: Lab, selector: str = WAYPOINT) -> int:
    """``istio_requests_total`` with reporter="waypoint", summed, from the waypoint pods' :15020."""
    pods = [p for p in lab.pods(NS, selector) if (p.get("status") or {}).get("podIP")]
    total = 0
    for pod in pods:
        with urllib.request.urlopen(f"http://{pod['status']['podIP']}:15020/metrics", timeout=5) as response:
            for line in response.read().decode().splitlines():
                if line.startswith("istio_requests_total{") and 'reporter="waypoint"' in line:
                    total += int(float(line.rsplit(" ", 1)[1]))
    return total


def test_service_traffic_goes_through_the_waypoint_at_l7(lab: Lab) -> None:
    gateway = lab.get("gateway", "waypoint", "-n", NS)
    assert condition(gateway, "Programmed").get("status") == "True", gateway.get("status")
    url = f"http://{vip(lab, 'echo')}/"

    def through_waypoint() -> list[dict[str, Any]] | None:
        answers = calls(lab, url, 3)
        return answers if all(a.get("request_id") for a in answers) else None

    answers = wait_until("requests to the Service carry x-request-id", through_waypoint, timeout=60, interval=1.0)
    assert all(a["status"] == 200 for a in answers), answers
    before = waypoint_requests(lab)
    calls(lab, url, 5)
    assert waypoint_requests(lab) >= before + 5
    bound = condition(lab.get("service", "echo", "-n", NS), "istio.io/WaypointBound")
    assert bound.get("status") == "True", bound
    # The deployed waypoint speaks HBONE on the socket TLS transport, as the node proxy does (its pod's environment).
    logs = lab.kubectl("logs", "-n", NS, "-l", WAYPOINT, "--tail=-1", check=False).stdout
    assert "TLS transport socket" in logs, logs[-2000:]


def test_requests_on_one_service_are_spread_over_its_endpoints(lab: Lab) -> None:
    answers = calls(lab, f"http://{vip(lab, 'echo-v1')}/", 20)
    pods = Counter(a["pod"] for a in answers)
    assert len(pods) == 2 and all(a["status"] == 200 for a in answers), pods


def test_a_destination_rule_round_robin_spreads_requests_evenly(lab: Lab) -> None:
    """TestDestinationRule's load-balancer setting, honoured by the waypoint: ``ROUND_ROBIN`` on ``echo`` (three
    pods) gives each pod exactly a third of 30 sequential requests; the rule is translated by the control plane
    and pushed to the waypoint pod over delta ADS."""
    rule = {
        "apiVersion": "networking.istio.io/v1",
        "kind": "DestinationRule",
        "metadata": {"name": "echo-round-robin"},
        "spec": {"host": "echo", "trafficPolicy": {"loadBalancer": {"simple": "ROUND_ROBIN"}}},
    }
    lab.apply(rule, namespace=NS)
    url = f"http://{vip(lab, 'echo')}/"

    def even() -> Counter[str] | None:
        answers = calls(lab, url, 30)
        pods = Counter(a["pod"] for a in answers)
        return pods if all(a["status"] == 200 for a in answers) and sorted(pods.values()) == [10, 10, 10] else None

    try:
        wait_until("30 requests split 10/10/10 over the three echo pods", even, timeout=90)
    finally:
        lab.kubectl("delete", "destinationrule", "echo-round-robin", "-n", NS, check=False)


HEADER_ROUTE = {
    "apiVersion": "gateway.networking.k8s.io/v1",
    "kind": "HTTPRoute",
    "metadata": {"name": "echo-by-header"},
    "spec": {
        "parentRefs": [{"group": "", "kind": "Service", "name": "echo", "port": 80}],
        "rules": [
            {
                "matches": [{"headers": [{"name": "x-version", "value": "v2"}]}],
                "backendRefs": [{"name": "echo-v2", "port": 80}],
            },
            {"backendRefs": [{"name": "echo-v1", "port": 80}]},
        ],
    },
}


def test_an_httproute_header_match_splits_traffic_between_two_deployments(lab: Lab) -> None:
    lab.apply(HEADER_ROUTE, namespace=NS)
    try:
        url = f"http://{vip(lab, 'echo')}/"
        v2 = {p["metadata"]["name"] for p in lab.pods(NS, "version=v2")}
        v1 = {p["metadata"]["name"] for p in lab.pods(NS, "version=v1")}

        def routed() -> bool:
            with_header = calls(lab, url, 4, "x-version:v2")
            without = calls(lab, url, 4)
            return {a.get("pod") for a in with_header} <= v2 and {a.get("pod") for a in without} <= v1

        wait_until("the header route applies", routed, timeout=60, interval=1.0)
        route = lab.get("httproute", "echo-by-header", "-n", NS)
        (parent,) = route["status"]["parents"]
        accepted = [c for c in parent["conditions"] if c["type"] == "Accepted"]
        assert accepted and accepted[0]["status"] == "True", parent
        assert parent["controllerName"] == "istio.io/gateway-controller"
    finally:
        lab.kubectl("delete", "httproute", "echo-by-header", "-n", NS, "--ignore-not-found")


# Istio's TestServerRouting "set header" VirtualService (tests/integration/ambient/baseline_test.go), with
# {{.Destination}} = echo; then TestTrafficSplit's header match, to the per-version Services (the subsets of a
# DestinationRule: test_traffic_split_by_subsets_at_the_waypoint below).
SET_HEADER = {
    "apiVersion": "networking.istio.io/v1",
    "kind": "VirtualService",
    "metadata": {"name": "route"},
    "spec": {
        "hosts": ["echo"],
        "http": [
            {
                "headers": {"request": {"add": {"istio-custom-header": "user-defined-value"}}},
                "route": [{"destination": {"host": "echo"}}],
            }
        ],
    },
}
HEADER_SPLIT = {
    **SET_HEADER,
    "spec": {
        "hosts": ["echo"],
        "http": [
            {
                "match": [{"headers": {"user": {"exact": "istio-custom-user"}}}],
                "route": [{"destination": {"host": "echo-v2"}}],
            },
            {"route": [{"destination": {"host": "echo-v1"}}]},
        ],
    },
}


def test_a_virtual_service_sets_a_header_then_splits_by_header_at_the_waypoint(lab: Lab) -> None:
    url = f"http://{vip(lab, 'echo')}/"
    lab.apply(SET_HEADER, namespace=NS)
    try:
        wait_until(
            "the VirtualService's header reaches the pods",
            lambda: all(a.get("custom") == "user-defined-value" for a in calls(lab, url, 4)),
            timeout=60,
            interval=1.0,
        )
        answers = calls(lab, url, 10)
        assert all(a["status"] == 200 and a["custom"] == "user-defined-value" for a in answers), answers
        lab.apply(HEADER_SPLIT, namespace=NS)
        v2 = {p["metadata"]["name"] for p in lab.pods(NS, "version=v2")}
        v1 = {p["metadata"]["name"] for p in lab.pods(NS, "version=v1")}

        def split() -> bool:
            with_header = calls(lab, url, 4, "user:istio-custom-user")
            without = calls(lab, url, 4)
            return {a.get("pod") for a in with_header} <= v2 and {a.get("pod") for a in without} <= v1

        wait_until("the header match applies", split, timeout=60, interval=1.0)
    finally:
        lab.kubectl("delete", "virtualservice", "route", "-n", NS, "--ignore-not-found")


# Istio's TestTrafficSplit, verbatim with {{.Destination}} = echo: a header match to subset v2, the rest to v1, and the
# DestinationRule that defines the subsets by the pods' version label.
TRAFFIC_SPLIT = {
    "apiVersion": "networking.istio.io/v1",
    "kind": "VirtualService",
    "metadata": {"name": "route"},
    "spec": {
        "hosts": ["echo"],
        "http": [
            {
                "match": [{"headers": {"user": {"exact": "istio-custom-user"}}}],
                "route": [{"destination": {"host": "echo", "subset": "v2"}}],
            },
            {"route": [{"destination": {"host": "echo", "subset": "v1"}}]},
        ],
    },
}
SUBSETS = {
    "apiVersion": "networking.istio.io/v1",
    "kind": "DestinationRule",
    "metadata": {"name": "dr"},
    "spec": {
        "host": "echo",
        "subsets": [{"name": "v1", "labels": {"version": "v1"}}, {"name": "v2", "labels": {"version": "v2"}}],
    },
}


def test_traffic_split_by_subsets_at_the_waypoint(lab: Lab) -> None:
    """TestTrafficSplit: every answer without the header comes from a v1 pod, with it from a v2 pod."""
    url = f"http://{vip(lab, 'echo')}/"
    v2 = {p["metadata"]["name"] for p in lab.pods(NS, "version=v2")}
    v1 = {p["metadata"]["name"] for p in lab.pods(NS, "version=v1")}
    assert v1 and v2
    lab.apply(TRAFFIC_SPLIT, namespace=NS)
    lab.apply(SUBSETS, namespace=NS)
    try:

        def split() -> bool:
            with_header = calls(lab, url, 5, "user:istio-custom-user")
            without = calls(lab, url, 5)
            if not all(a.get("status") == 200 for a in with_header + without):
                return False
            return {a.get("pod") for a in with_header} <= v2 and {a.get("pod") for a in without} <= v1

        wait_until("the subsets apply", split, timeout=60, interval=1.0)
        answers = calls(lab, url, 10)
        assert all(a["status"] == 200 and a.get("pod") in v1 for a in answers), answers
        # Upstream's TestServerRouting "subset": every answer from v1, however many calls.
        lab.apply(
            {**TRAFFIC_SPLIT, "spec": {**TRAFFIC_SPLIT["spec"], "http": TRAFFIC_SPLIT["spec"]["http"][1:]}},
            namespace=NS,
        )
        wait_until(
            "only subset v1 answers, header or not",
            lambda: {a.get("pod") for a in calls(lab, url, 5, "user:istio-custom-user")} <= v1,
            timeout=60,
            interval=1.0,
        )
    finally:
        lab.kubectl("delete", "virtualservice", "route", "-n", NS, "--ignore-not-found")
        lab.kubectl("delete", "destinationrule", "dr", "-n", NS, "--ignore-not-found")


def test_weights_90_10_hold_within_a_few_percent(lab: Lab) -> None:
    weighted = json.loads(json.dumps(HEADER_ROUTE))
    weighted["metadata"]["name"] = "echo-weighted"
    weighted["spec"]["rules"] = [
        {"backendRefs": [{"name": "echo-v1", "port": 80, "weight": 90}, {"name": "echo-v2", "port": 80, "weight": 10}]}
    ]
    lab.apply(weighted, namespace=NS)
    try:
        url = f"http://{vip(lab, 'echo')}/"
        v2 = {p["metadata"]["name"] for p in lab.pods(NS, "version=v2")}
        wait_until("the weighted route applies", lambda: any(a.get("pod") in v2 for a in calls(lab, url, 20)), 60, 1)
        answers = calls(lab, url, 400)
        share = sum(a.get("pod") in v2 for a in answers) / len(answers)
        assert 0.05 <= share <= 0.15, share
    finally:
        lab.kubectl("delete", "httproute", "echo-weighted", "-n", NS, "--ignore-not-found")


def test_a_tcp_route_with_weights_splits_connections_at_the_waypoint(lab: Lab) -> None:
    """TestTCPRoute (issue 17's "a TCPRoute with weights"): Services with a TCP port (``echo-tcp`` over every echo
    pod, ``echo-tcp-v1`` and ``echo-tcp-v2`` over each version); a TCPRoute attached to ``echo-tcp`` makes the
    waypoint pick a backend Service per connection by weight, 9:1 here (without it, 1 in 3 connections would reach
    the single v2 pod); the route's parent is Accepted."""
    tcp = ("tcp", 9000, 8080)
    services = [
        service("echo-tcp", {"app": "echo"}, tcp),
        service("echo-tcp-v1", {"app": "echo", "version": "v1"}, tcp),
        service("echo-tcp-v2", {"app": "echo", "version": "v2"}, tcp),
    ]
    route = {
        "apiVersion": "gateway.networking.k8s.io/v1alpha2",
        "kind": "TCPRoute",
        "metadata": {"name": "echo-tcp"},
        "spec": {
            "parentRefs": [{"group": "", "kind": "Service", "name": "echo-tcp"}],
            "rules": [
                {
                    "backendRefs": [
                        {"name": "echo-tcp-v1", "port": 9000, "weight": 9},
                        {"name": "echo-tcp-v2", "port": 9000, "weight": 1},
                    ]
                }
            ],
        },
    }
    lab.apply(*services, namespace=NS)
    v2 = {p["metadata"]["name"] for p in lab.pods(NS, "version=v2")}
    try:
        url = f"http://{vip(lab, 'echo-tcp')}:9000/"
        lab.apply(route, namespace=NS)

        def routed() -> bool:
            answers = calls(lab, url, 40)
            ok = all(a.get("status") == 200 for a in answers)
            return ok and sum(a.get("pod") in v2 for a in answers) <= 8

        wait_until("the TCPRoute's weights apply", routed, timeout=90, interval=1.0)
        answers = calls(lab, url, 200)  # a connection each
        assert all(a.get("status") == 200 and not a.get("request_id") for a in answers), answers[:5]
        share = sum(a.get("pod") in v2 for a in answers) / len(answers)
        assert 0.02 <= share <= 0.20, share  # 1 in 10 expected
        parents = (lab.get("tcproute", "echo-tcp", "-n", NS).get("status") or {}).get("parents") or []
        assert parents and any(c["type"] == "Accepted" and c["status"] == "True" for c in parents[0]["conditions"])
    finally:
        lab.kubectl("delete", "tcproute", "echo-tcp", "-n", NS, "--ignore-not-found")
        lab.kubectl("delete", "service", "echo-tcp", "echo-tcp-v1", "echo-tcp-v2", "-n", NS, "--ignore-not-found")


def https_echo(name: str, version: str) -> dict[str, Any]:
    """A Deployment of one ``https-echo`` pod (``app: tls-echo``, ``tls-version``) whose certificate names ``name``."""
    labels = {"app": "tls-echo", "tls-version": version}  # not ``version``: the echo pods' label
    container = {
        "name": "https",
        "image": "none",
        "command": ["python3", "-m", "ambit.lab.apps", "https-echo", "--port", "8443", "--hostname", name],
        "readinessProbe": {"tcpSocket": {"port": 8443}, "periodSeconds": 1},
    }
    return {
        "apiVersion": "apps/v1",
        "kind": "Deployment",
        "metadata": {"name": name},
        "spec": {
            "replicas": 1,
            "selector": {"matchLabels": labels},
            "template": {
                "metadata": {"labels": labels},
                "spec": {"terminationGracePeriodSeconds": 2, "containers": [container]},
            },
        },
    }


def test_a_tls_route_with_weights_splits_tls_connections_that_pass_through_the_waypoint(lab: Lab) -> None:
    """TestTLSRoute (u:tests/integration/ambient/waypoint_test.go:1185-1244): a TLSRoute whose parent is a Service
    makes the waypoint pick a backend Service per connection by weight. Upstream sends plain TCP to the route's
    Service; here the clients speak real TLS to ``https-echo`` pods (``tls-echo-v1`` and ``tls-echo-v2``, one each,
    behind Service ``tls-echo`` on a port named ``tls``), weights 9:1 (without the route half the connections would
    reach v2). TLS passes through end to end: every client sees the certificate of the pod that answered (its common
    name is the Deployment's name) and the pod sees no ``x-request-id`` (the waypoint never terminated it). Like
    Istio's waypoint, Ambit's reads no SNI for a TLSRoute at a waypoint (a:model/routes.py), so the split is by
    weight, as upstream checks it; the route's parent is Accepted."""
    tls = ("tls", 443, 8443)
    objects = [
        https_echo("tls-echo-v1", "v1"),
        https_echo("tls-echo-v2", "v2"),
        service("tls-echo", {"app": "tls-echo"}, tls),
        service("tls-echo-v1", {"app": "tls-echo", "tls-version": "v1"}, tls),
        service("tls-echo-v2", {"app": "tls-echo", "tls-version": "v2"}, tls),
    ]
    route = {
        "apiVersion": "gateway.networking.k8s.io/v1alpha2",
        "kind": "TLSRoute",
        "metadata": {"name": "tls-echo"},
        "spec": {
            "parentRefs": [{"group": "", "kind": "Service", "name": "tls-echo"}],
            "rules": [
                {
                    "backendRefs": [
                        {"name": "tls-echo-v1", "port": 443, "weight": 9},
                        {"name": "tls-echo-v2", "port": 443, "weight": 1},
                    ]
                }
            ],
        },
    }
    lab.apply(*objects, namespace=NS)
    try:
        lab.wait_pods_ready(NS, "app=tls-echo", 2, timeout=90)
        pods = {p["metadata"]["labels"]["tls-version"]: p["metadata"]["name"] for p in lab.pods(NS, "app=tls-echo")}
        call = {"scheme": "https", "host": f"tls-echo.{NS}.svc.cluster.local", "port": 443, "count": 40}
        lab.apply(route, namespace=NS)

        def routed() -> bool:
            answers = probe(lab, call)
            ok = all(a.get("status") == 200 for a in answers)
            return ok and sum(a.get("pod") == pods["v2"] for a in answers) <= 8

        wait_until("the TLSRoute's weights apply", routed, timeout=90, interval=1.0)
        answers = probe(lab, {**call, "count": 200})  # a connection each
        assert all(a["status"] == 200 and not a["request_id"] for a in answers), answers[:5]
        names = {pods["v1"]: "tls-echo-v1", pods["v2"]: "tls-echo-v2"}
        assert all(a["cn"] == names.get(a["pod"]) for a in answers), [
            a for a in answers if a["cn"] != names.get(a["pod"])
        ][:5]
        share = sum(a["pod"] == pods["v2"] for a in answers) / len(answers)
        assert 0.02 <= share <= 0.20, share  # 1 in 10 expected
        parents = (lab.get("tlsroute", "tls-echo", "-n", NS).get("status") or {}).get("parents") or []
        assert parents and any(c["type"] == "Accepted" and c["status"] == "True" for c in parents[0]["conditions"])
    finally:
        lab.kubectl("delete", "tlsroute", "tls-echo", "-n", NS, "--ignore-not-found")
        lab.kubectl("delete", "service", "tls-echo", "tls-echo-v1", "tls-echo-v2", "-n", NS, "--ignore-not-found")
        lab.kubectl("delete", "deployment", "tls-echo-v1", "tls-echo-v2", "-n", NS, "--ignore-not-found")


# Connections given as arguments: host, port, how many, how many at once, and how long each waits for the server
# to speak first. Each connection waits that long for a banner line before it sends anything, then sends
# ``whoami`` and reads lines until the JSON one (multi-echo's TCP listeners answer ``whoami`` with who they are).
# Each result: the pod that answered, the banner it sent before the client had sent a byte (else empty), and
# whether a banner came only after the client had spoken (``late``); ``error`` when the connection failed.
TCP_CALLS = """
import asyncio, json, sys
host, port = sys.argv[1], int(sys.argv[2])
count, parallel, wait = int(sys.argv[3]), int(sys.argv[4]), float(sys.argv[5])
async def one():
    row = {"pod": "", "banner": "", "late": False, "error": ""}
    try:
        reader, writer = await asyncio.wait_for(asyncio.open_connection(host, port), 5)
        try:
            try:
                row["banner"] = (await asyncio.wait_for(reader.readline(), wait)).decode().strip()
            except asyncio.TimeoutError:
                pass
            writer.write(b"whoami\\n")
            await writer.drain()
            while not row["pod"]:
                line = await asyncio.wait_for(reader.readline(), 5)
                if not line:
                    raise ConnectionError("closed before the answer")
                if line.startswith(b"{"):
                    row["pod"] = json.loads(line)["pod"]
                else:
                    row["late"] = True
        finally:
            writer.close()
    except Exception as exc:
        row["error"] = f"{type(exc).__name__}: {exc}"
    return row
async def main():
    out = []
    for start in range(0, count, parallel):
        out += await asyncio.gather(*(one() for _ in range(min(parallel, count - start))))
    print(json.dumps(out))
asyncio.run(main())
"""


def tcp_calls(lab: Lab, host: str, port: int, count: int, parallel: int, wait: float) -> list[dict[str, Any]]:
    """Run :data:`TCP_CALLS` in the client pod: one result per connection."""
    out = lab.exec("client", NS, "python3", "-c", TCP_CALLS, host, str(port), str(count), str(parallel), str(wait),
                   timeout=180)  # fmt: skip
    answers: list[dict[str, Any]] = json.loads(out)
    return answers


def multi_echo_pod(name: str, *listeners: str, labels: dict[str, str] | None = None) -> dict[str, Any]:
    """A pod running ``ambit.lab.apps multi-echo`` with ``listeners`` (``KIND:PORT``), ready once the first is."""
    command = ["python3", "-m", "ambit.lab.apps", "multi-echo"]
    for listener in listeners:
        command += ["--listen", listener]
    first_port = int(listeners[0].split(":")[1])
    container = {
        "name": "echo",
        "image": "none",
        "command": command,
        "readinessProbe": {"tcpSocket": {"port": first_port}, "periodSeconds": 1},
    }
    return pod_manifest(name, [container], labels={"app": name, **(labels or {})})


def test_a_tcp_route_3_1_1_reaches_a_captured_an_uncaptured_and_a_server_first_backend(lab: Lab) -> None:
    """TestTCPRoute's whole shape (u:tests/integration/ambient/waypoint_test.go:1124-1183): a TCPRoute whose parent is
    a waypoint-bound Service (``tcp-front``, upstream's ``service-addressed-waypoint``) splits connections 3:1:1 over
    a captured backend (``tcp-captured:9090``), one the mesh does not capture (``tcp-uncaptured:9090``, its pod
    labelled ``istio.io/dataplane-mode: none``) and the parent's own server-first port (``tcp-front:9093``, the
    ``tcp-server`` port upstream's echo app speaks first on). Every connection must be answered.

    What differs: upstream makes 40 calls and checks only that every backend is hit and the captured one most;
    here 300 connections, 60 at a time, and each count must lie within 4.5 standard deviations of its binomial
    expectation (180 ± 38 for weight 3 of 5, 60 ± 31 for 1 of 5; a false failure about once in 10^5 runs per
    count). An even split (100 each) or the parent's own endpoint would fail it. Each connection waits up to 3 s
    before sending a byte: every connection the server-first backend took must have had its banner by then (the
    waypoint connected upstream without waiting for the client's first bytes), and no other connection gets one.
    Upstream's client sends first and reads the server-first greeting with the echo; waiting shows the same
    path is not stalled on client bytes. Pods here are single pods running ``ambit.lab.apps multi-echo``."""
    tcp = {"name": "tcp", "port": 9090, "targetPort": 19090}
    tcp_server = {"name": "tcp-server", "port": 9093, "targetPort": 16061}

    def svc(name: str, *ports: dict[str, Any]) -> dict[str, Any]:
        return {
            "apiVersion": "v1",
            "kind": "Service",
            "metadata": {"name": name},
            "spec": {"selector": {"app": name}, "ports": list(ports)},
        }

    route = {
        "apiVersion": "gateway.networking.k8s.io/v1alpha2",
        "kind": "TCPRoute",
        "metadata": {"name": "tcp-front"},
        "spec": {
            "parentRefs": [{"group": "", "kind": "Service", "name": "tcp-front"}],
            "rules": [
                {
                    "backendRefs": [
                        {"name": "tcp-captured", "port": 9090, "weight": 3},
                        {"name": "tcp-uncaptured", "port": 9090, "weight": 1},
                        {"name": "tcp-front", "port": 9093, "weight": 1},
                    ]
                }
            ],
        },
    }
    lab.apply(
        multi_echo_pod("tcp-captured", "tcp:19090"),
        multi_echo_pod("tcp-uncaptured", "tcp:19090", labels={"istio.io/dataplane-mode": "none"}),
        multi_echo_pod("tcp-front", "tcp:19090", "server-first:16061"),
        svc("tcp-captured", tcp),
        svc("tcp-uncaptured", tcp),
        svc("tcp-front", tcp, tcp_server),
        namespace=NS,
    )
    try:
        for name in ("tcp-captured", "tcp-uncaptured", "tcp-front"):
            lab.wait_pods_ready(NS, f"app={name}", 1, timeout=90)
        wait_until(
            "the captured pods enrolled",
            lambda: all(
                (lab.pod(name, NS)["metadata"].get("annotations") or {}).get("ambient.istio.io/redirection")
                == "enabled"
                for name in ("tcp-captured", "tcp-front")
            ),
            timeout=60,
            interval=1.0,
        )
        redirection = (lab.pod("tcp-uncaptured", NS)["metadata"].get("annotations") or {}).get(
            "ambient.istio.io/redirection"
        )
        assert redirection != "enabled", redirection  # the uncaptured backend is outside the mesh
        lab.apply(route, namespace=NS)
        host = vip(lab, "tcp-front")

        def kind(row: dict[str, Any]) -> str:
            if row["error"]:
                return "error"
            if row["pod"] == "tcp-front":
                return "server-first" if row["banner"] == "HELLO from tcp-front" else "front-unrouted"
            return str(row["pod"]).removeprefix("tcp-")

        def routed() -> bool:
            kinds = Counter(kind(row) for row in tcp_calls(lab, host, 9090, 30, 30, 3.0))
            return set(kinds) == {"captured", "uncaptured", "server-first"}

        wait_until("the TCPRoute applies with all three backends", routed, timeout=90, interval=1.0)
        rows = tcp_calls(lab, host, 9090, 300, 60, 3.0)
        assert [row for row in rows if row["error"]] == [], [row for row in rows if row["error"]][:5]
        kinds = Counter(kind(row) for row in rows)
        assert set(kinds) == {"captured", "uncaptured", "server-first"}, kinds  # no front-unrouted, no other pod
        assert 142 <= kinds["captured"] <= 218, kinds  # 180 expected, sigma 8.5
        assert 29 <= kinds["uncaptured"] <= 91, kinds  # 60 expected, sigma 6.9
        assert 29 <= kinds["server-first"] <= 91, kinds
        assert not any(row["late"] for row in rows), [row for row in rows if row["late"]][:5]
        assert not any(row["banner"] for row in rows if row["pod"] != "tcp-front")
        parents = (lab.get("tcproute", "tcp-front", "-n", NS).get("status") or {}).get("parents") or []
        assert parents and any(c["type"] == "Accepted" and c["status"] == "True" for c in parents[0]["conditions"])
    finally:
        lab.kubectl("delete", "tcproute", "tcp-front", "-n", NS, "--ignore-not-found")
        lab.kubectl("delete", "service", "tcp-captured", "tcp-uncaptured", "tcp-front", "-n", NS, "--ignore-not-found")
        lab.kubectl("delete", "pod", "tcp-captured", "tcp-uncaptured", "tcp-front", "-n", NS, "--ignore-not-found",
                    "--wait=false")  # fmt: skip


# An HTTP/1.1 server for upstream's ``http-with-proxy`` port (port as the one argument): a PROXY protocol v1 line,
# when one opens the connection, is read and reported as ``proxy`` (its fields after ``PROXY``; empty without
# one), then the request is answered with who answered and the headers it saw, and the connection closed.
PROXY_ECHO = """
import asyncio, json, os, sys
async def handle(reader, writer):
    try:
        first = await reader.readline()
        proxy = first.decode("latin-1").split()[1:] if first.startswith(b"PROXY ") else []
        head = (b"" if proxy else first) + await reader.readuntil(b"\\r\\n\\r\\n")
        lines = head.decode("latin-1").split("\\r\\n")
        headers = dict(line.split(": ", 1) for line in lines[1:] if ": " in line)
        answer = {"pod": os.environ.get("POD_NAME", ""), "proxy": proxy, "request": lines[0], "headers": headers}
        body = json.dumps(answer).encode()
        writer.write(b"HTTP/1.1 200 OK\\r\\nContent-Type: application/json\\r\\nConnection: close\\r\\n"
                     + b"Content-Length: %d\\r\\n\\r\\n" % len(body) + body)
        await writer.drain()
    except (asyncio.IncompleteReadError, asyncio.LimitOverrunError, ConnectionError):
        pass
    finally:
        writer.close()
async def main():
    server = await asyncio.start_server(handle, "0.0.0.0", int(sys.argv[1]))
    async with server:
        await server.serve_forever()
asyncio.run(main())
"""


def destination_rule(host: str, traffic_policy: dict[str, Any]) -> dict[str, Any]:
    return {
        "apiVersion": "networking.istio.io/v1",
        "kind": "DestinationRule",
        "metadata": {"name": host},
        "spec": {"host": host, "trafficPolicy": traffic_policy},
    }


def test_destination_rule_tls_proxy_and_h2_upgrade_at_the_waypoint_with_live_traffic(lab: Lab) -> None:
    """TestDestinationRule (u:tests/integration/ambient/baseline_test.go:1739-1930) on a waypoint-bound Service
    (``dr-echo``), its cases one after another, each DestinationRule replacing the last, each waited for and then
    judged by what the backend saw:

    - "TLS" (``tls: SIMPLE``, ``insecureSkipVerify``): plain HTTP to the ``https`` port (declared TLS, so carried
      as TCP) is answered by the pod's TLS listener, which reports the handshake; without the rule it fails;
    - "PROXY" (``proxyProtocol: V1``): the ``http-with-proxy`` port (L7: the request carries ``x-request-id``) and
      a ``tcp`` port to the same listener (the TCP path: no ``x-request-id``) both reach it behind a PROXY line
      naming the client pod's address and the endpoint's; without the rule there is no PROXY line;
    - "H2" (``h2UpgradePolicy: UPGRADE``): HTTP/1.1 from the client reaches the ``http`` port as HTTP/2;
    - "port level TLS" (``portLevelSettings`` of port 443: ``SIMPLE``): as "TLS", from the port's own settings;
    - "ISTIO_MUTUAL" alone: HBONE as before (the ``https`` port is plain again: the rule is in force), 200 over
      HTTP/1.1;
    - "Subset policy" (a VirtualService routing to subset ``v1``, whose own traffic policy upgrades to HTTP/2):
      the backend sees HTTP/2; with the VirtualService gone the subset's policy no longer applies (HTTP/1.1);
    - "ISTIO_MUTUAL and PROXY": HBONE as before, and the PROXY line again.

    What differs: upstream checks only that each call succeeds (and the protocol for H2 and the subset), from
    every source app; here one captured client, and the backend reports what arrived. The backend's PROXY listener
    is a small server in this module (the lab's apps have none)."""
    host = f"dr-echo.{NS}.svc.cluster.local"
    echo = {
        "name": "echo",
        "image": "none",
        "command": ["python3", "-m", "ambit.lab.apps", "multi-echo", "--listen", "http:8080", "--listen",
                    "https:8443", "--hostname", host],
        "readinessProbe": {"tcpSocket": {"port": 8443}, "periodSeconds": 1},
    }  # fmt: skip
    proxy_echo = {
        "name": "proxy",
        "image": "none",
        "command": ["python3", "-c", PROXY_ECHO, "18082"],
        "readinessProbe": {"tcpSocket": {"port": 18082}, "periodSeconds": 1},
    }
    ports = [
        {"name": "http", "port": 80, "targetPort": 8080},
        {"name": "https", "port": 443, "targetPort": 8443},
        {"name": "http-with-proxy", "port": 81, "targetPort": 18082},
        {"name": "tcp-with-proxy", "port": 9082, "targetPort": 18082},
    ]
    svc = {
        "apiVersion": "v1",
        "kind": "Service",
        "metadata": {"name": "dr-echo"},
        "spec": {"selector": {"app": "dr-echo"}, "ports": ports},
    }
    lab.apply(
        pod_manifest("dr-echo", [echo, proxy_echo], labels={"app": "dr-echo", "version": "v1"}), svc, namespace=NS
    )

    def get(port: int) -> dict[str, Any]:
        (row,) = probe(lab, {"scheme": "http", "host": host, "port": port, "path": f"/dr/{port}"})
        return row

    def rule(traffic_policy: dict[str, Any]) -> None:
        lab.kubectl("delete", "destinationrule", "dr-echo", "-n", NS, "--ignore-not-found")
        lab.apply(destination_rule("dr-echo", traffic_policy), namespace=NS)

    try:
        lab.wait_pods_ready(NS, "app=dr-echo", 1, timeout=90)
        client_ip = lab.pod("client", NS)["status"]["podIP"]
        pod_ip = lab.pod("dr-echo", NS)["status"]["podIP"]

        def proxied(row: dict[str, Any]) -> bool:
            proxy = row.get("proxy") or []
            return row["status"] == 200 and proxy[:3] == ["TCP4", client_ip, pod_ip] and proxy[4:] == ["18082"]

        def answer(port: int, ok: Callable[[dict[str, Any]], bool]) -> dict[str, Any] | None:
            row = get(port)
            return row if ok(row) else None

        # No rule: HTTP/1.1 at L7, no PROXY line, and plain HTTP to the TLS port is not answered.
        plain = wait_until("dr-echo through the waypoint", lambda: answer(81, lambda r: r["status"] == 200), 60, 1.0)
        assert plain["proxy"] == [] and plain["request_id"], plain
        first = get(80)
        assert first["status"] == 200 and first["proto"] == "HTTP/1.1" and first["request_id"], first
        assert get(443)["status"] == 0

        rule({"tls": {"mode": "SIMPLE", "insecureSkipVerify": True}})
        tls = wait_until("TLS originated", lambda: answer(443, lambda r: r["status"] == 200), 60, 1.0)
        assert tls["tls"] and tls["pod"] == "dr-echo" and not tls["request_id"], tls  # carried as TCP

        rule({"proxyProtocol": {"version": "V1"}})
        at_l7 = wait_until("a PROXY line before the request", lambda: answer(81, proxied), 60, 1.0)
        assert at_l7["request_id"], at_l7
        as_tcp = get(9082)
        assert proxied(as_tcp) and not as_tcp["request_id"], as_tcp

        rule({"connectionPool": {"http": {"h2UpgradePolicy": "UPGRADE"}}})
        h2 = wait_until("HTTP/2 upstream", lambda: answer(80, lambda r: r["proto"] == "HTTP/2.0"), 60, 1.0)
        assert h2["status"] == 200 and h2["request_id"], h2
        without = get(9082)  # the PROXY rule is gone (a TCP port: no HTTP/2 to the HTTP/1.1-only listener)
        assert without["status"] == 200 and without["proxy"] == [], without

        rule({"portLevelSettings": [{"port": {"number": 443}, "tls": {"mode": "SIMPLE", "insecureSkipVerify": True}}]})
        port_tls = wait_until("port level TLS", lambda: answer(443, lambda r: r["status"] == 200), 60, 1.0)
        assert port_tls["tls"] and port_tls["pod"] == "dr-echo", port_tls
        assert get(80)["proto"] == "HTTP/1.1"  # the H2 rule is gone

        rule({"tls": {"mode": "ISTIO_MUTUAL"}})
        wait_until("the port level TLS rule replaced", lambda: get(443)["status"] == 0, 60, 1.0)
        mutual = get(80)
        assert mutual["status"] == 200 and mutual["proto"] == "HTTP/1.1" and mutual["request_id"], mutual

        lab.kubectl("delete", "destinationrule", "dr-echo", "-n", NS, "--ignore-not-found")
        subsets = {
            "apiVersion": "networking.istio.io/v1",
            "kind": "DestinationRule",
            "metadata": {"name": "dr-echo"},
            "spec": {
                "host": "dr-echo",
                "subsets": [
                    {
                        "name": "v1",
                        "labels": {"version": "v1"},
                        "trafficPolicy": {"connectionPool": {"http": {"h2UpgradePolicy": "UPGRADE"}}},
                    }
                ],
            },
        }
        route = {
            "apiVersion": "networking.istio.io/v1",
            "kind": "VirtualService",
            "metadata": {"name": "dr-echo-route"},
            "spec": {"hosts": ["dr-echo"], "http": [{"route": [{"destination": {"host": "dr-echo", "subset": "v1"}}]}]},
        }
        lab.apply(subsets, route, namespace=NS)
        subset = wait_until("the subset's HTTP/2", lambda: answer(80, lambda r: r["proto"] == "HTTP/2.0"), 60, 1.0)
        assert subset["status"] == 200 and subset["request_id"], subset
        lab.kubectl("delete", "virtualservice", "dr-echo-route", "-n", NS)
        unrouted = wait_until("no subset, no upgrade", lambda: answer(80, lambda r: r["proto"] == "HTTP/1.1"), 60, 1.0)
        assert unrouted["status"] == 200, unrouted

        rule({"tls": {"mode": "ISTIO_MUTUAL"}, "proxyProtocol": {"version": "V1"}})
        again = wait_until("ISTIO_MUTUAL and PROXY", lambda: answer(81, proxied), 60, 1.0)
        assert again["request_id"], again
    finally:
        lab.kubectl("delete", "virtualservice", "dr-echo-route", "-n", NS, "--ignore-not-found")
        lab.kubectl("delete", "destinationrule", "dr-echo", "-n", NS, "--ignore-not-found")
        lab.kubectl("delete", "service", "dr-echo", "-n", NS, "--ignore-not-found")
        lab.kubectl("delete", "pod", "dr-echo", "-n", NS, "--ignore-not-found", "--wait=false")


CUSTOMIZE_METRICS = customize_metrics_telemetry("echo-v2")  # upstream's TestCustomizeMetrics object, on echo-v2


def waypoint_request_lines(lab: Lab, service: str) -> list[str]:
    """The waypoint pods' ``istio_requests_total`` lines for ``service`` in the namespace."""
    wanted = f'destination_service="{service}.{NS}.svc.cluster.local"'
    lines = []
    for pod in [p for p in lab.pods(NS, WAYPOINT) if (p.get("status") or {}).get("podIP")]:
        with urllib.request.urlopen(f"http://{pod['status']['podIP']}:15020/metrics", timeout=5) as response:
            lines += [
                line
                for line in response.read().decode().splitlines()
                if line.startswith("istio_requests_total{") and wanted in line
            ]
    return lines


def test_telemetry_overrides_relabel_the_targeted_services_request_count_only(lab: Lab) -> None:
    lab.apply(CUSTOMIZE_METRICS, namespace=NS)
    try:

        def relabelled() -> list[str] | None:
            calls(lab, f"http://{vip(lab, 'echo-v2')}/", 3)
            lines = [line for line in waypoint_request_lines(lab, "echo-v2") if 'custom_dimension="test"' in line]
            return lines or None

        lines = wait_until("echo-v2's series carry custom_dimension", relabelled, timeout=60, interval=1.0)
        assert all("source_principal=" not in line for line in lines), lines
        calls(lab, f"http://{vip(lab, 'echo-v1')}/", 3)
        others = waypoint_request_lines(lab, "echo-v1")
        assert others and all("custom_dimension" not in line for line in others), others
        assert all('source_principal="spiffe://' in line for line in others), others
    finally:
        lab.kubectl("delete", "telemetries.telemetry.istio.io", "ns-default", "-n", NS, "--ignore-not-found")


def test_grpc_through_the_waypoint_keeps_trailers_and_spreads_one_connection_over_the_endpoints(lab: Lab) -> None:
    target = f"{vip(lab, 'grpc-echo')}:50051"
    pods = {p["metadata"]["name"] for p in lab.pods(NS, "app=grpc-echo")}
    before = waypoint_requests(lab)
    out = json.loads(lab.exec("client", NS, "python3", "-c", GRPC_CALLS, target, "20", timeout=120))
    assert set(out["pods"]) == pods, out  # one HTTP/2 connection, every request balanced on its own
    failed = out["failed"]
    assert failed["code"] == "NOT_FOUND" and failed["details"].endswith("was asked to fail"), failed
    assert failed["trailers"].get("x-pod") in pods, failed  # trailers intact through the waypoint
    assert waypoint_requests(lab) >= before + 21


GRPC_ABORTED = """
import json, sys, asyncio
import grpc, grpc.aio
target = sys.argv[1]
async def main():
    async with grpc.aio.insecure_channel(target) as channel:
        try:
            answer = (await channel.unary_unary("/echo.Echo/Say")(b"hi", timeout=5)).decode()
            print(json.dumps({"answer": answer}))
        except grpc.aio.AioRpcError as exc:
            print(json.dumps({"code": exc.code().name, "details": exc.details()}))
asyncio.run(main())
"""

# istio tests/integration/pilot/common/routing.go "fault abort gRPC", with {{ (index .dst 0).Config.Service }} =
# grpc-echo.
FAULT_ABORT_GRPC = {
    "apiVersion": "networking.istio.io/v1",
    "kind": "VirtualService",
    "metadata": {"name": "default"},
    "spec": {
        "hosts": ["grpc-echo"],
        "http": [
            {
                "route": [{"destination": {"host": "grpc-echo"}}],
                "fault": {"abort": {"percentage": {"value": 100}, "grpcStatus": "UNAVAILABLE"}},
            }
        ],
    },
}


def test_a_grpc_fault_abort_answers_unavailable_at_the_waypoint(lab: Lab) -> None:
    target = f"{vip(lab, 'grpc-echo')}:50051"

    def call() -> dict[str, Any]:
        answer: dict[str, Any] = json.loads(lab.exec("client", NS, "python3", "-c", GRPC_ABORTED, target, timeout=60))
        return answer

    lab.apply(FAULT_ABORT_GRPC, namespace=NS)
    try:
        wait_until("the gRPC fault abort applies", lambda: call().get("code") == "UNAVAILABLE", timeout=60)
        assert call() == {"code": "UNAVAILABLE", "details": "fault filter abort"}
    finally:
        lab.kubectl("delete", "virtualservice", "default", "-n", NS, "--ignore-not-found")
    wait_until("calls pass again without the VirtualService", lambda: "answer" in call(), timeout=60, interval=1.0)


CANARY = "gateway.networking.k8s.io/gateway-name=canary"


def test_a_canary_waypoint_takes_its_weight_of_the_connections(lab: Lab) -> None:
    """TestWeightedWaypointTrafficShift: ``istio.io/use-waypoint-canary`` and its weight annotation on a Service
    send that share of its new connections through the canary waypoint, the rest through the primary."""
    kubeconfig = str(lab.topology.kubeconfig)
    ambit("waypoint", "apply", "-n", NS, "--name", "canary", "--wait", "--kubeconfig", kubeconfig, timeout=240)
    url = f"http://{vip(lab, 'echo-v2')}/"

    def shares(weight: int) -> tuple[int, int]:
        """Set the weight, wait until the split has moved to it, and return (primary, canary) of 20 requests."""
        lab.kubectl("annotate", "service", "echo-v2", "-n", NS, f"istio.io/use-waypoint-canary-weight={weight}",
                    "--overwrite")  # fmt: skip

        def split() -> tuple[int, int] | None:
            primary, canary = waypoint_requests(lab), waypoint_requests(lab, CANARY)
            answers = calls(lab, url, 20)
            assert all(a["status"] == 200 and a.get("request_id") for a in answers), answers
            moved = waypoint_requests(lab) - primary, waypoint_requests(lab, CANARY) - canary
            settled = {0: moved[1] == 0, 100: moved[0] == 0}.get(weight, moved[0] > 0 and moved[1] > 0)
            return moved if settled else None

        found = wait_until(f"the split at canary weight {weight}", split, timeout=90, interval=1.0)
        print(f"canary weight {weight}: primary {found[0]}, canary {found[1]} of 20 requests")
        return found

    lab.kubectl("label", "service", "echo-v2", "-n", NS, "istio.io/use-waypoint-canary=canary", "--overwrite")
    try:
        assert shares(100)[1] >= 20
        assert shares(0)[0] >= 20
        assert sum(shares(50)) >= 20
        bound = condition(lab.get("service", "echo-v2", "-n", NS), "istio.io/WaypointBound")
        assert bound.get("status") == "True", bound
    finally:
        lab.kubectl("label", "service", "echo-v2", "-n", NS, "istio.io/use-waypoint-canary-", check=False)
        lab.kubectl("annotate", "service", "echo-v2", "-n", NS, "istio.io/use-waypoint-canary-weight-", check=False)
        ambit("waypoint", "delete", "-n", NS, "canary", "--kubeconfig", kubeconfig, check=False)


# Requests, each on a connection of its own, until stdin has something (or ends); then one JSON line of the failures
# and the count. ``ambit lab exec`` hands its stdin to the container's process.
TRAFFIC = """
import json, select, sys, time, urllib.request
url, sent, failed = sys.argv[1], 0, []
while not select.select([sys.stdin], [], [], 0)[0]:
    sent += 1
    started = time.time()
    try:
        with urllib.request.urlopen(url, timeout=5) as r:
            r.read()
    except Exception as exc:
        failed.append([started, f"{type(exc).__name__}: {exc}"])
print(json.dumps({"sent": sent, "failed": failed}))
"""

SECOND = "gateway.networking.k8s.io/gateway-name=waypoint-b"


def served(lab: Lab, selector: str, service: str) -> int:
    """How many requests for ``service`` the waypoint pods ``selector`` have counted (``istio_requests_total``)."""
    wanted = f'destination_service="{service}.{NS}.svc.cluster.local"'
    total = 0
    for pod in [p for p in lab.pods(NS, selector) if (p.get("status") or {}).get("podIP")]:
        try:
            with urllib.request.urlopen(f"http://{pod['status']['podIP']}:15020/metrics", timeout=5) as response:
                text = response.read().decode()
        except OSError:
            continue  # a pod on its way out
        for line in text.splitlines():
            if line.startswith("istio_requests_total{") and wanted in line and 'reporter="waypoint"' in line:
                total += int(float(line.rsplit(" ", 1)[1]))
    return total


def set_use_waypoint(lab: Lab, kind: str, name: str, waypoint: str | None) -> None:
    """Istio's ``SetWaypoint``: a merge patch of the ``istio.io/use-waypoint`` label (null removes it)."""
    patch = {"metadata": {"labels": {"istio.io/use-waypoint": waypoint}}}
    where = ["-n", NS] if kind != "namespace" else []
    lab.kubectl("patch", kind, name, *where, "--type", "merge", "-p", json.dumps(patch))


def test_moving_the_use_waypoint_label_moves_running_traffic(lab: Lab) -> None:
    """TestRemoveAddWaypoint and TestBogusUseWaypoint with the label moved while traffic runs: the namespace's
    label switched to a second waypoint moves ``echo-v1``'s requests there (its metrics count them, the first
    waypoint's stop), the Service's own label takes it back, ``none`` opts the Service out to L4, a deleted
    waypoint gets nothing and leaves the traffic at L4, and restoring the namespace label brings L7 back; a
    client sending all along sees no failure but for at most two resets, each just after a step."""
    kubeconfig = str(lab.topology.kubeconfig)
    ambit("waypoint", "apply", "-n", NS, "--name", "waypoint-b", "--wait", "--kubeconfig", kubeconfig, timeout=240)
    url = f"http://{vip(lab, 'echo-v1')}/"
    client = subprocess.Popen(
        [sys.executable, "-m", "ambit.cli", "lab", "exec", "--dir", str(lab.directory), "client", "-n", NS, "--",
         "python3", "-c", TRAFFIC, url],
        stdin=subprocess.PIPE, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True,
    )  # fmt: skip

    def moves_to(selector: str | None, away: tuple[str, ...]) -> None:
        """Wait until 10 requests to echo-v1 are all counted by ``selector``'s waypoint (L4 when None: no
        ``x-request-id``) and none by the waypoints ``away``."""

        def settled() -> bool:
            before = {s: served(lab, s, "echo-v1") for s in (*away, *([selector] if selector else []))}
            answers = calls(lab, url, 10)
            if not all(a.get("status") == 200 for a in answers):
                return False
            if any(served(lab, s, "echo-v1") != before[s] for s in away):
                return False
            if selector is None:
                return not any(a.get("request_id") for a in answers)
            # The background client's requests are counted too: at least the 10 of this batch.
            counted = served(lab, selector, "echo-v1") - before[selector]
            return all(a.get("request_id") for a in answers) and counted >= 10

        wait_until(f"echo-v1's requests go {'through ' + selector if selector else 'at L4'}", settled, 90, 1.0)

    steps: list[tuple[float, str]] = []

    def step(name: str) -> None:
        steps.append((time.time(), name))

    try:
        moves_to(WAYPOINT, ())
        step("namespace -> waypoint-b")
        set_use_waypoint(lab, "namespace", NS, "waypoint-b")
        moves_to(SECOND, (WAYPOINT,))
        step("service -> waypoint")
        set_use_waypoint(lab, "service", "echo-v1", "waypoint")
        moves_to(WAYPOINT, (SECOND,))
        step("service -> none")
        set_use_waypoint(lab, "service", "echo-v1", "none")
        moves_to(None, (WAYPOINT, SECOND))
        step("service label removed (namespace: waypoint-b)")
        set_use_waypoint(lab, "service", "echo-v1", None)
        moves_to(SECOND, (WAYPOINT,))
        step("waypoint-b deleted")
        ambit("waypoint", "delete", "-n", NS, "waypoint-b", "--kubeconfig", kubeconfig)
        moves_to(None, (WAYPOINT,))
        wait_until("waypoint-b's pods are gone", lambda: not lab.pods(NS, SECOND), 90, 1.0)
        step("waypoint-b's pods gone")
        bound = condition(lab.get("service", "echo-v1", "-n", NS), "istio.io/WaypointBound")
        assert bound.get("status") == "False" and bound.get("reason") == "WaypointIsNotReady", bound
        step("namespace -> waypoint")
        set_use_waypoint(lab, "namespace", NS, "waypoint")
        moves_to(WAYPOINT, ())
        step("done")
    finally:
        set_use_waypoint(lab, "namespace", NS, "waypoint")
        set_use_waypoint(lab, "service", "echo-v1", None)
        ambit("waypoint", "delete", "-n", NS, "waypoint-b", "--kubeconfig", kubeconfig, check=False)
        out, err = client.communicate("stop\n", timeout=60)
    result = json.loads(out or "{}") if client.returncode == 0 else {"exit": client.returncode, "stderr": err}
    print(f"background client: {result.get('sent')} requests, {len(result.get('failed', []))} failed")
    for at, error in result.get("failed", []):  # when each failure happened, after which step
        since, name = next(((at - t, n) for t, n in reversed(steps) if t <= at), (0.0, "before the first step"))
        print(f"  failed {since:6.2f} s after {name!r}: {error}")
    # Deleting the waypoint in use is the one step allowed a reset or two: a node proxy that has not yet heard the
    # Gateway is gone may still open a tunnel there just after the waypoint heard it (seen: 1 in 6714 requests).
    # A move has the same race, narrower (outbound rule 7 retries a 400 from the old waypoint; a reset just as a
    # binding flips was still seen once in three CI runs). Istio's own tests retry here. So a failure is allowed
    # only within 5 s of a step (10 s of the deletion), at most two in all: traffic never stops.
    windows = [(t, t + (10 if n == "waypoint-b deleted" else 5)) for t, n in steps]
    elsewhere = [f for f in result.get("failed", []) if not any(a <= f[0] <= b for a, b in windows)]
    assert result.get("sent", 0) > 0 and elsewhere == [] and len(result.get("failed", [])) <= 2, result


def test_removing_the_label_brings_traffic_back_to_l4(lab: Lab) -> None:
    url = f"http://{vip(lab, 'echo')}/"
    lab.kubectl("label", "namespace", NS, "istio.io/use-waypoint-")

    def direct() -> bool:
        answers = calls(lab, url, 3)
        return all(a.get("status") == 200 and not a.get("request_id") for a in answers)

    wait_until("requests no longer carry x-request-id", direct, timeout=60, interval=1.0)
    lab.kubectl("label", "namespace", NS, "istio.io/use-waypoint=waypoint")


def test_a_resolution_none_service_entry_is_carried_at_l7_to_the_address_asked_for(lab: Lab) -> None:
    """TestWaypointAsEgressGateway "resolution none": a ServiceEntry whose address is the ClusterIP of a Service
    outside the mesh (namespace ``wp-outside``, not ambient), no endpoints and ``resolution: NONE``, bound to the
    waypoint. Before the entry a call to that address is plain L4; with it, it goes through the waypoint at L7
    and reaches the pod behind the ClusterIP (the waypoint's original destination)."""
    outside = "wp-outside"
    lab.namespace(outside)
    lab.apply(
        pod_manifest("external", [http_echo_container(8080)], labels={"app": "external"}),
        service("external", {"app": "external"}, ("http", 8080, 8080)),
        namespace=outside,
    )
    lab.wait_pods_ready(outside, "", 1, timeout=90)
    address = str(lab.get("service", "external", "-n", outside)["spec"]["clusterIP"])
    url = f"http://{address}:8080/"

    def direct() -> dict[str, Any] | None:
        (answer,) = calls(lab, url)
        return answer if answer["status"] == 200 else None

    before = wait_until("the outside Service answers", direct, timeout=60, interval=1.0)
    assert before["pod"] == "external" and not before["request_id"], before
    entry = {
        "apiVersion": "networking.istio.io/v1",
        "kind": "ServiceEntry",
        "metadata": {"name": "external-resolution-none", "labels": {"istio.io/use-waypoint": "waypoint"}},
        "spec": {
            "hosts": ["fake-passthrough.example.com"],
            "ports": [{"name": "http", "number": 8080, "protocol": "HTTP"}],
            "resolution": "NONE",
            "location": "MESH_EXTERNAL",
            "addresses": [address],
        },
    }
    lab.apply(entry, namespace=NS)

    def through_waypoint() -> list[dict[str, Any]] | None:
        answers = calls(lab, url, 3)
        return answers if all(a.get("request_id") and a.get("pod") == "external" for a in answers) else None

    wait_until("the entry's address carried at L7 by the waypoint", through_waypoint, timeout=60, interval=1.0)
    bound = condition(lab.get("serviceentry", "external-resolution-none", "-n", NS), "istio.io/WaypointBound")
    assert bound.get("status") == "True", bound
    lab.kubectl("delete", "serviceentry", "external-resolution-none", "-n", NS)


def test_a_cidr_service_entry_carries_its_range_at_l7_and_exact_service_addresses_still_win(
    lab: Lab, namespace: str
) -> None:
    """TestWaypointAsEgressGateway "before CIDR SE" and "resolution none CIDR" (u:tests/integration/ambient/
    waypoint_test.go:646-717): a ``resolution: NONE`` ServiceEntry whose address is ``<ClusterIP>/24`` of a Service
    the mesh does not see (namespace ``wp-cidr``, hidden by the mesh config's ``discoverySelectors`` as upstream's
    external namespace is), bound to the waypoint. Before the entry a call to that ClusterIP is plain L4; with it,
    it goes through the waypoint at L7 to the pod behind the ClusterIP. Upstream stops there; on the lab the /24
    also holds the VIPs of Services the mesh knows, and those exact addresses win over the range (ztunnel's lookup):
    ``plain`` (this test's namespace, not ambient, no waypoint) is still reached at L4, and ``echo-v1`` (waypoint
    bound) still counts as itself at the waypoint, not as the entry's host."""
    hidden = "wp-cidr"
    lab.namespace(hidden)
    with undiscovered(lab, hidden):
        lab.apply(
            pod_manifest("cidr-target", [http_echo_container(8080)], labels={"app": "cidr-target"}),
            service("cidr-target", {"app": "cidr-target"}, ("http", 8080, 8080)),
            namespace=hidden,
        )
        lab.apply(
            pod_manifest("plain", [http_echo_container(8080)], labels={"app": "plain"}),
            service("plain", {"app": "plain"}, ("http", 8080, 8080)),
            namespace=namespace,
        )
        lab.wait_pods_ready(hidden, "", 1, timeout=90)
        lab.wait_pods_ready(namespace, "", 1, timeout=90)
        target = str(lab.get("service", "cidr-target", "-n", hidden)["spec"]["clusterIP"])
        plain = str(lab.get("service", "plain", "-n", namespace)["spec"]["clusterIP"])
        cidr = ipaddress.ip_network(f"{target}/24", strict=False)
        assert ipaddress.ip_address(plain) in cidr and ipaddress.ip_address(vip(lab, "echo-v1")) in cidr, (
            f"the lab allocated {target}, {plain} and {vip(lab, 'echo-v1')} outside one /24"
        )
        host = {"Host": "fake-cidr-passthrough.example.com"}
        call = {"scheme": "http", "host": target, "port": 8080, "headers": host}

        def direct() -> dict[str, Any] | None:
            (answer,) = probe(lab, call)
            return answer if answer["status"] == 200 else None

        before = wait_until("the hidden Service answers", direct, timeout=60, interval=1.0)
        assert before["pod"] == "cidr-target" and not before["request_id"], before
        entry = {
            "apiVersion": "networking.istio.io/v1",
            "kind": "ServiceEntry",
            "metadata": {"name": "external-resolution-none-cidr", "labels": {"istio.io/use-waypoint": "waypoint"}},
            "spec": {
                "hosts": ["fake-cidr-passthrough.example.com"],
                "ports": [{"name": "http", "number": 8080, "protocol": "HTTP"}],
                "resolution": "NONE",
                "location": "MESH_EXTERNAL",
                "addresses": [f"{target}/24"],
            },
        }
        lab.apply(entry, namespace=NS)
        try:

            def through_waypoint() -> list[dict[str, Any]] | None:
                answers = probe(lab, {**call, "count": 3})
                return answers if all(a["request_id"] and a["pod"] == "cidr-target" for a in answers) else None

            wait_until("the range's address carried at L7 by the waypoint", through_waypoint, timeout=60, interval=1.0)
            (exact,) = probe(lab, {"scheme": "http", "host": plain, "port": 8080, "headers": host})
            assert exact["status"] == 200 and exact["pod"] == "plain" and not exact["request_id"], exact
            counted = sum(int(float(line.rsplit(" ", 1)[1])) for line in waypoint_request_lines(lab, "echo-v1"))
            v1 = {p["metadata"]["name"] for p in lab.pods(NS, "version=v1")}
            answers = calls(lab, f"http://{vip(lab, 'echo-v1')}/", 5)
            assert all(a["status"] == 200 and a["request_id"] and a["pod"] in v1 for a in answers), answers
            after = sum(int(float(line.rsplit(" ", 1)[1])) for line in waypoint_request_lines(lab, "echo-v1"))
            assert after >= counted + 5, (counted, after)
            bound = condition(
                lab.get("serviceentry", "external-resolution-none-cidr", "-n", NS), "istio.io/WaypointBound"
            )
            assert bound.get("status") == "True", bound
        finally:
            lab.kubectl("delete", "serviceentry", "external-resolution-none-cidr", "-n", NS, "--ignore-not-found")


def test_a_wildcard_dynamic_dns_service_entry_is_forwarded_by_host_at_the_waypoint(lab: Lab) -> None:
    """TestWaypointAsEgressGatewayForWildcardEntries "overriding with matching Host header" and "overriding with
    invalid Host header": a ``DYNAMIC_DNS`` entry ``*.wp-wild.svc.cluster.local`` (port 80, target port 8080) bound to
    the waypoint. The client's DNS proxy answers a name under the wildcard with the entry's allocated address; the
    waypoint resolves the request's Host through the cluster's DNS (the ClusterIP of a Service outside the mesh) and
    forwards at L7; a Host outside the wildcard is answered 404 by the waypoint.

    The client addresses ``non-existent.wp-wild...`` rather than the Service's own name: upstream hides the external
    namespace from the mesh with meshConfig ``discoverySelectors``; this test leaves the lab's mesh config as
    installed (no selectors), so here the Service's own name is a mesh Service and the DNS proxy answers its
    ClusterIP (as ztunnel would without the selector). The next test hides its namespace and calls upstream's name."""
    outside = "wp-wild"
    lab.namespace(outside)
    lab.apply(
        pod_manifest("external", [http_echo_container(8080)], labels={"app": "external"}),
        service("external", {"app": "external"}, ("http", 8080, 8080)),
        namespace=outside,
    )
    lab.wait_pods_ready(outside, "", 1, timeout=90)
    entry = {
        "apiVersion": "networking.istio.io/v1",
        "kind": "ServiceEntry",
        "metadata": {"name": "external-wildcard", "labels": {"istio.io/use-waypoint": "waypoint"}},
        "spec": {
            "hosts": [f"*.{outside}.svc.cluster.local"],
            "ports": [{"name": "http", "number": 80, "protocol": "HTTP", "targetPort": 8080}],
            "resolution": "DYNAMIC_DNS",
            "location": "MESH_EXTERNAL",
        },
    }
    lab.apply(entry, namespace=NS)
    url = f"http://non-existent.{outside}.svc.cluster.local/"
    host = f"Host:external.{outside}.svc.cluster.local"
    last: list[list[dict[str, Any]]] = []

    def through_waypoint() -> list[dict[str, Any]] | None:
        answers = calls(lab, url, 3, host)
        last[:] = [answers]
        return answers if all(a.get("request_id") and a.get("pod") == "external" for a in answers) else None

    try:
        wait_until("a name under the wildcard carried at L7 by the waypoint", through_waypoint, timeout=90)
    except BaseException:
        print("last answers:", last, file=sys.stderr)
        print(lab.kubectl("logs", "-n", NS, "-l", WAYPOINT, "--tail=40", check=False).stdout, file=sys.stderr)
        raise
    (refused,) = calls(lab, url, 1, f"Host:external.{outside}-not.svc.cluster.local")
    assert refused["status"] == 404, refused
    bound = condition(lab.get("serviceentry", "external-wildcard", "-n", NS), "istio.io/WaypointBound")
    assert bound.get("status") == "True", bound
    lab.kubectl("delete", "serviceentry", "external-wildcard", "-n", NS)


def test_a_wildcard_entry_carries_tls_and_https_by_sni_and_originates_tls_for_its_target_port(lab: Lab) -> None:
    """TestWaypointAsEgressGatewayForWildcardEntries (u:tests/integration/ambient/waypoint_test.go:1246-1418) with
    upstream's entry (``*.wp-wild-tls.svc.cluster.local``: ``http`` 80, ``tls`` 443, ``http-for-tls`` 8080 → 443,
    ``DYNAMIC_DNS``) bound to the waypoint, and the external namespace hidden from the mesh by ``discoverySelectors``
    as upstream's install hides it, so upstream's own name is called: "basic" at L7, "overriding with invalid Host
    header" 404, "overriding with matching Host header" from another name under the wildcard at L7, "basic TLS" and
    "basic HTTPS" on 443 passed through to the server the SNI names (the client sees the external server's own
    certificate; a SNI outside the wildcard gets no handshake), then the wildcard DestinationRule ``SIMPLE`` and
    "http origination targetPort": plain HTTP on 8080 reaches the server's TLS port with ALPN ``http/1.1``.
    Upstream's egress waypoint lives in a namespace of its own; here it is the namespace's waypoint."""
    outside = "wp-wild-tls"
    name = f"external.{outside}.svc.cluster.local"
    lab.namespace(outside)
    entry = {
        "apiVersion": "networking.istio.io/v1",
        "kind": "ServiceEntry",
        "metadata": {"name": "external-wildcard-tls", "labels": {"istio.io/use-waypoint": "waypoint"}},
        "spec": {
            "hosts": [f"*.{outside}.svc.cluster.local"],
            "ports": [
                {"name": "http", "number": 80, "protocol": "HTTP"},
                {"name": "tls", "number": 443, "protocol": "TLS"},
                {"name": "http-for-tls", "number": 8080, "protocol": "HTTP", "targetPort": 443},
            ],
            "resolution": "DYNAMIC_DNS",
            "location": "MESH_EXTERNAL",
        },
    }
    origination = {
        "apiVersion": "networking.istio.io/v1",
        "kind": "DestinationRule",
        "metadata": {"name": "wildcard-tls-origination"},
        "spec": {
            "host": f"*.{outside}.svc.cluster.local",
            "trafficPolicy": {"tls": {"mode": "SIMPLE", "insecureSkipVerify": True}},
        },
    }
    external = {
        "name": "echo",
        "image": "none",
        "command": ["python3", "-m", "ambit.lab.apps", "multi-echo", "--listen", "http:8080", "--listen",
                    "https:8443", "--hostname", name],
        "readinessProbe": {"tcpSocket": {"port": 8443}, "periodSeconds": 1},
    }  # fmt: skip
    external_service = {
        "apiVersion": "v1",
        "kind": "Service",
        "metadata": {"name": "external"},
        "spec": {
            "selector": {"app": "external"},
            "ports": [
                {"name": "http", "port": 80, "targetPort": 8080},
                {"name": "https", "port": 443, "targetPort": 8443},
            ],
        },
    }
    with undiscovered(lab, outside):
        lab.apply(pod_manifest("external", [external], labels={"app": "external"}), external_service, namespace=outside)
        lab.wait_pods_ready(outside, "", 1, timeout=90)
        lab.apply(entry, namespace=NS)
        try:
            basic = {"scheme": "http", "host": name, "port": 80}
            last: list[list[dict[str, Any]]] = []

            def through_waypoint() -> list[dict[str, Any]] | None:
                answers = probe(lab, basic)
                last[:] = [answers]
                return answers if all(a["request_id"] and a["pod"] == "external" for a in answers) else None

            try:
                wait_until("upstream's name carried at L7 by the waypoint", through_waypoint, timeout=90, interval=1.0)
            except BaseException:
                print("last answers:", last, file=sys.stderr)
                raise
            invalid, matching, tls, https, elsewhere = probe(
                lab,
                {**basic, "headers": {"Host": "external.non-existent.svc.cluster.local"}},
                {**basic, "host": f"non-existent.{outside}.svc.cluster.local", "headers": {"Host": name}},
                {"scheme": "tls", "host": name, "port": 443, "sni": name},
                {"scheme": "https", "host": name, "port": 443, "sni": name},
                {"scheme": "tls", "host": name, "port": 443, "sni": "external.wp-elsewhere.svc.cluster.local"},
            )
            assert invalid["status"] == 404, invalid
            assert matching["status"] == 200 and matching["request_id"] and matching["pod"] == "external", matching
            assert tls["status"] == 1 and tls["cn"] == name, tls
            assert https["status"] == 200 and https["pod"] == "external" and https["cn"] == name, https
            assert not https["request_id"], https  # passed through: the waypoint never saw the request
            assert elsewhere["status"] == 0, elsewhere
            lab.apply(origination, namespace=NS)
            originated = {"scheme": "http", "host": name, "port": 8080}

            def over_tls() -> dict[str, Any] | None:
                (answer,) = probe(lab, originated)
                return answer if answer["status"] == 200 and answer["alpn"] == "http/1.1" else None

            answer = wait_until("plain HTTP on 8080 originated as TLS to 443", over_tls, timeout=60, interval=1.0)
            assert answer["request_id"] and answer["pod"] == "external", answer
        finally:
            lab.kubectl("delete", "destinationrule", "wildcard-tls-origination", "-n", NS, "--ignore-not-found")
            lab.kubectl("delete", "serviceentry", "external-wildcard-tls", "-n", NS, "--ignore-not-found")


RACE_NAME = "race.wp-app.lab.example"
DEAD = "192.0.2.1"
"""TEST-NET-1: nothing answers there, and it sorts before any lab pod address, so a waypoint dialling one address
(the first) would never reach the live one."""


def connect_strategy_entry(name: str, host: str, address: str, **metadata: Any) -> dict[str, Any]:
    """Upstream's ``resolution: DNS`` ServiceEntry of TestWaypointDNSConnectStrategy, racing connects asked for."""
    meta = {"name": name, "annotations": {"istio.io/connect-strategy": "RACE_FIRST_TCP_CONNECT"}, **metadata}
    return {
        "apiVersion": "networking.istio.io/v1",
        "kind": "ServiceEntry",
        "metadata": meta,
        "spec": {
            "hosts": [host],
            "ports": [{"name": "http", "number": 80, "protocol": "HTTP"}],
            "location": "MESH_EXTERNAL",
            "resolution": "DNS",
            "endpoints": [{"address": address, "ports": {"http": 8080}}],
        },
    }


def test_racing_connects_through_the_waypoint_and_waypoint_missing_without_one(lab: Lab, namespace: str) -> None:
    """TestWaypointDNSConnectStrategy (u:tests/integration/ambient/waypoint_test.go:1454-1690). "traffic through
    waypoint": ``connect-strategy-se`` (annotated ``RACE_FIRST_TCP_CONNECT``, bound to the waypoint) is reached at
    L7. Its endpoint name has two A records in the lab's DNS zone, a dead address first and the live pod second, so
    the request arrives only because the waypoint races its connects (upstream's name is a Service with one
    address; its "envoy cluster config" subtest reads Envoy's dump, which Ambit has not: the racing itself is checked
    instead). "status condition without waypoint": ``istio.io/WaypointMissing`` True on an annotated entry with no
    waypoint, read with ``kubectl get -o json``, and on a wildcard-host entry with none (istiod's other reason);
    "status condition clears on strategy reset": removing the annotation by an Update (``kubectl replace`` of the
    object read) removes the condition. The bound entry carries none. Upstream's waypoint is in a namespace of its
    own; here it is the namespace's."""
    lab.apply(pod_manifest("live", [http_echo_container(8080)], labels={"app": "live"}), namespace=namespace)
    (live,) = lab.wait_pods_ready(namespace, "app=live", 1, timeout=90)
    zone = json.dumps({"data": {RACE_NAME: f"{DEAD} {live['status']['podIP']}"}})
    lab.kubectl("patch", "configmap", "lab-dns-zone", "-n", "kube-system", "--type=merge", "-p", zone)
    bound = connect_strategy_entry(
        "connect-strategy-se", "fake-connect-strategy.example.com", RACE_NAME,
        labels={"istio.io/use-waypoint": "waypoint"},
    )  # fmt: skip
    missing = connect_strategy_entry("connect-strategy-no-wp", "fake-no-waypoint.example.com", RACE_NAME)
    reset = connect_strategy_entry("connect-strategy-reset-test", "fake-reset-test.example.com", RACE_NAME)
    wildcard = {
        "apiVersion": "networking.istio.io/v1",
        "kind": "ServiceEntry",
        "metadata": {"name": "wildcard-no-wp"},
        "spec": {
            "hosts": ["*.wildcard-no-waypoint.example.com"],
            "ports": [{"name": "http", "number": 80, "protocol": "HTTP"}],
            "location": "MESH_EXTERNAL",
            "resolution": "DYNAMIC_DNS",
        },
    }
    try:
        lab.apply(bound, namespace=NS)
        lab.apply(missing, reset, wildcard, namespace=namespace)

        def through_waypoint() -> list[dict[str, Any]] | None:
            answers = calls(lab, "http://fake-connect-strategy.example.com/", 3)
            return answers if all(a.get("request_id") and a.get("pod") == "live" for a in answers) else None

        wait_until("the racing entry reached at L7 through the waypoint", through_waypoint, timeout=90, interval=1.0)
        answers = calls(lab, "http://fake-connect-strategy.example.com/", 10)  # each within the client's 5 s
        assert all(a["status"] == 200 and a["pod"] == "live" for a in answers), answers

        def waypoint_missing(name: str) -> dict[str, Any]:
            return condition(lab.get("serviceentry", name, "-n", namespace), "istio.io/WaypointMissing")

        for name, reason in [
            ("connect-strategy-no-wp", "NoWaypointForRacingConnectStrategy"),
            ("connect-strategy-reset-test", "NoWaypointForRacingConnectStrategy"),
            ("wildcard-no-wp", "NoWaypointForWildcardService"),
        ]:
            found = wait_until(f"WaypointMissing on {name}", lambda n=name: waypoint_missing(n), 60, interval=1.0)
            assert (found["status"], found["reason"]) == ("True", reason), found
        assert condition(lab.get("serviceentry", "connect-strategy-se", "-n", NS), "istio.io/WaypointMissing") == {}
        read = lab.get("serviceentry", "connect-strategy-reset-test", "-n", namespace)
        del read["metadata"]["annotations"]["istio.io/connect-strategy"]
        lab.kubectl("replace", "-f", "-", input=json.dumps(read))
        wait_until(
            "WaypointMissing removed after the strategy was reset",
            lambda: waypoint_missing("connect-strategy-reset-test") == {},
            timeout=60,
            interval=1.0,
        )
        assert waypoint_missing("connect-strategy-no-wp").get("status") == "True"
    finally:
        lab.kubectl("delete", "serviceentry", "connect-strategy-se", "-n", NS, "--ignore-not-found")
        removal = json.dumps({"data": {RACE_NAME: None}})
        lab.kubectl("patch", "configmap", "lab-dns-zone", "-n", "kube-system", "--type=merge", "-p", removal)
