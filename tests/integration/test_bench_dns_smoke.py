"""The DNS benchmark runs end to end at a tiny size (dnsperf, dnsmasq and the real DNS proxy in a private network
namespace) and writes its table and JSON lines (no timing gate); nothing it started outlives it."""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parents[2]
TOOLS = ("dnsperf", "dnsmasq", "unshare", "taskset", "ip")

pytestmark = pytest.mark.timeout(180)


def _tools() -> None:
    missing = [tool for tool in TOOLS if shutil.which(tool) is None]
    if not missing:
        return
    message = f"missing {', '.join(missing)} (make install adds dnsperf and dnsmasq-base)"
    if os.environ.get("CI") == "true":
        pytest.fail(f"{message}: CI installs them")
    pytest.skip(message)


def _command_lines() -> set[str]:
    """Every running process's command line, from /proc."""
    found = set()
    for proc in Path("/proc").iterdir():
        if proc.name.isdigit():
            try:
                found.add((proc / "cmdline").read_bytes().replace(b"\0", b" ").decode(errors="replace"))
            except OSError:
                continue
    return found


def test_the_quick_profile_at_a_tiny_size_writes_both_scenarios_with_dnsmasq_as_reference(tmp_path: Path) -> None:
    _tools()
    out = tmp_path / "results"
    argv = [sys.executable, "-m", "bench.dns", "--quick", "--seconds", "1", "--services", "20", "--out", str(out)]
    done = subprocess.run(argv, cwd=REPO, capture_output=True, text=True, timeout=150, check=False)
    assert done.returncode == 0, done.stderr[-2000:]

    table = (out / "dns.md").read_text()
    assert "| Scenario | Metric | Value | Unit | Reference | Ratio |" in table
    rows = [json.loads(line) for line in (out / "dns.json").read_text().splitlines()]
    assert [(r["scenario"], r["metric"]) for r in rows] == [
        (scenario, metric)
        for scenario in ("cached mesh names", "forwarded names")
        for metric in (
            "answers/s at saturation",
            "server CPU per answer at saturation",
            "p50 latency at a fixed rate",
            "p99 latency at a fixed rate",
        )
    ]
    assert [r["unit"] for r in rows[:4]] == ["answers/s", "µs", "µs", "µs"]
    assert rows[5]["note"] == "ambit DNS proxy → dnsmasq: proxy + dnsmasq"  # forwarding: both servers' CPU
    assert {r["reference_name"] for r in rows} == {"dnsmasq, hosts file", "dnsmasq direct"}
    assert all(r["value"] > 0 and r["reference"] > 0 and r["ratio"] > 0 for r in rows)
    assert rows[0]["env"]["services"] == 20
    assert "queries/s" in rows[2]["note"]
    # Only this checkout's processes: another clone's suite may be running the same benchmark at the same time.
    ours = [line for line in _command_lines() if line.startswith(f"{sys.executable} ")]
    assert not [line for line in ours if "bench.dns_proxy" in line and "--services 20 " in line]
    assert not [line for line in _command_lines() if str(out) in line]


def test_outside_a_private_namespace_the_benchmark_refuses_to_touch_the_machine(tmp_path: Path) -> None:
    _tools()
    env = os.environ | {"AMBIT_BENCH_DNS_NETNS": "root", "PYTHONPATH": str(REPO)}
    argv = [sys.executable, "-m", "bench.dns", "--quick", "--out", str(tmp_path)]
    done = subprocess.run(argv, cwd=REPO, capture_output=True, text=True, timeout=60, check=False, env=env)
    if [line for line in Path("/proc/net/dev").read_text().splitlines()[2:] if not line.strip().startswith("lo:")]:
        assert done.returncode == 1
        assert done.stderr.strip() == (
            "bench.dns: refusing to run outside a private network namespace (python -m bench.dns makes one)"
        )
        assert not (tmp_path / "dns.json").exists()


def test_bad_arguments_get_one_line_not_a_traceback() -> None:
    argv = [sys.executable, "-m", "bench.dns", "--seconds", "0"]
    done = subprocess.run(argv, cwd=REPO, capture_output=True, text=True, timeout=60, check=False)
    assert done.returncode == 2
    assert "--seconds must be between 0 and 600" in done.stderr
    assert "Traceback" not in done.stderr
