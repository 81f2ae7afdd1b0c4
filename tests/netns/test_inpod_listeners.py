"""Pod listeners in a real network namespace: they listen there, not here, go away on stop, and see redirected
connections with their original destination.

Each test makes its own namespace ``ipl<hex>`` (with a veth pair inside it, eth0 on 198.18.251.1/24, so there is
somewhere to connect to) and deletes it in the fixture's finalizer.
"""

from __future__ import annotations

import asyncio
import itertools
import os
import secrets
import socket
import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path

import pytest

from ambit.commands import SubprocessRunner
from ambit.inpod.listeners import ListenerError, Port, open_pod_listeners
from ambit.inpod.workloads import PodListenerManager
from ambit.proxy.sockets import LOOPBACK_CONGESTION
from ambit.redirect import InPodSettings
from ambit.redirect.apply import apply_inpod
from ambit.zds.client import ZdsClient
from ambit.zds.protocol import WorkloadInfo
from ambit.zds.server import ZdsLinkError, ZdsServer

pytestmark = [pytest.mark.root, pytest.mark.timeout(60)]

INFO = WorkloadInfo("web-0", "apps", "web")
WEB = {"name": "web-0", "namespace": "apps", "service_account": "web"}
DB = {"name": "db-0", "namespace": "apps", "service_account": "db"}
POD_IP = "198.18.251.1"
PEER_IP = "198.18.251.9"  # on eth0's subnet: routable, and nothing answers it but the redirect
CONNECT = """
import socket, sys
s = socket.socket(socket.AF_INET6 if ":" in sys.argv[1] else socket.AF_INET)
s.settimeout(2)
try:
    s.connect((sys.argv[1], int(sys.argv[2])))
    print("connected")
except OSError as exc:
    print(f"error {exc!r}")
"""


def sh(*argv: str) -> str:
    return subprocess.run(argv, capture_output=True, text=True, check=True).stdout


@pytest.fixture
def netns() -> Iterator[str]:
    yield from _namespace()


@pytest.fixture
def other_netns() -> Iterator[str]:
    yield from _namespace()


def _namespace() -> Iterator[str]:
    name = f"ipl{secrets.token_hex(2)}"
    sh("ip", "netns", "add", name)
    try:
        sh("ip", "-n", name, "link", "set", "lo", "up")
        sh("ip", "-n", name, "link", "add", "eth0", "type", "veth", "peer", "name", "eth1")
        sh("ip", "-n", name, "addr", "add", f"{POD_IP}/24", "dev", "eth0")
        sh("ip", "-n", name, "link", "set", "eth0", "up")
        sh("ip", "-n", name, "link", "set", "eth1", "up")
        yield name
    finally:
        subprocess.run(["ip", "netns", "del", name], capture_output=True, check=False)
        assert name not in sh("ip", "netns", "list")


def listening(ns: str | None) -> set[str]:
    """``proto local-address:port`` of every listening socket in ``ns`` (None: this process's namespace)."""
    argv = ["ss", "-Hltnu"]
    text = sh(*(["ip", "netns", "exec", ns, *argv] if ns else argv))
    return {f"{line.split()[0]} {line.split()[4]}" for line in text.splitlines() if line.strip()}


POD_SOCKETS = {
    "tcp 0.0.0.0:15001",
    "tcp 0.0.0.0:15006",
    "tcp 0.0.0.0:15008",
    "tcp 127.0.0.1:15053",
    "udp 127.0.0.1:15053",
    "tcp [::]:15001",
    "tcp [::]:15006",
    "tcp [::]:15008",
    "tcp [::1]:15053",
    "udp [::1]:15053",
}
IPV6_SOCKETS = {"tcp [::]:15001", "tcp [::]:15006", "tcp [::]:15008", "tcp [::1]:15053", "udp [::1]:15053"}


async def test_listeners_open_inside_the_pod_netns_only_and_close_on_stop(netns: str) -> None:
    manager = PodListenerManager()
    fd = os.open(f"/run/netns/{netns}", os.O_RDONLY | os.O_CLOEXEC)
    try:
        await manager.open_listeners("uid-web", INFO, fd)
        assert listening(netns) >= POD_SOCKETS
        assert not POD_SOCKETS & listening(None)
        await manager.stop("uid-web")
        assert not POD_SOCKETS & listening(netns)
    finally:
        os.close(fd)
        await manager.aclose()


