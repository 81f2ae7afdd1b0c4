"""The waypoint's CPU per request on loopback: ``ambit waypoint proxy`` as its own process, no lab, no root.

``.venv/bin/python -m bench.waypoint_loopback [--rate R] [--requests N] [--seconds S] [--tunnels T]
[--protocols http1,http2] [--tls-transport loop|socket] [--profile FILE]`` (``make bench-waypoint``) starts:

- the waypoint in a child process, configured as the integration rig configures it (a local config file and a
  local CA, :mod:`tests.integration.waypoint_rig`): its own event loop (uvloop, as the command runs it), its own
  logging and access log (to ``/dev/null``), so its CPU is the waypoint's alone; both its HBONE legs on
  ``--tls-transport`` (the loop's by default, as ``ambit waypoint proxy``; ``socket`` uses the native TLS records
  when :mod:`ambit.native` loads them);
- in this process, one endpoint (an HBONE server whose tunnels are answered by a tiny HTTP/1.1 server: every
  request gets a 1 KiB body) and a client: ``--tunnels`` HBONE tunnels to the echo Service's VIP through the
  waypoint, each carrying keep-alive HTTP/1.1 requests (``http1``) or one HTTP/2 connection with prior knowledge
  (``http2``; the waypoint still speaks HTTP/1.1 to the endpoint, whose port is declared HTTP), one request at
  a time per tunnel, all paced together at ``--rate`` requests/s.

``--rate 1000 --tunnels 10`` is the lab's fixed-rate scenario (``make bench-l7``: 10 connections x 100 req/s, each
request alone on its connection, so every request pays the wake-ups a busy proxy shares); a ``--rate`` far above
what the client reaches (``--rate 50000 --tunnels 16``) saturates it instead, as the lab's keep-alive scenario does.

A run ends after ``--requests`` requests or ``--seconds`` seconds, whichever comes first. Measured on the child,
from ``/proc/<pid>/stat`` (user + system time) over the paced part only (start-up and warm-up excluded): CPU
seconds per 1,000 requests, which is vCPU per 1,000 req/s; the child's RSS (``VmRSS``, and its peak ``VmHWM``);
the achieved rate, the client's p50/p99 latency, the load average at the end, and the wake-ups per request (the
voluntary context switches of the child's main thread, where its event loop runs: its waits for events that
blocked). At a fixed rate the CPU per request depends on how many requests each wake-up serves: on a loaded machine
the waypoint answers later, requests of different tunnels meet in one loop iteration, and each costs less (the
client's p50 rises with it); compare runs of like p50 and wake-ups, or medians of alternating rounds.

CPU per request is steady even on a loaded machine (time the process did not get is not charged to it, and the
work per request does not change), so this figure can be compared across commits while other jobs run; the
latency and the achieved rate cannot. On a machine with more runnable work than cores it still drifts by some
10-15% (caches and frequency are shared), so compare commits in alternating runs, several rounds each. The client
and endpoint are Python too: at high rates on a loaded machine they, not the waypoint, limit the achieved rate,
which is why the rate is fixed and modest.

``--gc`` times the child's cyclic garbage collector (``gc.callbacks``, start to stop, per generation) over the
paced part and prints, per protocol, the collections and their CPU-µs per request (the child writes its running
totals to a file on ``SIGUSR1``, asked for before and after the paced part).

``--profile FILE`` runs the child under cProfile (timed by CPU time, not wall time) and writes its stats to
``FILE`` (``python -m pstats FILE``); with ``--top N`` the N entries of highest own time are printed. CPU under
the profiler is not comparable.
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
import pstats
import signal
import socket
import subprocess
import sys
import tempfile
import time
import urllib.request
from collections.abc import Awaitable, Callable
from dataclasses import dataclass
from pathlib import Path

import h2.config
import h2.connection
import h2.events

from ambit.identity.localca import LocalCa
from ambit.model.identity import SpiffeId
from ambit.model.localconfig import LocalConfig, render_local_config
from ambit.model.workload import (
    AppProtocol,
    GatewayAddress,
    NamespacedHostname,
    NetworkAddress,
    PortMapping,
    Service,
    TunnelProtocol,
    Workload,
)
from ambit.proxy.hbone_client import HboneClient
from ambit.proxy.hbone_server import HboneServer, InboundRequest, TunnelResponder
from ambit.proxy.hbone_stream import HboneStream
from ambit.tls.workload import WorkloadCertificate
from bench.mesh.probes import cpu_seconds
from bench.server_process import free_port

TD = "cluster.local"
WAYPOINT_IP = "127.0.0.61"
ENDPOINT_IP = "127.0.0.62"
CLIENT_IP = "127.0.0.64"
"""Loopback addresses of their own, apart from the integration rigs' (127.0.0.1-5) that tests may be using."""
ECHO_VIP = "198.18.61.1"
AUTHORITY = f"{ECHO_VIP}:80"
HOST = "echo.bench.svc.cluster.local"
CLIENT_ID = SpiffeId(TD, "bench", "client")
ENDPOINT_ID = SpiffeId(TD, "bench", "echo")
WAYPOINT_ID = SpiffeId(TD, "bench", "waypoint")
BODY = b"x" * 1024
RESPONSE = b"HTTP/1.1 200 OK\r\ncontent-type: text/plain\r\ncontent-length: %d\r\n\r\n%s" % (len(BODY), BODY)
WARMUP_REQUESTS = 200


