"""The native transport's C read callback (``ambit.native._tls_records.ReadPump``): while the protocol has a feed
(the HBONE session's DataPath) the loop calls it instead of ``_read_ready``; its steady state runs no Python frame
and everything else goes back to the transport from the exact point reached, with no byte lost or reordered.

Run where the extension is built (under CI, ``CI=true``, a missing build fails instead of skipping).
"""

from __future__ import annotations

import asyncio
import gc
import logging
import sys
import weakref
from collections.abc import Callable

import pytest
from tests.security.tls_peers import Certs, Sink, socket_pair

from ambit.tls.native_transport import NativeTlsSocketTransport
from ambit.tls.socket_transport import READ_SIZE, TlsSocketTransport


class Feed:
    """Takes ``take(len(data))`` octets of each read; remembers who called it and what it took."""

    def __init__(self, take: Callable[[int], int] = lambda n: n) -> None:
        self.taken = bytearray()
        self.callers: set[str] = set()
        self.calls = 0
        self._take = take
        self.arrived = asyncio.Event()

    def __call__(self, data: bytes) -> int:
        self.calls += 1
        self.callers.add(sys._getframe(1).f_code.co_name)
        n = self._take(len(data))
        self.taken += data[:n]
        self.arrived.set()
        return n


class Ordered(Sink):
    """A protocol that appends what reaches ``data_received`` to the same buffer as the feed (order is checked)."""

    def __init__(self, both: bytearray) -> None:
        super().__init__()
        self.both = both

    def data_received(self, data: bytes) -> None:
        self.both += data
        super().data_received(data)


async def _pair(certs: Certs, protocol: Sink) -> tuple[TlsSocketTransport, NativeTlsSocketTransport]:
    client, server = await socket_pair(certs, Sink(), protocol)
    assert isinstance(server, NativeTlsSocketTransport)
    return client, server


async def _until(predicate: Callable[[], bool], what: str) -> None:
    """Poll ``predicate`` (what it watches has no event of its own), for 10 s at most."""
    for _ in range(2000):
        if predicate():
            return
        await asyncio.sleep(0.005)
    raise AssertionError(f"not within 10 s: {what}")


async def test_the_steady_state_runs_no_python_read_callback(certs: Certs, tls_records: object) -> None:
    client, server = await _pair(certs, Sink())
    feed = Feed()
    server.set_data_path(feed)
    after_read = 0
    original = server._after_read

    def counting(*args: object) -> None:
        nonlocal after_read
        after_read += 1
        original(*args)  # type: ignore[arg-type]

    server._after_read = counting  # type: ignore[method-assign]
    message = b""
    for i in range(50):
        chunk = bytes([i]) * (1 + i * 37)
        message += chunk
        client.write(chunk)
        expected = len(message)
        await _until(lambda: len(feed.taken) == expected, "every octet reached the feed")  # noqa: B023
    assert bytes(feed.taken) == message
    assert "_read_ready" not in feed.callers, feed.callers  # the loop called the pump, not the Python callback
    assert after_read == 0, "the steady state went back to Python"
    client.abort()
    server.abort()


@pytest.mark.parametrize("take", [0, 1, 7, 100], ids=["none", "one", "seven", "hundred"])
async def test_what_the_feed_leaves_reaches_data_received_in_order(
    certs: Certs, tls_records: object, take: int
) -> None:
    both = bytearray()
    protocol = Ordered(both)
    client, server = await _pair(certs, protocol)
    feed = Feed(lambda n: min(n, take))
    original = feed.__call__

    def into_both(data: bytes) -> int:
        n = original(data)
        both.extend(data[:n])
        return n

    server.set_data_path(into_both)
    message = bytes(i % 253 for i in range(200_000))
    for start in range(0, len(message), 9_999):
        client.write(message[start : start + 9_999])
    await _until(lambda: len(both) == len(message), "every octet arrived once")
    assert bytes(both) == message
    client.abort()
    server.abort()


async def test_a_feed_that_raises_fails_the_connection_with_its_traceback_logged(
    certs: Certs, tls_records: object, caplog: pytest.LogCaptureFixture
) -> None:
    protocol = Sink()
    client, server = await _pair(certs, protocol)

    def broken(data: bytes) -> int:
        raise RuntimeError("the sink's bug")

    server.set_data_path(broken)
    with caplog.at_level(logging.ERROR, logger="ambit"):
        client.write(b"anything")
        async with asyncio.timeout(5):
            exc = await protocol.lost
    assert isinstance(exc, RuntimeError), exc
    failures = [r for r in caplog.records if "data_received failed" in r.getMessage()]
    assert failures, [r.getMessage() for r in caplog.records]
    assert failures[0].exc_info is not None and failures[0].exc_info[1] is exc  # as an except clause logs it
    assert server._read_pump is None  # the transport finished: the pump (which holds it) is let go
    client.abort()


