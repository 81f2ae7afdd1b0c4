"""Metrics and the access log for one proxied connection, from open to close (spec §8.1, §8.3).

Theory of operation: a handler builds :class:`Accounting` once it knows both ends (labels and the access-log
record) and gives it to the relay as its byte counter: the relay hands over its running totals once
(:meth:`Accounting.count_from`), which the accounting and its metrics handle read when they need the bytes, so no
call is made per chunk (:meth:`Accounting.up` / :meth:`Accounting.down` count bytes moved elsewhere, as the
waypoint's TCP path does); the relay's end calls :meth:`Accounting.finish` exactly once. Byte directions follow
Istio for both reporters: "received" is client→server, "sent" is server→client. A connection that fails before the
relay is reported with :meth:`Accounting.failed` (counted as failed, logged with the error, no opened/closed pair).

Memory: an idle connection keeps its :class:`Accounting` (slotted), labels and record for its whole life, so the
strings they hold that every connection between the same pair repeats are shared, not rebuilt: principals are
interned (:func:`principal`); workload names come from the workload objects themselves. CPU: a connection's labels
come from :class:`LabelsCache` (built once per pair of ends, not per connection).
"""

from __future__ import annotations

import dataclasses
import sys
import time
from collections.abc import Callable

from ambit.model.identity import SpiffeId
from ambit.model.workload import Service, Workload
from ambit.telemetry.accesslog import AccessLog, ConnectionRecord
from ambit.telemetry.metrics import (
    ByteTotals,
    ConnectionMetrics,
    ProxyMetrics,
    Reporter,
    SecurityPolicy,
    TrafficLabels,
)


def principal(identity: SpiffeId) -> str:
    """``str(identity)``, interned: the one string every connection of that identity shares."""
    return sys.intern(str(identity))


def traffic_labels(
    reporter: Reporter,
    *,
    source: Workload | None,
    source_identity: SpiffeId | None,
    destination: Workload | None,
    destination_identity: SpiffeId | None,
    service: Service | None,
    mtls: bool,
    flags: str = "-",
    request_protocol: str = "tcp",
    policy: SecurityPolicy | None = None,
) -> TrafficLabels:
    """Istio's CommonTrafficLabels for one connection (or request); principals only with mutual TLS. ``policy``:
    the ``connection_security_policy`` when it is not what ``mtls`` says (an ingress gateway's client-side report
    cannot know it: ``unknown``)."""
    if policy is None:
        policy = SecurityPolicy.MUTUAL_TLS if mtls else SecurityPolicy.UNKNOWN
    return TrafficLabels(
        reporter=reporter,
        source_workload=source.workload_name or source.name if source else "",
        source_canonical_service=source.canonical_name if source else "",
        source_canonical_revision=source.canonical_revision if source else "",
        source_workload_namespace=source.namespace if source else "",
        source_principal=principal(source_identity) if mtls and source_identity else "",
        source_app=source.canonical_name if source else "",
        source_version=source.canonical_revision if source else "",
        source_cluster=source.cluster_id if source else "",
        destination_service=service.hostname if service else "",
        destination_service_namespace=service.namespace if service else "",
        destination_service_name=service.name if service else "",
        destination_workload=destination.workload_name or destination.name if destination else "",
        destination_canonical_service=destination.canonical_name if destination else "",
        destination_canonical_revision=destination.canonical_revision if destination else "",
        destination_workload_namespace=destination.namespace if destination else "",
        destination_principal=principal(destination_identity) if mtls and destination_identity else "",
        destination_app=destination.canonical_name if destination else "",
        destination_version=destination.canonical_revision if destination else "",
        destination_cluster=destination.cluster_id if destination else "",
        request_protocol=request_protocol,
        response_flags=flags,
        connection_security_policy=policy,
    )


