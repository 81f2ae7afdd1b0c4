"""What a CONNECT to the waypoint may reach, and which endpoint serves each request: pure decisions on the state.

Theory of operation: a client's node proxy sends a connection to the waypoint over HBONE with the original target
in the CONNECT ``:authority`` (spec §6.1, §6.3). :func:`plan_tunnel` judges that authority against the workload
state and :class:`WaypointSelf` (who this waypoint is); :func:`pick_endpoint` chooses, per request (or per TCP
connection), one endpoint of a Service, as the node proxy's ``WorkloadState.resolve`` does for a VIP. Nothing here
does I/O; randomness comes in as ``choose``.

Hostname endpoints (a ``resolution: DNS`` ServiceEntry's, spec §4.1 ``Workload.hostname``): :func:`pick_endpoint`
may choose an endpoint that has a name and no address. Its :class:`Endpoint` then carries :data:`UNRESOLVED` as
``ip`` and names the host in :attr:`Endpoint.resolve_hostname`; the upstream shell resolves it on demand
(:class:`~ambit.proxy.hostnames.HostnameResolver`) in the IP version of its ``ip`` (IPv4, or IPv6 when the client
dialled an IPv6 address: :func:`in_dialled_family`), falling back to the other version, and asks
:func:`judge_resolved` whether the answer may be dialled before it connects, plain TCP, to the address and the
target port. A DNS answer is the network's word, not the mesh's: it must not turn the waypoint against itself.

A DestinationRule narrows and shapes that choice (:mod:`ambit.waypoint.traffic_policy` decides): ``only`` keeps a
subset's workloads, ``choose`` is the rule's load balancer, and the chosen :class:`Endpoint` carries a
:class:`Transport` (originated TLS, HTTP/2 upstream, PROXY header) that the upstream shell carries out.

Locality (istiod's ``GetEffectiveLbSetting`` for a Service with a traffic distribution: failover priority over
network, region, zone (subzone, node), forced): given ``near``, the waypoint's own workload
(:meth:`WaypointSelf.own_workload`), :func:`pick_endpoint` keeps, of the endpoints left after health, subset,
ejection and tried ones, those closest to it by the Service's routing preference
(:mod:`ambit.model.routing_preference`, the node proxy's rules): the ring that shares the most with the waypoint
takes every request while it has an endpoint, the next one only when it has none. (Envoy's priority levels spill
part of the load early, in proportion to the unhealthy share of the closer ring; Ambit moves it all at once, as
ztunnel does.) ``internalTrafficPolicy: Local`` keeps only endpoints on the waypoint's own node, as istiod's
endpoint builder does for any proxy. Without ``near`` (the waypoint's pod not in the state yet) every endpoint
counts. A DestinationRule's ``localityLbSetting`` (``locality``) replaces the Service's traffic distribution
(istiod: the rule's setting first): :func:`~ambit.model.locality_lb.by_locality` then decides, after
``internalTrafficPolicy: Local``'s node filter, which stays. A rule with only ``outlierDetection`` brings the
mesh's default setting, which the Service's traffic distribution outranks.

Rules of :func:`plan_tunnel` (Istio's waypoint accepts traffic only for what uses it, spec §1.4):

1. A malformed authority is refused, 400.
2. A port of the waypoint's own (admin, stats, readiness, HBONE: ``own_ports``) at one of its own addresses or at
   loopback is refused, 400: admin and metrics are never reachable through a tunnel.
3. ``VIP:port`` (or ``hostname:port``) of a Service whose ``waypoint`` is this waypoint (or one of whose weighted
   waypoints is: a canary serves the Service as the primary does), on a port the Service declares, is a
   :class:`ServiceTarget`. The same Service with an undeclared port is refused, 400. When several Services hold
   the address (a ServiceEntry on a Kubernetes Service's ClusterIP, a CIDR range), the one bound to this waypoint
   is the one meant.
4. ``podIP:port`` of a Workload whose ``waypoint`` is this waypoint is a :class:`WorkloadTarget` (the address of
   a workload whose Service uses the waypoint does not count: TestDirect's "workload-addressed via a service
   waypoint → error").
5. Anything else (unknown address, a Service or Workload using another waypoint or none) is refused, 400, marked
   :attr:`Refusal.unbound` (the shell may wait briefly for a state update that binds it, then judge again).
6. With ``listed`` given (the waypoint gets its WaypointConfig from the control plane: the keys of its
   ``services``), a Service of rule 3 that is not listed counts as not bound (rule 5): the workload state told the
   waypoint of the binding, but the config carrying that Service's policies, routes and DestinationRule has not
   come yet, and serving without them would fail open. The two arrive on separate resources, in either order.
   Without ``listed`` (a waypoint run from a local file has no such config) rule 3 alone decides. Workload-addressed
   tunnels (rule 4) need no listing: only the waypoint-wide policies apply to them, and those do not depend on
   any binding.

"This waypoint" (:meth:`WaypointSelf.is_me`): a ``GatewayAddress`` naming its Service hostname
(``<gateway>.<namespace>.svc.<domain>``) in its namespace, or one of its own addresses or its Service's VIPs.
"""

