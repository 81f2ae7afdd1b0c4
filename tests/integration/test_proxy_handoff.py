"""Hand-offs to a running splice: the pod's accept loop and the HBONE server leave a spliced connection alone.

A connection handler that returns a running :class:`~ambit.proxy.relay.Splice` has handed its socket (or tunnel)
to it. These tests run the real accept loop (:meth:`PodListenerManager._accept_loop`) of a :class:`PodProxy` on a
loopback listener, with handlers that splice the accepted socket to a loopback echo server, and a real
:class:`HboneServer` over mutual TLS whose handler splices or drops each tunnel. The echo server is a protocol (no
task per connection), so the loop's task count shows what the proxy side holds.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import socket
from collections.abc import AsyncIterator, Callable
from pathlib import Path

import pytest
from tests.integration.proxy_rig import HbonePair, hbone_pair, listener, recv_exactly

from ambit.inpod.workloads import Handler, PodListenerManager, PodProxy
from ambit.proxy.errors import StreamClosedError
from ambit.proxy.hbone_server import InboundRequest, TunnelResponder
from ambit.proxy.hbone_stream import HboneStream
from ambit.proxy.relay import Splice, close_now, splice
from ambit.proxy.sockets import HostSocketFactory, connect
from ambit.proxy.streams import SocketStream
from ambit.zds.protocol import WorkloadInfo

pytestmark = pytest.mark.timeout(60)

FACTORY = HostSocketFactory(mark=None)


class Echo(asyncio.Protocol):
    """Echoes what it gets and closes after the peer's EOF; no task per connection."""

    def connection_made(self, transport: asyncio.BaseTransport) -> None:
        assert isinstance(transport, asyncio.Transport)
        self.transport = transport

    def data_received(self, data: bytes) -> None:
        self.transport.write(data)

    def eof_received(self) -> bool:
        return False  # close once what was echoed is written


async def until(condition: Callable[[], bool]) -> None:
    """Poll (the conditions are loop callbacks' state, with no event to wait on) for up to 10 s."""
    async with asyncio.timeout(10):
        while not condition():  # noqa: ASYNC110
            await asyncio.sleep(0.005)


async def recv_end(sock: socket.socket) -> str:
    """Read until the connection ends: "eof" or "reset" (what was read before is dropped)."""
    loop = asyncio.get_running_loop()
    async with asyncio.timeout(5):
        try:
            while await loop.sock_recv(sock, 65536):
                pass
        except ConnectionResetError:
            return "reset"
    return "eof"


class Pod:
    """A :class:`PodProxy` with one accept loop on a loopback listener, and a loopback echo server to splice to."""

    def __init__(self) -> None:
        self.proxy = PodProxy("uid-handoff", WorkloadInfo("web-0", "apps", "web"))
        self.ended: list[str] = []
        self.clients: list[socket.socket] = []
        self.echo_addr: tuple[str, int] = ("127.0.0.1", 0)

    async def start(self, handler: Handler | None = None) -> None:
        loop = asyncio.get_running_loop()
        self._echo = await loop.create_server(Echo, "127.0.0.1", 0)
        self.echo_addr = self._echo.sockets[0].getsockname()[:2]
        self.listener = listener()
        self.proxy.listeners.append(self.listener)  # the pod closes it
        task = asyncio.create_task(PodListenerManager._accept_loop(self.proxy, self.listener, handler or self.splice))
        self.proxy.accept_tasks.append(task)

    async def splice(self, conn: socket.socket, ticket: object = None) -> Splice | None:
        """The handler under test: splice the accepted socket to the echo server and return the splice."""
        upstream = SocketStream(await connect(FACTORY, self.echo_addr))
        return splice(SocketStream(conn), upstream, self.end)

    def end(self, over: Splice) -> None:
        self.ended.append(over.result.error)
        close_now(over.downstream, over.upstream)

    def splices(self) -> list[Splice]:
        return [each for each in self.proxy.connections if isinstance(each, Splice)]

    async def dial(self) -> socket.socket:
        client = socket.socket()
        client.setblocking(False)
        self.clients.append(client)
        await asyncio.get_running_loop().sock_connect(client, self.listener.getsockname())
        return client

    async def aclose(self) -> None:
        await self.proxy.aclose()
        for client in self.clients:
            client.close()
        self._echo.close()
        await self._echo.wait_closed()


