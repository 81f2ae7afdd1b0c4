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


def object_labels(obj: Obj) -> dict[str, str]:
    """An API object's ``metadata.labels`` as strings (anything else in the input is ignored)."""
    return strings(mapping(obj.get("metadata")).get("labels"))


def object_annotations(obj: Obj) -> dict[str, str]:
    """An API object's ``metadata.annotations`` as strings (anything else in the input is ignored)."""
    return strings(mapping(obj.get("metadata")).get("annotations"))


def metadata_text(obj: Obj, key: str) -> str:
    """A string field of an object's ``metadata`` (``name``, ``namespace``...), ``""`` when it is not one."""
    return text(mapping(obj.get("metadata")).get(key))


__all__ = [
    "Obj",
    "mapping",
    "metadata_text",
    "object_annotations",
    "object_key",
    "object_labels",
    "strings",
    "text",
]
