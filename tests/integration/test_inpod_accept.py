"""The per-pod accept loop on loopback: what every accepted connection gets before its handler runs."""

from __future__ import annotations

import asyncio
import contextlib
import socket

from ambit.inpod.workloads import PodListenerManager, PodProxy
from ambit.zds.protocol import WorkloadInfo


async def test_accepted_connections_have_tcp_nodelay_before_the_handler_runs() -> None:
    listener = socket.socket()
    listener.bind(("127.0.0.1", 0))
    listener.listen(8)
    listener.setblocking(False)
    seen: asyncio.Queue[int] = asyncio.Queue()

    async def handler(conn: socket.socket, ticket: object = None) -> None:
        await seen.put(conn.getsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY))

    pod = PodProxy("uid-1", WorkloadInfo("web-0", "apps", "web"))
    accepting = asyncio.create_task(PodListenerManager._accept_loop(pod, listener, handler))
    clients = []
    try:
        for _ in range(3):
            client = socket.socket()
            client.setblocking(False)
            await asyncio.get_running_loop().sock_connect(client, listener.getsockname())
            clients.append(client)
        async with asyncio.timeout(5):
            flags = [await seen.get() for _ in clients]
        assert all(flags), flags  # Nagle would hold a small write until the peer's delayed ACK
    finally:
        accepting.cancel()
        with contextlib.suppress(asyncio.CancelledError):
            await accepting
        await asyncio.gather(*pod.connections, return_exceptions=True)
        for client in clients:
            client.close()
        listener.close()
