"""The soak (issue 21): many connections of mixed lifetimes through both node proxies while pods and policies churn;
the node proxies' memory and open files over the run.

``python -m bench.soak [--quick]`` (root; ``make bench-soak``, ``make bench-soak-quick``) writes
``bench/results/soak.{md,json,png}`` and ``soak-series.json``:

1. A 2-node lab with the mesh (:func:`bench.mesh.topology.bench_lab`: the lab lock, ``ambit lab up``, always
   ``ambit lab down``), the ambient pods ``amb-cli`` (node 1), ``amb-srv`` (node 2) and ``amb-srv-local`` (node 1),
   each server running the echo app.
2. Two soak clients in ``amb-cli`` (``python -m bench.mesh.apps soak``), one to each server, so that connections
   cross both node proxies (cross-node: node 1's outbound, node 2's inbound over HBONE) and stay on one (same
   node). Lifetimes are mixed (:func:`bench.mesh.apps.lifetime`): 89% carry one echo and close, 10% stay open
   for up to a second with three echoes, 1% for 5 to 20 seconds with an echo a second.
3. Churn, every :data:`CHURN_INTERVAL` s while the clients run, in turn: an ambient pod created on one node (so the
   node agent enrols it and the node proxy opens its listeners) or the one made two turns before deleted; an
   AuthorizationPolicy on ``amb-srv`` created or deleted (a DENY for a principal nobody has: every connection
   evaluates it, none is refused for it).
4. Every :data:`SAMPLE_INTERVAL` s: each node proxy's RSS and open file descriptors, against the connections
   done so far. Warm-up is the first :data:`WARMUP_SHARE` of the connections.

Verdict (issue 21's "Soak"): memory flat within 10% after warm-up (every later sample at most 1.10x the sample at
the end of warm-up), no file-descriptor growth (once the clients ended and :data:`SETTLE` s passed, each proxy
holds at most :data:`FD_SLACK` more descriptors than before the load), no crash (the same node-proxy processes
from start to end), and the connections that failed (the clients count them; none is expected).
"""

from __future__ import annotations

import argparse
import contextlib
import json
import os
import select
import subprocess
import sys
import tempfile
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from ambit.errors import AmbitError
from bench.mesh import chart
from bench.mesh.probes import ProbeError, rss_bytes
from bench.mesh.run import _listening, ensure_tools
from bench.mesh.topology import AMBIENT, BenchLab, Processes, bench_lab
from bench.report import Measurement, Report

REPO = Path(__file__).resolve().parents[1]
RESULTS = REPO / "bench" / "results"
ECHO_PORT = 9000
SAMPLE_INTERVAL = 2.0
CHURN_INTERVAL = 3.0
WARMUP_SHARE = 0.10
GROWTH_LIMIT = 1.10
FD_SLACK = 8
SETTLE = 5.0
DENY_NOBODY = "cluster.local/ns/soak-nobody/sa/nobody"


class SoakError(AmbitError):
    """The soak could not run (a client that never started, a node proxy that went away before the start)."""


@dataclass(frozen=True, slots=True)
class Profile:
    name: str
    connections: int
    """Connections in all, split between the cross-node and the same-node client."""
    concurrency: int
    """Short-lived connections at a time, per client."""
    max_seconds: float


PROFILES = {
    "quick": Profile("quick", connections=10_000, concurrency=32, max_seconds=600),
    "full": Profile("full", connections=100_000, concurrency=64, max_seconds=2400),
}


@dataclass(frozen=True, slots=True)
class Sample:
    seconds: float
    connections: int
    rss_mib: dict[str, float]
    """Node name → its node proxy's RSS."""
    fds: dict[str, int]


@dataclass
class Verdict:
    """Rule 4's checks on one node proxy's samples (pure: :func:`judge`)."""

    node: str
    rss_warm: float
    rss_peak_after: float
    rss_end: float
    fds_before: int
    fds_peak: int
    fds_after: int

    @property
    def growth(self) -> float:
        return self.rss_peak_after / self.rss_warm if self.rss_warm > 0 else float("inf")

    @property
    def memory_flat(self) -> bool:
        return self.growth <= GROWTH_LIMIT

    @property
    def fds_flat(self) -> bool:
        return self.fds_after <= self.fds_before + FD_SLACK


