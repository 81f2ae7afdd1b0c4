"""istiod's metrics as the control plane keeps and renders them (:mod:`ambit.controlplane.monitoring.metrics`)."""

from __future__ import annotations

import re
from typing import Any

import pytest
from hypothesis import given
from hypothesis import strategies as st
from prometheus_client.parser import text_string_to_metric_families

from ambit.controlplane.monitoring.metrics import (
    ADDRESS_TYPE,
    AUTHORIZATION_TYPE,
    MAX_VERSION_LENGTH,
    ControlPlaneMetrics,
    metric_type,
)
from ambit.k8s import kinds

WAYPOINT_TYPE = "type.googleapis.com/ambit.waypoint.WaypointConfig"


def scrape(metrics: ControlPlaneMetrics) -> dict[str, dict[tuple[tuple[str, str], ...], float]]:
    """Sample name → {sorted labels: value}, parsed back with prometheus_client's own parser (which names a
    counter's samples ``<name>_total`` whatever the text says: they are keyed by the family's name here)."""
    out: dict[str, dict[tuple[tuple[str, str], ...], float]] = {}
    for family in text_string_to_metric_families(metrics.render().decode()):
        for sample in family.samples:
            name = family.name if family.type == "counter" else sample.name
            out.setdefault(name, {})[tuple(sorted(sample.labels.items()))] = sample.value
    return out


def value(metrics: ControlPlaneMetrics, name: str, **labels: str) -> float | None:
    return scrape(metrics).get(name, {}).get(tuple(sorted(labels.items())))


@pytest.fixture
def metrics() -> ControlPlaneMetrics:
    return ControlPlaneMetrics(version="1.2.3", clock=lambda: 1000.0, process=False)


def test_counters_carry_istiods_names_without_a_total_suffix(metrics: ControlPlaneMetrics) -> None:
    text = metrics.render().decode()
    for name in (
        "pilot_xds_pushes",
        "pilot_push_triggers",
        "pilot_k8s_reg_events",
        "pilot_total_xds_rejects",
        "pilot_xds_expired_nonce",
        "citadel_server_csr_count",
        "citadel_server_authentication_failure_count",
        "citadel_server_csr_parsing_err_count",
        "citadel_server_success_cert_issuance_count",
    ):
        assert f"# TYPE {name} counter\n" in text, name
    assert not re.search(r"^\w+_total[ {]", text, re.MULTILINE)
    for name in ("pilot_xds_push_time", "pilot_proxy_convergence_time", "pilot_xds_send_time"):
        assert f"# TYPE {name} histogram\n" in text, name
    assert 'istio_build{component="pilot",tag="1.2.3"} 1.0\n' in text
    assert value(metrics, "pilot_info", version="1.2.3") == 1.0


def test_process_metrics_are_exposed_by_default() -> None:
    text = ControlPlaneMetrics(version="x").render().decode()
    assert "process_resident_memory_bytes" in text
    assert "# TYPE process_cpu_seconds_total counter\nprocess_cpu_seconds_total " in text


def test_responses_count_as_pushes_by_istiods_short_type(metrics: ControlPlaneMetrics) -> None:
    metrics.response_written(ADDRESS_TYPE, 0.05)
    metrics.response_written(ADDRESS_TYPE, 2.0)
    metrics.response_written(AUTHORIZATION_TYPE, 0.001)
    metrics.response_written(WAYPOINT_TYPE, 0.001)
    assert value(metrics, "pilot_xds_pushes", type="wds") == 2
    assert value(metrics, "pilot_xds_pushes", type="wads") == 1
    assert value(metrics, "pilot_xds_pushes", type=WAYPOINT_TYPE) == 1
    assert value(metrics, "pilot_xds_push_time_bucket", type="wds", le="0.01") == 0
    assert value(metrics, "pilot_xds_push_time_bucket", type="wds", le="0.1") == 1
    assert value(metrics, "pilot_xds_push_time_bucket", type="wds", le="3.0") == 2
    assert value(metrics, "pilot_xds_push_time_bucket", type="wds", le="+Inf") == 2
    assert value(metrics, "pilot_xds_push_time_count", type="wds") == 2
    assert value(metrics, "pilot_xds_push_time_sum", type="wds") == pytest.approx(2.05)


