"""The waypoint's request telemetry (spec §8, reporter="waypoint"): Istio's HTTP metrics and a line per request.

Theory of operation: :class:`WaypointMetrics` is the node proxy's :class:`~ambit.telemetry.metrics.ProxyMetrics`
(so TCP traffic the waypoint relays is counted as ``istio_tcp_*`` the usual way, and the stats endpoint serves it
unchanged) plus Istio's request families:

- ``istio_requests_total`` (counter),
- ``istio_request_duration_milliseconds``, ``istio_request_bytes``, ``istio_response_bytes`` (histograms),

labelled with the connection's :class:`~ambit.telemetry.metrics.TrafficLabels` (``reporter="waypoint"``,
``request_protocol`` http or grpc, Envoy's ``response_flags``) plus ``response_code`` and
``grpc_response_status`` (empty, so ``unknown``, unless the request is gRPC). One :meth:`WaypointMetrics.request`
call per finished request records all four under the metrics lock. A request's series (its 22 label values and its
three histograms) is remembered by what its labels depend on: the connection's shared
:class:`~ambit.telemetry.metrics.TrafficLabels` object (one per source, destination, service, flags and protocol:
:class:`~ambit.proxy.accounting.LabelsCache`), the response code and the gRPC status; a steady stream of like
requests builds no label tuple and makes no histogram look-up. The remembered series are the very objects the
exposition reads, made at the first request as without remembering, so the metrics text is the same byte for byte.

:class:`RequestRecord` is one request's access-log line, ``request complete`` (INFO) or, with response flags,
``request failed`` (WARNING), logfmt-style like the node proxy's connection lines, on the ``access`` logger; it
notes how many tries the request took upstream (``attempts``). :class:`RequestLog` writes it through an
:class:`~ambit.telemetry.access_sink.AccessSink`: batched per event-loop iteration, past ``logging`` when the
process's logging allows, the same bytes either way. The ``src.*`` pairs, fixed for a connection, are rendered
once per connection, and the values that recur per destination or route once each, for the last thousand of
either.

The Telemetry API's overrides (:mod:`ambit.waypoint.metric_overrides`; each request passes the current
configuration's, compiled when they are not the ones compiled last, so once per configuration) change the
request families per destination service: a dropped family records nothing for that service; a relabelled one
records its series apart, with the plan's labels, in the same family (the text format lets one family's series
carry different labels), at most ``max_custom_series`` of them per family. Requests to services without
overrides are recorded exactly as without any.

Rules: every family is exposed (HELP and TYPE) before its first sample; values only grow; label values that are
empty render as ``unknown``.
"""

from __future__ import annotations

import bisect
import functools
import json
import logging
import operator
import re
from collections.abc import Callable, Iterator
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, NamedTuple

from ambit.model.metric_overrides import RequestAttributes, ServiceMetrics
from ambit.telemetry.access_sink import AccessSink
from ambit.telemetry.flows import Flow, FlowRing, request_verdict
from ambit.telemetry.metrics import LABEL_NAMES, UNKNOWN, LabelValues, ProxyMetrics, TrafficLabels
from ambit.waypoint.metric_overrides import NO_PLANS, FamilyPlan, MetricPlans, Pairs, compile_overrides

if TYPE_CHECKING:  # prometheus_client is imported by the first scrape, as the node proxy's metrics do
    from prometheus_client.metrics_core import Metric

BUILD_COMPONENT = "ambit-waypoint"
REQUEST_LABELS = (*LABEL_NAMES, "response_code", "grpc_response_status")
DURATION_BUCKETS_MS = (0.5, 1, 5, 10, 25, 50, 100, 250, 500, 1000, 2500, 5000, 10000, 30000, 60000, 300000, 600000)
"""Istio's default buckets for ``istio_request_duration_milliseconds``."""
BYTES_BUCKETS = (1, 10, 100, 1000, 10000, 100000, 1000000, 10000000, 100000000)
_HISTOGRAMS = (
    ("istio_request_duration_milliseconds", "Request duration in milliseconds", DURATION_BUCKETS_MS),
    ("istio_request_bytes", "Request body size in bytes", BYTES_BUCKETS),
    ("istio_response_bytes", "Response body size in bytes", BYTES_BUCKETS),
)
_BOUNDS: dict[str, tuple[float, ...]] = {name: bounds for name, _, bounds in _HISTOGRAMS}
_Series = tuple[FamilyPlan, LabelValues, tuple[str, ...]]
"""A relabelled series as recorded: its plan, its standard label values and its tag values."""
MAX_CUSTOM_SERIES = 5000
"""Relabelled series per request family; past it, request-valued tags read ``overflow``."""
MAX_REMEMBERED_SERIES = 4096
"""Request series remembered by their labels object, code and status (see the module docstring); 0: none."""