async def test_the_outbound_capture_listeners_alone_take_the_loopback_congestion_control(netns: str) -> None:
    """15001's connections come from the pod's own applications over lo: its listeners (whose accepted connections
    inherit it) do not pace; 15006 and 15008, which remote peers reach, keep the netns default."""
    available = sh("sysctl", "-n", "net.ipv4.tcp_available_congestion_control").split()
    loopback = next(name.decode() for name in LOOPBACK_CONGESTION if name.decode() in available)
    default = "bbr" if "bbr" in available else next(name for name in available if name != loopback)
    sh("ip", "netns", "exec", netns, "sysctl", "-qw", f"net.ipv4.tcp_congestion_control={default}")
    fd = os.open(f"/run/netns/{netns}", os.O_RDONLY | os.O_CLOEXEC)
    try:
        opened = await asyncio.to_thread(open_pod_listeners, fd)
    finally:
        os.close(fd)
    try:
        tcp = [listener for listener in opened if listener.spec.kind == socket.SOCK_STREAM]
        assert {listener.spec.port for listener in tcp} >= {Port.OUTBOUND, Port.INBOUND_PLAINTEXT, Port.INBOUND_HBONE}
        for listener in tcp:
            taken = listener.sock.getsockopt(socket.IPPROTO_TCP, socket.TCP_CONGESTION, 16).rstrip(b"\0").decode()
            assert taken == (loopback if listener.spec.port == Port.OUTBOUND else default), listener.spec
    finally:
        for listener in opened:
            listener.sock.close()


async def test_a_pod_without_ipv6_gets_its_ipv4_listeners_only_and_no_error(netns: str) -> None:
    sh("ip", "netns", "exec", netns, "sysctl", "-qw", "net.ipv6.conf.all.disable_ipv6=1")
    sh("ip", "netns", "exec", netns, "sysctl", "-qw", "net.ipv6.conf.lo.disable_ipv6=1")
    manager = PodListenerManager()
    fd = os.open(f"/run/netns/{netns}", os.O_RDONLY | os.O_CLOEXEC)
    try:
        await manager.open_listeners("uid-web", INFO, fd)
        assert listening(netns) >= POD_SOCKETS - IPV6_SOCKETS
        assert not IPV6_SOCKETS & listening(netns)
    finally:
        os.close(fd)
        await manager.aclose()


async def test_with_ipv6_turned_off_a_pod_with_ipv6_gets_its_ipv4_listeners_only(netns: str) -> None:
    manager = PodListenerManager(ipv6=False)
    fd = os.open(f"/run/netns/{netns}", os.O_RDONLY | os.O_CLOEXEC)
    try:
        await manager.open_listeners("uid-web", INFO, fd)
        assert listening(netns) >= POD_SOCKETS - IPV6_SOCKETS
        assert not IPV6_SOCKETS & listening(netns)
    finally:
        os.close(fd)
        await manager.aclose()


async def test_adding_a_pod_again_in_the_same_netns_keeps_its_listeners(netns: str) -> None:
    """A node agent's snapshot after a restart adds every pod again: duplicate adds are idempotent (spec §3.3)."""
    manager = PodListenerManager()
    fd = os.open(f"/run/netns/{netns}", os.O_RDONLY | os.O_CLOEXEC)
    again = os.open(f"/run/netns/{netns}", os.O_RDONLY | os.O_CLOEXEC)  # another fd, as a new agent sends
    try:
        await manager.open_listeners("uid-web", INFO, fd)
        pod = manager.find_pod("uid-web")
        assert pod is not None
        before = [listener.fileno() for listener in pod.listeners]
        await manager.open_listeners("uid-web", INFO, again)
        assert manager.find_pod("uid-web") is pod and [listener.fileno() for listener in pod.listeners] == before
        assert listening(netns) >= POD_SOCKETS
    finally:
        os.close(fd)
        os.close(again)
        await manager.aclose()


async def test_adding_a_pod_again_in_another_netns_moves_its_listeners_there(netns: str, other_netns: str) -> None:
    other = other_netns
    manager = PodListenerManager()
    fd = os.open(f"/run/netns/{netns}", os.O_RDONLY | os.O_CLOEXEC)
    moved = os.open(f"/run/netns/{other}", os.O_RDONLY | os.O_CLOEXEC)
    try:
        await manager.open_listeners("uid-web", INFO, fd)
        await manager.open_listeners("uid-web", INFO, moved)
        assert listening(other) >= POD_SOCKETS
        assert not POD_SOCKETS & listening(netns)
    finally:
        os.close(fd)
        os.close(moved)
        await manager.aclose()


