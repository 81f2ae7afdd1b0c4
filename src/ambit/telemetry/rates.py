"""Edge rates for the topology page, from the proxies' own Istio metrics (the series Prometheus and Kiali read).

Theory of operation
-------------------
The dashboard scrapes each proxy's ``/metrics`` (the node proxies' and the waypoints' :15020) and hands the body
to :func:`read_scrape`, which keeps the counters an edge is made of:

- ``istio_tcp_sent_bytes_total`` and ``istio_tcp_received_bytes_total`` (bytes/s),
- ``istio_tcp_connections_opened_total`` (connections/s),
- ``istio_requests_total`` (requests/s, and the share of them answered 5xx).

A :class:`RateBook` is told each successful scrape of a target (:meth:`RateBook.observe`, with ``now``) and keeps,
for each interval between two scrapes of that target, how much each edge's counters grew. :meth:`RateBook.rates`
turns the intervals that ended in the last ``window`` seconds into per-second rates. No I/O and no clock here.
Rules:

1. A series is a sample name and its label set. Its increase over an interval is ``current - previous``, or
   ``current`` when the counter went down (a reset: the proxy restarted), as Prometheus's ``rate`` counts it. A
   series absent from the target's previous scrape grew from zero (the target answered without it); a target's
   first scrape only sets the baseline. Non-finite and negative values are ignored.
2. An edge is (source, destination) with the topology's node ids: ``wl:<source_workload_namespace>/
   <source_workload>``; ``wl:<destination_workload_namespace>/<destination_workload>``, else
   ``svc:<destination_service>``. A series without a known source or destination (``unknown``) belongs to no
   edge (it is counted in ``unattributed``).
3. Both ends of a meshed connection report it. Per edge and measure one reporter is used, as Kiali does:
   ``destination`` for TCP, then ``source``; ``waypoint`` for requests, then ``destination``, then ``source``.
   Rates from several targets with that reporter (a workload's pods on two nodes) add up.
4. A target's rate is its increase over the span of its intervals in the window (from the first one's start to
   the last one's end), so a missed scrape spreads its increase instead of losing it. Edges seen in a target's
   latest scrape are listed even at rate zero (traffic that stopped shows 0, not nothing).
5. ``mtls`` is true when every series of the edge in the latest scrapes says ``connection_security_policy=
   mutual_tls``; an edge with both says ``mixed``.
6. Bounded: a scrape keeps at most :data:`MAX_SERIES` samples (a body with more is refused, not cut); the book
   keeps intervals of the last :data:`MAX_WINDOW` seconds and at most :data:`MAX_KEPT` edge increments in all,
   dropping the oldest intervals first.
"""

from __future__ import annotations

import collections
import math
from collections.abc import Iterable, Mapping
from dataclasses import dataclass, field
from typing import Any

from prometheus_client.parser import text_string_to_metric_families

from ambit.errors import AmbitError

MAX_SERIES = 100_000
"""Most samples (of any name) a scrape may hold."""
MAX_WINDOW = 3600.0
MAX_KEPT = 1_000_000
"""Most intervals plus (interval, edge, measure) increments a book keeps."""
UNKNOWN = "unknown"

BYTES, CONNECTIONS, REQUESTS, ERRORS = "bytes", "connections", "requests", "errors"
_MEASURES = {
    "istio_tcp_sent_bytes_total": BYTES,
    "istio_tcp_received_bytes_total": BYTES,
    "istio_tcp_connections_opened_total": CONNECTIONS,
    "istio_requests_total": REQUESTS,
}
_PREFERENCE = {
    BYTES: ("destination", "source"),
    CONNECTIONS: ("destination", "source"),
    REQUESTS: ("waypoint", "destination", "source"),
    ERRORS: ("waypoint", "destination", "source"),
}

SeriesId = tuple[str, tuple[tuple[str, str], ...]]
"""A sample name and its labels, sorted."""
Edge = tuple[str, str]
_Part = tuple[Edge, str, str]
"""(edge, measure, reporter): what an increase counts towards."""


