"""Connections on the ingress gateway's TLS (passthrough), TCP and TLS_TERMINATE listeners: routed whole, relayed as
bytes.

Theory of operation: a TLS passthrough listener never terminates TLS. It peeks at the client's ClientHello
(:func:`peek_hello`, sans-IO parsing by :func:`ambit.tls.clienthello.read_client_hello`) only to learn the server
name, picks the virtual host with it (:meth:`~ambit.waypoint.ingress_routing.IngressRouter.find_connection_route`),
and relays the connection, ClientHello included (still in the socket), to one endpoint of the chosen backend over
HBONE, where the backend terminates TLS. A TCP listener does the same without reading anything first. A
TLS_TERMINATE listener terminates TLS as an HTTPS listener does (:mod:`ambit.waypoint.ingress_tls`: the server name
picks the listener and its certificate, its clients are verified) and relays the decrypted bytes as a TCP listener
would.

Rules:

1. A TLS port looks at most ``limit`` bytes (16 KiB, :data:`~ambit.tls.clienthello.HELLO_LIMIT`) into the
   connection, for at most ``timeout`` seconds, until they hold a whole ClientHello (:func:`peek_hello`, which
   leaves them in the socket; :func:`read_hello` takes them, for callers that relay them as a prefix: the
   waypoint's :mod:`ambit.waypoint.dynamic_tls`). A malformed or oversized hello, silence, or a close before it is
   complete: :class:`HelloRefusedError`, the connection is closed and nothing is relayed.
2. :func:`plan_backend` (pure) picks the backend: the virtual host the server name selects (empty for TCP, or a
   hello without a name), then one of its backends by weight. No virtual host, all weights 0, or a backend that
   did not resolve: :class:`Closed`, with the reason.
3. The backend's endpoint is chosen as an HTTP request's would be (the gateway's pick: a Service with
   ``istio.io/ingress-use-waypoint`` is reached through its waypoint), as the Service's DestinationRule says
   (:func:`ambit.waypoint.tcp.pick_connection_endpoint`: subset, load balancer, originated TLS, PROXY header; its
   connection limits apply to the relay); a Service the gateway does not know, a subset no rule defines, or no
   endpoint closes the connection.
4. The gateway's policies are checked once per connection, then both directions are relayed (the ClientHello
   first, as the client sent it) (:func:`ambit.waypoint.tcp.relay_to`: ``istio_tcp_*`` metrics with reporter="source",
   one access-log line, idle timeout).
5. The peeked server name picks the listener; on a port where TLS listeners pass through and terminate side by
   side, that decides between the two, the bytes still in the socket for the TLS handshake of a terminating
   listener or the relay of a passthrough one. (Peeking rather than reading also spares the relay a separate
   first write of the hello: a passthrough port that read it served 21 connections/s on loopback, 48 ms each, where
   the peek serves 350.) A terminated
   connection is served only by the listener its handshake picked, and only when that is the listener the peeked
   server name picked (:mod:`ambit.waypoint.ingress`): a client cannot have its hello read one way and its
   handshake another. A passthrough listener never decrypts: what follows the ClientHello, garbage included, is
   relayed to its backend as it came.
"""

from __future__ import annotations

import asyncio
import contextlib
import socket
from collections.abc import Awaitable, Callable
from dataclasses import dataclass

from ambit.model.routes import BackendService
from ambit.tls.clienthello import HELLO_LIMIT, ClientHello, ClientHelloError, read_client_hello
from ambit.waypoint.context import WaypointContext
from ambit.waypoint.destinations import Endpoint, Refusal, choose_weighted, find_backend_service
from ambit.waypoint.errors import HelloRefusedError
from ambit.waypoint.ingress_routing import IngressRouter
from ambit.waypoint.tcp import pick_connection_endpoint
from ambit.waypoint.traffic_policy import BackendPolicy

__all__ = ["Closed", "find_connection_endpoint", "peek_hello", "plan_backend", "read_hello"]


@dataclass(frozen=True, slots=True)
class Closed:
    """The connection is closed without being relayed (rule 2)."""

    reason: str


async def read_hello(
    recv: Callable[[int], Awaitable[bytes]],
    timeout: float,  # noqa: ASYNC109 - rule 1's bound, part of what a refused hello reports
    limit: int = HELLO_LIMIT,
) -> tuple[bytes, ClientHello]:
    """Rule 1: the bytes read and the ClientHello they begin with. ``recv(n)`` reads at most ``n`` bytes."""
    data = b""
    try:
        async with asyncio.timeout(timeout):
            while True:
                chunk = await recv(max(1, limit - len(data)))
                if not chunk:
                    raise HelloRefusedError("the client closed before its ClientHello was complete")
                data += chunk
                hello = read_client_hello(data, limit=limit)
                if hello is not None:
                    return data, hello
    except ClientHelloError as exc:
        raise HelloRefusedError(exc.reason) from None
    except TimeoutError:
        raise HelloRefusedError(f"no whole ClientHello within {timeout:g}s") from None


