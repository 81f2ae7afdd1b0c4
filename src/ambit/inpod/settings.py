"""Settings of the node proxy (``ambit nodeproxy``), parsed once at start-up and passed down.

The listeners' bounds (:func:`parse_connection_bounds`) come from the environment only, with defaults safe for a
node; they are read once at start.

The outbound connection pool's two limits are ztunnel's: a command-line flag wins, then the environment variable
ztunnel reads (``POOL_MAX_STREAMS_PER_CONNECTION``, ``POOL_UNUSED_RELEASE_TIMEOUT``), then ztunnel's default.
:func:`parse_pool_limits` does that, and says in one line which value was wrong and why.
"""

from __future__ import annotations

import ipaddress
import math
import re
from collections.abc import Mapping
from dataclasses import dataclass, field
from pathlib import Path

from ambit.errors import AmbitError
from ambit.hbone.liveness import LivenessSettings, LivenessSettingsError
from ambit.hbone.settings import MAX_CONCURRENT_STREAMS
from ambit.model.identity import DEFAULT_TRUST_DOMAIN
from ambit.proxy.admission import (
    DEFAULT_NODE_CONNECTIONS_PER_PEER,
    AdmissionSettingsError,
    ListenerLimits,
    NodeBudget,
)
from ambit.proxy.settings import ProxySettings
from ambit.telemetry.flows import DEFAULT_CAPACITY
from ambit.tls.socket_transport import TlsTransportKind
from ambit.zds.protocol import WorkloadInfo

POOL_MAX_STREAMS_ENV = "POOL_MAX_STREAMS_PER_CONNECTION"
POOL_IDLE_TIMEOUT_ENV = "POOL_UNUSED_RELEASE_TIMEOUT"
DEFAULT_POOL_MAX_STREAMS = MAX_CONCURRENT_STREAMS
DEFAULT_POOL_IDLE_TIMEOUT = 300.0

DEADLINE_ENV = "CONNECTION_TERMINATION_DEADLINE"
GRACE_PERIOD_ENV = "TERMINATION_GRACE_PERIOD_SECONDS"
DEFAULT_DRAIN_DEADLINE = 5.0
"""ztunnel's ``DEFAULT_CONNECTION_TERMINATION_DEADLINE``."""
DRAIN_MAX_ENV = "DRAIN_MAX"
DEFAULT_DRAIN_MAX = 3600.0
"""How long a node proxy that handed over to a successor keeps its established connections (issue 21)."""

IPV6_ENABLED_ENV = "IPV6_ENABLED"
"""ztunnel's switch for its IPv6 listeners (on unless ``false``)."""

SECRET_TTL_ENV = "SECRET_TTL"
DEFAULT_SECRET_TTL = 24 * 3600
"""ztunnel's ``DEFAULT_TTL``: the workload certificate lifetime asked of the CA."""

HBONE_MAX_CONNECTIONS_ENV = "HBONE_MAX_CONNECTIONS"
HBONE_MAX_PENDING_ENV = "HBONE_MAX_PENDING_HANDSHAKES"
HBONE_MAX_PENDING_PER_PEER_ENV = "HBONE_MAX_PENDING_HANDSHAKES_PER_PEER"
HBONE_HANDSHAKE_TIMEOUT_ENV = "HBONE_HANDSHAKE_TIMEOUT"
HBONE_PREFACE_TIMEOUT_ENV = "HBONE_PREFACE_TIMEOUT"
HBONE_IDLE_TIMEOUT_ENV = "HBONE_IDLE_TIMEOUT"
HBONE_KEEPALIVE_INTERVAL_ENV = "HBONE_KEEPALIVE_INTERVAL"
HBONE_KEEPALIVE_TIMEOUT_ENV = "HBONE_KEEPALIVE_TIMEOUT"
PLAINTEXT_MAX_CONNECTIONS_ENV = "PLAINTEXT_MAX_CONNECTIONS"
NODE_MAX_CONNECTIONS_ENV = "NODE_MAX_CONNECTIONS"
NODE_MAX_PENDING_ENV = "NODE_MAX_PENDING_HANDSHAKES"
NODE_MAX_CONNECTIONS_PER_PEER_ENV = "NODE_MAX_CONNECTIONS_PER_PEER"
DEFAULT_NODE_MAX_CONNECTIONS = 65536
DEFAULT_NODE_MAX_PENDING = 256
"""TLS handshakes in progress over the whole node proxy: 64 MiB of TLS read buffers allocated at most."""

