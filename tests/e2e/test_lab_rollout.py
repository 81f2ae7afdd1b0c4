"""Node proxy upgrades without resets, on the mesh installed from deploy/ (issue 21, beyond Istio's
TestZtunnelRestart): ``kubectl rollout restart daemonset/ztunnel`` rolls both nodes (maxSurge 1, maxUnavailable 0)
while streams run through the mesh and a steady loop of new connections goes on
(:func:`tests.faults.scene.rollout_under_load`), and a node proxy pod deleted with no successor drains as Istio's.

The module runs the node proxies with a short no-successor bound (``CONNECTION_TERMINATION_DEADLINE`` of
:data:`SHORT_BOUND` seconds instead of deploy's 25, and ``DRAIN_MAX`` of :data:`DRAIN_MAX` seconds instead of an
hour, so a leftover connection cannot hold a shared lab's rollout long), set on the DaemonSet as an operator would
(a rollout) and set back to deploy's values afterwards (another).

Checked end to end from the load's records:

1. A hand-over keeps a stream that outlives the no-successor bound: the node agent tells each old proxy that its
   successor holds every pod, so when its pod is deleted it keeps relaying. Every pair's stream (same-node and
   cross-node), up before the restart, ends on its own about 12 s after it; the cross-node stream :data:`OUTLIVING`
   runs on through both nodes' old proxies for more than :data:`SHORT_BOUND` seconds after the later deletion and
   ends on its own, every echo equal to what was sent and its half-close answered. Meanwhile both old pods stay
   Terminating; each is gone within :data:`GONE_AFTER_END` seconds of the stream's end, its proxy having exited on
   its own ("every connection ended"). No new connection started during the rollout is refused, reset or timed
   out; no payload crosses a node link in clear. ``kubectl rollout status`` returns once the old pods are gone (as
   kube's DaemonSet status, which judges a node by its oldest pod), within TestZtunnelRestart's 60 s.
2. No successor, Istio's semantics: node-1's node proxy pod deleted (``kubectl delete pod``; the lab's DaemonSet
   controller gives the node a new pod once the old one is gone) resets the streams it relays at the short bound,
   leaves the stream that does not cross node-1 alone, and new connections work again through its replacement.
"""

from __future__ import annotations

import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
from tests.e2e.lab_driver import COMPONENT_APPS, TEST_TIMEOUT, Lab, wait_until
from tests.faults.load import STREAM_INTERVAL
from tests.faults.report import fault_row
from tests.faults.scene import (
    ENDS_AFTER,
    EVERY_PAIR,
    NO_SUCCESSOR_DEADLINE,
    ROLLOUT_STATUS_BOUND,
    STREAM_LIFETIME,
    SYSTEM,
    Scene,
    check_row,
    failures,
    kept_streams,
    roll_env,
    rollout_under_load,
    set_up,
    steady_load,
    stream_bytes,
    wait_recovered,
)

pytestmark = [pytest.mark.root, pytest.mark.kubectl, pytest.mark.timeout(TEST_TIMEOUT)]

SHARES_THE_MESH_LAB = True
SHORT_BOUND = 5.0
"""The node proxies' ``CONNECTION_TERMINATION_DEADLINE`` in this module: a drain with no successor."""
DRAIN_MAX = 90.0
"""The node proxies' ``DRAIN_MAX`` in this module: longer than any stream here lives."""
OUTLIVING = "cli-1>srv-2"
"""The pair whose extra stream outlives the short bound: cross-node, so both nodes' old proxies relay it."""
OUTLIVES_RESTART_BY = 25.0
"""Seconds after the restart at which :data:`OUTLIVING`'s stream ends on its own: the old pods are deleted within
about 7 s of the restart on an idle lab, so this leaves the short bound and a loaded machine's lag (checked below)."""
STEP_BOUND = 3.0
"""The load's bound on each step of a stream (``tests.faults.load --timeout``): a stream that stayed intact echoed a
line at least every ``STEP_BOUND + STREAM_INTERVAL`` seconds."""
GONE_AFTER_END = 10.0
"""Seconds after its last connection ended within which an old pod must be seen gone: the proxy's exit (it counts
its connections every 50 ms), the kubelet's reaping, the API's deletion and the test's polling."""
DEADLINE_SLACK = 4.0
"""Seconds after the short bound (from the test's deletion request: the kubelet's SIGTERM follows it a little later)
within which the no-successor drain must have reset the streams: a bound, not a measurement."""
NODE_PROXY = COMPONENT_APPS["nodeproxy"]


