"""How TLS on the socket itself (:mod:`ambit.tls.socket_transport`) registers its descriptor with the event loop:
once for the handshake's reading steps and the transport after them, and nothing left behind when the handshake
fails. A registration left on a closed descriptor would be inherited by the next socket given that number.
Both record paths (``records_path``), on the loop the test runs on (asyncio's selector loop)."""

from __future__ import annotations

import asyncio
import selectors
import ssl
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest
from tests.security.tls_peers import CLIENT, TD, Certs, Sink, served, tcp_pair

from ambit.identity.localca import LocalCa
from ambit.tls.socket_handshake import open_tls
from ambit.tls.socket_transport import TlsSocketTransport

pytestmark = pytest.mark.usefixtures("records_path", "no_peer_traceback")


def _registered(loop: asyncio.AbstractEventLoop, fd: int) -> selectors.SelectorKey | None:
    selector: selectors.BaseSelector = loop._selector  # type: ignore[attr-defined]  # the selector loop's own
    return selector.get_map().get(fd)


def _record(monkeypatch: pytest.MonkeyPatch, loop: asyncio.AbstractEventLoop, calls: list[tuple[str, int]]) -> None:
    """Note every (un)registration the loop is asked for, by method name and descriptor."""
    for name in ("add_reader", "remove_reader", "add_writer", "remove_writer"):
        method: Callable[..., Any] = getattr(loop, name)

        def recording(fd: int, *args: Any, _name: str = name, _method: Callable[..., Any] = method) -> Any:
            calls.append((_name, fd))
            return _method(fd, *args)

        monkeypatch.setattr(loop, name, recording)


async def test_the_handshake_and_the_transport_read_through_one_registration(
    certs: Certs, monkeypatch: pytest.MonkeyPatch
) -> None:
    loop = asyncio.get_running_loop()
    client, server = await tcp_pair()
    client_fd, server_fd = client.fileno(), server.fileno()
    calls: list[tuple[str, int]] = []
    _record(monkeypatch, loop, calls)
    received = Sink()
    serving = loop.create_task(served(certs, server, received))
    try:
        transport, sent = await open_tls(
            Sink, client, certs.client.client_context(), server_side=False, handshake_timeout=5
        )
        server_transport = await serving
        for fd, end in ((client_fd, transport), (server_fd, server_transport)):
            assert ("remove_reader", fd) not in calls, f"the reading registration of fd {fd} was dropped: {calls}"
            key = _registered(loop, fd)
            assert key is not None and key.events & selectors.EVENT_READ
            reader = key.data[0]
            assert isinstance(end, TlsSocketTransport)
            assert reader._callback == end._read_ready, "the transport reads through a callback of the handshake"
        transport.write(b"ping")
        async with asyncio.timeout(5):
            await received.reached(4)
        assert bytes(received.received) == b"ping"
        transport.close()
        async with asyncio.timeout(5):
            await sent.lost
            await received.lost
        assert _registered(loop, client_fd) is None and _registered(loop, server_fd) is None
    finally:
        client.close()


async def test_a_refused_handshake_leaves_nothing_registered(certs: Certs, tmp_path: Path) -> None:
    loop = asyncio.get_running_loop()
    stranger = await LocalCa(tmp_path / "other-ca", trust_domain=TD).fetch_certificate(CLIENT)
    client, server = await tcp_pair()
    client_fd, server_fd = client.fileno(), server.fileno()
    serving = loop.create_task(served(certs, server, Sink()))
    try:
        with pytest.raises((ssl.SSLError, ConnectionError)):
            await open_tls(Sink, client, stranger.client_context(), server_side=False, handshake_timeout=5)
        with pytest.raises(ssl.SSLError):
            await serving
        assert client.fileno() == -1 and server.fileno() == -1
        assert _registered(loop, client_fd) is None and _registered(loop, server_fd) is None
    finally:
        client.close()


async def test_a_handshake_that_times_out_leaves_nothing_registered(certs: Certs) -> None:
    loop = asyncio.get_running_loop()
    client, server = await tcp_pair()  # the client never says hello
    server_fd = server.fileno()
    try:
        with pytest.raises(TimeoutError):
            await open_tls(Sink, server, certs.server.server_context(), server_side=True, handshake_timeout=0.2)
        assert server.fileno() == -1
        assert _registered(loop, server_fd) is None
    finally:
        client.close()


def _deadlines(loop: asyncio.AbstractEventLoop) -> int:
    """The handshake deadlines the loop still has scheduled (the selector loop's own timer heap)."""
    scheduled: list[asyncio.TimerHandle] = loop._scheduled  # type: ignore[attr-defined]
    return sum(1 for h in scheduled if not h.cancelled() and "_Deadline" in repr(h))


async def test_a_cancelled_handshake_leaves_nothing_registered_and_no_deadline(certs: Certs) -> None:
    loop = asyncio.get_running_loop()
    client, server = await tcp_pair()  # the client never says hello
    server_fd = server.fileno()
    opening = loop.create_task(
        open_tls(Sink, server, certs.server.server_context(), server_side=True, handshake_timeout=30)
    )
    try:
        await asyncio.sleep(0.05)
        assert _deadlines(loop) == 1 and _registered(loop, server_fd) is not None
        opening.cancel()
        with pytest.raises(asyncio.CancelledError):
            await opening
        assert server.fileno() == -1
        assert _registered(loop, server_fd) is None
        assert _deadlines(loop) == 0
    finally:
        client.close()


async def test_a_completed_handshake_leaves_no_deadline_behind(certs: Certs) -> None:
    loop = asyncio.get_running_loop()
    client, server = await tcp_pair()
    serving = loop.create_task(served(certs, server, Sink()))
    client_transport, _ = await open_tls(
        Sink, client, certs.client.client_context(), server_side=False, handshake_timeout=0.3
    )
    server_transport = await serving
    try:
        assert _deadlines(loop) == 0
        await asyncio.sleep(0.4)  # past the deadline: the connection is not touched
        assert not client_transport.is_closing() and not server_transport.is_closing()
    finally:
        client_transport.abort()
        server_transport.abort()
