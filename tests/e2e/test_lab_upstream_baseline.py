"""Cases of Istio's ambient baseline tests (tests/integration/ambient/baseline_test.go) that no other module runs,
with Istio's expectations (spec §11.3; docs/upstream-ambient-audit.md rows "done untested"):

- TestPodIP and TestServices' waypoint rows: a Service bound to a service waypoint is L7 by its VIP and L4 by a pod
  IP; a pod bound to a workload waypoint is L7 by its pod IP and L4 by its Service's VIP; an uncaptured client
  bypasses both (L4); a pod calling its own IP is L4; without a waypoint the server sees the client's own address.
- TestServices' ``http-localhost`` port: an application listening on localhost only cannot be reached through
  the mesh, with or without a waypoint (an error or a 503, never the application's answer).
- TestWaypointWithInvalidBackend: an HTTPRoute whose backend does not exist answers 500.
- TestOtherRevisionIgnored: a waypoint of another revision gets no Deployment.
- TestServiceRestart: a rollout restart of the destination loses no request from a captured or an uncaptured client.

L7 is recognised as upstream does: the request reaching the server carries ``X-Request-Id``.

Runs on the shared mesh lab: namespace ``ub-app`` (ambient) with Deployments ``captured`` (two replicas, no
waypoint), ``svc-wp`` (Service labelled for waypoint ``waypoint-service``, ``--for service``) and ``wl-wp`` (pods
labelled for waypoint ``waypoint-workload``, ``--for workload``), each with a Service of the same name on port 80;
a captured ``client`` pod and an uncaptured ``outsider`` pod.
"""

from __future__ import annotations

import json
import select
import subprocess
import sys
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
from tests.e2e.hbone_peer import node_connect, workload_files
from tests.e2e.lab_driver import (
    TEST_TIMEOUT,
    Lab,
    ambit,
    http_echo_container,
    module_on_shared_lab,
    pod_manifest,
    sleeper,
    wait_until,
)

pytestmark = [pytest.mark.root, pytest.mark.kubectl, pytest.mark.timeout(TEST_TIMEOUT)]
SHARES_THE_MESH_LAB = True  # tests/e2e/lab_driver.py shared_mesh_lab: one lab for the modules that share it

NS = "ub-app"
GRACE = 15
"""The echo pods' termination grace: http-echo exits a second after its last request once terminating."""

CALLS = """
import json, sys, urllib.request
url, count = sys.argv[1], int(sys.argv[2])
out = []
for _ in range(count):
    try:
        with urllib.request.urlopen(url, timeout=5) as r:
            answer = json.loads(r.read())
            headers = {k.lower(): v for k, v in answer["headers"].items()}
            out.append({"status": r.status, "pod": answer.get("pod", ""), "client": answer.get("client", ""),
                        "request_id": headers.get("x-request-id", "")})
    except Exception as exc:
        out.append({"status": getattr(exc, "code", 0), "error": f"{type(exc).__name__}: {exc}"})
print(json.dumps(out))
"""

TRAFFIC = """
import json, select, sys, time, urllib.request
url, interval, sent, failed = sys.argv[1], float(sys.argv[2]), 0, []
while not select.select([sys.stdin], [], [], interval)[0]:
    sent += 1
    started = time.time()
    try:
        with urllib.request.urlopen(url, timeout=5) as r:
            r.read()
    except Exception as exc:
        failed.append([started, f"{type(exc).__name__}: {exc}"])
    if sent == 1:
        print("running", flush=True)
print(json.dumps({"sent": sent, "failed": failed}))
"""
"""Requests ``url`` every ``interval`` seconds until a line comes on stdin; says ``running`` after its first request
and ends with a JSON line of what it sent and what failed."""


def echo_deployment(name: str, replicas: int, pod_labels: dict[str, str] | None = None) -> dict[str, Any]:
    return {
        "apiVersion": "apps/v1",
        "kind": "Deployment",
        "metadata": {"name": name},
        "spec": {
            "replicas": replicas,
            "selector": {"matchLabels": {"app": name}},
            "template": {
                "metadata": {"labels": {"app": name, **(pod_labels or {})}},
                "spec": {"terminationGracePeriodSeconds": GRACE, "containers": [http_echo_container(8080)]},
            },
        },
    }


