"""Writes at N stored pods: the embedded API server's pace for the scale harness's churn (issue 22).

``python -m bench.apiserver_writes --pods 50000 [--rate 100] [--seconds 30] [--data-from DIR] [--keep-data DIR]``

The API server is loaded with the scale harness's cluster (:func:`bench.scale.cluster.creates`: namespaces,
Services, pods with their status, one EndpointSlice per Service; no policies), then watched as a control plane
watches it (pods, Services and EndpointSlices in all namespaces, with bookmarks), and churned with the harness's
own changes (:func:`bench.scale.cluster.churn`: add, delete, readiness flip, label change, each followed by its
EndpointSlice write) paced at ``--rate`` changes per second from 4 keep-alive connections, as the harness sends
them. Every HTTP request is timed on its own: the table gives the rate achieved (changes and requests per second),
p50/p99/max request latency over all requests and for pod writes alone, how far behind its slot the pacing fell,
the server's CPU share, and that every watch received every change.

Loading 100,000 pods takes minutes: ``--keep-data DIR`` saves the loaded data directory (state.db, PKI,
kubeconfig) before the churn, and ``--data-from DIR`` starts from a copy of such a directory instead of loading,
so that before/after rounds churn the same stored state. ``--profile-server FILE`` runs the API server under
cProfile (written when it exits).
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import os
import shutil
import sys
import tempfile
import time
from collections.abc import Sequence
from dataclasses import dataclass, field
from pathlib import Path

from bench.kube_client import NO_TIMEOUT, Endpoint, _decode_event, _decode_object
from bench.report import Measurement, Report, median, percentile
from bench.scale.cluster import SERVICE_CIDR, ClusterShape, Request, churn, creates, paced
from bench.server_process import ServerProcess, free_port

REPO = Path(__file__).resolve().parents[1]
RESULTS = REPO / "bench" / "results"
MIB = 2**20
CONNECTIONS = 4
WATCHED = ("/api/v1/pods", "/api/v1/services", "/apis/discovery.k8s.io/v1/endpointslices")


def shape_for(pods: int) -> ClusterShape:
    """The harness's full shape scaled to ``pods``: 10 pods per Service, 10 Services per namespace, no policies."""
    services = max(1, pods // 10)
    return ClusterShape(max(1, services // 10), services, pods, 0, max(1, pods // 100))


@dataclass
class Timed:
    """Per request: (method and kind, seconds from sent to answered)."""

    latencies: list[tuple[str, float]] = field(default_factory=list)
    late: float = 0.0
    changes: int = 0
    elapsed: float = 0.0


def _kind(request: Request) -> str:
    what = "slice" if "/endpointslices" in request.path else "pod"
    return f"{request.method} {what}{' status' if request.path.endswith('/status') else ''}"


async def churn_timed(endpoint: Endpoint, requests: Sequence[Request], rate: float) -> Timed:
    """Send ``requests`` (each with its chain) paced at ``rate`` from :data:`CONNECTIONS` connections, as
    :func:`bench.scale.cluster.paced` does, timing each HTTP request."""
    timed = Timed()
    items = iter(enumerate(requests))
    began = time.monotonic()

    async def connection() -> None:
        async with endpoint.session(1) as session:
            for i, request in items:
                wait = began + i / rate - time.monotonic()
                if wait > 0:
                    await asyncio.sleep(wait)
                else:
                    timed.late = max(timed.late, -wait)
                step: Request | None = request
                while step is not None:
                    sent = time.monotonic()
                    headers = {"Content-Type": step.content_type}
                    async with session.request(step.method, step.path, data=step.body, headers=headers) as resp:
                        raw = await resp.read()
                    if resp.status not in (200, 201):
                        raise RuntimeError(f"{step.method} {step.path}: {resp.status} {raw[:300]!r}")
                    timed.latencies.append((_kind(step), time.monotonic() - sent))
                    step = step.then
                timed.changes += 1

    await asyncio.gather(*(connection() for _ in range(CONNECTIONS)))
    timed.elapsed = time.monotonic() - began
    return timed


class WatchCount:
    """Watches ``path`` from ``rv``, counting events (bookmarks apart) until cancelled."""

    def __init__(self, endpoint: Endpoint, path: str, rv: str) -> None:
        self.events = 0
        self.last_rv = 0
        self._opened = asyncio.Event()
        query = f"watch=1&allowWatchBookmarks=true&resourceVersion={rv}"
        self._task = asyncio.create_task(self._run(endpoint, f"{path}?{query}"))

    async def reached(self, events: int, *, within: float) -> None:
        """Wait until ``events`` events arrived, or ``within`` seconds (the count is reported either way)."""
        deadline = time.monotonic() + within
        while self.events < events and time.monotonic() < deadline:  # noqa: ASYNC110 - a count, polled
            await asyncio.sleep(0.1)

    async def opened(self) -> None:
        await asyncio.wait_for(self._opened.wait(), 30)

    async def _run(self, endpoint: Endpoint, path: str) -> None:
        async with endpoint.session(1) as session, session.get(path, timeout=NO_TIMEOUT) as resp:
            resp.raise_for_status()
            self._opened.set()
            pending = b""
            async for chunk in resp.content.iter_any():
                *lines, pending = (pending + chunk).split(b"\n")
                for line in lines:
                    if not line:
                        continue
                    event = _decode_event(line)
                    if event.type != "BOOKMARK":
                        self.events += 1
                        self.last_rv = int(event.object.metadata.resourceVersion)

    async def aclose(self) -> None:
        self._task.cancel()
        with contextlib.suppress(asyncio.CancelledError):
            await self._task


async def load(endpoint: Endpoint, shape: ClusterShape) -> float:
    """Create the harness's cluster as fast as 8 connections go; the seconds it took."""
    began = time.monotonic()
    for requests in creates(shape).values():
        await paced(endpoint, requests, rate=0, connections=8)
    return time.monotonic() - began


async def _resource_version(endpoint: Endpoint) -> str:
    async with endpoint.session(1) as session, session.get("/api/v1/namespaces?limit=1") as resp:
        resp.raise_for_status()
        return _decode_object(await resp.read()).metadata.resourceVersion


async def run_async(
    pods: int, rate: float, seconds: float, data_from: Path | None, keep_data: Path | None, profile_server: Path | None
) -> Report:
    shape = shape_for(pods)
    report = Report("ambit apiserver writes", f"{pods:,} pods, {rate:g} changes/s")
    scenario = f"writes at {pods:,} stored pods"
    with tempfile.TemporaryDirectory(prefix="ambit-bench-writes-") as tmp_name:
        tmp = Path(tmp_name)
        data_dir = tmp / "apiserver"
        if data_from is not None:
            shutil.copytree(data_from, data_dir)
        prefix = [sys.executable] + (["-m", "cProfile", "-o", str(profile_server)] if profile_server else [])
        argv = [*prefix, "-m", "ambit.cli", "apiserver", "--data-dir", str(data_dir), "--service-cidr", SERVICE_CIDR]
        api = ServerProcess(
            [*argv, "--listen", f"127.0.0.1:{free_port()}"], log=tmp / "apiserver.log", cwd=REPO, ready_timeout=600
        )
        watches: list[WatchCount] = []
        try:
            started = await api.start()
            endpoint = Endpoint.from_kubeconfig(data_dir / "kubeconfig")
            if data_from is None:
                report.add(Measurement(scenario, "load", await load(endpoint, shape), "s", note="8 connections"))
                if keep_data is not None:
                    await api.terminate(grace=60)
                    shutil.rmtree(keep_data, ignore_errors=True)
                    shutil.copytree(data_dir, keep_data)
                    started = await api.start()
            report.add(Measurement(scenario, "start to ready", started, "s"))
            report.add(Measurement(scenario, "server RSS before churn", api.rss_bytes() / MIB, "MiB"))
            rv = await _resource_version(endpoint)
            watches = [WatchCount(endpoint, path, rv) for path in WATCHED]
            for watch in watches:
                await watch.opened()
            changes = churn(shape, max(4, int(rate * seconds)))
            expected_pod_events = sum(1 + (r.then is not None and r.then.then is not None) for r in changes)
            cpu = api.cpu_seconds()
            timed = await churn_timed(endpoint, changes, rate)
            await watches[0].reached(expected_pod_events, within=120)
            server_cpu = api.cpu_seconds() - cpu
            _report(report, scenario, rate, timed, server_cpu, watches, expected_pod_events)
            report.add(Measurement(scenario, "server RSS after churn", api.rss_bytes() / MIB, "MiB"))
            report.env["loadavg_end"] = os.getloadavg()[0]
            report.env["shape"] = {"namespaces": shape.namespaces, "services": shape.services, "pods": shape.pods}
        except BaseException:
            tail = (tmp / "apiserver.log").read_bytes()[-3000:].decode(errors="replace")
            print(f"benchmark failed; the API server's log ends with:\n{tail}", file=sys.stderr)
            raise
        finally:
            for watch in watches:
                await watch.aclose()
            if api.running:
                await api.terminate(grace=120 if profile_server else 30)
    return report


def _report(
    report: Report,
    scenario: str,
    rate: float,
    timed: Timed,
    server_cpu: float,
    watches: Sequence[WatchCount],
    expected_pod_events: int,
) -> None:
    def add(metric: str, value: float, unit: str, note: str = "") -> None:
        report.add(Measurement(scenario, metric, value, unit, note=note))

    every = [t for _, t in timed.latencies]
    pod_writes = [t for kind, t in timed.latencies if "pod" in kind]
    add("changes/s achieved", timed.changes / timed.elapsed, "/s", f"asked {rate:g}/s, {timed.changes:,} changes")
    add("requests/s achieved", len(every) / timed.elapsed, "/s", f"{len(pod_writes):,} pod writes")
    add("pod writes/s achieved", len(pod_writes) / timed.elapsed, "/s")
    add("latest behind its slot", timed.late * 1000, "ms")
    add("request latency p50", median(every) * 1000, "ms", "all requests")
    add("request latency p99", percentile(every, 99) * 1000, "ms")
    add("request latency max", max(every) * 1000, "ms")
    add("pod write latency p50", median(pod_writes) * 1000, "ms")
    add("pod write latency p99", percentile(pod_writes, 99) * 1000, "ms")
    for kind in sorted({k for k, _ in timed.latencies}):
        these = [t for k, t in timed.latencies if k == kind]
        add(f"{kind} p50 / p99", median(these) * 1000, "ms", f"p99 {percentile(these, 99) * 1000:.1f} ms, {len(these)}")
    add("server CPU", server_cpu / timed.elapsed * 100, "%", "of one core, during the churn")
    add("server CPU per request", server_cpu / len(every) * 1e6, "µs")
    got = ", ".join(f"{path.rsplit('/', 1)[-1]} {w.events:,}" for path, w in zip(WATCHED, watches, strict=True))
    add("pod watch events", watches[0].events, "", f"expected {expected_pod_events:,}; {got}")


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(prog="python -m bench.apiserver_writes", description=__doc__.splitlines()[0])
    parser.add_argument("--pods", type=int, default=10_000)
    parser.add_argument("--rate", type=float, default=100.0, help="churn changes per second (each 1-3 requests)")
    parser.add_argument("--seconds", type=float, default=30.0)
    parser.add_argument("--data-from", type=Path, help="start from a copy of this loaded data directory")
    parser.add_argument("--keep-data", type=Path, help="save the loaded data directory here before the churn")
    parser.add_argument("--profile-server", type=Path, help="run the API server under cProfile, written here")
    parser.add_argument("--out", type=Path, help="write apiserver-writes.md and .json here")
    args = parser.parse_args(argv)
    report = asyncio.run(
        run_async(args.pods, args.rate, args.seconds, args.data_from, args.keep_data, args.profile_server)
    )
    print(report.markdown())
    if args.out is not None:
        report.write(args.out, "apiserver-writes")


if __name__ == "__main__":
    main()
