"""Node-proxy cost per connection, without a lab: memory per idle tunnelled connection, pooled connection rate, CPU.

Run as root: ``.venv/bin/python bench/proxy_connections.py --count 2000`` (``--help`` for the knobs).

Theory of operation. The lab's path is client pod → client node proxy (15001, outbound) → pooled HBONE HTTP/2
streams → server node proxy (15008, inbound) → server pod. This harness builds the same path on one machine with
the real pieces, minus the control plane:

- two network namespaces of our own (``pc<hex>-a`` the client pod, ``pc<hex>-b`` the server pod, joined by a veth
  pair on 198.18.244.0/24), each with the real in-pod redirection rules (:func:`ambit.redirect.apply.apply_inpod`);
- two node proxies in *this* process, each a :class:`~ambit.proxy.context.ProxyContext` (node-a and node-b, each
  with its own pool, metrics and access log) and a :class:`~ambit.inpod.workloads.PodListenerManager` that opens
  the pod's listeners in its netns, exactly as ``ambit nodeproxy`` does after a ZDS ``add``; one local CA signs both
  pods' certificates; the workload state knows both pods (HBONE, on different nodes, so no same-node fast path);
- the applications are ``bench.mesh.apps`` (``echo`` in the server pod, ``hold`` and ``rate`` in the client pod),
  run in their pods with ``ip netns exec`` as separate processes, so this process holds the two proxies only.

Both proxies share this process, so its RSS growth divided by the held connections is the lab's figure ("both
proxies together"). Figures:

- ``rss``: growth of this process's RSS from before ``hold`` opened N connections (each used once with a 1-byte
  echo, so every tunnel is set up) to after, divided by N (after a warm-up hold that dialled the pooled HBONE
  connections and filled the allocator's free lists once);
- ``tracemalloc``: the Python heap's growth for the same N, in a second round with tracing on, and its largest
  sites by ``file:line`` (what to cut);
- ``rate``: new connections per second, 8 concurrent clients each connecting, sending one byte, reading it back
  and closing (pooled HBONE: no handshake per connection), and this process's CPU time (user + system, both
  proxies and their socket threads) per connection, also split into user and system time (the system part is
  mostly the kernel carrying the packets: on one host, a send runs the receiver's TCP stack too), with the cyclic
  collector's share (its time per connection, from ``gc.callbacks``, and what it freed).
  ``--profile FILE`` writes a cProfile of the rate round. ``--cold`` runs both proxies' pools as the lab's
  cold-handshake scenario does (``--pool-max-streams 1 --pool-idle-timeout 0``): one stream per HBONE connection,
  closed when its stream ends, so every connection of the rate round costs a full mutual-TLS handshake;
- ``cycles`` (``--measure cycles``): the rate round again with the cyclic collector off, then one collection that
  keeps what it found (``gc.DEBUG_SAVEALL``): the objects per connection that reference counting did not free, by
  type, and the references between them by (referrer type, referent type): what a connection leaves in cycles;
- ``floor`` (``--measure floor``): the handshake cost floor, a loop of TLS 1.3 mutual-TLS handshakes between the
  two proxies' own client and server contexts over memory BIOs in this process (no sockets, no event loop), as
  CPU per handshake pair (both ends), with the peer check (:func:`ambit.tls.spiffe.check_peer`) timed apart. The
  rate round's cold minus pooled CPU, minus this floor, is what our Python and the event loop's TLS layer add.

``--tls-transport`` picks HBONE's TLS transport and, on the socket, the data path, as ``bench/hbone_loopback.py``
names them: ``loop``; ``socket+python`` (TLS records in Python, ``AMBIT_NATIVE=0``); ``socket+native`` (records in
C, ``AMBIT_NATIVE=1``); ``socket+frames`` (records and the DATA frames of attached streams in C, ``AMBIT_NATIVE=1
AMBIT_NATIVE_DATA=1``, as the deployed node proxy runs); ``socket`` (whatever this process's ``AMBIT_NATIVE`` and
``AMBIT_NATIVE_DATA`` say); ``all``: the first four in turn, ``--rounds`` times alternated, each run in a child
process of its own (and its own namespaces), so that its RSS and heap figures start from a clean process; one report
each. The selection is :func:`ambit.native.select` of those settings, so a path that is not
built stops the run (one line) rather than measuring the fallback under its name.

The C allocator's thresholds and the collector's young threshold are the node proxy's own
(:func:`ambit.inpod.allocator.tune_allocator`, :func:`ambit.heap.tune_collector`). Logging is the
node proxy's own (:func:`ambit.cli.process_logging.configure_logging`), to a file: both proxies write an
access-log line per connection, as in the lab.

Everything the harness creates (namespaces, subprocesses) is removed when it ends, even on Ctrl-C.
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import cProfile
import gc
import ipaddress
import json
import os
import resource
import secrets
import ssl
import subprocess
import sys
import tempfile
import time
import tracemalloc
from collections.abc import AsyncIterator, Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from ambit import native
from ambit.cli.process_logging import configure_logging
from ambit.commands import SubprocessRunner
from ambit.heap import tune_collector
from ambit.identity.localca import LocalCa
from ambit.identity.manager import CertificateManager
from ambit.inpod.allocator import tune_allocator
from ambit.inpod.eventloop import run
from ambit.inpod.settings import NodeProxySettings
from ambit.inpod.workloads import PodListenerManager
from ambit.model.identity import SpiffeId
from ambit.model.state import WorkloadState
from ambit.model.workload import TunnelProtocol, Workload
from ambit.proxy.context import ProxyContext, workload_uid
from ambit.proxy.pool import ConnectionPool
from ambit.redirect import InPodSettings
from ambit.redirect.apply import apply_inpod
from ambit.telemetry.accesslog import AccessLog
from ambit.telemetry.metrics import ProxyMetrics
from ambit.tls.socket_transport import TlsTransportKind
from ambit.tls.spiffe import check_peer
from ambit.tls.workload import WorkloadCertificate
from ambit.zds.protocol import WorkloadInfo

TD = "cluster.local"
SUBNET = "198.18.244"
CLIENT_IP, SERVER_IP = f"{SUBNET}.1", f"{SUBNET}.2"
APP_PORT = 8080
ROOT = Path(__file__).resolve().parent.parent
PAGE = os.sysconf("SC_PAGE_SIZE")


@dataclass(frozen=True, slots=True)
class Pod:
    netns: str
    ip: str
    node: str
    info: WorkloadInfo


def _sh(*argv: str) -> None:
    subprocess.run(argv, check=True, capture_output=True)


@contextlib.contextmanager
def _namespaces(prefix: str) -> Iterator[tuple[Pod, Pod]]:
    client = Pod(f"{prefix}-a", CLIENT_IP, "node-a", WorkloadInfo("client-0", "bench", "client"))
    server = Pod(f"{prefix}-b", SERVER_IP, "node-b", WorkloadInfo("server-0", "bench", "server"))
    try:
        for pod in (client, server):
            _sh("ip", "netns", "add", pod.netns)
            _sh("ip", "-n", pod.netns, "link", "set", "lo", "up")
        veth = ("link", "add", "eth0", "type", "veth", "peer", "name", "eth0", "netns", server.netns)
        _sh("ip", "-n", client.netns, *veth)
        for pod in (client, server):
            _sh("ip", "-n", pod.netns, "addr", "add", f"{pod.ip}/24", "dev", "eth0")
            _sh("ip", "-n", pod.netns, "link", "set", "eth0", "up")
            apply_inpod(pod.netns, InPodSettings(), "nftables", SubprocessRunner())
        yield client, server
    finally:
        for pod in (client, server):
            subprocess.run(["ip", "netns", "del", pod.netns], capture_output=True, check=False)


def _workload(pod: Pod) -> Workload:
    return Workload(
        uid=workload_uid(pod.info),
        name=pod.info.name,
        namespace=pod.info.namespace,
        addresses=(ipaddress.ip_address(pod.ip),),
        tunnel_protocol=TunnelProtocol.HBONE,
        trust_domain=TD,
        service_account=pod.info.service_account,
        node=pod.node,
        canonical_name=pod.info.name.rsplit("-", 1)[0],
        canonical_revision="v1",
        workload_name=pod.info.name.rsplit("-", 1)[0],
    )


@contextlib.asynccontextmanager
async def _node_proxy(
    pod: Pod, ca: LocalCa, workloads: list[Workload], tmp: Path, pool: ConnectionPool, tls_transport: TlsTransportKind
) -> AsyncIterator[ProxyContext]:
    """One node proxy serving ``pod``, as ``ambit nodeproxy`` builds it (minus ZDS and the control plane)."""
    settings = NodeProxySettings(
        node=pod.node, zds_socket=tmp / "unused.sock", trust_domain=TD, tls_transport=tls_transport
    )
    state = WorkloadState()
    state.replace_all(workloads, [])
    certs = CertificateManager(ca)
    context = ProxyContext(
        settings=settings.proxy,
        state=state,
        certs=certs,
        pool=pool,
        metrics=ProxyMetrics(build_version="bench"),
        access_log=AccessLog(),
    )
    pods = PodListenerManager(context)
    fd = os.open(f"/run/netns/{pod.netns}", os.O_RDONLY | os.O_CLOEXEC)
    try:
        await pods.open_listeners(f"uid-{pod.info.name}", pod.info, fd)
        yield context
    finally:
        os.close(fd)
        await pods.aclose()
        await context.pool.aclose()


def _app(netns: str, *args: str) -> list[str]:
    return ["ip", "netns", "exec", netns, sys.executable, "-m", "bench.mesh.apps", *args]


def _rss() -> int:
    with open("/proc/self/statm") as statm:
        return int(statm.read().split()[1]) * PAGE


def _cpu() -> tuple[float, float]:
    """This process's (user, system) CPU seconds so far."""
    usage = resource.getrusage(resource.RUSAGE_SELF)
    return usage.ru_utime, usage.ru_stime