def mesh_config() -> LocalConfig:
    waypoint = GatewayAddress(NamespacedHostname("bench", f"waypoint.bench.svc.{TD}"))

    def workload(name: str, ip: str, *services: str) -> Workload:
        return Workload(
            uid=f"Kubernetes//Pod/bench/{name}",
            name=name,
            namespace="bench",
            addresses=(ipaddress.ip_address(ip),),
            tunnel_protocol=TunnelProtocol.HBONE,
            service_account=name,
            canonical_name=name,
            services={f"bench/{s}.bench.svc.{TD}": (PortMapping(80, 8080),) for s in services},
        )

    echo = Service(
        name="echo",
        namespace="bench",
        hostname=HOST,
        vips=(NetworkAddress("", ipaddress.ip_address(ECHO_VIP)),),
        ports=(PortMapping(80, 8080, AppProtocol.HTTP11),),
        waypoint=waypoint,
    )
    return LocalConfig(
        workloads=(workload("client", CLIENT_IP), workload("echo", ENDPOINT_IP, "echo")), services=(echo,)
    )


# --- the waypoint child -----------------------------------------------------------------------------------------


def run_child(spec: dict[str, object], profile: str | None) -> None:
    """The waypoint process: the rig's local-config settings, run as ``ambit waypoint proxy`` runs it."""
    from ambit.cli.process_logging import configure_logging
    from ambit.heap import tune_collector
    from ambit.inpod import eventloop
    from ambit.waypoint.process import run_waypoint
    from ambit.waypoint.settings import WaypointLimits, WaypointSettings

    configure_logging()
    tune_collector()  # as ``run_l7`` does for ``ambit waypoint proxy`` and ``ambit gateway``
    settings = WaypointSettings(
        namespace="bench",
        gateway_name="waypoint",
        service_account="waypoint",
        pod_name="waypoint-0",
        instance_ip=WAYPOINT_IP,
        config_file=Path(str(spec["config"])),
        local_ca_dir=Path(str(spec["ca"])),
        hbone_port=int(str(spec["hbone_port"])),
        admin_port=free_port(),
        stats_port=free_port(),
        readiness_port=int(str(spec["readiness_port"])),
        upstream_hbone_port=int(str(spec["upstream_port"])),
        limits=WaypointLimits(drain_time=0.0),
        tls_transport="socket" if spec.get("tls_transport") == "socket" else "loop",
    )
    if gc_file := spec.get("gc_file"):
        time_collections(Path(str(gc_file)))
    profiler = cProfile.Profile(time.process_time) if profile else None
    if profiler is not None:
        profiler.enable()
    try:
        eventloop.run(lambda: run_waypoint(settings), "uvloop")
    finally:
        if profiler is not None:
            profiler.disable()
            profiler.dump_stats(profile)


