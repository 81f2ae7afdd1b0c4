"""A node proxy adds its workers' counts to its own (ambit.telemetry.peer_counts, ProxyMetrics.peer_report)."""

from __future__ import annotations

import json

import pytest
from hypothesis import given
from hypothesis import strategies as st
from prometheus_client.parser import text_string_to_metric_families

from ambit.telemetry.metrics import DnsLabels, ProxyMetrics, Reporter, TrafficLabels
from ambit.telemetry.peer_counts import MAX_SERIES, PeerCountsError

OUT = TrafficLabels(Reporter.SOURCE, source_workload="client", destination_service="web.apps")
IN = TrafficLabels(Reporter.DESTINATION, destination_workload="web")


def scrape(metrics: ProxyMetrics) -> dict[tuple[str, tuple[tuple[str, str], ...]], float]:
    out = {}
    for family in text_string_to_metric_families(metrics.render().decode()):
        for sample in family.samples:
            out[(sample.name, tuple(sorted(sample.labels.items())))] = sample.value
    return out


def total(metrics: ProxyMetrics, name: str) -> float:
    return sum(v for (n, _), v in scrape(metrics).items() if n == name)


def traffic(metrics: ProxyMetrics, connections: int, labels: TrafficLabels = OUT) -> None:
    for _ in range(connections):
        conn = metrics.connection_opened(labels)
        conn.add_received(10)
        conn.add_sent(20)
        conn.close()


def report(metrics: ProxyMetrics) -> object:
    return json.loads(json.dumps(metrics.snapshot()))  # as it travels


def test_a_workers_connections_bytes_and_dns_are_added_to_the_node_proxys_own() -> None:
    main, worker = ProxyMetrics(build_version="1"), ProxyMetrics(build_version="1")
    traffic(main, 2)
    traffic(worker, 3)
    traffic(worker, 1, IN)
    worker.dns_request(DnsLabels("a", "udp"))
    worker.dns_forwarded(DnsLabels("a", "udp"), 0.002, failed=False)
    worker.on_demand_dns(miss=True)
    worker.connection_refused("hbone", "over_limit")
    worker.set_proxy_counts(active=7, pending=0)
    worker.proxy_started()
    main.set_proxy_counts(active=1, pending=0)
    main.peer_report("worker-1", report(worker))
    assert total(main, "istio_tcp_connections_opened_total") == 6
    assert total(main, "istio_tcp_received_bytes_total") == 60
    assert total(main, "istio_tcp_sent_bytes_total") == 120
    assert total(main, "istio_dns_requests_total") == 1
    assert total(main, "istio_dns_upstream_request_duration_seconds_count") == 1
    assert total(main, "istio_on_demand_dns_cache_misses_total") == 1
    assert total(main, "ambit_listener_connections_refused_total") == 1
    # One proxy per pod in every process: the node proxy's own gauges and lifecycle counts, and one build line.
    assert total(main, "istio_active_proxy_count_total") == 1
    assert total(main, "istio_proxies_started_total") == 0
    assert total(main, "istio_build") == 1


def test_a_new_report_replaces_the_workers_previous_one_and_an_ended_worker_keeps_its_counts() -> None:
    main, worker = ProxyMetrics(), ProxyMetrics()
    traffic(worker, 2)
    main.peer_report("w", report(worker))
    traffic(worker, 1)
    main.peer_report("w", report(worker))
    assert total(main, "istio_tcp_connections_closed_total") == 3
    main.peer_gone("w")
    assert total(main, "istio_tcp_connections_closed_total") == 3  # counters never go back
    again = ProxyMetrics()  # the worker started again, from zero
    traffic(again, 1)
    main.peer_report("w", report(again))
    assert total(main, "istio_tcp_connections_closed_total") == 4


def test_a_report_mid_connection_carries_the_bytes_so_far() -> None:
    main, worker = ProxyMetrics(), ProxyMetrics()
    conn = worker.connection_opened(OUT)
    conn.add_received(5)
    main.peer_report("w", report(worker))
    assert total(main, "istio_tcp_received_bytes_total") == 5
    conn.add_received(6)
    conn.close()
    main.peer_report("w", report(worker))
    assert total(main, "istio_tcp_received_bytes_total") == 11


@pytest.mark.parametrize(
    "bad",
    [
        None,
        [],
        {"families": {}, "durations": []},
        {"families": {"istio_nope": []}, "durations": [], "scalars": {}},
        {"families": {"istio_tcp_connections_opened": [[["a"], 1]]}, "durations": [], "scalars": {}},
        {"families": {"ambit_dns_dropped": [[["x"], -1]]}, "durations": [], "scalars": {}},
        {"families": {"ambit_dns_dropped": [[["x"], True]]}, "durations": [], "scalars": {}},
        {"families": {"ambit_dns_dropped": [[["x"], 1.5]]}, "durations": [], "scalars": {}},
        {"families": {}, "durations": [[["a", "udp"], [1], 0.1]], "scalars": {}},
        {"families": {}, "durations": [[["a", "udp"], [0] * 7, float("nan")]], "scalars": {}},
        {"families": {}, "durations": [], "scalars": {"proxies_started": 1}},
    ],
)
def test_a_malformed_report_is_refused_whole_and_the_previous_one_stays(bad: object) -> None:
    main, worker = ProxyMetrics(), ProxyMetrics()
    traffic(worker, 2)
    main.peer_report("w", report(worker))
    with pytest.raises(PeerCountsError):
        main.peer_report("w", bad)
    assert total(main, "istio_tcp_connections_opened_total") == 2


def test_a_report_of_more_series_than_the_bound_is_refused_before_it_is_read() -> None:
    sample = [["x"], 1]
    with pytest.raises(PeerCountsError, match="series"):
        ProxyMetrics().peer_report(
            "w", {"families": {"ambit_dns_dropped": [sample] * (MAX_SERIES + 1)}, "durations": [], "scalars": {}}
        )


_json = st.recursive(
    st.none() | st.booleans() | st.integers() | st.floats() | st.text(max_size=5),
    lambda inner: st.lists(inner, max_size=4) | st.dictionaries(st.text(max_size=30), inner, max_size=4),
    max_leaves=20,
)


@given(st.fixed_dictionaries({"families": _json, "durations": _json, "scalars": _json}) | _json)
def test_any_json_is_a_report_or_a_clear_refusal(value: object) -> None:
    main = ProxyMetrics()
    try:
        main.peer_report("w", value)
    except PeerCountsError:
        return
    main.render()