async def _settle(seconds: float = 0.5) -> None:
    await asyncio.sleep(seconds)
    gc.collect()


async def _hold(client: Pod, count: int) -> asyncio.subprocess.Process:
    """Start ``hold`` in the client pod and wait until its ``count`` connections each echoed a byte."""
    proc = await asyncio.create_subprocess_exec(
        *_app(client.netns, "hold", SERVER_IP, str(APP_PORT), "--count", str(count)),
        cwd=ROOT,
        stdin=subprocess.PIPE,
        stdout=subprocess.PIPE,
    )
    assert proc.stdout is not None
    line = await asyncio.wait_for(proc.stdout.readline(), 60 + count / 50)
    if line.decode().strip() != f"ready {count}":
        raise RuntimeError(f"hold did not get ready: {line!r}")
    return proc


async def _release(proc: asyncio.subprocess.Process, contexts: list[ProxyContext]) -> None:
    assert proc.stdin is not None
    proc.stdin.close()
    await proc.wait()
    for _ in range(200):  # the proxies see the closes a little later
        if all(len(c.connections) <= 1 for c in contexts) and all(c.pool.stats()["streams"] == 0 for c in contexts):
            break
        await asyncio.sleep(0.05)


def _live(contexts: list[ProxyContext]) -> int:
    return sum(len(c.connections) for c in contexts)


