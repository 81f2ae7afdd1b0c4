"""One function per scenario: run the client in the client pod against a :class:`Route`, return samples.

A :class:`Route` is how one mode reaches the server's applications: the client pod's network namespace, the
address and port per application, and the pids of the proxies on the path (whose CPU is read from ``/proc``
before and after the client runs, so proxy CPU per GB or per round trip is attributed to that mode alone; the
modes run one after another, never together).
"""

from __future__ import annotations

import json
import select
import subprocess
import sys
import time
from collections.abc import Callable
from dataclasses import dataclass

from bench.mesh.probes import ProbeError, ProbeTimeout, cpu_seconds, parse_iperf3, parse_sockperf, rss_bytes
from bench.mesh.results import Sample
from bench.mesh.topology import Processes


@dataclass(frozen=True, slots=True)
class Route:
    mode: str
    netns: str
    host: str
    ports: dict[str, int]
    pids: tuple[int, ...]


def _run(route: Route, argv: list[str], timeout: float) -> str:
    try:
        done = subprocess.run(
            ["ip", "netns", "exec", route.netns, *argv], capture_output=True, text=True, timeout=timeout, check=False
        )
    except subprocess.TimeoutExpired:
        raise ProbeTimeout(
            f"{route.mode}: {' '.join(argv)} did not finish within {timeout:g} s "
            f"(client netns {route.netns}, server {route.host}); its TCP sockets then:\n{_sockets(route.netns)}"
        ) from None
    if done.returncode != 0 and not done.stdout.strip():
        raise ProbeError(f"{route.mode}: {argv[0]} failed ({done.returncode}): {done.stderr.strip()[-300:]}")
    return done.stdout


def _sockets(netns: str) -> str:
    """The client namespace's TCP sockets with their queues and TCP state, for a hung client's error (bounded)."""
    try:
        done = subprocess.run(
            ["ip", "netns", "exec", netns, "ss", "-tnio"], capture_output=True, text=True, timeout=5, check=False
        )
    except (OSError, subprocess.TimeoutExpired) as exc:
        return f"(ss failed: {exc})"
    lines = (done.stdout or done.stderr).splitlines()
    return "\n".join(lines[:40]) + (f"\n... {len(lines) - 40} more lines" if len(lines) > 40 else "")


def _cpu(route: Route) -> float:
    return cpu_seconds(route.pids) if route.pids else 0.0


def _measured(route: Route, action: Callable[[], str]) -> tuple[str, float]:
    before = _cpu(route)
    out = action()
    return out, _cpu(route) - before


def bulk(route: Route, scenario: str, streams: int, seconds: float) -> list[Sample]:
    argv = ["iperf3", "-c", route.host, "-p", str(route.ports["iperf3"]), "-t", f"{seconds:g}", "-P", str(streams)]
    argv.append("-J")
    for attempt in range(10):
        out, cpu = _measured(route, lambda: _run(route, argv, seconds + 30))
        try:
            result = parse_iperf3(out)
            break
        except ProbeError as exc:
            if "busy" not in str(exc) or attempt == 9:
                raise
            time.sleep(0.5)  # the iperf3 server is still closing the previous test
    gigabytes = result.bytes / 1e9
    per_gb = cpu / gigabytes if route.pids and gigabytes > 0 else None
    return [Sample(scenario, "throughput", route.mode, result.bits_per_second / 1e9, "Gbit/s", per_gb, "CPU-s/GB")]


CLIENT_NODE_CPU = 0
"""The vCPU the latency client runs on: node 1's (see ``run.pin_nodes``), the same for every mode."""


def latency(route: Route, scenario: str, size: int, seconds: float, rate: int = 0) -> list[Sample]:
    # sockperf under-load busy-waits between sends: pinned with node 1's proxy, it cannot land on node 2's vCPU.
    argv = ["taskset", "-c", str(CLIENT_NODE_CPU)]
    argv += ["sockperf", "ul" if rate else "pp", "--tcp", "-i", route.host, "-p", str(route.ports["sockperf"])]
    argv += ["-m", str(size), "-t", str(max(1, round(seconds))), "--full-rtt"]
    if rate:
        argv += ["--mps", str(rate), "--reply-every", "1"]
    out, cpu = _measured(route, lambda: _run(route, argv, seconds + 30))
    result = parse_sockperf(out)
    per_rt = cpu / result.messages * 1e6 if route.pids and result.messages else None
    return [
        Sample(scenario, name, route.mode, value, "µs", per_rt, "CPU-µs/RT")
        for name, value in (("p50", result.p50), ("p90", result.p90), ("p99", result.p99))
    ]


def connection_rate(route: Route, scenario: str, seconds: float, concurrency: int) -> list[Sample]:
    argv = [sys.executable, "-m", "bench.mesh.apps", "rate", route.host, str(route.ports["echo"])]
    argv += ["--seconds", f"{seconds:g}", "--concurrency", str(concurrency)]
    out, cpu = _measured(route, lambda: _run(route, argv, seconds + 60))
    try:
        result = json.loads(out)
        count, elapsed = int(result["connections"]), float(result["seconds"])
    except (ValueError, KeyError, TypeError):
        raise ProbeError(f"{route.mode}: the rate client printed {out[:200]!r}") from None
    if count == 0:
        raise ProbeError(f"{route.mode}: no connection went through ({result.get('failures')} failures)")
    per_conn = cpu / count * 1e6 if route.pids else None
    return [Sample(scenario, "connections/s", route.mode, count / elapsed, "/s", per_conn, "CPU-µs/conn")]


def idle(route: Route, scenario: str, count: int, processes: Processes) -> list[Sample]:
    """Hold ``count`` connections (each used once); proxy RSS grown per connection, in KiB."""
    before = rss_bytes(route.pids)
    cpu_before = _cpu(route)
    argv = [sys.executable, "-m", "bench.mesh.apps", "hold", route.host, str(route.ports["echo"])]
    holder = processes.start(route.netns, [*argv, "--count", str(count)], "hold", stdin=subprocess.PIPE)
    try:
        assert holder.stdout is not None
        ready, _, _ = select.select([holder.stdout], [], [], 60 + count / 50)
        line = holder.stdout.readline() if ready else ""
        if not line.startswith("ready"):
            raise ProbeError(f"{route.mode}: the holder did not get {count} connections up ({line.strip()!r})")
        time.sleep(1.0)  # let buffers the set-up grew settle
        after = rss_bytes(route.pids)
        setup_cpu = _cpu(route) - cpu_before
    finally:
        processes.stop(holder)
        processes.started.remove(holder)
    time.sleep(0.5)
    per_conn = (after - before) / count / 1024
    return [
        Sample(
            scenario, "proxy RSS per connection", route.mode, per_conn, "KiB", setup_cpu / count * 1e6, "CPU-µs/conn"
        )
    ]
