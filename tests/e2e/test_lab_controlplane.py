"""The control plane on the lab (issue 6): node proxies learn workloads over delta xDS, follow readiness, and keep
serving through a control-plane restart.

The module runs on the shared mesh lab (tests/e2e/lab_driver.py ``shared_mesh_lab``: the mesh installed from deploy/,
the control plane the istiod pod's container). Namespace ``cp-amb`` is ambient: a client on node 1, a server on node
2. The restart test kills the control plane; kubelet starts it again, and the next module finds the mesh ready.
"""

from __future__ import annotations

import json
import os
import signal
import time
from collections.abc import Iterator
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
SHARES_THE_MESH_LAB = True  # tests/e2e/lab_driver.py shared_mesh_lab: one lab for the modules that share it

NS = "cp-amb"
PROPAGATION_BOUND = 10.0
"""Seconds within which a change must reach every node proxy (measured figures are printed)."""

HTTP_GET = """
import sys, urllib.request
try:
    with urllib.request.urlopen(sys.argv[1], timeout=3) as r:
        print("ok", r.status)
except Exception as exc:
    print("error", type(exc).__name__)
"""


def config_dump(lab: Lab, node_index: int) -> dict[str, Any]:
    dump: dict[str, Any] = json.loads(lab.node_proxy_admin(lab.topology.node(node_index).name, "/config_dump"))
    return dump


def workload_status(lab: Lab, node_index: int, name: str) -> str | None:
    for workload in config_dump(lab, node_index)["workloads"]:
        if workload["name"] == name and workload["namespace"] == NS:
            return str(workload.get("status", "Healthy"))
    return None


def on_every_proxy(lab: Lab, predicate: Any) -> bool:
    return all(predicate(lab, index) for index in range(1, lab.topology.nodes + 1))


def get(lab: Lab, url: str) -> str:
    return lab.exec("client", NS, "python3", "-c", HTTP_GET, url, timeout=20).strip()


@pytest.fixture(scope="module")
def lab(lab: Lab) -> Iterator[Lab]:
    """The shared lab (conftest's ``lab``) with this module's ambient namespace, client and server."""
    n1, n2 = (node.name for node in lab.topology.all_nodes())
    lab.namespace(NS)
    lab.kubectl("label", "namespace", NS, "istio.io/dataplane-mode=ambient")
    lab.apply(
        pod_manifest("client", [sleeper()], node=n1, labels={"app": "client"}),
        pod_manifest("server", [http_echo_container(8080)], node=n2, labels={"app": "server"}),
        namespace=NS,
    )
    lab.wait_pods_ready(NS, "", 2, timeout=60)
    server_ip = lab.pod("server", NS)["status"]["podIP"]
    wait_until("client reaches server", lambda: get(lab, f"http://{server_ip}:8080/") == "ok 200", timeout=30)
    yield lab
    assert lab.log_tracebacks() == []


def test_a_new_pod_reaches_every_node_proxy_and_its_removal_too(lab: Lab) -> None:
    n2 = lab.topology.node(2).name
    start = time.monotonic()
    lab.apply(pod_manifest("late", [http_echo_container(8080)], node=n2, labels={"app": "late"}), namespace=NS)
    wait_until(
        "the new pod on every node proxy",
        lambda: on_every_proxy(lab, lambda lb, i: workload_status(lb, i, "late") is not None),
        timeout=PROPAGATION_BOUND + 30,
    )
    added = time.monotonic() - start
    start = time.monotonic()
    lab.kubectl("delete", "pod", "late", "-n", NS, "--grace-period=0", "--force", "--wait=false")
    wait_until(
        "the deleted pod gone from every node proxy",
        lambda: on_every_proxy(lab, lambda lb, i: workload_status(lb, i, "late") is None),
        timeout=PROPAGATION_BOUND,
    )
    removed = time.monotonic() - start
    print(f"\npropagation to both node proxies: add (incl. pod start) {added:.2f} s, removal {removed:.2f} s")


