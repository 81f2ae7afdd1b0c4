"""Metrics and the access log for one proxied connection, from open to close (spec §8.1, §8.3).

Theory of operation: a handler builds :class:`Accounting` once it knows both ends (labels and the access-log
record), hands :meth:`Accounting.up` / :meth:`Accounting.down` to the relay as byte callbacks, and calls
:meth:`Accounting.finish` exactly once. Byte directions follow Istio for both reporters: "received" is
client→server, "sent" is server→client. A connection that fails before the relay is reported with
:meth:`Accounting.failed` (counted as failed, logged with the error, no opened/closed pair).

Memory: an idle connection keeps its :class:`Accounting` (slotted), labels and record for its whole life, so the
strings they hold that every connection between the same pair repeats are shared, not rebuilt: principals are
interned (:func:`principal`); workload names come from the workload objects themselves.
"""

from __future__ import annotations

import dataclasses
import sys
import time
from collections.abc import Callable

from ambit.model.identity import SpiffeId
from ambit.model.workload import Service, Workload
from ambit.telemetry.accesslog import AccessLog, ConnectionRecord
from ambit.telemetry.metrics import ConnectionMetrics, ProxyMetrics, Reporter, SecurityPolicy, TrafficLabels


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
) -> TrafficLabels:
    """Istio's CommonTrafficLabels for one connection; principals only with mutual TLS."""
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
        response_flags=flags,
        connection_security_policy=SecurityPolicy.MUTUAL_TLS if mtls else SecurityPolicy.UNKNOWN,
    )


class Accounting:
    """One connection's metrics handle and access-log record."""

    __slots__ = ("_clock", "_handle", "_labels", "_log", "_metrics", "_record", "_started", "bytes_down", "bytes_up")

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
        self.bytes_up = 0
        self.bytes_down = 0

    def opened(self) -> None:
        self._handle = self._metrics.connection_opened(self._labels)

    def up(self, n: int) -> None:
        self.bytes_up += n
        if self._handle is not None:
            self._handle.add_received(n)

    def down(self, n: int) -> None:
        self.bytes_down += n
        if self._handle is not None:
            self._handle.add_sent(n)

    def finish(self, error: str = "") -> None:
        if self._handle is not None:
            self._handle.close()
            self._handle = None
        self._log.write(
            dataclasses.replace(
                self._record,
                bytes_sent=self.bytes_up,
                bytes_recv=self.bytes_down,
                duration_seconds=self._clock() - self._started,
                error=error,
            )
        )

    def failed(self, error: str, flags: str) -> None:
        self._metrics.connection_failed(dataclasses.replace(self._labels, response_flags=flags))
        self._log.write(dataclasses.replace(self._record, duration_seconds=self._clock() - self._started, error=error))
