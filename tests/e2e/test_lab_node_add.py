"""A node added to a running lab with the mesh installed (issue 16, "Done when": "a node added to the lab gets the
DaemonSet pods and its taint removed once the node agent is ready; a pod scheduled before that waits").

``ambit lab node add`` joins ``node-3``: it registers with ``cni.istio.io/not-ready=true:NoSchedule`` (kubelet's
``--register-with-taints``). An ambient pod created for it right away stays Pending (the scheduler names the taint);
the node agent and node proxy DaemonSets tolerate the taint and land there; once the node agent is Ready the
control plane's untaint controller removes the taint; the pod is then scheduled, enrolled by the node agent, and
reaches a pod on node-1 through the node proxies (their access logs show the SPIFFE identity). ``running_lab``
checks that ``ambit lab down`` leaves nothing of the three nodes behind.

Then ``ambit lab node remove node-3`` takes it away again (:mod:`ambit.lab.cluster.leave`): a pod no controller
owns stops the drain unless ``--force``; a PodDisruptionBudget with ``minAvailable`` equal to its Deployment's
replicas stops it too (the eviction is refused until ``--timeout``; the error names the pod and the budget; the node
stays cordoned), and once the budget can spare the pod the drain finishes; Deployment pods come back on the other
nodes; the DaemonSet pods, the Node, its namespace, link and routes are gone; the next add takes the name again.
"""

from __future__ import annotations

import json
import subprocess
import sys
import time
from collections.abc import Iterator
from typing import Any

import pytest
from tests.e2e.lab_driver import (
    TEST_TIMEOUT,
    Lab,
    condition,
    deployment_manifest,
    http_echo_container,
    is_ready,
    netns_names,
    pod_manifest,
    running_lab,
    sleeper,
    wait_until,
)

from ambit.lab.network.topology import Topology

pytestmark = [pytest.mark.root, pytest.mark.kubectl, pytest.mark.timeout(TEST_TIMEOUT)]

SYSTEM = "istio-system"
TAINT = {"key": "cni.istio.io/not-ready", "value": "true", "effect": "NoSchedule"}


@pytest.fixture(scope="module")
def lab(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Lab]:
    with running_lab(tmp_path_factory.mktemp("e2e-nodeadd"), mesh=True) as up:
        yield up
        assert up.log_tracebacks() == []


def _node(lab: Lab, name: str) -> dict[str, Any] | None:
    done = lab.kubectl("get", "node", name, "-o", "json", check=False)
    return json.loads(done.stdout) if done.returncode == 0 else None


def _taints(lab: Lab, name: str) -> list[dict[str, Any]]:
    node = _node(lab, name)
    return list((node or {}).get("spec", {}).get("taints") or [])


def _ready_component(lab: Lab, app: str, node: str) -> dict[str, Any] | None:
    pods = [p for p in lab.pods(SYSTEM, app) if p["spec"].get("nodeName") == node and is_ready(p)]
    return pods[0] if pods else None


