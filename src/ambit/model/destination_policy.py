"""What a waypoint applies of Istio's ``DestinationRule`` to one Service: load balancing, connection pools,
outlier detection, TLS origination and subsets.

Theory of operation: the control plane picks, for each Service a waypoint serves, the rule istiod would give that
waypoint, merges several rules for one host as istiod merges them, and resolves each subset's labels to the uids of
the Service's workloads they select (:class:`DestinationPolicy`). A backend naming a subset reaches only those
workloads; a subset no rule defines answers 503 (Envoy: no such cluster), never every endpoint.
:meth:`DestinationPolicy.policy_for` is Istio's per-port, per-subset merge (:meth:`TrafficPolicy.for_port`: a
port-level entry replaces the four settings wholesale). Every value is frozen and hashable.
"""

from __future__ import annotations

import enum
from dataclasses import dataclass, field

from ambit.model.locality_lb import LocalityLbSetting

__all__ = [
    "ClientTls",
    "ConnectionPool",
    "ConsistentHash",
    "DestinationPolicy",
    "H2Upgrade",
    "LoadBalancer",
    "LoadBalancerType",
    "OutlierDetection",
    "PortTrafficPolicy",
    "ProxyProtocolVersion",
    "Subset",
    "TlsMode",
    "TrafficPolicy",
]


class LoadBalancerType(enum.Enum):
    """``LoadBalancerSettings.simple`` (Istio's ``UNSPECIFIED`` and ``LEAST_CONN`` are least-request, its default)."""

    LEAST_REQUEST = "LEAST_REQUEST"
    ROUND_ROBIN = "ROUND_ROBIN"
    RANDOM = "RANDOM"
    PASSTHROUGH = "PASSTHROUGH"


@dataclass(frozen=True, slots=True)
class ConsistentHash:
    """``LoadBalancerSettings.consistentHash``: the request's key is one of these (the first set one)."""

    header_name: str = ""
    query_parameter: str = ""
    use_source_ip: bool = False


@dataclass(frozen=True, slots=True)
class LoadBalancer:
    simple: LoadBalancerType = LoadBalancerType.LEAST_REQUEST
    consistent_hash: ConsistentHash | None = None
    """Set: endpoints are chosen by hashing the request's key (``simple`` is then ignored)."""
    locality: LocalityLbSetting | None = None
    """``localityLbSetting``: which endpoints a proxy picks among, by its own locality
    (:mod:`ambit.model.locality_lb`); set, it replaces the Service's traffic distribution."""


class H2Upgrade(enum.Enum):
    """``ConnectionPoolSettings.http.h2UpgradePolicy``."""

    DEFAULT = "DEFAULT"
    DO_NOT_UPGRADE = "DO_NOT_UPGRADE"
    UPGRADE = "UPGRADE"


@dataclass(frozen=True, slots=True)
class ConnectionPool:
    """``ConnectionPoolSettings``; 0 is "no limit of ours" (Envoy's defaults are effectively unlimited)."""

    max_connections: int = 0
    """``tcp.maxConnections``: connections open to the whole subset (or Service) at once."""
    connect_timeout: float | None = None
    """``tcp.connectTimeout`` in seconds; None: the waypoint's default."""
    http1_max_pending_requests: int = 0
    """``http.http1MaxPendingRequests``: requests waiting for a connection once ``max_connections`` are open."""
    http2_max_requests: int = 0
    """``http.http2MaxRequests``: requests in flight to the subset (or Service) at once."""
    max_requests_per_connection: int = 0
    """``http.maxRequestsPerConnection``: a kept connection is closed after this many requests."""
    h2_upgrade: H2Upgrade = H2Upgrade.DEFAULT
    use_client_protocol: bool = False
    """``http.useClientProtocol``: the endpoint is spoken to in the client's HTTP version (Envoy's
    ``use_downstream_protocol_config``), whatever the port declares; ``h2_upgrade`` is then ignored."""


class TlsMode(enum.Enum):
    """``ClientTLSSettings.mode`` as a waypoint honours it: ``ISTIO_MUTUAL`` and ``DISABLE`` leave the default
    (HBONE to a meshed endpoint, plain TCP to another); ``SIMPLE`` and ``MUTUAL`` originate TLS to the endpoint,
    inside the HBONE tunnel when the endpoint has one (as Envoy's transport socket sits inside the CONNECT)."""

    DISABLE = "DISABLE"
    SIMPLE = "SIMPLE"
    MUTUAL = "MUTUAL"
    ISTIO_MUTUAL = "ISTIO_MUTUAL"


