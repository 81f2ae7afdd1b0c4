"""The ingress gateway as a process (``ambit gateway``): a Gateway of class ``istio`` served with the waypoint's L7
engine, from outside the mesh to mesh Services over HBONE with the gateway's own identity.

Theory of operation: :class:`IngressGateway` is a :class:`~ambit.waypoint.process.Waypoint` (the same certificate
manager for its SPIFFE identity ``spiffe://<td>/ns/<ns>/sa/<name>-istio``, workload state over xDS, upstream
HBONE pool, telemetry and admin endpoints) that, instead of an HBONE listener, serves the listeners of its
:class:`~ambit.model.ingress.GatewayConfig`:

- Each port of the config is bound on every address of the pod (``INSTANCE_IP`` and ``INSTANCE_IPS``: a dual-stack
  pod's IPv4 and IPv6, as Envoy's listeners are) when a config names it and closed when none does. Each accepted
  connection is served by the protocol of its port's listeners (:mod:`ambit.waypoint.ingress_serving`): on an
  HTTPS port TLS-terminated, the client's server name picking the listener and its certificate, then, as on an
  HTTP port, HTTP/1.1 or HTTP/2 through the waypoint's request path, every request routed by the listener's
  virtual hosts and sent over HBONE with the gateway's identity; on a TLS (passthrough) or TCP port routed whole
  and relayed over HBONE (:mod:`ambit.waypoint.ingress_connections`); on a TLS_TERMINATE port terminated, then
  relayed. A connection nothing routes is closed; the reasons are counted (``connection_refusals`` in the config
  dump).
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
  it, :mod:`ambit.controlplane.translate.waypoint_gateways` rule 1) receives that traffic on its listener ports in plain
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
import time
from collections.abc import Callable, Sequence
from pathlib import Path
from typing import Any

from ambit import native
from ambit.model.ingress import GatewayConfig, IngressListener
from ambit.model.localconfig import parse_local_config
from ambit.model.locality_lb import LocalityChoice
from ambit.model.routes import BackendService, RouteTable, WaypointConfig
from ambit.model.state import WorkloadState
from ambit.model.workload import ApplicationTunnel, Service, TunnelProtocol, Workload
from ambit.proxy.admission import ListenerGate, Refusal, refusal_reporter
from ambit.proxy.sockets import close_when_done, reset
from ambit.tls.workload import WorkloadCertificate
from ambit.waypoint.decisions import Decision, RequestHead
from ambit.waypoint.destinations import Endpoint, pick_ingress_endpoint
from ambit.waypoint.ingress_admission import REFUSAL_WORDS, gate_kind, gateway_budget, port_gate
from ambit.waypoint.ingress_routing import IngressRouter
from ambit.waypoint.ingress_serving import ListenerConnections
from ambit.waypoint.ingress_tls import PortTls
from ambit.waypoint.ingress_tunnel import TunnelRefused, describe, loopback_for, read_proxied, tunnel_ports
from ambit.waypoint.process import Waypoint, hbone_tls_records, serve_until_stopped
from ambit.waypoint.settings import WaypointSettings
from ambit.xds.client import Subscription
from ambit.xds.client_session import ClientUpdate
from ambit.xds.gateway import GATEWAY_CONFIG_TYPE_URL, decode_gateway_config

__all__ = ["IngressGateway", "run_gateway"]

log = logging.getLogger("ambit.waypoint.ingress")

CONFIG_TASK = "gateway config"


class IngressGateway(ListenerConnections, Waypoint):
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