async def _measure_rss(client: Pod, contexts: list[ProxyContext], count: int) -> dict[str, Any]:
    await _settle()
    before = _rss()
    proc = await _hold(client, count)
    await _settle()
    after, live = _rss(), _live(contexts)
    await _release(proc, contexts)
    return {"connections": count, "live": live, "rss_growth": after - before, "per_conn": (after - before) / count}


async def _measure_tracemalloc(client: Pod, contexts: list[ProxyContext], count: int, top: int) -> dict[str, Any]:
    await _settle()
    tracemalloc.start(1)
    try:
        before = tracemalloc.take_snapshot()
        proc = await _hold(client, count)
        await _settle()
        after = tracemalloc.take_snapshot()
        await _release(proc, contexts)
    finally:
        tracemalloc.stop()
    filters = [tracemalloc.Filter(False, tracemalloc.__file__)]
    stats = after.filter_traces(filters).compare_to(before.filter_traces(filters), "lineno")
    growth = sum(s.size_diff for s in stats)
    sites = [
        {
            "site": f"{_short(s.traceback[0].filename)}:{s.traceback[0].lineno}",
            "bytes_per_conn": round(s.size_diff / count, 1),
            "blocks_per_conn": round(s.count_diff / count, 2),
        }
        for s in stats[:top]
    ]
    return {"connections": count, "heap_growth": growth, "per_conn": growth / count, "top": sites}


