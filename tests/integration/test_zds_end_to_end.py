"""ZDS end to end over a real SOCK_SEQPACKET socket: ZdsServer (agent) and ZdsClient (node proxy) with a fake pod
handler. The "pod" netns is this process's own (``/proc/self/ns/net``), so no root is needed.
"""

from __future__ import annotations

import asyncio
import itertools
import os
import stat
from collections.abc import AsyncIterator, Callable
from pathlib import Path

import pytest

from ambit.zds.client import ZdsClient
from ambit.zds.protocol import WorkloadInfo
from ambit.zds.server import ZdsLinkError, ZdsServer

pytestmark = pytest.mark.timeout(30)

NETNS = "/proc/self/ns/net"
WEB = {"name": "web-0", "namespace": "apps", "service_account": "web"}


class FakePods:
    """Records what the client asked for; pods in ``failing`` raise."""

    def __init__(self) -> None:
        self.opened: list[tuple[str, WorkloadInfo, int]] = []  # (uid, info, netns inode)
        self.stopped: list[str] = []
        self.failing: set[str] = set()

    async def open_listeners(self, uid: str, info: WorkloadInfo, netns_fd: int) -> None:
        if uid in self.failing:
            raise OSError("bind 15001: address in use")
        self.opened.append((uid, info, os.fstat(netns_fd).st_ino))

    async def stop(self, uid: str) -> None:
        self.stopped.append(uid)


async def wait_until(predicate: Callable[[], bool]) -> None:
    """Poll ``predicate`` until it is true, for at most five seconds."""
    async with asyncio.timeout(5.0):
        for _ in itertools.count():
            if predicate():
                return
            await asyncio.sleep(0.005)


@pytest.fixture
async def server(tmp_path: Path) -> AsyncIterator[ZdsServer]:
    zds = ZdsServer(tmp_path / "ztunnel.sock")
    await zds.start()
    try:
        yield zds
    finally:
        await zds.aclose()


async def connected_client(server: ZdsServer, pods: FakePods) -> ZdsClient:
    client = ZdsClient(server.socket_path, pods)
    await client.start()
    await wait_until(lambda: client.ready)
    return client


async def test_socket_is_private_to_its_owner(server: ZdsServer) -> None:
    assert stat.S_IMODE(server.socket_path.stat().st_mode) == 0o600


async def test_add_hands_the_netns_to_the_proxy_and_returns_after_the_ack(server: ZdsServer) -> None:
    pods = FakePods()
    client = await connected_client(server, pods)
    try:
        await server.add("uid-web", NETNS, WEB)
        assert pods.opened == [("uid-web", WorkloadInfo("web-0", "apps", "web"), os.stat(NETNS).st_ino)]
        assert client.session.pods["uid-web"].info.service_account == "web"
    finally:
        await client.aclose()


async def test_a_handler_that_raises_makes_add_raise(server: ZdsServer) -> None:
    pods = FakePods()
    pods.failing.add("uid-bad")
    client = await connected_client(server, pods)
    try:
        with pytest.raises(ZdsLinkError, match="address in use"):
            await server.add("uid-bad", NETNS, WEB)
        assert not client.ready  # the pod is pending
        await server.add("uid-web", NETNS, WEB)  # the connection stayed up
        assert [uid for uid, _, _ in pods.opened] == ["uid-web"]
    finally:
        await client.aclose()


async def test_delete_stops_the_pod_proxy(server: ZdsServer) -> None:
    pods = FakePods()
    client = await connected_client(server, pods)
    try:
        await server.add("uid-web", NETNS, WEB)
        await server.delete("uid-web")
        await wait_until(lambda: pods.stopped == ["uid-web"])
        assert "uid-web" not in server.pods
    finally:
        await client.aclose()


async def test_a_new_proxy_gets_every_pod_in_its_snapshot(server: ZdsServer) -> None:
    first = FakePods()
    client = await connected_client(server, first)
    await server.add("uid-a", NETNS, WEB)
    await server.add("uid-b", NETNS, {**WEB, "name": "web-1"})
    await client.aclose()

    second = FakePods()
    client = await connected_client(server, second)
    try:
        assert sorted(uid for uid, _, _ in second.opened) == ["uid-a", "uid-b"]
        assert {ino for _, _, ino in second.opened} == {os.stat(NETNS).st_ino}
    finally:
        await client.aclose()


