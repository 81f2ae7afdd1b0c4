"""What a waypoint process is told at start-up, parsed once into frozen values (``ambit waypoint proxy``).

:class:`WaypointSettings` says who the waypoint is (its Gateway's name and namespace, service account, pod IP),
where its configuration comes from (the control plane's xDS and CA, or a local file and a local CA for tests and
labs), where it listens, and :class:`WaypointLimits`: the bounds that keep a hostile peer's cost bounded.

:func:`accepts_http10` reads the two switches Istio has for HTTP/1.0 from the process's environment: the control
plane's ``PILOT_HTTP10`` (istiod's; Ambit's control plane hands it to the pods it deploys) and the proxy's own
metadata ``ISTIO_META_HTTP10``. Either turns on Envoy's ``accept_http_10``, as istiod's listener code reads
``features.HTTP10 || enableHTTP10(node.Metadata.HTTP10)``: ``PILOT_HTTP10`` is a boolean as Go's
``strconv.ParseBool`` reads it (anything else is an error naming it), the metadata counts only when it is exactly
``"1"``.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, field
from pathlib import Path

from ambit.hbone import liveness
from ambit.model.identity import DEFAULT_TRUST_DOMAIN, SpiffeId
from ambit.tls.socket_transport import TlsTransportKind
from ambit.waypoint.errors import WaypointSettingsError


@dataclass(frozen=True, slots=True)
class WaypointLimits:
    max_head_bytes: int = 64 * 1024
    """Largest request (or response) line plus headers; a larger request head is answered 431 and closed."""
    head_timeout: float = 10.0
    """Seconds a client has to send a complete request head once it started one (slowloris), else 408."""
    idle_timeout: float = 300.0
    """Seconds a keep-alive connection (or a relayed TCP connection) may sit with nothing to do."""
    sniff_timeout: float = 5.0
    """Seconds to wait for a client's first bytes on a port of unknown protocol before treating it as TCP."""
    max_connections: int = 4096
    """HBONE connections served at once, in their handshake or established; more are reset at accept
    (:mod:`ambit.proxy.admission`)."""
    max_pending_handshakes: int = 256
    """HBONE connections in their TLS handshake at once; more evict the oldest. An ingress gateway has the same
    bound per listener port and over its ports, for connections not yet past their handshake, ClientHello or first
    request head (:mod:`ambit.waypoint.ingress_admission`)."""
    max_pending_handshakes_per_peer: int = 16
    """Of those, from one peer address (per listener); more are reset at accept."""
    handshake_timeout: float = 10.0
    """Seconds from accept to a judged HBONE client (certificate and the whole TLS handshake)."""
    hbone_preface_timeout: float = liveness.DEFAULT_PREFACE_TIMEOUT
    """Seconds from an HBONE client's TLS handshake to its HTTP/2 preface and first SETTINGS, else it is closed
    (:mod:`ambit.hbone.liveness`, as the three below)."""
    hbone_idle_timeout: float = liveness.DEFAULT_IDLE_TIMEOUT
    """Seconds an HBONE connection may have no tunnel open before a graceful GOAWAY; 0: never."""
    hbone_keepalive_interval: float = liveness.DEFAULT_KEEPALIVE_INTERVAL
    """Seconds of silence from an HBONE peer before a PING; 0: no keepalive."""
    hbone_keepalive_timeout: float = liveness.DEFAULT_KEEPALIVE_TIMEOUT
    """Seconds for that PING's ACK before the connection is dropped."""
    max_tunnels_per_connection: int = 100
    """CONNECT streams in flight on one HBONE connection (the HTTP/2 engine refuses the rest)."""
    max_tunnels: int = 16384
    """CONNECT streams served at once over all connections; more are answered 503."""
    startup_wait: float = 10.0
    """How long a tunnel that arrived before the certificate and the first xDS sync waits for them."""
    binding_wait: float = 2.0
    """How long a tunnel for a destination not bound to this waypoint waits for a state update that binds it."""
    max_binding_waits: int = 64
    """Tunnels waiting for a binding at once; others are refused at once."""
    drain_time: float = 5.0
    """Seconds a stopping waypoint keeps serving, not ready (Istio's default termination drain duration); within
    the pod's termination grace period (30 s for the waypoints the control plane deploys)."""
    connect_timeout: float = 10.0
    """Seconds to open an upstream tunnel (TCP, TLS, CONNECT)."""
    upstream_idle_per_endpoint: int = 16
    """Idle upstream HTTP/1.1 connections kept per endpoint for reuse."""
    max_streams_per_connection: int = 100
    """HTTP/2 requests in flight on one downstream HTTP/2 connection (SETTINGS_MAX_CONCURRENT_STREAMS)."""
    max_requests_per_connection: int = 0
    """Requests served on one downstream connection before it is closed (0: no limit)."""
    request_headers_timeout: float = 10.0
    """Seconds an ingress gateway's HTTP connection has from accept (HTTPS: from the end of its TLS handshake) to
    its first complete request head, else it is closed. Envoy's ``request_headers_timeout`` is off by default and
    counts from a head's first byte (Istio's edge profile: 60 s); ours bounds the silent connection too, as the
    HBONE preface deadline does, and later heads have ``head_timeout`` once begun and ``idle_timeout`` before."""
    max_connections_per_peer: int = 256
    """Connections from one client address at once, on the HBONE listener and on an ingress gateway's listeners;
    more are accepted and closed, so that one client's idle or slow connections cannot take every one of
    ``max_connections``."""

    def hbone_liveness(self) -> liveness.LivenessSettings:
        """The HBONE listener's deadlines after the handshake (raises ``LivenessSettingsError`` if they cannot
        work)."""
        return liveness.LivenessSettings(
            self.hbone_preface_timeout,
            self.hbone_idle_timeout,
            self.hbone_keepalive_interval,
            self.hbone_keepalive_timeout,
        )


