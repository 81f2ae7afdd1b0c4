"""The relay's plain socket side in C (step 3 of docs/native-data-path.md) and every way it falls back to Python.

Rig: client ⇄ splice A ⇄ HBONE tunnel (the socket TLS transport, records and DATA frames in C) ⇄ splice B ⇄ server.
Each of A and B joins a :class:`SocketStream` and an :class:`HboneStream`, so on the C path (``relay_path``
"c") all four directions move their bytes through ``SocketSink``/``SocketReader`` in the steady state; on the
Python path ("python", step 2 alone) through the relay's Python callbacks. Every test runs on both and must see the
same bytes, in order, and the same :class:`RelayResult`. The fallbacks are each driven on purpose: a slow plain
reader (partial sends), a slow HBONE peer (``DataPath.send`` refusing or over its bound), half-closes, resets,
a cancel while C's reader is registered, a socket closed under its stream with its descriptor number reused,
per-chunk callbacks, and random chunk and kernel buffer sizes (hypothesis).
"""

from __future__ import annotations

import asyncio
import contextlib
import hashlib
import os
import socket
from collections.abc import AsyncIterator, Iterator
from dataclasses import dataclass, field
from pathlib import Path

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st
from tests.conftest import use_records_path
from tests.integration.proxy_rig import CLIENT, SERVER, TD, HbonePair, connected_pair, expect_reset, rst_close, until

from ambit import native
from ambit.hbone.settings import HboneSettings
from ambit.identity.localca import LocalCa
from ambit.proxy import relay as relay_module
from ambit.proxy.hbone_stream import HboneStream
from ambit.proxy.relay import RelayResult, Splice, close_now, splice
from ambit.proxy.streams import SocketStream
from ambit.tls.workload import WorkloadCertificate

pytestmark = pytest.mark.timeout(60)
KiB, MiB = 1024, 1024 * 1024
EXAMPLES = int(os.environ.get("AMBIT_RELAY_EXAMPLES", "20"))
"""Hypothesis examples of the random exchange (the sanitizer run asks for few)."""


@pytest.fixture(params=("python", "c"))
def relay_path(request: pytest.FixtureRequest) -> Iterator[str]:
    """The relay's socket side in Python (records and DATA frames in C: step 2) or in C too (step 3)."""
    use_records_path("relay" if request.param == "c" else "native")
    yield request.param
    native.use(None)


@pytest.fixture(scope="module")
def certs(tmp_path_factory: pytest.TempPathFactory) -> tuple[WorkloadCertificate, WorkloadCertificate]:
    async def make() -> tuple[WorkloadCertificate, WorkloadCertificate]:
        ca = LocalCa(tmp_path_factory.mktemp("relay-sockets") / "ca", trust_domain=TD)
        client, server = await asyncio.gather(ca.fetch_certificate(CLIENT), ca.fetch_certificate(SERVER))
        return client, server

    return asyncio.run(make())


@contextlib.asynccontextmanager
async def socket_pair(
    certs: tuple[WorkloadCertificate, WorkloadCertificate], server_settings: HboneSettings | None = None
) -> AsyncIterator[HbonePair]:
    pair = HbonePair(*certs)
    pair.tls_transport = "socket"
    pair.server_settings = server_settings
    await pair.start()
    try:
        yield pair
    finally:
        await pair.aclose()


@dataclass
class Chain:
    """client ⇄ down ⇄ (splice a) ⇄ near ⇄ HBONE ⇄ far ⇄ (splice b) ⇄ up ⇄ server."""

    client: socket.socket
    server: socket.socket
    down: SocketStream
    up: SocketStream
    near: HboneStream
    far: HboneStream
    a: Splice | None = None
    b: Splice | None = None
    done: list[Splice] = field(default_factory=list)

    def finished(self, over: Splice) -> None:
        self.done.append(over)
        close_now(over.downstream, over.upstream)

    @property
    def results(self) -> list[RelayResult]:
        assert self.a is not None and self.b is not None
        return [self.a.result, self.b.result]

    def close(self) -> None:
        for splice_ in (self.a, self.b):
            if splice_ is not None:
                splice_.cancel()
        self.client.close()
        self.server.close()


