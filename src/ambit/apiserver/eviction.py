"""The eviction subresource's decisions (pure): kube-apiserver's ``EvictionREST`` (``pods/eviction``), the API
``kubectl drain`` calls. The I/O is :mod:`ambit.apiserver.eviction_rest`.

Rules, in the order a request meets them:

1. The body is a ``policy/v1`` (or ``policy/v1beta1``) ``Eviction``; a body without ``apiVersion`` and ``kind`` is
   taken as one. Its ``metadata.namespace``, when set, is the URL's; its ``metadata.name`` is the URL's pod (400
   otherwise, nothing read or written). ``deleteOptions`` are a pod delete's options; ``dryRun`` in the query and
   in the options must agree.
2. A pod that is Pending, Succeeded, Failed or already being deleted is deleted without consulting any budget
   (:func:`ignores_budgets`): it is not running, so its eviction disrupts nothing. Unless the pod is terminal or
   terminating, the delete carries the pod's ``resourceVersion`` as a precondition (unless the caller set one), so
   that a pod turning Running in between is not deleted on a stale decision.
3. The budgets covering the pod are those of its namespace whose non-empty selector selects it
   (:func:`ambit.model.disruption.covers`). More than one: 500, kube's message. None: the pod is deleted.
4. A pod that is not Ready passes without charging its budget when the budget's ``unhealthyPodEvictionPolicy`` is
   ``AlwaysAllow``, or when the budget already has its desired healthy pods (``currentHealthy >= desiredHealthy
   > 0``); the delete then carries the pod's ``resourceVersion`` precondition, and a conflict on it is a 429, so
   the client retries on fresh state.
5. Otherwise the budget is charged (:func:`charge`): a status the controller has not brought up to the budget's
   generation is 429 (retry after 10 s); a negative ``disruptionsAllowed`` or more than
   :data:`~ambit.model.disruption.MAX_DISRUPTED_PODS` pending evictions is 403; 0 is 429 with a
   ``DisruptionBudget`` cause; else ``disruptionsAllowed`` goes down by one and the pod is recorded in
   ``disruptedPods`` (not in a dry run), before the pod is deleted.
6. Before the delete (not in a dry run) the pod gets the ``DisruptionTarget`` condition (reason
   ``EvictionByEvictionAPI``); the success answer is a ``Status`` of ``Success``.
"""

from __future__ import annotations

import copy
import dataclasses
from collections.abc import Mapping
from typing import Any

from ambit.apiserver import errors
from ambit.apiserver.requests import DeleteOptions, JsonObject
from ambit.model.disruption import MAX_DISRUPTED_PODS, is_ready, update_allowed_condition

VERSIONS = ("policy/v1", "policy/v1beta1")
VIOLATION = "Cannot evict pod as it would violate the pod's disruption budget."
MULTIPLE = "This pod has more than one PodDisruptionBudget, which the eviction subresource does not support."
STALE_RETRY_SECONDS = 10


@dataclasses.dataclass(frozen=True, slots=True)
class Eviction:
    name: str
    options: DeleteOptions


def parse_eviction(body: Any, namespace: str, name: str, dry_run_query: bool) -> Eviction:
    """Rule 1."""
    if not isinstance(body, Mapping):
        raise errors.bad_request("the request body is not an Eviction object")
    api_version, kind = body.get("apiVersion"), body.get("kind")
    if (api_version, kind) != (None, None) and (api_version not in VERSIONS or kind != "Eviction"):
        raise errors.bad_request(
            f"the object provided is unrecognized (must be of type Eviction in policy/v1 or policy/v1beta1): "
            f"kind {str(kind)[:64]!r}, apiVersion {str(api_version)[:64]!r}"
        )
    meta = body.get("metadata") or {}
    if not isinstance(meta, Mapping):
        raise errors.bad_request("metadata must be an object")
    if meta.get("namespace") not in (None, "", namespace):
        raise errors.bad_request(
            "the namespace of the provided object does not match the namespace sent on the request"
        )
    if meta.get("name") != name:
        raise errors.bad_request("name in URL does not match name in Eviction object")
    raw_options = body.get("deleteOptions")
    if raw_options is not None and not isinstance(raw_options, Mapping):
        raise errors.bad_request("deleteOptions must be an object")
    options = DeleteOptions.from_body(dict(raw_options or {}), {})
    if dry_run_query and raw_options and raw_options.get("dryRun") and not options.dry_run:
        raise errors.bad_request("non-matching dry-run options in the request and in deleteOptions")
    if dry_run_query:
        options = dataclasses.replace(options, dry_run=True)
    return Eviction(name, options)


