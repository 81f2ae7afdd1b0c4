"""Checks of the fields that steer a pod to a node: tolerations and node affinity on pods, taints on nodes.

Theory of operation: each function returns the ``(field path, message)`` causes of one field, worded as
kube-apiserver words them; :mod:`ambit.apiserver.spec_validation` calls them for pods and pod templates, and
``validation.SPEC_RULES`` calls :func:`validate_node` for nodes. No input raises.

Rules (kube-apiserver's):

1. Taint and toleration keys are qualified names, values label values.
2. Tolerations: operator Exists or Equal (Equal when absent); Exists takes no value; an empty key needs Exists;
   effect empty (all effects) or NoSchedule, PreferNoSchedule, NoExecute; ``tolerationSeconds`` only with
   NoExecute.
3. Taints: key and effect are required; one taint per (key, effect) on a node.
4. Required node affinity: at least one term; requirement operators In, NotIn, Exists, DoesNotExist, Gt, Lt; In
   and NotIn need values, Exists and DoesNotExist take none, Gt and Lt take one integer; ``matchFields`` only on
   ``metadata.name`` with In or NotIn and one value.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

from ambit.apiserver.names import (
    Cause,
    at,
    duplicate,
    forbidden,
    invalid,
    label_value,
    qualified_name,
    required,
    unsupported,
)
from ambit.apiserver.shapes import is_int, object_items

TAINT_EFFECTS = ("NoExecute", "NoSchedule", "PreferNoSchedule")
NODE_SELECTOR_OPERATORS = ("DoesNotExist", "Exists", "Gt", "In", "Lt", "NotIn")


def validate_tolerations(tolerations: Any, path: str) -> list[Cause]:
    """Rule 2, for a pod's ``spec.tolerations``."""
    causes: list[Cause] = []
    for item_path, tol in object_items(tolerations, path, causes):
        key, operator, value = tol.get("key"), tol.get("operator", "Equal"), tol.get("value")
        if key not in (None, ""):
            causes.extend(_key(key, at(item_path, "key")))
        elif operator != "Exists":
            causes.append(
                invalid(
                    at(item_path, "operator"),
                    operator,
                    'operator must be Exists when `key` is empty, which means "match all values and all keys"',
                )
            )
        if operator == "Exists":
            if value not in (None, ""):
                causes.append(
                    invalid(at(item_path, "operator"), tol, "value must be empty when `operator` is 'Exists'")
                )
        elif operator == "Equal":
            if value is not None:
                causes.extend(_value(value, at(item_path, "value")))
        else:
            causes.append(unsupported(at(item_path, "operator"), operator, ("Equal", "Exists")))
        effect = tol.get("effect")
        if effect not in (None, "") and effect not in TAINT_EFFECTS:
            causes.append(unsupported(at(item_path, "effect"), effect, TAINT_EFFECTS))
        seconds = tol.get("tolerationSeconds")
        if seconds is not None:
            if not is_int(seconds):
                causes.append(invalid(at(item_path, "tolerationSeconds"), seconds, "must be an integer"))
            elif effect != "NoExecute":
                causes.append(
                    invalid(
                        at(item_path, "effect"), effect, "effect must be 'NoExecute' when `tolerationSeconds` is set"
                    )
                )
    return causes


def validate_node(obj: Mapping[str, Any]) -> list[Cause]:
    """Rule 3, for a node's ``spec.taints``."""
    causes: list[Cause] = []
    spec = obj.get("spec") or {}
    if not isinstance(spec, Mapping):
        return [invalid("spec", spec, "must be an object")]
    seen: set[tuple[str, str]] = set()
    for item_path, taint in object_items(spec.get("taints"), "spec.taints", causes):
        key, effect = taint.get("key"), taint.get("effect")
        if key in (None, ""):
            causes.append(required(at(item_path, "key")))
        else:
            causes.extend(_key(key, at(item_path, "key")))
        if taint.get("value") is not None:
            causes.extend(_value(taint.get("value"), at(item_path, "value")))
        if effect in (None, ""):
            causes.append(required(at(item_path, "effect")))
        elif effect not in TAINT_EFFECTS:
            causes.append(unsupported(at(item_path, "effect"), effect, TAINT_EFFECTS))
        pair = (str(key), str(effect))
        if pair in seen:
            causes.append(duplicate(item_path, {"key": key, "effect": effect}))
        seen.add(pair)
    if spec.get("unschedulable") is not None and not isinstance(spec.get("unschedulable"), bool):
        causes.append(invalid("spec.unschedulable", spec.get("unschedulable"), "must be a boolean"))
    return causes


