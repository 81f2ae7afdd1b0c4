"""Where a proxy's CPU goes on the data-path lab: user against system time, and optionally a `perf` profile by
shared object, for ambit and the C tunnels in one run (issue 23's "profile of each target still missed").

``python -m bench.mesh.cpu_split [--scenario rr|bulk] [--seconds S] [--rounds N] [--modes ambit,stunnel]
[--perf DIR]`` (root: it brings up the benchmark's lab) measures the closed-loop 14-byte round trip (``rr``,
sockperf, client and node pinned as in :func:`bench.mesh.run.pin_nodes`) or one bulk stream (``bulk``, iperf3)
through each mode, ``--rounds`` times interleaved, and prints per round trip (per GB in bulk) the proxies' CPU
split into user and system time from ``/proc/<pid>/stat`` (every thread, live or ended). With ``--perf DIR`` one
more run per mode is recorded by ``perf record -g`` on the mode's proxies and the shares of the kernel, libpython,
the event loop, libssl/libcrypto and libc are printed from it (``DIR/<scenario>-<mode>.perf.data`` is kept for
``perf report``).

Why: on the lab, system time (the kernel's network path, wake-ups) is about the same for ambit and stunnel; what
differs is user time, and its owners say which lever can close a gap (fewer Python steps, fewer copies, or native
code). Not a test and not part of ``make bench``: a probe to run when deciding what to change.
"""

from __future__ import annotations

import argparse
import os
import re
import subprocess
import sys
import tempfile
import time
from collections.abc import Iterable
from pathlib import Path

from bench.mesh import scenarios
from bench.mesh.profile import AMBIT, DIRECT, HAPROXY, PASSTHROUGH, STUNNEL
from bench.mesh.run import TunnelPairs, check_mesh, ensure_tools, pin_nodes, routes, start_servers
from bench.mesh.scenarios import Route
from bench.mesh.topology import Processes, bench_lab

_TICKS = os.sysconf("SC_CLK_TCK")
_GROUPS = (
    ("kernel", ("[kernel",)),
    ("python", ("libpython", "python3")),
    ("event loop", ("uvloop", "loop.cpython")),
    ("TLS (libssl, libcrypto, _ssl)", ("libssl", "libcrypto", "_ssl.")),
    ("libc", ("libc.so", "libc-")),
)


def user_system(pids: Iterable[int]) -> tuple[float, float]:
    """User and system CPU seconds of the processes (all their threads, ended ones included)."""
    user = system = 0.0
    for pid in pids:
        fields = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()
        user += int(fields[11]) / _TICKS
        system += int(fields[12]) / _TICKS
    return user, system


def dso_shares(data: Path) -> dict[str, float]:
    """Percent of the samples in ``data`` per group of :data:`_GROUPS` (see :func:`shares_of`)."""
    done = subprocess.run(
        ["perf", "report", "-i", str(data), "--no-children", "--sort", "dso", "-g", "none", "--stdio"],
        capture_output=True,
        text=True,
        check=False,
    )
    return shares_of(done.stdout)


