"""The ingress gateway as a process (``ambit gateway``): a Gateway of class ``istio`` served with the waypoint's L7
engine, from outside the mesh to mesh Services over HBONE with the gateway's own identity.

Theory of operation: :class:`IngressGateway` is a :class:`~ambit.waypoint.process.Waypoint` (the same certificate
manager for its SPIFFE identity ``spiffe://<td>/ns/<ns>/sa/<name>-istio``, workload state over xDS, upstream
HBONE pool, telemetry and admin endpoints) that, instead of an HBONE listener, serves the listeners of its
:class:`~ambit.model.ingress.GatewayConfig`:

- Each port of the config is bound on every address of the pod (``INSTANCE_IP`` and ``INSTANCE_IPS``: a dual-stack
  pod's IPv4 and IPv6, as Envoy's listeners are) when a config names it and closed when none does.
  Connections on an HTTPS port are TLS-terminated (:mod:`ambit.waypoint.ingress_tls`) on the socket TLS transport
  (:func:`~ambit.tls.socket_transport.open_tls`, its records in C where this process runs the native accelerator,
  :mod:`ambit.native`) and read and written through the stream that is its protocol
  (:class:`~ambit.proxy.transport_stream.TransportStream`): the client's server name
  (SNI) picks the listener (:class:`~ambit.waypoint.ingress_routing.IngressRouter`) and, among that listener's
  certificates, the first whose names cover it (an ``ISTIO_MUTUAL`` listener: the gateway's own mesh
  certificate); ALPN offers ``h2`` then ``http/1.1``. A mutual-TLS listener's client is judged after the
  handshake and closed at once when refused (counted as ``client tls``); an ``ISTIO_MUTUAL`` client's
  SPIFFE id is the request's peer identity (``source.principal`` for the gateway's policies). Each connection
  then carries HTTP/1.1 (:func:`~ambit.waypoint.http1_proxy.serve_http1`) or, when the client chose ``h2`` (or,
  on an HTTP port, opened with the HTTP/2 preface: prior knowledge, read as a waypoint reads it), HTTP/2
  (:func:`~ambit.waypoint.http2_proxy.serve_http2`) through the waypoint's request path: every request routed
  by the picked listener's virtual hosts, balanced per request, sent over HBONE (mutual TLS with the gateway's
  certificate, so the server sees the gateway's identity as the peer) in the version Istio's gateway cluster
  speaks (:func:`~ambit.waypoint.traffic_policy.plan_upstream_h2`: HTTP/2 to a port declared HTTP/2 or gRPC,
  else HTTP/1.1, also to a port of unknown protocol), measured with ``reporter="source"`` and logged.
- Connections on a TLS (passthrough) or TCP port are routed whole (:mod:`ambit.waypoint.ingress_connections`):
  the ClientHello's server name, peeked at without terminating TLS or taking the bytes, picks the virtual host of
  a TLS port; the bytes
  are relayed to one endpoint of a weighted backend over HBONE. A connection nothing routes is closed; the
  reasons are counted (``connection_refusals`` in the config dump). A TLS_TERMINATE port terminates TLS as an
  HTTPS port does (the same listener pick by SNI, certificates and client verdict), then relays the decrypted
  bytes as a TCP port does, to the backend of the listener its handshake picked (the virtual host its server name
  picks there). A port where TLS listeners of both kinds meet (a Gateway's TLS ``Passthrough`` and ``Terminate``
  listeners on one port; an Istio Gateway's PASSTHROUGH and SIMPLE/MUTUAL/ISTIO_MUTUAL servers on one port) peeks at
  the ClientHello without taking it: the listener its server name picks decides, passthrough relaying the bytes
  untouched, terminating (HTTPS or TLS_TERMINATE) handing the socket to the TLS handshake, which must pick the
  same listener or the connection is closed (``client tls``), and is then served as on a port of that protocol.
- Bounds (:mod:`ambit.waypoint.ingress_admission`, the HBONE listeners' admission): at most ``max_connections``
  connections at once over all listeners and ``max_connections_per_peer`` from one client address, more reset at
  accept; a connection is pending until its TLS handshake (HTTPS, TLS_TERMINATE), its ClientHello (TLS
  passthrough) or its first request head (HTTP) is through, with a bound on pending connections per port and per
  address, the oldest evicted for a newcomer when full, and a deadline from accept (``handshake_timeout``;
  ``request_headers_timeout`` for a first head, HTTPS's counted from its handshake). A passthrough ClientHello
  takes at most ``sniff_timeout`` and 16 KiB; an idle connection lasts ``idle_timeout``, a later request head
  ``head_timeout`` once begun.
- A new config (a route change, a rotated certificate) replaces the router and the TLS contexts at once: the next
  request and the next handshake use it, no restart, and connections already open keep what they negotiated.
  A certificate that does not load leaves its listener without that certificate (logged); the rest is served.
- Policies: the config's RequestAuthentications, AuthorizationPolicies and destination rules become the request
  path's :class:`~ambit.model.routes.WaypointConfig` (no route tables, every policy of scope WAYPOINT), so each
  request's backend is shaped by its DestinationRule exactly as at a waypoint (subset, load balancer, connection
  pool, outlier detection, originated TLS, HTTP/2 upstream; :mod:`ambit.waypoint.traffic_policy`) and each request is
  authenticated and authorized exactly as at a waypoint (:func:`ambit.waypoint.exchange.serve_request`: a token no
  rule accepts 401, a denied request 403) before it is routed; the JWKS of ``jwksUri`` rules are fetched by the
  same :class:`~ambit.waypoint.jwks.JwksManager`. A removed config keeps the last policies (fail closed).
- A gateway whose own pod is captured by the node proxy (the Gateway labelled ``istio.io/dataplane-mode: ambient``,
  Istio's "sandwich": Services bind to it with ``istio.io/use-waypoint`` and node proxies steer their traffic to
  it, :mod:`ambit.controlplane.translate.waypoints` rule 1) receives that traffic on its listener ports in plain
  text from its node proxy, which has terminated the HBONE tunnel (the authority's port is the listener's), and
  routes it like any other request: the Host header picks the listener. Its upstream connections are then plain
  (:meth:`IngressGateway.captured`, :mod:`ambit.waypoint.upstream`) and its node proxy tunnels them. With a PROXY
  inbound binding (``ambient.istio.io/waypoint-inbound-binding``), that traffic comes instead to loopback-only
  listeners after a PROXY header, whose client identity is the request's ``source.principal``
  (:mod:`ambit.waypoint.ingress_tunnel`); such a connection is admitted at the gate of the port it was meant for,
  under the client address its header names (the node proxy is the only loopback peer).
- A client's ``x-forwarded-client-cert`` is handled by the config's ``forward_client_cert`` (ProxyConfig
  ``gatewayTopology.forwardClientCertDetails``, Istio's default for gateways ``SANITIZE_SET``), as the
  connection's handshake left it (:mod:`ambit.waypoint.client_cert` rules 5-10): removed unless the mode forwards
  it, and over mutual TLS replaced by (or appended to) the element describing the client certificate the listener
  verified. A connection keeps the mode it was accepted under, as Envoy's keep their listener's.
- Readiness (``:15021/healthz/ready``) waits for the certificate, the workload state and the control plane's first
  answer for the config, which may be that there is none yet (no Gateway selects this one): then the gateway is
  ready with no listeners, as Istio's is.

Why the configuration, keys included, comes over xDS rather than from the API: the gateway, like a waypoint, holds
no cluster credentials (its pods do not mount an API token), so a compromised gateway reads nothing of the cluster;
the control plane, which already watches the Gateways and routes, resolves ``certificateRefs`` with the same
judgement it writes the listener status from, and serves each gateway's config, private keys included, only to a
caller authenticated as that gateway's service account (``<name>-istio`` in its namespace): another workload's
token cannot read it, whatever resource name it asks for. Reading Secrets with the gateway's own token would
instead need a Role per gateway namespace, created by the control plane, and a client in every gateway.
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
import time
from collections.abc import Callable, Sequence
from pathlib import Path
from typing import Any

from ambit import native
from ambit.model.identity import SpiffeId
from ambit.model.ingress import GatewayConfig, IngressListener, ListenerProtocol
from ambit.model.localconfig import parse_local_config
from ambit.model.locality_lb import LocalityChoice
from ambit.model.routes import BackendService, RouteTable, WaypointConfig
from ambit.model.state import WorkloadState
from ambit.model.workload import ApplicationTunnel, AppProtocol, Service, TunnelProtocol, Workload
from ambit.proxy.admission import ListenerGate, Refusal, Ticket, refusal_reporter
from ambit.proxy.sockets import close_when_done, reset
from ambit.proxy.streams import ByteStream, SocketStream
from ambit.proxy.transport_stream import TransportStream
from ambit.telemetry.metrics import Reporter
from ambit.tls.client_auth import ClientRefused
from ambit.tls.socket_transport import open_tls
from ambit.tls.workload import WorkloadCertificate
from ambit.waypoint.client_cert import ClientCertificate
from ambit.waypoint.context import SelfReport, Tunnel
from ambit.waypoint.decisions import Decision, RequestHead
from ambit.waypoint.destinations import Endpoint, ServiceTarget, pick_ingress_endpoint
from ambit.waypoint.errors import HelloRefusedError
from ambit.waypoint.http1_proxy import serve_http1
from ambit.waypoint.http2_proxy import serve_http2
from ambit.waypoint.inbound import read_preface
from ambit.waypoint.ingress_admission import REFUSAL_WORDS, gate_kind, gateway_budget, port_gate
from ambit.waypoint.ingress_connections import (
    Closed,
    find_connection_endpoint,
    peek_hello,
    plan_backend,
)
from ambit.waypoint.ingress_routing import IngressRouter
from ambit.waypoint.ingress_tls import Admitted, PortTls
from ambit.waypoint.ingress_tunnel import Proxied, TunnelRefused, describe, loopback_for, read_proxied, tunnel_ports
from ambit.waypoint.process import Waypoint, hbone_tls_records, serve_until_stopped
from ambit.waypoint.settings import WaypointSettings
from ambit.waypoint.tcp import relay_to
from ambit.xds.client import Subscription
from ambit.xds.client_session import ClientUpdate
from ambit.xds.gateway import GATEWAY_CONFIG_TYPE_URL, decode_gateway_config

__all__ = ["IngressGateway", "run_gateway"]

log = logging.getLogger("ambit.waypoint.ingress")

CONFIG_TASK = "gateway config"


class IngressGateway(Waypoint):
    """Everything one ingress gateway runs; ``start`` then ``aclose``."""

    def __init__(self, settings: WaypointSettings, *, admin_token_file: Path | None = None) -> None:
        super().__init__(settings, admin_token_file=admin_token_file)
        self.router = IngressRouter(GatewayConfig(self.config_name))
        self.context.router = self._decide
        self.context.edge = True
        self.context.undeclared_follows_client = False
        self.context.pick = self._pick
        self.context.upstreams.captured = self.captured
        self.readiness.add_pending(CONFIG_TASK)
        self._ports: dict[int, list[tuple[socket.socket, asyncio.Task[None]]]] = {}
        """Each listener port's sockets, one per pod address (a dual-stack pod's IPv4 and IPv6)."""
        self._tunnel_ports: dict[int, tuple[socket.socket, asyncio.Task[None]]] = {}
        """The loopback listeners of a PROXY inbound binding (:mod:`ambit.waypoint.ingress_tunnel` rule 1)."""
        self._tls: dict[int, PortTls] = {}
        self._started = False
        self.config_updates = 0
        self.connection_refusals: collections.Counter[str] = collections.Counter()
        """Connections closed before they were served (limits) or relayed (TLS and TCP ports), by reason (a
        bounded set of words)."""
        self.budget = gateway_budget(settings.limits, refusal_reporter(self._refused_at_gate, time.monotonic, log))
        """What every listener port shares (:mod:`ambit.waypoint.ingress_admission`)."""
        self._gates: dict[int, ListenerGate] = {}
        """Each bound port's admission, for its listeners' protocol."""

    def _own_workload(self) -> Workload | None:
        ip = self.settings.instance_ip
        if not ip:
            return None
        return self.state.find_workload_by_address(self.settings.network, ipaddress.ip_address(ip))

    def captured(self) -> bool:
        """Whether the node proxy captures this gateway's own pod (a "sandwich": its workload, found by the pod's
        address, speaks HBONE): its upstream connections are then plain, and that node proxy tunnels them."""
        own = self._own_workload()
        return own is not None and own.tunnel_protocol is TunnelProtocol.HBONE

    def inbound_binding(self) -> ApplicationTunnel | None:
        """This gateway's application tunnel, from its own workload (the Gateway's inbound binding)."""
        own = self._own_workload()
        return None if own is None else own.application_tunnel

    def _state_changed(self) -> None:
        super()._state_changed()
        if self._started:
            self._sync_tunnel_ports()

    def _pick(
        self,
        state: WorkloadState,
        service: Service,
        port: int,
        choose: Callable[[Sequence[Workload]], Workload],
        *,
        exclude: frozenset[str] = frozenset(),
        only: frozenset[str] | None = None,
        near: Workload | None = None,
        locality: LocalityChoice | None = None,
    ) -> Endpoint | None:
        """:func:`pick_ingress_endpoint` with a fresh draw per request (a canary waypoint's share)."""
        draw = self.context.random()
        return pick_ingress_endpoint(
            state, service, port, choose, exclude=exclude, draw=draw, only=only, near=near, locality=locality
        )

    def _subscriptions(self) -> tuple[Subscription, ...]:
        return (
            Subscription(GATEWAY_CONFIG_TYPE_URL, (self.config_name,), decode_gateway_config, self._config_changed),
        )

    def _decide(
        self, table: RouteTable | None, destination: BackendService, request: RequestHead, random: float
    ) -> Decision:
        return self.router.decide(table, destination, request, random)

    def _config_changed(self, update: ClientUpdate) -> None:
        for name, value in update.upserts:
            if name == self.config_name and isinstance(value, GatewayConfig):
                self.apply(value)
        if self.config_name in update.removals:
            # No listeners any more, but the last policies stay (fail closed, as a waypoint keeps them).
            last = self.router.config
            self.apply(GatewayConfig(self.config_name, (), last.policies, last.request_authentications))
        # Any answer to the subscription is the first config, also one that says ours does not exist (nothing
        # selects this gateway yet): it is ready with no listeners, as Istio's gateway is before any Gateway.
        self.readiness.done(CONFIG_TASK)

    def apply(self, config: GatewayConfig) -> None:
        """Serve ``config`` from the next request and handshake on (see the module docstring)."""
        router = IngressRouter(config)
        tls = {
            port: PortTls(port, router, self._mesh_certificate, self.identity.trust_domain)
            for port in router.ports()
            if router.terminates_on(port)
        }
        self.router, self._tls = router, tls
        self.context.routes.replace(
            WaypointConfig(
                config.gateway,
                policies=config.policies,
                request_authentications=config.request_authentications,
                destination_rules=config.destination_rules,
                envoy_patches=config.envoy_patches,
                mesh_locality=config.mesh_locality,
            )
        )
        self.context.jwks.update(config.request_authentications)
        self.config_updates += 1
        self.readiness.done(CONFIG_TASK)
        log.info("gateway config: %d listener(s) on port(s) %s", len(config.listeners), sorted(router.ports()))
        if self._started:
            self._sync_ports()

    def _mesh_certificate(self) -> WorkloadCertificate | None:
        return self.certs.find(self.identity)

    def _sync_tunnel_ports(self) -> None:
        """Listen in loopback where the inbound binding asks (:mod:`ambit.waypoint.ingress_tunnel` rule 1)."""
        wanted = tunnel_ports(self.inbound_binding(), self.router.ports())
        for port in sorted(set(self._tunnel_ports) - wanted):
            sock, task = self._tunnel_ports.pop(port)
            task.cancel()
            sock.close()
        for port in sorted(wanted - set(self._tunnel_ports)):
            try:
                sock = self._bind(port, loopback_for(self.settings.listen_host))
            except OSError as exc:
                log.warning("cannot listen for the application tunnel on port %d: %s", port, exc.strerror or exc)
                continue
            name = f"gateway tunnel accept :{port}"
            task = asyncio.get_running_loop().create_task(self._accept_tunnelled(sock, port), name=name)
            self._tunnel_ports[port] = (sock, task)

    def _sync_ports(self) -> None:
        self._sync_tunnel_ports()
        protocols = self.router.ports()
        wanted = set(protocols)
        for port in sorted(set(self._ports) - wanted):
            for sock, task in self._ports.pop(port):
                task.cancel()
                sock.close()
            self._gates.pop(port, None)
        for port in sorted(wanted):  # a port whose protocol changed gets a new gate; old tickets free the old one
            gate = self._gates.get(port)
            if gate is None or gate.kind != gate_kind(protocols[port]):
                self._gates[port] = port_gate(protocols[port], self.settings.limits, self.budget)
        loop = asyncio.get_running_loop()
        for port in sorted(wanted - set(self._ports)):
            bound: list[tuple[socket.socket, asyncio.Task[None]]] = []
            for host in (self.settings.listen_host, *self.settings.more_listen_hosts):
                try:
                    sock = self._bind(port, host)
                except OSError as exc:
                    log.warning("cannot listen on %s port %d: %s", host, port, exc.strerror or exc)
                    continue
                name = f"gateway accept {host}:{port}"
                bound.append((sock, loop.create_task(self._accept_port(sock, port), name=name)))
            if bound:
                self._ports[port] = bound

    def _bind(self, port: int, host: str | None = None) -> socket.socket:
        host = host or self.settings.listen_host
        sock = socket.socket(socket.AF_INET6 if ":" in host else socket.AF_INET, socket.SOCK_STREAM)
        try:
            sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
            sock.bind((host, port))
            sock.listen(1024)
            sock.setblocking(False)
        except OSError:
            sock.close()
            raise
        return sock

    def listening_ports(self) -> list[int]:
        return sorted(self._ports)

    def tunnel_listening_ports(self) -> list[int]:
        return sorted(self._tunnel_ports)

    async def start(self) -> None:
        from ambit.telemetry.endpoints import write_admin_token

        if self.admin_token_file is not None:
            write_admin_token(self.admin_token_file, self.admin_token)
        await self.endpoints.start()
        self.certs.track({self.identity})
        if self.xds is not None:
            await self.xds.start()
        elif self.settings.config_file is not None:
            config = parse_local_config(self.settings.config_file.read_text(encoding="utf-8"))
            self.state.replace_all(config.workloads, config.services)
            self._state_loaded = True
        else:
            self._state_loaded = True
        if self.xds is None:
            self.readiness.done(CONFIG_TASK)  # no control plane: listeners come only through apply()
        self._started = True
        self._sync_ports()
        self._tasks.append(asyncio.create_task(self._housekeeping(), name="gateway housekeeping"))
        log.info(
            "gateway %s is running (HBONE TLS transport %s, TLS records: %s; listeners' TLS records: %s)",
            self.identity,
            self.settings.tls_transport,
            hbone_tls_records(self.settings),
            native.selection().describe(),
        )

    async def _accept_port(self, listener: socket.socket, port: int) -> None:
        loop = asyncio.get_running_loop()
        while True:
            try:
                sock, address = await loop.sock_accept(listener)
            except OSError as exc:
                log.warning("accept on port %d failed: %s", port, exc)
                await asyncio.sleep(0.1)
                continue
            peer = str(address[0])
            gate = self._gates.get(port)
            ticket = gate.admit(peer) if gate is not None else Refusal.CONNECTIONS
            if isinstance(ticket, Refusal):  # over a bound (counted by the gate): reset, nothing else spent
                reset(sock)
                continue
            with contextlib.suppress(OSError):  # already reset by the peer: serving finds out
                sock.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
            task = loop.create_task(self._serve(sock, port, ticket), name=f"gateway connection :{port} from {peer}")
            self._connections.add(task)
            task.add_done_callback(self._connections.discard)
            # Even if cancelled before it ran (evicted by a newcomer, or the gateway closing): place and socket.
            task.add_done_callback(ticket.release_when_done)
            task.add_done_callback(functools.partial(close_when_done, sock))
            ticket.on_evict(task.cancel)

    async def _accept_tunnelled(self, listener: socket.socket, port: int) -> None:
        """A tunnel listener's accept loop: only the node proxy, in this pod, reaches it (loopback); each connection
        is admitted once its header names the client (:meth:`_serve_tunnelled`)."""
        loop = asyncio.get_running_loop()
        while True:
            try:
                sock, _ = await loop.sock_accept(listener)
            except OSError as exc:
                log.warning("accept on tunnel port %d failed: %s", port, exc)
                await asyncio.sleep(0.1)
                continue
            task = loop.create_task(self._serve_tunnelled(sock, port), name=f"gateway tunnel :{port}")
            self._connections.add(task)
            task.add_done_callback(self._connections.discard)
            task.add_done_callback(functools.partial(close_when_done, sock))

    async def _serve_tunnelled(self, sock: socket.socket, port: int) -> None:
        """A connection on a tunnel listener: its PROXY header first (within ``sniff_timeout``), then admitted at
        the gate of the original target's port under the client address the header names, and served as if it had
        arrived there from that client (:mod:`ambit.waypoint.ingress_tunnel` rules 2-4)."""
        proxied = await read_proxied(sock, self.settings.limits.sniff_timeout)
        if isinstance(proxied, TunnelRefused):
            self._refuse(sock, f"tunnel {proxied.reason}", "loopback", port, proxied.detail)
            return
        target = proxied.target[1]
        gate = self._gates.get(target)
        ticket = gate.admit(proxied.peer[0]) if gate is not None else Refusal.CONNECTIONS
        if isinstance(ticket, Refusal):
            reset(sock)
            return
        log.debug("tunnelled connection on :%d: %s", port, describe(proxied))
        task = asyncio.current_task()
        if task is not None:
            ticket.on_evict(task.cancel)  # a newcomer's eviction of this pending connection ends it
        try:
            await self._serve(sock, target, ticket, proxied)
        finally:
            ticket.release()

    def _refused_at_gate(self, listener: str, reason: str) -> None:
        self.connection_refusals[REFUSAL_WORDS[Refusal(reason)]] += 1
        self.metrics.connection_refused(listener, reason)

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

    def config_dump(self) -> dict[str, Any]:
        dump = super().config_dump()
        config = self.router.config
        dump["gateway"] = {
            "listeners": [_listener_dump(item) for item in config.listeners],
            "listening": self.listening_ports(),
            "tunnelListening": self.tunnel_listening_ports(),
            "updates": self.config_updates,
            "forwardClientCert": config.forward_client_cert.value,
            "connection_refusals": dict(sorted(self.connection_refusals.items())),
        }
        return dump

    async def aclose(self) -> None:
        listeners = [*(pair for bound in self._ports.values() for pair in bound), *self._tunnel_ports.values()]
        for sock, task in listeners:
            task.cancel()
            sock.close()
        for _, task in listeners:
            with contextlib.suppress(asyncio.CancelledError):
                await task
        self._ports.clear()
        self._tunnel_ports.clear()
        await super().aclose()


def _listener_dump(listener: IngressListener) -> dict[str, Any]:
    return {
        "name": listener.name,
        "port": listener.port,
        "protocol": listener.protocol.value,
        "hostname": listener.hostname,
        "certificates": len(listener.certificates),
        "tlsMode": listener.tls.mode.value,
        "virtualHosts": [
            {
                "hostname": v.hostname,
                "routes": [r.route for r in v.http],
                "tcpBackends": len(v.tcp_backends),
                "httpsRedirect": v.https_redirect,
            }
            for v in listener.virtual_hosts
        ],
    }


async def run_gateway(settings: WaypointSettings, *, admin_token_file: Path | None = None) -> None:
    """Run until SIGTERM, SIGINT or ``/quitquitquit``, then drain as a waypoint does (a rollout of the gateway
    must not reset the connections that reach the old pod before its endpoint is gone everywhere)."""
    import signal

    gateway = IngressGateway(settings, admin_token_file=admin_token_file)
    loop = asyncio.get_running_loop()
    for sig in (signal.SIGTERM, signal.SIGINT):
        loop.add_signal_handler(sig, gateway.stopped.set)
    await gateway.start()
    await serve_until_stopped(gateway, settings.limits.drain_time)
