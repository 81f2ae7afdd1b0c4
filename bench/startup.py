"""Benchmark of the node proxy's start-up: import time, resident memory at ready, modules and threads.

Run as root: ``python -m bench.startup [--runs 7] [--pods 3] [--out bench/results]`` (``make bench-startup``).

Theory of operation. Each run spawns ``python -m ambit.cli nodeproxy`` in a node namespace of its own (``nsenter
--net=`` into a node namespace of our own, which execs: the pid is the proxy's), with ``--notify-fd``, and measures
it from the outside (``/proc/<pid>``), so this process's own imports never count. The proxy gets a minimal lab
directory (topology, workloads file, local CA, run directory) and this process plays the node agent
(:class:`~ambit.zds.server.ZdsServer`), so no lab, control plane or API server is needed. Variants:

1. ``no pods``: the ZDS snapshot is empty; measured when the proxy writes ``READY=1``;
2. ``N pods``: the snapshot holds ``--pods`` pods, each a network namespace of ours (the proxy opens its four
   listeners in each and fetches each pod's certificate from the local CA); measured at ``READY=1``;
3. ``lab flags``: the flags the lab gives (``--xds-address``/``--ca-address`` with a root certificate and a token),
   the address one where nothing listens, so the gRPC client is loaded and keeps retrying and the proxy never
   becomes ready; measured once the ZDS connection is up plus ``SETTLE`` seconds.

Figures per variant, medians over ``--runs`` runs (one untimed run first warms the page cache):

- ``ready``: seconds from spawn to ``READY=1`` (variants 1 and 2);
- ``CPU time``: the process's user and system time until then (``/proc/<pid>/stat``, 10 ms ticks), which a busy
  machine disturbs less than the wall-clock figures;
- ``RSS``, ``RSS anon`` (the process's own pages; the rest are files such as shared libraries) and ``PSS`` from
  ``/proc/<pid>/status`` and ``smaps_rollup``, in MiB, and ``threads``;
- ``import time``: the sum of the top-level imports' cumulative times that ``python -X importtime`` reports, in a
  separate run of the same variant (``-X importtime`` slows the imports down), and ``modules``, the number of
  modules that run imported. The largest top-level packages by their modules' own import time are listed in the
  notes, as are the extension modules (``.so``) the process has mapped.

The harness removes what it made (namespaces, processes, directory) when it ends, also on errors and Ctrl-C.
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import os
import re
import secrets
import signal
import subprocess
import sys
import tempfile
import time
from collections import Counter
from collections.abc import AsyncIterator, Iterator
from dataclasses import dataclass, field
from pathlib import Path

from ambit.lab.network.topology import Topology
from ambit.zds import ZDS_SOCKET
from ambit.zds.server import ZdsServer
from bench.report import Measurement, Report, median

REPO = Path(__file__).resolve().parents[1]
RESULTS = REPO / "bench" / "results"
READY_TIMEOUT = 60.0
SETTLE = 1.0
"""Seconds the ``lab flags`` variant runs after its ZDS connection before it is measured."""
UNREACHABLE = "127.0.0.1:9"
"""The control plane address of the ``lab flags`` variant: the node netns's loopback, where nothing listens."""
POD_NET = "198.18.251"
WATCHED_EXTENSIONS = ("grpc", "cryptography", "hypothesis", "yaml", "h2", "aiohttp", "uvloop", "google", "msgspec")


class BenchError(Exception):
    """The benchmark cannot run here (not root, a proxy that does not start)."""


@dataclass
class Sample:
    """What one run of one variant measured."""

    ready: float | None = None
    rss: float = 0.0
    rss_anon: float = 0.0
    pss: float = 0.0
    threads: int = 0
    cpu_ms: float = 0.0
    import_ms: float | None = None
    modules: int | None = None
    import_self: Counter[str] = field(default_factory=Counter)
    extensions: tuple[str, ...] = ()


@dataclass(frozen=True, slots=True)
class Variant:
    name: str
    pods: int
    lab_flags: bool = False


def sh(*argv: str) -> None:
    subprocess.run(argv, capture_output=True, check=True)


