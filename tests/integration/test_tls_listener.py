"""The TLS listener over real loopback sockets: closing it leaves no accepted socket open, whatever the peer does;
and the two servers built on it (the API server, the validation webhook) close the same way.

"Open" is read from the kernel (:func:`tests.harness.own_sockets_on`). Peers that must stay stuck (never answering
close_notify, never sending a ClientHello) are blocking sockets driven from threads, as a stopped or hostile
process would be.
"""

from __future__ import annotations

import asyncio
import gc
import socket
import ssl
import time
import warnings
from collections.abc import AsyncIterator, Iterator
from dataclasses import dataclass, field
from pathlib import Path

import pytest
from tests.harness import own_sockets_on, wait_for

from ambit.apiserver.server import ApiServer
from ambit.controlplane.webhook import ValidationWebhookServer, WebhookServerSettings
from ambit.tls.certs import KeyPair, issue_server_cert, new_ca
from ambit.tls.listener import TlsListener

GREETING = b"hello\n"


@dataclass
class Greeter(asyncio.Protocol):
    """Says hello on every connection and remembers the transports, so the test can close them as an owner would."""

    transports: list[asyncio.Transport] = field(default_factory=list)

    def connection_made(self, transport: asyncio.BaseTransport) -> None:
        assert isinstance(transport, asyncio.Transport)
        self.transports.append(transport)
        transport.write(GREETING)


@dataclass(frozen=True)
class Pki:
    ca: KeyPair
    server: ssl.SSLContext
    cert_file: Path
    key_file: Path


@pytest.fixture(scope="module")
def pki(tmp_path_factory: pytest.TempPathFactory) -> Pki:
    now = time.time()
    ca = new_ca("ambit-listener-test-ca", now=now)
    cert = issue_server_cert(ca, common_name="listener", dns_names=[], ip_addresses=["127.0.0.1"], now=now)
    directory: Path = tmp_path_factory.mktemp("listener-pki")
    (directory / "tls.crt").write_bytes(cert.cert_pem)
    (directory / "tls.key").write_bytes(cert.key_pem)
    server = ssl.create_default_context(ssl.Purpose.CLIENT_AUTH)
    server.load_cert_chain(directory / "tls.crt", directory / "tls.key")
    return Pki(ca, server, directory / "tls.crt", directory / "tls.key")


def client_context(pki: Pki) -> ssl.SSLContext:
    return ssl.create_default_context(cadata=pki.ca.cert_pem.decode())


@dataclass
class Served:
    listener: TlsListener
    greeter: Greeter
    port: int


def listen(pki: Pki, handshake_timeout: float = 10.0) -> Served:
    sock = socket.socket(socket.AF_INET, socket.SOCK_STREAM)
    sock.bind(("127.0.0.1", 0))
    greeter = Greeter()
    listener = TlsListener(sock, lambda: greeter, pki.server, handshake_timeout=handshake_timeout, name="test")
    listener.start()
    return Served(listener, greeter, listener.address[1])


@pytest.fixture
async def served(pki: Pki) -> AsyncIterator[Served]:
    served = listen(pki)
    try:
        yield served
    finally:
        await served.listener.aclose(grace=0.1)


@pytest.fixture
def stuck_peers() -> Iterator[list[socket.socket]]:
    """Client sockets a test leaves stuck on purpose; closed at the end."""
    peers: list[socket.socket] = []
    try:
        yield peers
    finally:
        for peer in peers:
            peer.close()


def answered_then_stuck(
    context: ssl.SSLContext, port: int, peers: list[socket.socket], request: bytes, answer: bytes
) -> None:
    """Handshake, send ``request``, read the start of the answer, then never read again (nor answer close_notify)."""
    tls = context.wrap_socket(socket.create_connection(("127.0.0.1", port), timeout=30), server_hostname="127.0.0.1")
    peers.append(tls)
    tls.sendall(request)
    assert tls.recv(len(answer)) == answer


def greeted_then_stuck(pki: Pki, port: int, peers: list[socket.socket]) -> None:
    answered_then_stuck(client_context(pki), port, peers, b"", GREETING)


def assert_nothing_left_to_collect() -> None:
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        gc.collect()
    assert not [w for w in caught if issubclass(w.category, ResourceWarning)], [str(w.message) for w in caught]


