"""The fault suite (issue 21): parts of the mesh die under a steady load; the mesh fails closed and recovers.

One 2-node lab with the mesh installed from deploy/ as on a cluster (``ambit lab up --install``: the node proxies
and node agents are DaemonSet pods, the control plane a Deployment's pod; the tests kill, stop and roll them through
the lab driver, :class:`tests.e2e.lab_driver.Lab`, and the kubelet or the controllers bring them back). The traffic
is :mod:`tests.faults.scene`'s: ``srv-1`` and ``cli-1`` on node-1, ``srv-2`` and ``cli-2`` on node-2 in an ambient
namespace, each client loading a same-node and a cross-node server (new connections at ``RATE`` per second per
pair, and one long-lived echoing stream per pair), and ``tcpdump`` watching every link of both nodes for the load's
marker in clear (:mod:`tests.faults.rig`).

Each test adds one row to the fault table (:mod:`tests.faults.report` defines the columns), printed at the end of
the run and written to ``bench/results/faults.md`` when the whole module ran. What is asserted is what the mesh
promises: no plaintext on a node link, no data lost, pairs that do not involve the failed part unaffected, and
recovery within generous bounds (the measured times are reported, never asserted tight).
"""

from __future__ import annotations

import json
import os
import signal
import subprocess
import time
from collections.abc import Iterator
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

import pytest
from tests.e2e.lab_driver import (
    TEST_TIMEOUT,
    Lab,
    condition,
    is_ready,
    pod_manifest,
    running_lab,
    sleeper,
    wait_until,
)
from tests.faults.report import ROWS, fault_row, markdown_table
from tests.faults.rig import REPO
from tests.faults.scene import (
    EVERY_PAIR,
    RATE,
    ROLLOUT_STATUS_BOUND,
    Scene,
    check_row,
    failures,
    kept_streams,
    rollout_under_load,
    set_up,
    steady_load,
    wait_enrolled,
    wait_recovered,
)

pytestmark = [pytest.mark.root, pytest.mark.kubectl, pytest.mark.timeout(TEST_TIMEOUT)]

NAMESPACE = "faults"
TABLE = REPO / "bench" / "results" / "faults.md"
FAULTS = 6


@pytest.fixture(scope="module")
def scene(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Scene]:
    with running_lab(tmp_path_factory.mktemp("faults"), install=True) as lab:
        lab.wait_mesh_ready()
        for node in (n.name for n in lab.topology.all_nodes()):
            wait_until(
                f"{node}'s node proxy connected to its node agent",
                lambda node=node: "node proxy connected" in lab.component_log("nodeagent", node),
                30,
            )
        lab.namespace(NAMESPACE)
        yield set_up(lab, NAMESPACE)
        assert lab.log_tracebacks() == []
    if len(ROWS) == FAULTS:
        stamp = datetime.now(UTC).strftime("%Y-%m-%d %H:%M UTC")
        TABLE.parent.mkdir(parents=True, exist_ok=True)
        TABLE.write_text(
            "# Fault suite (tests/faults, issue 21)\n\n"
            f"Measured {stamp} on a 2-node lab (mesh installed from deploy/), under {4 * RATE:g} new connections/s\n"
            "and one long-lived stream per client-server pair (same-node and cross-node). Columns:\n"
            "tests/faults/report.py.\n\n" + markdown_table(ROWS)
        )


