"""The fault suite (issue 21): parts of the mesh die under a steady load; the mesh fails closed and recovers.

One 2-node lab with the mesh as supervised host processes (``ambit lab up --supervised``: the node proxies, node
agents and control plane are processes the tests can ``kill -9``, and the lab's supervisor starts them again). In an
ambient namespace: ``srv-1`` and ``cli-1`` on node-1, ``srv-2`` and ``cli-2`` on node-2, so each client has a
same-node and a cross-node server. During each fault both clients run :mod:`tests.faults.load` (new connections at
``RATE`` per second per pair, and one long-lived echoing stream per pair), and ``tcpdump`` watches every link of
both nodes for the load's marker in clear (:mod:`tests.faults.rig`).

Each test adds one row to the fault table (:mod:`tests.faults.report` defines the columns), printed at the end of
the run and written to ``bench/results/faults.md`` when the whole module ran. What is asserted is what the mesh
promises: no plaintext on a node link, no data lost, pairs that do not involve the failed part unaffected, and
recovery within generous bounds (the measured times are reported, never asserted tight).
"""

from __future__ import annotations

import contextlib
import json
import os
import secrets
import signal
import subprocess
import sys
import time
from collections.abc import Iterator
from dataclasses import dataclass, field
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

import pytest
from tests.e2e.lab_driver import (
    TEST_TIMEOUT,
    Lab,
    condition,
    daemon_pid,
    is_ready,
    lab_processes,
    pod_manifest,
    running_lab,
    sleeper,
    wait_until,
)
from tests.faults.report import ROWS, FaultRow, fault_row, markdown_table, recovery_time
from tests.faults.rig import REPO, LoadRun, PlaintextCapture

pytestmark = [pytest.mark.root, pytest.mark.kubectl, pytest.mark.timeout(TEST_TIMEOUT)]

NAMESPACE = "faults"
PORT = 9000
RATE = 5.0
"""New connections per second per client-server pair (four pairs: 20 per second in all)."""
REDIRECTION = "ambient.istio.io/redirection"
SAME_NODE = ("cli-1>srv-1", "cli-2>srv-2")
CROSS_NODE = ("cli-1>srv-2", "cli-2>srv-1")
RECOVERY_BOUND = 60.0
"""Seconds within which new connections must succeed again after a part is back: a bound on correctness."""
TABLE = REPO / "bench" / "results" / "faults.md"
FAULTS = 6


@dataclass
class Scene:
    lab: Lab
    ips: dict[str, str]
    netns: dict[str, str]
    """Pod name or node name → its network namespace."""

    def targets(self, client: str) -> list[str]:
        return [f"{srv}={self.ips[srv]}:{PORT}" for srv in ("srv-1", "srv-2")]


def tcp_echo(port: int) -> dict[str, Any]:
    return {
        "name": "echo",
        "image": "none",
        "command": ["python3", "-m", "ambit.lab.apps", "tcp-echo", "--port", str(port)],
        "readinessProbe": {"tcpSocket": {"port": port}, "periodSeconds": 1},
    }


def wait_enrolled(lab: Lab, name: str, timeout: float = 30.0) -> dict[str, Any]:
    def enrolled() -> dict[str, Any] | None:
        pod = lab.pod(name, NAMESPACE)
        annotations = pod["metadata"].get("annotations") or {}
        return pod if is_ready(pod) and annotations.get(REDIRECTION) == "enabled" else None

    return wait_until(f"{NAMESPACE}/{name} Ready and enrolled", enrolled, timeout)


