"""The relay and socket streams on real loopback TCP: exact bytes, half-closes, resets, bulk, backpressure, cancel.

Every test builds the same rig: a *client* connected to the proxy's accept side (the downstream stream), and the
proxy connected with :func:`connect` to a *server* (the upstream stream); the relay runs between the two streams.
Client and server are plain sockets driven with the loop's ``sock_*`` calls.
"""

from __future__ import annotations

import asyncio
import contextlib
import hashlib
import os
import socket
import struct
import time
from collections.abc import AsyncIterator
from dataclasses import dataclass

import pytest
from bench.relaying import RelayResult, relay

from ambit.proxy.errors import ProxyConnectError, StreamClosedError
from ambit.proxy.sockets import PROXY_MARK, HostSocketFactory, connect, original_dst
from ambit.proxy.streams import ByteStream, SocketStream

pytestmark = pytest.mark.timeout(60)

MiB = 1024 * 1024
ROOT = os.geteuid() == 0


def factory() -> HostSocketFactory:
    return HostSocketFactory(mark=PROXY_MARK if ROOT else None)


def listener(backlog: int = 16) -> socket.socket:
    sock = socket.socket()
    sock.setblocking(False)
    sock.bind(("127.0.0.1", 0))
    sock.listen(backlog)
    return sock


class Metered:
    """A ByteStream wrapper that counts what went through it (to measure what the relay holds)."""

    def __init__(self, inner: SocketStream) -> None:
        self.inner = inner
        self.read_total = 0
        self.written_total = 0

    async def read(self) -> bytes:
        data = await self.inner.read()
        self.read_total += len(data)
        return data

    async def write(self, data: bytes | memoryview) -> None:
        await self.inner.write(data)
        self.written_total += len(data)

    def write_eof(self) -> None:
        self.inner.write_eof()

    def abort(self) -> None:
        self.inner.abort()

    async def aclose(self) -> None:
        await self.inner.aclose()


@dataclass
class Rig:
    """Client ⇄ relay ⇄ server; ``pull`` mode wraps the sockets (the relay's task pumps), else push mode."""

    client: socket.socket
    server: socket.socket
    downstream: Metered | SocketStream
    upstream: Metered | SocketStream
    ups: list[int]
    downs: list[int]
    task: asyncio.Task[RelayResult] | None = None

    @property
    def pull(self) -> bool:
        return isinstance(self.downstream, Metered)

    def held(self) -> int:
        """Client bytes the relay has taken in and not yet handed to the kernel for the server."""
        if isinstance(self.downstream, Metered) and isinstance(self.upstream, Metered):
            return self.downstream.read_total - self.upstream.written_total
        assert isinstance(self.upstream, SocketStream)
        return self.upstream.buffered

    def socket_stream(self, which: Metered | SocketStream) -> SocketStream:
        return which.inner if isinstance(which, Metered) else which

    def start(self) -> None:
        streams: tuple[ByteStream, ByteStream] = (self.downstream, self.upstream)
        self.task = asyncio.create_task(
            relay(*streams, on_upstream=self.ups.append, on_downstream=self.downs.append), name="relay test"
        )

    async def result(self) -> RelayResult:
        assert self.task is not None
        async with asyncio.timeout(20):
            return await self.task


@pytest.fixture(params=["pull", "push"])
async def rig(request: pytest.FixtureRequest) -> AsyncIterator[Rig]:
    loop = asyncio.get_running_loop()
    front, back = listener(), listener()
    client = socket.socket()
    client.setblocking(False)
    await loop.sock_connect(client, front.getsockname())
    accepted, _ = await loop.sock_accept(front)
    upstream_sock = await connect(factory(), back.getsockname())
    server, _ = await loop.sock_accept(back)
    server.setblocking(False)
    front.close()
    back.close()
    down, up = SocketStream(accepted), SocketStream(upstream_sock)
    if request.param == "pull":  # a wrapper is not a PushStream: the relay pumps with two tasks
        r = Rig(client, server, Metered(down), Metered(up), [], [])
    else:
        r = Rig(client, server, down, up, [], [])
    r.start()
    try:
        yield r
    finally:
        if r.task is not None and not r.task.done():
            r.task.cancel()
            with contextlib.suppress(asyncio.CancelledError):
                await r.task
        for stream in (r.downstream, r.upstream):
            await stream.aclose()
        client.close()
        server.close()