_DURATION = re.compile(r"\s*(\d+(?:\.\d*)?|\.\d+)\s*(ms|s|m|h)?\s*")
_UNIT_SECONDS = {"ms": 0.001, "s": 1.0, "m": 60.0, "h": 3600.0, None: 1.0}


class NodeProxySettingsError(AmbitError):
    """A node-proxy setting (flag or environment variable) out of range or unreadable."""


def parse_pool_limits(
    max_streams: str | None, idle_timeout: str | None, environ: Mapping[str, str]
) -> tuple[int, float]:
    """``(max streams per connection, idle timeout in seconds)`` from the flags, else ``environ``, else defaults.

    The timeout is seconds (``300``, ``0.5``), or a number with a unit as ztunnel's environment takes it (``5m``,
    ``300s``, ``500ms``, ``1h``). ``0`` closes a pooled connection as soon as its last stream ends.
    """
    streams_text, streams_from = _pick(max_streams, "--pool-max-streams", environ, POOL_MAX_STREAMS_ENV)
    timeout_text, timeout_from = _pick(idle_timeout, "--pool-idle-timeout", environ, POOL_IDLE_TIMEOUT_ENV)
    streams = DEFAULT_POOL_MAX_STREAMS
    if streams_text is not None:
        try:
            streams = int(streams_text.strip())
        except ValueError:
            raise NodeProxySettingsError(f"{streams_from}: expected a whole number, got {streams_text!r}") from None
        if streams < 1:
            raise NodeProxySettingsError(f"{streams_from}: expected at least 1 stream per connection, got {streams}")
    timeout = DEFAULT_POOL_IDLE_TIMEOUT
    if timeout_text is not None:
        timeout = _duration(timeout_text, timeout_from)
    return streams, timeout


def parse_drain_deadline(flag: str | None, environ: Mapping[str, str]) -> float:
    """Seconds a draining proxy lets its connections run before closing them (ztunnel's
    ``self_termination_deadline``): ``--drain-deadline``, else ``$CONNECTION_TERMINATION_DEADLINE`` (seconds or a
    duration), else from ``$TERMINATION_GRACE_PERIOD_SECONDS`` (its pod's grace period less 5 s when above 10 s,
    else less 1 s, at least 1 s: the rest is left for closing before the kubelet's SIGKILL), else 5 s."""
    text, source = _pick(flag, "--drain-deadline", environ, DEADLINE_ENV)
    if text is not None:
        return _duration(text, source)
    within = _within_grace_period(environ)
    return DEFAULT_DRAIN_DEADLINE if within is None else within


def parse_drain_max(flag: str | None, environ: Mapping[str, str], deadline: float) -> float:
    """Seconds a proxy that handed over to a successor lets its established connections run (Ambit's own setting,
    :mod:`ambit.inpod.drain`): ``--drain-max``, else ``$DRAIN_MAX`` (seconds or a duration), else one hour; never
    past what ``$TERMINATION_GRACE_PERIOD_SECONDS`` leaves before the kubelet's SIGKILL (the same margin as
    :func:`parse_drain_deadline`'s), and never below ``deadline``, the bound without a successor. So a DaemonSet
    that sets only the grace period, as ztunnel's chart does, drains the same either way, as before."""
    text, source = _pick(flag, "--drain-max", environ, DRAIN_MAX_ENV)
    seconds = DEFAULT_DRAIN_MAX if text is None else _duration(text, source)
    within = _within_grace_period(environ)
    if within is not None:
        seconds = min(seconds, within)
    return max(seconds, deadline)


MAX_WORKERS = 32
"""More worker processes than this is a mistake (each holds the whole workload state and its certificates)."""


