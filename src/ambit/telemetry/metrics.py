"""Istio's standard TCP metrics and ztunnel's DNS metrics for the node proxy, in a private Prometheus registry.

Theory of operation
-------------------
The proxy calls :meth:`ProxyMetrics.connection_opened` once per connection with its :class:`TrafficLabels` and
gets a :class:`ConnectionMetrics` handle. A copy loop then calls ``add_received(n)`` (client→server bytes) and
``add_sent(n)`` (server→client bytes) per chunk, or, if it keeps running totals of its own (the node proxy's relay
does), hands them over once with ``count_from(totals)`` and is read from then on, with no call per chunk; and it
calls ``close()`` once. Source-reported labels come from the
outbound side, destination-reported from inbound; for both reporters "received" is the request direction and
"sent" the response direction, so a client that sends 11 bytes and reads 22 shows received=11, sent=22.

The hot path never takes a lock: a handle keeps two plain running totals, and only the handle's own connection
writes them. Flushing is the reverse: only :class:`ProxyMetrics` (under its lock) moves the not-yet-flushed part
(running total, ``totals`` included, minus what was already flushed) into the family totals, on ``close()`` and at every
:meth:`ProxyMetrics.render`. Each field has a single writer, so a scrape mid-connection shows the exact bytes moved
so far, and the closed connection's final flush adds exactly the remainder.

Exposition is a custom collector that yields metric families from our own dicts (no prometheus_client metric
objects): the exposed names are exactly Istio's (``istio_tcp_received_bytes_total``, no ``_total_total``) and there
are no ``_created`` series. Families are exposed (HELP and TYPE) even before their first sample, so a scrape
always lists every name. Unstable metrics say "(unstable)" in their HELP text, as ztunnel's do.

The DNS proxy counts each request (``istio_dns_requests_total``), each forwarded one and its failures and time
(``istio_dns_upstream_requests_total``, ``..._failures_total``, ``istio_dns_upstream_request_duration_seconds``),
labelled as ztunnel labels them (:class:`DnsLabels`), and what it dropped unanswered
(``ambit_dns_dropped_total{reason}``, ours: ztunnel has none).

Revocation (:mod:`ambit.proxy.revocation`) counts, by ``reporter`` (``destination`` for an inbound peer, ``source``
for an outbound one), the connections refused or closed because the peer's chain is revoked
(``istio_crl_policy_rejections_total``) and those admitted without a chain to re-check later
(``istio_crl_untracked_connections_total``).

A node proxy with worker processes (:mod:`ambit.inpod.workers`) adds their counts to its own: each worker sends
:meth:`ProxyMetrics.snapshot`, the node proxy keeps the latest per worker (:meth:`ProxyMetrics.peer_report`, judged
by :mod:`ambit.telemetry.peer_counts`) and a retired total of workers that ended (:meth:`ProxyMetrics.peer_gone`),
and every family, histogram and counter it renders is its own plus theirs; the proxy-count gauges and the
started/stopped counters (one per pod, which every worker serves too) and ``istio_build`` stay its own.

Invariants: every family total only grows, except the two proxy-count gauges; a label value that is empty renders
as ``unknown``; there is no global registry, so any number of :class:`ProxyMetrics` coexist (one per test).
"""

from __future__ import annotations

import dataclasses
import enum
import threading
from collections.abc import Iterable, Iterator
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any, Protocol

from ambit.telemetry.peer_counts import NO_COUNTS, PeerCounts, parse_peer_counts

if TYPE_CHECKING:  # prometheus_client is imported by the first scrape (see render)
    from prometheus_client import CollectorRegistry
    from prometheus_client.metrics_core import CounterMetricFamily, Metric

CONTENT_TYPE = "text/plain; version=0.0.4; charset=utf-8"
"""The exposition's media type (prometheus_client's ``CONTENT_TYPE_PLAIN_0_0_4``)."""

UNKNOWN = "unknown"
BUILD_COMPONENT = "ambit-nodeproxy"


class Reporter(enum.Enum):
    SOURCE = "source"
    DESTINATION = "destination"
    WAYPOINT = "waypoint"


class SecurityPolicy(enum.Enum):
    MUTUAL_TLS = "mutual_tls"
    UNKNOWN = "unknown"


