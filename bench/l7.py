"""The L7 benchmark: the waypoint and ingress paths against the L4 mesh path, the bare path and haproxy (17, 18).

Issues 17 and 18 ask for it: the waypoint path side by side with the L4-only path and haproxy in HTTP mode, and the
ingress path against haproxy terminating TLS and forwarding over mutual TLS, in one run each.

``python -m bench.l7 [--quick]`` (root; ``make bench-l7``, ``make bench-l7-quick``) brings up a 2-node lab with the
mesh (:func:`bench.mesh.topology.bench_lab`: the lab lock, ``ambit lab up``, always ``ambit lab down``; every
process it starts is ended by its pid), the benchmark's pods (client on node 1, server on node 2, in ``bench-plain``
outside the mesh and ``bench-amb`` enrolled), and what :mod:`bench.l7_objects` describes: an answer server
(haproxy returning a 1 KiB body) in both server pods, the ``haproxy-http`` pair, a waypoint for ``bench-amb``
(``ambit waypoint apply --wait``) with Service ``amb-wp`` bound to it and ``amb-l4`` not, the ingress Gateway with
an HTTPS listener and its route to ``amb-l4``, and ``haproxy-ingress`` on the host. Load is h2load
(:mod:`bench.h2load`), from the client pod for the mesh paths and from the host for the ingress paths.

Modes (rounds interleave them, round by round, in this order, so the machine's drift spreads over all):

1. ``direct``: ``plain-cli`` → ``plain-srv`` (no mesh); the ingress scenarios' ``direct`` is the host → ``plain-srv``
   over TLS (the answer server's own TLS listener, the same certificate);
2. ``l4``: ``amb-cli`` → Service ``amb-l4`` (node proxy → HBONE → node proxy → server);
3. ``waypoint``: ``amb-cli`` → Service ``amb-wp`` (node proxy → HBONE → waypoint → HBONE → node proxy → server);
4. ``haproxy-http``: ``plain-cli`` → its haproxy (127.0.0.1) → mutual TLS, HTTP/2 → haproxy in ``plain-srv`` →
   server;
5. ``gateway``: the host → the Gateway's LoadBalancer address (TLS, the listener's host name as server name) →
   HBONE → node proxy → server in ``amb-srv``;
6. ``haproxy-ingress``: the host → haproxy on 127.0.0.1 (TLS, same certificate) → mutual TLS → haproxy in
   ``plain-srv`` → server.

Scenarios, each mode per round: HTTP/1.1 keep-alive and HTTP/2 (h2c inside the mesh, ALPN h2 at the ingress) at a
fixed concurrency, closed loop, for the profile's duration after a warm-up; the mesh modes also at a fixed rate of
:data:`FIXED_RATE` requests/s (h2load ``--rps`` per connection), where the goals are judged; the ingress modes also
with a new TLS connection per request (HTTP/1.1, ``Connection: close``: h2load opens a new connection after each
response), giving handshakes/s. Figures per run: h2load's requests/s; p50 and p99 from its per-request log; CPU
(user + system, from ``/proc``, over the main duration) of the L7 proxy on the path (the waypoint pod's processes,
both ``haproxy-http`` processes, the gateway pod's processes, the host's haproxy), of the node proxies, and of all
proxies on the path, per 1,000 requests/s (vCPU) or as requests/s per vCPU; the L7 proxy's peak RSS during the run
(sampled every :data:`RSS_INTERVAL` s). Rows carry ratios to ``direct`` and to haproxy of the same run
(:mod:`bench.l7_report`); the report names the machine and the load average at start and end.
"""

# ruff: noqa: RUF001, RUF003 - the tables use × and en dashes on purpose

from __future__ import annotations

import argparse
import json
import os
import signal
import socket
import subprocess
import sys
import tempfile
import time
import urllib.request
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from ambit.errors import AmbitError
from ambit.lab.runtime.processes import container_main_pid
from bench import l7_objects as objects
from bench.h2load import HTTP1, HTTP2, PROTOCOLS, H2loadError, Load, check_clean, latencies, parse_log, parse_summary
from bench.l7_report import (
    DIRECT,
    GATEWAY,
    HAPROXY_HTTP,
    HAPROXY_INGRESS,
    L4,
    L7_CPU,
    L7_RSS,
    P50,
    P99,
    RATE,
    WAYPOINT,
    Sample,
    aggregate,
    json_lines,
    markdown,
    verdicts,
)
from bench.mesh.probes import ProbeError, cpu_seconds, rss_bytes
from bench.mesh.run import _listening, _version, ensure_tools, environment
from bench.mesh.topology import BenchLab, Processes, ambit, bench_lab
from bench.mesh.tunnels import Credentials, make_credentials

