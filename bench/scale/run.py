"""The scale harness's run: API server and control plane as real processes, a loaded cluster, simulated node proxies.

Order (each step's figures go to one :class:`~bench.report.Report`):

1. start ``ambit apiserver`` on loopback with an empty data directory;
2. load the cluster (:mod:`bench.scale.cluster`) at the profile's rate; API server RSS after;
3. one ``istio-system/ztunnel`` pod per simulated node and a TokenRequest bound to it (audience ``istio-ca``), as
   each node's proxy holds;
4. start ``ambit controlplane`` (no webhook, no waypoint deployment): spawn to ready is its list of the whole
   cluster plus the first translation;
5. start the node proxies (:mod:`bench.scale.fleet`); initial sync = from their start until every client holds a
   response of both types (the whole wildcard snapshot; on demand, the answer to every name it looked up);
6. churn at the profile's rate (:func:`bench.scale.cluster.churn`): per change and client, delivery latency = the
   change's arrival at the client minus when its request was sent to the API server (on demand: the clients that
   looked the changed pod up); control-plane CPU share and RSS peak during the churn;
7. SIGTERM the control plane and start it again: resync = from its spawn until every client is in sync on a new
   stream, and how many resources the resync carried (versions are content hashes: ideally none); once per entry
   of ``restart_rates`` (the xDS admission rate of that start, 0: istiod's default), and the TokenReviews the API
   server answered meanwhile (each admitted stream is one) per second.

RSS is sampled every 0.2 s for both servers (peaks). A run's processes live in a temporary directory that is
removed at the end; every process is ended in ``finally``.
"""

from __future__ import annotations

import asyncio
import contextlib
import os
import re
import shutil
import sys
import tempfile
import time
import urllib.request
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path

from bench.kube_client import Endpoint
from bench.report import Measurement, Report, percentile
from bench.scale.cluster import (
    CHURN_KINDS,
    SERVICE_CIDR,
    ClusterShape,
    churn,
    churn_pods,
    creates,
    demanded_pods,
    paced,
    pod_ip,
)
from bench.scale.fleet import Fleet
from bench.server_process import ServerProcess, free_port

REPO = Path(__file__).resolve().parents[2]
CONTROL_PLANE_READY = re.compile(rb"control plane ready on port (\d+)")
MIB = 1024 * 1024


@dataclass(frozen=True, slots=True)
class Profile:
    name: str
    shape: ClusterShape
    load_rate: float
    """Creates per second while loading (0: as fast as the connections go)."""
    churn_rate: float
    """Pod changes per second."""
    churn_seconds: float
    workers: int = 2
    """Processes the simulated node proxies are spread over."""
    patience: float = 600.0
    """Seconds to wait for a sync or for every change to reach every client before failing the run."""
    restart_patience: float = 120.0
    """Seconds to wait for the resync after a restart; past that the run goes on and reports how far it got."""
    on_demand: int = 0
    """Names (pod ``network/IP`` aliases) each simulated node proxy looks up on demand; 0: every client is wildcard."""
    controlplane_args: tuple[str, ...] = ()
    """More ``ambit controlplane`` flags (e.g. ``--max-requests-per-second``)."""
    restart_rates: tuple[float, ...] = (0.0,)
    """One restart per entry, with that ``--max-requests-per-second`` (0: the control plane's default)."""

    @property
    def changes(self) -> int:
        return max(4, int(self.churn_rate * self.churn_seconds))

    @property
    def clients(self) -> str:
        """How the clients subscribe, for scenario names."""
        return f"{self.shape.nodes:,} clients" + (
            f" on demand ({self.on_demand:,} names each)" if self.on_demand else ""
        )


def _shape(ns: int, svc: int, pods: int, policies: int, nodes: int) -> ClusterShape:
    return ClusterShape(namespaces=ns, services=svc, pods=pods, policies=policies, nodes=nodes)