@dataclass(slots=True)
class _Histogram:
    bounds: tuple[float, ...]
    counts: list[int] = field(default_factory=list)
    total: float = 0.0

    def observe(self, value: float) -> None:
        if not self.counts:
            self.counts = [0] * (len(self.bounds) + 1)
        self.counts[bisect.bisect_left(self.bounds, value)] += 1
        self.total += value

    def buckets(self) -> list[tuple[str, float]]:
        out: list[tuple[str, float]] = []
        running = 0
        for bound, count in zip((*self.bounds, float("inf")), self.counts or [0] * (len(self.bounds) + 1), strict=True):
            running += count
            out.append(("+Inf" if bound == float("inf") else _number(bound), running))
        return out


@dataclass(frozen=True, slots=True)
class _RequestSeries:
    """A standard series of the request families, as one kind of request records it (see the module docstring)."""

    labels: TrafficLabels
    """Held so that its ``id`` in the remembering key is not reused while the entry lives."""
    key: LabelValues
    durations: _Histogram
    request_sizes: _Histogram
    response_sizes: _Histogram


def _number(value: float) -> str:
    return str(int(value)) if float(value).is_integer() else str(value)


class WaypointMetrics(ProxyMetrics):
    """:class:`ProxyMetrics` plus Istio's request metrics (see the module docstring)."""

    def __init__(
        self,
        *,
        build_version: str = "",
        max_custom_series: int = MAX_CUSTOM_SERIES,
        max_remembered_series: int = MAX_REMEMBERED_SERIES,
    ) -> None:
        self._max_custom = max_custom_series
        self._max_remembered = max_remembered_series
        self._remembered: dict[tuple[int, int, str], _RequestSeries] = {}
        self._requests: dict[LabelValues, int] = {}
        self._durations: dict[LabelValues, _Histogram] = {}
        self._request_sizes: dict[LabelValues, _Histogram] = {}
        self._response_sizes: dict[LabelValues, _Histogram] = {}
        self._plans: MetricPlans = NO_PLANS
        self._compiled: tuple[ServiceMetrics, ...] = ()
        self._custom_counts: dict[_Series, int] = {}
        self._custom_histograms: dict[str, dict[_Series, _Histogram]] = {name: {} for name, _, _ in _HISTOGRAMS}
        self._default_tables = {
            "istio_request_duration_milliseconds": self._durations,
            "istio_request_bytes": self._request_sizes,
            "istio_response_bytes": self._response_sizes,
        }
        super().__init__(build_version=build_version)

    def set_overrides(self, entries: tuple[ServiceMetrics, ...]) -> None:
        """Apply a configuration's metric overrides to the requests counted from now on."""
        plans = compile_overrides(entries, REQUEST_LABELS) if entries else NO_PLANS
        with self._lock:
            self._plans, self._compiled = plans, entries

    def request(
        self,
        labels: TrafficLabels,
        *,
        response_code: int,
        grpc_status: str = "",
        duration_ms: float,
        request_bytes: int,
        response_bytes: int,
        service_key: str = "",
        request: Callable[[], RequestAttributes] | None = None,
        overrides: tuple[ServiceMetrics, ...] | None = None,
    ) -> None:
        """Count one finished request with its duration and body sizes. ``overrides``: the current configuration's
        (None keeps those last set); ``service_key`` (the addressed service) chooses among them, and their
        expressions read ``request()``."""
        if overrides is not None and overrides is not self._compiled:
            self.set_overrides(overrides)
        plans = self._plans
        plan = plans.find(service_key) if plans.by_service else None
        if plan is None and self._max_remembered:
            series = self._remembered.get((id(labels), response_code, grpc_status))
            with self._lock:
                if series is None:
                    series = self._remember(labels, response_code, grpc_status)
                key = series.key
                self._requests[key] = self._requests.get(key, 0) + 1
                for remembered, value in (
                    (series.durations, duration_ms),
                    (series.request_sizes, request_bytes),
                    (series.response_sizes, response_bytes),
                ):
                    remembered.counts[bisect.bisect_left(remembered.bounds, value)] += 1
                    remembered.total += value
            return
        key = self._request_key(labels, response_code, grpc_status)
        if plan is not None:
            attributes = request() if plan.needs_request and request is not None else None
            values = (
                ("istio_requests", 1.0),
                ("istio_request_duration_milliseconds", duration_ms),
                ("istio_request_bytes", float(request_bytes)),
                ("istio_response_bytes", float(response_bytes)),
            )
            with self._lock:
                for name, value in values:
                    family = plan.families.get(name)
                    if family is None:
                        self._record_default(name, key, value)
                    elif not isinstance(family, str):  # else dropped
                        self._record_custom(name, family, key, attributes, value)
            return
        with self._lock:
            self._requests[key] = self._requests.get(key, 0) + 1
            for table, bounds, value in (
                (self._durations, DURATION_BUCKETS_MS, duration_ms),
                (self._request_sizes, BYTES_BUCKETS, request_bytes),
                (self._response_sizes, BYTES_BUCKETS, response_bytes),
            ):
                histogram = table.get(key)
                if histogram is None:  # made once per series, not per request (``setdefault`` would make one each)
                    histogram = table[key] = _Histogram(bounds)
                histogram.observe(value)

    def _request_key(self, labels: TrafficLabels, response_code: int, grpc_status: str) -> LabelValues:
        return (*self._key(labels), str(response_code) if response_code else UNKNOWN, grpc_status or UNKNOWN)

    def _remember(self, labels: TrafficLabels, response_code: int, grpc_status: str) -> _RequestSeries:
        """The series of these labels, code and status, its histograms made now if they are new (as the first
        request makes them without remembering), and remembered; past ``max_remembered_series`` entries (labels
        objects come and go with workloads and connections) the remembering starts afresh. Called under the
        metrics lock, by the request that records into the series next."""
        key = self._request_key(labels, response_code, grpc_status)
        histograms = []
        for table, bounds in (
            (self._durations, DURATION_BUCKETS_MS),
            (self._request_sizes, BYTES_BUCKETS),
            (self._response_sizes, BYTES_BUCKETS),
        ):
            histogram = table.get(key)
            if histogram is None:
                histogram = table[key] = _Histogram(bounds)
            if not histogram.counts:
                histogram.counts = [0] * (len(bounds) + 1)
            histograms.append(histogram)
        series = _RequestSeries(labels, key, *histograms)
        if len(self._remembered) >= self._max_remembered:
            self._remembered.clear()
        self._remembered[(id(labels), response_code, grpc_status)] = series
        return series

    def _record_default(self, name: str, key: LabelValues, value: float) -> None:
        if name == "istio_requests":
            self._requests[key] = self._requests.get(key, 0) + 1
            return
        table = self._default_tables[name]
        histogram = table.get(key)
        if histogram is None:
            histogram = table[key] = _Histogram(_BOUNDS[name])
        histogram.observe(value)

    def _record_custom(
        self, name: str, plan: FamilyPlan, key: LabelValues, request: RequestAttributes | None, value: float
    ) -> None:
        series: _Series = (plan, key, plan.tag_values(request if plan.constant is None else None))
        if name == "istio_requests":
            if series not in self._custom_counts and len(self._custom_counts) >= self._max_custom:
                series = (plan, key, plan.overflow)
            self._custom_counts[series] = self._custom_counts.get(series, 0) + 1
            return
        table = self._custom_histograms[name]
        if series not in table and len(table) >= self._max_custom:
            series = (plan, key, plan.overflow)
        histogram = table.get(series)
        if histogram is None:
            histogram = table[series] = _Histogram(_BOUNDS[name])
        histogram.observe(value)

    def _families(self) -> Iterator[Metric]:
        from prometheus_client.metrics_core import CounterMetricFamily, GaugeMetricFamily, HistogramMetricFamily

        for family in super()._families():
            if family.name == "istio_build":
                build = GaugeMetricFamily("istio_build", "Istio component build info", labels=["component", "tag"])
                build.add_metric([BUILD_COMPONENT, self._build_version], 1)
                yield build
            else:
                yield family
        with self._lock:
            requests = dict(self._requests)
            custom_counts: dict[Pairs, float] = {}
            for (plan, key, tags), count in self._custom_counts.items():
                pairs = plan.labels(key, tags)
                custom_counts[pairs] = custom_counts.get(pairs, 0) + count
            histograms = [
                (
                    name,
                    doc,
                    {key: (h.buckets(), h.total) for key, h in values.items()},
                    _merged(self._custom_histograms[name]),
                )
                for name, doc, values in (
                    ("istio_request_duration_milliseconds", "Request duration in milliseconds", self._durations),
                    ("istio_request_bytes", "Request body size in bytes", self._request_sizes),
                    ("istio_response_bytes", "Response body size in bytes", self._response_sizes),
                )
            ]
        counter = CounterMetricFamily("istio_requests", "The total number of requests", labels=REQUEST_LABELS)
        for key, value in requests.items():
            counter.add_metric(key, value)
        for pairs, total in custom_counts.items():
            series = CounterMetricFamily("istio_requests", "", labels=[n for n, _ in pairs])
            series.add_metric([v for _, v in pairs], total)
            counter.samples.extend(series.samples)
        yield counter
        for name, doc, samples, custom in histograms:
            family = HistogramMetricFamily(name, doc, labels=REQUEST_LABELS)
            for key, (buckets, total) in samples.items():
                family.add_metric(list(key), buckets, total)
            for pairs, (buckets, total) in custom.items():
                histogram = HistogramMetricFamily(name, "", labels=[n for n, _ in pairs])
                histogram.add_metric([v for _, v in pairs], buckets, total)
                family.samples.extend(histogram.samples)
            yield family


