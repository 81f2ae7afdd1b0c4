"""HBONE over real mutual TLS on loopback: client pool → HboneServer → a handler relaying to a local TCP server."""

from __future__ import annotations

import asyncio
import dataclasses
import gc
import hashlib
import os
import socket
import struct
from collections.abc import AsyncIterator
from pathlib import Path

import pytest
from tests.integration.hbone_mesh import (
    CLIENT,
    CRASH_PORT,
    FACTORY,
    REJECT_PORTS,
    SERVER,
    SILENT_PORT,
    SMALL_BUFFER,
    TD,
    Mesh,
    echo,
    echo_once,
    read_all,
    until,
)

from ambit import native
from ambit.hbone import wire
from ambit.hbone.settings import HboneSettings
from ambit.identity.localca import LocalCa
from ambit.model.identity import SpiffeId
from ambit.proxy.drain import DrainSignal
from ambit.proxy.errors import ResponseFlag, StreamClosedError
from ambit.proxy.hbone_client import HboneClient, HboneConnectError, TunnelRefusedError
from ambit.proxy.hbone_session import ConnectionLostError
from ambit.proxy.pool import ConnectionPool
from ambit.proxy.sockets import connect
from ambit.tls.socket_transport import TlsTransportKind


@pytest.fixture
async def ca(tmp_path: Path) -> LocalCa:
    return LocalCa(tmp_path / "ca", trust_domain=TD)


@pytest.fixture
async def mesh(ca: LocalCa, tls_transport: TlsTransportKind) -> AsyncIterator[Mesh]:
    client_cert, server_cert = await asyncio.gather(ca.fetch_certificate(CLIENT), ca.fetch_certificate(SERVER))
    mesh = Mesh(ca, client_cert, server_cert)
    mesh.tls_transport = tls_transport
    await mesh.start()
    yield mesh
    await mesh.aclose()


async def test_one_tunnel_echoes_bytes_through_mutual_tls(mesh: Mesh) -> None:
    assert await echo_once(mesh, b"hello through hbone") == b"hello through hbone"
    stats = mesh.pool.stats()
    assert stats["connections"] == 1
    assert stats["streams"] == 0
    assert mesh.failures == []


async def test_the_native_transport_frames_and_parses_a_tunnels_data_in_c(mesh: Mesh) -> None:
    """On the native records the session runs the C data path (``ambit.native._hbone_data``), and only there: a
    silent fallback to the Python engine, or the C path on another transport, fails here."""
    stream = await mesh.open()
    try:
        data_path = stream._session.data_path
        assert (data_path is not None) == (native.selection().hbone_data is not None and mesh.tls_transport == "socket")
        payload = bytes(range(256)) * 64
        assert stream.write_nowait(payload)  # framed by the data path's send where there is one
        stream.write_eof()
        assert await read_all(stream) == payload
    finally:
        await stream.aclose()
    assert mesh.failures == []


async def test_fifty_concurrent_tunnels_share_one_connection(mesh: Mesh) -> None:
    payloads = [f"tunnel {i} ".encode() * (i + 1) for i in range(50)]
    replies = await asyncio.gather(*(echo_once(mesh, p) for p in payloads))
    assert replies == payloads
    assert mesh.connections_served == 1
    assert mesh.pool.stats()["connections"] == 1


async def test_one_hundred_fifty_concurrent_tunnels_spill_onto_two_connections(mesh: Mesh) -> None:
    streams = await asyncio.gather(*(mesh.open() for _ in range(150)))
    try:
        assert mesh.connections_served == 2
        assert mesh.pool.stats()["streams"] == 150
        for i, stream in enumerate(streams):
            await stream.write(b"%d" % i)
            stream.write_eof()
        replies = await asyncio.gather(*(read_all(s) for s in streams))
        assert replies == [b"%d" % i for i in range(150)]
    finally:
        for stream in streams:
            await stream.aclose()