@pytest.fixture(scope="module")
def scene(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Scene]:
    with running_lab(tmp_path_factory.mktemp("faults"), mesh=True, supervised=True) as lab:
        nodes = {n.name: n for n in lab.topology.all_nodes()}
        for node in nodes:
            wait_until(
                f"{node}'s node proxy connected to its node agent",
                lambda node=node: "node proxy connected" in lab.component_log("nodeagent", node),
                30,
            )
        lab.namespace(NAMESPACE)
        lab.kubectl("label", "namespace", NAMESPACE, "istio.io/dataplane-mode=ambient")
        lab.apply(
            pod_manifest("srv-1", [tcp_echo(PORT)], node="node-1"),
            pod_manifest("srv-2", [tcp_echo(PORT)], node="node-2"),
            pod_manifest("cli-1", [sleeper()], node="node-1"),
            pod_manifest("cli-2", [sleeper()], node="node-2"),
            namespace=NAMESPACE,
        )
        pods = {name: wait_enrolled(lab, name, 60) for name in ("srv-1", "srv-2", "cli-1", "cli-2")}
        yield Scene(
            lab=lab,
            ips={name: str(pod["status"]["podIP"]) for name, pod in pods.items()},
            netns={name: lab.pod_netns(pod) for name, pod in pods.items()} | {n: a.netns for n, a in nodes.items()},
        )
        assert lab.log_tracebacks() == []
    if len(ROWS) == FAULTS:
        stamp = datetime.now(UTC).strftime("%Y-%m-%d %H:%M UTC")
        TABLE.parent.mkdir(parents=True, exist_ok=True)
        TABLE.write_text(
            "# Fault suite (tests/faults, issue 21)\n\n"
            f"Measured {stamp} on a 2-node lab (supervised mesh), under {4 * RATE:g} new connections/s and one\n"
            "long-lived stream per client-server pair (same-node and cross-node). Columns: tests/faults/report.py.\n\n"
            + markdown_table(ROWS)
        )


@dataclass
class Trial:
    """One fault's run of the load and the capture, and what they saw once stopped."""

    marker: str
    load: LoadRun
    records: list[dict[str, Any]] = field(default_factory=list)
    plaintext: int = -1
    control_seen: int = -1

    def now_records(self) -> list[dict[str, Any]]:
        return self.load.records()


@contextlib.contextmanager
def steady_load(scene: Scene, directory: Path) -> Iterator[Trial]:
    """The load from both clients and the capture on both nodes, from warm (every stream up, every pair answered)
    until the block ends; then the positive control, and the counts."""
    marker = "AMBITFAULT" + secrets.token_hex(6)
    control = "AMBITCONTROL" + secrets.token_hex(6)
    capture = PlaintextCapture(directory / "capture", [scene.netns["node-1"], scene.netns["node-2"]])
    load = None
    try:
        clients = {c: (scene.netns[c], scene.targets(c)) for c in ("cli-1", "cli-2")}
        load = LoadRun(directory, marker, clients, RATE)
        trial = Trial(marker, load)

        def warm() -> bool:
            records = load.records()
            up = {r["target"] for r in records if r["kind"] == "stream-up"}
            answered = {r["target"] for r in records if r["kind"] == "new" and r["outcome"] == "ok"}
            assert load.running(), "a load process exited"
            return len(up) == 4 and len(answered) == 4

        wait_until("the load warm on all four pairs", warm, 30)
        yield trial
        trial.records = load.stop()
        trial.control_seen = capture.control(control, [(scene.ips["srv-1"], PORT), (scene.ips["srv-2"], PORT)])
    finally:
        if load is not None:
            load.stop()
        capture.stop()
    trial.plaintext = capture.count(marker.encode())


def check_row(trial: Trial, row: FaultRow) -> None:
    """What every fault must keep: the capture works and saw no payload in clear; no data lost."""
    ROWS.append(row)
    assert trial.control_seen == 2, "a capture missed the positive control: it cannot vouch for anything"
    assert row.plaintext == 0, f"the load's payload crossed a node link in clear {row.plaintext} times"
    assert row.lost == 0, [r for r in trial.records if r["outcome"] == "mismatch"]


def wait_recovered(trial: Trial, since: float) -> float:
    """Until every pair answered again after its last failure since ``since``; the seconds that took."""

    def recovered() -> tuple[float] | None:
        # A 1-tuple, because a recovery of 0.0 s (no pair failed at all) is falsy and wait_until would wait on.
        took = recovery_time(trial.now_records(), since)
        return (took,) if took != float("inf") and time.time() > since + 1 else None

    (took,) = wait_until("new connections succeeding on every pair again", recovered, RECOVERY_BOUND)
    return took