def test_a_graceful_upgrade_of_every_node_proxy_keeps_streams_ending_in_its_window_and_refuses_none(
    scene: Scene, tmp_path: Path
) -> None:
    """The graceful upgrade: ``kubectl rollout restart daemonset/ztunnel`` (maxSurge 1, maxUnavailable 0, grace
    period 30 s as ztunnel's chart). On each node in turn the DaemonSet controller starts a new node proxy pod beside
    the old one, whose proxy binds every pod's listeners beside the old ones (SO_REUSEPORT) once the node agent gave
    it its snapshot and reports ready; then the old pod is deleted, and its proxy drains: its listeners close,
    inbound HBONE connections hear GOAWAY, and the connections it already relays run on, up to its grace period
    less 5 s. The load's streams, up before the restart, end on their own inside that window (about 12 s after the
    restart): none may break, no new connection may fail, and each old pod exits once its connections ended, before
    its deadline. (A stream outliving the window is cut at the deadline: tests/e2e/test_lab_rollout.py.)"""
    run = rollout_under_load(scene, tmp_path)
    rollout = run.rollout
    row = fault_row(
        "node proxy graceful upgrade (DaemonSet rollout, both nodes)",
        run.trial.records,
        rollout.began,
        run.window_end,
        run.trial.plaintext,
        note=f"new proxies ready in {rollout.seconds:.1f} s, rollout status {rollout.status_seconds():.1f} s; old"
        f" pods: {', '.join(sorted(set(run.drained.values())))}",
    )
    check_row(run.trial, row)
    assert failures(run.trial.records, rollout.began, run.window_end, EVERY_PAIR) == []
    assert row.kept == row.established and row.established == 4, row
    assert kept_streams(run.trial.records, EVERY_PAIR) == []
    assert run.drained == {o.node: "every connection ended" for o in rollout.old}, run.drained
    assert rollout.status.returncode == 0 and rollout.status_seconds() <= ROLLOUT_STATUS_BOUND, rollout.status


def test_node_proxy_kill_9_loses_its_nodes_connections_and_new_ones_succeed_again(scene: Scene, tmp_path: Path) -> None:
    """``kill -9`` of node-1's node proxy (the main process of its ztunnel container): the kubelet starts the
    container again in the same pod, which connects to the node agent and gets the snapshot again."""
    lab = scene.lab
    with steady_load(scene, tmp_path) as trial:
        time.sleep(1.5)
        old = wait_until("node-1's node proxy", lambda: lab.component_pid("nodeproxy", "node-1"), 10)
        killed_at = time.time()
        os.kill(old, signal.SIGKILL)
        wait_until(
            "node-1's node proxy restarted",
            lambda: (lab.component_pid("nodeproxy", "node-1") or old) != old,
            60,
            interval=0.05,
        )
        restarted = time.time() - killed_at
        took = wait_recovered(trial, killed_at)
        time.sleep(1.5)
        window_end = time.time()
    row = fault_row(
        "node proxy kill -9 (node-1)",
        trial.records,
        killed_at,
        window_end,
        trial.plaintext,
        note=f"container restarted by the kubelet {restarted:.1f} s after the kill; serving {took - restarted:.1f} s"
        " later",
    )
    check_row(trial, row)
    # node-2's own pair never touches node-1: nothing of it fails.
    assert failures(trial.records, killed_at, window_end, ("cli-2>srv-2",)) == []
    assert kept_streams(trial.records, ("cli-2>srv-2",)) == []


def test_with_no_node_proxy_an_enrolled_pods_connections_fail_closed(scene: Scene, tmp_path: Path) -> None:
    lab = scene.lab
    involved = ("cli-1>srv-1", "cli-1>srv-2", "cli-2>srv-1")
    with steady_load(scene, tmp_path) as trial:
        time.sleep(1.5)
        killed_at = time.time()
        with lab.component_stopped("nodeproxy", "node-1"):
            dead_from = time.time()
            time.sleep(4)
            dead_until = time.time()
        wait_recovered(trial, dead_until)
        time.sleep(1)
        window_end = time.time()
    records = trial.records
    row = fault_row(
        "node proxy down 4 s (node-1), fail closed",
        records,
        killed_at,
        window_end,
        trial.plaintext,
        note="held down 4 s: none of node-1's connections answered; recovery from the restart being let happen",
        recovery_from=dead_until,
    )
    check_row(trial, row)
    # Fail closed: while node-1 has no node proxy, no connection from or to its pods gets through at all (nothing
    # goes around the proxy in clear: the capture saw nothing, and nothing answered).
    dead = [r for r in records if r["kind"] == "new" and dead_from <= r["start"] <= dead_until]
    through = [r for r in dead if r["target"] in involved and r["outcome"] == "ok"]
    assert through == [], through
    assert {r["target"] for r in dead if r["target"] in involved} == set(involved), "each pair tried meanwhile"
    assert failures(records, killed_at, window_end, ("cli-2>srv-2",)) == []


