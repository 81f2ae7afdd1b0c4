"""A two-ended HBONE mesh on loopback for the tunnel tests: :class:`Mesh` runs an HBONE server in front of echo and
refusing upstreams and a client pool, with the certificates of one local CA."""

from __future__ import annotations

import asyncio
import socket
from collections.abc import Awaitable, Callable

from bench.relaying import relay

from ambit.hbone.headers import parse_authority
from ambit.hbone.settings import HboneSettings
from ambit.identity.localca import LocalCa
from ambit.model.identity import SpiffeId
from ambit.proxy.drain import DrainSignal
from ambit.proxy.hbone_client import HboneClient
from ambit.proxy.hbone_server import HboneServer, InboundRequest, TunnelResponder
from ambit.proxy.hbone_stream import HboneStream
from ambit.proxy.pool import ConnectionPool, PoolKey
from ambit.proxy.revocation import RevocationManager
from ambit.proxy.sockets import HostSocketFactory, connect
from ambit.proxy.streams import SocketStream
from ambit.tls.socket_transport import TlsTransportKind
from ambit.tls.workload import WorkloadCertificate

TD = "cluster.local"
CLIENT = SpiffeId(TD, "client-ns", "client-sa")
SERVER = SpiffeId(TD, "server-ns", "server-sa")
REJECT_PORTS = {1400: 400, 1401: 401, 1503: 503}
CRASH_PORT, SILENT_PORT = 1599, 1600
FACTORY = HostSocketFactory(mark=None)
SMALL_BUFFER = 64 * 1024


class Clock:
    def __init__(self) -> None:
        self.now = 1000.0

    def __call__(self) -> float:
        return self.now


