"""Measurements, the environment they were taken in, and their rendering as a Markdown table and JSON lines.

A :class:`Measurement` is one figure with its unit. When the same quantity was measured on a reference (a bare
server doing the least the scenario needs, or a start with an empty data directory) in the same run, the
reference value rides along and the table shows the ratio; figures are never compared across runs here.
"""

from __future__ import annotations

import json
import math
import os
import platform
import ssl
import statistics
import sys
import time
from collections.abc import Iterable, Sequence
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any, Protocol, TypeVar


def environment() -> dict[str, Any]:
    import aiohttp

    return {
        "kernel": platform.release(),
        "cpus": os.cpu_count(),
        "cpu_model": _cpu_model(),
        "python": platform.python_version(),
        "implementation": sys.implementation.name,
        "openssl": ssl.OPENSSL_VERSION,
        "aiohttp": aiohttp.__version__,
        "loadavg": os.getloadavg()[0],
    }


def _cpu_model() -> str:
    try:
        for line in Path("/proc/cpuinfo").read_text().splitlines():
            if line.startswith("model name"):
                return line.split(":", 1)[1].strip()
    except OSError:
        pass
    return platform.processor() or "unknown"


@dataclass(frozen=True, slots=True)
class Measurement:
    """One figure of one scenario."""

    scenario: str
    metric: str
    value: float
    unit: str
    reference: float | None = None
    """The same quantity measured on ``reference_name`` in this run, when there is one."""
    reference_name: str = ""
    note: str = ""

    @property
    def ratio(self) -> float | None:
        if self.reference is None or self.reference <= 0 or self.value < 0:
            return None  # a ratio to zero or across signs (latencies near zero) says nothing
        return self.value / self.reference


@dataclass
class Report:
    """Everything one run measured, in the order it was measured."""

    title: str
    profile: str
    notes: list[str] = field(default_factory=list)
    measurements: list[Measurement] = field(default_factory=list)
    started: float = field(default_factory=time.time)
    env: dict[str, Any] = field(default_factory=environment)
    """Where the figures were taken; ``loadavg_end`` is added when the run ends."""

    def add(self, measurement: Measurement) -> None:
        self.measurements.append(measurement)

    def markdown(self) -> str:
        env = self.env
        load = f"load average {env['loadavg']:.2f} at start"
        if "loadavg_end" in env:
            load += f", {env['loadavg_end']:.2f} at end"
        lines = [
            f"## {self.title} ({self.profile} profile)",
            "",
            f"{env['cpus']} CPUs ({env['cpu_model']}), Linux {env['kernel']}, Python {env['python']}, "
            f"{env['openssl']}, aiohttp {env['aiohttp']}; {load}; "
            f"{time.strftime('%Y-%m-%d %H:%M', time.gmtime(self.started))} UTC",
            "",
            "| Scenario | Metric | Value | Unit | Reference | Ratio |",
            "| --- | --- | ---: | --- | ---: | ---: |",
        ]
        for m in self.measurements:
            reference = f"{number(m.reference)} ({m.reference_name})" if m.reference is not None else ""
            ratio = f"{m.ratio:.2f}x" if m.ratio is not None else ""
            metric = f"{m.metric} ({m.note})" if m.note else m.metric
            lines.append(f"| {m.scenario} | {metric} | {number(m.value)} | {m.unit} | {reference} | {ratio} |")
        if self.notes:
            lines.append("")
            lines.extend(f"- {note}" for note in self.notes)
        return "\n".join(lines) + "\n"

    def json_lines(self) -> str:
        rows = []
        for m in self.measurements:
            row: dict[str, Any] = asdict(m)
            row["ratio"] = m.ratio
            row["profile"] = self.profile
            row["time"] = self.started
            row["env"] = self.env
            rows.append(json.dumps(row, sort_keys=True))
        return "\n".join(rows) + "\n"

    def write(self, directory: Path, stem: str) -> tuple[Path, Path]:
        directory.mkdir(parents=True, exist_ok=True)
        md, js = directory / f"{stem}.md", directory / f"{stem}.json"
        md.write_text(self.markdown())
        js.write_text(self.json_lines())
        return md, js


def percentile(values: Sequence[float], q: float) -> float:
    """The ``q``-th percentile (0 to 100) by linear interpolation; the values need not be sorted."""
    if not values:
        return float("nan")
    ordered = sorted(values)
    if len(ordered) == 1:
        return ordered[0]
    pos = (len(ordered) - 1) * q / 100
    low = int(pos)
    high = min(low + 1, len(ordered) - 1)
    return ordered[low] + (ordered[high] - ordered[low]) * (pos - low)


def median(values: Sequence[float]) -> float:
    return statistics.median(values) if values else float("nan")


def number(value: float | None) -> str:
    """A table cell: thousands grouped, three significant figures or so below that; blank for None."""
    if value is None:
        return ""
    if math.isnan(value):
        return "n/a"
    magnitude = abs(value)
    if magnitude >= 1000:
        return f"{value:,.0f}"
    if magnitude >= 100:
        return f"{value:.0f}"
    if magnitude >= 10:
        return f"{value:.1f}"
    if magnitude >= 1 or magnitude == 0:
        return f"{value:.2f}"
    return f"{value:.3g}"


def times(value: float | None) -> str:
    """A ratio cell (``1.25×``); blank for None."""  # noqa: RUF002
    return f"{value:.2f}×" if value is not None else ""  # noqa: RUF001


def ratio(value: float, reference: float | None) -> float | None:
    """``value`` over ``reference`` of the same run; None when there is no reference, it is zero, or ``value`` is
    negative (a figure that was not taken)."""
    if reference is None or reference <= 0 or value < 0:
        return None
    return value / reference


class Keyed(Protocol):
    scenario: str
    metric: str
    mode: str
    value: float


S = TypeVar("S", bound=Keyed)
GroupKey = tuple[str, str, str]
"""(scenario, metric, mode)."""


def group_samples(samples: Iterable[S]) -> tuple[dict[GroupKey, list[S]], dict[GroupKey, float]]:
    """The repeats of each (scenario, metric, mode) in the order first seen, and each group's median: the lab
    benchmarks' rows (bench.mesh, bench.l7) are built from these, with ratios to other modes' medians."""
    groups: dict[GroupKey, list[S]] = {}
    for s in samples:
        groups.setdefault((s.scenario, s.metric, s.mode), []).append(s)
    medians = {key: statistics.median(s.value for s in group) for key, group in groups.items()}
    return groups, medians


def rows_as_json_lines(rows: Sequence[Any], env: dict[str, Any], profile: str) -> str:
    """One JSON object per table row (a dataclass with a ``samples`` sequence), each carrying the profile and the
    environment: the ``.json`` beside a benchmark's ``.md`` (bench.mesh, bench.l7)."""
    out = []
    for r in rows:
        obj = asdict(r)
        obj["samples"] = list(r.samples)
        obj["profile"] = profile
        obj["env"] = env
        out.append(json.dumps(obj, sort_keys=True, ensure_ascii=False))
    return "\n".join(out) + "\n"
