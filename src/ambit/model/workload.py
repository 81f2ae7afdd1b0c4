"""Workloads and services as the node proxy sees them (spec §4.1, ``istio.workload``), with proto3 defaults (§12).

Theory of operation: these are plain values. A :class:`Workload` is one addressable thing (a pod, a workload entry)
with its identity inputs and the per-service port mappings it overrides; a :class:`Service` is a hostname with
VIPs and a default port mapping. Indexing and lookups live in :mod:`ambit.model.state`; parsing from files lives in
:mod:`ambit.model.localconfig`. Nothing here validates names: whoever builds a value from outside input (the local
config parser, the xDS translation) checks it there and blames the right field.

Invariants:

- Values are immutable (by type) and hashable. ``Workload.services`` is copied on construction, so the caller's
  dict can change later without changing the workload; it stays a plain dict so ``asdict``/``deepcopy`` work.
- Empty ``trust_domain`` / ``service_account`` mean the mesh defaults, as on the wire, so :attr:`Workload.identity`
  is the same whether a workload came from xDS (elided defaults) or from a file (spelled out).
- ``PortMapping.target_port == 0`` means "named port": each endpoint says its own number in ``Workload.services``.
- An empty :class:`Locality` (all three parts empty) means "unknown", as an absent ``Locality`` message on the wire.
- ``Service.weighted_waypoints`` is empty unless the service has a canary waypoint; ``Service.waypoint`` is then
  still the primary, so a reader that knows nothing of weights sends everything there.
- ``waypoint`` None means "no waypoint" (an absent ``GatewayAddress``); a :class:`GatewayAddress` names its
  waypoint either by hostname (within a namespace) or by one address, never both, as the proto's ``oneof``.
"""

from __future__ import annotations

import enum
import functools
import ipaddress
from collections.abc import Mapping
from dataclasses import dataclass, field

from ambit.model.errors import AddressError
from ambit.model.identity import DEFAULT_SERVICE_ACCOUNT, DEFAULT_TRUST_DOMAIN, SpiffeId

__all__ = [
    "HBONE_MTLS_PORT",
    "AddressError",
    "AppProtocol",
    "GatewayAddress",
    "HealthPolicy",
    "HealthStatus",
    "IPAddress",
    "IPFamilies",
    "LoadBalancingMode",
    "Locality",
    "NamespacedHostname",
    "NetworkAddress",
    "NetworkMode",
    "PortMapping",
    "RoutingScope",
    "Service",
    "TunnelProtocol",
    "Visibility",
    "WeightedWaypoint",
    "Workload",
    "parse_ip",
]

IPAddress = ipaddress.IPv4Address | ipaddress.IPv6Address


class TunnelProtocol(enum.Enum):
    """How a workload takes inbound mesh traffic: HBONE on 15008, or plain TCP to its own port."""

    NONE = "NONE"
    HBONE = "HBONE"


class NetworkMode(enum.Enum):
    """Whether a workload has its own network namespace or shares its node's (``hostNetwork``): a host-network
    workload's address is the node's, so it is never indexed by IP (ztunnel does the same)."""

    STANDARD = "Standard"
    HOST_NETWORK = "HostNetwork"


class IPFamilies(enum.Enum):
    """A service's IP families (``spec.ipFamilies``); AUTOMATIC = not said, the node proxy infers from the VIPs."""

    AUTOMATIC = "Automatic"
    IPV4_ONLY = "IPv4Only"
    IPV6_ONLY = "IPv6Only"
    DUAL = "Dual"


class AppProtocol(enum.Enum):
    """The application protocol of a service port (spec §4.1 ``AppProtocol``); UNKNOWN = not declared."""

    UNKNOWN = "Unknown"
    HTTP11 = "HTTP11"
    HTTP2 = "HTTP2"
    GRPC = "GRPC"
    TCP = "TCP"
    TLS = "TLS"


class Visibility(enum.Enum):
    """Who may see a service (spec §4.1 ``Service.visibility``): everyone, or only clients of its own namespace.

    A service a client may not see is, for that client, not there at all: its name is not answered by the DNS
    proxy and its VIPs are not handled as the service (ztunnel's rule: no shadowing by an invisible service)."""

    PUBLIC = "Public"
    NAMESPACE = "Namespace"


class HealthStatus(enum.Enum):
    HEALTHY = "Healthy"
    UNHEALTHY = "Unhealthy"


