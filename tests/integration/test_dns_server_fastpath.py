"""One pod's DNS proxy (:class:`~ambit.dns.server.DnsServer`) on loopback UDP and TCP: mesh names answered again
from memory (the fast path) mean what the dnspython way answers, the access log and the metrics see both, the answers
follow the workload state, and hostile datagrams aimed at the fast path's parser are dropped without harm."""

from __future__ import annotations

import asyncio
import contextlib
import logging
import socket
import struct
import subprocess
import sys
from collections.abc import AsyncIterator
from dataclasses import dataclass
from pathlib import Path

import dns.flags
import dns.message
import dns.rcode
import pytest
from tests.unit.dns_state import mesh, svc

from ambit.dns.answer import DnsClient
from ambit.dns.forwarder import Forwarder, read_exactly
from ambit.dns.server import DnsServer
from ambit.dns.settings import Upstream
from ambit.model.state import WorkloadState
from ambit.proxy.sockets import HostSocketFactory
from ambit.telemetry.metrics import ProxyMetrics


@dataclass
class Served:
    server: DnsServer
    state: WorkloadState
    metrics: ProxyMetrics
    udp: tuple[str, int]
    tcp: tuple[str, int]


@pytest.fixture
async def served() -> AsyncIterator[Served]:
    state = mesh()
    metrics = ProxyMetrics()

    async def upstream() -> Upstream:
        return Upstream(("198.18.0.1",), timeout=0.2, attempts=1)  # only one test forwards: any answer will do

    server = DnsServer(
        state,
        lambda: DnsClient("ns1", "", "web", "web", "v1"),
        Forwarder(HostSocketFactory(mark=None)),
        upstream,
        metrics,
    )
    loop = asyncio.get_running_loop()
    udp = socket.socket(socket.AF_INET, socket.SOCK_DGRAM)
    udp.bind(("127.0.0.1", 0))
    udp.setblocking(False)
    transport, _ = await loop.create_datagram_endpoint(server.datagram_protocol, sock=udp)
    listener = socket.socket(socket.AF_INET, socket.SOCK_STREAM)
    listener.bind(("127.0.0.1", 0))
    listener.listen()
    listener.setblocking(False)
    tasks: set[asyncio.Task[None]] = set()

    async def accept() -> None:
        while True:
            conn, _ = await loop.sock_accept(listener)
            conn.setblocking(False)
            task = asyncio.create_task(server.serve_tcp(conn))
            tasks.add(task)
            task.add_done_callback(tasks.discard)

    acceptor = asyncio.create_task(accept())
    try:
        yield Served(server, state, metrics, udp.getsockname(), listener.getsockname())
    finally:
        acceptor.cancel()
        with contextlib.suppress(asyncio.CancelledError):
            await acceptor
        for task in list(tasks):
            task.cancel()
        await asyncio.gather(*tasks, return_exceptions=True)
        transport.close()
        listener.close()
        await server.aclose()


async def ask_udp(where: tuple[str, int], wire: bytes, *, expect_answer: bool = True) -> bytes | None:
    loop = asyncio.get_running_loop()
    with socket.socket(socket.AF_INET, socket.SOCK_DGRAM) as sock:
        sock.setblocking(False)
        await loop.sock_connect(sock, where)
        await loop.sock_sendall(sock, wire)
        try:
            async with asyncio.timeout(5.0 if expect_answer else 0.3):
                return await loop.sock_recv(sock, 65535)
        except TimeoutError:
            if expect_answer:
                raise
            return None


async def ask_tcp(where: tuple[str, int], wire: bytes) -> bytes:
    loop = asyncio.get_running_loop()
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as sock:
        sock.setblocking(False)
        await loop.sock_connect(sock, where)
        await loop.sock_sendall(sock, struct.pack("!H", len(wire)) + wire)
        async with asyncio.timeout(5.0):
            (length,) = struct.unpack("!H", await read_exactly(loop, sock, 2))
            return await read_exactly(loop, sock, length)


def records(wire: bytes | None) -> list[str]:
    assert wire is not None
    message = dns.message.from_wire(wire)
    assert message.rcode() == dns.rcode.NOERROR and message.flags & dns.flags.AA
    return sorted(f"{r.name} {r.rdtype.name} {d}" for r in message.answer for d in r)


def query(host: str, rdtype: str = "A", **kw: object) -> bytes:
    return dns.message.make_query(host, rdtype, **kw).to_wire()  # type: ignore[arg-type]


