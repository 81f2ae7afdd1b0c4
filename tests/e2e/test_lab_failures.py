"""Failures on a real 2-node lab: a CNI plugin that fails ADD, and bad input of every kind; the lab stays healthy."""

from __future__ import annotations

import itertools
import json
import time
from collections.abc import Iterator
from datetime import datetime
from pathlib import Path
from typing import Any

import pytest
from tests.e2e.lab_driver import (
    TEST_TIMEOUT,
    Lab,
    condition,
    http_echo_container,
    is_ready,
    netns_names,
    pod_manifest,
    service_manifest,
    sleeper,
    wait_until,
)

pytestmark = [pytest.mark.root, pytest.mark.kubectl, pytest.mark.timeout(TEST_TIMEOUT)]

FAILING_PLUGIN = """#!/bin/sh
# A CNI plugin that refuses ADD (with a CNI error object on stdout) and accepts everything else.
cat >/dev/null
case "$CNI_COMMAND" in
ADD)
    printf '{"cniVersion":"1.0.0","code":111,"msg":"e2e-refuse says no","details":"test plugin"}\\n'
    exit 1 ;;
VERSION)
    printf '{"cniVersion":"1.0.0","supportedVersions":["0.3.0","0.3.1","0.4.0","1.0.0"]}\\n' ;;
esac
exit 0
"""
PLUGIN_ERROR = 'plugin type="e2e-refuse" failed (add): e2e-refuse says no: test plugin'


@pytest.fixture
def healthy_lab(lab: Lab) -> Iterator[Lab]:
    """The lab, checked after the test: both nodes Ready, their runtimes the same processes, no tracebacks."""
    runtimes = lab.runtime_pids()
    assert all(len(pids) == 1 for pids in runtimes.values()), runtimes
    yield lab
    assert lab.runtime_pids() == runtimes, "a node runtime died or was restarted"
    nodes = lab.items("nodes")
    assert sorted(n["metadata"]["name"] for n in nodes if condition(n, "Ready").get("status") == "True") == [
        "node-1",
        "node-2",
    ]
    assert lab.log_tracebacks() == []


def _event_times(event: dict[str, Any]) -> tuple[int, float]:
    """(occurrences so far, time of the last one) of a core/v1 Event folded into a series."""
    series = event.get("series") or {}
    last = series.get("lastObservedTime") or event.get("eventTime") or event.get("lastTimestamp")
    return int(series.get("count") or event.get("count") or 1), datetime.fromisoformat(str(last)).timestamp()


def test_a_failing_cni_plugin_keeps_the_pod_pending_until_it_is_removed(healthy_lab: Lab, namespace: str) -> None:
    lab = healthy_lab
    plugin = lab.topology.cni_bin_dir("node-1") / "e2e-refuse"
    conflist = lab.topology.cni_conf_dir("node-1") / "10-ambit-lab.conflist"
    original = conflist.read_text()
    plugin.write_text(FAILING_PLUGIN)
    plugin.chmod(0o755)
    chained = json.loads(original)
    chained["plugins"].append({"type": "e2e-refuse"})
    try:
        _write_atomically(conflist, json.dumps(chained, indent=2))
        lab.apply(pod_manifest("cni-blocked", [sleeper()], nodeName="node-1"), namespace=namespace)

        def failing() -> dict[str, Any]:
            pod = lab.pod("cni-blocked", namespace)
            return pod if condition(pod, "PodReadyToStartContainers").get("message") == PLUGIN_ERROR else {}

        pod = wait_until("the plugin's error in the pod's status", failing, 15)
        assert pod["status"]["phase"] == "Pending"
        assert condition(pod, "PodReadyToStartContainers")["reason"] == "FailedCreatePodSandBox"
        assert PLUGIN_ERROR in condition(pod, "Ready")["message"]
        assert "podIP" not in pod["status"]
        assert pod["status"]["containerStatuses"][0]["state"]["waiting"]["reason"] == "ContainerCreating"

        # Retries fold into one Warning Event's series; record when each occurrence was observed.
        seen: dict[int, float] = {}

        def three_attempts() -> bool:
            for event in lab.events(namespace, "cni-blocked"):
                if event["reason"] == "FailedCreatePodSandBox":
                    assert event["type"] == "Warning"
                    assert event["message"] == f"Failed to create pod sandbox: {PLUGIN_ERROR}"
                    count, at = _event_times(event)
                    seen.setdefault(count, at)
            return len(seen) >= 3

        wait_until("three sandbox attempts", three_attempts, 15, interval=0.1)
    finally:
        _write_atomically(conflist, original)
        plugin.unlink()

    pod = wait_until("the pod to run once the plugin is gone", lambda: _ready(lab, "cni-blocked", namespace), 20)
    assert pod["status"]["phase"] == "Running"
    assert condition(pod, "PodReadyToStartContainers")["status"] == "True"
    counts = sorted(seen)
    gaps = [(seen[b] - seen[a]) / (b - a) for a, b in itertools.pairwise(counts)]
    assert gaps == sorted(gaps) and gaps[-1] > 1.5 * gaps[0], f"retries should back off: {seen}"
    (event,) = [e for e in lab.events(namespace, "cni-blocked") if e["reason"] == "FailedCreatePodSandBox"]
    assert _event_times(event)[0] >= 3
    # Every failed ADD was undone (CNI DEL): node-1's host-local holds exactly its pods' addresses.
    wait_until("node-1's addresses to be its pods' addresses", lambda: _ipam_matches_pods(lab, "node-1"), 15)


