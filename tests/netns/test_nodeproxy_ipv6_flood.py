"""Floods of the IPv6 in-pod listeners of a real ``ambit nodeproxy`` process (the ``[::]`` sockets of 15008 and
15006 that the dual-stack listeners added; :mod:`ambit.inpod.listeners`), as the IPv4 floods of
``test_nodeproxy_listener_flood.py`` and ``tests/security/test_listener_floods.py``.

The rig is :mod:`tests.netns.nodeproxy_rig`'s, with a per-run ULA ``fd00:ab:<hex>::/64`` on the pod's veth (the pod
``::1``, its peer ``::9``, the attacker's sources beside it; no duplicate address detection), the workload's address
list carrying the pod's IPv6 address, and an IPv6 echo server in the pod on ``[::]:ECHO_PORT``.

- 15008 over IPv6: idle connections from six IPv6 sources are held to the pending bound (a newcomer evicts the
  oldest), each source to its share, the rest reset at once and counted; the proxy's resident memory stays within
  a bound; an HBONE tunnel established over IPv6 before the flood keeps relaying, a new HBONE client over IPv6 gets
  in while the flood holds every pending place, and the kept ones are closed at the handshake timeout.
- 15006 over IPv6 (plaintext to the pod's address, redirected by the in-pod rules): the plaintext connection bound
  holds, a flood beyond it is reset and counted, relayed connections keep flowing, and places given back are
  taken by newcomers.
- 15001 over IPv6 (the pod's own connections to an address outside the mesh, redirected by the in-pod rules): the
  same bound, reset and counted beyond it, relays flowing, places given back.
"""

from __future__ import annotations

import asyncio
import contextlib
import os
import secrets
import socket
import subprocess
import sys
import time
from collections.abc import AsyncIterator, Awaitable, Callable
from pathlib import Path

import pytest
from tests.harness import process_rss
from tests.netns.nodeproxy_rig import (
    CLIENT_ID,
    CLIENT_IP,
    ECHO_PORT,
    POD_ID,
    POD_IP,
    REPO,
    TD,
    WORKLOADS,
    DrainRig,
    Proxy,
    add_pod,
    drain_rig,
    echo,
    listening,
    sh,
)
from tests.security.listener_flood import closed_by_server

from ambit.commands import SubprocessRunner
from ambit.identity.localca import LocalCa
from ambit.proxy.hbone_client import HboneClient
from ambit.proxy.sockets import NetnsSocketFactory
from ambit.redirect import InPodSettings
from ambit.redirect.apply import apply_inpod

pytestmark = [pytest.mark.root, pytest.mark.timeout(180)]

PENDING, PER_PEER, TIMEOUT, PLAINTEXT = 12, 4, 4.0, 8
BOUNDS = {
    "HBONE_MAX_PENDING_HANDSHAKES": str(PENDING),
    "HBONE_MAX_PENDING_HANDSHAKES_PER_PEER": str(PER_PEER),
    "HBONE_HANDSHAKE_TIMEOUT": f"{TIMEOUT:g}s",
    "PLAINTEXT_MAX_CONNECTIONS": str(PLAINTEXT),
}
PER_SOURCE = 10
RSS_BOUND = 24 * 1024 * 1024
"""As the IPv4 process test: the kept handshakes' TLS buffers and whatever the allocator keeps."""
SIX_LISTENERS = {"tcp [::]:15001", "tcp [::]:15006", "tcp [::]:15008", "tcp [::1]:15053"}
ECHO6 = (
    "import asyncio\n"
    "async def h(r, w):\n"
    "    while d := await r.read(65536):\n"
    "        w.write(d); await w.drain()\n"
    "    w.close()\n"
    "async def m():\n"
    "    s = await asyncio.start_server(h, '::', {port})\n"
    "    await s.serve_forever()\n"
    "asyncio.run(m())\n"
)


class Six:
    """The run's IPv6 addresses: the pod, its peer (the legitimate client) and the attacker's sources."""

    def __init__(self) -> None:
        prefix = f"fd00:ab:{secrets.token_hex(2)}:"
        self.pod = f"{prefix}:1"
        self.client = f"{prefix}:9"
        self.sources = [f"{prefix}:{n:x}" for n in range(0x20, 0x26)]


def stats(node_ns: str) -> str:
    return sh("ip", "netns", "exec", node_ns, "curl", "-s", "--max-time", "5", "http://127.0.0.1:15020/metrics")


def refused(text: str, listener: str) -> dict[str, int]:
    found: dict[str, int] = {}
    for line in text.splitlines():
        if line.startswith(f'ambit_listener_connections_refused_total{{listener="{listener}"'):
            labels, value = line.rsplit(" ", 1)
            found[labels.split('reason="')[1].split('"')[0]] = int(float(value))
    return found