def test_a_killed_node_agent_keeps_pods_working_and_a_new_pod_waits_for_it(scene: Scene, tmp_path: Path) -> None:
    lab = scene.lab
    with steady_load(scene, tmp_path) as trial:
        time.sleep(1.5)
        with lab.component_stopped("nodeagent", "node-1"):
            killed_at = time.time()
            lab.apply(pod_manifest("late", [sleeper()], node="node-1"), namespace=NAMESPACE)

            def sandbox_failed() -> list[dict[str, Any]]:
                return [e for e in lab.events(NAMESPACE, "late") if e.get("reason") == "FailedCreatePodSandBox"]

            (event, *_) = wait_until("a FailedCreatePodSandBox Event on the new pod", sandbox_failed, 30)
            assert event["type"] == "Warning" and "node agent" in str(event.get("message")), event
            pod = lab.pod("late", NAMESPACE)
            assert pod["status"].get("phase") == "Pending" and not is_ready(pod)
            waiting = pod["status"]["containerStatuses"][0]["state"]["waiting"]
            assert waiting["reason"] == "ContainerCreating", pod["status"]
            time.sleep(1)
        back_at = time.time()
        wait_enrolled(lab, NAMESPACE, "late", 90)
        pod_took = time.time() - back_at
        time.sleep(1)
        window_end = time.time()
    lab.kubectl("delete", "pod", "late", "-n", NAMESPACE, "--wait=false")
    row = fault_row(
        "node agent killed (node-1)",
        trial.records,
        killed_at,
        window_end,
        trial.plaintext,
        note=f"pod made meanwhile: ContainerCreating + Event; Ready {pod_took:.1f} s after the agent's return",
    )
    check_row(trial, row)
    every = EVERY_PAIR
    assert failures(trial.records, killed_at, window_end, every) == []
    assert kept_streams(trial.records, every) == []


DENY_LABELLED = {
    "apiVersion": "security.istio.io/v1",
    "kind": "AuthorizationPolicy",
    "metadata": {"name": "deny-labelled"},
    "spec": {"selector": {"matchLabels": {"fault": "deny"}}, "action": "DENY", "rules": [{}]},
}
"""Denies every connection to a pod labelled ``fault=deny`` (none, until the test labels one)."""


def test_a_killed_control_plane_keeps_traffic_and_a_change_made_meanwhile_arrives_after(
    scene: Scene, tmp_path: Path
) -> None:
    """While the control plane is down, mesh configuration cannot be written (its validating webhook fails
    closed, as istiod's does), so the change made meanwhile is a pod label that brings srv-2 under a deny policy
    that was there before: the control plane must see it once it is back."""
    lab = scene.lab
    to_srv_2 = ("cli-1>srv-2", "cli-2>srv-2")
    lab.apply(DENY_LABELLED, namespace=NAMESPACE)
    try:
        with steady_load(scene, tmp_path) as trial:
            time.sleep(1.5)
            killed_at = time.time()
            with lab.component_stopped("controlplane", ""):
                refused = lab.kubectl("apply", "-n", NAMESPACE, "-f", "-", input=json.dumps(DENY_SRV_2), check=False)
                lab.kubectl("label", "pod", "srv-2", "-n", NAMESPACE, "fault=deny")
                time.sleep(4)  # traffic and certificates keep working meanwhile
                down_until = time.time()
            back_at = time.time()

            def denied() -> bool:
                recent = [r for r in trial.now_records() if r["kind"] == "new" and r["start"] > back_at]
                return all(any(r["target"] == t and r["outcome"] != "ok" for r in recent) for t in to_srv_2)

            wait_until("the label made meanwhile enforced after the control plane's return", denied, 90)
            policy_took = time.time() - back_at
            lab.kubectl("label", "pod", "srv-2", "-n", NAMESPACE, "fault-")
            allowed_from = time.time()
            took = wait_recovered(trial, allowed_from)
    finally:
        lab.kubectl("label", "pod", "srv-2", "-n", NAMESPACE, "fault-", check=False)
        lab.kubectl("delete", "authorizationpolicy", "deny-labelled", "-n", NAMESPACE, check=False)
    row = fault_row(
        "control plane killed 4 s",
        trial.records,
        killed_at,
        down_until,
        trial.plaintext,
        note=f"label made while down: deny enforced {policy_took:.1f} s after return, lifted in {took:.1f} s",
        kept_until=down_until,
    )
    check_row(trial, row)
    # A policy write while the validator is down is refused with a clear error, not taken and lost.
    assert refused.returncode != 0 and "validation.istio.io" in refused.stderr, refused.stderr
    every = EVERY_PAIR
    assert failures(trial.records, killed_at, down_until, every) == []
    assert row.kept == row.established


