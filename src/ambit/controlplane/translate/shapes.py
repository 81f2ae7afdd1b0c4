"""The shape of a user's spec: reading lists, mappings and strings out of a decoded manifest, or saying which field
is wrong.

Theory of operation: the translators read specs that any namespace user wrote, through an API server that only
checks them against a loose schema (or none). Every read of a field goes through one of these readers, which
return the value in the type the translator expects (an absent field reads as empty) or raise :class:`ShapeError`
naming the field's path (``spec.rules[0].to``) and what was wrong. A translator catches it at the object's edge
and reports the object as skipped; nothing about a bad spec reaches a proxy, and nothing raises further.

Invariants: pure; never coerces a value of the wrong type into the right one.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

__all__ = ["ShapeError", "list_of", "mapping", "strings", "text"]


class ShapeError(Exception):
    """A field of a spec does not have the shape the translation needs."""

    def __init__(self, field: str, reason: str) -> None:
        super().__init__(f"{field}: {reason}")
        self.field, self.reason = field, reason


def list_of(value: object, path: str) -> list[Any]:
    """A list field; absent reads as ``[]``."""
    if value is None:
        return []
    if not isinstance(value, list):
        raise ShapeError(path, f"expected a list, got {type(value).__name__}")
    return value


def mapping(value: object, path: str, *, required: bool = False) -> Mapping[str, Any]:
    """A mapping field; absent reads as ``{}`` unless ``required``."""
    if value is None and not required:
        return {}
    if not isinstance(value, Mapping):
        raise ShapeError(path, f"expected a mapping, got {type(value).__name__}")
    return value


def strings(value: object, path: str) -> list[str]:
    """A list of strings; absent reads as ``[]``."""
    out = []
    for index, item in enumerate(list_of(value, path)):
        if not isinstance(item, str):
            raise ShapeError(f"{path}[{index}]", f"expected a string, got {type(item).__name__}")
        out.append(item)
    return out


def text(value: object, path: str, *, required: bool = False) -> str:
    """A string field; absent reads as ``""``, which ``required`` refuses."""
    if value is None:
        value = ""
    if not isinstance(value, str):
        raise ShapeError(path, f"expected a string, got {type(value).__name__}")
    if required and not value:
        raise ShapeError(path, "required")
    return value