async def recv_all(sock: socket.socket) -> bytes:
    """Everything until EOF."""
    loop = asyncio.get_running_loop()
    parts = []
    while chunk := await loop.sock_recv(sock, 256 * 1024):
        parts.append(chunk)
    return b"".join(parts)


async def recv_exactly(sock: socket.socket, n: int) -> bytes:
    loop = asyncio.get_running_loop()
    buf = b""
    while len(buf) < n:
        chunk = await loop.sock_recv(sock, n - len(buf))
        assert chunk, "unexpected EOF"
        buf += chunk
    return buf


def rst_close(sock: socket.socket) -> None:
    sock.setsockopt(socket.SOL_SOCKET, socket.SO_LINGER, struct.pack("ii", 1, 0))
    sock.close()


async def expect_reset(sock: socket.socket) -> None:
    loop = asyncio.get_running_loop()
    async with asyncio.timeout(5):
        with pytest.raises(ConnectionResetError):
            while True:
                await loop.sock_recv(sock, 65536)


async def test_bytes_cross_the_relay_exactly_both_ways(rig: Rig) -> None:
    loop = asyncio.get_running_loop()
    await loop.sock_sendall(rig.client, b"ping")
    assert await recv_exactly(rig.server, 4) == b"ping"
    await loop.sock_sendall(rig.server, b"pong!")
    assert await recv_exactly(rig.client, 5) == b"pong!"
    rig.client.shutdown(socket.SHUT_WR)
    assert await recv_all(rig.server) == b""
    rig.server.shutdown(socket.SHUT_WR)
    assert await recv_all(rig.client) == b""
    result = await rig.result()
    assert result == RelayResult(upstream_bytes=4, downstream_bytes=5, error="")
    assert sum(rig.ups) == 4 and sum(rig.downs) == 5


async def test_a_client_that_half_closes_still_gets_the_whole_reply(rig: Rig) -> None:
    loop = asyncio.get_running_loop()
    await loop.sock_sendall(rig.client, b"request")
    rig.client.shutdown(socket.SHUT_WR)
    assert await recv_all(rig.server) == b"request"
    reply = os.urandom(300_000)
    await loop.sock_sendall(rig.server, reply)
    rig.server.shutdown(socket.SHUT_WR)
    assert await recv_all(rig.client) == reply
    result = await rig.result()
    assert (result.upstream_bytes, result.downstream_bytes, result.error) == (7, len(reply), "")


async def test_a_server_that_half_closes_first_still_receives_the_client_bytes(rig: Rig) -> None:
    loop = asyncio.get_running_loop()
    await loop.sock_sendall(rig.server, b"banner")
    rig.server.shutdown(socket.SHUT_WR)
    assert await recv_all(rig.client) == b"banner"
    await loop.sock_sendall(rig.client, b"late data after the server's FIN")
    rig.client.shutdown(socket.SHUT_WR)
    assert await recv_all(rig.server) == b"late data after the server's FIN"
    result = await rig.result()
    assert result.error == ""
    assert result.downstream_bytes == 6


async def test_a_client_reset_reaches_the_server_as_a_reset(rig: Rig) -> None:
    loop = asyncio.get_running_loop()
    await loop.sock_sendall(rig.client, b"x")
    assert await recv_exactly(rig.server, 1) == b"x"
    rst_close(rig.client)
    await expect_reset(rig.server)
    result = await rig.result()
    assert "downstream->upstream read" in result.error
    assert "reset" in result.error


async def test_a_server_reset_reaches_the_client_as_a_reset(rig: Rig) -> None:
    loop = asyncio.get_running_loop()
    await loop.sock_sendall(rig.server, b"y")
    assert await recv_exactly(rig.client, 1) == b"y"
    rst_close(rig.server)
    await expect_reset(rig.client)
    result = await rig.result()
    assert "upstream->downstream read" in result.error


async def test_a_reset_after_a_half_close_still_propagates(rig: Rig) -> None:
    rig.client.shutdown(socket.SHUT_WR)
    assert await recv_all(rig.server) == b""
    rst_close(rig.server)
    await expect_reset(rig.client)
    assert (await rig.result()).error