def shares_of(report: str) -> dict[str, float]:
    """Percent per group of :data:`_GROUPS` (the rest as "other") from the text of ``perf report --sort dso``."""
    shares: dict[str, float] = {name: 0.0 for name, _ in _GROUPS} | {"other": 0.0}
    for line in report.splitlines():
        match = re.match(r"\s*([\d.]+)%\s+(\S.*)$", line)
        if not match:
            continue
        percent, dso = float(match.group(1)), match.group(2).strip()
        group = next((name for name, needles in _GROUPS if any(n in dso for n in needles)), "other")
        shares[group] += percent
    return shares


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--scenario", choices=("rr", "bulk"), default="rr")
    parser.add_argument("--seconds", type=float, default=4.0)
    parser.add_argument("--rounds", type=int, default=3)
    modes_help = f"comma-separated, of {AMBIT}, {STUNNEL}, {HAPROXY}, {PASSTHROUGH}"
    parser.add_argument("--modes", default=f"{AMBIT},{STUNNEL}", help=modes_help)
    parser.add_argument("--perf", type=Path, help="record each mode once more with perf into this directory")
    args = parser.parse_args(argv)
    if os.geteuid() != 0:
        print("cpu_split needs root (it brings up a lab)", file=sys.stderr)
        return 2
    modes = [m for m in args.modes.split(",") if m]
    if unknown := set(modes) - {AMBIT, STUNNEL, HAPROXY, PASSTHROUGH}:
        parser.error(f"unknown modes: {sorted(unknown)} ({DIRECT} has no proxy to measure)")
    ensure_tools()
    unit = "round trip" if args.scenario == "rr" else "GB"
    print(f"load average {os.getloadavg()[0]:.2f} at start", flush=True)
    with tempfile.TemporaryDirectory(prefix="ambit-cpu-split-") as tmp_name:
        tmp = Path(tmp_name)
        procs = Processes(tmp)
        with bench_lab(tmp) as lab:
            tunnels = TunnelPairs(lab, procs, tmp)
            try:
                lab.create_pods(False)
                for server in ("plain-srv", "amb-srv"):
                    start_servers(lab, procs, server)
                lab.reuse_time_wait()
                tunnels.start()
                cross = routes(lab, tunnels.pids)
                check_mesh(lab, cross[AMBIT])
                if args.scenario == "rr":
                    pin_nodes(lab, tunnels)
                for number in range(args.rounds):
                    for mode in modes:
                        _report(cross[mode], args.scenario, args.seconds, unit, number)
                if args.perf:
                    args.perf.mkdir(parents=True, exist_ok=True)
                    for mode in modes:
                        _profile(cross[mode], args.scenario, args.seconds, args.perf)
            finally:
                pin_nodes(lab, tunnels, on=False)
                procs.stop_all()
    return 0


def _report(route: Route, scenario: str, seconds: float, unit: str, number: int) -> None:
    user0, system0 = user_system(route.pids)
    if scenario == "rr":
        sample = scenarios.latency(route, "rr", size=14, seconds=seconds)[0]
        figure = f"p50 {sample.value:7.1f} us"
    else:
        sample = scenarios.bulk(route, "bulk", streams=1, seconds=seconds)[0]
        figure = f"{sample.value:5.2f} Gbit/s"
    user1, system1 = user_system(route.pids)
    user, system = user1 - user0, system1 - system0
    per_unit = sample.cpu or 0.0  # CPU-us per round trip or CPU-s per GB, from the same /proc figures
    label = "CPU-us" if scenario == "rr" else "CPU-s"
    if per_unit and user + system > 0:
        share = user / (user + system)
        split = f"{label}/{unit} {per_unit:7.2f} = user {per_unit * share:7.2f} + system {per_unit * (1 - share):7.2f}"
    else:
        split = "no CPU measured"
    print(f"round {number + 1} {route.mode:18s} {figure}  {split}", flush=True)


def _profile(route: Route, scenario: str, seconds: float, where: Path) -> None:
    data = where / f"{scenario}-{route.mode}.perf.data"
    pids = ",".join(str(p) for p in route.pids)
    argv = ["perf", "record", "-F", "2000", "-g", "-o", str(data), "-p", pids]
    recorder = subprocess.Popen(argv, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    try:
        time.sleep(0.5)
        if scenario == "rr":
            scenarios.latency(route, "rr", size=14, seconds=seconds)
        else:
            scenarios.bulk(route, "bulk", streams=1, seconds=seconds)
    finally:
        recorder.send_signal(2)
        recorder.wait(timeout=60)
    shares = dso_shares(data)
    text = ", ".join(f"{name} {percent:.1f}%" for name, percent in shares.items())
    print(f"perf {route.mode:18s} {text}  ({data})", flush=True)


if __name__ == "__main__":
    raise SystemExit(main())
