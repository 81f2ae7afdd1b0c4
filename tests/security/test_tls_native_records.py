"""The TLS record path in C (:mod:`ambit.tls.native_transport`, ``ambit.native._tls_records``) held to what the
pure-Python path does, against peers that misbehave and under any chunking of writes and reads.

Tests that take ``records_path`` run on both paths (the fallback must keep the same behaviour); the tests of the C
object itself run where it is built, and under CI (``CI=true``) a missing build fails instead of skipping.
"""

from __future__ import annotations

import asyncio
import contextlib
import hashlib
import os
import socket
import ssl
import struct
from pathlib import Path

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st
from tests.security.tls_peers import (
    Certs,
    Sink,
    hand_handshake,
    make_certs,
    served,
    socket_pair,
    tcp_pair,
)

from ambit import native
from ambit.tls import contexts
from ambit.tls.contexts import context_options, libssl_verify_mode
from ambit.tls.native_transport import NativeTlsSocketTransport
from ambit.tls.socket_transport import TlsSocketTransport

pytestmark = pytest.mark.usefixtures("no_peer_traceback")

MIB = 1024 * 1024
EXCHANGE_EXAMPLES = int(os.environ.get("AMBIT_EXCHANGE_EXAMPLES", "25"))
"""Hypothesis examples of the write/read exchange (the sanitizer run, ``test_native_sanitizers.py``, asks for few)."""


@pytest.fixture(scope="module")
def shared_certs(tmp_path_factory: pytest.TempPathFactory) -> Certs:
    """One set for every hypothesis example (a fixture per example would be remade for nothing)."""
    return asyncio.run(make_certs(tmp_path_factory.mktemp("native-records")))


def test_ci_runs_the_native_path_not_the_fallback_alone() -> None:
    module, reason = native.load_tls_records()
    if os.environ.get("CI") != "true":
        pytest.skip("outside CI a missing build only skips the native tests")
    assert module is not None, f"CI=true and the native accelerator cannot be used: {reason}"


async def test_each_record_path_gives_the_transport_it_names(certs: Certs, records_path: str) -> None:
    peer, transport = await socket_pair(certs, Sink(), Sink())
    expected = NativeTlsSocketTransport if records_path == "native" else TlsSocketTransport
    assert type(transport) is expected and type(peer) is expected
    transport.abort()
    peer.abort()


async def test_a_close_without_close_notify_between_records_fails_the_connection(
    certs: Certs, records_path: str
) -> None:
    loop = asyncio.get_running_loop()
    client, server = await tcp_pair()
    protocol = Sink()
    serving = loop.create_task(served(certs, server, protocol))
    try:
        tls, outgoing = await hand_handshake(client, certs.client.client_context())
        await serving
        tls.write(b"all of it")
        await loop.sock_sendall(client, outgoing.read())
        await protocol.reached(9)
        client.shutdown(socket.SHUT_WR)  # a FIN after a whole record, and no close_notify
        async with asyncio.timeout(5):
            exc = await protocol.lost
        assert isinstance(exc, ssl.SSLError), exc
        assert bytes(protocol.received) == b"all of it"
        assert not protocol.eof, "a truncated stream was taken for an orderly close"
    finally:
        client.close()


async def test_a_flood_of_one_byte_records_arrives_in_order_in_few_callbacks(certs: Certs, records_path: str) -> None:
    loop = asyncio.get_running_loop()
    client, server = await tcp_pair()
    protocol = Sink()
    serving = loop.create_task(served(certs, server, protocol))
    records = 20_000
    message = bytes(i % 251 for i in range(records))
    callbacks = 0
    counted = protocol.data_received

    def data_received(data: bytes) -> None:
        nonlocal callbacks
        callbacks += 1
        counted(data)

    protocol.data_received = data_received  # type: ignore[method-assign]
    try:
        tls, outgoing = await hand_handshake(client, certs.client.client_context())
        await serving
        for i in range(records):
            tls.write(message[i : i + 1])
        await loop.sock_sendall(client, outgoing.read())
        async with asyncio.timeout(10):
            await protocol.reached(records)
        assert protocol.digest.digest() == hashlib.sha256(message).digest()
        assert callbacks < records // 10, f"{callbacks} callbacks for {records} records"
        assert not protocol.lost.done()
    finally:
        client.close()


