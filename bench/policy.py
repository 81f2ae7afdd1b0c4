"""The L4 policy benchmark: what 0, 100 and 10,000 AuthorizationPolicies cost the mesh (issue 15).

``python -m bench.policy [--quick] [--micro-only]`` (as root for the lab part; ``make bench-policy``) measures:

1. **the decision's own cost** (no lab): :meth:`ambit.rbac.PolicyIndex.check` in-process, in µs per decision, for
   the policy sets below, translated by the control plane's own translation (so the policies are those a node proxy
   holds);
2. on a 2-node lab with the mesh (:func:`bench.mesh.topology.bench_lab`: the lab lock, ``ambit lab up --mesh``,
   always ``ambit lab down``; every process it starts is ended by its pid): **new connections per second**
   (closed loop, 8 concurrent clients, each connecting, echoing 1 byte and closing, for a bounded time) and
   **request/response latency** (sockperf ping-pong, 14-byte messages on one connection, p50 and p99), from
   ``amb-cli`` on node 1 to ``amb-srv`` on node 2 (both enrolled: HBONE, the destination's node proxy decides),
   with 0, 100 and 10,000 policies in the cluster, interleaved round by round (0, 100, 10k, 0, 100, 10k, ...) so
   that the machine's drift spreads over all three; each figure as a ratio to the 0-policy median of the same run;
3. **the node proxies' RSS** with 0 policies (the first round, before any policy existed: a Python process keeps
   memory it freed, so later 0-policy rounds would overstate it) and with 10,000 (after the push settled);
4. **the control plane's push time** for the 10,000 policies: from the first API write to the destination's node
   proxy holding all of them, and from the last write;
5. **a DENY enforced**: a client in ``amb-cli`` connects every 10 ms; the time from starting ``kubectl apply`` of a
   namespace-wide DENY until its first refused connection (median of several tries, with the 10,000 policies in
   place), and from ``kubectl delete`` until connections go through again.

The policy set (:func:`policy_objects`): five policies apply to the destination, all letting the client in so that
every connection runs the whole evaluation (namespace ALLOW by source namespace and DENY by principals, and three
selecting ``app=amb-srv``: ALLOW by principal, DENY by IP block, DENY by port and ``when``); the rest are spread
over :data:`SPREAD_NAMESPACES` other namespaces in four shapes (namespace ALLOW by principals, namespace DENY by
namespaces and ports, selector ALLOW by namespaces, selector DENY by IP blocks and notPrincipals). The 100 set is
the first 100 of the 10,000 set, so moving between sets only creates or deletes. Objects are written with the
lab's admin kubeconfig (exempt from the API server's per-user rate limit) by :data:`WRITERS` concurrent requests.

A policy set is "settled" when the destination's node proxy lists exactly that many policies in its
``/config_dump`` (polled every :data:`SETTLE_POLL` s) and then the control plane, the API server and the lab's
controllers (whose mesh config writer follows every policy) use under :data:`QUIET_CPU` of a CPU over a second:
status writes and re-translations follow the push, and the machine has two vCPUs. After :data:`QUIET_TIMEOUT` s the
set is measured anyway and the report says so.
"""

# ruff: noqa: RUF001, RUF003 - µ and × on purpose

from __future__ import annotations

import argparse
import asyncio
import json
import os
import select
import signal
import statistics
import subprocess
import sys
import tempfile
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from ambit.controlplane.translate.policies import translate_authorization_policy
from ambit.errors import AmbitError
from ambit.k8s import KubeClient, kinds
from ambit.model.identity import SpiffeId
from ambit.model.policy import Policy
from ambit.model.workload import Workload
from ambit.rbac import Connection, PolicyIndex
from bench.mesh import scenarios
from bench.mesh.probes import ProbeError, cpu_seconds, find_pids, rss_bytes
from bench.mesh.run import _listening, _set_affinity, check_mesh, ensure_tools
from bench.mesh.scenarios import Route
from bench.mesh.topology import BenchLab, Processes, bench_lab
from bench.mesh.tunnels import APP_PORTS
from bench.report import Measurement, Report

