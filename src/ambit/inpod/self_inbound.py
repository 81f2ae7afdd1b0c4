"""The node proxy's self-proxy listener: HBONE to its own pod, as ztunnel's ``create_ztunnel_self_proxy_listener``.

Theory of operation: in a cluster the node proxy runs in a pod of its own (its own netns and address), and its metrics
port serves every scraper. A meshed client that calls that address would send it in clear unless the proxy's own pod
speaks HBONE: the control plane marks it so when the pod carries ``networking.istio.io/tunnel: http`` (istiod's
``SupportsTunnel``), and then clients' node proxies tunnel to ``<its address>:15008``. This listener answers there
with the proxy's own identity, in its own netns, through the same inbound path as a pod's 15008
(:func:`ambit.proxy.inbound.serve_hbone`), so the mesh's policies for that workload apply and the connection is
counted with ``reporter="destination"``.

Rules:

1. It runs only when the proxy knows who its pod is: ``POD_NAME``, ``POD_NAMESPACE``, ``SERVICE_ACCOUNT`` and
   ``INSTANCE_IP`` (the DaemonSet's downward API), as ztunnel reads them. A lab's host-process node proxy has no
   pod and opens nothing.
2. It listens on ``<INSTANCE_IP>:15008`` with ``SO_REUSEPORT``, so that a successor started for a hand-over binds too.
3. A tunnel may reach only the proxy's ports that serve others (:data:`~ambit.proxy.plans.SELF_SERVED_PORTS`: metrics
   and readiness); any other port of the proxy is refused 400 as for a pod. The proxy dials its own address from its
   own address, never from the client's (ztunnel disables freebind here likewise).
4. Its connections are admitted by ``gate`` (:mod:`ambit.proxy.admission`: the node's budget, its own bounds on
   connections and on TLS handshakes in progress, in total and per peer address); one over a bound is reset at
   accept.
5. The workload must be in the state (the control plane's view of the proxy's pod); until it is, tunnels wait as a
   pod's do and are refused 503 when it does not come.
"""

from __future__ import annotations

import asyncio
import contextlib
import functools
import logging
import socket

from ambit.hbone.headers import hostport
from ambit.proxy.admission import ListenerGate, ListenerLimits, NodeBudget, Refusal, Ticket
from ambit.proxy.context import LocalPod, ProxyContext
from ambit.proxy.inbound import serve_hbone
from ambit.proxy.sockets import HostSocketFactory, close_when_done, reset
from ambit.zds.protocol import WorkloadInfo

log = logging.getLogger("ambit.inpod.self_inbound")

HBONE_PORT = 15008
BACKLOG = 128


class SelfInbound:
    """The listener of the module docstring; ``start`` then ``aclose``."""

    def __init__(
        self,
        context: ProxyContext,
        info: WorkloadInfo,
        address: str,
        port: int = HBONE_PORT,
        gate: ListenerGate | None = None,
    ) -> None:
        self._context = context
        self.gate = gate or ListenerGate("self_hbone", ListenerLimits(), NodeBudget(), handshake=True)
        self._address = (address, port)
        uid = f"self:{info.namespace}/{info.name}"
        self.pod = LocalPod(uid, info, HostSocketFactory(mark=None), context.settings.trust_domain, itself=True)
        self._listener: socket.socket | None = None
        self._accepting: asyncio.Task[None] | None = None
        self._serving: set[asyncio.Task[None]] = set()

    @property
    def address(self) -> tuple[str, int]:
        """Where it listens (the port the kernel chose when asked for 0)."""
        if self._listener is None:
            return self._address
        host, port = self._listener.getsockname()[:2]
        return str(host), int(port)

    async def start(self) -> None:
        family = socket.AF_INET6 if ":" in self._address[0] else socket.AF_INET
        sock = socket.socket(family, socket.SOCK_STREAM)
        try:
            sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
            sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEPORT, 1)  # rule 2
            sock.bind(self._address)
            sock.listen(BACKLOG)
            sock.setblocking(False)
        except OSError:
            sock.close()
            raise
        self._listener = sock
        self._accepting = asyncio.create_task(self._accept(sock), name="self-proxy listener")
        where = hostport(*self.address)
        log.info("self-proxy listener on %s for %s/%s", where, self.pod.info.namespace, self.pod.info.name)

    async def _accept(self, listener: socket.socket) -> None:
        loop = asyncio.get_running_loop()
        while True:
            try:
                conn, peer = await loop.sock_accept(listener)
            except OSError as exc:  # EMFILE and friends: keep the listener, slow down
                log.warning("self-proxy listener: accept failed: %s", exc)
                await asyncio.sleep(0.1)
                continue
            ticket = self.gate.admit(peer[0])  # rule 4
            if isinstance(ticket, Refusal):
                reset(conn)
                continue
            conn.setblocking(False)
            task = asyncio.create_task(self._serve(conn, ticket))
            self._serving.add(task)
            task.add_done_callback(self._serving.discard)
            # Even if cancelled before it ran (evicted by a newcomer, or the listener closing): place and socket.
            task.add_done_callback(ticket.release_when_done)
            task.add_done_callback(functools.partial(close_when_done, conn))
            ticket.on_evict(task.cancel)

    async def _serve(self, conn: socket.socket, ticket: Ticket) -> None:
        try:
            await serve_hbone(self._context, self.pod, conn, ticket)
        except Exception:  # a bug: the listener keeps going
            log.exception("self-proxy listener: a connection failed")
            conn.close()

    async def stop_accepting(self) -> None:
        """Close the listener; connections keep running (a drain)."""
        if self._accepting is not None:
            self._accepting.cancel()
            with contextlib.suppress(asyncio.CancelledError):
                await self._accepting
            self._accepting = None
        if self._listener is not None:
            self._listener.close()
            self._listener = None

    async def aclose(self) -> None:
        await self.stop_accepting()
        for task in list(self._serving):
            task.cancel()
        await asyncio.gather(*self._serving, return_exceptions=True)
