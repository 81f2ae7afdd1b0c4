"""Loopback plumbing for the relay and hand-off tests: socket pairs, exact reads, resets, and an HBONE pair
(:class:`HbonePair`: a mutual-TLS server handing each accepted tunnel to the test, and its client)."""

from __future__ import annotations

import asyncio
import contextlib
import socket
import struct
from collections.abc import AsyncIterator, Awaitable, Callable
from pathlib import Path

import pytest

from ambit.hbone.settings import HboneSettings
from ambit.identity.localca import LocalCa
from ambit.model.identity import SpiffeId
from ambit.proxy.hbone_client import HboneClient
from ambit.proxy.hbone_server import HboneServer, InboundRequest, TunnelResponder
from ambit.proxy.hbone_stream import HboneStream
from ambit.proxy.sockets import HostSocketFactory, connect
from ambit.tls.socket_transport import TlsTransportKind
from ambit.tls.workload import WorkloadCertificate

TD = "cluster.local"
CLIENT = SpiffeId(TD, "client-ns", "client-sa")
SERVER = SpiffeId(TD, "server-ns", "server-sa")
FACTORY = HostSocketFactory(mark=None)


def listener(backlog: int = 128) -> socket.socket:
    sock = socket.socket()
    sock.setblocking(False)
    sock.bind(("127.0.0.1", 0))
    sock.listen(backlog)
    return sock


async def connected_pair() -> tuple[socket.socket, socket.socket]:
    """A loopback TCP connection: (the dialling end, the accepted end), both non-blocking."""
    loop = asyncio.get_running_loop()
    with listener() as front:
        client = socket.socket()
        client.setblocking(False)
        await loop.sock_connect(client, front.getsockname())
        accepted, _ = await loop.sock_accept(front)
    accepted.setblocking(False)
    return client, accepted


def rst_close(sock: socket.socket) -> None:
    sock.setsockopt(socket.SOL_SOCKET, socket.SO_LINGER, struct.pack("ii", 1, 0))
    sock.close()


async def recv_exactly(sock: socket.socket, n: int) -> bytes:
    loop = asyncio.get_running_loop()
    buf = b""
    async with asyncio.timeout(5):
        while len(buf) < n:
            chunk = await loop.sock_recv(sock, n - len(buf))
            assert chunk, "unexpected EOF"
            buf += chunk
    return buf


async def recv_all(sock: socket.socket) -> bytes:
    """Everything until EOF."""
    loop = asyncio.get_running_loop()
    parts = []
    async with asyncio.timeout(5):
        while chunk := await loop.sock_recv(sock, 256 * 1024):
            parts.append(chunk)
    return b"".join(parts)


async def expect_reset(sock: socket.socket) -> None:
    loop = asyncio.get_running_loop()
    async with asyncio.timeout(5):
        with pytest.raises(ConnectionResetError):
            while True:
                await loop.sock_recv(sock, 65536)


async def until(condition: Callable[[], bool]) -> None:
    """Poll (the conditions are loop callbacks' state, with no event to wait on) for up to 5 s."""
    async with asyncio.timeout(5):
        while not condition():  # noqa: ASYNC110
            await asyncio.sleep(0.005)


async def settle() -> None:
    """Let the loop run a few rounds (for a second, wrong on_done call to show up)."""
    for _ in range(5):
        await asyncio.sleep(0.01)


class HbonePair:
    """An HBONE server on loopback (mutual TLS) whose handler hands each accepted tunnel to the test, and a client.

    ``server_settings`` are the server's HTTP/2 settings: a tiny stream window there makes the client's writes
    queue behind flow control while the test does not read the server end.
    """

    def __init__(self, client_cert: WorkloadCertificate, server_cert: WorkloadCertificate) -> None:
        self.client_cert, self.server_cert = client_cert, server_cert
        self.server_settings: HboneSettings | None = None
        self.tls_transport: TlsTransportKind = "socket"
        """Both ends' HBONE TLS transport (the record and DATA paths are the process's: ``ambit.native``)."""
        self.handler: Callable[[InboundRequest, TunnelResponder], Awaitable[object]] | None = None
        """When set, the server's handler instead of handing each tunnel to the test (``accepted``)."""
        self.accepted: asyncio.Queue[HboneStream] = asyncio.Queue()
        self.serving: set[asyncio.Task[None]] = set()
        self.clients: list[HboneClient] = []

    async def start(self) -> None:
        self._listener = listener()
        self._accepting = asyncio.create_task(self._accept())

    async def _accept(self) -> None:
        loop = asyncio.get_running_loop()
        while True:
            sock, _ = await loop.sock_accept(self._listener)
            task = asyncio.create_task(
                HboneServer.serve(
                    sock,
                    self._cert,
                    trust_domain=TD,
                    handler=self._handle,
                    settings=self.server_settings,
                    tls_transport=self.tls_transport,
                )
            )
            self.serving.add(task)
            task.add_done_callback(self.serving.discard)

    async def _cert(self) -> WorkloadCertificate:
        return self.server_cert

    async def _handle(self, request: InboundRequest, responder: TunnelResponder) -> object:
        if self.handler is not None:
            return await self.handler(request, responder)
        stream = responder.accept()
        self.accepted.put_nowait(stream)
        return stream  # the test owns it now: the server must leave it alone

    async def open_near(self) -> HboneStream:
        """A tunnel on a new client connection; its client end."""
        sock = await connect(FACTORY, self._listener.getsockname())
        client = await HboneClient.connect(
            sock, self.client_cert, frozenset({SERVER}), trust_domain=TD, tls_transport=self.tls_transport
        )
        self.clients.append(client)
        return await client.open_tunnel("127.0.0.1:80", [])

    async def open(self) -> tuple[HboneStream, HboneStream]:
        """A tunnel: (the client end, the server end); only without a ``handler``."""
        near = await self.open_near()
        async with asyncio.timeout(5):
            far = await self.accepted.get()
        return near, far

    async def aclose(self) -> None:
        for client in self.clients:
            await client.aclose()
        self._accepting.cancel()
        await asyncio.gather(self._accepting, return_exceptions=True)
        self._listener.close()
        for task in list(self.serving):
            task.cancel()
        await asyncio.gather(*self.serving, return_exceptions=True)


@contextlib.asynccontextmanager
async def hbone_pair(tmp_path: Path) -> AsyncIterator[HbonePair]:
    ca = LocalCa(tmp_path / "ca", trust_domain=TD)
    client_cert, server_cert = await asyncio.gather(ca.fetch_certificate(CLIENT), ca.fetch_certificate(SERVER))
    pair = HbonePair(client_cert, server_cert)
    await pair.start()
    try:
        yield pair
    finally:
        await pair.aclose()


async def read_all(stream: HboneStream) -> bytes:
    parts = []
    async with asyncio.timeout(10):
        while chunk := await stream.read():
            parts.append(chunk)
    return b"".join(parts)
