"""What the node proxy does with a connection, decided without I/O (spec §6.3, §6.5, §6.6).

A connection handler gathers the facts of one connection (its addresses, the local pod's workload, the peer's
identity), asks a ``plan_*`` function what to do, and carries the answer out. Plans read the workload state through
its synchronous ``find_*`` lookups and ask the authorizer; they touch no socket, task or clock, so every branch is
table-tested without a network. A refusal is a :class:`Refuse` value, never an exception: ``status`` is the HBONE
answer (400, 401, 503; an outbound or plaintext refusal resets the connection instead), ``flag`` the response flag
it is counted with, and ``counted`` whether it is counted at all (refusals before the connection's two ends are
known are only logged, as ztunnel does).

Outbound (15001), :func:`plan_outbound`, in order (ztunnel's ``build_request``):

1. A destination on one of the proxy's own ports (:data:`ILLEGAL_PORTS`) at loopback or at the pod's own address
   is a self-call: refused, not counted.
2. A source workload the state does not know: refused, not counted.
3. A Service VIP whose Service has a waypoint: :class:`Tunnel` to one instance of the waypoint
   (:meth:`WorkloadState.resolve_waypoint`: its pod IP and HBONE port) with ``:authority <VIP>:<port>`` (the
   original destination), the server checked against the waypoint's identity. This comes before an endpoint is
   chosen: the waypoint balances, so the service needs no healthy endpoint here. A waypoint that does not resolve
   refuses the connection (503, ``NR``, counted, "waypoint ... not found"): it is never bypassed, as in ztunnel.
   The one exception is a source that is itself an instance of that waypoint (same identity, one of its
   addresses), which goes on to rule 4, so that a captured waypoint (sandwich mode) does not loop into itself;
   ztunnel checks this only for rule 6, as its waypoints are normally not captured.
   A Service with a weighted set (a canary waypoint) picks its waypoint per connection with ``draw``
   (:func:`~ambit.model.waypoint_choice.choose_waypoint`: weight 0 never, a canary the state knows no instance of
   never, the primary when nothing else is left); a picked canary that does not resolve falls back to the primary.
   An instance of any waypoint of the set is exempt as above.
4. A Service VIP otherwise: one endpoint is chosen by ``choose`` among the eligible ones closest to the pod by
   the Service's routing preference (:mod:`ambit.model.routing_preference`; a waypoint instance likewise, by its
   Service's); none → refused, ``NR``,
   unless the Service's load balancing mode is PASSTHROUGH (a ``resolution: NONE`` ServiceEntry): then
   :class:`Plain` to the original destination, the address the pod connected to (ztunnel's rule), reported with
   the Service.
   A pod address is that workload; any other address is passthrough.
5. A pod address (not a VIP) whose workload has a waypoint, unless the source is an instance of that waypoint:
   :class:`Tunnel` to the workload's waypoint with ``:authority <pod IP>:<port>``, whatever the pod's own transport
   and node; an unresolvable waypoint is refused as in rule 3. Traffic to a VIP never takes its endpoint's
   workload waypoint, and traffic to a pod IP never takes a waypoint its Service has (a service-only waypoint).
6. An HBONE workload served by this same proxy: :class:`Local` (handed to the inbound side, no TLS).
7. An HBONE workload elsewhere: :class:`Tunnel` to ``<pod IP>:15008`` with ``:authority <pod IP>:<target port>``,
   the server checked against the workload's identity (and the service's SAN overrides).
8. Otherwise :class:`Plain` TCP: to ``<pod IP>:<target port>`` for a workload without HBONE, or to the original
   destination for passthrough.
9. Visibility: rules 3 and 4 see only the Services visible to the source's namespace (spec §4.1 ``visibility``): a
   VIP of a namespace-visible Service of another namespace is, for this source, an unknown address (passthrough
   unless it is a workload's), as ztunnel does.
10. A chosen endpoint with a hostname and no address (a ``resolution: DNS`` ServiceEntry's) is :class:`Plain`
    with ``hostname`` set: the executor resolves the name (an address of the original destination's family)
    before dialling ``<address>:<target port>``. Such an endpoint with HBONE is refused (503, ``NR``): Ambit does
    not tunnel to names.

A waypoint is always reached through HBONE, never by :class:`Local`, even when its pod is on this node (ztunnel has
no same-node shortcut, and a waypoint terminates HBONE itself). The tunnel's ``destination`` is what the connection
is reported as (ztunnel's metrics for waypoint traffic): the waypoint instance as the destination workload and
principal, the original Service (if the destination was a VIP) as the destination service.

Inbound (15008 HBONE, 15006 plaintext, and the same-node path), :func:`plan_inbound`, in order:

1. HBONE: an ``:authority`` that is not ``host:port`` → 400.
2. A local workload the state does not know → 503, ``NR``; one without an address (same-node path) → 503, ``NR``.
3. HBONE: an IP authority must be the address the connection arrived at, else 400 ("ip mismatch"), unless the
   local workload has an ``application_tunnel`` (a waypoint that learns the real target from the PROXY header, or
   takes it as is), or the Service or workload at that IP (workload first, in the local workload's network) names
   a waypoint that this local workload is an instance of (for a Service, any waypoint of its weighted set): then
   the pod is dialled on the authority's port. That case arises only when a waypoint is itself captured by a node
   proxy (a "sandwich"): Istio's waypoints are not enrolled and terminate HBONE on 15008 themselves. A hostname
   must be a Service this pod is an endpoint of, and its port is mapped to the pod's target port, else 400.
   A target port (after that mapping) that is one of the proxy's own ports (:data:`ILLEGAL_PORTS`) → 400,
   uncounted, as ztunnel does: tunnels must not nest into the proxy's own listeners (the same-node path too).
   The one exception is the node proxy's own pod (:attr:`InboundFacts.itself`): its metrics and readiness ports
   (:data:`SELF_SERVED_PORTS`) are what its self-proxy listener serves, as ztunnel's does.
4. The authorizer refuses → 401, ``DENY``, counted, with the engine's reason ("explicitly denied by: ns/name",
   "allow policies exist, but none allowed").
5. :class:`Dial` the pod at ``<its IP>:<port>`` from the client's address (the node proxy's own pod: from its own
   address; the shell decides, :attr:`~ambit.proxy.context.LocalPod.itself`).
6. Application tunnel (spec §6.5 step 5; HBONE and the same-node path, not plaintext, as ztunnel's passthrough
   has none): the tunnel's port replaces the port unless it is 0 (an own port after that → 400 as in rule 3).
   NONE dials the pod's address as rule 5. PROXY dials loopback in the pod (``127.0.0.1``, ``::1`` for an IPv6
   pod address) from loopback, so that only what the node proxy sends in the pod's own namespace reaches the
   tunnel port (the waypoint listens there on loopback), and :attr:`Dial.header` is written first: a PROXY
   version 2 header with the client's address and port, the original target (the IP authority; for a hostname,
   the Service's VIP, one on the pod's network and IPv4 first, with the authority's port), and TLV ``0xD0`` the
   client's SPIFFE identity when it has one. No VIP, or a client and target of different families → 400.

Plaintext (15006), :func:`plan_plaintext`: a call to one of the proxy's own ports is refused, not counted; then as
inbound, with no peer identity and no authority.
"""