def failures(records: list[dict[str, Any]], begin: float, end: float, targets: tuple[str, ...]) -> list[str]:
    return [
        f"{r['target']} {r['outcome']} {r['detail']}"
        for r in records
        if r["kind"] == "new" and begin <= r["start"] <= end and r["target"] in targets and r["outcome"] != "ok"
    ]


def kept_streams(records: list[dict[str, Any]], targets: tuple[str, ...]) -> list[str]:
    """Streams of ``targets`` that broke: none expected."""
    return [
        f"{r['target']} {r['outcome']} {r['detail']}"
        for r in records
        if r["kind"] == "stream" and r["target"] in targets and r["outcome"] != "ok"
    ]


def test_a_rolling_restart_of_every_node_proxy_keeps_every_connection_and_refuses_none(
    scene: Scene, tmp_path: Path
) -> None:
    """``ambit lab restart nodeproxy``: on each node in turn the supervisor starts a new node proxy beside the old
    one (SO_REUSEPORT), waits until it is ready with the node's pods (the node agent's snapshot), then stops the
    old one, which drains: its listeners close, inbound HBONE connections hear GOAWAY, and the connections it
    already relays run on (up to its 25 s deadline). No established stream may break and no new connection fail."""
    lab = scene.lab
    old = {node: daemon_pids(lab, node) for node in ("node-1", "node-2")}
    with steady_load(scene, tmp_path) as trial:
        time.sleep(1.5)
        began = time.time()
        restart = subprocess.run(
            [sys.executable, "-m", "ambit.cli", "lab", "restart", "nodeproxy", "--dir", str(lab.directory)],
            capture_output=True,
            text=True,
            timeout=300,
            check=False,
        )
        handed_over = time.time()
        assert restart.returncode == 0, restart.stderr
        time.sleep(3)  # new connections through the new proxies while the old ones still relay the streams
        window_end = time.time()
    # The old proxies exit once the streams they relayed have ended (the load stopped them), not at a deadline.
    for node, pids in old.items():
        wait_until(f"{node}'s old node proxy gone", lambda node=node, pids=pids: not pids & daemon_pids(lab, node), 20)
    readiness = ", ".join(line.split(" ready in ")[1].split(",")[0] for line in restart.stdout.splitlines())
    row = fault_row(
        "node proxy rolling restart (hand-over, both nodes)",
        trial.records,
        began,
        window_end,
        trial.plaintext,
        note=f"new proxies ready in {readiness}; both handed over in {handed_over - began:.1f} s",
    )
    check_row(trial, row)
    assert all(daemon_pids(lab, node) and not daemon_pids(lab, node) & pids for node, pids in old.items())
    every = SAME_NODE + CROSS_NODE
    assert failures(trial.records, began, window_end, every) == []
    assert row.kept == row.established and row.established == 4, row


def daemon_pids(lab: Lab, node: str) -> set[int]:
    """Every running node proxy process of ``node`` (two during a hand-over)."""
    return {pid for pid, argv in lab_processes(lab.directory).items() if "nodeproxy" in argv and node in argv}


def test_node_proxy_kill_9_loses_its_nodes_connections_and_new_ones_succeed_again(scene: Scene, tmp_path: Path) -> None:
    lab = scene.lab
    with steady_load(scene, tmp_path) as trial:
        time.sleep(1.5)
        old = wait_until("node-1's node proxy", lambda: daemon_pid(lab.directory, "nodeproxy", "node-1"), 10)
        killed_at = time.time()
        os.kill(old, signal.SIGKILL)
        wait_until(
            "node-1's node proxy restarted",
            lambda: (daemon_pid(lab.directory, "nodeproxy", "node-1") or old) != old,
            30,
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
        note=f"restarted by the supervisor {restarted:.1f} s after the kill; serving {took - restarted:.1f} s later",
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
        wait_enrolled(lab, "late", 90)
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
    every = SAME_NODE + CROSS_NODE
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
    every = SAME_NODE + CROSS_NODE
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
        wait_enrolled(lab, "after-api", 90)
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
    every = SAME_NODE + CROSS_NODE
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
