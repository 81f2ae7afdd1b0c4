"""HBONE shell microbenchmark: both node-proxy roles in one process on loopback, over real mutual TLS.

``.venv/bin/python bench/hbone_loopback.py [--seconds S] [--loop uvloop|asyncio]`` runs, in this process, an
"outbound" listener whose connections are relayed into pooled HBONE tunnels (``ConnectionPool`` →
``HboneClient``) and the HBONE server (``HboneServer``) that relays each tunnel to an echo server. A child process
holds the application ends (the echo server and the client), so this process's CPU (``getrusage``) is the proxy
work alone: both proxies' Python, TLS and syscalls, as in the lab but without veths, nftables or a second process.
Each relay counts its bytes into an :class:`~ambit.proxy.accounting.Accounting` (metrics and access log), as the
node proxy's do.

Printed: 1-byte request/response round trips per second on one connection, proxy CPU µs per round trip, and the
round trip's p50, p99 and p99.9 as the client saw it;
bulk MB/s one way through one tunnel, and proxy CPU seconds per GB.

``--peer stunnel`` runs the same applications through a stunnel pair on loopback instead (the C baseline: mutual
TLS 1.3 with ECDSA P-256 certificates, as :mod:`bench.mesh.tunnels` configures it for the lab; CPU is the two
stunnel processes'), so the two can be compared in one run; ``--peer both`` alternates them ``--rounds`` times.
``--tls-transport`` picks ambit's HBONE TLS transport: ``loop``, ``socket`` (records in Python), ``socket+native``
(records in C, :mod:`ambit.native`; the extension must be built), ``socket+frames`` (records and the DATA frames of
attached streams in C), ``socket+relay`` (those and the relay's plain socket side in C: step 3), ``both`` (loop and
socket) or ``all`` (the five).
``--calls TOP`` counts Python and C calls per round trip (per MB in bulk) under cProfile instead, and names the
``TOP`` most called: the figure to compare across commits on a loaded machine. ``--modes bulk4`` sends four
streams at once. Caveat for it: here both ambit roles share one thread, while each
stunnel runs a thread per connection, so compare CPU per GB rather than MB/s there. The allocator is tuned as
``ambit nodeproxy`` tunes it (:func:`ambit.inpod.allocator.tune_allocator`).
"""

from __future__ import annotations

import argparse
import asyncio
import cProfile
import json
import os
import resource
import socket
import subprocess
import sys
import tempfile
import time
from pathlib import Path

from ambit import native
from ambit.heap import tune_collector
from ambit.identity.localca import LocalCa
from ambit.inpod.allocator import tune_allocator
from ambit.model.identity import SpiffeId
from ambit.proxy.accounting import Accounting
from ambit.proxy.hbone_client import HboneClient
from ambit.proxy.hbone_server import HboneServer, InboundRequest, TunnelResponder
from ambit.proxy.pool import ConnectionPool, PoolKey
from ambit.proxy.sockets import HostSocketFactory, connect
from ambit.proxy.streams import ByteStream, SocketStream
from ambit.telemetry.accesslog import AccessLog, ConnectionRecord
from ambit.telemetry.metrics import ProxyMetrics, Reporter, TrafficLabels
from ambit.tls.socket_transport import TLS_TRANSPORTS, TlsTransportKind
from bench.mesh.probes import cpu_seconds
from bench.mesh.tunnels import make_credentials
from bench.relaying import relay

TD = "cluster.local"
CLIENT = SpiffeId(TD, "bench", "client")
SERVER = SpiffeId(TD, "bench", "server")

_APPS = r"""
import socket, sys, threading, time, json
mode, seconds = sys.argv[1], float(sys.argv[2])
echo = socket.socket(); echo.bind(("127.0.0.1", 0)); echo.listen(8)
def serve():
    while True:
        conn, _ = echo.accept()
        conn.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
        def run(conn=conn):
            while data := conn.recv(262144):
                if mode == "rr":
                    conn.sendall(data)
            conn.close()
        threading.Thread(target=run, daemon=True).start()
threading.Thread(target=serve, daemon=True).start()
print(echo.getsockname()[1], flush=True)
port = int(sys.stdin.readline())
streams = 4 if mode == "bulk4" else 1
clients = [socket.create_connection(("127.0.0.1", port)) for _ in range(streams)]
for client in clients:
    client.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
count, totals, start = 0, [0] * streams, time.perf_counter()
took = []
if mode == "rr":
    client = clients[0]
    clock = time.perf_counter
    while (sent := clock()) - start < seconds:
        client.sendall(b"x"); client.recv(16); count += 1
        took.append(clock() - sent)
else:
    block = b"\xa5" * 262144
    def send(i):
        while time.perf_counter() - start < seconds:
            clients[i].sendall(block); totals[i] += len(block)
    senders = [threading.Thread(target=send, args=(i,)) for i in range(streams)]
    for sender in senders: sender.start()
    for sender in senders: sender.join()
for client in clients:
    client.shutdown(socket.SHUT_WR); client.recv(16)
took.sort()
tail = {f"p{q:g}": took[min(int(len(took) * q / 100), len(took) - 1)] for q in (50, 99, 99.9)} if took else {}
print(json.dumps({"count": count, "bytes": sum(totals), "seconds": time.perf_counter() - start} | tail), flush=True)
"""