def parse_workers(flag: str | None, environ: Mapping[str, str]) -> int:
    """How many processes serve the node's pods: ``--workers``, else ztunnel's ``ZTUNNEL_WORKER_THREADS`` (its worker
    threads are our processes), else 1; an integer from 1 to :data:`MAX_WORKERS`."""
    text, source = _pick(flag, "--workers", environ, "ZTUNNEL_WORKER_THREADS")
    if text is None:
        return 1
    if not text.isascii() or not text.isdigit() or len(text) > 3:  # int() would take "1_0", " 2", "+2"
        raise NodeProxySettingsError(f"{source} must be a whole number of processes, not {text!r}")
    value = int(text)
    if not 1 <= value <= MAX_WORKERS:
        raise NodeProxySettingsError(f"{source} must be from 1 to {MAX_WORKERS}, not {value}")
    return value


def _within_grace_period(environ: Mapping[str, str]) -> float | None:
    """The pod's grace period less 5 s when above 10 s, else less 1 s, at least 1 s; None without one."""
    grace = environ.get(GRACE_PERIOD_ENV)
    if grace is None:
        return None
    stripped = grace.strip()
    if not (stripped.isascii() and stripped.isdigit()) or len(stripped) > 12:
        raise NodeProxySettingsError(f"${GRACE_PERIOD_ENV}: expected whole seconds, got {grace!r}")
    seconds = int(stripped)
    return float(max(seconds - 5 if seconds > 10 else seconds - 1, 1))


def parse_secret_ttl(flag: str | None, environ: Mapping[str, str]) -> int:
    """Whole seconds of validity the proxy asks the CA for (``validity_duration``): ``--secret-ttl``, else
    ``$SECRET_TTL`` (seconds or a duration, as ztunnel reads it: ``5m``, ``24h``), else 24 h.

    Certificates are refreshed at half life, so this also bounds how long a proxy keeps signing material from a
    CA that has since been replaced: a rotated plug-in CA reaches every proxy within half of it.
    """
    text, source = _pick(flag, "--secret-ttl", environ, SECRET_TTL_ENV)
    if text is None:
        return DEFAULT_SECRET_TTL
    seconds = int(_duration(text, source))
    if seconds < 1:
        raise NodeProxySettingsError(f"{source}: a certificate must live at least 1 second, got {text!r}")
    return seconds


def parse_ipv6_enabled(environ: Mapping[str, str]) -> bool:
    """Whether pods get IPv6 listeners too (``[::]`` and ``[::1]``, :mod:`ambit.inpod.listeners`): ztunnel's
    ``$IPV6_ENABLED``, ``true`` or ``false`` (any case, spaces ignored), on when unset."""
    text = environ.get(IPV6_ENABLED_ENV)
    if text is None:
        return True
    value = text.strip().lower()
    if value not in ("true", "false"):
        raise NodeProxySettingsError(f"${IPV6_ENABLED_ENV}: expected true or false, got {text[:40]!r}")
    return value == "true"


@dataclass(frozen=True, slots=True)
class ConnectionBounds:
    """The bounds of the node proxy's listeners (:mod:`ambit.proxy.admission`)."""

    hbone: ListenerLimits = field(default_factory=ListenerLimits)
    """Each pod's 15008 and the self-proxy listener's."""
    plaintext: ListenerLimits = field(default_factory=ListenerLimits)
    """Each pod's 15001 and 15006 (connections only: no handshake there)."""
    node_max_connections: int = DEFAULT_NODE_MAX_CONNECTIONS
    """Connections over every listener of the process."""
    node_max_pending: int = DEFAULT_NODE_MAX_PENDING
    """TLS handshakes in progress over every HBONE listener of the process."""
    node_max_connections_per_peer: int = DEFAULT_NODE_CONNECTIONS_PER_PEER
    """Connections one peer address may hold over every listener of the process."""


