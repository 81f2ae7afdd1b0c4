"""The data-path benchmark runs end to end on a lab in its smoke profile and writes its outputs (no timing gate)."""

# ruff: noqa: RUF001 - the table header has its multiplication signs and an en dash

from __future__ import annotations

import json
import sys
from pathlib import Path

import pytest
from tests.e2e.lab_driver import TEST_TIMEOUT, root_lab_lock

REPO = Path(__file__).resolve().parents[2]

pytestmark = [pytest.mark.root, pytest.mark.kubectl, pytest.mark.timeout(TEST_TIMEOUT)]


def test_the_smoke_profile_writes_a_table_per_scenario_latest_json_and_a_png(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    if str(REPO) not in sys.path:  # bench/ is not installed: `python -m bench.mesh` runs from the repository root
        sys.path.insert(0, str(REPO))
    from bench.mesh import topology
    from bench.mesh.profile import MODES, PROFILES
    from bench.mesh.run import COLD_MODES, COLD_SCENARIO, run

    # Queue for the lab as the other e2e tests do, the test's timeout stopped meanwhile: another suite's lab may
    # be up for longer than the timeout (bench's own lock wait counts against it).
    monkeypatch.setattr(topology, "lab_lock", root_lab_lock)

    run(PROFILES["smoke"], tmp_path, echo=False)

    table = (tmp_path / "latest.md").read_text()
    assert "| Metric | Mode | Median | Min–max | Unit | ×direct | +direct | ×stunnel | Proxy CPU |" in table
    for scenario in (
        "bulk, 1 stream",
        "request/response 14 B, closed loop",
        "new connections",
        COLD_SCENARIO,
        "20 idle connections",
        "proxy memory",
    ):
        assert f"## {scenario}" in table
    rows = [json.loads(line) for line in (tmp_path / "latest.json").read_text().splitlines()]
    assert rows
    assert not any(r["scenario"].endswith("unpinned") for r in rows)  # left out of the smoke profile
    for row in rows:
        assert {"scenario", "mode", "value", "unit", "x_direct", "x_stunnel", "env"} <= row.keys()
    assert {r["mode"] for r in rows if r["scenario"] == "bulk, 1 stream"} == set(MODES)
    assert {"new connections, 1-byte echo", COLD_SCENARIO} <= {r["scenario"] for r in rows}
    assert {r["mode"] for r in rows if r["scenario"] == COLD_SCENARIO} == set(COLD_MODES)
    env = rows[0]["env"]
    assert {"kernel", "vcpus", "python", "openssl", "cipher", "http2", "uvloop"} <= env.keys()
    assert (tmp_path / "latest.png").read_bytes().startswith(b"\x89PNG\r\n\x1a\n")