@pytest.fixture
async def pod() -> AsyncIterator[Pod]:
    p = Pod()
    try:
        yield p
    finally:
        await p.aclose()


async def test_a_spliced_connection_stays_open_after_its_handler_returned_and_leaves_the_pod_when_over(
    pod: Pod,
) -> None:
    loop = asyncio.get_running_loop()
    await pod.start()
    client = await pod.dial()
    await until(lambda: len(pod.splices()) == 1)  # the handler returned its splice
    running = pod.splices()[0]
    assert pod.proxy.connections == {running}  # the handler's task is gone, the splice took its place
    assert running.registry is pod.proxy.connections
    assert not running.over
    for payload in (b"hello", b"again, later"):  # the accepted socket was not closed behind the splice's back
        await loop.sock_sendall(client, payload)
        assert await recv_exactly(client, len(payload)) == payload
        await asyncio.sleep(0.05)
    client.shutdown(socket.SHUT_WR)
    assert await recv_end(client) == "eof"
    await until(lambda: not pod.proxy.connections)
    assert pod.ended == [""]
    assert running.over and running.registry is None


async def test_closing_the_pod_resets_a_live_spliced_connection_and_empties_its_connections(pod: Pod) -> None:
    loop = asyncio.get_running_loop()
    await pod.start()
    client = await pod.dial()
    await until(lambda: len(pod.splices()) == 1)
    await loop.sock_sendall(client, b"ping")
    assert await recv_exactly(client, 4) == b"ping"
    await pod.proxy.aclose()
    assert pod.proxy.connections == set()
    assert pod.ended == ["cancelled"]
    assert await recv_end(client) == "reset"


async def test_a_handler_that_returns_none_gets_its_socket_closed(pod: Pod) -> None:
    accepted: list[socket.socket] = []

    async def forgets(conn: socket.socket, ticket: object = None) -> None:
        accepted.append(conn)

    await pod.start(forgets)
    client = await pod.dial()
    assert await recv_end(client) == "eof"
    assert len(accepted) == 1 and accepted[0].fileno() == -1
    await until(lambda: not pod.proxy.connections)


async def test_a_handler_that_raises_is_logged_and_its_socket_closed(
    pod: Pod, caplog: pytest.LogCaptureFixture
) -> None:
    accepted: list[socket.socket] = []

    async def crashes(conn: socket.socket, ticket: object = None) -> None:
        accepted.append(conn)
        raise RuntimeError("handler bug")

    await pod.start(crashes)
    client = await pod.dial()
    assert await recv_end(client) == "eof"
    assert len(accepted) == 1 and accepted[0].fileno() == -1
    await until(lambda: not pod.proxy.connections)
    failures = [r for r in caplog.records if "connection handler failed" in r.getMessage()]
    assert len(failures) == 1 and failures[0].levelno == logging.ERROR
    assert failures[0].exc_info is not None and isinstance(failures[0].exc_info[1], RuntimeError)
    # The listener survived the bug: the next connection is served (and closed) too.
    assert await recv_end(await pod.dial()) == "eof"
    assert len(accepted) == 2


async def test_a_splice_that_is_over_before_its_handler_returns_is_not_tracked_and_its_socket_is_its_own(
    pod: Pod,
) -> None:
    async def already_over(conn: socket.socket, ticket: object = None) -> Splice | None:
        running = await pod.splice(conn)
        assert running is not None
        running.cancel()  # over at once: on_done closed both streams
        return running

    await pod.start(already_over)
    client = await pod.dial()
    assert await recv_end(client) == "reset"
    await until(lambda: not pod.proxy.connections)
    assert pod.ended == ["cancelled"]


