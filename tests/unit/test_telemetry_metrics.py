"""ProxyMetrics: label rendering, exact byte counts across scrapes, and the exposed family names and HELP texts."""

from __future__ import annotations

import re
import subprocess
import sys
from dataclasses import dataclass

from hypothesis import given
from hypothesis import strategies as st
from prometheus_client.parser import text_string_to_metric_families
from prometheus_client.samples import Sample

from ambit.telemetry.metrics import (
    LABEL_NAMES,
    DnsLabels,
    ProxyMetrics,
    Reporter,
    SecurityPolicy,
    TrafficLabels,
)

OUTBOUND = TrafficLabels(
    Reporter.SOURCE,
    source_workload="web-0",
    source_workload_namespace="default",
    destination_service="echo.default.svc.cluster.local",
    destination_workload="echo-0",
)
INBOUND = TrafficLabels(
    Reporter.DESTINATION,
    source_workload="web-0",
    source_principal="spiffe://cluster.local/ns/default/sa/web",
    destination_workload="echo-0",
    destination_principal="spiffe://cluster.local/ns/default/sa/echo",
    connection_security_policy=SecurityPolicy.MUTUAL_TLS,
)

STABLE = {
    "istio_tcp_connections_opened_total",
    "istio_tcp_connections_closed_total",
    "istio_tcp_received_bytes_total",
    "istio_tcp_sent_bytes_total",
    "istio_build",
}
UNSTABLE = {
    "istio_tcp_connections_failed_total",
    "istio_active_proxy_count_total",
    "istio_pending_proxy_count_total",
    "istio_proxies_started_total",
    "istio_proxies_stopped_total",
    "istio_dns_requests_total",
    "istio_dns_upstream_requests_total",
    "istio_dns_upstream_failures_total",
    "istio_dns_upstream_request_duration_seconds",
    "istio_on_demand_dns_total",
    "istio_on_demand_dns_cache_misses_total",
    "istio_crl_policy_rejections_total",
    "istio_crl_untracked_connections_total",
}
OWN = {"ambit_dns_dropped_total", "ambit_listener_connections_refused_total"}
"""Ours, not Istio's (ztunnel has no such counter): prefixed ``ambit_``, never ``istio_``."""


def samples(metrics: ProxyMetrics) -> list[Sample]:
    text = metrics.render().decode()
    return [s for family in text_string_to_metric_families(text) for s in family.samples]


def value(metrics: ProxyMetrics, name: str, labels: TrafficLabels | None = None) -> float | None:
    """The value of sample ``name`` (with exactly ``labels``' label set, if given), or None when absent."""
    wanted = None if labels is None else dict(zip(LABEL_NAMES, labels.values(), strict=True))
    found = [s.value for s in samples(metrics) if s.name == name and (wanted is None or s.labels == wanted)]
    assert len(found) <= 1
    return found[0] if found else None


def test_empty_label_values_render_as_unknown_and_enums_as_their_values() -> None:
    values = dict(zip(LABEL_NAMES, TrafficLabels(Reporter.SOURCE).values(), strict=True))
    assert values["reporter"] == "source"
    assert values["source_workload"] == "unknown"
    assert values["destination_principal"] == "unknown"
    assert values["request_protocol"] == "tcp"
    assert values["response_flags"] == "-"
    assert values["connection_security_policy"] == "unknown"
    assert set(values.values()) == {"source", "unknown", "tcp", "-"}


def test_label_names_are_istio_common_traffic_labels_in_field_order() -> None:
    assert LABEL_NAMES[0] == "reporter"
    assert LABEL_NAMES[-3:] == ("request_protocol", "response_flags", "connection_security_policy")
    assert len(LABEL_NAMES) == 23
    values = dict(zip(LABEL_NAMES, INBOUND.values(), strict=True))
    assert values["reporter"] == "destination"
    assert values["source_principal"] == "spiffe://cluster.local/ns/default/sa/web"
    assert values["connection_security_policy"] == "mutual_tls"


def test_a_closed_connection_shows_received_as_client_bytes_and_sent_as_server_bytes() -> None:
    metrics = ProxyMetrics()
    conn = metrics.connection_opened(OUTBOUND)
    for _ in range(11):
        conn.add_received(1)
    conn.add_sent(20)
    conn.add_sent(2)
    conn.close()
    assert value(metrics, "istio_tcp_connections_opened_total", OUTBOUND) == 1
    assert value(metrics, "istio_tcp_connections_closed_total", OUTBOUND) == 1
    assert value(metrics, "istio_tcp_received_bytes_total", OUTBOUND) == 11
    assert value(metrics, "istio_tcp_sent_bytes_total", OUTBOUND) == 22
    assert (conn.received_bytes, conn.sent_bytes) == (11, 22)