@contextlib.contextmanager
def namespaces(pods: int) -> Iterator[tuple[str, list[str]]]:
    """A node namespace and ``pods`` pod namespaces, loopback up, removed on exit."""
    tag = secrets.token_hex(2)
    names = [f"sun{tag}", *(f"sup{tag}-{i}" for i in range(pods))]
    try:
        for ns in names:
            sh("ip", "netns", "add", ns)
            sh("ip", "-n", ns, "link", "set", "lo", "up")
        yield names[0], names[1:]
    finally:
        for ns in names:
            subprocess.run(["ip", "netns", "del", ns], capture_output=True, check=False)


def workloads_yaml(pods: int) -> str:
    lines = ["workloads:"]
    for i in range(pods):
        lines += [
            f"- uid: Kubernetes//Pod/bench/web-{i}",
            f"  name: web-{i}",
            "  namespace: bench",
            f"  workloadIps: [{POD_NET}.{i + 10}]",
            "  protocol: HBONE",
            f"  serviceAccount: web-{i}",
            "  node: node-1",
        ]
    return "\n".join(lines) + "\n" if pods else "workloads: []\n"


def pod_uid(i: int) -> str:
    return f"00000000-0000-4000-8000-bench{i:07d}"


def lab_directory(base: Path, pods: int) -> Topology:
    """The minimal lab a node proxy with ``--lab-dir`` reads: topology, workloads, local CA, run directory."""
    topology = Topology.new(1, base / "lab")
    topology.path.mkdir(parents=True)
    topology.save()
    topology.mesh_config_file.parent.mkdir(parents=True, exist_ok=True)
    topology.mesh_config_file.write_text(workloads_yaml(pods))
    (topology.node_dir("node-1") / "run").mkdir(parents=True)
    from ambit.identity.localca import LocalCa

    LocalCa(topology.mesh_ca_dir, trust_domain="cluster.local")  # made once here, not in the timed runs
    return topology


def lab_flags(topology: Topology, base: Path) -> list[str]:
    """The control-plane flags of a lab node proxy (xDS and CA addresses, the root certificate), with a control
    plane nobody answers at."""
    from ambit.identity.localca import LocalCa

    root = base / "root-cert.pem"
    root.write_bytes(LocalCa(topology.mesh_ca_dir, trust_domain="cluster.local").roots_pem)
    token = base / "token"
    token.write_text("bench-token-not-checked\n")
    return ["--xds-address", UNREACHABLE, "--ca-address", UNREACHABLE, "--root-cert", str(root), "--token", str(token)]


# -- reading a process from /proc ------------------------------------------------------------------------------------
def _status(pid: int) -> dict[str, str]:
    text = Path(f"/proc/{pid}/status").read_text()
    return dict(line.split(":", 1) for line in text.splitlines() if ":" in line)


def _kib(value: str) -> float:
    return float(value.split(maxsplit=1)[0])


def measure_process(pid: int, sample: Sample) -> None:
    status = _status(pid)
    sample.rss = _kib(status["VmRSS"]) / 1024
    sample.rss_anon = _kib(status["RssAnon"]) / 1024
    sample.threads = int(status["Threads"])
    fields = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()
    sample.cpu_ms = (int(fields[11]) + int(fields[12])) * 1000 / os.sysconf("SC_CLK_TCK")  # utime + stime
    for line in Path(f"/proc/{pid}/smaps_rollup").read_text().splitlines():
        if line.startswith("Pss:"):
            sample.pss = _kib(line.split(":", 1)[1]) / 1024
    mapped = set()
    for line in Path(f"/proc/{pid}/maps").read_text().splitlines():
        path = line.split()[-1]
        if ".so" in path:  # an extension module's package, or a library's file name
            package = path.split("site-packages/", 1)[1].split("/")[0] if "site-packages/" in path else ""
            mapped.add(package or Path(path).name)
    sample.extensions = tuple(sorted(mapped))


_IMPORT_LINE = re.compile(r"^import time:\s+(\d+) \|\s+(\d+) \| (\s*)(\S+)$")


def parse_importtime(text: str, sample: Sample) -> None:
    """Total import time (sum of top-level cumulative times), module count and own time by top-level package."""
    total_us = 0
    modules = 0
    for line in text.splitlines():
        match = _IMPORT_LINE.match(line)
        if match is None:
            continue
        own, cumulative, indent, name = int(match[1]), int(match[2]), match[3], match[4]
        modules += 1
        if not indent:
            total_us += cumulative
        sample.import_self[name.split(".")[0]] += own
    sample.import_ms = total_us / 1000
    sample.modules = modules


