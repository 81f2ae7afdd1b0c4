"""The waypoint as a process (``ambit waypoint proxy``): identity, workload state, HBONE listener, telemetry.

Theory of operation: the pieces are built once from :class:`~ambit.waypoint.settings.WaypointSettings` and wired
here, and nowhere else:

- its own certificate for ``spiffe://<td>/ns/<namespace>/sa/<service account>`` from the control plane's CA with
  its own token (no impersonation: the CA signs the caller's identity), or from a local CA; the
  :class:`~ambit.identity.manager.CertificateManager` tracks that one identity and refreshes it at half life;
- the workload state of the whole mesh from the control plane over delta ADS (the node proxy's
  :class:`~ambit.xds.client.XdsClient`), or from a local config file read once at start;
- the HBONE listener on ``<INSTANCE_IP or 0.0.0.0>:15008`` (:mod:`ambit.waypoint.inbound`), accepting at once;
  tunnels wait (bounded) until the certificate and the first state are in (lazy start);
- admin (127.0.0.1:15000, ``/config_dump``), stats (15020, ``/metrics``) and readiness (15021,
  ``/healthz/ready``: ready once certificate and state are in), the node proxy's
  :class:`~ambit.telemetry.endpoints.ProxyEndpoints`.

The process runs until SIGTERM, SIGINT or ``POST /quitquitquit`` (with the admin token, written to
``admin_token_file`` when given), then drains (:meth:`Waypoint.drain`): not ready, still serving for
``drain_time`` seconds (or until a second signal), since node proxies keep sending here until the control plane
tells them the waypoint is gone (a deleted Gateway, a ``use-waypoint`` label moved) and a waypoint that vanished at
once would reset their connections; then it closes the listener, tunnels, pooled connections and endpoints.
"""

from __future__ import annotations

import asyncio
import contextlib
import functools
import ipaddress
import logging
import signal
import socket
import time
from pathlib import Path
from typing import Any

from ambit import native
from ambit.dns.resolvconf import ResolvConf, parse_resolv_conf
from ambit.identity.istiod import IstiodCaClient
from ambit.identity.localca import LocalCa
from ambit.identity.manager import CaClient, CertificateManager
from ambit.model.localconfig import parse_local_config
from ambit.model.routes import WaypointConfig
from ambit.model.state import WorkloadState
from ambit.model.workload import IPAddress
from ambit.proxy.admission import ListenerGate, ListenerLimits, NodeBudget, Refusal, refusal_reporter
from ambit.proxy.hostnames import HostnameResolver, upstream_lookup
from ambit.proxy.pool import ConnectionPool
from ambit.proxy.sockets import HostSocketFactory, close_when_done, reset
from ambit.telemetry.accesslog import AccessLog
from ambit.telemetry.endpoints import ProxyEndpoints, new_admin_token, write_admin_token
from ambit.telemetry.flows import FlowRing
from ambit.telemetry.readiness import Readiness
from ambit.tls.workload import WorkloadCertificate
from ambit.waypoint.context import WaypointContext
from ambit.waypoint.destinations import OWN_PORTS, WaypointSelf
from ambit.waypoint.errors import WaypointSettingsError
from ambit.waypoint.inbound import Refusals, Startup, serve_connection
from ambit.waypoint.settings import WaypointSettings
from ambit.waypoint.telemetry import RequestLog, WaypointMetrics
from ambit.waypoint.upstream import Upstreams
from ambit.xds.client import Subscription, XdsClient
from ambit.xds.client_session import ClientUpdate
from ambit.xds.routes import WAYPOINT_CONFIG_TYPE_URL, decode_waypoint_config

log = logging.getLogger("ambit.waypoint.process")

CERT_TASK = "certificate"
STATE_TASK = "state manager"
DRAIN_TASK = "draining"
HOUSEKEEPING_INTERVAL = 0.2
REAP_INTERVAL = 30.0
UPSTREAM_IDLE_SECONDS = 60.0


def _required(path: Path | None, what: str) -> Path:
    if path is None:
        raise WaypointSettingsError(f"the waypoint needs {what} to talk to the control plane")
    return path


MAX_RESOLV_CONF = 64 * 1024
"""The most of a resolv.conf that is read."""