@dataclass(frozen=True, slots=True)
class TrafficLabels:
    """Istio's ``CommonTrafficLabels``; field order is the label order (:data:`LABEL_NAMES`)."""

    reporter: Reporter
    source_workload: str = ""
    source_canonical_service: str = ""
    source_canonical_revision: str = ""
    source_workload_namespace: str = ""
    source_principal: str = ""  # only with mTLS
    source_app: str = ""
    source_version: str = ""
    source_cluster: str = ""
    destination_service: str = ""
    destination_service_namespace: str = ""
    destination_service_name: str = ""
    destination_workload: str = ""
    destination_canonical_service: str = ""
    destination_canonical_revision: str = ""
    destination_workload_namespace: str = ""
    destination_principal: str = ""  # only with mTLS
    destination_app: str = ""
    destination_version: str = ""
    destination_cluster: str = ""
    request_protocol: str = "tcp"
    response_flags: str = "-"
    connection_security_policy: SecurityPolicy = SecurityPolicy.UNKNOWN

    def values(self) -> tuple[str, ...]:
        """The label values in :data:`LABEL_NAMES` order, with ``""`` rendered as ``unknown``."""
        out: list[str] = []
        for name in LABEL_NAMES:
            value = getattr(self, name)
            if isinstance(value, enum.Enum):
                value = value.value
            out.append(value or UNKNOWN)
        return tuple(out)


LABEL_NAMES: tuple[str, ...] = tuple(f.name for f in dataclasses.fields(TrafficLabels))


@dataclass(frozen=True, slots=True)
class DnsLabels:
    """The labels of ztunnel's DNS metrics (zt:src/dns/metrics.rs ``DnsLabels``), in label order."""

    request_query_type: str = ""
    """The query's type in lower case (``a``, ``aaaa``, ``srv``)."""
    request_protocol: str = "udp"
    source_canonical_service: str = ""
    source_canonical_revision: str = ""

    def values(self) -> tuple[str, ...]:
        return tuple(getattr(self, name) or UNKNOWN for name in DNS_LABEL_NAMES)


DNS_LABEL_NAMES: tuple[str, ...] = tuple(f.name for f in dataclasses.fields(DnsLabels))
DNS_DURATION_BUCKETS = (0.0005, 0.001, 0.01, 0.1, 1.0, 5.0)
"""ztunnel's buckets for ``istio_dns_upstream_request_duration_seconds``."""


@dataclass(slots=True)
class _Histogram:
    counts: list[int]
    total: float = 0.0

    def observe(self, value: float) -> None:
        for i, bound in enumerate(DNS_DURATION_BUCKETS):
            if value <= bound:
                self.counts[i] += 1
        self.counts[-1] += 1
        self.total += value


LabelValues = tuple[str, ...]


class ByteTotals(Protocol):
    """Running byte totals a copy loop keeps itself: client→server (``upstream_bytes``) and server→client."""

    upstream_bytes: int
    downstream_bytes: int


class ConnectionMetrics:
    """One connection's byte counts. ``add_*`` are lock-free; ``close()`` flushes and is idempotent."""

    __slots__ = ("_closed", "_flushed_received", "_flushed_sent", "_key", "_owner", "_received", "_sent", "_totals")

    def __init__(self, owner: ProxyMetrics, key: LabelValues) -> None:
        self._owner = owner
        self._key = key
        self._received = 0  # written only by the connection (add_received)
        self._sent = 0
        self._flushed_received = 0  # written only by the owner, under its lock
        self._flushed_sent = 0
        self._closed = False
        self._totals: ByteTotals | None = None  # written by the connection's copy loop (count_from)

    def count_from(self, totals: ByteTotals) -> None:
        """Count ``totals`` too, read when flushing: what a copy loop adds to its own totals is counted without a
        call per chunk."""
        self._totals = totals

    def add_received(self, n: int) -> None:
        """Count ``n`` client→server (request) bytes."""
        self._received += n

    def add_sent(self, n: int) -> None:
        """Count ``n`` server→client (response) bytes."""
        self._sent += n

    @property
    def received_bytes(self) -> int:
        totals = self._totals
        return self._received if totals is None else self._received + totals.upstream_bytes

    @property
    def sent_bytes(self) -> int:
        totals = self._totals
        return self._sent if totals is None else self._sent + totals.downstream_bytes

    def close(self) -> None:
        """Flush the remaining bytes and count the connection closed (once, however often it is called)."""
        self._owner._close(self)