async def test_an_outbound_connection_lands_on_15001_with_its_original_destination(netns: str) -> None:
    apply_inpod(netns, InPodSettings(), "nftables", SubprocessRunner())
    manager = PodListenerManager()
    fd = os.open(f"/run/netns/{netns}", os.O_RDONLY | os.O_CLOEXEC)
    try:
        await manager.open_listeners("uid-web", INFO, fd)
        proc = await asyncio.create_subprocess_exec(
            "ip", "netns", "exec", netns, sys.executable, "-I", "-S", "-c", CONNECT, PEER_IP, "8080",
            stdout=subprocess.PIPE,
        )  # fmt: skip
        out, _ = await proc.communicate()
        assert out.decode().strip() == "connected"
        pod = manager.find_pod("uid-web")
        assert pod is not None
        async with asyncio.timeout(5):
            for _ in itertools.count():
                if Port.OUTBOUND in pod.last_original_dst:
                    break
                await asyncio.sleep(0.01)
        assert pod.last_original_dst[Port.OUTBOUND] == (PEER_IP, 8080)
    finally:
        os.close(fd)
        await manager.aclose()


async def test_an_ipv6_outbound_connection_lands_on_the_ipv6_15001_with_its_original_destination(netns: str) -> None:
    """With the IPv6 rules, a pod's connection to an IPv6 address is redirected to ``[::1]:15001``, and the
    listener reads where it was going with ``IP6T_SO_ORIGINAL_DST``."""
    prefix = f"fd00:ab:{secrets.randbelow(0xFFFF) + 1:x}:"
    sh("ip", "-n", netns, "addr", "add", f"{prefix}:1/64", "dev", "eth0", "nodad")
    apply_inpod(netns, InPodSettings(ipv6=True), "nftables", SubprocessRunner())
    manager = PodListenerManager()
    fd = os.open(f"/run/netns/{netns}", os.O_RDONLY | os.O_CLOEXEC)
    try:
        await manager.open_listeners("uid-web", INFO, fd)
        proc = await asyncio.create_subprocess_exec(
            "ip", "netns", "exec", netns, sys.executable, "-I", "-S", "-c", CONNECT, f"{prefix}:9", "8080",
            stdout=subprocess.PIPE,
        )  # fmt: skip
        out, _ = await proc.communicate()
        assert out.decode().strip() == "connected"
        pod = manager.find_pod("uid-web")
        assert pod is not None
        async with asyncio.timeout(5):
            while Port.OUTBOUND not in pod.last_original_dst:  # noqa: ASYNC110 - the listener sets it
                await asyncio.sleep(0.01)
        assert pod.last_original_dst[Port.OUTBOUND] == (f"{prefix}:9", 8080)
    finally:
        os.close(fd)
        await manager.aclose()


async def test_a_pod_whose_application_holds_the_ipv6_15008_gets_no_listeners_and_an_error_naming_it(
    netns: str,
) -> None:
    """Where the netns has IPv6 the IPv6 listeners are required like the rest: all or none."""
    squatter = await asyncio.create_subprocess_exec(
        "ip", "netns", "exec", netns, sys.executable, "-c", SQUAT, "15008", "::", stdout=subprocess.PIPE
    )
    manager = PodListenerManager()
    fd = os.open(f"/run/netns/{netns}", os.O_RDONLY | os.O_CLOEXEC)
    try:
        assert squatter.stdout is not None
        assert (await asyncio.wait_for(squatter.stdout.readline(), 10)).strip() == b"listening"
        with pytest.raises(ListenerError, match=r"apps/web-0: cannot listen on \[::\]:15008/tcp"):
            await manager.open_listeners("uid-web", INFO, fd)
        assert manager.find_pod("uid-web") is None
        assert not (POD_SOCKETS - {"tcp [::]:15008"}) & listening(netns)
    finally:
        os.close(fd)
        squatter.kill()
        await squatter.wait()
        await manager.aclose()


