"""``python -m bench.scale.controlplane_memory --pods N [--rounds R] [--tracemalloc]``: the control plane's memory
at ready, before any client connects.

Starts ``ambit apiserver`` on a data directory (``--data-dir``, kept between runs: loading 100,000 pods takes
minutes, so a directory already loaded with the same shape is reused), loads it with the scale harness's cluster
(:mod:`bench.scale.cluster`; the full profile's proportions: a Service per ten pods, a namespace and a node per
hundred, a policy per fifty) when it is not, then starts ``ambit controlplane`` against it ``--rounds`` times and
reports, per start: spawn to ready (every cache listed, one translation, the xDS tables built), the first
translation's time (``pilot_pushcontext_init_seconds`` from its monitoring port), its CPU and its RSS ``--settle``
seconds after the ready line; then the medians and the load average.

``--tracemalloc`` instead runs the control plane in a child of this module with :mod:`tracemalloc` on (slower,
and its RSS includes the tracing's own memory) and prints, once it is ready: the top allocations grouped by file
and line and by file, the live objects counted by type (:func:`gc.get_objects`) and the traced size of the main
tables (the informer caches, the translation memo, the xDS tables). No root, no clients.
"""

from __future__ import annotations

import argparse
import asyncio
import collections
import gc
import json
import os
import re
import signal
import statistics
import sys
import time
import tracemalloc
import types
import urllib.request
from pathlib import Path
from typing import Any, TextIO

from bench.kube_client import Endpoint
from bench.scale.cluster import SERVICE_CIDR, ClusterShape, creates, paced
from bench.server_process import ServerProcess, free_port

REPO = Path(__file__).resolve().parents[2]
MIB = 1024 * 1024
READY = re.compile(rb"control plane ready on port (\d+)")
REPORT_END = "=== end\n"
TRANSLATION = re.compile(r"^pilot_pushcontext_init_seconds_sum (\S+)$", re.M)


