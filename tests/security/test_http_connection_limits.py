"""The proxies' small HTTP servers under attack: too many clients, half-sent heads, clients that never read.

:class:`~ambit.telemetry.limited_site.LimitedSite` is exercised with a real aiohttp application on loopback
(short lifetimes, so the test waits well under a second per rule), and then the wiring in a real node proxy: 200
clients asking for a full page of flows and never reading it used to pin 130 MiB in the proxy.
"""

from __future__ import annotations

import asyncio
import contextlib
import os
import socket
from collections.abc import AsyncIterator, Iterator
from pathlib import Path

import pytest
from aiohttp import web
from hypothesis import given
from hypothesis import strategies as st
from tests.harness import process_rss
from tests.proxyconfig_rig import loopback_node_proxy_settings

from ambit.inpod.daemon import NodeProxy
from ambit.inpod.eventloop import run
from ambit.telemetry.connection_limits import ADMIN_LIMITS, ConnectionGate, ConnectionLimits
from ambit.telemetry.flows import Flow
from ambit.telemetry.limited_site import LimitedSite

BIG = b"x" * (4 << 20)  # larger than any socket buffer on loopback: a client that does not read pins it


class Site:
    def __init__(self, runner: web.AppRunner, site: LimitedSite) -> None:
        self.runner = runner
        self.site = site

    @property
    def port(self) -> int:
        return int(self.runner.addresses[0][1])


async def start_site(limits: ConnectionLimits) -> Site:
    async def small(_request: web.Request) -> web.Response:
        return web.Response(text="ok\n")

    async def big(_request: web.Request) -> web.Response:
        return web.Response(body=BIG)

    app = web.Application()
    app.router.add_get("/small", small)
    app.router.add_get("/big", big)
    runner = web.AppRunner(app, access_log=None, handle_signals=False, shutdown_timeout=0.5)
    await runner.setup()
    site = LimitedSite(runner, "127.0.0.1", 0, limits)
    await site.start()
    return Site(runner, site)


@pytest.fixture
async def sites() -> AsyncIterator[list[Site]]:
    started: list[Site] = []
    yield started
    for site in started:
        await site.runner.cleanup()


class Clients:
    """Raw client sockets (non-blocking, for the loop's sock_* calls); all closed at the end."""

    def __init__(self) -> None:
        self.socks: list[socket.socket] = []

    async def connect(self, port: int, source: str = "127.0.0.1", rcvbuf: int = 0) -> socket.socket:
        sock = socket.socket()
        self.socks.append(sock)
        if rcvbuf:
            sock.setsockopt(socket.SOL_SOCKET, socket.SO_RCVBUF, rcvbuf)
        sock.bind((source, 0))
        sock.setblocking(False)
        await asyncio.get_running_loop().sock_connect(sock, ("127.0.0.1", port))
        return sock


@pytest.fixture
def clients() -> Iterator[Clients]:
    made = Clients()
    yield made
    for sock in made.socks:
        sock.close()


async def closed_by_peer(sock: socket.socket, within: float = 10.0) -> bool:
    """Read until the server closes (EOF or reset); False if it is still open after ``within`` seconds."""
    loop = asyncio.get_running_loop()
    try:
        async with asyncio.timeout(within):
            while await loop.sock_recv(sock, 65536):
                pass
    except TimeoutError:
        return False
    except ConnectionResetError:
        return True
    return True


async def ask(sock: socket.socket, path: str) -> bytes:
    """One keep-alive request; the whole answer of /small."""
    loop = asyncio.get_running_loop()
    await loop.sock_sendall(sock, f"GET {path} HTTP/1.1\r\nHost: x\r\n\r\n".encode())
    answer = b""
    async with asyncio.timeout(10):
        while not answer.endswith(b"ok\n"):
            chunk = await loop.sock_recv(sock, 4096)
            if not chunk:
                break
            answer += chunk
    return answer


async def eventually(check: object, within: float = 10.0) -> None:
    assert callable(check)
    async with asyncio.timeout(within):
        while not check():  # noqa: ASYNC110 - the server's own bookkeeping
            await asyncio.sleep(0.02)


# -- the gate's bookkeeping ----------------------------------------------------------------------------------------