def _phase(pod: Mapping[str, Any]) -> str:
    return str((pod.get("status") or {}).get("phase") or "Pending")


def _terminating(pod: Mapping[str, Any]) -> bool:
    return bool((pod.get("metadata") or {}).get("deletionTimestamp"))


def ignores_budgets(pod: Mapping[str, Any]) -> bool:
    """Rule 2: the pod is deleted without consulting a budget."""
    return _phase(pod) in ("Pending", "Succeeded", "Failed") or _terminating(pod)


def enforces_resource_version(pod: Mapping[str, Any]) -> bool:
    """Rule 2: whether the delete must be conditional on the pod's current version."""
    return _phase(pod) not in ("Succeeded", "Failed") and not _terminating(pod)


def with_resource_version(options: DeleteOptions, rv: str) -> DeleteOptions:
    """``options`` with the pod's version as a precondition, unless the caller set one."""
    if options.precondition_rv:
        return options
    return dataclasses.replace(options, precondition_rv=rv)


def passes_unready(pod: Mapping[str, Any], budget: Mapping[str, Any]) -> bool:
    """Rule 4."""
    if is_ready(pod):
        return False
    if (budget.get("spec") or {}).get("unhealthyPodEvictionPolicy") == "AlwaysAllow":
        return True
    status = budget.get("status") or {}
    desired = int(status.get("desiredHealthy") or 0)
    return int(status.get("currentHealthy") or 0) >= desired > 0


def too_many_requests(message: str, retry_after: int) -> errors.ApiError:
    details: dict[str, Any] = {"causes": [{"reason": "DisruptionBudget", "message": message}]}
    if retry_after > 0:
        details["retryAfterSeconds"] = retry_after
    return errors.ApiError(429, "TooManyRequests", VIOLATION, details=details)


def still_processing(budget_name: str) -> errors.ApiError:
    return too_many_requests(
        f"The disruption budget {budget_name} is still being processed by the server.",
        STALE_RETRY_SECONDS,
    )


def _forbidden(budget_name: str, why: str) -> errors.ApiError:
    return errors.ApiError(
        403,
        "Forbidden",
        f'poddisruptionbudget.policy "{budget_name}" is forbidden: {why}',
        details={"name": budget_name, "group": "policy", "kind": "poddisruptionbudget"},
    )


def charge(budget: Mapping[str, Any], pod_name: str, now: str, dry_run: bool) -> JsonObject:
    """Rule 5: the budget's new status after one more disruption, or the ApiError refusing it."""
    meta, status = budget.get("metadata") or {}, budget.get("status") or {}
    name = str(meta.get("name") or "")
    if int(status.get("observedGeneration") or 0) < int(meta.get("generation") or 0):
        raise still_processing(name)
    allowed = int(status.get("disruptionsAllowed") or 0)
    disrupted = status.get("disruptedPods") or {}
    if allowed < 0:
        raise _forbidden(name, "pdb disruptions allowed is negative")
    if len(disrupted) > MAX_DISRUPTED_PODS:
        raise _forbidden(name, "DisruptedPods map too big - too many evictions not confirmed by PDB controller")
    if allowed == 0:
        desired, current = int(status.get("desiredHealthy") or 0), int(status.get("currentHealthy") or 0)
        raise too_many_requests(
            f"The disruption budget {name} needs {desired} healthy pods and has {current} currently", 0
        )
    new = copy.deepcopy(dict(status))
    new["disruptionsAllowed"] = allowed - 1
    if allowed - 1 == 0:
        update_allowed_condition(new, now)
    if not dry_run:
        new["disruptedPods"] = {**disrupted, pod_name: now}
    return new


def disruption_target(now: str) -> JsonObject:
    """Rule 6's pod condition."""
    return {
        "type": "DisruptionTarget",
        "status": "True",
        "reason": "EvictionByEvictionAPI",
        "message": "Eviction API: evicting",
        "lastTransitionTime": now,
    }


def success() -> JsonObject:
    return {"kind": "Status", "apiVersion": "v1", "metadata": {}, "status": "Success"}