PROFILES = {
    "smoke": Profile(
        "smoke", _shape(2, 4, 40, 4, 3), load_rate=0, churn_rate=20, churn_seconds=1, patience=40, restart_patience=40
    ),
    "quick": Profile("quick", _shape(10, 100, 1_000, 50, 10), load_rate=0, churn_rate=50, churn_seconds=8),
    "default": Profile("default", _shape(100, 1_000, 10_000, 500, 100), load_rate=0, churn_rate=100, churn_seconds=30),
    "full": Profile(
        "full", _shape(1_000, 10_000, 100_000, 2_000, 1_000), load_rate=0, churn_rate=100, churn_seconds=60, workers=4
    ),
}


_BUCKET = re.compile(r'^pilot_proxy_convergence_time_bucket\{le="([^"]+)"\} ([0-9.e+]+)$', re.MULTILINE)


def convergence_buckets(metrics: str) -> dict[float, float]:
    """The cumulative buckets of ``pilot_proxy_convergence_time`` in a Prometheus text page (bound -> count)."""
    return {float(bound): float(count) for bound, count in _BUCKET.findall(metrics)}


def convergence_shares(before: dict[float, float], after: dict[float, float]) -> dict[float, float]:
    """The share of the pushes between two scrapes that converged within 0.5 s and within 1 s."""
    total = after.get(float("inf"), 0.0) - before.get(float("inf"), 0.0)
    if total <= 0:
        return {}
    return {bound: (after.get(bound, 0.0) - before.get(bound, 0.0)) / total for bound in (0.5, 1.0)}


_TOTAL = re.compile(r"^(pilot_[a-z_]+?)(_sum|_count|_total)?(?:\{[^}]*\})? ([0-9.e+-]+)$", re.MULTILINE)
WATCHED = ("pilot_pushcontext_init_seconds", "pilot_debounce_time", "pilot_xds_send_time", "pilot_xds_pushes")
"""The control plane's series whose totals between two scrapes explain a churn: translations (count, time),
debounce (first change to the end of the hand-over), writes (count, time each)."""


def series_totals(metrics: str) -> dict[str, float]:
    """Each :data:`WATCHED` series' ``_sum`` and ``_count`` (a histogram) or its value (a counter, with or without
    ``_total``), each summed over its labels, keyed ``name_sum`` / ``name_count`` / ``name``."""
    totals: dict[str, float] = {}
    for name, suffix, value in _TOTAL.findall(metrics):
        if name not in WATCHED:
            continue
        key = name if suffix == "_total" else name + suffix
        totals[key] = totals.get(key, 0.0) + float(value)
    return totals


@dataclass(frozen=True)
class FanOut:
    """Where a churn's delivery latency goes, from each change's arrivals at its clients: ``first`` is the first
    client's latency (API server, watch, debounce, translation, one write), ``spread`` the time from the first
    client's arrival to the last one's (the fan-out of one push round over every stream)."""

    first: list[float]
    spread: list[float]


def fan_out(sent: list[float], arrivals: list[list[float | None]]) -> FanOut:
    """:class:`FanOut` of changes sent at ``sent[k]`` and read at ``arrivals[k][c]`` (None: never; left out)."""
    first: list[float] = []
    spread: list[float] = []
    for at, times in zip(sent, arrivals, strict=True):
        seen = [t for t in times if t is not None]
        if seen:
            first.append(min(seen) - at)
            spread.append(max(seen) - min(seen))
    return FanOut(first, spread)


class ScaleError(RuntimeError):
    """The run could not produce its figures (a sync or a delivery did not finish in time)."""


class Sampler:
    """Peak RSS of some processes, sampled in the background."""

    def __init__(self, processes: dict[str, Callable[[], ServerProcess]]) -> None:
        self._processes = processes
        self.peaks: dict[str, int] = dict.fromkeys(processes, 0)
        self._task: asyncio.Task[None] | None = None

    def reset(self) -> None:
        self.peaks = dict.fromkeys(self._processes, 0)

    async def _run(self) -> None:
        while True:
            for name, process in self._processes.items():
                with contextlib.suppress(OSError, RuntimeError):
                    self.peaks[name] = max(self.peaks[name], process().rss_bytes())
            await asyncio.sleep(0.2)

    def start(self) -> None:
        self._task = asyncio.create_task(self._run(), name="rss sampler")

    async def aclose(self) -> None:
        if self._task is not None:
            self._task.cancel()
            await asyncio.gather(self._task, return_exceptions=True)


