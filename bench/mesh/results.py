"""Samples of one run, their aggregation per (scenario, metric, mode), and the Markdown and JSON-lines output.

A :class:`Sample` is one repeat of one measurement. :func:`aggregate` groups the repeats and takes the median,
the range, and the ratios to ``direct`` and to ``stunnel`` of the same scenario and metric in the same run
(``x_direct``, ``x_stunnel``; ``None`` when that mode was not measured or is zero). For latencies the table also
shows the latency added over ``direct``, the figure the targets speak of.
"""

# ruff: noqa: RUF001, RUF003 - the tables use × and en dashes on purpose

from __future__ import annotations

import statistics
from collections.abc import Iterable, Sequence
from dataclasses import dataclass
from typing import Any

from bench.mesh.profile import DIRECT, MODES, STUNNEL
from bench.report import group_samples, number, ratio, rows_as_json_lines, times


@dataclass(frozen=True, slots=True)
class Sample:
    scenario: str
    metric: str
    mode: str
    value: float
    unit: str
    cpu: float | None = None
    """Proxy CPU per unit of work (``cpu_unit``), when the mode has a proxy."""
    cpu_unit: str = ""


@dataclass(frozen=True, slots=True)
class Row:
    scenario: str
    metric: str
    mode: str
    value: float
    """The median of the repeats."""
    min: float
    max: float
    unit: str
    samples: tuple[float, ...]
    x_direct: float | None
    x_stunnel: float | None
    added_over_direct: float | None
    cpu: float | None
    cpu_unit: str


def aggregate(samples: Iterable[Sample]) -> list[Row]:
    groups, medians = group_samples(samples)
    rows = []
    for (scenario, metric, mode), group in groups.items():
        value = medians[(scenario, metric, mode)]
        direct = medians.get((scenario, metric, DIRECT))
        stunnel = medians.get((scenario, metric, STUNNEL))
        cpus = [s.cpu for s in group if s.cpu is not None]
        values = [s.value for s in group]
        unit = group[0].unit
        rows.append(
            Row(
                scenario,
                metric,
                mode,
                value,
                min(values),
                max(values),
                unit,
                tuple(values),
                ratio(value, direct),
                ratio(value, stunnel),
                value - direct if unit == "µs" and direct is not None else None,
                statistics.median(cpus) if cpus else None,
                group[0].cpu_unit,
            )
        )
    order = {mode: i for i, mode in enumerate(MODES)}
    scenarios = list(dict.fromkeys(r.scenario for r in rows))
    metrics = list(dict.fromkeys(r.metric for r in rows))
    rows.sort(key=lambda r: (scenarios.index(r.scenario), metrics.index(r.metric), order.get(r.mode, 99)))
    return rows


def markdown(rows: Sequence[Row], env: dict[str, Any], profile: str, notes: Sequence[str]) -> str:
    lines = [
        f"# Ambit data path ({profile} profile)",
        "",
        f"{env['vcpus']} vCPUs ({env['cpu_model']}), Linux {env['kernel']}, Python {env['python']}, "
        f"{env['openssl']}, HTTP/2 {env['http2']}, uvloop {env['uvloop']}; cipher: {env['cipher']}; "
        f"load average {env['loadavg']:.2f} at start; idle vCPUs: {env.get('cpuidle', 'unknown')}; "
        f"TCP congestion control: {env.get('tcp_congestion', 'unknown')}; {env['time']}",
    ]
    for scenario in dict.fromkeys(r.scenario for r in rows):
        lines += [
            "",
            f"## {scenario}",
            "",
            "| Metric | Mode | Median | Min–max | Unit | ×direct | +direct | ×stunnel | Proxy CPU |",
            "| --- | --- | ---: | ---: | --- | ---: | ---: | ---: | ---: |",
        ]
        for r in (r for r in rows if r.scenario == scenario):
            cpu = f"{number(r.cpu)} {r.cpu_unit}" if r.cpu is not None else ""
            lines.append(
                f"| {r.metric} | {r.mode} | {number(r.value)} | {number(r.min)}–{number(r.max)} | {r.unit} | "
                f"{times(r.x_direct)} | {number(r.added_over_direct)} | {times(r.x_stunnel)} | {cpu} |"
            )
    if notes:
        lines.append("")
        lines.extend(f"- {note}" for note in notes)
    return "\n".join(lines) + "\n"


def json_lines(rows: Sequence[Row], env: dict[str, Any], profile: str) -> str:
    """One object per measurement (a row of the tables), each carrying the profile and the environment."""
    return rows_as_json_lines(rows, env, profile)
