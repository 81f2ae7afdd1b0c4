"""The TLS listener over real loopback sockets: closing it leaves no accepted socket open, whatever the peer does.

"Open" is read from the kernel: a socket of this process whose local port is the listener's, found through
``/proc/self/fd`` and ``/proc/self/net/tcp`` (a socket the process has closed is no longer one of its fds, even
while the kernel still finishes the TCP close). Peers that must stay stuck (never answering close_notify, never
sending a ClientHello) are blocking sockets driven from threads, as a stopped or hostile process would be.
"""

from __future__ import annotations

import asyncio
import gc
import os
import socket
import ssl
import time
import warnings
from collections.abc import AsyncIterator, Iterator
from dataclasses import dataclass, field
from pathlib import Path

import pytest
from tests.harness import wait_for

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
    return Pki(ca, server)


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


def own_sockets_on(port: int) -> int:
    """How many sockets this process holds whose local TCP port is ``port`` (listening or connected)."""
    inodes = set()
    for fd in os.listdir("/proc/self/fd"):
        try:
            target = os.readlink(f"/proc/self/fd/{fd}")
        except OSError:
            continue
        if target.startswith("socket:["):
            inodes.add(target[len("socket:[") : -1])
    count = 0
    for line in Path("/proc/self/net/tcp").read_text().splitlines()[1:]:
        fields = line.split()
        if int(fields[1].split(":")[1], 16) == port and fields[9] in inodes:
            count += 1
    return count


@pytest.fixture
def stuck_peers() -> Iterator[list[socket.socket]]:
    """Client sockets a test leaves stuck on purpose; closed at the end."""
    peers: list[socket.socket] = []
    try:
        yield peers
    finally:
        for peer in peers:
            peer.close()


def greeted_then_stuck(pki: Pki, port: int, peers: list[socket.socket]) -> None:
    """Handshake, read the greeting, then never read again (so never answer close_notify)."""
    tls = client_context(pki).wrap_socket(
        socket.create_connection(("127.0.0.1", port), timeout=30), server_hostname="127.0.0.1"
    )
    peers.append(tls)
    assert tls.recv(len(GREETING)) == GREETING


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
