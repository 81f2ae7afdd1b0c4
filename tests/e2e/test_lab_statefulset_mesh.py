"""A StatefulSet in the mesh on the shared 2-node lab, as Istio's test framework deploys its headless echo apps: a
headless Service and an ambient StatefulSet whose pods come up in ordinal order, each enrolled, each resolvable by
its own name (``<pod>.<service>.<namespace>.svc.cluster.local``) and reached through the node proxies with mutual
TLS; ``kubectl rollout status``, ``scale`` and ``rollout restart`` work on it as on a cluster."""

from __future__ import annotations

import json
import sys
from typing import Any

import pytest
from tests.e2e.lab_driver import (
    TEST_TIMEOUT,
    Lab,
    http_echo_container,
    pod_manifest,
    service_manifest,
    sleeper,
    wait_until,
)

pytestmark = [pytest.mark.root, pytest.mark.kubectl, pytest.mark.timeout(TEST_TIMEOUT)]
SHARES_THE_MESH_LAB = True  # tests/e2e/conftest.py lab: the shared mesh lab, in a namespace of the test's own

REDIRECTION = "ambient.istio.io/redirection"
RESOLVE = """
import json, socket, sys
print(json.dumps({n: sorted({a[4][0] for a in socket.getaddrinfo(n, None, socket.AF_INET)}) for n in sys.argv[1:]}))
"""


def statefulset(name: str, replicas: int) -> dict[str, Any]:
    return {
        "apiVersion": "apps/v1",
        "kind": "StatefulSet",
        "metadata": {"name": name},
        "spec": {
            "serviceName": name,
            "replicas": replicas,
            "selector": {"matchLabels": {"app": name}},
            "template": {
                "metadata": {"labels": {"app": name}},
                "spec": {"terminationGracePeriodSeconds": 2, "containers": [http_echo_container()]},
            },
        },
    }


def created(pod: dict[str, Any]) -> str:
    return str(pod["metadata"]["creationTimestamp"])


def test_an_ambient_statefulset_comes_up_in_order_enrolled_and_reachable_by_each_pods_name(
    lab: Lab, namespace: str
) -> None:
    lab.kubectl("label", "namespace", namespace, "istio.io/dataplane-mode=ambient")
    headless = service_manifest("web", {"app": "web"}, 8080, 8080)
    headless["spec"]["clusterIP"] = "None"
    lab.apply(headless, statefulset("web", 2), pod_manifest("client", [sleeper()]), namespace=namespace)
    lab.kubectl("rollout", "status", "statefulset/web", "-n", namespace, "--timeout=120s", timeout=150)
    pods = {p["metadata"]["name"]: p for p in lab.pods(namespace, "app=web")}
    assert sorted(pods) == ["web-0", "web-1"]
    assert created(pods["web-0"]) <= created(pods["web-1"])  # OrderedReady: web-1 only once web-0 was Ready
    for name, pod in pods.items():
        assert pod["spec"]["hostname"] == name and pod["spec"]["subdomain"] == "web"
    lab.wait_pods_ready(namespace, "app=client", 1, timeout=60)
    for name in [*pods, "client"]:
        wait_until(
            f"{name} enrolled",
            lambda n=name: lab.pod(n, namespace)["metadata"].get("annotations", {}).get(REDIRECTION) == "enabled",
            30,
        )

    names = [f"{p}.web.{namespace}.svc.cluster.local" for p in pods]
    want = {f"{p}.web.{namespace}.svc.cluster.local": [pod["status"]["podIP"]] for p, pod in pods.items()}
    resolved = lambda: json.loads(lab.exec("client", namespace, sys.executable, "-c", RESOLVE, *names)) == want  # noqa: E731
    wait_until("each pod's own name", resolved, 30)
    for pod_name in pods:
        url = f"http://{pod_name}.web:8080/"
        out = lab.exec(
            "client",
            namespace,
            sys.executable,
            "-m",
            "ambit.lab.apps",
            "client",
            "--url",
            url,
            "--count",
            "1",
            timeout=30,
        )
        assert " ok " in out, out
    principal = f'destination_principal="spiffe://cluster.local/ns/{namespace}/sa/default"'

    def through_the_mesh() -> bool:
        node = pods["web-0"]["spec"]["nodeName"]
        return any(
            line.startswith("istio_tcp_connections_opened_total{")
            and 'reporter="destination"' in line
            and principal in line
            and 'connection_security_policy="mutual_tls"' in line
            and 'destination_workload="web"' in line
            for line in lab.node_proxy_metrics(node).splitlines()
        )

    wait_until("web-0's node proxy reports the mutual-TLS connection", through_the_mesh, 15)

    # Scale up adds the next ordinal; a rollout restart replaces every pod, highest ordinal first, under its name.
    lab.kubectl("scale", "statefulset/web", "-n", namespace, "--replicas=3")
    lab.kubectl("rollout", "status", "statefulset/web", "-n", namespace, "--timeout=120s", timeout=150)
    before = {p["metadata"]["name"]: p["metadata"]["uid"] for p in lab.pods(namespace, "app=web")}
    assert sorted(before) == ["web-0", "web-1", "web-2"]
    lab.kubectl("rollout", "restart", "statefulset/web", "-n", namespace)
    lab.kubectl("rollout", "status", "statefulset/web", "-n", namespace, "--timeout=180s", timeout=210)
    after = {p["metadata"]["name"]: p for p in lab.pods(namespace, "app=web")}
    assert sorted(after) == sorted(before)
    assert all(after[n]["metadata"]["uid"] != before[n] for n in before), "every pod replaced"
    # Highest ordinal first (timestamps are whole seconds: a tie is allowed, an inversion is not).
    assert created(after["web-2"]) <= created(after["web-1"]) <= created(after["web-0"]), after
    status = lab.get("statefulset", "web", "-n", namespace)["status"]
    assert status["currentRevision"] == status["updateRevision"] and status["updatedReplicas"] == 3
