"""The API server benchmark's scenarios, each adding its figures to the report of one :class:`Lab`.

They run in this order on one data directory: load and list (1), SIGTERM restart (4a), creates per second (2),
watch fan-out (3), kill -9 in the middle of a create burst and restart (4b). Every scenario also reports the CPU
seconds the server used during it (``/proc``) and those the benchmark client used (``time.process_time``): on a
small machine the client shares the CPUs, and its figure shows when it, not the server, was the limit.
"""

from __future__ import annotations

import time
from dataclasses import dataclass

from bench.kube_client import CreateRun, Endpoint, create_pods, fetch_body, fetch_list, fetch_pages
from bench.report import Measurement, Report, median, percentile
from bench.server_process import ServerProcess
from bench.watch_fanout import FanoutResult, fan_out

LOAD_NAMESPACE = "bench"
NAMESPACES = (LOAD_NAMESPACE, "creates-1", "creates-8", "watch", "crash")
BARE = "bare aiohttp"


class BenchError(RuntimeError):
    """A scenario could not produce a meaningful figure (requests failed, counts did not add up)."""


@dataclass(frozen=True, slots=True)
class Profile:
    """How big each scenario is."""

    name: str
    pods: int
    """Pods loaded into one namespace for the list and restart scenarios."""
    list_runs: int
    """Timed repetitions of each list."""
    creates: int
    """Creates per concurrency level in the creates-per-second scenario."""
    watchers: int
    watch_events: int
    """Creates in the burst that every watcher must receive."""
    crash_writes: int
    """Creates in the burst that is cut by kill -9 half-way."""
    writers: int = 8
    page_size: int = 500


PROFILES = {
    "full": Profile("full", 10_000, list_runs=7, creates=2_000, watchers=100, watch_events=1_000, crash_writes=2_000),
    "quick": Profile("quick", 1_000, list_runs=5, creates=300, watchers=10, watch_events=100, crash_writes=300),
    "smoke": Profile("smoke", 120, list_runs=2, creates=40, watchers=3, watch_events=20, crash_writes=40),
}


@dataclass
class Lab:
    """The servers under test and where figures go."""

    profile: Profile
    report: Report
    api: ServerProcess
    endpoint: Endpoint
    bare: ServerProcess
    bare_endpoint: Endpoint
    cold_start: float
    """Seconds from spawn to ready with an empty data directory: the reference for restarts."""
    idle_rss: int

    def add(
        self,
        scenario: str,
        metric: str,
        value: float,
        unit: str,
        *,
        reference: float | None = None,
        reference_name: str = "",
        note: str = "",
    ) -> None:
        self.report.add(Measurement(scenario, metric, value, unit, reference, reference_name, note))


class Meter:
    """CPU seconds of the server and of this process, and wall time, since construction."""

    def __init__(self, server: ServerProcess) -> None:
        self._server = server
        self._wall = time.monotonic()
        self._server_cpu = server.cpu_seconds()
        self._client_cpu = time.process_time()

    def read(self) -> tuple[float, float, float]:
        return (
            time.monotonic() - self._wall,
            self._server.cpu_seconds() - self._server_cpu,
            time.process_time() - self._client_cpu,
        )

    def report(self, lab: Lab, scenario: str, reference: tuple[float, float, float] | None = None) -> None:
        """Add server and client CPU seconds, with those of the same scenario on the bare server if given."""
        wall, server, client = self.read()
        ref_server, ref_client, name = (None, None, "") if reference is None else (reference[1], reference[2], BARE)
        note = f"over {wall:.1f} s wall"
        lab.add(scenario, "server CPU", server, "s", reference=ref_server, reference_name=name, note=note)
        lab.add(scenario, "benchmark client CPU", client, "s", reference=ref_client, reference_name=name)


def _check(run_failures: int, first_error: str, what: str) -> None:
    if run_failures:
        raise BenchError(f"{what}: {run_failures} requests failed, first: {first_error}")