@contextlib.asynccontextmanager
async def six_rig(tmp_path: Path) -> AsyncIterator[tuple[DrainRig, Proxy, Six, NetnsSocketFactory]]:
    """The drain rig with IPv6 on the pod's veth, the pod's IPv6 address in its workload, an IPv6 echo server in the
    pod, a ready proxy with :data:`BOUNDS` serving it, and a socket factory in the client's namespace."""
    six = Six()
    async with drain_rig(tmp_path) as (rig, agent):
        for ns, addresses in ((rig.pod, [six.pod]), (rig.client, [six.client, *six.sources])):
            for address in addresses:
                sh("ip", "-n", ns, "addr", "add", f"{address}/64", "dev", "eth0", "nodad")
        # The node agent's in-pod rules for both families (the rig applies the IPv4 ones only).
        apply_inpod(rig.pod, InPodSettings(ipv6=True), "nftables", SubprocessRunner())
        config = rig.topology.mesh_config_file
        config.write_text(
            WORKLOADS.replace(f"[{POD_IP}]", f"[{POD_IP}, '{six.pod}']").replace(
                f"[{CLIENT_IP}]", f"[{CLIENT_IP}, '{six.client}']"
            )
        )
        fd = os.open(f"/run/netns/{rig.client}", os.O_RDONLY | os.O_CLOEXEC)
        factory = NetnsSocketFactory(fd, name="ipv6 client", mark=0)
        try:
            async with echo6_server(rig.pod, tmp_path / "echo6.log"):
                proxy = rig.start_proxy(env=BOUNDS)
                await add_pod(agent, rig)
                await proxy.ready()
                await factory.start()
                yield rig, proxy, six, factory
        finally:
            await factory.aclose()
            os.close(fd)


async def places_given_back(
    relayed: list[socket.socket], dial: Callable[[], Awaitable[socket.socket]], count: int
) -> None:
    """Close ``count`` of the ``relayed`` connections, then check that as many newcomers from ``dial`` get in (they
    join ``relayed``): a relay that ends gives its place back."""
    for sock in relayed[:count]:
        sock.close()
    del relayed[:count]
    deadline = time.monotonic() + 10
    newcomers = 0
    while newcomers < count:
        assert time.monotonic() < deadline, f"only {newcomers} newcomers got in: places not given back"
        sock = await dial()
        try:
            ok = await echo_once(sock, b"my turn") == b"my turn"
        except (OSError, AssertionError):
            ok = False
        if ok:
            relayed.append(sock)
            newcomers += 1
        else:
            sock.close()
            await asyncio.sleep(0.2)  # the ended relays' places are released as their splices see the end


@contextlib.asynccontextmanager
async def echo6_server(namespace: str, log_path: Path) -> AsyncIterator[None]:
    """An IPv6 echo server on ``[::]:ECHO_PORT`` in ``namespace``, listening when the block starts."""
    log = open(log_path, "wb")  # noqa: SIM115, ASYNC230 - closed below; a local file
    server = subprocess.Popen(  # noqa: ASYNC220 - started, not waited for
        ["ip", "netns", "exec", namespace, sys.executable, "-c", ECHO6.format(port=ECHO_PORT)],
        cwd=REPO,
        stdout=log,
        stderr=log,
    )
    try:
        async with asyncio.timeout(30):
            while f"tcp [::]:{ECHO_PORT}" not in listening(namespace):
                assert server.poll() is None, log_path.read_text()  # noqa: ASYNC240 - a failure message
                await asyncio.sleep(0.05)
        yield
    finally:
        server.terminate()
        server.wait(10)
        log.close()


async def dial6(factory: NetnsSocketFactory, source: str, address: tuple[str, int]) -> socket.socket:
    """A TCP connection over IPv6 from ``source`` in the client's namespace (one reset before the connect returned
    is returned too: a refused flood connection can be reset that quickly)."""
    sock = await factory.tcp_socket(family=socket.AF_INET6)
    sock.bind((source, 0))
    with contextlib.suppress(ConnectionResetError):
        await asyncio.get_running_loop().sock_connect(sock, address)
    return sock


async def hbone6(rig: DrainRig, six: Six, factory: NetnsSocketFactory) -> HboneClient:
    cert = await LocalCa(rig.topology.mesh_ca_dir, trust_domain=TD).fetch_certificate(CLIENT_ID)
    sock = await dial6(factory, six.client, (six.pod, 15008))
    return await HboneClient.connect(sock, cert, frozenset({POD_ID}), trust_domain=TD)


async def echo_once(sock: socket.socket, data: bytes) -> bytes:
    loop = asyncio.get_running_loop()
    await loop.sock_sendall(sock, data)
    got = b""
    async with asyncio.timeout(10):
        while len(got) < len(data):
            chunk = await loop.sock_recv(sock, 65536)
            assert chunk, f"the relay ended after {got!r}"
            got += chunk
    return got


