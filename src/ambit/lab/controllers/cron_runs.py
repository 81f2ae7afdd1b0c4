"""What a CronJob does next (pure: the CronJob, the Jobs it controls and ``now`` in; a plan out). The schedule
grammar is :mod:`ambit.model.cron`'s.

Rules (kube-controller-manager's CronJob controller, v2):

1. The Jobs it controls are *active* until they have a ``Complete`` or ``Failed`` condition. ``status.active``
   lists the active ones (object references); ``lastSuccessfulTime`` is the latest ``completionTime`` of a
   Complete one, never moved back.
2. The schedule is read in ``spec.timeZone`` (UTC when unset: the lab's controller manager's zone). A schedule or
   zone that cannot be read makes no Job: a Warning Event ``UnparseableSchedule`` or ``UnknownTimeZone``, and the
   CronJob waits for a change.
3. The time to run is the latest firing in ``(earliest, now]``, where ``earliest`` is ``lastScheduleTime`` (else
   the CronJob's creation) and, with ``startingDeadlineSeconds``, no earlier than ``now`` minus it, and never
   more than a week back. Earlier missed firings are dropped (a Warning ``TooManyMissedTimes`` when more than 100
   were). None: nothing to run now.
4. A suspended or deleting CronJob makes no Job (rules 1 and 7 still hold).
5. ``concurrencyPolicy``: Allow runs beside active Jobs; Forbid skips the firing while any is active (it is
   retried until the starting deadline, if any, passes); Replace deletes the active Jobs first.
6. The Job is ``<cronjob>-<scheduled time in minutes since the epoch>``, from ``jobTemplate`` (its labels,
   annotations and spec), with the annotation ``batch.kubernetes.io/cronjob-scheduled-timestamp`` (the time in
   the CronJob's zone, RFC 3339) and a controller reference. A Job of that name that exists already is that run:
   it is not made again. ``lastScheduleTime`` becomes the scheduled time.
7. Finished Jobs beyond ``successfulJobsHistoryLimit`` (Complete) and ``failedJobsHistoryLimit`` (Failed) are
   deleted, oldest first (by scheduled time, else creation).
8. The CronJob looks again at its next firing after ``now``.
"""

from __future__ import annotations

import copy
from collections.abc import Mapping
from dataclasses import dataclass, field
from datetime import UTC, datetime, tzinfo
from typing import Any

from ambit.lab.controllers import job_progress
from ambit.lab.controllers import pods as podstate
from ambit.lab.controllers.ownership import Object, is_deleting, name_of, owner_reference, uid_of
from ambit.model.cron import CronError, CronSchedule, find_zone, parse_schedule

SCHEDULED_TIMESTAMP = "batch.kubernetes.io/cronjob-scheduled-timestamp"
MISSED_WARNING = 100
_WALK_LIMIT = 20000
"""The most firings rule 3 walks (a week of every minute is 10080)."""


@dataclass(slots=True)
class CronPlan:
    """In order: ``delete`` (Jobs: replaced or beyond the history), ``create`` (a Job body), then ``status`` (None:
    unchanged) and ``events``; look again after ``wait`` seconds (None: on the next change)."""

    delete: list[Object] = field(default_factory=list)
    create: Object | None = None
    status: dict[str, Any] | None = None
    events: list[tuple[job_progress.EventKind, str, str]] = field(default_factory=list)
    wait: float | None = None


def _spec(cron: Mapping[str, Any]) -> Mapping[str, Any]:
    spec = cron.get("spec")
    return spec if isinstance(spec, Mapping) else {}


def _limit(cron: Mapping[str, Any], key: str, default: int) -> int:
    value = _spec(cron).get(key)
    return value if isinstance(value, int) and not isinstance(value, bool) and value >= 0 else default


def job_name(cron: Mapping[str, Any], scheduled: datetime) -> str:
    return f"{name_of(cron)}-{int(scheduled.timestamp()) // 60}"


def reference(job: Mapping[str, Any]) -> dict[str, Any]:
    meta = job.get("metadata") or {}
    return {
        "apiVersion": "batch/v1",
        "kind": "Job",
        "name": name_of(job),
        "namespace": meta.get("namespace", ""),
        "uid": uid_of(job),
    }


def _ran_at(job: Mapping[str, Any]) -> float:
    annotations = (job.get("metadata") or {}).get("annotations") or {}
    at = podstate.parse_time(annotations.get(SCHEDULED_TIMESTAMP))
    return at if at is not None else podstate.parse_time((job.get("metadata") or {}).get("creationTimestamp")) or 0.0


