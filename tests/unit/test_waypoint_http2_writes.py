"""The waypoint's HTTP/2 session bounds every write by ``idle_timeout`` (ambit.waypoint.http2 rule 1), with one
timer for many writes: a peer that stops taking bytes fails the session, however many writes went before."""

from __future__ import annotations

import asyncio

from ambit.hbone.messages import Http2ClientConnection
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
