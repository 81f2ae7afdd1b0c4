"""The waypoint's request families under Telemetry overrides (ambit.waypoint.metric_overrides, WaypointMetrics):
an overridden service's series carry the upserted labels and lack the removed ones, other services' series stay
exactly as without overrides, disabled families record nothing, and Prometheus' parser accepts the mixed family."""

from __future__ import annotations

import dataclasses

from prometheus_client.parser import text_string_to_metric_families
from prometheus_client.samples import Sample

from ambit.model.metric_overrides import IstioMetric, MetricOverride, RequestAttributes, ServiceMetrics, TagOverride
from ambit.model.metric_overrides import parse_expression as expr
from ambit.model.routes import WaypointConfig
from ambit.telemetry.metrics import Reporter, TrafficLabels
from ambit.waypoint.config import RouteConfig
from ambit.waypoint.telemetry import REQUEST_LABELS, WaypointMetrics

CUSTOM, OTHER = "app/custom.app.svc.cluster.local", "app/other.app.svc.cluster.local"
PRINCIPAL = "spiffe://cluster.local/ns/app/sa/client"


def labels(service: str) -> TrafficLabels:
    return TrafficLabels(
        Reporter.WAYPOINT,
        source_principal=PRINCIPAL,
        destination_service=service.partition("/")[2],
        request_protocol="http",
    )


def record(metrics: WaypointMetrics, service_key: str, *, user: str = "alice") -> None:
    metrics.request(
        labels(service_key),
        response_code=200,
        duration_ms=3.0,
        request_bytes=10,
        response_bytes=20,
        service_key=service_key,
        request=lambda: RequestAttributes(method="GET", headers=(("x-user", user),)),
    )


def samples(metrics: WaypointMetrics, name: str) -> list[Sample]:
    text = metrics.render().decode()
    return [s for f in text_string_to_metric_families(text) for s in f.samples if s.name == name]


UPSTREAM = ServiceMetrics(
    CUSTOM,
    overrides=(
        MetricOverride(
            IstioMetric.REQUEST_COUNT,
            tags=(TagOverride("custom_dimension", expr("'test'")), TagOverride("source_principal")),
        ),
    ),
)


def test_the_overridden_service_gets_custom_dimension_and_loses_source_principal_while_others_are_unchanged() -> None:
    plain, overridden = WaypointMetrics(), WaypointMetrics()
    overridden.set_overrides((UPSTREAM,))
    for m in (plain, overridden):
        record(m, CUSTOM)
        record(m, OTHER)
    (custom,) = [s for s in samples(overridden, "istio_requests_total") if "custom" in s.labels["destination_service"]]
    assert custom.labels["custom_dimension"] == "test" and "source_principal" not in custom.labels
    assert custom.value == 1
    assert set(custom.labels) == {*REQUEST_LABELS, "custom_dimension"} - {"source_principal"}
    other = [s for s in samples(overridden, "istio_requests_total") if "other" in s.labels["destination_service"]]
    assert other == [s for s in samples(plain, "istio_requests_total") if "other" in s.labels["destination_service"]]
    assert other[0].labels["source_principal"] == PRINCIPAL
    # only REQUEST_COUNT was overridden: the histograms stay standard for both services
    assert samples(overridden, "istio_request_bytes_count") == samples(plain, "istio_request_bytes_count")


def test_without_overrides_rendering_is_byte_for_byte_as_before() -> None:
    plain, emptied = WaypointMetrics(), WaypointMetrics()
    emptied.set_overrides((UPSTREAM,))
    emptied.set_overrides(())
    for m in (plain, emptied):
        record(m, CUSTOM)
    assert plain.render() == emptied.render()


def test_request_attributes_fill_upserted_labels_and_replace_standard_ones() -> None:
    metrics = WaypointMetrics()
    tags = (
        TagOverride("request_protocol", expr("request.method")),
        TagOverride("user", expr("request.headers['x-user']")),
    )
    metrics.set_overrides((ServiceMetrics("", overrides=(MetricOverride(IstioMetric.REQUEST_DURATION, tags=tags),)),))
    record(metrics, CUSTOM, user="alice")
    record(metrics, CUSTOM, user="bob")
    record(metrics, CUSTOM, user="")
    counts = {s.labels["user"]: s.value for s in samples(metrics, "istio_request_duration_milliseconds_count")}
    assert counts == {"alice": 1, "bob": 1, "unknown": 1}
    assert {s.labels["request_protocol"] for s in samples(metrics, "istio_request_duration_milliseconds_count")} == {
        "GET"
    }
    buckets = [s for s in samples(metrics, "istio_request_duration_milliseconds_bucket") if s.labels["user"] == "bob"]
    assert buckets[-1].labels["le"] == "+Inf" and buckets[-1].value == 1


