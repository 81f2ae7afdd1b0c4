"""Label selectors as controllers read them (pure).

Two shapes: a Service's ``spec.selector`` is a plain map (every pair must match; an empty map selects nothing
for a Service, which is "no selector"); a workload's ``spec.selector`` is a LabelSelector (``matchLabels`` and
``matchExpressions`` with ``In``, ``NotIn``, ``Exists``, ``DoesNotExist``; an empty LabelSelector selects
everything, as in apimachinery). A malformed selector selects nothing, so a bad object never grabs pods.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any


def labels_of(obj: Mapping[str, Any]) -> dict[str, str]:
    labels = (obj.get("metadata") or {}).get("labels")
    return labels if isinstance(labels, dict) else {}


def map_matches(selector: Mapping[str, Any], labels: Mapping[str, Any]) -> bool:
    """A plain map selector: every pair present and equal."""
    return all(labels.get(k) == v for k, v in selector.items())


def selector_matches(selector: Any, labels: Mapping[str, Any]) -> bool:
    """A LabelSelector (``matchLabels`` / ``matchExpressions``)."""
    if not isinstance(selector, Mapping):
        return False
    match_labels = selector.get("matchLabels") or {}
    if not isinstance(match_labels, Mapping) or not map_matches(match_labels, labels):
        return False
    expressions = selector.get("matchExpressions") or []
    if not isinstance(expressions, list):
        return False
    return all(_expression_matches(expr, labels) for expr in expressions)


def _expression_matches(expr: Any, labels: Mapping[str, Any]) -> bool:
    if not isinstance(expr, Mapping):
        return False
    key, operator = expr.get("key"), expr.get("operator")
    values = expr.get("values") or []
    if not isinstance(key, str) or not isinstance(values, list):
        return False
    if operator == "In":
        return key in labels and labels[key] in values
    if operator == "NotIn":
        return key not in labels or labels[key] not in values
    if operator == "Exists":
        return key in labels
    if operator == "DoesNotExist":
        return key not in labels
    return False


def service_selector(service: Mapping[str, Any]) -> dict[str, str] | None:
    """The Service's selector, or None when it has none (its endpoints are then managed by someone else)."""
    selector = (service.get("spec") or {}).get("selector")
    if not isinstance(selector, dict) or not selector:
        return None
    return {str(k): str(v) for k, v in selector.items()}
