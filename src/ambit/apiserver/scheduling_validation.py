"""Checks of the kinds and fields that decide where pods run and how they roll out, as kube-apiserver words them.

Theory of operation: like :mod:`ambit.apiserver.spec_validation` (whose helpers these rules share), each
``validate_*`` takes the whole object and returns its causes; ``validation.SPEC_RULES`` names the kinds. Every
rule reads defensively, so one request reports every problem and no input raises.

Rules kept (kube-apiserver's, for these fields):

1. int-or-percent fields (``maxUnavailable``, ``maxSurge``, ``minAvailable``): a non-negative integer or
   ``[0-9]+%``, at most 100%.
2. DaemonSet: the workload rules, plus ``updateStrategy.type`` RollingUpdate or OnDelete; RollingUpdate's
   ``rollingUpdate`` (defaulted when absent) has exactly one of ``maxUnavailable`` and ``maxSurge`` non-zero;
   OnDelete takes no ``rollingUpdate``; ``minReadySeconds`` and ``revisionHistoryLimit`` are not negative.
3. ControllerRevision: ``data`` is given; ``revision`` is an integer >= 0 (immutability of ``data`` is the
   strategy's, it compares with the stored object).
4. PriorityClass: ``value`` an int32; names starting ``system-`` are reserved for the built-in classes (with their
   values); other classes stay at or below 1000000000; ``preemptionPolicy`` PreemptLowerPriority or Never.
   One ``globalDefault`` at most is the strategy's rule (it reads the store).
5. PodDisruptionBudget: not both ``minAvailable`` and ``maxUnavailable``; each as rule 1; a well-formed selector.
6. StatefulSet: the workload rules (``serviceName`` may be empty; when given it is a DNS-1123 label, as it becomes
   the pods' ``subdomain``), plus ``podManagementPolicy`` OrderedReady or Parallel; ``updateStrategy.type``
   RollingUpdate or OnDelete, ``rollingUpdate`` only with RollingUpdate, its ``partition`` not negative and its
   ``maxUnavailable`` (rule 1) above 0; ``minReadySeconds``, ``revisionHistoryLimit`` and ``ordinals.start`` not
   negative; each ``persistentVolumeClaimRetentionPolicy`` field Retain or Delete; each
   ``volumeClaimTemplates`` entry an object with a ``metadata.name`` (a DNS-1123 subdomain), names unique, and a
   spec that passes a claim's rules (:mod:`ambit.apiserver.storage_validation`). Which
   spec fields an update may change is the strategy's rule (it compares with the stored object).

Tolerations, taints and node affinity are :mod:`ambit.apiserver.placement_validation`'s.
"""

from __future__ import annotations

import re
from collections.abc import Mapping
from typing import Any

from ambit.apiserver.names import (
    Cause,
    at,
    dns1123_label,
    dns1123_subdomain,
    duplicate,
    forbidden,
    invalid,
    required,
    unsupported,
)
from ambit.apiserver.shapes import as_object, is_int, object_items
from ambit.apiserver.spec_validation import validate_label_selector, validate_workload
from ambit.apiserver.storage_validation import validate_claim_spec

SYSTEM_PRIORITY_CLASSES = {"system-node-critical": 2000001000, "system-cluster-critical": 2000000000}
"""The built-in PriorityClasses kube-apiserver creates at start, and their values."""
HIGHEST_USER_PRIORITY = 1000000000
PREEMPTION_POLICIES = ("Never", "PreemptLowerPriority")
POD_MANAGEMENT_POLICIES = ("OrderedReady", "Parallel")
CLAIM_RETENTION_POLICIES = ("Delete", "Retain")
_PERCENT = re.compile(r"[0-9]+%")
_PERCENT_MESSAGE = (
    "a valid percent string must be a numeric string followed by an ending '%' (e.g. '1%',  or '93%', "
    "regex used for validation is '[0-9]+%')"
)
_INT32_MAX = 2**31 - 1


def int_or_percent(value: Any, path: str) -> list[Cause]:
    """Rule 1."""
    if isinstance(value, str):
        if not _PERCENT.fullmatch(value):
            return [invalid(path, value, _PERCENT_MESSAGE)]
        if int(value[:-1]) > 100:
            return [invalid(path, value, "must not be greater than 100%")]
        return []
    if is_int(value):
        return [invalid(path, value, "must be greater than or equal to 0")] if value < 0 else []
    return [invalid(path, value, "must be an integer or percentage (e.g '5%')")]


