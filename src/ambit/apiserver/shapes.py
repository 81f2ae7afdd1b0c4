"""Reading fields of a body whose shape is not known yet, for the validators (pure).

Theory of operation: validation runs on whatever JSON a client sent. These helpers read one field as the shape a
rule expects (an integer, an object, a list of objects) and, when it is something else, add one cause to the
caller's list and hand back an empty value, so the rule carries on and reports every other problem too.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

from ambit.apiserver.names import Cause, at, invalid


def is_int(value: Any) -> bool:
    """A JSON integer (``true`` is not one, as in Go)."""
    return isinstance(value, int) and not isinstance(value, bool)


def object_items(value: Any, path: str, causes: list[Cause]) -> list[tuple[str, Mapping[str, Any]]]:
    """The (path, item) pairs of a list of objects; anything else in it becomes a cause."""
    if value is None:
        return []
    if not isinstance(value, list):
        causes.append(invalid(path, value, "must be a list"))
        return []
    items = []
    for i, item in enumerate(value):
        if isinstance(item, Mapping):
            items.append((at(path, i), item))
        else:
            causes.append(invalid(at(path, i), item, "must be an object"))
    return items


def as_object(value: Any, path: str, causes: list[Cause]) -> Mapping[str, Any]:
    """``value`` as an object (absent: empty); anything else becomes a cause."""
    if value is None:
        return {}
    if not isinstance(value, Mapping):
        causes.append(invalid(path, value, "must be an object"))
        return {}
    return value
