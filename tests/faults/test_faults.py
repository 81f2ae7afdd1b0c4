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

import contextlib
import dataclasses
import json
import os
import shutil
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
from tests.faults.report import ROWS, fault_row, lost, markdown_table
from tests.faults.rig import REPO, LoadRun
from tests.faults.scene import (
    CROSS_NODE,
    EVERY_PAIR,
    RATE,
    RECOVERY_BOUND,
    REDIRECTION,
    ROLLOUT_STATUS_BOUND,
    SAME_NODE,
    Scene,
    check_row,
    failures,
    kept_streams,
    roll_env,
    rollout_under_load,
    set_up,
    steady_load,
    wait_enrolled,
    wait_recovered,
)
from tests.harness import PrivateTmpfs

pytestmark = [pytest.mark.root, pytest.mark.kubectl, pytest.mark.timeout(TEST_TIMEOUT)]

NAMESPACE = "faults"
TABLE = REPO / "bench" / "results" / "faults.md"
FAULTS = 9


@pytest.fixture(scope="module")
def scene(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Scene]:
    with running_lab(tmp_path_factory.mktemp("faults"), mesh=True) as lab:
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
    """The graceful upgrade: ``kubectl rollout restart daemonset/ztunnel`` (maxSurge 1, maxUnavailable 0). On each
    node in turn the DaemonSet controller starts a new node proxy pod beside the old one, whose proxy binds every
    pod's listeners beside the old ones (SO_REUSEPORT) once the node agent gave it its snapshot and reports ready;
    the node agent tells the old proxy it has a successor; then the old pod is deleted, and its proxy drains: its
    listeners close, inbound HBONE connections hear GOAWAY, and the connections it already relays run on until they
    end (up to DRAIN_MAX, an hour). The load's streams, up before the restart, end on their own (about 12 s after
    the restart): none may break, no new connection may fail, and each old pod exits once its connections ended.
    (A stream outliving Istio's drain window, and a pod stopped with no successor: tests/e2e/test_lab_rollout.py.)"""
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


CERT_TTL = 15
"""Seconds of validity the node proxies ask for in the certificate row (their ``SECRET_TTL``; 24 h otherwise): short
enough that a certificate expires a few seconds into the CA's outage, so the row stays well under two minutes."""


@contextlib.contextmanager
def short_certificates(lab: Lab, ttl: int) -> Iterator[None]:
    """The node proxies ask the CA for ``ttl``-second certificates while the block runs: ``SECRET_TTL`` set on the
    ztunnel DaemonSet (a graceful rollout, as an operator would change it), and unset after (another)."""
    rolled = roll_env(lab, f"SECRET_TTL={ttl}s")
    try:
        yield
    finally:
        roll_env(lab, "SECRET_TTL-", after=rolled)


def certificate_expiries(lab: Lab, namespace: str) -> list[float]:
    """When each node proxy's certificates for ``namespace``'s identities expire (epoch seconds, from
    ``/config_dump``; whole seconds, rounded down)."""
    found = []
    for node in (n.name for n in lab.topology.all_nodes()):
        for entry in json.loads(lab.node_proxy_admin(node, "/config_dump"))["certificates"]:
            if f"/ns/{namespace}/" in entry["identity"] and entry["certChain"]:
                moment = datetime.strptime(entry["certChain"][0]["expirationTime"], "%Y-%m-%dT%H:%M:%SZ")
                found.append(moment.replace(tzinfo=UTC).timestamp())
    return found