def time_collections(report: Path) -> None:
    """Count the collector's runs and their CPU time per generation; write the totals to ``report`` on SIGUSR1."""
    counts, seconds = [0, 0, 0], [0.0, 0.0, 0.0]
    started = [0.0]

    def timed(phase: str, info: dict[str, int]) -> None:
        if phase == "start":
            started[0] = time.process_time()
        else:
            generation = info["generation"]
            counts[generation] += 1
            seconds[generation] += time.process_time() - started[0]

    def dump(_signum: int, _frame: object) -> None:
        report.write_text(json.dumps({"counts": counts, "seconds": seconds}), encoding="utf-8")

    gc.callbacks.append(timed)
    signal.signal(signal.SIGUSR1, dump)


def collections_now(pid: int, report: Path) -> dict[str, list[float]]:
    """The child's collector totals, asked for by SIGUSR1 (the child answers from its event loop)."""
    report.unlink(missing_ok=True)
    os.kill(pid, signal.SIGUSR1)
    for _ in range(200):
        with contextlib.suppress(FileNotFoundError, ValueError):
            totals: dict[str, list[float]] = json.loads(report.read_text(encoding="utf-8"))
            return totals
        time.sleep(0.01)
    raise RuntimeError("the waypoint did not report its collections")


# --- the endpoint: an HBONE server answering HTTP/1.1 in its tunnels -------------------------------------------


async def answer_http1(stream: HboneStream) -> None:
    """Every request on the tunnel (a GET, or a body framed by content-length) gets :data:`RESPONSE`."""
    buffer = b""
    while True:
        while (end := buffer.find(b"\r\n\r\n")) < 0:
            chunk = await stream.read()
            if not chunk:
                return
            buffer += chunk
        head, buffer = buffer[:end].lower(), buffer[end + 4 :]
        length = 0
        if (at := head.find(b"\r\ncontent-length:")) >= 0:
            length = int(head[at + 17 :].split(b"\r\n", 1)[0])
        while len(buffer) < length:
            chunk = await stream.read()
            if not chunk:
                return
            buffer += chunk
        buffer = buffer[length:]
        await stream.write(RESPONSE)


class EchoEndpoint:
    def __init__(self, cert: WorkloadCertificate, port: int) -> None:
        self.cert, self.port = cert, port
        self._tasks: set[asyncio.Task[None]] = set()

    async def start(self) -> None:
        self._listener = socket.socket()
        self._listener.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        self._listener.bind((ENDPOINT_IP, self.port))
        self._listener.listen(64)
        self._listener.setblocking(False)
        self._accepting = asyncio.create_task(self._accept())

    async def _accept(self) -> None:
        loop = asyncio.get_running_loop()
        while True:
            sock, _ = await loop.sock_accept(self._listener)
            task = asyncio.create_task(HboneServer.serve(sock, self._cert, trust_domain=TD, handler=self._handle))
            self._tasks.add(task)
            task.add_done_callback(self._tasks.discard)

    async def _cert(self) -> WorkloadCertificate:
        return self.cert

    async def _handle(self, request: InboundRequest, responder: TunnelResponder) -> None:
        stream = responder.accept()
        with contextlib.suppress(Exception):
            await answer_http1(stream)

    async def aclose(self) -> None:
        self._accepting.cancel()
        for task in list(self._tasks):
            task.cancel()
        await asyncio.gather(self._accepting, *self._tasks, return_exceptions=True)
        self._listener.close()


# --- the client ---------------------------------------------------------------------------------------------------


class Http1Tunnel:
    """Keep-alive GETs on one tunnel; the answer is read up to its content-length."""

    def __init__(self, stream: HboneStream) -> None:
        self.stream = stream
        self.request = f"GET /echo HTTP/1.1\r\nhost: {HOST}\r\nuser-agent: bench\r\n\r\n".encode()
        self.buffer = b""

    async def call(self) -> None:
        await self.stream.write(self.request)
        while (end := self.buffer.find(b"\r\n\r\n")) < 0:
            self.buffer += await self._read()
        head, rest = self.buffer[:end].lower(), self.buffer[end + 4 :]
        if not head.startswith(b"http/1.1 200"):
            raise RuntimeError(f"unexpected answer {head[:80]!r}")
        at = head.find(b"\r\ncontent-length:")
        length = int(head[at + 17 :].split(b"\r\n", 1)[0]) if at >= 0 else 0
        while len(rest) < length:
            rest += await self._read()
        self.buffer = rest[length:]

    async def _read(self) -> bytes:
        chunk = await self.stream.read()
        if not chunk:
            raise RuntimeError("the waypoint closed the tunnel")
        return chunk


