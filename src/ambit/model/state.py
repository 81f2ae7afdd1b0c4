"""The node proxy's view of the mesh: an in-memory index of workloads and services, and the outbound decision.

Theory of operation: :class:`WorkloadState` holds every known :class:`Workload` (by uid) and :class:`Service` (by
``namespace/hostname``) plus secondary indexes (address, VIP, hostname, node, service membership), so each
``find_*`` is a dictionary lookup. Updates diff the old and new value of one entry and touch only the index
entries that changed. :meth:`WorkloadState.resolve` is spec §6.3 without waypoints and network gateways: it turns
an original destination into a :class:`Destination` to dial. :meth:`WorkloadState.resolve_waypoint` turns a
waypoint's :class:`GatewayAddress` into the waypoint instance to dial (the plans decide when to use it). Load
balancing is injected (``choose``), so this module stays pure and deterministic under test.

Invariants and conflict rules:

1. Every index entry points at a live workload or service, and every live one is in all the indexes it belongs to.
2. Two workloads may share an address (a pod IP being reused): the most recently added one answers the lookup;
   removing it uncovers the other. VIPs shared by two services work the same way, except that a lookup for a
   client prefers a service of the client's own namespace (ztunnel's ``get_best_by_vip``). A HOST_NETWORK workload is
   never indexed by address (as in ztunnel): its address is its node's, shared with every other host-network pod
   and the node itself, so an address lookup must not pick one of them. It is still found by uid, by node and
   as a service endpoint.
3. Two services may share a hostname (one per namespace): the one added first answers, as the oldest object wins
   hostname conflicts in Istio. Updating a service in place keeps its place.
4. Endpoint lists come back sorted by uid, so ``choose`` sees the same sequence for the same state.

Waypoints (spec §1.4, §4.1; ztunnel's ``fetch_waypoint``):

5. A :class:`GatewayAddress` names a Service by ``namespace/hostname`` (exactly that key: no fallback to a service
   of another namespace), or an address: the workload with that address, else the Service with that VIP, in the
   address's own network (:meth:`WorkloadState.find_gateway`).
6. A named workload is dialled at the address itself (by hostname: its address of the caller's family) on the
   ``hbone_mtls_port``. A named Service is dialled at one of its endpoints picked by ``choose``; an endpoint is
   eligible when it has an address, is healthy (unless the service allows all), is on the caller's network (there
   is no east-west gateway to cross networks) and has a port for the HBONE port: the Service must declare it, and
   the endpoint's own mapping, else the Service's non-zero target port, gives the number (a named port without a
   mapping is no port, as in ztunnel). The endpoint's address is the one of the original destination's family.
7. The expected identity is the chosen instance's, plus the waypoint Service's SAN overrides
   (:attr:`Destination.expected_identities` of the returned destination).
8. Anything else raises :class:`UnknownWaypointError`: a configured waypoint is never skipped silently.

Visibility and hostname endpoints (spec §4.1 ``Service.visibility``, ``Workload.hostname``; ztunnel):

9. Given the client's namespace, a VIP lookup sees only the services visible to it: a NAMESPACE service of
   another namespace is skipped as if absent (another service with that VIP may answer, else the address is a
   workload's or passthrough). Without a namespace (inbound, waypoint lookups) every service counts.
10. A service endpoint with a ``hostname`` and no address is eligible (rule 6's other conditions apart); the
    :class:`Destination` then keeps the original IP and says :attr:`Destination.resolve_hostname`: the caller
    resolves the name (``fetch_*``, with I/O) before dialling. Waypoint instances must have an address.
11. A VIP with a prefix length (a ServiceEntry's CIDR range) makes every address in the range the service's: a
    VIP lookup that finds no service at the address itself takes a range holding it, ranked as ztunnel ranks
    them: the client's namespace first, then the longest prefix, then canonical (rule 9 applies; ties: the latest).

Routing preference (spec §4.1 ``LoadBalancing``; ztunnel's ``load_balance``):

12. Given the client workload, a service's eligible endpoints (and a waypoint Service's eligible instances) are
    narrowed to the closest to it by the service's routing preference (:mod:`ambit.model.routing_preference`)
    before ``choose`` sees them; STRICT with none close is no healthy upstream (no instance, for a waypoint).
    Without a client the preference is not weighed. The outbound narrowing is kept per service and client view
    until the state changes (at most :data:`CLOSEST_CACHED` of them), so a connection costs a dictionary lookup.
"""

