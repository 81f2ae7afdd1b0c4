"""One accepted connection of the ingress gateway, served from its admission to its close by the protocol of its
port's listeners (the listeners themselves, the configuration and the bounds are :mod:`ambit.waypoint.ingress`'s).

Theory of operation: :class:`ListenerConnections` is the part of :class:`~ambit.waypoint.ingress.IngressGateway`
that takes a socket its port's gate admitted (:mod:`ambit.waypoint.ingress_admission`) and serves it. It reads the
gateway's router and TLS contexts as they are at each step, so a new config applies from the next handshake and
the next request on; what a connection negotiated stays its own.

Rules:

1. HTTPS: the connection is TLS-terminated (:mod:`ambit.waypoint.ingress_tls`) on the socket TLS transport
   (:func:`~ambit.tls.socket_handshake.open_tls`, its records in C where this process runs the native accelerator,
   :mod:`ambit.native`) and read and written through the stream that is its protocol
   (:class:`~ambit.proxy.transport_stream.TransportStream`): the client's server name (SNI) picks the listener
   (:class:`~ambit.waypoint.ingress_routing.IngressRouter`) and, among that listener's certificates, the first
   whose names cover it (an ``ISTIO_MUTUAL`` listener: the gateway's own mesh certificate); ALPN offers ``h2`` then
   ``http/1.1``. A mutual-TLS listener's client is judged after the handshake and closed at once when refused
   (counted as ``client tls``); an ``ISTIO_MUTUAL`` client's SPIFFE id is the request's peer identity
   (``source.principal`` for the gateway's policies).
2. HTTP, and HTTPS after its handshake: the connection carries HTTP/1.1
   (:func:`~ambit.waypoint.http1_proxy.serve_http1`) or, when the client chose ``h2`` (or, on an HTTP port, opened
   with the HTTP/2 preface: prior knowledge, read as a waypoint reads it), HTTP/2
   (:func:`~ambit.waypoint.http2_proxy.serve_http2`) through the waypoint's request path: every request routed by
   the picked listener's virtual hosts, balanced per request, sent over HBONE (mutual TLS with the gateway's
   certificate, so the server sees the gateway's identity as the peer) in the version Istio's gateway cluster
   speaks (:func:`~ambit.waypoint.traffic_policy.plan_upstream_h2`: HTTP/2 to a port declared HTTP/2 or gRPC, else
   HTTP/1.1, also to a port of unknown protocol), measured with ``reporter="source"`` and logged.
3. TLS (passthrough) and TCP: the connection is routed whole (:mod:`ambit.waypoint.ingress_connections`): the
   ClientHello's server name, peeked at without terminating TLS or taking the bytes, picks the virtual host of a
   TLS port; the bytes are relayed to one endpoint of a weighted backend over HBONE. A connection nothing routes is
   closed; the reasons are counted (``connection_refusals`` in the config dump).
4. TLS_TERMINATE: TLS is terminated as on an HTTPS port (the same listener pick by SNI, certificates and client
   verdict), then the decrypted bytes are relayed as on a TCP port, to the backend of the listener its handshake
   picked (the virtual host its server name picks there).
5. A port where TLS listeners of both kinds meet (a Gateway's TLS ``Passthrough`` and ``Terminate`` listeners on one
   port; an Istio Gateway's PASSTHROUGH and SIMPLE/MUTUAL/ISTIO_MUTUAL servers on one port): the ClientHello is
   peeked at without taking it and the listener its server name picks decides, passthrough relaying the bytes
   untouched, terminating (HTTPS or TLS_TERMINATE) handing the socket to the TLS handshake, which must pick the
   same listener or the connection is closed (``client tls``); it is then served as on a port of that protocol.
6. A connection is pending until its TLS handshake (HTTPS, TLS_TERMINATE), its ClientHello (TLS passthrough) or its
   first request head (HTTP) is through, within its port's deadline from accept (``handshake_timeout``;
   ``request_headers_timeout`` for a first head, HTTPS's counted from its handshake;
   :mod:`ambit.waypoint.ingress_admission` rule 3). One that misses it is closed and counted (``handshake
   timeout``, ``request head timeout``).
7. A connection keeps the ``forward_client_cert`` mode of the config it was accepted under, as Envoy's keep their
   listener's, and the client certificate its handshake verified (:mod:`ambit.waypoint.client_cert` rules 5-10).
8. A connection that came through a PROXY inbound binding (:mod:`ambit.waypoint.ingress_tunnel`) is served as if it
   had arrived from the client its header names: that client's address and identity replace what the loopback
   socket says, and its metrics report that client, not this gateway.
"""

