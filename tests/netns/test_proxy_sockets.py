"""The per-pod socket factory in real namespaces: its sockets live in the pod's netns, carry the proxy mark, can
spoof a client's source address for inbound delivery, and the factory cleans up after itself.

Each test makes two namespaces ``eps<hex>a`` and ``eps<hex>b`` joined by a veth pair (eth0 on both sides:
198.18.240.1/24 in A, 198.18.240.2/24 in B; nothing in the root namespace) and deletes them in the finalizer.
The test process itself stays in the root namespace throughout.
"""

from __future__ import annotations

import asyncio
import itertools
import os
import secrets
import socket
import subprocess
import threading
from collections.abc import AsyncIterator, Iterator
from dataclasses import dataclass

import pytest

from ambit.commands import SubprocessRunner
from ambit.proxy import sockets as proxy_sockets
from ambit.proxy.errors import SocketFactoryError
from ambit.proxy.sockets import PROXY_MARK, NetnsSocketFactory, connect, use_loopback_congestion
from ambit.proxy.streams import SocketStream
from ambit.redirect import InPodSettings
from ambit.redirect.apply import apply_inpod

pytestmark = [pytest.mark.root, pytest.mark.timeout(60)]

A_IP = "198.18.240.1"
B_IP = "198.18.240.2"
SPOOFED_IP = "198.18.240.77"  # nobody's address
APP_PORT = 8080


def sh(*argv: str) -> str:
    return subprocess.run(argv, capture_output=True, text=True, check=True).stdout


@dataclass(frozen=True)
class Pair:
    a: str
    b: str


@pytest.fixture
def pair() -> Iterator[Pair]:
    prefix = f"eps{secrets.token_hex(3)}"
    names = Pair(f"{prefix}a", f"{prefix}b")
    try:
        for ns in (names.a, names.b):
            sh("ip", "netns", "add", ns)
            sh("ip", "-n", ns, "link", "set", "lo", "up")
        sh("ip", "-n", names.a, "link", "add", "eth0", "type", "veth", "peer", "name", "eth0", "netns", names.b)
        for ns, ip in ((names.a, A_IP), (names.b, B_IP)):
            sh("ip", "-n", ns, "addr", "add", f"{ip}/24", "dev", "eth0")
            sh("ip", "-n", ns, "link", "set", "eth0", "up")
        yield names
    finally:
        for ns in (names.a, names.b):
            subprocess.run(["ip", "netns", "del", ns], capture_output=True, check=False)
        assert prefix not in sh("ip", "netns", "list")


@pytest.fixture
async def factories(pair: Pair) -> AsyncIterator[tuple[NetnsSocketFactory, NetnsSocketFactory]]:
    made = []
    for ns in (pair.a, pair.b):
        fd = os.open(f"/run/netns/{ns}", os.O_RDONLY | os.O_CLOEXEC)
        try:
            made.append(NetnsSocketFactory(fd, name=ns, spares=4))
        finally:
            os.close(fd)  # the factory holds its own dup
    try:
        for factory in made:
            await factory.start()
        yield made[0], made[1]
    finally:
        for factory in made:
            await factory.aclose()


async def app_listener(factory: NetnsSocketFactory, ip: str) -> socket.socket:
    """A plain listening socket in the factory's netns, as the pod's app would have (no proxy mark)."""
    sock = await factory.tcp_socket()
    sock.setsockopt(socket.SOL_SOCKET, socket.SO_MARK, 0)
    sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
    sock.bind((ip, APP_PORT))
    sock.listen(8)
    return sock


async def echo_once(client: socket.socket, server: socket.socket) -> None:
    """Bytes go both ways over the connection (replies route back, not just the handshake)."""
    loop = asyncio.get_running_loop()
    async with asyncio.timeout(5):
        await loop.sock_sendall(client, b"hello")
        assert await loop.sock_recv(server, 16) == b"hello"
        await loop.sock_sendall(server, b"world")
        assert await loop.sock_recv(client, 16) == b"world"