class LabelsCache:
    """:func:`traffic_labels` per connection without building 23 labels each time: remembered by its inputs.

    The destination's identity is the destination workload's (not asked for: a workload makes a new
    :class:`SpiffeId` each time). Entries are keyed by the *identity* of the inputs (workloads, the source
    identity, the service; the workload state replaces rather than mutates them) and hold those objects, so an id
    in a key is never reused while its entry lives. The result is the metrics' shared labels object
    (:meth:`ProxyMetrics.shared_labels`); its principals are the access log's too. When ``limit`` entries are
    reached (workloads and HBONE connections come and go) the cache starts afresh.
    """

    __slots__ = ("_entries", "_limit", "_metrics")

    def __init__(self, metrics: ProxyMetrics, limit: int = 4096) -> None:
        self._metrics = metrics
        self._limit = limit
        self._entries: dict[tuple[object, ...], tuple[TrafficLabels, tuple[object, ...]]] = {}

    def labels(
        self,
        reporter: Reporter,
        *,
        source: Workload | None,
        source_identity: SpiffeId | None,
        destination: Workload | None,
        service: Service | None,
        mtls: bool,
        flags: str = "-",
        request_protocol: str = "tcp",
        policy: SecurityPolicy | None = None,
    ) -> TrafficLabels:
        """The shared labels object equal to :func:`traffic_labels` of these, with the destination's identity
        (a waypoint's requests also name their flags and protocol)."""
        key = (
            reporter,
            mtls,
            id(source),
            id(source_identity),
            id(destination),
            id(service),
            flags,
            request_protocol,
            policy,
        )
        entry = self._entries.get(key)
        if entry is not None:
            return entry[0]
        labels = traffic_labels(
            reporter,
            source=source,
            source_identity=source_identity,
            destination=destination,
            destination_identity=destination.identity if destination is not None else None,
            service=service,
            mtls=mtls,
            flags=flags,
            request_protocol=request_protocol,
            policy=policy,
        )
        if len(self._entries) >= self._limit:
            self._entries.clear()
        shared = self._metrics.shared_labels(labels)
        self._entries[key] = (shared, (source, source_identity, destination, service))
        return shared


class Accounting:
    """One connection's metrics handle and access-log record."""

    __slots__ = ("_clock", "_down", "_handle", "_labels", "_log", "_metrics", "_record", "_started", "_totals", "_up")

    def __init__(
        self,
        metrics: ProxyMetrics,
        access_log: AccessLog,
        labels: TrafficLabels,
        record: ConnectionRecord,
        clock: Callable[[], float] = time.monotonic,
    ) -> None:
        self._metrics, self._log, self._record = metrics, access_log, record
        self._labels = metrics.shared_labels(labels)
        self._clock = clock
        self._started = clock()
        self._handle: ConnectionMetrics | None = None
        self._up = 0  # counted by up() and down()
        self._down = 0
        self._totals: ByteTotals | None = None  # a relay's own running totals (count_from)

    def opened(self) -> None:
        self._handle = self._metrics.connection_opened(self._labels)
        if self._totals is not None:
            self._handle.count_from(self._totals)

    def count_from(self, totals: ByteTotals) -> None:
        """Count a relay's running totals too, read when needed (no call per chunk)."""
        self._totals = totals
        if self._handle is not None:
            self._handle.count_from(totals)

    def up(self, n: int) -> None:
        self._up += n
        if self._handle is not None:
            self._handle.add_received(n)

    def down(self, n: int) -> None:
        self._down += n
        if self._handle is not None:
            self._handle.add_sent(n)

    @property
    def bytes_up(self) -> int:
        """Client→server bytes so far."""
        totals = self._totals
        return self._up if totals is None else self._up + totals.upstream_bytes

    @property
    def bytes_down(self) -> int:
        """Server→client bytes so far."""
        totals = self._totals
        return self._down if totals is None else self._down + totals.downstream_bytes

    def finish(self, error: str = "") -> None:
        if self._handle is not None:
            self._handle.close()
            self._handle = None
        duration = self._clock() - self._started
        self._log.write(
            self._record.ended(
                bytes_sent=self.bytes_up, bytes_recv=self.bytes_down, duration_seconds=duration, error=error
            )
        )

    def failed(self, error: str, flags: str) -> None:
        self._metrics.connection_failed(dataclasses.replace(self._labels, response_flags=flags))
        duration = self._clock() - self._started
        record = self._record
        self._log.write(
            record.ended(
                bytes_sent=record.bytes_sent, bytes_recv=record.bytes_recv, duration_seconds=duration, error=error
            ),
            flags,
        )


class BothSides:
    """Both sides' accountings of one same-node connection (the source's and the destination's), as one.

    The same-node fast path relays one connection that is both an outbound and an inbound connection: every byte
    counts on both sides, and both records end together.
    """

    __slots__ = ("accountings",)

    def __init__(self, accountings: tuple[Accounting, ...]) -> None:
        self.accountings = accountings

    def count_from(self, totals: ByteTotals) -> None:
        for each in self.accountings:
            each.count_from(totals)

    def up(self, n: int) -> None:
        for each in self.accountings:
            each.up(n)

    def down(self, n: int) -> None:
        for each in self.accountings:
            each.down(n)

    def finish(self, error: str = "") -> None:
        for each in self.accountings:
            each.finish(error)
