"""HBONE shell microbenchmark: both node-proxy roles in one process on loopback, over real mutual TLS.

``.venv/bin/python bench/hbone_loopback.py [--seconds S] [--loop uvloop|asyncio]`` runs, in this process, an
"outbound" listener whose connections are relayed into pooled HBONE tunnels (``ConnectionPool`` →
``HboneClient``) and the HBONE server (``HboneServer``) that relays each tunnel to an echo server. A child process
holds the application ends (the echo server and the client), so this process's CPU (``getrusage``) is the proxy
work alone: both proxies' Python, TLS and syscalls, as in the lab but without veths, nftables or a second process.

Printed: 1-byte request/response round trips per second on one connection, and proxy CPU µs per round trip;
bulk MB/s one way through one tunnel, and proxy CPU seconds per GB.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import resource
import socket
import subprocess
import sys
import tempfile
from pathlib import Path

from ambit.identity.localca import LocalCa
from ambit.model.identity import SpiffeId
from ambit.proxy.hbone_client import HboneClient
from ambit.proxy.hbone_server import HboneServer, InboundRequest, TunnelResponder
from ambit.proxy.pool import ConnectionPool, PoolKey
from ambit.proxy.sockets import HostSocketFactory, connect
from ambit.proxy.streams import SocketStream
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
client = socket.create_connection(("127.0.0.1", port))
client.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
count, total, start = 0, 0, time.perf_counter()
if mode == "rr":
    while time.perf_counter() - start < seconds:
        client.sendall(b"x"); client.recv(16); count += 1
else:
    block = b"\xa5" * 262144
    while time.perf_counter() - start < seconds:
        client.sendall(block); total += len(block)
client.shutdown(socket.SHUT_WR); client.recv(16)
print(json.dumps({"count": count, "bytes": total, "seconds": time.perf_counter() - start}), flush=True)
"""


async def run(mode: str, seconds: float, directory: Path) -> dict[str, float]:
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

    async def handle(request: InboundRequest, responder: TunnelResponder) -> None:
        upstream = SocketStream(await connect(factory, ("127.0.0.1", echo_port)))
        await relay(responder.accept(), upstream)
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
            spawn(HboneServer.serve(sock, cert, trust_domain=TD, handler=handle))  # type: ignore[arg-type]

    pool = ConnectionPool()
    key = PoolKey(CLIENT, frozenset({SERVER}), "127.0.0.1", hbone_addr)

    async def dial() -> HboneClient:
        sock = await connect(factory, hbone_addr)
        return await HboneClient.connect(sock, client_cert, frozenset({SERVER}), trust_domain=TD)

    outbound = socket.create_server(("127.0.0.1", 0))
    outbound.setblocking(False)

    async def serve_outbound() -> None:
        while True:
            sock, _ = await loop.sock_accept(outbound)
            sock.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
            tunnel = await pool.open_tunnel(key, f"127.0.0.1:{echo_port}", [], dial)
            spawn(relay(SocketStream(sock), tunnel))

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
    if mode == "rr":
        return {
            "round trips/s": result["count"] / result["seconds"],
            "proxy CPU µs/RT": cpu / result["count"] * 1e6,
            "of which user µs/RT": user / result["count"] * 1e6,
        }
    gigabytes = result["bytes"] / 1e9
    return {
        "MB/s": result["bytes"] / result["seconds"] / 1e6,
        "proxy CPU-s/GB": cpu / gigabytes,
        "of which user CPU-s/GB": user / gigabytes,
    }


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0] if __doc__ else None)
    parser.add_argument("--seconds", type=float, default=3.0)
    parser.add_argument("--loop", choices=("uvloop", "asyncio"), default="uvloop")
    args = parser.parse_args()
    for mode in ("rr", "bulk"):
        with tempfile.TemporaryDirectory(prefix="ambit-bench-hbone-") as tmp:
            if args.loop == "uvloop":
                import uvloop

                figures = uvloop.run(run(mode, args.seconds, Path(tmp)))
            else:
                figures = asyncio.run(run(mode, args.seconds, Path(tmp)))
        print("  ".join(f"{name} {value:,.1f}" for name, value in figures.items()), flush=True)


if __name__ == "__main__":
    main()