async def test_a_factory_socket_lives_in_the_pod_netns_and_carries_the_proxy_mark(
    factories: tuple[NetnsSocketFactory, NetnsSocketFactory],
) -> None:
    ns_a, ns_b = factories
    loop = asyncio.get_running_loop()
    with await app_listener(ns_b, B_IP) as server_listener:
        client = await connect(ns_a, (B_IP, APP_PORT), timeout=5)
        with client:
            server, peer = await loop.sock_accept(server_listener)
            with server:
                assert peer[0] == A_IP  # only a socket in A has that source address
                assert client.getsockopt(socket.SOL_SOCKET, socket.SO_MARK) == PROXY_MARK
                await echo_once(client, server)


async def test_a_transparent_connect_delivers_from_the_client_ip_under_the_pod_redirect_rules(
    pair: Pair, factories: tuple[NetnsSocketFactory, NetnsSocketFactory]
) -> None:
    _, ns_b = factories
    apply_inpod(pair.b, InPodSettings(), "nftables", SubprocessRunner())
    loop = asyncio.get_running_loop()
    with await app_listener(ns_b, B_IP) as app:
        proxy_side = await connect(ns_b, (B_IP, APP_PORT), source_ip=SPOOFED_IP, timeout=5)
        with proxy_side:
            server, peer = await loop.sock_accept(app)
            with server:
                assert peer[0] == SPOOFED_IP
                assert proxy_side.getsockname()[0] == SPOOFED_IP
                await echo_once(proxy_side, server)
                stream = SocketStream(server)
                stream.write_eof()
                assert await loop.sock_recv(proxy_side, 16) == b""


def congestion(sock: socket.socket) -> str:
    return sock.getsockopt(socket.IPPROTO_TCP, socket.TCP_CONGESTION, 16).rstrip(b"\0").decode()


def pacing_default(ns: str) -> tuple[str, str]:
    """Set ``ns``'s default congestion control to one that is not the loopback legs' (bbr where the kernel has it:
    the pacing one); (that default, the loopback legs' algorithm)."""
    available = sh("sysctl", "-n", "net.ipv4.tcp_available_congestion_control").split()
    loopback = next(name.decode() for name in proxy_sockets.LOOPBACK_CONGESTION if name.decode() in available)
    default = "bbr" if "bbr" in available else next(name for name in available if name != loopback)
    sh("ip", "netns", "exec", ns, "sysctl", "-q", "-w", f"net.ipv4.tcp_congestion_control={default}")
    return default, loopback


async def test_a_loopback_dial_does_not_pace_and_other_dials_keep_the_netns_default(
    pair: Pair, factories: tuple[NetnsSocketFactory, NetnsSocketFactory]
) -> None:
    _, ns_b = factories
    apply_inpod(pair.b, InPodSettings(), "nftables", SubprocessRunner())  # the spoofed delivery's replies come back
    default, loopback = pacing_default(pair.b)
    loop = asyncio.get_running_loop()
    with await app_listener(ns_b, B_IP) as app:
        delivery = await connect(ns_b, (B_IP, APP_PORT), source_ip=SPOOFED_IP, timeout=5, loopback=True)
        plain = await connect(ns_b, (B_IP, APP_PORT), timeout=5)
        with delivery, plain:
            for client in (delivery, plain):
                server, _ = await loop.sock_accept(app)
                with server:
                    await echo_once(client, server)
                    assert congestion(server) == default  # the application's side is the application's
            assert congestion(delivery) == loopback
            assert congestion(plain) == default


async def test_a_kernel_that_takes_no_loopback_algorithm_keeps_the_default_and_the_dial_works(
    pair: Pair, factories: tuple[NetnsSocketFactory, NetnsSocketFactory], monkeypatch: pytest.MonkeyPatch
) -> None:
    _, ns_b = factories
    default, _ = pacing_default(pair.b)
    monkeypatch.setattr(proxy_sockets, "LOOPBACK_CONGESTION", (b"no-such-algorithm", b"x" * 15))
    loop = asyncio.get_running_loop()
    with await app_listener(ns_b, B_IP) as app:
        client = await connect(ns_b, (B_IP, APP_PORT), timeout=5, loopback=True)
        with client:
            server, _ = await loop.sock_accept(app)
            with server:
                await echo_once(client, server)
            assert congestion(client) == default
            assert use_loopback_congestion(client) is False