def echo_service(name: str, labels: dict[str, str] | None = None) -> dict[str, Any]:
    return {
        "apiVersion": "v1",
        "kind": "Service",
        "metadata": {"name": name, "labels": labels or {}},
        "spec": {"selector": {"app": name}, "ports": [{"name": "http", "port": 80, "targetPort": 8080}]},
    }


def local_only_deployment() -> dict[str, Any]:
    """An app that listens on 127.0.0.1 only (upstream's ``http-localhost`` port): ready once running."""
    server = {
        "name": "local",
        "image": "none",
        "command": ["python3", "-m", "http.server", "--bind", "127.0.0.1", "8080"],
    }
    deployment = echo_deployment("local-only", 1)
    deployment["spec"]["template"]["spec"]["containers"] = [server]
    return deployment


@pytest.fixture(scope="module")
def lab(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Lab]:
    with module_on_shared_lab(tmp_path_factory) as up:
        up.namespace(NS)
        up.kubectl("label", "namespace", NS, "istio.io/dataplane-mode=ambient")
        kubeconfig = str(up.topology.kubeconfig)
        for name, kind in (("waypoint-service", "service"), ("waypoint-workload", "workload")):
            ambit("waypoint", "apply", "-n", NS, "--name", name, "--for", kind, "--kubeconfig", kubeconfig)
        up.apply(
            echo_deployment("captured", 2),
            echo_service("captured"),
            echo_deployment("svc-wp", 1),
            echo_service("svc-wp", {"istio.io/use-waypoint": "waypoint-service"}),
            echo_deployment("wl-wp", 1, {"istio.io/use-waypoint": "waypoint-workload"}),
            echo_service("wl-wp"),
            local_only_deployment(),
            {
                **echo_service("local-only"),
                "spec": {**echo_service("local-only")["spec"], "selector": {"app": "local-only"}},
            },
            {
                **echo_service("local-only-wp", {"istio.io/use-waypoint": "waypoint-service"}),
                "spec": {**echo_service("local-only-wp")["spec"], "selector": {"app": "local-only"}},
            },
            pod_manifest("client", [sleeper()], labels={"app": "client"}),
            pod_manifest("outsider", [sleeper()], labels={"app": "outsider", "istio.io/dataplane-mode": "none"}),
            namespace=NS,
        )
        up.wait_pods_ready(NS, "", 9, timeout=180)  # 7 of ours and the two waypoints
        yield up
        assert up.log_tracebacks() == []


def calls(lab: Lab, source: str, url: str, count: int = 3) -> list[dict[str, Any]]:
    out = lab.exec(source, NS, "python3", "-c", CALLS, url, str(count), timeout=120)
    answers: list[dict[str, Any]] = json.loads(out)
    return answers


def vip(lab: Lab, name: str) -> str:
    return str(lab.get("service", name, "-n", NS)["spec"]["clusterIP"])


def pod_of(lab: Lab, app: str) -> dict[str, Any]:
    pods = [p for p in lab.pods(NS, f"app={app}") if not p["metadata"].get("deletionTimestamp")]
    assert len(pods) == 1, [p["metadata"]["name"] for p in pods]
    return pods[0]


def layer(answers: list[dict[str, Any]]) -> str:
    """``L7`` when every answer is a 200 that went through a waypoint, ``L4`` when every one is a 200 that did not,
    else a description of what came back."""
    if all(a.get("status") == 200 for a in answers):
        if all(a.get("request_id") for a in answers):
            return "L7"
        if not any(a.get("request_id") for a in answers):
            return "L4"
    return f"mixed: {answers}"