# -- one run -------------------------------------------------------------------------------------------------------
async def run_once(
    variant: Variant, topology: Topology, node_ns: str, pod_ns: list[str], extra: list[str], *, importtime: bool
) -> Sample:
    run_dir = topology.node_dir("node-1") / "run"
    agent = ZdsServer(run_dir / ZDS_SOCKET)
    for i in range(variant.pods):
        info = {"name": f"web-{i}", "namespace": "bench", "service_account": f"web-{i}"}
        await agent.add(pod_uid(i), f"/run/netns/{pod_ns[i]}", info)
    await agent.start()
    read_end, write_end = os.pipe()
    log = topology.path / f"nodeproxy-{variant.name.replace(' ', '-')}.log"
    python = [sys.executable, *(["-X", "importtime"] if importtime else []), "-m", "ambit.cli", "nodeproxy"]
    argv = ["nsenter", f"--net=/run/netns/{node_ns}", "--", *python, "--node", "node-1"]
    argv += ["--lab-dir", str(topology.path), "--notify-fd", str(write_end), *extra]
    environ = {k: v for k, v in os.environ.items() if "TERMINATION" not in k and k != "PYTHONPROFILEIMPORTTIME"}
    sample = Sample()
    began = time.perf_counter()
    proc = _spawn(argv, log, write_end, environ)
    os.close(write_end)
    loop = asyncio.get_running_loop()
    try:
        if variant.lab_flags:
            async with asyncio.timeout(READY_TIMEOUT):
                while agent.connections < 1:
                    if proc.poll() is not None:
                        raise BenchError(f"the node proxy exited ({proc.returncode}):\n{_tail(log)}")
                    await asyncio.sleep(0.01)
            await asyncio.sleep(SETTLE)
        else:
            try:
                data = await asyncio.wait_for(loop.run_in_executor(None, os.read, read_end, 64), READY_TIMEOUT)
            except TimeoutError:
                raise BenchError(f"the node proxy was not ready in {READY_TIMEOUT:g} s:\n{_tail(log)}") from None
            if data != b"READY=1\n":
                raise BenchError(f"the node proxy said {data!r} (exit {proc.poll()}):\n{_tail(log)}")
            sample.ready = time.perf_counter() - began
        if proc.poll() is not None:
            raise BenchError(f"the node proxy exited ({proc.returncode}):\n{_tail(log)}")
        measure_process(proc.pid, sample)
    finally:
        if proc.poll() is None:
            proc.send_signal(signal.SIGKILL)
        await loop.run_in_executor(None, proc.wait)
        os.close(read_end)
        await agent.aclose()
    if importtime:
        parse_importtime(log.read_text(errors="replace"), sample)
    return sample


def _spawn(argv: list[str], log: Path, notify_fd: int, environ: dict[str, str]) -> subprocess.Popen[bytes]:
    with open(log, "wb") as out:
        return subprocess.Popen(
            argv, cwd=REPO, stdout=out, stderr=out, stdin=subprocess.DEVNULL, pass_fds=(notify_fd,), env=environ
        )


def _tail(log: Path) -> str:
    return log.read_text(errors="replace")[-3000:]


@contextlib.asynccontextmanager
async def rig(pods: int) -> AsyncIterator[tuple[Topology, str, list[str], Path]]:
    with tempfile.TemporaryDirectory(prefix="startup-bench", dir="/tmp") as directory, namespaces(pods) as (node, ps):
        base = Path(directory)
        yield lab_directory(base, pods), node, ps, base


async def measure(runs: int, pods: int, variants: list[Variant]) -> dict[str, list[Sample]]:
    out: dict[str, list[Sample]] = {}
    async with rig(pods) as (topology, node_ns, pod_ns, base):
        flags = lab_flags(topology, base)
        for variant in variants:
            extra = flags if variant.lab_flags else []
            await run_once(variant, topology, node_ns, pod_ns, extra, importtime=False)  # warms the page cache
            samples = []
            for _ in range(runs):
                sample = await run_once(variant, topology, node_ns, pod_ns, extra, importtime=False)
                timed = await run_once(variant, topology, node_ns, pod_ns, extra, importtime=True)
                sample.import_ms, sample.modules, sample.import_self = timed.import_ms, timed.modules, timed.import_self
                samples.append(sample)
            out[variant.name] = samples
    return out


