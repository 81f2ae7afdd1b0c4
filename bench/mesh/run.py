"""The orchestration: set up, measure every scenario in every mode (interleaved), write the results, tear down.

Order of a run: install missing tools (apt), lab up with the mesh (holding the lab lock), pods, servers in the
server pods (iperf3, sockperf, the echo app), the stunnel and haproxy pairs, a check that ``ambit`` traffic really
crosses both node proxies (node 2 reports it as destination); then for each scenario, ``repeats`` rounds over the
modes in the same order. The cold-handshake scenario comes after the pooled connection rate and compares full
handshakes only: the stunnel and haproxy pairs are restarted without TLS session resumption (``resume=False`` in
:mod:`bench.mesh.tunnels`: no session offered, no ticket issued, no session cache) and the node proxies with
:data:`COLD_FLAGS` (one stream per pooled connection, closed when it ends, so every tunnel makes a full mutual-TLS
handshake; ambit never resumes), ``ambit`` is measured interleaved with ``direct``, ``stunnel`` and ``haproxy-tls``,
and both pairs and the proxies are restarted once more with their defaults for the scenarios that follow (routes
are rebuilt after each restart: they hold the pids whose CPU and memory are read). The flow log's cost comes next:
the ambit route's pooled connection rate with the node proxies' flow ring (their default) and without it
(:data:`FLOW_LOG_OFF`), in alternating order, reported as a ratio in the notes and the JSON's environment
(``flow_log_on_over_off``). Whatever happens, every
started process is ended by its pid and the lab is brought down; temporary files (certificates, configurations,
logs) live in one temporary directory that is removed.
"""

# ruff: noqa: RUF001, RUF003 - the tables use × and en dashes on purpose

from __future__ import annotations

import argparse
import contextlib
import dataclasses
import datetime
import os
import platform
import shlex
import shutil
import ssl
import subprocess
import sys
import tempfile
import time
from collections.abc import Callable
from functools import partial
from pathlib import Path
from typing import Any

from ambit.errors import AmbitError
from bench.mesh import chart, scenarios
from bench.mesh.probes import ProbeError, find_pids, peak_rss_bytes, rss_bytes, with_descendants
from bench.mesh.profile import AMBIT, DIRECT, HAPROXY, MODES, PASSTHROUGH, PROFILES, PROXY_MODES, STUNNEL, Profile
from bench.mesh.results import Row, Sample, aggregate, json_lines, markdown
from bench.mesh.scenarios import Route
from bench.mesh.topology import BenchLab, BenchLabError, Processes, bench_lab
from bench.mesh.tunnels import APP_PORTS, TunnelKind, haproxy_config, make_credentials, stunnel_config
from bench.mesh.tunnels import HAPROXY as HAPROXY_KIND
from bench.mesh.tunnels import STUNNEL as STUNNEL_KIND