from __future__ import annotations

import functools
import ipaddress
from collections.abc import Callable, Container, Sequence
from dataclasses import dataclass, field

from ambit import proxyprotocol
from ambit.hbone.errors import AuthorityError
from ambit.hbone.headers import hostport, parse_authority
from ambit.model.identity import SpiffeId
from ambit.model.state import Destination, NoHealthyUpstreamError, Transport, UnknownWaypointError, WorkloadState
from ambit.model.waypoint_choice import choose_waypoint
from ambit.model.workload import AppTunnelProtocol, GatewayAddress, IPAddress, Service, Workload
from ambit.proxy.authorization import Authorizer
from ambit.proxy.errors import ResponseFlag
from ambit.rbac import Connection

HBONE_PORT = 15008

ILLEGAL_PORTS = frozenset({15001, 15006, 15008, 15080, 15000, 15020, 15021})
"""The proxy's own ports: a pod calling them (at loopback or its own address) is refused (spec §2.4)."""
SELF_SERVED_PORTS = frozenset({15020, 15021})
"""Of those, the ones the node proxy's own pod serves to others through its self-proxy listener (metrics and
readiness, as ztunnel's TestZtunnelSecureMetrics scrapes 15020 over HBONE): reachable when the local pod is the
proxy itself (:attr:`InboundFacts.itself`)."""