def test_a_certificate_expiring_while_the_ca_is_down_is_used_until_it_expires_then_cross_node_connections_fail_closed(
    scene: Scene, tmp_path: Path
) -> None:
    """The control plane (the CA) is scaled to 0 while the node proxies hold certificates of :data:`CERT_TTL`
    seconds. Each proxy keeps using its certificate (its renewal failing, retried with back-off) until it expires;
    from then on every cross-node connection is refused (no certificate: no mTLS, and nothing is sent in clear
    instead), while same-node ones, delivered inside the proxy without TLS, go on. Once the CA is back, the next
    retry (at most the back-off's cap, 5 s) gets a new certificate and new connections succeed again. Streams
    already up keep their TLS sessions throughout, as in ztunnel (a certificate is checked at the handshake)."""
    lab = scene.lab
    with short_certificates(lab, CERT_TTL), steady_load(scene, tmp_path) as trial:
        time.sleep(1.5)
        down_at = time.time()
        with lab.component_stopped("controlplane", ""):
            ca_gone = time.time()
            expiries = certificate_expiries(lab, NAMESPACE)
            assert len(expiries) == 2 and max(expiries) <= ca_gone + CERT_TTL + 1, (expiries, ca_gone)
            wait_until("every certificate expired", lambda: time.time() > max(expiries) + 4, CERT_TTL + 10)
            back_from = time.time()
        back_at = time.time()  # the CA's pod is ready
        took = wait_recovered(trial, back_at)
        time.sleep(1)
        window_end = time.time()
    row = fault_row(
        f"certificate ({CERT_TTL} s) expiring while the CA is down",
        trial.records,
        down_at,
        window_end,
        trial.plaintext,
        note=f"CA down {back_from - ca_gone:.1f} s, certificates expired {max(expiries) - ca_gone:.1f} s into it;"
        f" CA ready {back_at - back_from:.1f} s after its scale-up; recovery counted from then",
        recovery_from=back_at,
    )
    check_row(trial, row)
    records = trial.records
    # Kept until it expires: nothing failed before the first certificate expired.
    assert failures(records, down_at, min(expiries) - 1, EVERY_PAIR) == []
    # Then fail closed: no cross-node connection got through with no valid certificate, each pair tried.
    dead = [r for r in records if r["kind"] == "new" and max(expiries) + 1 <= r["start"] <= back_from]
    assert {r["target"] for r in dead if r["target"] in CROSS_NODE} == set(CROSS_NODE)
    assert [r for r in dead if r["target"] in CROSS_NODE and r["outcome"] == "ok"] == []
    assert failures(records, down_at, window_end, SAME_NODE) == []
    assert row.kept == row.established == 4, row
    assert took <= RECOVERY_BOUND


SQUATTER = """
import socket, threading
def echo(conn):
    with conn:
        while data := conn.recv(65536):
            conn.sendall(data)
def serve(port):
    s = socket.socket()
    s.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
    s.bind(("0.0.0.0", port))
    s.listen(64)
    return s
squat = serve(15008)
print("holding 15008", flush=True)
def release():
    squat.accept()[0].close()
    squat.close()
    print("released 15008", flush=True)
threading.Thread(target=release, daemon=True).start()
srv = serve(9000)
while True:
    threading.Thread(target=echo, args=(srv.accept()[0],), daemon=True).start()
"""
"""The squatter pod's application: a TCP echo on 9000 that also listens on 15008, the node proxy's HBONE port in
the pod's netns, until anything connects there (the test does, from inside the pod, to free the port)."""
SQUAT_RATE = 2.0
"""New connections per second from each client to the squatter."""


def workload_protocol(lab: Lab, node: str, namespace: str, name: str) -> str:
    """How ``node``'s node proxy reaches the pod (``HBONE``, ``TCP``; ``""`` when it does not know it)."""
    dump = json.loads(lab.node_proxy_admin(node, "/config_dump"))
    found = [w for w in dump["workloads"] if (w["namespace"], w["name"]) == (namespace, name)]
    return str(found[0]["protocol"]) if found else ""