def _merged(series: dict[_Series, _Histogram]) -> dict[Pairs, tuple[list[tuple[str, float]], float]]:
    """Histograms by label pairs: series whose removed labels differed are one series once rendered."""
    out: dict[Pairs, _Histogram] = {}
    for (plan, key, tags), histogram in series.items():
        pairs = plan.labels(key, tags)
        merged = out.get(pairs)
        if merged is None:
            merged = out[pairs] = _Histogram(histogram.bounds, [0] * (len(histogram.bounds) + 1))
        for i, count in enumerate(histogram.counts):
            merged.counts[i] += count
        merged.total += histogram.total
    return {pairs: (h.buckets(), h.total) for pairs, h in out.items()}


REQUEST_COMPLETE = "request complete"
REQUEST_FAILED = "request failed"
_PLAIN = re.compile(r"[a-zA-Z0-9.:/_\-\[\]@,+*~%]+")
"""A value made only of these is written bare in a log line; any other is quoted (one regex match per field:
the access log formats about twenty of them per request)."""


class RequestRecord(NamedTuple):
    """One request through the waypoint, for the access log and the flow ring. A named tuple: immutable, and made
    per request in a single step (a frozen dataclass sets each of its 22 fields through ``object.__setattr__``)."""

    src_addr: str
    src_workload: str = ""
    src_namespace: str = ""
    src_identity: str = ""
    dst_addr: str = ""
    """The endpoint the request went to (``ip:port``), empty when none was reached."""
    dst_hbone_addr: str = ""
    """The tunnel's CONNECT authority (what the client addressed)."""
    dst_service: str = ""
    dst_workload: str = ""
    dst_namespace: str = ""
    dst_identity: str = ""
    method: str = ""
    path: str = ""
    protocol: str = "HTTP/1.1"
    response_code: int = 0
    response_flags: str = "-"
    request_id: str = ""
    route: str = ""
    bytes_sent: int = 0
    bytes_recv: int = 0
    duration_seconds: float = 0.0
    error: str = ""
    attempts: int = 0
    """Tries sent upstream (Envoy's ``UPSTREAM_REQUEST_ATTEMPT_COUNT``); 0 when none was (a local answer)."""

    def fields(self) -> list[tuple[str, str | int]]:
        out: list[tuple[str, str | int]] = [
            ("src.addr", self.src_addr),
            ("src.workload", self.src_workload),
            ("src.namespace", self.src_namespace),
            ("src.identity", self.src_identity),
            ("dst.addr", self.dst_addr),
            ("dst.hbone_addr", self.dst_hbone_addr),
            ("dst.service", self.dst_service),
            ("dst.workload", self.dst_workload),
            ("dst.namespace", self.dst_namespace),
            ("dst.identity", self.dst_identity),
            ("method", self.method),
            ("path", self.path),
            ("protocol", self.protocol),
            ("route", self.route),
            ("request_id", self.request_id),
        ]
        out = [(key, value) for key, value in out if value != ""]
        out += [
            ("response_code", self.response_code),
            ("response_flags", self.response_flags),
            ("attempts", self.attempts),
            ("bytes_sent", self.bytes_sent),
            ("bytes_recv", self.bytes_recv),
            ("duration", f"{round(max(self.duration_seconds, 0.0) * 1000)}ms"),
        ]
        if self.error:
            out.append(("error", self.error))
        return out

    def flow(self) -> Flow:
        """The flow-log entry of this request (:func:`request_flow`)."""
        return request_flow(self)


