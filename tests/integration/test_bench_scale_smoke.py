"""The control-plane scale harness runs end to end at a tiny size: every change reaches every simulated node proxy,
a restart resends nothing, and the table and JSON lines are written (no timing gate)."""

from __future__ import annotations

import json
import math
import sys
from dataclasses import replace
from pathlib import Path

REPO = Path(__file__).resolve().parents[2]


def test_scale_harness_smoke_profile_delivers_every_change_to_every_client(tmp_path: Path) -> None:
    if str(REPO) not in sys.path:  # bench/ is not installed: `python -m bench.scale` runs from the repository root
        sys.path.insert(0, str(REPO))
    from bench.scale.__main__ import run
    from bench.scale.run import PROFILES

    profile = replace(PROFILES["smoke"], name="test")
    shape = profile.shape
    report = run(profile, tmp_path, echo=False)

    table = (tmp_path / "scale.md").read_text()
    assert "| Scenario | Metric | Value | Unit | Reference | Ratio |" in table
    for scenario in ("load ", "control plane start", "initial sync", "churn ", "control plane restart"):
        assert f"| {scenario}" in table
    rows = [json.loads(line) for line in (tmp_path / "scale.json").read_text().splitlines()]
    assert len(rows) == len(report.measurements)
    values = {r["metric"]: r["value"] for r in rows}
    assert values["resources per client"] == shape.pods + shape.services
    assert values["changes"] >= 4
    assert values["deliveries missing"] == 0
    assert values["delivery p99"] > 0
    assert values["resources resent"] == 0
    assert math.isfinite(values["spawn to all clients in sync"])
    assert values["client connects"] >= shape.nodes
    assert rows[0]["env"]["shape"]["clients"] == shape.nodes


def test_scale_harness_on_demand_clients_get_the_changes_to_what_they_looked_up(tmp_path: Path) -> None:
    if str(REPO) not in sys.path:
        sys.path.insert(0, str(REPO))
    from bench.scale.__main__ import run
    from bench.scale.run import PROFILES

    profile = replace(PROFILES["smoke"], name="test", on_demand=8, restart_rates=(0.0, 50.0))
    report = run(profile, tmp_path, echo=False)
    values = {(m.scenario, m.metric): m.value for m in report.measurements}
    assert 0 < values[("initial sync, 3 clients on demand (8 names each)", "resources per client")] <= 8
    assert values[("churn 20 pod changes/s to 3 clients on demand (8 names each)", "deliveries missing")] == 0
    for admission in ("default admission", "admission 50/s"):
        scenario = f"control plane restart ({admission}), 3 clients on demand (8 names each)"
        assert values[(scenario, "resources resent")] == 0
        assert math.isfinite(values[(scenario, "spawn to all clients in sync")])
        assert values[(scenario, "TokenReviews on the API server")] > 0