def _key(key: Any, path: str) -> list[Cause]:
    if not isinstance(key, str):
        return [invalid(path, key, "must be a string")]
    return [invalid(path, key, msg) for msg in qualified_name(key)]


def _value(value: Any, path: str) -> list[Cause]:
    if not isinstance(value, str):
        return [invalid(path, value, "must be a string")]
    return [invalid(path, value, msg) for msg in label_value(value)]


def validate_affinity(affinity: Any, path: str) -> list[Cause]:
    """Rule 4, for a pod's ``spec.affinity`` (only node affinity's required terms are checked)."""
    causes: list[Cause] = []
    if affinity is None:
        return causes
    if not isinstance(affinity, Mapping):
        return [invalid(path, affinity, "must be an object")]
    node = affinity.get("nodeAffinity")
    if not isinstance(node, Mapping):
        return causes if node is None else [invalid(at(path, "nodeAffinity"), node, "must be an object")]
    req_path = at(at(path, "nodeAffinity"), "requiredDuringSchedulingIgnoredDuringExecution")
    required_terms = node.get("requiredDuringSchedulingIgnoredDuringExecution")
    if required_terms is None:
        return causes
    if not isinstance(required_terms, Mapping):
        return [invalid(req_path, required_terms, "must be an object")]
    terms_path = at(req_path, "nodeSelectorTerms")
    terms = object_items(required_terms.get("nodeSelectorTerms"), terms_path, causes)
    if not terms and not causes:
        causes.append(required(terms_path, "must have at least one node selector term"))
    for term_path, term in terms:
        for expr_path, expr in object_items(term.get("matchExpressions"), at(term_path, "matchExpressions"), causes):
            causes.extend(_requirement(expr, expr_path, fields=False))
        for expr_path, expr in object_items(term.get("matchFields"), at(term_path, "matchFields"), causes):
            causes.extend(_requirement(expr, expr_path, fields=True))
    return causes


def _requirement(expr: Mapping[str, Any], path: str, *, fields: bool) -> list[Cause]:
    causes: list[Cause] = []
    key, op, values = expr.get("key"), expr.get("operator"), expr.get("values")
    if fields:
        if key != "metadata.name":
            causes.append(unsupported(at(path, "key"), key, ("metadata.name",)))
    else:
        causes.extend(_key(key, at(path, "key")))
    if op not in NODE_SELECTOR_OPERATORS:
        return [*causes, unsupported(at(path, "operator"), op, NODE_SELECTOR_OPERATORS)]
    if values is not None and not (isinstance(values, list) and all(isinstance(v, str) for v in values)):
        return [*causes, invalid(at(path, "values"), values, "must be a list of strings")]
    values = values or []
    if fields and (op not in ("In", "NotIn") or len(values) != 1):
        causes.append(invalid(at(path, "values"), values, "must have one element"))
    elif op in ("In", "NotIn") and not values:
        causes.append(required(at(path, "values"), "must be specified when `operator` is 'In' or 'NotIn'"))
    elif op in ("Exists", "DoesNotExist") and values:
        causes.append(
            forbidden(at(path, "values"), "may not be specified when `operator` is 'Exists' or 'DoesNotExist'")
        )
    elif op in ("Gt", "Lt"):
        if len(values) != 1:
            causes.append(
                required(at(path, "values"), "must be specified single value when `operator` is 'Lt' or 'Gt'")
            )
        elif not values[0].lstrip("-").isdigit():
            causes.append(invalid(at(path, "values[0]"), values[0], "must be an integer"))
    return causes
