"""The per-connection shortcuts of issue 7 on real loopback sockets: the accept loop on readiness, close_both.

The accept loop keeps its listener registered with the event loop instead of a ``sock_accept`` per connection;
these pin that it takes a whole queue of connections, and that once cancelled it has unregistered the listener
(so closing it cannot leave a stale registration for the next socket with that fd number).
"""

from __future__ import annotations

import asyncio
import contextlib
import socket

from bench.relaying import close_both

from ambit.inpod.workloads import ACCEPT_BATCH, PodListenerManager, PodProxy
from ambit.proxy.streams import SocketStream
from ambit.zds.protocol import WorkloadInfo


def _listener() -> socket.socket:
    listener = socket.socket()
    listener.bind(("127.0.0.1", 0))
    listener.listen(256)
    listener.setblocking(False)
    return listener


async def test_the_accept_loop_takes_a_queue_longer_than_its_batch_and_unregisters_when_cancelled() -> None:
    listener = _listener()
    count = ACCEPT_BATCH + 10
    handled: asyncio.Queue[bool] = asyncio.Queue()

    async def handler(conn: socket.socket, ticket: object = None) -> None:
        await handled.put(not conn.getblocking())

    pod = PodProxy("uid-1", WorkloadInfo("web-0", "apps", "web"))
    clients = []
    for _ in range(count):  # queued before the loop starts: one readiness has more than a batch waiting
        client = socket.socket()
        client.setblocking(False)
        with contextlib.suppress(BlockingIOError):
            client.connect(listener.getsockname())
        clients.append(client)
    accepting = asyncio.create_task(PodListenerManager._accept_loop(pod, listener, handler))
    try:
        async with asyncio.timeout(5):
            nonblocking = [await handled.get() for _ in range(count)]
        assert all(nonblocking)
    finally:
        accepting.cancel()
        with contextlib.suppress(asyncio.CancelledError):
            await accepting
        await asyncio.gather(*pod.connections, return_exceptions=True)
        assert not asyncio.get_running_loop().remove_reader(listener.fileno())  # nothing left registered
        for client in clients:
            client.close()
        listener.close()


async def test_closing_a_pod_unregisters_its_accept_loops_before_closing_the_listeners() -> None:
    listener = _listener()
    fd = listener.fileno()

    async def handler(conn: socket.socket, ticket: object = None) -> None:
        conn.close()

    pod = PodProxy("uid-1", WorkloadInfo("web-0", "apps", "web"))
    pod.listeners.append(listener)
    pod.accept_tasks.append(asyncio.create_task(PodListenerManager._accept_loop(pod, listener, handler)))
    await asyncio.sleep(0)  # the loop registered the listener
    await pod.aclose()
    assert listener.fileno() == -1
    assert not asyncio.get_running_loop().remove_reader(fd)


class _FailingClose:
    """A stream whose close fails: close_both ignores it, as gather(return_exceptions=True) did."""

    def __init__(self) -> None:
        self.closed = False

    async def read(self) -> bytes:
        return b""

    async def write(self, data: bytes | memoryview) -> None:
        pass

    def write_eof(self) -> None:
        pass

    def abort(self) -> None:
        pass

    async def aclose(self) -> None:
        self.closed = True
        raise OSError("close failed")


async def test_close_both_closes_each_stream_whichever_side_the_socket_is_on_and_ignores_close_errors() -> None:
    for socket_first in (True, False):
        left, right = socket.socketpair()
        try:
            stream, other = SocketStream(left), _FailingClose()
            await (close_both(stream, other) if socket_first else close_both(other, stream))
            assert left.fileno() == -1 and other.closed
            assert right.recv(1) == b""  # a graceful close: FIN, not a reset
        finally:
            right.close()
    first, second = _FailingClose(), _FailingClose()
    await close_both(first, second)
    assert first.closed and second.closed