DENY_SRV_2 = {
    "apiVersion": "security.istio.io/v1",
    "kind": "AuthorizationPolicy",
    "metadata": {"name": "deny-srv-2"},
    "spec": {"selector": {"matchLabels": {"app": "srv-2"}}, "action": "DENY", "rules": [{}]},
}


def test_a_killed_api_server_keeps_traffic_and_the_cluster_works_once_it_is_back(scene: Scene, tmp_path: Path) -> None:
    lab = scene.lab
    with steady_load(scene, tmp_path) as trial:
        time.sleep(1.5)
        pid, argv = wait_until("the API server", lambda: apiserver_process(lab), 10)
        killed_at = time.time()
        os.kill(pid, signal.SIGKILL)
        wait_until("the API server gone", lambda: apiserver_process(lab) is None, 10)
        time.sleep(5)
        restart_apiserver(lab, argv)
        back_at = time.time()
        wait_until("the API server answering", lambda: lab.kubectl("get", "nodes", check=False).returncode == 0, 30)
        lab.apply(pod_manifest("after-api", [sleeper()], node="node-2"), namespace=NAMESPACE)
        wait_enrolled(lab, NAMESPACE, "after-api", 90)
        pod_took = time.time() - back_at
        time.sleep(1)
        window_end = time.time()
    lab.kubectl("delete", "pod", "after-api", "-n", NAMESPACE, "--wait=false")
    row = fault_row(
        "API server killed 5 s, restarted",
        trial.records,
        killed_at,
        window_end,
        trial.plaintext,
        note=f"a pod made after the restart enrolled and Ready in {pod_took:.1f} s",
    )
    check_row(trial, row)
    every = EVERY_PAIR
    assert failures(trial.records, killed_at, window_end, every) == []
    assert kept_streams(trial.records, every) == []
    nodes = lab.items("nodes")
    assert all(condition(n, "Ready").get("status") == "True" for n in nodes), nodes


def apiserver_process(lab: Lab) -> tuple[int, list[str]] | None:
    """The lab's API server: its pid and command line (it names the lab's directory only in its data directory)."""
    data_dir = str(lab.directory / "apiserver")
    for entry in Path("/proc").iterdir():
        if not entry.name.isdigit():
            continue
        try:
            argv = (entry / "cmdline").read_bytes().decode(errors="replace").split("\0")
            state = (entry / "stat").read_text().rsplit(")", 1)[1].split()[0]
        except (OSError, IndexError):
            continue
        if "apiserver" in argv and data_dir in argv and state != "Z":
            return int(entry.name), [a for a in argv if a]
    return None


def restart_apiserver(lab: Lab, argv: list[str]) -> None:
    """Start the API server again with its command line, detached as ``lab up`` starts it (``ambit lab down``
    finds it by its command line)."""
    with open(lab.directory / "logs" / "apiserver.log", "ab") as log:
        subprocess.run(["setsid", "-f", *argv], stdin=subprocess.DEVNULL, stdout=log, stderr=log, check=True)
