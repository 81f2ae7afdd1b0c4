"""A stand-in waypoint and a pod's outbound call for the node proxy's waypoint tests, on loopback with real TLS and
HBONE: :class:`FakeWaypoint` is an HBONE server holding a waypoint's certificate that records each CONNECT and
echoes the tunnel's bytes; :func:`call_outbound` opens a connection from a pod through the proxy's outbound handler
(:func:`ambit.proxy.outbound.serve_outbound`) with the original destination the kernel's REDIRECT would have given
and returns what the pod gets back."""

from __future__ import annotations

import asyncio
import dataclasses
import socket
from collections.abc import Callable
from unittest import mock

from tests.integration.proxy_rig import recv_all

from ambit.proxy import outbound as outbound_module
from ambit.proxy.context import LocalPod, ProxyContext
from ambit.proxy.hbone_server import HboneServer, InboundRequest, TunnelResponder
from ambit.proxy.outbound import serve_outbound
from ambit.tls.workload import WorkloadCertificate

TD = "cluster.local"


@dataclasses.dataclass
class FakeWaypoint:
    """An HBONE server at ``ip`` standing in for a waypoint: it records each CONNECT and echoes the tunnel's bytes."""

    cert: WorkloadCertificate
    ip: str
    requests: list[InboundRequest] = dataclasses.field(default_factory=list)
    handshakes: int = 0
    serving: set[asyncio.Task[None]] = dataclasses.field(default_factory=set)
    answer: Callable[[InboundRequest], int] = lambda request: 200
    """The status each CONNECT gets (a test may refuse some)."""

    async def start(self) -> None:
        self.listener = socket.create_server((self.ip, 0))
        self.listener.setblocking(False)
        self.port: int = self.listener.getsockname()[1]
        self.accepting = asyncio.create_task(self._accept())

    async def _accept(self) -> None:
        loop = asyncio.get_running_loop()
        while True:
            sock, _ = await loop.sock_accept(self.listener)
            self.handshakes += 1
            task = asyncio.create_task(HboneServer.serve(sock, self._cert, trust_domain=TD, handler=self._handle))
            self.serving.add(task)
            task.add_done_callback(self.serving.discard)

    async def _cert(self) -> WorkloadCertificate:
        return self.cert

    async def _handle(self, request: InboundRequest, responder: TunnelResponder) -> None:
        self.requests.append(request)
        status = self.answer(request)
        if status != 200:
            responder.reject(status)
            return
        stream = responder.accept()
        while chunk := await stream.read():
            await stream.write(chunk)
        stream.write_eof()

    async def aclose(self) -> None:
        for task in [self.accepting, *self.serving]:
            task.cancel()
        await asyncio.gather(self.accepting, *self.serving, return_exceptions=True)
        self.listener.close()


async def call_outbound(
    ctx: ProxyContext, pod: LocalPod, client_ip: str, dst: tuple[str, int], payload: bytes
) -> bytes:
    """What the pod at ``client_ip`` gets back from a connection to ``dst`` carried by the node proxy (b"" if
    reset)."""
    loop = asyncio.get_running_loop()
    front = socket.create_server((client_ip, 0))
    front.setblocking(False)
    app = socket.socket()
    app.setblocking(False)
    app.bind((client_ip, 0))
    try:
        await loop.sock_connect(app, front.getsockname())
        accepted, _ = await loop.sock_accept(front)
        accepted.setblocking(False)
        with mock.patch.object(outbound_module, "original_dst", lambda sock: dst):
            await serve_outbound(ctx, pod, accepted)
        try:
            await loop.sock_sendall(app, payload)
            app.shutdown(socket.SHUT_WR)
            return await recv_all(app)
        except ConnectionResetError:
            return b""
    finally:
        app.close()
        front.close()