from __future__ import annotations

import dataclasses
import functools
import ipaddress
from collections.abc import Callable, Sequence
from dataclasses import dataclass

from ambit.hbone.errors import AuthorityError
from ambit.hbone.headers import hostport, parse_authority
from ambit.model.destination_policy import ClientTls, ProxyProtocolVersion
from ambit.model.errors import IdentityError
from ambit.model.identity import SpiffeId
from ambit.model.locality_lb import LocalityChoice, by_locality
from ambit.model.routes import BackendService, WeightedBackend
from ambit.model.routing_preference import client_view, closest, weighs_preference
from ambit.model.state import WorkloadState
from ambit.model.waypoint_choice import choose_waypoint
from ambit.model.workload import (
    AppProtocol,
    GatewayAddress,
    HealthPolicy,
    HealthStatus,
    IPAddress,
    LoadBalancingMode,
    NamespacedHostname,
    Service,
    Workload,
)

OWN_PORTS = frozenset({15000, 15008, 15020, 15021})
"""The waypoint's own ports: admin, HBONE, stats, readiness."""

UNRESOLVED: IPAddress = ipaddress.IPv4Address("0.0.0.0")
"""The ``ip`` of a hostname endpoint before its name is resolved (never dialled: :func:`judge_resolved`)."""

UNRESOLVED_V6: IPAddress = ipaddress.IPv6Address("::")
"""The ``ip`` of a hostname endpoint whose name is to be resolved to an IPv6 address first
(:func:`in_dialled_family`); never dialled either."""


@dataclass(frozen=True, slots=True)
class WaypointSelf:
    namespace: str
    gateway_name: str
    addresses: frozenset[IPAddress] = frozenset()
    network: str = ""
    domain: str = "cluster.local"
    own_ports: frozenset[int] = OWN_PORTS

    @property
    def hostname(self) -> str:
        """The waypoint's Service hostname, as a ``GatewayAddress`` names it."""
        return f"{self.gateway_name}.{self.namespace}.svc.{self.domain}"

    def own_workload(self, state: WorkloadState) -> Workload | None:
        """The waypoint's own pod as the state knows it (by its first address the state holds), for locality."""
        for ip in sorted(self.addresses, key=lambda a: (a.version, a)):
            workload = state.find_workload_by_address(self.network, ip)
            if workload is not None:
                return workload
        return None

    def fronts(self, service: Service, state: WorkloadState) -> bool:
        """Whether this waypoint is the Service's waypoint or one of its weighted set (a canary)."""
        return any(self.is_me(gateway, state) for gateway in service.fronting_waypoints)

    def is_me(self, waypoint: GatewayAddress | None, state: WorkloadState) -> bool:
        if waypoint is None:
            return False
        destination = waypoint.destination
        if isinstance(destination, NamespacedHostname):
            return destination.namespace == self.namespace and destination.hostname == self.hostname
        if destination.ip in self.addresses:
            return True
        service = state.find_service_by_hostname(self.hostname)
        return service is not None and any(vip.ip == destination.ip for vip in service.vips)


