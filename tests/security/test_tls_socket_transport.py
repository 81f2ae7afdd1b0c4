"""TLS on the socket itself (:mod:`ambit.tls.socket_transport`) against peers that misbehave, over real loopback
sockets with the HBONE contexts of one local CA.

The hostile peer is a hand-driven TLS client (an ``SSLObject`` over memory BIOs on a raw socket), so it can stop
anywhere: in the middle of its handshake, in the middle of a record, or send bytes that are no record at all. Each
failure must end the connection on our side with the peer blamed (``connection_lost`` with the error, one debug
line), never a traceback, and never an end of stream mistaken for a clean one. Bulk transfers check the flow-control
contract (memory bounded by the write-buffer limits against a peer that never reads) and byte-for-byte delivery,
against the loop's own TLS transport as well as our own. Every test runs on both record paths of the transport (the
``records_path`` fixture: pure Python, and the C of :mod:`ambit.tls.native_transport`).
"""

from __future__ import annotations

import asyncio
import gc
import hashlib
import os
import socket
import ssl
import struct
import time
from pathlib import Path

import pytest
from tests.security.tls_peers import (
    CLIENT,
    TD,
    Certs,
    Sink,
    hand_handshake,
    served,
    socket_pair,
    tcp_pair,
    tls_end,
)

from ambit.identity.localca import LocalCa
from ambit.tls import contexts, socket_handshake
from ambit.tls.socket_handshake import open_tls
from ambit.tls.socket_transport import READ_AHEAD_BUFFER, TlsTransportKind
from ambit.tls.spiffe import check_peer

# Every test on both record paths (Python and C), and no traceback for a peer's failure.
pytestmark = pytest.mark.usefixtures("records_path", "no_peer_traceback")

MIB = 1024 * 1024


async def test_a_handshake_trickled_a_byte_at_a_time_ends_at_the_deadline_from_its_start(certs: Certs) -> None:
    loop = asyncio.get_running_loop()
    client, server = await tcp_pair()
    hello_bio = ssl.MemoryBIO()
    hello_maker = certs.client.client_context().wrap_bio(ssl.MemoryBIO(), hello_bio)
    with pytest.raises(ssl.SSLWantReadError):
        hello_maker.do_handshake()
    hello = hello_bio.read()

    async def trickle() -> None:
        for byte in hello:
            await loop.sock_sendall(client, bytes([byte]))
            await asyncio.sleep(0.02)  # each byte well within the deadline, the whole far beyond it

    trickling = loop.create_task(trickle())
    started = time.monotonic()
    try:
        with pytest.raises(TimeoutError):
            await open_tls(Sink, server, certs.server.server_context(), server_side=True, handshake_timeout=0.5)
        assert 0.45 < time.monotonic() - started < 2.0
        assert server.fileno() == -1  # ours to close, and closed
        with pytest.raises(OSError):
            async with asyncio.timeout(2):
                while await loop.sock_recv(client, 4096):
                    pass
                raise ConnectionResetError("closed")  # an orderly close counts as well
    finally:
        trickling.cancel()
        await asyncio.gather(trickling, return_exceptions=True)
        client.close()


