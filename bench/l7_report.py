"""The L7 benchmark's figures: samples of one run, their rows (median, range, ratios), the goals, and the Markdown
and JSON-lines output (bench/results/l7.md, l7.json).

Rules:

1. A :class:`Sample` is one round of one (scenario, metric, mode); a row is the median of its rounds with their
   range. Rows are ordered by scenario, then by metric as first measured in that scenario, then by mode in
   :data:`MODE_ORDER`.
2. Every row carries its ratio to ``direct`` and to the C peer (the ``haproxy-*`` mode) of the same scenario and
   metric in the same run (:func:`aggregate`); none when that mode was not measured, has no such figure, or is
   zero. Latency rows (unit µs) also carry what they add over ``direct``.
3. "The p99 the waypoint adds" (:func:`added_p99`) is the waypoint path's p99 minus the L4 mesh path's (the path
   beneath it); haproxy's is ``haproxy-http``'s p99 minus ``direct``'s, from the same scenario's medians.
4. A goal is met or missed by the figure measured at the fixed rate (:func:`verdicts`), never by an extrapolation
   from the closed-loop runs.
"""

# ruff: noqa: RUF001, RUF003 - the tables use × and en dashes on purpose

from __future__ import annotations

from collections.abc import Iterable, Sequence
from dataclasses import dataclass
from typing import Any

from bench.report import group_samples, number, ratio, rows_as_json_lines, times

DIRECT, L4, WAYPOINT, HAPROXY_HTTP = "direct", "l4", "waypoint", "haproxy-http"
GATEWAY, HAPROXY_INGRESS = "gateway", "haproxy-ingress"
MODE_ORDER = (DIRECT, L4, WAYPOINT, HAPROXY_HTTP, GATEWAY, HAPROXY_INGRESS)
PEERS = (HAPROXY_HTTP, HAPROXY_INGRESS)

GOAL_CPU_VCPU = 0.25
"""Waypoint CPU per 1,000 requests/s (vCPU): Istio's published figure for its Envoy waypoint."""
GOAL_RSS_MB = 60.0
"""Waypoint memory at that rate, MB (10^6 bytes)."""

P50, P99 = "p50", "p99"
RATE = "requests/s"
L7_CPU = "L7 proxy CPU per 1,000 req/s"
"""The waypoint's (mode ``waypoint``), both haproxy processes' (``haproxy-http``), the gateway's, or the host-side
haproxy's (``haproxy-ingress``) CPU over the run, per 1,000 requests/s of it, in vCPU."""
L7_RSS = "L7 proxy RSS (peak)"


@dataclass(frozen=True, slots=True)
class Sample:
    scenario: str
    metric: str
    mode: str
    value: float
    unit: str


@dataclass(frozen=True, slots=True)
class Row:
    scenario: str
    metric: str
    mode: str
    value: float
    min: float
    max: float
    unit: str
    samples: tuple[float, ...]
    x_direct: float | None
    x_peer: float | None
    peer: str
    added_over_direct: float | None


def aggregate(samples: Iterable[Sample]) -> list[Row]:
    """Rules 1 and 2."""
    groups, medians = group_samples(samples)
    rows = []
    for (scenario, metric, mode), group in groups.items():
        value = medians[(scenario, metric, mode)]
        direct = medians.get((scenario, metric, DIRECT))
        peer = next((p for p in PEERS if (scenario, metric, p) in medians), "")
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
                ratio(value, direct) if mode != DIRECT else None,
                ratio(value, medians.get((scenario, metric, peer))) if peer and mode != peer else None,
                peer,
                value - direct if unit == "µs" and direct is not None and mode != DIRECT else None,
            )
        )
    order = {mode: i for i, mode in enumerate(MODE_ORDER)}
    scenarios = list(dict.fromkeys(r.scenario for r in rows))
    metrics = list(dict.fromkeys((r.scenario, r.metric) for r in rows))
    rows.sort(key=lambda r: (scenarios.index(r.scenario), metrics.index((r.scenario, r.metric)), order.get(r.mode, 99)))
    return rows


def _find(rows: Sequence[Row], scenario: str, metric: str, mode: str) -> float | None:
    return next((r.value for r in rows if (r.scenario, r.metric, r.mode) == (scenario, metric, mode)), None)