async def chain(pair: HbonePair, relay_path: str, buffers: tuple[int, int] | None = None, **callbacks: object) -> Chain:
    """A tunnel spliced to a socket at each end; ``buffers`` (SO_SNDBUF, SO_RCVBUF) on all four sockets (a receive
    buffer below loopback's 64 KiB MSS makes TCP wait for its persist timer: seconds per MiB)."""
    near, far = await pair.open()
    client, accepted = await connected_pair()
    dialled, server = await connected_pair()
    for sock in (client, accepted, dialled, server):
        sock.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)  # as the proxy's sockets; no delayed-ACK stalls
        if buffers is not None:
            sock.setsockopt(socket.SOL_SOCKET, socket.SO_SNDBUF, buffers[0])
            sock.setsockopt(socket.SOL_SOCKET, socket.SO_RCVBUF, buffers[1])
    rig = Chain(client, server, SocketStream(accepted), SocketStream(dialled), near, far)
    rig.a = splice(rig.down, near, rig.finished, **callbacks)  # type: ignore[arg-type]
    rig.b = splice(far, rig.up, rig.finished)
    natives = [type(d.native).__name__ for s in (rig.a, rig.b) for d in s.directions]
    if relay_path == "c" and not callbacks:
        assert natives == ["SocketReader", "SocketSink", "SocketSink", "SocketReader"]
    elif not callbacks:
        assert natives == ["NoneType"] * 4
    return rig


async def send_all(sock: socket.socket, data: bytes) -> None:
    await asyncio.get_running_loop().sock_sendall(sock, data)


async def read_exactly(sock: socket.socket, n: int) -> bytes:
    loop, parts, got = asyncio.get_running_loop(), [], 0
    async with asyncio.timeout(20):
        while got < n:
            chunk = await loop.sock_recv(sock, min(n - got, 256 * KiB))
            assert chunk, f"EOF after {got} of {n} octets"
            parts.append(chunk)
            got += len(chunk)
    return b"".join(parts)


async def read_to_eof(sock: socket.socket) -> bytes:
    loop, parts = asyncio.get_running_loop(), []
    async with asyncio.timeout(20):
        while chunk := await loop.sock_recv(sock, 256 * KiB):
            parts.append(chunk)
    return b"".join(parts)


