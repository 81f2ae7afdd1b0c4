"""The per-pod workload manager: each pod's in-netns listeners, served on the event loop (spec §1.3).

Theory of operation: :class:`PodListenerManager` is the ZDS client's pod handler. ``open_listeners`` creates the
pod's sockets inside its netns (:mod:`ambit.inpod.listeners`, on a helper thread) and, with a proxy context, a
socket factory for the pod's netns (upstream connections are made from inside the pod); it then runs one accept
loop per TCP listener, which keeps the listener registered with the event loop for its whole life and accepts on
readiness (the listener is unregistered before it is closed: its fd number may be reused at once). Each accepted
connection is its own task running the port's handler (outbound 15001, plaintext inbound 15006, HBONE 15008).
A handler that returns a running :class:`~ambit.proxy.relay.Splice` has handed the connection to it (the splice
owns the socket now): the pod keeps the splice among its live connections until it is over, so that ``stop``
can cancel it like a task.
Accepted sockets get ``TCP_NODELAY`` like every socket the proxy dials: without it Nagle holds a small write (a
CONNECT's 200 HEADERS followed by the first DATA, a 1-byte echo) until the peer's delayed ACK.

Admission (:mod:`ambit.proxy.admission`): with a :class:`PodAdmission`, each pod's 15008, 15001 and 15006 have a
gate of their own over the process's one budget. The accept loop asks it before anything else: a refused connection
is reset at once; an admitted one carries its ticket to the handler (15008 makes it established once the client is
judged) and gives it back when its task ends or, for a connection handed to a splice, when the splice is over. A
pending one evicted by a newcomer has its task cancelled (whose end closes the socket).

Adding a uid again is idempotent when it names the same network namespace (same device and inode): the node agent
sends every pod again in its snapshot after it or we restart (spec §3.3), and the pod's listeners and connections
must survive that. A different namespace (the pod's sandbox was recreated) replaces them: the latest netns wins.
``stop`` closes the pod's listeners and cancels its connections (the pod is gone: no drain).

Draining (the proxy is going away, :mod:`ambit.inpod.drain`): ``stop_accepting`` closes every pod's listeners, TCP
and UDP, and leaves the connections they accepted running; a pod added afterwards is refused (the node agent's
Add is nacked: the pod belongs to the proxy that took over), while a pod added again in the netns it is served in
is still the no-op above, and ``stop`` still stops pods. With SO_REUSEPORT a successor's listeners already sit
beside ours, so closing ours sends every new connection there; connections that completed their handshake but were
not accepted yet move to the successor's queue too where the netns allows it (``tcp_migrate_req``,
:mod:`ambit.inpod.listeners`).

Without a proxy context (the listener layer's own tests) a captured connection's original destination is
recorded and the connection closed.
"""

from __future__ import annotations

import asyncio
import functools
import importlib
import logging
import os
import socket
import sys
from collections.abc import Callable, Coroutine
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any

from ambit.dns.settings import DnsServerSettings, Upstream
from ambit.inpod.listeners import ListenerError, Port, open_pod_listeners, pod_listeners
from ambit.inpod.resolvers import PodResolvers
from ambit.proxy.admission import ListenerGate, ListenerLimits, NodeBudget, Refusal, Ticket
from ambit.proxy.context import LocalPod, ProxyContext
from ambit.proxy.inbound import serve_hbone, serve_plaintext
from ambit.proxy.outbound import serve_outbound
from ambit.proxy.relay import Splice
from ambit.proxy.sockets import NetnsSocketFactory, original_dst, reset
from ambit.zds.protocol import WorkloadInfo

if TYPE_CHECKING:  # the DNS proxy is imported when the first pod's DNS server starts (dnspython later)
    from ambit.dns.resolution import DnsClient
    from ambit.dns.server import DnsDatagramProtocol, DnsServer

log = logging.getLogger("ambit.inpod.workloads")

Handler = Callable[[socket.socket, Ticket | None], Coroutine[Any, Any, Splice | None]]
"""Serves one accepted connection (with its admission ticket, if its listener has a gate); returns None when done
with it, or the splice it handed the connection to."""


