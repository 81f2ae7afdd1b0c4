"""Peers for the tests of TLS on the socket itself (``test_tls_socket_transport.py``, ``test_tls_native_records.py``):
a protocol that records what arrives, a loopback TCP pair, a client handshake driven by hand over memory BIOs (so a
test can stop it anywhere or send what no TLS stack would), either end of a connection on either transport, both
ends on the socket transport; and their fixtures (``certs``, ``no_peer_traceback``: the suite's conftest imports
them).
"""

from __future__ import annotations

import _ssl
import asyncio
import ctypes
import hashlib
import logging
import socket
import ssl
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path

import pytest
from tests.conftest import use_records_path

from ambit import native
from ambit.identity.localca import LocalCa
from ambit.model.identity import SpiffeId
from ambit.tls import contexts
from ambit.tls.socket_handshake import open_tls
from ambit.tls.socket_transport import READ_AHEAD_BUFFER, TlsSocketTransport, TlsTransportKind
from ambit.tls.workload import WorkloadCertificate

TD = "cluster.local"
CLIENT = SpiffeId(TD, "client-ns", "client-sa")
SERVER = SpiffeId(TD, "server-ns", "server-sa")


@dataclass
class Certs:
    client: WorkloadCertificate
    server: WorkloadCertificate


async def make_certs(directory: Path) -> Certs:
    ca = LocalCa(directory / "ca", trust_domain=TD)
    client, server = await asyncio.gather(ca.fetch_certificate(CLIENT), ca.fetch_certificate(SERVER))
    return Certs(client, server)


@pytest.fixture
async def certs(tmp_path: Path) -> Certs:
    return await make_certs(tmp_path)


@pytest.fixture
def tls_records() -> Iterator[object]:
    """The native TLS records' extension module (skipped where it is not built, failed under CI)."""
    use_records_path("native")
    selected = native.selection().tls_records
    assert selected is not None
    yield selected
    native.use(None)


@pytest.fixture
def no_peer_traceback(caplog: pytest.LogCaptureFixture) -> Iterator[None]:
    """A peer's failure is logged without a traceback."""
    caplog.set_level(logging.DEBUG, logger="ambit")
    yield
    tracebacks = [r.getMessage() for r in caplog.records if r.exc_info]
    assert tracebacks == [], "a peer's failure was logged with a traceback"


class Sink(asyncio.Protocol):
    """Keeps what arrives; pauses its own reading when told to; says how the connection ended."""

    def __init__(self, *, read: bool = True) -> None:
        self.received = bytearray()
        self.count = 0
        self._arrived = asyncio.Event()
        self.digest = hashlib.sha256()
        self.eof = False
        self.paused_writing = 0
        self.resumed_writing = 0
        self.writable = asyncio.Event()
        self.writable.set()
        self.lost: asyncio.Future[Exception | None] = asyncio.get_running_loop().create_future()
        self._read = read
        self.transport: asyncio.Transport | None = None

    def connection_made(self, transport: asyncio.BaseTransport) -> None:
        assert isinstance(transport, asyncio.Transport)
        self.transport = transport
        if not self._read:
            transport.pause_reading()

    def data_received(self, data: bytes) -> None:
        self.digest.update(data)
        self.received += data[:64]  # the digest counts; the head is enough to look at
        self.count += len(data)
        self._arrived.set()

    async def reached(self, count: int) -> None:
        """Until ``count`` bytes have arrived."""
        while self.count < count:
            self._arrived.clear()
            await self._arrived.wait()

    def eof_received(self) -> bool:
        self.eof = True
        return False

    def pause_writing(self) -> None:
        self.paused_writing += 1
        self.writable.clear()

    def resume_writing(self) -> None:
        self.resumed_writing += 1
        self.writable.set()

    def connection_lost(self, exc: Exception | None) -> None:
        if not self.lost.done():
            self.lost.set_result(exc)


async def tcp_pair() -> tuple[socket.socket, socket.socket]:
    loop = asyncio.get_running_loop()
    with socket.create_server(("127.0.0.1", 0)) as listener:
        listener.setblocking(False)
        client = socket.socket()
        client.setblocking(False)
        accepting = loop.create_task(loop.sock_accept(listener))
        await loop.sock_connect(client, listener.getsockname())
        server, _ = await accepting
    return client, server


