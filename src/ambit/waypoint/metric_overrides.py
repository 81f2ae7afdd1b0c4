"""The Telemetry API's metric overrides compiled for the waypoint's request families, once per configuration.

Theory of operation: :func:`compile_overrides` turns a configuration's
:class:`~ambit.model.metric_overrides.ServiceMetrics` into a :class:`MetricPlans`: per destination service key, and
per request family (``istio_requests``, ``istio_request_duration_milliseconds``, ``istio_request_bytes``,
``istio_response_bytes``), either nothing (the family is recorded exactly as without overrides), "dropped", or a
:class:`FamilyPlan` saying which of the standard labels are removed, which get an expression's value instead, and
which labels are added after them. :meth:`MetricPlans.find` is one dictionary lookup per request; the plan's
:meth:`FamilyPlan.tag_values` evaluates its expressions (nothing to do when they are all literals), and the series
is kept as (plan, standard values, tag values); :meth:`FamilyPlan.labels` builds its label pairs at scrape time.
Plans compare by identity, so keeping one in a series key costs no hashing of its fields.

Rules:

1. A service without an entry of its own uses the ``""`` entry; without that, no overrides.
2. A ``disabled`` entry drops every request family; a metric override with ``disabled`` drops its family.
3. A tag naming a standard label replaces its value (UPSERT) or removes the label from the series (REMOVE); a tag
   naming another label adds it after the standard ones, in name order (REMOVE of an unknown label: nothing).
4. An expression that gives an empty value renders ``unknown``, as empty standard labels do; a value is cut to
   :data:`MAX_VALUE` characters.
5. The TCP and gRPC-message metrics are not request families: their overrides are carried but not applied here.
6. Overflow: asked for labels without a request (the recorder does so once a family holds its maximum of
   relabelled series), every expression that reads the request gives ``overflow``, so a client that sends a new
   header value with each request cannot grow the series without bound.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass

from ambit.model.metric_overrides import Attribute, Expression, IstioMetric, RequestAttributes, ServiceMetrics, evaluate
from ambit.telemetry.metrics import UNKNOWN, LabelValues

__all__ = ["DROPPED", "FAMILIES", "FamilyPlan", "MetricPlans", "compile_overrides"]

FAMILIES: Mapping[IstioMetric, str] = {
    IstioMetric.REQUEST_COUNT: "istio_requests",
    IstioMetric.REQUEST_DURATION: "istio_request_duration_milliseconds",
    IstioMetric.REQUEST_SIZE: "istio_request_bytes",
    IstioMetric.RESPONSE_SIZE: "istio_response_bytes",
}
"""Istio's request metrics → the waypoint's family names."""

Pairs = tuple[tuple[str, str], ...]
MAX_VALUE = 256
OVERFLOW = "overflow"


@dataclass(frozen=True, slots=True, eq=False)
class FamilyPlan:
    """How one family's series are labelled for one service (rule 3)."""

    names: tuple[str, ...]
    """The standard label names (the family's ``labels``)."""
    removed: frozenset[int]
    replaced: tuple[tuple[int, Expression], ...]
    added: tuple[tuple[str, Expression], ...]
    constant: tuple[str, ...] | None = None
    """The tag values when every expression is a literal (``replaced`` then ``added``)."""
    overflow: tuple[str, ...] = ()
    """The tag values of the overflow series (rule 6)."""

    def tag_values(self, request: RequestAttributes | None) -> tuple[str, ...]:
        """The values of ``replaced`` then ``added`` for one request; ``request`` None: the overflow series."""
        if self.constant is not None:
            return self.constant
        if request is None:
            return self.overflow
        return tuple(_value(e, request) for _, e in self.replaced) + tuple(_value(e, request) for _, e in self.added)

    def labels(self, values: LabelValues, tags: tuple[str, ...]) -> Pairs:
        """The series' label pairs from its standard values and :meth:`tag_values`."""
        out = list(values)
        for (index, _), value in zip(self.replaced, tags, strict=False):
            out[index] = value
        pairs = [(n, v) for i, (n, v) in enumerate(zip(self.names, out, strict=True)) if i not in self.removed]
        pairs.extend((name, value) for (name, _), value in zip(self.added, tags[len(self.replaced) :], strict=True))
        return tuple(pairs)


def _plan(
    names: tuple[str, ...],
    removed: frozenset[int],
    replaced: tuple[tuple[int, Expression], ...],
    added: tuple[tuple[str, Expression], ...],
) -> FamilyPlan:
    expressions = [e for _, e in replaced] + [e for _, e in added]
    literal = all(e.attribute is Attribute.LITERAL for e in expressions)
    constant = tuple(_value(e, None) for e in expressions) if literal else None
    return FamilyPlan(names, removed, replaced, added, constant, tuple(_value(e, None) for e in expressions))


def _value(expression: Expression, request: RequestAttributes | None) -> str:
    if expression.attribute is Attribute.LITERAL:
        return expression.argument[:MAX_VALUE] or UNKNOWN
    if request is None:
        return OVERFLOW
    return evaluate(expression, request)[:MAX_VALUE] or UNKNOWN


DROPPED = "dropped"
"""A family not recorded for a service (rule 2)."""


@dataclass(frozen=True, slots=True)
class ServicePlan:
    families: Mapping[str, FamilyPlan | str]
    """Family name → its plan or :data:`DROPPED`; a family not named is recorded as without overrides."""
    needs_request: bool
    """Some expression reads the request (build :class:`RequestAttributes` only then)."""


@dataclass(frozen=True, slots=True)
class MetricPlans:
    by_service: Mapping[str, ServicePlan]

    def find(self, service_key: str) -> ServicePlan | None:
        """The plan for the requests to ``service_key`` (rule 1); None: no overrides."""
        plan = self.by_service.get(service_key)
        return plan if plan is not None else self.by_service.get("")


NO_PLANS = MetricPlans({})


def _service_plan(entry: ServiceMetrics, names: tuple[str, ...]) -> ServicePlan:
    if entry.disabled:
        return ServicePlan(dict.fromkeys(FAMILIES.values(), DROPPED), False)
    families: dict[str, FamilyPlan | str] = {}
    needs = False
    index = {name: i for i, name in enumerate(names)}
    for override in entry.overrides:
        family = FAMILIES.get(override.metric)
        if family is None:
            continue
        if override.disabled:
            families[family] = DROPPED
            continue
        if not override.tags:
            continue
        removed = frozenset(index[t.name] for t in override.tags if t.value is None and t.name in index)
        replaced = tuple((index[t.name], t.value) for t in override.tags if t.value is not None and t.name in index)
        added = tuple(
            (t.name, t.value)
            for t in sorted(override.tags, key=lambda t: t.name)
            if t.value is not None and t.name not in index
        )
        needs = needs or any(e.attribute is not Attribute.LITERAL for _, e in (*replaced, *added))
        families[family] = _plan(names, removed, replaced, added)
    return ServicePlan(families, needs)


def compile_overrides(entries: tuple[ServiceMetrics, ...], names: tuple[str, ...]) -> MetricPlans:
    """The plans for a configuration's overrides; ``names``: the request families' standard label names."""
    return MetricPlans({e.service_key: _service_plan(e, names) for e in entries})
