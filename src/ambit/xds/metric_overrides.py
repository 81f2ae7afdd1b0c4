"""Model metric overrides ↔ ``ambit.waypoint.v1.ServiceMetrics`` (``proto/metric_overrides.proto``), carried in
WaypointConfig field 7.

Theory of operation: :func:`service_metrics_to_proto` encodes field for field (the control plane's side);
:class:`MetricOverridesReader` judges what a waypoint was sent, the first problem raising
:class:`~ambit.xds.errors.XdsConversionError` naming the resource and the field, so that the client NACKs that
resource and keeps its last good config.

Rules:

1. At most :data:`MAX_SERVICES` entries, service keys unique and printable (one may be empty); at most one
   override per metric, each a metric name this build knows; at most :data:`MAX_TAGS` tags per metric, unique,
   each a Prometheus label name.
2. A removed tag has no value; any other tag's value is an expression
   :func:`~ambit.model.metric_overrides.parse_expression` accepts (so at most
   :data:`~ambit.model.metric_overrides.MAX_EXPRESSION` characters).
3. Nothing but :class:`~ambit.xds.errors.XdsConversionError` escapes decoding.
"""

from __future__ import annotations

from collections.abc import Sequence

from ambit.api import metric_overrides_pb2 as pb
from ambit.model.metric_overrides import (
    ExpressionError,
    IstioMetric,
    MetricOverride,
    ServiceMetrics,
    TagOverride,
    parse_expression,
    tag_name_problem,
)
from ambit.xds.convert import FieldReader

__all__ = ["MAX_SERVICES", "MAX_TAGS", "MetricOverridesReader", "service_metrics_to_proto"]

MAX_SERVICES = 10_000
MAX_TAGS = 64


def service_metrics_to_proto(entry: ServiceMetrics) -> pb.ServiceMetrics:
    return pb.ServiceMetrics(
        service_key=entry.service_key,
        disabled=entry.disabled,
        overrides=[
            pb.MetricOverride(
                metric=o.metric.value,
                disabled=o.disabled,
                tags=[
                    pb.TagOverride(name=t.name, remove=t.value is None, value=t.value.source if t.value else "")
                    for t in o.tags
                ],
            )
            for o in entry.overrides
        ],
    )


class MetricOverridesReader(FieldReader):
    def all(self, field: str, entries: Sequence[pb.ServiceMetrics]) -> tuple[ServiceMetrics, ...]:
        if len(entries) > MAX_SERVICES:
            raise self.fail(field, f"more than {MAX_SERVICES} entries")
        out = tuple(self.service_metrics(f"{field}[{i}]", e) for i, e in enumerate(entries))
        if len({e.service_key for e in out}) != len(out):
            raise self.fail(field, "a service key appears twice")
        return out

    def service_metrics(self, field: str, message: pb.ServiceMetrics) -> ServiceMetrics:
        key = self.text(f"{field}.service_key", message.service_key)
        overrides = tuple(self.override(f"{field}.overrides[{i}]", o) for i, o in enumerate(message.overrides))
        if len({o.metric for o in overrides}) != len(overrides):
            raise self.fail(f"{field}.overrides", "a metric appears twice")
        return ServiceMetrics(key, message.disabled, overrides)

    def override(self, field: str, message: pb.MetricOverride) -> MetricOverride:
        if message.metric not in IstioMetric.__members__:
            raise self.fail(f"{field}.metric", f"unknown metric {message.metric[:64]!r}")
        if len(message.tags) > MAX_TAGS:
            raise self.fail(f"{field}.tags", f"more than {MAX_TAGS} tags")
        tags = tuple(self.tag(f"{field}.tags[{i}]", t) for i, t in enumerate(message.tags))
        if len({t.name for t in tags}) != len(tags):
            raise self.fail(f"{field}.tags", "a tag appears twice")
        return MetricOverride(IstioMetric[message.metric], message.disabled, tags)

    def tag(self, field: str, message: pb.TagOverride) -> TagOverride:
        problem = tag_name_problem(message.name)
        if problem is not None:
            raise self.fail(f"{field}.name", problem)
        if message.remove:
            if message.value:
                raise self.fail(f"{field}.value", "a removed tag has no value")
            return TagOverride(message.name)
        try:
            return TagOverride(message.name, parse_expression(message.value))
        except ExpressionError as exc:
            raise self.fail(f"{field}.value", exc.reason) from None
