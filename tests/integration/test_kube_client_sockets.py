"""The API client closes every socket it opened, however a request is interrupted (ambit.k8s.sockets).

The peer is a TCP listener that accepts and never answers, so a request is caught inside its TLS handshake for as
long as the test likes; the listener sees the client's socket close as end-of-file. (This directory also ends each
test with a full garbage collection that turns an unclosed transport into an error.)
"""

from __future__ import annotations

import asyncio
import ssl
from collections.abc import AsyncIterator

import pytest

from ambit.k8s import KubeClient, kinds
from ambit.k8s.connection import Connection
from ambit.k8s.errors import KubeClientError
from ambit.k8s.sockets import TrackedSockets


class SilentPeer:
    """Accepts connections and never writes; ``closed`` counts the connections the client closed."""

    def __init__(self) -> None:
        self.accepted = asyncio.Queue[None]()
        self.closed = asyncio.Queue[None]()
        self.server: asyncio.Server | None = None

    async def handle(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        self.accepted.put_nowait(None)
        try:
            while await reader.read(4096):
                pass
            self.closed.put_nowait(None)
        finally:
            writer.close()

    @property
    def url(self) -> str:
        assert self.server is not None
        port = self.server.sockets[0].getsockname()[1]
        return f"https://127.0.0.1:{port}"


@pytest.fixture
async def peer() -> AsyncIterator[SilentPeer]:
    silent = SilentPeer()
    silent.server = await asyncio.start_server(silent.handle, "127.0.0.1", 0)
    try:
        yield silent
    finally:
        silent.server.close()
        await silent.server.wait_closed()


def client_for(peer: SilentPeer) -> KubeClient:
    return KubeClient(Connection(server=peer.url, verify=ssl.create_default_context(), auth=None))


def sockets_of(kube: KubeClient) -> TrackedSockets:
    sockets = kube._sockets
    assert sockets is not None, "the default transport tracks its sockets"
    return sockets


async def test_a_request_cancelled_during_the_tls_handshake_closes_its_socket(peer: SilentPeer) -> None:
    async with client_for(peer) as kube:
        for _ in range(3):
            request = asyncio.create_task(kube.list(kinds.PODS, "default"))
            await asyncio.wait_for(peer.accepted.get(), 10)
            request.cancel()
            with pytest.raises(asyncio.CancelledError):
                await request
            await asyncio.wait_for(peer.closed.get(), 10)
            assert sockets_of(kube).open_count == 0


async def test_closing_the_client_closes_a_connection_still_being_made(peer: SilentPeer) -> None:
    kube = client_for(peer)
    requests = [asyncio.create_task(kube.list(kinds.PODS, "default")) for _ in range(4)]
    for _ in requests:
        await asyncio.wait_for(peer.accepted.get(), 10)
    await kube.aclose()
    for _ in requests:
        await asyncio.wait_for(peer.closed.get(), 10)
    for request in requests:
        with pytest.raises(KubeClientError):
            await request
    assert sockets_of(kube).open_count == 0


async def test_a_closed_client_opens_no_socket(peer: SilentPeer) -> None:
    kube = client_for(peer)
    await kube.aclose()
    with pytest.raises(KubeClientError):
        await kube.list(kinds.PODS, "default")
    assert peer.accepted.empty()


async def test_a_watch_on_a_closed_client_is_a_client_error(peer: SilentPeer) -> None:
    kube = client_for(peer)
    await kube.aclose()
    with pytest.raises(KubeClientError):
        async for _ in kube.watch(kinds.PODS, "default"):
            pass
    assert peer.accepted.empty()