REPO = Path(__file__).resolve().parents[1]
RESULTS = REPO / "bench" / "results"
FIXED_RATE = 1000
FIXED_CONNECTIONS = 10
RSS_INTERVAL = 0.2
READY_TIMEOUT = 180.0
NODE_CPU = "node proxies' CPU per 1,000 req/s"
PATH_CPU = "all proxies' CPU per 1,000 req/s"


class L7BenchError(AmbitError):
    """The lab did not reach a state the benchmark needs (a path that never answered, a Gateway never Programmed)."""


@dataclass(frozen=True, slots=True)
class Profile:
    name: str
    rounds: int
    seconds: float
    warm_up: float
    handshakes: int
    """Requests (each on a new TLS connection) per handshake run."""
    h1_connections: int = 16
    h2_connections: int = 4
    h2_streams: int = 4
    handshake_connections: int = 8


PROFILES = {
    "quick": Profile("quick", rounds=2, seconds=2, warm_up=0.5, handshakes=400),
    "full": Profile("full", rounds=3, seconds=8, warm_up=2, handshakes=3000),
}


@dataclass(frozen=True, slots=True)
class Target:
    """How one mode reaches the answer server: where h2load runs (a netns, or the host), its URL, the address to
    connect to for TLS by name, and the pids of the proxies on the path by role."""

    mode: str
    netns: str | None
    url: str
    connect_to: str = ""
    l7: tuple[int, ...] = ()
    """The L7 proxy's processes (none for ``direct`` and ``l4``)."""
    node_proxies: tuple[int, ...] = ()
    others: tuple[int, ...] = ()
    """Other proxies on the path (haproxy-ingress: haproxy-http's server side), counted only with all of them."""

    @property
    def every(self) -> tuple[int, ...]:
        return (*self.l7, *self.node_proxies, *self.others)


@dataclass(frozen=True, slots=True)
class Reading:
    """One h2load run with the CPU and memory of the path's proxies over it."""

    rate: float
    p50: float
    p99: float
    seconds: float
    """The window the CPU was read over."""
    cpu: Mapping[str, float]
    """Role (``l7``, ``node``, ``all``) → CPU seconds in the window."""
    l7_rss_peak: int
    bad: int = 0
    """Requests that failed or got no 2xx (rule 2 of :mod:`bench.h2load`: a few are tolerated, and reported)."""
    done: int = 0
    detail: str = ""
    """What the bad ones were: h2load's counts and the logged statuses, with when in the run they started."""


# -- scenario names -------------------------------------------------------------------------------------------------
def closed_load(profile: Profile, protocol: str) -> Load:
    if protocol == HTTP1:
        return Load(HTTP1, profile.h1_connections, 1, profile.seconds, profile.warm_up)
    return Load(HTTP2, profile.h2_connections, profile.h2_streams, profile.seconds, profile.warm_up)


def fixed_load(profile: Profile, protocol: str) -> Load:
    per_connection = FIXED_RATE // FIXED_CONNECTIONS
    return Load(protocol, FIXED_CONNECTIONS, 1, profile.seconds, profile.warm_up, rate_per_connection=per_connection)


def handshake_load(profile: Profile) -> Load:
    return Load(HTTP1, profile.handshake_connections, requests=profile.handshakes, headers=("Connection: close",))


def scenario_name(load: Load, *, ingress: bool = False) -> str:
    where = "ingress HTTPS from the host, " if ingress else ""
    if load.headers:
        return f"{where}a new TLS connection per request (HTTP/1.1, {load.connections} connections)"
    if load.rate_per_connection:
        total = load.rate_per_connection * load.connections
        return f"{where}{load.protocol} at {total:,} req/s (fixed rate, {load.connections} connections)"
    if load.protocol == HTTP1:
        return f"{where}HTTP/1.1 keep-alive, {load.connections} connections"
    return f"{where}HTTP/2, {load.connections} connections × {load.streams} streams"