REPO = Path(__file__).resolve().parents[2]
RESULTS = REPO / "bench" / "results"
APT_PACKAGES = {
    "iperf3": "iperf3",
    "stunnel4": "stunnel",
    "haproxy": "haproxy",
    "sockperf": "sockperf",
    "nghttp2-client": "h2load",  # bench.l7's load generator
}
NOTES = [
    "Client pod on node 1, server pod on node 2 unless the scenario says 'same node'; all modes in one run, "
    "interleaved; median of the repeats, min–max across them; ratios to direct and stunnel of this run.",
    "Latency is sockperf's full round trip with 14-byte messages (sockperf's smallest, its header) or 1 KiB; "
    "'fixed rate' is sockperf under-load (open loop at a set message rate, every message answered).",
    "Proxy CPU is user+system time from /proc of the proxies on the path: both node proxies for ambit modes, "
    "both stunnel or both haproxy processes otherwise. Per connection for the idle scenario it is set-up CPU.",
    "Idle connections: the growth of the proxies' summed RSS while N connections are held, divided by N; the "
    "mode's proxies are restarted before each round (a process keeps and reuses the memory an earlier round freed). "
    "A baseline that cannot hold N connections with its default limits is left out of that table.",
    "Every pod namespace has net.ipv4.tcp_tw_reuse=1: without it the connection-rate scenarios exhaust the "
    "clients' ephemeral ports with TIME_WAIT sockets after a few runs and measure the kernel's port search.",
    "New connections: every mode runs with its defaults, so stunnel and haproxy resume TLS sessions between their "
    "own connections (session cache, TLS 1.3 tickets: most of theirs are abbreviated handshakes) and an ambit "
    "connection is an HTTP/2 stream on a pooled mutual-TLS connection (ambit never resumes: no tickets, no session "
    "cache). 'Cold handshake': nobody resumes, every proxied connection is a full TLS 1.3 ECDSA mutual-TLS "
    "handshake: the stunnel pair is restarted with sessionResume = no on both sides (the server side then sends no "
    "ticket and keeps no cache), the haproxy pair with no-ssl-reuse, no-tls-tickets and tune.ssl.cachesize 0, the "
    "node proxies with --pool-max-streams=1 --pool-idle-timeout=0; all are restarted with their defaults after it.",
    "The same-node variant runs direct, ambit and ambit-passthrough only (no tunnel pair to a same-node server).",
    "Latency scenarios give each node its own vCPU, the same way in every mode, as two machines would: node 1's "
    "proxy, the stunnel and haproxy clients and the sockperf client on vCPU 0, node 2's proxy, the tunnel servers "
    "and the sockperf servers on vCPU 1 (same-node: all on vCPU 0). Left to the scheduler, a round trip's four "
    "processes were placed differently per mode and per rate: at a fixed rate nearly every wake-up landed on the "
    "waker's vCPU, so a proxy's work after its send delayed the next hop, and sockperf's under-load client, which "
    "busy-waits between sends, held up whatever shared its vCPU until the next scheduler tick. The 'unpinned' "
    "closed-loop scenarios measure the same round trips with every process left to the scheduler.",
]


COLD_SCENARIO = "new connections, 1-byte echo, cold handshake"
COLD_FLAGS = ("--pool-max-streams=1", "--pool-idle-timeout=0")
"""The node proxies' flags for the cold-handshake scenario: a connection per tunnel, closed when the tunnel ends."""
COLD_MODES = (DIRECT, STUNNEL, HAPROXY, AMBIT)
FLOW_LOG_SCENARIO = "new connections, 1-byte echo, flow log on and off"
NO_FLOW_LOG = "ambit, no flow log"
FLOW_LOG_OFF = ("--flow-log-size=0",)
"""The node proxies' flags without the flow log (admin ``/flows``, ``ambit flows``): its cost, side by side."""


class BenchSetupError(AmbitError):
    """The machine lacks what the benchmark needs (root, tools)."""


def ensure_tools() -> None:
    missing = [pkg for pkg, binary in APT_PACKAGES.items() if shutil.which(binary) is None]
    if not missing:
        return
    print(f"apt-get install: {' '.join(missing)}", file=sys.stderr)
    env = dict(os.environ, DEBIAN_FRONTEND="noninteractive")
    subprocess.run(["apt-get", "update", "-qq"], check=False, env=env)
    done = subprocess.run(["apt-get", "install", "-y", "-qq", *missing], check=False, env=env, capture_output=True)
    if done.returncode != 0:
        raise BenchSetupError(f"apt-get install {' '.join(missing)} failed: {done.stderr.decode()[-300:]}")


def _version(argv: list[str]) -> str:
    try:
        done = subprocess.run(argv, capture_output=True, text=True, timeout=10, check=False)
    except OSError:
        return "missing"
    text = (done.stdout + done.stderr).strip().splitlines()
    return text[0].strip() if text else "?"


CPUIDLE = Path("/sys/devices/system/cpu/cpuidle")
HALTPOLL_WINDOW = Path("/sys/module/haltpoll/parameters/guest_halt_poll_ns")


def cpuidle() -> str:
    """How an idle vCPU waits: the cpuidle driver, and for a guest's ``haltpoll`` its poll window. On a VM that
    halts at once (window 0) every wake-up costs an exit to the host, which doubled the round trip and its CPU on
    session 46's machine (docs/native-data-path.md): the figures are comparable only with the same setting."""
    try:
        driver = (CPUIDLE / "current_driver").read_text().strip()
    except OSError:
        return "unknown"
    if driver == "haltpoll":
        try:
            return f"haltpoll, guest poll window {HALTPOLL_WINDOW.read_text().strip()} ns"
        except OSError:
            return driver
    return driver


