"""The task-less relay (:func:`ambit.proxy.relay.splice`) and :func:`close_now` on real loopback sockets and HBONE.

Socket rig: a *client* connected to the proxy's accept side (the downstream :class:`SocketStream`) and the proxy
connected to a *server* (the upstream one); the splice runs between the two streams, client and server are plain
sockets driven with the loop's ``sock_*`` calls. HBONE rig: an in-process HBONE server over real mutual TLS whose
handler accepts each tunnel and hands the server end to the test (returning it, so the server leaves it alone),
and a client connection in front of it; the test drives either end in pull mode or splices it.
"""

from __future__ import annotations

import asyncio
import contextlib
import hashlib
import logging
import socket
import struct
from collections.abc import AsyncIterator
from dataclasses import dataclass, field
from pathlib import Path

import pytest
from bench.relaying import relay
from tests.conftest import use_records_path
from tests.integration.proxy_rig import (
    HbonePair,
    connected_pair,
    expect_reset,
    hbone_pair,
    read_all,
    recv_all,
    recv_exactly,
    rst_close,
    settle,
    until,
)

from ambit import native
from ambit.hbone.settings import HboneSettings
from ambit.proxy.errors import StreamClosedError
from ambit.proxy.hbone_stream import WRITE_BOUND
from ambit.proxy.relay import RelayResult, Splice, close_now, splice
from ambit.proxy.streams import SocketStream

pytestmark = pytest.mark.timeout(60)
MiB = 1024 * 1024


@dataclass
class Rig:
    """client ⇄ downstream SocketStream ⇄ (splice) ⇄ upstream SocketStream ⇄ server."""

    client: socket.socket
    server: socket.socket
    downstream: SocketStream
    upstream: SocketStream
    done: list[tuple[Splice, str]] = field(default_factory=list)
    ups: list[int] = field(default_factory=list)
    downs: list[int] = field(default_factory=list)

    def on_done(self, over: Splice) -> None:
        self.done.append((over, over.result.error))

    def splice(self) -> Splice:
        return splice(
            self.downstream, self.upstream, self.on_done, on_upstream=self.ups.append, on_downstream=self.downs.append
        )


@pytest.fixture
async def rig() -> AsyncIterator[Rig]:
    client, accepted = await connected_pair()
    server, dialled = await connected_pair()
    r = Rig(client, server, SocketStream(accepted), SocketStream(dialled))
    try:
        yield r
    finally:
        for stream in (r.downstream, r.upstream):
            stream.abort()
        client.close()
        server.close()


async def test_splice_returns_before_any_byte_moves_then_relays_exactly_and_reports_once_after_both_eofs(
    rig: Rig,
) -> None:
    loop = asyncio.get_running_loop()
    await loop.sock_sendall(rig.client, b"early")  # already waiting in the accepted socket
    running = rig.splice()
    assert isinstance(running, Splice)
    assert not running.over
    assert running.result == RelayResult(0, 0, "")  # nothing was read inside splice()
    assert rig.done == [] and rig.ups == [] and rig.downs == []

    assert await recv_exactly(rig.server, 5) == b"early"
    await loop.sock_sendall(rig.client, b"ping")
    assert await recv_exactly(rig.server, 4) == b"ping"
    await loop.sock_sendall(rig.server, b"pong!!")
    assert await recv_exactly(rig.client, 6) == b"pong!!"
    big = bytes(range(256)) * 4096  # 1 MiB, several chunks and some backpressure
    sender = asyncio.create_task(loop.sock_sendall(rig.server, big))
    assert await recv_exactly(rig.client, len(big)) == big
    await sender

    rig.client.shutdown(socket.SHUT_WR)
    assert await recv_all(rig.server) == b""
    await settle()
    assert rig.done == [] and not running.over  # one direction is still open
    rig.server.shutdown(socket.SHUT_WR)
    assert await recv_all(rig.client) == b""
    await until(lambda: bool(rig.done))
    await settle()
    assert rig.done == [(running, "")]
    assert running.over
    assert running.result == RelayResult(upstream_bytes=9, downstream_bytes=6 + len(big), error="")
    assert sum(rig.ups) == 9 and sum(rig.downs) == 6 + len(big)