# -- figures --------------------------------------------------------------------------------------------------------
def samples_of(scenario: str, mode: str, reading: Reading, *, ingress: bool, handshakes: bool = False) -> list[Sample]:
    """The rows one run gives (rate, p50, p99, CPU by role, the L7 proxy's peak RSS)."""
    rate_metric = "new TLS connections/s (one request each)" if handshakes else RATE
    out = [
        Sample(scenario, rate_metric, mode, reading.rate, "/s"),
        Sample(scenario, P50, mode, reading.p50, "µs"),
        Sample(scenario, P99, mode, reading.p99, "µs"),
    ]
    roles = {"l7": "L7 proxy", "node": "node proxies'", "all": "all proxies'"}
    per = "connection" if handshakes else "request"
    for role, seconds in reading.cpu.items():
        vcpu = seconds / reading.seconds if reading.seconds > 0 else 0.0
        if ingress:
            if vcpu > 0:
                metric = f"{rate_metric.split(' (')[0]} per vCPU, {roles[role].rstrip(chr(39))}"
                out.append(Sample(scenario, metric, mode, reading.rate / vcpu, f"/s per vCPU ({per}s)"))
        elif reading.rate > 0:
            metric = {"l7": L7_CPU, "node": NODE_CPU, "all": PATH_CPU}[role]
            out.append(Sample(scenario, metric, mode, vcpu / (reading.rate / 1000), "vCPU"))
    if reading.l7_rss_peak:
        out.append(Sample(scenario, L7_RSS, mode, reading.l7_rss_peak / 2**20, "MiB"))
    return out


# -- processes ------------------------------------------------------------------------------------------------------
def descendants(pid: int) -> list[int]:
    """``pid`` and every process below it (a container's main process may start workers)."""
    children: dict[int, list[int]] = {}
    for entry in Path("/proc").iterdir():
        if not entry.name.isdigit():
            continue
        try:
            parent = int((entry / "stat").read_text().rsplit(")", 1)[1].split()[1])
        except (OSError, IndexError, ValueError):
            continue
        children.setdefault(parent, []).append(int(entry.name))
    found, queue = [], [pid]
    while queue:
        current = queue.pop()
        found.append(current)
        queue.extend(children.get(current, ()))
    return sorted(found)


def _pods(lab: BenchLab, namespace: str, selector: str) -> list[dict[str, Any]]:
    items: list[dict[str, Any]] = json.loads(lab.kubectl("get", "pods", "-n", namespace, "-l", selector, "-o", "json"))[
        "items"
    ]
    return [p for p in items if not p["metadata"].get("deletionTimestamp")]


def pod_pids(lab: BenchLab, namespace: str, selector: str) -> tuple[int, ...]:
    """Every process of the running pods ``selector`` picks (their containers' main processes and descendants)."""
    pids: list[int] = []
    for pod in _pods(lab, namespace, selector):
        for status in (pod.get("status") or {}).get("containerStatuses") or ():
            if (main := container_main_pid(status)) is not None:
                pids.extend(descendants(main))
    if not pids:
        raise L7BenchError(f"no running pod in {namespace} for {selector}")
    return tuple(sorted(pids))


