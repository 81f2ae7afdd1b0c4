"""A byte stream that is the protocol of the socket TLS transport (:mod:`ambit.proxy.transport_stream`), on each
record path (Python, C), against a real TLS peer on loopback: its rules 1-5.

Who can reach it: any client of an ingress gateway's HTTPS or TLS_TERMINATE listener. What it must not cost: memory
beyond its bounds for a client that sends without reading answers, or that stops reading; a traceback for a peer
that resets.
"""

from __future__ import annotations

import asyncio
import hashlib
import socket
import struct

import pytest
from tests.security.tls_peers import Certs, Sink, tcp_pair
from tests.supervision import until_true

from ambit.proxy.errors import StreamClosedError
from ambit.proxy.transport_stream import TransportStream
from ambit.tls.socket_handshake import open_tls
from ambit.tls.socket_transport import TlsSocketTransport

pytestmark = [pytest.mark.timeout(30), pytest.mark.usefixtures("records_path", "no_peer_traceback")]

MIB = 1024 * 1024


async def stream_pair(
    certs: Certs, peer: Sink, *, small_buffers: bool = False
) -> tuple[TransportStream, TlsSocketTransport]:
    """A served :class:`TransportStream` and the client's transport (delivering to ``peer``)."""
    client, server = await tcp_pair()
    if small_buffers:  # the transport's own limit is what is measured, not the kernel's
        for sock in (client, server):
            sock.setsockopt(socket.SOL_SOCKET, socket.SO_SNDBUF, 64 * 1024)
            sock.setsockopt(socket.SOL_SOCKET, socket.SO_RCVBUF, 64 * 1024)
    stream = TransportStream(max_buffer=64 * 1024)
    opening = asyncio.get_running_loop().create_task(
        open_tls(lambda: peer, client, certs.client.client_context(), server_side=False, handshake_timeout=5)
    )
    await open_tls(lambda: stream, server, certs.server.server_context(), server_side=True, handshake_timeout=5)
    transport, _ = await opening
    return stream, transport


async def test_a_write_to_a_peer_that_stops_reading_waits_and_holds_no_more_than_the_limit(certs: Certs) -> None:
    peer = Sink(read=False)
    stream, client = await stream_pair(certs, peer, small_buffers=True)
    stream.transport.set_write_buffer_limits(high=256 * 1024)
    piece = b"w" * MIB
    written = 0
    largest = 0
    with pytest.raises(TimeoutError):
        async with asyncio.timeout(1.5):
            while written < 64 * MIB:
                written += len(piece)  # the transport has it from the call on; the call returns when it may take more
                await stream.write(piece)
                largest = max(largest, stream.transport.get_write_buffer_size())
    largest = max(largest, stream.transport.get_write_buffer_size())
    assert written <= 4 * MIB, "the writer was never held back"
    assert largest <= 256 * 1024 + MIB + MIB // 16384 * 22  # the limit and the write that crossed it
    client.resume_reading()
    await stream.write(b"")  # the stream still works after the timeout cancelled a waiting write
    async with asyncio.timeout(10):
        await peer.reached(written)
    assert peer.digest.digest() == hashlib.sha256(piece * (written // MIB)).digest()
    stream.abort()
    client.abort()


async def test_unread_bytes_over_the_bound_pause_the_transport_until_the_next_read(certs: Certs) -> None:
    peer = Sink()
    stream, client = await stream_pair(certs, peer)
    client.write(b"r" * (256 * 1024))
    await until_true(lambda: not stream.transport.is_reading(), "the transport paused", 5)
    got = await stream.read()
    assert 64 * 1024 <= len(got) <= 64 * 1024 + 256 * 1024
    assert stream.transport.is_reading()
    total = len(got)
    async with asyncio.timeout(5):
        while total < 256 * 1024:
            total += len(await stream.read())
    assert total == 256 * 1024
    stream.abort()
    client.abort()


async def test_the_peer_s_close_notify_reads_as_eof_after_what_came_before_it(certs: Certs) -> None:
    peer = Sink()
    stream, client = await stream_pair(certs, peer)
    client.write(b"last words")
    client.close()  # close_notify after them
    async with asyncio.timeout(5):
        got = b""
        while chunk := await stream.read():
            got += chunk
        assert got == b"last words"
        assert await stream.read() == b""
        await stream.aclose()
        await peer.lost


async def test_write_eof_closes_with_close_notify_only_when_asked(certs: Certs) -> None:
    peer = Sink()
    stream, client = await stream_pair(certs, peer)
    stream.write_eof()  # a relay: nothing is sent, the connection stays open
    await stream.write(b"still open")
    async with asyncio.timeout(5):
        await peer.reached(len(b"still open"))
    assert not peer.eof
    stream.close_on_eof = True
    stream.write_eof()
    await until_true(lambda: peer.eof, "close_notify at the peer", 5)
    client.close()
    async with asyncio.timeout(5):
        await stream.aclose()


async def test_abort_wakes_a_waiting_read_and_later_writes_fail(certs: Certs) -> None:
    peer = Sink()
    stream, client = await stream_pair(certs, peer)
    reading = asyncio.get_running_loop().create_task(stream.read())
    await asyncio.sleep(0.05)
    stream.abort()
    with pytest.raises(StreamClosedError):
        await asyncio.wait_for(reading, 5)
    with pytest.raises(StreamClosedError):
        await stream.write(b"x")
    async with asyncio.timeout(5):
        await peer.lost
    client.abort()


async def test_a_peer_reset_fails_a_waiting_read_without_a_traceback(certs: Certs) -> None:
    peer = Sink()
    stream, client = await stream_pair(certs, peer)
    reading = asyncio.get_running_loop().create_task(stream.read())
    await asyncio.sleep(0.05)
    raw = client.get_extra_info("socket")
    raw.setsockopt(socket.SOL_SOCKET, socket.SO_LINGER, struct.pack("ii", 1, 0))
    client.abort()  # a TCP reset
    async with asyncio.timeout(5):
        with pytest.raises(StreamClosedError):
            await reading
        with pytest.raises(StreamClosedError):
            await stream.write(b"x")