@dataclass(frozen=True, slots=True)
class Refuse:
    """Refuse the connection: answer ``status`` on HBONE (reset otherwise), count it with ``flag`` if ``counted``."""

    status: int
    flag: ResponseFlag
    reason: str
    counted: bool = True
    stopped: Dial | None = None
    """The dial the refusal stopped, when it came that far (an inbound denial is counted against it)."""


@dataclass(frozen=True, slots=True)
class Tunnel:
    """An HBONE tunnel: CONNECT ``authority`` on a pooled mutual-TLS connection to ``address``."""

    destination: Destination
    address: tuple[str, int]
    """The peer's HBONE listener: ``(pod IP, 15008)``, or a waypoint instance's ``(pod IP, HBONE port)``."""
    authority: str
    """``<pod IP>:<target port>``; through a waypoint, the original destination ``<VIP or pod IP>:<port>``."""
    expected: frozenset[SpiffeId]
    """Identities the server's certificate may name."""
    waypoint: GatewayAddress | None = None
    """The waypoint the tunnel goes through (rules 3 and 5); None for a tunnel straight to the destination pod."""


@dataclass(frozen=True, slots=True)
class Plain:
    """Plain TCP to ``address``, from the pod's own address."""

    destination: Destination
    address: tuple[str, int]
    """``(IP, port)``; with ``hostname``, ``(hostname, port)``: resolve, then dial the address at that port."""
    hostname: str = ""
    """A name to resolve for the address to dial (rule 10), else ``""``."""


@dataclass(frozen=True, slots=True)
class Local:
    """The destination pod is served by this proxy: hand the connection to its inbound side."""

    destination: Destination
    workload: Workload
    address: tuple[str, int]
    """``(pod IP, target port)``."""


@dataclass(frozen=True, slots=True)
class AppTunnelHeader:
    """The PROXY header a PROXY application tunnel starts with (inbound rule 6)."""

    source: tuple[IPAddress, int]
    target: tuple[IPAddress, int]
    identity: SpiffeId | None

    def encode(self) -> bytes:
        tlvs = () if self.identity is None else ((proxyprotocol.TLV_PEER_IDENTITY, str(self.identity).encode()),)
        return proxyprotocol.encode_v2(self.source, self.target, tlvs)


@dataclass(frozen=True, slots=True)
class Dial:
    """Connect to the local pod ``workload`` at ``ip:port``, bound to the client's ``source_ip`` (from loopback,
    and ``header`` written first, for a PROXY application tunnel)."""

    workload: Workload
    ip: str
    port: int
    source_ip: str
    connection: Connection | None = field(default=None, compare=False)
    """The facts the connection was authorized on (kept, so that a policy change can re-check it)."""
    dry_run: str = field(default="", compare=False)
    """What dry-run policies would have done, when they would have denied (for the log)."""
    header: AppTunnelHeader | None = None
    """Inbound rule 6: the PROXY header to write before anything else."""


OutboundPlan = Tunnel | Plain | Local | Refuse
InboundPlan = Dial | Refuse


# --- outbound --------------------------------------------------------------------------------------------------


@dataclass(frozen=True, slots=True)
class NodeView:
    """What plans know of the proxy itself: its network and node, and the workloads whose pods it serves."""

    network: str
    node: str
    local_workloads: Container[str]
    """Uids of the workloads with a pod in this proxy (a live view: the proxy's own index)."""

    def serves(self, workload: Workload) -> bool:
        return workload.node == self.node and workload.uid in self.local_workloads


@dataclass(frozen=True, slots=True)
class OutboundFacts:
    """One connection a local pod opened: where it was going (original destination), and who the pod is."""

    dst_ip: IPAddress
    dst_text: str
    """``dst_ip`` as the socket gave it (text): reused as is when the connection goes to that very address."""
    dst_port: int
    source: Workload | None
    """The pod's workload; None when the state did not learn it in time."""


def is_self_call(dst_ip: IPAddress, dst_port: int, own: Sequence[IPAddress]) -> bool:
    return dst_port in ILLEGAL_PORTS and (dst_ip.is_loopback or dst_ip in own)