from __future__ import annotations

import enum
import ipaddress
from collections.abc import Callable, Iterable, Sequence
from dataclasses import dataclass
from typing import Any, TypeVar

from ambit.model.errors import IdentityError, NoHealthyUpstreamError, UnknownWaypointError
from ambit.model.identity import SpiffeId
from ambit.model.localconfig_forms import service_to_dict, workload_to_dict
from ambit.model.routing_preference import ClientView, client_view, closest, weighs_preference
from ambit.model.workload import (
    GatewayAddress,
    HealthPolicy,
    HealthStatus,
    IPAddress,
    NamespacedHostname,
    NetworkAddress,
    NetworkMode,
    Service,
    TunnelProtocol,
    Workload,
)

__all__ = [
    "CLOSEST_CACHED",
    "Destination",
    "NoHealthyUpstreamError",
    "Transport",
    "UnknownWaypointError",
    "WorkloadState",
    "choose_by_capacity",
]


CLOSEST_CACHED = 4096
"""Narrowed endpoint lists kept (rule 12): one per service and client view in use; all are dropped when full."""


class Transport(enum.Enum):
    """How to reach a destination."""

    HBONE = "hbone"  # the destination workload speaks HBONE: mTLS + HTTP/2 CONNECT to its IP on 15008
    PLAINTEXT = "plaintext"  # a known workload without HBONE: plain TCP to its IP and target port
    PASSTHROUGH = "passthrough"  # not in the mesh's view: plain TCP to the original destination


@dataclass(frozen=True, slots=True)
class Destination:
    """Where an outbound connection goes, and why."""

    ip: IPAddress
    """The address to dial: the workload's IP, or the original IP for passthrough."""
    port: int
    """The target port: the service port mapped to the endpoint's target port, or the original port."""
    transport: Transport
    workload: Workload | None
    service: Service | None

    @property
    def resolve_hostname(self) -> str:
        """The DNS name to resolve for the address to dial (rule 10), or ``""`` when ``ip`` is the address."""
        workload = self.workload
        if workload is None or workload.addresses:
            return ""
        return workload.hostname

    @property
    def expected_identities(self) -> frozenset[SpiffeId]:
        """Identities the peer certificate may carry: the workload's, plus the service's SAN overrides.

        Like ztunnel, SANs that are not SPIFFE ids are ignored rather than failing the connection. Empty when there
        is no workload (passthrough).
        """
        if self.workload is None:
            return frozenset()
        identities = {self.workload.identity}
        if self.service is not None:
            for san in self.service.subject_alt_names:
                try:
                    identities.add(SpiffeId.parse(san))
                except IdentityError:
                    continue
        return frozenset(identities)


def _transport_of(workload: Workload) -> Transport:
    return Transport.HBONE if workload.tunnel_protocol is TunnelProtocol.HBONE else Transport.PLAINTEXT


def _target_port(workload: Workload, service: Service, port: int) -> int:
    """The endpoint's own mapping, else the service's non-zero target port, else the service port itself."""
    for mapping in workload.services.get(service.key, ()):
        if mapping.service_port == port and mapping.target_port:
            return mapping.target_port
    for mapping in service.ports:
        if mapping.service_port == port and mapping.target_port:
            return mapping.target_port
    return port


def _waypoint_port(workload: Workload, service: Service, hbone_port: int) -> int | None:
    """The port ``workload`` takes HBONE on as an instance of waypoint ``service`` (rule 6); None if it has none."""
    declared = [mapping for mapping in service.ports if mapping.service_port == hbone_port]
    if not declared:
        return None
    for mapping in workload.services.get(service.key, ()):
        if mapping.service_port == hbone_port and mapping.target_port:
            return mapping.target_port
    return declared[0].target_port or None


def _eligible(workload: Workload, service: Service, *, hostname: bool = False) -> bool:
    """Whether a service's endpoint may be picked: it has an address (or, with ``hostname``, a name to resolve:
    rule 10), and is healthy unless the service allows all."""
    return bool(workload.addresses or (hostname and workload.hostname)) and (
        service.health_policy is HealthPolicy.ALLOW_ALL or workload.status is HealthStatus.HEALTHY
    )