def plan(cron: Object, jobs: list[Object], now: float) -> CronPlan:
    """Rules 1-8."""
    result = CronPlan()
    before = cron.get("status") if isinstance(cron.get("status"), dict) else {}
    status: dict[str, Any] = copy.deepcopy(dict(before or {}))
    active = [j for j in jobs if job_progress.finished_condition(j) is None]
    status["active"] = [reference(j) for j in sorted(active, key=name_of)] or None
    _last_success(status, jobs)
    result.delete = _beyond_history(cron, jobs)
    try:
        schedule = parse_schedule(str(_spec(cron).get("schedule", "")))
    except CronError as exc:
        result.events.append(("Warning", "UnparseableSchedule", f"unparseable schedule: {exc}"))
        return _finish(result, before or {}, status)
    zone_name = _spec(cron).get("timeZone")
    try:
        zone: tzinfo = UTC if zone_name is None else find_zone(str(zone_name))
    except CronError as exc:
        result.events.append(("Warning", "UnknownTimeZone", str(exc)))
        return _finish(result, before or {}, status)
    instant = datetime.fromtimestamp(now, UTC)
    upcoming = schedule.next_after(instant, zone)
    if upcoming is not None:
        result.wait = max(0.0, upcoming.timestamp() - now)
    if _spec(cron).get("suspend") is True or is_deleting(cron):
        return _finish(result, before or {}, status)
    due, missed = _due(cron, schedule, zone, now)
    if missed > MISSED_WARNING:
        note = (
            f"too many missed start times: {missed}. Set or decrease .spec.startingDeadlineSeconds or check clock skew"
        )
        result.events.append(("Warning", "TooManyMissedTimes", note))
    if due is None:
        return _finish(result, before or {}, status)
    name = job_name(cron, due)
    if any(name_of(j) == name for j in jobs):
        status["lastScheduleTime"] = podstate.rfc3339(due.timestamp())
        return _finish(result, before or {}, status)
    policy = _spec(cron).get("concurrencyPolicy") or "Allow"
    if active and policy == "Forbid":
        return _finish(result, before or {}, status)  # an active Job's end queues the CronJob again
    if active and policy == "Replace":
        result.delete = [*active, *[j for j in result.delete if j not in active]]
        active = []
    result.create = job_for(cron, name, due, zone)
    status["lastScheduleTime"] = podstate.rfc3339(due.timestamp())
    result.events.append(("Normal", "SuccessfulCreate", f"Created job {name}"))
    return _finish(result, before or {}, status)


def _finish(result: CronPlan, before: Mapping[str, Any], status: dict[str, Any]) -> CronPlan:
    if status.get("active") is None:
        status.pop("active", None)
    if status != before:
        result.status = status
    return result


def _last_success(status: dict[str, Any], jobs: list[Object]) -> None:
    """Rule 1's ``lastSuccessfulTime``: the latest completion, never earlier than the one recorded."""
    times = [
        podstate.parse_time((j.get("status") or {}).get("completionTime"))
        for j in jobs
        if job_progress.condition(j, "Complete") is not None
    ]
    latest = max((t for t in times if t is not None), default=None)
    recorded = podstate.parse_time(status.get("lastSuccessfulTime"))
    if latest is not None and (recorded is None or latest > recorded):
        status["lastSuccessfulTime"] = podstate.rfc3339(latest)


def _beyond_history(cron: Mapping[str, Any], jobs: list[Object]) -> list[Object]:
    """Rule 7."""
    victims: list[Object] = []
    for kind, key, default in (("Complete", "successfulJobsHistoryLimit", 3), ("Failed", "failedJobsHistoryLimit", 1)):
        done = sorted((j for j in jobs if job_progress.condition(j, kind) is not None), key=_ran_at)
        keep = _limit(cron, key, default)
        victims.extend(done[: max(0, len(done) - keep)])
    return [j for j in victims if not is_deleting(j)]


def _due(cron: Mapping[str, Any], schedule: CronSchedule, zone: tzinfo, now: float) -> tuple[datetime | None, int]:
    """Rule 3: the firing to run now (or None) and how many firings it passes over."""
    meta = cron.get("metadata") or {}
    earliest = podstate.parse_time((cron.get("status") or {}).get("lastScheduleTime"))
    if earliest is None:
        earliest = podstate.parse_time(meta.get("creationTimestamp")) or now
    deadline = _spec(cron).get("startingDeadlineSeconds")
    if isinstance(deadline, int) and not isinstance(deadline, bool) and deadline >= 0:
        earliest = max(earliest, now - deadline)
    earliest = max(earliest, now - 86400 * 7)  # more than a week behind: only the recent firings can matter
    cursor = datetime.fromtimestamp(earliest, UTC)
    latest, seen = None, 0
    for _ in range(_WALK_LIMIT):
        fired = schedule.next_after(cursor, zone)
        if fired is None or fired.timestamp() > now:
            break
        latest, seen, cursor = fired, seen + 1, fired
    return latest, max(0, seen - 1)


def job_for(cron: Mapping[str, Any], name: str, scheduled: datetime, zone: tzinfo) -> Object:
    """Rule 6's Job."""
    template = _object(_spec(cron).get("jobTemplate"))
    meta = _object(template.get("metadata"))
    annotations = dict(_object(meta.get("annotations")))
    local = scheduled.astimezone(zone).isoformat(timespec="seconds")
    annotations[SCHEDULED_TIMESTAMP] = local.removesuffix("+00:00") + "Z" if local.endswith("+00:00") else local
    job_meta: dict[str, Any] = {
        "name": name,
        "namespace": (cron.get("metadata") or {}).get("namespace", ""),
        "annotations": annotations,
        "ownerReferences": [owner_reference(cron)],
    }
    if labels := _object(meta.get("labels")):
        job_meta["labels"] = copy.deepcopy(dict(labels))
    spec = copy.deepcopy(dict(_object(template.get("spec"))))
    return {"apiVersion": "batch/v1", "kind": "Job", "metadata": job_meta, "spec": spec}


def _object(value: Any) -> Mapping[str, Any]:
    return value if isinstance(value, Mapping) else {}