async def test_connections_accepted_by_a_loopback_listener_inherit_its_algorithm(
    pair: Pair, factories: tuple[NetnsSocketFactory, NetnsSocketFactory]
) -> None:
    _, ns_b = factories
    default, loopback = pacing_default(pair.b)
    loop = asyncio.get_running_loop()
    with await app_listener(ns_b, B_IP) as listener:
        assert use_loopback_congestion(listener) is True
        client = await connect(ns_b, (B_IP, APP_PORT), timeout=5)
        with client:
            accepted, _ = await loop.sock_accept(listener)
            with accepted:
                await echo_once(client, accepted)
                assert congestion(accepted) == loopback
            assert congestion(client) == default


async def test_spares_are_refilled_after_use_and_a_drained_pool_still_answers(
    factories: tuple[NetnsSocketFactory, NetnsSocketFactory],
) -> None:
    ns_a, _ = factories

    async def pool_full() -> None:
        async with asyncio.timeout(5):
            for _ in itertools.count():
                if ns_a.spare_count == 4:
                    return
                await asyncio.sleep(0.01)

    await pool_full()
    taken = [await ns_a.tcp_socket() for _ in range(10)]  # more than the pool holds: some come the slow way
    try:
        assert len({s.fileno() for s in taken}) == 10
        assert all(s.getsockopt(socket.SOL_SOCKET, socket.SO_MARK) == PROXY_MARK for s in taken)
        await pool_full()
    finally:
        for sock in taken:
            sock.close()


async def test_ipv6_sockets_get_a_pool_of_their_own_from_the_first_one_asked_for(
    factories: tuple[NetnsSocketFactory, NetnsSocketFactory],
) -> None:
    ns_a, _ = factories

    async def pooled(count: int) -> None:
        async with asyncio.timeout(5):
            while ns_a.spare_count != count:  # noqa: ASYNC110 - the factory's thread fills it
                await asyncio.sleep(0.01)

    await pooled(4)  # IPv4 only until an IPv6 socket is asked for
    first = await ns_a.tcp_socket(family=socket.AF_INET6)
    await pooled(8)
    taken = [await ns_a.tcp_socket(family=socket.AF_INET6, transparent=True) for _ in range(3)]
    try:
        for sock in (first, *taken):
            assert sock.family == socket.AF_INET6
            assert sock.getsockopt(socket.SOL_SOCKET, socket.SO_MARK) == PROXY_MARK
        assert all(sock.getsockopt(socket.IPPROTO_IPV6, 75) == 1 for sock in taken)  # IPV6_TRANSPARENT
    finally:
        first.close()
        for sock in taken:
            sock.close()


def fd_count() -> int:
    return len(os.listdir("/proc/self/fd"))


async def test_aclose_stops_the_thread_and_closes_every_fd(pair: Pair) -> None:
    # Warm up what asyncio.to_thread creates once per loop (the default executor), so it is not counted.
    await asyncio.to_thread(lambda: None)
    before = fd_count()
    fd = os.open(f"/run/netns/{pair.a}", os.O_RDONLY | os.O_CLOEXEC)
    factory = NetnsSocketFactory(fd, name=pair.a, spares=3)
    os.close(fd)
    await factory.start()
    (await factory.tcp_socket(transparent=True)).close()
    assert factory.thread_name in {t.name for t in threading.enumerate()}
    await factory.aclose()
    await factory.aclose()
    assert factory.thread_name not in {t.name for t in threading.enumerate()}
    assert fd_count() == before
    with pytest.raises(SocketFactoryError):
        await factory.tcp_socket()


async def test_a_factory_on_something_that_is_not_a_netns_fails_to_start_and_cleans_up(pair: Pair) -> None:
    before = fd_count()
    fd = os.open("/dev/null", os.O_RDONLY | os.O_CLOEXEC)
    factory = NetnsSocketFactory(fd, name="not-a-netns")
    os.close(fd)
    with pytest.raises(SocketFactoryError, match="cannot make sockets in the netns"):
        await factory.start()
    assert factory.thread_name not in {t.name for t in threading.enumerate()}
    assert fd_count() == before