def variants_for(pods: int, *, quick: bool) -> list[Variant]:
    if quick:
        return [Variant("no pods", 0)]
    return [Variant("no pods", 0), Variant(f"{pods} pods", pods), Variant("lab flags", 0, lab_flags=True)]


def run(runs: int, pods: int, out: Path | None = RESULTS, *, quick: bool = False, echo: bool = True) -> Report:
    if os.geteuid() != 0:
        raise BenchError("needs root (network namespaces for the node proxy and its pods)")
    variants = variants_for(pods, quick=quick)
    profile = f"{runs} runs, {pods} pods" if not quick else f"quick, {runs} runs"
    report = Report("node proxy start-up", profile)
    results = asyncio.run(measure(runs, pods, variants))
    for variant in variants:
        samples = results[variant.name]
        scenario = f"ambit nodeproxy, {variant.name}"
        if not variant.lab_flags:
            ready = [s.ready for s in samples if s.ready is not None]
            report.add(Measurement(scenario, "ready (median)", median(ready), "s"))
        report.add(Measurement(scenario, "CPU time (median)", median([s.cpu_ms for s in samples]), "ms"))
        report.add(Measurement(scenario, "import time (median)", median([s.import_ms or 0.0 for s in samples]), "ms"))
        report.add(Measurement(scenario, "modules", median([float(s.modules or 0) for s in samples]), ""))
        report.add(Measurement(scenario, "RSS (median)", median([s.rss for s in samples]), "MiB"))
        report.add(Measurement(scenario, "RSS anon (median)", median([s.rss_anon for s in samples]), "MiB"))
        report.add(Measurement(scenario, "PSS (median)", median([s.pss for s in samples]), "MiB"))
        report.add(Measurement(scenario, "threads", median([float(s.threads) for s in samples]), ""))
        own: Counter[str] = Counter()
        for s in samples:
            own.update(s.import_self)
        top = ", ".join(f"{name} {us / 1000 / len(samples):.0f}" for name, us in own.most_common(8))
        report.notes.append(f"{variant.name}: own import time by top-level package (ms, mean): {top}.")
        watched = [ext for ext in samples[-1].extensions if ext.startswith(WATCHED_EXTENSIONS)]
        report.notes.append(
            f"{variant.name}: {len(samples[-1].extensions)} shared-object packages and libraries mapped; of note: "
            f"{', '.join(watched) or 'none'}."
        )
    report.notes.append(
        "Each run spawns `python -m ambit.cli nodeproxy` through nsenter into a node namespace, with a minimal lab "
        "directory (local workloads file and CA) and this process as the node agent (ZDS); `lab flags` adds the "
        f"lab's --xds-address/--ca-address pointing at {UNREACHABLE} (nothing listens) and is measured "
        f"{SETTLE:g} s after its ZDS connection, as it never becomes ready."
    )
    report.notes.append("Import time and modules come from a separate `-X importtime` run of the same variant.")
    report.env["loadavg_end"] = os.getloadavg()[0]
    if echo:
        print(report.markdown())
    if out is not None:
        md, js = report.write(out, "startup")
        if echo:
            print(f"written: {md} and {js}")
    return report


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m bench.startup", description=__doc__.split("\n")[0])
    parser.add_argument("--runs", type=int, default=7, help="measured runs of each variant (median reported)")
    parser.add_argument("--pods", type=int, default=3, help="pods in the snapshot of the 'N pods' variant")
    parser.add_argument("--quick", action="store_true", help="the 'no pods' variant only")
    parser.add_argument("--out", type=Path, default=RESULTS, help="where startup.md and startup.json go")
    args = parser.parse_args(argv)
    if not 1 <= args.runs <= 100:
        parser.error("--runs is from 1 to 100")
    if not 1 <= args.pods <= 50:
        parser.error("--pods is from 1 to 50")
    try:
        run(args.runs, args.pods, args.out, quick=args.quick)
    except BenchError as exc:
        print(f"bench.startup: {exc}", file=sys.stderr)
        return 1
    return 0


if __name__ == "__main__":
    sys.exit(main())