@dataclass(frozen=True, slots=True)
class ServiceTarget:
    service: Service
    port: int
    """The Service port the client addressed."""
    protocol: AppProtocol
    ip: IPAddress | None = None
    """The VIP the CONNECT authority named (the original destination); None when it named the hostname."""

    @property
    def backend(self) -> BackendService:
        return BackendService(self.service.namespace, self.service.hostname, self.port)


@dataclass(frozen=True, slots=True)
class WorkloadTarget:
    workload: Workload
    ip: IPAddress
    port: int
    protocol: AppProtocol = AppProtocol.UNKNOWN


@dataclass(frozen=True, slots=True)
class Refusal:
    status: int
    reason: str
    unbound: bool = False
    """Rule 5: the destination does not use this waypoint as far as its state knows; a state update may yet bind
    it (the waypoint may hear of a new binding after the client's node proxy did)."""


Target = ServiceTarget | WorkloadTarget


def plan_tunnel(
    authority: str, state: WorkloadState, me: WaypointSelf, listed: frozenset[str] | None = None
) -> Target | Refusal:
    """Judge one CONNECT authority (see the module rules); ``listed``: the service keys of the current
    WaypointConfig when it comes from the control plane (rule 6), else None."""
    try:
        host, port = parse_authority(authority)
    except AuthorityError as exc:
        return Refusal(400, f"bad authority: {exc}")  # rule 1
    try:
        ip: IPAddress | None = ipaddress.ip_address(host)
    except ValueError:
        ip = None
    if ip is not None and port in me.own_ports and (ip in me.addresses or ip.is_loopback or ip.is_unspecified):
        return Refusal(400, f"{authority} is one of the waypoint's own ports")  # rule 2
    if ip is not None:
        # Of the Services at that address (a ServiceEntry may share a Kubernetes Service's ClusterIP, or hold it in
        # a CIDR range), the one bound to this waypoint is meant, as Envoy matches a waypoint's own VIPs.
        candidates = state.find_services_by_vip(me.network, ip)
        service = next((s for s in candidates if me.fronts(s, state)), candidates[0] if candidates else None)
    else:
        service = state.find_service_by_hostname(host)
    if service is not None:
        if not me.fronts(service, state):
            return Refusal(400, f"service {service.key} does not use this waypoint", unbound=True)  # rule 5
        if listed is not None and service.key not in listed:
            reason = f"service {service.key} is not (yet) in this waypoint's configuration"
            return Refusal(400, reason, unbound=True)  # rule 6
        mapping = next((m for m in service.ports if m.service_port == port), None)
        if mapping is None:
            return Refusal(400, f"service {service.key} has no port {port}")  # rule 3
        return ServiceTarget(service, port, mapping.app_protocol, ip)
    workload = state.find_workload_by_address(me.network, ip) if ip is not None else None
    if workload is not None and ip is not None:
        if not me.is_me(workload.waypoint, state):
            return Refusal(400, f"workload {workload.uid} does not use this waypoint", unbound=True)  # rule 5
        return WorkloadTarget(workload, ip, port)  # rule 4
    return Refusal(400, f"unknown destination {authority}", unbound=True)  # rule 5