def test_disabled_metrics_and_disabled_services_record_nothing() -> None:
    metrics = WaypointMetrics()
    metrics.set_overrides(
        (
            ServiceMetrics("", overrides=(MetricOverride(IstioMetric.RESPONSE_SIZE, disabled=True),)),
            ServiceMetrics(OTHER, disabled=True),
        )
    )
    record(metrics, CUSTOM)
    record(metrics, OTHER)
    assert samples(metrics, "istio_response_bytes_count") == []
    (count,) = samples(metrics, "istio_requests_total")
    assert "custom" in count.labels["destination_service"]


def test_expressions_that_read_nothing_of_the_request_do_not_build_its_attributes() -> None:
    metrics = WaypointMetrics()
    metrics.set_overrides((UPSTREAM,))

    def refuse() -> RequestAttributes:
        raise AssertionError("built request attributes for a literal")

    metrics.request(
        labels(CUSTOM),
        response_code=200,
        duration_ms=1,
        request_bytes=0,
        response_bytes=0,
        service_key=CUSTOM,
        request=refuse,
    )
    assert samples(metrics, "istio_requests_total")[0].labels["custom_dimension"] == "test"


def test_a_client_sending_a_new_header_value_each_time_cannot_grow_the_series_past_the_cap() -> None:
    metrics = WaypointMetrics(max_custom_series=10)
    tags = (TagOverride("user", expr("request.headers['x-user']")), TagOverride("kind", expr("'fixed'")))
    metrics.set_overrides((ServiceMetrics("", overrides=(MetricOverride(IstioMetric.REQUEST_COUNT, tags=tags),)),))
    for i in range(1000):
        record(metrics, CUSTOM, user=f"u{i}" + "x" * 1000)
    series = samples(metrics, "istio_requests_total")
    assert len(series) == 11  # ten users, then one overflow series
    assert {s.labels["kind"] for s in series} == {"fixed"}
    (overflow,) = [s for s in series if s.labels["user"] == "overflow"]
    assert overflow.value == 990
    assert max(len(s.labels["user"]) for s in series) == 256


def test_series_that_differ_only_in_a_removed_label_render_as_one() -> None:
    metrics = WaypointMetrics()
    metrics.set_overrides((UPSTREAM, ServiceMetrics(CUSTOM, overrides=UPSTREAM.overrides)))
    tags = (TagOverride("source_principal"),)
    metrics.set_overrides(
        (
            ServiceMetrics(
                CUSTOM, overrides=(MetricOverride(IstioMetric.REQUEST_DURATION, tags=tags), *UPSTREAM.overrides)
            ),
        )
    )
    for principal in ("spiffe://cluster.local/ns/app/sa/a", "spiffe://cluster.local/ns/app/sa/b"):
        metrics.request(
            dataclasses.replace(labels(CUSTOM), source_principal=principal),
            response_code=200,
            duration_ms=2.0,
            request_bytes=0,
            response_bytes=0,
            service_key=CUSTOM,
        )
    (count,) = samples(metrics, "istio_requests_total")
    assert count.value == 2 and "source_principal" not in count.labels
    (duration,) = samples(metrics, "istio_request_duration_milliseconds_count")
    assert duration.value == 2
    (total,) = samples(metrics, "istio_request_duration_milliseconds_sum")
    assert total.value == 4.0


def test_the_config_dump_shows_the_overrides() -> None:
    routes = RouteConfig(WaypointConfig("app/waypoint", metrics=(UPSTREAM,)))
    assert routes.to_dump()["metrics"] == [
        {
            "service": CUSTOM,
            "disabled": False,
            "overrides": {
                "REQUEST_COUNT": {
                    "disabled": False,
                    "tags": {"custom_dimension": "'test'", "source_principal": "REMOVE"},
                }
            },
        }
    ]


def test_a_series_begun_with_one_family_disabled_keeps_each_histogram_once_the_override_is_gone() -> None:
    """The default path finds each family's histogram on its own: one made under an override that disabled
    another family is not replaced, and the missing one is made."""
    metrics = WaypointMetrics()
    metrics.set_overrides((ServiceMetrics("", overrides=(MetricOverride(IstioMetric.RESPONSE_SIZE, disabled=True),)),))
    record(metrics, CUSTOM)
    metrics.set_overrides(())
    record(metrics, CUSTOM)
    counts = {
        name: [s.value for s in samples(metrics, name)]
        for name in (
            "istio_request_bytes_count",
            "istio_response_bytes_count",
            "istio_request_duration_milliseconds_count",
        )
    }
    assert counts == {
        "istio_request_bytes_count": [2.0],
        "istio_response_bytes_count": [1.0],
        "istio_request_duration_milliseconds_count": [2.0],
    }
