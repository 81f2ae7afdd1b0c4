"""bench.scale.node_state runs end to end at a small size: the snapshot the control plane would serve is applied
by a child process as the node proxy's xDS client does, with every resource decoded and held."""

from __future__ import annotations

from bench.scale.node_state import measure, report


def test_a_small_snapshot_is_applied_whole_and_reported() -> None:
    (row,) = measure([200])
    assert row["workloads"] == 200 and row["services"] == 20 and row["errors"] == 0
    assert row["rss_after"] >= row["rss_before"] > 0 and row["apply_cpu_s"] > 0
    text = report([row, row])
    assert "| 200 (20) |" in text and "KiB per known workload" in text