async def tls_end(
    kind: TlsTransportKind, sock: socket.socket, context: ssl.SSLContext, protocol: Sink, *, server_side: bool
) -> asyncio.Transport:
    if kind == "socket":
        transport, _ = await open_tls(lambda: protocol, sock, context, server_side=server_side, handshake_timeout=5)
        return transport
    loop = asyncio.get_running_loop()
    if server_side:
        loop_transport, _ = await loop.connect_accepted_socket(lambda: protocol, sock, ssl=context)
    else:
        loop_transport, _ = await loop.create_connection(lambda: protocol, sock=sock, ssl=context, server_hostname="")
    return loop_transport


async def hand_handshake(sock: socket.socket, context: ssl.SSLContext) -> tuple[ssl.SSLObject, ssl.MemoryBIO]:
    """The client handshake driven by hand over memory BIOs; the object and its outgoing BIO."""
    tls, _, outgoing = await hand_handshake_bios(sock, context)
    return tls, outgoing


async def hand_handshake_bios(
    sock: socket.socket, context: ssl.SSLContext
) -> tuple[ssl.SSLObject, ssl.MemoryBIO, ssl.MemoryBIO]:
    """:func:`hand_handshake`, with the incoming BIO too (for a peer that reads what the server sends)."""
    loop = asyncio.get_running_loop()
    incoming, outgoing = ssl.MemoryBIO(), ssl.MemoryBIO()
    tls = context.wrap_bio(incoming, outgoing)
    while True:
        try:
            tls.do_handshake()
            break
        except ssl.SSLWantReadError:
            if out := outgoing.read():
                await loop.sock_sendall(sock, out)
            data = await loop.sock_recv(sock, 65536)
            if not data:
                raise ConnectionError("the server closed the handshake") from None
            incoming.write(data)
    if out := outgoing.read():
        await loop.sock_sendall(sock, out)
    return tls, incoming, outgoing


async def served(
    certs: Certs, server: socket.socket, protocol: Sink, *, read_ahead: int = READ_AHEAD_BUFFER
) -> TlsSocketTransport:
    """The server end on the socket transport; by default with the context HBONE makes for it (reading ahead for
    all its connections), with ``read_ahead=0`` with one made for the loop's (read-ahead turned on per connection)."""
    context = certs.server.server_context(read_ahead=read_ahead)
    transport, _ = await open_tls(lambda: protocol, server, context, server_side=True, handshake_timeout=5)
    return transport


async def socket_pair(certs: Certs, client: Sink, server: Sink) -> tuple[TlsSocketTransport, TlsSocketTransport]:
    """A loopback connection with both ends on the socket transport: the client's and the server's transports."""
    client_sock, server_sock = await tcp_pair()
    opening = asyncio.get_running_loop().create_task(
        open_tls(
            lambda: client,
            client_sock,
            certs.client.client_context(read_ahead=READ_AHEAD_BUFFER),
            server_side=False,
            handshake_timeout=5,
        )
    )
    server_transport = await served(certs, server_sock, server)
    client_transport, _ = await opening
    return client_transport, server_transport


_KEY_UPDATE_REQUESTED = 1


def _libssl_key_update() -> ctypes._CFuncPtr:  # type: ignore[name-defined]
    function = ctypes.CDLL(_ssl.__file__).SSL_key_update
    function.argtypes, function.restype = [ctypes.c_void_p, ctypes.c_int], ctypes.c_int
    return function


def request_key_update(tls: ssl.SSLObject) -> None:
    """Have ``tls`` send a KeyUpdate that asks the other end for one too, with its next record."""
    found = contexts._ctx_handle(tls.context)
    handle = contexts._ssl_handle(tls, found[1]) if found is not None else None  # type: ignore[arg-type]
    assert handle is not None, "the SSL * of the peer cannot be reached"
    assert _libssl_key_update()(handle, _KEY_UPDATE_REQUESTED) == 1
