"""Benchmark of the import time of ``ambit nodeproxy``'s start: trees of the source compared in fresh interpreters.

Run: ``python -m bench.nodeproxy_imports --tree base=/tmp/base/src --tree now=src [--rounds 15]``. No root, no lab.

Theory of operation. Each process runs ``ambit``'s entry point (:func:`ambit.cli.main.main`) with the command line
the DaemonSet gives (``nodeproxy --node ... --xds-address ... --ca-address ... --root-cert ... --token ...``) in a
tree put first on ``PYTHONPATH``, so the front end of that tree (typer or argparse) parses it, checks the flags and
imports the data path exactly as the real process does. The command's last step, ``ambit.inpod.eventloop.run``
(the same call in every tree since the node proxy had an event-loop option), is replaced by one that stops the
process, so what is measured is the import closure of the start and nothing the loop does. Figures per process:

- ``wall`` and ``CPU``: ``perf_counter`` and ``process_time`` around the whole start path, in ms;
- ``importtime``: the sum of the top-level imports' cumulative times in a separate process run with
  ``python -X importtime`` (which slows imports down: its figures are only comparable with each other);
- ``modules``: ``len(sys.modules)`` at the end, and how many of them are ``ambit``'s;
- ``RSS``: the process's resident memory at the end, in MiB (the imports' share of the proxy's memory at start).

The trees run in turn (A B A B ...), ``--rounds`` processes of each kind per tree, so load from other work on the
machine falls on all of them alike; medians and minima are printed with the load average before and after. The
bytecode of each tree must be compiled beforehand (``python -m compileall``), or the first process of each tree
pays for it and the others do not, when ``PYTHONDONTWRITEBYTECODE`` is set.
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import sys
from collections import defaultdict
from pathlib import Path

ARGV = [
    "ambit", "nodeproxy", "--node", "node-1",
    "--xds-address", "198.18.0.1:15012", "--ca-address", "198.18.0.1:15012",
    "--root-cert", "/var/run/secrets/istio/root-cert.pem", "--token", "/var/run/secrets/tokens/istio-token",
    "--cluster-id", "Kubernetes",
]  # fmt: skip
"""The DaemonSet's command line (deploy/base/ztunnel/daemonset.yaml) with its variables filled in."""

PROBE = f"""\
import json, sys, time
wall, cpu = time.perf_counter(), time.process_time()
import ambit.inpod.eventloop as eventloop
class Started(BaseException):
    pass
def run(*args, **kwargs):
    raise Started
eventloop.run = run
sys.argv = {ARGV!r}
from ambit.cli.main import main
try:
    main()
except Started:
    pass
else:
    raise SystemExit("the start path did not reach the event loop")
wall, cpu = time.perf_counter() - wall, time.process_time() - cpu
ambit = sum(1 for name in sys.modules if name.split('.')[0] == 'ambit')
rss = next(int(line.split()[1]) for line in open('/proc/self/status') if line.startswith('VmRSS:')) / 1024
print(json.dumps({{"wall": wall * 1e3, "cpu": cpu * 1e3, "modules": len(sys.modules), "ambit": ambit, "rss": rss}}))
"""


def run_probe(src: Path, importtime: bool) -> dict[str, float]:
    env = {**os.environ, "PYTHONPATH": str(src)}
    args = [sys.executable, *(["-X", "importtime"] if importtime else []), "-c", PROBE]
    done = subprocess.run(args, check=True, capture_output=True, text=True, env=env, timeout=120)
    figures: dict[str, float] = json.loads(done.stdout.strip().splitlines()[-1])
    if importtime:
        figures["importtime"] = total_importtime(done.stderr) / 1e3
        figures["own"] = own_times(done.stderr)  # type: ignore[assignment]
    return figures


def total_importtime(stderr: str) -> int:
    """The sum of the top-level imports' cumulative microseconds in ``-X importtime`` output."""
    total = 0
    for line in stderr.splitlines():
        if not line.startswith("import time:") or "cumulative" in line:
            continue
        _, cumulative, name = line[len("import time:") :].split("|")
        if name.startswith(" ") and not name.startswith("  "):
            total += int(cumulative)
    return total


def own_times(stderr: str) -> dict[str, float]:
    """Self import time in ms per top-level package (``ambit`` split one level deeper)."""
    out: dict[str, float] = defaultdict(float)
    for line in stderr.splitlines():
        if not line.startswith("import time:") or "cumulative" in line:
            continue
        own, _, name = line[len("import time:") :].split("|")
        parts = name.strip().split(".")
        key = ".".join(parts[:2]) if parts[0] == "ambit" else parts[0]
        out[key] += int(own) / 1e3
    return dict(out)


def load() -> str:
    return " ".join(f"{x:.2f}" for x in os.getloadavg())


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--tree", action="append", required=True, help="NAME=SRC_DIR, at least one")
    parser.add_argument("--rounds", type=int, default=15)
    parser.add_argument("--top", type=int, default=0, help="also list the N packages with the most own import time")
    options = parser.parse_args()
    trees = {name: Path(src) for name, src in (tree.split("=", 1) for tree in options.tree)}
    results: dict[str, list[dict[str, float]]] = {name: [] for name in trees}
    timed: dict[str, list[dict[str, float]]] = {name: [] for name in trees}
    before = load()
    for src in trees.values():  # one untimed process each: the page cache
        run_probe(src, importtime=False)
    for _ in range(options.rounds):
        for name, src in trees.items():
            results[name].append(run_probe(src, importtime=False))
        for name, src in trees.items():
            timed[name].append(run_probe(src, importtime=True))
    after = load()
    print(f"{options.rounds} processes of each kind per tree, in turn; load average {before} before, {after} after")
    print()
    print("| tree | wall (ms) | CPU (ms) | -X importtime (ms) | min wall / CPU | modules (ambit) | RSS (MiB) |")
    print("| --- | ---: | ---: | ---: | ---: | ---: | ---: |")
    for name in trees:
        rows, more = results[name], timed[name]
        wall = [r["wall"] for r in rows]
        cpu = [r["cpu"] for r in rows]
        imp = [r["importtime"] for r in more]
        print(
            f"| {name} | {statistics.median(wall):.0f} | {statistics.median(cpu):.0f} | {statistics.median(imp):.0f}"
            f" | {min(wall):.0f} / {min(cpu):.0f} | {rows[-1]['modules']:.0f} ({rows[-1]['ambit']:.0f})"
            f" | {statistics.median(r['rss'] for r in rows):.1f} |"
        )
    if options.top:
        for name in trees:
            medians = {
                key: statistics.median(r["own"].get(key, 0.0) for r in timed[name])  # type: ignore[union-attr]
                for key in timed[name][-1]["own"]  # type: ignore[union-attr]
            }
            top = sorted(medians.items(), key=lambda kv: -kv[1])[: options.top]
            print(f"\n{name}: own import time, median ms: " + ", ".join(f"{k} {v:.1f}" for k, v in top))


if __name__ == "__main__":
    main()