def test_a_scrape_mid_connection_shows_the_bytes_so_far_and_the_close_adds_only_the_rest() -> None:
    metrics = ProxyMetrics()
    conn = metrics.connection_opened(OUTBOUND)
    assert value(metrics, "istio_tcp_received_bytes_total", OUTBOUND) == 0
    conn.add_received(5)
    conn.add_sent(7)
    assert value(metrics, "istio_tcp_received_bytes_total", OUTBOUND) == 5
    assert value(metrics, "istio_tcp_sent_bytes_total", OUTBOUND) == 7
    assert value(metrics, "istio_tcp_connections_closed_total", OUTBOUND) is None
    conn.add_received(6)
    conn.add_sent(15)
    assert value(metrics, "istio_tcp_received_bytes_total", OUTBOUND) == 11
    conn.close()
    conn.close()  # idempotent: counted once
    assert value(metrics, "istio_tcp_received_bytes_total", OUTBOUND) == 11
    assert value(metrics, "istio_tcp_sent_bytes_total", OUTBOUND) == 22
    assert value(metrics, "istio_tcp_connections_closed_total", OUTBOUND) == 1


def test_connections_with_the_same_labels_share_a_series_and_reporters_do_not() -> None:
    metrics = ProxyMetrics()
    a, b, c = (
        metrics.connection_opened(OUTBOUND),
        metrics.connection_opened(OUTBOUND),
        metrics.connection_opened(INBOUND),
    )
    a.add_received(1)
    b.add_received(2)
    c.add_received(4)
    for conn in (a, b, c):
        conn.close()
    assert value(metrics, "istio_tcp_connections_opened_total", OUTBOUND) == 2
    assert value(metrics, "istio_tcp_received_bytes_total", OUTBOUND) == 3
    assert value(metrics, "istio_tcp_received_bytes_total", INBOUND) == 4
    assert value(metrics, "istio_tcp_connections_closed_total", INBOUND) == 1


@given(
    st.lists(
        st.tuples(st.sampled_from(["recv", "sent", "scrape"]), st.integers(min_value=0, max_value=1 << 20)),
        max_size=40,
    )
)
def test_byte_counts_are_exact_whatever_the_interleaving_of_chunks_and_scrapes(ops: list[tuple[str, int]]) -> None:
    metrics = ProxyMetrics()
    conn = metrics.connection_opened(OUTBOUND)
    received = sent = 0
    for op, n in ops:
        if op == "recv":
            conn.add_received(n)
            received += n
        elif op == "sent":
            conn.add_sent(n)
            sent += n
        else:
            assert value(metrics, "istio_tcp_received_bytes_total", OUTBOUND) == received
            assert value(metrics, "istio_tcp_sent_bytes_total", OUTBOUND) == sent
    conn.close()
    assert value(metrics, "istio_tcp_received_bytes_total", OUTBOUND) == received
    assert value(metrics, "istio_tcp_sent_bytes_total", OUTBOUND) == sent


@dataclass
class Totals:
    """A copy loop's own running totals (the relay's ``RelayResult`` has the same two fields)."""

    upstream_bytes: int = 0
    downstream_bytes: int = 0


@given(
    st.lists(st.tuples(st.sampled_from(["up", "down", "recv", "sent", "scrape"]), st.integers(0, 1 << 20)), max_size=40)
)
def test_totals_counted_from_a_copy_loop_are_read_at_each_scrape_and_at_close_alongside_added_bytes(
    ops: list[tuple[str, int]],
) -> None:
    metrics = ProxyMetrics()
    conn = metrics.connection_opened(OUTBOUND)
    totals = Totals()
    conn.count_from(totals)
    received = sent = 0
    for op, n in ops:
        if op == "up":  # the copy loop moves bytes: no call into the handle
            totals.upstream_bytes += n
            received += n
        elif op == "down":
            totals.downstream_bytes += n
            sent += n
        elif op == "recv":
            conn.add_received(n)
            received += n
        elif op == "sent":
            conn.add_sent(n)
            sent += n
        else:
            assert value(metrics, "istio_tcp_received_bytes_total", OUTBOUND) == received
            assert value(metrics, "istio_tcp_sent_bytes_total", OUTBOUND) == sent
    assert (conn.received_bytes, conn.sent_bytes) == (received, sent)
    conn.close()
    totals.upstream_bytes += 1000  # after the close: not counted
    assert value(metrics, "istio_tcp_received_bytes_total", OUTBOUND) == received
    assert value(metrics, "istio_tcp_sent_bytes_total", OUTBOUND) == sent


def test_exposed_names_are_exactly_istio_names_without_created_series_or_double_total() -> None:
    metrics = ProxyMetrics()
    metrics.connection_opened(OUTBOUND).close()
    metrics.connection_failed(INBOUND)
    dns_labels = DnsLabels("a", "udp")
    metrics.dns_request(dns_labels)
    metrics.dns_forwarded(dns_labels, 0.003, failed=True)
    metrics.dns_dropped("short")
    text = metrics.render().decode()
    declared = set(re.findall(r"^# TYPE (\S+) ", text, re.MULTILINE))
    assert declared == STABLE | UNSTABLE | OWN
    histogram = "istio_dns_upstream_request_duration_seconds"
    sample_names = {line.split("{")[0].split(" ")[0] for line in text.splitlines() if not line.startswith("#")}
    sample_names = {n.removesuffix("_bucket").removesuffix("_sum").removesuffix("_count") for n in sample_names}
    assert sample_names <= STABLE | UNSTABLE | OWN
    assert f'{histogram}_bucket{{le="0.01",request_protocol="udp"' in text
    assert "_created" not in text
    assert "_total_total" not in text


