"""A DestinationRule's ``loadBalancer.localityLbSetting`` read from the manifest into
:class:`~ambit.model.locality_lb.LocalityLbSetting`.

Theory of operation: pure. :func:`read_locality_lb` reads the four fields through :mod:`.shapes`, then judges the
setting as istiod's validation does (:func:`~ambit.model.locality_lb.setting_problems`); the first problem raises
:class:`~ambit.controlplane.translate.shapes.ShapeError` naming the field, so the translation skips the rule and
the webhook refuses it. Lists are measured before they are walked, so an oversized object costs little.

Rules:

1. ``enabled`` is true or false (absent: true). ``distribute`` is a list of ``{from, to}``, ``to`` a mapping of
   locality to a whole number; ``failover`` a list of ``{from, to}`` regions; ``failoverPriority`` a list of
   strings.
2. A ``failoverPriority`` label that Ambit's workloads do not carry (not one of
   :data:`~ambit.model.locality_lb.TOPOLOGY_LABELS`) is kept, and noted: it compares as empty on both sides.
3. ``failover`` or ``failoverPriority`` without ``outlierDetection`` in the same traffic policy is noted, as
   istiod warns: without it nothing fails over (the policy's merge may still bring one from the rule's top level).
"""

from __future__ import annotations

from typing import Any

from ambit.controlplane.translate import shapes
from ambit.model.locality_lb import (
    MAX_DISTRIBUTE,
    MAX_FAILOVER,
    MAX_FAILOVER_PRIORITY,
    TOPOLOGY_LABELS,
    LocalityDistribute,
    LocalityFailover,
    LocalityLbSetting,
    setting_problems,
)

__all__ = ["read_locality_lb"]

_MAX_TO = 100
"""``to`` entries: each weighs at least 1 and they add up to 100."""


def _bounded(value: Any, path: str, limit: int) -> list[Any]:
    items = shapes.list_of(value, path)
    if len(items) > limit:
        raise shapes.ShapeError(path, f"more than {limit} entries")
    return items


def read_locality_lb(value: Any, path: str) -> tuple[LocalityLbSetting, list[tuple[str, str]]]:
    """The setting at ``path`` and its notes (rules 2-3, without the outlier check: :func:`failover_note`)."""
    spec = shapes.mapping(value, path)
    enabled = spec.get("enabled")
    if enabled is not None and not isinstance(enabled, bool):
        raise shapes.ShapeError(f"{path}.enabled", f"expected true or false, got {enabled!r}")
    distribute = []
    for index, item in enumerate(_bounded(spec.get("distribute"), f"{path}.distribute", MAX_DISTRIBUTE)):
        at = f"{path}.distribute[{index}]"
        entry = shapes.mapping(item, at)
        to = shapes.mapping(entry.get("to"), f"{at}.to")
        if len(to) > _MAX_TO:
            raise shapes.ShapeError(f"{at}.to", f"more than {_MAX_TO} localities")
        weights = []
        for name, weight in to.items():
            if not isinstance(name, str) or isinstance(weight, bool) or not isinstance(weight, int):
                raise shapes.ShapeError(f"{at}.to", f"expected locality: weight, got {name!r}: {weight!r}")
            weights.append((name, weight))
        distribute.append(LocalityDistribute(shapes.text(entry.get("from"), f"{at}.from"), tuple(weights)))
    failover = []
    for index, item in enumerate(_bounded(spec.get("failover"), f"{path}.failover", MAX_FAILOVER)):
        at = f"{path}.failover[{index}]"
        entry = shapes.mapping(item, at)
        region = shapes.text(entry.get("from"), f"{at}.from")
        failover.append(LocalityFailover(region, shapes.text(entry.get("to"), f"{at}.to")))
    labels = shapes.strings(
        _bounded(spec.get("failoverPriority"), f"{path}.failoverPriority", MAX_FAILOVER_PRIORITY),
        f"{path}.failoverPriority",
    )
    setting = LocalityLbSetting(enabled is not False, tuple(distribute), tuple(failover), tuple(labels))
    problems = setting_problems(setting)
    if problems:
        field, problem = problems[0]
        raise shapes.ShapeError(f"{path}.{field}", problem)
    if not setting.enabled:
        return setting, []  # nothing of it applies: nothing to say about it
    notes = [
        (
            f"{path}.failoverPriority[{index}]",
            f"{label.partition('=')[0]}: workloads carry no such label here; it "
            "matches every endpoint (or, with =value, none)",
        )
        for index, label in enumerate(labels)
        if label.partition("=")[0] not in TOPOLOGY_LABELS
    ]
    return setting, notes


def failover_note(setting: LocalityLbSetting | None, outlier: object, path: str) -> list[tuple[str, str]]:
    """Rule 3: istiod's warning, for a traffic policy whose ``outlierDetection`` is ``outlier``."""
    if setting is None or not setting.enabled or outlier is not None:
        return []
    if not (setting.failover or setting.failover_priority):
        return []
    return [(path, "failover needs outlierDetection: without it every endpoint is picked alike")]
