"""Values as Go's ``text/template`` sees them: truth, printing, comparison, and the proto messages istiod hands its
templates. Pure.

Rules:

1. Template data is JSON-shaped Python (dict, list, str, int, float, bool, None) plus :class:`Message`, a proto
   message (``.ProxyConfig``, ``.MeshConfig``) held as its JSON form, whose fields a template names in Go's
   spelling (``.ProxyMetadata`` is the JSON field ``proxyMetadata``).
2. None is Go's missing value: printed ``<no value>``, false, and a field of it is None again (the subset follows
   ``missingkey=default`` without the nil-pointer errors, so that a chain through an absent Helm value is empty).
3. Truth as Go's: false, 0, None and empty strings, lists and maps are false; everything else is true. A
   :class:`Message` is judged as a map (istiod's templates test the map fields of messages, ``ProxyMetadata``).
4. Printing as ``fmt.Print``: integral floats print without exponent below 1e21, lists as ``[a b]``, maps as
   ``map[k:v]`` in key order.
5. JSON as Go's ``encoding/json``: keys sorted, compact, and ``<``, ``>``, ``&`` escaped.
"""

from __future__ import annotations

import json
import math
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

__all__ = ["NO_VALUE", "Message", "go_json", "go_print", "plain", "truth"]

NO_VALUE = "<no value>"


@dataclass(frozen=True, slots=True)
class Message:
    """A proto message: ``fields`` is its JSON form (rule 1)."""

    fields: Mapping[str, Any]

    def get(self, name: str) -> Any:
        value = self.fields[name] if name in self.fields else self.fields.get(name[:1].lower() + name[1:])
        return Message(value) if isinstance(value, Mapping) else value


def plain(value: Any) -> Any:
    """``value`` with every :class:`Message` turned into its JSON form."""
    if isinstance(value, Message):
        return {key: plain(item) for key, item in value.fields.items()}
    if isinstance(value, Mapping):
        return {key: plain(item) for key, item in value.items()}
    if isinstance(value, list | tuple):
        return [plain(item) for item in value]
    return value


def truth(value: Any) -> bool:
    """Rule 3."""
    if value is None or value is False:
        return False
    if isinstance(value, Message):
        return len(value.fields) > 0
    if isinstance(value, str | list | tuple | Mapping):
        return len(value) > 0
    if isinstance(value, int | float):
        return value != 0
    return True


def _float(value: float) -> str:
    if math.isfinite(value) and value == int(value) and abs(value) < 1e21:
        return str(int(value))
    text = repr(value)
    if "e" in text:
        mantissa, _, exponent = text.partition("e")
        sign = "-" if exponent.startswith("-") else "+"
        digits = exponent.lstrip("+-").rjust(2, "0")
        return f"{mantissa}e{sign}{digits}"
    return text.replace("inf", "Inf").replace("nan", "NaN")


def go_print(value: Any, missing: str = NO_VALUE) -> str:
    """Rule 4; ``missing`` is how None prints (``<no value>`` in output, ``<nil>`` through ``fmt.Sprint``)."""
    if value is None:
        return missing
    if isinstance(value, str):
        return value
    if isinstance(value, bool):
        return "true" if value else "false"
    if isinstance(value, int):
        return str(value)
    if isinstance(value, float):
        return _float(value)
    if isinstance(value, Message):
        return "&{" + go_print(dict(value.fields), "<nil>")[4:-1] + "}"
    if isinstance(value, Mapping):
        items = sorted(value.items(), key=lambda item: str(item[0]))
        return "map[" + " ".join(f"{key}:{go_print(item, '<nil>')}" for key, item in items) + "]"
    if isinstance(value, list | tuple):
        return "[" + " ".join(go_print(item, "<nil>") for item in value) + "]"
    return str(value)


def go_json(value: Any) -> str:
    """Rule 5."""
    text = json.dumps(plain(value), sort_keys=True, separators=(",", ":"), ensure_ascii=False, allow_nan=False)
    for char, escaped in (("<", "\\u003c"), (">", "\\u003e"), ("&", "\\u0026"), ("\u2028", "\\u2028"),
                          ("\u2029", "\\u2029")):  # fmt: skip
        text = text.replace(char, escaped)
    return text