def plan_outbound(
    facts: OutboundFacts,
    state: WorkloadState,
    node: NodeView,
    choose: Callable[[Sequence[Workload]], Workload],
    draw: Callable[[], float] = lambda: 0.0,
) -> OutboundPlan:
    """Where the connection goes (the module's outbound rules); ``draw`` gives a number in [0, 1) for a Service's
    weighted waypoints (called only for such a Service)."""
    source = facts.source
    if is_self_call(facts.dst_ip, facts.dst_port, source.addresses if source else ()):
        return Refuse(503, ResponseFlag.NONE, "a call to the proxy's own port", counted=False)
    if source is None:
        return Refuse(503, ResponseFlag.NO_ROUTE, "unknown source workload", counted=False)
    service = state.find_service_by_vip(node.network, facts.dst_ip, source.namespace)
    if service is not None and service.waypoint is not None and not _from_any_waypoint(state, service, source):
        return _through_service_waypoint(facts, state, node, choose, draw, service, service.waypoint)
    try:
        destination = state.resolve(node.network, facts.dst_ip, facts.dst_port, choose, source.namespace, client=source)
    except NoHealthyUpstreamError as exc:
        return Refuse(503, ResponseFlag.NO_ROUTE, str(exc))
    workload = destination.workload
    if (
        destination.service is None
        and workload is not None
        and workload.waypoint is not None
        and not _from_waypoint(state, workload.waypoint, source)
    ):
        return _through_waypoint(facts, state, node, choose, workload.waypoint, None)
    if hostname := destination.resolve_hostname:
        if destination.transport is Transport.HBONE:
            return Refuse(503, ResponseFlag.NO_ROUTE, f"HBONE to hostname endpoint {hostname} is not supported")
        return Plain(destination, (hostname, destination.port), hostname)
    ip_text = facts.dst_text if destination.ip == facts.dst_ip else str(destination.ip)
    if destination.transport is Transport.HBONE and workload is not None:
        if node.serves(workload):
            return Local(destination, workload, (ip_text, destination.port))
        authority = hostport(ip_text, destination.port)
        return Tunnel(destination, (ip_text, HBONE_PORT), authority, destination.expected_identities)
    return Plain(destination, (ip_text, destination.port))


def _through_waypoint(
    facts: OutboundFacts,
    state: WorkloadState,
    node: NodeView,
    choose: Callable[[Sequence[Workload]], Workload],
    gateway: GatewayAddress,
    service: Service | None,
) -> Tunnel | Refuse:
    """The tunnel to ``gateway``'s waypoint for the original destination (rules 3 and 5), or its refusal."""
    try:
        waypoint = state.resolve_waypoint(gateway, node.network, facts.dst_ip, choose, client=facts.source)
    except UnknownWaypointError as exc:
        return Refuse(503, ResponseFlag.NO_ROUTE, str(exc))
    # Reported as the waypoint instance, for the original service (ztunnel's metrics for waypoint traffic).
    reported = Destination(waypoint.ip, waypoint.port, Transport.HBONE, waypoint.workload, service)
    return Tunnel(
        reported,
        (str(waypoint.ip), waypoint.port),
        hostport(facts.dst_text, facts.dst_port),
        waypoint.expected_identities,
        waypoint=gateway,
    )


def _through_service_waypoint(
    facts: OutboundFacts,
    state: WorkloadState,
    node: NodeView,
    choose: Callable[[Sequence[Workload]], Workload],
    draw: Callable[[], float],
    service: Service,
    primary: GatewayAddress,
) -> Tunnel | Refuse:
    """Rule 3: the service's waypoint, or one of its weighted set; a picked canary that fails gives the primary."""
    if not service.weighted_waypoints:
        return _through_waypoint(facts, state, node, choose, primary, service)
    picked = choose_waypoint(service, lambda g: bool(state.find_waypoint_instances(g)), draw()) or primary
    plan = _through_waypoint(facts, state, node, choose, picked, service)
    if isinstance(plan, Refuse) and picked != primary:
        return _through_waypoint(facts, state, node, choose, primary, service)
    return plan


def _from_any_waypoint(state: WorkloadState, service: Service, source: Workload) -> bool:
    return any(_from_waypoint(state, gateway, source) for gateway in service.fronting_waypoints)


