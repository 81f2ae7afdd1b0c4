"""The ingress gateway's listeners under attack from the outside: whoever reaches its LoadBalancer address.

The gateway is the real :class:`~ambit.waypoint.ingress.IngressGateway` in a process of its own (so that its
descriptors and memory are its own), listening on 127.0.0.1 with an HTTP listener and a TLS passthrough listener;
the mesh behind it (an HBONE endpoint and a TLS backend) runs in the test (tests/integration/ingress_rig.py). The
attacker connects from other loopback addresses, a legitimate client from 127.0.0.1. Each attack is bounded in
count and time:

- an idle-connection flood from one address: the gateway keeps at most ``max_connections_per_peer`` of them, and
  legitimate TLS passthrough and HTTP requests are answered within ``ANSWER_BOUND`` all along;
- an idle flood from many addresses: descriptors stay under ``max_connections`` plus the gateway's own (the silent
  connections are pending, :mod:`ambit.waypoint.ingress_admission`: the newest evict the oldest);
- slowloris request heads on the HTTP listener: closed at ``head_timeout``;
- a ClientHello flood on the passthrough listener (the record header, then nothing): closed at ``sniff_timeout``,
  nothing relayed; oversized hellos (a handshake longer than 16 KiB, or 64 KiB of records) closed at once;
- the gateway's resident memory grows by less than ``RSS_BOUND`` across all of it, and every connection closed
  early is counted by its reason.
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import os
import socket
import subprocess
import sys
import time
from collections.abc import AsyncIterator, Iterator
from dataclasses import asdict
from pathlib import Path

import pytest
from tests.harness import process_fds, process_rss
from tests.integration.ingress_rig import MeshBackends, backend, gateway_settings, mesh_backends, tls_ask
from tests.integration.waypoint_rig import free_port

from ambit.model.ingress import GatewayConfig, IngressListener, ListenerProtocol, VirtualHost
from ambit.model.routes import WeightedBackend
from ambit.waypoint.settings import WaypointLimits
from ambit.xds.gateway import gateway_config_to_proto, pack_gateway_config

LIMITS = WaypointLimits(
    max_connections=256, max_connections_per_peer=32, sniff_timeout=1.0, head_timeout=1.0, idle_timeout=30.0
)
ANSWER_BOUND = 1.0
"""Seconds a legitimate request may take while an attack goes on."""
RSS_BOUND = 32 * 1024 * 1024
IP_BIND_ADDRESS_NO_PORT = 24  # linux/in.h; not in Python's socket module

SERVER = """
import asyncio, json, logging, sys
from pathlib import Path
from google.protobuf import any_pb2
from ambit.waypoint.ingress import IngressGateway
from ambit.waypoint.settings import WaypointLimits, WaypointSettings
from ambit.xds.gateway import decode_gateway_config

async def main() -> None:
    logging.basicConfig(level=logging.ERROR)
    args = json.loads(sys.argv[1])
    settings = args["settings"]
    settings["limits"] = WaypointLimits(**settings["limits"])
    settings["config_file"], settings["local_ca_dir"] = Path(settings["config_file"]), Path(settings["local_ca_dir"])
    proc = IngressGateway(WaypointSettings(**settings))
    body = any_pb2.Any()
    body.ParseFromString(bytes.fromhex(args["config"]))
    proc.apply(decode_gateway_config("edge/edge", body))
    await proc.start()
    await asyncio.wait_for(proc.startup.ready.wait(), 15)
    print("ready", flush=True)
    loop = asyncio.get_running_loop()
    while await loop.run_in_executor(None, sys.stdin.readline):
        print(json.dumps(proc.config_dump()["gateway"]["connection_refusals"]), flush=True)
    await proc.aclose()