def _write_atomically(path: Path, text: str) -> None:
    """Replace a file in one rename, so the runtime never reads half of it."""
    tmp = path.with_name(f".{path.name}.tmp")
    tmp.write_text(text)
    tmp.rename(path)


def _ready(lab: Lab, name: str, namespace: str) -> dict[str, Any]:
    pod = lab.pod(name, namespace)
    return pod if is_ready(pod) else {}


def _ipam_matches_pods(lab: Lab, node: str) -> bool:
    pods = lab.items("pods", "-A", "--field-selector", f"spec.nodeName={node}")
    return lab.ipam_files(node) == {p["status"]["podIP"] for p in pods if p["status"].get("podIP")}


def test_a_pod_without_containers_is_rejected_and_not_stored(healthy_lab: Lab, namespace: str) -> None:
    lab = healthy_lab
    empty = pod_manifest("empty", [])
    done = lab.kubectl("create", "-n", namespace, "-f", "-", "-v=6", input=json.dumps(empty), check=False)
    assert done.returncode != 0
    assert "422 Unprocessable Entity" in done.stderr
    assert "spec.containers: Required value" in done.stderr
    gone = lab.kubectl("get", "pod", "empty", "-n", namespace, check=False)
    assert gone.returncode != 0 and "NotFound" in gone.stderr


def test_a_command_that_does_not_exist_backs_off_and_the_node_keeps_serving(healthy_lab: Lab, namespace: str) -> None:
    lab = healthy_lab
    broken = {"name": "broken", "image": "none", "command": ["/nonexistent/e2e-command"]}
    lab.apply(pod_manifest("no-such-command", [broken], nodeName="node-2"), namespace=namespace)

    def backing_off() -> dict[str, Any]:
        status = (lab.pod("no-such-command", namespace)["status"].get("containerStatuses") or [{}])[0]
        waiting = (status.get("state") or {}).get("waiting") or {}
        return status if status.get("restartCount", 0) >= 1 and waiting.get("reason") == "CrashLoopBackOff" else {}

    status = wait_until("the broken container to back off", backing_off, 15)
    assert status["ready"] is False
    assert status["lastState"]["terminated"]["exitCode"] != 0
    assert "back-off" in status["state"]["waiting"]["message"]

    def failed_and_backoff() -> list[dict[str, Any]]:
        events = [e for e in lab.events(namespace, "no-such-command") if e["reason"] in ("Failed", "BackOff")]
        return events if {e["reason"] for e in events} == {"Failed", "BackOff"} else []

    for event in wait_until("Failed and BackOff Events", failed_and_backoff, 10):
        assert event["type"] == "Warning"
    log = lab.topology.pod_dir(lab.pod("no-such-command", namespace)["metadata"]["uid"]) / "broken.log"
    assert "/nonexistent/e2e-command" in log.read_text()

    lab.apply(pod_manifest("neighbour", [http_echo_container()], nodeName="node-2"), namespace=namespace)
    lab.wait_pods_ready(namespace, "app=neighbour", 1)
    assert lab.pod("no-such-command", namespace)["status"]["phase"] == "Running"  # restartPolicy Always