def test_pod_ip_and_service_addressing_choose_the_waypoint_as_istio_does(lab: Lab) -> None:
    """TestServices and TestPodIP: which call a waypoint sees depends on how the destination is addressed and on
    what the waypoint is for."""
    svc_wp, wl_wp = pod_of(lab, "svc-wp"), pod_of(lab, "wl-wp")
    svc_pod_url = f"http://{svc_wp['status']['podIP']}:8080/"
    wl_pod_url = f"http://{wl_wp['status']['podIP']}:8080/"
    # The waypoints become ready and get their bindings in their own time: wait until both carry L7.
    wait_until(
        "the service waypoint carries svc-wp's VIP",
        lambda: layer(calls(lab, "client", f"http://{vip(lab, 'svc-wp')}/")) == "L7",
        120,
        1.0,
    )
    wait_until(
        "the workload waypoint carries wl-wp's pod IP",
        lambda: layer(calls(lab, "client", wl_pod_url)) == "L7",
        120,
        1.0,
    )
    seen = {
        "client -> svc-wp VIP": layer(calls(lab, "client", f"http://{vip(lab, 'svc-wp')}/")),
        "client -> svc-wp pod IP": layer(calls(lab, "client", svc_pod_url)),
        "client -> wl-wp VIP": layer(calls(lab, "client", f"http://{vip(lab, 'wl-wp')}/")),
        "client -> wl-wp pod IP": layer(calls(lab, "client", wl_pod_url)),
        "outsider -> svc-wp VIP": layer(calls(lab, "outsider", f"http://{vip(lab, 'svc-wp')}/")),
        "outsider -> wl-wp pod IP": layer(calls(lab, "outsider", wl_pod_url)),
        "wl-wp -> its own pod IP": layer(calls(lab, wl_wp["metadata"]["name"], wl_pod_url)),
    }
    assert seen == {
        "client -> svc-wp VIP": "L7",
        "client -> svc-wp pod IP": "L4",
        "client -> wl-wp VIP": "L4",
        "client -> wl-wp pod IP": "L7",
        "outsider -> svc-wp VIP": "L4",
        "outsider -> wl-wp pod IP": "L4",
        "wl-wp -> its own pod IP": "L4",
    }
    # Pod IPs land on that pod; without a waypoint on the path the server sees the client's own address.
    assert {a["pod"] for a in calls(lab, "client", wl_pod_url)} == {wl_wp["metadata"]["name"]}
    client_ip = lab.pod("client", NS)["status"]["podIP"]
    direct = calls(lab, "client", f"http://{vip(lab, 'captured')}/")
    assert layer(direct) == "L4" and {a["client"].rsplit(":", 1)[0] for a in direct} == {client_ip}, direct


def waypoint_pod_ip(lab: Lab, name: str) -> str:
    pods = lab.pods(NS, f"gateway.networking.k8s.io/gateway-name={name}")
    running = [p for p in pods if not p["metadata"].get("deletionTimestamp") and p["status"].get("podIP")]
    assert running, f"no running pod of waypoint {name}"
    return str(running[0]["status"]["podIP"])


