"""How stored values become table cells: ages, timestamps, label lists, and tolerant field access.

Theory of operation: kubectl shows what the server puts in each cell verbatim, so the formatting rules of
kube-apiserver's printers live here, written once: ``human_duration`` for every age, ``since`` for a timestamp's
age, the ``<none>`` / ``<unknown>`` placeholders, and selector syntax. The ``as_*`` accessors read a field of
an object of unknown shape and fall back to an empty value instead of raising.

Invariant: nothing here raises on any JSON-shaped input, and nothing reads a clock (``now`` is passed in).
"""

from __future__ import annotations

import re
from collections.abc import Mapping
from datetime import UTC, datetime
from typing import Any

Cell = str | int | float | bool | None
"""A value in a table row: kubectl prints strings as they are and numbers in decimal; None is an empty cell."""

# ---- time ------------------------------------------------------------------------------------------------


def human_duration(seconds: float) -> str:
    """kubectl's compact duration (apimachinery ``duration.HumanDuration``): more detail when it is small.

    Up to 2 minutes in seconds; ``XmYs`` below 10 minutes; minutes below 3 hours; ``XhYm`` below 8 hours;
    hours below 2 days; ``XdYh`` below 8 days; days below 2 years; ``XyYd`` below 8 years; then years.
    A zero second part is left out (``4m``, ``3h``, ``2d``). Up to a second in the future counts as now.
    """
    total = int(seconds)  # truncates toward zero, like Go's int(d.Seconds())
    if total < -1:
        return "<invalid>"
    if total < 0:
        return "0s"
    if total < 120:
        return f"{total}s"
    minutes = total // 60
    if minutes < 10:
        return _pair(minutes, "m", total % 60, "s")
    if minutes < 180:
        return f"{minutes}m"
    hours = minutes // 60
    if hours < 8:
        return _pair(hours, "h", minutes % 60, "m")
    if hours < 48:
        return f"{hours}h"
    days = hours // 24
    if hours < 24 * 8:
        return _pair(days, "d", hours % 24, "h")
    if days < 365 * 2:
        return f"{days}d"
    if days < 365 * 8:
        return _pair(days // 365, "y", days % 365, "d")
    return f"{days // 365}y"


def _pair(big: int, big_unit: str, small: int, small_unit: str) -> str:
    return f"{big}{big_unit}{small}{small_unit}" if small else f"{big}{big_unit}"


_FRACTION = re.compile(r"\.(\d+)")


def parse_timestamp(value: Any) -> float | None:
    """Seconds since the epoch of an RFC 3339 timestamp (``metav1.Time`` or ``MicroTime``), else None."""
    if not isinstance(value, str) or not value:
        return None
    # fromisoformat takes at most 6 fractional digits; RFC 3339 allows any number.
    text = _FRACTION.sub(lambda m: "." + m.group(1)[:6].ljust(6, "0"), value, count=1)
    try:
        parsed = datetime.fromisoformat(text)
    except ValueError:
        return None
    if parsed.tzinfo is None:
        parsed = parsed.replace(tzinfo=UTC)
    return parsed.timestamp()


def since(value: Any, now: float) -> str:
    """Age of a timestamp as kubectl prints it; ``<unknown>`` when absent or unreadable."""
    then = parse_timestamp(value)
    return "<unknown>" if then is None else human_duration(now - then)


def age(obj: Mapping[str, Any], now: float) -> str:
    return since(as_map(obj.get("metadata")).get("creationTimestamp"), now)


def created_at(obj: Mapping[str, Any]) -> str:
    """The creation time as RFC 3339 UTC; Go's zero time when unknown, as kube-apiserver prints it."""
    then = parse_timestamp(as_map(obj.get("metadata")).get("creationTimestamp"))
    if then is None:
        return "0001-01-01T00:00:00Z"
    return datetime.fromtimestamp(then, UTC).strftime("%Y-%m-%dT%H:%M:%SZ")


# ---- shape-tolerant field access ------------------------------------------------------------------------------


def as_map(value: Any) -> Mapping[str, Any]:
    return value if isinstance(value, Mapping) else {}


def as_list(value: Any) -> list[Any]:
    return list(value) if isinstance(value, list | tuple) else []


def as_maps(value: Any) -> list[Mapping[str, Any]]:
    return [item for item in as_list(value) if isinstance(item, Mapping)]


def as_str(value: Any, default: str = "") -> str:
    return value if isinstance(value, str) else default


def as_int(value: Any, default: int = 0) -> int:
    if isinstance(value, bool):
        return default
    if isinstance(value, int):
        return value
    if isinstance(value, float) and value.is_integer():
        return int(value)
    return default


def name_of(obj: Mapping[str, Any]) -> str:
    return as_str(as_map(obj.get("metadata")).get("name"))


def format_labels(labels: Any) -> str:
    """``k=v`` pairs sorted by key, comma-joined; ``<none>`` when empty (``labels.FormatLabels``)."""
    pairs = sorted(f"{k}={v}" for k, v in as_map(labels).items() if isinstance(v, str))
    return ",".join(pairs) or "<none>"


def format_label_selector(selector: Any) -> str:
    """A LabelSelector in selector-string syntax (``app=web,tier in (a,b),!legacy``), or ``<none>``."""
    sel = as_map(selector)
    reqs = [(k, f"{k}={v}") for k, v in as_map(sel.get("matchLabels")).items() if isinstance(v, str)]
    for expr in as_maps(sel.get("matchExpressions")):
        key, op = as_str(expr.get("key")), as_str(expr.get("operator"))
        values = ",".join(sorted(v for v in as_list(expr.get("values")) if isinstance(v, str)))
        shown = {
            "In": f"{key} in ({values})",
            "NotIn": f"{key} notin ({values})",
            "Exists": key,
            "DoesNotExist": f"!{key}",
        }.get(op)
        if key and shown:
            reqs.append((key, shown))
    return ",".join(text for _, text in sorted(reqs)) or "<none>"


def abbreviate(items: list[str], limit: int = 3, empty: str = "<none>") -> str:
    """At most ``limit`` items, then ``+ N more...``, the way kubectl abbreviates endpoint lists."""
    if not items:
        return empty
    shown = ",".join(items[:limit])
    return f"{shown} + {len(items) - limit} more..." if len(items) > limit else shown
