"""What every tunnel handler of the waypoint shares, and what one tunnel knows about itself.

:class:`WaypointContext` is built once per process (:mod:`ambit.waypoint.process`) and passed to the handlers:
the workload state, the route configuration and router, the upstream side, telemetry, limits and the seams (clock,
random numbers). :class:`Tunnel` is one accepted CONNECT: its target (what the client addressed), who sent it
(identity from the client certificate, source workload looked up by the peer's address) and where from.
"""

from __future__ import annotations

import asyncio
import random as _random
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field

from ambit.model.identity import SpiffeId
from ambit.model.ingress import ForwardClientCert
from ambit.model.state import WorkloadState
from ambit.model.workload import Service, TunnelProtocol, Workload
from ambit.proxy.accounting import LabelsCache, traffic_labels
from ambit.telemetry.accesslog import AccessLog
from ambit.telemetry.metrics import Reporter, SecurityPolicy, TrafficLabels
from ambit.waypoint.authorization import WaypointAuthorizer
from ambit.waypoint.client_cert import ClientCertificate
from ambit.waypoint.config import RouteConfig
from ambit.waypoint.decisions import Router
from ambit.waypoint.destinations import EndpointPicker, ServiceTarget, Target, WaypointSelf, pick_endpoint
from ambit.waypoint.http2 import Http2Pool
from ambit.waypoint.jwks import JwksManager
from ambit.waypoint.request_ids import RequestIds
from ambit.waypoint.routing import waypoint_route
from ambit.waypoint.settings import WaypointLimits
from ambit.waypoint.telemetry import RequestLog, WaypointMetrics
from ambit.waypoint.traffic_policy import Balancer
from ambit.waypoint.upstream import Upstreams


@dataclass(slots=True)
class WaypointContext:
    state: WorkloadState
    me: WaypointSelf
    upstreams: Upstreams
    metrics: WaypointMetrics
    request_log: RequestLog
    access_log: AccessLog
    limits: WaypointLimits = field(default_factory=WaypointLimits)
    routes: RouteConfig = field(default_factory=RouteConfig)
    serve_listed_only: bool = False
    """Serve a Service-addressed tunnel only when ``routes`` lists the Service (rule 6 of
    :func:`~ambit.waypoint.destinations.plan_tunnel`): set when the configuration comes from the control plane,
    whose WaypointConfig lists what it carries policies for; a waypoint run from a local file has no such list."""
    edge: bool = False
    """An ingress gateway: the edge of the mesh, where the client's address comes from the connection and trusted
    proxies (Envoy's ``use_remote_address``; :mod:`ambit.waypoint.forwarded_for`), and requests leave with
    ``X-Forwarded-For`` and ``X-Envoy-External-Address``."""
    accept_http10: bool = False
    """HTTP/1.0 requests are served (Envoy's ``accept_http_10``, which istiod sets with ``PILOT_HTTP10`` or the
    proxy's ``HTTP10`` metadata); off, they are answered 426 (:mod:`ambit.waypoint.exchange` rule 0)."""
    router: Router = waypoint_route
    """The routing engine (:func:`ambit.waypoint.routing.waypoint_route`); tests put stand-ins here."""
    authorizer: WaypointAuthorizer = field(default_factory=WaypointAuthorizer)
    jwks: JwksManager = field(default_factory=JwksManager)
    """The key sets of the RequestAuthentications' ``jwksUri`` (fetched by the waypoint: :mod:`ambit.waypoint.jwks`)."""
    wall_clock: Callable[[], float] = time.time
    """Token times (``exp``, ``nbf``) are wall-clock seconds; ``clock`` is monotonic."""
    """The policies of ``routes`` per destination (:mod:`ambit.waypoint.authorization`)."""
    clock: Callable[[], float] = time.monotonic
    random: Callable[[], float] = _random.random
    choose: Callable[[Sequence[Workload]], Workload] = _random.choice
    request_id: Callable[[], str] = field(default_factory=lambda: RequestIds().next)
    """The ``x-request-id`` of a request that arrives without one (:mod:`ambit.waypoint.request_ids`)."""
    pick: EndpointPicker = pick_endpoint
    """How a request's endpoint is chosen: :func:`~ambit.waypoint.destinations.pick_endpoint`; an ingress gateway
    sends Services marked ``istio.io/ingress-use-waypoint`` through their waypoint."""
    undeclared_follows_client: bool = True
    """A backend port of unknown protocol is spoken to in the client's HTTP version (a waypoint, as istiod sets
    ``use_downstream_protocol`` for it); a gateway speaks HTTP/1.1 to it
    (:func:`~ambit.waypoint.traffic_policy.plan_upstream_h2`)."""
    tunnels: int = 0
    """Tunnels being served now (bounded by ``limits.max_tunnels``)."""
    http2: Http2Pool = field(default_factory=Http2Pool)
    """Upstream HTTP/2 sessions per endpoint, shared by requests (:mod:`ambit.waypoint.http2_upstream`)."""
    identity: SpiffeId | None = None
    """Its own identity: ``By`` of the XFCC header it adds (:mod:`ambit.waypoint.client_cert`)."""
    balancer: Balancer = field(default_factory=Balancer)
    """Round-robin positions, requests in flight and pool limits for the DestinationRules."""
    admission: dict[str, asyncio.Condition] = field(default_factory=dict)
    """Per Service/subset with a ``maxConnections``: where requests over it wait for one to finish."""
    background: set[asyncio.Task[None]] = field(default_factory=set)
    """Tasks that outlive the request that started them (mirrored copies); cancelled when the waypoint stops."""
    labels: LabelsCache = field(init=False)
    """Each request's metric labels, by its ends, flags and protocol (built once, not per request)."""

    def __post_init__(self) -> None:
        self.labels = LabelsCache(self.metrics)

    def near(self) -> Workload | None:
        """This proxy's own workload, which endpoints are picked close to (the locality rules of
        :mod:`~ambit.waypoint.destinations`); None while the state does not know it."""
        return self.me.own_workload(self.state)