def test_a_pod_bound_to_an_unknown_node_stays_pending(healthy_lab: Lab, namespace: str) -> None:
    lab = healthy_lab
    lab.apply(pod_manifest("lost", [sleeper()], nodeName="node-9"), namespace=namespace)

    def reported() -> dict[str, Any]:
        pod = lab.pod("lost", namespace)
        return pod if condition(pod, "PodScheduled") else {}

    pod = wait_until("the scheduler to report the unknown node", reported, 10)
    assert condition(pod, "PodScheduled") | {"lastTransitionTime": ""} == {
        "type": "PodScheduled",
        "status": "False",
        "reason": "Unschedulable",
        "message": 'node "node-9" not found',
        "lastTransitionTime": "",
    }
    time.sleep(2)  # nothing else is supposed to happen: give it the chance to
    pod = lab.pod("lost", namespace)
    assert pod["spec"]["nodeName"] == "node-9", "a bound pod is never moved"
    assert pod["status"]["phase"] == "Pending"
    assert "podIP" not in pod["status"] and "containerStatuses" not in pod["status"], "no node runs it"
    assert lab.pod_netns(pod) not in netns_names()
    assert not lab.topology.pod_dir(pod["metadata"]["uid"]).exists()


def test_duplicate_names_are_refused(healthy_lab: Lab, namespace: str) -> None:
    lab = healthy_lab
    first = pod_manifest("twin", [sleeper()])
    lab.kubectl("create", "-n", namespace, "-f", "-", input=json.dumps(first))
    uid = lab.pod("twin", namespace)["metadata"]["uid"]
    second = pod_manifest("twin", [sleeper("other")])
    done = lab.kubectl("create", "-n", namespace, "-f", "-", "-v=6", input=json.dumps(second), check=False)
    assert done.returncode != 0
    assert "409 Conflict" in done.stderr and 'pods "twin" already exists' in done.stderr
    pod = lab.pod("twin", namespace)
    assert pod["metadata"]["uid"] == uid and [c["name"] for c in pod["spec"]["containers"]] == ["main"]
    lab.wait_pods_ready(namespace, "app=twin", 1)


def test_a_probe_that_never_passes_keeps_the_pod_out_of_ready_endpoints(healthy_lab: Lab, namespace: str) -> None:
    lab = healthy_lab
    container = http_echo_container()
    container["readinessProbe"] = {"exec": {"command": ["false"]}, "periodSeconds": 1}
    lab.apply(
        pod_manifest("unready", [container], labels={"app": "unready"}),
        service_manifest("unready", {"app": "unready"}, 80, 8080),
        namespace=namespace,
    )

    def unhealthy() -> list[dict[str, Any]]:
        return [e for e in lab.events(namespace, "unready") if e["reason"] == "Unhealthy"]

    (event,) = wait_until("an Unhealthy Event", unhealthy, 15)
    assert event["type"] == "Warning" and event["message"].startswith("Readiness probe failed")
    pod = lab.pod("unready", namespace)
    assert pod["status"]["phase"] == "Running" and not is_ready(pod)
    assert pod["status"]["containerStatuses"][0]["started"] is True

    def endpoints() -> list[dict[str, Any]]:
        slices = lab.items("endpointslices", "-n", namespace, "-l", "kubernetes.io/service-name=unready")
        return [ep for s in slices for ep in s.get("endpoints") or ()]

    (endpoint,) = wait_until("the pod in the Service's slice", endpoints, 10)
    assert endpoint["conditions"]["ready"] is False
    assert endpoint["addresses"] == [pod["status"]["podIP"]]