def pattern(n: int, seed: int) -> bytes:
    """``n`` octets no shift of which repeats within 4 KiB: a reordering or a duplicate shows."""
    block = hashlib.sha256(str(seed).encode()).digest() * 128 + bytes(range(251)) * 17
    return (block * (n // len(block) + 1))[:n]


class Calls:
    """Counts calls of :class:`~ambit.proxy.relay._Direction` methods (C calls them through the class too)."""

    def __init__(self, monkeypatch: pytest.MonkeyPatch, *names: str) -> None:
        self.counts = dict.fromkeys(names, 0)
        for name in names:
            original = getattr(relay_module._Direction, name)

            def counted(self_: object, *args: object, _name: str = name, _original: object = original) -> object:
                self.counts[_name] += 1
                return _original(self_, *args)  # type: ignore[operator]

            monkeypatch.setattr(relay_module._Direction, name, counted)


async def test_bytes_cross_both_ways_in_order_and_both_paths_count_them_alike(
    certs: tuple[WorkloadCertificate, WorkloadCertificate], relay_path: str
) -> None:
    async with socket_pair(certs) as pair:
        rig = await chain(pair, relay_path)
        try:
            up, down = pattern(3 * MiB + 17, 1), pattern(2 * MiB + 5, 2)
            sending = asyncio.gather(send_all(rig.client, up), send_all(rig.server, down))
            got_up, got_down = await asyncio.gather(
                read_exactly(rig.server, len(up)), read_exactly(rig.client, len(down))
            )
            await sending
            assert got_up == up and got_down == down
            rig.client.shutdown(socket.SHUT_WR)
            assert await read_to_eof(rig.server) == b""
            rig.server.shutdown(socket.SHUT_WR)
            assert await read_to_eof(rig.client) == b""
            await until(lambda: len(rig.done) == 2)
            assert rig.results == [RelayResult(len(up), len(down), "")] * 2
        finally:
            rig.close()


async def test_a_slow_plain_reader_gets_every_byte_in_order_after_partial_sends_pause_the_tunnel(
    certs: tuple[WorkloadCertificate, WorkloadCertificate], relay_path: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    calls = Calls(monkeypatch, "on_data", "hold_source")
    async with socket_pair(certs) as pair:
        rig = await chain(pair, relay_path, buffers=(4 * KiB, 128 * KiB))
        try:
            data = pattern(1 * MiB, 3)
            sending = asyncio.create_task(send_all(rig.client, data))
            await asyncio.sleep(0.3)  # the server does not read: the up socket fills, its sends go short
            assert not sending.done()
            assert not rig.far._session.core._streams[rig.far.stream_id].sink  # the tunnel's source is paused
            assert rig.up.buffered > 0  # what the kernel did not take is queued, by the Python path
            assert calls.counts["hold_source"] > 0 and calls.counts["on_data"] > 0
            assert await read_exactly(rig.server, len(data)) == data
            await sending
            assert rig.results[0].upstream_bytes == rig.results[1].upstream_bytes == len(data)
            assert not rig.done
        finally:
            rig.close()


async def test_a_tunnel_window_that_refuses_the_chunk_sends_it_the_python_way_and_pauses_the_socket(
    certs: tuple[WorkloadCertificate, WorkloadCertificate], relay_path: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A stream window smaller than a read: ``DataPath.send`` returns None and the chunk queues in the core."""
    calls = Calls(monkeypatch, "on_data", "hold_source")
    async with socket_pair(certs, HboneSettings(stream_window=4 * KiB, send_chunk=4 * KiB)) as pair:
        rig = await chain(pair, relay_path, buffers=(4 * KiB, 128 * KiB))
        try:
            data = pattern(2 * MiB + 3, 4)
            sending = asyncio.create_task(send_all(rig.client, data))
            await asyncio.sleep(0.2)  # the server does not read: the window shuts, the client's socket is paused
            assert not sending.done() and not rig.down._read_armed
            assert calls.counts["on_data"] > 0 and calls.counts["hold_source"] > 0
            assert await read_exactly(rig.server, len(data)) == data
            await sending
            assert rig.results[0].upstream_bytes == rig.results[1].upstream_bytes == len(data)
        finally:
            rig.close()


async def test_a_refused_chunk_reaches_on_data_as_a_view_of_the_frame_it_was_read_into(
    certs: tuple[WorkloadCertificate, WorkloadCertificate], relay_path: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The C reader recv()s into the DATA frame the chunk would travel in: when the tunnel refuses it, the Python path
    gets a read-only view of that frame's payload (9 octets of header in front, zeroed: never uninitialised memory),
    not a copy."""
    if relay_path != "c":
        pytest.skip("the C callables only")
    seen: list[tuple[object, bytes | memoryview]] = []
    original = relay_module._Direction.on_data

    def on_data(self_: relay_module._Direction, data: bytes | memoryview) -> None:
        seen.append((self_.src, data))
        original(self_, data)

    monkeypatch.setattr(relay_module._Direction, "on_data", on_data)
    async with socket_pair(certs, HboneSettings(stream_window=4 * KiB, send_chunk=4 * KiB)) as pair:
        rig = await chain(pair, relay_path, buffers=(4 * KiB, 128 * KiB))
        try:
            data = pattern(512 * KiB + 1, 7)
            sending = asyncio.create_task(send_all(rig.client, data))
            await asyncio.sleep(0.2)
            assert await read_exactly(rig.server, len(data)) == data
            await sending
        finally:
            rig.close()
    from_the_socket = [chunk for src, chunk in seen if src is rig.down]
    assert from_the_socket, "the window never refused a chunk"
    for chunk in from_the_socket:
        assert isinstance(chunk, memoryview) and chunk.readonly and isinstance(chunk.obj, bytes)
        assert len(chunk.obj) == len(chunk) + 9 and chunk.obj[:9] == bytes(9)
        assert chunk.obj[9:] == chunk


async def test_short_reads_full_reads_and_eof_right_after_data_cross_whole_and_in_order(
    certs: tuple[WorkloadCertificate, WorkloadCertificate], relay_path: str
) -> None:
    """Reads shorter than the read size (the frame shrunk to the read), reads that fill it (the size doubles), and
    the client's EOF straight after its last octets."""
    async with socket_pair(certs) as pair:
        rig = await chain(pair, relay_path)
        try:
            first = rig.down._chunk
            pieces = [pattern(n, n) for n in (1, first - 1, first, 3, 5 * first + 7)]
            for piece in pieces:
                await send_all(rig.client, piece)
                assert await read_exactly(rig.server, len(piece)) == piece
            tail = pattern(3 * MiB + 1, 9)
            await send_all(rig.client, tail)
            rig.client.shutdown(socket.SHUT_WR)
            assert await read_exactly(rig.server, len(tail)) == tail
            assert await read_to_eof(rig.server) == b""
            assert rig.down._chunk > first
            total = sum(map(len, pieces)) + len(tail)
            rig.server.shutdown(socket.SHUT_WR)
            await until(lambda: len(rig.done) == 2)
            assert rig.results == [RelayResult(total, 0, "")] * 2
        finally:
            rig.close()


async def test_a_tunnel_over_its_write_bound_pauses_the_socket_until_it_drains(
    certs: tuple[WorkloadCertificate, WorkloadCertificate], relay_path: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    """``DataPath.send`` took the chunk but says False (the TLS transport is over its high-water mark): the chunk is
    sent and counted, the socket is paused, and it is resumed when the session drains."""
    calls = Calls(monkeypatch, "on_data", "hold_source")
    async with socket_pair(certs) as pair:
        rig = await chain(pair, relay_path)
        try:
            session = rig.near._session
            session.write_paused = True  # as pause_writing leaves it
            await send_all(rig.client, b"taken")
            assert await read_exactly(rig.server, 5) == b"taken"
            await until(lambda: not rig.down._read_armed)
            assert calls.counts["hold_source"] == 1
            assert calls.counts["on_data"] == (0 if relay_path == "c" else 2)  # the chunk through splice a, then b
            await send_all(rig.client, b"held")
            await asyncio.sleep(0.1)
            rig.server.setblocking(False)
            with pytest.raises(BlockingIOError):
                rig.server.recv(100)  # not read while paused
            session.resume_writing()
            assert rig.down._read_armed
            assert await read_exactly(rig.server, 4) == b"held"
            assert rig.results[0].upstream_bytes == 9
        finally:
            rig.close()


@pytest.mark.parametrize("first", ["client", "server"])
async def test_a_half_close_either_way_lets_the_other_direction_finish(
    certs: tuple[WorkloadCertificate, WorkloadCertificate], relay_path: str, first: str
) -> None:
    async with socket_pair(certs) as pair:
        rig = await chain(pair, relay_path)
        try:
            ends = {"client": rig.client, "server": rig.server}
            closer, other = ends[first], ends["server" if first == "client" else "client"]
            request = pattern(100 * KiB + 1, 5)
            await send_all(closer, request)
            closer.shutdown(socket.SHUT_WR)
            assert await read_to_eof(other) == request
            reply = pattern(700 * KiB + 3, 6)
            await send_all(other, reply)  # the other direction still runs, through C
            assert await read_exactly(closer, len(reply)) == reply
            other.shutdown(socket.SHUT_WR)
            assert await read_to_eof(closer) == b""
            await until(lambda: len(rig.done) == 2)
            expected = (
                RelayResult(len(request), len(reply), "")
                if first == "client"
                else RelayResult(len(reply), len(request), "")
            )
            assert rig.results == [expected, expected]
        finally:
            rig.close()


@pytest.mark.parametrize("who", ["client", "server"])
async def test_a_reset_of_a_plain_socket_mid_transfer_aborts_both_ends_and_is_reported(
    certs: tuple[WorkloadCertificate, WorkloadCertificate], relay_path: str, who: str
) -> None:
    async with socket_pair(certs) as pair:
        rig = await chain(pair, relay_path)
        try:
            reset, other = (rig.client, rig.server) if who == "client" else (rig.server, rig.client)
            flood = asyncio.create_task(send_all(other, pattern(32 * MiB, 7)))
            await read_exactly(reset, 64 * KiB)  # bytes are moving towards the socket that resets
            rst_close(reset)
            await until(lambda: len(rig.done) == 2)
            assert all(result.error for result in rig.results), rig.results
            async with asyncio.timeout(5):  # the other peer, still sending, is reset (its send sees it first)
                (outcome,) = await asyncio.gather(flood, return_exceptions=True)
            assert isinstance(outcome, ConnectionResetError | BrokenPipeError), outcome
        finally:
            rig.close()


async def test_cancelling_a_splice_while_its_c_reader_is_registered_unregisters_it_and_resets_both_peers(
    certs: tuple[WorkloadCertificate, WorkloadCertificate], relay_path: str
) -> None:
    async with socket_pair(certs) as pair:
        rig = await chain(pair, relay_path)
        assert rig.a is not None
        try:
            await send_all(rig.client, b"ping")
            assert await read_exactly(rig.server, 4) == b"ping"
            reader = rig.a.directions[0].native
            assert rig.down._read_armed  # the loop holds the reader (C's, on the C path)
            rig.a.cancel()
            assert rig.a.result.error == "cancelled" and rig.a.directions == ()
            assert not rig.down._read_armed and rig.down.socket.fileno() == -1
            if reader is not None:
                reader()  # a late call of the old callback: nothing to read, nothing raised
            await expect_reset(rig.client)
            await until(lambda: len(rig.done) == 2)
            assert rig.results[1].error  # the tunnel was reset: the far splice fails too
        finally:
            rig.close()


@pytest.mark.parametrize("how", ["under the stream", "through the stream"])
async def test_a_closed_socket_whose_number_was_reused_is_never_read_or_written_by_the_c_side(
    certs: tuple[WorkloadCertificate, WorkloadCertificate], relay_path: str, how: str
) -> None:
    """A socket closed (by its stream or behind its back) and its descriptor number taken by a new connection before
    the C callables run again: they must fall back, and never touch the new connection."""
    if relay_path != "c":
        pytest.skip("the C callables only")
    async with socket_pair(certs) as pair:
        rig = await chain(pair, relay_path)
        assert rig.a is not None and rig.b is not None
        reader, sink = rig.a.directions[0].native, rig.b.directions[0].native
        assert reader is not None and sink is not None
        victims: list[socket.socket] = []
        try:
            for stream in (rig.down, rig.up):
                number = stream.socket.fileno()
                if how == "under the stream":
                    stream.socket.close()  # the stream still thinks it is open (and reading is armed)
                else:
                    stream.close()
                while True:  # the lowest free number is the one just freed
                    victim, peer = socket.socketpair()
                    victims += [victim, peer]
                    if number in (victim.fileno(), peer.fileno()):
                        victim, peer = (victim, peer) if victim.fileno() == number else (peer, victim)
                        break
                    assert len(victims) < 20
                peer.send(b"not yours")
                peer.setblocking(False)
                if stream is rig.down:
                    reader()
                    assert victim.recv(100) == b"not yours"  # still there: nothing read it
                else:
                    sink(b"secret")
                    with pytest.raises(BlockingIOError):
                        peer.recv(100)  # nothing written to the new connection
            await until(lambda: len(rig.done) == 2)
            assert all(result.error for result in rig.results), rig.results
        finally:
            for sock in victims:
                sock.close()
            rig.close()


async def test_per_chunk_callbacks_keep_the_python_path_and_see_every_chunk(
    certs: tuple[WorkloadCertificate, WorkloadCertificate], relay_path: str
) -> None:
    ups: list[int] = []
    downs: list[int] = []
    async with socket_pair(certs) as pair:
        rig = await chain(pair, relay_path, on_upstream=ups.append, on_downstream=downs.append)
        assert rig.a is not None
        assert [d.native for d in rig.a.directions] == [None, None]
        try:
            up, down = pattern(1 * MiB + 1, 8), pattern(300 * KiB, 9)
            await send_all(rig.client, up)
            assert await read_exactly(rig.server, len(up)) == up
            await send_all(rig.server, down)
            assert await read_exactly(rig.client, len(down)) == down
            assert sum(ups) == len(up) and sum(downs) == len(down)
            assert rig.a.result == RelayResult(len(up), len(down), "") == rig.results[1]
        finally:
            rig.close()


async def _exchange(
    certs: tuple[WorkloadCertificate, WorkloadCertificate],
    relay_path: str,
    sizes: list[list[int]],
    buffers: tuple[int, int],
) -> None:
    async with socket_pair(certs) as pair:
        rig = await chain(pair, relay_path, buffers=buffers)
        try:
            payloads = [[pattern(n, i * 1000 + j) for j, n in enumerate(side)] for i, side in enumerate(sizes)]
            wholes = [b"".join(side) for side in payloads]

            async def send(sock: socket.socket, chunks: list[bytes]) -> None:
                for chunk in chunks:
                    await send_all(sock, chunk)
                sock.shutdown(socket.SHUT_WR)

            async with asyncio.timeout(30):
                _, _, got_up, got_down = await asyncio.gather(
                    send(rig.client, payloads[0]),
                    send(rig.server, payloads[1]),
                    read_to_eof(rig.server),
                    read_to_eof(rig.client),
                )
                await until(lambda: len(rig.done) == 2)
            assert got_up == wholes[0] and got_down == wholes[1]
            assert rig.results == [RelayResult(len(wholes[0]), len(wholes[1]), "")] * 2
        finally:
            rig.close()


_CHUNKS = st.lists(st.one_of(st.integers(1, 64), st.integers(1, 300_000), st.sampled_from([1024, 16384, 262144])))


@settings(max_examples=EXAMPLES, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(
    sizes=st.lists(_CHUNKS, min_size=2, max_size=2),
    sndbuf=st.sampled_from([2048, 4096, 16384, 262144]),
    rcvbuf=st.sampled_from([65536, 131072, 262144]),  # below loopback's MSS (64 KiB) TCP crawls on persist timers
)
def test_bytes_out_equal_bytes_in_for_any_chunks_and_kernel_buffers_on_both_paths(
    certs: tuple[WorkloadCertificate, WorkloadCertificate],
    relay_path: str,
    sizes: list[list[int]],
    sndbuf: int,
    rcvbuf: int,
    tmp_path: Path,
) -> None:
    asyncio.run(_exchange(certs, relay_path, sizes, (sndbuf, rcvbuf)))


async def test_a_finished_splice_with_its_c_side_is_freed_without_the_cyclic_collector(
    certs: tuple[WorkloadCertificate, WorkloadCertificate], relay_path: str
) -> None:
    """The C callables hold their direction, which holds them: the finished splice lets them go, so a relayed
    connection is still freed by reference counting on both paths."""
    import gc

    relay_types = {"Splice", "_Direction", "SocketStream", "RelayResult", "SocketSink", "SocketReader"}
    async with socket_pair(certs) as pair:
        gc.collect()
        gc.disable()
        try:
            rig = await chain(pair, relay_path)
            await send_all(rig.client, b"ping")
            assert await read_exactly(rig.server, 4) == b"ping"
            rig.client.shutdown(socket.SHUT_WR)
            rig.server.shutdown(socket.SHUT_WR)
            assert await read_to_eof(rig.client) == b""
            async with asyncio.timeout(5):
                while len(rig.done) < 2:  # noqa: ASYNC110 (until's closure would keep the rig)
                    await asyncio.sleep(0.005)
            rig.client.close()
            rig.server.close()
            del rig
            await asyncio.sleep(0.05)
            gc.set_debug(gc.DEBUG_SAVEALL)  # what the collector would have to free stays in gc.garbage
            gc.collect()
            assert sorted({type(o).__name__ for o in gc.garbage} & relay_types) == []
        finally:
            gc.set_debug(0)
            gc.garbage.clear()
            gc.enable()