def _address_like(workload: Workload, ip: IPAddress) -> IPAddress:
    """The workload's first address of ``ip``'s family, else its first address (the caller checked it has one)."""
    for address in workload.addresses:
        if address.version == ip.version:
            return address
    return workload.addresses[0]


K = TypeVar("K")


def _link(index: dict[K, dict[str, None]], key: K, member: str) -> None:
    index.setdefault(key, {})[member] = None


def _unlink(index: dict[K, dict[str, None]], key: K, member: str) -> None:
    members = index.get(key)
    if members is not None:
        members.pop(member, None)
        if not members:
            del index[key]


def _relink(index: dict[K, dict[str, None]], old: Iterable[K], new: Iterable[K], member: str) -> None:
    """Move ``member`` from the ``old`` keys to the ``new`` ones, leaving unchanged keys (and their order) alone."""
    old_keys, new_keys = dict.fromkeys(old), dict.fromkeys(new)
    for key in old_keys:
        if key not in new_keys:
            _unlink(index, key, member)
    for key in new_keys:
        if key not in old_keys:
            _link(index, key, member)


class WorkloadState:
    """Pure, mutable index. Every find_* is an O(1)/O(k) in-memory lookup."""

    __slots__ = (
        "_by_address",
        "_by_hostname",
        "_by_node",
        "_by_range",
        "_by_service",
        "_by_vip",
        "_closest",
        "_closest_generation",
        "_generation",
        "_range_lengths",
        "_services",
        "_workloads",
    )

    def __init__(self) -> None:
        self._generation = 0
        self._workloads: dict[str, Workload] = {}
        self._services: dict[str, Service] = {}
        # Index values are insertion-ordered sets (dicts with None values) of uids or service keys.
        self._by_address: dict[tuple[str, IPAddress], dict[str, None]] = {}
        self._by_node: dict[str, dict[str, None]] = {}
        self._by_service: dict[str, dict[str, None]] = {}
        self._by_vip: dict[tuple[str, IPAddress], dict[str, None]] = {}
        self._by_range: dict[tuple[str, IPAddress, int], dict[str, None]] = {}
        # (generation, network and IP version -> prefix lengths present, longest first): rebuilt after a change.
        self._range_lengths: tuple[int, dict[tuple[str, int], list[int]]] = (-1, {})
        self._by_hostname: dict[str, dict[str, None]] = {}
        # Rule 12: (service key, client view) -> the eligible endpoints closest to such a client, for one generation.
        self._closest: dict[tuple[str, ClientView], tuple[Workload, ...]] = {}
        self._closest_generation = -1

    @property
    def generation(self) -> int:
        """A number that changes with every update, so a cache of lookups can tell it is stale."""
        return self._generation

    # Updates.

    def replace_all(self, workloads: Iterable[Workload], services: Iterable[Service]) -> None:
        """Forget everything, then add these (a full snapshot, e.g. a reloaded local config)."""
        self._generation += 1
        for index in (
            self._by_address,
            self._by_node,
            self._by_service,
            self._by_vip,
            self._by_range,
            self._by_hostname,
        ):
            index.clear()
        self._workloads.clear()
        self._services.clear()
        for workload in workloads:
            self.upsert_workload(workload)
        for service in services:
            self.upsert_service(service)

    def upsert_workload(self, workload: Workload) -> None:
        """Add ``workload``, or replace the one with its uid; index entries it no longer has are dropped."""
        self._generation += 1
        old = self._workloads.get(workload.uid)
        uid = workload.uid
        _relink(self._by_address, _address_keys(old), _address_keys(workload), uid)
        _relink(self._by_node, [old.node] if old and old.node else [], [workload.node] if workload.node else [], uid)
        _relink(self._by_service, old.services if old else [], workload.services, uid)
        self._workloads[uid] = workload

    def remove_workload(self, uid: str) -> bool:
        """Forget the workload with this uid; False if there was none."""
        self._generation += 1
        old = self._workloads.pop(uid, None)
        if old is None:
            return False
        _relink(self._by_address, _address_keys(old), [], uid)
        _relink(self._by_node, [old.node] if old.node else [], [], uid)
        _relink(self._by_service, old.services, [], uid)
        return True

    def upsert_service(self, service: Service) -> None:
        """Add ``service``, or replace the one with its key."""
        self._generation += 1
        key = service.key
        old = self._services.get(key)
        _relink(self._by_vip, _vip_keys(old), _vip_keys(service), key)
        _relink(self._by_range, _range_keys(old), _range_keys(service), key)
        _relink(self._by_hostname, [old.hostname] if old else [], [service.hostname], key)
        self._services[key] = service

    def remove_service(self, key: str) -> bool:
        """Forget the service with this ``namespace/hostname`` key; False if there was none."""
        self._generation += 1
        old = self._services.pop(key, None)
        if old is None:
            return False
        _relink(self._by_vip, _vip_keys(old), [], key)
        _relink(self._by_range, _range_keys(old), [], key)
        _relink(self._by_hostname, [old.hostname], [], key)
        return True

    # Lookups.

    def find_workload(self, uid: str) -> Workload | None:
        return self._workloads.get(uid)

    def find_workload_by_address(self, network: str, ip: IPAddress) -> Workload | None:
        uids = self._by_address.get((network, ip))
        return self._workloads[next(reversed(uids))] if uids else None

    def find_service_by_vip(self, network: str, ip: IPAddress, client_namespace: str | None = None) -> Service | None:
        """The service with this VIP, else the one whose VIP range holds it (rule 11); with ``client_namespace``,
        only those visible to a client of that namespace (rule 9), and one of that namespace first (rule 2)."""
        found = self.find_services_by_vip(network, ip, client_namespace)
        return found[0] if found else None

    def find_services_by_vip(self, network: str, ip: IPAddress, client_namespace: str | None = None) -> list[Service]:
        """Every service :meth:`find_service_by_vip` could answer, best first: at the address itself (of the client's
        namespace first, then the latest added), else in ranges (ranked by client's namespace, prefix length, then
        canonical, as ztunnel ranks them; ties: the latest added)."""
        exact = self._visible(self._by_vip.get((network, ip)), client_namespace)
        if exact or not self._by_range:
            return sorted(exact, key=lambda s: s.namespace != client_namespace)  # stable: latest first otherwise
        ranked: list[tuple[tuple[bool, int, bool], Service]] = []
        for length in self._lengths(network, ip.version):
            start = ipaddress.ip_network((ip, length), strict=False).network_address
            for service in self._visible(self._by_range.get((network, start, length)), client_namespace):
                ranked.append(((service.namespace == client_namespace, length, service.canonical), service))
        ranked.sort(key=lambda item: item[0], reverse=True)  # stable: latest first within a rank
        return [service for _, service in ranked]

    def _visible(self, keys: dict[str, None] | None, client_namespace: str | None) -> list[Service]:
        """The services of ``keys``, latest added first, visible to ``client_namespace`` (all without one)."""
        services = [self._services[key] for key in reversed(keys or {})]
        return [s for s in services if client_namespace is None or s.visible_to(client_namespace)]

    def _lengths(self, network: str, version: int) -> list[int]:
        generation, lengths = self._range_lengths
        if generation != self._generation:
            grouped: dict[tuple[str, int], set[int]] = {}
            for net, start, length in self._by_range:
                grouped.setdefault((net, start.version), set()).add(length)
            lengths = {group: sorted(items, reverse=True) for group, items in grouped.items()}
            self._range_lengths = (self._generation, lengths)
        return lengths.get((network, version), [])

    def find_service_by_hostname(self, hostname: str) -> Service | None:
        keys = self._by_hostname.get(hostname)
        return self._services[next(iter(keys))] if keys else None

    def find_services_by_hostname(self, hostname: str) -> list[Service]:
        """Every service with this hostname (one per namespace at most), oldest first (rule 3)."""
        return [self._services[key] for key in self._by_hostname.get(hostname, ())]

    def find_endpoints(self, service: Service) -> list[Workload]:
        """Workloads that list ``service.key`` in their services, sorted by uid."""
        return [self._workloads[uid] for uid in sorted(self._by_service.get(service.key, ()))]

    def find_workloads_on_node(self, node: str) -> list[Workload]:
        return [self._workloads[uid] for uid in sorted(self._by_node.get(node, ()))]

    def find_identities_on_node(self, node: str) -> frozenset[SpiffeId]:
        return frozenset(workload.identity for workload in self.find_workloads_on_node(node))

    def workloads(self) -> list[Workload]:
        """Every workload, sorted by uid."""
        return [self._workloads[uid] for uid in sorted(self._workloads)]

    def services(self) -> list[Service]:
        """Every service, sorted by key."""
        return [self._services[key] for key in sorted(self._services)]

    # Decisions.

    def resolve(
        self,
        network: str,
        ip: IPAddress,
        port: int,
        choose: Callable[[Sequence[Workload]], Workload],
        client_namespace: str | None = None,
        client: Workload | None = None,
    ) -> Destination:
        """Where a connection to ``ip:port`` (in ``network``) goes (spec §6.3, steps 3, 4 and 7).

        A service VIP goes to an endpoint picked by ``choose`` among the eligible ones (healthy unless the service
        allows all; with an address or a hostname, rule 10); without one, a PASSTHROUGH service's VIP is passthrough
        to ``ip:port`` (with the service), any other raises :class:`NoHealthyUpstreamError`. A workload
        address goes to that workload, whatever its health. Anything else is passthrough. With
        ``client_namespace``, services not visible to that namespace are not seen (rule 9); with ``client`` (the
        connecting workload), the service's routing preference narrows the endpoints (rule 12).
        """
        service = self.find_service_by_vip(network, ip, client_namespace)
        if service is not None:
            candidates = self._service_candidates(service, client)
            if not candidates and service.passthrough:
                # ztunnel's rule for a PASSTHROUGH service (a ``resolution: NONE`` ServiceEntry): no endpoint, so
                # the connection goes where it was sent.
                return Destination(ip=ip, port=port, transport=Transport.PASSTHROUGH, workload=None, service=service)
            if not candidates:
                raise NoHealthyUpstreamError(f"no healthy upstream for service {service.key} ({ip} port {port})")
            chosen = choose(candidates)
            return Destination(
                ip=_address_like(chosen, ip) if chosen.addresses else ip,
                port=_target_port(chosen, service, port),
                transport=_transport_of(chosen),
                workload=chosen,
                service=service,
            )
        workload = self.find_workload_by_address(network, ip)
        if workload is not None:
            return Destination(ip=ip, port=port, transport=_transport_of(workload), workload=workload, service=None)
        return Destination(ip=ip, port=port, transport=Transport.PASSTHROUGH, workload=None, service=None)

    def _service_candidates(self, service: Service, client: Workload | None) -> Sequence[Workload]:
        """The endpoints of ``service`` a connection from ``client`` may go to (rules 6, 10 and 12)."""
        if client is None or not weighs_preference(service):
            return [w for w in self.find_endpoints(service) if _eligible(w, service, hostname=True)]
        if self._closest_generation != self._generation:
            self._closest.clear()
            self._closest_generation = self._generation
        key = (service.key, client_view(service, client))
        found = self._closest.get(key)
        if found is None:
            if len(self._closest) >= CLOSEST_CACHED:
                self._closest.clear()
            eligible = [w for w in self.find_endpoints(service) if _eligible(w, service, hostname=True)]
            found = self._closest[key] = tuple(closest(service, key[1], eligible))
        return found

    def find_gateway(self, gateway: GatewayAddress) -> Workload | Service | None:
        """What a waypoint's address names (rule 5): a Service, a workload, or nothing known."""
        destination = gateway.destination
        if isinstance(destination, NamespacedHostname):
            return self._services.get(f"{destination.namespace}/{destination.hostname}")
        return self.find_workload_by_address(destination.network, destination.ip) or self.find_service_by_vip(
            destination.network, destination.ip
        )

    def find_waypoint_instances(self, gateway: GatewayAddress) -> list[Workload]:
        """The workloads that are the waypoint ``gateway`` names, whatever their health (empty when unknown)."""
        found = self.find_gateway(gateway)
        if found is None:
            return []
        if isinstance(found, Workload):
            return [found]
        return self.find_endpoints(found)

    def resolve_waypoint(
        self,
        gateway: GatewayAddress,
        network: str,
        like: IPAddress,
        choose: Callable[[Sequence[Workload]], Workload],
        client: Workload | None = None,
    ) -> Destination:
        """The waypoint instance a connection to ``like`` (the original destination IP) is sent to (rules 5-8),
        the closest to ``client`` by the waypoint Service's routing preference (rule 12).

        The result's ``ip`` and ``port`` are the instance's HBONE listener, its ``workload`` the instance, its
        ``service`` the waypoint's own Service (None when the address names a workload). Raises
        :class:`UnknownWaypointError` when the waypoint is unknown or has no instance to dial.
        """
        found = self.find_gateway(gateway)
        if found is None:
            raise UnknownWaypointError(f"waypoint {gateway} not found")
        if isinstance(found, Workload):
            if not found.addresses:
                raise UnknownWaypointError(f"waypoint {gateway} (workload {found.uid}) has no address")
            if found.network != network:
                raise UnknownWaypointError(f"waypoint {gateway} is on network {found.network!r}, not {network!r}")
            destination = gateway.destination
            ip = destination.ip if isinstance(destination, NetworkAddress) else _address_like(found, like)
            return Destination(ip, gateway.hbone_mtls_port, Transport.HBONE, found, None)
        service = found
        hbone_port = gateway.hbone_mtls_port
        ports: dict[str, int] = {}
        candidates = []
        for workload in self.find_endpoints(service):
            port = _waypoint_port(workload, service, hbone_port)
            if port is not None and workload.network == network and _eligible(workload, service):
                ports[workload.uid] = port
                candidates.append(workload)
        if not candidates:
            raise UnknownWaypointError(
                f"waypoint {gateway} has no healthy instance with port {hbone_port} on network {network!r}"
            )
        if client is not None and weighs_preference(service):
            candidates = closest(service, client_view(service, client), candidates)
            if not candidates:
                raise UnknownWaypointError(f"waypoint {gateway} has no instance its routing preference allows")
        chosen = choose(candidates)
        if isinstance(gateway.destination, NetworkAddress):
            like = gateway.destination.ip  # named by its VIP: that VIP's family, as ztunnel does
        return Destination(_address_like(chosen, like), ports[chosen.uid], Transport.HBONE, chosen, service)

    def resolve_inbound_target(self, local: Workload, authority_host: str, port: int) -> int | None:
        """The port on ``local`` for a CONNECT to ``authority_host:port`` where the host is a service hostname.

        Among the services with that hostname, the first one ``local`` is an endpoint of maps the port (spec §6.5
        step 2). None when the hostname is unknown or ``local`` is an endpoint of none of them.
        """
        for key in self._by_hostname.get(authority_host, ()):
            if key in local.services:
                return _target_port(local, self._services[key], port)
        return None

    def to_dump(self) -> dict[str, Any]:
        """JSON-able ``{"workloads": [...], "services": [...]}`` in the local config's shape, for /config_dump."""
        return {
            "workloads": [_json_keys(workload_to_dict(workload)) for workload in self.workloads()],
            "services": [_json_keys(service_to_dict(service)) for service in self.services()],
        }