async def load_and_list(lab: Lab) -> None:
    """Scenario 1: load the pods (8 clients), then time whole lists, a 10% label selection, and pagination."""
    p = lab.profile
    scenario = f"1 list {p.pods:,} pods"
    meter = Meter(lab.api)
    names = [f"pod-{i:05d}" for i in range(p.pods)]
    run = await create_pods(lab.endpoint, LOAD_NAMESPACE, names, clients=p.writers)
    _check(run.failures, run.first_error, "loading pods")
    lab.add(scenario, f"load rate, {p.writers} clients", run.rate, "creates/s")
    meter.report(lab, f"{scenario}: load")
    rss = lab.api.rss_bytes()
    idle = lab.idle_rss / 2**20
    lab.add(scenario, "server RSS after load", rss / 2**20, "MiB", reference=idle, reference_name="idle")
    lab.add(scenario, "server RSS per pod", (rss - lab.idle_rss) / p.pods / 1024, "KiB")

    meter = Meter(lab.api)
    selector = "labelSelector=app%3Dapp-3"
    async with lab.endpoint.session(1) as session:
        body, _ = await fetch_body(session, "/api/v1/pods")  # warm-up, and a check of what we time
        doc = await fetch_list(session, f"/api/v1/namespaces/{LOAD_NAMESPACE}/pods?{selector}")
        if body.count(b'"kind":"Pod"') < p.pods or len(doc["items"]) != p.pods // 10:
            raise BenchError(f"lists disagree with the load: {len(doc['items'])} pods selected of {p.pods}")
        for label, path in (
            ("all namespaces", "/api/v1/pods"),
            (f"labelSelector, {len(doc['items'])} of {p.pods}", f"/api/v1/namespaces/{LOAD_NAMESPACE}/pods?{selector}"),
        ):
            times = []
            for _ in range(p.list_runs):
                body, seconds = await fetch_body(session, path)
                times.append(seconds)
            lab.add(scenario, f"GET {label}, median", median(times) * 1000, "ms", note=f"{p.list_runs} runs")
            lab.add(scenario, f"GET {label}, p90", percentile(times, 90) * 1000, "ms")
            lab.add(scenario, f"GET {label}, response size", len(body) / 2**20, "MiB")
        pages_times = []
        for _ in range(max(1, p.list_runs // 2)):
            pages, items, seconds = await fetch_pages(session, "/api/v1/pods", p.page_size)
            pages_times.append(seconds)
        if items < p.pods:
            raise BenchError(f"pagination returned {items} pods, expected {p.pods}")
        metric = f"limit={p.page_size} pagination, all pages"
        lab.add(scenario, metric, median(pages_times) * 1000, "ms", note=f"{pages} pages")
        lab.add(scenario, f"limit={p.page_size} pagination, per page", median(pages_times) / pages * 1000, "ms")
    meter.report(lab, f"{scenario}: lists")


async def _list_state(lab: Lab) -> tuple[int, int]:
    """(pods in all namespaces, list resourceVersion)."""
    async with lab.endpoint.session(1) as session:
        doc = await fetch_list(session, "/api/v1/pods")
    return len(doc["items"]), int(doc["metadata"]["resourceVersion"])


async def restart(lab: Lab) -> None:
    """Scenario 4a: SIGTERM, start again on the same data directory; time to the ready line."""
    scenario = f"4 restart with {lab.profile.pods:,} pods"
    count, rv = await _list_state(lab)
    shutdown = await lab.api.terminate()
    ready = await lab.api.start()
    startup_cpu = lab.api.cpu_seconds()
    rss = lab.api.rss_bytes()
    count_after, rv_after = await _list_state(lab)
    if count_after != count or rv_after < rv:
        raise BenchError(f"after a clean restart: {count_after} pods (was {count}), resourceVersion {rv_after} ({rv})")
    lab.add(scenario, "SIGTERM to exit", shutdown * 1000, "ms")
    lab.add(scenario, "start to ready line", ready, "s", reference=lab.cold_start, reference_name="empty data dir")
    lab.add(scenario, "start-up CPU", startup_cpu, "s")
    lab.add(scenario, "server RSS after restart", rss / 2**20, "MiB")


async def creates_per_second(lab: Lab) -> None:
    """Scenario 2: 1 and 8 concurrent keep-alive clients, against the API server and the bare server."""
    p = lab.profile
    for clients in (1, p.writers):
        scenario = f"2 creates, {clients} client{'s' if clients > 1 else ''}"
        names = [f"c{clients}-{i:05d}" for i in range(p.creates)]
        meter = Meter(lab.bare)
        bare = await create_pods(lab.bare_endpoint, f"creates-{clients}", names, clients=clients)
        _check(bare.failures, bare.first_error, "bare creates")
        bare_cpu = meter.read()
        meter = Meter(lab.api)
        run = await create_pods(lab.endpoint, f"creates-{clients}", names, clients=clients)
        _check(run.failures, run.first_error, "creates")
        lab.add(scenario, "creates/s", run.rate, "/s", reference=bare.rate, reference_name=BARE)
        cpu = meter.read()[1]
        lab.add(
            scenario,
            "server CPU per create",
            cpu / p.creates * 1e6,
            "µs",
            reference=bare_cpu[1] / p.creates * 1e6,
            reference_name=BARE,
        )
        meter.report(lab, scenario, reference=bare_cpu)


async def watch_fanout(lab: Lab) -> None:
    """Scenario 3: W watches on all pods, K creates; delivery rate and ack-to-delivery latency."""
    p = lab.profile
    scenario = f"3 watch, {p.watchers} watchers x {p.watch_events} creates"
    _, rv = await _list_state(lab)

    async def measure(endpoint: Endpoint, path: str) -> FanoutResult:
        return await fan_out(
            endpoint, path, "watch", watchers=p.watchers, events=p.watch_events, writers=p.writers, prefix="w"
        )

    meter = Meter(lab.bare)
    bare = await measure(lab.bare_endpoint, "/api/v1/pods?watch=true")
    bare_cpu = meter.read()
    meter = Meter(lab.api)
    ours = await measure(lab.endpoint, f"/api/v1/pods?watch=true&resourceVersion={rv}&timeoutSeconds=1800")
    _check(ours.writes.failures, ours.writes.first_error, "watch burst")

    def add(metric: str, value: float, reference: float, unit: str, note: str = "") -> None:
        lab.add(scenario, metric, value, unit, reference=reference, reference_name=BARE, note=note)

    add("events delivered/s, total", ours.delivery_rate, bare.delivery_rate, "/s")
    add("first write to all delivered", ours.until_all_delivered, bare.until_all_delivered, "s")
    add("write rate during burst", ours.writes.rate, bare.writes.rate, "creates/s")
    for q in (50, 99):
        ms = percentile(ours.latencies, q) * 1000
        add(f"ack→delivery p{q}", ms, percentile(bare.latencies, q) * 1000, "ms", f"{len(ours.latencies):,} deliveries")
    if ours.incomplete_watchers or bare.incomplete_watchers:
        add("watchers missing events", ours.incomplete_watchers, bare.incomplete_watchers, "")
    cpu = meter.read()[1] / max(ours.delivered, 1) * 1e6
    add("server CPU per delivered event", cpu, bare_cpu[1] / max(bare.delivered, 1) * 1e6, "µs", "writes included")
    meter.report(lab, scenario, reference=bare_cpu)


async def crash_restart(lab: Lab) -> None:
    """Scenario 4b: kill -9 half-way through a create burst; every acknowledged pod must come back unchanged."""
    p = lab.profile
    scenario = "4 crash (kill -9) mid-burst"
    count_before, rv_before = await _list_state(lab)
    names = [f"x-{i:05d}" for i in range(p.crash_writes)]
    killed = False

    def kill_half_way(run: CreateRun) -> None:
        nonlocal killed
        if not killed and len(run.acked) >= p.crash_writes // 2:
            killed = True
            lab.api.crash()

    run = await create_pods(lab.endpoint, "crash", names, clients=p.writers, on_ack=kill_half_way)
    await lab.api.kill()
    rv_acked = max((rv for _, rv in run.acked.values()), default=rv_before)
    ready = await lab.api.start()
    async with lab.endpoint.session(1) as session:
        doc = await fetch_list(session, "/api/v1/pods")
    rv_after = int(doc["metadata"]["resourceVersion"])
    present = {
        i["metadata"]["name"]: int(i["metadata"]["resourceVersion"])
        for i in doc["items"]
        if i["metadata"]["namespace"] == "crash"
    }
    lost = [n for n, (_, rv) in run.acked.items() if present.get(n) != rv]
    lab.add(scenario, "start to ready line", ready, "s", reference=lab.cold_start, reference_name="empty data dir")
    lab.add(scenario, "acknowledged creates before the kill", len(run.acked), "pods")
    lab.add(scenario, "acknowledged pods lost or changed", len(lost), "pods", note="must be 0")
    lab.add(scenario, "committed, not acknowledged", len(present) - (len(run.acked) - len(lost)), "pods")
    lab.add(scenario, "resourceVersion after - before", rv_after - max(rv_before, rv_acked), "", note="must be >= 0")
    lab.add(scenario, "pods after restart", len(doc["items"]), "pods", note=f"{count_before:,} before the burst")
    if lost or rv_after < max(rv_before, rv_acked):
        lab.report.notes.append(
            f"DURABILITY FAILURE: {len(lost)} acknowledged pods lost or changed ({lost[:5]}), "
            f"resourceVersion {rv_after} after restart vs {max(rv_before, rv_acked)} acknowledged"
        )
