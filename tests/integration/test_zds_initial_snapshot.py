"""The agent's initial snapshot: pods added before the ZDS server serves are all in a node proxy's first snapshot.

This is what makes a restart of the node agent invisible to the node proxy (spec §3.2; istio-cni does the same):
the agent finds the running pods again *before* it accepts a node proxy, so the proxy's reconciliation on
SnapshotSent keeps every pod's listeners instead of dropping them on a partial snapshot. The "pod" netns is this
process's own (``/proc/self/ns/net``), so no root is needed.
"""

from __future__ import annotations

import asyncio
import os
from pathlib import Path

import pytest

from ambit.zds.client import ZdsClient
from ambit.zds.protocol import WorkloadInfo
from ambit.zds.server import ZdsLinkError, ZdsServer

pytestmark = pytest.mark.timeout(30)

NETNS = "/proc/self/ns/net"
WEB = {"name": "web-0", "namespace": "apps", "service_account": "web"}


class RecordingPods:
    def __init__(self) -> None:
        self.opened: list[str] = []
        self.stopped: list[str] = []

    async def open_listeners(self, uid: str, info: WorkloadInfo, netns_fd: int) -> None:
        assert os.fstat(netns_fd).st_ino == os.stat(NETNS).st_ino
        self.opened.append(uid)

    async def stop(self, uid: str) -> None:
        self.stopped.append(uid)


async def test_pods_added_before_the_server_serves_are_in_the_first_snapshot(tmp_path: Path) -> None:
    server = ZdsServer(tmp_path / "ztunnel.sock")
    try:
        await server.add("uid-a", NETNS, WEB)  # returns at once: nobody can be connected yet
        await server.add("uid-b", NETNS, {**WEB, "name": "web-1"})
        await server.delete("uid-b")
        await server.start()
        pods = RecordingPods()
        client = ZdsClient(server.socket_path, pods)
        await client.start()
        try:
            for _ in range(500):
                if client.ready:
                    break
                await asyncio.sleep(0.01)
            assert pods.opened == ["uid-a"] and pods.stopped == []
            await server.add("uid-c", NETNS, WEB)  # once serving, an add waits for the proxy's ack
            assert pods.opened == ["uid-a", "uid-c"]
        finally:
            await client.aclose()
    finally:
        await server.aclose()


async def test_once_serving_an_add_without_a_node_proxy_fails(tmp_path: Path) -> None:
    server = ZdsServer(tmp_path / "ztunnel.sock")
    await server.start()
    try:
        with pytest.raises(ZdsLinkError, match="no node proxy is connected"):
            await server.add("uid-a", NETNS, WEB)
        assert "uid-a" in server.pods, "kept for the snapshot of the next node proxy"
    finally:
        await server.aclose()
