"""ZDS when a process runs out of file descriptors (EMFILE, likely under load): the node agent's accept loop and
the node proxy's connect loop must both go on once fds are free again, over real SOCK_SEQPACKET sockets.

The exhaustion is real: the soft RLIMIT_NOFILE is lowered to the lowest free fd number for a moment, so the next
``socket()`` or ``accept()`` of this process fails with EMFILE.
"""

from __future__ import annotations

import asyncio
import contextlib
import itertools
import logging
import os
import resource
import socket
from collections.abc import Callable, Iterator
from pathlib import Path

import pytest

from ambit.zds.client import ZdsClient
from ambit.zds.protocol import WorkloadInfo
from ambit.zds.server import ZdsLinkError, ZdsServer

pytestmark = pytest.mark.timeout(30)

NETNS = "/proc/self/ns/net"
WEB = {"name": "web-0", "namespace": "apps", "service_account": "web"}


class Pods:
    def __init__(self) -> None:
        self.opened: list[str] = []

    async def open_listeners(self, uid: str, info: WorkloadInfo, netns_fd: int) -> None:
        self.opened.append(uid)

    async def stop(self, uid: str) -> None:
        pass


async def wait_until(predicate: Callable[[], bool]) -> None:
    async with asyncio.timeout(5.0):
        for _ in itertools.count():
            if predicate():
                return
            await asyncio.sleep(0.005)


@contextlib.contextmanager
def out_of_fds() -> Iterator[None]:
    """No new fd for this process until the block ends (the lowest free fd number becomes the limit)."""
    soft, hard = resource.getrlimit(resource.RLIMIT_NOFILE)
    lowest = os.dup(0)
    os.close(lowest)
    resource.setrlimit(resource.RLIMIT_NOFILE, (lowest, hard))
    try:
        yield
    finally:
        resource.setrlimit(resource.RLIMIT_NOFILE, (soft, hard))


async def test_the_agent_accepts_again_after_an_accept_failed_for_want_of_fds(
    tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    server = ZdsServer(tmp_path / "ztunnel.sock")
    await server.start()
    early = socket.socket(socket.AF_UNIX, socket.SOCK_SEQPACKET | socket.SOCK_CLOEXEC)
    client: ZdsClient | None = None
    try:
        with caplog.at_level(logging.WARNING, logger="ambit.zds.server"), out_of_fds():
            early.connect(str(server.socket_path))  # queued: the agent's accept needs an fd it cannot have
            await wait_until(lambda: "ZDS accept" in caplog.text)
        pods = Pods()
        client = ZdsClient(server.socket_path, pods, backoff_max=0.05)
        await client.start()
        await wait_until(lambda: client is not None and client.ready)
        await server.add("uid-web", NETNS, WEB)  # the newest proxy, accepted after the failure, takes the pod
        assert pods.opened == ["uid-web"]
    finally:
        early.close()
        if client is not None:
            await client.aclose()
        await server.aclose()


async def test_the_node_proxy_connects_once_it_can_make_a_socket_again(tmp_path: Path) -> None:
    server = ZdsServer(tmp_path / "ztunnel.sock")
    await server.start()
    pods = Pods()
    tries: list[float] = []

    async def sleep(seconds: float) -> None:
        tries.append(seconds)
        await asyncio.sleep(0.001)

    client = ZdsClient(server.socket_path, pods, sleep=sleep, backoff_max=0.05)
    try:
        with out_of_fds():
            await client.start()
            await wait_until(lambda: len(tries) >= 3)  # socket() failed: the back-off, then again
        await wait_until(lambda: client.ready)
        await server.add("uid-web", NETNS, WEB)
        assert pods.opened == ["uid-web"]
    finally:
        await client.aclose()
        await server.aclose()


async def test_a_defect_in_one_connections_reader_drops_it_and_the_node_proxy_connects_again(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    server = ZdsServer(tmp_path / "ztunnel.sock")
    await server.start()
    pods = Pods()
    client = ZdsClient(server.socket_path, pods, backoff_max=0.05)
    await client.start()
    try:
        await wait_until(lambda: client.ready)
        session = server._hub.find_session(1)
        assert session is not None

        def broken(datagram: object, now: float) -> list[object]:
            raise KeyError("a defect")

        monkeypatch.setattr(session, "datagram_received", broken)
        with pytest.raises(ZdsLinkError, match="went away"):  # at once, not after the add's timeout
            await asyncio.wait_for(server.add("uid-a", NETNS, WEB), 2)
        await wait_until(lambda: client.connects == 2 and client.ready)
        await server.add("uid-b", NETNS, WEB)
        assert "uid-b" in pods.opened
    finally:
        await client.aclose()
        await server.aclose()