def judge(node: str, before: Sample, samples: list[Sample], after: Sample, total: int) -> Verdict:
    """The verdict for ``node`` from the samples taken during the load (``before``/``after``: without load)."""
    warm_at = total * WARMUP_SHARE
    warm = [s for s in samples if s.connections <= warm_at] or samples[:1] or [before]
    later = [s for s in samples if s.connections > warm_at] or [after]
    return Verdict(
        node=node,
        rss_warm=warm[-1].rss_mib[node],
        rss_peak_after=max(s.rss_mib[node] for s in later),
        rss_end=after.rss_mib[node],
        fds_before=before.fds[node],
        fds_peak=max([s.fds[node] for s in samples] or [before.fds[node]]),
        fds_after=after.fds[node],
    )


def _fds(pid: int) -> int:
    try:
        return len(os.listdir(f"/proc/{pid}/fd"))
    except OSError:
        raise ProbeError(f"process {pid} is gone") from None


@dataclass
class Soak:
    bench: BenchLab
    procs: Processes
    profile: Profile
    log: Callable[[str], None]
    pids: dict[str, int] = field(default_factory=dict)
    churn: dict[str, int] = field(default_factory=lambda: {"pods": 0, "policies": 0})
    _pods: list[str] = field(default_factory=list)
    _policy: bool = False
    _turn: int = 0

    def proxies(self) -> dict[str, int]:
        found = self.bench.node_proxy_pids_by_node()
        if any(len(pids) != 1 for pids in found.values()) or len(found) != 2:
            raise SoakError(f"expected one node proxy per node, found {found}")
        return {node: pids[0] for node, pids in sorted(found.items())}

    def sample(self, started: float, connections: int) -> Sample:
        return Sample(
            round(time.monotonic() - started, 2),
            connections,
            {node: rss_bytes([pid]) / 2**20 for node, pid in self.pids.items()},
            {node: _fds(pid) for node, pid in self.pids.items()},
        )

    def churn_once(self) -> None:
        """Rule 3, one turn: a pod (created or deleted) on even turns, a policy on odd ones."""
        self._turn += 1
        nodes = [n.name for n in self.bench.topology.all_nodes()]
        if self._turn % 2:
            name = f"soak-churn-{self._turn}"
            pod = {
                "apiVersion": "v1",
                "kind": "Pod",
                "metadata": {"name": name, "labels": {"app": "soak-churn"}},
                "spec": {
                    "terminationGracePeriodSeconds": 1,
                    "nodeSelector": {"kubernetes.io/hostname": nodes[self._turn // 2 % len(nodes)]},
                    "containers": [{"name": "main", "image": "none", "command": ["sleep", "infinity"]}],
                },
            }
            self.bench.kubectl("apply", "-n", AMBIENT, "-f", "-", input=json.dumps(pod))
            self._pods.append(name)
            if len(self._pods) > 2:
                self.bench.kubectl("delete", "pod", "-n", AMBIENT, self._pods.pop(0), "--wait=false")
            self.churn["pods"] += 1
        else:
            if self._policy:
                self.bench.kubectl("delete", "authorizationpolicy", "-n", AMBIENT, "soak-deny", "--wait=false")
            else:
                policy = {
                    "apiVersion": "security.istio.io/v1",
                    "kind": "AuthorizationPolicy",
                    "metadata": {"name": "soak-deny"},
                    "spec": {
                        "selector": {"matchLabels": {"app": "amb-srv"}},
                        "action": "DENY",
                        "rules": [{"from": [{"source": {"principals": [DENY_NOBODY]}}]}],
                    },
                }
                self.bench.kubectl("apply", "-n", AMBIENT, "-f", "-", input=json.dumps(policy))
            self._policy = not self._policy
            self.churn["policies"] += 1

    def clean_churn(self) -> None:
        with contextlib.suppress(AmbitError):
            self.bench.kubectl("delete", "pods", "-n", AMBIENT, "-l", "app=soak-churn", "--wait=false")
            self.bench.kubectl("delete", "authorizationpolicy", "-n", AMBIENT, "soak-deny", "--ignore-not-found")

    def run(self) -> tuple[Sample, list[Sample], Sample, dict[str, Any]]:
        for name in ("amb-srv", "amb-srv-local"):
            netns = self.bench.netns[name]
            self.procs.start(netns, [sys.executable, "-m", "bench.mesh.apps", "echo", "--port", str(ECHO_PORT)], name)
            _listening(netns, {ECHO_PORT})
        self.bench.reuse_time_wait()
        self.pids = self.proxies()
        started = time.monotonic()
        before = self.sample(started, 0)
        half = self.profile.connections // 2
        clients = {
            target: self.procs.start(
                self.bench.netns["amb-cli"],
                [
                    sys.executable,
                    "-m",
                    "bench.mesh.apps",
                    "soak",
                    self.bench.ips[target],
                    str(ECHO_PORT),
                    "--connections",
                    str(half),
                    "--concurrency",
                    str(self.profile.concurrency),
                    "--seconds",
                    f"{self.profile.max_seconds:g}",
                ],
                f"soak-{target}",
                stdin=subprocess.PIPE,
            )
            for target in ("amb-srv", "amb-srv-local")
        }
        progress = {target: {"progress": 0, "failures": 0} for target in clients}
        samples: list[Sample] = []
        next_sample = next_churn = time.monotonic()
        running = dict(clients)
        while running:
            streams = {proc.stdout: target for target, proc in running.items() if proc.stdout is not None}
            ready, _, _ = select.select(list(streams), [], [], 0.2)
            for stream in ready:
                target = streams[stream]
                line = stream.readline()
                if not line:
                    running.pop(target)
                    continue
                with contextlib.suppress(ValueError):
                    progress[target] = json.loads(line)
                if progress[target].get("final"):
                    running.pop(target)
            now = time.monotonic()
            if now >= next_churn and running:
                self.churn_once()
                next_churn = now + CHURN_INTERVAL
            if now >= next_sample:
                done = sum(int(p.get("progress", 0)) for p in progress.values())
                samples.append(self.sample(started, done))
                next_sample = now + SAMPLE_INTERVAL
                if len(samples) % 15 == 0:
                    self.log(
                        f"{done:,} connections; RSS " + ", ".join(f"{v:.1f}" for v in samples[-1].rss_mib.values())
                    )
            if now - started > self.profile.max_seconds + 120:
                raise SoakError(f"the soak clients did not end within {self.profile.max_seconds + 120:.0f} s")
        self.clean_churn()
        time.sleep(SETTLE)
        done = sum(int(p.get("progress", 0)) for p in progress.values())
        after = self.sample(started, done)
        return before, samples, after, progress


def run(profile: Profile, out: Path | None, *, echo: bool = True) -> Report:
    report = Report("ambit soak", profile.name, notes=[])
    started = time.monotonic()

    def log(line: str) -> None:
        if echo:
            print(f"[{time.monotonic() - started:5.0f} s] {line}", file=sys.stderr, flush=True)

    if os.geteuid() != 0:
        raise SoakError("the soak needs root (it brings a lab up)")
    ensure_tools()
    with tempfile.TemporaryDirectory(prefix="ambit-bench-soak-") as tmp_name:
        tmp = Path(tmp_name)
        procs = Processes(tmp)
        with bench_lab(tmp) as bench:
            try:
                log(f"lab {bench.topology.lab_id} up")
                bench.create_pods(True)
                log("pods Ready")
                soak = Soak(bench, procs, profile, log)
                before, samples, after, progress = soak.run()
                pids_end = soak.proxies()
            finally:
                procs.stop_all()
    _report(report, profile, soak, before, samples, after, progress, pids_end)
    report.env["loadavg_end"] = os.getloadavg()[0]
    report.env["seconds"] = round(time.monotonic() - started, 1)
    if echo:
        print(report.markdown())
    if out is not None:
        md, js = report.write(out, "soak")
        series = out / "soak-series.json"
        series.write_text(json.dumps([_sample_dict(s) for s in samples]))
        png = draw(samples, out / "soak.png")
        log(f"written: {md}, {js}, {series}, {png}")
    return report


def _sample_dict(sample: Sample) -> dict[str, Any]:
    return {"seconds": sample.seconds, "connections": sample.connections, "rss_mib": sample.rss_mib, "fds": sample.fds}


def _report(
    report: Report,
    profile: Profile,
    soak: Soak,
    before: Sample,
    samples: list[Sample],
    after: Sample,
    progress: dict[str, Any],
    pids_end: dict[str, int],
) -> None:
    done = sum(int(p.get("progress", 0)) for p in progress.values())
    failed = sum(int(p.get("failures", 0)) for p in progress.values())
    seconds = max(float(p.get("seconds", 0.0)) for p in progress.values())
    report.add(Measurement("load", "connections completed", done, ""))
    report.add(Measurement("load", "connections failed", failed, ""))
    report.add(Measurement("load", "duration", seconds, "s"))
    report.add(Measurement("load", "connections per second", done / seconds if seconds else 0, "/s"))
    report.add(Measurement("churn", "pods created or deleted", soak.churn["pods"], ""))
    report.add(Measurement("churn", "policies created or deleted", soak.churn["policies"], ""))
    verdicts = []
    for node in sorted(soak.pids):
        v = judge(node, before, samples, after, profile.connections)
        verdicts.append(v)
        scenario = f"node proxy on {node}"
        report.add(Measurement(scenario, "RSS before the load", before.rss_mib[node], "MiB"))
        report.add(Measurement(scenario, "RSS at the end of warm-up", v.rss_warm, "MiB"))
        report.add(
            Measurement(scenario, "RSS peak after warm-up", v.rss_peak_after, "MiB", v.rss_warm, "end of warm-up")
        )
        report.add(Measurement(scenario, "RSS after the load", v.rss_end, "MiB"))
        report.add(Measurement(scenario, "open files before the load", v.fds_before, ""))
        report.add(Measurement(scenario, "open files, peak", v.fds_peak, ""))
        report.add(Measurement(scenario, "open files after the load", v.fds_after, "", v.fds_before, "before"))
    crashed = sorted(node for node, pid in soak.pids.items() if pids_end.get(node) != pid)
    parts = [
        f"{v.node}: memory {v.growth:.3f}x ({'flat' if v.memory_flat else 'NOT flat'}), "
        f"open files {v.fds_before} → {v.fds_after} ({'no growth' if v.fds_flat else 'GREW'})"
        for v in verdicts
    ]
    parts.append("no node proxy restarted" if not crashed else f"node proxies replaced on {', '.join(crashed)}")
    parts.append(f"{failed} connections failed")
    report.notes.append("Verdict (memory within 10% after warm-up, no fd growth, no crash): " + "; ".join(parts) + ".")
    report.notes.append(
        f"{profile.connections:,} connections in two clients in amb-cli (node 1): to amb-srv (node 2, cross-node) "
        f"and amb-srv-local (node 1); per client {profile.concurrency} short-lived at a time; lifetimes 89% one "
        "echo, 10% up to 1 s, 1% 5-20 s. Churn every 3 s: an ambient pod created or deleted, a DENY policy on "
        f"amb-srv created or deleted. Samples every {SAMPLE_INTERVAL:g} s; warm-up = the first "
        f"{WARMUP_SHARE:.0%} of the connections."
    )


def draw(samples: list[Sample], path: Path) -> Path:
    nodes = sorted(samples[0].rss_mib) if samples else []
    xs = [float(s.connections) for s in samples]
    rss = {n: list(zip(xs, [s.rss_mib[n] for s in samples], strict=True)) for n in nodes}
    fds = {n: list(zip(xs, [float(s.fds[n]) for s in samples], strict=True)) for n in nodes}
    panels = [("node proxy RSS (MiB) by connections done", rss), ("node proxy open files by connections done", fds)]
    return chart.draw_series(panels, path)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m bench.soak", description=__doc__.split("\n")[0])
    parser.add_argument("--quick", action="store_const", const="quick", default="full", dest="profile")
    parser.add_argument("--out", type=Path, default=RESULTS)
    args = parser.parse_args(argv)
    try:
        run(PROFILES[args.profile], args.out)
    except AmbitError as exc:
        print(f"bench.soak: {exc}", file=sys.stderr)
        return 1
    return 0


if __name__ == "__main__":
    sys.exit(main())