def tcp_congestion() -> str:
    """The machine's TCP congestion control, and the one the lab's namespaces run with when it differs
    (:mod:`ambit.lab.network.congestion`): under ``bbr``'s pacing on the lab's links one bulk stream through the mesh
    moved 0.6x, at 1.8x the node proxies' CPU per byte (session 47), so figures compare only with the same setting."""
    from ambit.lab.network.congestion import machine_congestion_sysctls

    try:
        machine = Path("/proc/sys/net/ipv4/tcp_congestion_control").read_text().strip()
    except OSError:
        return "unknown"
    lab = machine_congestion_sysctls()
    return f"{machine}, the lab's namespaces {lab[0].split('=', 1)[1]}" if lab else machine


def environment() -> dict[str, Any]:
    from importlib.metadata import PackageNotFoundError, version

    try:
        uv = f"{version('uvloop')} (the node proxy's default event loop)"
    except PackageNotFoundError:
        uv = "not used"
    model = next(
        (
            line.split(":", 1)[1].strip()
            for line in Path("/proc/cpuinfo").read_text().splitlines()
            if "model name" in line
        ),
        platform.processor() or "unknown",
    )
    return {
        "kernel": platform.release(),
        "vcpus": os.cpu_count(),
        "cpu_model": model,
        "python": platform.python_version(),
        "openssl": ssl.OPENSSL_VERSION,
        "cipher": "TLS 1.3, OpenSSL's default suite order in every tunnel (TLS_AES_256_GCM_SHA384), ECDSA P-256",
        "http2": f"ambit.hbone (own engine), hpack {version('hpack')}",
        "uvloop": uv,
        "iperf3": _version(["iperf3", "--version"]),
        "stunnel": _version(["stunnel", "-version"]),
        "haproxy": _version(["haproxy", "-v"]),
        "sockperf": _version(["sockperf", "--version"]),
        "loadavg": os.getloadavg()[0],
        "cpuidle": cpuidle(),
        "tcp_congestion": tcp_congestion(),
        "time": datetime.datetime.now(datetime.UTC).strftime("%Y-%m-%d %H:%M UTC"),
    }


def _listening(netns: str, ports: set[int], timeout: float = 20.0) -> None:
    deadline = time.monotonic() + timeout
    while True:
        out = subprocess.run(
            ["ip", "netns", "exec", netns, "ss", "-Hltn"], capture_output=True, text=True, check=False
        ).stdout
        seen = {int(line.split()[3].rsplit(":", 1)[1]) for line in out.splitlines() if line.strip()}
        if ports <= seen:
            return
        if time.monotonic() > deadline:
            raise BenchLabError(f"nothing listens on {sorted(ports - seen)} in {netns}")
        time.sleep(0.1)


def start_servers(lab: BenchLab, procs: Processes, server: str) -> None:
    ns = lab.netns[server]
    procs.start(ns, ["iperf3", "-s", "-p", str(APP_PORTS["iperf3"])], f"{server}-iperf3")
    procs.start(ns, ["sockperf", "sr", "--tcp", "-p", str(APP_PORTS["sockperf"])], f"{server}-sockperf")
    procs.start(ns, [sys.executable, "-m", "bench.mesh.apps", "echo", "--port", "9000"], f"{server}-echo")
    _listening(ns, set(APP_PORTS.values()))