def _value(value: str | int) -> str:
    if isinstance(value, int):
        return str(value)
    return _text(value)


def _text(value: str) -> str:
    """A string value as a log line shows it: bare when plain, else JSON-quoted (always one line)."""
    if _PLAIN.fullmatch(value):
        return value
    text = json.dumps(value, ensure_ascii=False)
    return text if text.isprintable() else json.dumps(value)  # one line, whatever the client sent


_recurring_text = functools.lru_cache(maxsize=1024)(_text)
""":func:`_text` of the response flags, remembered (a handful of values). The other recurring values are rendered
in segments of their own (:func:`_source_text`, :func:`_destination_text`, :func:`_route_text`); a request's path,
id and error are not remembered: they seldom repeat and would only push the others out."""

_STRING_FIELDS = (
    ("src.addr", "src_addr"),
    ("src.workload", "src_workload"),
    ("src.namespace", "src_namespace"),
    ("src.identity", "src_identity"),
    ("dst.addr", "dst_addr"),
    ("dst.hbone_addr", "dst_hbone_addr"),
    ("dst.service", "dst_service"),
    ("dst.workload", "dst_workload"),
    ("dst.namespace", "dst_namespace"),
    ("dst.identity", "dst_identity"),
    ("method", "method"),
    ("path", "path"),
    ("protocol", "protocol"),
    ("route", "route"),
    ("request_id", "request_id"),
)
"""(log key, record attribute) of the string fields :meth:`RequestRecord.fields` lists first, in its order."""
_PREFIXES = tuple(f"{key}=" for key, _ in _STRING_FIELDS)
_SOURCE = 4
"""The first fields, ``src.*``: fixed for a connection (its client's address, workload and identity)."""
_PATH = 11
"""``path``'s place: the fields between the source's and it (``dst.*`` and ``method``) recur per destination."""
_GET_SOURCE = operator.attrgetter(*(attr for _, attr in _STRING_FIELDS[:_SOURCE]))
_GET_DESTINATION = operator.attrgetter(*(attr for _, attr in _STRING_FIELDS[_SOURCE:_PATH]))


