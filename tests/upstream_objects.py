"""Objects Istio's own ambient integration tests apply (istio tests/integration/ambient), as data for our tests:
one copy each, so the unit, integration and e2e tests that replay them cannot drift apart."""

from __future__ import annotations

from typing import Any


def customize_metrics_spec(service: str = "service-addressed-waypoint", **extra_tags: Any) -> dict[str, Any]:
    """TestCustomizeMetrics' Telemetry spec (a literal tag added, ``source_principal`` removed) on ``service``."""
    return {
        "targetRefs": [{"kind": "Service", "group": "core", "name": service}],
        "metrics": [
            {
                "providers": [{"name": "prometheus"}],
                "overrides": [
                    {
                        "match": {"metric": "REQUEST_COUNT"},
                        "tagOverrides": {
                            "custom_dimension": {"value": "'test'"},
                            "source_principal": {"operation": "REMOVE"},
                            **extra_tags,
                        },
                    }
                ],
            }
        ],
    }


def customize_metrics_telemetry(service: str, namespace: str | None = None, **extra_tags: Any) -> dict[str, Any]:
    """TestCustomizeMetrics' whole Telemetry object (named ``ns-default``) on ``service``."""
    metadata: dict[str, Any] = {"name": "ns-default"}
    if namespace is not None:
        metadata["namespace"] = namespace
    return {
        "apiVersion": "telemetry.istio.io/v1",
        "kind": "Telemetry",
        "metadata": metadata,
        "spec": customize_metrics_spec(service, **extra_tags),
    }