class Mesh:
    """One HBONE listener on loopback with an upstream TCP server behind it, and a client pool in front."""

    def __init__(self, ca: LocalCa, client_cert: WorkloadCertificate, server_cert: WorkloadCertificate) -> None:
        self.ca = ca
        self.client_cert = client_cert
        self.server_cert = server_cert
        self.clock = Clock()
        self.pool = ConnectionPool(clock=self.clock)
        self.failures: list[str] = []
        self.connections_served = 0
        self.serving: set[asyncio.Task[None]] = set()
        self.settings: HboneSettings | None = None
        self.upstream: Callable[[asyncio.StreamReader, asyncio.StreamWriter], Awaitable[None]] = echo
        self.upstream_addr = ("127.0.0.1", 0)
        self.listener_addr = ("127.0.0.1", 0)
        self.server_revocation: RevocationManager | None = None
        self.client_revocation: RevocationManager | None = None
        self.drain = DrainSignal()
        """Raised by a test: the server's connections say GOAWAY, as a draining node proxy's do."""
        self.next_drains: list[DrainSignal] = []
        """The drain signals of the next connections accepted, in order (then :attr:`drain`'s)."""
        self.tls_transport: TlsTransportKind = "socket"
        """The TLS transport of both ends (a test parametrizes it: the same behaviour holds on each)."""
        self.find_server_cert: Callable[[], WorkloadCertificate | None] | None = None
        """The server's ``find_cert`` (the certificate at hand), or None to await its fetch always."""
        self.pass_addresses = False
        """Give the server the accepted socket's addresses, as the node proxy's inbound side does."""
        self.cert_fetches = 0
        """How many times the server awaited its certificate."""
        self.requests: list[InboundRequest] = []

    async def start(self) -> None:
        async def upstream(reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
            try:
                await self.upstream(reader, writer)
            finally:
                writer.close()

        self._upstream_server = await asyncio.start_server(upstream, "127.0.0.1", 0)
        self.upstream_addr = self._upstream_server.sockets[0].getsockname()[:2]
        self._listener = socket.socket(socket.AF_INET, socket.SOCK_STREAM)
        self._listener.bind(("127.0.0.1", 0))
        self._listener.listen(256)
        self._listener.setblocking(False)
        self.listener_addr = self._listener.getsockname()[:2]
        self._accepting = asyncio.create_task(self._accept())

    async def _accept(self) -> None:
        loop = asyncio.get_running_loop()
        while True:
            sock, _ = await loop.sock_accept(self._listener)
            self.connections_served += 1
            addresses = (sock.getpeername(), sock.getsockname()) if self.pass_addresses else None
            task = asyncio.create_task(
                HboneServer.serve(
                    sock,
                    self._server_cert,
                    trust_domain=TD,
                    handler=self._handle,
                    settings=self.settings,
                    on_failure=self.failures.append,
                    revocation=self.server_revocation,
                    drain=self.next_drains.pop(0) if self.next_drains else self.drain,
                    tls_transport=self.tls_transport,
                    find_cert=self.find_server_cert,
                    addresses=addresses,
                )
            )
            self.serving.add(task)
            task.add_done_callback(self.serving.discard)

    async def _server_cert(self) -> WorkloadCertificate:
        self.cert_fetches += 1
        return self.server_cert

    async def _handle(self, request: InboundRequest, responder: TunnelResponder) -> None:
        assert request.peer_identity == self.client_cert.identity
        self.requests.append(request)
        _, port = parse_authority(request.authority)
        if port in REJECT_PORTS:
            responder.reject(REJECT_PORTS[port])
            return
        if port == CRASH_PORT:
            raise RuntimeError("handler bug")
        if port == SILENT_PORT:
            return
        sock = await connect(FACTORY, self.upstream_addr)
        sock.setsockopt(socket.SOL_SOCKET, socket.SO_RCVBUF, SMALL_BUFFER)
        sock.setsockopt(socket.SOL_SOCKET, socket.SO_SNDBUF, SMALL_BUFFER)
        upstream = SocketStream(sock)
        try:
            await relay(responder.accept(), upstream)
        finally:
            await upstream.aclose()

    async def dial(self, expected: frozenset[SpiffeId] = frozenset({SERVER})) -> HboneClient:
        sock = await connect(FACTORY, self.listener_addr)
        return await HboneClient.connect(
            sock,
            self.client_cert,
            expected,
            trust_domain=TD,
            settings=self.settings,
            clock=self.clock,
            revocation=self.client_revocation,
            tls_transport=self.tls_transport,
        )

    @property
    def key(self) -> PoolKey:
        return PoolKey(self.client_cert.identity, frozenset({SERVER}), "127.0.0.1", self.listener_addr)

    async def open(self, port: int | None = None) -> HboneStream:
        authority = f"127.0.0.1:{port or self.upstream_addr[1]}"
        return await self.pool.open_tunnel(self.key, authority, [("forwarded", 'for="127.0.0.1:1"')], self.dial)

    async def aclose(self) -> None:
        await self.pool.aclose()
        self._accepting.cancel()
        await asyncio.gather(self._accepting, return_exceptions=True)
        self._listener.close()
        for task in list(self.serving):
            task.cancel()
        await asyncio.gather(*self.serving, return_exceptions=True)
        self._upstream_server.close()
        await self._upstream_server.wait_closed()


async def echo(reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
    while data := await reader.read(65536):
        writer.write(data)
        await writer.drain()
    writer.write_eof()
    await writer.drain()


async def read_all(stream: HboneStream) -> bytes:
    parts = []
    while chunk := await stream.read():
        parts.append(chunk)
    return b"".join(parts)


async def echo_once(mesh: Mesh, payload: bytes) -> bytes:
    stream = await mesh.open()
    try:
        await stream.write(payload)
        stream.write_eof()
        return await read_all(stream)
    finally:
        await stream.aclose()


async def until(condition: Callable[[], bool]) -> None:
    """Poll (the conditions are other tasks' state, with no event to wait on) for up to 10 s."""
    async with asyncio.timeout(10.0):
        while not condition():  # noqa: ASYNC110
            await asyncio.sleep(0.01)