@dataclass(frozen=True, slots=True)
class Transport:
    """How the waypoint's connections to an endpoint are made, beyond HBONE or plain TCP (a DestinationRule's
    ``tls``, ``h2UpgradePolicy`` and ``proxyProtocol``: :mod:`ambit.waypoint.traffic_policy`)."""

    tls: ClientTls | None = None
    """Originate TLS (mode SIMPLE or MUTUAL) to the endpoint, inside its tunnel."""
    h2: bool = False
    """HTTP requests go upstream as HTTP/2."""
    proxy_protocol: ProxyProtocolVersion | None = None
    sni: str = ""
    """The server name for originated TLS."""
    max_requests_per_connection: int = 0
    """A kept upstream connection (HTTP/1.1, or an HTTP/2 session) takes no more than this many requests; 0: no
    limit."""
    race_first_connect: bool = False
    """A hostname endpoint is dialled at every address its name resolves to at once, the first connection to
    succeed kept (``istio.io/connect-strategy: RACE_FIRST_TCP_CONNECT``, :mod:`ambit.waypoint.racing`)."""


PLAIN = Transport()

_address_text = functools.lru_cache(maxsize=4096)(hostport)
""":attr:`Endpoint.address`, remembered for the last few thousand endpoints (every request's log line names its
endpoint, nearly always one seen before, and ``str`` of an address object is a few Python calls)."""


@dataclass(frozen=True, slots=True)
class Endpoint:
    """Where one request (or TCP connection) goes: a workload's address and target port."""

    workload: Workload
    ip: IPAddress
    port: int
    service: Service | None
    via: IPAddress | None = None
    """Where the HBONE tunnel goes when not to ``ip``: the waypoint of the Service, which ``ip:port`` (the
    Service's VIP and port, the CONNECT authority) is addressed through (``istio.io/ingress-use-waypoint``)."""
    resolve_hostname: str = ""
    """The DNS name to resolve for the address to dial (``ip`` is then :data:`UNRESOLVED`), or ``""`` when ``ip``
    is the address."""
    transport: Transport = PLAIN

    @property
    def address(self) -> str:
        """``ip:port`` for a log line; ``name:port`` while the hostname is unresolved."""
        return _address_text(self.resolve_hostname or self.ip, self.port)

    @property
    def expected_identities(self) -> frozenset[SpiffeId]:
        """The workload's identity plus the Service's SPIFFE SAN overrides (as the node proxy checks them)."""
        identities = {self.workload.identity}
        if self.service is not None:
            for san in self.service.subject_alt_names:
                try:
                    identities.add(SpiffeId.parse(san))
                except IdentityError:
                    continue
        return frozenset(identities)


def choose_weighted(backends: Sequence[WeightedBackend], random: float) -> WeightedBackend | None:
    """One of ``backends`` in proportion to its weight (weight 0 is never chosen), ``random`` in [0, 1); None
    when every weight is 0 (Gateway API: such a route answers 500, for TCP the connection is refused)."""
    total = sum(max(b.weight, 0) for b in backends)
    if total <= 0:
        return None
    point = random * total
    for backend in backends:
        if backend.weight <= 0:
            continue
        point -= backend.weight
        if point < 0:
            return backend
    return next(b for b in reversed(backends) if b.weight > 0)


def find_backend_service(state: WorkloadState, backend: BackendService) -> Service | None:
    service = state.find_service_by_hostname(backend.hostname)
    if service is None or service.namespace != backend.namespace:
        return None
    return service


def _target_port(workload: Workload, service: Service, port: int) -> int:
    for mapping in workload.services.get(service.key, ()):
        if mapping.service_port == port and mapping.target_port:
            return mapping.target_port
    for mapping in service.ports:
        if mapping.service_port == port and mapping.target_port:
            return mapping.target_port
    return port


EndpointPicker = Callable[..., "Endpoint | None"]
"""``pick(state, service, port, choose, *, exclude=..., only=..., near=..., locality=...)``: :func:`pick_endpoint`,
or an ingress gateway's :func:`pick_ingress_endpoint`."""


