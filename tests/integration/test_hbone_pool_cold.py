"""The pool with one stream per connection and no idle time over real mutual TLS: a handshake per tunnel."""

from __future__ import annotations

import asyncio
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