def test_direct_hbone_to_a_waypoint_serves_only_what_it_is_the_waypoint_for(lab: Lab, tmp_path: Path) -> None:
    """TestDirect "waypoint": an independent HTTP/2 client (Node.js) opens CONNECT tunnels straight to a waypoint's
    15008 with a workload certificate of the mesh (upstream: ``captured``'s identity). The waypoint serves its own
    Service's VIP on a declared port and its own workload's pod IP; it refuses a host name (istio/istio#43241), a
    port the Service does not declare, a VIP or pod it is not the waypoint for, and its own admin port 15000."""
    wait_until(
        "the service waypoint carries svc-wp's VIP",
        lambda: layer(calls(lab, "client", f"http://{vip(lab, 'svc-wp')}/")) == "L7",
        120,
        1.0,
    )
    files = workload_files(tmp_path, lab.topology.mesh_ca_dir, NS, "default", "captured")
    service_waypoint = waypoint_pod_ip(lab, "waypoint-service")
    workload_waypoint = waypoint_pod_ip(lab, "waypoint-workload")
    wl_wp, captured = pod_of(lab, "wl-wp"), lab.pods(NS, "app=captured")[0]
    cases = {
        "named destination": (workload_waypoint, f"wl-wp.{NS}.svc.cluster.local:80"),
        "VIP destination": (service_waypoint, f"{vip(lab, 'svc-wp')}:80"),
        "VIP destination, unknown port": (service_waypoint, f"{vip(lab, 'svc-wp')}:12345"),
        "Pod IP destination": (workload_waypoint, f"{wl_wp['status']['podIP']}:8080"),
        "Unserved VIP destination": (service_waypoint, f"{vip(lab, 'captured')}:80"),
        "Unserved pod destination": (workload_waypoint, f"{captured['status']['podIP']}:8080"),
        "Waypoint destination": (service_waypoint, f"{service_waypoint}:15000"),
    }
    seen = {name: node_connect(target, authority, files) for name, (target, authority) in cases.items()}
    served = {name for name, out in seen.items() if out.startswith("status 200 ")}
    assert served == {"VIP destination", "Pod IP destination"}, seen
    assert '"svc-wp-' in seen["VIP destination"] and f'"{wl_wp["metadata"]["name"]}"' in seen["Pod IP destination"]
    # Whatever is refused is refused at the tunnel: no inner request reached an application.
    assert not [out for out in seen.values() if out.startswith("inner ")], seen


def test_an_httproute_to_a_missing_backend_answers_500(lab: Lab) -> None:
    """TestWaypointWithInvalidBackend: the route applies at the service waypoint and its backend does not exist."""
    route = {
        "apiVersion": "gateway.networking.k8s.io/v1",
        "kind": "HTTPRoute",
        "metadata": {"name": "invalid-backend"},
        "spec": {
            "parentRefs": [{"name": "svc-wp", "kind": "Service", "group": "", "port": 80}],
            "rules": [
                {
                    "filters": [
                        {
                            "type": "RequestHeaderModifier",
                            "requestHeaderModifier": {"add": [{"name": "greeting", "value": "hello world!"}]},
                        }
                    ],
                    "backendRefs": [{"name": "invalid", "port": 80}],
                }
            ],
        },
    }
    url = f"http://{vip(lab, 'svc-wp')}/"
    lab.apply(route, namespace=NS)
    try:
        wait_until(
            "the waypoint answers 500 for a missing backend",
            lambda: [a.get("status") for a in calls(lab, "client", url)] == [500, 500, 500],
            90,
            1.0,
        )
    finally:
        lab.kubectl("delete", "httproute", "invalid-backend", "-n", NS, "--ignore-not-found")
    wait_until("svc-wp answers again", lambda: layer(calls(lab, "client", url)) == "L7", 90, 1.0)


def test_a_waypoint_of_another_revision_gets_no_deployment(lab: Lab) -> None:
    """TestOtherRevisionIgnored: ``waypoint apply --revision foo`` makes a Gateway this control plane leaves alone.
    Deploying waypoints takes well under the window watched here (the module's two were deployed in seconds)."""
    kubeconfig = str(lab.topology.kubeconfig)
    ambit("waypoint", "apply", "-n", NS, "--name", "other-rev", "--revision", "foo", "--kubeconfig", kubeconfig)
    try:
        gateway = lab.get("gateway", "other-rev", "-n", NS)
        assert gateway["metadata"]["labels"].get("istio.io/rev") == "foo", gateway["metadata"]
        deadline = time.monotonic() + 10
        while time.monotonic() < deadline:
            names = {d["metadata"]["name"] for d in lab.items("deployments", "-n", NS)}
            assert "other-rev" not in names, names
            time.sleep(1)
        status = lab.get("gateway", "other-rev", "-n", NS).get("status") or {}
        assert not status.get("addresses"), status
    finally:
        ambit("waypoint", "delete", "-n", NS, "other-rev", "--kubeconfig", kubeconfig, check=False)


