"""The per-pod workload manager: each pod's in-netns listeners, served on the event loop (spec §1.3).

Theory of operation: :class:`PodListenerManager` is the ZDS client's pod handler. ``open_listeners`` creates the
pod's sockets inside its netns (:mod:`ambit.inpod.listeners`, on a helper thread) and serves them with asyncio;
re-adding a uid replaces its listeners (latest netns wins). ``stop`` closes all of the pod's servers at once (the
pod is gone: no drain). For now a captured connection (15001, 15006) is accepted, its original destination is read
(``SO_ORIGINAL_DST``) and recorded, and it is closed; 15008 and DNS accept and drop. The data path comes next.
"""

from __future__ import annotations

import asyncio
import functools
import logging
import socket
import struct
from dataclasses import dataclass, field

from ambit.inpod.listeners import Port, open_pod_listeners
from ambit.zds.protocol import WorkloadInfo

log = logging.getLogger("ambit.inpod.workloads")

SO_ORIGINAL_DST = 80


def original_dst(sock: socket.socket) -> tuple[str, int] | None:
    """The pre-NAT IPv4 destination of a redirected connection, or None when it was not redirected."""
    try:
        raw = sock.getsockopt(socket.SOL_IP, SO_ORIGINAL_DST, 16)
    except OSError:
        return None
    (port,) = struct.unpack("!H", raw[2:4])
    return socket.inet_ntoa(raw[4:8]), port


@dataclass(slots=True)
class PodProxy:
    """One pod's listeners, and what its capture listeners saw last."""

    uid: str
    info: WorkloadInfo
    servers: list[asyncio.Server] = field(default_factory=list)
    datagram_transports: list[asyncio.DatagramTransport] = field(default_factory=list)
    datagram_closed: list[asyncio.Future[None]] = field(default_factory=list)
    last_original_dst: dict[Port, tuple[str, int] | None] = field(default_factory=dict)

    def close(self) -> None:
        for server in self.servers:
            server.close()
        for transport in self.datagram_transports:
            transport.close()


class _CaptureProtocol(asyncio.Protocol):
    """Record the connection's original destination, then close it (the data path is not here yet)."""

    def __init__(self, pod: PodProxy, port: Port) -> None:
        self._pod, self._port = pod, port

    def connection_made(self, transport: asyncio.BaseTransport) -> None:
        sock = transport.get_extra_info("socket")
        dst = original_dst(sock) if self._port in (Port.OUTBOUND, Port.INBOUND_PLAINTEXT) else None
        self._pod.last_original_dst[self._port] = dst
        log.info("pod %s: connection on %d for %s", self._pod.uid, self._port, dst)
        transport.close()


class _DropDatagrams(asyncio.DatagramProtocol):
    """DNS is not served yet; ``closed`` is done once the socket really is closed (that happens a tick later)."""

    def __init__(self) -> None:
        self.closed: asyncio.Future[None] = asyncio.get_running_loop().create_future()

    def connection_lost(self, exc: Exception | None) -> None:
        if not self.closed.done():
            self.closed.set_result(None)


class PodListenerManager:
    """Per pod uid, the pod's listeners; implements the ZDS client's ``PodHandler``."""

    def __init__(self) -> None:
        self._pods: dict[str, PodProxy] = {}

    def find_pod(self, uid: str) -> PodProxy | None:
        return self._pods.get(uid)

    async def open_listeners(self, uid: str, info: WorkloadInfo, netns_fd: int) -> None:
        """Open the pod's listeners in the netns ``netns_fd`` (borrowed); raise when any fails."""
        await self.stop(uid)
        listeners = await asyncio.to_thread(open_pod_listeners, netns_fd)
        loop = asyncio.get_running_loop()
        pod = PodProxy(uid, info)
        try:
            for listener in listeners:
                port = listener.spec.port
                if listener.spec.kind == socket.SOCK_DGRAM:
                    transport, protocol = await loop.create_datagram_endpoint(_DropDatagrams, sock=listener.sock)
                    pod.datagram_transports.append(transport)
                    pod.datagram_closed.append(protocol.closed)
                else:
                    factory = functools.partial(_CaptureProtocol, pod, port)
                    server = await loop.create_server(factory, sock=listener.sock)
                    pod.servers.append(server)
        except BaseException:
            pod.close()
            for listener in listeners:
                listener.sock.close()
            raise
        self._pods[uid] = pod
        log.info("pod %s (%s/%s): listeners open", uid, info.namespace, info.name)

    async def stop(self, uid: str) -> None:
        pod = self._pods.pop(uid, None)
        if pod is None:
            return
        pod.close()
        for server in pod.servers:
            await server.wait_closed()
        await asyncio.gather(*pod.datagram_closed)
        log.info("pod %s: listeners closed", uid)

    async def aclose(self) -> None:
        for uid in list(self._pods):
            await self.stop(uid)