async def run(mode: str, seconds: float, directory: Path, tls_transport: TlsTransportKind = "loop") -> dict[str, float]:
    ca = LocalCa(directory / "ca", trust_domain=TD)
    client_cert, server_cert = await asyncio.gather(ca.fetch_certificate(CLIENT), ca.fetch_certificate(SERVER))
    factory = HostSocketFactory(mark=None)
    apps = subprocess.Popen(  # noqa: ASYNC220 - started once, before the measurement
        [sys.executable, "-c", _APPS, mode, str(seconds)], stdin=subprocess.PIPE, stdout=subprocess.PIPE, text=True
    )
    assert apps.stdin is not None and apps.stdout is not None
    echo_port = int(apps.stdout.readline())
    loop = asyncio.get_running_loop()

    async def cert() -> object:
        return server_cert

    metrics, access_log = ProxyMetrics(), AccessLog()

    async def relay_counted(downstream: ByteStream, upstream: ByteStream, reporter: Reporter) -> None:
        counted = Accounting(metrics, access_log, TrafficLabels(reporter), ConnectionRecord("bench", "client", "echo"))
        counted.opened()
        result = await relay(downstream, upstream, counter=counted)
        counted.finish(result.error)

    async def handle(request: InboundRequest, responder: TunnelResponder) -> None:
        upstream = SocketStream(await connect(factory, ("127.0.0.1", echo_port)))
        await relay_counted(responder.accept(), upstream, Reporter.DESTINATION)
        await upstream.aclose()

    hbone = socket.create_server(("127.0.0.1", 0))
    hbone.setblocking(False)
    hbone_addr = hbone.getsockname()[:2]

    running: set[asyncio.Task[object]] = set()

    def spawn(coro: object) -> None:
        task: asyncio.Task[object] = loop.create_task(coro)  # type: ignore[arg-type]
        running.add(task)
        task.add_done_callback(running.discard)

    async def serve_hbone() -> None:
        while True:
            sock, _ = await loop.sock_accept(hbone)
            sock.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
            spawn(HboneServer.serve(sock, cert, trust_domain=TD, handler=handle, tls_transport=tls_transport))  # type: ignore[arg-type]

    pool = ConnectionPool()
    key = PoolKey(CLIENT, frozenset({SERVER}), "127.0.0.1", hbone_addr)

    async def dial() -> HboneClient:
        sock = await connect(factory, hbone_addr)
        return await HboneClient.connect(
            sock, client_cert, frozenset({SERVER}), trust_domain=TD, tls_transport=tls_transport
        )

    outbound = socket.create_server(("127.0.0.1", 0))
    outbound.setblocking(False)

    async def serve_outbound() -> None:
        while True:
            sock, _ = await loop.sock_accept(outbound)
            sock.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
            tunnel = await pool.open_tunnel(key, f"127.0.0.1:{echo_port}", [], dial)
            spawn(relay_counted(SocketStream(sock), tunnel, Reporter.SOURCE))

    tasks = [loop.create_task(serve_hbone()), loop.create_task(serve_outbound())]
    before = resource.getrusage(resource.RUSAGE_SELF)
    apps.stdin.write(f"{outbound.getsockname()[1]}\n")
    apps.stdin.flush()
    line = await asyncio.to_thread(apps.stdout.readline)
    after = resource.getrusage(resource.RUSAGE_SELF)
    apps.wait()
    for task in tasks:
        task.cancel()
    result = json.loads(line)
    cpu = (after.ru_utime - before.ru_utime) + (after.ru_stime - before.ru_stime)
    user = after.ru_utime - before.ru_utime
    return _figures(mode, result, cpu, user)