def pick_ingress_endpoint(
    state: WorkloadState,
    service: Service,
    port: int,
    choose: Callable[[Sequence[Workload]], Workload],
    *,
    exclude: frozenset[str] = frozenset(),
    draw: float = 0.0,
    only: frozenset[str] | None = None,
    near: Workload | None = None,
    locality: LocalityChoice | None = None,
) -> Endpoint | None:
    """An ingress gateway's choice (spec §1.5): a Service labelled ``istio.io/ingress-use-waypoint`` with a waypoint
    is reached through one of the waypoint's endpoints, the tunnel addressed to the Service's VIP and port (as a
    node proxy sends to a waypoint, spec §6.3). Without a VIP, or with the waypoint unknown or without endpoints:
    None (the request answers 503; the waypoint is never bypassed). Any other Service: :func:`pick_endpoint`.
    A Service with weighted waypoints (a canary) picks one per request with ``draw`` in [0, 1)
    (:func:`~ambit.model.waypoint_choice.choose_waypoint`); a canary without endpoints is never picked, and a
    retry (``exclude``) goes to a weighted waypoint with an instance not tried yet, else tries one again: never a
    weight-0 waypoint. ``near`` (the gateway's own workload) picks by locality, the waypoint instance too (by the
    waypoint Service's traffic distribution: ``locality``, the backend's rule, applies to the backend's endpoints)."""
    if not service.ingress_use_waypoint or service.waypoint is None:
        return pick_endpoint(state, service, port, choose, exclude=exclude, only=only, near=near, locality=locality)
    vip = next((v.ip for v in service.vips if v.length is None), None)
    if vip is None:
        return None

    def hop_to(
        gateway: GatewayAddress, pick: Callable[[Sequence[Workload]], Workload], tried: frozenset[str]
    ) -> Endpoint | None:
        destination = gateway.destination
        if isinstance(destination, NamespacedHostname):
            waypoint_service = state.find_service_by_hostname(destination.hostname)
        else:
            waypoint_service = state.find_service_by_vip(destination.network, destination.ip)
        if waypoint_service is None:
            return None
        hop = pick_endpoint(state, waypoint_service, gateway.hbone_mtls_port, pick, exclude=tried, near=near)
        if hop is not None and hop.resolve_hostname:
            return None  # a waypoint instance must have an address: the tunnel goes to it, not to a name
        return hop

    def usable(tried: frozenset[str]) -> Callable[[GatewayAddress], bool]:
        # Asked without ``choose``: only the chosen waypoint's endpoints are balanced.
        return lambda gateway: hop_to(gateway, lambda candidates: candidates[0], tried) is not None

    # A retry (``exclude``) goes to a weighted waypoint with an instance not tried yet, as Envoy's retries skip the
    # hosts already tried; when every one has been tried it stays in the weighted set (an instance is tried again),
    # so a weight-0 waypoint never takes a request. The primary alone stands in only for a canary with no instance.
    weighted = [w.destination for w in service.weighted_waypoints if w.weight > 0]
    if exclude and any(usable(exclude)(g) for g in weighted):
        gateway = choose_waypoint(service, usable(exclude), draw) or service.waypoint
    else:
        gateway = choose_waypoint(service, usable(frozenset()), draw) or service.waypoint
    hop = hop_to(gateway, choose, exclude) or (hop_to(gateway, choose, frozenset()) if exclude else None)
    if hop is None:
        return None
    return Endpoint(hop.workload, vip, port, service, via=hop.ip)