def test_an_added_node_waits_for_its_node_agent_before_ambient_pods_run_there(lab: Lab, namespace: str) -> None:
    lab.kubectl("label", "namespace", namespace, "istio.io/dataplane-mode=ambient")
    lab.apply(pod_manifest("server", [http_echo_container()], node="node-1"), namespace=namespace)
    lab.wait_pods_ready(namespace, "app=server", 1, timeout=60)

    started = time.monotonic()
    adding = subprocess.Popen(
        [sys.executable, "-m", "ambit.cli", "lab", "node", "add", "--dir", str(lab.directory)],
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
    )
    try:
        # The pod is created as soon as the Node exists: before its node agent can be ready.
        node = wait_until("node-3 registered", lambda: _node(lab, "node-3"), timeout=60, interval=0.05)
        lab.apply(pod_manifest("client", [sleeper()], node="node-3"), namespace=namespace)
        out, err = adding.communicate(timeout=90)
    finally:
        if adding.poll() is None:
            adding.kill()
            adding.wait()
    assert adding.returncode == 0, err
    assert "node-3 joined" in out
    assert node["spec"]["taints"] == [TAINT]  # registered with it, from the first moment

    def pending_on_the_taint() -> dict[str, Any]:
        scheduled = condition(lab.pod("client", namespace), "PodScheduled")
        return scheduled if scheduled.get("reason") == "Unschedulable" else {}

    scheduled = wait_until("the client Pending on the taint", pending_on_the_taint, timeout=30)
    assert "untolerated taint {cni.istio.io/not-ready: true}" in scheduled["message"], scheduled
    assert not lab.pod("client", namespace)["spec"].get("nodeName")

    # The DaemonSets tolerate the taint and land on the new node; the node agent's readiness lifts it.
    agent = wait_until(
        "a ready node agent on node-3", lambda: _ready_component(lab, "k8s-app=istio-cni-node", "node-3"), 120
    )
    wait_until("a ready node proxy on node-3", lambda: _ready_component(lab, "app=ztunnel", "node-3"), 120)
    wait_until("the taint removed from node-3", lambda: _taints(lab, "node-3") == [], 60)
    untainted = time.monotonic() - started

    client = lab.wait_pods_ready(namespace, "app=client", 1, timeout=90)[0]
    assert client["spec"]["nodeName"] == "node-3"
    # Bound only once the node agent there was Ready: the scheduler's Scheduled event against the agent's Ready
    # condition (RFC 3339 times, compared to the second as text).
    (bound,) = [e for e in lab.events(namespace, "client") if e.get("reason") == "Scheduled"]
    bound_at = str(bound.get("eventTime") or bound.get("firstTimestamp"))[:19]
    assert bound_at >= condition(agent, "Ready")["lastTransitionTime"][:19], (bound, agent["status"])
    assert client["metadata"]["annotations"]["ambient.istio.io/redirection"] == "enabled"

    server_ip = lab.pod("server", namespace)["status"]["podIP"]
    code = f"import urllib.request;print(urllib.request.urlopen('http://{server_ip}:8080/',timeout=5).read().decode())"
    answer = json.loads(lab.exec("client", namespace, "python3", "-c", code))
    assert answer["pod"] == "server"
    identity = f"spiffe://cluster.local/ns/{namespace}/sa/default"

    def proxy_log(node: str) -> str:
        proxy = _ready_component(lab, "app=ztunnel", node)
        assert proxy is not None
        path = lab.directory / "pods" / proxy["metadata"]["uid"] / "istio-proxy.log"
        return path.read_text(errors="replace")

    wait_until(
        "the node proxies' access log of the HBONE connection",
        lambda: f"src.identity={identity}" in proxy_log("node-3") and 'direction="inbound"' in proxy_log("node-1"),
        timeout=10,
    )
    print(f"node-3 untainted {untainted:.1f} s after `ambit lab node add` started")


def test_node_add_refuses_bad_taints_and_a_missing_lab(lab: Lab, tmp_path: Any) -> None:
    def add(*args: str) -> subprocess.CompletedProcess[str]:
        return subprocess.run(
            [sys.executable, "-m", "ambit.cli", "lab", "node", "add", *args],
            capture_output=True,
            text=True,
            timeout=30,
            check=False,
        )

    done = add("--dir", str(lab.directory), "--taint", "dedicated=x:Sometimes")
    assert done.returncode == 2 and "the effect must be one of" in done.stderr, done.stderr
    assert "Traceback" not in done.stderr
    done = add("--dir", str(lab.directory), "--taint", "a:NoSchedule", "--no-taint")
    assert done.returncode == 2 and "contradict" in done.stderr
    done = add("--dir", str(tmp_path / "nolab"))
    assert done.returncode == 1 and "no lab in" in done.stderr


def _remove(lab: Lab, *args: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [sys.executable, "-m", "ambit.cli", "lab", "node", "remove", *args, "--dir", str(lab.directory)],
        capture_output=True,
        text=True,
        timeout=240,
        check=False,
    )


def _routes(netns: str | None) -> str:
    where = ["-n", netns] if netns else []
    return subprocess.run(["ip", *where, "route"], capture_output=True, text=True, check=True).stdout