def _address_keys(workload: Workload | None) -> list[tuple[str, IPAddress]]:
    if workload is None or workload.network_mode is NetworkMode.HOST_NETWORK:
        return []  # rule 2
    return [(workload.network, ip) for ip in workload.addresses]


def _vip_keys(service: Service | None) -> list[tuple[str, IPAddress]]:
    return [] if service is None else [(vip.network, vip.ip) for vip in service.vips if vip.length is None]


def _range_keys(service: Service | None) -> list[tuple[str, IPAddress, int]]:
    if service is None:
        return []
    return [(vip.network, vip.ip, vip.length) for vip in service.vips if vip.length is not None]


def _json_keys(value: Any) -> Any:
    """Port maps have int keys in YAML; JSON object keys are strings."""
    if isinstance(value, dict):
        return {str(key): _json_keys(item) for key, item in value.items()}
    if isinstance(value, list):
        return [_json_keys(item) for item in value]
    return value


def choose_by_capacity(candidates: Sequence[Workload], draw: float) -> Workload:
    """One of ``candidates`` in proportion to its :attr:`~ambit.model.workload.Workload.capacity` (ztunnel's
    weighted choice), ``draw`` in [0, 1): capacity 0 is never chosen while another has some; when every one has 0,
    each is equally likely (ztunnel would find no upstream; Ambit's ``choose`` always answers)."""
    total = sum(w.capacity for w in candidates)
    if total <= 0:
        return candidates[min(int(draw * len(candidates)), len(candidates) - 1)]
    point = draw * total
    for workload in candidates:
        point -= workload.capacity
        if point < 0 and workload.capacity > 0:
            return workload
    return next(w for w in reversed(candidates) if w.capacity > 0)