class HealthPolicy(enum.Enum):
    """Which endpoints of a service may be picked (``LoadBalancing.health_policy``)."""

    ONLY_HEALTHY = "OnlyHealthy"
    ALLOW_ALL = "AllowAll"


class LoadBalancingMode(enum.Enum):
    """How a service's endpoints are chosen (``LoadBalancing.mode``). PASSTHROUGH: a connection to a VIP of the
    service that finds no endpoint goes to the address it was sent to (a ``resolution: NONE`` ServiceEntry).
    STRICT and FAILOVER weigh the service's routing preference (:class:`RoutingScope`,
    :mod:`ambit.model.routing_preference`): STRICT picks only endpoints sharing every scope with the client,
    FAILOVER the closest there are; UNSPECIFIED ignores the preference."""

    UNSPECIFIED = "Unspecified"
    STRICT = "Strict"
    FAILOVER = "Failover"
    PASSTHROUGH = "Passthrough"


class RoutingScope(enum.Enum):
    """One scope of a service's routing preference (``LoadBalancing.Scope``): what a client and an endpoint must
    share for the endpoint to count as close. Values are ztunnel's local config spellings."""

    REGION = "Region"
    ZONE = "Zone"
    SUBZONE = "Subzone"
    NODE = "Node"
    CLUSTER = "Cluster"
    NETWORK = "Network"


def parse_ip(text: str) -> IPAddress:
    """Read one IPv4 or IPv6 address; zone ids (``fe80::1%eth0``) are refused: mesh addresses are global."""
    try:
        ip = ipaddress.ip_address(text)
    except ValueError:
        raise AddressError(f"not an IP address: {text!r}") from None
    if isinstance(ip, ipaddress.IPv6Address) and ip.scope_id is not None:
        raise AddressError(f"IP address has a zone id: {text!r}")
    return ip


@dataclass(frozen=True, slots=True)
class PortMapping:
    """A service port and the port the endpoint listens on; ``target_port`` 0 = named, resolved per workload."""

    service_port: int
    target_port: int
    app_protocol: AppProtocol = AppProtocol.UNKNOWN


@dataclass(frozen=True, slots=True)
class Locality:
    """Where a workload runs (its node's ``topology.kubernetes.io/region``, ``.../zone`` and
    ``topology.istio.io/subzone`` labels); all empty = unknown."""

    region: str = ""
    zone: str = ""
    subzone: str = ""

    @property
    def known(self) -> bool:
        return bool(self.region or self.zone or self.subzone)


@dataclass(frozen=True, slots=True)
class NetworkAddress:
    """An IP within a network (``""`` = the default network); rendered ``network/ip`` as in ztunnel's keys.

    With ``length`` (a ServiceEntry's CIDR, spec §4.1 ``NetworkAddress.length``) it is a range: ``ip`` is then the
    range's network address (host bits clear) and ``length`` shorter than the address; rendered
    ``network/ip/length``. None: one address."""

    network: str
    ip: IPAddress
    length: int | None = None

    def __str__(self) -> str:
        text = f"{self.network}/{self.ip}"
        return text if self.length is None else f"{text}/{self.length}"

    @property
    def is_range(self) -> bool:
        return self.length is not None

    def contains(self, ip: IPAddress) -> bool:
        """Whether ``ip`` is this address, or in this range."""
        if self.length is None or ip.version != self.ip.version:
            return ip == self.ip
        return ip in ipaddress.ip_network((self.ip, self.length))

    @classmethod
    def of_cidr(cls, network: str, text: str) -> NetworkAddress:
        """An address or a CIDR range (``10.0.0.0/24``; host bits are cleared, as istiod masks it); a prefix as long
        as the address is one address. Raises :class:`AddressError`."""
        if "/" not in text:
            return cls(network, parse_ip(text))
        if "%" in text:
            raise AddressError(f"IP range has a zone id: {text!r}")
        try:
            net = ipaddress.ip_network(text, strict=False)
        except ValueError:
            raise AddressError(f"not an IP address or CIDR range: {text!r}") from None
        length = net.prefixlen if net.prefixlen != net.max_prefixlen else None
        return cls(network, net.network_address, length)

    @classmethod
    def parse(cls, text: str) -> NetworkAddress:
        """Read ``net/ip``, ``/ip`` or a bare ``ip``, and ranges as ``net/ip/length`` or ``ip/length``. The IP is
        after the last ``/`` (before the length of a range): an IP never holds one."""
        if not isinstance(text, str):
            raise AddressError(f"network address must be a string, not {type(text).__name__}")
        network, _, last = text.rpartition("/")
        if last.isdigit() and last.isascii():
            outer, _, ip = network.rpartition("/")
            address = cls.of_cidr(outer, f"{ip}/{last}")
            if address.length is not None and address.ip != parse_ip(ip):
                raise AddressError(f"range has host bits set: {text!r}")
            return address
        return cls(network, parse_ip(last))