def parse_connection_bounds(environ: Mapping[str, str], open_files: int | None = None) -> ConnectionBounds:
    """The listeners' bounds from the environment (``HBONE_MAX_CONNECTIONS``, ``HBONE_MAX_PENDING_HANDSHAKES``,
    ``HBONE_MAX_PENDING_HANDSHAKES_PER_PEER``, ``HBONE_HANDSHAKE_TIMEOUT``, the established HBONE connections'
    deadlines (``HBONE_PREFACE_TIMEOUT``, ``HBONE_IDLE_TIMEOUT``, ``HBONE_KEEPALIVE_INTERVAL``,
    ``HBONE_KEEPALIVE_TIMEOUT``; :mod:`ambit.hbone.liveness`; 0 turns the last three off),
    ``PLAINTEXT_MAX_CONNECTIONS``,
    ``NODE_MAX_CONNECTIONS``, ``NODE_MAX_PENDING_HANDSHAKES``, ``NODE_MAX_CONNECTIONS_PER_PEER``), else the
    defaults.

    ``open_files`` is the process's descriptor limit (``RLIMIT_NOFILE``), if finite: the node's default connection
    budget is half of it (a relayed connection holds two descriptors), so that the budget refuses a flood before
    ``accept`` runs out of descriptors for everyone; an explicit value is taken as given.
    """
    defaults = ListenerLimits()
    node_default = DEFAULT_NODE_MAX_CONNECTIONS
    if open_files is not None:
        node_default = max(min(node_default, open_files // 2), 16)
    node_connections = _count(environ, NODE_MAX_CONNECTIONS_ENV, node_default)
    node_pending = _count(environ, NODE_MAX_PENDING_ENV, min(DEFAULT_NODE_MAX_PENDING, max(node_connections // 2, 1)))
    node_per_peer = _count(
        environ, NODE_MAX_CONNECTIONS_PER_PEER_ENV, min(DEFAULT_NODE_CONNECTIONS_PER_PEER, node_connections)
    )
    hbone_connections = _count(environ, HBONE_MAX_CONNECTIONS_ENV, defaults.max_connections)
    pending = _count(environ, HBONE_MAX_PENDING_ENV, min(defaults.max_pending, hbone_connections))
    per_peer = _count(environ, HBONE_MAX_PENDING_PER_PEER_ENV, min(defaults.max_pending_per_peer, pending))
    timeout = defaults.handshake_timeout
    if HBONE_HANDSHAKE_TIMEOUT_ENV in environ:
        timeout = _duration(environ[HBONE_HANDSHAKE_TIMEOUT_ENV], f"${HBONE_HANDSHAKE_TIMEOUT_ENV}")
        if timeout <= 0:
            raise NodeProxySettingsError(f"${HBONE_HANDSHAKE_TIMEOUT_ENV}: expected more than 0 seconds")
    plaintext_connections = _count(environ, PLAINTEXT_MAX_CONNECTIONS_ENV, defaults.max_connections)
    live = defaults.liveness
    try:
        liveness = LivenessSettings(
            _seconds(environ, HBONE_PREFACE_TIMEOUT_ENV, live.preface_timeout),
            _seconds(environ, HBONE_IDLE_TIMEOUT_ENV, live.idle_timeout),
            _seconds(environ, HBONE_KEEPALIVE_INTERVAL_ENV, live.keepalive_interval),
            _seconds(environ, HBONE_KEEPALIVE_TIMEOUT_ENV, live.keepalive_timeout),
        )
    except LivenessSettingsError as exc:
        raise NodeProxySettingsError(f"HBONE connection deadlines: {exc}") from None
    try:
        hbone = ListenerLimits(hbone_connections, pending, per_peer, timeout, liveness)
        plaintext = ListenerLimits(plaintext_connections, min(defaults.max_pending, plaintext_connections), 1)
        NodeBudget(node_connections, node_pending, max_connections_per_peer=node_per_peer)
    except AdmissionSettingsError as exc:
        raise NodeProxySettingsError(f"connection bounds: {exc}") from None
    return ConnectionBounds(hbone, plaintext, node_connections, node_pending, node_per_peer)


def _seconds(environ: Mapping[str, str], name: str, default: float) -> float:
    text = environ.get(name)
    return default if text is None else _duration(text, f"${name}")


def _count(environ: Mapping[str, str], name: str, default: int) -> int:
    text = environ.get(name)
    if text is None:
        return default
    stripped = text.strip()
    if not (stripped.isascii() and stripped.isdigit()) or len(stripped) > 9 or int(stripped) < 1:
        raise NodeProxySettingsError(f"${name}: expected a whole number from 1 to 999999999, got {text!r}")
    return int(stripped)


def _duration(text: str, source: str) -> float:
    match = _DURATION.fullmatch(text)
    if match is None and text.strip().startswith("-"):
        raise NodeProxySettingsError(f"{source}: expected 0 seconds or more, got {text!r}")
    if match is None:
        raise NodeProxySettingsError(
            f"{source}: expected seconds (e.g. 300, 0.5) or a duration (e.g. 5m, 500ms), got {text!r}"
        )
    value = float(match.group(1)) * _UNIT_SECONDS[match.group(2)]
    if not math.isfinite(value):
        raise NodeProxySettingsError(f"{source}: {text!r} is too large")
    return value


def _pick(flag: str | None, flag_name: str, environ: Mapping[str, str], env_name: str) -> tuple[str | None, str]:
    if flag is not None:
        return flag, flag_name
    if env_name in environ:
        return environ[env_name], f"${env_name}"
    return None, ""


@dataclass(frozen=True, slots=True)
class NodeProxySettings:
    node: str
    """The node this proxy serves (workloads with this ``node`` are local)."""
    zds_socket: Path
    """The node agent's ZDS socket (spec §3)."""
    config_file: Path | None = None
    """Workloads and services from a local YAML file (ztunnel's local mode), reloaded when it changes."""
    local_ca_dir: Path | None = None
    """Sign workload certificates with a root kept in this directory (until the control plane's CA exists)."""
    xds_address: str | None = None
    """The control plane's ``HOST:PORT`` for the workload API (delta xDS); replaces ``config_file``."""
    ca_address: str | None = None
    """The control plane's ``HOST:PORT`` for workload certificates; replaces ``local_ca_dir``."""
    root_cert_file: Path | None = None
    """The mesh root (PEM) that the control plane's serving certificate must chain to."""
    token_file: Path | None = None
    """The proxy's service-account token (audience ``istio-ca``), re-read on every use."""
    xds_server_name: str = "istiod.istio-system.svc"
    """The name the control plane's certificate is verified against."""
    cluster_id: str = "Kubernetes"
    trust_domain: str = DEFAULT_TRUST_DOMAIN
    """The mesh's trust domain: peers from another one are refused."""
    network: str = ""
    """The network this node is on (addresses are looked up as ``network/IP``)."""
    admin_port: int = 15000
    """Admin (``/config_dump``, ``/quitquitquit``) on 127.0.0.1 of the proxy's own netns."""
    admin_token_file: Path | None = None
    """Where the admin token that ``POST /quitquitquit`` and ``POST /logging`` need is written at start-up (0600);
    by default ``admin-token`` next to the ZDS socket, in the proxy's run directory."""
    stats_port: int = 15020
    """Prometheus metrics (``/metrics``, ``/stats/prometheus``)."""
    readiness_port: int = 15021
    """``/healthz/ready``."""
    log_json: bool = False
    """Access log lines as JSON instead of ``key=value``."""
    flow_log_size: int = DEFAULT_CAPACITY
    """Ended connections kept for ``GET /flows`` on the admin port (``ambit flows``); 0: no flow log."""
    pool_max_streams: int = DEFAULT_POOL_MAX_STREAMS
    """Concurrent tunnels on one pooled outbound HBONE connection before the pool dials another."""
    pool_idle_timeout: float = DEFAULT_POOL_IDLE_TIMEOUT
    """Seconds a pooled connection without streams is kept; 0 closes it when its last stream ends."""
    ipv6: bool = True
    """Give each pod IPv6 listeners beside the IPv4 ones where its netns has IPv6 (``[::]`` for 15001, 15006 and
    15008, ``[::1]`` for 15053; :func:`parse_ipv6_enabled`); off: IPv4 only."""
    dns_proxy: bool = True
    """Serve DNS on 15053 in each pod (ztunnel's ``DNS_CAPTURE`` proxy metadata; the node agent's DNS capture
    decides whether the pod's queries reach it)."""
    xds_on_demand: bool = False
    """Subscribe to no Address at start and ask the control plane for each one a connection needs (ztunnel's
    ``XDS_ON_DEMAND``): memory grows with what this node's pods talk to, not with the mesh. Exclusive with
    :attr:`dns_proxy`, as in ztunnel (the DNS proxy answers from every workload and service)."""
    dns_nameservers: tuple[str, ...] = ()
    """Forward every pod's unanswered queries to these; empty: to each pod's own resolv.conf nameservers, else to
    those of ``resolv_conf``."""
    resolv_conf: Path = Path("/etc/resolv.conf")
    """The proxy's own resolv.conf: the forwarding fallback."""
    cluster_domain: str = "cluster.local"
    crl_path: Path | None = None
    """The CRL bundle (PEM) peers' chains are checked against, watched for changes (ztunnel's ``CRL_PATH``; the
    ``istio-ca-crl`` ConfigMap mounted); None: no CRL checks."""
    crl_poll_interval: float = 2.0
    """Seconds between looks at ``crl_path``."""
    secret_ttl: int = DEFAULT_SECRET_TTL
    """Seconds of validity asked of the control plane's CA for each workload certificate (ztunnel's
    ``SECRET_TTL``, :func:`parse_secret_ttl`); refreshed at half life."""
    drain_deadline: float = DEFAULT_DRAIN_DEADLINE
    """Seconds a draining proxy (SIGTERM, ``/quitquitquit``) with no successor lets its connections run before
    closing them (:func:`parse_drain_deadline`, :mod:`ambit.inpod.drain`)."""
    drain_max: float = DEFAULT_DRAIN_DEADLINE
    """Seconds a draining proxy whose pods a successor took over (the node agent said so) lets its connections
    run (:func:`parse_drain_max`); at least ``drain_deadline``."""
    notify_fd: int | None = None
    """Write ``READY=1`` and a newline to this inherited file descriptor (then close it) once the proxy is ready
    (its configuration read, every pod the node agent handed over served): how a supervisor starting a successor
    knows when it may stop the old proxy."""
    own_pod: WorkloadInfo | None = None
    """The proxy's own pod (in a cluster: ``POD_NAME``, ``POD_NAMESPACE``, ``SERVICE_ACCOUNT``), for its self-proxy
    listener (:mod:`ambit.inpod.self_inbound`); None: no such listener."""
    own_address: str | None = None
    """The proxy's own pod address (``INSTANCE_IP``), where the self-proxy listener listens."""
    connection_bounds: ConnectionBounds = field(default_factory=ConnectionBounds)
    """Connections and TLS handshakes in progress each listener (and the whole process) takes at once
    (:func:`parse_connection_bounds`); more are reset at accept."""
    event_loop: str = "uvloop"
    """The event loop the proxy runs on: ``uvloop`` or ``asyncio`` (see :mod:`ambit.inpod.eventloop`). uvloop is
    the default since the connection-churn soak test (``tests/integration/test_uvloop_churn.py``) passes under it."""

    tls_transport: TlsTransportKind = "socket"
    """HBONE's TLS transport, both ways: the event loop's (memory BIOs) or TLS on the socket itself
    (:mod:`ambit.tls.socket_transport`)."""
    workers: int = 1
    """Processes serving the node's pods (:mod:`ambit.inpod.workers`): this one and ``workers - 1`` more, each a
    whole data path on a core of its own (:func:`parse_workers`)."""
    worker: bool = False
    """This process is one of a node proxy's workers: its pods come from the node proxy, not the node agent; it
    opens no admin, stats or readiness endpoint and no self-proxy listener, and reports its metrics upward."""

    @property
    def proxy(self) -> ProxySettings:
        """What the data path needs of these settings."""
        return ProxySettings(
            node=self.node, network=self.network, trust_domain=self.trust_domain, tls_transport=self.tls_transport
        )


def own_pod_from_environment(environ: Mapping[str, str]) -> tuple[WorkloadInfo | None, str | None]:
    """The proxy's own pod and address from the downward API's variables, as ztunnel reads them (``POD_NAME``,
    ``POD_NAMESPACE``, ``SERVICE_ACCOUNT``, ``INSTANCE_IP``); (None, None) unless all four are there and the address
    is an IP."""
    name, namespace = environ.get("POD_NAME", ""), environ.get("POD_NAMESPACE", "")
    account, address = environ.get("SERVICE_ACCOUNT", ""), environ.get("INSTANCE_IP", "")
    if not (name and namespace and account and address):
        return None, None
    try:
        ip = ipaddress.ip_address(address)
    except ValueError:
        return None, None
    return WorkloadInfo(name, namespace, account), str(ip)