class TunnelPairs:
    """The stunnel and haproxy pairs (client side in ``plain-cli``, server side in ``plain-srv``), restartable.

    :meth:`restart` ends the four processes by their pids and starts them again on the same ports with
    configurations rendered for ``resume`` (:func:`~bench.mesh.tunnels.stunnel_config`); routes hold the pids
    (CPU and memory are read from them), so a caller rebuilds its routes after a restart.
    """

    KINDS = (
        (STUNNEL_KIND, stunnel_config, ("stunnel",)),
        (HAPROXY_KIND, haproxy_config, ("haproxy", "-db", "-f")),
    )

    def __init__(self, lab: BenchLab, procs: Processes, tmp: Path) -> None:
        self.lab, self.procs, self.tmp = lab, procs, tmp
        self.creds = make_credentials(tmp)
        self.running: dict[str, tuple[subprocess.Popen[str], ...]] = {}

    @property
    def pids(self) -> dict[str, tuple[int, ...]]:
        return {name: tuple(proc.pid for proc in procs) for name, procs in self.running.items()}

    def start(self, *, resume: bool = True) -> None:
        """Start both pairs with configurations rendered for ``resume``; return once every side listens."""
        server_ip, cli, srv = self.lab.ips["plain-srv"], self.lab.netns["plain-cli"], self.lab.netns["plain-srv"]
        for kind, render, argv in self.KINDS:
            started = []
            for side, netns in (("server", srv), ("client", cli)):
                config = self.tmp / f"{kind.name}-{side}.conf"
                config.write_text(render(self.creds, client=side == "client", server_ip=server_ip, resume=resume))
                started.append(self.procs.start(netns, [*argv, str(config)], f"{kind.name}-{side}"))
            self.running[kind.name] = tuple(started)
            _listening(srv, {kind.tls_port(app) for app in APP_PORTS})
            _listening(cli, {kind.local_port(app) for app in APP_PORTS})

    def restart(self, *, resume: bool, log: Callable[[str], None]) -> None:
        """End every process of both pairs (by pid, waited for), then :meth:`start` them again with ``resume``."""
        began = time.monotonic()
        for procs in self.running.values():
            for proc in procs:
                self.procs.stop(proc)
                self.procs.started.remove(proc)
        self.running.clear()
        self.start(resume=resume)
        what = "with session resumption (their defaults)" if resume else "without session resumption"
        log(f"stunnel and haproxy restarted {what}: {time.monotonic() - began:.1f} s (pids {self.pids})")


def routes(lab: BenchLab, tunnels: dict[str, tuple[int, ...]], server_suffix: str = "") -> dict[str, Route]:
    """Every mode's route, with the node proxies' current pids and the tunnel pairs' ``tunnels`` (kind → pids)."""
    proxies = tuple(with_descendants(lab.node_proxy_pids()))  # with their workers, if any
    plain, amb = f"plain-srv{server_suffix}", f"amb-srv{server_suffix}"

    def tunnel(kind: TunnelKind) -> Route:
        ports = {app: kind.local_port(app) for app in APP_PORTS}
        return Route(kind.name, lab.netns["plain-cli"], "127.0.0.1", ports, tunnels[kind.name])

    found = {
        DIRECT: Route(DIRECT, lab.netns["plain-cli"], lab.ips[plain], dict(APP_PORTS), ()),
        AMBIT: Route(AMBIT, lab.netns["amb-cli"], lab.ips[amb], dict(APP_PORTS), proxies),
        PASSTHROUGH: Route(PASSTHROUGH, lab.netns["amb-cli"], lab.ips[plain], dict(APP_PORTS), proxies),
    }
    if not server_suffix:
        found[STUNNEL], found[HAPROXY] = tunnel(STUNNEL_KIND), tunnel(HAPROXY_KIND)
    return {mode: found[mode] for mode in MODES if mode in found}


def _set_affinity(pid: int, cpus: set[int]) -> None:
    """Every thread of ``pid`` (threads it starts later inherit the creating thread's mask)."""
    for task in Path(f"/proc/{pid}/task").iterdir():
        with contextlib.suppress(ProcessLookupError):
            os.sched_setaffinity(int(task.name), cpus)


def pin_nodes(lab: BenchLab, tunnels: TunnelPairs, *, on: bool = True) -> None:
    """Give each node one vCPU for the latency scenarios, the same way for every mode (``on=False`` undoes it).

    Node 1 (vCPU 0): the client (``scenarios.CLIENT_NODE_CPU``), node 1's proxy, the stunnel and haproxy clients;
    node 2 (vCPU 1): node 2's proxy, the stunnel and haproxy servers, the sockperf servers. Left to the scheduler,
    the four processes of a round trip placed themselves differently per mode and per message rate (at a fixed
    rate nearly every wake-up landed on the waker's vCPU, so one proxy's CPU after its send delayed the next hop).
    """
    every = set(range(os.cpu_count() or 1))
    if len(every) < 2:  # one vCPU: nothing to separate
        return
    proxies = lab.node_proxy_pids_by_node()
    node = {n: with_descendants(proxies.get(lab.topology.node(n).name, [])) for n in (1, 2)}
    for server, client in tunnels.running.values():
        node[1].append(client.pid)
        node[2].append(server.pid)
    node_of_netns = {lab.netns[pod]: 2 for pod in ("plain-srv", "amb-srv")}
    node_of_netns |= {lab.netns[pod]: 1 for pod in ("plain-srv-local", "amb-srv-local") if pod in lab.netns}
    for pid in find_pids("sockperf", "sr"):
        netns = subprocess.run(["ip", "netns", "identify", str(pid)], capture_output=True, text=True, check=False)
        if (number := node_of_netns.get(netns.stdout.strip())) is not None:
            node[number].append(pid)
    for number, pids in node.items():
        for pid in pids:
            _set_affinity(pid, {number - 1} if on else every)