def added_p99(rows: Sequence[Row], scenario: str) -> tuple[float | None, float | None]:
    """Rule 3: (what the waypoint adds over l4, what haproxy-http adds over direct) to the p99, in µs."""
    waypoint, l4 = _find(rows, scenario, P99, WAYPOINT), _find(rows, scenario, P99, L4)
    haproxy, direct = _find(rows, scenario, P99, HAPROXY_HTTP), _find(rows, scenario, P99, DIRECT)
    return (
        waypoint - l4 if waypoint is not None and l4 is not None else None,
        haproxy - direct if haproxy is not None and direct is not None else None,
    )


def verdicts(rows: Sequence[Row], fixed_rate_scenarios: Sequence[str]) -> list[str]:
    """Rule 4: a line per goal and fixed-rate scenario (met / missed with the figure), and the p99 added."""
    lines = []
    for scenario in fixed_rate_scenarios:
        cpu = _find(rows, scenario, L7_CPU, WAYPOINT)
        rss = _find(rows, scenario, L7_RSS, WAYPOINT)
        rate = _find(rows, scenario, RATE, WAYPOINT)
        at = f" at {rate:,.0f} req/s" if rate is not None else ""
        if cpu is None:
            lines.append(f"Goal: waypoint CPU per 1,000 req/s ≤ {GOAL_CPU_VCPU} vCPU ({scenario}): not measured.")
        else:
            met = "met" if cpu <= GOAL_CPU_VCPU else "missed"
            lines.append(
                f"Goal: waypoint CPU per 1,000 req/s ≤ {GOAL_CPU_VCPU} vCPU ({scenario}): {met}, {cpu:.3f} vCPU{at}."
            )
        if rss is None:
            lines.append(f"Goal: waypoint memory ≤ {GOAL_RSS_MB:.0f} MB at that rate ({scenario}): not measured.")
        else:
            megabytes = rss * 2**20 / 1e6
            met = "met" if megabytes <= GOAL_RSS_MB else "missed"
            lines.append(
                f"Goal: waypoint memory ≤ {GOAL_RSS_MB:.0f} MB at that rate ({scenario}): {met}, "
                f"{megabytes:.1f} MB ({rss:.1f} MiB) peak RSS{at}."
            )
        waypoint, haproxy = added_p99(rows, scenario)
        lines.append(
            f"p99 added ({scenario}): the waypoint {_us(waypoint)} over the L4 mesh path; "
            f"haproxy-http {_us(haproxy)} over direct."
        )
    return lines


def _us(value: float | None) -> str:
    return f"{value:+,.0f} µs" if value is not None else "n/a"


def markdown(rows: Sequence[Row], env: dict[str, Any], profile: str, notes: Sequence[str]) -> str:
    load = f"load average {env['loadavg']:.2f} at start"
    if "loadavg_end" in env:
        load += f", {env['loadavg_end']:.2f} at end"
    lines = [
        f"# Ambit L7: waypoint and ingress paths ({profile} profile)",
        "",
        f"{env['vcpus']} vCPUs ({env['cpu_model']}), Linux {env['kernel']}, Python {env['python']}, "
        f"{env['openssl']}, {env['h2load']}, {env['haproxy']}; {load}; {env['time']}",
    ]
    for scenario in dict.fromkeys(r.scenario for r in rows):
        lines += [
            "",
            f"## {scenario}",
            "",
            "| Metric | Mode | Median | Min–max | Unit | ×direct | +direct | ×haproxy |",
            "| --- | --- | ---: | ---: | --- | ---: | ---: | ---: |",
        ]
        for r in (r for r in rows if r.scenario == scenario):
            lines.append(
                f"| {r.metric} | {r.mode} | {number(r.value)} | {number(r.min)}–{number(r.max)} | {r.unit} | "
                f"{times(r.x_direct)} | {number(r.added_over_direct)} | {times(r.x_peer)} |"
            )
    if notes:
        lines.append("")
        lines.extend(f"- {note}" for note in notes)
    return "\n".join(lines) + "\n"


def json_lines(rows: Sequence[Row], env: dict[str, Any], profile: str) -> str:
    """One object per row, each carrying the profile and the environment."""
    return rows_as_json_lines(rows, env, profile)