async def test_a_peer_closing_in_the_middle_of_a_record_fails_the_connection_and_delivers_nothing_of_it(
    certs: Certs,
) -> None:
    loop = asyncio.get_running_loop()
    client, server = await tcp_pair()
    protocol = Sink()
    serving = loop.create_task(served(certs, server, protocol))
    try:
        tls, outgoing = await hand_handshake(client, certs.client.client_context())
        transport = await serving
        tls.write(b"whole record")
        await loop.sock_sendall(client, outgoing.read())
        tls.write(b"x" * 10_000)
        record = outgoing.read()
        await loop.sock_sendall(client, record[: len(record) // 2])
        client.shutdown(socket.SHUT_WR)  # a FIN with no close_notify, half a record in
        async with asyncio.timeout(5):
            exc = await protocol.lost
        assert isinstance(exc, ssl.SSLError), exc
        assert bytes(protocol.received) == b"whole record"
        assert not protocol.eof, "a truncated stream was taken for an orderly close"
        assert transport.is_closing()
    finally:
        client.close()


@pytest.mark.parametrize(
    "garbage",
    [b"GET / HTTP/1.1\r\nHost: x\r\n\r\n", b"\x17\x03\x03\x00\x20" + b"\x00" * 32, b"\x17\x03\x03\xff\xff"],
    ids=["http-text", "a-forged-record", "an-oversized-record-header"],
)
async def test_bytes_that_are_no_record_fail_the_connection(certs: Certs, garbage: bytes) -> None:
    loop = asyncio.get_running_loop()
    client, server = await tcp_pair()
    protocol = Sink()
    serving = loop.create_task(served(certs, server, protocol))
    try:
        await hand_handshake(client, certs.client.client_context())
        await serving
        await loop.sock_sendall(client, garbage + b"\x00" * 20_000)
        async with asyncio.timeout(5):
            exc = await protocol.lost
        assert isinstance(exc, ssl.SSLError), exc
        assert protocol.received == b"" and not protocol.eof
    finally:
        client.close()


async def test_a_peer_of_another_mesh_gets_no_transport_on_either_side(certs: Certs, tmp_path: Path) -> None:
    """Each refuses the other's chain (the mutual-TLS suites run the one-sided cases over this transport too)."""
    stranger = await LocalCa(tmp_path / "other-ca", trust_domain=TD).fetch_certificate(CLIENT)
    client, server = await tcp_pair()
    serving = asyncio.get_running_loop().create_task(served(certs, server, Sink()))
    try:
        with pytest.raises((ssl.SSLError, ConnectionError)):
            await open_tls(Sink, client, stranger.client_context(), server_side=False, handshake_timeout=5)
        with pytest.raises(ssl.SSLError, match="unknown ca"):  # the stranger's alert: it did not trust us either
            await serving
    finally:
        client.close()


async def test_a_peer_that_never_reads_holds_no_more_than_the_write_buffer_limit(certs: Certs) -> None:
    client, server = await tcp_pair()
    for sock in (client, server):  # small kernel buffers: the transport's own limit is what is measured
        sock.setsockopt(socket.SOL_SOCKET, socket.SO_SNDBUF, 64 * 1024)
        sock.setsockopt(socket.SOL_SOCKET, socket.SO_RCVBUF, 64 * 1024)
    reader = Sink(read=False)
    writer = Sink()
    loop = asyncio.get_running_loop()
    opening = loop.create_task(
        open_tls(lambda: reader, client, certs.client.client_context(), server_side=False, handshake_timeout=5)
    )
    transport = await served(certs, server, writer)
    peer, _ = await opening
    transport.set_write_buffer_limits(high=256 * 1024)
    piece = b"m" * MIB
    written = 0
    largest = 0
    try:
        async with asyncio.timeout(2):
            while written < 64 * MIB:
                await writer.writable.wait()
                transport.write(piece)
                written += len(piece)
                largest = max(largest, transport.get_write_buffer_size())
    except TimeoutError:
        pass
    assert writer.paused_writing == 1 and writer.resumed_writing == 0
    assert written <= 4 * MIB, "the writer was never held back"
    # The limit plus the one write that crossed it (encrypted, on the C path: 22 octets per 16 KiB record more).
    assert largest <= 256 * 1024 + MIB + MIB // 16384 * 22
    assert not reader.lost.done() and not writer.lost.done()
    peer.resume_reading()  # the reader wakes: everything arrives and the writer resumes
    async with asyncio.timeout(10):
        await writer.writable.wait()
        await reader.reached(written)
    assert writer.resumed_writing == 1
    assert reader.digest.digest() == hashlib.sha256(piece * (written // MIB)).digest()
    transport.abort()
    peer.abort()
    await asyncio.gather(reader.lost, writer.lost)


@pytest.mark.parametrize(("client_kind", "server_kind"), [("socket", "socket"), ("socket", "loop"), ("loop", "socket")])
async def test_sixty_four_mebibytes_each_way_arrive_byte_for_byte_and_close_cleanly(
    certs: Certs, client_kind: TlsTransportKind, server_kind: TlsTransportKind
) -> None:
    client, server = await tcp_pair()
    ends = [Sink(), Sink()]
    loop = asyncio.get_running_loop()
    opening = loop.create_task(tls_end(client_kind, client, certs.client.client_context(), ends[0], server_side=False))
    server_transport = await tls_end(server_kind, server, certs.server.server_context(), ends[1], server_side=True)
    transports = [await opening, server_transport]
    sizes = [65536 * 3 + 17, MIB + 5, 1500, 256 * 1024]  # records cut every way

    async def send(index: int) -> bytes:
        transport, protocol = transports[index], ends[index]
        digest = hashlib.sha256()
        sent, step = 0, index
        while sent < 64 * MIB:
            size = min(sizes[step % len(sizes)], 64 * MIB - sent)
            chunk = bytes([(sent // 4096 + index) % 256]) * size
            await protocol.writable.wait()
            transport.write(chunk)
            digest.update(chunk)
            sent += size
            step += 1
        return digest.digest()

    async with asyncio.timeout(120):
        digests = await asyncio.gather(send(0), send(1))
        await asyncio.gather(*(end.reached(64 * MIB) for end in ends))
        transports[0].close()  # close_notify after the flush; the server hears a clean end
        lost = await asyncio.gather(*(end.lost for end in ends))
    assert ends[1].digest.digest() == digests[0]
    assert ends[0].digest.digest() == digests[1]
    assert ends[1].eof, "the server did not hear an orderly close"
    assert lost == [None, None]


@pytest.mark.parametrize("read_ahead", [READ_AHEAD_BUFFER, 0], ids=["context-reads-ahead", "per-connection"])
async def test_records_read_ahead_in_one_system_call_are_all_delivered_without_more_input(
    certs: Certs, read_ahead: int
) -> None:
    """Two short records (and a third cut in two) arrive in one segment: OpenSSL, reading ahead, takes them all in
    one ``read``; the socket then has nothing to say, so whatever OpenSSL holds must be handed on without waiting
    for it. Read-ahead on for the whole context (HBONE's contexts for this transport) or turned on per connection
    (any other context)."""
    loop = asyncio.get_running_loop()
    client, server = await tcp_pair()
    protocol = Sink()
    serving = loop.create_task(served(certs, server, protocol, read_ahead=read_ahead))
    try:
        tls, outgoing = await hand_handshake(client, certs.client.client_context())
        transport = await serving
        assert _reads_ahead(transport.get_extra_info("ssl_object"))
        for message in (b"first", b"second", b"third"):
            tls.write(message)
        await loop.sock_sendall(client, outgoing.read())
        async with asyncio.timeout(5):
            await protocol.reached(len(b"firstsecondthird"))
        assert bytes(protocol.received) == b"firstsecondthird"
        assert not protocol.lost.done()
    finally:
        client.close()


def _reads_ahead(tls: ssl.SSLSocket) -> bool:
    """Whether OpenSSL reads ahead on this connection (``SSL_get_read_ahead``), asked of its ``SSL *``."""
    found = contexts._ctx_handle(tls.context)
    lib = contexts._libssl_connection()
    assert found is not None and lib is not None, "this Python's _ssl cannot be reached: nothing to check"
    handle = contexts._ssl_handle(tls, found[1])
    assert handle is not None
    return bool(lib.ctrl(handle, _SSL_CTRL_GET_READ_AHEAD, 0, None))


_SSL_CTRL_GET_READ_AHEAD = 40


async def test_a_context_made_for_the_transport_reads_ahead_with_no_step_per_connection(
    certs: Certs, monkeypatch: pytest.MonkeyPatch
) -> None:
    """HBONE's contexts for this transport have read-ahead on for every connection: none is set up per connection
    (the ctypes checks of ``read_ahead``), yet both ends read ahead, and bytes arrive both ways."""

    def per_connection(tls: ssl.SSLSocket, buffer_len: int) -> None:
        raise AssertionError("read-ahead set up per connection on a context that has it")

    monkeypatch.setattr(socket_handshake, "read_ahead", per_connection)
    client, server = Sink(), Sink()
    client_transport, server_transport = await socket_pair(certs, client, server)
    try:
        for transport in (client_transport, server_transport):
            assert contexts.reads_ahead(transport.get_extra_info("sslcontext"))
            assert _reads_ahead(transport.get_extra_info("ssl_object"))
        client_transport.write(b"ping")
        server_transport.write(b"pong")
        async with asyncio.timeout(5):
            await server.reached(4)
            await client.reached(4)
        assert (bytes(server.received), bytes(client.received)) == (b"ping", b"pong")
    finally:
        client_transport.abort()
        server_transport.abort()


async def test_records_held_by_openssl_are_delivered_when_what_it_holds_cannot_be_asked(
    certs: Certs, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A connection of a context reading ahead whose ``SSL_has_pending`` cannot be reached (its ``SSL *`` failed
    the checks): the Python records read until OpenSSL says ``WANT_READ``, so records it took in one ``read`` are
    not left waiting for a readiness the poller will not report. (The C records ask OpenSSL themselves.)"""
    monkeypatch.setattr(socket_handshake, "pending_probe", lambda tls: None)
    loop = asyncio.get_running_loop()
    client, server = await tcp_pair()
    protocol = Sink()
    serving = loop.create_task(served(certs, server, protocol))
    try:
        tls, outgoing = await hand_handshake(client, certs.client.client_context())
        await serving
        for message in (b"first", b"second", b"third"):
            tls.write(message)
        await loop.sock_sendall(client, outgoing.read())
        async with asyncio.timeout(5):
            await protocol.reached(len(b"firstsecondthird"))
        assert bytes(protocol.received) == b"firstsecondthird"
    finally:
        client.close()


async def test_a_rotated_certificate_or_trust_bundle_takes_effect_on_the_transports_contexts(
    certs: Certs, tmp_path: Path
) -> None:
    """Contexts for this transport are made per certificate, like the loop's: a successor certificate is the one
    presented on the next connection, and a certificate from a new CA (a new trust bundle) refuses the old CA's
    peer. A certificate dropped takes its context's read-ahead entry with it."""
    rotated = await LocalCa(tmp_path / "ca", trust_domain=TD).fetch_certificate(certs.server.identity)  # same CA
    assert rotated.chain_pem[0] != certs.server.chain_pem[0]
    client, server = Sink(), Sink()
    client_transport, server_transport = await socket_pair(Certs(certs.client, rotated), client, server)
    try:
        presented = client_transport.get_extra_info("ssl_object").getpeercert(binary_form=True)
        assert presented == ssl.PEM_cert_to_DER_cert(rotated.chain_pem[0].decode())
        assert server_transport.get_extra_info("sslcontext") is not certs.server.server_context(
            read_ahead=READ_AHEAD_BUFFER
        )
    finally:
        client_transport.abort()
        server_transport.abort()
    other_ca = await LocalCa(tmp_path / "other-ca", trust_domain=TD).fetch_certificate(CLIENT)
    client_sock, server_sock = await tcp_pair()
    try:
        refused, _ = await asyncio.gather(
            open_tls(
                Sink,
                client_sock,
                other_ca.client_context(read_ahead=READ_AHEAD_BUFFER),
                server_side=False,
                handshake_timeout=5,
            ),
            served(certs, server_sock, Sink()),
            return_exceptions=True,
        )
        assert isinstance(refused, ssl.SSLCertVerificationError), refused
    finally:
        client_sock.close()
        server_sock.close()
    entries = len(contexts._READS_AHEAD)
    del rotated, client_transport, server_transport, client, server
    gc.collect()
    assert len(contexts._READS_AHEAD) < entries


async def test_the_peer_certificate_is_decoded_on_demand_and_equals_the_eager_one(certs: Certs) -> None:
    """``peercert`` is not decoded per connection; asked for, on either end, before or after the close, it is what
    the ``SSLSocket`` decodes (and what the loop's transport gives, eagerly), naming the identity the DER names."""
    client, server = Sink(), Sink()
    client_transport, server_transport = await socket_pair(certs, client, server)
    try:
        ends = [(client_transport, certs.server.identity), (server_transport, certs.client.identity)]
        eager = []
        for transport, identity in ends:
            assert "peercert" not in transport._info, "decoded per connection"
            tls = transport.get_extra_info("ssl_object")
            eager.append(tls.getpeercert())
            assert transport.get_extra_info("peercert") == eager[-1]
            assert check_peer(tls.getpeercert(binary_form=True), trust_domain=TD, expected=None) == identity
            assert dict(eager[-1]["subjectAltName"])["URI"] == str(identity)
    finally:
        client_transport.abort()
        server_transport.abort()
    for transport, _ in ends:  # asked first after the close
        transport._info.pop("peercert")
        assert transport.get_extra_info("peercert") == eager.pop(0)
    loop_client, loop_server = Sink(), Sink()
    client_sock, server_sock = await tcp_pair()
    loop_ends = await asyncio.gather(
        tls_end("loop", client_sock, certs.client.client_context(), loop_client, server_side=False),
        tls_end("loop", server_sock, certs.server.server_context(), loop_server, server_side=True),
    )
    try:
        for (transport, _), loop_transport in zip(ends, loop_ends, strict=True):
            assert transport.get_extra_info("peercert") == loop_transport.get_extra_info("peercert")
    finally:
        for loop_transport in loop_ends:
            loop_transport.abort()


async def test_a_socket_that_is_not_connected_is_refused_and_closed(certs: Certs) -> None:
    sock = socket.socket()
    with pytest.raises(OSError) as raised:
        await open_tls(Sink, sock, certs.client.client_context(), server_side=False, handshake_timeout=5)
    assert not isinstance(raised.value, ssl.SSLError)
    assert sock.fileno() == -1


async def test_a_connection_reset_before_the_handshake_fails_with_its_descriptor_closed_at_once(certs: Certs) -> None:
    # wrap_socket takes the descriptor, then trips over the reset; the half-made SSLSocket is reachable only from the
    # exception's frames, which a caller (a log record, here pytest.raises) may keep for long.
    with socket.create_server(("127.0.0.1", 0)) as listener:
        client = socket.create_connection(listener.getsockname()[:2])
        server, _ = listener.accept()
    client.setsockopt(socket.SOL_SOCKET, socket.SO_LINGER, struct.pack("ii", 1, 0))
    client.close()  # an RST
    await asyncio.sleep(0.05)
    descriptor = os.fstat(server.fileno())
    with pytest.raises(OSError) as raised:
        await open_tls(Sink, server, certs.server.server_context(), server_side=True, handshake_timeout=5)
    assert not isinstance(raised.value, ssl.SSLError)
    assert server.fileno() == -1
    held = [f for f in os.listdir("/proc/self/fd") if _same_file(f"/proc/self/fd/{f}", descriptor)]
    assert held == [], "the reset connection's descriptor is still open"


async def test_a_failure_right_after_the_socket_is_wrapped_closes_its_descriptor_at_once(
    certs: Certs, monkeypatch: pytest.MonkeyPatch
) -> None:
    def failing(tls: ssl.SSLSocket, size: int) -> None:
        raise OSError("read-ahead refused")

    monkeypatch.setattr(socket_handshake, "read_ahead", failing)
    client, server = await tcp_pair()
    descriptor = os.fstat(client.fileno())
    with pytest.raises(OSError, match="read-ahead refused"):  # the context does not read ahead: per connection
        await open_tls(Sink, client, certs.client.client_context(), server_side=False, handshake_timeout=5)
    held = [f for f in os.listdir("/proc/self/fd") if _same_file(f"/proc/self/fd/{f}", descriptor)]
    assert held == []
    server.close()


def _same_file(path: str, stat: os.stat_result) -> bool:
    try:
        other = os.stat(path)
    except OSError:
        return False
    return (other.st_dev, other.st_ino) == (stat.st_dev, stat.st_ino)


@pytest.mark.parametrize("read_ahead", [READ_AHEAD_BUFFER, 0], ids=["context-reads-ahead", "per-connection"])
async def test_data_that_came_with_the_handshakes_last_flight_is_delivered_without_more_input(
    certs: Certs, read_ahead: int
) -> None:
    """The client's Finished and its first record arrive in one segment: reading ahead, the server's last handshake
    step takes both, so the transport must read what OpenSSL holds at once (the poller has nothing to report);
    when OpenSSL holds nothing, it waits for the poller."""
    loop = asyncio.get_running_loop()
    client, server = await tcp_pair()
    protocol = Sink()
    serving = loop.create_task(served(certs, server, protocol, read_ahead=read_ahead))
    try:
        tls, outgoing = await hand_handshake(client, certs.client.client_context())
        tls.write(b"early")
        await loop.sock_sendall(client, outgoing.read())  # Finished and the record, in one segment
        async with asyncio.timeout(5):
            await serving
            await protocol.reached(len(b"early"))
        assert bytes(protocol.received) == b"early"
    finally:
        client.close()


@pytest.mark.parametrize("given", [True, False], ids=["given", "asked"])
async def test_the_transport_reports_the_addresses_its_opener_already_had(certs: Certs, given: bool) -> None:
    """``open_tls(addresses=...)``: a caller that asked the socket already (the HBONE ends do) hands its answer on,
    and the transport reports it rather than asking the socket again; without it, the socket's own."""
    client_sock, server_sock = await tcp_pair()
    peer, local = client_sock.getpeername(), client_sock.getsockname()
    # Distinct from the socket's own when given: the transport must report what it was handed, not ask again.
    addresses = (("198.18.0.9", 15008), ("198.18.0.8", 40000)) if given else None
    server = Sink()
    serving = asyncio.get_running_loop().create_task(served(certs, server_sock, server))
    context = certs.client.client_context(read_ahead=READ_AHEAD_BUFFER)
    transport, _ = await open_tls(
        Sink, client_sock, context, server_side=False, handshake_timeout=5, addresses=addresses
    )
    server_transport = await serving
    try:
        expected = addresses if addresses is not None else (peer, local)
        assert (transport.get_extra_info("peername"), transport.get_extra_info("sockname")) == expected
        # The rest of asyncio's extra information is what the SSLSocket says.
        tls = transport.get_extra_info("ssl_object")
        assert transport.get_extra_info("sslcontext") is context is tls.context
        assert transport.get_extra_info("cipher") == tls.cipher() is not None
    finally:
        transport.abort()
        server_transport.abort()