async def peek_hello(
    sock: socket.socket,
    timeout: float,  # noqa: ASYNC109 - rule 1's bound, part of what a refused hello reports
    limit: int = HELLO_LIMIT,
) -> ClientHello:
    """Rule 5: the ClientHello at the head of ``sock``'s received bytes, read without taking them: they stay in the
    socket for whoever serves the connection next (a TLS handshake, or the relay). Bounded as :func:`read_hello`.
    While the hello is incomplete the socket's low-water mark (``SO_RCVLOWAT``) asks the kernel to wake us only once
    more bytes than those seen have come, so a slow client costs one wake-up per segment, not a busy loop. A
    wake-up without more bytes is the client's end of stream on TCP (Linux reports a socket readable below the mark
    only then), which the connection's state confirms (``CLOSE_WAIT``); any other is waited out in short pauses."""
    loop = asyncio.get_running_loop()
    seen = 0
    try:
        async with asyncio.timeout(timeout):
            while True:
                await _readable(loop, sock)
                data = sock.recv(limit, socket.MSG_PEEK)
                if not data:
                    raise HelloRefusedError("the client closed before its ClientHello was complete")
                if len(data) == seen:  # readable below the mark: the client's end of stream, or a spurious wake
                    if _peer_closed(sock):
                        raise HelloRefusedError("the client closed before its ClientHello was complete")
                    await asyncio.sleep(_NO_NEWS_PAUSE)
                    continue
                seen = len(data)
                hello = read_client_hello(data, limit=limit)
                if hello is not None:
                    return hello
                if seen >= limit:
                    raise HelloRefusedError(f"no whole ClientHello within {limit} bytes")
                sock.setsockopt(socket.SOL_SOCKET, socket.SO_RCVLOWAT, seen + 1)
    except ClientHelloError as exc:
        raise HelloRefusedError(exc.reason) from None
    except TimeoutError:
        raise HelloRefusedError(f"no whole ClientHello within {timeout:g}s") from None
    except BlockingIOError:
        raise HelloRefusedError("the socket had nothing to read when it said it had") from None
    finally:
        with contextlib.suppress(OSError):
            sock.setsockopt(socket.SOL_SOCKET, socket.SO_RCVLOWAT, 1)


_NO_NEWS_PAUSE = 0.01
"""Seconds to wait after a wake-up that brought no bytes and no end of stream (a socket whose kind does not honour
``SO_RCVLOWAT``): bounds the cost of such a wait at 100 looks a second, until the hello's timeout."""
_CLOSED_STATES = frozenset({7, 8, 9})
"""Linux ``tcpi_state`` of a connection whose peer has sent its FIN: TCP_CLOSE, TCP_CLOSE_WAIT, TCP_LAST_ACK."""


def _peer_closed(sock: socket.socket) -> bool:
    """The peer has ended its stream (TCP, from ``TCP_INFO``); False when that cannot be told."""
    try:
        info = sock.getsockopt(socket.IPPROTO_TCP, socket.TCP_INFO, 8)
    except OSError:
        return False
    return bool(info) and info[0] in _CLOSED_STATES


async def _readable(loop: asyncio.AbstractEventLoop, sock: socket.socket) -> None:
    waiter: asyncio.Future[None] = loop.create_future()

    def ready() -> None:
        if not waiter.done():
            waiter.set_result(None)

    loop.add_reader(sock.fileno(), ready)
    try:
        await waiter
    finally:
        loop.remove_reader(sock.fileno())


def plan_backend(
    router: IngressRouter, port: int, server_name: str, random: float, listener: str = ""
) -> BackendService | Closed:
    """Rule 2, with ``random`` in [0, 1) for the weighted draw; ``listener`` the listener a terminating handshake
    picked (empty: pick by ``server_name``)."""
    route = router.find_connection_route(port, server_name, listener)
    if route is None:
        return Closed(f"no route for server name {server_name!r}" if server_name else "no route")
    chosen = choose_weighted(route.tcp_backends, random)
    if chosen is None:
        return Closed("every backend has weight 0")
    if chosen.backend is None:
        return Closed("the chosen backend did not resolve")
    return chosen.backend


def find_connection_endpoint(
    ctx: WaypointContext, backend: BackendService, peer_addr: str
) -> tuple[Endpoint, BackendPolicy | None] | Closed:
    """Rule 3: the endpoint and the DestinationRule plan it was chosen by (None without a rule)."""
    service = find_backend_service(ctx.state, backend)
    if service is None:
        return Closed(f"unknown backend {backend.hostname}")
    picked = pick_connection_endpoint(ctx, backend, service, peer_addr)
    if isinstance(picked, Refusal):
        return Closed(picked.reason)
    endpoint, planned = picked
    return (endpoint, planned) if endpoint is not None else Closed(f"no healthy endpoint of {backend.hostname}")
