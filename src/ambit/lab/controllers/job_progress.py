"""What a Job's pods add up to, and what the Job controller does next (pure: the Job and its pods in, a plan
out; time comes in as ``now``).

Counting, exactly once. Every pod the controller makes carries the finalizer :data:`TRACKING_FINALIZER`, so a
pod cannot vanish before it is counted. A pod is *finished* when its phase is Succeeded or Failed, or when it is
being deleted without having succeeded (it will never succeed: it counts as Failed, as kube counts it). Counting
is kube's three steps, each a write the next one waits for:

1. A finished pod that still carries the finalizer and whose uid is not in ``status.uncountedTerminatedPods``
   joins that list (succeeded or failed), in a status write that carries the resourceVersion it was decided on.
2. Once its uid is in the stored list, the finalizer is taken off the pod.
3. A uid in the list whose pod the cache shows without the finalizer (or no longer at all) leaves the list, and
   the ``succeeded`` or ``failed`` counter goes up by one, in the same kind of status write.

A pod is counted when it leaves the list, and it leaves only once the cache shows it without the finalizer; the
cache never shows a pod's finalizer again after that, so step 1 cannot take the pod a second time. Each status
write is conditional on the Job's resourceVersion, so two reconciles that read the same stale Job cannot both
move a uid: the second write is refused (409) and retried on a fresher cache.

The plan, for a Job that is not finished (no ``Complete`` or ``Failed`` condition):

4. Success criteria: NonIndexed with completions: ``succeeded`` reaches ``completions``; Indexed: every index in
   ``[0, completions)`` has succeeded (``status.completedIndexes``, kube's ``1,3-5,7`` form); a work queue (no
   completions): some pod succeeded and none is active. Then ``SuccessCriteriaMet`` is added, active pods are
   deleted, and once no pod is left running or uncounted, ``Complete`` with ``completionTime`` (event
   ``Completed``).
5. Failure: more failed pods than ``backoffLimit``, or, with restartPolicy OnFailure, as many container restarts
   in the live pods as the limit (any restart when it is 0), reason ``BackoffLimitExceeded``; or
   ``activeDeadlineSeconds`` past since ``startTime``, reason ``DeadlineExceeded``. Then ``FailureTarget`` is
   added, active pods are deleted, and once no pod is left running or uncounted, ``Failed`` with the same reason
   (a Warning event of that reason).
6. ``suspend: true``: active pods are deleted, condition ``Suspended`` True (event ``Suspended``); on resume it
   turns False (event ``Resumed``) and ``startTime`` starts again, so does the deadline. Pods the controller
   deletes while the Job settles (suspended, or with ``FailureTarget`` or ``SuccessCriteriaMet``) lose the
   finalizer uncounted: unlike kube, a suspension never costs the Job its back-off limit.
7. Otherwise pods are made up to what is wanted: NonIndexed ``min(parallelism, completions - succeeded)``; a work
   queue ``parallelism`` until a pod succeeds, then none; Indexed the lowest pending indexes, at most
   ``parallelism`` running. Surplus active pods are deleted, worst first. Terminating pods hold their place only
   with ``podReplacementPolicy: Failed``.
8. After failures, a replacement waits ``backoff_base * 2^(n-1)`` seconds (at most ``backoff_max``) from the last
   failure, ``n`` the failed pods that finished after the last pod that succeeded (kube: 10 s doubling to 6 min).

A finished Job makes nothing; the finalizers of its remaining pods are taken off without counting them.
"""

from __future__ import annotations

import copy
import re
from collections.abc import Iterable, Mapping
from dataclasses import dataclass, field
from typing import Any, Literal

from ambit.lab.controllers import pods as podstate
from ambit.lab.controllers.ownership import Object, is_deleting, name_of, owner_reference, uid_of

_DIGITS = re.compile(r"[0-9]{1,9}")
EventKind = Literal["Normal", "Warning"]
TRACKING_FINALIZER = "batch.kubernetes.io/job-tracking"
COMPLETION_INDEX = "batch.kubernetes.io/job-completion-index"
INDEX_ENV = "JOB_COMPLETION_INDEX"
TERMINAL = ("Complete", "Failed")
BACKOFF_LIMIT = ("BackoffLimitExceeded", "Job has reached the specified backoff limit")
DEADLINE = ("DeadlineExceeded", "Job was active longer than specified deadline")
COMPLETIONS_REACHED = ("CompletionsReached", "Reached expected number of succeeded pods")


@dataclass(frozen=True, slots=True)
class Backoff:
    """Rule 8's policy."""

    base: float = 10.0
    maximum: float = 360.0

    def delay(self, failures: int) -> float:
        if failures <= 0:
            return 0.0
        return float(min(self.base * 2 ** min(failures - 1, 32), self.maximum))


