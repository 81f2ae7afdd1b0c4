"""``ambit lab restart`` on the installed mesh (issue 16: the supervised lab retired): a component is restarted as an
operator restarts it on a cluster, ``kubectl rollout restart`` semantics through the API, and the command waits as
``kubectl rollout status`` does, printing kubectl's progress lines.

1. ``ambit lab restart nodeproxy`` under the fault suite's load (:func:`tests.faults.scene.rollout_under_load`,
   ``via="ambit"``): every node gets a new node proxy pod of a new ControllerRevision beside the old one; the
   streams up before the restart carry data through it and end on their own, intact; no new connection started
   during the restart is refused, reset or timed out; nothing crosses a node link in clear; the command returns 0
   once the old pods are gone.
2. With ``ZTUNNEL_WORKER_THREADS=2`` on the DaemonSet, every node proxy runs a worker process beside it, and the same
   restart under the same load hands over from proxies with workers to proxies with workers as cleanly.
3. ``ambit lab restart controlplane`` rolls istiod's Deployment; ``--node`` is refused with the reason (a DaemonSet
   rolls every node), and so is an unknown component.
"""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path

import pytest
from tests.e2e.lab_driver import COMPONENT_APPS, TEST_TIMEOUT, Lab, ambit, is_ready, wait_until
from tests.faults.report import fault_row
from tests.faults.scene import (
    EVERY_PAIR,
    ROLLOUT_STATUS_BOUND,
    SYSTEM,
    Scene,
    check_row,
    failures,
    kept_streams,
    roll_env,
    rollout_under_load,
    set_up,
    stream_bytes,
)

pytestmark = [pytest.mark.root, pytest.mark.kubectl, pytest.mark.timeout(TEST_TIMEOUT)]

SHARES_THE_MESH_LAB = True


@pytest.fixture(scope="module")
def scene(lab: Lab) -> Iterator[Scene]:
    name = "e2e-lab-restart"
    lab.namespace(name)
    try:
        yield set_up(lab, name)
    finally:
        lab.delete_namespace(name)


def _revisions(lab: Lab, name: str) -> set[str]:
    names = (r["metadata"]["name"] for r in lab.items("controllerrevisions", "-n", SYSTEM))
    return {n for n in names if n.startswith(f"{name}-")}


def test_ambit_lab_restart_nodeproxy_rolls_every_node_while_streams_live_through_it_and_refuses_no_connection(
    scene: Scene, tmp_path: Path
) -> None:
    lab = scene.lab
    before = _revisions(lab, "ztunnel")
    run = rollout_under_load(scene, tmp_path, via="ambit")
    trial, rollout = run.trial, run.rollout
    records, began = trial.records, rollout.began
    row = fault_row("ambit lab restart nodeproxy", records, began, run.window_end, trial.plaintext)
    tried = [r for r in records if r["kind"] == "new" and began <= r["start"] <= run.window_end]
    print(
        f"\nambit lab restart nodeproxy: new proxies ready on every node {rollout.seconds:.1f} s after the start;"
        f" the command returned {rollout.status_seconds():.1f} s after it (code {rollout.status.returncode});"
        f" old pods: {run.drained}\nstreams up at the restart kept {row.kept}/{row.established}; new connections"
        f" tried {len(tried)}, failed {row.failed}; bytes echoed per pair {stream_bytes(records)}"
        f"\n{rollout.status.output}"
    )
    check_row(trial, row)

    # The command: kubectl's progress lines, then done, within TestZtunnelRestart's bound.
    assert rollout.status.returncode == 0, rollout.status.output
    assert "daemonset/ztunnel restarted" in rollout.status.output, rollout.status.output
    assert 'Waiting for daemon set "ztunnel" rollout to finish' in rollout.status.output, rollout.status.output
    assert 'daemon set "ztunnel" successfully rolled out' in rollout.status.output, rollout.status.output
    assert rollout.status_seconds() <= ROLLOUT_STATUS_BOUND, rollout.status_seconds()
    # It waited for the old pods (the DaemonSet's status judges a node by its oldest pod): each old proxy relayed a
    # stream up before the restart until that stream ended, so the rollout cannot have been over before the first
    # of them ended.
    first = {(pair, up["start"]) for pair, up in run.first_ups.items()}
    ends = [r["end"] for r in records if r["kind"] == "stream" and (r["target"], r["start"]) in first]
    assert len(ends) == 4 and rollout.status.returned >= min(ends), (ends, rollout.status)

    # Every node's proxy replaced, from a new ControllerRevision.
    assert {o.node for o in rollout.old} == {n.name for n in lab.topology.all_nodes()}
    assert len(_revisions(lab, "ztunnel") - before) == 1, (before, _revisions(lab, "ztunnel"))

    # The streams up before the restart: every pair's carried data through it and ended on its own.
    assert row.established == 4 and row.kept == 4, row
    assert kept_streams(records, EVERY_PAIR) == []
    # New connections during the restart: none refused, reset or timed out, from every pair.
    assert failures(records, began, run.window_end, EVERY_PAIR) == []
    assert row.failed == 0 and {r["target"] for r in tried} == set(EVERY_PAIR), row