REPO = Path(__file__).resolve().parents[1]
RESULTS = REPO / "bench" / "results"

DEST_NAMESPACE = "bench-amb"
"""The destination's namespace (:data:`bench.mesh.topology.AMBIENT`)."""
DEST_LABELS = {"app": "amb-srv"}
CLIENT_NAMESPACE, CLIENT_ACCOUNT = "bench-amb", "default"
TRUST_DOMAIN = "cluster.local"
SPREAD_NAMESPACES = 100
DESTINATION_POLICIES = 5
COUNTS = (0, 100, 10_000)
WRITERS = 16
"""Concurrent API requests while creating or deleting policies."""
SETTLE_POLL = 0.25
SETTLE_TIMEOUT = 600.0
QUIET_CPU = 0.10
QUIET_TIMEOUT = 300.0
DENY_NAME = "bench-deny"
RETRY_INTERVAL = 0.010

GOAL_RATIO = 0.05
GOAL_DENY_SECONDS = 1.0


class PolicyBenchError(AmbitError):
    """The lab did not reach a state the benchmark needs (policies not pushed, a client that never answered)."""


@dataclass(frozen=True, slots=True)
class Profile:
    name: str
    rounds: int
    rate_seconds: float
    rr_seconds: float
    deny_tries: int
    micro_decisions: int
    """Decisions per timing of the micro-benchmark (the median of :data:`MICRO_REPEATS` timings is reported)."""
    rate_concurrency: int = 8


PROFILES = {
    "quick": Profile("quick", rounds=2, rate_seconds=2, rr_seconds=2, deny_tries=3, micro_decisions=2_000),
    "full": Profile("full", rounds=3, rate_seconds=4, rr_seconds=4, deny_tries=7, micro_decisions=20_000),
}
MICRO_REPEATS = 5


# -- the policy set -------------------------------------------------------------------------------------------------
def _policy(name: str, namespace: str, spec: dict[str, Any]) -> dict[str, Any]:
    return {
        "apiVersion": "security.istio.io/v1",
        "kind": "AuthorizationPolicy",
        "metadata": {"name": name, "namespace": namespace},
        "spec": spec,
    }


def spread_namespace(index: int) -> str:
    return f"bench-pol-{index:03d}"


def _destination_policies() -> list[dict[str, Any]]:
    """Five policies that apply to the destination and all let the client through (each is evaluated in full)."""
    client = f"{TRUST_DOMAIN}/ns/{CLIENT_NAMESPACE}/sa/{CLIENT_ACCOUNT}"
    selector = {"matchLabels": dict(DEST_LABELS)}
    return [
        _policy(
            "dst-allow-namespace",
            DEST_NAMESPACE,
            {"action": "ALLOW", "rules": [{"from": [{"source": {"namespaces": [CLIENT_NAMESPACE, "bench-pol-*"]}}]}]},
        ),
        _policy(
            "dst-deny-principals",
            DEST_NAMESPACE,
            {
                "action": "DENY",
                "rules": [
                    {"from": [{"source": {"principals": [f"{TRUST_DOMAIN}/ns/evil/sa/intruder", "*/sa/blocked"]}}]}
                ],
            },
        ),
        _policy(
            "dst-allow-principal",
            DEST_NAMESPACE,
            {
                "selector": selector,
                "action": "ALLOW",
                "rules": [
                    {"from": [{"source": {"principals": [f"{TRUST_DOMAIN}/ns/other/sa/reader"]}}]},
                    {"from": [{"source": {"principals": [client, f"{TRUST_DOMAIN}/ns/other/sa/writer"]}}]},
                ],
            },
        ),
        _policy(
            "dst-deny-ipblock",
            DEST_NAMESPACE,
            {
                "selector": selector,
                "action": "DENY",
                "rules": [{"from": [{"source": {"ipBlocks": ["10.255.0.0/16"]}}]}],
            },
        ),
        _policy(
            "dst-deny-port",
            DEST_NAMESPACE,
            {
                "selector": selector,
                "action": "DENY",
                "rules": [
                    {
                        "to": [{"operation": {"ports": ["1", "2"]}}],
                        "when": [{"key": "source.namespace", "values": ["bench-pol-003"]}],
                    }
                ],
            },
        ),
    ]