class Run:
    """One run's processes and report."""

    def __init__(self, profile: Profile, tmp: Path, *, profile_controlplane: bool) -> None:
        self.profile = profile
        self.shape = profile.shape
        self.tmp = tmp
        self.report = Report("control plane at scale", profile.name, notes=list(NOTES))
        self.data_dir = tmp / "apiserver"
        self.api = ServerProcess(
            [
                sys.executable,
                "-m",
                "ambit.cli",
                "apiserver",
                "--data-dir",
                str(self.data_dir),
                "--listen",
                f"127.0.0.1:{free_port()}",
                "--service-cidr",
                SERVICE_CIDR,
            ],
            log=tmp / "apiserver.log",
            cwd=REPO,
        )
        self.xds_port = free_port()
        self.monitoring_port = free_port()
        self._profile_controlplane = profile_controlplane
        self._plane_starts = 0
        self.plane = self._control_plane()
        self.fleet: Fleet | None = None
        self.endpoint: Endpoint | None = None
        self.demanders: dict[str, set[str]] = {}
        """On demand: each looked-up name → the nodes whose client looked it up."""

    def _control_plane(self, rate: float = 0.0) -> ServerProcess:
        prefix = [sys.executable]
        extra = ("--max-requests-per-second", f"{rate:g}") if rate else ()
        self._plane_starts += 1
        if self._profile_controlplane:  # one profile per start: the first covers the initial sync and the churn
            out = self.tmp / f"controlplane-{self._plane_starts}.prof"
            prefix += ["-m", "cProfile", "-o", str(out)]
        return ServerProcess(
            [
                *prefix,
                "-m",
                "ambit.cli",
                "controlplane",
                "--kubeconfig",
                str(self.data_dir / "kubeconfig"),
                "--listen",
                f"127.0.0.1:{self.xds_port}",
                "--webhook-port",
                "0",
                "--no-deploy-waypoints",
                "--monitoring-port",
                str(self.monitoring_port),
                *self.profile.controlplane_args,
                *extra,
            ],
            log=self.tmp / "controlplane.log",
            cwd=REPO,
            ready_timeout=self.profile.patience,
            ready=CONTROL_PLANE_READY,
        )

    def add(self, scenario: str, metric: str, value: float, unit: str, note: str = "") -> None:
        self.report.add(Measurement(scenario, metric, value, unit, note=note))

    async def execute(self) -> None:
        s = self.shape
        await self.api.start()
        self.endpoint = Endpoint.from_kubeconfig(self.data_dir / "kubeconfig")
        await asyncio.sleep(0.3)
        idle_api = self.api.rss_bytes()
        sampler = Sampler({"apiserver": lambda: self.api, "controlplane": lambda: self.plane})
        sampler.start()
        try:
            self._phase("load")
            await self._load(idle_api)
            tokens = await self._node_tokens()
            self._phase("control plane start")
            await self._start_plane()
            self._phase("initial sync")
            await self._initial_sync(tokens)
            sampler.reset()
            self._phase("churn")
            await self._churn(sampler)
            for rate in self.profile.restart_rates:
                self._phase("restart")
                await self._restart(rate)
            self._phase("done")
        finally:
            await sampler.aclose()
        self.report.env["loadavg_end"] = os.getloadavg()[0]
        self.report.env["shape"] = {
            "namespaces": s.namespaces,
            "services": s.services,
            "pods": s.pods,
            "policies": s.policies,
            "clients": s.nodes,
        }

    async def _metrics(self) -> str:
        """The control plane's metrics page now."""
        url = f"http://127.0.0.1:{self.monitoring_port}/metrics"

        def scrape() -> str:
            with urllib.request.urlopen(url, timeout=10) as answer:
                return str(answer.read().decode())

        return await asyncio.to_thread(scrape)

    def _phase(self, name: str) -> None:
        """A progress line on stderr as each step begins, with the servers' pids (to attach a profiler from outside
        to one step of a run that takes minutes)."""
        pids = ", ".join(
            f"{what} {server.pid}"
            for what, server in (("apiserver", self.api), ("controlplane", self.plane))
            if server.running
        )
        print(f"[scale {time.strftime('%H:%M:%S')}] {name} ({pids})", file=sys.stderr, flush=True)

    async def _load(self, idle_api: int) -> None:
        assert self.endpoint is not None
        s, p = self.shape, self.profile
        scenario = f"load {s.pods:,} pods, {s.services:,} Services, {s.policies:,} policies"
        began = time.monotonic()
        for phase, requests in creates(s).items():
            run = await paced(self.endpoint, requests, rate=p.load_rate, connections=8)
            if phase == "pods":
                note = f"asked {p.load_rate:g}/s" if p.load_rate else "as fast as 8 connections go"
                self.add(scenario, "pods created", run.rate, "/s", f"create + status patch; {note}")
        self.add(scenario, "load time", time.monotonic() - began, "s")
        self.add(scenario, "API server RSS", self.api.rss_bytes() / MIB, "MiB", f"{idle_api / MIB:.0f} MiB empty")

    async def _node_tokens(self) -> list[tuple[str, str]]:
        """One ztunnel pod per node and a token bound to it, as each node proxy's projected token is."""
        from ambit.k8s import KubeAlreadyExistsError, KubeClient, kinds

        async with KubeClient.from_kubeconfig(self.data_dir / "kubeconfig") as kube:
            with contextlib.suppress(KubeAlreadyExistsError):
                await kube.create(kinds.NAMESPACES, {"metadata": {"name": "istio-system"}})
            with contextlib.suppress(KubeAlreadyExistsError):
                account = {"metadata": {"name": "ztunnel", "namespace": "istio-system"}}
                await kube.create(kinds.SERVICE_ACCOUNTS, account, "istio-system")
            semaphore = asyncio.Semaphore(8)

            async def one(n: int) -> tuple[str, str]:
                node = f"node-{n:04d}"
                pod = {
                    "metadata": {"name": f"ztunnel-{n:04d}", "namespace": "istio-system", "labels": {"app": "ztunnel"}},
                    "spec": {
                        "nodeName": node,
                        "serviceAccountName": "ztunnel",
                        "containers": [{"name": "istio-proxy", "image": "ambit"}],
                    },
                }
                async with semaphore:
                    created = await kube.create(kinds.PODS, pod, "istio-system")
                    token = await kube.create_token("istio-system", "ztunnel", ["istio-ca"], bound_pod=created)
                return node, str(token["status"]["token"])

            return list(await asyncio.gather(*(one(n) for n in range(self.shape.nodes))))

    async def _root_pem(self) -> bytes:
        from ambit.k8s import KubeClient, KubeNotFoundError, kinds

        async with KubeClient.from_kubeconfig(self.data_dir / "kubeconfig") as kube:
            for _ in range(600):
                with contextlib.suppress(KubeNotFoundError):
                    cm = await kube.get(kinds.CONFIG_MAPS, "istio-ca-root-cert", "istio-system")
                    return str(cm["data"]["root-cert.pem"]).encode()
                await asyncio.sleep(0.1)
        raise ScaleError("the control plane never published istio-ca-root-cert")

    async def _start_plane(self) -> None:
        s = self.shape
        scenario = f"control plane start ({s.pods:,} pods)"
        ready = await self.plane.start()
        self.add(scenario, "spawn to ready", ready, "s", "lists everything, translates once")
        self.add(scenario, "CPU", self.plane.cpu_seconds(), "s")
        self.add(scenario, "RSS", self.plane.rss_bytes() / MIB, "MiB")

    async def _wait(self, what: str, done: Callable[[], object], *, within: float = 0.0) -> None:
        patience = within or self.profile.patience
        deadline = time.monotonic() + patience
        while True:
            result = done()
            if asyncio.iscoroutine(result):
                result = await result
            if result:
                return
            if time.monotonic() > deadline:
                raise ScaleError(f"{what} did not finish within {patience:g} s")
            await asyncio.sleep(0.25)

    async def _initial_sync(self, tokens: list[tuple[str, str]]) -> None:
        s, p = self.shape, self.profile
        scenario = f"initial sync, {p.clients}"
        root = await self._root_pem()
        demands = {
            node: [f"/{pod_ip(i)}" for i in demanded_pods(s, n, p.on_demand, p.changes)]
            for n, (node, _) in enumerate(tokens)
            if p.on_demand
        }
        self.demanders = {}
        for node, names in demands.items():
            for name in names:
                self.demanders.setdefault(name, set()).add(node)
        cpu = self.plane.cpu_seconds()
        began = time.monotonic()
        self.fleet = await Fleet.start(
            f"127.0.0.1:{self.xds_port}",
            root,
            tokens,
            workers=self.profile.workers,
            log=self.tmp / "fleet.log",
            demands=demands,
        )
        fleet = self.fleet

        async def all_synced() -> bool:
            status = await fleet.status()
            return bool(status["synced"] == s.nodes)

        await self._wait("the initial sync", all_synced)
        syncs = await fleet.syncs()
        # A client's first sync may come on a later connect, when an earlier one failed (reported as connects).
        firsts = sorted(next(s for _, s, _ in client if s > 0) - began for client in syncs)
        last = began + firsts[-1]
        status = await fleet.status()
        self.add(
            scenario,
            "until all in sync",
            last - began,
            "s",
            f"first {firsts[0]:.2f} s, median {firsts[len(firsts) // 2]:.2f} s",
        )
        held = "Addresses held" if not p.on_demand else f"Addresses held, most (fewest {status['held_min']:,})"
        self.add(scenario, "resources per client", status["held_max"], "", held)
        self.add(scenario, "client connects", status["connects"], "", f"{s.nodes} clients")
        self.add(scenario, "control plane CPU", self.plane.cpu_seconds() - cpu, "s")
        self.add(scenario, "control plane RSS", self.plane.rss_bytes() / MIB, "MiB", "after the sync")
        self.add(scenario, "node proxies' CPU", fleet.cpu_seconds(), "s", f"{len(fleet.workers)} worker processes")
        self.add(scenario, "node proxies' RSS", fleet.rss_bytes() / MIB, "MiB", "all workers, after the sync")

    async def _churn(self, sampler: Sampler) -> None:
        assert self.endpoint is not None and self.fleet is not None
        s, p = self.shape, self.profile
        requests = churn(s, p.changes)
        names = [r.tag for r in requests]
        # Who should see each change: every client, or on demand those that looked its pod up.
        nodes = self.fleet.nodes

        def wanting(pod: int) -> list[bool]:
            if not p.on_demand:
                return [True] * len(nodes)
            who = self.demanders.get(f"/{pod_ip(pod)}", set())
            return [n in who for n in nodes]

        wanted = [wanting(i) for i in churn_pods(s, p.changes)]
        expected = sum(sum(w) for w in wanted)
        await self.fleet.track(names)
        scenario = f"churn {p.churn_rate:g} pod changes/s to {p.clients}"
        plane_cpu, api_cpu, fleet_cpu = self.plane.cpu_seconds(), self.api.cpu_seconds(), self.fleet.cpu_seconds()
        page = await self._metrics()
        converged, totals = convergence_buckets(page), series_totals(page)
        began = time.monotonic()
        run = await paced(self.endpoint, requests, rate=p.churn_rate, connections=4)
        fleet = self.fleet

        async def all_delivered() -> bool:  # a count, not the arrivals: polling must not hold the clients up
            status = await fleet.status()
            return bool(status["arrived"] >= expected)

        with contextlib.suppress(ScaleError):  # what never arrived is reported as missing, by kind
            await self._wait("delivering the churn", all_delivered)
        wall = time.monotonic() - began
        arrivals = await fleet.arrivals(names)
        latencies: list[float] = []
        missing: dict[str, int] = {}
        for k, name in enumerate(names):
            sent = run.times[name][0]
            for c, t in enumerate(arrivals[name]):
                if not wanted[k][c]:
                    continue
                if t is None:
                    kind = CHURN_KINDS[k % len(CHURN_KINDS)]
                    missing[kind] = missing.get(kind, 0) + 1
                else:
                    latencies.append(t - sent)
        self.add(
            scenario, "changes", len(names), "", f"at {run.rate:.0f}/s, latest {run.late * 1000:.0f} ms behind its slot"
        )
        self.add(scenario, "delivery p50", percentile(latencies, 50) * 1000, "ms", "API request sent to client read")
        self.add(scenario, "delivery p99", percentile(latencies, 99) * 1000, "ms")
        self.add(scenario, "delivery max", max(latencies, default=float("nan")) * 1000, "ms")
        by_kind = ", ".join(f"{kind} {n}" for kind, n in missing.items())
        self.add(scenario, "deliveries missing", sum(missing.values()), "", f"of {expected:,} {by_kind}")
        wanted_arrivals = [[t for c, t in enumerate(arrivals[name]) if wanted[k][c]] for k, name in enumerate(names)]
        spread = fan_out([run.times[name][0] for name in names], wanted_arrivals)
        note = "API request sent to the first client's read"
        self.add(scenario, "first client p50", percentile(spread.first, 50) * 1000, "ms", note)
        self.add(scenario, "first client p99", percentile(spread.first, 99) * 1000, "ms")
        note = "per change, from the first client's read to the last one's"
        self.add(scenario, "fan-out p50", percentile(spread.spread, 50) * 1000, "ms", note)
        self.add(scenario, "fan-out p99", percentile(spread.spread, 99) * 1000, "ms")
        page = await self._metrics()
        pushes = convergence_shares(converged, convergence_buckets(page))
        for bound, share in pushes.items():
            note = "of the pushes: first change seen by the control plane to its last write to that client"
            self.add(scenario, f"control plane convergence <= {bound:g} s", share * 100, "%", note)
        after = series_totals(page)

        def delta(key: str) -> float:
            return after.get(key, 0.0) - totals.get(key, 0.0)

        translations = delta("pilot_pushcontext_init_seconds_count")
        if translations > 0:
            mean = delta("pilot_pushcontext_init_seconds_sum") / translations * 1000
            self.add(scenario, "translations", translations, "", f"{translations / wall:.1f}/s, mean {mean:.0f} ms")
            mean = delta("pilot_debounce_time_sum") / max(delta("pilot_debounce_time_count"), 1) * 1000
            self.add(scenario, "debounce mean", mean, "ms", "first change seen to the end of its hand-over")
        writes = delta("pilot_xds_send_time_count")
        if writes > 0:
            mean = delta("pilot_xds_send_time_sum") / writes * 1000
            self.add(scenario, "writes to clients", writes, "", f"{writes / wall:.0f}/s, mean {mean:.2f} ms each")
        self.add(scenario, "control plane CPU", (self.plane.cpu_seconds() - plane_cpu) / wall * 100, "%", "of one core")
        self.add(scenario, "control plane RSS peak", sampler.peaks["controlplane"] / MIB, "MiB")
        self.add(scenario, "API server CPU", (self.api.cpu_seconds() - api_cpu) / wall * 100, "%", "of one core")
        self.add(scenario, "API server RSS peak", sampler.peaks["apiserver"] / MIB, "MiB")
        self.add(scenario, "node proxies' CPU", (fleet.cpu_seconds() - fleet_cpu) / wall * 100, "%", "of one core")

    async def _restart(self, rate: float) -> None:
        assert self.fleet is not None
        s = self.shape
        admission = f"admission {rate:g}/s" if rate else "default admission"
        scenario = f"control plane restart ({admission}), {self.profile.clients}"
        fleet = self.fleet
        before = await fleet.syncs()
        connects_before = [len(client) for client in before]
        await self.plane.terminate(grace=60)
        api_cpu = self.api.cpu_seconds()
        self.plane = self._control_plane(rate)
        reviews = _token_reviews(self.tmp / "controlplane.log")
        began = time.monotonic()
        ready = await self.plane.start()
        self._phase("resync")

        async def all_resynced() -> bool:
            syncs = await fleet.syncs()
            return all(len(client) > n and client[-1][1] > 0 for client, n in zip(syncs, connects_before, strict=True))

        finished = True
        try:
            await self._wait("the resync after the restart", all_resynced, within=self.profile.restart_patience)
        except ScaleError:
            finished = False  # reported, with how often the clients tried: a reconnect loop is a finding
        syncs = await fleet.syncs()
        self.add(scenario, "spawn to ready", ready, "s")
        if finished:
            last = max(client[-1][1] for client in syncs)
            self.add(scenario, "spawn to all clients in sync", last - began, "s")
            answered = _token_reviews(self.tmp / "controlplane.log") - reviews
            note = f"{answered:,} TokenReviews from spawn to the last sync"
            self.add(scenario, "TokenReviews on the API server", answered / max(last - began, 1e-9), "/s", note)
        else:
            synced = sum(
                1 for client, n in zip(syncs, connects_before, strict=True) if len(client) > n and client[-1][1] > 0
            )
            note = f"not within {self.profile.restart_patience:g} s; {synced} of {s.nodes} in sync"
            self.add(scenario, "spawn to all clients in sync", float("nan"), "s", note)
        reconnects = sum(len(client) - n for client, n in zip(syncs, connects_before, strict=True))
        self.add(scenario, "client connects", reconnects, "", "attempts; each admitted one is a TokenReview")
        resent = sum(client[-1][2] for client in syncs)
        self.add(scenario, "resources resent", resent, "", "all clients; versions are content hashes")
        self.add(scenario, "API server CPU", self.api.cpu_seconds() - api_cpu, "s", "during the resync")
        self.add(scenario, "control plane RSS", self.plane.rss_bytes() / MIB, "MiB", "after the resync")

    async def aclose(self) -> None:
        if self.fleet is not None:
            await self.fleet.aclose()
        for server in (self.plane, self.api):
            if server.running:
                await server.terminate(grace=60)