async def test_a_peer_that_never_answers_close_notify_is_aborted_once_the_grace_is_over(
    pki: Pki, served: Served, stuck_peers: list[socket.socket]
) -> None:
    await asyncio.to_thread(greeted_then_stuck, pki, served.port, stuck_peers)
    await asyncio.to_thread(wait_for, lambda: served.listener.open_connections == 1)
    for transport in served.greeter.transports:  # the owner closes first, as runner.cleanup() does
        transport.close()
    await served.listener.aclose(grace=0.2)
    assert served.listener.open_connections == 0
    assert own_sockets_on(served.port) == 0
    assert_nothing_left_to_collect()


async def test_a_peer_that_answers_close_notify_is_closed_without_waiting_for_the_grace(
    pki: Pki, served: Served
) -> None:
    reader, writer = await asyncio.open_connection("127.0.0.1", served.port, ssl=client_context(pki))
    assert await reader.readexactly(len(GREETING)) == GREETING
    for transport in served.greeter.transports:
        transport.close()
    began = time.monotonic()
    await served.listener.aclose(grace=60.0)
    assert time.monotonic() - began < 30.0  # the grace is for stuck peers; this one answered at once
    assert own_sockets_on(served.port) == 0
    assert await reader.read() == b""
    writer.close()
    await writer.wait_closed()


async def test_a_client_stuck_before_its_client_hello_is_dropped_when_the_listener_closes(
    served: Served, stuck_peers: list[socket.socket]
) -> None:
    peer = socket.create_connection(("127.0.0.1", served.port), timeout=30)
    stuck_peers.append(peer)
    await asyncio.to_thread(wait_for, lambda: own_sockets_on(served.port) == 2)  # listening + accepted
    await served.listener.aclose(grace=0.2)
    assert own_sockets_on(served.port) == 0
    assert await asyncio.to_thread(peer.recv, 1) == b""
    assert_nothing_left_to_collect()


async def test_a_silent_client_is_dropped_after_the_handshake_timeout_and_others_are_still_served(
    pki: Pki, stuck_peers: list[socket.socket]
) -> None:
    served = listen(pki, handshake_timeout=0.5)
    try:
        silent = socket.create_connection(("127.0.0.1", served.port), timeout=30)
        stuck_peers.append(silent)
        assert await asyncio.to_thread(silent.recv, 1) == b""  # no ClientHello within 0.5 s: dropped
        garbage = socket.create_connection(("127.0.0.1", served.port), timeout=30)
        stuck_peers.append(garbage)
        garbage.sendall(b"GET / HTTP/1.1\r\n\r\n")  # not TLS: the handshake fails, the listener goes on
        with pytest.raises(ConnectionResetError):
            while await asyncio.to_thread(garbage.recv, 4096):
                pass
            raise ConnectionResetError  # a FIN instead of a reset is as good
        reader, writer = await asyncio.open_connection("127.0.0.1", served.port, ssl=client_context(pki))
        assert await reader.readexactly(len(GREETING)) == GREETING
        writer.close()
        await writer.wait_closed()
    finally:
        await served.listener.aclose(grace=0.2)
    assert own_sockets_on(served.port) == 0


async def test_the_api_server_closes_with_a_client_that_never_answers_close_notify(
    apiserver: ApiServer, stuck_peers: list[socket.socket]
) -> None:
    port = int(apiserver.url.rsplit(":", 1)[1])
    context = ssl.create_default_context(cadata=(apiserver.settings.data_dir / "pki" / "ca.crt").read_text())
    request = f"GET /version HTTP/1.1\r\nHost: 127.0.0.1\r\nAuthorization: Bearer {apiserver.admin_token}\r\n\r\n"
    await asyncio.to_thread(answered_then_stuck, context, port, stuck_peers, request.encode(), b"HTTP/1.1 200")
    await apiserver.aclose()  # the fixture's aclose() after this one finds nothing left to do
    assert own_sockets_on(port) == 0
    assert_nothing_left_to_collect()


async def test_the_webhook_server_closes_with_a_client_that_never_answers_close_notify(
    pki: Pki, stuck_peers: list[socket.socket]
) -> None:
    settings = WebhookServerSettings(cert_file=pki.cert_file, key_file=pki.key_file, host="127.0.0.1", port=0)
    server = ValidationWebhookServer(settings)
    await server.start()
    port = server.port
    try:
        request = b"GET /ready HTTP/1.1\r\nHost: 127.0.0.1\r\n\r\n"
        await asyncio.to_thread(answered_then_stuck, client_context(pki), port, stuck_peers, request, b"HTTP/1.1 200")
    finally:
        await server.aclose()
    assert own_sockets_on(port) == 0
    assert_nothing_left_to_collect()