@dataclass(frozen=True, slots=True)
class SelfReport:
    """An ingress gateway as the source of its own reports."""

    workload: Workload | None
    """Its pod's workload (None while the workload state does not know it: ``unknown`` labels)."""
    identity: SpiffeId | None
    """Its identity, when it reaches upstreams over mutual TLS itself (HBONE); None when a node proxy tunnels its
    plain upstream connections (a captured gateway: no principal of its own on them)."""


@dataclass(frozen=True, slots=True)
class Tunnel:
    target: Target
    authority: str
    peer_identity: SpiffeId | None
    """The client's verified identity; None for a client outside the mesh (an ingress gateway's)."""
    peer_addr: str
    """``ip:port`` of the HBONE connection's client."""
    source: Workload | None
    reporter: Reporter = Reporter.WAYPOINT
    """Whose metrics these are: the waypoint's, or an ingress gateway's (``source``, as Istio's gateways report)."""
    mtls: bool = True
    """The client came over mutual TLS (HBONE); an ingress gateway's downstream does not."""
    scheme: str = "http"
    """The scheme of the client's requests (their ``:scheme``): ``https`` when an ingress gateway terminated the
    client's TLS itself; ``http`` in a waypoint's HBONE tunnel, whose requests are plaintext."""
    forward_client_cert: ForwardClientCert | None = None
    """An ingress gateway's connection: what its requests' ``x-forwarded-client-cert`` becomes (the gateway's
    mode when the connection was accepted); None: a waypoint's rules (:mod:`ambit.waypoint.client_cert`)."""
    client_certificate: ClientCertificate | None = None
    """The client certificate the gateway verified on this connection (mutual TLS), else None."""
    self_report: SelfReport | None = None
    """An ingress gateway's connection from an ordinary client: the gateway reports as the source (Istio's
    client-side stats name the reporting proxy as the source, the upstream as the destination). None: the
    connection's own source is reported (a waypoint's; a gateway's tunnelled connection, whose node proxy named
    the client)."""
    service_key: str = field(init=False)
    """The key policies, RequestAuthentications and metric overrides name the destination by: the Service's
    ``namespace/hostname``, empty for a workload target (fixed for the tunnel, so worked out once)."""

    def __post_init__(self) -> None:
        target = self.target
        object.__setattr__(self, "service_key", target.service.key if isinstance(target, ServiceTarget) else "")

    def labels(
        self,
        destination: Workload | None,
        service: Service | None,
        *,
        flags: str = "-",
        protocol: str = "http",
        cache: LabelsCache | None = None,
    ) -> TrafficLabels:
        """Istio's labels for one request (or TCP connection) of this tunnel, reporter="waypoint" (or the
        gateway's: reported client-side, by the gateway as the source, principals only when the upstream was
        reached over HBONE, and the security policy ``unknown`` as Istio's source reports have it); from ``cache``
        (the context's) when given."""
        source, identity, mtls, policy = self.source, self.peer_identity, self.mtls, None
        if self.self_report is not None:
            source, identity, policy = self.self_report.workload, self.self_report.identity, SecurityPolicy.UNKNOWN
            hbone = destination is not None and destination.tunnel_protocol is TunnelProtocol.HBONE
            mtls = identity is not None and hbone
        if cache is not None:
            return cache.labels(
                self.reporter,
                source=source,
                source_identity=identity,
                destination=destination,
                service=service,
                mtls=mtls,
                flags=flags,
                request_protocol=protocol,
                policy=policy,
            )
        return traffic_labels(
            self.reporter,
            source=source,
            source_identity=identity,
            destination=destination,
            destination_identity=destination.identity if destination is not None else None,
            service=service,
            mtls=mtls,
            flags=flags,
            request_protocol=protocol,
            policy=policy,
        )