from __future__ import annotations

import asyncio
import collections
import contextlib
import functools
import ipaddress
import logging
import socket
import ssl
from collections.abc import Callable
from typing import Any

from ambit.model.identity import SpiffeId
from ambit.model.ingress import ListenerProtocol
from ambit.model.state import WorkloadState
from ambit.model.workload import AppProtocol, Service, Workload
from ambit.proxy.admission import Ticket
from ambit.proxy.streams import ByteStream, SocketStream
from ambit.proxy.transport_stream import TransportStream
from ambit.telemetry.metrics import Reporter
from ambit.tls.client_auth import ClientRefused
from ambit.tls.socket_handshake import open_tls
from ambit.waypoint.client_cert import ClientCertificate
from ambit.waypoint.context import SelfReport, Tunnel, WaypointContext
from ambit.waypoint.destinations import ServiceTarget
from ambit.waypoint.errors import HelloRefusedError
from ambit.waypoint.http1_proxy import serve_http1
from ambit.waypoint.http2_proxy import serve_http2
from ambit.waypoint.inbound import Startup, read_preface
from ambit.waypoint.ingress_connections import Closed, find_connection_endpoint, peek_hello, plan_backend
from ambit.waypoint.ingress_routing import IngressRouter
from ambit.waypoint.ingress_tls import Admitted, PortTls
from ambit.waypoint.ingress_tunnel import Proxied
from ambit.waypoint.settings import WaypointSettings
from ambit.waypoint.tcp import relay_to

__all__ = ["ListenerConnections"]

log = logging.getLogger("ambit.waypoint.ingress")


