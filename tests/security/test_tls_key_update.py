"""TLS 1.3 KeyUpdate on the socket transport's two record paths (Python, C): a peer's request for new keys is
answered before the server's next record, data flows both ways under the new keys, and a peer that keeps asking
while it never reads is not read from until it reads (the answers it is owed would otherwise pile up in memory,
one per request).

Python's ``ssl`` cannot send a KeyUpdate, so the peer is a client handshaken by hand over memory BIOs whose ``SSL *``
is asked for one through libssl's ``SSL_key_update`` (reached as :mod:`ambit.tls.contexts` reaches it).
"""

from __future__ import annotations

import asyncio
import contextlib
import socket
import ssl
import time
from pathlib import Path

import pytest
import uvloop
from tests.security.tls_peers import (
    Certs,
    Sink,
    hand_handshake_bios,
    make_certs,
    request_key_update,
    served,
    tcp_pair,
)

from ambit.tls.listener import TlsListener
from ambit.tls.socket_transport import TlsSocketTransport

pytestmark = pytest.mark.usefixtures("no_peer_traceback")

_BUFFER = 65536
"""Socket buffers of both ends in the flood: small, so that the answers back up after a few hundred KiB."""


async def _read_records(sock: socket.socket, tls: ssl.SSLObject, incoming: ssl.MemoryBIO, want: int) -> bytes:
    """What ``tls`` decrypts from ``sock`` until ``want`` bytes of application data came (10 s at most)."""
    loop = asyncio.get_running_loop()
    got = bytearray()
    async with asyncio.timeout(10):
        while len(got) < want:
            data = await loop.sock_recv(sock, 65536)
            assert data, "the server closed the connection"
            incoming.write(data)
            while True:
                try:
                    got += tls.read(65536)
                except ssl.SSLWantReadError:
                    break
    return bytes(got)


async def _peer(
    certs: Certs, protocol: Sink, *, small_buffers: bool = False
) -> tuple[socket.socket, ssl.SSLObject, ssl.MemoryBIO, ssl.MemoryBIO, TlsSocketTransport]:
    loop = asyncio.get_running_loop()
    client, server = await tcp_pair()
    if small_buffers:
        client.setsockopt(socket.SOL_SOCKET, socket.SO_RCVBUF, _BUFFER)
        client.setsockopt(socket.SOL_SOCKET, socket.SO_SNDBUF, _BUFFER)
        server.setsockopt(socket.SOL_SOCKET, socket.SO_RCVBUF, _BUFFER)
        server.setsockopt(socket.SOL_SOCKET, socket.SO_SNDBUF, _BUFFER)
    serving = loop.create_task(served(certs, server, protocol))
    tls, incoming, outgoing = await hand_handshake_bios(client, certs.client.client_context())
    transport = await serving
    return client, tls, incoming, outgoing, transport


async def test_data_flows_both_ways_across_key_updates_the_peer_requests(certs: Certs, records_path: str) -> None:
    loop = asyncio.get_running_loop()
    protocol = Sink()
    client, tls, incoming, outgoing, transport = await _peer(certs, protocol)
    try:
        for round_ in range(5):
            request_key_update(tls)
            tls.write(b"ping %d" % round_)
            await loop.sock_sendall(client, outgoing.read())
            async with asyncio.timeout(5):
                await protocol.reached(len(b"ping 0") * (round_ + 1))  # read under the client's new key
            # OpenSSL writes the server's own KeyUpdate (the answer) with its next read or write, before any record
            # under the new key: the client decrypts the pong only if both arrived in that order.
            transport.write(b"pong %d" % round_)
            assert await _read_records(client, tls, incoming, len(b"pong 0")) == b"pong %d" % round_
        assert bytes(protocol.received) == b"".join(b"ping %d" % i for i in range(5))
        assert not protocol.lost.done()
    finally:
        client.close()
        transport.abort()


async def test_a_peer_that_asks_for_key_updates_and_never_reads_is_not_read_from_until_it_reads(
    certs: Certs, records_path: str
) -> None:
    """Each request is owed an answer; once the socket takes no more of them, the server stops reading (a socket
    BIO's WANT_WRITE on the Python path; the C path must do the same, not hold every answer), and reads on once the
    peer has read: nothing is lost either way."""
    protocol = Sink()
    client, tls, incoming, outgoing, transport = await _peer(certs, protocol, small_buffers=True)
    try:
        await _flood_then_read(client, tls, incoming, outgoing, protocol, transport)
    finally:
        client.close()
        transport.abort()