class Http2Tunnel:
    """One HTTP/2 connection (prior knowledge) on one tunnel, one GET at a time."""

    def __init__(self, stream: HboneStream) -> None:
        self.stream = stream
        self.h2 = h2.connection.H2Connection(h2.config.H2Configuration(client_side=True, header_encoding="utf-8"))
        self.h2.initiate_connection()
        self.started = False

    async def call(self) -> None:
        sid = self.h2.get_next_available_stream_id()
        request = [(":method", "GET"), (":scheme", "http"), (":authority", HOST), (":path", "/echo")]
        self.h2.send_headers(sid, request, end_stream=True)
        await self.stream.write(self.h2.data_to_send())
        while True:
            data = await self.stream.read()
            if not data:
                raise RuntimeError("the waypoint closed the tunnel")
            done = False
            for event in self.h2.receive_data(data):
                if isinstance(event, h2.events.DataReceived):
                    self.h2.acknowledge_received_data(event.flow_controlled_length, event.stream_id)
                elif isinstance(event, h2.events.StreamReset) and event.stream_id == sid:
                    raise RuntimeError("the waypoint reset the stream")
                elif isinstance(event, h2.events.StreamEnded) and event.stream_id == sid:
                    done = True
            if pending := self.h2.data_to_send():
                await self.stream.write(pending)
            if done:
                return


@dataclass
class Result:
    protocol: str
    requests: int
    seconds: float
    cpu: float
    rss_mib: float
    peak_mib: float
    p50_ms: float
    p99_ms: float
    load: str
    wakeups: int = 0
    """The child's main thread's voluntary context switches over the paced part: its event loop's waits for events
    that blocked (a wait that finds events already there, as on a busy machine, is not counted)."""
    collections: tuple[int, int, int] = (0, 0, 0)
    """With ``--gc``: the collector's runs per generation over the paced part."""
    collection_cpu: tuple[float, float, float] = (0.0, 0.0, 0.0)
    """With ``--gc``: their CPU seconds per generation."""

    @property
    def vcpu_per_1000(self) -> float:
        return self.cpu / self.requests * 1000 if self.requests else 0.0

    def row(self) -> str:
        return (
            f"| {self.protocol} | {self.requests} | {self.requests / self.seconds:,.0f} | {self.vcpu_per_1000:.3f} "
            f"| {1e6 * self.cpu / max(self.requests, 1):.0f} | {self.wakeups / max(self.requests, 1):.2f} "
            f"| {self.rss_mib:.1f} | {self.peak_mib:.1f} "
            f"| {self.p50_ms:.2f} | {self.p99_ms:.2f} | {self.load} |"
        )

    def collection_row(self) -> str:
        per_request = [1e6 * s / max(self.requests, 1) for s in self.collection_cpu]
        share = sum(self.collection_cpu) / self.cpu if self.cpu else 0.0
        return (
            f"| {self.protocol} | {' / '.join(map(str, self.collections))} "
            f"| {' / '.join(f'{x:.2f}' for x in per_request)} | {sum(per_request):.2f} | {100 * share:.1f} % |"
        )


HEADER = (
    "| protocol | requests | req/s | vCPU per 1,000 req/s | CPU µs/request | wake-ups/request | RSS MiB | peak RSS MiB "
    "| p50 ms | p99 ms | load average |\n|---|---|---|---|---|---|---|---|---|---|---|"
)


COLLECTION_HEADER = (
    "| protocol | collections gen 0 / 1 / 2 | CPU µs/request gen 0 / 1 / 2 | total µs/request | share of CPU |\n"
    "|---|---|---|---|---|"
)


def status_field(pid: int, field: str) -> int:
    """A number of ``/proc/<pid>/status`` (the main thread's, for per-thread fields)."""
    for line in Path(f"/proc/{pid}/status").read_text().splitlines():
        if line.startswith(field + ":"):
            return int(line.split()[1])
    return 0