class ListenerConnections:
    """Serving one admitted connection (the module's rules); mixed into
    :class:`~ambit.waypoint.ingress.IngressGateway`, which provides what is declared here."""

    settings: WaypointSettings
    context: WaypointContext
    state: WorkloadState
    identity: SpiffeId
    startup: Startup
    router: IngressRouter
    """The current config's router, replaced whole by a new config."""
    connection_refusals: collections.Counter[str]
    _tls: dict[int, PortTls]
    """The current config's TLS contexts, per port that terminates TLS."""

    def _own_workload(self) -> Workload | None:
        raise NotImplementedError

    def captured(self) -> bool:
        raise NotImplementedError

    async def _serve(self, sock: socket.socket, port: int, ticket: Ticket, proxied: Proxied | None = None) -> None:
        """Serve one admitted connection; while it is pending, within its port's deadline from accept
        (:mod:`ambit.waypoint.ingress_admission` rule 3)."""
        deadline = asyncio.timeout(ticket.handshake_timeout if ticket.pending else None)
        try:
            async with deadline:
                await self._serve_admitted(sock, port, ticket, deadline, proxied)
        except TimeoutError:
            if not deadline.expired():
                raise
            handshaking = ticket.pending and self.router.ports().get(port) is not ListenerProtocol.HTTP
            reason = "handshake timeout" if handshaking else "request head timeout"
            self.connection_refusals[reason] += 1
            log.debug("connection on :%d closed: %s", port, reason)

    async def _serve_admitted(
        self, sock: socket.socket, port: int, ticket: Ticket, deadline: asyncio.Timeout, proxied: Proxied | None
    ) -> None:
        loop = asyncio.get_running_loop()

        def established() -> None:
            ticket.established()
            deadline.reschedule(None)

        try:
            peer: tuple[Any, ...] = sock.getpeername()
            local: tuple[Any, ...] = sock.getsockname()
        except OSError:
            return
        client: SpiffeId | None = None
        mtls = False
        client_certificate: ClientCertificate | None = None
        forward_client_cert = self.router.config.forward_client_cert  # the connection keeps its listener's
        source: Workload | None = None
        report: SelfReport | None = SelfReport(self._own_workload(), None if self.captured() else self.identity)
        if proxied is not None:  # what the node proxy vouches for replaces what the loopback socket says
            peer, local, client = proxied.peer, proxied.target, proxied.identity
            mtls = client is not None
            source = self.state.find_workload_by_address(self.settings.network, ipaddress.ip_address(peer[0]))
            report = None  # the client its node proxy named is reported, as before this gateway's own metrics
        with contextlib.suppress(asyncio.TimeoutError, TimeoutError):
            await asyncio.wait_for(self.startup.ready.wait(), self.settings.limits.startup_wait)
        protocol = self.router.ports().get(port, ListenerProtocol.HTTP)
        expected = ""
        if protocol is ListenerProtocol.TLS and self.router.terminates_on(port):
            # A port shared by passthrough and terminating listeners: the peeked server name decides.
            try:
                hello = await peek_hello(sock, self.settings.limits.sniff_timeout)
            except (HelloRefusedError, OSError) as exc:
                self._refuse(sock, "hello", f"{peer[0]}:{peer[1]}", port, str(exc))
                return
            picked = self.router.pick_listener(port, hello.server_name or "")
            if picked is not None and picked.protocol.terminates_tls:
                protocol, expected = picked.protocol, picked.name
        if not protocol.carries_http and not protocol.terminates_tls:
            peer_text = f"{peer[0]}:{peer[1]}"
            await self._serve_connection(sock, port, protocol, peer_text, local, established, client, report)
            return
        stream: ByteStream
        listener_name = ""
        h2 = False
        tls = self._tls.get(port)
        first_request: Callable[[], object]
        if tls is not None:
            if tls.default is None:
                return
            tls_stream = TransportStream()
            try:
                transport, _ = await open_tls(
                    lambda: tls_stream,
                    sock,
                    tls.default,
                    server_side=True,
                    handshake_timeout=self.settings.limits.handshake_timeout,
                )
            except (OSError, TimeoutError) as exc:  # ssl.SSLError among the OSErrors
                log.info("TLS handshake from %s:%d on :%d failed: %s", peer[0], peer[1], port, exc)
                return
            tls_object = transport.get_extra_info("ssl_object")
            admitted = tls.admit(tls_object) if isinstance(tls_object, ssl.SSLSocket) else None
            if not isinstance(admitted, Admitted) or (expected and admitted.listener != expected):
                reason = admitted.reason if isinstance(admitted, ClientRefused) else "no TLS session"
                if isinstance(admitted, Admitted):
                    reason = "the handshake picked another listener than the ClientHello's server name"
                self.connection_refusals["client tls"] += 1
                log.info("client %s:%d on :%d refused: %s", peer[0], peer[1], port, reason)
                transport.abort()
                return
            established()  # the handshake's place is free; the first request head has its own deadline
            deadline.reschedule(loop.time() + self.settings.limits.request_headers_timeout)
            first_request = functools.partial(deadline.reschedule, None)
            listener_name = admitted.listener
            if admitted.verdict.identity is not None or proxied is None:
                client = admitted.verdict.identity
                mtls = admitted.mutual
            client_certificate = admitted.client_certificate
            h2 = tls_object.selected_alpn_protocol() == "h2"
            prefix = b""
            served = next((item for item in self.router.listeners_on(port) if item.name == listener_name), None)
            if served is not None:
                protocol = served.protocol  # HTTPS and TLS_TERMINATE listeners may share a port: the handshake's
            if protocol is ListenerProtocol.TLS_TERMINATE:
                deadline.reschedule(None)  # a relay: no request head to wait for
                peer_text = f"{peer[0]}:{peer[1]}"
                await self._relay_terminated(
                    tls_stream, port, listener_name, peer_text, local, client, mtls, admitted.server_name, report
                )
                return
            tls_stream.close_on_eof = True
            stream = tls_stream
        else:
            stream = SocketStream(sock)
            prefix, spoken = await read_preface(stream, self.settings.limits.sniff_timeout)
            h2 = spoken is AppProtocol.HTTP2
            first_request = established
        target = ServiceTarget(self._listener_service(listener_name, port), port, AppProtocol.HTTP11)
        tunnel = Tunnel(
            target,
            f"{local[0]}:{local[1]}",
            client,
            f"{peer[0]}:{peer[1]}",
            source,
            reporter=Reporter.SOURCE,
            self_report=report,
            mtls=mtls,
            scheme="https" if tls is not None else "http",
            forward_client_cert=forward_client_cert,
            client_certificate=client_certificate,
        )
        try:
            if h2:
                await serve_http2(self.context, tunnel, stream, prefix, first_request)
            else:
                await serve_http1(self.context, tunnel, stream, prefix, first_request)
        except asyncio.CancelledError:
            # the gateway is closing: a TLS close would wait for the client's close_notify (asyncio allows it
            # 30 s), which a client holding its connection open never sends
            stream.abort()
            raise
        finally:
            with contextlib.suppress(Exception):
                await stream.aclose()

    async def _serve_connection(
        self,
        sock: socket.socket,
        port: int,
        protocol: ListenerProtocol,
        peer: str,
        local: tuple[Any, ...],
        established: Callable[[], None],
        client: SpiffeId | None = None,
        report: SelfReport | None = None,
    ) -> None:
        """A connection on a TLS passthrough or TCP port (:mod:`ambit.waypoint.ingress_connections`); it is
        ``established`` once its ClientHello is read (at once on a TCP port)."""
        prefix, server_name = b"", ""
        if protocol is ListenerProtocol.TLS:
            try:
                hello = await peek_hello(sock, self.settings.limits.sniff_timeout)
            except (HelloRefusedError, OSError) as exc:
                self._refuse(sock, "hello", peer, port, str(exc))
                return
            server_name = hello.server_name or ""
        established()
        planned = plan_backend(self.router, port, server_name, self.context.random())
        if isinstance(planned, Closed):
            self._refuse(sock, "no route", peer, port, planned.reason)
            return
        found = find_connection_endpoint(self.context, planned, peer)
        if isinstance(found, Closed):
            self._refuse(sock, "no endpoint", peer, port, found.reason)
            return
        endpoint, policy = found
        listener = self.router.pick_listener(port, server_name)
        service = self._listener_service(listener.name if listener else "", port)
        app = AppProtocol.TLS if protocol is ListenerProtocol.TLS else AppProtocol.TCP
        tunnel = Tunnel(
            ServiceTarget(service, port, app),
            f"{local[0]}:{local[1]}",
            client,
            peer,
            None,
            reporter=Reporter.SOURCE,
            self_report=report,
            mtls=client is not None,
        )
        stream = SocketStream(sock)
        try:
            await relay_to(self.context, tunnel, endpoint, stream, prefix, policy)
        finally:
            with contextlib.suppress(Exception):
                await stream.aclose()

    async def _relay_terminated(
        self,
        stream: TransportStream,
        port: int,
        listener_name: str,
        peer: str,
        local: tuple[Any, ...],
        client: SpiffeId | None,
        mtls: bool,
        server_name: str = "",
        report: SelfReport | None = None,
    ) -> None:
        """A connection on a TLS_TERMINATE listener, its handshake done and its client admitted: the decrypted bytes
        relayed as on a TCP port (:mod:`ambit.waypoint.ingress_connections`), to the backend of the listener the
        handshake picked, the virtual host chosen by the server name the client asked for; the client's mesh
        identity (``ISTIO_MUTUAL``) is the connection's for policies."""
        try:
            planned = plan_backend(self.router, port, server_name, self.context.random(), listener_name)
            found = planned if isinstance(planned, Closed) else find_connection_endpoint(self.context, planned, peer)
            if isinstance(found, Closed):
                self.connection_refusals["no route" if found is planned else "no endpoint"] += 1
                log.debug("connection from %s on :%d closed: %s", peer, port, found.reason)
                stream.abort()
                return
            endpoint, policy = found
            tunnel = Tunnel(
                ServiceTarget(self._listener_service(listener_name, port), port, AppProtocol.TCP),
                f"{local[0]}:{local[1]}",
                client,
                peer,
                None,
                reporter=Reporter.SOURCE,
                self_report=report,
                mtls=mtls,
            )
            await relay_to(self.context, tunnel, endpoint, stream, b"", policy)
        except asyncio.CancelledError:
            stream.abort()  # shutting down: no TLS close exchange (see _serve)
            raise
        finally:
            with contextlib.suppress(Exception):
                await stream.aclose()

    def _refuse(self, sock: socket.socket, reason: str, peer: str, port: int, detail: str) -> None:
        self.connection_refusals[reason] += 1
        log.debug("connection from %s on :%d closed (%s): %s", peer, port, reason, detail)
        sock.close()

    def _listener_service(self, listener_name: str, port: int) -> Service:
        """What the request path sees as the addressed Service: the gateway's listener (the router reads the
        listener from its hostname; metrics of a request no route took name it)."""
        return Service(
            name=self.settings.gateway_name,
            namespace=self.settings.namespace,
            hostname=listener_name,
        )
