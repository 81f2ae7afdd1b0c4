"""What a fault did to the load, from the load's records (:mod:`tests.faults.load`): one row of the fault table.

Pure: records (dicts as the load writes them) and times in, a :class:`FaultRow` out. Definitions, for every row:

- **established kept**: long-lived streams that were up when the fault began (their ``stream-up`` before it) and
  still intact when the load stopped or closed cleanly at the end of their own lifetime (or intact at the end of
  the fault, for a fault whose test ends them on purpose afterwards), over all such streams.
- **new failed**: new connections started between the fault and the end of its window that did not come back
  ``ok`` (denied, refused, reset, timed out), over all started in that window.
- **recovery**: from the fault (or from when the failed part was let come back, for a fault held for a while) to
  the start of the first ``ok`` new connection that followed the last failed one, the longest over the targets (0
  when nothing failed).
- **data lost**: connections whose echo came back different from what was sent (``mismatch``): loss the
  application was not told about. Connections that failed visibly are counted as failed, not as lost data.
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any

from tests.faults.load import KEPT

Record = Mapping[str, Any]


@dataclass(frozen=True)
class FaultRow:
    fault: str
    kept: int
    established: int
    failed: int
    started: int
    recovery: float
    plaintext: int
    lost: int
    note: str = ""
    failed_by_target: Mapping[str, int] = field(default_factory=dict)

    def cells(self) -> list[str]:
        return [
            self.fault,
            f"{self.kept}/{self.established}",
            f"{self.failed}/{self.started}",
            f"{self.recovery:.2f} s",
            str(self.plaintext),
            str(self.lost),
            self.note,
        ]


ROWS: list[FaultRow] = []
"""The rows of this run, in the order the faults ran (printed by tests/faults/conftest.py)."""

HEADER = ["fault", "established kept", "new failed", "recovery", "plaintext seen", "data lost", "notes"]


def streams_up_at(records: Iterable[Record], at: float) -> list[Record]:
    """The ``stream-up`` records of streams that were up at ``at`` (started before it, not ended before it)."""
    records = list(records)
    ups = [r for r in records if r["kind"] == "stream-up" and r["end"] <= at]
    ended = {(r["target"], r["start"]): r for r in records if r["kind"] == "stream"}
    alive = []
    for up in ups:
        end = ended.get((up["target"], up["start"]))
        if end is None or end["end"] >= at:
            alive.append(up)
    return alive


def stream_kept(records: Iterable[Record], up: Record, until: float | None = None) -> bool:
    """Whether the stream that ``up`` announced ended only when the load stopped (``ok``) or on its own, cleanly
    (``ended``), or after ``until``."""
    for r in records:
        if r["kind"] == "stream" and r["target"] == up["target"] and r["start"] == up["start"]:
            return bool(r["outcome"] in KEPT or (until is not None and r["end"] > until))
    return False


def new_in_window(records: Iterable[Record], begin: float, end: float, targets: Sequence[str] = ()) -> list[Record]:
    return [
        r
        for r in records
        if r["kind"] == "new" and begin <= r["start"] <= end and (not targets or r["target"] in targets)
    ]


def recovery_time(records: Iterable[Record], fault_at: float) -> float:
    """Seconds from ``fault_at`` until every target that failed had an ``ok`` new connection after its last
    failure (0 when none failed)."""
    by_target: dict[str, list[Record]] = {}
    for r in records:
        if r["kind"] == "new" and r["start"] >= fault_at:
            by_target.setdefault(r["target"], []).append(r)
    worst = 0.0
    for conns in by_target.values():
        conns.sort(key=lambda r: r["start"])
        failed = [r for r in conns if r["outcome"] != "ok"]
        if not failed:
            continue
        last = failed[-1]["start"]
        after = [r for r in conns if r["outcome"] == "ok" and r["start"] > last]
        worst = max(worst, (after[0]["start"] if after else float("inf")) - fault_at)
    return worst


def lost(records: Iterable[Record]) -> int:
    return sum(1 for r in records if r["outcome"] == "mismatch")


def fault_row(
    fault: str,
    records: Sequence[Record],
    fault_at: float,
    window_end: float,
    plaintext: int,
    note: str = "",
    targets: Sequence[str] = (),
    kept_until: float | None = None,
    recovery_from: float | None = None,
) -> FaultRow:
    """The row for a fault that began at ``fault_at`` and whose effects are counted until ``window_end``; only
    connections to ``targets`` count for new failures (all targets when empty); a stream that lasted past
    ``kept_until`` counts as kept (when the test itself ends streams later on purpose); recovery is measured from
    ``recovery_from`` (when the failed part was let come back) if given, else from the fault."""
    up = streams_up_at(records, fault_at)
    window = new_in_window(records, fault_at, window_end, targets)
    failures = [r for r in window if r["outcome"] != "ok"]
    by_target: dict[str, int] = {}
    for r in failures:
        by_target[r["target"]] = by_target.get(r["target"], 0) + 1
    return FaultRow(
        fault=fault,
        kept=sum(1 for u in up if stream_kept(records, u, kept_until)),
        established=len(up),
        failed=len(failures),
        started=len(window),
        recovery=recovery_time(
            [r for r in records if r["start"] <= window_end], fault_at if recovery_from is None else recovery_from
        ),
        plaintext=plaintext,
        lost=lost(records),
        note=note,
        failed_by_target=by_target,
    )


def markdown_table(rows: Sequence[FaultRow]) -> str:
    lines = ["| " + " | ".join(HEADER) + " |", "|" + "---|" * len(HEADER)]
    lines += ["| " + " | ".join(row.cells()) + " |" for row in rows]
    return "\n".join(lines) + "\n"