@dataclass(slots=True)
class JobPlan:
    """What one reconcile writes, in order: ``status`` (None: unchanged), finalizers off ``release`` (only after the
    status write), ``delete``, then ``create`` (pod bodies); ``events`` after the status write; look again after
    ``wait`` seconds (None: on the next change)."""

    status: dict[str, Any] | None = None
    release: list[Object] = field(default_factory=list)
    delete: list[Object] = field(default_factory=list)
    create: list[Object] = field(default_factory=list)
    events: list[tuple[EventKind, str, str]] = field(default_factory=list)
    wait: float | None = None


# ---- reading a Job ------------------------------------------------------------------------------------------


def _spec(job: Mapping[str, Any]) -> Mapping[str, Any]:
    spec = job.get("spec")
    return spec if isinstance(spec, Mapping) else {}


def _int(value: Any, default: int | None) -> int | None:
    return value if isinstance(value, int) and not isinstance(value, bool) and value >= 0 else default


def parallelism(job: Mapping[str, Any]) -> int:
    return _int(_spec(job).get("parallelism"), 1) or 0


def completions(job: Mapping[str, Any]) -> int | None:
    return _int(_spec(job).get("completions"), None)


def is_indexed(job: Mapping[str, Any]) -> bool:
    return _spec(job).get("completionMode") == "Indexed"


def is_suspended(job: Mapping[str, Any]) -> bool:
    return _spec(job).get("suspend") is True


def condition(job: Mapping[str, Any], kind: str) -> dict[str, Any] | None:
    found = podstate.condition(job, kind)
    return found if found is not None and found.get("status") == "True" else None


def finished_condition(job: Mapping[str, Any]) -> dict[str, Any] | None:
    """The Job's ``Complete`` or ``Failed`` condition, when it has one."""
    return next((c for c in (condition(job, k) for k in TERMINAL) if c is not None), None)


def has_finalizer(pod: Mapping[str, Any]) -> bool:
    return TRACKING_FINALIZER in ((pod.get("metadata") or {}).get("finalizers") or ())


def outcome(pod: Mapping[str, Any]) -> str | None:
    """``succeeded`` or ``failed`` for a finished pod, else None."""
    phase = podstate.phase(pod)
    if phase == "Succeeded":
        return "succeeded"
    if phase == "Failed" or is_deleting(pod):
        return "failed"
    return None


def index_of(pod: Mapping[str, Any]) -> int | None:
    meta = pod.get("metadata") or {}
    for source in (meta.get("annotations") or {}, meta.get("labels") or {}):
        value = source.get(COMPLETION_INDEX)
        if isinstance(value, str) and _DIGITS.fullmatch(value):
            return int(value)
    return None


# ---- completed indexes ---------------------------------------------------------------------------------------


def format_indexes(indexes: Iterable[int]) -> str:
    """Sorted indexes, three or more consecutive ones as ``a-b`` (kube's ``completedIndexes`` form)."""
    runs: list[list[int]] = []
    for i in sorted(set(indexes)):
        if runs and runs[-1][1] == i - 1:
            runs[-1][1] = i
        else:
            runs.append([i, i])
    parts = []
    for low, high in runs:
        if high - low >= 2:
            parts.append(f"{low}-{high}")
        else:
            parts.extend(str(i) for i in range(low, high + 1))
    return ",".join(parts)


def parse_indexes(text: Any, limit: int) -> set[int]:
    """The indexes below ``limit`` that ``text`` lists; anything malformed is skipped."""
    found: set[int] = set()
    for part in text.split(",") if isinstance(text, str) else ():
        low, _, high = part.partition("-")
        if not _DIGITS.fullmatch(low) or not _DIGITS.fullmatch(high or low):
            continue
        found.update(range(int(low), min(int(high or low), limit - 1) + 1))
    return found


# ---- the plan ---------------------------------------------------------------------------------------------------