def test_a_pod_whose_application_holds_the_node_proxys_port_fails_closed_alone_and_is_enrolled_once_it_is_freed(
    scene: Scene, tmp_path: Path
) -> None:
    """A running pod (``squatter``, on node-1) whose application listens on 15008 in its netns is brought into the
    mesh (its opt-out label removed). The node agent installs its redirection and hands it to node-1's node proxy,
    which cannot bind 15008 there and nacks the Add naming the pod and the port; the agent marks it pending, records
    a Warning Event, and retries with back-off. Meanwhile the pod's traffic is refused (redirected to listeners
    that are not there: nothing reaches it, nothing is sent in clear), and the other pods are unaffected. Once the
    application frees the port, the next retry enrols the pod and its traffic flows through the mesh."""
    lab = scene.lab
    opted_out = {"app": "squatter", "istio.io/dataplane-mode": "none"}
    app = {"name": "app", "image": "none", "command": ["python3", "-u", "-c", SQUATTER]}
    lab.apply(pod_manifest("squatter", [app], node="node-1", labels=opted_out), namespace=NAMESPACE)
    try:
        pod = wait_until("the squatter Ready", lambda: is_ready(p := lab.pod("squatter", NAMESPACE)) and p, 60)
        ip = str(pod["status"]["podIP"])
        wait_until("the squatter holding 15008", lambda: "holding 15008" in squatter_log(lab, pod), 30)
        targets = {c: (scene.netns[c], [f"squatter={ip}:9000"]) for c in ("cli-1", "cli-2")}
        with steady_load(scene, tmp_path) as trial:
            time.sleep(1.5)
            fault_at = time.time()
            lab.kubectl("label", "pod", "squatter", "-n", NAMESPACE, "istio.io/dataplane-mode-")

            def refused() -> list[dict[str, Any]]:
                return [e for e in lab.events(NAMESPACE, "squatter") if e.get("reason") == "AmbientProxyUnavailable"]

            (event, *_) = wait_until("a Warning Event on the squatter", refused, 30)
            message = str(event.get("message"))
            assert event["type"] == "Warning" and "squatter" in message and "15008" in message, event
            wait_until(
                "the squatter annotated pending",
                lambda: (
                    (lab.pod("squatter", NAMESPACE)["metadata"].get("annotations") or {}).get(REDIRECTION) == "pending"
                ),
                10,
            )
            assert "15008" in lab.component_log("nodeagent", "node-1")
            squat = LoadRun(tmp_path / "squatter", trial.marker, targets, SQUAT_RATE)
            try:
                wait_until(
                    "connections to the squatter tried from both clients",
                    lambda: (
                        {r["target"] for r in squat.records() if r["kind"] == "new"}
                        >= {"cli-1>squatter", "cli-2>squatter"}
                    ),
                    30,
                )
                time.sleep(3)
            finally:
                pending = squat.stop()
            released_at = time.time()
            lab.exec(
                "squatter",
                NAMESPACE,
                "python3",
                "-c",
                "import socket; socket.create_connection(('127.0.0.1', 15008), 5)",
            )
            wait_until("the squatter's 15008 freed", lambda: "released 15008" in squatter_log(lab, pod), 30)
            wait_enrolled(lab, NAMESPACE, "squatter", 60)
            enrolled = time.time() - released_at
            # New connections to it only once every node proxy reaches it over HBONE: before that a client's proxy
            # would send in clear to a pod it still believes outside the mesh (as it should to such a pod).
            for node in ("node-1", "node-2"):
                wait_until(
                    f"{node}'s node proxy reaching the squatter over HBONE",
                    lambda node=node: workload_protocol(lab, node, NAMESPACE, "squatter") == "HBONE",
                    30,
                )
            after = LoadRun(tmp_path / "squatter-after", trial.marker, targets, SQUAT_RATE)
            try:
                wait_until(
                    "connections to the squatter answered from both clients",
                    lambda: (
                        {r["target"] for r in after.records() if r["kind"] == "new" and r["outcome"] == "ok"}
                        >= {"cli-1>squatter", "cli-2>squatter"}
                    ),
                    30,
                )
                served = time.time() - released_at
                time.sleep(1)
            finally:
                served_records = after.stop()
            window_end = time.time()
    finally:
        lab.kubectl("delete", "pod", "squatter", "-n", NAMESPACE, "--wait=false", check=False)
    tried = [r for r in pending if r["kind"] == "new"]
    # Recovery: from the port being freed until the squatter's traffic was served (its new connections were only
    # tried again once every node proxy reached it over HBONE, so none of them failed after the release).
    row = dataclasses.replace(
        fault_row(
            "a pod's netns listener failing (its app holds 15008)",
            [*trial.records, *pending, *served_records],
            fault_at,
            window_end,
            trial.plaintext,
            note=f"nacked, Event, pod pending: {len(tried)}/{len(tried)} of its connections refused; enrolled"
            f" {enrolled:.1f} s after the port was freed; recovery: from the port freed to its traffic served",
            recovery_from=released_at,
        ),
        recovery=served,
    )
    check_row(trial, row)
    assert lost(pending) == lost(served_records) == 0
    # Fail closed: while the proxy could not listen for it, nothing of the squatter's traffic got through.
    assert tried and [r for r in pending if r["outcome"] == "ok"] == [], [r for r in pending if r["outcome"] == "ok"]
    # The other pods were unaffected.
    assert failures(trial.records, fault_at, window_end, EVERY_PAIR) == []
    assert kept_streams(trial.records, EVERY_PAIR) == []
    assert row.kept == row.established == 4, row


def squatter_log(lab: Lab, pod: dict[str, Any]) -> str:
    path = lab.directory / "pods" / str(pod["metadata"]["uid"]) / "app.log"
    return path.read_text(errors="replace") if path.is_file() else ""


FILLING_PAYLOAD = 96 * 1024
"""Bytes of data in each ConfigMap written while the API server's disk is full."""


def configmap(name: str, size: int) -> str:
    return json.dumps({"apiVersion": "v1", "kind": "ConfigMap", "metadata": {"name": name}, "data": {"d": "x" * size}})