def check_mesh(lab: BenchLab, route: Route) -> None:
    """Wait until the ambit route carries a connection, and check node 2 saw it as an HBONE destination."""
    deadline = time.monotonic() + 60
    while True:
        try:
            scenarios.connection_rate(route, "warm-up", 0.3, 1)
            break
        except (ProbeError, subprocess.TimeoutExpired) as exc:
            if time.monotonic() > deadline:
                raise BenchLabError(f"the mesh did not carry a connection within 60 s: {exc}") from None
            time.sleep(0.5)
    text = lab.metrics(2)
    if not any('reporter="destination"' in line and "mutual_tls" in line for line in text.splitlines()):
        raise BenchLabError("node 2's proxy reports no mutual-TLS inbound connection: ambit mode is not meshed")


def restart_proxies(
    lab: BenchLab, tunnels: dict[str, tuple[int, ...]], flags: tuple[str, ...], log: Callable[[str], None]
) -> dict[str, Route]:
    """Restart the node proxies with ``flags``, wait until the ambit route carries a connection again; new routes."""
    started = time.monotonic()
    pids = lab.restart_node_proxies(flags)
    log(f"node proxies restarted with {' '.join((*lab.extra_args, *flags)) or 'their defaults'} (pids {pids})")
    found = routes(lab, tunnels)
    check_mesh(lab, found[AMBIT])
    log(f"node proxies carry traffic again: {time.monotonic() - started:.0f} s")
    return found


def _idle(route: Route, name: str, count: int, procs: Processes, log: Callable[[str], None]) -> list[Sample]:
    """An idle scenario's samples, or none when the mode cannot hold that many (its open-files limit)."""
    try:
        return scenarios.idle(route, name, count, procs)
    except ProbeError as exc:
        log(f"{name}: {route.mode} skipped: {exc}")
        return []