async def test_a_handler_that_finishes_its_hand_off_while_the_pod_closes_leaves_no_live_splice_behind(
    pod: Pod,
) -> None:
    entered = asyncio.Event()

    async def stubborn(conn: socket.socket, ticket: object = None) -> Splice | None:
        entered.set()
        with contextlib.suppress(asyncio.CancelledError):  # past the point of no return: it sets up anyway
            await asyncio.sleep(30)
        return await pod.splice(conn)

    await pod.start(stubborn)
    client = await pod.dial()
    await entered.wait()
    await pod.proxy.aclose()
    await until(lambda: pod.ended == ["cancelled"])
    assert pod.proxy.connections == set()
    assert await recv_end(client) == "reset"


async def test_fifty_idle_relayed_connections_hold_no_task(pod: Pod) -> None:
    loop = asyncio.get_running_loop()
    n = 50
    await pod.start()
    await asyncio.sleep(0.01)  # the accept loop's task is running
    before = len(asyncio.all_tasks())
    clients = [await pod.dial() for _ in range(n)]
    await until(lambda: len(pod.splices()) == n)
    await asyncio.sleep(0.05)
    grown = len(asyncio.all_tasks()) - before
    assert pod.proxy.connections == set(pod.splices())  # no handler task is left, only splices
    assert grown <= 1, f"{grown} more tasks for {n} idle relayed connections"
    for i, client in enumerate(clients):  # and they all still relay
        await loop.sock_sendall(client, b"%03d" % i)
        assert await recv_exactly(client, 3) == b"%03d" % i
    for client in clients:
        client.shutdown(socket.SHUT_WR)
    await until(lambda: not pod.proxy.connections)
    assert pod.ended == [""] * n


# HBONE


@pytest.fixture
async def hbone(tmp_path: Path) -> AsyncIterator[HbonePair]:
    async with hbone_pair(tmp_path) as pair:
        yield pair


async def read_exactly(stream: HboneStream, n: int) -> bytes:
    got = b""
    async with asyncio.timeout(5):
        while len(got) < n:
            chunk = await stream.read()
            assert chunk, "unexpected end of the tunnel"
            got += chunk
    return got


async def test_an_hbone_handler_that_returns_its_splice_leaves_the_tunnel_open_after_it_returned(
    hbone: HbonePair,
) -> None:
    loop = asyncio.get_running_loop()
    echo = await loop.create_server(Echo, "127.0.0.1", 0)
    returned = asyncio.Event()
    ended: list[str] = []
    splices: list[Splice] = []

    def end(over: Splice) -> None:
        ended.append(over.result.error)
        close_now(over.downstream, over.upstream)

    async def splices_to_echo(request: InboundRequest, responder: TunnelResponder) -> object:
        upstream = SocketStream(await connect(FACTORY, echo.sockets[0].getsockname()[:2]))
        running = splice(responder.accept(), upstream, end)
        splices.append(running)
        returned.set()
        return running

    hbone.handler = splices_to_echo
    try:
        stream = await hbone.open_near()
        async with asyncio.timeout(5):
            await returned.wait()
        for _ in range(3):  # let the server act on the handler's return
            await asyncio.sleep(0.02)
        for payload in (b"after the handler returned", b"and still later"):
            await stream.write(payload)
            assert await read_exactly(stream, len(payload)) == payload
            await asyncio.sleep(0.05)
        assert not splices[0].over
        stream.write_eof()
        async with asyncio.timeout(5):
            assert await stream.read() == b""  # the echo server closed: EOF came back through the splice
        await until(lambda: bool(ended))
        assert ended == [""]
    finally:
        echo.close()
        await echo.wait_closed()


async def test_an_hbone_handler_that_accepts_and_returns_none_gets_its_tunnel_closed(hbone: HbonePair) -> None:
    accepted: list[HboneStream] = []

    async def accepts_and_forgets(request: InboundRequest, responder: TunnelResponder) -> object:
        accepted.append(responder.accept())
        return None

    hbone.handler = accepts_and_forgets
    stream = await hbone.open_near()
    async with asyncio.timeout(5):
        with contextlib.suppress(StreamClosedError):  # END_STREAM, possibly followed by a reset
            assert await stream.read() == b""
    await until(lambda: accepted[0].done)