@given(st.lists(st.tuples(st.booleans(), st.sampled_from(["a", "b", "c"])), max_size=200))
def test_the_gate_never_admits_past_its_limits_and_releases_exactly(steps: list[tuple[bool, str]]) -> None:
    gate = ConnectionGate(ConnectionLimits(total=5, per_address=2, lifetime=1.0))
    held: list[str] = []
    for opening, address in steps:
        if opening:
            expected = len(held) < 5 and held.count(address) < 2
            assert gate.admit(address) is expected
            if expected:
                held.append(address)
        elif address in held:
            held.remove(address)
            gate.release(address)
        assert gate.open == len(held)
    for address in list(held):
        gate.release(address)
    assert gate.open == 0 and gate.admit("a")


@pytest.mark.parametrize(
    "limits",
    [
        dict(total=0, per_address=0, lifetime=1.0),
        dict(total=2, per_address=3, lifetime=1.0),
        dict(total=2, per_address=1, lifetime=0.0),
        dict(total=2, per_address=1, lifetime=1.0, grace=-1.0),
    ],
)
def test_nonsensical_limits_are_refused(limits: dict[str, float]) -> None:
    with pytest.raises(ValueError, match="invalid connection limits"):
        ConnectionLimits(**limits)  # type: ignore[arg-type]


# -- the site, attacked -------------------------------------------------------------------------------------------


async def test_connections_past_the_total_are_cut_at_once_and_slots_come_back(
    sites: list[Site], clients: Clients
) -> None:
    sites.append(site := await start_site(ConnectionLimits(total=3, per_address=3, lifetime=30.0)))
    held = [await clients.connect(site.port) for _ in range(3)]
    await eventually(lambda: site.site.gate.open == 3)
    extra = await clients.connect(site.port)
    assert await closed_by_peer(extra, within=5.0)
    assert site.site.gate.refused >= 1
    assert b"200 OK" in await ask(held[0], "/small")  # the admitted ones are served
    held[1].close()
    await eventually(lambda: site.site.gate.open == 2)
    assert b"200 OK" in await ask(await clients.connect(site.port), "/small")


async def test_one_address_cannot_take_every_slot(sites: list[Site], clients: Clients) -> None:
    sites.append(site := await start_site(ConnectionLimits(total=6, per_address=2, lifetime=30.0)))
    mine = [await clients.connect(site.port, source="127.0.0.1") for _ in range(2)]
    await eventually(lambda: site.site.gate.open == 2)
    assert await closed_by_peer(await clients.connect(site.port, source="127.0.0.1"), within=5.0)
    other = await clients.connect(site.port, source="127.0.0.2")
    assert b"200 OK" in await ask(other, "/small")
    assert b"200 OK" in await ask(mine[0], "/small")


async def test_a_half_sent_head_is_closed_after_the_lifetime(sites: list[Site], clients: Clients) -> None:
    sites.append(site := await start_site(ConnectionLimits(total=4, per_address=4, lifetime=0.5, grace=0.5)))
    sock = await clients.connect(site.port)
    await asyncio.get_running_loop().sock_sendall(sock, b"GET /small HTTP/1.1\r\nHost: x\r\nX-Slow: ")
    assert await closed_by_peer(sock)
    await eventually(lambda: site.site.gate.open == 0)


async def test_a_client_that_never_reads_a_large_answer_is_aborted_and_its_slot_freed(
    sites: list[Site], clients: Clients
) -> None:
    sites.append(site := await start_site(ConnectionLimits(total=4, per_address=4, lifetime=0.5, grace=0.5)))
    loop = asyncio.get_running_loop()
    stalled = await clients.connect(site.port, rcvbuf=4096)
    await loop.sock_sendall(stalled, b"GET /big HTTP/1.1\r\nHost: x\r\n\r\n")
    await eventually(lambda: site.site.gate.open == 1)
    await eventually(lambda: site.site.gate.open == 0)  # aborted with most of 4 MiB unsent
    got = 0
    with contextlib.suppress(ConnectionResetError):  # the server aborted: what was still queued is gone
        async with asyncio.timeout(10):
            while chunk := await loop.sock_recv(stalled, 65536):
                got += len(chunk)
    assert got < len(BIG)


async def test_a_keep_alive_client_is_served_and_closed_cleanly_between_requests(
    sites: list[Site], clients: Clients
) -> None:
    sites.append(site := await start_site(ConnectionLimits(total=4, per_address=4, lifetime=0.5, grace=0.5)))
    sock = await clients.connect(site.port)
    for _ in range(3):
        assert b"200 OK" in await ask(sock, "/small")
    assert await closed_by_peer(sock)  # after the lifetime, with no request in progress: a plain close


# -- the node proxy's admin port, attacked ------------------------------------------------------------------------