def measure(profile: Profile, lab: BenchLab, procs: Processes, tmp: Path, log: Callable[[str], None]) -> list[Sample]:
    for server in ("plain-srv", "amb-srv") + (("plain-srv-local", "amb-srv-local") if profile.same_node else ()):
        start_servers(lab, procs, server)
    lab.reuse_time_wait()
    tunnels = TunnelPairs(lab, procs, tmp)
    tunnels.start()
    cross = routes(lab, tunnels.pids)
    local = routes(lab, tunnels.pids, "-local") if profile.same_node else {}
    check_mesh(lab, cross[AMBIT])
    samples: list[Sample] = []
    idle_rss = {mode: rss_bytes(cross[mode].pids) for mode in PROXY_MODES}

    def interleave(name: str, where: dict[str, Route], run: Callable[[Route], list[Sample]], repeats: int = 0) -> None:
        started = time.monotonic()
        for _ in range(repeats or profile.repeats):
            for route in where.values():
                samples.extend(run(route))
        log(f"{name}: {time.monotonic() - started:.0f} s")

    for streams in profile.streams:
        name = f"bulk, {streams} stream{'s' if streams > 1 else ''}"
        interleave(name, cross, partial(scenarios.bulk, scenario=name, streams=streams, seconds=profile.bulk_seconds))
    if profile.same_node:
        name = "bulk, 1 stream, same node"
        interleave(name, local, partial(scenarios.bulk, scenario=name, streams=1, seconds=profile.bulk_seconds))
    pin_nodes(lab, tunnels)
    try:
        for size in profile.rr_sizes:
            name = f"request/response {size} B, closed loop"
            interleave(name, cross, partial(scenarios.latency, scenario=name, size=size, seconds=profile.rr_seconds))
        if profile.fixed_rate:
            name = f"request/response 14 B, fixed rate {profile.fixed_rate}/s"
            rate = profile.fixed_rate
            run = partial(scenarios.latency, scenario=name, size=14, seconds=profile.rr_seconds, rate=rate)
            interleave(name, cross, run)
        if profile.same_node:
            name = "request/response 14 B, closed loop, same node"
            interleave(name, local, partial(scenarios.latency, scenario=name, size=14, seconds=profile.rr_seconds))
    finally:
        pin_nodes(lab, tunnels, on=False)
    for size in profile.unpinned_sizes:
        name = f"request/response {size} B, closed loop, unpinned"
        interleave(name, cross, partial(scenarios.latency, scenario=name, size=size, seconds=profile.rr_seconds))
    name = "new connections, 1-byte echo"
    run = partial(
        scenarios.connection_rate, scenario=name, seconds=profile.rate_seconds, concurrency=profile.rate_concurrency
    )
    interleave(name, cross, run)
    peak_before: dict[str, int] = {}

    def remember_peaks(where: dict[str, Route]) -> None:
        """A restart resets a process's high-water mark: keep every proxy's peak so far for "RSS peak"."""
        for mode in PROXY_MODES:
            peak_before[mode] = max(peak_before.get(mode, 0), peak_rss_bytes(where[mode].pids))

    if profile.cold:
        remember_peaks(cross)
        # Like with like: nobody resumes a TLS session, every proxied connection is a full handshake.
        tunnels.restart(resume=False, log=log)
        restarted = restart_proxies(lab, tunnels.pids, COLD_FLAGS, log)
        cold = {mode: restarted[mode] for mode in COLD_MODES}
        seconds = profile.cold_seconds or profile.rate_seconds
        run = partial(
            scenarios.connection_rate, scenario=COLD_SCENARIO, seconds=seconds, concurrency=profile.rate_concurrency
        )
        interleave(COLD_SCENARIO, cold, run)
        remember_peaks(restarted)
        tunnels.restart(resume=True, log=log)
        cross = restart_proxies(lab, tunnels.pids, (), log)  # the idle scenarios read the restarted processes

    def idle_in_fresh_processes(route: Route, name: str, count: int) -> list[Sample]:
        """Restart the mode's proxies first: a process that held connections before keeps the memory it freed (the
        allocator reuses it), so a second round in the same processes would measure almost no growth."""
        nonlocal cross
        if not profile.fresh_idle:
            return _idle(route, name=name, count=count, procs=procs, log=log)
        remember_peaks(cross)
        if route.mode in (STUNNEL, HAPROXY):
            tunnels.restart(resume=True, log=log)
            cross = routes(lab, tunnels.pids)
        else:
            cross = restart_proxies(lab, tunnels.pids, (), log)
        return _idle(cross[route.mode], name=name, count=count, procs=procs, log=log)

    # The flow log's cost: the pooled connection rate of the ambit route with the node proxies' flow ring on (their
    # default) and off, alternating which comes first (off on | on off | ...) so a restart is needed only when the
    # flags change; the proxies end with their defaults.
    run = partial(
        scenarios.connection_rate,
        scenario=FLOW_LOG_SCENARIO,
        seconds=profile.rate_seconds,
        concurrency=profile.rate_concurrency,
    )
    started = time.monotonic()
    for repeat in range(profile.repeats if profile.flow_log else 0):
        for flags in (FLOW_LOG_OFF, ()) if repeat % 2 == 0 else ((), FLOW_LOG_OFF):
            if lab.proxy_flags != flags:
                remember_peaks(cross)
                cross = restart_proxies(lab, tunnels.pids, flags, log)
            route = dataclasses.replace(cross[AMBIT], mode=NO_FLOW_LOG if flags else AMBIT)
            samples.extend(run(route))
    if lab.proxy_flags:
        remember_peaks(cross)
        cross = restart_proxies(lab, tunnels.pids, (), log)
    if profile.flow_log:
        log(f"{FLOW_LOG_SCENARIO}: {time.monotonic() - started:.0f} s")

    proxied = {mode: route for mode, route in cross.items() if mode != DIRECT}
    for count in profile.idle_counts:
        name = f"{count:,} idle connections"
        interleave(name, proxied, partial(idle_in_fresh_processes, name=name, count=count), profile.idle_repeats)
    for mode in PROXY_MODES:
        pids = cross[mode].pids
        # Per process: every mode runs one proxy process per node (two), so the figure is one node's proxy, the
        # unit issue 23's start-up target and a node's sizing use (the summed figure read as one proxy's before).
        count = max(len(tuple(pids)), 1)
        samples.append(
            Sample("proxy memory", "RSS idle (at start), per process", mode, idle_rss[mode] / count / 2**20, "MiB")
        )
        peak = max(peak_before.get(mode, 0), peak_rss_bytes(pids))
        samples.append(Sample("proxy memory", "RSS peak, per process", mode, peak / count / 2**20, "MiB"))
    return samples


