"""Running dnsperf (C, Debian's ``dnsperf`` 2.10) and reading what it prints.

Theory of operation: :func:`dnsperf_argv` builds the command line of one run; :func:`parse_summary` reads the
statistics block every run ends with, and :func:`parse_latencies` reads the per-response lines of a verbose run
(``-v``: ``> RCODE NAME TYPE SECONDS``), from which the benchmark takes percentiles (dnsperf 2.10 prints no
latency histogram of its own). Both readers are pure and raise :class:`DnsperfError` with the line that was
expected when the text is not dnsperf's, never anything else.
"""

from __future__ import annotations

import re
from collections import Counter
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path

from ambit.errors import AmbitError


class DnsperfError(AmbitError):
    """dnsperf did not run or printed something the benchmark cannot read."""


@dataclass(frozen=True, slots=True)
class Summary:
    """dnsperf's statistics block."""

    sent: int
    completed: int
    lost: int
    rcodes: dict[str, int]
    run_time: float
    """Seconds."""

    @property
    def answered_per_second(self) -> float:
        """NOERROR answers per second: SERVFAILs from an overloaded proxy must not count as work done."""
        return self.rcodes.get("NOERROR", 0) / self.run_time if self.run_time > 0 else 0.0

    @property
    def failed(self) -> int:
        """Queries sent that did not come back NOERROR (lost, or another response code)."""
        return self.sent - self.rcodes.get("NOERROR", 0)


@dataclass(frozen=True, slots=True)
class Latencies:
    """A verbose run's responses: each latency in seconds, the response codes, and the queries that timed out."""

    seconds: tuple[float, ...]
    rcodes: dict[str, int]
    timeouts: int


def dnsperf_argv(
    server: str,
    port: int,
    queries: Path,
    seconds: float,
    *,
    clients: int = 1,
    outstanding: int = 100,
    max_qps: int | None = None,
    verbose: bool = False,
    timeout: float = 1.0,
) -> list[str]:
    """One dnsperf run over UDP; ``max_qps`` None is as fast as the server answers (``outstanding`` in flight)."""
    argv = ["dnsperf", "-s", server, "-p", str(port), "-d", str(queries), "-l", f"{seconds:g}"]
    argv += ["-c", str(clients), "-q", str(outstanding), "-t", f"{timeout:g}"]
    if max_qps is not None:
        argv += ["-Q", str(max_qps)]
    if verbose:
        argv.append("-v")
    return argv


_FIELDS = {
    "sent": re.compile(r"^\s*Queries sent:\s+(\d+)\s*$", re.MULTILINE),
    "completed": re.compile(r"^\s*Queries completed:\s+(\d+)\b", re.MULTILINE),
    "lost": re.compile(r"^\s*Queries lost:\s+(\d+)\b", re.MULTILINE),
    "run_time": re.compile(r"^\s*Run time \(s\):\s+([0-9.]+)\s*$", re.MULTILINE),
}
_RCODES_LINE = re.compile(r"^\s*Response codes:(.*)$", re.MULTILINE)
_RCODE = re.compile(r"([A-Z]+)\s+(\d+)\s+\([0-9.]+%\)")
_RESPONSE = re.compile(r"^> ([A-Z]+) \S+ \S+ ([0-9]+\.[0-9]+)$")
_TIMEOUT = re.compile(r"^\[Timeout\] Query timed out")


def parse_summary(text: str) -> Summary:
    """The statistics block of dnsperf's output; :class:`DnsperfError` when one of its lines is missing."""
    values: dict[str, str] = {}
    for name, pattern in _FIELDS.items():
        found = pattern.search(text)
        if found is None:
            raise DnsperfError(f"dnsperf printed no {name.replace('_', ' ')!r} line: {_tail(text)}")
        values[name] = found.group(1)
    line = _RCODES_LINE.search(text)
    if line is None:
        raise DnsperfError(f"dnsperf printed no 'Response codes' line: {_tail(text)}")
    rcodes = {code: int(count) for code, count in _RCODE.findall(line.group(1))}
    try:
        run_time = float(values["run_time"])
    except ValueError:
        raise DnsperfError(f"dnsperf's run time is not a number: {values['run_time']!r}") from None
    return Summary(int(values["sent"]), int(values["completed"]), int(values["lost"]), rcodes, run_time)


def parse_latencies(lines: Sequence[str]) -> Latencies:
    """Every ``> RCODE NAME TYPE SECONDS`` and timeout line of a verbose run; other lines are skipped."""
    seconds: list[float] = []
    rcodes: Counter[str] = Counter()
    timeouts = 0
    for line in lines:
        found = _RESPONSE.match(line.rstrip("\n"))
        if found is not None:
            rcodes[found.group(1)] += 1
            seconds.append(float(found.group(2)))
        elif _TIMEOUT.match(line):
            timeouts += 1
    return Latencies(tuple(seconds), dict(rcodes), timeouts)


def _tail(text: str) -> str:
    lines = [line for line in text.strip().splitlines() if line.strip()]
    return " / ".join(lines[-3:]) if lines else "(nothing)"
