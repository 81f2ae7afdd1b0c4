"""The waypoint's request series remembered by their labels object, response code and gRPC status
(:class:`ambit.waypoint.telemetry.WaypointMetrics`): the metrics text is the one the series give when each request
builds its label values anew, for any sequence of requests, overrides and scrapes; and a steady stream of like
requests builds no label values."""

from __future__ import annotations

import dataclasses

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from ambit.model.metric_overrides import IstioMetric, MetricOverride, RequestAttributes, ServiceMetrics, TagOverride
from ambit.model.metric_overrides import parse_expression as expr
from ambit.telemetry.metrics import ProxyMetrics, Reporter, SecurityPolicy, TrafficLabels
from ambit.waypoint.telemetry import WaypointMetrics

SERVICES = ("app/web.app.svc.cluster.local", "app/api.app.svc.cluster.local", "")

LABELS = (
    TrafficLabels(Reporter.WAYPOINT, destination_service="web.app.svc.cluster.local", request_protocol="http"),
    TrafficLabels(
        Reporter.WAYPOINT,
        source_workload="client",
        source_principal="spiffe://cluster.local/ns/app/sa/client",
        destination_service="api.app.svc.cluster.local",
        destination_workload="api-0",
        request_protocol="grpc",
        connection_security_policy=SecurityPolicy.MUTUAL_TLS,
    ),
    TrafficLabels(Reporter.WAYPOINT, destination_service="web.app.svc.cluster.local", response_flags="UH"),
    TrafficLabels(Reporter.SOURCE, destination_service="api.app.svc.cluster.local", request_protocol="http"),
)

OVERRIDES: tuple[tuple[ServiceMetrics, ...], ...] = (
    (),
    (
        ServiceMetrics(
            SERVICES[0],
            overrides=(
                MetricOverride(
                    IstioMetric.REQUEST_COUNT,
                    tags=(TagOverride("user", expr("request.headers['x-user']")), TagOverride("source_principal")),
                ),
            ),
        ),
    ),
    (ServiceMetrics("", overrides=(MetricOverride(IstioMetric.RESPONSE_SIZE, disabled=True),)),),
    (ServiceMetrics(SERVICES[1], disabled=True),),
)

_REQUEST = st.tuples(
    st.just("request"),
    st.integers(0, len(LABELS) - 1),
    st.booleans(),  # the shared labels object, or an equal copy of it
    st.sampled_from((0, 200, 404, 503)),
    st.sampled_from(("", "0", "14")),
    st.floats(0, 100_000, allow_nan=False),
    st.integers(0, 10**7),
    st.integers(0, 10**7),
    st.sampled_from(SERVICES),
    st.sampled_from(("alice", "bob")),
)
_OPERATIONS = st.lists(
    st.one_of(
        _REQUEST,
        st.tuples(st.just("overrides"), st.integers(0, len(OVERRIDES) - 1)),
        st.tuples(st.just("scrape")),
    ),
    max_size=40,
)


def run(metrics: WaypointMetrics, operations: list[tuple[object, ...]]) -> list[bytes]:
    """Apply ``operations`` to ``metrics``; the metrics text at each scrape and at the end."""
    scrapes: list[bytes] = []
    for operation in operations:
        if operation[0] == "scrape":
            scrapes.append(metrics.render())
        elif operation[0] == "overrides":
            index = operation[1]
            assert isinstance(index, int)
            metrics.set_overrides(OVERRIDES[index])
        else:
            _, index, shared, code, grpc, duration, sent, received, service, user = operation
            assert isinstance(index, int) and isinstance(code, int) and isinstance(grpc, str)
            assert isinstance(duration, float) and isinstance(sent, int) and isinstance(received, int)
            assert isinstance(service, str) and isinstance(user, str)
            labels = LABELS[index] if shared else dataclasses.replace(LABELS[index])
            metrics.request(
                labels,
                response_code=code,
                grpc_status=grpc,
                duration_ms=duration,
                request_bytes=sent,
                response_bytes=received,
                service_key=service,
                request=lambda user=user: RequestAttributes(method="GET", headers=(("x-user", user),)),  # type: ignore[misc]
            )
    scrapes.append(metrics.render())
    return scrapes


@settings(max_examples=120, deadline=None)
@given(_OPERATIONS)
def test_remembered_series_give_the_same_metrics_text_as_series_built_per_request(
    operations: list[tuple[object, ...]],
) -> None:
    built = run(WaypointMetrics(build_version="t", max_remembered_series=0), operations)
    assert run(WaypointMetrics(build_version="t"), operations) == built
    assert run(WaypointMetrics(build_version="t", max_remembered_series=2), operations) == built  # starts afresh


def test_like_requests_after_the_first_build_no_label_values(monkeypatch: pytest.MonkeyPatch) -> None:
    metrics = WaypointMetrics()
    built: list[TrafficLabels] = []
    real = ProxyMetrics._key

    def counted(self: ProxyMetrics, labels: TrafficLabels) -> tuple[str, ...]:
        built.append(labels)
        return real(self, labels)

    monkeypatch.setattr(ProxyMetrics, "_key", counted)
    for code in (200, 200, 503, 200, 503):
        for _ in range(100):
            metrics.request(
                LABELS[1], response_code=code, grpc_status="0", duration_ms=1.0, request_bytes=1, response_bytes=2
            )
    assert len(built) == 2  # one per response code
    text = metrics.render().decode()
    assert 'response_code="200"' in text and 'response_code="503"' in text
    assert "istio_requests_total{" in text