def test_every_family_is_listed_before_its_first_sample() -> None:
    text = ProxyMetrics().render().decode()
    assert set(re.findall(r"^# HELP (\S+) ", text, re.MULTILINE)) == STABLE | UNSTABLE | OWN


def test_unstable_metrics_and_only_those_say_unstable_in_their_help() -> None:
    text = ProxyMetrics().render().decode()
    helps = dict(re.findall(r"^# HELP (\S+) (.*)$", text, re.MULTILINE))
    for name in UNSTABLE:
        assert "(unstable)" in helps[name], name
    for name in STABLE:
        assert "(unstable)" not in helps[name], name
    parsed = {f.name: f.documentation for f in text_string_to_metric_families(text)}
    assert "(unstable)" in parsed["istio_tcp_connections_failed"]


def test_build_info_names_the_component_and_version() -> None:
    found = [s for s in samples(ProxyMetrics(build_version="0.1.0")) if s.name == "istio_build"]
    assert [(s.labels, s.value) for s in found] == [({"component": "ambit-nodeproxy", "tag": "0.1.0"}, 1)]
    found = [s for s in samples(ProxyMetrics()) if s.name == "istio_build"]
    assert found[0].labels["tag"] == "unknown"


def test_crl_rejections_and_untracked_connections_are_counted_by_reporter() -> None:
    metrics = ProxyMetrics()
    metrics.crl_rejected(Reporter.DESTINATION)
    metrics.crl_rejected(Reporter.DESTINATION)
    metrics.crl_rejected(Reporter.SOURCE)
    metrics.crl_untracked(Reporter.SOURCE)
    found = {(s.name, s.labels["reporter"]): s.value for s in samples(metrics) if "crl" in s.name}
    assert found == {
        ("istio_crl_policy_rejections_total", "destination"): 2,
        ("istio_crl_policy_rejections_total", "source"): 1,
        ("istio_crl_untracked_connections_total", "source"): 1,
    }


def test_failed_connections_and_proxy_lifecycle_counts_are_reported() -> None:
    metrics = ProxyMetrics()
    metrics.connection_failed(OUTBOUND.__class__(Reporter.SOURCE, response_flags="CONNECT"))
    metrics.set_proxy_counts(active=3, pending=1)
    metrics.proxy_started()
    metrics.proxy_started()
    metrics.proxy_stopped()
    failed = [s for s in samples(metrics) if s.name == "istio_tcp_connections_failed_total"]
    assert len(failed) == 1
    assert failed[0].labels["response_flags"] == "CONNECT"
    assert failed[0].value == 1
    assert value(metrics, "istio_active_proxy_count_total") == 3
    assert value(metrics, "istio_pending_proxy_count_total") == 1
    assert value(metrics, "istio_proxies_started_total") == 2
    assert value(metrics, "istio_proxies_stopped_total") == 1
    metrics.set_proxy_counts(active=0, pending=0)
    assert value(metrics, "istio_active_proxy_count_total") == 0


def test_each_instance_has_its_own_registry() -> None:
    first, second = ProxyMetrics(), ProxyMetrics()
    first.connection_opened(OUTBOUND)
    assert value(first, "istio_tcp_connections_opened_total", OUTBOUND) == 1
    assert value(second, "istio_tcp_connections_opened_total", OUTBOUND) is None
    assert first.content_type.startswith("text/plain; version=0.0.4")


def test_connections_refused_at_accept_are_counted_by_listener_and_reason() -> None:
    metrics = ProxyMetrics()
    metrics.connection_refused("hbone", "peer_pending")
    metrics.connection_refused("hbone", "peer_pending")
    metrics.connection_refused("inbound_plaintext", "connections")
    text = metrics.render().decode()
    assert 'ambit_listener_connections_refused_total{listener="hbone",reason="peer_pending"} 2.0' in text
    assert 'ambit_listener_connections_refused_total{listener="inbound_plaintext",reason="connections"} 1.0' in text


def test_prometheus_client_is_imported_by_the_first_scrape_and_the_media_type_is_its_own() -> None:
    probe = (
        "import sys\n"
        "from ambit.telemetry.metrics import CONTENT_TYPE, ProxyMetrics\n"
        "metrics = ProxyMetrics()\n"
        "metrics.proxy_started()\n"
        "print('prometheus_client' in sys.modules)\n"
        "body = metrics.render()\n"
        "from prometheus_client.exposition import CONTENT_TYPE_PLAIN_0_0_4\n"
        "print(b'istio_proxies_started_total 1.0' in body, CONTENT_TYPE == CONTENT_TYPE_PLAIN_0_0_4)\n"
    )
    done = subprocess.run([sys.executable, "-c", probe], capture_output=True, text=True, timeout=60, check=True)
    assert done.stdout.split() == ["False", "True", "True"], done.stdout