def _from_waypoint(state: WorkloadState, gateway: GatewayAddress, source: Workload) -> bool:
    """Whether ``source`` is an instance of the waypoint ``gateway`` names: its identity, one of its addresses
    (ztunnel's ``check_from_waypoint``)."""
    addresses = set(source.addresses)
    # Addresses first: cheap, and they rule out every instance but the source itself.
    return any(
        not addresses.isdisjoint(w.addresses) and w.identity == source.identity
        for w in state.find_waypoint_instances(gateway)
    )


# --- inbound ---------------------------------------------------------------------------------------------------


@dataclass(frozen=True, slots=True)
class InboundFacts:
    """One connection arriving for a local pod."""

    local: Workload | None
    """The pod's workload; None when the state did not learn it in time."""
    local_ip: str | None
    """The address the connection arrived at; None on the same-node path (the pod's first address)."""
    port: int
    """The destination port (plaintext, same-node path); unused when there is an ``authority``."""
    source_ip: str
    source_identity: SpiffeId | None
    """The peer's verified identity; None without mutual TLS."""
    authority: str | None = None
    """The CONNECT ``:authority`` (HBONE only)."""
    itself: bool = False
    """The local pod is the node proxy's own (rule 3 lets :data:`SELF_SERVED_PORTS` through)."""
    source_port: int = 0
    """The client's port (a PROXY application tunnel's header names it)."""


@functools.lru_cache(maxsize=4096)
def parse_ip(text: str) -> IPAddress:
    """``ipaddress.ip_address(text)``, remembered: every connection names a few addresses (its source, the local
    pod, a destination), nearly always ones seen before, and parsing one costs microseconds. The result is a pure
    function of the text and immutable, so the cache cannot change a verdict; text that is no address raises
    ValueError every time (never cached). The bound caps what peers naming ever new addresses can make it hold."""
    return ipaddress.ip_address(text)


def plan_inbound(facts: InboundFacts, state: WorkloadState, authorize: Authorizer) -> InboundPlan:
    """Whether and where to dial the local pod (the module's inbound rules)."""
    return _plan_inbound(facts, state, authorize, tunnels=True)


def _plan_inbound(facts: InboundFacts, state: WorkloadState, authorize: Authorizer, *, tunnels: bool) -> InboundPlan:
    host, port = None, facts.port
    if facts.authority is not None:
        try:
            host, port = _split_authority(facts.authority, facts.local_ip)
        except AuthorityError as exc:
            return Refuse(400, ResponseFlag.NONE, f"bad CONNECT authority: {exc}", counted=False)
    workload = facts.local
    if workload is None:
        return Refuse(503, ResponseFlag.NO_ROUTE, "the local pod is not in the workload state", counted=False)
    local_ip = facts.local_ip
    if local_ip is None:
        if not workload.addresses:
            return Refuse(503, ResponseFlag.NO_ROUTE, f"pod {workload.name} has no address", counted=False)
        local_ip = str(workload.addresses[0])
    authority_port = port
    if host is not None and host != local_ip:
        mapped = _inbound_port(state, workload, local_ip, host, port)
        if isinstance(mapped, Refuse):
            return mapped
        port = mapped
    if port in ILLEGAL_PORTS and not (facts.itself and port in SELF_SERVED_PORTS):
        return Refuse(400, ResponseFlag.NONE, f"CONNECT to the proxy's own port {port}", counted=False)
    tunnel = workload.application_tunnel if tunnels else None
    dial_ip, dial_port, header = local_ip, port, None
    if tunnel is not None:
        dial_port = tunnel.port or port
        if dial_port in ILLEGAL_PORTS:
            return Refuse(
                400, ResponseFlag.NONE, f"application tunnel to the proxy's own port {dial_port}", counted=False
            )
        if tunnel.protocol is AppTunnelProtocol.PROXY:
            made = _tunnel_header(state, workload, facts, host or local_ip, authority_port)
            if isinstance(made, Refuse):
                return made
            header = made
            dial_ip = "::1" if ":" in local_ip else "127.0.0.1"
    try:
        connection = Connection(parse_ip(facts.source_ip), facts.source_identity, parse_ip(local_ip), port)
    except ValueError:
        return Refuse(400, ResponseFlag.NONE, f"not an IP address: {facts.source_ip!r}", counted=False)
    decision = authorize(workload, connection)
    dial = Dial(workload, dial_ip, dial_port, facts.source_ip, connection, decision.dry_run, header)
    if not decision.allowed:
        return Refuse(401, ResponseFlag.DENY, decision.reason, stopped=dial)
    return dial