SQUAT = """
import socket, sys, time
host = sys.argv[2] if len(sys.argv) > 2 else "0.0.0.0"
s = socket.socket(socket.AF_INET6 if ":" in host else socket.AF_INET)
if ":" in host:  # IPv6 only: the IPv4 listener binds, the IPv6 one cannot
    s.setsockopt(socket.IPPROTO_IPV6, socket.IPV6_V6ONLY, 1)
s.bind((host, int(sys.argv[1])))
s.listen()
print("listening", flush=True)
time.sleep(60)
"""


async def test_a_pod_whose_application_holds_15008_is_nacked_over_zds_naming_the_pod_and_port_and_others_are_served(
    netns: str, other_netns: str, tmp_path: Path
) -> None:
    """The pod's own application already listens on 15008 in its netns (without SO_REUSEPORT), so the node proxy
    cannot bind there: its Add is nacked with a message naming the pod and the port, none of its listeners stay
    open (fail closed: with the redirection in place, nothing of its traffic reaches a proxy port of ours), another
    pod is served, and once the application frees the port, adding the pod again enrols it."""
    squatter = await asyncio.create_subprocess_exec(
        "ip", "netns", "exec", netns, sys.executable, "-c", SQUAT, "15008", stdout=subprocess.PIPE
    )
    server = ZdsServer(tmp_path / "ztunnel.sock")
    manager = PodListenerManager()
    client = ZdsClient(server.socket_path, manager)
    try:
        assert squatter.stdout is not None
        assert (await asyncio.wait_for(squatter.stdout.readline(), 10)).strip() == b"listening"
        await server.start()
        await client.start()
        async with asyncio.timeout(10):
            while not client.ready:  # noqa: ASYNC110 - the client has no event for it
                await asyncio.sleep(0.01)
        with pytest.raises(ZdsLinkError) as refused:
            await server.add("uid-web", f"/run/netns/{netns}", WEB)
        message = str(refused.value)
        assert "apps/web-0" in message and "0.0.0.0:15008/tcp" in message and "in use" in message, message
        assert manager.find_pod("uid-web") is None
        assert not POD_SOCKETS & listening(netns) - {"tcp 0.0.0.0:15008"}  # all or none: the app's own 15008 only
        await server.add("uid-db", f"/run/netns/{other_netns}", DB)
        assert listening(other_netns) >= POD_SOCKETS
        squatter.kill()
        await squatter.wait()
        await server.add("uid-web", f"/run/netns/{netns}", WEB)
        assert manager.find_pod("uid-web") is not None and listening(netns) >= POD_SOCKETS
    finally:
        if squatter.returncode is None:
            squatter.kill()
            await squatter.wait()
        await client.aclose()
        await server.aclose()
        await manager.aclose()


async def test_a_pod_the_node_proxy_refused_is_in_the_snapshot_its_successor_gets_and_is_served_then(
    netns: str, tmp_path: Path
) -> None:
    """The node agent keeps a refused pod: a node proxy that connects later (a restart, an upgrade) gets it in its
    snapshot and serves it once its listeners can be opened."""
    squatter = await asyncio.create_subprocess_exec(
        "ip", "netns", "exec", netns, sys.executable, "-c", SQUAT, "15006", stdout=subprocess.PIPE
    )
    server = ZdsServer(tmp_path / "ztunnel.sock")
    first, second = PodListenerManager(), PodListenerManager()
    client = ZdsClient(server.socket_path, first)
    successor = ZdsClient(server.socket_path, second)
    try:
        assert squatter.stdout is not None
        assert (await asyncio.wait_for(squatter.stdout.readline(), 10)).strip() == b"listening"
        await server.start()
        await client.start()
        async with asyncio.timeout(10):
            while not client.ready:  # noqa: ASYNC110 - the client has no event for it
                await asyncio.sleep(0.01)
        with pytest.raises(ZdsLinkError, match=r"0\.0\.0\.0:15006/tcp"):
            await server.add("uid-web", f"/run/netns/{netns}", WEB)
        await client.aclose()
        await first.aclose()
        squatter.kill()
        await squatter.wait()
        await successor.start()
        async with asyncio.timeout(10):
            while not successor.ready:  # noqa: ASYNC110 - the client has no event for it
                await asyncio.sleep(0.01)
        assert second.find_pod("uid-web") is not None and listening(netns) >= POD_SOCKETS
    finally:
        if squatter.returncode is None:
            squatter.kill()
            await squatter.wait()
        await client.aclose()
        await successor.aclose()
        await server.aclose()
        await first.aclose()
        await second.aclose()