@dataclass(frozen=True, slots=True)
class ClientTls:
    mode: TlsMode = TlsMode.DISABLE
    sni: str = ""
    """Empty: the Service's hostname."""
    insecure_skip_verify: bool = False
    ca_certificates: str = ""
    """PEM trust anchors (resolved by the control plane from ``credentialName``'s Secret); empty with
    ``insecure_skip_verify`` False: the waypoint's system trust store."""
    subject_alt_names: tuple[str, ...] = ()
    """The server certificate must name one of these (DNS SANs); empty: ``sni`` (or the hostname) is checked."""
    client_certificate: str = ""
    """MUTUAL: the PEM chain to present (from ``credentialName``'s Secret ``tls.crt``)."""
    private_key: str = field(default="", repr=False)
    """MUTUAL: its PEM private key (the Secret's ``tls.key``); never shown in a repr or a log."""
    ca_certificates_path: str = ""
    """``caCertificates``: a file of PEM trust anchors on the waypoint (used when ``ca_certificates`` is empty)."""
    client_certificate_path: str = ""
    """``clientCertificate``: a PEM chain file on the waypoint (MUTUAL, when ``client_certificate`` is empty)."""
    private_key_path: str = ""
    """``privateKey``: its key file on the waypoint."""
    trust_unresolved: bool = False
    """``credentialName`` named trust anchors the control plane could not find: every connection is refused (fail
    closed), never verified against the system store instead."""


class ProxyProtocolVersion(enum.Enum):
    V1 = "V1"
    V2 = "V2"


@dataclass(frozen=True, slots=True)
class OutlierDetection:
    """``OutlierDetection``: an endpoint answering ``consecutive_5xx`` 5xx (or connect failures) in a row is left
    out for ``base_ejection_time`` seconds times the number of its ejections; at most ``max_ejection_percent`` of
    the endpoints are out at once. 0 ``consecutive_5xx``: off."""

    consecutive_5xx: int = 0
    interval: float = 10.0
    base_ejection_time: float = 30.0
    max_ejection_percent: int = 10


@dataclass(frozen=True, slots=True)
class PortTrafficPolicy:
    """``TrafficPolicy.portLevelSettings[]``: replaces the four settings for one port (unset ones go back to the
    defaults, they are not inherited)."""

    port: int
    load_balancer: LoadBalancer | None = None
    connection_pool: ConnectionPool | None = None
    outlier_detection: OutlierDetection | None = None
    tls: ClientTls | None = None


@dataclass(frozen=True, slots=True)
class TrafficPolicy:
    """``DestinationRule.trafficPolicy`` (or a subset's); None fields are unset (defaults, or inherited by a
    subset from the rule's top level)."""

    load_balancer: LoadBalancer | None = None
    connection_pool: ConnectionPool | None = None
    outlier_detection: OutlierDetection | None = None
    tls: ClientTls | None = None
    proxy_protocol: ProxyProtocolVersion | None = None
    port_level: tuple[PortTrafficPolicy, ...] = ()

    def for_port(self, port: int) -> tuple[TrafficPolicy, bool]:
        """This policy for one Service port, and whether a port-level setting applied (Istio's
        ``GetPortLevelTrafficPolicy``: the port's entry replaces the four settings wholesale; proxy protocol is
        not a port-level setting and is dropped then, as istiod drops it)."""
        for entry in self.port_level:
            if entry.port == port:
                return (
                    TrafficPolicy(entry.load_balancer, entry.connection_pool, entry.outlier_detection, entry.tls),
                    True,
                )
        return TrafficPolicy(
            self.load_balancer, self.connection_pool, self.outlier_detection, self.tls, self.proxy_protocol
        ), False


@dataclass(frozen=True, slots=True)
class Subset:
    name: str
    workloads: frozenset[str] = frozenset()
    """The uids of the Service's workloads whose labels the subset's ``labels`` select (resolved by the control
    plane)."""
    traffic_policy: TrafficPolicy | None = None


@dataclass(frozen=True, slots=True)
class DestinationPolicy:
    """The ``DestinationRule`` a waypoint applies to one Service (several rules for one host already merged)."""

    service_key: str
    """``namespace/hostname`` of the Service."""
    rule: str = ""
    """``namespace/name`` of the DestinationRule(s) it came from, for logs and config dumps (comma-separated)."""
    traffic_policy: TrafficPolicy | None = None
    subsets: tuple[Subset, ...] = ()

    def find_subset(self, name: str) -> Subset | None:
        return next((s for s in self.subsets if s.name == name), None)

    def policy_for(self, port: int, subset: str = "") -> TrafficPolicy:
        """The effective policy for one port of the Service, through ``subset`` when named (Istio's
        ``MergeSubsetTrafficPolicy``): the rule's policy for the port; the subset's fields that are set replace it
        field by field, and a subset's port-level entry for the port replaces the four port-level settings
        wholesale. A subset the rule does not define gets the rule's policy (the engine refuses it before)."""
        base, _ = (self.traffic_policy or TrafficPolicy()).for_port(port)
        found = self.find_subset(subset) if subset else None
        if found is None or found.traffic_policy is None:
            return base
        own, port_level = found.traffic_policy.for_port(port)
        if self.traffic_policy is None:
            return own
        if port_level:
            return TrafficPolicy(
                own.load_balancer, own.connection_pool, own.outlier_detection, own.tls, base.proxy_protocol
            )
        return TrafficPolicy(
            own.load_balancer or base.load_balancer,
            own.connection_pool or base.connection_pool,
            own.outlier_detection or base.outlier_detection,
            own.tls or base.tls,
            own.proxy_protocol or base.proxy_protocol,
        )