def test_config_size_is_labelled_with_the_full_type_url_as_istiod_does(metrics: ControlPlaneMetrics) -> None:
    metrics.config_sent(ADDRESS_TYPE, 5000)
    text = metrics.render().decode()
    assert f'pilot_xds_config_size_bytes_bucket{{le="10000.0",type="{ADDRESS_TYPE}"}} 1.0' in text
    assert f'pilot_xds_config_size_bytes_bucket{{le="1e+06",type="{ADDRESS_TYPE}"}} 1.0' in text


def test_a_push_round_adds_the_merged_event_count_of_each_reason_as_istiod_does(
    metrics: ControlPlaneMetrics,
) -> None:
    # Five addresses and two policies changed within one debounce, and a waypoint's routes: istiod's ReasonStats
    # merge the events, and each client's push adds each reason's count (recordPushTriggers).
    metrics.push_round({ADDRESS_TYPE: 5, AUTHORIZATION_TYPE: 2, WAYPOINT_TYPE: 1}, 0.4)
    metrics.push_round({ADDRESS_TYPE: 1}, None)  # woke, but nothing this stream sees had changed
    metrics.push_round({AUTHORIZATION_TYPE: 0}, None)  # a type with no change adds nothing
    assert value(metrics, "pilot_push_triggers", type="ambient") == 8
    assert value(metrics, "pilot_push_triggers", type="config") == 1
    assert value(metrics, "pilot_proxy_convergence_time_count") == 1
    assert value(metrics, "pilot_proxy_convergence_time_bucket", le="0.5") == 1


def test_rejects_and_expired_nonces_appear_once_they_happen(metrics: ControlPlaneMetrics) -> None:
    metrics.response_written(ADDRESS_TYPE, 0.0)
    assert "pilot_total_xds_rejects" not in scrape(metrics)
    metrics.rejected(ADDRESS_TYPE)
    metrics.nonce_expired(AUTHORIZATION_TYPE)
    metrics.nonce_expired(AUTHORIZATION_TYPE)
    assert value(metrics, "pilot_total_xds_rejects", type="wds") == 1
    assert value(metrics, "pilot_xds_expired_nonce", type="wads") == 2
    assert value(metrics, "pilot_xds_expired_nonce", type="wds") is None


def test_connected_clients_are_counted_by_version_and_their_series_goes_with_them(
    metrics: ControlPlaneMetrics,
) -> None:
    metrics.client_connected("1.24.0")
    metrics.client_connected("1.24.0")
    metrics.client_connected("ambit/0.1.0")
    assert value(metrics, "pilot_xds", version="1.24.0") == 2
    metrics.client_disconnected("1.24.0")
    metrics.client_disconnected("ambit/0.1.0")
    assert value(metrics, "pilot_xds", version="1.24.0") == 1
    assert value(metrics, "pilot_xds", version="ambit/0.1.0") is None


def test_a_client_cycling_through_made_up_versions_leaves_no_series_behind(metrics: ControlPlaneMetrics) -> None:
    for n in range(10_000):
        version = f"forged-{n}-" + "v" * 500
        metrics.client_connected(version)
        metrics.client_disconnected(version)
    assert metrics.xds_clients == {}
    metrics.client_connected("x" * 500)
    assert list(metrics.xds_clients) == ["x" * MAX_VERSION_LENGTH]


@given(st.text(max_size=80))
def test_any_stated_version_renders_as_parseable_text(version: str) -> None:
    metrics = ControlPlaneMetrics(version='v"1\\\n', process=False)
    metrics.client_connected(version)
    assert value(metrics, "pilot_xds", version=version[:MAX_VERSION_LENGTH]) == 1
    assert value(metrics, "istio_build", component="pilot", tag='v"1\\\n') == 1


