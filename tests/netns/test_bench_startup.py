"""The node proxy start-up benchmark runs end to end in its quickest form and writes its table and JSON lines (the
shape of the report is checked, not a speed)."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
from bench.startup import run

pytestmark = [pytest.mark.root, pytest.mark.timeout(300)]

METRICS = ("ready (median)", "CPU time (median)", "import time (median)", "modules", "RSS (median)", "threads")


def test_startup_benchmark_in_its_quick_form_writes_a_table_and_json_lines(tmp_path: Path) -> None:
    report = run(1, 1, tmp_path, quick=True, echo=False)

    table = (tmp_path / "startup.md").read_text()
    for metric in METRICS:
        assert f"| ambit nodeproxy, no pods | {metric} |" in table
    rows = [json.loads(line) for line in (tmp_path / "startup.json").read_text().splitlines()]
    assert len(rows) == len(report.measurements)
    value = {row["metric"]: row["value"] for row in rows}
    assert value["modules"] > 100 and value["RSS (median)"] > 0 and value["threads"] >= 1
    assert value["import time (median)"] > 0 and value["ready (median)"] > 0
