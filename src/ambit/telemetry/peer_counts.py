"""The counts a node proxy's worker processes report, added to the node proxy's own at each scrape.

Theory of operation: a worker (:mod:`ambit.inpod.workers`) sends :meth:`ProxyMetrics.snapshot
<ambit.telemetry.metrics.ProxyMetrics.snapshot>` as JSON now and then; the node proxy reads each report with
:func:`parse_peer_counts`, keeps the latest per worker process, and adds them to its own families when it renders.
When a worker process ends, its last report is folded into a retired total (:meth:`PeerCounts.plus`), so a counter
never goes back when a worker is started again from zero.

Rules:
1. A report is an object ``{"families": {name: [[labels...], value]...}, "durations": [[labels, counts, total]...],
   "scalars": {name: value}}``; every name must be one the node proxy knows, every label list as long as its
   family's label names, every value a non-negative integer (a histogram total a non-negative finite number, its
   counts one per bucket plus +Inf).
2. Anything else refuses the whole report (:class:`PeerCountsError`, a clear message, no traceback): the worker's
   previous report stays.
3. At most :data:`MAX_SERIES` series per report: a worker cannot make the node proxy hold more than that for it.
"""

from __future__ import annotations

import math
from collections.abc import Mapping
from dataclasses import dataclass

from ambit.errors import AmbitError

LabelValues = tuple[str, ...]

MAX_SERIES = 200_000
"""Series (family samples and histograms together) one report may carry."""


class PeerCountsError(AmbitError):
    """A worker's report is not one this node proxy can add to its own."""


@dataclass(frozen=True, slots=True)
class PeerCounts:
    """A worker's counts: family name → label values → value; DNS durations; unlabelled counters."""

    families: Mapping[str, Mapping[LabelValues, int]]
    durations: Mapping[LabelValues, tuple[tuple[int, ...], float]]
    scalars: Mapping[str, int]

    def plus(self, other: PeerCounts) -> PeerCounts:
        """Both reports' counts added."""
        families: dict[str, dict[LabelValues, int]] = {name: dict(values) for name, values in self.families.items()}
        for name, values in other.families.items():
            into = families.setdefault(name, {})
            for key, value in values.items():
                into[key] = into.get(key, 0) + value
        durations = dict(self.durations)
        for key, (counts, total) in other.durations.items():
            have = durations.get(key)
            durations[key] = (
                (counts, total)
                if have is None
                else (tuple(a + b for a, b in zip(have[0], counts, strict=True)), have[1] + total)
            )
        scalars = dict(self.scalars)
        for name, value in other.scalars.items():
            scalars[name] = scalars.get(name, 0) + value
        return PeerCounts(families, durations, scalars)


NO_COUNTS = PeerCounts({}, {}, {})


def _count(value: object, where: str) -> int:
    if type(value) is not int or value < 0:
        raise PeerCountsError(f"{where}: {value!r} is not a count")
    return value


def _labels(value: object, width: int, where: str) -> LabelValues:
    if not isinstance(value, list) or len(value) != width or not all(isinstance(v, str) for v in value):
        raise PeerCountsError(f"{where}: labels must be a list of {width} strings")
    return tuple(value)


def parse_peer_counts(
    report: object, widths: Mapping[str, int], dns_width: int, buckets: int, scalars: frozenset[str]
) -> PeerCounts:
    """A worker's report as :class:`PeerCounts`, judged by rules 1-3; ``widths`` are the known families' label
    counts, ``dns_width`` the durations' label count, ``buckets`` their bucket count with +Inf."""
    if not isinstance(report, dict) or set(report) != {"families", "durations", "scalars"}:
        raise PeerCountsError("a report is an object of families, durations and scalars")
    raw_families, raw_durations, raw_scalars = report["families"], report["durations"], report["scalars"]
    if not isinstance(raw_families, dict) or not isinstance(raw_durations, list) or not isinstance(raw_scalars, dict):
        raise PeerCountsError("families and scalars are objects, durations a list")
    series = len(raw_durations) + sum(len(v) if isinstance(v, list) else 0 for v in raw_families.values())
    if series > MAX_SERIES:
        raise PeerCountsError(f"{series} series in one report, more than {MAX_SERIES}")
    families: dict[str, dict[LabelValues, int]] = {}
    for name, samples in raw_families.items():
        width = widths.get(name)
        if width is None:
            raise PeerCountsError(f"unknown family {name!r}")
        if not isinstance(samples, list):
            raise PeerCountsError(f"{name}: samples must be a list")
        values: dict[LabelValues, int] = {}
        for sample in samples:
            if not isinstance(sample, list) or len(sample) != 2:
                raise PeerCountsError(f"{name}: a sample is [labels, value]")
            key = _labels(sample[0], width, name)
            values[key] = values.get(key, 0) + _count(sample[1], name)
        families[name] = values
    durations: dict[LabelValues, tuple[tuple[int, ...], float]] = {}
    for entry in raw_durations:
        if not isinstance(entry, list) or len(entry) != 3:
            raise PeerCountsError("durations: an entry is [labels, counts, total]")
        key = _labels(entry[0], dns_width, "durations")
        counts, total = entry[1], entry[2]
        if not isinstance(counts, list) or len(counts) != buckets:
            raise PeerCountsError(f"durations: {buckets} bucket counts expected")
        if type(total) not in (int, float) or not math.isfinite(total) or total < 0:
            raise PeerCountsError(f"durations: total {total!r} is not a duration")
        durations[key] = (tuple(_count(c, "durations") for c in counts), float(total))
    parsed_scalars: dict[str, int] = {}
    for name, value in raw_scalars.items():
        if name not in scalars:
            raise PeerCountsError(f"unknown counter {name!r}")
        parsed_scalars[name] = _count(value, name)
    return PeerCounts(families, durations, parsed_scalars)