@pytest.mark.parametrize(
    ("kind", "family", "label"),
    [
        (kinds.PODS, "pilot_k8s_reg_events", "Pods"),
        (kinds.SERVICES, "pilot_k8s_reg_events", "Services"),
        (kinds.ENDPOINT_SLICES, "pilot_k8s_reg_events", "EndpointSlice"),
        (kinds.NAMESPACES, "pilot_k8s_reg_events", "Namespaces"),
        (kinds.NODES, "pilot_k8s_reg_events", "Nodes"),
        (kinds.AUTHORIZATION_POLICIES, "pilot_k8s_cfg_events", "AuthorizationPolicy"),
        (kinds.SERVICE_ENTRIES, "pilot_k8s_cfg_events", "ServiceEntry"),
        (kinds.HTTP_ROUTES, "pilot_k8s_cfg_events", "HTTPRoute"),
    ],
)
def test_informer_events_are_counted_by_kind_and_event(
    metrics: ControlPlaneMetrics, kind: kinds.ResourceKind, family: str, label: str
) -> None:
    handlers = metrics.event_handlers(kind)
    assert handlers is not None
    on_add, on_update, on_delete = handlers
    obj: dict[str, Any] = {}
    on_add(obj)
    on_add(obj)
    on_update(obj, obj)
    on_delete(obj)
    assert value(metrics, family, type=label, event="add") == 2
    assert value(metrics, family, type=label, event="update") == 1
    assert value(metrics, family, type=label, event="delete") == 1


@pytest.mark.parametrize("kind", [kinds.CONFIG_MAPS, kinds.SECRETS])
def test_kinds_istiod_does_not_count_get_no_handlers(metrics: ControlPlaneMetrics, kind: kinds.ResourceKind) -> None:
    assert metrics.event_handlers(kind) is None


def test_the_ca_counters_and_expiries(metrics: ControlPlaneMetrics) -> None:
    for _ in range(3):
        metrics.csr_received()
    metrics.authentication_failed()
    metrics.csr_malformed()
    metrics.certificate_issued()
    assert "citadel_server_root_cert_expiry_timestamp" not in scrape(metrics)  # no CA set yet
    metrics.set_ca_expiry(5000.0, None)
    assert value(metrics, "citadel_server_csr_count") == 3
    assert value(metrics, "citadel_server_authentication_failure_count") == 1
    assert value(metrics, "citadel_server_csr_parsing_err_count") == 1
    assert value(metrics, "citadel_server_success_cert_issuance_count") == 1
    assert value(metrics, "citadel_server_root_cert_expiry_timestamp") == 5000.0
    assert value(metrics, "citadel_server_root_cert_expiry_seconds") == 4000.0
    assert "citadel_server_cert_chain_expiry_timestamp" not in scrape(metrics)  # a self-signed root has no chain
    metrics.set_ca_expiry(5000.0, 3000.0)
    assert value(metrics, "citadel_server_cert_chain_expiry_timestamp") == 3000.0


@pytest.mark.parametrize(
    ("type_url", "short"),
    [(ADDRESS_TYPE, "wds"), ("type.googleapis.com/istio.workload.Workload", "wds"), (AUTHORIZATION_TYPE, "wads")],
)
def test_metric_type_is_istiods_short_name(type_url: str, short: str) -> None:
    assert metric_type(type_url) == short
    assert metric_type(WAYPOINT_TYPE) == WAYPOINT_TYPE


def test_debounce_and_translation_times_go_into_istiods_buckets(metrics: ControlPlaneMetrics) -> None:
    metrics.translated(0.004)
    metrics.debounced(0.35)
    metrics.debounced(12.0)
    assert value(metrics, "pilot_pushcontext_init_seconds_bucket", le="0.01") == 1
    assert value(metrics, "pilot_pushcontext_init_seconds_bucket", le="10.0") is None  # istiod's stop at 5
    assert value(metrics, "pilot_debounce_time_bucket", le="0.5") == 1
    assert value(metrics, "pilot_debounce_time_bucket", le="20.0") == 2
    assert value(metrics, "pilot_debounce_time_count") == 2
    assert value(metrics, "pilot_debounce_time_sum") == pytest.approx(12.35)