def _figures(mode: str, result: dict[str, float], cpu: float, user: float | None) -> dict[str, float]:
    if mode == "rr":
        figures = {"round trips/s": result["count"] / result["seconds"], "proxy CPU µs/RT": cpu / result["count"] * 1e6}
        if user is not None:
            figures["of which user µs/RT"] = user / result["count"] * 1e6
        for q in ("p50", "p99", "p99.9"):  # the round trip as the client saw it, proxies and applications
            if q in result:
                figures[f"{q} µs"] = result[q] * 1e6
        return figures
    gigabytes = result["bytes"] / 1e9
    figures = {"MB/s": result["bytes"] / result["seconds"] / 1e6, "proxy CPU-s/GB": cpu / gigabytes}
    if user is not None:
        figures["of which user CPU-s/GB"] = user / gigabytes
    return figures


def _free_port() -> int:
    with socket.socket() as probe:
        probe.bind(("127.0.0.1", 0))
        return int(probe.getsockname()[1])


def _user_seconds(pids: list[int]) -> float:
    total = 0.0
    for pid in pids:
        fields = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()
        total += int(fields[11]) / os.sysconf("SC_CLK_TCK")
    return total


def run_stunnel(mode: str, seconds: float, directory: Path) -> dict[str, float]:
    """The same applications through a stunnel pair on loopback (client side, then server side, then the echo)."""
    creds = make_credentials(directory)
    apps = subprocess.Popen(
        [sys.executable, "-c", _APPS, mode, str(seconds)], stdin=subprocess.PIPE, stdout=subprocess.PIPE, text=True
    )
    assert apps.stdin is not None and apps.stdout is not None
    echo_port = int(apps.stdout.readline())
    local_port, tls_port = _free_port(), _free_port()
    common = ["foreground = yes", "pid =", "debug = 3", "syslog = no", "socket = l:TCP_NODELAY=1"]
    common += ["socket = r:TCP_NODELAY=1", "[echo]", f"CAfile = {creds.ca}", "verifyChain = yes"]
    server = [f"cert = {creds.server_pem}", f"accept = 127.0.0.1:{tls_port}", f"connect = 127.0.0.1:{echo_port}"]
    client = [f"cert = {creds.client_pem}", "client = yes", f"accept = 127.0.0.1:{local_port}"]
    client.append(f"connect = 127.0.0.1:{tls_port}")
    configs = {"server": common + server, "client": common + client}
    tunnels: list[subprocess.Popen[bytes]] = []
    try:
        for side, lines in configs.items():
            config = directory / f"stunnel-{side}.conf"
            config.write_text("\n".join(lines) + "\n")
            tunnels.append(subprocess.Popen(["stunnel", str(config)], stderr=subprocess.DEVNULL))
        deadline = time.monotonic() + 10
        while True:  # wait until the client side listens
            try:
                socket.create_connection(("127.0.0.1", local_port), timeout=1).close()
                break
            except OSError:
                if time.monotonic() > deadline:
                    raise
                time.sleep(0.05)
        pids = [proc.pid for proc in tunnels]
        before, before_user = cpu_seconds(pids), _user_seconds(pids)
        apps.stdin.write(f"{local_port}\n")
        apps.stdin.flush()
        line = apps.stdout.readline()
        cpu, user = cpu_seconds(pids) - before, _user_seconds(pids) - before_user
        apps.wait()
    finally:
        for proc in tunnels:
            proc.terminate()
            proc.wait()
        if apps.poll() is None:
            apps.terminate()
            apps.wait()
    return _figures(mode, json.loads(line), cpu, user)


def count_calls(mode: str, seconds: float, top: int, tls_transport: TlsTransportKind = "loop") -> None:
    """Run ``mode`` under cProfile and print the calls per round trip (``rr``) or per MB (bulk), Python functions and
    C functions apart, and the ``top`` most called: a figure that, unlike CPU time, a loaded machine does not move."""
    profile = cProfile.Profile()

    async def profiled(directory: Path) -> dict[str, float]:
        profile.enable()
        try:
            return await run(mode, seconds, directory, tls_transport)
        finally:
            profile.disable()

    import uvloop

    with tempfile.TemporaryDirectory(prefix="ambit-bench-hbone-") as tmp:
        figures = uvloop.run(profiled(Path(tmp)))
    rate, unit = (figures["round trips/s"], "round trip") if mode == "rr" else (figures["MB/s"], "MB")
    events = rate * seconds
    # One entry per code object: ``pstats`` keys by (file, line, name), under which every dataclass's generated
    # ``__init__`` is the same "<string>:2 __init__", so all but one of them would be lost.
    counts = [(entry.callcount / events, _label(entry.code)) for entry in profile.getstats()]
    python = sum(n for n, label in counts if not label.startswith("~"))
    native = sum(n for n, label in counts if label.startswith("~"))
    per = f"per {unit}: Python calls {python:.1f}, C calls {native:.1f}"
    print(f"{mode} ({tls_transport}): {events:,.0f} {unit}s profiled; {per}")
    for n, label in sorted(counts, reverse=True)[:top]:
        print(f"  {n:8.2f}  {label}")