class ScrapeError(AmbitError):
    """A metrics body that cannot be read: not UTF-8, not Prometheus text, or too many series."""


def read_scrape(body: bytes, *, max_series: int = MAX_SERIES) -> dict[SeriesId, float]:
    """Rule 6: the edge counters of a Prometheus text body (other samples are counted and dropped)."""
    try:
        text = body.decode("utf-8")
    except UnicodeDecodeError as exc:
        raise ScrapeError(f"metrics are not UTF-8 (byte {exc.start})") from None
    kept: dict[SeriesId, float] = {}
    seen = 0
    try:
        for family in text_string_to_metric_families(text):
            for sample in family.samples:
                seen += 1
                if seen > max_series:
                    raise ScrapeError(f"more than {max_series} series")
                if sample.name in _MEASURES:
                    value = float(sample.value)
                    if math.isfinite(value) and value >= 0:
                        kept[(sample.name, tuple(sorted(sample.labels.items())))] = value
    except (ValueError, TypeError, IndexError, KeyError) as exc:
        raise ScrapeError(f"not Prometheus text: {str(exc)[:200]}") from None
    return kept


def edge_of(labels: Mapping[str, str]) -> Edge | None:
    """Rule 2: the edge a series counts on, or None."""

    def known(name: str) -> str:
        value = labels.get(name, "")
        return "" if value == UNKNOWN else value

    src_ns, src = known("source_workload_namespace"), known("source_workload")
    if not (src_ns and src):
        return None
    dst_ns, dst = known("destination_workload_namespace"), known("destination_workload")
    if dst_ns and dst:
        return f"wl:{src_ns}/{src}", f"wl:{dst_ns}/{dst}"
    service = known("destination_service")
    return (f"wl:{src_ns}/{src}", f"svc:{service}") if service else None


@dataclass(frozen=True, slots=True)
class _Classified:
    part: _Part
    mtls: bool
    error: bool


def _classify(series: SeriesId) -> _Classified | None:
    name, pairs = series
    labels = dict(pairs)
    edge = edge_of(labels)
    if edge is None:
        return None
    code = labels.get("response_code", "")
    error = _MEASURES[name] == REQUESTS and len(code) == 3 and code.startswith("5")
    mtls = labels.get("connection_security_policy") == "mutual_tls"
    return _Classified((edge, _MEASURES[name], labels.get("reporter", UNKNOWN)), mtls, error)


@dataclass(frozen=True, slots=True)
class EdgeRate:
    src: str
    dst: str
    requests: float
    """Requests per second."""
    errors: float
    """Requests per second answered 5xx."""
    bytes: float
    """Bytes per second, both directions."""
    connections: float
    """Connections opened per second."""
    security: str
    """``mutual_tls``, ``none`` or ``mixed`` (rule 5)."""

    @property
    def error_ratio(self) -> float:
        return self.errors / self.requests if self.requests > 0 else 0.0

    def to_json(self) -> dict[str, Any]:
        return {
            "src": self.src,
            "dst": self.dst,
            "requestsPerSecond": self.requests,
            "errorRatio": self.error_ratio,
            "bytesPerSecond": self.bytes,
            "connectionsPerSecond": self.connections,
            "mtls": self.security == "mutual_tls",
            "security": self.security,
        }


@dataclass(slots=True)
class _Interval:
    target: str
    start: float
    end: float
    growth: dict[_Part, float]


@dataclass(slots=True)
class _Target:
    at: float
    series: dict[SeriesId, float]
    parts: dict[_Part, set[bool]]
    """Each (edge, measure, reporter) of the latest scrape, with the mTLS values its series had."""