def memory_mib(pid: int, field: str) -> float:
    return status_field(pid, field) / 1024


async def paced_calls(
    calls: list[Callable[[], Awaitable[object]]], rate: float, requests: int, seconds: float
) -> list[float]:
    """``requests`` calls spread over ``calls`` (one connection or tunnel each, one call in flight on each), paced
    to ``rate`` per second in all, staggered, for at most ``seconds``: the latency of each, in seconds."""
    latencies: list[float] = []
    loop = asyncio.get_running_loop()
    interval = len(calls) / rate
    began = loop.time()
    deadline = began + seconds
    per_call = requests // len(calls)

    async def paced(index: int, call: Callable[[], Awaitable[object]]) -> None:
        due = began + index * interval / len(calls)
        for _ in range(per_call):
            if (now := loop.time()) < due:
                await asyncio.sleep(due - now)
            if loop.time() > deadline:
                return
            sent = loop.time()
            await call()
            latencies.append(loop.time() - sent)
            due += interval

    await asyncio.gather(*(paced(i, c) for i, c in enumerate(calls)))
    return latencies


async def drive(client: HboneClient, protocol: str, args: argparse.Namespace, pid: int, gc_file: Path | None) -> Result:
    tunnels = []
    for _ in range(args.tunnels):
        stream = await client.open_tunnel(AUTHORITY, [("forwarded", f'for="{CLIENT_IP}:1"')])
        tunnels.append(Http1Tunnel(stream) if protocol == "http1" else Http2Tunnel(stream))
    for _ in range(WARMUP_REQUESTS // args.tunnels):
        await asyncio.gather(*(t.call() for t in tunnels))
    gc_before = await asyncio.to_thread(collections_now, pid, gc_file) if gc_file else None
    cpu_before, switches_before = cpu_seconds([pid]), status_field(pid, "voluntary_ctxt_switches")
    loop = asyncio.get_running_loop()
    began = loop.time()
    latencies = await paced_calls([t.call for t in tunnels], args.rate, args.requests, args.seconds)
    cpu = cpu_seconds([pid]) - cpu_before
    wakeups = status_field(pid, "voluntary_ctxt_switches") - switches_before
    collections, collection_cpu = (0, 0, 0), (0.0, 0.0, 0.0)
    if gc_file and gc_before:
        gc_after = await asyncio.to_thread(collections_now, pid, gc_file)
        a, b = gc_after["counts"], gc_before["counts"]
        collections = (int(a[0] - b[0]), int(a[1] - b[1]), int(a[2] - b[2]))
        a, b = gc_after["seconds"], gc_before["seconds"]
        collection_cpu = (a[0] - b[0], a[1] - b[1], a[2] - b[2])
    seconds = loop.time() - began
    latencies.sort()
    for tunnel in tunnels:
        with contextlib.suppress(Exception):
            tunnel.stream.write_eof()
    return Result(
        protocol="HTTP/1.1 keep-alive" if protocol == "http1" else "HTTP/2",
        requests=len(latencies),
        seconds=seconds,
        cpu=cpu,
        rss_mib=memory_mib(pid, "VmRSS"),
        peak_mib=memory_mib(pid, "VmHWM"),
        p50_ms=1000 * latencies[len(latencies) // 2] if latencies else 0.0,
        p99_ms=1000 * latencies[int(len(latencies) * 0.99)] if latencies else 0.0,
        load=" ".join(f"{x:.2f}" for x in os.getloadavg()),
        wakeups=wakeups,
        collections=collections,
        collection_cpu=collection_cpu,
    )


def wait_ready(port: int, child: subprocess.Popen[bytes], timeout: float = 30.0, host: str = WAYPOINT_IP) -> None:
    end = time.monotonic() + timeout
    while time.monotonic() < end:
        if child.poll() is not None:
            raise RuntimeError(f"the waypoint exited with status {child.returncode}")
        url = f"http://{host}:{port}/healthz/ready"
        with contextlib.suppress(OSError), urllib.request.urlopen(url, timeout=1) as answer:
            if answer.status == 200:
                return
        time.sleep(0.1)
    raise RuntimeError("the waypoint did not become ready")


async def run(args: argparse.Namespace, directory: Path) -> list[Result]:
    ca = LocalCa(directory / "ca", trust_domain=TD)
    client_cert, endpoint_cert = await asyncio.gather(
        ca.fetch_certificate(CLIENT_ID), ca.fetch_certificate(ENDPOINT_ID)
    )
    config = directory / "mesh.yaml"
    config.write_text(render_local_config(mesh_config()), encoding="utf-8")
    endpoint = EchoEndpoint(endpoint_cert, free_port(ENDPOINT_IP))
    await endpoint.start()
    spec = {
        "config": str(config),
        "ca": str(directory / "ca"),
        "hbone_port": free_port(WAYPOINT_IP),
        "readiness_port": free_port(WAYPOINT_IP),
        "upstream_port": endpoint.port,
        "tls_transport": args.tls_transport,
    }
    gc_file = directory / "collections.json" if args.gc else None
    if gc_file:
        spec["gc_file"] = str(gc_file)
    command = [sys.executable, "-m", "bench.waypoint_loopback", "--child", json.dumps(spec)]
    if args.profile:
        command += ["--profile", args.profile]
    child = subprocess.Popen(command, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)  # noqa: ASYNC220
    results: list[Result] = []
    try:
        await asyncio.to_thread(wait_ready, int(str(spec["readiness_port"])), child)
        for protocol in args.protocols.split(","):
            loop = asyncio.get_running_loop()
            sock = socket.socket()
            sock.setblocking(False)
            sock.bind((CLIENT_IP, 0))
            await loop.sock_connect(sock, (WAYPOINT_IP, int(str(spec["hbone_port"]))))
            client = await HboneClient.connect(sock, client_cert, frozenset({WAYPOINT_ID}), trust_domain=TD)
            try:
                results.append(await drive(client, protocol, args, child.pid, gc_file))
            finally:
                await client.aclose()
    finally:
        await stop_child(child)
        await endpoint.aclose()
    return results


async def stop_child(child: subprocess.Popen[bytes]) -> None:
    """End the proxy under test: SIGTERM twice (the second skips its drain), then SIGKILL after 20 s."""
    child.send_signal(signal.SIGTERM)
    await asyncio.sleep(0.5)
    child.send_signal(signal.SIGTERM)
    try:
        await asyncio.to_thread(child.wait, 20)
    except subprocess.TimeoutExpired:
        child.kill()


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--rate", type=float, default=500.0, help="requests per second, over all tunnels")
    parser.add_argument("--requests", type=int, default=10_000, help="requests per protocol")
    parser.add_argument("--seconds", type=float, default=30.0, help="at most this long per protocol")
    parser.add_argument("--tunnels", type=int, default=4)
    parser.add_argument("--protocols", default="http1,http2")
    parser.add_argument(
        "--tls-transport",
        choices=("loop", "socket"),
        default="loop",
        help="the waypoint's HBONE TLS transport (socket: with the native TLS records when they load)",
    )
    parser.add_argument("--gc", action="store_true", help="time the waypoint's garbage collector per generation")
    parser.add_argument("--profile", help="run the waypoint under cProfile, stats to this file")
    parser.add_argument("--top", type=int, default=0, help="with --profile: print the N entries of most own time")
    parser.add_argument("--child", help=argparse.SUPPRESS)
    args = parser.parse_args()
    if args.child:
        run_child(json.loads(args.child), args.profile)
        return
    if args.profile:
        args.profile = str(Path(args.profile).resolve())
    with tempfile.TemporaryDirectory(prefix="ambit-wp-bench-") as tmp:
        results = asyncio.run(run(args, Path(tmp)))
    print(f"waypoint on loopback: {args.rate:,.0f} req/s paced over {args.tunnels} tunnels, 1 KiB answers")
    print(HEADER)
    for result in results:
        print(result.row())
    if args.gc:
        print()
        print(COLLECTION_HEADER)
        for result in results:
            print(result.collection_row())
    if args.profile and args.top:
        pstats.Stats(args.profile).sort_stats("tottime").print_stats(args.top)


if __name__ == "__main__":
    main()