async def test_a_hundred_mebibytes_each_way_arrive_whole_and_counted(rig: Rig) -> None:
    loop = asyncio.get_running_loop()
    block = os.urandom(MiB)
    total = 100 * MiB

    async def send(sock: socket.socket) -> None:
        for _ in range(total // len(block)):
            await loop.sock_sendall(sock, block)
        sock.shutdown(socket.SHUT_WR)

    async def digest(sock: socket.socket) -> tuple[int, str]:
        h, n = hashlib.sha256(), 0
        while chunk := await loop.sock_recv(sock, 256 * 1024):
            h.update(chunk)
            n += len(chunk)
        return n, h.hexdigest()

    expected = hashlib.sha256(block * 100).hexdigest()
    results = await asyncio.gather(send(rig.client), send(rig.server), digest(rig.server), digest(rig.client))
    assert results[2] == (total, expected)
    assert results[3] == (total, expected)
    result = await rig.result()
    assert result == RelayResult(total, total, "")
    assert sum(rig.ups) == total and sum(rig.downs) == total
    assert rig.socket_stream(rig.downstream).read_size == 256 * 1024  # bulk traffic grew the reads to the cap


async def test_a_slow_reader_stalls_the_sender_and_the_relay_holds_at_most_one_chunk(rig: Rig) -> None:
    sent = 0
    held = 0
    block = b"z" * (64 * 1024)

    async def flood() -> None:
        nonlocal sent
        while sent < 256 * MiB:
            try:
                sent += rig.client.send(block)
            except BlockingIOError:
                await asyncio.sleep(0.005)

    flooder = asyncio.create_task(flood())
    last, stalled_since = -1, time.monotonic()
    async with asyncio.timeout(20):
        while time.monotonic() - stalled_since < 0.3:  # the server reads nothing: the sender must stall
            await asyncio.sleep(0.02)
            held = max(held, rig.held())
            if sent != last:
                last, stalled_since = sent, time.monotonic()
    assert not flooder.done()
    assert sent < 256 * MiB
    assert held <= 256 * 1024
    flooder.cancel()
    with contextlib.suppress(asyncio.CancelledError):
        await flooder
    # Once the server reads, everything the sender managed to send arrives.
    rig.client.shutdown(socket.SHUT_WR)
    assert len(await recv_all(rig.server)) == sent
    rig.server.shutdown(socket.SHUT_WR)
    assert await recv_all(rig.client) == b""
    assert (await rig.result()).upstream_bytes == sent


async def test_cancelling_the_relay_resets_both_peers_and_reraises(rig: Rig) -> None:
    loop = asyncio.get_running_loop()
    await loop.sock_sendall(rig.client, b"hello")
    assert await recv_exactly(rig.server, 5) == b"hello"
    assert rig.task is not None
    rig.task.cancel()
    with pytest.raises(asyncio.CancelledError):
        await rig.task
    await expect_reset(rig.client)
    await expect_reset(rig.server)


async def test_the_read_size_starts_small_and_doubles_while_reads_fill_it() -> None:
    a, b = socket.socketpair()
    stream = SocketStream(a, max_chunk=8192)
    try:
        assert stream.read_size == 1024
        b.sendall(b"q" * 10)
        assert await stream.read() == b"q" * 10
        assert stream.read_size == 1024
        b.sendall(b"r" * 100_000)
        sizes = [len(await stream.read()) for _ in range(5)]
        assert sizes == [1024, 2048, 4096, 8192, 8192]
        assert stream.read_size == 8192
    finally:
        await stream.aclose()
        b.close()


async def test_abort_wakes_a_pending_read_and_later_calls_fail_cleanly() -> None:
    a, b = socket.socketpair()
    stream = SocketStream(a)
    try:
        reader = asyncio.create_task(stream.read())
        await asyncio.sleep(0.01)
        stream.abort()
        stream.abort()
        with pytest.raises(StreamClosedError):
            await reader
        with pytest.raises(StreamClosedError):
            await stream.read()
        with pytest.raises(StreamClosedError):
            await stream.write(b"more")
        stream.write_eof()
        await stream.aclose()
    finally:
        b.close()


async def test_abort_wakes_a_write_blocked_on_a_full_socket() -> None:
    a, b = socket.socketpair()
    stream = SocketStream(a)
    try:
        writer = asyncio.create_task(stream.write(b"w" * (64 * MiB)))
        await asyncio.sleep(0.05)
        assert not writer.done()
        stream.abort()
        with pytest.raises(StreamClosedError):
            await writer
    finally:
        b.close()


async def test_writing_after_write_eof_is_an_error_and_the_peer_sees_eof() -> None:
    a, b = socket.socketpair()
    stream = SocketStream(a)
    try:
        await stream.write(b"last")
        stream.write_eof()
        stream.write_eof()
        with pytest.raises(StreamClosedError):
            await stream.write(b"more")
        b.setblocking(False)
        assert await recv_all(b) == b"last"
    finally:
        await stream.aclose()
        b.close()


async def test_connect_to_a_closed_port_is_refused_with_the_address_named() -> None:
    closed = listener()
    address = closed.getsockname()
    closed.close()
    with pytest.raises(ProxyConnectError) as caught:
        await connect(factory(), address)
    assert caught.value.reason == "refused"
    assert caught.value.address == address
    assert f"127.0.0.1:{address[1]}" in str(caught.value)


async def test_connect_to_a_listener_that_never_accepts_times_out() -> None:
    loop = asyncio.get_running_loop()
    full = listener(backlog=0)
    fillers: list[socket.socket] = []
    try:
        for _ in range(2):  # fill the accept queue: further SYNs are dropped
            filler = socket.socket()
            filler.setblocking(False)
            fillers.append(filler)
            with contextlib.suppress(TimeoutError):
                async with asyncio.timeout(0.2):
                    await loop.sock_connect(filler, full.getsockname())
        with pytest.raises(ProxyConnectError) as caught:
            await connect(factory(), full.getsockname(), timeout=0.3)
        assert caught.value.reason == "timeout"
    finally:
        for filler in fillers:
            filler.close()
        full.close()


async def test_factory_sockets_are_nonblocking_cloexec_nodelay_keepalive_and_marked() -> None:
    sock = await factory().tcp_socket()
    with sock:
        assert not sock.getblocking()
        assert not os.get_inheritable(sock.fileno())
        assert sock.getsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY)
        assert sock.getsockopt(socket.SOL_SOCKET, socket.SO_KEEPALIVE)
        if ROOT:
            assert sock.getsockopt(socket.SOL_SOCKET, socket.SO_MARK) == PROXY_MARK


