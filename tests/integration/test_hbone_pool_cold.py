"""The pool with one stream per connection and no idle time over real mutual TLS: a handshake per tunnel."""

from __future__ import annotations

import asyncio
import gc
from collections.abc import AsyncIterator
from pathlib import Path

import pytest
from tests.integration.hbone_mesh import CLIENT, SERVER, TD, Mesh, echo_once, until

from ambit.identity.localca import LocalCa
from ambit.proxy.pool import ConnectionPool
from ambit.tls.socket_transport import TlsTransportKind


@pytest.fixture
async def cold_mesh(ca: LocalCa, tls_transport: TlsTransportKind) -> AsyncIterator[Mesh]:
    client_cert, server_cert = await asyncio.gather(ca.fetch_certificate(CLIENT), ca.fetch_certificate(SERVER))
    mesh = Mesh(ca, client_cert, server_cert)
    mesh.tls_transport = tls_transport
    mesh.pool = ConnectionPool(max_streams=1, idle_timeout=0, clock=mesh.clock)
    await mesh.start()
    yield mesh
    await mesh.aclose()


@pytest.fixture
async def ca(tmp_path: Path) -> LocalCa:
    return LocalCa(tmp_path / "ca", trust_domain=TD)


async def test_each_tunnel_makes_its_own_connection_closed_when_the_tunnel_ends(cold_mesh: Mesh) -> None:
    for n in range(1, 4):
        payload = f"tunnel {n}".encode()
        assert await asyncio.create_task(echo_once(cold_mesh, payload)) == payload
        # Closed because the connection said its tunnel ended (nothing here reaps the pool).
        await until(lambda: cold_mesh.pool.stats()["connections"] == 0)
        await until(lambda: not cold_mesh.serving)  # the server saw the close
        assert cold_mesh.connections_served == n
    assert cold_mesh.failures == []


async def test_concurrent_tunnels_each_get_a_handshake_of_their_own(cold_mesh: Mesh) -> None:
    payloads = [f"tunnel {i} ".encode() * (i + 1) for i in range(12)]
    replies = await asyncio.gather(*(asyncio.create_task(echo_once(cold_mesh, p)) for p in payloads))
    assert replies == payloads
    assert cold_mesh.connections_served == 12
    await asyncio.sleep(0)
    assert cold_mesh.pool.stats()["connections"] == 0
    await until(lambda: not cold_mesh.serving)


CLIENT_SIDE = {"HboneClient", "HboneClientConnection"}


async def _left_in_cycles(mesh: Mesh, tunnels: int) -> set[str]:
    """Run ``tunnels`` cold tunnels with the collector off, then collect once keeping what it found: the names of
    the types among it (reference counting should have freed a finished connection whole)."""
    gc.collect()
    gc.disable()
    try:
        for n in range(tunnels):
            payload = f"tunnel {n}".encode()
            assert await asyncio.create_task(echo_once(mesh, payload)) == payload
        await until(lambda: mesh.pool.stats()["connections"] == 0)
        await until(lambda: not mesh.serving)  # the server saw the close
        for _ in range(3):  # the closes' callbacks
            await asyncio.sleep(0)
        gc.set_debug(gc.DEBUG_SAVEALL)  # what the collector would have to free stays in gc.garbage
        gc.collect()
        return {type(o).__name__ for o in gc.garbage}
    finally:
        gc.set_debug(0)
        gc.garbage.clear()
        gc.enable()


async def test_a_finished_client_connection_is_freed_without_the_cyclic_collector(cold_mesh: Mesh) -> None:
    """The pool's idle callback holds the connection, which holds the session that holds the callback: once the
    connection is lost the session lets the callback go, so the connection is freed by reference counting."""
    assert await _left_in_cycles(cold_mesh, 3) & CLIENT_SIDE == set()
    assert cold_mesh.failures == []


def _uvloop_running() -> bool:
    return type(asyncio.get_running_loop()).__module__.startswith("uvloop")


SERVER_SIDE = {"HboneServer", "HboneServerConnection", "HboneSession", "LivenessTimer"}


async def test_a_finished_server_connection_is_freed_without_the_cyclic_collector(cold_mesh: Mesh) -> None:
    """The session holds the server's request and stream callbacks (bound methods: the server, which holds the
    session): once ``serve`` has returned the session lets them go, so the server and its session are freed by
    reference counting, as the client's are."""
    assert await _left_in_cycles(cold_mesh, 3) & (SERVER_SIDE | CLIENT_SIDE) == set()
    assert cold_mesh.failures == []


async def test_a_server_connection_whose_handshake_failed_is_freed_without_the_cyclic_collector(
    cold_mesh: Mesh,
) -> None:
    """A client that does not speak TLS: the session never saw a connection (no ``connection_lost``), and ``serve``
    lets it go all the same. Not on asyncio's own TLS transport: its failed handshake leaves the error in a cycle
    with the frames of its traceback, ``serve``'s among them (the standard library's, not one of ours)."""
    if cold_mesh.tls_transport == "loop" and not _uvloop_running():
        pytest.skip("asyncio's TLS transport keeps its failed handshake's frames in a cycle")
    gc.collect()
    gc.disable()
    try:
        for _ in range(3):
            _, writer = await asyncio.open_connection(*cold_mesh.listener_addr)
            writer.write(b"GET / HTTP/1.1\r\nhost: not-tls\r\n\r\n")
            await writer.drain()
            writer.close()
        await until(lambda: len(cold_mesh.failures) == 3 and not cold_mesh.serving)
        gc.set_debug(gc.DEBUG_SAVEALL)
        gc.collect()
        left = {type(o).__name__ for o in gc.garbage} & SERVER_SIDE
    finally:
        gc.set_debug(0)
        gc.garbage.clear()
        gc.enable()
    assert left == set()
    assert all(failure.startswith("TLS handshake failed") for failure in cold_mesh.failures)
