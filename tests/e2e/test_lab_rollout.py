"""A rolling restart of every node proxy under load, on the mesh installed from deploy/ (issue 21, Istio's
TestZtunnelRestart): ``kubectl rollout restart daemonset/ztunnel`` rolls both nodes (maxSurge 1, maxUnavailable 0;
grace period 30 s, as ztunnel's chart) while streams run through the mesh and a steady loop of new connections
goes on (:func:`tests.faults.scene.rollout_under_load`).

Checked end to end from the load's records, with Istio's semantics and ours:

1. A stream that ends within the drain window is not cut: each pair's stream (same-node and cross-node), up before
   the restart and carrying data both ways through it, closes on its own about 12 s after the restart, every echo
   equal to what was sent and the client's half-close answered by the server's EOF through the draining proxies.
2. A stream that outlives the drain window is closed by the old proxy at its deadline (the grace period less 5 s
   after its pod was deleted), never left hanging: the client sees a reset (the proxy aborts both sides of the
   connections it still relays, so each peer learns at once), and the load's next stream, through the new
   proxies, works.
3. No new connection started during the rollout (until the old pods are gone) is refused, reset or timed out; no
   payload crosses a node link in clear.
4. ``kubectl rollout status daemonset/ztunnel`` reports the rollout complete within 60 s of the restart (the bound
   TestZtunnelRestart waits), and each old pod is gone within its grace period of being deleted, having exited
   on its own (its log says how its drain ended), not killed by the kubelet.
"""

from __future__ import annotations

from pathlib import Path

from tests.e2e.lab_driver import Lab
from tests.faults.load import STREAM_INTERVAL
from tests.faults.report import fault_row
from tests.faults.scene import (
    DRAIN_DEADLINE,
    ENDS_AFTER,
    EVERY_PAIR,
    GRACE_PERIOD,
    ROLLOUT_STATUS_BOUND,
    STREAM_LIFETIME,
    check_row,
    failures,
    kept_streams,
    rollout_under_load,
    set_up,
    stream_bytes,
)

SHARES_THE_MESH_LAB = True
OUTLIVING = "cli-1>srv-2"
"""The pair whose extra stream outlives the drain window: cross-node, so both nodes' old proxies relay it."""
STEP_BOUND = 3.0
"""The load's bound on each step of a stream (``tests.faults.load --timeout``): a stream that stayed intact echoed a
line at least every ``STEP_BOUND + STREAM_INTERVAL`` seconds."""
GONE_SLACK = 10.0
"""Seconds on top of the grace period for an old pod to be seen gone (the kubelet's reaping, the API's deletion,
the scene's polling)."""
DEADLINE_SLACK = 3.0
"""Seconds either side of the old proxy's drain deadline within which the over-deadline stream must end, counted
from when the test saw the first old pod terminating (polled, so seen up to a poll late; the kubelet's SIGTERM
follows the deletion a little later): a bound, not a measurement. The kubelet's SIGKILL comes 5 s after the
deadline, outside it."""


def test_a_rollout_restart_of_every_node_proxy_under_load_keeps_streams_within_the_drain_window(
    lab: Lab, namespace: str, tmp_path: Path
) -> None:
    scene = set_up(lab, namespace)
    run = rollout_under_load(scene, tmp_path, outliving=(OUTLIVING,))
    trial, rollout = run.trial, run.rollout
    records, began = trial.records, rollout.began
    row = fault_row("node proxy DaemonSet rollout (both nodes)", records, began, run.window_end, trial.plaintext)
    tried = [r for r in records if r["kind"] == "new" and began <= r["start"] <= run.window_end]
    ended = {
        pair: next(r for r in records if r["kind"] == "stream" and r["start"] == up["start"] and r["target"] == pair)
        for pair, up in run.first_ups.items()
    }
    long_streams = sorted((r for r in trial.outliving_records if r["kind"] == "stream"), key=lambda r: r["start"])
    cut = long_streams[0] if long_streams else {}
    first_deleted = min(o.terminating for o in rollout.old)
    olds = ", ".join(
        f"{o.node} {o.gone - o.terminating:.1f} s after deletion ({run.drained[o.node]})" for o in rollout.old
    )
    ends = ", ".join(f"{p} +{ended[p]['end'] - began:.1f} s {ended[p]['outcome']}" for p in sorted(ended))
    cut_at = cut.get("end", 0.0) - first_deleted
    print(
        f"\nrollout of {len(rollout.old)} node proxies: new proxies ready on every node {rollout.seconds:.1f} s after"
        f" the restart; rollout status returned {rollout.status_seconds():.1f} s after it (code"
        f" {rollout.status.returncode}); old pods gone {olds}"
        f"\nstreams up at the restart kept {row.kept}/{row.established}, ending {ends}"
        f"\nover-deadline stream {OUTLIVING}: {cut.get('outcome')} ({cut.get('detail')}) {cut_at:.1f} s after the"
        f" first old pod's deletion, {cut.get('echoed')} bytes echoed"
        f"\nnew connections tried {len(tried)}, failed {row.failed}; bytes echoed per pair {stream_bytes(records)}"
    )
    check_row(trial, row)

    # 1. Streams that end within the window: all four kept, each closed on its own around ENDS_AFTER.
    assert set(run.first_ups) == set(EVERY_PAIR)
    assert row.established == 4 and row.kept == 4, ended
    for pair, record in ended.items():
        assert record["outcome"] == "ended", (pair, record)
        assert ENDS_AFTER - 3 < record["end"] - began < ENDS_AFTER + STEP_BOUND + 3, (pair, record, began)
        lasted = record["end"] - record["start"]
        assert record["echoed"] >= 64 * int(lasted / (STEP_BOUND + STREAM_INTERVAL)), (pair, record)
    assert kept_streams(records, EVERY_PAIR) == []

    # 2. The stream that outlives the window: reset by the old proxy at its drain deadline, then a new one works.
    assert cut["outcome"] == "reset", cut
    assert cut["start"] < began and cut["echoed"] > 0, cut
    assert DRAIN_DEADLINE - DEADLINE_SLACK <= cut_at <= DRAIN_DEADLINE + DEADLINE_SLACK, (
        cut_at,
        cut,
        [vars(o) for o in rollout.old],
    )
    assert any("deadline" in outcome for outcome in run.drained.values()), run.drained
    assert [r["outcome"] for r in long_streams[1:]][-1:] == ["ok"], long_streams

    # 3. New connections: none failed, from every pair, during the whole rollout.
    assert failures(records, began, run.window_end, EVERY_PAIR) == []
    assert row.failed == 0 and {r["target"] for r in tried} == set(EVERY_PAIR), row

    # 4. rollout status within TestZtunnelRestart's bound; the old pods gone within their grace period, on their own.
    assert rollout.status.returncode == 0, rollout.status.output
    assert rollout.status_seconds() <= ROLLOUT_STATUS_BOUND, rollout.status_seconds()
    for old in rollout.old:
        # Seen gone by polling the API after the kubelet reaped it: a loaded CI run saw 30.1 s for a pod that drained
        # to its 25 s deadline, so the bound allows the polling and deletion lag on top of the grace period.
        assert old.gone - old.terminating <= GRACE_PERIOD + GONE_SLACK, vars(old)
        assert run.drained[old.node] != "no drain logged", run.drained
    assert STREAM_LIFETIME > ENDS_AFTER