def _segment(prefixes: tuple[str, ...], values: tuple[str, ...]) -> str:
    return " ".join(prefix + _text(value) for prefix, value in zip(prefixes, values, strict=True) if value)


@functools.lru_cache(maxsize=1024)
def _source_text(values: tuple[str, str, str, str]) -> str:
    """The ``src.*`` pairs of a line, rendered once per connection (its client's ``ip:port`` is in the key) for the
    last thousand connections."""
    return _segment(_PREFIXES[:_SOURCE], values)


@functools.lru_cache(maxsize=1024)
def _destination_text(values: tuple[str, ...]) -> str:
    """The ``dst.*`` and ``method`` pairs of a line, rendered once per endpoint and method for the last thousand."""
    return _segment(_PREFIXES[_SOURCE:_PATH], values)


@functools.lru_cache(maxsize=256)
def _route_text(protocol: str, route: str) -> str:
    """The ``protocol`` and ``route`` pairs of a line."""
    return _segment(_PREFIXES[_PATH + 1 : _PATH + 3], (protocol, route))


def _format_text(message: str, record: RequestRecord) -> str:
    """``message`` and :meth:`RequestRecord.fields` as ``key=value`` pairs, in one pass (it runs per request): the
    pairs that recur (per connection, per destination, per route) are rendered once each, the path and the
    request id every time."""
    parts = [message]
    for segment in (
        _source_text(_GET_SOURCE(record)),
        _destination_text(_GET_DESTINATION(record)),
        "path=" + _text(record.path) if record.path else "",
        _route_text(record.protocol, record.route),
        "request_id=" + _text(record.request_id) if record.request_id else "",
    ):
        if segment:
            parts.append(segment)
    parts.append(
        f"response_code={record.response_code} response_flags={_recurring_text(record.response_flags)}"
        f" attempts={record.attempts} bytes_sent={record.bytes_sent} bytes_recv={record.bytes_recv}"
        f" duration={round(max(record.duration_seconds, 0.0) * 1000)}ms"
    )
    if record.error:
        parts.append("error=" + _text(record.error))
    return " ".join(parts)