async def test_a_peer_that_resets_while_we_write_fails_the_connection_quietly(certs: Certs, records_path: str) -> None:
    loop = asyncio.get_running_loop()
    client, server = await tcp_pair()
    protocol = Sink()
    serving = loop.create_task(served(certs, server, protocol))
    await hand_handshake(client, certs.client.client_context())
    transport = await serving
    client.setsockopt(socket.SOL_SOCKET, socket.SO_LINGER, struct.pack("ii", 1, 0))
    client.close()  # an RST: what we write next is refused by the kernel
    async with asyncio.timeout(5):
        while not protocol.lost.done():
            await protocol.writable.wait()
            transport.write(b"r" * 65536)
            await asyncio.sleep(0.01)
        exc = await protocol.lost
    assert isinstance(exc, OSError), exc
    transport.write(b"after the end")  # ignored, as asyncio's transports do once closing


class PausingSink(Sink):
    """Pauses its reading after every ``every`` bytes and resumes on the next loop iteration: a reader whose pace
    cuts the stream wherever hypothesis likes."""

    def __init__(self, every: int) -> None:
        super().__init__()
        self._every, self._since = every, 0

    def data_received(self, data: bytes) -> None:
        super().data_received(data)
        self._since += len(data)
        if self._since >= self._every and self.transport is not None:
            self._since = 0
            self.transport.pause_reading()
            asyncio.get_running_loop().call_soon(self.transport.resume_reading)


async def _exchange(certs: Certs, sizes: list[list[int]], every: int, high: int) -> None:
    ends = [PausingSink(every), PausingSink(every)]
    transports = await socket_pair(certs, ends[0], ends[1])
    sent = [hashlib.sha256(), hashlib.sha256()]
    totals = [0, 0]

    async def send(index: int) -> None:
        transport = transports[index]
        transport.set_write_buffer_limits(high=high)
        for step, size in enumerate(sizes[index]):
            chunk = bytes([(step * 7 + index) % 256]) * size
            await ends[index].writable.wait()
            transport.write(chunk)
            sent[index].update(chunk)
            totals[index] += size

    async with asyncio.timeout(30):
        await asyncio.gather(send(0), send(1))
        await asyncio.gather(ends[1].reached(totals[0]), ends[0].reached(totals[1]))
        transports[0].close()
        lost = await asyncio.gather(*(end.lost for end in ends))
    assert ends[1].digest.digest() == sent[0].digest() and ends[1].count == totals[0]
    assert ends[0].digest.digest() == sent[1].digest() and ends[0].count == totals[1]
    assert lost == [None, None] and ends[1].eof


_SIZES = st.lists(st.one_of(st.integers(1, 64), st.integers(1, 70_000), st.sampled_from([16384, 16385, 262144])))