@pytest.mark.parametrize("side", ["client", "server"])
async def test_a_reset_on_one_side_reports_its_direction_once_and_resets_the_other_peer(rig: Rig, side: str) -> None:
    loop = asyncio.get_running_loop()
    running = rig.splice()
    await loop.sock_sendall(rig.client, b"x")
    assert await recv_exactly(rig.server, 1) == b"x"
    await loop.sock_sendall(rig.server, b"y")
    assert await recv_exactly(rig.client, 1) == b"y"
    if side == "client":
        rst_close(rig.client)
        await expect_reset(rig.server)
        direction = "downstream->upstream read"
    else:
        rst_close(rig.server)
        await expect_reset(rig.client)
        direction = "upstream->downstream read"
    await until(lambda: bool(rig.done))
    await settle()
    assert len(rig.done) == 1
    over, error = rig.done[0]
    assert over is running and running.over
    assert error.startswith(direction), error
    assert "reset" in error
    assert (running.result.upstream_bytes, running.result.downstream_bytes) == (1, 1)


async def test_cancel_resets_both_peers_reports_cancelled_once_and_leaves_its_registry(rig: Rig) -> None:
    loop = asyncio.get_running_loop()
    running = rig.splice()
    registry: set[Splice] = {running}
    running.registry = registry
    await loop.sock_sendall(rig.client, b"hello")
    assert await recv_exactly(rig.server, 5) == b"hello"

    running.cancel()
    assert rig.done == [(running, "cancelled")]  # on_done ran inside cancel(), not later
    assert running.over and running.result.error == "cancelled"
    assert registry == set()
    assert running.registry is None
    await expect_reset(rig.client)
    await expect_reset(rig.server)
    running.cancel()
    await settle()
    assert rig.done == [(running, "cancelled")]


async def test_a_splice_that_ends_normally_leaves_its_registry(rig: Rig) -> None:
    running = rig.splice()
    registry: set[Splice] = {running}
    running.registry = registry
    rig.client.shutdown(socket.SHUT_WR)
    rig.server.shutdown(socket.SHUT_WR)
    assert await recv_all(rig.client) == b""
    assert await recv_all(rig.server) == b""
    await until(lambda: bool(rig.done))
    assert rig.done == [(running, "")]
    assert registry == set()
    running.cancel()  # after the end: nothing happens
    assert rig.done == [(running, "")]
    assert running.result.error == ""


async def test_an_on_done_that_raises_is_logged_and_neither_breaks_the_stream_nor_runs_twice(
    rig: Rig, caplog: pytest.LogCaptureFixture
) -> None:
    loop = asyncio.get_running_loop()
    calls: list[str] = []

    def broken(over: Splice) -> None:
        calls.append(over.result.error)
        raise RuntimeError("bookkeeping bug")

    caplog.set_level(logging.DEBUG)
    running = splice(rig.downstream, rig.upstream, broken)
    await loop.sock_sendall(rig.client, b"abc")
    assert await recv_exactly(rig.server, 3) == b"abc"
    rig.client.shutdown(socket.SHUT_WR)
    rig.server.shutdown(socket.SHUT_WR)  # the last EOF's readiness callback runs the raising on_done
    assert await recv_all(rig.client) == b""
    assert await recv_all(rig.server) == b""
    await until(lambda: bool(calls))
    await settle()
    running.cancel()  # already over: on_done is not called again
    assert calls == [""]
    assert running.over
    failures = [r for r in caplog.records if r.name == "ambit.proxy.relay" and "on_done failed" in r.getMessage()]
    assert len(failures) == 1
    assert failures[0].levelno == logging.ERROR
    assert failures[0].exc_info is not None and isinstance(failures[0].exc_info[1], RuntimeError)
    # Nothing escaped into the stream's readiness callback (the loop would log "Exception in callback ...").
    assert [r for r in caplog.records if r.name == "asyncio" and r.levelno >= logging.ERROR] == []
    # The streams are intact and still the owner's: they close cleanly.
    close_now(rig.downstream, rig.upstream)
    assert rig.downstream.socket.fileno() == -1 and rig.upstream.socket.fileno() == -1


async def test_an_on_done_that_raises_during_cancel_does_not_escape_cancel(
    rig: Rig, caplog: pytest.LogCaptureFixture
) -> None:
    calls: list[str] = []

    def broken(over: Splice) -> None:
        calls.append(over.result.error)
        raise RuntimeError("bookkeeping bug")

    running = splice(rig.downstream, rig.upstream, broken)
    running.cancel()
    running.cancel()
    assert calls == ["cancelled"]
    assert "on_done failed" in caplog.text
    await expect_reset(rig.client)
    await expect_reset(rig.server)


