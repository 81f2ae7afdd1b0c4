"""A TLS connection to a ``DYNAMIC_DNS`` ServiceEntry host, relayed to the server its ClientHello names.

Theory of operation: the shell half of :mod:`ambit.waypoint.dynamic_hosts` for a port declared TLS (Envoy's SNI
dynamic forward proxy in front of its TCP proxy, as istiod builds it for a waypoint). The waypoint never terminates
the client's TLS: it reads the ClientHello only to learn the server name, and relays the bytes, the ClientHello
included, to that name resolved, at the port's target port.

Rules:

1. The CONNECT is accepted first (the ClientHello comes inside the tunnel), then at most
   :data:`~ambit.tls.clienthello.HELLO_LIMIT` bytes are read for at most ``sniff_timeout`` seconds
   (:func:`ambit.waypoint.ingress_connections.read_hello`). A malformed, oversized or late hello, or a close before
   it is whole, closes the tunnel; nothing is resolved or dialled.
2. The server name is judged by :func:`~ambit.waypoint.dynamic_hosts.plan_server_name`: no name, an IP literal,
   or a name the entry's host does not cover closes the tunnel, counted as a connection without a route; nothing is
   resolved or dialled.
3. Otherwise the connection goes as any TCP connection through the waypoint does
   (:func:`ambit.waypoint.tcp.relay_to`): the waypoint's policies are checked once, the name is resolved
   (bounded cache and lookups, :class:`~ambit.proxy.hostnames.HostnameResolver`) and the answer judged
   (:func:`~ambit.waypoint.destinations.judge_resolved`); a name that does not resolve closes the tunnel with a
   connect failure. The DestinationRule's settings apply as for any endpoint (a PROXY header; originated TLS over
   the client's TLS is the rule's own business).
4. The hello read in rule 1 goes to the server as the relay's own first write, not held back to be joined with
   later bytes (the server answers it before the client sends more). Every socket on the path has
   ``TCP_NODELAY`` (the HBONE connection the waypoint accepted, the connection it dials from its socket factory),
   so neither the hello nor the handshake's later small records wait for a delayed ACK; a client that dials the
   waypoint without it (not a node proxy) stalls its own small writes by about 40 ms a connection.
"""

from __future__ import annotations

import dataclasses
import logging

from ambit.proxy.hbone_server import TunnelResponder
from ambit.tls.clienthello import HELLO_LIMIT
from ambit.waypoint.context import Tunnel, WaypointContext
from ambit.waypoint.destinations import PLAIN, Refusal, ServiceTarget, in_dialled_family
from ambit.waypoint.dynamic_hosts import plan_server_name
from ambit.waypoint.errors import HelloRefusedError
from ambit.waypoint.ingress_connections import read_hello
from ambit.waypoint.tcp import relay_to
from ambit.waypoint.traffic_policy import DEFAULT as DEFAULT_BACKEND

__all__ = ["serve_by_server_name"]

log = logging.getLogger("ambit.waypoint.dynamic_tls")


async def serve_by_server_name(ctx: WaypointContext, tunnel: Tunnel, responder: TunnelResponder) -> None:
    """Relay one TLS tunnel to a ``DYNAMIC_DNS`` Service to the server its ClientHello names (the module rules)."""
    target = tunnel.target
    if not isinstance(target, ServiceTarget):
        raise AssertionError("a workload-addressed tunnel is never forwarded by server name")
    stream = responder.accept()  # rule 1

    async def recv(_limit: int) -> bytes:
        return await stream.read()

    try:
        prefix, hello = await read_hello(recv, ctx.limits.sniff_timeout, HELLO_LIMIT)
    except HelloRefusedError as exc:
        log.info("tls %s from %s: %s", tunnel.authority, tunnel.peer_addr, exc)
        stream.abort()
        return
    planned = ctx.routes.plan_backend(target.backend)
    backend = None if isinstance(planned, Refusal) or planned is DEFAULT_BACKEND else planned
    transport = dataclasses.replace(backend.transport, h2=False) if backend is not None else PLAIN
    found = plan_server_name(target.service, target.port, hello.server_name, transport)  # rule 2
    refusal = planned if isinstance(planned, Refusal) else found if isinstance(found, Refusal) else None
    if refusal is not None or isinstance(found, Refusal):
        log.info("tls %s from %s: %s; closed", tunnel.authority, tunnel.peer_addr, refusal.reason if refusal else "")
        await relay_to(ctx, tunnel, None, stream)
        return
    await relay_to(ctx, tunnel, in_dialled_family(found, target), stream, prefix, backend)  # rule 3