@pytest.fixture(scope="module")
def scene(lab: Lab) -> Iterator[Scene]:
    """The fault suite's four pods in a namespace of the module's, and the node proxies' short bounds."""
    name = "e2e-lab-rollout"
    lab.namespace(name)
    rolled = roll_env(lab, f"CONNECTION_TERMINATION_DEADLINE={SHORT_BOUND:g}s", f"DRAIN_MAX={DRAIN_MAX:g}s")
    try:
        yield set_up(lab, name)
    finally:
        lab.delete_namespace(name)
        roll_env(lab, f"CONNECTION_TERMINATION_DEADLINE={NO_SUCCESSOR_DEADLINE:g}s", "DRAIN_MAX=1h", after=rolled)


def test_a_rollout_restart_keeps_a_stream_outliving_the_no_successor_bound_until_it_ends_and_refuses_none(
    scene: Scene, tmp_path: Path
) -> None:
    lifetime = STREAM_LIFETIME - ENDS_AFTER + OUTLIVES_RESTART_BY  # the restart comes that long after warm-up
    run = rollout_under_load(scene, tmp_path, outliving=(OUTLIVING,), outliving_lifetime=lifetime)
    trial, rollout = run.trial, run.rollout
    records, began = trial.records, rollout.began
    row = fault_row(
        "node proxy rollout, a stream outliving Istio's drain", records, began, run.window_end, trial.plaintext
    )
    tried = [r for r in records if r["kind"] == "new" and began <= r["start"] <= run.window_end]
    ended = {
        pair: next(r for r in records if r["kind"] == "stream" and r["start"] == up["start"] and r["target"] == pair)
        for pair, up in run.first_ups.items()
    }
    long_streams = sorted((r for r in trial.outliving_records if r["kind"] == "stream"), key=lambda r: r["start"])
    long: dict[str, Any] = long_streams[0] if long_streams else {}
    last_deleted = max(o.terminating for o in rollout.old)
    olds = ", ".join(
        f"{o.node} deleted +{o.terminating - began:.1f} s, gone {o.gone - long.get('end', 0.0):+.1f} s after the"
        f" long stream's end ({run.drained[o.node]})"
        for o in rollout.old
    )
    print(
        f"\nrollout of {len(rollout.old)} node proxies: new proxies ready on every node {rollout.seconds:.1f} s after"
        f" the restart; rollout status returned {rollout.status_seconds():.1f} s after it (code"
        f" {rollout.status.returncode}); {olds}"
        f"\nstreams up at the restart kept {row.kept}/{row.established}; long stream {OUTLIVING}:"
        f" {long.get('outcome')} ({long.get('detail')}) {long.get('end', 0.0) - last_deleted:.1f} s after the later"
        f" deletion, {long.get('echoed')} bytes echoed"
        f"\nnew connections tried {len(tried)}, failed {row.failed}; bytes echoed per pair {stream_bytes(records)}"
    )
    check_row(trial, row)

    # The streams that end soon after the restart: all four kept, each closed on its own.
    assert set(run.first_ups) == set(EVERY_PAIR)
    assert row.established == 4 and row.kept == 4, ended
    for pair, record in ended.items():
        assert record["outcome"] == "ended", (pair, record)
    assert kept_streams(records, EVERY_PAIR) == []

    # The stream that outlives the short bound: relayed by both old proxies to its own clean end, byte for byte.
    assert long["outcome"] == "ended" and long["start"] < began, long
    assert long["end"] - last_deleted > SHORT_BOUND + DEADLINE_SLACK, ("the test cannot vouch", long, rollout.old)
    lasted = long["end"] - long["start"]
    assert long["echoed"] >= 64 * int(lasted / (STEP_BOUND + STREAM_INTERVAL)), long
    assert [r["outcome"] for r in long_streams[1:]][-1:] == ["ok"], long_streams  # the next one, through the new

    # The old pods: Terminating while it lived, gone within seconds after, each proxy exiting on its own.
    for old in rollout.old:
        assert long["end"] <= old.gone <= long["end"] + GONE_AFTER_END, (vars(old), long)
        assert run.drained[old.node] == "every connection ended", run.drained

    # New connections: none failed, from every pair, during the whole rollout.
    assert failures(records, began, run.window_end, EVERY_PAIR) == []
    assert row.failed == 0 and {r["target"] for r in tried} == set(EVERY_PAIR), row

    # rollout status: once the old pods are gone (kube's DaemonSet status), within TestZtunnelRestart's bound.
    assert rollout.status.returncode == 0, rollout.status.output
    assert rollout.status.returned >= long["end"], (rollout.status, long)  # it waited for the old pods
    assert rollout.status_seconds() <= ROLLOUT_STATUS_BOUND, rollout.status_seconds()