@dataclass(slots=True)
class _Family:
    name: str
    help: str
    values: dict[LabelValues, int] = dataclasses.field(default_factory=dict)

    def bump(self, key: LabelValues, n: int = 1) -> None:
        self.values[key] = self.values.get(key, 0) + n


class ProxyMetrics:
    """The node proxy's metrics: ``connection_opened`` per connection, ``render()`` per scrape."""

    content_type: str = CONTENT_TYPE

    def __init__(self, *, build_version: str = "") -> None:
        self._lock = threading.Lock()
        self._build_version = build_version or UNKNOWN
        self._open: set[ConnectionMetrics] = set()
        # Per distinct label set: one shared labels object and its values, computed once and held by every
        # connection with those labels (an idle connection keeps both). Bounded like the families themselves.
        self._shared: dict[TrafficLabels, tuple[TrafficLabels, LabelValues]] = {}
        # The same entries by the id of their shared labels object (alive as long as we are, so its id is never
        # reused): a connection holding the shared object finds its key without hashing 23 label values.
        self._shared_by_id: dict[int, tuple[TrafficLabels, LabelValues]] = {}
        self._opened = _Family("istio_tcp_connections_opened", "The total number of TCP connections opened")
        self._closed = _Family("istio_tcp_connections_closed", "The total number of TCP connections closed")
        self._received = _Family("istio_tcp_received_bytes", "The size of total bytes received during request")
        self._sent = _Family("istio_tcp_sent_bytes", "The size of total bytes sent during response")
        self._failed = _Family(
            "istio_tcp_connections_failed", "The total number of TCP connections that failed to establish (unstable)"
        )
        self._dns_requests = _Family("istio_dns_requests", "Total number of DNS requests (unstable)")
        self._dns_upstream = _Family(
            "istio_dns_upstream_requests", "Total number of DNS requests forwarded to upstream (unstable)"
        )
        self._dns_failures = _Family(
            "istio_dns_upstream_failures", "Total number of DNS requests that failed to forward upstream (unstable)"
        )
        self._dns_duration: dict[LabelValues, _Histogram] = {}
        # Each DNS label set's values, computed once (the DNS proxy counts every answer); as many as the series.
        self._dns_keys: dict[DnsLabels, LabelValues] = {}
        self._dns_dropped = _Family(
            "ambit_dns_dropped", "DNS messages the DNS proxy dropped or refused without asking upstream, by reason"
        )
        self._crl_rejections = _Family(
            "istio_crl_policy_rejections",
            "The total number of connections rejected or closed because a peer certificate is revoked (unstable)",
        )
        self._crl_untracked = _Family(
            "istio_crl_untracked_connections",
            "The total number of connections whose peer chain could not be tracked for revocation (unstable)",
        )
        self._refused_connections = _Family(
            "ambit_listener_connections_refused",
            "Connections a listener refused at accept over its bounds, or closed in their handshake to make room for "
            "newer ones (pending_evicted), by listener and reason",
        )
        self._summed = (
            self._opened,
            self._closed,
            self._received,
            self._sent,
            self._failed,
            self._dns_requests,
            self._dns_upstream,
            self._dns_failures,
            self._dns_dropped,
            self._crl_rejections,
            self._crl_untracked,
            self._refused_connections,
        )
        """The families a worker's counts are added to (:mod:`ambit.telemetry.peer_counts`)."""
        self._widths = {family.name: len(LABEL_NAMES) for family in self._summed[:5]} | {
            family.name: len(DNS_LABEL_NAMES) for family in self._summed[5:8]
        }
        self._widths |= {self._dns_dropped.name: 1, self._crl_rejections.name: 1, self._crl_untracked.name: 1}
        self._widths[self._refused_connections.name] = 2
        self._peers: dict[str, PeerCounts] = {}
        self._retired = NO_COUNTS
        self._active_proxies = 0
        self._pending_proxies = 0
        self._proxies_started = 0
        self._on_demand_dns = 0
        self._on_demand_dns_misses = 0
        self._proxies_stopped = 0
        self._registry: CollectorRegistry | None = None

    # --- recording (called by the proxy) ---------------------------------------------------------------------

    def connection_opened(self, labels: TrafficLabels) -> ConnectionMetrics:
        """Count a new connection (``istio_tcp_connections_opened_total``) and return its byte-count handle."""
        key = self._key(labels)
        conn = ConnectionMetrics(self, key)
        with self._lock:
            # The families' ``bump``, inline: this runs per connection (a Python call each, three here).
            opened = self._opened.values
            opened[key] = opened.get(key, 0) + 1
            # Byte series exist from the first connection on, so a scrape shows 0 rather than nothing.
            self._received.values.setdefault(key, 0)
            self._sent.values.setdefault(key, 0)
            self._open.add(conn)
        return conn

    def connection_failed(self, labels: TrafficLabels) -> None:
        """Count a connection that failed to establish (``istio_tcp_connections_failed_total``)."""
        key = self._key(labels)
        with self._lock:
            self._failed.bump(key)

    def shared_labels(self, labels: TrafficLabels) -> TrafficLabels:
        """The one object equal to ``labels`` that every connection with these labels holds."""
        return self._lookup(labels)[0]

    def _key(self, labels: TrafficLabels) -> LabelValues:
        return self._lookup(labels)[1]

    def _lookup(self, labels: TrafficLabels) -> tuple[TrafficLabels, LabelValues]:
        shared = self._shared_by_id.get(id(labels))
        if shared is not None:
            return shared
        shared = self._shared.get(labels)
        if shared is None:  # a race between threads only computes the same entry twice
            shared = self._shared.setdefault(labels, (labels, labels.values()))
            self._shared_by_id[id(shared[0])] = shared
        return shared

    def dns_request(self, labels: DnsLabels) -> None:
        """Count a DNS request the proxy took (``istio_dns_requests_total``)."""
        key = self._dns_keys.get(labels)
        if key is None:  # a race between threads only computes the same entry twice
            key = self._dns_keys.setdefault(labels, labels.values())
        with self._lock:
            self._dns_requests.bump(key)

    def dns_forwarded(self, labels: DnsLabels, seconds: float, *, failed: bool) -> None:
        """Count a request forwarded upstream, how long it took, and whether it failed."""
        key = labels.values()
        with self._lock:
            self._dns_upstream.bump(key)
            if failed:
                self._dns_failures.bump(key)
            histogram = self._dns_duration.get(key)
            if histogram is None:
                histogram = self._dns_duration[key] = _Histogram([0] * (len(DNS_DURATION_BUCKETS) + 1))
            histogram.observe(seconds)

    def dns_dropped(self, reason: str) -> None:
        """Count a DNS message dropped or refused locally (garbage, overload), by ``reason``."""
        with self._lock:
            self._dns_dropped.bump((reason,))

    def set_proxy_counts(self, *, active: int, pending: int) -> None:
        """Set the in-pod proxy gauges (workloads with a running proxy, and those waiting for one)."""
        with self._lock:
            self._active_proxies = active
            self._pending_proxies = pending

    def on_demand_dns(self, *, miss: bool) -> None:
        """Count a hostname endpoint resolved on demand, and whether the cache missed (``istio_on_demand_dns_total``,
        ``istio_on_demand_dns_cache_misses_total``; unlabelled here, ztunnel labels them by the connection)."""
        with self._lock:
            self._on_demand_dns += 1
            if miss:
                self._on_demand_dns_misses += 1

    def crl_rejected(self, reporter: Reporter) -> None:
        """Count a connection refused at its handshake, or closed later, because its peer's chain is revoked."""
        with self._lock:
            self._crl_rejections.bump((reporter.value,))

    def crl_untracked(self, reporter: Reporter) -> None:
        """Count a connection admitted without its peer chain, so a later CRL cannot close it."""
        with self._lock:
            self._crl_untracked.bump((reporter.value,))

    def connection_refused(self, listener: str, reason: str) -> None:
        """Count a connection refused at accept, or evicted in its handshake, by a listener's admission
        (:mod:`ambit.proxy.admission`)."""
        with self._lock:
            self._refused_connections.bump((listener, reason))

    def proxy_started(self) -> None:
        with self._lock:
            self._proxies_started += 1

    def proxy_stopped(self) -> None:
        with self._lock:
            self._proxies_stopped += 1

    # --- a node proxy's workers --------------------------------------------------------------------------------

    def snapshot(self) -> dict[str, Any]:
        """This process's counts as a worker reports them (JSON-ready; :mod:`ambit.telemetry.peer_counts`)."""
        with self._lock:
            for conn in self._open:
                self._flush_locked(conn)
            families = {f.name: [[list(k), v] for k, v in f.values.items()] for f in self._summed if f.values}
            durations = [[list(k), list(h.counts), h.total] for k, h in self._dns_duration.items()]
            scalars = {"on_demand_dns": self._on_demand_dns, "on_demand_dns_misses": self._on_demand_dns_misses}
        return {"families": families, "durations": durations, "scalars": scalars}

    def peer_report(self, peer: str, report: object) -> None:
        """Take ``peer``'s latest counts (replacing its previous ones); raise :class:`PeerCountsError` and keep the
        previous ones if the report is not well formed."""
        counts = parse_peer_counts(
            report,
            self._widths,
            len(DNS_LABEL_NAMES),
            len(DNS_DURATION_BUCKETS) + 1,
            frozenset({"on_demand_dns", "on_demand_dns_misses"}),
        )
        with self._lock:
            self._peers[peer] = counts

    def peer_gone(self, peer: str) -> None:
        """``peer`` ended: its last counts stay, in the retired total."""
        with self._lock:
            counts = self._peers.pop(peer, None)
            if counts is not None:
                self._retired = self._retired.plus(counts)

    def _others_locked(self) -> PeerCounts:
        others = self._retired
        for counts in self._peers.values():
            others = others.plus(counts)
        return others

    # --- exposition ------------------------------------------------------------------------------------------

    def render(self) -> bytes:
        """The Prometheus text exposition, after flushing the bytes of every open connection.

        The first call imports prometheus_client (once, some tens of milliseconds): a proxy nobody scrapes never
        holds it (about 3 MiB and 40 modules, among them http.server and wsgiref)."""
        from prometheus_client import generate_latest

        if self._registry is None:
            self._registry = _registry_for(self)
        with self._lock:
            for conn in self._open:
                self._flush_locked(conn)
        return generate_latest(self._registry)

    def _close(self, conn: ConnectionMetrics) -> None:
        with self._lock:
            if conn._closed:
                return
            conn._closed = True
            self._open.discard(conn)
            self._flush_locked(conn)
            closed = self._closed.values
            closed[conn._key] = closed.get(conn._key, 0) + 1

    def _flush_locked(self, conn: ConnectionMetrics) -> None:
        received, sent = conn.received_bytes, conn.sent_bytes  # read once: the connection may be adding meanwhile
        key = conn._key
        if received != conn._flushed_received:
            values = self._received.values
            values[key] = values.get(key, 0) + received - conn._flushed_received
            conn._flushed_received = received
        if sent != conn._flushed_sent:
            values = self._sent.values
            values[key] = values.get(key, 0) + sent - conn._flushed_sent
            conn._flushed_sent = sent

    def _families(self) -> Iterator[Metric]:
        """Snapshot every family (called by the registry during ``render``, outside our lock)."""
        from prometheus_client.metrics_core import CounterMetricFamily, GaugeMetricFamily, HistogramMetricFamily

        with self._lock:
            others = self._others_locked() if self._peers or self._retired is not NO_COUNTS else None

            def merged(family: _Family) -> dict[LabelValues, int]:
                own = dict(family.values)
                for key, value in (others.families.get(family.name, {}) if others is not None else {}).items():
                    own[key] = own.get(key, 0) + value
                return own

            families = (self._opened, self._closed, self._received, self._sent)
            traffic = [(f.name, f.help, merged(f)) for f in families]
            failed = merged(self._failed)
            active, pending = self._active_proxies, self._pending_proxies
            started, stopped = self._proxies_started, self._proxies_stopped
            on_demand, on_demand_misses = self._on_demand_dns, self._on_demand_dns_misses
            if others is not None:
                on_demand += others.scalars.get("on_demand_dns", 0)
                on_demand_misses += others.scalars.get("on_demand_dns_misses", 0)
            dns_counters = [
                (f.name, f.help, merged(f)) for f in (self._dns_requests, self._dns_upstream, self._dns_failures)
            ]
            durations = {key: (list(h.counts), h.total) for key, h in self._dns_duration.items()}
            for key, (peer_counts, peer_total) in (others.durations if others is not None else {}).items():
                have = durations.get(key)
                durations[key] = (
                    (list(peer_counts), peer_total)
                    if have is None
                    else ([a + b for a, b in zip(have[0], peer_counts, strict=True)], have[1] + peer_total)
                )
            dropped = merged(self._dns_dropped)
            crl = [(f.name, f.help, merged(f)) for f in (self._crl_rejections, self._crl_untracked)]
            refused = merged(self._refused_connections)
        for name, doc, values in traffic:
            yield _counter(name, doc, values.items())
        build = GaugeMetricFamily("istio_build", "Istio component build info", labels=["component", "tag"])
        build.add_metric([BUILD_COMPONENT, self._build_version], 1)
        yield build
        yield _counter(self._failed.name, self._failed.help, failed.items())
        yield GaugeMetricFamily(
            "istio_active_proxy_count_total", "The total number of workloads with an active proxy (unstable)", active
        )
        yield GaugeMetricFamily(
            "istio_pending_proxy_count_total", "The total number of workloads waiting for a proxy (unstable)", pending
        )
        yield CounterMetricFamily("istio_proxies_started", "The total number of proxies started (unstable)", started)
        yield CounterMetricFamily("istio_proxies_stopped", "The total number of proxies stopped (unstable)", stopped)
        yield CounterMetricFamily(
            "istio_on_demand_dns", "The total number of requests that used on-demand DNS (unstable)", on_demand
        )
        yield CounterMetricFamily(
            "istio_on_demand_dns_cache_misses",
            "The total number of cache misses for requests on-demand DNS (unstable)",
            on_demand_misses,
        )
        for name, doc, dns_values in dns_counters:
            family = CounterMetricFamily(name, doc, labels=DNS_LABEL_NAMES)
            for key, value in dns_values.items():
                family.add_metric(key, value)
            yield family
        histogram = HistogramMetricFamily(
            "istio_dns_upstream_request_duration_seconds",
            "Total time in seconds Istio takes to get DNS response from upstream (unstable)",
            labels=DNS_LABEL_NAMES,
        )
        for key, (counts, total) in durations.items():
            bounds = [*(repr(b) for b in DNS_DURATION_BUCKETS), "+Inf"]
            histogram.add_metric(key, list(zip(bounds, counts, strict=True)), total)
        yield histogram
        drops = CounterMetricFamily(self._dns_dropped.name, self._dns_dropped.help, labels=["reason"])
        for key, value in dropped.items():
            drops.add_metric(key, value)
        yield drops
        for name, doc, crl_values in crl:
            family = CounterMetricFamily(name, doc, labels=["reporter"])
            for key, value in crl_values.items():
                family.add_metric(key, value)
            yield family
        refusals = CounterMetricFamily(
            self._refused_connections.name, self._refused_connections.help, labels=["listener", "reason"]
        )
        for key, value in refused.items():
            refusals.add_metric(key, value)
        yield refusals


def _counter(name: str, doc: str, samples: Iterable[tuple[LabelValues, int]]) -> CounterMetricFamily:
    from prometheus_client.metrics_core import CounterMetricFamily

    family = CounterMetricFamily(name, doc, labels=LABEL_NAMES)
    for key, value in samples:
        family.add_metric(key, value)
    return family


def _registry_for(metrics: ProxyMetrics) -> CollectorRegistry:
    """A registry of its own for ``metrics``, whose collector yields its families."""
    from prometheus_client import CollectorRegistry
    from prometheus_client.registry import Collector

    class _Collector(Collector):
        def collect(self) -> Iterable[Metric]:
            return metrics._families()

    registry = CollectorRegistry(auto_describe=False)
    registry.register(_Collector())
    return registry