def test_a_full_disk_under_the_api_server_fails_writes_with_a_500_and_loses_nothing_acknowledged(
    scene: Scene, tmp_path: Path
) -> None:
    """The lab's API server is moved onto a small tmpfs holding a copy of its state (stopped, copied, started again
    inside a mount namespace of the test's own), which is then filled to ENOSPC under the load. Writes are refused
    with 500 InternalError naming the storage (kubectl shows it); traffic goes on; once space is freed writes work
    again; every acknowledged write is there, also after the server is moved back onto the lab's disk (stopped,
    its state copied back, started as before)."""
    lab = scene.lab
    data_dir = lab.directory / "apiserver"
    pid, argv = wait_until("the API server", lambda: apiserver_process(lab), 10)
    stop_apiserver(lab, pid)
    seed = tmp_path / "apiserver-state"
    shutil.copytree(data_dir, seed)  # the tmpfs hides data_dir inside the namespace: it is seeded from a copy
    used = sum(f.stat().st_size for f in seed.rglob("*") if f.is_file())
    disk = PrivateTmpfs(data_dir, f"{used // 1024 + 16 * 1024}k", seed=seed)
    try:
        restart_apiserver(lab, disk.argv(*argv))
        wait_until("the API server answering", lambda: lab.kubectl("get", "nodes", check=False).returncode == 0, 30)
        acknowledged: list[str] = []
        with steady_load(scene, tmp_path) as trial:
            time.sleep(1.5)
            fault_at = time.time()
            filled = disk.fill()
            refusal = None
            for n in range(200):
                done = lab.kubectl(
                    "create", "-n", NAMESPACE, "-f", "-", input=configmap(f"full-{n}", FILLING_PAYLOAD), check=False
                )
                if done.returncode == 0:
                    acknowledged.append(f"full-{n}")
                else:
                    refusal = done.stderr
                    break
            assert refusal is not None, "no write refused on a full disk"
            time.sleep(2)  # traffic goes on with the API server unable to write
            disk.free()
            freed_at = time.time()
            wait_until(
                "a write accepted once space is freed",
                lambda: (
                    lab.kubectl(
                        "create", "-n", NAMESPACE, "-f", "-", input=configmap("after", 10), check=False
                    ).returncode
                    == 0
                ),
                30,
                interval=0.1,
            )
            write_recovery = time.time() - freed_at
            acknowledged.append("after")
            time.sleep(1)
            window_end = time.time()
        present = {item["metadata"]["name"] for item in lab.items("configmaps", "-n", NAMESPACE)}
        assert set(acknowledged) <= present, set(acknowledged) - present
    finally:
        # Back onto the lab's disk, whatever happened: stopped, its state (less the filler) copied back.
        if (running := apiserver_process(lab)) is not None:
            stop_apiserver(lab, running[0])
        disk.inside("filler").unlink(missing_ok=True)
        for stale in data_dir.glob("state.db*"):
            stale.unlink()
        shutil.copytree(disk.inside(), data_dir, dirs_exist_ok=True)
        disk.close()
        restart_apiserver(lab, argv)
        wait_until("the API server answering", lambda: lab.kubectl("get", "nodes", check=False).returncode == 0, 30)
    present = {item["metadata"]["name"] for item in lab.items("configmaps", "-n", NAMESPACE)}
    assert set(acknowledged) <= present, set(acknowledged) - present
    lab.kubectl("delete", "configmap", "-n", NAMESPACE, *acknowledged, "--wait=false", check=False)
    row = dataclasses.replace(
        fault_row(
            "API server's disk full (tmpfs, filled)",
            trial.records,
            fault_at,
            window_end,
            trial.plaintext,
            note=f"{len(acknowledged) - 1} writes landed before one got a 500 InternalError; every acknowledged"
            " one kept (also after a restart); recovery: from space freed to a write accepted",
        ),
        recovery=write_recovery,
    )
    check_row(trial, row)
    assert "InternalError" in refusal and "Internal error occurred: storage " in refusal and "full" in refusal, refusal
    assert filled > 0
    assert failures(trial.records, fault_at, window_end, EVERY_PAIR) == []
    assert kept_streams(trial.records, EVERY_PAIR) == []
    assert row.kept == row.established == 4, row


def stop_apiserver(lab: Lab, pid: int) -> None:
    """SIGTERM the API server and wait until it is gone (its state closed cleanly)."""
    os.kill(pid, signal.SIGTERM)
    wait_until("the API server stopped", lambda: apiserver_process(lab) is None, 30)