NOTES = [
    "Both servers are real processes on loopback with TLS; the simulated node proxies are real delta ADS gRPC "
    "clients (one connection each, the node proxy's session and keepalive, a token bound to a ztunnel pod on their "
    "node) spread over worker processes; all share the machine's CPUs with the load generator.",
    "Delivery latency counts from the churn request leaving the harness to the change being read by a client: the "
    "API server's write and watch, the control plane's debounce and translation, and the push.",
    "Control plane CPU is in percent of one core over the churn's wall time (churn plus the drain after it).",
]


async def run_async(
    profile: Profile, *, profile_controlplane: Path | None = None, partial: Callable[[Report], None] | None = None
) -> Report:
    """Run ``profile``; with ``profile_controlplane`` (a directory), the control plane runs under cProfile and its
    profiles (one per start) and logs are copied there. When the run fails, ``partial`` is handed the report of
    what was measured until then."""
    with tempfile.TemporaryDirectory(prefix="ambit-scale-") as tmp_name:
        run = Run(profile, Path(tmp_name), profile_controlplane=profile_controlplane is not None)
        try:
            await run.execute()
        except BaseException as exc:
            # What was measured before the failure is kept (the full profile's restart failing cost a whole run).
            run.report.notes.append(f"The run stopped early: {type(exc).__name__}: {str(exc)[:300]}")
            if partial is not None:
                partial(run.report)
            for name in ("controlplane.log", "apiserver.log", "fleet.log"):
                path = Path(tmp_name) / name
                if path.exists():
                    tail = path.read_bytes()[-2500:].decode(errors="replace")
                    print(f"--- {name} ends with:\n{tail}", file=sys.stderr)
            raise
        finally:
            await run.aclose()
            if profile_controlplane is not None:
                _keep(Path(tmp_name), "controlplane*", profile_controlplane)
    return run.report


def _token_reviews(log: Path) -> int:
    """TokenReviews the control plane has asked for so far, from its log (its API client logs each request)."""
    try:
        return log.read_bytes().count(b"/tokenreviews")
    except OSError:
        return 0


def _keep(directory: Path, pattern: str, destination: Path) -> None:
    """Copy the files of ``directory`` matching ``pattern`` to ``destination`` as ``scale-<name>``."""
    destination.mkdir(parents=True, exist_ok=True)
    for path in directory.glob(pattern):
        shutil.copy(path, destination / f"scale-{path.name}")