def format_request_log(record: RequestRecord, *, as_json: bool = False) -> str:
    message = REQUEST_FAILED if record.response_flags != "-" or record.error else REQUEST_COMPLETE
    if as_json:
        return json.dumps({"message": message, **dict(record.fields())})
    return _format_text(message, record)


def request_flow(record: RequestRecord) -> Flow:
    """The flow-log entry of a request (``ambit flows``); ``seq`` and ``time`` are the ring's to set."""
    return Flow(
        seq=0,
        time=0.0,
        direction="waypoint",
        verdict=request_verdict(record.response_code, record.response_flags),
        mtls=bool(record.src_identity or record.dst_identity),
        src_addr=record.src_addr,
        src_workload=record.src_workload,
        src_namespace=record.src_namespace,
        src_identity=record.src_identity,
        dst_addr=record.dst_addr or record.dst_hbone_addr,
        dst_service=record.dst_service,
        dst_workload=record.dst_workload,
        dst_namespace=record.dst_namespace,
        dst_identity=record.dst_identity,
        bytes_sent=record.bytes_sent,
        bytes_recv=record.bytes_recv,
        duration_ms=round(max(record.duration_seconds, 0.0) * 1000),
        reason=record.error,
        flag=record.response_flags if record.response_flags != "-" else "",
        method=record.method,
        path=record.path,
        response_code=record.response_code,
        route=record.route,
    )


class RequestLog:
    """Writes :class:`RequestRecord` lines to the ``access`` logger, through an
    :class:`~ambit.telemetry.access_sink.AccessSink` (batched per loop iteration; :meth:`flush` when stopping)."""

    def __init__(
        self, *, as_json: bool = False, logger: logging.Logger | None = None, flows: FlowRing | None = None
    ) -> None:
        self._json = as_json
        self.sink = AccessSink(logger if logger is not None else logging.getLogger("access"))
        self.flows = flows

    def write(self, record: RequestRecord) -> None:
        if self.flows is not None:
            self.flows.add_request(record)  # its flow is made when a page is read
        failed = record.response_flags != "-" or bool(record.error)
        level = logging.WARNING if failed else logging.INFO
        sink = self.sink
        if sink.enabled(level):
            sink.emit(level, format_request_log(record, as_json=self._json))

    def flush(self) -> None:
        """Write the lines still waiting in the batch."""
        self.sink.flush()