HBONE_MTLS_PORT = 15008
"""The port a waypoint takes HBONE on (spec §0, §1.4)."""


@dataclass(frozen=True, slots=True)
class NamespacedHostname:
    """A hostname looked up within a namespace (spec §4.1 ``NamespacedHostname``): a waypoint's Service."""

    namespace: str
    hostname: str

    def __str__(self) -> str:
        return f"{self.namespace}/{self.hostname}"


@dataclass(frozen=True, slots=True)
class GatewayAddress:
    """Where a waypoint is reached (spec §4.1 ``GatewayAddress``): by hostname or by one address, HBONE port."""

    destination: NamespacedHostname | NetworkAddress
    hbone_mtls_port: int = HBONE_MTLS_PORT

    def __str__(self) -> str:
        """``ns/hostname:15008``, ``network/10.0.0.1:15008``, ``network/[fd00::1]:15008``."""
        destination = self.destination
        if isinstance(destination, NetworkAddress) and destination.ip.version == 6:
            return f"{destination.network}/[{destination.ip}]:{self.hbone_mtls_port}"
        return f"{destination}:{self.hbone_mtls_port}"


class AppTunnelProtocol(enum.Enum):
    """How a node proxy hands decapsulated traffic to a workload that asks for an application tunnel: as is
    (NONE), or after a PROXY protocol version 2 header naming the client (PROXY)."""

    NONE = "NONE"
    PROXY = "PROXY"


@dataclass(frozen=True, slots=True)
class ApplicationTunnel:
    """What a waypoint instance asks of its node proxy (spec §4.1 ``Workload.application_tunnel``, §6.5 step 5);
    istiod sets it from ``ambient.istio.io/waypoint-inbound-binding``."""

    protocol: AppTunnelProtocol = AppTunnelProtocol.NONE
    port: int = 0
    """The port inside the pod to deliver to; 0 keeps the port the client asked for."""


@dataclass(frozen=True, slots=True)
class WeightedWaypoint:
    """One waypoint of a Service's weighted set (spec §4.1 ``WeightedWaypoint``): its share of new connections."""

    destination: GatewayAddress
    weight: int


@dataclass(frozen=True, slots=True)
class Workload:
    """One addressable workload (spec §4.1 ``Workload``), with the fields the node proxy uses."""

    uid: str
    name: str
    namespace: str
    addresses: tuple[IPAddress, ...]
    network: str = ""
    tunnel_protocol: TunnelProtocol = TunnelProtocol.NONE
    trust_domain: str = DEFAULT_TRUST_DOMAIN
    service_account: str = DEFAULT_SERVICE_ACCOUNT
    node: str = ""
    canonical_name: str = ""
    canonical_revision: str = ""
    workload_name: str = ""
    workload_type: str = "pod"
    cluster_id: str = "Kubernetes"
    status: HealthStatus = HealthStatus.HEALTHY
    services: Mapping[str, tuple[PortMapping, ...]] = field(default_factory=dict)
    """Key ``namespace/hostname`` of each service this workload is an endpoint of → its own port mappings."""
    authorization_policies: tuple[str, ...] = ()
    """Keys (``namespace/name``) of the selector-scoped policies that apply to this workload (spec §7.3)."""
    network_mode: NetworkMode = NetworkMode.STANDARD
    locality: Locality = field(default_factory=Locality)
    waypoint: GatewayAddress | None = None
    """The waypoint traffic to this workload's own addresses goes through (``istio.io/use-waypoint``)."""
    hostname: str = ""
    """A DNS name the node proxy resolves when it picks this endpoint (spec §4.1 ``Workload.hostname``), for a
    workload without addresses: the endpoints of a ``resolution: DNS`` ServiceEntry, a WorkloadEntry whose
    ``address`` is a name."""
    application_tunnel: ApplicationTunnel | None = None
    """For a waypoint's own pod: how its node proxy delivers inbound traffic to it (§6.5 step 3 and 5)."""
    capacity: int = 1
    """This endpoint's relative share of its services' traffic (spec §4.1 ``Workload.capacity``, absent = 1): a
    WorkloadEntry's or ServiceEntry endpoint's ``weight``."""

    def __post_init__(self) -> None:
        if not isinstance(self.addresses, tuple):
            object.__setattr__(self, "addresses", tuple(self.addresses))
        if not isinstance(self.authorization_policies, tuple):
            object.__setattr__(self, "authorization_policies", tuple(self.authorization_policies))
        # A private copy: the caller's dict may change later. Typed as a Mapping, so callers cannot mutate it.
        object.__setattr__(self, "services", {key: tuple(ports) for key, ports in self.services.items()})

    def __hash__(self) -> int:
        # The generated hash would include the services mapping, which is not hashable; equal workloads still
        # hash equal since these fields are part of equality.
        return hash((self.uid, self.name, self.namespace, self.addresses))

    @property
    def identity(self) -> SpiffeId:
        """``spiffe://<trust domain>/ns/<namespace>/sa/<service account>``, empty parts taking the defaults."""
        return _identity(
            self.trust_domain or DEFAULT_TRUST_DOMAIN,
            self.namespace,
            self.service_account or DEFAULT_SERVICE_ACCOUNT,
        )