def _spread_policy(index: int) -> dict[str, Any]:
    """Policy ``index`` (from 0) of those that do not apply to the destination: four shapes, round-robin."""
    namespace = spread_namespace(index % SPREAD_NAMESPACES)
    other = spread_namespace((index + 1) % SPREAD_NAMESPACES)
    name = f"pol-{index:05d}"
    shape = (index // SPREAD_NAMESPACES) % 4
    if shape == 0:
        principals = [f"{TRUST_DOMAIN}/ns/{other}/sa/sa-{index % 7}", f"{TRUST_DOMAIN}/ns/{namespace}/sa/sa-{index}"]
        return _policy(
            name, namespace, {"action": "ALLOW", "rules": [{"from": [{"source": {"principals": principals}}]}]}
        )
    if shape == 1:
        rule = {"from": [{"source": {"namespaces": [other]}}], "to": [{"operation": {"ports": ["8080", "9090"]}}]}
        return _policy(name, namespace, {"action": "DENY", "rules": [rule]})
    selector = {"matchLabels": {"app": f"svc-{index % 13}"}}
    if shape == 2:
        rule = {"from": [{"source": {"namespaces": [namespace, other]}}]}
        return _policy(name, namespace, {"selector": selector, "action": "ALLOW", "rules": [rule]})
    source = {"ipBlocks": [f"10.{index % 200}.0.0/16"], "notPrincipals": [f"{TRUST_DOMAIN}/ns/{namespace}/sa/admin"]}
    return _policy(name, namespace, {"selector": selector, "action": "DENY", "rules": [{"from": [{"source": source}]}]})


def policy_objects(count: int) -> list[dict[str, Any]]:
    """The first ``count`` policies of the set: the destination's five, then the spread ones (a prefix of any larger
    set, so moving between sets only creates or deletes)."""
    if count < 0:
        raise ValueError("a policy count is not negative")
    objects = _destination_policies()[:count]
    objects += [_spread_policy(i) for i in range(max(0, count - DESTINATION_POLICIES))]
    return objects


def _key(obj: dict[str, Any]) -> str:
    meta = obj["metadata"]
    return f"{meta['namespace']}/{meta['name']}"


# -- 1. the decision's own cost ---------------------------------------------------------------------------------------
@dataclass(frozen=True, slots=True)
class Decisions:
    """An index of ``count`` translated policies and the destination workload and connection to ask it about."""

    count: int
    index: PolicyIndex
    workload: Workload
    connection: Connection

    @property
    def applying(self) -> int:
        return len(self.index.find_for(self.workload)[0])


def decisions(count: int) -> Decisions:
    """Translate the first ``count`` policies as the control plane does; list the selector ones on the workload."""
    import ipaddress

    policies: list[Policy] = []
    listed: list[str] = []
    for obj in policy_objects(count):
        translated = translate_authorization_policy(obj)
        if translated.policy is None:
            raise PolicyBenchError(f"the translation dropped {_key(obj)}: {translated.status}")
        policies.append(translated.policy)
        if translated.selection is not None and translated.selection.selects(DEST_NAMESPACE, DEST_LABELS):
            listed.append(translated.selection.key)
    destination = ipaddress.ip_address("198.18.2.10")
    workload = Workload(
        uid="Kubernetes//Pod/bench-amb/amb-srv",
        name="amb-srv",
        namespace=DEST_NAMESPACE,
        addresses=(destination,),
        authorization_policies=tuple(sorted(listed)),
    )
    connection = Connection(
        source_ip=ipaddress.ip_address("198.18.1.10"),
        source_identity=SpiffeId(TRUST_DOMAIN, CLIENT_NAMESPACE, CLIENT_ACCOUNT),
        destination_ip=destination,
        destination_port=9000,
    )
    return Decisions(count, PolicyIndex(policies), workload, connection)


def time_decisions(setup: Decisions, decisions_per_timing: int, repeats: int = MICRO_REPEATS) -> list[float]:
    """µs per :meth:`PolicyIndex.check`, one figure per timing; every decision must allow (the set lets the client
    in; a benchmark of a refusal would measure a different path)."""
    check, workload, conn = setup.index.check, setup.workload, setup.connection
    decision = check(workload, conn)
    if not decision.allowed:
        raise PolicyBenchError(f"the client is refused under {setup.count} policies: {decision.reason}")
    timings = []
    for _ in range(repeats):
        started = time.perf_counter()
        for _ in range(decisions_per_timing):
            check(workload, conn)
        timings.append((time.perf_counter() - started) / decisions_per_timing * 1e6)
    return timings


def measure_decisions(report: Report, profile: Profile, counts: Sequence[int] = COUNTS) -> dict[int, float]:
    """Scenario "decision": µs per decision per policy count (median of the timings, interleaved by count)."""
    setups = {count: decisions(count) for count in counts}
    timings: dict[int, list[float]] = {count: [] for count in counts}
    for _ in range(MICRO_REPEATS):
        for count, setup in setups.items():
            timings[count].extend(time_decisions(setup, profile.micro_decisions, repeats=1))
    medians = {count: statistics.median(values) for count, values in timings.items()}
    base = medians[counts[0]]
    for count in counts:
        values = timings[count]
        note = f"{setups[count].applying} apply to the destination; {min(values):.2f}–{max(values):.2f} µs"
        report.add(
            Measurement(
                "decision (PolicyIndex.check, in-process)",
                f"{_policies(count)}",
                medians[count],
                "µs",
                base if count != counts[0] else None,
                _policies(counts[0]),
                note,
            )
        )
    return medians


def _policies(count: int) -> str:
    return f"{count:,} policies"


# -- 2. to 5. the lab -------------------------------------------------------------------------------------------------
CLIENT = """
import socket, sys, time
host, port, interval = sys.argv[1], int(sys.argv[2]), float(sys.argv[3])
def one():
    try:
        with socket.create_connection((host, port), timeout=2) as s:
            s.settimeout(2)
            s.sendall(b"x")
            return s.recv(1) == b"x"
    except OSError:
        return False
state = None
while True:
    ok = one()
    if ok != state:
        print("open" if ok else "refused", time.monotonic(), flush=True)
        state = ok
    time.sleep(interval)
"""
"""The DENY client: a new connection every ``interval`` s; prints ``open|refused <monotonic>`` on each change
(CLOCK_MONOTONIC is one clock for every process of the machine, network namespaces included)."""


@dataclass
class Lab:
    """What the lab part needs of :class:`bench.mesh.topology.BenchLab`, plus the policy writes and the settling."""

    bench: BenchLab
    procs: Processes
    log: Callable[[str], None]
    present: int = 0
    """How many of :func:`policy_objects` are in the cluster."""
    busy: list[int] = field(default_factory=list)
    """Policy counts measured while the control plane had not gone quiet (:meth:`_quiet`)."""

    @property
    def kubeconfig(self) -> Path:
        return Path(self.bench.topology.kubeconfig)

    def node_proxy(self, node: int) -> int:
        """The pid of node ``node``'s node proxy (the ztunnel DaemonSet's container on that node)."""
        pids = self.bench.node_proxy_pids_by_node().get(self.bench.topology.node(node).name, [])
        if len(pids) != 1:
            raise PolicyBenchError(f"expected one node proxy on node {node}, found {pids}")
        return pids[0]

    def control_plane(self) -> list[int]:
        """The pids whose CPU going quiet means a push settled: the control plane (istiod's pod), the API server,
        and the lab's controllers."""
        lab = str(self.bench.topology.path)
        hosted = {pid for role in ("apiserver", "controllers") for pid in find_pids("ambit.cli", role, lab)}
        return sorted(hosted | set(self.bench.control_plane_pids()))

    def policies_on(self, node: int) -> int:
        """How many policies node ``node``'s proxy holds (its admin port, on 127.0.0.1 of its pod's netns)."""
        done = subprocess.run(
            ["nsenter", "-t", str(self.node_proxy(node)), "-n", "curl", "-sf", "http://127.0.0.1:15000/config_dump"],
            capture_output=True,
            text=True,
            timeout=30,
            check=False,
        )
        if done.returncode != 0:
            return -1
        return len(json.loads(done.stdout).get("policies") or ())

    def set_policies(self, count: int) -> dict[str, float]:
        """Create or delete policies until the first ``count`` are in the cluster; wait until settled; timings."""
        wanted = policy_objects(max(count, self.present))
        cpu = cpu_seconds(self.control_plane())
        started = time.monotonic()
        if count > self.present:
            asyncio.run(_write(self.kubeconfig, wanted[self.present : count], create=True))
        elif count < self.present:
            asyncio.run(_write(self.kubeconfig, wanted[count : self.present], create=False))
        written = time.monotonic()
        changed = abs(count - self.present)
        self.present = count
        deadline = written + SETTLE_TIMEOUT
        while (seen := self.policies_on(2)) != count:
            if time.monotonic() > deadline:
                raise PolicyBenchError(f"node 2's proxy lists {seen} policies, not {count}, {SETTLE_TIMEOUT:.0f} s on")
            time.sleep(SETTLE_POLL)
        pushed = time.monotonic()
        if not self._quiet():
            self.busy.append(count)
        quiet = time.monotonic()
        cpu = cpu_seconds(self.control_plane()) - cpu
        self.log(
            f"{count:,} policies ({changed:,} written in {written - started:.1f} s; node 2 has them "
            f"{pushed - written:.1f} s later; quiet {quiet - pushed:.1f} s later; {cpu:.0f} CPU-s)"
        )
        return {
            "write": written - started,
            "push": pushed - written,
            "total": pushed - started,
            "quiet": quiet - pushed,
            "cpu": cpu,
        }

    def _quiet(self) -> bool:
        """Wait until the control plane and the API server use under :data:`QUIET_CPU` of a CPU over a second;
        False (logged) when they never do within :data:`QUIET_TIMEOUT` s (measured anyway: the table says so)."""
        deadline = time.monotonic() + QUIET_TIMEOUT
        while time.monotonic() < deadline:
            pids = self.control_plane()
            try:
                before = cpu_seconds(pids)
                time.sleep(1.0)
                used = cpu_seconds(pids) - before
            except ProbeError:
                continue
            if used < QUIET_CPU:
                return True
        self.log(f"the control plane, API server or lab controllers were still busy {QUIET_TIMEOUT:.0f} s on")
        return False


async def _write(kubeconfig: Path, objects: Sequence[dict[str, Any]], *, create: bool) -> None:
    queue = iter(objects)

    async def writer(client: KubeClient) -> None:
        for obj in queue:
            meta = obj["metadata"]
            if create:
                await client.create(kinds.AUTHORIZATION_POLICIES, obj, meta["namespace"])
            else:
                await client.delete(kinds.AUTHORIZATION_POLICIES, meta["name"], meta["namespace"])

    async with KubeClient.from_kubeconfig(kubeconfig) as client:
        await asyncio.gather(*(writer(client) for _ in range(WRITERS)))


def _namespaces() -> str:
    return "\n".join(
        json.dumps({"apiVersion": "v1", "kind": "Namespace", "metadata": {"name": spread_namespace(i)}})
        for i in range(SPREAD_NAMESPACES)
    )


def _pin(lab: Lab, *, on: bool = True) -> None:
    """Node 1's proxy (and the latency client, see ``bench.mesh.scenarios``) on vCPU 0, node 2's proxy and the
    sockperf server on vCPU 1, as the data-path benchmark does for its latency scenarios (``on=False`` undoes it)."""

    every = set(range(os.cpu_count() or 1))
    if len(every) < 2:
        return
    server = lab.bench.netns["amb-srv"]
    sockperf = [
        pid
        for pid in find_pids("sockperf", "sr")
        if subprocess.run(
            ["ip", "netns", "identify", str(pid)], capture_output=True, text=True, check=False
        ).stdout.strip()
        == server
    ]
    for cpu, pids in ((0, [lab.node_proxy(1)]), (1, [lab.node_proxy(2), *sockperf])):
        for pid in pids:
            _set_affinity(pid, {cpu} if on else every)


def _start_server(lab: Lab) -> None:
    netns = lab.bench.netns["amb-srv"]
    lab.procs.start(netns, ["sockperf", "sr", "--tcp", "-p", str(APP_PORTS["sockperf"])], "srv-sockperf")
    lab.procs.start(netns, [sys.executable, "-m", "bench.mesh.apps", "echo", "--port", "9000"], "srv-echo")
    _listening(netns, {APP_PORTS["sockperf"], APP_PORTS["echo"]})


def _route(lab: Lab) -> Route:
    pids = (lab.node_proxy(1), lab.node_proxy(2))
    return Route("ambit", lab.bench.netns["amb-cli"], lab.bench.ips["amb-srv"], dict(APP_PORTS), pids)


@dataclass
class Figures:
    """Each (metric, policy count)'s samples over the rounds, and each metric's unit."""

    samples: dict[tuple[str, int], list[float]]
    units: dict[str, str]

    def add(self, metric: str, count: int, value: float, unit: str) -> None:
        self.samples.setdefault((metric, count), []).append(value)
        self.units[metric] = unit


def measure_lab(lab: Lab, profile: Profile, report: Report) -> dict[str, Any]:
    """Scenarios 2 to 5 on a lab with its pods; adds to ``report``; returns the goal's figures."""
    _start_server(lab)
    lab.bench.reuse_time_wait()
    lab.bench.kubectl("apply", "-f", "-", input=_namespaces())
    route = _route(lab)
    check_mesh(lab.bench, route)
    _pin(lab)
    figures = Figures({}, {})
    rss: dict[tuple[int, int], list[float]] = {}
    push: dict[str, float] = {}
    for round_number in range(profile.rounds):
        for count in COUNTS:
            timings = lab.set_policies(count)
            if count == COUNTS[-1] and round_number == 0:
                push = timings
            if round_number == 0 or count != 0:
                for node in (1, 2):
                    rss.setdefault((node, count), []).append(rss_bytes([lab.node_proxy(node)]) / 2**20)
            route = _route(lab)
            for sample in scenarios.connection_rate(route, "rate", profile.rate_seconds, profile.rate_concurrency):
                figures.add("new connections", count, sample.value, "/s")
                if sample.cpu is not None:
                    figures.add("node proxies' CPU per new connection", count, sample.cpu, "µs")
            for sample in scenarios.latency(route, "rr", 14, profile.rr_seconds):
                if sample.metric in ("p50", "p99"):
                    figures.add(f"request/response 14 B, {sample.metric}", count, sample.value, "µs")
                    if sample.cpu is not None and sample.metric == "p50":
                        figures.add("node proxies' CPU per round trip", count, sample.cpu, "µs")
        lab.log(f"round {round_number + 1} of {profile.rounds} done")
    goal = _report_lab(report, figures, rss, push)
    if lab.busy:
        counts = ", ".join(_policies(c) for c in lab.busy)
        report.notes.append(f"Measured while the control plane was still busy {QUIET_TIMEOUT:.0f} s on: {counts}.")
    _pin(lab, on=False)
    deny = measure_deny(lab, profile, report)
    goal["deny_median_s"] = deny
    return goal


def _report_lab(
    report: Report, figures: Figures, rss: dict[tuple[int, int], list[float]], push: dict[str, float]
) -> dict[str, Any]:
    scenario = "through the mesh, cross-node"
    goal: dict[str, Any] = {}
    metrics = list(dict.fromkeys(metric for metric, _ in figures.samples))
    for metric in metrics:
        base = statistics.median(figures.samples[(metric, 0)])
        for count in COUNTS:
            values = figures.samples[(metric, count)]
            value = statistics.median(values)
            spread = f"{_policies(count)}; {len(values)} rounds, {min(values):.1f}–{max(values):.1f}"
            report.add(
                Measurement(
                    scenario,
                    metric,
                    value,
                    figures.units[metric],
                    base if count else None,
                    _policies(0),
                    spread,
                )
            )
            if count == COUNTS[-1] and base > 0:
                goal[metric] = value / base
    for node in (1, 2):
        base = statistics.median(rss[(node, 0)])
        for count in (0, COUNTS[-1]):
            value = statistics.median(rss[(node, count)])
            what = "destination" if node == 2 else "source"
            report.add(
                Measurement(
                    "node proxy memory (RSS, settled)",
                    f"node {node} ({what})",
                    value,
                    "MiB",
                    base if count else None,
                    _policies(0),
                    _policies(count) + ("; first round, before any policy existed" if not count else ""),
                )
            )
    if push:
        added = COUNTS[-1] - COUNTS[-2]
        report.add(Measurement("push", f"{added:,} policies written to the API server", push["write"], "s"))
        report.add(Measurement("push", "last write → the destination's node proxy has all", push["push"], "s"))
        report.add(Measurement("push", "first write → the destination's node proxy has all", push["total"], "s"))
        quiet = "the control plane, API server and lab controllers quiet"
        report.add(Measurement("push", f"the proxy has all → {quiet}", push["quiet"], "s"))
        report.add(Measurement("push", "CPU of those three, first write → quiet", push["cpu"], "s"))
    return goal


def deny_policy() -> dict[str, Any]:
    """The namespace-wide DENY of scenario 5: every connection from the client's namespace to the destination's."""
    rules = [{"from": [{"source": {"namespaces": [CLIENT_NAMESPACE]}}]}]
    return _policy(DENY_NAME, DEST_NAMESPACE, {"action": "DENY", "rules": rules})


def measure_deny(lab: Lab, profile: Profile, report: Report) -> float:
    """Scenario 5: ``kubectl apply`` of a DENY → the first refused connection; ``kubectl delete`` → open again."""
    deny = deny_policy()
    netns, host = lab.bench.netns["amb-cli"], lab.bench.ips["amb-srv"]
    client = lab.procs.start(
        netns, [sys.executable, "-c", CLIENT, host, "9000", str(RETRY_INTERVAL)], "deny-client", stdin=subprocess.PIPE
    )
    applied: list[float] = []
    lifted: list[float] = []
    try:
        _expect(client, "open", 30)
        for _ in range(profile.deny_tries):
            began = time.monotonic()
            lab.bench.kubectl("apply", "-f", "-", input=json.dumps(deny))
            applied.append(_expect(client, "refused", 30) - began)
            began = time.monotonic()
            lab.bench.kubectl("delete", "authorizationpolicy", "-n", DEST_NAMESPACE, DENY_NAME)
            lifted.append(_expect(client, "open", 30) - began)
            time.sleep(0.5)
    finally:
        lab.procs.stop(client)
        lab.procs.started.remove(client)
    scenario = f"DENY enforced (client connecting every {RETRY_INTERVAL * 1000:.0f} ms; {_policies(lab.present)})"
    for metric, values in (
        ("kubectl apply → first refused connection", applied),
        ("kubectl delete → connections go through again", lifted),
    ):
        note = f"median of {len(values)}; {min(values):.3f}–{max(values):.3f} s"
        report.add(Measurement(scenario, metric, statistics.median(values), "s", note=note))
    lab.log(f"DENY: {[round(v, 3) for v in applied]} s; lifted: {[round(v, 3) for v in lifted]} s")
    return statistics.median(applied)


def _expect(proc: subprocess.Popen[str], state: str, timeout: float) -> float:
    """The time of the client's next change of state, which must be to ``state`` within ``timeout`` s."""
    assert proc.stdout is not None
    ready, _, _ = select.select([proc.stdout], [], [], timeout)
    line = proc.stdout.readline() if ready else ""
    if not line:
        raise PolicyBenchError(f"the DENY client did not go {state} within {timeout:g} s")
    seen, stamp = line.split()
    if seen != state:
        raise PolicyBenchError(f"the DENY client went {seen}, expected {state}")
    return float(stamp)


# -- the run ----------------------------------------------------------------------------------------------------------
NOTES = [
    "Policy sets: 5 apply to the destination (2 namespace-wide, 3 selecting it; all let the client in, so each "
    f"connection evaluates all 5), the rest spread over {SPREAD_NAMESPACES} other namespaces; 100 is a prefix of "
    "10,000. Ratios are to the 0-policy median of the same run; rounds interleave 0, 100, 10,000.",
    "New connections: 8 concurrent clients in amb-cli (node 1), each connecting to amb-srv (node 2), echoing 1 byte "
    "and closing (pooled HBONE: one HTTP/2 stream per connection); request/response: sockperf ping-pong, 14 B; node "
    "1's proxy and the client on vCPU 0, node 2's proxy and the server on vCPU 1.",
    "A set is settled when node 2's proxy lists that many policies in /config_dump and then the control plane, the API "
    "server and the lab's controllers use under 10% of a CPU over a second (or 300 s passed: noted below).",
    "RSS with 0 policies is from the first round (before any policy existed); with 10,000 the median over rounds.",
]


def run(profile: Profile, out: Path | None, *, echo: bool = True, lab: bool = True) -> Report:
    """The micro-benchmark, then (``lab``) the lab part; writes policy.md and policy.json to ``out``."""
    report = Report("ambit L4 policy", profile.name, notes=list(NOTES))
    started = time.monotonic()

    def log(line: str) -> None:
        if echo:
            print(f"[{time.monotonic() - started:5.0f} s] {line}", file=sys.stderr, flush=True)

    medians = measure_decisions(report, profile)
    log("decision: " + ", ".join(f"{_policies(c)} {v:.2f} µs" for c, v in medians.items()))
    goal: dict[str, Any] = {"decision_us": {str(c): v for c, v in medians.items()}}
    if lab:
        goal |= _run_lab(profile, report, log)
        report.notes.append(_verdict(goal))
    report.env["loadavg_end"] = os.getloadavg()[0]
    report.env["seconds"] = round(time.monotonic() - started, 1)
    if echo:
        print(report.markdown())
    if out is not None:
        md, js = report.write(out, "policy")
        log(f"written: {md} and {js}")
    return report


def _run_lab(profile: Profile, report: Report, log: Callable[[str], None]) -> dict[str, Any]:
    if os.geteuid() != 0:
        raise PolicyBenchError("the lab part needs root (use --micro-only without it)")
    ensure_tools()
    with tempfile.TemporaryDirectory(prefix="ambit-bench-policy-") as tmp_name:
        tmp = Path(tmp_name)
        procs = Processes(tmp)
        with bench_lab(tmp) as bench:
            try:
                log(f"lab {bench.topology.lab_id} up")
                bench.create_pods(False)
                log("pods Ready")
                return measure_lab(Lab(bench, procs, log), profile, report)
            finally:
                procs.stop_all()


def _verdict(goal: dict[str, Any]) -> str:
    ratios = {k: v for k, v in goal.items() if isinstance(v, float) and k != "deny_median_s"}
    parts = []
    for metric, ratio in ratios.items():
        lower_is_better = "µs" in metric or "request/response" in metric or "CPU" in metric
        within = ratio <= 1 + GOAL_RATIO if lower_is_better else ratio >= 1 - GOAL_RATIO
        parts.append(f"{metric} {ratio:.3f}× ({'met' if within else 'NOT met'})")
    deny = goal.get("deny_median_s")
    if deny is not None:
        parts.append(f"DENY {deny:.3f} s ({'met' if deny < GOAL_DENY_SECONDS else 'NOT met'})")
    return "Goal (10,000 policies within 5% of 0, DENY under 1 s): " + "; ".join(parts) + "."


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m bench.policy", description=__doc__.split("\n")[0])
    parser.add_argument("--quick", action="store_const", const="quick", default="full", dest="profile")
    parser.add_argument("--micro-only", action="store_true", help="only the in-process decision benchmark (no root)")
    parser.add_argument("--out", type=Path, default=RESULTS, help="where policy.md and policy.json go")
    args = parser.parse_args(argv)
    # A SIGTERM (an impatient caller) unwinds like an error: the lab comes down and temporary files go.
    signal.signal(signal.SIGTERM, lambda signum, frame: sys.exit(128 + signum))
    try:
        run(PROFILES[args.profile], args.out, lab=not args.micro_only)
    except AmbitError as exc:
        print(f"bench.policy: {exc}", file=sys.stderr)
        return 1
    return 0


if __name__ == "__main__":
    sys.exit(main())