def plan(job: Object, pods: list[Object], now: float, backoff: Backoff, *, burst: int = 500) -> JobPlan:
    """Rules 1-8 for ``job`` and the pods it controls."""
    result = JobPlan()
    found = job.get("status")
    before: dict[str, Any] = found if isinstance(found, dict) else {}
    status = _readable(before)
    if finished_condition(job) is not None:
        _count(status, job, pods, counting=False)
        result.release = [p for p in pods if has_finalizer(p)]
        return _finish(result, before, status)
    # Pods the controller itself deletes (suspension, a failure or success target) are not failures (rule 6).
    settling = is_suspended(job) or any(condition(job, k) for k in ("FailureTarget", "SuccessCriteriaMet"))
    _count(status, job, pods, counting=True, deletions_fail=not settling)
    uncounted = _uncounted_uids(status)
    result.release = [p for p in pods if has_finalizer(p) and (uid_of(p) in uncounted or _dropped(p, settling))]
    live = [p for p in pods if not is_deleting(p) and outcome(p) is None]
    terminating = [p for p in pods if is_deleting(p) and podstate.phase(p) not in ("Succeeded", "Failed")]
    if is_suspended(job):
        _suspend(job, status, now, result)
        result.delete, live = live, []
    else:
        _resume(job, status, now, result)
    drained = not live and not terminating and not uncounted
    failure = _failure(job, status, live, now)
    if failure is not None and condition(job, "SuccessCriteriaMet") is None:
        _set_condition(status, "FailureTarget", *failure, now)
        result.delete = live
        if drained:
            _set_condition(status, "Failed", *failure, now)
            result.events.append(("Warning", failure[0], failure[1]))
    elif _success(job, status, live):
        _set_condition(status, "SuccessCriteriaMet", *COMPLETIONS_REACHED, now)
        result.delete = live
        if drained:
            _set_condition(status, "Complete", *COMPLETIONS_REACHED, now)
            status["completionTime"] = podstate.rfc3339(now)
            result.events.append(("Normal", "Completed", "Job completed"))
    elif not is_suspended(job):
        _manage(job, status, pods, live, terminating, now, backoff, burst, result)
    gone = {uid_of(p) for p in result.delete}
    kept = [p for p in live if uid_of(p) not in gone]
    status.update(active=len(kept), ready=sum(1 for p in kept if podstate.is_ready(p)))
    status["terminating"] = len(terminating) + len(gone)
    deadline = _deadline_wait(job, status, now)
    if deadline is not None and deadline > 0:
        result.wait = deadline if result.wait is None else min(result.wait, deadline)
    return _finish(result, before, status)


def _readable(before: Mapping[str, Any]) -> dict[str, Any]:
    """A copy of the stored status with the fields the plan reads in their shapes (a status is not validated: a
    malformed one is repaired by the next write rather than stopping the Job)."""
    status = copy.deepcopy(dict(before))
    for key in ("succeeded", "failed"):
        status[key] = _int(status.get(key), 0)
    uncounted = status.get("uncountedTerminatedPods")
    uncounted = uncounted if isinstance(uncounted, dict) else {}
    lists = {k: uncounted.get(k) for k in ("succeeded", "failed")}
    status["uncountedTerminatedPods"] = {
        k: [u for u in v if isinstance(u, str)] for k, v in lists.items() if isinstance(v, list) and v
    }
    conditions = status.get("conditions")
    if conditions is not None:
        status["conditions"] = [c for c in conditions if isinstance(c, dict)] if isinstance(conditions, list) else []
    return status


def _dropped(pod: Mapping[str, Any], settling: bool) -> bool:
    """A pod deleted by the controller while the Job settles: its finalizer goes without counting it (whatever
    phase its kubelet wrote as it stopped it)."""
    return settling and is_deleting(pod) and podstate.phase(pod) != "Succeeded"


def _finish(result: JobPlan, before: Mapping[str, Any], status: dict[str, Any]) -> JobPlan:
    if finished_condition({"status": status}) is not None:
        status.update(active=0, ready=0)
    if status != before:
        result.status = status
    return result


def _uncounted_uids(status: Mapping[str, Any]) -> set[str]:
    uncounted = status.get("uncountedTerminatedPods") or {}
    return {str(u) for key in ("succeeded", "failed") for u in uncounted.get(key) or ()}


def _count(
    status: dict[str, Any], job: Object, pods: list[Object], *, counting: bool, deletions_fail: bool = True
) -> None:
    """Rules 1 and 3 on ``status``: uids whose pods lost the finalizer leave ``uncountedTerminatedPods`` for the
    counters; when ``counting``, newly finished pods join it (a deleted pod only when ``deletions_fail``)."""
    by_uid = {uid_of(p): p for p in pods}
    uncounted = status.get("uncountedTerminatedPods") or {}
    lists = {key: [str(u) for u in uncounted.get(key) or () if isinstance(u, str)] for key in ("succeeded", "failed")}
    listed = set(lists["succeeded"]) | set(lists["failed"])
    for key in ("succeeded", "failed"):
        stay = []
        for uid in lists[key]:
            pod = by_uid.get(uid)
            if pod is not None and has_finalizer(pod):
                stay.append(uid)  # rule 2 has not happened yet
            else:
                status[key] = int(status.get(key) or 0) + 1
        lists[key] = stay
    indexed, total = is_indexed(job), completions(job) or 0
    done = parse_indexes(status.get("completedIndexes"), total) if indexed else set()
    for pod in pods if counting else ():
        result = outcome(pod)
        if result is None or not has_finalizer(pod) or uid_of(pod) in listed:
            continue
        if result == "failed" and is_deleting(pod) and not deletions_fail:
            continue  # deleted by the controller while the Job settles (its kubelet may have written Failed)
        lists[result].append(uid_of(pod))
        index = index_of(pod)
        if result == "succeeded" and indexed and index is not None and index < total:
            done.add(index)
    if indexed:
        status["completedIndexes"] = format_indexes(done)
    status["uncountedTerminatedPods"] = {k: v for k, v in lists.items() if v}
    status.setdefault("succeeded", 0)
    status.setdefault("failed", 0)