class _MadeSink(Sink):
    def __init__(self) -> None:
        super().__init__()
        self.made = asyncio.Event()

    def connection_made(self, transport: asyncio.BaseTransport) -> None:
        super().connection_made(transport)
        self.made.set()


@pytest.mark.parametrize("loop_kind", ["asyncio", "uvloop"])
def test_the_tls_listener_stops_reading_a_peer_that_asks_for_key_updates_and_never_reads(
    tmp_path: Path, loop_kind: str
) -> None:
    """The loop's TLS (asyncio's and uvloop's) answers a KeyUpdate request from inside its read and buffers what the
    socket refuses: behind :class:`~ambit.tls.listener.TlsListener` (the API server's, the webhook's) the connection
    is not read from while its writing is paused (its rule 4), and reads on once the peer reads."""

    async def scenario() -> None:
        certs = await make_certs(tmp_path)
        protocol = _MadeSink()
        sock = socket.socket()
        for option in (socket.SO_RCVBUF, socket.SO_SNDBUF):  # an accepted socket's, too
            sock.setsockopt(socket.SOL_SOCKET, option, _BUFFER)
        sock.bind(("127.0.0.1", 0))
        listener = TlsListener(sock, lambda: protocol, certs.server.server_context(), name="key update test")
        listener.start()
        client = socket.socket()
        try:
            client.setsockopt(socket.SOL_SOCKET, socket.SO_RCVBUF, _BUFFER)
            client.setsockopt(socket.SOL_SOCKET, socket.SO_SNDBUF, _BUFFER)
            client.setblocking(False)
            await asyncio.get_running_loop().sock_connect(client, listener.address)
            tls, incoming, outgoing = await hand_handshake_bios(client, certs.client.client_context())
            async with asyncio.timeout(5):
                await protocol.made.wait()  # the server's side of the handshake ends a moment later
            await _flood_then_read(client, tls, incoming, outgoing, protocol)
        finally:
            client.close()
            await listener.aclose(grace=0)

    if loop_kind == "uvloop":
        uvloop.run(scenario())
    else:
        asyncio.run(scenario())


async def _flood_then_read(
    client: socket.socket,
    tls: ssl.SSLObject,
    incoming: ssl.MemoryBIO,
    outgoing: ssl.MemoryBIO,
    protocol: Sink,
    transport: asyncio.Transport | None = None,
) -> None:
    """Ask for key updates (a byte after each) until the server stops reading, check it stopped soon, then read
    everything it sends until it has read every request."""
    transport = transport or protocol.transport
    assert transport is not None
    requests = sent = 0
    pending = b""
    blocked_since: float | None = None
    deadline = time.monotonic() + 20
    while sent < 8 << 20 and time.monotonic() < deadline:
        if not pending:
            for _ in range(100):  # a byte after each: the bytes the server got count the requests it read
                request_key_update(tls)
                tls.write(b"k")
            requests += 100
            pending = outgoing.read()
        try:
            count = client.send(pending)
        except BlockingIOError:
            now = time.monotonic()
            blocked_since = blocked_since or now
            if now - blocked_since > 1:
                break  # the server has stopped reading
            await asyncio.sleep(0.005)
            continue
        blocked_since = None
        sent += count
        pending = pending[count:]
        await asyncio.sleep(0)
    held = transport.get_write_buffer_size()
    # Bounds: what the sockets' buffers hold, and for the loop's TLS its write high-water mark (512 KiB) and read
    # buffer (256 KiB); unbounded, the server reads all 8 MiB and holds half as much in answers.
    assert sent < 4 << 20, f"the server read {sent} bytes of key update requests it could not answer"
    assert held < 1 << 20, f"{held} bytes of answers held"
    assert not protocol.lost.done()
    # The peer reads now: the server answers the rest and reads on, to the last request.
    async with asyncio.timeout(20):
        while protocol.count < requests:
            if pending:
                with contextlib.suppress(BlockingIOError):
                    pending = pending[client.send(pending) :]
            try:
                data = client.recv(1 << 20)
            except BlockingIOError:
                await asyncio.sleep(0.005)
                continue
            assert data, "the server closed the connection"
            incoming.write(data)
            with pytest.raises(ssl.SSLWantReadError):
                tls.read(65536)
            await asyncio.sleep(0)
    assert protocol.count == requests
    assert not protocol.lost.done()