@dataclass(slots=True)
class RateBook:
    """Rules 1, 4 and 6: each target's latest scrape and the growth of its edges' counters between scrapes."""

    max_kept: int = MAX_KEPT
    targets: dict[str, _Target] = field(default_factory=dict)
    intervals: collections.deque[_Interval] = field(default_factory=collections.deque)
    kept: int = 0
    unattributed: int = 0

    def observe(self, target: str, now: float, series: Mapping[SeriesId, float]) -> None:
        before = self.targets.get(target)
        growth: dict[_Part, float] = {}
        parts: dict[_Part, set[bool]] = {}
        unattributed = 0
        for key, value in series.items():
            found = _classify(key)
            if found is None:
                unattributed += 1
                continue
            parts.setdefault(found.part, set()).add(found.mtls)
            if found.error:
                parts.setdefault((found.part[0], ERRORS, found.part[2]), set()).add(found.mtls)
            if before is None or now <= before.at:
                continue
            previous = before.series.get(key, 0.0)
            increase = value - previous if value >= previous else value
            if increase > 0:
                growth[found.part] = growth.get(found.part, 0.0) + increase
                if found.error:
                    errors = (found.part[0], ERRORS, found.part[2])
                    growth[errors] = growth.get(errors, 0.0) + increase
        self.unattributed = unattributed
        self.targets[target] = _Target(now, dict(series), parts)
        if before is not None and now > before.at:
            self.intervals.append(_Interval(target, before.at, now, growth))
            self.kept += 1 + len(growth)
        self._trim(now)

    def forget(self, target: str) -> None:
        """A target that went away: its latest scrape no longer lists edges (its intervals age out)."""
        self.targets.pop(target, None)

    def _trim(self, now: float) -> None:
        while self.intervals and (self.kept > self.max_kept or self.intervals[0].end < now - MAX_WINDOW):
            self.kept -= 1 + len(self.intervals.popleft().growth)

    def rates(self, now: float, window: float) -> list[EdgeRate]:
        """Rules 3 to 5: each edge's rates over the intervals that ended in ``(now - window, now]``."""
        since = now - window
        spans: dict[str, tuple[float, float]] = {}
        growth: dict[str, dict[_Part, float]] = {}
        for interval in self.intervals:
            if not since < interval.end <= now:
                continue
            start, end = spans.get(interval.target, (interval.start, interval.end))
            spans[interval.target] = (min(start, interval.start), max(end, interval.end))
            mine = growth.setdefault(interval.target, {})
            for part, amount in interval.growth.items():
                mine[part] = mine.get(part, 0.0) + amount
        per_part: dict[_Part, float] = {}
        for target, mine in growth.items():
            start, end = spans[target]
            for part, amount in mine.items():
                per_part[part] = per_part.get(part, 0.0) + amount / (end - start)
        security: dict[Edge, set[bool]] = {}
        for state in self.targets.values():
            for part, values in state.parts.items():
                per_part.setdefault(part, 0.0)
                security.setdefault(part[0], set()).update(values)
        return _choose(per_part, security)


def _choose(per_part: Mapping[_Part, float], security: Mapping[Edge, set[bool]]) -> list[EdgeRate]:
    by_edge: dict[Edge, dict[tuple[str, str], float]] = {}
    for (edge, measure, reporter), rate in per_part.items():
        by_edge.setdefault(edge, {})[(measure, reporter)] = rate
    out = []
    for edge in sorted(by_edge):
        rates = by_edge[edge]
        chosen: dict[str, float] = {}
        for measure, order in _PREFERENCE.items():
            counted = REQUESTS if measure == ERRORS else measure  # the errors of the reporter whose requests count
            reporter = next((r for r in order if (counted, r) in rates), "")
            chosen[measure] = rates.get((measure, reporter), 0.0)
        values = security.get(edge, set())
        shown = "mixed" if len(values) > 1 else ("mutual_tls" if values == {True} else "none")
        out.append(EdgeRate(*edge, chosen[REQUESTS], chosen[ERRORS], chosen[BYTES], chosen[CONNECTIONS], shown))
    return out


def rates_by_edge(rates: Iterable[EdgeRate]) -> dict[Edge, EdgeRate]:
    return {(r.src, r.dst): r for r in rates}


__all__ = [
    "MAX_SERIES",
    "MAX_WINDOW",
    "EdgeRate",
    "RateBook",
    "ScrapeError",
    "SeriesId",
    "edge_of",
    "rates_by_edge",
    "read_scrape",
]
