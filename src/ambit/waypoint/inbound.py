"""HBONE into the waypoint (spec §6.5 as a waypoint does it): mutual TLS on 15008, one handler per CONNECT.

Theory of operation: :func:`serve_connection` runs one accepted TCP connection through
:class:`~ambit.proxy.hbone_server.HboneServer`: TLS 1.3 with the waypoint's own certificate (fetched lazily: the
listener accepts before the certificate is there), a client certificate that chains to the mesh root with a
SPIFFE id of our trust domain, ALPN h2. Each CONNECT then:

1. is refused 503 when ``max_tunnels`` are being served already, or when the waypoint has not got its
   certificate and first workload state within ``startup_wait`` (lazy start);
2. is judged by :func:`~ambit.waypoint.destinations.plan_tunnel`; a destination not bound to this waypoint (or,
   with a config from the control plane, a Service its WaypointConfig does not list yet: the policies for it are
   not in) is judged again after each workload state or WaypointConfig update for up to ``binding_wait`` seconds
   (the client's node proxy may have heard of a new binding before this waypoint did: make-before-break when a
   ``use-waypoint`` label moves here), by at most ``max_binding_waits`` tunnels at once (the rest are judged at
   once); a refusal answers its status (400), is logged
   with its reason and counted (``istio_tcp_connections_failed_total{reporter="waypoint",response_flags="NR"}``
   and the ``refused`` tally of ``/config_dump``);
3. goes by the Service port's ``appProtocol``: a TCP port reaches its endpoint first and answers 200 only then
   (503 when it cannot, as ztunnel does; :func:`~ambit.waypoint.tcp.serve_tcp`), except a TLS port of a
   ``DYNAMIC_DNS`` ServiceEntry host, which is accepted and relayed to the server its ClientHello names
   (:func:`~ambit.waypoint.dynamic_tls.serve_by_server_name`); a port declared HTTP/1.1,
   HTTP/2 or gRPC is accepted and served per request in the version the client opens with, as Envoy's
   automatic codec does (:func:`read_preface`): the HTTP/2 preface on our HTTP/2 engine
   (:func:`~ambit.waypoint.http2_proxy.serve_http2`), anything else as HTTP/1.1
   (:func:`~ambit.waypoint.http1_proxy.serve_http1`, which answers 400 to bytes that are not HTTP); a port of
   unknown protocol is accepted and sniffed (:func:`sniff`), then served as HTTP/1.1, HTTP/2 or TCP. The version
   spoken to the endpoint is decided per request from the backend port's declaration and its DestinationRule
   (:func:`~ambit.waypoint.traffic_policy.plan_upstream_h2`), not from the shell that took the request.

The tunnel is the handler's until it returns; HboneServer then closes it.
"""

from __future__ import annotations

import asyncio
import collections
import ipaddress
import logging
import socket
import ssl
from collections.abc import Awaitable, Callable
from typing import TypeVar

from ambit.errors import AmbitError
from ambit.hbone.headers import hostport
from ambit.hbone.settings import HboneSettings
from ambit.model.workload import AppProtocol
from ambit.proxy.admission import Ticket
from ambit.proxy.hbone_server import HboneServer, InboundRequest, TunnelResponder
from ambit.proxy.streams import ByteStream
from ambit.telemetry.metrics import Reporter, SecurityPolicy, TrafficLabels
from ambit.tls.socket_transport import TlsTransportKind
from ambit.tls.workload import WorkloadCertificate
from ambit.waypoint.context import Tunnel, WaypointContext
from ambit.waypoint.destinations import Refusal, ServiceTarget, Target, plan_tunnel
from ambit.waypoint.dynamic_tls import serve_by_server_name
from ambit.waypoint.http1_proxy import serve_http1
from ambit.waypoint.http2_proxy import serve_http2
from ambit.waypoint.sniff import Protocol, h2_prior_knowledge, sniff
from ambit.waypoint.tcp import serve_tcp

log = logging.getLogger("ambit.waypoint.inbound")


async def read_protocol(stream: ByteStream, timeout: float) -> tuple[bytes, AppProtocol]:  # noqa: ASYNC109
    """Read the client's first bytes (for at most ``timeout`` seconds) until :func:`ambit.waypoint.sniff.sniff`
    decides; a client that sends nothing in time (a server-first protocol) is TCP. Returns the bytes read, which
    the caller passes on, and the protocol as the workload state names it."""
    data, verdict = await _read_until(stream, timeout, sniff)
    if verdict is None:
        verdict = sniff(data, final=True) or Protocol.TCP
    return data, _AS_APP_PROTOCOL[verdict]