def test_a_rollout_restart_of_the_destination_loses_no_request(lab: Lab) -> None:
    """TestServiceRestart: a captured and an uncaptured client call ``captured`` every 40 ms while its Deployment
    is restarted; every request succeeds (upstream's threshold is 100 %)."""
    url = f"http://{vip(lab, 'captured')}/"
    before = {p["metadata"]["name"] for p in lab.pods(NS, "app=captured")}
    clients = {
        source: subprocess.Popen(
            [
                sys.executable,
                "-m",
                "ambit.cli",
                "lab",
                "exec",
                "--dir",
                str(lab.directory),
                source,
                "-n",
                NS,
                "--",
                "python3",
                "-c",
                TRAFFIC,
                url,
                "0.04",
            ],
            stdin=subprocess.PIPE,
            stdout=subprocess.PIPE,
            stderr=subprocess.PIPE,
            text=True,
        )
        for source in ("client", "outsider")
    }
    results: dict[str, Any] = {}
    try:
        # The clients are calling before the restart and until the new pods are ready, so the whole rollout is
        # covered whatever the machine's speed (how many requests that makes is not the point).
        for source, process in clients.items():
            assert process.stdout is not None
            ready, _, _ = select.select([process.stdout], [], [], 60)
            assert ready and process.stdout.readline().strip() == "running", f"{source} never sent its first request"
        lab.kubectl("rollout", "restart", "deployment/captured", "-n", NS)

        def replaced() -> bool:
            pods = lab.pods(NS, "app=captured")
            names = {p["metadata"]["name"] for p in pods}
            return (
                len(pods) == 2
                and not (names & before)
                and all((p.get("status") or {}).get("phase") == "Running" for p in pods)
            )

        wait_until("captured's pods all replaced", replaced, 240, 1.0)
        lab.wait_pods_ready(NS, "app=captured", 2, timeout=60)
    finally:
        for source, process in clients.items():
            out, err = process.communicate("stop\n", timeout=60)
            results[source] = json.loads(out or "{}") if process.returncode == 0 else {"stderr": err}
    for source, result in results.items():
        print(f"{source}: {result.get('sent')} requests, failed: {result.get('failed')}")
    assert all(r.get("sent", 0) > 1 and r.get("failed") == [] for r in results.values()), results


API_CALL = """
import json, ssl, sys, urllib.request
request = urllib.request.Request("https://kubernetes.default.svc/", headers={"Authorization": "Bearer " + sys.argv[1]})
context = ssl.create_default_context()
context.check_hostname, context.verify_mode = False, ssl.CERT_NONE
try:
    with urllib.request.urlopen(request, timeout=10, context=context) as r:
        print(json.dumps({"status": r.status, "body": r.read().decode()}))
except urllib.error.HTTPError as exc:
    print(json.dumps({"status": exc.code, "body": exc.read().decode()}))
"""


def test_a_pod_reaches_the_api_server_with_its_own_identity(lab: Lab) -> None:
    """TestAPIServer: a captured pod and an uncaptured one call ``https://kubernetes.default.svc/`` with a token
    of their namespace's ``default`` account (audience ``kubernetes.default.svc``); the API server names that
    account in its answer, not the node proxy's."""
    token = lab.kubectl(
        "create", "token", "default", "-n", NS, "--audience", "kubernetes.default.svc", "--duration", "600s"
    ).stdout.strip()
    for source in ("client", "outsider"):
        answer = json.loads(lab.exec(source, NS, "python3", "-c", API_CALL, token, timeout=60))
        assert f"system:serviceaccount:{NS}:default" in answer["body"], (source, answer)


def test_an_application_listening_on_localhost_only_is_not_reachable_through_the_mesh(lab: Lab) -> None:
    """TestServices, port ``http-localhost``: upstream expects an error or a 503, by the Service and through its
    waypoint; the mesh never dials the pod's loopback for it."""
    for service in ("local-only", "local-only-wp"):
        answers = calls(lab, "client", f"http://{vip(lab, service)}/", 2)
        assert all(a.get("status") in (0, 503) for a in answers), (service, answers)