def test_a_removed_node_is_drained_and_leaves_nothing_behind(lab: Lab, namespace: str) -> None:
    if _node(lab, "node-3") is None:  # the add test above failed or was deselected
        done = subprocess.run(
            [sys.executable, "-m", "ambit.cli", "lab", "node", "add", "--no-taint", "--dir", str(lab.directory)],
            capture_output=True,
            text=True,
            timeout=120,
            check=False,
        )
        assert done.returncode == 0, done.stderr
    wait_until("a ready node proxy on node-3", lambda: _ready_component(lab, "app=ztunnel", "node-3"), 120)
    lab.apply(pod_manifest("lone", [sleeper()], node="node-3"), namespace=namespace)
    lab.apply(deployment_manifest("web", 3, http_echo_container()), namespace=namespace)
    lab.wait_pods_ready(namespace, "app=web", 3, timeout=90)
    lab.wait_pods_ready(namespace, "app=lone", 1, timeout=60)
    on_node_3 = [p["metadata"]["name"] for p in lab.pods(namespace, "app=web") if p["spec"]["nodeName"] == "node-3"]
    grown = Topology.load(lab.directory)  # the lab's own topology object predates node-3
    node3 = grown.node_named("node-3") if grown else None
    assert node3 is not None

    done = _remove(lab, "node-9")
    assert done.returncode == 1 and "no node 'node-9' in this lab" in done.stderr, done.stderr
    # A pod no controller owns: the drain refuses, as kubectl's does, and leaves the node cordoned and running.
    done = _remove(lab, "node-3")
    assert done.returncode == 1, done.stderr
    assert f"no controller would recreate {namespace}/lone" in done.stderr and "Traceback" not in done.stderr
    assert (_node(lab, "node-3") or {})["spec"].get("unschedulable") is True
    assert is_ready(lab.pod("lone", namespace))

    # A budget that cannot spare the one pod of a Deployment pinned to node-3: the eviction is refused until the
    # drain's time is up, and the node stays cordoned with the pod running.
    guarded = deployment_manifest("guarded", 1, sleeper())
    guarded["spec"]["template"]["spec"]["nodeSelector"] = {"kubernetes.io/hostname": "node-3"}
    budget = {
        "apiVersion": "policy/v1",
        "kind": "PodDisruptionBudget",
        "metadata": {"name": "guarded"},
        "spec": {"minAvailable": 1, "selector": {"matchLabels": {"app": "guarded"}}},
    }
    lab.kubectl("uncordon", "node-3")
    lab.apply(guarded, budget, namespace=namespace)
    (held,) = lab.wait_pods_ready(namespace, "app=guarded", 1, timeout=60)

    def budget_status() -> dict[str, Any]:
        status: dict[str, Any] = lab.get("pdb", "guarded", "-n", namespace).get("status") or {}
        return status

    wait_until("the budget's status", lambda: budget_status().get("currentHealthy") == 1, timeout=30)
    assert budget_status()["disruptionsAllowed"] == 0
    done = _remove(lab, "node-3", "--force", "--timeout", "8")
    assert done.returncode == 1, done.stderr
    assert "would violate their disruption budget" in done.stderr and "Traceback" not in done.stderr
    assert f"{namespace}/{held['metadata']['name']}" in done.stderr
    assert "The disruption budget guarded needs 1 healthy pods and has 1 currently" in done.stderr
    assert (_node(lab, "node-3") or {})["spec"].get("unschedulable") is True
    assert is_ready(lab.pod(held["metadata"]["name"], namespace))

    # A budget that can spare it: the drain finishes.
    lab.kubectl("patch", "pdb", "guarded", "-n", namespace, "--type=merge", "-p", '{"spec": {"minAvailable": 0}}')
    wait_until("the budget to allow a disruption", lambda: budget_status().get("disruptionsAllowed") == 1, timeout=30)
    started = time.monotonic()
    done = _remove(lab, "node-3", "--force")
    took = time.monotonic() - started
    assert done.returncode == 0, done.stderr
    assert "node-3 left the lab" in done.stdout
    assert _node(lab, "node-3") is None
    assert [p for p in lab.items("pods", "-A") if p["spec"].get("nodeName") == "node-3"] == []
    web = lab.wait_pods_ready(namespace, "app=web", 3, timeout=90)
    assert {p["spec"]["nodeName"] for p in web} <= {"node-1", "node-2"}
    assert node3.netns not in netns_names()
    assert node3.pod_cidr not in _routes(lab.node_addresses("node-1").netns)
    assert node3.pod_cidr not in _routes(None)
    assert not (lab.directory / "nodes" / "node-3").exists()
    ds = lab.get("daemonset", "ztunnel", "-n", SYSTEM)
    wait_until(
        "the node proxy DaemonSet's status without node-3",
        lambda: lab.get("daemonset", "ztunnel", "-n", SYSTEM)["status"].get("desiredNumberScheduled") == 2,
        timeout=30,
    )
    print(f"node-3 removed in {took:.1f} s (web pods there before: {on_node_3}; ds {ds['status']})")

    # The name and addresses are free again: the next add takes them.
    done = subprocess.run(
        [sys.executable, "-m", "ambit.cli", "lab", "node", "add", "--dir", str(lab.directory)],
        capture_output=True,
        text=True,
        timeout=120,
        check=False,
    )
    assert done.returncode == 0 and "node-3 joined" in done.stdout, done.stderr
    wait_until("a ready node proxy on node-3 again", lambda: _ready_component(lab, "app=ztunnel", "node-3"), 120)