def requests(metrics: ProxyMetrics, protocol: str) -> float:
    return sum(
        float(line.rsplit(" ", 1)[1])
        for line in metrics.render().decode().splitlines()
        if line.startswith("istio_dns_requests_total{") and f'request_protocol="{protocol}"' in line
    )


async def test_mesh_names_are_answered_alike_with_and_without_the_access_log(
    served: Served, caplog: pytest.LogCaptureFixture
) -> None:
    asked = [
        ("productpage.", "A"),
        ("Api.Example.com.ns1.svc.cluster.local.", "A"),
        ("api.example.com.", "AAAA"),
        ("headless.ns1.svc.cluster.local.", "A"),
        ("ipv6.localhost.", "A"),
    ]
    fast = [records(await ask_udp(served.udp, query(h, t, id=9))) for h, t in asked]
    fast_tcp = [records(await ask_tcp(served.tcp, query(h, t, use_edns=0))) for h, t in asked]
    assert fast[1] == [
        "Api.Example.com. A 240.240.0.1",
        "Api.Example.com.ns1.svc.cluster.local. CNAME Api.Example.com.",
    ]
    assert fast[4] == []
    assert requests(served.metrics, "udp") == len(asked) and requests(served.metrics, "tcp") == len(asked)
    with caplog.at_level(logging.DEBUG, logger="dns"):  # the access log on: the dnspython way, which logs
        slow = [records(await ask_udp(served.udp, query(h, t, id=9))) for h, t in asked]
        slow_tcp = [records(await ask_tcp(served.tcp, query(h, t, use_edns=0))) for h, t in asked]
    assert fast == slow == fast_tcp == slow_tcp
    lines = [r.getMessage() for r in caplog.records if r.name == "dns"]
    assert len(lines) == 2 * len(asked)
    assert "query=A domain=Api.Example.com.ns1.svc.cluster.local. result=success endpoints=1" in lines[1]
    assert requests(served.metrics, "udp") == 2 * len(asked)


async def test_the_answers_follow_the_workload_state(served: Served) -> None:
    assert records(await ask_udp(served.udp, query("api.example.com."))) == ["api.example.com. A 240.240.0.1"]
    served.state.upsert_service(svc("api", "ns1", "api.example.com", "240.240.0.7"))
    assert records(await ask_udp(served.udp, query("api.example.com."))) == ["api.example.com. A 240.240.0.7"]
    served.state.remove_service("ns1/api.example.com")
    answer = await ask_udp(served.udp, query("api.example.com."))  # forwarded now: whatever upstream says
    assert answer is not None and not dns.message.from_wire(answer).answer
    assert "istio_dns_upstream_requests_total{" in served.metrics.render().decode()


async def test_a_large_mesh_answer_is_truncated_over_udp_and_whole_over_tcp(served: Served) -> None:
    many = (f"198.19.{i // 200}.{i % 200 + 1}" for i in range(60))
    served.state.upsert_service(svc("wide", "ns1", "wide.example.com", *many))
    udp = await ask_udp(served.udp, query("wide.example.com."))
    assert udp is not None and len(udp) <= 512
    assert dns.message.from_wire(udp).flags & dns.flags.TC
    tcp = dns.message.from_wire(await ask_tcp(served.tcp, query("wide.example.com.")))
    assert len(tcp.answer[0]) == 60
    big = await ask_udp(served.udp, query("wide.example.com.", use_edns=0, payload=4096))
    assert big is not None and len(dns.message.from_wire(big).answer[0]) == 60


def hostile_datagrams() -> list[bytes]:
    """Queries that look simple up to the byte that is not: pointer loops, oversized labels and names, counts
    that lie, a header cut short; each would make a careless parser loop, read past the end or raise."""
    plain = query("productpage.", id=1)
    header, tail = plain[:12], plain[-4:]
    return [
        header + b"\xc0\x0c" + tail,  # a pointer to itself
        header + b"\x01a\xc0\x0c" + tail,  # a pointer back to the question's start: a loop
        header + b"\x40" + b"a" * 64 + b"\x00" + tail,  # label type 01
        header + (b"\x3f" + b"a" * 63) * 5 + b"\x00" + tail,  # 321 bytes of name
        header + b"\x3f" + b"a" * 10,  # the label runs past the end
        header[:4] + b"\xff\xff" + header[6:] + plain[12:],  # 65535 questions
        header[:10] + b"\xff\xff" + plain[12:],  # 65535 additional records
        plain[:5],
        plain + b"\x00" * 11,  # an OPT-sized tail of zeroes
        header + b"\x00" + tail + b"\x00\x00\x29\x10\x00\x00\x00\x00\x00\x00\x04\x00\x0a\x00\x00",  # a lying OPT
    ]