async def test_a_connection_that_was_not_redirected_has_no_original_destination(rig: Rig) -> None:
    assert original_dst(rig.server) is None


def _has_ipv6_loopback() -> bool:
    try:
        with socket.socket(socket.AF_INET6) as probe:
            probe.bind(("::1", 0))
    except OSError:
        return False
    return True


@pytest.mark.skipif(not _has_ipv6_loopback(), reason="this machine has no ::1")
def test_an_ipv6_connection_that_was_not_redirected_has_no_original_destination_and_keeps_its_local_address() -> None:
    """Without a NAT entry ``IP6T_SO_ORIGINAL_DST`` fails (ENOENT): no original destination, and the local address,
    which a TPROXY'd connection's destination is, is there for the caller to use instead."""
    with socket.socket(socket.AF_INET6) as listener:
        listener.bind(("::1", 0))
        listener.listen()
        with socket.create_connection(listener.getsockname()[:2]) as client:
            accepted, _ = listener.accept()
            with accepted:
                assert original_dst(accepted) is None
                assert original_dst(client) is None
                assert accepted.getsockname()[:2] == ("::1", listener.getsockname()[1])


async def test_a_finished_splice_of_socket_streams_is_freed_without_the_cyclic_collector() -> None:
    """A stream that is closed lets go of the relay it pushed to: the splice, its directions and both streams are
    freed by reference counting once the owner drops them, not left in a cycle for the collector (a cold
    connection's every object counts)."""
    import gc

    from ambit.proxy.relay import Splice, close_now, splice

    a, client = socket.socketpair()
    b, server = socket.socketpair()
    for sock in (a, b, client, server):
        sock.setblocking(False)
    loop = asyncio.get_running_loop()
    done = asyncio.Event()
    down, up = SocketStream(a), SocketStream(b)

    def finished(running: Splice) -> None:
        close_now(running.downstream, running.upstream)
        done.set()

    gc.collect()
    gc.disable()
    try:
        running = splice(down, up, finished)
        await loop.sock_sendall(client, b"ping")
        assert await loop.sock_recv(server, 16) == b"ping"
        client.shutdown(socket.SHUT_WR)
        server.shutdown(socket.SHUT_WR)
        await asyncio.wait_for(done.wait(), 5)
        del running, down, up, finished
        await asyncio.sleep(0)
        gc.set_debug(gc.DEBUG_SAVEALL)  # what the collector would have to free stays in gc.garbage
        gc.collect()
        left = sorted({type(o).__name__ for o in gc.garbage} & {"Splice", "_Direction", "SocketStream", "RelayResult"})
        assert left == []
    finally:
        gc.set_debug(0)
        gc.garbage.clear()
        gc.enable()
        client.close()
        server.close()