def flow_log_cost(rows: list[Row]) -> float | None:
    """The ambit route's connection rate with the flow log over without it (medians), if both were measured."""
    found = {r.mode: r.value for r in rows if r.scenario == FLOW_LOG_SCENARIO and r.metric == "connections/s"}
    on, off = found.get(AMBIT), found.get(NO_FLOW_LOG)
    return on / off if on is not None and off else None


def run(profile: Profile, out: Path | None, *, echo: bool = True, node_proxy_args: tuple[str, ...] = ()) -> str:
    """Run the benchmark; write latest.md, latest.json and latest.png to ``out``; return the Markdown.

    ``node_proxy_args`` are added to the node proxies' installed args before the first scenario and at every
    restart after it, so every ambit row measures that variant."""
    if os.geteuid() != 0:
        raise BenchSetupError("the data-path benchmark needs root (it brings up a lab)")
    ensure_tools()
    env = environment()
    started = time.monotonic()

    def log(line: str) -> None:
        if echo:
            print(f"[{time.monotonic() - started:5.0f} s] {line}", file=sys.stderr, flush=True)

    with tempfile.TemporaryDirectory(prefix="ambit-bench-mesh-") as tmp_name:
        tmp = Path(tmp_name)
        procs = Processes(tmp)
        with bench_lab(tmp) as lab:
            try:
                log(f"lab {lab.topology.lab_id} up")
                lab.create_pods(profile.same_node)
                log("pods Ready")
                if node_proxy_args:
                    lab.extra_args = node_proxy_args
                    pids = lab.restart_node_proxies(())
                    log(f"node proxies restarted with {' '.join(node_proxy_args)} for every scenario (pids {pids})")
                samples = measure(profile, lab, procs, tmp, log)
            finally:
                procs.stop_all()
    env["loadavg_end"] = os.getloadavg()[0]
    env["seconds"] = round(time.monotonic() - started, 1)
    rows = aggregate(samples)
    notes = list(NOTES)
    if node_proxy_args:
        env["node_proxy_args"] = list(node_proxy_args)
        notes.append(
            f"Node proxies: {' '.join(node_proxy_args)} added to their installed args in every scenario (restarts "
            "included): the ambit rows measure that variant."
        )
    if (cost := flow_log_cost(rows)) is not None:
        env["flow_log_on_over_off"] = round(cost, 4)
        notes.append(
            f"Flow log: with it (the default, {FLOW_LOG_SCENARIO!r}) the ambit route made {cost:.3f}× the connections "
            f"per second it made without it (--flow-log-size=0), medians of {profile.repeats} alternating rounds: "
            f"a cost of {100 * (1 - cost):.1f}% of the connection rate (a negative cost is noise)."
        )
    text = markdown(rows, env, profile.name, notes)
    if echo:
        print(text)
    if out is not None:
        out.mkdir(parents=True, exist_ok=True)
        (out / "latest.md").write_text(text)
        (out / "latest.json").write_text(json_lines(rows, env, profile.name))
        panels = [("bulk, 1 stream", "throughput"), ("request/response 14 B, closed loop", "p50")]
        chart.draw(rows, panels, out / "latest.png")
        log(f"written: {out}/latest.md, latest.json, latest.png")
    return text


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m bench.mesh", description=__doc__.split("\n")[0])
    parser.add_argument("--profile", choices=sorted(PROFILES), default="full")
    parser.add_argument("--quick", action="store_const", const="short", dest="profile", help="--profile short")
    parser.add_argument("--out", type=Path, default=RESULTS, help="where latest.md/.json/.png go")
    parser.add_argument(
        "--node-proxy-args",
        default="",
        help="args added to the node proxies' installed ones for the whole run; give them with '=', as in "
        "--node-proxy-args=--tls-transport=socket",
    )
    args = parser.parse_args(argv)
    try:
        run(PROFILES[args.profile], args.out, node_proxy_args=tuple(shlex.split(args.node_proxy_args)))
    except AmbitError as exc:
        print(f"bench.mesh: {exc}", file=sys.stderr)
        return 1
    return 0
