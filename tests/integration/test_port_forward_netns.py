""":class:`~ambit.lab.runtime.port_forward.NetnsDialer` against a real network namespace this test makes (``ip netns
add`` with a per-run name, removed in a finalizer): the pod's localhost is the namespace's, not the machine's."""

from __future__ import annotations

import asyncio
import os
import socket
import subprocess
import threading
import uuid
from collections.abc import AsyncIterator, Iterator

import pytest

from ambit.lab.runtime.port_forward import NetnsDialer, PodDialError
from ambit.proxy.sockets import enter_netns

pytestmark = pytest.mark.skipif(os.geteuid() != 0, reason="making a network namespace needs root")


@pytest.fixture
def netns() -> Iterator[str]:
    name = f"ambit-pfwd-{os.getpid()}-{uuid.uuid4().hex[:6]}"
    subprocess.run(["ip", "netns", "add", name], check=True)
    try:
        subprocess.run(["ip", "-n", name, "link", "set", "lo", "up"], check=True)
        yield f"/run/netns/{name}"
    finally:
        subprocess.run(["ip", "netns", "delete", name], check=False)


def _listener_in(path: str) -> socket.socket:
    """A listening socket on the namespace's 127.0.0.1 (made by a thread that enters it and then ends)."""
    made: list[socket.socket] = []

    def run() -> None:
        fd = os.open(path, os.O_RDONLY | os.O_CLOEXEC)
        try:
            enter_netns(fd)
        finally:
            os.close(fd)
        sock = socket.socket(socket.AF_INET, socket.SOCK_STREAM)
        sock.bind(("127.0.0.1", 0))
        sock.listen()
        made.append(sock)

    thread = threading.Thread(target=run)
    thread.start()
    thread.join()
    return made[0]


async def _greet(reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
    writer.write(b"inside the pod\n")
    await writer.drain()
    writer.close()


@pytest.fixture
async def pod_port(netns: str) -> AsyncIterator[int]:
    sock = _listener_in(netns)
    port = int(sock.getsockname()[1])
    server = await asyncio.start_server(_greet, sock=sock)
    try:
        yield port
    finally:
        server.close()
        await server.wait_closed()


async def test_the_dialer_reaches_a_port_on_the_pods_own_localhost(netns: str, pod_port: int) -> None:
    sock = await NetnsDialer(lambda uid: netns).dial("uid-1", pod_port)
    reader, writer = await asyncio.open_connection(sock=sock)
    assert await asyncio.wait_for(reader.read(), 10) == b"inside the pod\n"
    writer.close()
    # The machine's own localhost has no such listener: the namespace was the one dialled.
    with socket.socket() as here:
        assert here.connect_ex(("127.0.0.1", pod_port)) != 0


async def test_a_closed_port_in_the_pod_is_refused_on_both_families(netns: str, pod_port: int) -> None:
    with pytest.raises(PodDialError) as refused:
        await NetnsDialer(lambda uid: netns).dial("uid-1", pod_port + 1 if pod_port < 65535 else 1)
    assert refused.value.netns == netns
    assert refused.value.ipv4_error.startswith("dial tcp4 127.0.0.1:")
    assert "connection refused" in refused.value.ipv4_error
    assert refused.value.ipv6_error.startswith("dial tcp6 [::1]:")


async def test_a_missing_namespace_is_a_dial_error_not_a_crash() -> None:
    with pytest.raises(PodDialError, match="cannot enter the namespace"):
        await NetnsDialer(lambda uid: "/run/netns/ambit-pfwd-no-such-namespace").dial("uid-1", 80)
