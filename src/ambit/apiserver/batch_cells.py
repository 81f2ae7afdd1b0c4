"""Table cells of batch/v1 Jobs and CronJobs, as kube-apiserver prints them for ``kubectl get`` (pure; the columns
are in :data:`ambit.apiserver.printers.PRINTERS`).

Jobs: NAME, STATUS, COMPLETIONS, DURATION, AGE, then the wide CONTAINERS, IMAGES, SELECTOR.

1. STATUS is the first that holds of: ``Complete`` or ``Failed`` (their condition True), ``Terminating`` (being
   deleted), ``Suspended``, ``FailureTarget``, ``SuccessCriteriaMet`` (conditions True), else ``Running``.
2. COMPLETIONS is ``succeeded/completions``; a work queue (no completions) shows ``succeeded/1``, with
   `` of <parallelism>`` when more than one pod runs at once.
3. DURATION runs from ``startTime`` to ``completionTime``, or to now while unfinished; empty before the start.

CronJobs: NAME, SCHEDULE, TIMEZONE (``<none>`` unset), SUSPEND (``True``/``False``), ACTIVE (Jobs in
``status.active``), LAST SCHEDULE (time since ``lastScheduleTime``, ``<none>`` before the first), AGE, then the
wide CONTAINERS, IMAGES, SELECTOR (the job template's).
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

from ambit.apiserver.cells import (
    Cell,
    age,
    as_int,
    as_list,
    as_map,
    as_maps,
    as_str,
    format_label_selector,
    human_duration,
    name_of,
    parse_timestamp,
    since,
)
from ambit.apiserver.workload_cells import containers_and_images

_STATUS_ORDER = ("Complete", "Failed", "Terminating", "Suspended", "FailureTarget", "SuccessCriteriaMet")


def job_state(job: Mapping[str, Any]) -> str:
    """Rule 1."""
    conditions = as_maps(as_map(job.get("status")).get("conditions"))
    true = {as_str(c.get("type")) for c in conditions if as_str(c.get("status")) == "True"}
    if as_map(job.get("metadata")).get("deletionTimestamp"):
        true.add("Terminating")
    return next((state for state in _STATUS_ORDER if state in true), "Running")


def job_completions(job: Mapping[str, Any]) -> str:
    """Rule 2."""
    spec, status = as_map(job.get("spec")), as_map(job.get("status"))
    succeeded = as_int(status.get("succeeded"))
    completions = spec.get("completions")
    if isinstance(completions, int) and not isinstance(completions, bool):
        return f"{succeeded}/{completions}"
    parallelism = as_int(spec.get("parallelism"), 1)
    return f"{succeeded}/1 of {parallelism}" if parallelism > 1 else f"{succeeded}/1"


def job_duration(job: Mapping[str, Any], now: float) -> str:
    """Rule 3."""
    status = as_map(job.get("status"))
    start = parse_timestamp(status.get("startTime"))
    if start is None:
        return ""
    end = parse_timestamp(status.get("completionTime"))
    return human_duration((now if end is None else end) - start)


def job_cells(job: Mapping[str, Any], now: float) -> list[Cell]:
    spec = as_map(job.get("spec"))
    names, images = containers_and_images(spec.get("template"))
    return [
        name_of(job),
        job_state(job),
        job_completions(job),
        job_duration(job, now),
        age(job, now),
        names,
        images,
        format_label_selector(spec.get("selector")),
    ]


def cron_job_cells(cron: Mapping[str, Any], now: float) -> list[Cell]:
    spec, status = as_map(cron.get("spec")), as_map(cron.get("status"))
    job_spec = as_map(as_map(spec.get("jobTemplate")).get("spec"))
    names, images = containers_and_images(job_spec.get("template"))
    last = status.get("lastScheduleTime")
    return [
        name_of(cron),
        as_str(spec.get("schedule")),
        as_str(spec.get("timeZone")) or "<none>",
        "True" if spec.get("suspend") is True else "False",
        len(as_list(status.get("active"))),
        "<none>" if last is None else since(last, now),
        age(cron, now),
        names,
        images,
        format_label_selector(job_spec.get("selector")),
    ]