@dataclass(frozen=True, slots=True)
class PodAdmission:
    """The bounds of every pod's listeners (:mod:`ambit.proxy.admission`), over the process's one budget."""

    budget: NodeBudget
    hbone: ListenerLimits = field(default_factory=ListenerLimits)
    """Each pod's 15008: connections, TLS handshakes in progress, handshakes per peer address, handshake timeout."""
    plaintext: ListenerLimits = field(default_factory=ListenerLimits)
    """Each pod's 15001 and 15006 (each its own): connections (no handshake there)."""

    def gates(self) -> dict[Port, ListenerGate]:
        """One pod's gates, by port."""
        return {
            Port.INBOUND_HBONE: ListenerGate("hbone", self.hbone, self.budget, handshake=True),
            Port.OUTBOUND: ListenerGate("outbound", self.plaintext, self.budget, handshake=False),
            Port.INBOUND_PLAINTEXT: ListenerGate("inbound_plaintext", self.plaintext, self.budget, handshake=False),
        }


class _HeldSplice:
    """A pod's live connections as a relayed connection's registry: leaving them releases its admission ticket."""

    __slots__ = ("connections", "ticket")

    def __init__(self, connections: set[asyncio.Task[Splice | None] | Splice], ticket: Ticket) -> None:
        self.connections, self.ticket = connections, ticket

    def discard(self, splice: Splice, /) -> None:
        self.connections.discard(splice)
        self.ticket.release()


ACCEPT_BATCH = 64
"""Connections accepted per readiness of a listener at most, before the loop runs anything else."""


def _connection_done(
    pod: PodProxy, conn: socket.socket, ticket: Ticket | None, task: asyncio.Task[Splice | None]
) -> None:
    """A connection's handler ended: forget its task, log a bug (it never takes the listener down), and close the
    socket unless the handler handed it to a running splice, which the pod then tracks until it is over. The
    connection's admission ticket is released with it: now, or when that splice is over."""
    pod.connections.discard(task)
    if not task.cancelled():
        if (exc := task.exception()) is not None:
            log.error("pod %s: connection handler failed", pod.uid, exc_info=exc)
        elif (running := task.result()) is not None:
            if pod.closing:  # handed over while the pod was being stopped: nobody would cancel it later
                running.cancel()
            elif not running.over:
                running.registry = pod.connections if ticket is None else _HeldSplice(pod.connections, ticket)
                pod.connections.add(running)
                return
            if ticket is not None:
                ticket.release()
            return
    if ticket is not None:
        ticket.release()
    if conn.fileno() != -1:  # not closed yet (an HBONE connection's TLS socket took its descriptor, and closed it)
        try:  # noqa: SIM105 - per connection: contextlib.suppress is three Python calls more
            conn.close()
        except OSError:
            pass


@dataclass(frozen=True, slots=True)
class DnsProxySettings:
    """The DNS proxy every pod gets (:mod:`ambit.dns.server`) and where its unanswered queries go."""

    server: DnsServerSettings = field(default_factory=DnsServerSettings)
    fallback: Upstream = field(default_factory=lambda: Upstream(("127.0.0.1",)))
    """The resolvers to forward to when the pod's own resolv.conf cannot be read (:mod:`ambit.inpod.resolvers`)."""
    explicit: bool = False
    """``fallback`` was configured explicitly: use it for every pod, never the pod's resolv.conf."""


