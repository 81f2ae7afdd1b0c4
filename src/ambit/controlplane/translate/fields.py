"""Lenient readers of API objects' fields, for the translators.

An object from the API server has passed validation, but the translators still meet fields of the wrong type (an
object stored before a schema tightened, a CRD without a structural schema): a field of the wrong type reads as
empty, the translator goes on, and validation or status reports the object, never a traceback here.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

Obj = Mapping[str, Any]


def mapping(value: Any) -> Obj:
    """``value`` if it is a mapping, else an empty one."""
    return value if isinstance(value, Mapping) else {}


def sequence(value: Any) -> list[Any]:
    """``value`` if it is a list, else an empty one."""
    return value if isinstance(value, list) else []


def text(value: Any) -> str:
    """``value`` if it is a string, else ``""``."""
    return value if isinstance(value, str) else ""


def strings(value: Any) -> dict[str, str]:
    """The string-to-string entries of a mapping such as labels or a selector; others are left out."""
    return {k: v for k, v in mapping(value).items() if isinstance(k, str) and isinstance(v, str)}


def object_key(obj: Obj) -> str:
    """``namespace/name`` of an object."""
    meta = mapping(obj.get("metadata"))
    return f"{text(meta.get('namespace'))}/{text(meta.get('name'))}"


__all__ = ["Obj", "mapping", "object_key", "strings", "text"]