def _short(filename: str) -> str:
    for marker in ("/src/", "/lib/python3.11/"):
        if marker in filename:
            return filename.split(marker, 1)[1]
    return filename


async def _measure_rate(client: Pod, seconds: float, concurrency: int, profile: Path | None) -> dict[str, Any]:
    await _settle()
    profiler = cProfile.Profile() if profile else None
    collector = _CollectorClock()
    gc.callbacks.append(collector)
    cpu0, wall0 = _cpu(), time.perf_counter()
    if profiler is not None:
        profiler.enable()
    proc = await asyncio.create_subprocess_exec(
        *_app(
            client.netns, "rate", SERVER_IP, str(APP_PORT), "--seconds", str(seconds), "--concurrency", str(concurrency)
        ),
        cwd=ROOT,
        stdout=subprocess.PIPE,
    )
    out, _ = await proc.communicate()
    if profiler is not None:
        profiler.disable()
    (user0, sys0), (user1, sys1) = cpu0, _cpu()
    gc.callbacks.remove(collector)
    user, system = user1 - user0, sys1 - sys0
    cpu, wall = user + system, time.perf_counter() - wall0
    result = json.loads(out)
    if profiler is not None and profile is not None:
        profiler.dump_stats(profile)
    n = result["connections"]
    return {
        "connections": n,
        "failures": result["failures"],
        "per_second": n / result["seconds"],
        "proxy_cpu_seconds": round(cpu, 3),
        "proxy_cpu_us_per_conn": round(cpu / n * 1e6, 1) if n else None,
        "proxy_user_us_per_conn": round(user / n * 1e6, 1) if n else None,
        "proxy_system_us_per_conn": round(system / n * 1e6, 1) if n else None,
        "wall_seconds": round(wall, 2),
        "collector_us_per_conn": round(collector.seconds / n * 1e6, 1) if n else None,
        "collected_per_conn": round(collector.collected / n, 1) if n else None,
        "collections": collector.runs,
    }


class _CollectorClock:
    """A ``gc.callbacks`` entry: the time the cyclic collector ran (it runs in this thread: CPU time, too), how many
    times, and the objects it freed."""

    def __init__(self) -> None:
        self.seconds = 0.0
        self.runs = self.collected = 0
        self._start = 0.0

    def __call__(self, phase: str, info: dict[str, int]) -> None:
        if phase == "start":
            self._start = time.perf_counter()
        else:
            self.seconds += time.perf_counter() - self._start
            self.runs += 1
            self.collected += info["collected"]


async def _measure_cycles(client: Pod, seconds: float, concurrency: int, top: int) -> dict[str, Any]:
    await _settle()
    gc.disable()
    try:
        proc = await asyncio.create_subprocess_exec(
            *_app(
                client.netns, "rate", SERVER_IP, str(APP_PORT), "--seconds", str(seconds),
                "--concurrency", str(concurrency),
            ),
            cwd=ROOT,
            stdout=subprocess.PIPE,
        )  # fmt: skip
        out, _ = await proc.communicate()
        await asyncio.sleep(0.5)  # the proxies see the last closes a little later
        gc.set_debug(gc.DEBUG_SAVEALL)  # what the collector would free stays in gc.garbage
        gc.collect()
        garbage = list(gc.garbage)
    finally:
        gc.set_debug(0)
        gc.garbage.clear()
        gc.enable()
    n = json.loads(out)["connections"]
    found = {id(o) for o in garbage}
    types: dict[str, int] = {}
    edges: dict[str, int] = {}
    for o in garbage:
        name = type(o).__qualname__
        types[name] = types.get(name, 0) + 1
        for referent in gc.get_referents(o):
            if id(referent) in found:
                edge = f"{name} -> {type(referent).__qualname__}"
                edges[edge] = edges.get(edge, 0) + 1
    del garbage

    def per_conn(counts: dict[str, int]) -> list[tuple[str, float]]:
        return [(k, round(v / n, 2)) for k, v in sorted(counts.items(), key=lambda kv: -kv[1])[:top]]

    return {"connections": n, "objects_per_conn": round(len(found) / n, 1), "types": per_conn(types),
            "edges": per_conn(edges)}  # fmt: skip