@pytest.fixture
async def proxy(tmp_path: Path) -> AsyncIterator[NodeProxy]:
    node_proxy = NodeProxy(loopback_node_proxy_settings(tmp_path, "workloads: []\nservices: []\n"))
    await node_proxy.start()
    try:
        yield node_proxy
    finally:
        await node_proxy.aclose()


async def test_clients_that_ask_for_flows_and_never_read_cannot_exhaust_the_node_proxy(
    proxy: NodeProxy, clients: Clients
) -> None:
    assert proxy.flows is not None
    long = "a" * 200
    for _ in range(5000):  # a full ring of long flows: the largest page there is
        proxy.flows.add_request(
            Flow(0, 0.0, "inbound", "allowed", True, src_identity=long, dst_identity=long, path="/" + long)
        )
    port = proxy.endpoints.ports["admin"]
    loop = asyncio.get_running_loop()
    before = process_rss(os.getpid())
    for _ in range(200):
        sock = await clients.connect(port, rcvbuf=4096)
        with contextlib.suppress(OSError):  # past the limit the proxy has already cut the connection
            await loop.sock_sendall(sock, b"GET /flows?limit=1000 HTTP/1.1\r\nHost: x\r\n\r\n")
    await asyncio.sleep(1.0)
    grown = process_rss(os.getpid()) - before
    assert grown < 40 << 20, f"the proxy grew by {grown >> 20} MiB for 200 stalled readers"
    for sock in clients.socks:
        sock.close()
    clients.socks.clear()
    # The slots come back as the stalled clients go away, and an honest reader is served.
    async with asyncio.timeout(ADMIN_LIMITS.lifetime + ADMIN_LIMITS.grace + 10):
        while True:
            try:
                reader, writer = await asyncio.open_connection("127.0.0.1", port)
                writer.write(b"GET /flows?limit=1 HTTP/1.1\r\nHost: x\r\nConnection: close\r\n\r\n")
                answer = await reader.read()
                writer.close()
                if b"200 OK" in answer:
                    break
            except ConnectionError:
                pass
            await asyncio.sleep(0.1)


# -- the same under uvloop (the node proxy's loop: its transports are not asyncio.Transport subclasses) -----------


async def _the_rules_in_brief() -> None:
    site = await start_site(ConnectionLimits(total=2, per_address=2, lifetime=0.5, grace=0.5))
    made = Clients()
    try:
        first = await made.connect(site.port)
        assert b"200 OK" in await ask(first, "/small")
        second = await made.connect(site.port)
        await asyncio.get_running_loop().sock_sendall(second, b"GET /small HTTP/1.1\r\nHost: x\r\nX-Slow: ")
        await eventually(lambda: site.site.gate.open == 2)
        assert await closed_by_peer(await made.connect(site.port), within=5.0)  # past the total
        assert await closed_by_peer(second) and await closed_by_peer(first)  # the lifetime ends both
        await eventually(lambda: site.site.gate.open == 0)
    finally:
        for sock in made.socks:
            sock.close()
        await site.runner.cleanup()


@pytest.mark.parametrize("loop_name", ["asyncio", "uvloop"])
def test_the_limits_hold_on_either_event_loop(loop_name: str) -> None:
    run(_the_rules_in_brief, loop_name)


async def test_the_dashboard_admits_the_admin_limit_of_connections_and_still_serves_its_page(
    tmp_path: Path, clients: Clients
) -> None:
    """``ambit dashboard`` on loopback: 16 idle connections take every slot, the 17th is cut at once, and the page
    is served again as soon as one of them goes."""
    from tests.integration.dashboard_rig import running_dashboard

    (tmp_path / "proxy").mkdir()
    loop = asyncio.get_running_loop()
    async with running_dashboard(tmp_path / "proxy") as dash:
        held = [await clients.connect(dash.port) for _ in range(ADMIN_LIMITS.total)]
        assert await closed_by_peer(await clients.connect(dash.port), within=5)
        held[0].close()

        async def page() -> bytes:
            sock = await clients.connect(dash.port)
            try:
                await loop.sock_sendall(sock, f"GET / HTTP/1.1\r\nHost: 127.0.0.1:{dash.port}\r\n\r\n".encode())
                return await loop.sock_recv(sock, 4096)
            except (ConnectionResetError, BrokenPipeError):
                return b""

        async with asyncio.timeout(10):  # the slot comes back when the server sees the close
            while not (head := await page()).startswith(b"HTTP/1.1 200"):
                assert head == b"", head[:200]  # cut: the slot is not free yet