async def test_half_close_works_both_ways_through_a_tunnel(mesh: Mesh) -> None:
    received = asyncio.get_running_loop().create_future()

    async def speaks_first_then_listens(reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        writer.write(b"greeting")
        writer.write_eof()  # upstream finished sending, still listening
        await writer.drain()
        received.set_result(await reader.read())

    mesh.upstream = speaks_first_then_listens
    stream = await mesh.open()
    assert await read_all(stream) == b"greeting"  # EOF reached the client while its side is still open
    await stream.write(b"late reply")
    stream.write_eof()
    assert await asyncio.wait_for(received, 10) == b"late reply"
    await stream.aclose()
    # And the usual order: the client half-closes first and still gets the whole answer.
    mesh.upstream = echo
    assert await echo_once(mesh, b"x" * 100_000) == b"x" * 100_000


async def test_an_upstream_reset_reaches_the_client_as_a_closed_stream(mesh: Mesh) -> None:
    async def resets(reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        await reader.readexactly(4)
        sock = writer.get_extra_info("socket")
        sock.setsockopt(socket.SOL_SOCKET, socket.SO_LINGER, b"\x01\x00\x00\x00\x00\x00\x00\x00")
        writer.transport.abort()

    mesh.upstream = resets
    stream = await mesh.open()
    await stream.write(b"ping")
    with pytest.raises(StreamClosedError):
        await asyncio.wait_for(read_all(stream), 10)
    with pytest.raises(StreamClosedError):
        await stream.write(b"more")
    stream.abort()  # idempotent after a peer reset


async def test_a_client_abort_resets_the_upstream_connection(mesh: Mesh) -> None:
    outcome = asyncio.get_running_loop().create_future()

    async def waits(reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        try:
            data = await reader.read()
            outcome.set_result(f"eof after {data!r}")
        except ConnectionResetError:
            outcome.set_result("reset")

    mesh.upstream = waits
    stream = await mesh.open()
    await stream.write(b"partial")
    await asyncio.sleep(0.05)
    stream.abort()
    assert await asyncio.wait_for(outcome, 10) == "reset"
    with pytest.raises(StreamClosedError):
        await stream.read()


@pytest.mark.parametrize("port,status", sorted(REJECT_PORTS.items()))
async def test_a_handler_refusal_becomes_tunnel_refused_with_its_status(mesh: Mesh, port: int, status: int) -> None:
    with pytest.raises(TunnelRefusedError) as caught:
        await mesh.open(port)
    assert caught.value.status == status
    # The connection survives a refused tunnel.
    assert await echo_once(mesh, b"after refusal") == b"after refusal"
    assert mesh.connections_served == 1


async def test_a_crashing_handler_answers_503_and_a_silent_one_resets_the_stream(
    mesh: Mesh, caplog: pytest.LogCaptureFixture
) -> None:
    with pytest.raises(TunnelRefusedError) as caught:
        await mesh.open(CRASH_PORT)
    assert caught.value.status == 503
    assert "handler bug" in caplog.text
    with pytest.raises(StreamClosedError):
        await mesh.open(SILENT_PORT)
    assert await echo_once(mesh, b"still fine") == b"still fine"
    assert mesh.connections_served == 1


async def test_the_server_rejects_a_client_certificate_from_another_root(mesh: Mesh, tmp_path: Path) -> None:
    stranger = await LocalCa(tmp_path / "other-root", trust_domain=TD).fetch_certificate(CLIENT)
    # The stranger trusts our root (so it gets as far as presenting its own certificate).
    mesh.client_cert = dataclasses.replace(stranger, roots_pem=mesh.ca.roots_pem)
    with pytest.raises(HboneConnectError) as caught:
        await mesh.dial()
    assert caught.value.flag == "TLS_FAILURE"
    await until(lambda: bool(mesh.failures))
    assert "TLS handshake failed" in mesh.failures[0]


async def test_the_server_drops_a_client_of_another_trust_domain(mesh: Mesh, tmp_path: Path) -> None:
    # Same root (same CA directory), but the certificate speaks for another trust domain.
    foreign = LocalCa(tmp_path / "ca", trust_domain="other.domain")
    mesh.client_cert = await foreign.fetch_certificate(SpiffeId("other.domain", "client-ns", "client-sa"))
    with pytest.raises(HboneConnectError) as caught:
        await mesh.dial()
    assert caught.value.flag == "TLS_FAILURE"
    await until(lambda: bool(mesh.failures))
    assert "outside trust domain" in mesh.failures[0]


async def test_the_client_refuses_a_server_with_an_unexpected_identity(mesh: Mesh) -> None:
    with pytest.raises(HboneConnectError) as caught:
        await mesh.dial(frozenset({SpiffeId(TD, "server-ns", "someone-else")}))
    assert caught.value.flag == "IDENTITY_ERROR"
    assert "someone-else" in str(caught.value)


async def test_ten_mebibytes_each_way_with_slow_readers_stay_bounded(mesh: Mesh) -> None:
    mesh.settings = HboneSettings(stream_window=256 * 1024, connection_window=1024 * 1024, send_chunk=16 * 1024)
    size = 10 * 1024 * 1024
    block = os.urandom(1024 * 1024)
    upload_digest = asyncio.get_running_loop().create_future()
    counters = {"up_written": 0, "up_read": 0, "down_written": 0, "down_read": 0}
    peaks = {"up": 0, "down": 0}

    async def slow_sink_and_source(reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        sock = writer.get_extra_info("socket")
        sock.setsockopt(socket.SOL_SOCKET, socket.SO_SNDBUF, SMALL_BUFFER)
        # A fixed receive buffer too: left to autotuning (up to net.ipv4.tcp_rmem's maximum) the kernel would hold
        # more of the upload the slower this reader runs, which is the kernel's memory, not the relay's.
        sock.setsockopt(socket.SOL_SOCKET, socket.SO_RCVBUF, SMALL_BUFFER)

        async def sink() -> None:
            digest = hashlib.sha256()
            while data := await reader.read(32 * 1024):
                counters["up_read"] += len(data)
                peaks["up"] = max(peaks["up"], counters["up_written"] - counters["up_read"])
                digest.update(data)
                await asyncio.sleep(0.001)
            upload_digest.set_result(digest.hexdigest())

        async def source() -> None:
            for _ in range(size // len(block)):
                writer.write(block)
                await writer.drain()
                counters["down_written"] += len(block)
            writer.write_eof()

        await asyncio.gather(sink(), source())

    mesh.upstream = slow_sink_and_source
    stream = await mesh.open()

    async def upload() -> None:
        for _ in range(size // len(block)):
            for offset in range(0, len(block), 64 * 1024):
                await stream.write(block[offset : offset + 64 * 1024])
                counters["up_written"] += 64 * 1024
        stream.write_eof()

    async def download() -> str:
        digest = hashlib.sha256()
        while data := await stream.read():
            counters["down_read"] += len(data)
            peaks["down"] = max(peaks["down"], counters["down_written"] - counters["down_read"])
            digest.update(data)
            await asyncio.sleep(0.001)
        return digest.hexdigest()

    _, down_digest = await asyncio.gather(upload(), download())
    expected = hashlib.sha256(block * (size // len(block))).hexdigest()
    assert down_digest == expected
    assert await asyncio.wait_for(upload_digest, 30) == expected
    await stream.aclose()
    # In flight at any time: the HTTP/2 windows plus a few socket and transport buffers, far below 10 MiB.
    assert peaks["up"] < 2 * 1024 * 1024, peaks
    assert peaks["down"] < 2 * 1024 * 1024, peaks


async def test_the_pool_reaps_idle_connections_and_both_ends_close(mesh: Mesh) -> None:
    assert await echo_once(mesh, b"one") == b"one"
    assert mesh.pool.stats()["connections"] == 1
    assert mesh.pool.reap_idle() == 0  # not idle long enough yet
    mesh.clock.now += 301
    assert mesh.pool.reap_idle() == 1
    assert mesh.pool.stats()["connections"] == 0
    await until(lambda: not mesh.serving)  # the server saw the GOAWAY and finished serving
    assert await echo_once(mesh, b"two") == b"two"  # a fresh connection
    assert mesh.connections_served == 2


async def test_the_pool_forgets_a_connection_its_server_closed_without_being_asked(mesh: Mesh) -> None:
    """The client connection tells the pool it is gone: no open and no reap is needed for the pool to forget it."""
    assert await echo_once(mesh, b"one") == b"one"
    assert mesh.pool.stats()["connections"] == 1
    for task in list(mesh.serving):  # the server's end goes away
        task.cancel()
    await until(lambda: mesh.pool.stats()["keys"] == [])
    assert await echo_once(mesh, b"two") == b"two"  # a fresh connection
    assert mesh.connections_served == 2


async def test_an_upstream_that_resets_mid_upload_fails_only_its_own_tunnel(mesh: Mesh) -> None:
    async def reset_after_first_bytes(reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        await reader.read(1)
        writer.get_extra_info("socket").setsockopt(socket.SOL_SOCKET, socket.SO_LINGER, struct.pack("ii", 1, 0))
        writer.transport.abort()

    mesh.upstream = reset_after_first_bytes
    stream = await mesh.open()
    with pytest.raises(StreamClosedError):
        async with asyncio.timeout(10):
            while True:  # the server side's socket write fails inside the HBONE session's receive callback
                await stream.write(b"u" * (64 * 1024))
    mesh.upstream = echo
    assert await echo_once(mesh, b"the pooled connection survived") == b"the pooled connection survived"
    assert mesh.connections_served == 1
    assert mesh.failures == []


async def test_a_draining_server_finishes_its_tunnel_while_the_pool_takes_new_ones_elsewhere(mesh: Mesh) -> None:
    """The server says GOAWAY (its proxy drains): the tunnel in flight goes on; the pool stops using that
    connection and dials a new one for the next tunnel; the old connection closes once its tunnel is done."""
    old_stream = await mesh.open()
    await old_stream.write(b"before")
    assert await old_stream.read() == b"before"
    (old,) = [c for bucket in mesh.pool._buckets.values() for c in bucket.connections]
    mesh.drain.start()
    mesh.drain = DrainSignal()  # connections accepted from now on are the successor's: not draining
    await until(lambda: not old.available)
    assert not old.closed
    assert await echo_once(mesh, b"a new tunnel") == b"a new tunnel"
    assert mesh.connections_served == 2, "the new tunnel rode the draining connection"
    await old_stream.write(b"during the drain")
    assert await old_stream.read() == b"during the drain"
    old_stream.write_eof()
    assert await read_all(old_stream) == b""
    await until(lambda: old.closed)
    assert mesh.failures == []


async def test_a_connection_accepted_as_its_server_drains_is_dialled_again_not_counted_as_refused(mesh: Mesh) -> None:
    """A connection the old proxy accepted as its drain began: it says SETTINGS, GOAWAY, and closes, as it has no
    tunnel. The pool dials again and the tunnel opens on the next connection (the successor's); the first dial is
    not reported as a refused certificate."""
    await mesh.pool.aclose()
    mesh.pool = ConnectionPool(max_streams=1, idle_timeout=0, clock=mesh.clock)  # a connection per tunnel
    draining = DrainSignal()
    draining.start()
    for _ in range(20):  # the client may see the GOAWAY alone, or the GOAWAY and the close together
        mesh.next_drains.append(draining)
        assert await echo_once(mesh, b"after a going-away dial") == b"after a going-away dial"
        assert not mesh.next_drains
    assert mesh.connections_served == 40
    assert mesh.failures == []


async def test_a_server_that_only_ever_goes_away_fails_the_open_after_one_more_dial(mesh: Mesh) -> None:
    """Every connection says GOAWAY before any tunnel: the open fails after the second dial rather than dialling
    without end."""
    mesh.drain.start()
    with pytest.raises(ConnectionLostError, match="going away"):
        await mesh.open()
    assert mesh.connections_served == 2


def _data_paths() -> int:
    return sum(1 for o in gc.get_objects() if type(o).__name__ == "DataPath")


async def test_a_lost_connection_drops_its_data_path_without_the_collector(mesh: Mesh) -> None:
    """The C data path holds its session (and core): the session drops it when the connection is lost, so neither
    waits for the cyclic collector (with the collector off here, both ends' data paths must go by themselves)."""
    stream = await mesh.open()
    session = stream._session
    native_path = session.data_path is not None
    gc.collect()
    gc.disable()
    try:
        assert await echo_once(mesh, b"once") == b"once"
        await stream.aclose()
        await mesh.pool.aclose()  # the client closes its connection; the server's end follows
        await until(lambda: session.transport is None and not mesh.serving)
        assert session.data_path is None and session.send_now is None
        if native_path:
            await until(lambda: _data_paths() == 0)
    finally:
        gc.enable()
    assert mesh.failures == []


async def test_a_server_certificate_at_hand_is_used_without_awaiting_its_fetch(mesh: Mesh) -> None:
    """What the node proxy's inbound side gives the server (``find_cert``): with the certificate at hand nothing is
    awaited for it (no deadline to arm); when it is not, the server awaits the fetch as before."""
    mesh.find_server_cert = lambda: mesh.server_cert
    assert await echo_once(mesh, b"at hand") == b"at hand"
    assert mesh.cert_fetches == 0
    await mesh.pool.aclose()
    mesh.pool = ConnectionPool(clock=mesh.clock)  # a new connection, whose certificate is not at hand
    mesh.find_server_cert = lambda: None
    assert await echo_once(mesh, b"fetched") == b"fetched"
    assert mesh.cert_fetches == 1
    assert mesh.failures == []


@pytest.mark.parametrize("pass_addresses", [True, False], ids=["given", "asked"])
async def test_the_server_reports_the_connections_addresses_whoever_asked_for_them(
    mesh: Mesh, pass_addresses: bool
) -> None:
    """The node proxy's inbound side asks the accepted socket for its addresses once and hands them on; the
    request and the TLS transport report the same as when the server asks the socket itself."""
    mesh.pass_addresses = pass_addresses
    stream = await mesh.open()
    try:
        client = stream._session.transport
        assert client is not None
        client_addr = client.get_extra_info("sockname")[:2]
        assert mesh.requests[-1].peer_addr == client_addr
        assert mesh.requests[-1].local_addr == tuple(mesh.listener_addr)
        assert client.get_extra_info("peername")[:2] == tuple(mesh.listener_addr)
    finally:
        await stream.aclose()
    assert mesh.failures == []


@pytest.mark.parametrize("then_close", [False, True], ids=["goaway", "goaway-and-close"])
async def test_a_server_that_says_goaway_with_its_settings_fails_the_connect_as_lost_not_as_refused(
    ca: LocalCa, tls_transport: TlsTransportKind, then_close: bool
) -> None:
    """A server that took our certificate and is going away at once (a proxy that accepted the connection as its
    drain began): its SETTINGS and GOAWAY arrive together, its close maybe with them. The connect fails with
    ConnectionLostError (the pool dials again), not as a refused certificate or a usable connection."""
    client_cert, server_cert = await asyncio.gather(ca.fetch_certificate(CLIENT), ca.fetch_certificate(SERVER))
    loop = asyncio.get_running_loop()
    listener = socket.create_server(("127.0.0.1", 0))
    listener.setblocking(False)
    kept: list[asyncio.BaseTransport] = []

    async def go_away_at_once() -> None:
        sock, _ = await loop.sock_accept(listener)
        transport, _ = await loop.connect_accepted_socket(asyncio.Protocol, sock, ssl=server_cert.server_context())
        transport.write(wire.settings_frame([]) + wire.goaway(0, wire.NO_ERROR))
        if then_close:
            transport.close()
        else:
            kept.append(transport)

    serving = asyncio.create_task(go_away_at_once())
    try:
        sock = await connect(FACTORY, listener.getsockname()[:2])
        with pytest.raises(ConnectionLostError, match="going away"):
            await HboneClient.connect(
                sock, client_cert, frozenset({SERVER}), trust_domain=TD, tls_transport=tls_transport
            )
        await serving
    finally:
        serving.cancel()
        for transport in kept:
            transport.abort()
        listener.close()


async def test_a_server_that_never_sends_its_settings_fails_the_connect_at_the_timeout(
    ca: LocalCa, tls_transport: TlsTransportKind
) -> None:
    """A genuine server that completes the handshake and then says nothing: the client gives up after ``timeout``
    (CONNECT_FAILURE), closes its side, and leaves nothing waiting on the session."""
    client_cert, server_cert = await asyncio.gather(ca.fetch_certificate(CLIENT), ca.fetch_certificate(SERVER))
    loop = asyncio.get_running_loop()
    listener = socket.create_server(("127.0.0.1", 0))
    listener.setblocking(False)
    silent: list[asyncio.BaseTransport] = []

    async def serve_silently() -> None:
        sock, _ = await loop.sock_accept(listener)
        transport, _ = await loop.connect_accepted_socket(asyncio.Protocol, sock, ssl=server_cert.server_context())
        silent.append(transport)

    serving = asyncio.create_task(serve_silently())
    try:
        sock = await connect(FACTORY, listener.getsockname()[:2])
        started = loop.time()
        with pytest.raises(HboneConnectError, match="sent no HTTP/2 settings") as raised:
            await HboneClient.connect(
                sock, client_cert, frozenset({SERVER}), trust_domain=TD, timeout=0.5, tls_transport=tls_transport
            )
        assert raised.value.flag is ResponseFlag.CONNECT_FAILURE
        assert loop.time() - started >= 0.5
        await serving
    finally:
        serving.cancel()
        for transport in silent:
            transport.abort()
        listener.close()