def shape_for(pods: int) -> ClusterShape:
    """The full profile's proportions at ``pods`` pods."""
    return ClusterShape(
        namespaces=max(1, pods // 100),
        services=max(1, pods // 10),
        pods=pods,
        policies=pods // 50,
        nodes=max(1, pods // 100),
    )


def _api_server(data_dir: Path) -> ServerProcess:
    argv = [sys.executable, "-m", "ambit.cli", "apiserver", "--data-dir", str(data_dir / "apiserver")]
    argv += ["--listen", f"127.0.0.1:{free_port()}", "--service-cidr", SERVICE_CIDR]
    return ServerProcess(argv, log=data_dir / "apiserver.log", cwd=REPO, ready_timeout=600.0)


async def _ensure_loaded(data_dir: Path, shape: ClusterShape) -> None:
    marker = data_dir / "loaded.json"
    wanted = {
        "namespaces": shape.namespaces,
        "services": shape.services,
        "pods": shape.pods,
        "policies": shape.policies,
    }
    if marker.exists() and json.loads(marker.read_text()) == wanted:
        return
    endpoint = Endpoint.from_kubeconfig(data_dir / "apiserver" / "kubeconfig")
    began = time.monotonic()
    for phase, requests in creates(shape).items():
        run = await paced(endpoint, requests, rate=0, connections=8)
        print(f"loaded {phase}: {len(requests):,} requests at {run.rate:,.0f}/s", flush=True)
    marker.write_text(json.dumps(wanted))
    print(f"loaded in {time.monotonic() - began:.0f} s", flush=True)


def _control_plane_argv(data_dir: Path, monitoring: int, *, traced: bool) -> list[str]:
    head = [sys.executable, "-m", "bench.scale.controlplane_memory", "--inside"] if traced else []
    head = head or [sys.executable, "-m", "ambit.cli"]
    return [
        *head,
        "controlplane",
        "--kubeconfig",
        str(data_dir / "apiserver" / "kubeconfig"),
        "--listen",
        f"127.0.0.1:{free_port()}",
        "--webhook-port",
        "0",
        "--monitoring-port",
        str(monitoring),
        "--no-deploy-waypoints",
    ]


def _translation_seconds(monitoring: int) -> float:
    with urllib.request.urlopen(f"http://127.0.0.1:{monitoring}/metrics", timeout=30) as response:
        match = TRANSLATION.search(response.read().decode())
    return float(match.group(1)) if match else float("nan")


async def _one_start(data_dir: Path, settle: float, *, traced: bool) -> dict[str, float]:
    monitoring = free_port()
    plane = ServerProcess(
        _control_plane_argv(data_dir, monitoring, traced=traced),
        log=data_dir / "controlplane.log",
        cwd=REPO,
        ready_timeout=1800.0,
        ready=READY,
    )
    os.environ["CPMEM_REPORT"] = str(data_dir / "tracemalloc.txt")
    ready = await plane.start()
    try:
        await asyncio.sleep(settle)
        figures = {
            "ready_s": ready,
            "translation_s": _translation_seconds(monitoring),
            "cpu_s": plane.cpu_seconds(),
            "rss_mib": plane.rss_bytes() / MIB,
        }
        if traced:
            report = data_dir / "tracemalloc.txt"
            report.unlink(missing_ok=True)
            os.kill(plane.pid, signal.SIGUSR1)  # the child writes its report, then goes on
            for _ in range(3600):  # another process writes it: polled
                if _finished(report):
                    break
                await asyncio.sleep(1.0)
        return figures
    finally:
        await plane.terminate()


def _finished(report: Path) -> bool:
    return report.exists() and report.read_text().endswith(REPORT_END)


def _prepared(data_dir: Path) -> Path:
    data_dir.mkdir(parents=True, exist_ok=True)
    if (data_dir / "apiserver").exists() and not (data_dir / "loaded.json").exists():
        raise SystemExit(f"{data_dir} holds a partial load; remove it or give another --data-dir")
    return data_dir


async def _measure(args: argparse.Namespace) -> None:
    shape = shape_for(args.pods)
    data_dir = _prepared(args.data_dir or Path(f"/tmp/ambit-cpmem-{args.pods}"))
    api = _api_server(data_dir)
    await api.start()
    try:
        await _ensure_loaded(data_dir, shape)
        print(f"API server RSS {api.rss_bytes() / MIB:,.0f} MiB; load {os.getloadavg()[0]:.1f}", flush=True)
        rounds = []
        for r in range(args.rounds):
            load = os.getloadavg()[0]
            figures = await _one_start(data_dir, args.settle, traced=args.tracemalloc)
            figures["load"] = load
            rounds.append(figures)
            print(f"round {r + 1}: " + ", ".join(f"{k} {v:,.1f}" for k, v in figures.items()), flush=True)
        if len(rounds) > 1:
            print("median: " + ", ".join(f"{k} {statistics.median(f[k] for f in rounds):,.1f}" for k in rounds[0]))
        if args.tracemalloc:
            print((data_dir / "tracemalloc.txt").read_text())
    finally:
        await api.terminate()


def _reachable_mib(obj: Any, seen: set[int]) -> float:
    """The size (:func:`sys.getsizeof`) of the containers, strings and Ambit objects reachable from ``obj`` and not
    counted before (``seen``), in MiB; it does not follow functions, modules or classes (they reach everything)."""
    total = 0
    stack = [obj]
    while stack:
        item = stack.pop()
        if id(item) in seen or isinstance(item, (type, types.ModuleType, types.FunctionType, types.MethodType)):
            continue
        seen.add(id(item))
        total += sys.getsizeof(item)
        if isinstance(item, dict):
            stack.extend(item.keys())
            stack.extend(item.values())
        elif isinstance(item, (list, tuple, set, frozenset)):
            stack.extend(item)
        elif type(item).__module__.startswith("ambit."):
            attrs = getattr(item, "__dict__", None)
            if attrs is not None:
                stack.append(attrs)
            for cls in type(item).__mro__:
                stack.extend(getattr(item, n) for n in cls.__dict__.get("__slots__", ()) if hasattr(item, n))
    return total / MIB


def _report(plane: Any, top: int, path: Path) -> None:
    with path.open("w") as out:
        _write_report(plane, top, out)
        out.write(REPORT_END)


def _write_report(plane: Any, top: int, out: TextIO) -> None:
    gc.collect()
    if os.environ.get("CPMEM_CHAIN_KEY"):
        _print_chain(os.environ["CPMEM_CHAIN_KEY"], out)
    snapshot = tracemalloc.take_snapshot().filter_traces([tracemalloc.Filter(False, tracemalloc.__file__)])
    traced, peak = tracemalloc.get_traced_memory()
    print(f"\n=== tracemalloc: {traced / MIB:,.1f} MiB traced (peak {peak / MIB:,.1f} MiB)", file=out)
    for key in ("lineno", "filename"):
        print(f"--- top {top} by {key}", file=out)
        for stat in snapshot.statistics(key)[:top]:
            frame = stat.traceback[0]
            where = frame.filename.replace(str(REPO) + "/", "").replace(sys.prefix, "<py>")
            line = f":{frame.lineno}" if key == "lineno" else ""
            print(f"{stat.size / MIB:9.1f} MiB {stat.count:10,} {where}{line}", file=out)
    counts = collections.Counter(type(o).__name__ for o in gc.get_objects())
    print("--- objects tracked by gc, by type (top 20)", file=out)
    for name, count in counts.most_common(20):
        print(f"{count:12,} {name}", file=out)
    seen: set[int] = set()
    informers = plane.view._informers
    tables = {
        "informer cache: pods": informers["pods"]._cache,
        "informer caches: all other kinds": [i._cache for name, i in informers.items() if name != "pods"],
        "translation memo": plane.view._translation_memo,
        "policy memo": plane.view._policy_memo,
        "applied config (LocalConfig)": plane._applied,
        "encoded addresses cache": plane._encoded_addresses,
        "address table": plane.table,
        "authorizations (cache, table)": (plane._encoded, plane.authorizations),
    }
    print("--- reachable size (sys.getsizeof, each object counted once, in this order)", file=out)
    for name, root in tables.items():
        print(f"{_reachable_mib(root, seen):9.1f} MiB {name}", file=out)
    top_line = snapshot.statistics("lineno")[0].traceback[0]
    where = top_line.filename.replace(str(REPO) + "/", "")
    print(f"--- live blocks from {where}:{top_line.lineno} (the top line) by holder", file=out)
    for (holder, held), (count, size) in _held_from(top_line.filename, top_line.lineno)[:top]:
        print(f"{size / MIB:9.1f} MiB {count:10,} {held} in {holder}", file=out)
    if tracemalloc.get_traceback_limit() > 1:
        print("--- the top line's allocations by call stack (CPMEM_FRAMES deep)", file=out)
        at_top = snapshot.filter_traces([tracemalloc.Filter(True, top_line.filename, top_line.lineno)])
        for stat in at_top.statistics("traceback")[:5]:
            print(f"{stat.size / MIB:9.1f} MiB {stat.count:10,}", file=out)
            for frame in stat.traceback:
                print(f"        {frame.filename.replace(str(REPO) + '/', '')}:{frame.lineno}", file=out)


def _print_chain(key: str, out: TextIO, depth: int = 8) -> None:
    """What keeps a mapping with ``key`` alive: its referrers, and theirs, ``depth`` levels up (the first of each)."""
    sample = next((o for o in gc.get_objects() if isinstance(o, dict) and isinstance(o.get(key), str)), None)
    print(f"--- what holds a mapping with {key!r}", file=out, flush=True)
    here: list[Any] = [] if sample is None else [sample]
    for level in range(depth):
        if not here:
            break
        obj = here[0]
        keys = list(obj)[:6] if isinstance(obj, dict) else ""
        print(f"  {level}: {type(obj).__module__}.{type(obj).__qualname__} {keys}", file=out, flush=True)
        here = [r for r in gc.get_referrers(obj) if r is not here and not isinstance(r, types.FrameType)]


def _held_from(filename: str, lineno: int) -> list[tuple[tuple[str, str], list[int]]]:
    """The objects allocated at ``filename:lineno`` that are alive, grouped by what refers to them: the type of the
    referring container (a mapping's key too, when it is a string) and their own type, most bytes first. Containers
    the collector does not track (a dict of strings only) are looked into from the tracked ones that hold them."""
    found: dict[tuple[str, str], list[int]] = collections.defaultdict(lambda: [0, 0])
    seen: set[int] = set()
    counted: set[int] = set()

    def from_line(obj: Any) -> bool:
        trace = tracemalloc.get_object_traceback(obj)
        return trace is not None and trace[-1].filename == filename and trace[-1].lineno == lineno

    def visit(holder: Any) -> None:
        pairs: Any = holder.items() if isinstance(holder, dict) else ((None, r) for r in gc.get_referents(holder))
        for key, item in pairs:
            if isinstance(holder, dict) and isinstance(key, str) and from_line(key):
                tally(f"dict keys of {type(holder).__name__}", key)
            if from_line(item):
                label = f"dict[{key!r}]" if isinstance(key, str) and len(key) < 40 else type(holder).__name__
                tally(label, item)
            if isinstance(item, (dict, list, tuple)) and not gc.is_tracked(item) and id(item) not in seen:
                seen.add(id(item))
                visit(item)

    def tally(label: str, item: Any) -> None:
        if id(item) in counted:  # a shared value (an interned string) counts once, under its first holder
            return
        counted.add(id(item))
        entry = found[(label, type(item).__name__)]
        entry[0] += 1
        entry[1] += sys.getsizeof(item)

    for obj in gc.get_objects():
        visit(obj)
    return sorted(found.items(), key=lambda kv: -kv[1][1])


def _inside(argv: list[str]) -> None:
    """Run ``ambit <argv>`` (the control plane) in this process with tracemalloc on; SIGUSR1 prints the report."""
    from ambit.cli.main import main as ambit
    from ambit.controlplane import process

    tracemalloc.start(int(os.environ.get("CPMEM_FRAMES", "1")))
    planes: list[Any] = []
    original = process.ControlPlane.__init__

    def keep(self: Any, *args: Any, **kwargs: Any) -> None:
        original(self, *args, **kwargs)
        planes.append(self)

    process.ControlPlane.__init__ = keep  # type: ignore[method-assign]
    report = Path(os.environ["CPMEM_REPORT"])
    signal.signal(signal.SIGUSR1, lambda *_: _report(planes[0], 30, report))
    sys.argv = ["ambit", *argv]
    ambit()


def main(argv: list[str] | None = None) -> None:
    argv = sys.argv[1:] if argv is None else argv
    if argv[:1] == ["--inside"]:
        _inside(argv[1:])
        return
    parser = argparse.ArgumentParser(
        prog="python -m bench.scale.controlplane_memory", description=__doc__.split(":")[0]
    )
    parser.add_argument("--pods", type=int, default=20_000)
    parser.add_argument("--rounds", type=int, default=1)
    parser.add_argument("--settle", type=float, default=5.0, help="seconds after the ready line before measuring")
    parser.add_argument("--data-dir", type=Path, help="the API server's data (default /tmp/ambit-cpmem-PODS)")
    parser.add_argument("--tracemalloc", action="store_true", help="trace the control plane's allocations")
    asyncio.run(_measure(parser.parse_args(argv)))


if __name__ == "__main__":
    main()