def run_load(path: Target, load: Load, log_file: Path) -> Reading:
    """Run h2load for ``path`` and read the proxies' CPU over its main duration and the L7 proxy's peak RSS."""
    log_file.unlink(missing_ok=True)
    argv = load.argv(path.url, str(log_file), path.connect_to)
    if path.netns is not None:
        argv = ["ip", "netns", "exec", path.netns, *argv]
    roles = {"l7": path.l7, "node": path.node_proxies, "all": path.every}
    roles = {role: pids for role, pids in roles.items() if pids}
    limit = load.seconds + load.warm_up + 60 if load.seconds else 120
    proc = subprocess.Popen(argv, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    try:
        time.sleep(load.warm_up)
        began = time.monotonic()
        before = {role: cpu_seconds(pids) for role, pids in roles.items()}
        peak = _rss(path.l7)
        while proc.poll() is None:
            if time.monotonic() - began > limit:
                raise L7BenchError(f"{path.mode}: h2load still running {limit:.0f} s on")
            time.sleep(RSS_INTERVAL)
            peak = max(peak, _rss(path.l7))
        window = time.monotonic() - began
        used = {role: cpu_seconds(pids) - before[role] for role, pids in roles.items()}
        out, err = proc.communicate(timeout=10)
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.communicate(timeout=10)
    if proc.returncode != 0:
        raise H2loadError(f"{path.mode}: h2load failed ({proc.returncode}): {err.strip()[-300:]}")
    summary = parse_summary(out)
    bad = check_clean(summary, path.mode, load.protocol)
    logged = parse_log(log_file.read_text())
    timing = latencies(logged)
    if not load.seconds:  # a request count: the rate and the CPU window are the whole run
        window = summary.seconds
    detail = ""
    if bad:
        first = min((r.started_us for r in logged), default=0)
        odd = [f"{r.status} at {(r.started_us - first) / 1e6:.2f} s" for r in logged if not 200 <= r.status < 300]
        detail = (
            f"{summary.failed} failed, {summary.errored} errored, {summary.timeout} timed out, "
            f"{summary.other_statuses}; logged: {', '.join(odd[:5]) or 'none'}"
        )
    return Reading(summary.requests_per_second, timing.p50, timing.p99, window, used, peak, bad, summary.done, detail)


def _rss(pids: Sequence[int]) -> int:
    """The processes' summed RSS; 0 for a sample taken while one of them was gone (the CPU reading, which must not
    miss one, fails the run instead)."""
    try:
        return rss_bytes(pids) if pids else 0
    except ProbeError:
        return 0


# -- set-up ---------------------------------------------------------------------------------------------------------
@dataclass
class Setup:
    """What the run put on the lab besides its pods."""

    lab: BenchLab
    procs: Processes
    tmp: Path
    creds: Credentials
    files: objects.AnswerFiles
    listener: tuple[bytes, bytes]
    """The listener's certificate and key, PEM (the Gateway's Secret)."""
    gateway_address: str = ""
    stats_socket: Path | None = None
    haproxy_http: dict[str, int] = field(default_factory=dict)
    """haproxy-http's side (``client``, ``server``) → its pid."""
    haproxy_ingress: int = 0


def write_files(tmp: Path) -> tuple[objects.AnswerFiles, bytes, bytes]:
    """The body, and the listener's certificate and key for :data:`~bench.l7_objects.INGRESS_HOST` (ECDSA P-256
    from a throw-away CA), as one PEM for haproxy and as the pair for the Gateway's Secret."""
    from ambit.tls.certs import issue_server_cert, new_ca

    body = tmp / "body"
    body.write_bytes(bytes(ord("a") + i % 26 for i in range(objects.BODY_BYTES)))
    ca = new_ca("ambit bench ingress CA", now=time.time(), days=1)
    host = objects.INGRESS_HOST
    pair = issue_server_cert(ca, common_name=host, dns_names=[host], ip_addresses=[], now=time.time(), days=1)
    pem = tmp / "listener.pem"
    pem.write_bytes(pair.cert_pem + pair.key_pem)
    pem.chmod(0o600)
    return objects.AnswerFiles(body, pem), pair.cert_pem, pair.key_pem


def start_haproxy(setup: Setup, netns: str, config: str, name: str) -> subprocess.Popen[str]:
    path = setup.tmp / f"{name}.cfg"
    path.write_text(config)
    return setup.procs.start(netns, ["haproxy", "-db", "-f", str(path)], name)


def start_host_haproxy(setup: Setup, config: str) -> subprocess.Popen[str]:
    """haproxy-ingress on the host (not in a netns); kept in ``procs`` so that it is ended with the rest."""
    path = setup.tmp / "haproxy-ingress.cfg"
    path.write_text(config)
    with open(setup.tmp / "haproxy-ingress.log", "a") as log:
        proc = subprocess.Popen(
            ["haproxy", "-db", "-f", str(path)], stdin=subprocess.DEVNULL, stdout=log, stderr=log, text=True
        )
    setup.procs.started.append(proc)
    deadline = time.monotonic() + 20
    while True:
        try:
            socket.create_connection(("127.0.0.1", objects.INGRESS_LOCAL_PORT), timeout=1).close()
            return proc
        except OSError:
            if proc.poll() is not None or time.monotonic() > deadline:
                raise L7BenchError("haproxy-ingress did not listen; see its log") from None
            time.sleep(0.1)


def gateway_address(lab: BenchLab) -> str:
    """The Gateway's LoadBalancer address once it is Programmed."""
    deadline = time.monotonic() + READY_TIMEOUT
    while True:
        gateway = json.loads(lab.kubectl("get", "gateway", objects.GATEWAY, "-n", objects.EDGE_NAMESPACE, "-o", "json"))
        status = gateway.get("status") or {}
        programmed = any(
            c.get("type") == "Programmed" and c.get("status") == "True" for c in status.get("conditions") or ()
        )
        addresses = status.get("addresses") or []
        if programmed and addresses:
            return str(addresses[0]["value"])
        if time.monotonic() > deadline:
            raise L7BenchError(f"the Gateway was not Programmed with an address in {READY_TIMEOUT:.0f} s: {status}")
        time.sleep(1)


def set_up(setup: Setup, log: Callable[[str], None]) -> None:
    lab, files, creds = setup.lab, setup.files, setup.creds
    for server in ("plain-srv", "amb-srv"):
        start_haproxy(setup, lab.netns[server], objects.answer_config(files), f"answer-{server}")
        _listening(lab.netns[server], {objects.ANSWER_PORT, objects.ANSWER_TLS_PORT})
    server_ip = lab.ips["plain-srv"]
    for side, pod in (("server", "plain-srv"), ("client", "plain-cli")):
        config = objects.haproxy_http_config(creds, client=side == "client", server_ip=server_ip)
        setup.haproxy_http[side] = start_haproxy(setup, lab.netns[pod], config, f"haproxy-http-{side}").pid
    _listening(lab.netns["plain-srv"], {objects.HTTP_TLS_PORT})
    _listening(lab.netns["plain-cli"], {objects.HTTP_LOCAL_PORT})
    setup.stats_socket = setup.tmp / "haproxy-ingress.sock"
    config = objects.haproxy_ingress_config(creds, files, server_ip=server_ip, stats_socket=setup.stats_socket)
    setup.haproxy_ingress = start_host_haproxy(setup, config).pid
    log("answer servers, haproxy-http and haproxy-ingress up")
    manifests = objects.mesh_objects(*setup.listener)
    namespaces = [m for m in manifests if m["kind"] == "Namespace"]
    lab.kubectl("apply", "-f", "-", input="\n".join(json.dumps(m) for m in namespaces))
    lab.kubectl("apply", "-f", "-", input="\n".join(json.dumps(m) for m in manifests if m not in namespaces))
    began = time.monotonic()
    kubeconfig = str(lab.topology.kubeconfig)
    # --wait with the command's own timeout (its option's name differs between versions; 90 s by default)
    ambit("waypoint", "apply", "-n", "bench-amb", "--wait", "--kubeconfig", kubeconfig, timeout=READY_TIMEOUT + 60)
    log(f"waypoint applied and ready: {time.monotonic() - began:.0f} s")
    setup.gateway_address = gateway_address(lab)
    log(f"ingress Gateway Programmed at {setup.gateway_address}: {time.monotonic() - began:.0f} s")


def paths(setup: Setup) -> dict[str, Target]:
    """Every mode's path with the current pids of its proxies."""
    lab = setup.lab
    nodes = tuple(lab.node_proxy_pids())
    waypoint = pod_pids(lab, "bench-amb", f"{objects.GATEWAY_NAME_LABEL}={objects.WAYPOINT}")
    gateway = pod_pids(lab, objects.EDGE_NAMESPACE, f"{objects.GATEWAY_NAME_LABEL}={objects.GATEWAY}")
    haproxy_http = tuple(setup.haproxy_http.values())
    host, server_side = setup.haproxy_ingress, setup.haproxy_http["server"]
    vip = {name: _cluster_ip(lab, name) for name in (objects.L4_SERVICE, objects.WAYPOINT_SERVICE)}
    host_url = f"https://{objects.INGRESS_HOST}/"
    return {
        DIRECT: Target(DIRECT, lab.netns["plain-cli"], f"http://{lab.ips['plain-srv']}:{objects.ANSWER_PORT}/"),
        L4: Target(L4, lab.netns["amb-cli"], f"http://{vip[objects.L4_SERVICE]}/", node_proxies=nodes),
        WAYPOINT: Target(
            WAYPOINT, lab.netns["amb-cli"], f"http://{vip[objects.WAYPOINT_SERVICE]}/", l7=waypoint, node_proxies=nodes
        ),
        HAPROXY_HTTP: Target(
            HAPROXY_HTTP, lab.netns["plain-cli"], f"http://127.0.0.1:{objects.HTTP_LOCAL_PORT}/", l7=haproxy_http
        ),
        f"ingress {DIRECT}": Target(DIRECT, None, host_url, f"{lab.ips['plain-srv']}:{objects.ANSWER_TLS_PORT}", ()),
        GATEWAY: Target(GATEWAY, None, host_url, f"{setup.gateway_address}:{objects.GATEWAY_PORT}", gateway, nodes),
        HAPROXY_INGRESS: Target(
            HAPROXY_INGRESS, None, host_url, f"127.0.0.1:{objects.INGRESS_LOCAL_PORT}", (host,), others=(server_side,)
        ),
    }


def _cluster_ip(lab: BenchLab, service: str) -> str:
    return str(json.loads(lab.kubectl("get", "service", service, "-n", "bench-amb", "-o", "json"))["spec"]["clusterIP"])


def waypoint_requests(lab: BenchLab) -> int:
    """``istio_requests_total`` with reporter="waypoint", summed over the waypoint pods' :15020."""
    total = 0
    for pod in _pods(lab, "bench-amb", f"{objects.GATEWAY_NAME_LABEL}={objects.WAYPOINT}"):
        address = (pod.get("status") or {}).get("podIP")
        if not address:
            continue
        with urllib.request.urlopen(f"http://{address}:15020/metrics", timeout=5) as response:
            for line in response.read().decode().splitlines():
                if line.startswith("istio_requests_total{") and 'reporter="waypoint"' in line:
                    total += int(float(line.rsplit(" ", 1)[1]))
    return total


def check_paths(setup: Setup, every: Mapping[str, Target], log: Callable[[str], None]) -> None:
    """Every path answers 20 requests cleanly (retried until :data:`READY_TIMEOUT`), the waypoint path is counted by
    the waypoint, and node 2's proxy saw mutual-TLS inbound traffic."""
    probe = Load(HTTP1, 1, requests=20)
    for name, path in every.items():
        deadline = time.monotonic() + READY_TIMEOUT
        while True:
            try:
                before = waypoint_requests(setup.lab) if path.mode == WAYPOINT else 0
                run_load(path, probe, setup.tmp / "probe.log")
                if path.mode != WAYPOINT or waypoint_requests(setup.lab) >= before + probe.requests:
                    break
                reason = "the waypoint did not count the requests"
            except (H2loadError, ProbeError, OSError) as exc:
                reason = str(exc)
            if time.monotonic() > deadline:
                raise L7BenchError(f"{name}: no clean answer in {READY_TIMEOUT:.0f} s: {reason}")
            time.sleep(1)
    metrics = setup.lab.metrics(2)
    if not any('reporter="destination"' in line and "mutual_tls" in line for line in metrics.splitlines()):
        raise L7BenchError("node 2's proxy reports no mutual-TLS inbound connection: the mesh paths are not meshed")
    log("every path answers; the waypoint counts its requests")


def haproxy_session_reuse(setup: Setup) -> str:
    """haproxy-ingress's ``SslFrontendSessionReuse_pct`` (over its last second) from its stats socket."""
    if setup.stats_socket is None:
        return "?"
    try:
        with socket.socket(socket.AF_UNIX) as sock:
            sock.settimeout(2)
            sock.connect(str(setup.stats_socket))
            sock.sendall(b"show info\n")
            data = b""
            while chunk := sock.recv(65536):
                data += chunk
    except OSError as exc:
        return f"unread ({exc})"
    return objects.parse_stats_info(data.decode(errors="replace")).get("SslFrontendSessionReuse_pct", "?")


# -- the run --------------------------------------------------------------------------------------------------------
MESH_MODES = (DIRECT, L4, WAYPOINT, HAPROXY_HTTP)
INGRESS_MODES = (f"ingress {DIRECT}", GATEWAY, HAPROXY_INGRESS)


def measure(setup: Setup, profile: Profile, log: Callable[[str], None]) -> tuple[list[Sample], list[str], list[str]]:
    """Every round: the closed-loop and fixed-rate mesh scenarios, then the ingress ones; samples, the fixed-rate
    scenario names, and notes gathered on the way."""
    set_up(setup, log)
    every = paths(setup)
    check_paths(setup, every, log)
    samples: list[Sample] = []
    reuse: list[str] = []
    bad: dict[tuple[str, str], list[int]] = {}

    def take(scenario: str, mode: str, reading: Reading, **kinds: bool) -> None:
        samples.extend(samples_of(scenario, mode, reading, **kinds))
        if reading.bad:
            count = bad.setdefault((scenario, mode), [0, 0])
            count[0] += reading.bad
            log(f"{scenario}, {mode}: {reading.bad} of {reading.done} requests failed or got no 2xx ({reading.detail})")
        bad.setdefault((scenario, mode), [0, 0])[1] += reading.done

    fixed_names = [scenario_name(fixed_load(profile, protocol)) for protocol in PROTOCOLS]
    log_file = setup.tmp / "h2load.log"
    for number in range(profile.rounds):
        began = time.monotonic()
        every = paths(setup)  # pids again: a restarted pod would otherwise go unmeasured
        for protocol in PROTOCOLS:
            for load in (closed_load(profile, protocol), fixed_load(profile, protocol)):
                scenario = scenario_name(load)
                for mode in MESH_MODES:
                    take(scenario, mode, run_load(every[mode], load, log_file), ingress=False)
        for protocol in PROTOCOLS:
            ingress = closed_load(profile, protocol)
            for name in INGRESS_MODES:
                reading = run_load(every[name], ingress, log_file)
                take(scenario_name(ingress, ingress=True), every[name].mode, reading, ingress=True)
        handshakes = handshake_load(profile)
        for name in INGRESS_MODES:
            reading = run_load(every[name], handshakes, log_file)
            if every[name].mode == HAPROXY_INGRESS:
                reuse.append(haproxy_session_reuse(setup))
            scenario = scenario_name(handshakes, ingress=True)
            take(scenario, every[name].mode, reading, ingress=True, handshakes=True)
        log(f"round {number + 1} of {profile.rounds}: {time.monotonic() - began:.0f} s")
    wrong = [f"{mode} in '{scenario}': {n:,} of {total:,}" for (scenario, mode), (n, total) in bad.items() if n]
    notes = [
        f"Processes read as the L7 proxy: the waypoint pod's {len(every[WAYPOINT].l7)}, the gateway pod's "
        f"{len(every[GATEWAY].l7)} (each container's main process and its descendants).",
        "Requests that failed or got no 2xx (left out of the percentiles; a run with more than 0.5% ends the "
        f"benchmark): {'; '.join(wrong) if wrong else 'none'}.",
        "haproxy-ingress's TLS session reuse over the last second of each handshake run (its stats socket, "
        f"SslFrontendSessionReuse_pct): {', '.join(f'{r}%' for r in reuse)}.",
    ]
    return samples, fixed_names, notes


NOTES = [
    "Client pod on node 1, server pod on node 2; every mode reaches the same answer server (haproxy returning a "
    "1 KiB body: a C server, so that the server never limits a mode); modes interleaved round by round; median of "
    "the rounds, min–max across them; ratios to direct and to haproxy (haproxy-http for the mesh scenarios, "
    "haproxy-ingress for the ingress ones) of the same scenario in this run.",
    "Load: h2load, one thread. HTTP/1.1 keep-alive: one request in flight per connection; HTTP/2: h2c with prior "
    "knowledge inside the mesh, ALPN h2 at the ingress. Requests/s is h2load's over the main duration (after its "
    "warm-up); p50/p99 from its per-request log (start of a request to the end of its response), 2xx only; a run "
    "with more than 0.5% of its requests failed or answered with another status ends the benchmark (fewer are "
    "counted in the notes).",
    "CPU: user + system from /proc over the main duration, per 1,000 requests/s of that run (vCPU), or requests/s "
    "per vCPU at the ingress. L7 proxy: the waypoint pod's processes (waypoint), both haproxy processes "
    "(haproxy-http), the gateway pod's processes (gateway), the host's haproxy (haproxy-ingress); node proxies: "
    "both nodes' proxies; all proxies: the sum on the path (haproxy-ingress: both its haproxy processes). RSS: the "
    "L7 proxy's peak over the run, sampled every 0.2 s.",
    f"Fixed rate: {FIXED_CONNECTIONS} connections, h2load --rps {FIXED_RATE // FIXED_CONNECTIONS} each "
    f"({FIXED_RATE:,} req/s offered); the goals are judged there, at the rate the path achieved (its requests/s row).",
    "haproxy-http: the client side (in the client pod) takes HTTP/1.1 or h2c and forwards each request over mutual "
    "TLS with ALPN h2 (ECDSA P-256, both chains verified, OpenSSL's default TLS 1.3 suite, as bench/mesh's "
    "haproxy-tls) to the server side (in the server pod), which forwards to the answer server over HTTP/1.1 "
    "keep-alive; mode http, defaults otherwise.",
    "Ingress: h2load on the host, TLS with the listener's host name as the server name (--connect-to the address). "
    "gateway: the Gateway's LoadBalancer address on the lab bridge, HTTPS listener with a kubernetes.io/tls Secret, "
    "HTTPRoute to Service amb-l4 (HBONE to node 2's proxy with the gateway's identity); haproxy-ingress: haproxy on "
    "the host with the same certificate and key, forwarding over mutual TLS (ALPN h2) to haproxy-http's server side "
    "in plain-srv; direct: the answer server's own TLS listener in plain-srv (the same certificate).",
    "Handshakes: h2load --h1 -n N -c C with 'Connection: close': every response closes its connection and h2load "
    "opens a new one, so each request is a new TCP connection and TLS handshake. h2load offers the TLS session it "
    "got before on the same client, so a server that issues tickets (haproxy and Python's ssl do by default) "
    "resumes most handshakes (abbreviated, no certificate signature); haproxy's share is in the notes, the "
    "gateway's is not observable from outside.",
    "No CPU pinning: the two vCPUs are shared by the client, the proxies and the server in every mode alike.",
]


def run(profile: Profile, out: Path | None, *, echo: bool = True) -> str:
    """Run the benchmark; write l7.md and l7.json to ``out``; return the Markdown."""
    if os.geteuid() != 0:
        raise L7BenchError("the L7 benchmark needs root (it brings up a lab)")
    ensure_tools()
    env = environment()
    env["h2load"] = _version(["h2load", "--version"])
    env["ambit"] = _ambit_source()
    started = time.monotonic()

    def log(line: str) -> None:
        if echo:
            print(f"[{time.monotonic() - started:5.0f} s] {line}", file=sys.stderr, flush=True)

    with tempfile.TemporaryDirectory(prefix="ambit-bench-l7-") as tmp_name:
        tmp = Path(tmp_name)
        procs = Processes(tmp)
        files, cert_pem, key_pem = write_files(tmp)
        with bench_lab(tmp) as lab:
            try:
                log(f"lab {lab.topology.lab_id} up")
                lab.create_pods(False)
                log("pods Ready")
                setup = Setup(lab, procs, tmp, make_credentials(tmp), files, (cert_pem, key_pem))
                samples, fixed_names, extra = measure(setup, profile, log)
            finally:
                procs.stop_all()
    env["loadavg_end"] = os.getloadavg()[0]
    env["seconds"] = round(time.monotonic() - started, 1)
    rows = aggregate(samples)
    notes = [*NOTES, *extra, *verdicts(rows, fixed_names)]
    text = markdown(rows, env, profile.name, notes)
    if echo:
        print(text)
    if out is not None:
        out.mkdir(parents=True, exist_ok=True)
        (out / "l7.md").write_text(text)
        (out / "l7.json").write_text(json_lines(rows, env, profile.name))
        log(f"written: {out}/l7.md, l7.json")
    return text


def _ambit_source() -> str:
    """Where the lab's product comes from (the ``ambit`` package this interpreter imports) and its commit."""
    import ambit as package

    where = Path(package.__file__ or ".").resolve().parents[2]
    done = subprocess.run(
        ["git", "-C", str(where), "rev-parse", "--short", "HEAD"], capture_output=True, text=True, check=False
    )
    return f"{where} @ {done.stdout.strip() or '?'}"


def main(argv: Sequence[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m bench.l7", description=(__doc__ or "").split("\n")[0])
    parser.add_argument(
        "--quick", action="store_const", const="quick", default="full", dest="profile", help="two short rounds"
    )
    parser.add_argument("--out", type=Path, default=RESULTS, help="where l7.md and l7.json go")
    args = parser.parse_args(argv)
    # A SIGTERM (an impatient caller) unwinds like an error: the lab comes down and temporary files go.
    signal.signal(signal.SIGTERM, lambda signum, frame: sys.exit(128 + signum))
    try:
        run(PROFILES[args.profile], args.out)
    except AmbitError as exc:
        print(f"bench.l7: {exc}", file=sys.stderr)
        return 1
    return 0


if __name__ == "__main__":
    sys.exit(main())