def _label(code: object) -> str:
    """``file:line name`` of a profiled Python function, ``~ <builtin>`` of a C one (as ``pstats`` labels them)."""
    if isinstance(code, str):
        return f"~ {code}"
    filename, line, name = code.co_filename, code.co_firstlineno, code.co_name  # type: ignore[attr-defined]
    return f"{filename.rsplit('/', 1)[-1]}:{line} {name}"


NATIVE = "socket+native"
"""The socket transport with its TLS records in C (``ambit.native``, step 1)."""
FRAMES = "socket+frames"
"""The same with the DATA frames of attached streams parsed in C too (``ambit.native._hbone_data``, step 2)."""
RELAY = "socket+relay"
"""The same with the relay's plain socket side in C too (``SocketSink``/``SocketReader`` of ``_hbone_data``, step 3)."""


def _use_transport(name: str) -> TlsTransportKind:
    """Select the record path ``name`` asks for in this process; the transport kind to pass to ``run``."""
    if name in (NATIVE, FRAMES, RELAY):
        module, reason = native.load_tls_records()
        hbone_data = native.load_hbone_data() if name != NATIVE else None
        if module is None or (name != NATIVE and hbone_data is None):
            raise SystemExit(f"{name}: {reason} (build it: python scripts/build_native.py)")
        native.use(native.NativeSelection(module, reason, hbone_data, hbone_data if name == RELAY else None))
        return "socket"
    native.use(native.NativeSelection(None, "the pure-Python path, by the benchmark"))
    return "socket" if name == "socket" else "loop"


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0] if __doc__ else None)
    parser.add_argument("--seconds", type=float, default=3.0)
    parser.add_argument("--loop", choices=("uvloop", "asyncio"), default="uvloop")
    parser.add_argument("--peer", choices=("ambit", "stunnel", "both"), default="ambit")
    parser.add_argument("--rounds", type=int, default=1, help="rounds of every peer, alternated")
    parser.add_argument("--modes", default="rr,bulk", help="comma-separated: rr, bulk, bulk4 (4 streams)")
    parser.add_argument(
        "--tls-transport",
        choices=(*TLS_TRANSPORTS, NATIVE, FRAMES, RELAY, "both", "all"),
        default="loop",
        help="ambit's HBONE TLS transport: the loop's, TLS on the socket with its records in Python or in C, both "
        "(loop, socket) or all three (alternated with the peers)",
    )
    parser.add_argument("--calls", type=int, metavar="TOP", help="count calls per event instead (see count_calls)")
    args = parser.parse_args()
    tune_allocator()  # as ``ambit nodeproxy`` does at start-up
    tune_collector()
    transports = {"both": TLS_TRANSPORTS, "all": (*TLS_TRANSPORTS, NATIVE, FRAMES, RELAY)}.get(
        args.tls_transport, (args.tls_transport,)
    )
    if args.calls is not None:
        for mode in args.modes.split(","):
            for transport in transports:
                print(f"{transport}:", end=" ")
                count_calls(mode, args.seconds, args.calls, _use_transport(transport))
        return
    peers = [f"ambit/{t}" for t in transports] if args.peer != "stunnel" else []
    if args.peer in ("stunnel", "both"):
        peers.append("stunnel")
    print(f"load average {os.getloadavg()[0]:.2f}", flush=True)
    for _ in range(args.rounds):
        for mode in args.modes.split(","):
            for peer in peers:
                with tempfile.TemporaryDirectory(prefix="ambit-bench-hbone-") as tmp:
                    if peer == "stunnel":
                        figures = run_stunnel(mode, args.seconds, Path(tmp))
                    else:
                        bench = run(mode, args.seconds, Path(tmp), _use_transport(peer.removeprefix("ambit/")))
                        if args.loop == "uvloop":
                            import uvloop

                            figures = uvloop.run(bench)
                        else:
                            figures = asyncio.run(bench)
                shown = "  ".join(f"{name} {value:,.{2 if value < 10 else 1}f}" for name, value in figures.items())
                print(f"{peer:12} {mode:5} {shown}  load {os.getloadavg()[0]:.2f}", flush=True)


if __name__ == "__main__":
    main()
