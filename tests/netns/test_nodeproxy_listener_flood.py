"""A real ``ambit nodeproxy`` process (on its default event loop, uvloop) under an idle-connection flood on a pod's
15008, from the pod's peer namespace (:mod:`tests.netns.nodeproxy_rig`): its bounds come from the environment, an
established tunnel keeps relaying, the flood is bounded (and the process's resident memory with it) and counted on
the stats port, and a new client gets in.

The in-process floods of every HBONE listener are in ``tests/security/test_listener_floods.py``; this one checks the
process as deployed: the settings read from the environment and the pod accept loop wired to the node's budget.
"""

from __future__ import annotations

import asyncio
import contextlib
import os
import socket
import time
from pathlib import Path

import pytest
from tests.harness import process_rss
from tests.netns.nodeproxy_rig import POD_IP, add_pod, drain_rig, echo, sh
from tests.security.listener_flood import closed_by_server

from ambit.proxy.sockets import NetnsSocketFactory

pytestmark = [pytest.mark.root, pytest.mark.timeout(180)]

PENDING, PER_PEER, TIMEOUT = 12, 4, 4.0
BOUNDS = {
    "HBONE_MAX_PENDING_HANDSHAKES": str(PENDING),
    "HBONE_MAX_PENDING_HANDSHAKES_PER_PEER": str(PER_PEER),
    "HBONE_HANDSHAKE_TIMEOUT": f"{TIMEOUT:g}s",
}
SOURCES = [f"198.18.252.{n}" for n in range(20, 26)]
"""The attacker's addresses, beside the client's on the pod's peer namespace."""
PER_SOURCE = 10
RSS_BOUND = 24 * 1024 * 1024
"""The proxy process's resident memory growth allowed across the flood: its kept handshakes (a 256 KiB TLS buffer
each) and whatever the allocator keeps; without the bounds every one of the 60 connections would hold its buffer."""


def stats(node_ns: str) -> str:
    return sh("ip", "netns", "exec", node_ns, "curl", "-s", "--max-time", "5", "http://127.0.0.1:15020/metrics")


def refused(text: str) -> dict[str, int]:
    found: dict[str, int] = {}
    for line in text.splitlines():
        if line.startswith('ambit_listener_connections_refused_total{listener="hbone"'):
            labels, value = line.rsplit(" ", 1)
            found[labels.split('reason="')[1].split('"')[0]] = int(float(value))
    return found


async def test_a_flood_on_a_pods_hbone_port_is_bounded_by_the_settings_and_tunnels_keep_flowing(
    tmp_path: Path,
) -> None:
    async with drain_rig(tmp_path) as (rig, agent):
        for address in SOURCES:
            sh("ip", "-n", rig.client, "addr", "add", f"{address}/24", "dev", "eth0")
        proxy = rig.start_proxy(env=BOUNDS)
        await add_pod(agent, rig)
        await proxy.ready()
        client = await rig.hbone_client()
        stream = await rig.tunnel(client)
        await echo(stream, b"before the flood")

        rss_before = process_rss(proxy.proc.pid)
        fd = os.open(f"/run/netns/{rig.client}", os.O_RDONLY | os.O_CLOEXEC)
        factory = NetnsSocketFactory(fd, name="attacker", mark=0)
        await factory.start()
        flood: list[socket.socket] = []
        loop = asyncio.get_running_loop()
        try:
            for source in SOURCES:
                for _ in range(PER_SOURCE):
                    sock = await factory.tcp_socket()
                    sock.bind((source, 0))
                    flood.append(sock)
                    with contextlib.suppress(ConnectionResetError):  # refused before the connect call returned
                        await loop.sock_connect(sock, (POD_IP, 15008))
            started = time.monotonic()
            gone = await closed_by_server(flood, 1.0)
            await echo(stream, b"during the flood")
            assert time.monotonic() - started < 3.0
            kept = [sock for sock in flood if sock not in gone]
            assert len(kept) == PENDING, (len(kept), proxy.tail())
            growth = process_rss(proxy.proc.pid) - rss_before
            assert growth < RSS_BOUND, f"the proxy grew by {growth / 2**20:.1f} MiB"

            # A new client gets in while the flood holds every pending place.
            second = await rig.hbone_client()
            await echo(await rig.tunnel(second), b"a newcomer")
            counted = refused(stats(rig.node))
            assert counted == {
                "peer_pending": len(SOURCES) * (PER_SOURCE - PER_PEER),
                "pending_evicted": len(SOURCES) * PER_PEER - PENDING + 1,
            }, counted

            # The rest are closed at the handshake timeout, although the attacker holds them open.
            assert len(await closed_by_server(kept, TIMEOUT + 3.0)) == len(kept)
            await echo(stream, b"after the flood")
            await second.aclose()
        finally:
            for sock in flood:
                sock.close()
            await factory.aclose()
            os.close(fd)
        await client.aclose()
        assert proxy.proc.poll() is None, proxy.tail()
        assert "Traceback" not in proxy.tail(), proxy.tail()
