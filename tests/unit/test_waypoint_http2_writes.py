"""The waypoint's HTTP/2 session bounds every write by ``idle_timeout`` (ambit.waypoint.http2 rule 1), with one
timer for many writes: a peer that stops taking bytes fails the session, however many writes went before; and the
reader, while no stream is open, ends the session after ``idle_timeout`` without a frame, with one timer too."""

from __future__ import annotations

import asyncio

from ambit.hbone.messages import Http2ClientConnection, Http2ServerConnection
from ambit.waypoint.http2 import Http2Session


class StallingStream:
    """A byte stream that takes ``accepted`` writes, then never finishes one (a peer that stopped reading)."""

    def __init__(self, accepted: int) -> None:
        self.accepted = accepted
        self.written: list[bytes] = []
        self.aborted = False

    async def read(self) -> bytes:
        await asyncio.get_running_loop().create_future()
        return b""

    async def write(self, data: bytes | memoryview) -> None:
        if len(self.written) >= self.accepted:
            await asyncio.get_running_loop().create_future()
        self.written.append(bytes(data))

    def write_eof(self) -> None:
        pass

    def abort(self) -> None:
        self.aborted = True

    async def aclose(self) -> None:
        pass


async def test_a_write_the_peer_never_takes_fails_the_session_after_the_idle_timeout() -> None:
    stream = StallingStream(accepted=0)
    session = Http2Session(Http2ClientConnection(), stream, idle_timeout=0.05, name="test")
    async with asyncio.timeout(2):
        await session.flush()  # the preface and SETTINGS
    assert session.broken and session.closed


async def test_each_write_has_the_whole_idle_timeout_and_a_stalled_one_still_fails() -> None:
    stream = StallingStream(accepted=3)
    conn = Http2ClientConnection()
    session = Http2Session(conn, stream, idle_timeout=0.2, name="test")
    loop = asyncio.get_running_loop()
    started = loop.time()
    for _ in range(3):  # quick writes, spread over more than one idle_timeout in all
        await session.flush()
        conn.ping(b"12345678")
        await asyncio.sleep(0.08)
    assert not session.broken and len(stream.written) == 3
    async with asyncio.timeout(2):
        await session.flush()  # the fourth stalls
    assert session.broken
    assert loop.time() - started >= 0.2 + 3 * 0.08


class FedStream(StallingStream):
    """A byte stream whose reads return what the test puts in ``incoming``, and that takes every write."""

    def __init__(self) -> None:
        super().__init__(accepted=1_000_000)
        self.incoming: asyncio.Queue[bytes] = asyncio.Queue()

    async def read(self) -> bytes:
        return await self.incoming.get()


def _peer_frames() -> tuple[bytes, Http2ServerConnection]:
    peer = Http2ServerConnection()
    return peer.data_to_send(), peer


async def test_a_reader_with_no_stream_open_ends_the_session_when_the_peer_is_idle_for_idle_timeout() -> None:
    stream = FedStream()
    session = Http2Session(Http2ClientConnection(), stream, idle_timeout=0.2, name="test")
    settings, peer = _peer_frames()
    loop = asyncio.get_running_loop()
    started = loop.time()
    reader = asyncio.create_task(session.run())
    stream.incoming.put_nowait(settings)
    for _ in range(4):  # reads spread over more than one idle_timeout: each has the whole of it
        await asyncio.sleep(0.1)
        assert not reader.done()
        peer.ping(b"12345678")
        stream.incoming.put_nowait(peer.data_to_send())
    async with asyncio.timeout(2):
        await reader
    assert session.closed and not session.broken
    assert loop.time() - started >= 4 * 0.1 + 0.2


async def test_a_reader_with_a_stream_open_waits_past_idle_timeout_and_is_bounded_again_once_it_closes() -> None:
    stream = FedStream()
    session = Http2Session(Http2ClientConnection(), stream, idle_timeout=0.1, name="test")
    settings, peer = _peer_frames()
    session.open_channel(1)
    reader = asyncio.create_task(session.run())
    stream.incoming.put_nowait(settings)
    await asyncio.sleep(0.35)
    assert not reader.done() and not session.closed
    session.close_channel(1)
    peer.ping(b"12345678")
    stream.incoming.put_nowait(peer.data_to_send())
    async with asyncio.timeout(2):
        await reader
    assert session.closed and not session.broken