def _succeeded_total(status: Mapping[str, Any]) -> int:
    uncounted = status.get("uncountedTerminatedPods") or {}
    return int(status.get("succeeded") or 0) + len(uncounted.get("succeeded") or ())


def _failed_total(status: Mapping[str, Any]) -> int:
    uncounted = status.get("uncountedTerminatedPods") or {}
    return int(status.get("failed") or 0) + len(uncounted.get("failed") or ())


def _success(job: Object, status: Mapping[str, Any], live: list[Object]) -> bool:
    """Rule 4's criteria."""
    total = completions(job)
    if is_indexed(job):
        return total is not None and len(parse_indexes(status.get("completedIndexes"), total)) >= total
    if total is None:
        return _succeeded_total(status) > 0 and not live
    return _succeeded_total(status) >= total


def _failure(job: Object, status: Mapping[str, Any], live: list[Object], now: float) -> tuple[str, str] | None:
    """Rule 5's criteria."""
    if condition(job, "FailureTarget") is not None:
        found = condition(job, "FailureTarget") or {}
        return (str(found.get("reason") or BACKOFF_LIMIT[0]), str(found.get("message") or BACKOFF_LIMIT[1]))
    limit = _int(_spec(job).get("backoffLimit"), 6) or 0
    failed = _failed_total(status)
    template = (_spec(job).get("template") or {}).get("spec") or {}
    if template.get("restartPolicy") == "OnFailure":
        restarts = sum(podstate.restarts(p) for p in live)
        if restarts and restarts >= limit:
            return BACKOFF_LIMIT
    if failed > limit:
        return BACKOFF_LIMIT
    wait = _deadline_wait(job, status, now)
    if wait is not None and wait <= 0:
        return DEADLINE
    return None


def _deadline_wait(job: Object, status: Mapping[str, Any], now: float) -> float | None:
    seconds = _int(_spec(job).get("activeDeadlineSeconds"), None)
    started = podstate.parse_time(status.get("startTime"))
    if seconds is None or started is None or is_suspended(job) or finished_condition({"status": status}):
        return None
    return started + seconds - now


def _set_condition(status: dict[str, Any], kind: str, reason: str, message: str, now: float) -> None:
    conditions = [c for c in status.get("conditions") or () if isinstance(c, dict)]
    for cond in conditions:
        if cond.get("type") == kind:
            if cond.get("status") != "True" or cond.get("reason") != reason:
                cond.update(status="True", reason=reason, message=message, lastTransitionTime=podstate.rfc3339(now))
                cond["lastProbeTime"] = podstate.rfc3339(now)
            status["conditions"] = conditions
            return
    stamp = podstate.rfc3339(now)
    conditions.append(
        {
            "type": kind,
            "status": "True",
            "reason": reason,
            "message": message,
            "lastProbeTime": stamp,
            "lastTransitionTime": stamp,
        }
    )
    status["conditions"] = conditions


def _suspend(job: Object, status: dict[str, Any], now: float, result: JobPlan) -> None:
    """Rule 6, going (or staying) suspended."""
    if condition(job, "Suspended") is None:
        _set_condition(status, "Suspended", "JobSuspended", "Job suspended", now)
        result.events.append(("Normal", "Suspended", "Job suspended"))


def _resume(job: Object, status: dict[str, Any], now: float, result: JobPlan) -> None:
    """Rule 6, running: the start time is set when the Job first runs and again when it resumes."""
    if condition(job, "Suspended") is not None:
        for cond in status.get("conditions") or ():
            if isinstance(cond, dict) and cond.get("type") == "Suspended":
                stamp = podstate.rfc3339(now)
                cond.update(status="False", reason="JobResumed", message="Job resumed")
                cond.update(lastProbeTime=stamp, lastTransitionTime=stamp)
        result.events.append(("Normal", "Resumed", "Job resumed"))
        status["startTime"] = podstate.rfc3339(now)
    status.setdefault("startTime", podstate.rfc3339(now))