async def test_pausing_resuming_and_the_peer_s_close_go_through_the_transport(
    certs: Certs, tls_records: object
) -> None:
    protocol = Sink()
    client, server = await _pair(certs, protocol)
    feed = Feed()
    server.set_data_path(feed)
    client.write(b"a" * 1000)
    await _until(lambda: len(feed.taken) == 1000, "the first write")
    server.pause_reading()
    client.write(b"b" * 1000)
    await asyncio.sleep(0.1)
    assert len(feed.taken) == 1000, "a paused transport read"
    server.resume_reading()
    await _until(lambda: len(feed.taken) == 2000, "the write held while paused")
    assert bytes(feed.taken) == b"a" * 1000 + b"b" * 1000
    client.close()  # close_notify: the read's EOF status goes to the transport, which tells the protocol
    async with asyncio.timeout(5):
        await protocol.lost
    assert protocol.eof
    server.abort()


async def test_setting_no_feed_gives_the_reads_back_to_the_transport_s_own_callback(
    certs: Certs, tls_records: object
) -> None:
    both = bytearray()
    protocol = Ordered(both)
    client, server = await _pair(certs, protocol)
    feed = Feed()
    server.set_data_path(feed)
    client.write(b"to the feed")
    await _until(lambda: bytes(feed.taken) == b"to the feed", "the feed's part")
    server.set_data_path(None)
    assert server._read_pump is None
    client.write(b"to the protocol")
    await _until(lambda: bytes(both) == b"to the protocol", "the protocol's part")
    assert bytes(feed.taken) == b"to the feed"
    client.abort()
    server.abort()


async def test_a_finished_transport_is_freed_without_the_collector(certs: Certs, tls_records: object) -> None:
    protocol = Sink()
    client, server = await _pair(certs, protocol)
    server.set_data_path(Feed())
    ref = weakref.ref(server)
    gc.disable()
    try:
        server.abort()
        client.abort()
        async with asyncio.timeout(5):
            await protocol.lost
        await asyncio.sleep(0)
        protocol.transport = None
        del server
        await asyncio.sleep(0.01)
        assert ref() is None, [type(r).__name__ for r in gc.get_referrers(ref())]
    finally:
        gc.enable()


async def test_a_pump_refuses_what_it_cannot_use(certs: Certs, tls_records: object) -> None:
    client, server = await _pair(certs, Sink())
    pump_type = tls_records.ReadPump  # type: ignore[attr-defined]
    records = server._records
    with pytest.raises(TypeError):
        pump_type(server, object(), len, READ_SIZE)  # not a Records
    with pytest.raises(TypeError):
        pump_type(server, records, "not callable", READ_SIZE)
    for limit in (0, -1, 1 << 30):
        with pytest.raises(ValueError):
            pump_type(server, records, len, limit)
    with pytest.raises(TypeError):
        pump_type(server, records, len, "65536")
    pump = pump_type(server, records, len, READ_SIZE)
    with pytest.raises(TypeError):
        pump(1)
    client.abort()
    server.abort()


@pytest.mark.parametrize("loop_kind", ["asyncio", "uvloop"])
def test_the_data_paths_callback_takes_over_the_registration_without_dropping_it(
    certs: Certs, tls_records: object, loop_kind: str
) -> None:
    """Swapping the read callback keeps the descriptor registered (no ``remove_reader``), and the loop then calls
    the new one, then the old one again once the feed is gone: on both event loops."""
    if loop_kind == "uvloop":
        uvloop = pytest.importorskip("uvloop")
        loop = uvloop.new_event_loop()
    else:
        loop = asyncio.SelectorEventLoop()

    async def run() -> None:
        client, server = await _pair(certs, Sink())
        calls: list[str] = []
        for name in ("add_reader", "remove_reader"):
            method = getattr(server._loop, name)

            def recording(*args: object, _name: str = name, _method: Callable[..., object] = method) -> object:
                calls.append(_name)
                return _method(*args)

            setattr(server._loop, name, recording)
        try:
            feed = Feed()
            server.set_data_path(feed)
            assert calls == ["add_reader"]
            client.write(b"x" * 100)
            await _until(lambda: len(feed.taken) == 100, "the feed took the bytes")
            server.set_data_path(None)
            assert calls == ["add_reader", "add_reader"]
            client.write(b"y" * 10)
            await _until(lambda: server._protocol.received.endswith(b"y" * 10), "the protocol got the rest")
        finally:
            for name in ("add_reader", "remove_reader"):
                delattr(server._loop, name)
            client.abort()
            server.abort()

    try:
        loop.run_until_complete(run())
    finally:
        loop.close()
