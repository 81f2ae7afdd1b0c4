"""Run a test directory (or any pytest target) N times and report, per test, how often it failed.

    .venv/bin/python scripts/repeat_tests.py tests/integration --runs 5 [--load] [-- -k controllers]

Each run is a fresh pytest process writing a JUnit XML report; the summary lists every test that failed or
errored at least once, with its count and the first line of its last failure, and the exit status is 1 if any
did. ``--load`` keeps every core busy for the whole time (one spinning process per core, at normal priority), so
that waits which assume a speed show up; the spinners end with the runs, or after ``--max-hours`` at the latest.
"""

from __future__ import annotations

import argparse
import collections
import os
import signal
import subprocess
import sys
import tempfile
import time
import xml.etree.ElementTree as ET
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
HOG = "import time\nend = time.monotonic() + {seconds}\nwhile time.monotonic() < end:\n    pass\n"


def failures_in(report: Path) -> dict[str, str]:
    """Test id -> first line of its failure, for every failed or errored test case in a JUnit report."""
    found: dict[str, str] = {}
    if not report.exists():
        return {"<pytest did not write a report>": ""}
    for case in ET.parse(report).iter("testcase"):
        for outcome in ("failure", "error"):
            node = case.find(outcome)
            if node is not None:
                test_id = f"{case.get('classname', '')}::{case.get('name', '')}"
                message = (node.get("message") or node.text or "").strip().splitlines()
                found[test_id] = message[0][:160] if message else ""
    return found


def start_hogs(seconds: float) -> list[subprocess.Popen[bytes]]:
    code = HOG.format(seconds=seconds)
    return [subprocess.Popen([sys.executable, "-c", code]) for _ in range(os.cpu_count() or 1)]


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("target", nargs="?", default="tests", help="what pytest runs (default: tests)")
    parser.add_argument("--runs", type=int, default=5)
    parser.add_argument("--load", action="store_true", help="keep every core busy while the runs go")
    parser.add_argument("--max-hours", type=float, default=3.0, help="bound on the CPU hogs' life")
    argv = sys.argv[1:]
    split = argv.index("--") if "--" in argv else len(argv)
    args = parser.parse_args(argv[:split])
    args.pytest_args = argv[split + 1 :]  # argparse would take them for "target" when options follow the target

    counts: collections.Counter[str] = collections.Counter()
    last: dict[str, str] = {}
    hogs = start_hogs(args.max_hours * 3600) if args.load else []
    try:
        with tempfile.TemporaryDirectory(prefix="ambit-repeat-") as tmp:
            for run in range(1, args.runs + 1):
                report = Path(tmp) / f"run-{run}.xml"
                began = time.monotonic()
                command = [sys.executable, "-m", "pytest", "-q", "-p", "no:cacheprovider", f"--junitxml={report}"]
                done = subprocess.run([*command, args.target, *args.pytest_args], cwd=ROOT, check=False)
                failed = failures_in(report)
                counts.update(failed.keys())  # one count per run that test failed in
                last.update(failed)
                took = time.monotonic() - began
                print(f"run {run}/{args.runs}: exit {done.returncode}, {len(failed)} failed, {took:.0f} s", flush=True)
    finally:
        for hog in hogs:
            hog.send_signal(signal.SIGKILL)
            hog.wait()
    load = " under load" if args.load else ""
    if not counts:
        print(f"no failures in {args.runs} runs of {args.target}{load}")
        return 0
    print(f"failures in {args.runs} runs of {args.target}{load}:")
    for test_id, count in counts.most_common():
        print(f"  {count}/{args.runs}  {test_id}\n         {last[test_id]}")
    return 1


if __name__ == "__main__":
    sys.exit(main())