def _is_zero(value: Any) -> bool:
    if isinstance(value, str) and _PERCENT.fullmatch(value):
        return int(value[:-1]) == 0
    return value is None or (is_int(value) and value == 0)


def _non_negative(spec: Mapping[str, Any], key: str, path: str) -> list[Cause]:
    value = spec.get(key)
    if value is not None and (not is_int(value) or value < 0):
        return [invalid(at(path, key), value, "must be greater than or equal to 0")]
    return []


def validate_daemon_set(obj: Mapping[str, Any]) -> list[Cause]:
    """Rule 2."""
    causes = validate_workload(obj)
    spec = obj.get("spec")
    if not isinstance(spec, Mapping):
        return causes
    causes.extend(_non_negative(spec, "minReadySeconds", "spec"))
    causes.extend(_non_negative(spec, "revisionHistoryLimit", "spec"))
    strategy = as_object(spec.get("updateStrategy"), "spec.updateStrategy", causes)
    kind = strategy.get("type", "RollingUpdate")
    rolling = strategy.get("rollingUpdate")
    path = "spec.updateStrategy.rollingUpdate"
    if kind == "OnDelete":
        if rolling is not None:
            causes.append(forbidden(path, "may not be specified when strategy `type` is 'OnDelete'"))
    elif kind == "RollingUpdate":
        if rolling is not None:  # absent: the defaults (maxUnavailable 1, maxSurge 0) apply
            rolling = as_object(rolling, path, causes)
            unavailable, surge = rolling.get("maxUnavailable"), rolling.get("maxSurge")
            for key, value in (("maxUnavailable", unavailable), ("maxSurge", surge)):
                if value is not None:
                    causes.extend(int_or_percent(value, at(path, key)))
            if not _is_zero(unavailable) and not _is_zero(surge):
                causes.append(invalid(at(path, "maxSurge"), surge, "may not be set when maxUnavailable is non-zero"))
            elif _is_zero(unavailable) and _is_zero(surge):
                causes.append(required(at(path, "maxUnavailable"), "cannot be 0 when maxSurge is 0"))
    else:
        causes.append(unsupported("spec.updateStrategy", kind, ("OnDelete", "RollingUpdate")))
    return causes


def validate_controller_revision(obj: Mapping[str, Any]) -> list[Cause]:
    """Rule 3."""
    causes: list[Cause] = []
    if obj.get("data") is None:
        causes.append(required("data", "data is mandatory"))
    revision = obj.get("revision")
    if revision is None:
        causes.append(required("revision"))
    elif not is_int(revision) or revision < 0:
        causes.append(invalid("revision", revision, "must be greater than or equal to 0"))
    return causes


def validate_priority_class(obj: Mapping[str, Any]) -> list[Cause]:
    """Rule 4."""
    causes: list[Cause] = []
    value = obj.get("value")
    if value is None:
        causes.append(required("value"))
    elif not is_int(value) or not -_INT32_MAX - 1 <= value <= _INT32_MAX:
        causes.append(invalid("value", value, "must be a 32-bit integer"))
        value = None
    name = str((obj.get("metadata") or {}).get("name") or "") if isinstance(obj.get("metadata"), Mapping) else ""
    if name.startswith("system-"):
        known = SYSTEM_PRIORITY_CLASSES.get(name)
        if known is None:
            why = f"{name} is not a known system priority class"
        elif value != known:
            why = f"value of {name} PriorityClass must be {known}"
        elif obj.get("globalDefault"):
            why = f"globalDefault of {name} must be false"
        else:
            why = ""
        if why:
            causes.append(
                forbidden(
                    "metadata.name",
                    f"priority class names with 'system-' prefix are reserved for system use only. error: {why}",
                )
            )
    elif value is not None and value > HIGHEST_USER_PRIORITY:
        causes.append(
            forbidden("value", f"maximum allowed value of a user defined priority is {HIGHEST_USER_PRIORITY}")
        )
    policy = obj.get("preemptionPolicy")
    if policy is not None and policy not in PREEMPTION_POLICIES:
        causes.append(unsupported("preemptionPolicy", policy, PREEMPTION_POLICIES))
    default = obj.get("globalDefault")
    if default is not None and not isinstance(default, bool):
        causes.append(invalid("globalDefault", default, "must be a boolean"))
    return causes