asyncio.run(main())
"""


class GatewayProcess:
    def __init__(self, process: asyncio.subprocess.Process, http_port: int, tls_port: int) -> None:
        self.process = process
        self.http_port = http_port
        self.tls_port = tls_port

    def fds(self) -> int:
        return process_fds(self.process.pid)

    def rss(self) -> int:
        return process_rss(self.process.pid)

    async def refusals(self) -> dict[str, int]:
        assert self.process.stdin is not None and self.process.stdout is not None
        self.process.stdin.write(b"\n")
        await self.process.stdin.drain()
        found = json.loads(await asyncio.wait_for(self.process.stdout.readline(), 10))
        assert isinstance(found, dict)
        return found

    async def legitimate(self) -> None:
        """A TLS passthrough exchange and an HTTP request from 127.0.0.1, each answered within the bound."""
        started = time.monotonic()
        assert await asyncio.wait_for(tls_ask(self.tls_port, "a.example.com"), 5) == "one hello"
        reader, writer = await asyncio.open_connection("127.0.0.1", self.http_port)
        writer.write(b"GET / HTTP/1.1\r\nHost: nowhere.example\r\nConnection: close\r\n\r\n")
        answer = await asyncio.wait_for(reader.read(), 5)
        writer.close()
        assert answer.startswith(b"HTTP/1.1 404 ")  # answered by the gateway itself: no route there
        assert time.monotonic() - started < ANSWER_BOUND

    def connect_from(self, source: str, port: int) -> socket.socket:
        sock = socket.socket(socket.AF_INET, socket.SOCK_STREAM)
        sock.settimeout(2.0)
        try:
            sock.setsockopt(socket.IPPROTO_IP, IP_BIND_ADDRESS_NO_PORT, 1)
            sock.bind((source, 0))
            sock.connect(("127.0.0.1", port))  # refused connections are reset at once: this may fail
        except OSError:
            sock.close()
            raise
        return sock


def config(http_port: int, tls_port: int) -> GatewayConfig:
    return GatewayConfig(
        "edge/edge",
        (
            IngressListener("http", http_port, ListenerProtocol.HTTP, "", (), (VirtualHost("only.example"),)),
            IngressListener(
                "tls",
                tls_port,
                ListenerProtocol.TLS,
                "",
                (),
                (VirtualHost("a.example.com", (), (WeightedBackend(backend("one")),)),),
            ),
        ),
    )


@pytest.fixture
async def gateway(tmp_path: Path) -> AsyncIterator[GatewayProcess]:
    async with mesh_backends(tmp_path) as backends, _gateway_process(backends) as proc:
        yield proc


@contextlib.asynccontextmanager
async def _gateway_process(backends: MeshBackends) -> AsyncIterator[GatewayProcess]:
    http_port, tls_port = free_port(), free_port()
    full = gateway_settings(backends, LIMITS)
    keys = ("namespace", "gateway_name", "service_account", "pod_name", "instance_ip", "admin_port", "stats_port")
    settings = {key: getattr(full, key) for key in (*keys, "readiness_port", "upstream_hbone_port")}
    settings |= {
        "config_file": str(full.config_file),
        "local_ca_dir": str(full.local_ca_dir),
        "limits": asdict(full.limits),
    }
    packed = pack_gateway_config(gateway_config_to_proto(config(http_port, tls_port))).SerializeToString()
    args = json.dumps({"settings": settings, "config": packed.hex()})
    process = await asyncio.create_subprocess_exec(
        sys.executable, "-c", SERVER, args, stdin=subprocess.PIPE, stdout=subprocess.PIPE
    )
    assert process.stdin is not None and process.stdout is not None
    try:
        assert (await asyncio.wait_for(process.stdout.readline(), 30)).strip() == b"ready"
        yield GatewayProcess(process, http_port, tls_port)
    finally:
        process.stdin.close()
        try:
            await asyncio.wait_for(process.wait(), 10.0)
        except TimeoutError:
            process.kill()
            await process.wait()


@contextlib.contextmanager
def sockets() -> Iterator[list[socket.socket]]:
    held: list[socket.socket] = []
    try:
        yield held
    finally:
        for sock in held:
            sock.close()


async def wait_for_fds(proc: GatewayProcess, at_most: int, within: float) -> int:
    deadline = time.monotonic() + within
    while (count := proc.fds()) > at_most and time.monotonic() < deadline:  # noqa: ASYNC110 - /proc has no event
        await asyncio.sleep(0.1)
    return count


async def test_an_idle_flood_from_one_address_leaves_legitimate_clients_answered(gateway: GatewayProcess) -> None:
    await gateway.legitimate()
    baseline, rss = gateway.fds(), gateway.rss()
    with sockets() as held:
        for index in range(400):
            with contextlib.suppress(OSError):
                port = gateway.http_port if index % 2 else gateway.tls_port
                held.append(gateway.connect_from("127.0.0.9", port))
        assert len(held) > 350  # the kernel accepted them; the gateway closes all but the peer's share
        for _ in range(5):
            await gateway.legitimate()
        count = await wait_for_fds(gateway, baseline + LIMITS.max_connections_per_peer + 4, 5.0)
        assert count <= baseline + LIMITS.max_connections_per_peer + 4
    refusals = await gateway.refusals()
    # Refused at accept: over the address's share of the gateway, or of a port's connections still pending (here,
    # every one: they never send a byte), which comes first.
    by_peer = refusals.get("peer connection limit", 0) + refusals.get("peer pending limit", 0)
    assert by_peer >= 350 - LIMITS.max_connections_per_peer, refusals
    # The passthrough share sent no ClientHello: closed at sniff_timeout, counted.
    assert refusals.get("hello", 0) <= LIMITS.max_connections_per_peer
    assert gateway.rss() - rss < RSS_BOUND


async def test_an_idle_flood_from_many_addresses_is_held_to_the_connection_cap(gateway: GatewayProcess) -> None:
    baseline = gateway.fds()
    with sockets() as held:
        for index in range(600):
            with contextlib.suppress(OSError):
                held.append(gateway.connect_from(f"127.0.{3 + index // 100}.{2 + index % 100}", gateway.http_port))
        await asyncio.sleep(0.5)
        assert gateway.fds() <= baseline + LIMITS.max_connections + 4
    assert await wait_for_fds(gateway, baseline + 4, 5.0) <= baseline + 4
    await gateway.legitimate()
    refusals = await gateway.refusals()  # silent, so pending: the newest keep their places, the oldest evicted
    assert refusals.get("connection limit", 0) + refusals.get("evicted", 0) >= 600 - LIMITS.max_connections, refusals


async def test_slowloris_heads_are_closed_at_the_head_timeout(gateway: GatewayProcess) -> None:
    with sockets() as held:
        for _ in range(16):
            sock = gateway.connect_from("127.0.0.10", gateway.http_port)
            sock.sendall(b"GET / HTTP/1.1\r\n")
            held.append(sock)
        started = time.monotonic()
        closed: set[int] = set()
        while len(closed) < len(held) and time.monotonic() - started < LIMITS.head_timeout + 10.0:
            for index, sock in enumerate(held):
                if index not in closed:
                    try:
                        sock.sendall(b"X-Drip: 1\r\n")
                    except OSError:
                        closed.add(index)
            await gateway.legitimate()
            await asyncio.sleep(0.2)
        assert len(closed) == len(held)
        # Closed by the head timeout, not by anything later; the margin is for a loaded machine (a loaded CI run
        # took 4.0 s, each round also waits for a legitimate request).
        assert time.monotonic() - started < LIMITS.head_timeout + 6.0


STALLED_HELLOS = (
    b"\x16\x03\x01\x40\x00",  # a record header, then silence
    b"\x16\x03\x01\x40\x00\x01\x00\x3f\xfc\x03\x03",  # the start of a ClientHello, then silence
)


async def test_a_client_hello_flood_is_closed_at_the_sniff_timeout(gateway: GatewayProcess) -> None:
    baseline, rss = gateway.fds(), gateway.rss()
    with sockets() as held:
        for index in range(64):
            sock = gateway.connect_from(f"127.0.1.{2 + index % 8}", gateway.tls_port)
            sock.sendall(STALLED_HELLOS[index % 2])
            held.append(sock)
        await gateway.legitimate()
        started = time.monotonic()
        assert await wait_for_fds(gateway, baseline + 2, LIMITS.sniff_timeout + 3.0) <= baseline + 2
        assert time.monotonic() - started < LIMITS.sniff_timeout + 3.0
        for sock in held:
            sock.settimeout(1.0)
            with contextlib.suppress(ConnectionResetError):
                assert sock.recv(1) == b""  # closed, never answered
    assert (await gateway.refusals())["hello"] >= 64
    assert gateway.rss() - rss < RSS_BOUND


HOSTILE_HELLOS = (
    b"\x16\x03\x01\x40\x00\x01\x00\x4e\x20" + b"\x00" * 16375,  # a handshake that says it is 20,000 bytes
    (b"\x16\x03\x01\x10\x00" + b"\x01\x00\xff\xff" + b"\x00" * 4092) + (b"\x16\x03\x01\x10\x00" + b"\x00" * 4096) * 15,
    b"\x16\x03\x01\x00\x05" + b"\x01\x00\x00\xff\x03" + b"\x16\x03\x01\x00\x01\x00" * 12000,  # tiny records
    os.urandom(20000),
)
"""A handshake that says it is 20,000 bytes; 64 KiB of records; a hello in 1-byte records; random bytes."""


async def test_oversized_and_garbage_hellos_are_closed_at_once(gateway: GatewayProcess) -> None:
    rss = gateway.rss()
    for index in range(32):
        with gateway.connect_from(f"127.0.2.{2 + index % 8}", gateway.tls_port) as sock:
            with contextlib.suppress(OSError):
                sock.sendall(HOSTILE_HELLOS[index % len(HOSTILE_HELLOS)])
            sock.settimeout(LIMITS.sniff_timeout / 2)  # closed well before the timeout would have
            with contextlib.suppress(ConnectionResetError):
                assert sock.recv(1) == b""
    await gateway.legitimate()
    assert (await gateway.refusals())["hello"] >= 32
    assert gateway.rss() - rss < RSS_BOUND