def pick_endpoint(
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
    """One endpoint of ``service`` for service port ``port``: healthy (unless the Service allows all), with an
    address or a hostname to resolve (then its ``ip`` is :data:`UNRESOLVED`), not in ``exclude`` (uids already
    tried), in ``only`` when given (a DestinationRule subset's uids), of those the closest to ``near`` when given
    (the module's locality rules; ``locality``: the rule's setting instead of the Service's traffic
    distribution), chosen by ``choose``; None when there is none."""
    allow_all = service.health_policy is HealthPolicy.ALLOW_ALL
    candidates = [
        workload
        for workload in state.find_endpoints(service)
        if (workload.addresses or workload.hostname)
        and workload.uid not in exclude
        and (only is None or workload.uid in only)
        and (allow_all or workload.status is HealthStatus.HEALTHY)
    ]
    if near is not None and locality is not None and not (locality.mesh_default and weighs_preference(service)):
        if service.load_balancing_mode is LoadBalancingMode.STRICT:  # internalTrafficPolicy: Local, a filter
            candidates = closest(service, client_view(service, near), candidates)
        setting, failing_over = locality.setting, locality.failing_over
        draw = locality.random() if setting.distribute else 0.0
        candidates = by_locality(setting, near, candidates, failing_over=failing_over, draw=draw)
    elif near is not None and weighs_preference(service):
        candidates = closest(service, client_view(service, near), candidates)
    if not candidates:
        return None
    chosen = choose(candidates)
    target_port = _target_port(chosen, service, port)
    if chosen.addresses:
        return Endpoint(chosen, chosen.addresses[0], target_port, service)
    return Endpoint(chosen, UNRESOLVED, target_port, service, resolve_hostname=chosen.hostname)


def original_destination(target: ServiceTarget) -> Endpoint | None:
    """The endpoint for a PASSTHROUGH Service that has none (a ``resolution: NONE`` ServiceEntry; Envoy's
    ORIGINAL_DST cluster): plain TCP to the VIP and port the CONNECT authority named, which :func:`plan_tunnel`
    has checked to be one of this Service's VIPs, bound to this waypoint, on a declared port, and not the waypoint's
    own. Never a name, never an address from a request header: the waypoint is not an open proxy. None for any
    other Service, or a CONNECT that named the hostname (nothing to dial)."""
    service, ip = target.service, target.ip
    if not service.passthrough or ip is None or not any(vip.contains(ip) for vip in service.vips):
        return None
    if ip.is_unspecified or ip.is_multicast or ip == ipaddress.IPv4Address("255.255.255.255"):
        return None
    workload = Workload(
        uid=f"{service.key}/original-destination",
        name="",
        namespace=service.namespace,
        addresses=(ip,),
        workload_name="",
    )
    return Endpoint(workload, ip, target.port, service)


def in_dialled_family(endpoint: Endpoint | None, target: ServiceTarget) -> Endpoint | None:
    """``endpoint``, to be resolved in the IP version of the VIP the client dialled: a hostname endpoint of a
    connection to an IPv6 VIP gets :data:`UNRESOLVED_V6` as its ``ip``. So a client that called a ServiceEntry's
    IPv6 address is served over IPv6 end to end, and one that called its IPv4 address over IPv4, as the node
    proxy resolves such names in the original destination's family (upstream's TestWaypointDNS checks the family
    the server saw on both legs). Connections kept for reuse are per ``ip`` too, so never shared across families.
    Any other endpoint is returned as it is."""
    if endpoint is None or not endpoint.resolve_hostname or target.ip is None or target.ip.version != 6:
        return endpoint
    return dataclasses.replace(endpoint, ip=UNRESOLVED_V6)


def judge_resolved(endpoint: Endpoint, ip: IPAddress, me: WaypointSelf) -> Endpoint | Refusal:
    """Whether the address a DNS answer gave for ``endpoint``'s hostname may be dialled; the endpoint at that address,
    else a 503 :class:`Refusal`. Refused: an unspecified, multicast or (IPv4) broadcast address (nothing to dial,
    or ``0.0.0.0`` which reaches loopback), and one of the waypoint's own ports at one of its own addresses or at
    loopback (the same rule :func:`plan_tunnel` applies to a CONNECT: admin and metrics stay out of reach)."""
    name = endpoint.resolve_hostname
    if ip.is_unspecified or ip.is_multicast or ip == ipaddress.IPv4Address("255.255.255.255"):
        return Refusal(503, f"{name} resolved to {ip}, which cannot be dialled")
    if endpoint.port in me.own_ports and (ip in me.addresses or ip.is_loopback):
        return Refusal(503, f"{name} resolved to {ip}, and port {endpoint.port} is one of the waypoint's own")
    return dataclasses.replace(endpoint, ip=ip, resolve_hostname="")