THROUGH_NODE_1 = ("cli-1>srv-1", "cli-1>srv-2", "cli-2>srv-1")


def test_a_node_proxy_pod_deleted_with_no_successor_resets_its_streams_at_the_short_bound(
    scene: Scene, tmp_path: Path
) -> None:
    lab = scene.lab
    old = wait_until("a ready node proxy on node-1", lambda: lab.ready_component(NODE_PROXY, "node-1"), 60)
    uid = str(old["metadata"]["uid"])
    log = lab.directory / "pods" / uid / "istio-proxy.log"
    with steady_load(scene, tmp_path) as trial:
        deleted = time.time()
        lab.kubectl("delete", "pod", str(old["metadata"]["name"]), "-n", SYSTEM, "--wait=false")

        def gone() -> bool:
            return uid not in {p["metadata"]["uid"] for p in lab.pods(SYSTEM, NODE_PROXY)}

        wait_until("the deleted node proxy pod gone", gone, SHORT_BOUND + 30, interval=0.2)
        gone_at = time.time()
        wait_until("a new ready node proxy on node-1", lambda: lab.ready_component(NODE_PROXY, "node-1"), 60)
        took = wait_recovered(trial, gone_at)
        time.sleep(2)
        window_end = time.time()
    records = trial.records
    row = fault_row("node proxy pod deleted, no successor (node-1)", records, deleted, window_end, trial.plaintext)
    first = {
        pair: min((r for r in records if r["kind"] == "stream" and r["target"] == pair), key=lambda r: r["start"])
        for pair in EVERY_PAIR
    }
    cut_at = {pair: first[pair]["end"] - deleted for pair in THROUGH_NODE_1}
    text = log.read_text(errors="replace") if log.is_file() else ""
    cuts = ", ".join(f"{p} +{t:.1f} s {first[p]['outcome']}" for p, t in sorted(cut_at.items()))
    print(
        f"\nnode-1's node proxy deleted: gone {gone_at - deleted:.1f} s after; streams through it cut at {cuts};"
        f" new connections work again {took:.1f} s after it was gone"
    )
    check_row(trial, row)
    for pair in THROUGH_NODE_1:
        assert first[pair]["start"] < deleted and first[pair]["outcome"] == "reset", first[pair]
        assert SHORT_BOUND - 0.5 <= cut_at[pair] <= SHORT_BOUND + DEADLINE_SLACK, (pair, cut_at, first[pair])
    assert first["cli-2>srv-2"]["outcome"] == "ok", first["cli-2>srv-2"]  # node-2 only: untouched
    assert f"drain deadline (no successor) of {SHORT_BOUND:g} s reached" in text, text[-2000:]
    assert "successor holds every pod" not in text, text[-2000:]