async def test_close_now_closes_two_socket_streams_at_once_and_both_peers_read_eof(rig: Rig) -> None:
    loop = asyncio.get_running_loop()
    await loop.sock_sendall(rig.server, b"unread")  # closing with unread input would send a reset: read it
    assert await rig.upstream.read() == b"unread"
    before = asyncio.all_tasks()
    close_now(rig.downstream, rig.upstream)
    assert asyncio.all_tasks() - before == set()
    assert rig.downstream.socket.fileno() == -1 and rig.upstream.socket.fileno() == -1
    assert await recv_all(rig.client) == b""
    assert await recv_all(rig.server) == b""
    close_now(rig.downstream, rig.upstream)  # idempotent


async def test_close_now_after_a_splice_ends_closes_both_sockets(rig: Rig) -> None:
    loop = asyncio.get_running_loop()

    def end(over: Splice) -> None:
        rig.on_done(over)
        close_now(over.downstream, over.upstream)

    splice(rig.downstream, rig.upstream, end)
    await loop.sock_sendall(rig.client, b"q")
    assert await recv_exactly(rig.server, 1) == b"q"
    rig.client.shutdown(socket.SHUT_WR)
    rig.server.shutdown(socket.SHUT_WR)
    assert await recv_all(rig.server) == b""
    assert await recv_all(rig.client) == b""
    await until(lambda: bool(rig.done))
    assert rig.downstream.socket.fileno() == -1 and rig.upstream.socket.fileno() == -1


# HBONE


@pytest.fixture(params=("loop", "socket-native", "socket-relay"))
async def hbone(tmp_path: Path, request: pytest.FixtureRequest) -> AsyncIterator[HbonePair]:
    """The pair on the loop's TLS transport, on the socket transport with records and DATA frames in C, and with the
    relay's socket side in C too (step 3): splices of a socket and a tunnel run on each."""
    use_records_path({"socket-native": "native", "socket-relay": "relay"}.get(request.param, "python"))
    try:
        async with hbone_pair(tmp_path) as pair:
            pair.tls_transport = "loop" if request.param == "loop" else "socket"
            yield pair
    finally:
        native.use(None)


async def test_close_now_waits_in_a_task_for_bytes_queued_behind_flow_control_and_the_peer_gets_them_all(
    hbone: HbonePair,
) -> None:
    hbone.server_settings = HboneSettings(stream_window=4096, send_chunk=4096)
    near, far = await hbone.open()
    far.write_eof()  # the server end has nothing to say: once ours is flushed the tunnel is done, not reset
    assert await read_all(near) == b""
    payload = bytes(range(256)) * 1024  # 256 KiB against a 4 KiB window nobody is reopening
    near.write_nowait(payload)
    await asyncio.sleep(0.05)
    assert not near.done  # still queued: the far end does not read
    a, b = socket.socketpair()
    other = SocketStream(a)
    try:
        before = asyncio.all_tasks()
        close_now(near, other)
        closing = asyncio.all_tasks() - before
        assert len(closing) == 1  # the one close that has to wait
        assert other.socket.fileno() == -1  # the socket did not wait for it
        await asyncio.sleep(0.1)
        assert not next(iter(closing)).done()  # waiting for the far end to read
        assert await read_all(far) == payload
        async with asyncio.timeout(5):
            await asyncio.gather(*closing)
        assert near.done
    finally:
        b.close()


async def test_close_now_on_a_tunnel_with_nothing_queued_closes_at_once_without_a_task(hbone: HbonePair) -> None:
    near, far = await hbone.open()
    far.write_eof()
    assert await read_all(near) == b""
    near.write_nowait(b"small enough for the window")
    a, b = socket.socketpair()
    other = SocketStream(a)
    try:
        before = asyncio.all_tasks()
        close_now(near, other)
        assert asyncio.all_tasks() - before == set()
        assert near.done  # END_STREAM sent, nothing queued, the far end had ended: over on the wire
        assert await read_all(far) == b"small enough for the window"
    finally:
        b.close()