def _handshake_pair(client_ctx: ssl.SSLContext, server_ctx: ssl.SSLContext) -> tuple[ssl.SSLObject, ssl.SSLObject]:
    """One full mutual-TLS handshake over memory BIOs, as the proxies make it (no SNI, no resumption)."""
    c_in, c_out, s_in, s_out = ssl.MemoryBIO(), ssl.MemoryBIO(), ssl.MemoryBIO(), ssl.MemoryBIO()
    client = client_ctx.wrap_bio(c_in, c_out, server_side=False, server_hostname=None)
    server = server_ctx.wrap_bio(s_in, s_out, server_side=True)
    client_done = server_done = False
    while not (client_done and server_done):
        if not client_done:
            try:
                client.do_handshake()
                client_done = True
            except ssl.SSLWantReadError:
                pass
        if c_out.pending:
            s_in.write(c_out.read())
        if not server_done:
            try:
                server.do_handshake()
                server_done = True
            except ssl.SSLWantReadError:
                pass
        if s_out.pending:
            c_in.write(s_out.read())
    # TLS 1.3: the client finishes first; the server is done (and has judged the client's certificate) once it
    # has read the client's Finished, which the loop above delivered.
    return client, server


def _measure_floor(client_cert: WorkloadCertificate, server_cert: WorkloadCertificate, count: int) -> dict[str, Any]:
    client_ctx, server_ctx = client_cert.client_context(), server_cert.server_context()
    for _ in range(20):  # warm-up: first-use costs (provider look-ups, lazily built stores)
        _handshake_pair(client_ctx, server_ctx)
    pairs = []
    t0 = time.process_time()
    for _ in range(count):
        pairs.append(_handshake_pair(client_ctx, server_ctx))
    handshake = time.process_time() - t0
    t0 = time.process_time()
    for client, server in pairs:
        check_peer(client.getpeercert(binary_form=True), trust_domain=TD, expected=frozenset({server_cert.identity}))
        check_peer(server.getpeercert(binary_form=True), trust_domain=TD, expected=None)
    check = time.process_time() - t0
    alpn = {(c.selected_alpn_protocol(), c.version(), s.version()) for c, s in pairs}
    return {
        "handshakes": count,
        "handshake_pair_cpu_us": round(handshake / count * 1e6, 1),
        "check_peer_pair_cpu_us": round(check / count * 1e6, 1),
        "negotiated": sorted(" ".join(str(x) for x in a) for a in alpn),
    }


async def _main(args: argparse.Namespace) -> dict[str, Any]:
    configure_logging(args.tmp / "proxy.log")  # the node proxy's own logging set-up, to a file
    tune_allocator()  # the C allocator's thresholds, as ``ambit nodeproxy`` fixes them at start-up
    tune_collector()  # and the collector's young threshold
    ca = LocalCa(args.tmp / "ca", trust_domain=TD)
    prefix = f"pc{secrets.token_hex(3)}"
    results: dict[str, Any] = {
        "loop": args.loop,
        "count": args.count,
        "cold": args.cold,
        "tls_transport": args.tls_transport,
        "load": round(os.getloadavg()[0], 2),
        "records": native.selection().describe() if args.tls_transport != "loop" else "the loop's",
    }

    def pool() -> ConnectionPool:
        return ConnectionPool(max_streams=1, idle_timeout=0) if args.cold else ConnectionPool()

    with _namespaces(prefix) as (client, server):
        workloads = [_workload(client), _workload(server)]
        echo = await asyncio.create_subprocess_exec(*_app(server.netns, "echo", "--port", str(APP_PORT)), cwd=ROOT)
        try:
            async with (
                _node_proxy(client, ca, workloads, args.tmp, pool(), args.kind) as client_proxy,
                _node_proxy(server, ca, workloads, args.tmp, pool(), args.kind) as server_proxy,
            ):
                contexts = [client_proxy, server_proxy]
                await asyncio.sleep(0.5)  # the echo server is listening
                warm = await _hold(client, min(args.count, 20))  # dials one pooled connection, loads certificates
                await _release(warm, contexts)
                if "rss" in args.measure:
                    results["rss"] = await _measure_rss(client, contexts, args.count)
                if "tracemalloc" in args.measure:
                    results["tracemalloc"] = await _measure_tracemalloc(client, contexts, args.count, args.top)
                if "rate" in args.measure:
                    results["rate"] = await _measure_rate(client, args.seconds, args.concurrency, args.profile)
                if "cycles" in args.measure:
                    results["cycles"] = await _measure_cycles(client, args.seconds, args.concurrency, args.top)
                if "floor" in args.measure:
                    client_cert = client_proxy.certs.find(_identity(client))
                    server_cert = server_proxy.certs.find(_identity(server))
                    assert client_cert is not None and server_cert is not None  # fetched by the warm-up
                    results["floor"] = _measure_floor(client_cert, server_cert, args.handshakes)
                results["pool"] = client_proxy.pool.stats()["connections"]
        finally:
            echo.terminate()
            await echo.wait()
    return results


