"""Labels and selectors as controllers read them off objects (pure).

Matching is :mod:`ambit.model.labels`. A Service's ``spec.selector`` is a plain map, and an empty one is "no
selector" (its endpoints are managed by someone else), which :func:`service_selector` tells apart.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any


def labels_of(obj: Mapping[str, Any]) -> dict[str, str]:
    labels = (obj.get("metadata") or {}).get("labels")
    return labels if isinstance(labels, dict) else {}


def service_selector(service: Mapping[str, Any]) -> dict[str, str] | None:
    """The Service's selector, or None when it has none (its endpoints are then managed by someone else)."""
    selector = (service.get("spec") or {}).get("selector")
    if not isinstance(selector, dict) or not selector:
        return None
    return {str(k): str(v) for k, v in selector.items()}