async def read_preface(stream: ByteStream, timeout: float) -> tuple[bytes, AppProtocol]:  # noqa: ASYNC109
    """On a port declared HTTP (HTTP/1.1, HTTP/2 or gRPC): read while the client's bytes are a prefix of the
    HTTP/2 preface (at most ``timeout`` seconds, at most the preface's length plus one read); HTTP2 for the
    preface (:func:`ambit.waypoint.sniff.h2_prior_knowledge`), else HTTP11 (silence and partial prefaces too).
    Returns the bytes read, which the caller passes on."""
    data, h2 = await _read_until(stream, timeout, h2_prior_knowledge)
    return data, AppProtocol.HTTP2 if h2 else AppProtocol.HTTP11


_T = TypeVar("_T")


async def _read_until(
    stream: ByteStream,
    timeout: float,  # noqa: ASYNC109
    decide: Callable[[bytes], _T | None],
) -> tuple[bytes, _T | None]:
    """Read until ``decide`` answers, the stream ends or ``timeout`` passes (then None)."""
    data = b""
    verdict: _T | None = None
    try:
        async with asyncio.timeout(timeout):
            while (verdict := decide(data)) is None:
                chunk = await stream.read()
                if not chunk:
                    break
                data += chunk
    except TimeoutError:
        pass
    return data, verdict


_PER_REQUEST = frozenset({AppProtocol.UNKNOWN, AppProtocol.HTTP11, AppProtocol.HTTP2, AppProtocol.GRPC})

_AS_APP_PROTOCOL = {
    Protocol.HTTP1: AppProtocol.HTTP11,
    Protocol.HTTP2: AppProtocol.HTTP2,
    Protocol.TCP: AppProtocol.TCP,
}


class Startup:
    """Lazy start: tunnels wait (bounded) until the certificate and the first workload state are in; and later
    workload state and WaypointConfig updates, which tunnels for a destination not (yet) bound to this waypoint wait
    for (rule 2)."""

    def __init__(self) -> None:
        self.ready = asyncio.Event()
        self._changed = asyncio.Event()
        self.binding_waits = 0
        """Tunnels waiting for a binding now (at most ``WaypointLimits.max_binding_waits``)."""

    def state_changed(self) -> None:
        """Wake the tunnels waiting for a state (or config) update."""
        self._changed.set()
        self._changed = asyncio.Event()

    async def wait_state_change(self, timeout: float) -> bool:  # noqa: ASYNC109 - the binding wait's bound
        changed = self._changed
        try:
            async with asyncio.timeout(timeout):
                await changed.wait()
        except TimeoutError:
            return False
        return True

    async def wait(self, timeout: float) -> bool:  # noqa: ASYNC109 - the lazy-start bound
        if self.ready.is_set():
            return True
        try:
            async with asyncio.timeout(timeout):
                await self.ready.wait()
        except TimeoutError:
            return False
        return True


class Refusals:
    """Refused tunnels by reason class, for ``/config_dump``."""

    def __init__(self) -> None:
        self.by_status: collections.Counter[int] = collections.Counter()
        self.handshake_failures = 0


async def serve_connection(
    ctx: WaypointContext,
    startup: Startup,
    refusals: Refusals,
    sock: socket.socket,
    certificate: Callable[[], Awaitable[WorkloadCertificate]],
    trust_domain: str,
    ticket: Ticket | None = None,
    tls_transport: TlsTransportKind = "socket",
) -> None:
    """Serve one accepted connection on the HBONE port; never raises for peer trouble. ``ticket`` is its place at
    the listener (:mod:`ambit.proxy.admission`; the caller releases it): established once the client is judged.
    ``tls_transport`` is HBONE's TLS transport (:class:`~ambit.waypoint.settings.WaypointSettings`)."""
    settings = HboneSettings(max_concurrent_streams=ctx.limits.max_tunnels_per_connection)

    def failed(reason: str) -> None:
        refusals.handshake_failures += 1

    async def handle(request: InboundRequest, responder: TunnelResponder) -> None:
        await _serve_tunnel(ctx, startup, refusals, request, responder)

    try:
        await HboneServer.serve(
            sock,
            certificate,
            trust_domain=trust_domain,
            handler=handle,
            settings=settings,
            on_failure=failed,
            ticket=ticket,
            handshake_timeout=ctx.limits.handshake_timeout,
            tls_transport=tls_transport,
        )
    except (AmbitError, OSError, ssl.SSLError) as exc:
        log.info("HBONE connection failed: %s", exc)


