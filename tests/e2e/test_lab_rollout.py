"""A rolling restart of every node proxy under load, on the mesh installed from deploy/ (issue 21's "Done when",
Istio's TestZtunnelRestart): ``kubectl rollout restart daemonset/ztunnel`` rolls both nodes (maxSurge 1,
maxUnavailable 0) while long-lived streams (same-node and cross-node, data both ways all the time) and a steady
loop of new connections run through the mesh (:mod:`tests.faults.scene`).

Checked end to end from the load's records: every stream established before the rollout is still intact when the
load stops, each echo equal to what was sent (no byte lost, none changed); no new connection started during the
rollout is refused, reset or timed out; no payload crosses a node link in clear; and each old node proxy pod
drains (its established connections run on through it) and exits once they have ended, before its deadline.
"""

from __future__ import annotations

import time
from pathlib import Path

from tests.e2e.lab_driver import Lab
from tests.faults.load import STREAM_INTERVAL
from tests.faults.report import fault_row, stream_kept, streams_up_at
from tests.faults.scene import (
    EVERY_PAIR,
    check_row,
    failures,
    kept_streams,
    roll_node_proxies,
    set_up,
    steady_load,
    stream_bytes,
    wait_old_proxies_gone,
)

SHARES_THE_MESH_LAB = True
STEP_BOUND = 3.0
"""The load's bound on each step of a stream (``tests.faults.load --timeout``): a stream that stayed intact echoed a
line at least every ``STEP_BOUND + STREAM_INTERVAL`` seconds."""


def test_a_rollout_restart_of_every_node_proxy_under_load_keeps_every_stream_and_refuses_no_connection(
    lab: Lab, namespace: str, tmp_path: Path
) -> None:
    scene = set_up(lab, namespace)
    with steady_load(scene, tmp_path) as trial:
        time.sleep(1.5)
        rollout = roll_node_proxies(lab)
        time.sleep(3)  # new connections through the new proxies while the old ones still relay the streams
        window_end = time.time()
    drained = wait_old_proxies_gone(lab, rollout)
    records = trial.records
    row = fault_row(
        "node proxy DaemonSet rollout (both nodes)",
        records,
        rollout.began,
        window_end,
        trial.plaintext,
        note=f"rollout {rollout.seconds:.1f} s",
    )
    up = streams_up_at(records, rollout.began)
    tried = [r for r in records if r["kind"] == "new" and rollout.began <= r["start"] <= window_end]
    carried = stream_bytes(records)
    print(
        f"\nrollout of {len(rollout.old)} node proxies: {rollout.seconds:.1f} s; streams kept {row.kept}/"
        f"{row.established}; new connections tried {len(tried)}, failed {row.failed}; bytes echoed per stream "
        f"{carried}; old proxies: {drained}"
    )
    check_row(trial, row)
    assert row.established == 4 and row.kept == 4, (up, [r for r in records if r["kind"] == "stream"])
    assert all(stream_kept(records, u) for u in up)
    assert kept_streams(records, EVERY_PAIR) == []
    assert failures(records, rollout.began, window_end, EVERY_PAIR) == []
    assert {r["target"] for r in tried} == set(EVERY_PAIR), "each pair tried new connections during the rollout"
    # Each stream carried data through the whole rollout: an intact stream echoes a line at least every step bound.
    lasted = trial.stopped_at - rollout.began
    for pair in EVERY_PAIR:
        assert carried[pair] >= 64 * int(lasted / (STEP_BOUND + STREAM_INTERVAL)), (pair, carried)
    # The old pods drained: their connections ran on until the load closed them, and they exited then.
    assert drained == {o.node: "every connection ended" for o in rollout.old}, drained