PATHS: dict[str, dict[str, str]] = {
    "socket+python": {native.ENVIRONMENT: "0"},
    "socket+native": {native.ENVIRONMENT: "1"},
    "socket+frames": {native.ENVIRONMENT: "1", native.DATA_ENVIRONMENT: "1"},
}
"""The data paths of the socket transport, as the node proxy's environment selects them."""


def _use_transport(name: str) -> TlsTransportKind:
    """Select the data path ``name`` asks for in this process (see the module docstring); the transport kind."""
    if name == "loop":
        return "loop"
    native.use(native.select(PATHS[name]) if name in PATHS else None)  # None: this process's environment
    native.selection()  # a path that cannot be had fails here, before any namespace is made
    return "socket"


def _identity(pod: Pod) -> SpiffeId:
    return SpiffeId(TD, pod.info.namespace, pod.info.service_account or "default")


def _print(results: dict[str, Any]) -> None:
    print(f"loop={results['loop']} tls_transport={results['tls_transport']} records={results['records']} "
          f"connections={results['count']} pooled HBONE connections={results.get('pool')} load {results['load']}"
          f"{' (cold: one stream per connection, no reuse)' if results['cold'] else ''}")  # fmt: skip
    if "rss" in results:
        r = results["rss"]
        print(f"RSS growth: {r['rss_growth'] / 1024:.0f} KiB for {r['connections']} idle connections = "
              f"{r['per_conn'] / 1024:.2f} KiB/conn (both proxies; {r['live']} live proxy connections)")  # fmt: skip
    if "tracemalloc" in results:
        t = results["tracemalloc"]
        print(f"Python heap growth (tracemalloc): {t['per_conn'] / 1024:.2f} KiB/conn; top sites per connection:")
        for site in t["top"]:
            print(f"  {site['bytes_per_conn']:8.1f} B  {site['blocks_per_conn']:5.2f} blocks  {site['site']}")
    if "rate" in results:
        r = results["rate"]
        kind = "cold (a handshake each)" if results["cold"] else "pooled"
        print(f"{kind} new connections/s (1-byte echo, concurrent clients): {r['per_second']:.0f}/s "
              f"({r['connections']} in {r['wall_seconds']} s, {r['failures']} failures); "
              f"proxy CPU {r['proxy_cpu_us_per_conn']} µs/conn (user {r['proxy_user_us_per_conn']}, "
              f"system {r['proxy_system_us_per_conn']}); cyclic collector {r['collector_us_per_conn']} µs/conn "
              f"({r['collections']} runs, {r['collected_per_conn']} objects freed per connection)")  # fmt: skip
    if "cycles" in results:
        c = results["cycles"]
        print(f"left to the cyclic collector: {c['objects_per_conn']} objects per connection ({c['connections']} "
              "connections, collector off); by type, per connection:")  # fmt: skip
        for name, count in c["types"]:
            print(f"  {count:6.2f}  {name}")
        print("references between them, per connection:")
        for edge, count in c["edges"]:
            print(f"  {count:6.2f}  {edge}")
    if "floor" in results:
        f = results["floor"]
        print(f"handshake floor (memory BIOs, one process): {f['handshake_pair_cpu_us']} CPU-µs per mutual-TLS "
              f"handshake pair, check_peer {f['check_peer_pair_cpu_us']} µs per pair ({f['handshakes']} handshakes, "
              f"{', '.join(f['negotiated'])})")  # fmt: skip