@dataclass(slots=True)
class PodProxy:
    """One pod's listeners, their accept loops and live connections."""

    uid: str
    info: WorkloadInfo
    netns: tuple[int, int] = (0, 0)
    """The pod's network namespace as (device, inode): what tells a repeated add from a new sandbox."""
    listeners: list[socket.socket] = field(default_factory=list)
    accept_tasks: list[asyncio.Task[None]] = field(default_factory=list)
    connections: set[asyncio.Task[Splice | None] | Splice] = field(default_factory=set)
    """Handlers still setting a connection up (tasks), and the splices they handed connections to."""
    sockets: NetnsSocketFactory | None = None
    dns: DnsServer | None = None
    datagram_transports: list[asyncio.DatagramTransport] = field(default_factory=list)
    datagram_closed: list[asyncio.Future[None]] = field(default_factory=list)
    last_original_dst: dict[Port, tuple[str, int] | None] = field(default_factory=dict)
    closing: bool = False
    """``aclose`` has started: a splice handed over from now on is cancelled at once."""

    async def stop_accepting(self) -> None:
        """Close the listeners (their accept loops first); the connections accepted so far keep running."""
        for task in self.accept_tasks:
            task.cancel()
        try:
            await asyncio.gather(*self.accept_tasks, return_exceptions=True)
        finally:
            for listener in self.listeners:
                listener.close()
            for transport in self.datagram_transports:
                transport.close()
        await asyncio.gather(*self.datagram_closed)

    async def aclose(self) -> None:
        self.closing = True
        tasks: list[asyncio.Task[Any]] = [*self.accept_tasks]
        for each in list(self.connections):  # a cancelled splice leaves the set at once
            each.cancel()
            if isinstance(each, asyncio.Task):
                tasks.append(each)
        for task in self.accept_tasks:
            task.cancel()
        try:  # the accept loops unregister their listeners first: a closed fd's number is free for reuse
            await asyncio.gather(*self.accept_tasks, return_exceptions=True)
        finally:
            for listener in self.listeners:
                listener.close()
            for transport in self.datagram_transports:
                transport.close()
        await asyncio.gather(*tasks, return_exceptions=True)
        for each in list(self.connections):  # a handler that had just finished may have handed one over since
            each.cancel()
        await asyncio.gather(*self.datagram_closed)
        if self.dns is not None:
            await self.dns.aclose()
        if self.sockets is not None:
            await self.sockets.aclose()


class _DropDatagrams(asyncio.DatagramProtocol):
    """Without a DNS proxy (none configured, or no proxy context): datagrams are dropped; ``closed`` is done once
    the socket really is closed (that happens a tick later)."""

    def __init__(self) -> None:
        self.closed: asyncio.Future[None] = asyncio.get_running_loop().create_future()

    def connection_lost(self, exc: Exception | None) -> None:
        if not self.closed.done():
            self.closed.set_result(None)


class _Acceptor:
    """One listener's accept loop on readiness callbacks (see the module docstring).

    The listener stays registered with the loop for its whole life and each readiness accepts what is queued (up to
    ``ACCEPT_BATCH``, so a busy listener cannot starve the loop), rather than ``loop.sock_accept`` registering and
    unregistering it for every connection.
    """

    __slots__ = (
        "_accept",
        "_armed",
        "_fd",
        "_gate",
        "_handler",
        "_kind",
        "_listener",
        "_loop",
        "_pod",
        "_retry",
        "stopped",
    )

    def __init__(
        self,
        loop: asyncio.AbstractEventLoop,
        pod: PodProxy,
        listener: socket.socket,
        handler: Handler,
        gate: ListenerGate | None = None,
    ) -> None:
        self._loop, self._pod, self._listener, self._handler = loop, pod, listener, handler
        self._gate = gate
        self._fd = listener.fileno()
        # What ``listener.accept()`` does, without reading the listener's family and type again per connection
        # (each an enum made in Python): the accepted socket is of the listener's family, type and protocol.
        self._accept = listener._accept  # type: ignore[attr-defined]  # the _socket method: (fd, peer address)
        self._kind = (listener.family, listener.type, listener.proto)
        self._armed = False
        self._retry: asyncio.TimerHandle | None = None
        self.stopped: asyncio.Future[None] = loop.create_future()
        """Never resolved: the accept loop's task waits on it until cancelled."""

    def start(self) -> None:
        self._retry = None
        if not self._armed:
            self._armed = True
            self._loop.add_reader(self._fd, self._ready)

    def stop(self) -> None:
        if self._retry is not None:
            self._retry.cancel()
            self._retry = None
        if self._armed:
            self._armed = False
            self._loop.remove_reader(self._fd)

    def _ready(self) -> None:
        pod, loop, handler, gate = self._pod, self._loop, self._handler, self._gate
        family, kind, proto = self._kind
        ticket: Ticket | None = None
        for _ in range(ACCEPT_BATCH):
            try:
                fd, peer = self._accept()
            except (BlockingIOError, InterruptedError):
                return
            except OSError as exc:  # EMFILE and friends: keep the listener, slow down
                log.warning("pod %s: accept failed: %s", pod.uid, exc)
                self.stop()
                self._retry = loop.call_later(0.1, self.start)
                return
            conn = socket.socket(family, kind, proto, fileno=fd)
            if gate is not None:
                admitted = gate.admit(peer[0])
                if isinstance(admitted, Refusal):  # over a bound: reset at once, nothing else is spent on it
                    reset(conn)
                    continue
                ticket = admitted
            conn.setblocking(False)
            try:  # noqa: SIM105 - per connection: contextlib.suppress is three Python calls more
                conn.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
            except OSError:  # a connection already reset: its handler finds out
                pass
            # The handler's coroutine is the task itself, and what a wrapper would do (log a bug, close the
            # socket) is a done callback: an idle connection suspends one coroutine frame less.
            task = loop.create_task(handler(conn, ticket))
            pod.connections.add(task)
            task.add_done_callback(functools.partial(_connection_done, pod, conn, ticket))
            if ticket is not None and ticket.pending:  # evicted by a newcomer: the done callback closes the socket
                ticket.on_evict(task.cancel)