def _manage(
    job: Object,
    status: Mapping[str, Any],
    pods: list[Object],
    live: list[Object],
    terminating: list[Object],
    now: float,
    backoff: Backoff,
    burst: int,
    result: JobPlan,
) -> None:
    """Rules 7 and 8."""
    holding = len(live) + (len(terminating) if _spec(job).get("podReplacementPolicy") == "Failed" else 0)
    most = parallelism(job)
    total = completions(job)
    if is_indexed(job):
        done = parse_indexes(status.get("completedIndexes"), total or 0)
        running = {index_of(p) for p in live}
        pending = [i for i in range(total or 0) if i not in done and i not in running]
        want_new = max(0, min(most - holding, len(pending)))
        surplus = sorted(live, key=lambda p: -(index_of(p) or 0))[: max(0, len(live) - most)]
        indexes: list[int | None] = list(pending[:want_new])
    else:
        if total is None:
            want = most if _succeeded_total(status) == 0 else len(live)
        else:
            want = max(0, min(most, total - _succeeded_total(status)))
        want_new = max(0, want - holding)
        surplus = sorted(live, key=podstate.deletion_rank)[: max(0, len(live) - want)]
        indexes = [None] * want_new
    result.delete = surplus
    if not indexes:
        return
    failures, last = _recent_failures(pods)
    ready_at = last + backoff.delay(failures) if last is not None else now
    if ready_at > now:
        result.wait = ready_at - now
        return
    result.create = [pod_for(job, index) for index in indexes[:burst]]


def _recent_failures(pods: list[Object]) -> tuple[int, float | None]:
    """Rule 8: failed pods that finished after the last pod that succeeded, and when the last of them finished."""
    finished = sorted((_finished_at(p), outcome(p)) for p in pods if outcome(p) is not None)
    count, last = 0, None
    for when, result in finished:
        if result == "succeeded":
            count, last = 0, None
        else:
            count, last = count + 1, when
    return count, last


def _finished_at(pod: Mapping[str, Any]) -> float:
    status = pod.get("status") or {}
    times = [
        podstate.parse_time(((s.get("state") or {}).get("terminated") or {}).get("finishedAt"))
        for s in status.get("containerStatuses") or ()
        if isinstance(s, dict)
    ]
    known = [t for t in times if t is not None]
    if known:
        return max(known)
    meta = pod.get("metadata") or {}
    return (
        podstate.parse_time(meta.get("deletionTimestamp")) or podstate.parse_time(meta.get("creationTimestamp")) or 0.0
    )


def pod_for(job: Object, index: int | None) -> Object:
    """A new pod of ``job``: its template, a controller reference, the tracking finalizer; for an Indexed Job the
    index as label, annotation, ``JOB_COMPLETION_INDEX`` (from the annotation, as kube injects it) and the
    hostname ``<job>-<index>``."""
    template = _spec(job).get("template") or {}
    meta = template.get("metadata") or {}
    name = name_of(job)
    pod_meta: dict[str, Any] = {
        "generateName": f"{name}-" if index is None else f"{name}-{index}-",
        "namespace": (job.get("metadata") or {}).get("namespace", ""),
        "ownerReferences": [owner_reference(job)],
        "finalizers": [TRACKING_FINALIZER],
        "labels": copy.deepcopy(dict(meta.get("labels") or {})),
        "annotations": copy.deepcopy(dict(meta.get("annotations") or {})),
    }
    spec = copy.deepcopy(dict(template.get("spec") or {}))
    if index is not None:
        pod_meta["labels"][COMPLETION_INDEX] = str(index)
        pod_meta["annotations"][COMPLETION_INDEX] = str(index)
        spec.setdefault("hostname", f"{name}-{index}")
        source = {"fieldRef": {"apiVersion": "v1", "fieldPath": f"metadata.annotations['{COMPLETION_INDEX}']"}}
        for kind in ("initContainers", "containers"):
            for container in spec.get(kind) or ():
                env = container.setdefault("env", [])
                if isinstance(env, list) and not any(isinstance(e, dict) and e.get("name") == INDEX_ENV for e in env):
                    env.insert(0, {"name": INDEX_ENV, "valueFrom": copy.deepcopy(source)})
    for key in ("labels", "annotations"):
        if not pod_meta[key]:
            del pod_meta[key]
    return {"apiVersion": "v1", "kind": "Pod", "metadata": pod_meta, "spec": spec}