def test_service_endpoints_follow_pod_readiness(lab: Lab) -> None:
    n2 = lab.topology.node(2).name
    flag = "/tmp/ready"  # the container's own /tmp: exec probes run inside the container
    container = http_echo_container(8080)
    container["readinessProbe"] = {"exec": {"command": ["test", "-f", flag]}, "periodSeconds": 1}
    lab.apply(
        pod_manifest("toggle", [container], node=n2, labels={"app": "toggle"}),
        service_manifest("toggle", {"app": "toggle"}, 80, 8080),
        namespace=NS,
    )
    vip = lab.get("service", "toggle", "-n", NS)["spec"]["clusterIP"]
    wait_until(
        "the unready pod known as Unhealthy",
        lambda: on_every_proxy(lab, lambda lb, i: workload_status(lb, i, "toggle") == "Unhealthy"),
        timeout=30,
    )
    assert get(lab, f"http://{vip}/").startswith("error"), "no healthy endpoint: the VIP must not answer"
    lab.exec("toggle", NS, "touch", flag)
    wait_until(
        "the ready pod known as Healthy",
        lambda: on_every_proxy(lab, lambda lb, i: workload_status(lb, i, "toggle") == "Healthy"),
        timeout=PROPAGATION_BOUND + 5,
    )
    assert get(lab, f"http://{vip}/") == "ok 200"
    lab.exec("toggle", NS, "rm", flag)
    wait_until(
        "the pod Unhealthy again",
        lambda: on_every_proxy(lab, lambda lb, i: workload_status(lb, i, "toggle") == "Unhealthy"),
        timeout=PROPAGATION_BOUND + 5,
    )


def test_the_control_plane_reports_istiods_metrics_on_its_monitoring_port(lab: Lab) -> None:
    """Scraped as a Prometheus would (before the restart below, which starts every counter again)."""
    from prometheus_client.parser import text_string_to_metric_families

    def samples() -> dict[tuple[str, tuple[tuple[str, str], ...]], float]:
        out = {}
        for family in text_string_to_metric_families(lab.control_plane_metrics()):
            for sample in family.samples:
                name = family.name if family.type == "counter" else sample.name  # istiod's counters: no _total
                out[name, tuple(sorted(sample.labels.items()))] = sample.value
        return out

    def total(series: dict[tuple[str, tuple[tuple[str, str], ...]], float], name: str, **labels: str) -> float:
        wanted = set(labels.items())
        return sum(v for (n, ls), v in series.items() if n == name and wanted <= set(ls))

    nodes = lab.topology.nodes

    def connected() -> dict[tuple[str, tuple[tuple[str, str], ...]], float] | None:
        series = samples()
        ready = total(series, "pilot_xds") >= nodes and total(series, "pilot_xds_pushes", type="wds") >= nodes
        return series if ready else None

    series = wait_until("every node proxy connected and pushed to", connected, timeout=30)
    assert series is not None
    assert total(series, "pilot_k8s_reg_events", type="Pods", event="add") >= 2  # client and server at least
    assert total(series, "citadel_server_success_cert_issuance_count") >= 2  # their certificates
    assert total(series, "citadel_server_csr_count") >= total(series, "citadel_server_success_cert_issuance_count")
    assert total(series, "citadel_server_root_cert_expiry_timestamp") > time.time()
    assert total(series, "istio_build", component="pilot") == 1
    print(
        f"control plane: {total(series, 'pilot_xds'):.0f} xDS clients, "
        f"{total(series, 'pilot_xds_pushes'):.0f} responses, "
        f"{total(series, 'citadel_server_success_cert_issuance_count'):.0f} certificates"
    )