async def test_hostile_datagrams_are_dropped_or_refused_and_the_proxy_keeps_answering(served: Served) -> None:
    for wire in hostile_datagrams():
        answer = await ask_udp(served.udp, wire, expect_answer=False)
        if answer is not None:  # only a clean error may come back, never records
            message = dns.message.from_wire(answer)
            assert message.rcode() in (dns.rcode.FORMERR, dns.rcode.SERVFAIL) and not message.answer, wire
    assert records(await ask_udp(served.udp, query("productpage."))) == ["productpage. A 198.19.0.9"]
    assert records(await ask_tcp(served.tcp, query("productpage."))) == ["productpage. A 198.19.0.9"]


async def test_a_flood_of_random_names_leaves_the_cache_bounded(served: Served) -> None:
    for i in range(3000):  # every name a new cache entry: ``*.wildcard`` answers them all
        assert records(await ask_udp(served.udp, query(f"r{i}.wildcard."))) == [f"r{i}.wildcard. A 198.19.10.10"]
        if i % 500 == 0:
            assert records(await ask_udp(served.udp, query("productpage."))) == ["productpage. A 198.19.0.9"]
    assert len(served.server._cache) <= 2 * 1024  # resolutions and answers, each bounded


LAZY_PROBE = """
import asyncio, socket, struct, sys
from tests.unit.dns_state import mesh
from ambit.dns.forwarder import Forwarder
from ambit.dns.resolution import DnsClient
from ambit.dns.server import DnsServer
from ambit.dns.settings import Upstream
from ambit.proxy.sockets import HostSocketFactory
from ambit.telemetry.metrics import ProxyMetrics

def wire(ident, name, qtype=1, opcode=0):
    labels = b"".join(bytes([len(p)]) + p.encode() for p in name.split(".")) + b"\\0"
    return struct.pack("!HHHHHH", ident, 0x0100 | opcode << 11, 1, 0, 0, 0) + labels + struct.pack("!HH", qtype, 1)

async def main():
    async def upstream():
        return Upstream(("198.18.0.1",), timeout=0.2, attempts=1)
    sockets = HostSocketFactory(mark=None)
    server = DnsServer(mesh(), lambda: DnsClient("ns1"), Forwarder(sockets), upstream, ProxyMetrics())
    loop = asyncio.get_running_loop()
    listen = socket.socket(socket.AF_INET, socket.SOCK_DGRAM)
    listen.bind(("127.0.0.1", 0))
    transport, _ = await loop.create_datagram_endpoint(server.datagram_protocol, sock=listen)
    ask = socket.socket(socket.AF_INET, socket.SOCK_DGRAM)
    ask.settimeout(30)  # generous: the machine is shared; the answer normally takes milliseconds
    print("idle", "dns" in sys.modules)
    ask.sendto(wire(1, "productpage.ns1.svc.cluster.local"), listen.getsockname())
    ask.sendto(wire(2, "productpage.ns1.svc.cluster.local", opcode=2), listen.getsockname())  # STATUS: NOTIMP
    first = sorted([await loop.run_in_executor(None, ask.recv, 4096) for _ in range(2)])
    print("first", [struct.unpack("!HH", s[:4]) for s in first], "dns" in sys.modules)
    ask.sendto(wire(3, "productpage.ns1.svc.cluster.local"), listen.getsockname())
    again = await loop.run_in_executor(None, ask.recv, 4096)
    print("again", struct.unpack("!HH", again[:4]), again[4:] == first[0][4:], len(server._cache._answers))
    transport.close()

asyncio.run(main())
"""


def test_a_pods_dns_proxy_loads_dnspython_for_its_first_query_and_answers_a_mesh_name_again_from_memory() -> None:
    """A fresh interpreter: a pod that asks nothing costs no dnspython; two queries (a mesh name, and opcode STATUS,
    answered NOTIMP) arrive before dnspython is there, wait for it and are both answered; the mesh name asked again
    is dnspython's answer sent again with the new id."""
    root = Path(__file__).resolve().parents[2]
    done = subprocess.run(
        [sys.executable, "-c", LAZY_PROBE], cwd=root, check=False, capture_output=True, text=True, timeout=120
    )
    assert done.returncode == 0, done.stderr[-2000:]
    # 0x8500: QR, AA, RD, NOERROR; 0x9104: QR, opcode STATUS, RD, NOTIMP (dnspython's make_response keeps the opcode)
    assert done.stdout.splitlines() == [
        "idle False",
        "first [(1, 34048), (2, 37124)] True",
        "again (3, 34048) True 1",
    ], done.stdout