def _plan(ctx: WaypointContext, authority: str) -> Target | Refusal:
    """:func:`plan_tunnel` on the current state and, when the config comes from the control plane, its list of
    bound Services."""
    return plan_tunnel(authority, ctx.state, ctx.me, ctx.routes.listed if ctx.serve_listed_only else None)


async def _plan_after_binding(ctx: WaypointContext, startup: Startup, authority: str) -> Target | Refusal:
    """Rule 2, with its wait for a binding: a destination this waypoint does not serve is judged again after each
    state or config update, for at most ``binding_wait`` seconds, by at most ``max_binding_waits`` tunnels at once."""
    plan = _plan(ctx, authority)
    if not isinstance(plan, Refusal) or not plan.unbound or startup.binding_waits >= ctx.limits.max_binding_waits:
        return plan
    loop = asyncio.get_running_loop()
    deadline = loop.time() + ctx.limits.binding_wait
    startup.binding_waits += 1
    try:
        while isinstance(plan, Refusal) and plan.unbound:
            left = deadline - loop.time()
            if left <= 0 or not await startup.wait_state_change(left):
                break
            plan = _plan(ctx, authority)
    finally:
        startup.binding_waits -= 1
    return plan


async def _serve_tunnel(
    ctx: WaypointContext, startup: Startup, refusals: Refusals, request: InboundRequest, responder: TunnelResponder
) -> None:
    peer_addr = hostport(*request.peer_addr)
    if ctx.tunnels >= ctx.limits.max_tunnels:  # rule 1
        _refuse(ctx, refusals, request, responder, Refusal(503, "too many tunnels"))
        return
    if not await startup.wait(ctx.limits.startup_wait):
        _refuse(ctx, refusals, request, responder, Refusal(503, "waypoint not ready (certificate or xDS)"))
        return
    plan = await _plan_after_binding(ctx, startup, request.authority)  # rule 2
    if isinstance(plan, Refusal):
        _refuse(ctx, refusals, request, responder, plan)
        return
    try:
        source = ctx.state.find_workload_by_address(ctx.me.network, ipaddress.ip_address(request.peer_addr[0]))
    except ValueError:
        source = None
    tunnel = Tunnel(plan, request.authority, request.peer_identity, peer_addr, source)
    ctx.tunnels += 1
    stream = None
    try:
        protocol = plan.protocol
        if protocol is AppProtocol.TLS and isinstance(plan, ServiceTarget) and ctx.routes.is_dynamic(plan.service.key):
            await serve_by_server_name(ctx, tunnel, responder)  # rule 3: by the ClientHello's server name
            return
        if protocol not in _PER_REQUEST:  # rule 3: declared TCP (or TLS)
            await serve_tcp(ctx, tunnel, responder)
            return
        stream = responder.accept()
        if protocol is AppProtocol.UNKNOWN:
            prefix, spoken = await read_protocol(stream, ctx.limits.sniff_timeout)
        else:  # declared HTTP/1.1, HTTP/2 or gRPC: either version, as Envoy's automatic codec takes them
            prefix, spoken = await read_preface(stream, ctx.limits.sniff_timeout)
        if spoken is AppProtocol.HTTP11:
            await serve_http1(ctx, tunnel, stream, prefix)
        elif spoken is AppProtocol.HTTP2:
            await serve_http2(ctx, tunnel, stream, prefix)
        else:
            await serve_tcp(ctx, tunnel, stream, prefix)
    except (AmbitError, OSError) as exc:
        log.info("tunnel %s from %s ended: %s", request.authority, peer_addr, exc)
        if stream is not None:
            stream.abort()
        elif responder.status is None:
            responder.reject(503)
    finally:
        ctx.tunnels -= 1


def _refuse(
    ctx: WaypointContext, refusals: Refusals, request: InboundRequest, responder: TunnelResponder, refusal: Refusal
) -> None:
    refusals.by_status[refusal.status] += 1
    log.warning(
        "refused CONNECT %r from %s (%s): %d %s",
        request.authority[:300],
        hostport(*request.peer_addr),
        request.peer_identity,
        refusal.status,
        refusal.reason,
    )
    ctx.metrics.connection_failed(
        TrafficLabels(
            Reporter.WAYPOINT,
            source_principal=str(request.peer_identity),
            response_flags="NR",
            connection_security_policy=SecurityPolicy.MUTUAL_TLS,
        )
    )
    responder.reject(refusal.status)
