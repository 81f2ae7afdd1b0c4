"""The plugin start-up benchmark runs end to end at a tiny size and writes its table and JSON lines (no timing gate)."""

from __future__ import annotations

import json
import sys
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parents[2]


def test_cni_startup_benchmark_with_two_runs_writes_a_table_and_json_lines(tmp_path: Path) -> None:
    if str(REPO) not in sys.path:  # bench/ is not installed: `python -m bench.cni_startup` runs from the repository
        sys.path.insert(0, str(REPO))
    from bench.cni_startup import BRIDGE, run

    if not BRIDGE.is_file():
        pytest.skip(f"needs {BRIDGE} (containernetworking-plugins)")
    report = run(2, tmp_path, echo=False)

    table = (tmp_path / "cni_startup.md").read_text()
    for scenario in ("bridge VERSION (Go)", "ambit-cni VERSION (installed wrapper)", "ambit-cni ADD, ambient pod"):
        assert f"| {scenario} | median |" in table and f"| {scenario} | p90 |" in table
    rows = [json.loads(line) for line in (tmp_path / "cni_startup.json").read_text().splitlines()]
    assert len(rows) == len(report.measurements)
    add = next(r for r in rows if r["scenario"] == "ambit-cni ADD, ambient pod" and r["metric"] == "median")
    assert add["value"] > 0 and add["reference_name"] == "bridge VERSION" and add["ratio"] > 0