def test_traffic_flows_through_a_control_plane_restart_and_proxies_resync(lab: Lab) -> None:
    server_ip = lab.pod("server", NS)["status"]["podIP"]
    first = lab.component_pid("controlplane")
    assert first is not None
    os.kill(first, signal.SIGKILL)
    # The node proxies keep their last state: traffic keeps flowing while the control plane is away.
    results = [get(lab, f"http://{server_ip}:8080/outage{i}") for i in range(3)]
    assert results == ["ok 200"] * 3
    n1 = lab.topology.node(1).name
    lab.apply(pod_manifest("after", [http_echo_container(8080)], node=n1, labels={"app": "after"}), namespace=NS)

    def restarted() -> int | None:
        pid = lab.component_pid("controlplane")
        return pid if pid not in (None, first) else None

    # The kubelet restarts the container of the istiod pod.
    wait_until("the control plane restarted", restarted, timeout=60)
    wait_until(
        "the proxies resync and learn the new pod",
        lambda: on_every_proxy(lab, lambda lb, i: workload_status(lb, i, "after") == "Healthy"),
        timeout=60,
    )
    after_ip = lab.pod("after", NS)["status"]["podIP"]
    assert get(lab, f"http://{after_ip}:8080/") == "ok 200"
    assert get(lab, f"http://{server_ip}:8080/") == "ok 200"


INVALID_POLICY = """
apiVersion: security.istio.io/v1
kind: AuthorizationPolicy
metadata: {name: bad-ports, namespace: cp-amb}
spec:
  action: ALLOW
  rules:
  - to:
    - operation: {ports: ["8080", "http"]}
"""


def test_the_validating_webhook_refuses_an_invalid_policy_naming_the_field(lab: Lab) -> None:
    done = lab.kubectl("apply", "-f", "-", input=INVALID_POLICY, check=False)
    assert done.returncode != 0
    assert "spec.rules[0].to[0].operation.ports[1]" in done.stderr, done.stderr
    good = INVALID_POLICY.replace('"http"', '"9090"').replace("bad-ports", "good-ports")
    lab.kubectl("apply", "-f", "-", input=good)


def test_node_authorization_refuses_an_identity_that_runs_only_on_another_node(lab: Lab) -> None:
    import asyncio

    from ambit.identity.caclient import CaError
    from ambit.identity.istiod import IstiodCaClient
    from ambit.model.identity import SpiffeId

    n2 = lab.topology.node(2).name
    lab.kubectl("create", "serviceaccount", "only-n2", "-n", NS)
    pod = pod_manifest("only-n2", [http_echo_container(8080)], node=n2, labels={"app": "only-n2"})
    pod["spec"]["serviceAccountName"] = "only-n2"
    lab.apply(pod, namespace=NS)
    lab.wait_pods_ready(NS, "app=only-n2", 1, timeout=30)
    identity = SpiffeId("cluster.local", NS, "only-n2")

    async def fetch(node: str) -> str:
        root, token = lab.node_proxy_credentials(node)
        client = IstiodCaClient(lab.control_plane_address(), root, token, server_name="istiod.istio-system.svc")
        try:
            cert = await client.fetch_certificate(identity)
            return str(cert.identity)
        except CaError as exc:
            return f"refused: {exc}"
        finally:
            await client.aclose()

    node1, node2 = (n.name for n in lab.topology.all_nodes())
    assert asyncio.run(fetch(node2)) == str(identity)
    refused = asyncio.run(fetch(node1))
    assert refused.startswith("refused") and "UNAUTHENTICATED" in refused.upper(), refused


def test_an_xds_client_without_a_token_gets_nothing(lab: Lab) -> None:
    import asyncio

    from ambit.model.state import WorkloadState
    from ambit.xds.client import XdsClient

    async def attempt() -> tuple[bool, int]:
        state = WorkloadState()
        client = XdsClient(
            lab.control_plane_address(),
            state,
            lambda: None,
            root_cert_file=lab.node_proxy_credentials(lab.topology.node(1).name)[0],
            token_file=None,
            cluster_id="Kubernetes",
        )
        await client.start()
        await asyncio.sleep(3)
        synced = client.synced
        await client.aclose()
        return synced, len(state.workloads())

    assert asyncio.run(attempt()) == (False, 0)