@settings(max_examples=EXCHANGE_EXAMPLES, suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(
    sizes=st.lists(_SIZES, min_size=2, max_size=2),
    every=st.sampled_from([1, 1000, 16384, 100_000, 1 << 30]),
    high=st.sampled_from([0, 1024, 65536, 1 << 20]),
)
def test_bytes_out_equal_bytes_in_under_any_chunking_of_writes_and_reads(
    shared_certs: Certs, records_path: str, sizes: list[list[int]], every: int, high: int
) -> None:
    asyncio.run(_exchange(shared_certs, sizes, every, high))


# The C object itself: what it refuses, and that no call touches the SSL once it is closed.


async def _records_for(certs: Certs, tls_records: object) -> tuple[object, ssl.SSLSocket, socket.socket]:
    """A Records on the server end of a finished handshake, the SSLSocket and the raw client socket."""
    loop = asyncio.get_running_loop()
    client, server = await tcp_pair()
    server.setblocking(False)
    tls = certs.server.server_context().wrap_socket(server, server_side=True, do_handshake_on_connect=False)
    handshaking = loop.create_task(hand_handshake(client, certs.client.client_context()))
    while not handshaking.done():
        with contextlib.suppress(ssl.SSLWantReadError, ssl.SSLWantWriteError):
            tls.do_handshake()
        await asyncio.sleep(0.005)
    await handshaking
    context = tls.context
    records = tls_records.Records(  # type: ignore[attr-defined]
        tls, tls._sslobj, context, int(context.options), libssl_verify_mode(context)
    )
    return records, tls, client


async def test_read_limits_out_of_range_are_refused_before_any_use(certs: Certs, tls_records: object) -> None:
    records, tls, client = await _records_for(certs, tls_records)
    try:
        for limit in (0, -1, 16 * MIB + 1, 1 << 62):
            with pytest.raises(ValueError, match="read limit"):
                records.read(limit)  # type: ignore[attr-defined]
        with pytest.raises(OverflowError):
            records.read(1 << 80)  # type: ignore[attr-defined]
        data, status, error = records.read(1)  # type: ignore[attr-defined]
        assert (data, status, error) == (None, tls_records.READ_AGAIN, None)  # type: ignore[attr-defined]
        with pytest.raises(TypeError):
            records.write("text is no buffer")  # type: ignore[attr-defined]
    finally:
        records.close()  # type: ignore[attr-defined]
        tls.close()
        client.close()


async def test_no_call_touches_the_ssl_once_closed(certs: Certs, tls_records: object) -> None:
    records, tls, client = await _records_for(certs, tls_records)
    records.close()  # type: ignore[attr-defined]
    records.close()  # type: ignore[attr-defined]  # twice is fine
    calls = (lambda: records.read(1024), lambda: records.write(b"x"), records.flush, records.shutdown, records.pending)  # type: ignore[attr-defined]
    for call in calls:
        with pytest.raises(ValueError, match="closed"):
            call()
    assert records.held == 0  # type: ignore[attr-defined]
    tls.close()
    client.close()


async def test_a_socket_closed_under_the_records_is_an_error_not_a_stale_descriptor(
    certs: Certs, tls_records: object
) -> None:
    records, tls, client = await _records_for(certs, tls_records)
    tls.close()  # the descriptor may now be any other file's: the records must not use it
    try:
        calls = (lambda: records.read(1024), lambda: records.write(b"x"), records.flush, records.pending)  # type: ignore[attr-defined]
        for call in calls:
            with pytest.raises(OSError, match="closed under"):
                call()
    finally:
        records.close()  # type: ignore[attr-defined]
        client.close()


async def test_objects_that_are_not_one_sslsocket_its_ssl_object_and_its_context_are_refused(
    certs: Certs, tls_records: object, tmp_path: Path
) -> None:
    Records = tls_records.Records  # type: ignore[attr-defined]
    _, tls, client = await _records_for(certs, tls_records)
    context = tls.context
    other = certs.client.client_context()
    options, mode = int(context.options), libssl_verify_mode(context)
    try:
        with pytest.raises(TypeError):
            Records(client, tls._sslobj, context, options, mode)  # type: ignore[attr-defined]
        with pytest.raises(TypeError):
            Records(tls, object(), context, options, mode)
        with pytest.raises(TypeError):
            Records(tls, tls._sslobj, object(), options, mode)  # type: ignore[attr-defined]
        with pytest.raises(ValueError):  # another context than the socket's
            Records(tls, tls._sslobj, other, int(other.options), libssl_verify_mode(other))  # type: ignore[attr-defined]
        with pytest.raises(ValueError):  # the context's own, but the options do not match what libssl reports
            Records(tls, tls._sslobj, context, options ^ ssl.OP_NO_COMPRESSION, mode)  # type: ignore[attr-defined]
    finally:
        tls.close()
        client.close()


@pytest.mark.parametrize("mode", [ssl.CERT_NONE, ssl.CERT_OPTIONAL, ssl.CERT_REQUIRED])
def test_the_checks_per_connection_read_what_ssl_and_libssl_report(mode: ssl.VerifyMode) -> None:
    """The options and verify mode ``attach_records`` hands the C checks, read past ``ssl``'s enums, are the ones
    ``ssl`` reports and the ones libssl reports for the ``SSL_CTX *`` (a context of each verify mode)."""
    context = ssl.SSLContext(ssl.PROTOCOL_TLS_SERVER)
    context.verify_mode = mode
    context.options |= ssl.OP_NO_TICKET
    found = contexts._ctx_handle(context)
    assert found is not None, "this Python's _ssl cannot be reached: nothing to check"
    lib, handle = found
    assert context_options(context) == int(context.options) == lib.get_options(handle)
    assert libssl_verify_mode(context) == lib.get_verify_mode(handle)
    assert libssl_verify_mode(context) == {ssl.CERT_NONE: 0, ssl.CERT_OPTIONAL: 1, ssl.CERT_REQUIRED: 3}[mode]