def plan_plaintext(facts: InboundFacts, state: WorkloadState, authorize: Authorizer) -> InboundPlan:
    """A connection redirected to 15006: never to the proxy's own ports, then as :func:`plan_inbound`."""
    if facts.port in ILLEGAL_PORTS:
        return Refuse(503, ResponseFlag.NONE, "a plaintext call to the proxy's own port", counted=False)
    return _plan_inbound(facts, state, authorize, tunnels=False)


def _tunnel_header(
    state: WorkloadState, workload: Workload, facts: InboundFacts, host: str, port: int
) -> AppTunnelHeader | Refuse:
    """Rule 6's header: the client, and the original target (``host`` an IP, else a Service hostname)."""
    try:
        target: IPAddress = parse_ip(host)
    except ValueError:
        vips = [
            vip
            for service in state.find_services_by_hostname(host)
            if service.key in workload.services
            for vip in service.vips
            if vip.length is None
        ]
        if not vips:
            return Refuse(400, ResponseFlag.NONE, f"no IP address for service {host!r}", counted=False)
        best = max(vips, key=lambda vip: (vip.network == workload.network, vip.ip.version == 4))
        target = best.ip
    try:
        source = parse_ip(facts.source_ip)
    except ValueError:
        return Refuse(400, ResponseFlag.NONE, f"not an IP address: {facts.source_ip!r}", counted=False)
    if source.version != target.version:
        return Refuse(400, ResponseFlag.NONE, f"client {source} and target {target} differ in family", counted=False)
    return AppTunnelHeader((source, facts.source_port), (target, port), facts.source_identity)


def _split_authority(authority: str, local_ip: str | None) -> tuple[str, int]:
    """:func:`parse_authority`, with a shortcut for the usual CONNECT: to this pod's IP and a valid port.

    ``local_ip`` is the IPv4 address as the listener reported it, so already in the form ``parse_authority`` gives.
    """
    host, _, port_text = authority.rpartition(":")
    if (
        host == local_ip
        and ":" not in host
        and 0 < len(port_text) <= 5
        and port_text.isascii()
        and port_text.isdigit()
        and port_text[0] != "0"
        and int(port_text) <= 65535
    ):
        return host, int(port_text)
    return parse_authority(authority)


def _inbound_port(state: WorkloadState, workload: Workload, local_ip: str, host: str, port: int) -> int | Refuse:
    """The pod's port for a CONNECT to ``host:port`` where ``host`` is not the address it arrived at."""
    try:
        ip = parse_ip(host)
    except ValueError:
        mapped = state.resolve_inbound_target(workload, host, port)
        if mapped is None:
            return Refuse(400, ResponseFlag.NONE, f"unknown service {host!r} for this pod", counted=False)
        return mapped
    arrived = parse_ip(local_ip)
    if workload.application_tunnel is not None:
        return port  # rule 3: the tunnelled waypoint is told the target, or takes anything
    if ip != arrived and not _is_waypoint_for(state, workload, arrived, ip):
        return Refuse(400, ResponseFlag.NONE, f"ip mismatch: CONNECT to {host} arrived at {local_ip}", counted=False)
    return port


def _is_waypoint_for(state: WorkloadState, local: Workload, arrived: IPAddress, target: IPAddress) -> bool:
    """Whether the Service or workload at ``target`` names a waypoint that ``local`` is an instance of (rule 3)."""
    named = state.find_workload_by_address(local.network, target) or state.find_service_by_vip(local.network, target)
    if named is None:
        return False
    gateways = named.fronting_waypoints if isinstance(named, Service) else (named.waypoint,)
    for gateway in gateways:
        found = None if gateway is None else state.find_gateway(gateway)
        if isinstance(found, Workload) and arrived in found.addresses:
            return True
        if isinstance(found, Service) and found.key in local.services:
            return True
    return False
