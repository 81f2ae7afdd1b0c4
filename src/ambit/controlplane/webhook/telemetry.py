"""Shallow validation of ``telemetry.istio.io`` Telemetry.

Theory of operation. The spec is decoded strictly (unknown fields are errors) at the levels Ambit reads:
``selector``/``targetRefs`` as for every policy; each ``metrics[]`` entry's ``providers`` name a provider;
each override's ``match.metric`` and ``match.mode`` hold Istio's values and ``disabled`` is a boolean; a tag
override names its tag, its ``operation`` is UPSERT or REMOVE, and an UPSERT has a ``value``. ``accessLogging``
and ``tracing`` only have to be lists of objects. Tag values are CEL expressions: the webhook does not judge
them, as istiod does not; what Ambit's waypoint cannot evaluate is reported by the translation instead.
"""

from __future__ import annotations

from typing import Any

from ambit.controlplane.webhook.attachment import check_attachment
from ambit.controlplane.webhook.fields import Fields, describe

METRICS = (
    "ALL_METRICS",
    "REQUEST_COUNT",
    "REQUEST_DURATION",
    "REQUEST_SIZE",
    "RESPONSE_SIZE",
    "TCP_OPENED_CONNECTIONS",
    "TCP_CLOSED_CONNECTIONS",
    "TCP_SENT_BYTES",
    "TCP_RECEIVED_BYTES",
    "GRPC_REQUEST_MESSAGES",
    "GRPC_RESPONSE_MESSAGES",
)
MODES = ("CLIENT_AND_SERVER", "CLIENT", "SERVER")
OPERATIONS = ("UPSERT", "REMOVE")


def validate_telemetry(obj: dict[str, Any]) -> Fields:
    f = Fields()
    metadata = f.mapping(obj.get("metadata"), "metadata")
    namespace = metadata.get("namespace") if isinstance(metadata.get("namespace"), str) else None
    spec = f.mapping(
        obj.get("spec"), "spec", known=("selector", "targetRef", "targetRefs", "tracing", "metrics", "accessLogging")
    )
    check_attachment(f, spec, namespace)
    f.objects(f.get(spec, "tracing"), "spec.tracing")
    f.objects(f.get(spec, "accessLogging"), "spec.accessLogging")
    for path, entry in f.objects(spec.get("metrics"), "spec.metrics"):
        f.mapping(entry, path, known=("providers", "overrides", "reportingInterval"))
        for provider_path, provider in f.objects(entry.get("providers"), f"{path}.providers"):
            f.mapping(provider, provider_path, known=("name",))
            f.string(provider.get("name"), f"{provider_path}.name", required=True)
        f.string(f.get(entry, "reportingInterval"), f"{path}.reportingInterval")
        for override_path, override in f.objects(entry.get("overrides"), f"{path}.overrides"):
            _override(f, override, override_path)
    return f


def _override(f: Fields, override: dict[str, Any], path: str) -> None:
    f.mapping(override, path, known=("match", "disabled", "tagOverrides"))
    match = f.mapping(override.get("match"), f"{path}.match", known=("metric", "customMetric", "mode"))
    metric = f.enum(match.get("metric"), f"{path}.match.metric", METRICS)
    custom = f.string(f.get(match, "customMetric"), f"{path}.match.customMetric")
    if metric is not None and custom is not None:
        f.error(f"{path}.match", "only one of metric or customMetric can be set")
    f.enum(match.get("mode"), f"{path}.match.mode", MODES)
    disabled = override.get("disabled")
    if disabled is not None and not isinstance(disabled, bool):
        f.error(f"{path}.disabled", f"expected a boolean, got {describe(disabled)}")
    for name, tag in f.mapping(f.get(override, "tagOverrides"), f"{path}.tagOverrides").items():
        tag_path = f"{path}.tagOverrides[{name}]"
        if not name:
            f.error(tag_path, "a tag name must not be empty")
        fields = f.mapping(tag, tag_path, known=("operation", "value"))
        operation = f.enum(fields.get("operation"), f"{tag_path}.operation", OPERATIONS) or "UPSERT"
        value = f.string(fields.get("value"), f"{tag_path}.value")
        if operation == "UPSERT" and value is None:
            f.error(f"{tag_path}.value", "must be set when the operation is UPSERT")
        elif operation == "REMOVE" and value is not None:
            f.error(f"{tag_path}.value", "must not be set when the operation is REMOVE")