IDENTITIES_CACHED = 4096
"""Workload identities kept made (:func:`_identity`): a node's outbound connections ask for them per connection."""


@functools.lru_cache(maxsize=IDENTITIES_CACHED)
def _identity(trust_domain: str, namespace: str, service_account: str) -> SpiffeId:
    """The :class:`SpiffeId` of these parts, checked once rather than per connection (an outbound connection asks
    its destination workload's, for the names its peer may carry). ``SpiffeId`` is immutable, so one instance
    serves every caller; parts that do not make one raise each time (nothing is cached for them). The parts come
    from the control plane's workloads, never from a peer, and the cache is bounded all the same."""
    return SpiffeId(trust_domain, namespace, service_account)


@dataclass(frozen=True, slots=True)
class Service:
    """A service (spec §4.1 ``Service``): a hostname, its VIPs and default port mappings."""

    name: str
    namespace: str
    hostname: str
    vips: tuple[NetworkAddress, ...] = ()
    ports: tuple[PortMapping, ...] = ()
    subject_alt_names: tuple[str, ...] = ()
    health_policy: HealthPolicy = HealthPolicy.ONLY_HEALTHY
    canonical: bool = False
    """The authoritative service for its hostname (istiod: true for every Kubernetes Service); it wins hostname
    lookups from outside its namespace."""
    ip_families: IPFamilies = IPFamilies.AUTOMATIC
    waypoint: GatewayAddress | None = None
    """The waypoint traffic to this service goes through (``istio.io/use-waypoint``)."""
    ingress_use_waypoint: bool = False
    """Ingress gateways, too, send to this service through its waypoint (``istio.io/ingress-use-waypoint``)."""
    visibility: Visibility = Visibility.PUBLIC

    def visible_to(self, namespace: str) -> bool:
        """Whether a client in ``namespace`` may see this service (:class:`Visibility`)."""
        return self.visibility is Visibility.PUBLIC or namespace == self.namespace

    weighted_waypoints: tuple[WeightedWaypoint, ...] = ()
    """With a canary waypoint: the primary and the canary with their shares of new connections (a weight 0 is never
    chosen); ``waypoint`` stays the primary, which takes everything when none of these can be used."""
    load_balancing_mode: LoadBalancingMode = LoadBalancingMode.UNSPECIFIED
    """``PASSTHROUGH``: without an endpoint, a connection goes to its original destination (ztunnel's rule)."""
    routing_preference: tuple[RoutingScope, ...] = ()
    """The scopes a client prefers its endpoint to share, most significant first (``LoadBalancing.
    routing_preference``); weighed only in STRICT and FAILOVER mode."""

    @property
    def passthrough(self) -> bool:
        return self.load_balancing_mode is LoadBalancingMode.PASSTHROUGH

    @property
    def fronting_waypoints(self) -> tuple[GatewayAddress, ...]:
        """Every waypoint that may take this service's traffic: the primary, then the weighted set's others."""
        out = [] if self.waypoint is None else [self.waypoint]
        out.extend(w.destination for w in self.weighted_waypoints if w.destination not in out)
        return tuple(out)

    @property
    def key(self) -> str:
        """``namespace/hostname``: how workloads refer to the service in :attr:`Workload.services`."""
        return f"{self.namespace}/{self.hostname}"