def _workers(pid: int) -> list[int]:
    children = Path(f"/proc/{pid}/task/{pid}/children").read_text().split()
    return [int(c) for c in children if b"nodeproxy_worker" in Path(f"/proc/{c}/cmdline").read_bytes()]


def test_node_proxies_with_a_worker_process_each_hand_over_under_load_without_refusing_a_connection(
    scene: Scene, tmp_path: Path
) -> None:
    lab = scene.lab
    rolled = roll_env(lab, "ZTUNNEL_WORKER_THREADS=2")
    try:
        for node in (n.name for n in lab.topology.all_nodes()):
            pid = lab.component_pid("nodeproxy", node)
            assert pid is not None
            wait_until(f"{node}'s node proxy worker", lambda pid=pid: len(_workers(pid)) == 1, 30)
        run = rollout_under_load(scene, tmp_path, via="ambit")
        trial, records, began = run.trial, run.trial.records, run.rollout.began
        row = fault_row("restart with workers", records, began, run.window_end, trial.plaintext)
        print(f"\nnode proxies with workers: {row}")
        check_row(trial, row)
        assert row.established == 4 and row.kept == 4, row
        assert failures(records, began, run.window_end, EVERY_PAIR) == []
        for node in (n.name for n in lab.topology.all_nodes()):
            pid = lab.component_pid("nodeproxy", node)
            assert pid is not None and len(_workers(pid)) == 1, (node, pid)
            opened = [
                line
                for line in lab.node_proxy_metrics(node).splitlines()
                if line.startswith("istio_tcp_connections_opened_total{")
            ]
            assert opened, node
    finally:
        roll_env(lab, "ZTUNNEL_WORKER_THREADS-", after=rolled)


def test_ambit_lab_restart_controlplane_rolls_istiod_and_per_node_or_unknown_restarts_are_refused(lab: Lab) -> None:
    directory = str(lab.directory)
    refused = ambit("lab", "restart", "nodeproxy", "--node", "node-1", "--dir", directory, check=False)
    assert refused.returncode == 2, refused
    assert "--node is refused" in refused.stderr and "every node" in refused.stderr, refused.stderr
    assert "Traceback" not in refused.stderr
    unknown = ambit("lab", "restart", "kubelet", "--dir", directory, check=False)
    said = " ".join(unknown.stderr.replace("│", " ").split())  # typer's error box wraps at the terminal's width
    assert unknown.returncode == 2 and "one of nodeproxy, nodeagent, controlplane" in said, unknown
    assert "Traceback" not in unknown.stderr

    app = COMPONENT_APPS["controlplane"]
    old = {p["metadata"]["uid"] for p in lab.pods(SYSTEM, app)}
    done = ambit("lab", "restart", "controlplane", "--dir", directory, "--timeout", "180", timeout=200)
    assert "deployment/istiod restarted" in done.stdout, done.stdout
    assert 'deployment "istiod" successfully rolled out' in done.stdout, done.stdout
    # Rolled out: a new pod is ready (as kubectl judges a Deployment, the old one may still be terminating).
    live = [p for p in lab.pods(SYSTEM, app) if not p["metadata"].get("deletionTimestamp")]
    new = [p for p in live if p["metadata"]["uid"] not in old]
    assert new and all(is_ready(p) for p in new), new
    template = lab.get("deployment", "istiod", "-n", SYSTEM)["spec"]["template"]["metadata"]["annotations"]
    assert "kubectl.kubernetes.io/restartedAt" in template, template
    gone = lambda: not ({p["metadata"]["uid"] for p in lab.pods(SYSTEM, app)} & old)  # noqa: E731
    wait_until("the old istiod pod gone", gone, 90)
    lab.wait_mesh_ready()