def _report(results: dict[str, Any], as_json: bool) -> None:
    if as_json:
        print(json.dumps(results), flush=True)
    else:
        _print(results)
        sys.stdout.flush()


def _child_argv(args: argparse.Namespace, name: str, index: int) -> list[str]:
    """This harness's command line for one run of ``name`` (its ``index``), reporting in JSON."""
    argv = [sys.executable, str(Path(__file__).resolve()), "--tls-transport", name, "--json"]
    argv += ["--count", str(args.count), "--seconds", str(args.seconds), "--concurrency", str(args.concurrency)]
    argv += ["--loop", args.loop, "--measure", ",".join(sorted(args.measure)), "--handshakes", str(args.handshakes)]
    argv += ["--top", str(args.top), *(["--cold"] if args.cold else [])]
    if args.profile is not None:
        argv += ["--profile", f"{args.profile}.{index}.{name}"]
    return argv


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="bench/proxy_connections.py", description=__doc__.split("\n\n")[0])
    parser.add_argument("--count", type=int, default=2000, help="idle connections to hold (default 2000)")
    parser.add_argument("--seconds", type=float, default=5.0, help="length of the rate round (default 5)")
    parser.add_argument("--concurrency", type=int, default=8, help="concurrent clients in the rate round")
    parser.add_argument("--loop", choices=["uvloop", "asyncio"], default="uvloop")
    parser.add_argument(
        "--tls-transport",
        choices=["loop", "socket", *PATHS, "all"],
        default="loop",
        help="HBONE's TLS transport and data path: loop, socket+python (AMBIT_NATIVE=0), socket+native (records in "
        "C), socket+frames (records and DATA frames in C), socket (as AMBIT_NATIVE and AMBIT_NATIVE_DATA say), all "
        "(the first four, alternated)",
    )
    parser.add_argument("--rounds", type=int, default=1, help="rounds of every transport, alternated (default 1)")
    parser.add_argument(
        "--measure", default="rss,tracemalloc,rate", help="comma-separated: rss,tracemalloc,rate,cycles,floor"
    )
    parser.add_argument(
        "--cold",
        action="store_true",
        help="one stream per HBONE connection, closed when it ends (--pool-max-streams 1 --pool-idle-timeout 0)",
    )
    parser.add_argument("--handshakes", type=int, default=2000, help="handshakes in the floor loop")
    parser.add_argument("--top", type=int, default=15, help="tracemalloc sites, types and references in cycles to show")
    parser.add_argument("--profile", type=Path, help="write a cProfile of the rate round here")
    parser.add_argument("--json", action="store_true", help="print the results as one JSON object")
    args = parser.parse_args(argv)
    args.measure = set(args.measure.split(","))
    if os.geteuid() != 0:
        parser.error("needs root (it makes two network namespaces)")
    _, hard = resource.getrlimit(resource.RLIMIT_NOFILE)
    resource.setrlimit(resource.RLIMIT_NOFILE, (hard, hard))
    names = ["loop", *PATHS] if args.tls_transport == "all" else [args.tls_transport]
    try:
        for name in names:  # every path that will be measured can be had: fail before the first round, not later
            _use_transport(name)
    except native.NativeError as exc:
        parser.error(str(exc))
    if len(names) == 1 and args.rounds == 1:
        with tempfile.TemporaryDirectory(prefix="proxy-connections-") as tmp:
            args.tmp, args.kind = Path(tmp), _use_transport(args.tls_transport)
            _report(run(lambda: _main(args), args.loop), args.json)
        return 0
    for index in range(args.rounds * len(names)):  # each in a process of its own: RSS and heap figures start clean
        name = names[index % len(names)]
        child = subprocess.run(_child_argv(args, name, index), stdout=subprocess.PIPE, text=True, check=True)
        _report(json.loads(child.stdout.splitlines()[-1]), args.json)
    return 0


if __name__ == "__main__":
    sys.path.insert(0, str(ROOT))
    sys.exit(main())