async def test_the_client_reconnects_after_the_agent_restarts(tmp_path: Path) -> None:
    path = tmp_path / "ztunnel.sock"
    delays: list[float] = []

    async def sleep(seconds: float) -> None:
        delays.append(seconds)
        await asyncio.sleep(0.001)

    pods = FakePods()
    client = ZdsClient(path, pods, sleep=sleep, backoff_max=0.05)
    await client.start()
    try:
        await wait_until(lambda: len(delays) >= 8)  # nobody listens yet: back-off, doubling up to the cap
        assert all(d <= 0.05 for d in delays) and max(delays) > delays[0]
        for attempt in (1, 2):
            server = ZdsServer(path)
            await server.start()
            try:
                await wait_until(lambda n=attempt: client.connects == n and client.ready)
                await server.add(f"uid-{attempt}", NETNS, WEB)
            finally:
                await server.aclose()
        assert [uid for uid, _, _ in pods.opened] == ["uid-1", "uid-2"]
    finally:
        await client.aclose()


async def test_add_without_a_connected_proxy_fails_promptly(server: ZdsServer) -> None:
    async with asyncio.timeout(1):
        with pytest.raises(ZdsLinkError, match="no node proxy"):
            await server.add("uid-web", NETNS, WEB)
    assert "uid-web" in server.pods  # kept for the snapshot of the next proxy


async def test_a_pod_whose_listeners_failed_stays_pending_and_is_retried_until_they_open(server: ZdsServer) -> None:
    pods = FakePods()
    client = ZdsClient(server.socket_path, pods, pending_retry=0.1)
    await client.start()
    try:
        await wait_until(lambda: client.ready)
        pods.failing.add("uid-bad")
        with pytest.raises(ZdsLinkError):
            await server.add("uid-bad", NETNS, WEB)
        assert not client.ready, "a pending pod keeps the proxy not ready"
        await asyncio.sleep(0.3)
        assert client.retries == 0
        pods.failing.discard("uid-bad")
        await wait_until(lambda: client.ready)
        assert client.retries == 1
        assert [uid for uid, _, _ in pods.opened] == ["uid-bad"]
        assert pods.opened[0][2] == os.stat(NETNS).st_ino, "the retry used the pod's own netns"
    finally:
        await client.aclose()


async def test_a_pending_pod_deleted_is_no_longer_retried(server: ZdsServer) -> None:
    pods = FakePods()
    client = ZdsClient(server.socket_path, pods, pending_retry=0.05)
    await client.start()
    try:
        await wait_until(lambda: client.ready)
        pods.failing.add("uid-bad")
        with pytest.raises(ZdsLinkError):
            await server.add("uid-bad", NETNS, WEB)
        await server.delete("uid-bad")
        pods.failing.discard("uid-bad")
        await asyncio.sleep(0.3)
        assert pods.opened == [] and client.retries == 0
        await wait_until(lambda: client.ready)
    finally:
        await client.aclose()


class StopHeldPods(FakePods):
    """A pod handler whose ``stop`` waits until released, so the agent can go away while a Del is handled."""

    def __init__(self) -> None:
        super().__init__()
        self.stopping = asyncio.Event()
        self.release = asyncio.Event()

    async def stop(self, uid: str) -> None:
        self.stopping.set()
        await self.release.wait()
        await super().stop(uid)


async def test_an_agent_gone_before_the_dels_ack_is_reconnected_to(tmp_path: Path) -> None:
    """Seen on the lab (a node agent's DaemonSet deleted just after one of its pods was): the agent closed its end
    while the node proxy stopped the deleted pod, the Del's ack then failed with EPIPE, and that error ended the
    client's task: the node proxy never connected to the next agent and no pod of its node could start."""
    path = tmp_path / "ztunnel.sock"
    pods = StopHeldPods()
    server = ZdsServer(path)
    await server.start()
    client = ZdsClient(path, pods, backoff_max=0.05)
    await client.start()
    try:
        await wait_until(lambda: client.ready)
        await server.add("uid-a", NETNS, WEB)
        deleting = asyncio.create_task(server.delete("uid-a"))
        await asyncio.wait_for(pods.stopping.wait(), 5)
        deleting.cancel()
        await server.aclose()  # the agent stops while the proxy is still stopping the pod
        pods.release.set()
        await wait_until(lambda: pods.stopped == ["uid-a"])
        server = ZdsServer(path)
        await server.start()
        await wait_until(lambda: client.connects == 2 and client.ready)
        await server.add("uid-b", NETNS, WEB)  # the new agent's pod reaches the proxy
        assert [uid for uid, _, _ in pods.opened] == ["uid-a", "uid-b"]
    finally:
        await client.aclose()
        await server.aclose()
