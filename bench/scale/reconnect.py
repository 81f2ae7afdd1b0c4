"""``python -m bench.scale.reconnect``: N node proxies reconnecting at once to a restarted xDS server, each opening
with every resource it holds named in ``initial_resource_versions`` (issue 22's restart), and what that costs the
server's memory.

The server is a real :class:`~ambit.xds.server.XdsServer` (TLS on loopback, default admission unless ``--rate``) in
its own process, serving ``--resources`` synthetic Addresses; its RSS is sampled every 20 ms and its peak (the
kernel's ``VmHWM``) read at the end. The clients are raw delta ADS streams in ``--workers`` processes, one TCP + TLS
connection each (a new channel per attempt, as after a restart), sending the same pre-encoded opening request: the
wildcard subscription naming every resource at the server's version (~60 bytes a name; 110,000 names make
~6.5 MB). A client is in sync when its first response has come (it ACKs it); a refused one waits out the
``grpc-retry-pushback-ms`` hint (else 0.5-1 s) and connects again. ``--attack`` makes the clients an attacker
instead: no valid token, ``--attack-bytes`` of made-up names per opening request, reconnecting as fast as it is
refused, for ``--seconds`` (``--authenticated``: with a valid token, as a compromised node would); then one honest
client must still get its answer.

Prints one table (and ``--json``): the server's RSS before the clients, its peak, the peak's growth per client,
the time from the start to every client in sync, the connects, and the load average; then the server's RSS when
told to stop, ``--settle`` seconds later (``rss_held_mib``: after its own trim, where it has one), and after a
garbage collection and ``malloc_trim`` of the harness's own (``rss_trimmed_mib``: what is live).
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import ctypes
import gc
import hashlib
import json
import os
import random
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

import grpc  # type: ignore[import-untyped]

from ambit.api import discovery_pb2 as dpb
from ambit.api import workload_pb2 as pb
from ambit.xds.convert import ADDRESS_TYPE_URL
from ambit.xds.session import METHOD, SERVICE_NAME

PATH = f"/{SERVICE_NAME}/{METHOD}"
SERVER_NAME = "istiod.istio-system.svc"
TOKEN = "node-token"


def _name(i: int) -> str:
    return f"Kubernetes//Pod/ns-{i % 100:03d}/pod-{i:06d}-{i * 7919 % 99991:05d}"


def _version(i: int) -> str:
    return hashlib.sha256(str(i).encode()).hexdigest()[:16]


def _resources(count: int) -> dict[str, tuple[str, pb.Address]]:
    out: dict[str, tuple[str, pb.Address]] = {}
    for i in range(count):
        ip = bytes((10, (i >> 16) & 255, (i >> 8) & 255, i & 255))
        workload = pb.Workload(uid=_name(i), name=f"pod-{i:06d}", namespace=f"ns-{i % 100:03d}", addresses=[ip])
        out[_name(i)] = (_version(i), pb.Address(workload=workload))
    return out


def opening_request(count: int) -> bytes:
    """What a wildcard node proxy holding all ``count`` resources opens with after a restart."""
    request = dpb.DeltaDiscoveryRequest(type_url=ADDRESS_TYPE_URL)
    for i in range(count):
        request.initial_resource_versions[_name(i)] = _version(i)
    return request.SerializeToString()


def attack_request(size: int, seed: int) -> bytes:
    """An opening request of about ``size`` bytes of names nobody has."""
    request = dpb.DeltaDiscoveryRequest(type_url=ADDRESS_TYPE_URL)
    for i in range(max(1, size // 64)):
        request.initial_resource_versions[f"made-up/{seed}/{i:012d}/{'x' * 24}"] = "0123456789abcdef"
    return request.SerializeToString()


# --- the server process ---------------------------------------------------------------------------------------


async def _serve(args: argparse.Namespace) -> None:
    from ambit.xds.admission import Admission
    from ambit.xds.callers import Caller
    from ambit.xds.server import XdsServer
    from ambit.xds.table import AddressTable

    directory = Path(args.dir)
    table = AddressTable(_resources(args.resources))

    async def authenticate(metadata: Any) -> Caller | None:
        await asyncio.sleep(0.005)  # a TokenReview's round trip
        if dict(metadata).get("authorization") == f"Bearer {TOKEN}":
            return Caller("system:serviceaccount:istio-system:ztunnel")
        return None

    admission = Admission(rate=args.rate) if args.rate else None
    server = XdsServer(
        table,
        authenticate,
        cert_chain_pem=(directory / "chain.pem").read_bytes(),
        key_pem=(directory / "key.pem").read_bytes(),
        host="127.0.0.1",
        port=0,
        admission=admission,
        grpc_options=[(k, int(v)) for k, v in (o.split("=", 1) for o in args.grpc_option)],
    )
    await server.start()
    print(json.dumps({"port": server.port}), flush=True)
    loop = asyncio.get_running_loop()
    reader = asyncio.StreamReader()
    await loop.connect_read_pipe(lambda: asyncio.StreamReaderProtocol(reader), sys.stdin)
    await reader.readline()  # the harness closes stdin (or writes a line) when done
    stats = server.service.stats
    settled = _rss(os.getpid(), "VmRSS")
    await asyncio.sleep(args.settle)  # the server's own trim after a burst (where it has one) comes after a quiet time
    held = _rss(os.getpid(), "VmRSS")
    gc.collect()
    ctypes.CDLL(None).malloc_trim(0)  # what is left is live, not the allocator's free lists
    counts = {"refused": stats.refused, "unauthenticated": stats.unauthenticated, "streams": stats.streams}
    counts["trims"] = getattr(stats, "trims", None)  # the server's own (a base without it: None)
    counts["trim_seconds"] = getattr(stats, "trim_seconds", None)
    counts["rss_at_stop_mib"] = settled / 2**20
    print(json.dumps({**counts, "rss_held_mib": held / 2**20, "rss_trimmed_mib": _rss(os.getpid(), "VmRSS") / 2**20}))
    await server.aclose(grace=0)


# --- the client processes -------------------------------------------------------------------------------------


def _pushback(exc: grpc.aio.AioRpcError) -> float | None:
    value = next((str(v) for k, v in exc.trailing_metadata() or () if k == "grpc-retry-pushback-ms"), "")
    return min(int(value) / 1000, 60.0) if value.isdigit() and len(value) <= 10 else None


async def _client(
    target: str,
    root: bytes,
    opening: bytes,
    token: str,
    out: dict[str, Any],
    forever: bool,
    on_sync: asyncio.Event | None = None,
) -> None:
    credentials = grpc.ssl_channel_credentials(root_certificates=root)
    options = [
        ("grpc.ssl_target_name_override", SERVER_NAME),
        ("grpc.use_local_subchannel_pool", 1),
        ("grpc.max_receive_message_length", 64 * 1024 * 1024),
    ]
    metadata = (("authorization", f"Bearer {token}"),)
    ack = b""
    while True:
        out["connects"] += 1
        pushback: float | None = None
        try:
            async with grpc.aio.secure_channel(target, credentials, options) as channel:
                call = channel.stream_stream(
                    PATH, request_serializer=lambda b: b, response_deserializer=dpb.DeltaDiscoveryResponse.FromString
                )(metadata=metadata)
                await call.write(opening)
                response = await call.read()
                if response is grpc.aio.EOF:
                    raise RuntimeError("closed")
                ack = dpb.DeltaDiscoveryRequest(type_url=ADDRESS_TYPE_URL, response_nonce=response.nonce)
                out["resent"] += len(response.resources)
                await call.write(ack.SerializeToString())
                out["synced"] = time.monotonic()
                if on_sync is not None:
                    on_sync.set()
                await asyncio.Event().wait()  # hold the stream, as a node proxy does
        except asyncio.CancelledError:
            raise
        except grpc.aio.AioRpcError as exc:
            out["errors"][exc.code().name] = out["errors"].get(exc.code().name, 0) + 1
            pushback = _pushback(exc)
        except Exception as exc:
            out["errors"][type(exc).__name__] = out["errors"].get(type(exc).__name__, 0) + 1
        if not forever:
            await asyncio.sleep(pushback if pushback is not None else 0.5 + 0.5 * random.random())
        else:
            await asyncio.sleep(0.01)


async def _clients(args: argparse.Namespace) -> None:
    root = (Path(args.dir) / "root.pem").read_bytes()
    target = f"127.0.0.1:{args.port}"
    if args.attack:
        openings = [attack_request(args.attack_bytes, seed) for seed in range(4)]
    else:
        openings = [opening_request(args.resources)]
    loop = asyncio.get_running_loop()
    reader = asyncio.StreamReader()
    await loop.connect_read_pipe(lambda: asyncio.StreamReaderProtocol(reader), sys.stdin)
    print(json.dumps({"ready": True}), flush=True)
    await reader.readline()  # go
    outs = [{"connects": 0, "resent": 0, "synced": 0.0, "errors": {}} for _ in range(args.count)]
    token = "not-a-token" if args.attack and not args.authenticated else TOKEN
    tasks = [
        asyncio.create_task(_client(target, root, openings[n % len(openings)], token, out, args.attack))
        for n, out in enumerate(outs)
    ]
    deadline = time.monotonic() + args.seconds
    while time.monotonic() < deadline:
        if not args.attack and all(out["synced"] for out in outs):
            break
        await asyncio.sleep(0.05)
    print(json.dumps(outs), flush=True)
    for task in tasks:
        task.cancel()
    await asyncio.gather(*tasks, return_exceptions=True)


# --- the harness ----------------------------------------------------------------------------------------------


def _rss(pid: int, field: str) -> int:
    for line in Path(f"/proc/{pid}/status").read_text().splitlines():
        if line.startswith(field + ":"):
            return int(line.split()[1]) * 1024
    return 0


async def _child(args: list[str], env: dict[str, str]) -> asyncio.subprocess.Process:
    return await asyncio.create_subprocess_exec(
        sys.executable, "-m", "bench.scale.reconnect", *args, stdin=asyncio.subprocess.PIPE,
        stdout=asyncio.subprocess.PIPE, env=env,
    )  # fmt: skip


async def _line(proc: asyncio.subprocess.Process, within: float) -> Any:
    assert proc.stdout is not None
    line = await asyncio.wait_for(proc.stdout.readline(), within)
    if not line:
        raise RuntimeError(f"a child ended early (exit {await proc.wait()})")
    return json.loads(line)


async def measure(args: argparse.Namespace) -> dict[str, Any]:
    from ambit.tls.certs import issue_server_cert, new_ca

    env = dict(os.environ)
    if args.server_path:
        env["PYTHONPATH"] = args.server_path + os.pathsep + env.get("PYTHONPATH", "")
    with tempfile.TemporaryDirectory() as tmp:
        now = time.time()
        ca = new_ca("reconnect root", now=now)
        cert = issue_server_cert(ca, common_name="istiod", dns_names=[SERVER_NAME], ip_addresses=[], now=now)
        (Path(tmp) / "root.pem").write_bytes(ca.cert_pem)
        (Path(tmp) / "chain.pem").write_bytes(cert.cert_pem + ca.cert_pem)
        (Path(tmp) / "key.pem").write_bytes(cert.key_pem)
        options = [f"--grpc-option={o}" for o in args.grpc_option]
        serve = ["--serve", "--dir", tmp, "--resources", str(args.resources), "--rate", str(args.rate), *options]
        serve += ["--settle", str(args.settle)]
        server = await _child(serve, env)
        port = (await _line(server, 300))["port"]
        client_env = dict(os.environ)
        per = [
            args.clients // args.workers + (1 if w < args.clients % args.workers else 0) for w in range(args.workers)
        ]
        common = ["--dir", tmp, "--port", str(port), "--resources", str(args.resources), "--seconds", str(args.seconds)]
        if args.attack:
            common += ["--attack", "--attack-bytes", str(args.attack_bytes)]
            common += ["--authenticated"] if args.authenticated else []
        workers = [await _child(["--clients-worker", "--count", str(n), *common], client_env) for n in per if n]
        for worker in workers:
            await _line(worker, 300)
        await asyncio.sleep(1.0)
        before = _rss(server.pid, "VmRSS")
        started = time.monotonic()
        for worker in workers:
            assert worker.stdin is not None
            worker.stdin.write(b"go\n")
        peak_sampled = before
        pending = [asyncio.create_task(_line(w, args.seconds + 60)) for w in workers]
        while not all(t.done() for t in pending):
            peak_sampled = max(peak_sampled, _rss(server.pid, "VmRSS"))
            await asyncio.sleep(0.02)
        outs = [o for t in pending for o in t.result()]
        peak = max(_rss(server.pid, "VmHWM"), peak_sampled)
        after = _rss(server.pid, "VmRSS")  # every client in sync, streams held
        honest: float | None = None
        if args.attack:  # under (just after) the flood: does an honest client still get in?
            probe = {"connects": 0, "resent": 0, "synced": 0.0, "errors": {}}
            t0, synced_now = time.monotonic(), asyncio.Event()
            root = (Path(tmp) / "root.pem").read_bytes()
            task = asyncio.create_task(
                _client(f"127.0.0.1:{port}", root, opening_request(args.resources), TOKEN, probe, False, synced_now)
            )
            with contextlib.suppress(TimeoutError):
                await asyncio.wait_for(synced_now.wait(), 30)
            honest = probe["synced"] - t0 if probe["synced"] else None
            task.cancel()
            await asyncio.gather(task, return_exceptions=True)
        assert server.stdin is not None
        server.stdin.write(b"stop\n")
        counts = await _line(server, 60)
        for proc in (server, *workers):
            with contextlib.suppress(ProcessLookupError):
                proc.kill()
            await proc.wait()
    synced = [o["synced"] for o in outs if o["synced"]]
    errors: dict[str, int] = {}
    for o in outs:
        for k, v in o["errors"].items():
            errors[k] = errors.get(k, 0) + v
    return {
        "clients": args.clients,
        "resources": args.resources,
        "request_bytes": len(opening_request(args.resources)) if not args.attack else args.attack_bytes,
        "rss_before_mib": before / 2**20,
        "rss_peak_mib": peak / 2**20,
        "rss_synced_mib": after / 2**20,
        "growth_per_client_kib": (peak - before) / 1024 / max(1, args.clients),
        "synced": len(synced),
        "all_synced_s": (max(synced) - started) if len(synced) == len(outs) and not args.attack else None,
        "connects": sum(o["connects"] for o in outs),
        "resent": sum(o["resent"] for o in outs),
        "errors": errors,
        "server": counts,
        "honest_synced_s": honest,
        "load": os.getloadavg()[0],
    }


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(prog="python -m bench.scale.reconnect", description=__doc__.splitlines()[0])
    parser.add_argument("--clients", type=int, default=200)
    parser.add_argument("--resources", type=int, default=110_000)
    parser.add_argument("--rate", type=float, default=0.0, help="admission rate (0: the server's default)")
    parser.add_argument("--workers", type=int, default=2)
    parser.add_argument("--seconds", type=float, default=120.0, help="how long to wait for the clients")
    parser.add_argument("--attack", action="store_true", help="unauthenticated clients flooding large openings")
    parser.add_argument("--attack-bytes", type=int, default=12 * 1024 * 1024)
    parser.add_argument("--authenticated", action="store_true", help="the attacker holds a valid token (a node's)")
    parser.add_argument("--server-path", default="", help="PYTHONPATH entry for the server (another checkout)")
    parser.add_argument("--grpc-option", action="append", default=[], metavar="KEY=INT", help="a server option")
    parser.add_argument("--settle", type=float, default=2.0, help="seconds after the clients before RSS is held")
    parser.add_argument("--json", type=Path, help="append the result as one JSON line")
    parser.add_argument("--serve", action="store_true", help=argparse.SUPPRESS)
    parser.add_argument("--clients-worker", action="store_true", help=argparse.SUPPRESS)
    parser.add_argument("--dir", help=argparse.SUPPRESS)
    parser.add_argument("--port", type=int, help=argparse.SUPPRESS)
    parser.add_argument("--count", type=int, help=argparse.SUPPRESS)
    args = parser.parse_args(argv)
    if args.serve:
        asyncio.run(_serve(args))
        return
    if args.clients_worker:
        asyncio.run(_clients(args))
        return
    result = asyncio.run(measure(args))
    print(json.dumps(result))
    if args.json:
        with args.json.open("a") as out:
            out.write(json.dumps({**result, "server_path": args.server_path}) + "\n")


if __name__ == "__main__":
    main()