@dataclass(frozen=True, slots=True)
class WaypointSettings:
    namespace: str
    """The waypoint's namespace (``POD_NAMESPACE``)."""
    gateway_name: str
    """Its Gateway's name (``GATEWAY_NAME``): its Service is ``<gateway_name>.<namespace>.svc.<domain>``."""
    service_account: str
    """``SERVICE_ACCOUNT``: the identity is ``spiffe://<trust domain>/ns/<namespace>/sa/<service_account>``."""
    pod_name: str = ""
    instance_ip: str | None = None
    instance_ips: tuple[str, ...] = ()
    """``INSTANCE_IPS`` (the downward API's ``status.podIPs``, comma-separated): every address of the pod."""
    """``INSTANCE_IP``: where HBONE is served and the waypoint's own address; None serves on 0.0.0.0."""
    node_name: str = ""
    trust_domain: str = DEFAULT_TRUST_DOMAIN
    cluster_id: str = "Kubernetes"
    domain: str = "cluster.local"
    network: str = ""
    xds_address: str | None = None
    ca_address: str | None = None
    root_cert_file: Path | None = None
    token_file: Path | None = None
    xds_server_name: str = "istiod.istio-system.svc"
    secret_ttl: int = 24 * 3600
    """Seconds of validity asked of the control plane's CA for the waypoint's certificate (``SECRET_TTL``, as
    istio-agent reads it in a waypoint pod); refreshed at half life, so a rotated CA reaches it within half."""
    config_file: Path | None = None
    """Workloads and services from this local YAML file instead of xDS (read once at start)."""
    local_ca_dir: Path | None = None
    """Certificates from the local CA in this directory instead of the control plane's CA."""
    hbone_port: int = 15008
    admin_port: int = 15000
    stats_port: int = 15020
    readiness_port: int = 15021
    upstream_hbone_port: int = 15008
    """The port endpoints take HBONE on (15008; tests put their node proxies elsewhere)."""
    log_json: bool = False
    dns_nameservers: tuple[str, ...] = ()
    """Where hostname endpoints are resolved; empty: the nameservers of ``resolv_conf`` (read once at start)."""
    dns_port: int = 53
    """The port the nameservers answer on (tests run theirs elsewhere)."""
    resolv_conf: Path = Path("/etc/resolv.conf")
    tls_transport: TlsTransportKind = "socket"
    """HBONE's TLS transport, both legs (the listener's connections and the upstream pool's): the event loop's
    (``loop``, memory BIOs) or TLS on the socket itself (``socket``, with the native TLS records when
    :mod:`ambit.native` loads them); :func:`ambit.cli.l7_proxy.l7_settings` picks it from the flag."""
    accept_http10: bool = False
    """Serve HTTP/1.0 requests (Envoy's ``accept_http_10``; :func:`accepts_http10`); off, they are answered 426
    ``Upgrade Required``, as Envoy answers them with istiod's default configuration."""
    limits: WaypointLimits = field(default_factory=WaypointLimits)

    @property
    def identity(self) -> SpiffeId:
        return SpiffeId(self.trust_domain, self.namespace, self.service_account or "default")

    @property
    def listen_host(self) -> str:
        return self.instance_ip or "0.0.0.0"

    @property
    def more_listen_hosts(self) -> tuple[str, ...]:
        """The pod's other addresses (``instance_ips`` but ``instance_ip``: a dual-stack pod's IPv6), where HBONE is
        served too, as Istio binds its waypoint's HBONE listener dual stack: a node proxy reaches a waypoint in the
        family of the address its client dialled."""
        if not self.instance_ip:
            return ()
        return tuple(ip for ip in self.instance_ips if ip != self.instance_ip)


_GO_TRUE = frozenset(("1", "t", "T", "TRUE", "true", "True"))
_GO_FALSE = frozenset(("0", "f", "F", "FALSE", "false", "False"))
"""What Go's ``strconv.ParseBool`` takes (case matters: ``tRuE`` is an error there too)."""


def accepts_http10(environ: Mapping[str, str]) -> bool:
    """Whether HTTP/1.0 is served, from ``PILOT_HTTP10`` and ``ISTIO_META_HTTP10`` (module docstring); a
    ``PILOT_HTTP10`` that is no boolean raises :class:`WaypointSettingsError` naming it."""
    pilot = environ.get("PILOT_HTTP10", "")
    if pilot and pilot not in _GO_TRUE and pilot not in _GO_FALSE:
        raise WaypointSettingsError(f"PILOT_HTTP10: expected true or false, got {pilot[:64]!r}")
    return pilot in _GO_TRUE or environ.get("ISTIO_META_HTTP10") == "1"