async def test_relay_with_a_tunnel_on_one_side_copies_both_ways_and_cancelling_it_resets_both_peers(
    hbone: HbonePair,
) -> None:
    loop = asyncio.get_running_loop()
    near, far = await hbone.open()
    client, accepted = await connected_pair()
    downstream = SocketStream(accepted)
    try:
        counted: list[int] = []
        task = asyncio.create_task(relay(downstream, near, on_upstream=counted.append, on_downstream=counted.append))
        await loop.sock_sendall(client, b"through the tunnel")
        got = b""
        async with asyncio.timeout(5):
            while len(got) < 18:
                got += await far.read()
        assert got == b"through the tunnel"
        await far.write(b"and back")
        assert await recv_exactly(client, 8) == b"and back"
        assert sum(counted) == 26

        task.cancel()
        with pytest.raises(asyncio.CancelledError):
            await task
        await expect_reset(client)
        with pytest.raises(StreamClosedError):
            async with asyncio.timeout(5):
                await far.read()
    finally:
        downstream.abort()
        client.close()


async def test_relay_with_a_tunnel_on_one_side_ends_cleanly_after_both_eofs(hbone: HbonePair) -> None:
    loop = asyncio.get_running_loop()
    near, far = await hbone.open()
    client, accepted = await connected_pair()
    downstream = SocketStream(accepted)
    try:
        task = asyncio.create_task(relay(downstream, near))
        await loop.sock_sendall(client, b"request")
        client.shutdown(socket.SHUT_WR)
        assert await read_all(far) == b"request"
        await far.write(b"reply")
        far.write_eof()
        assert await recv_all(client) == b"reply"
        async with asyncio.timeout(5):
            assert await task == RelayResult(7, 5, "")
    finally:
        with contextlib.suppress(Exception):
            await downstream.aclose()
        client.close()


async def test_a_slow_reader_behind_a_tunnel_stalls_the_sender_and_the_tunnel_holds_at_most_its_window(
    hbone: HbonePair,
) -> None:
    """client ⇄ splice ⇄ tunnel ⇄ splice ⇄ server that does not read: the far end's sink is detached when its
    socket backs up, DATA then queues unconsumed, the window shuts, the near end's writes pass their bound and the
    client's socket stops being read. Once the server reads, every byte arrives, in order."""
    window = 64 * 1024
    hbone.server_settings = HboneSettings(stream_window=window)
    near, far = await hbone.open()
    client, accepted = await connected_pair()
    dialled, server = await connected_pair()
    done: list[Splice] = []

    def finished(over: Splice) -> None:
        done.append(over)
        close_now(over.downstream, over.upstream)

    splice(SocketStream(accepted), near, finished)
    splice(far, SocketStream(dialled), finished)
    sent, digest = 0, hashlib.sha256()

    async def flood() -> None:
        nonlocal sent
        block = 0
        while sent < 256 * MiB:
            data = struct.pack(">Q", block) * 8192  # 64 KiB, each block different
            view = memoryview(data)
            while view:
                try:
                    n = client.send(view)
                except BlockingIOError:
                    await asyncio.sleep(0.005)
                    continue
                digest.update(view[:n])
                sent += n
                view = view[n:]
            block += 1

    try:
        flooder = asyncio.create_task(flood())
        last, stalled_since, held = -1, asyncio.get_running_loop().time(), 0
        try:
            async with asyncio.timeout(20):
                while asyncio.get_running_loop().time() - stalled_since < 0.3:  # the sender must stall
                    await asyncio.sleep(0.02)
                    held = max(held, sum(flow for _, flow in far._chunks or ()))
                    if sent != last:
                        last, stalled_since = sent, asyncio.get_running_loop().time()
            assert not flooder.done() and sent < 256 * MiB
            assert 0 < held <= window
            assert near._session.core.pending_bytes(near.stream_id) <= WRITE_BOUND + 256 * 1024
        finally:
            flooder.cancel()
            with contextlib.suppress(asyncio.CancelledError):
                await flooder
        client.shutdown(socket.SHUT_WR)
        received = hashlib.sha256()
        total = 0
        loop = asyncio.get_running_loop()
        async with asyncio.timeout(20):
            while chunk := await loop.sock_recv(server, 256 * 1024):
                received.update(chunk)
                total += len(chunk)
        assert (total, received.hexdigest()) == (sent, digest.hexdigest())
        server.shutdown(socket.SHUT_WR)
        assert await recv_all(client) == b""
        await until(lambda: len(done) == 2)
        assert [over.result.error for over in done] == ["", ""]
        assert done[0].result.upstream_bytes == done[1].result.upstream_bytes == sent
    finally:
        client.close()
        server.close()