def validate_pod_disruption_budget(obj: Mapping[str, Any]) -> list[Cause]:
    """Rule 5."""
    causes: list[Cause] = []
    spec = as_object(obj.get("spec"), "spec", causes)
    min_available, max_unavailable = spec.get("minAvailable"), spec.get("maxUnavailable")
    if min_available is not None and max_unavailable is not None:
        causes.append(invalid("spec.minAvailable", min_available, "minAvailable and maxUnavailable cannot be both set"))
    for key, value in (("minAvailable", min_available), ("maxUnavailable", max_unavailable)):
        if value is not None:
            causes.extend(int_or_percent(value, at("spec", key)))
    if spec.get("selector") is not None:
        causes.extend(validate_label_selector(spec.get("selector"), "spec.selector"))
    policy = spec.get("unhealthyPodEvictionPolicy")
    if policy is not None and policy not in ("AlwaysAllow", "IfHealthyBudget"):
        causes.append(unsupported("spec.unhealthyPodEvictionPolicy", policy, ("AlwaysAllow", "IfHealthyBudget")))
    return causes


def validate_stateful_set(obj: Mapping[str, Any]) -> list[Cause]:
    """Rule 6."""
    causes = validate_workload(obj)
    spec = obj.get("spec")
    if not isinstance(spec, Mapping):
        return causes
    service = spec.get("serviceName")
    if service is not None and not isinstance(service, str):
        causes.append(invalid("spec.serviceName", service, "must be a string"))
    elif service:
        causes.extend(invalid("spec.serviceName", service, m) for m in dns1123_label(service))
    policy = spec.get("podManagementPolicy")
    if policy is not None and policy not in POD_MANAGEMENT_POLICIES:
        causes.append(invalid("spec.podManagementPolicy", policy, "must be 'OrderedReady' or 'Parallel'"))
    for key in ("minReadySeconds", "revisionHistoryLimit"):
        causes.extend(_non_negative(spec, key, "spec"))
    ordinals = spec.get("ordinals")
    if ordinals is not None:
        causes.extend(_non_negative(as_object(ordinals, "spec.ordinals", causes), "start", "spec.ordinals"))
    causes.extend(_stateful_strategy(spec.get("updateStrategy")))
    retention = spec.get("persistentVolumeClaimRetentionPolicy")
    if retention is not None:
        retention = as_object(retention, "spec.persistentVolumeClaimRetentionPolicy", causes)
        for key in ("whenDeleted", "whenScaled"):
            value = retention.get(key)
            if value is not None and value not in CLAIM_RETENTION_POLICIES:
                path = at("spec.persistentVolumeClaimRetentionPolicy", key)
                causes.append(unsupported(path, value, CLAIM_RETENTION_POLICIES))
    names: set[str] = set()
    for path, claim in object_items(spec.get("volumeClaimTemplates"), "spec.volumeClaimTemplates", causes):
        meta = as_object(claim.get("metadata"), at(path, "metadata"), causes)
        name = meta.get("name")
        name_path = at(at(path, "metadata"), "name")
        if name in (None, ""):
            causes.append(required(name_path))
        elif not isinstance(name, str):
            causes.append(invalid(name_path, name, "must be a string"))
        elif name in names:
            causes.append(duplicate(name_path, name))
        else:
            names.add(name)
            causes.extend(invalid(name_path, name, m) for m in dns1123_subdomain(name))
        causes.extend(validate_claim_spec(claim.get("spec"), at(path, "spec")))
    return causes


def _stateful_strategy(strategy: Any) -> list[Cause]:
    causes: list[Cause] = []
    strategy = as_object(strategy, "spec.updateStrategy", causes)
    kind = strategy.get("type", "RollingUpdate")
    rolling = strategy.get("rollingUpdate")
    path = "spec.updateStrategy.rollingUpdate"
    if kind == "OnDelete":
        if rolling is not None:
            causes.append(invalid(path, rolling, "only allowed for updateStrategy 'RollingUpdate'"))
    elif kind == "RollingUpdate":
        rolling = as_object(rolling, path, causes)
        causes.extend(_non_negative(rolling, "partition", path))
        unavailable = rolling.get("maxUnavailable")
        if unavailable is not None:
            found = int_or_percent(unavailable, at(path, "maxUnavailable"))
            if not found and _is_zero(unavailable):
                found = [invalid(at(path, "maxUnavailable"), unavailable, "must be greater than 0")]
            causes.extend(found)
    else:
        causes.append(invalid("spec.updateStrategy", kind, "must be 'RollingUpdate' or 'OnDelete'"))
    return causes