async def test_an_ipv6_flood_on_a_pods_hbone_port_is_bounded_and_tunnels_over_ipv6_keep_flowing(
    tmp_path: Path,
) -> None:
    async with six_rig(tmp_path) as (rig, proxy, six, factory):
        assert listening(rig.pod) >= SIX_LISTENERS, listening(rig.pod)
        client = await hbone6(rig, six, factory)
        stream = await client.open_tunnel(f"[{six.pod}]:{ECHO_PORT}", [])
        await echo(stream, b"before the flood, over IPv6")

        rss_before = process_rss(proxy.proc.pid)
        flood = [await dial6(factory, source, (six.pod, 15008)) for source in six.sources for _ in range(PER_SOURCE)]
        try:
            started = time.monotonic()
            gone = await closed_by_server(flood, 1.0)
            await echo(stream, b"during the flood")
            assert time.monotonic() - started < 3.0
            kept = [sock for sock in flood if sock not in gone]
            assert len(kept) == PENDING, (len(kept), proxy.tail())
            growth = process_rss(proxy.proc.pid) - rss_before
            assert growth < RSS_BOUND, f"the proxy grew by {growth / 2**20:.1f} MiB"

            # A new client over IPv6 gets in while the flood holds every pending place.
            second = await hbone6(rig, six, factory)
            await echo(await second.open_tunnel(f"[{six.pod}]:{ECHO_PORT}", []), b"a newcomer over IPv6")
            counted = refused(stats(rig.node), "hbone")
            assert counted == {
                "peer_pending": len(six.sources) * (PER_SOURCE - PER_PEER),
                "pending_evicted": len(six.sources) * PER_PEER - PENDING + 1,
            }, counted

            # The rest are closed at the handshake timeout, although the attacker holds them open.
            assert len(await closed_by_server(kept, TIMEOUT + 3.0)) == len(kept)
            await echo(stream, b"after the flood")
            await second.aclose()
        finally:
            for sock in flood:
                sock.close()
        await client.aclose()
        assert proxy.proc.poll() is None, proxy.tail()
        assert "Traceback" not in proxy.tail(), proxy.tail()


async def test_an_ipv6_plaintext_flood_is_held_to_the_connection_bound_and_relays_keep_flowing(tmp_path: Path) -> None:
    async with six_rig(tmp_path) as (rig, proxy, six, factory):
        target = (six.pod, ECHO_PORT)  # plaintext to the pod: the in-pod rules redirect it to [::]:15006
        relayed = [await dial6(factory, six.client, target) for _ in range(PLAINTEXT)]
        flood: list[socket.socket] = []
        try:
            for n, sock in enumerate(relayed):
                assert await echo_once(sock, f"hello {n}".encode()) == f"hello {n}".encode()
            flood = [await dial6(factory, source, target) for source in six.sources[:4] for _ in range(10)]
            refused_now = await closed_by_server(flood, 5.0)
            assert len(refused_now) == len(flood) == 40
            assert refused(stats(rig.node), "inbound_plaintext") == {"connections": 40}
            for sock in relayed:  # the relayed ones never noticed
                assert await echo_once(sock, b"still here") == b"still here"

            await places_given_back(relayed, lambda: dial6(factory, six.sources[5], target), 4)
        finally:
            for sock in relayed + flood:
                sock.close()
        assert proxy.proc.poll() is None, proxy.tail()
        assert "Traceback" not in proxy.tail(), proxy.tail()


async def test_an_ipv6_flood_of_a_pods_own_outbound_connections_is_held_to_the_bound_and_relays_keep_flowing(
    tmp_path: Path,
) -> None:
    """15001 over IPv6: the pod's application opens connections to an address outside the mesh (passthrough), the
    in-pod rules redirect them to ``[::]:15001``; beyond the plaintext bound they are reset at once and counted, the
    relayed ones keep flowing, and a relay that ends gives its place back."""
    async with six_rig(tmp_path) as (rig, proxy, six, _), echo6_server(rig.client, tmp_path / "outside.log"):
        outside = six.sources[0]  # no workload's address: the node proxy passes the connection through
        fd = os.open(f"/run/netns/{rig.pod}", os.O_RDONLY | os.O_CLOEXEC)
        app = NetnsSocketFactory(fd, name="the pod's application", mark=0)
        relayed: list[socket.socket] = []
        flood: list[socket.socket] = []
        try:
            await app.start()
            target = (outside, ECHO_PORT)
            relayed = [await dial6(app, six.pod, target) for _ in range(PLAINTEXT)]
            for n, sock in enumerate(relayed):
                assert await echo_once(sock, f"out {n}".encode()) == f"out {n}".encode()
            flood = [await dial6(app, six.pod, target) for _ in range(30)]
            assert len(await closed_by_server(flood, 5.0)) == len(flood) == 30
            assert refused(stats(rig.node), "outbound") == {"connections": 30}
            for sock in relayed:  # the relayed ones never noticed
                assert await echo_once(sock, b"still here") == b"still here"
            await places_given_back(relayed, lambda: dial6(app, six.pod, target), 3)
        finally:
            for sock in relayed + flood:
                sock.close()
            await app.aclose()
            os.close(fd)
        assert proxy.proc.poll() is None, proxy.tail()
        assert "Traceback" not in proxy.tail(), proxy.tail()
