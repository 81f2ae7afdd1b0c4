"""The Priority admission step on Pod create, and the built-in PriorityClasses (pure).

Theory of operation: kube-apiserver's ``Priority`` admission plugin resolves a new pod's
``spec.priorityClassName`` to ``spec.priority`` and ``spec.preemptionPolicy`` before the pod is stored;
:func:`admit_pod` does the same over the PriorityClasses it is handed (the caller reads them from the store).

Rules:

1. A named class must exist: otherwise the pod is refused (403) with ``no PriorityClass with name <n> was found``.
2. No class named: the ``globalDefault`` class applies (its name is written into the pod); with none, priority 0
   and PreemptLowerPriority.
3. A pod that carries ``spec.priority`` or ``spec.preemptionPolicy`` different from what its class gives is
   refused, as kube refuses it (the fields are the plugin's to set).
4. :data:`BUILTIN_CLASSES` exist from server start: ``system-node-critical`` and ``system-cluster-critical``.
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping
from typing import Any

from ambit.apiserver import errors
from ambit.apiserver.scheduling_validation import SYSTEM_PRIORITY_CLASSES

DEFAULT_POLICY = "PreemptLowerPriority"


def builtin_classes() -> list[dict[str, Any]]:
    """The PriorityClasses kube-apiserver creates at start (fresh objects on every call)."""
    return [
        {
            "apiVersion": "scheduling.k8s.io/v1",
            "kind": "PriorityClass",
            "metadata": {"name": name},
            "value": value,
            "description": "Used for system critical pods that must not be moved from their current node."
            if name == "system-node-critical"
            else "Used for system critical pods that must run in the cluster, but can be moved to another node "
            "if necessary.",
        }
        for name, value in SYSTEM_PRIORITY_CLASSES.items()
    ]


def find_global_default(classes: Iterable[Mapping[str, Any]]) -> Mapping[str, Any] | None:
    """The class marked ``globalDefault`` (the lowest value if, against the rules, several are)."""
    defaults = [c for c in classes if c.get("globalDefault") is True]
    return min(defaults, key=lambda c: int(c.get("value") or 0)) if defaults else None


def admit_pod(pod: dict[str, Any], classes: Iterable[Mapping[str, Any]]) -> None:
    """Set the pod's priority fields in place (rules 1-3); raises :class:`errors.ApiError` when refused."""
    spec = pod.get("spec")
    if not isinstance(spec, dict):
        return
    name = str((pod.get("metadata") or {}).get("name") or "")
    by_name = {str((c.get("metadata") or {}).get("name")): c for c in classes}
    wanted = spec.get("priorityClassName")
    if wanted:
        found = by_name.get(str(wanted))
        if found is None:
            raise errors.forbidden(f'pods "{name}" is forbidden: no PriorityClass with name {wanted} was found')
    else:
        found = find_global_default(by_name.values())
        if found is not None:
            spec["priorityClassName"] = (found.get("metadata") or {}).get("name")
    value = int(found.get("value") or 0) if found is not None else 0
    policy = str(found.get("preemptionPolicy") or DEFAULT_POLICY) if found is not None else DEFAULT_POLICY
    if spec.get("priority") is not None and spec.get("priority") != value:
        raise errors.forbidden(
            f'pods "{name}" is forbidden: the integer value of priority ({spec["priority"]}) must not be provided '
            f"in pod spec; priority admission controller computed {value} from the given PriorityClass name"
        )
    if spec.get("preemptionPolicy") is not None and spec.get("preemptionPolicy") != policy:
        raise errors.forbidden(
            f'pods "{name}" is forbidden: the string value of PreemptionPolicy ({spec["preemptionPolicy"]}) must '
            f"not be provided in pod spec; priority admission controller computed {policy} from the given "
            "PriorityClass name"
        )
    spec["priority"] = value
    spec["preemptionPolicy"] = policy