class PodListenerManager:
    """Per pod uid, the pod's listeners; implements the ZDS client's ``PodHandler``."""

    def __init__(
        self,
        context: ProxyContext | None = None,
        dns: DnsProxySettings | None = None,
        admission: PodAdmission | None = None,
        *,
        ipv6: bool = True,
    ) -> None:
        self._context = context
        self._dns = dns
        self._listeners = pod_listeners(ipv6=ipv6)
        """Each pod's listeners: both families, or IPv4 only with IPv6 off (:mod:`ambit.inpod.listeners`)."""
        self.admission = admission
        """Each pod's listeners' bounds; None: no gates (the listener layer's own tests)."""
        self._pods: dict[str, PodProxy] = {}
        self.draining = False
        """``stop_accepting`` was called: new pods are refused."""
        self.on_change: Callable[[], None] = lambda: None
        """Called after a pod was added or removed (the daemon re-tracks certificates and counts)."""

    def find_pod(self, uid: str) -> PodProxy | None:
        return self._pods.get(uid)

    @property
    def pods(self) -> dict[str, PodProxy]:
        return self._pods

    async def open_listeners(self, uid: str, info: WorkloadInfo, netns_fd: int) -> None:
        """Open the pod's listeners in the netns ``netns_fd`` (borrowed); raise when any fails.

        Nothing happens when the pod already has its listeners in that very namespace (see the module docstring).
        """
        stat = os.fstat(netns_fd)
        netns = (stat.st_dev, stat.st_ino)
        current = self._pods.get(uid)
        if current is not None and current.netns == netns:
            log.info("pod %s (%s/%s): already served in this netns", uid, info.namespace, info.name)
            return
        if self.draining:
            raise ListenerError(f"pod {info.namespace}/{info.name}: this node proxy is draining and takes no pods")
        await self.stop(uid)
        try:
            listeners = await asyncio.to_thread(open_pod_listeners, netns_fd, self._listeners)
        except ListenerError as exc:  # the nack's message: which pod, which port
            raise ListenerError(f"pod {info.namespace}/{info.name}: {exc}") from exc
        loop = asyncio.get_running_loop()
        pod = PodProxy(uid, info, netns)
        try:
            handlers: dict[Port, Handler] = {}
            if self._context is not None:
                pod.sockets = NetnsSocketFactory(netns_fd, name=f"{info.namespace}/{info.name}")
                await pod.sockets.start()
                local = LocalPod(uid, info, pod.sockets, self._context.settings.trust_domain)
                handlers = self._handlers(self._context, local)
                if self._dns is not None:
                    if "ambit.dns.server" not in sys.modules:  # the first pod's, off the loop
                        await asyncio.to_thread(importlib.import_module, "ambit.dns.server")
                    pod.dns = dns = self._dns_server(self._context, local, pod.sockets, netns, self._dns)
                    handlers[Port.DNS] = lambda sock, ticket: dns.serve_tcp(sock)  # bounded by the DNS server
            gates = self.admission.gates() if self.admission is not None else {}
            for listener in listeners:
                port = listener.spec.port
                if listener.spec.kind == socket.SOCK_DGRAM:
                    factory: Callable[[], _DropDatagrams | DnsDatagramProtocol] = (
                        _DropDatagrams if pod.dns is None else pod.dns.datagram_protocol
                    )
                    transport, protocol = await loop.create_datagram_endpoint(factory, sock=listener.sock)
                    pod.datagram_transports.append(transport)
                    pod.datagram_closed.append(protocol.closed)
                    continue
                pod.listeners.append(listener.sock)
                handler = handlers.get(port) or self._capture_handler(pod, port)
                task = asyncio.create_task(
                    self._accept_loop(pod, listener.sock, handler, gates.get(port)),
                    name=f"accept {info.namespace}/{info.name}:{port}",
                )
                pod.accept_tasks.append(task)
        except BaseException:
            try:
                await pod.aclose()
            finally:
                for listener in listeners:
                    listener.sock.close()
            raise
        self._pods[uid] = pod
        if self._context is not None:
            self._context.add_pod(local)
        log.info("pod %s (%s/%s): listeners open", uid, info.namespace, info.name)
        self.on_change()

    @staticmethod
    def _handlers(context: ProxyContext, local: LocalPod) -> dict[Port, Handler]:
        return {
            Port.OUTBOUND: lambda sock, ticket: serve_outbound(context, local, sock),
            Port.INBOUND_PLAINTEXT: lambda sock, ticket: serve_plaintext(context, local, sock),
            Port.INBOUND_HBONE: lambda sock, ticket: serve_hbone(context, local, sock, ticket),
        }

    @staticmethod
    def _dns_server(
        context: ProxyContext,
        local: LocalPod,
        sockets: NetnsSocketFactory,
        netns: tuple[int, int],
        settings: DnsProxySettings,
    ) -> DnsServer:
        """The pod's DNS proxy: the pod is the client, its netns makes the upstream sockets.

        The first pod's start imports the DNS proxy, in a thread (once); dnspython (about 4 MiB) comes with the
        first query its fast path declines (:mod:`ambit.dns.server`): a node proxy without pods, with the DNS proxy
        off, or whose pods ask only mesh names, never holds it."""
        from ambit.dns.forwarder import Forwarder
        from ambit.dns.resolution import DnsClient
        from ambit.dns.server import DnsServer

        info = local.info

        def client() -> DnsClient:
            workload = context.find_local_workload(local)
            if workload is None:
                return DnsClient(info.namespace, context.settings.network, info.name)
            return DnsClient(
                info.namespace, workload.network, info.name, workload.canonical_name, workload.canonical_revision
            )

        resolvers = PodResolvers(netns, settings.fallback, explicit=settings.explicit)
        return DnsServer(
            context.state, client, Forwarder(sockets), resolvers.upstream, context.metrics, settings.server
        )

    @staticmethod
    def _capture_handler(pod: PodProxy, port: Port) -> Handler:
        async def capture(sock: socket.socket, ticket: Ticket | None) -> None:
            dst = original_dst(sock) if port in (Port.OUTBOUND, Port.INBOUND_PLAINTEXT) else None
            pod.last_original_dst[port] = dst
            log.info("pod %s: connection on %d for %s", pod.uid, port, dst)
            sock.close()

        return capture

    @staticmethod
    async def _accept_loop(
        pod: PodProxy, listener: socket.socket, handler: Handler, gate: ListenerGate | None = None
    ) -> None:
        """Accept connections on ``listener`` (non-blocking), admitted by ``gate`` if any, and start ``handler`` for
        each, until cancelled."""
        acceptor = _Acceptor(asyncio.get_running_loop(), pod, listener, handler, gate)
        acceptor.start()
        try:
            await acceptor.stopped
        finally:  # before the listener is closed: its fd number may be reused at once
            acceptor.stop()

    async def stop(self, uid: str) -> None:
        pod = self._pods.pop(uid, None)
        if pod is None:
            return
        if self._context is not None:
            self._context.remove_pod(uid)
        await pod.aclose()
        log.info("pod %s: listeners closed", uid)
        self.on_change()

    async def stop_accepting(self) -> None:
        """Close every pod's listeners and take no new pods; connections keep running (module docstring)."""
        self.draining = True
        await asyncio.gather(*(pod.stop_accepting() for pod in self._pods.values()))

    async def aclose(self) -> None:
        for uid in list(self._pods):
            await self.stop(uid)
