"""Readings: iperf3's JSON, sockperf's text, and ``/proc`` (CPU seconds, resident memory) of proxy processes.

The parsers are pure (text in, numbers out) and raise :class:`ProbeError` on output they do not recognise, so a
tool that failed (its error text instead of a report) ends the run with one clear line rather than a KeyError.
"""

from __future__ import annotations

import json
import os
import re
from collections.abc import Iterable
from dataclasses import dataclass
from pathlib import Path

from ambit.errors import AmbitError

_CLOCK_TICKS = os.sysconf("SC_CLK_TCK")
_PAGE = os.sysconf("SC_PAGE_SIZE")


class ProbeError(AmbitError):
    """A tool's output, or a process's ``/proc`` entry, was not what the benchmark reads."""


class ProbeTimeout(ProbeError):
    """A client did not finish within its bound: the message names the mode's route and what its sockets held."""


@dataclass(frozen=True, slots=True)
class Bulk:
    bits_per_second: float
    bytes: int


def parse_iperf3(text: str) -> Bulk:
    """The receiver's figures from ``iperf3 -J`` (what arrived, not what was sent into socket buffers)."""
    try:
        report = json.loads(text)
    except ValueError:
        raise ProbeError(f"iperf3 printed no JSON: {text[:200]!r}") from None
    if not isinstance(report, dict):
        raise ProbeError("iperf3 JSON is not an object")
    if report.get("error"):
        raise ProbeError(f"iperf3: {report['error']}")
    received = (report.get("end") or {}).get("sum_received")
    if not isinstance(received, dict):
        raise ProbeError("iperf3 JSON has no end.sum_received")
    try:
        return Bulk(float(received["bits_per_second"]), int(received["bytes"]))
    except (KeyError, TypeError, ValueError):
        raise ProbeError("iperf3 end.sum_received lacks bits_per_second or bytes") from None


@dataclass(frozen=True, slots=True)
class Latency:
    p50: float
    p90: float
    p99: float
    """Microseconds, full round trip."""
    messages: int
    """Replies received over the whole run (warm-up included), for CPU per round trip."""


_PERCENTILE = re.compile(r"percentile\s+(\d+\.\d+)\s*=\s*([\d.]+)")
_TOTAL = re.compile(r"\[Total Run\].*?ReceivedMessages=(\d+)")


def parse_sockperf(text: str) -> Latency:
    """Percentiles (µs) and the reply count from ``sockperf ping-pong`` or ``under-load`` with ``--full-rtt``."""
    found = {float(q): float(v) for q, v in _PERCENTILE.findall(text)}
    total = _TOTAL.search(text)
    if total is None or not {50.0, 90.0, 99.0} <= found.keys():
        tail = text.strip().splitlines()[-3:]
        raise ProbeError(f"sockperf printed no percentiles: {tail}")
    return Latency(found[50.0], found[90.0], found[99.0], int(total.group(1)))


# -- /proc ----------------------------------------------------------------------------------------------------------
def cpu_seconds(pids: Iterable[int]) -> float:
    """User + system CPU seconds of the processes (all their threads), summed."""
    total = 0.0
    for pid in pids:
        try:
            fields = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()
        except (OSError, IndexError):
            raise ProbeError(f"process {pid} is gone") from None
        total += (int(fields[11]) + int(fields[12])) / _CLOCK_TICKS
    return total


def rss_bytes(pids: Iterable[int]) -> int:
    """Resident memory of the processes, summed."""
    total = 0
    for pid in pids:
        try:
            total += int(Path(f"/proc/{pid}/statm").read_text().split()[1]) * _PAGE
        except (OSError, IndexError, ValueError):
            raise ProbeError(f"process {pid} is gone") from None
    return total


def peak_rss_bytes(pids: Iterable[int]) -> int:
    """The high-water mark of resident memory (``VmHWM``) of the processes, summed."""
    total = 0
    for pid in pids:
        try:
            status = Path(f"/proc/{pid}/status").read_text()
        except OSError:
            raise ProbeError(f"process {pid} is gone") from None
        match = re.search(r"^VmHWM:\s+(\d+) kB", status, re.MULTILINE)
        total += int(match.group(1)) * 1024 if match else 0
    return total


def with_descendants(pids: Iterable[int]) -> list[int]:
    """``pids`` and every process below them (a node proxy's workers, ``--workers``), as they are now."""
    found: list[int] = []
    todo = list(pids)
    while todo:
        pid = todo.pop()
        if pid in found:
            continue
        found.append(pid)
        for task in Path(f"/proc/{pid}/task").glob("*/children"):
            try:
                todo += [int(child) for child in task.read_text().split()]
            except OSError:
                continue
    return sorted(found)


def find_pids(*needles: str) -> list[int]:
    """Processes whose command line holds every one of ``needles``."""
    wanted = [n.encode() for n in needles]
    pids = []
    for entry in Path("/proc").iterdir():
        if not entry.name.isdigit():
            continue
        try:
            args = (entry / "cmdline").read_bytes()
        except OSError:
            continue
        if all(w in args for w in wanted):
            pids.append(int(entry.name))
    return sorted(pids)