def hbone_tls_records(settings: WaypointSettings) -> str:
    """Who handles HBONE's TLS records (for the start-up log and the config dump): the event loop's transport, or
    on the socket transport the data path :mod:`ambit.native` chose."""
    return native.selection().describe() if settings.tls_transport == "socket" else "the loop's"


def hostname_resolver(settings: WaypointSettings) -> HostnameResolver:
    """Resolves hostname endpoints from the explicit nameservers, else the waypoint's resolv.conf (read once)."""
    nameservers = settings.dns_nameservers
    if not nameservers:
        try:
            with settings.resolv_conf.open("rb") as f:
                conf = parse_resolv_conf(f.read(MAX_RESOLV_CONF).decode("utf-8", "replace"))
        except OSError:
            conf = ResolvConf()
        nameservers = conf.nameservers
    return HostnameResolver(upstream_lookup(nameservers, port=settings.dns_port), clock=time.monotonic)


class Waypoint:
    """Everything one waypoint runs; ``start`` then ``aclose``."""

    def __init__(self, settings: WaypointSettings, *, admin_token_file: Path | None = None) -> None:
        from ambit import __version__

        self.settings = settings
        self.identity = settings.identity
        self.stopped = asyncio.Event()
        self.state = WorkloadState()
        self.ca = self._ca_client(settings)
        self.certs = CertificateManager(self.ca)
        self.metrics = WaypointMetrics(build_version=__version__)
        self.readiness = Readiness()
        self.readiness.add_pending(CERT_TASK)
        self.readiness.add_pending(STATE_TASK)
        self.startup = Startup()
        self.refusals = Refusals()
        bounds = settings.limits
        # A smaller connection bound caps the handshake bounds under it (they are parts of it).
        pending = min(bounds.max_pending_handshakes, bounds.max_connections)
        self.hbone_gate = ListenerGate(
            "hbone",
            ListenerLimits(
                bounds.max_connections,
                pending,
                min(bounds.max_pending_handshakes_per_peer, pending),
                bounds.handshake_timeout,
                bounds.hbone_liveness(),
            ),
            NodeBudget(
                bounds.max_connections,
                pending,
                refusal_reporter(self._refused_at_accept, time.monotonic, log),
                min(bounds.max_connections_per_peer, bounds.max_connections),
            ),
            handshake=True,
        )
        """The HBONE listener's admission (:mod:`ambit.proxy.admission`): the process has that one listener."""
        addresses: frozenset[IPAddress] = frozenset()
        if settings.instance_ip:
            own = (settings.instance_ip, *settings.more_listen_hosts)
            addresses = frozenset(ipaddress.ip_address(ip) for ip in own)
        own_ports = OWN_PORTS | {
            settings.hbone_port,
            settings.admin_port,
            settings.stats_port,
            settings.readiness_port,
        }
        limits = settings.limits
        me = WaypointSelf(
            settings.namespace,
            settings.gateway_name,
            addresses,
            settings.network,
            settings.domain,
            frozenset(own_ports),
        )
        self.flows = FlowRing()
        self.context = WaypointContext(
            state=self.state,
            me=me,
            upstreams=Upstreams(
                pool=ConnectionPool(),
                certs=self.certs,
                identity=self.identity,
                source_ip=settings.instance_ip or "0.0.0.0",
                trust_domain=settings.trust_domain,
                sockets=HostSocketFactory(mark=None),
                hbone_port=settings.upstream_hbone_port,
                connect_timeout=limits.connect_timeout,
                max_idle=limits.upstream_idle_per_endpoint,
                max_head_bytes=limits.max_head_bytes,
                hostnames=hostname_resolver(settings),
                me=me,
                tls_transport=settings.tls_transport,
            ),
            metrics=self.metrics,
            request_log=RequestLog(as_json=settings.log_json, flows=self.flows),
            access_log=AccessLog(json=settings.log_json, flows=self.flows),
            limits=limits,
            identity=self.identity,
            # From the control plane, the WaypointConfig lists the Services it carries policies for; a local file
            # has no WaypointConfig, and the workload state alone says what is bound.
            serve_listed_only=bool(settings.xds_address),
            accept_http10=settings.accept_http10,
        )
        self.xds = (
            XdsClient(
                settings.xds_address,
                self.state,
                self._state_changed,
                root_cert_file=_required(settings.root_cert_file, "a root certificate file"),
                token_file=settings.token_file,
                cluster_id=settings.cluster_id,
                node_id=f"waypoint~{settings.instance_ip or ''}~{settings.pod_name}.{settings.namespace}"
                f"~{settings.namespace}.svc.{settings.domain}",
                server_name=settings.xds_server_name,
                authorization=False,
                subscriptions=self._subscriptions(),
            )
            if settings.xds_address
            else None
        )
        self.admin_token = new_admin_token()
        self.admin_token_file = admin_token_file
        self.endpoints = ProxyEndpoints(
            admin_token=self.admin_token,
            metrics=self.metrics,
            readiness=self.readiness,
            config_dump=self.config_dump,
            quit=self.stopped.set,
            admin_address=("127.0.0.1", settings.admin_port),
            stats_address=("0.0.0.0", settings.stats_port),
            readiness_address=("0.0.0.0", settings.readiness_port),
            flows=self.flows,
        )
        self._listener: socket.socket | None = None
        self._more_listeners: list[socket.socket] = []
        self._connections: set[asyncio.Task[None]] = set()
        self._tasks: list[asyncio.Task[None]] = []
        self._state_loaded = False

    @staticmethod
    def _ca_client(settings: WaypointSettings) -> CaClient:
        if settings.ca_address:
            return IstiodCaClient(
                settings.ca_address,
                _required(settings.root_cert_file, "a root certificate file"),
                _required(settings.token_file, "a token file"),
                cluster_id=settings.cluster_id,
                server_name=settings.xds_server_name,
                ttl_seconds=settings.secret_ttl,
                impersonate=False,
            )
        if settings.local_ca_dir is not None:
            return LocalCa(settings.local_ca_dir, trust_domain=settings.trust_domain)
        raise WaypointSettingsError("the waypoint needs a CA: the control plane's (--ca-address) or a local one")

    def _subscriptions(self) -> tuple[Subscription, ...]:
        """What this proxy asks the control plane for besides the workload state: its WaypointConfig."""
        return (
            Subscription(WAYPOINT_CONFIG_TYPE_URL, (self.config_name,), decode_waypoint_config, self.routes_changed),
        )

    def _state_changed(self) -> None:
        """Nothing to recompute (every tunnel and request reads the state when it needs it); tunnels waiting for a
        binding judge again."""
        self.startup.state_changed()

    @property
    def config_name(self) -> str:
        """The name of this waypoint's WaypointConfig resource: its Gateway's ``namespace/name``."""
        return f"{self.settings.namespace}/{self.settings.gateway_name}"

    def routes_changed(self, update: ClientUpdate) -> None:
        """The control plane sent (or removed) this waypoint's routes: from the next request on, they apply, and
        tunnels waiting for their Service to be listed judge again."""
        for name, value in update.upserts:
            if name == self.config_name and isinstance(value, WaypointConfig):
                self.context.routes.replace(value)
                self.context.jwks.update(value.request_authentications)
                log.info("routes: %d table(s), %d service(s) for %s", len(value.tables), len(value.services), name)
        if self.config_name in update.removals:
            # The routes go back to the defaults, but the last policies stay: a control plane that stops serving
            # this resource must not turn every authorization policy off (fail closed, not open). The Services
            # listed stay with them: those policies are the ones chosen for exactly those Services.
            last = self.context.routes.current
            self.context.routes.replace(
                WaypointConfig(
                    waypoint=self.config_name,
                    policies=last.policies,
                    request_authentications=last.request_authentications,
                    services=last.services,
                )
            )
            log.info("routes: none for %s (default routes; the last policies are kept)", self.config_name)
        self.startup.state_changed()

    @property
    def hbone_address(self) -> tuple[str, int]:
        """Where the HBONE listener is bound (its real port once started)."""
        if self._listener is None:
            return (self.settings.listen_host, self.settings.hbone_port)
        host, port = self._listener.getsockname()[:2]
        return (str(host), int(port))

    async def _certificate(self) -> WorkloadCertificate:
        return await self.certs.fetch(self.identity)

    def config_dump(self) -> dict[str, Any]:
        me = self.context.me
        state = self.state
        return {
            "config": {
                "gateway": f"{self.settings.namespace}/{self.settings.gateway_name}",
                "hostname": me.hostname,
                "identity": str(self.identity),
                "addresses": sorted(str(ip) for ip in me.addresses),
                "trustDomain": self.settings.trust_domain,
                "xdsAddress": self.settings.xds_address or "",
                "caAddress": self.settings.ca_address or "",
                "configFile": str(self.settings.config_file or ""),
                "xdsSynced": bool(self.xds and self.xds.synced),
                "tlsTransport": self.settings.tls_transport,
                "tlsRecords": hbone_tls_records(self.settings),
            },
            "serving": {
                "services": [s.key for s in state.services() if me.fronts(s, state)],
                "workloads": [w.uid for w in state.workloads() if me.is_me(w.waypoint, state)],
            },
            "routes": self.context.routes.to_dump(),
            **state.to_dump(),
            "certificates": self.certs.snapshot(),
            "pool": self.context.upstreams.pool.stats(),
            "upstreamIdleHttp": self.context.upstreams.idle_count(),
            "upstreamHttp2": self.context.http2.count(),
            "upstreamHttp2Streams": self.context.http2.open_streams(),
            "tunnels": self.context.tunnels,
            "refused": {str(status): n for status, n in sorted(self.refusals.by_status.items())},
            "handshakeFailures": self.refusals.handshake_failures,
        }

    async def start(self) -> None:
        if self.admin_token_file is not None:
            write_admin_token(self.admin_token_file, self.admin_token)
        await self.endpoints.start()
        self._listener = self._listen(self.settings.listen_host)
        self._more_listeners = [self._listen(host) for host in self.settings.more_listen_hosts]
        self.certs.track({self.identity})
        if self.xds is not None:
            await self.xds.start()
        elif self.settings.config_file is not None:
            config = parse_local_config(self.settings.config_file.read_text(encoding="utf-8"))
            self.state.replace_all(config.workloads, config.services)
            self._state_loaded = True
        else:
            self._state_loaded = True  # no source of state: an empty mesh
        for listener in (self._listener, *self._more_listeners):
            self._tasks.append(asyncio.create_task(self._accept(listener), name="waypoint hbone accept"))
        self._tasks.append(asyncio.create_task(self._housekeeping(), name="waypoint housekeeping"))
        log.info(
            "waypoint %s is running (HBONE %s:%d, TLS transport %s, TLS records: %s)",
            self.identity,
            *self.hbone_address,
            self.settings.tls_transport,
            hbone_tls_records(self.settings),
        )

    def _listen(self, host: str) -> socket.socket:
        family = socket.AF_INET6 if ":" in host else socket.AF_INET
        sock = socket.socket(family, socket.SOCK_STREAM)
        try:
            sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
            if family == socket.AF_INET6:
                sock.setsockopt(socket.IPPROTO_IPV6, socket.IPV6_V6ONLY, 1)
            sock.bind((host, self.settings.hbone_port))
            sock.listen(1024)
            sock.setblocking(False)
        except OSError as exc:
            sock.close()
            raise WaypointSettingsError(
                f"cannot listen for HBONE on {host}:{self.settings.hbone_port}: {exc.strerror}"
            ) from None
        return sock

    def _refused_at_accept(self, listener: str, reason: str) -> None:
        """A connection refused at accept (``refused`` under status 0 in the config dump), or a handshake evicted
        for a newcomer (:mod:`ambit.proxy.admission`); both counted in the metric."""
        if reason != Refusal.EVICTED:
            self.refusals.by_status[0] += 1
        self.metrics.connection_refused(listener, reason)

    async def _accept(self, listener: socket.socket) -> None:
        loop = asyncio.get_running_loop()
        gate = self.hbone_gate
        while True:
            try:
                sock, peer = await loop.sock_accept(listener)
            except OSError as exc:  # EMFILE and friends: back off, keep the listener
                log.warning("HBONE accept failed: %s", exc)
                await asyncio.sleep(0.1)
                continue
            ticket = gate.admit(str(peer[0]))
            if isinstance(ticket, Refusal):  # over a bound (counted by the gate): reset, nothing else spent
                reset(sock)
                continue
            # As every proxy socket: without it Nagle holds a response's last small TLS record until the client's
            # delayed ACK (~40 ms per request on a keep-alive tunnel).
            with contextlib.suppress(OSError):  # already reset by the peer: the handshake finds out
                sock.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
            task = loop.create_task(
                serve_connection(
                    self.context,
                    self.startup,
                    self.refusals,
                    sock,
                    self._certificate,
                    self.settings.trust_domain,
                    ticket,
                    self.settings.tls_transport,
                ),
                name="waypoint hbone connection",
            )
            self._connections.add(task)
            task.add_done_callback(self._connections.discard)
            # Even if cancelled before it ran (evicted by a newcomer, or the waypoint closing): place and socket.
            task.add_done_callback(ticket.release_when_done)
            task.add_done_callback(functools.partial(close_when_done, sock))
            ticket.on_evict(task.cancel)

    async def _housekeeping(self) -> None:
        since_reap = 0.0
        while True:
            if self.certs.find(self.identity) is not None:
                self.readiness.done(CERT_TASK)
            if self._state_loaded or (self.xds is not None and self.xds.synced):
                self.readiness.done(STATE_TASK)
            if not {CERT_TASK, STATE_TASK} & set(self.readiness.pending()):  # draining or not
                self.startup.ready.set()
            await asyncio.sleep(HOUSEKEEPING_INTERVAL)
            since_reap += HOUSEKEEPING_INTERVAL
            if since_reap >= REAP_INTERVAL:
                since_reap = 0.0
                self.context.upstreams.pool.reap_idle()
                self.context.upstreams.reap_idle(self.context.clock(), UPSTREAM_IDLE_SECONDS)

    async def drain(self, seconds: float) -> None:
        """Report not ready and keep serving for ``seconds``, or until :attr:`stopped` is set again."""
        self.readiness.add_pending(DRAIN_TASK)
        self.stopped.clear()
        with contextlib.suppress(TimeoutError):
            async with asyncio.timeout(seconds):
                await self.stopped.wait()

    async def aclose(self) -> None:
        for task in self._tasks:
            task.cancel()
        for task in self._tasks:
            with contextlib.suppress(asyncio.CancelledError):
                await task
        if self._listener is not None:
            self._listener.close()
        for listener in self._more_listeners:
            listener.close()
        background = [*self._connections, *self.context.background]
        for task in background:
            task.cancel()
        await asyncio.gather(*background, return_exceptions=True)
        if self.xds is not None:
            await self.xds.aclose()
        await self.context.http2.aclose()
        await self.context.jwks.aclose()
        await self.context.upstreams.aclose()
        await self.certs.aclose()
        if isinstance(self.ca, IstiodCaClient):
            await self.ca.aclose()
        await self.endpoints.aclose()
        self.context.request_log.flush()  # the last requests' and connections' lines
        self.context.access_log.flush()


async def serve_until_stopped(proxy: Waypoint, drain_time: float) -> None:
    """Serve a started proxy until :attr:`Waypoint.stopped` is set, then drain for ``drain_time`` (not ready,
    still serving, as Envoy does for Istio's termination drain duration: a pod being deleted still gets new
    connections until every proxy has heard its endpoint is gone), then close. A waypoint and an ingress gateway
    stop alike."""
    try:
        await proxy.stopped.wait()
        await proxy.drain(drain_time)
    finally:
        await proxy.aclose()


async def run_waypoint(settings: WaypointSettings, *, admin_token_file: Path | None = None) -> None:
    """Run until SIGTERM, SIGINT or ``/quitquitquit``, then drain."""
    waypoint = Waypoint(settings, admin_token_file=admin_token_file)
    loop = asyncio.get_running_loop()
    for sig in (signal.SIGTERM, signal.SIGINT):
        loop.add_signal_handler(sig, waypoint.stopped.set)
    await waypoint.start()
    await serve_until_stopped(waypoint, settings.limits.drain_time)
