"""The API server benchmark runs end to end at a tiny size and produces its table and JSON lines (no timing gate)."""

from __future__ import annotations

import json
import sys
from dataclasses import replace
from pathlib import Path

REPO = Path(__file__).resolve().parents[2]


def test_apiserver_benchmark_smoke_profile_writes_a_table_and_json_lines(tmp_path: Path) -> None:
    if str(REPO) not in sys.path:  # bench/ is not installed: `python -m bench.apiserver` runs from the repository root
        sys.path.insert(0, str(REPO))
    from bench.apiserver import run
    from bench.apiserver_scenarios import PROFILES

    profile = replace(PROFILES["smoke"], name="test")
    report = run(profile, tmp_path, echo=False)

    table = (tmp_path / "apiserver.md").read_text()
    assert "| Scenario | Metric | Value | Unit | Reference | Ratio |" in table
    for scenario in ("1 list", "2 creates, 8 clients", "3 watch", "4 restart", "4 crash"):
        assert f"| {scenario}" in table
    rows = [json.loads(line) for line in (tmp_path / "apiserver.json").read_text().splitlines()]
    assert len(rows) == len(report.measurements)
    assert {"scenario", "metric", "value", "unit", "env"} <= rows[0].keys()
    assert rows[0]["env"]["cpus"] >= 1
    lost = next(r for r in rows if r["metric"] == "acknowledged pods lost or changed")
    assert lost["value"] == 0
