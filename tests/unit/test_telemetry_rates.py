"""Edge rates from two scrapes of the proxies' Istio metrics (:mod:`ambit.telemetry.rates`): counter resets as
Prometheus counts them, one reporter per edge, zero after traffic stops, and any body is a scrape or a ScrapeError."""

from __future__ import annotations

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from ambit.telemetry.metrics import ProxyMetrics, Reporter, SecurityPolicy, TrafficLabels
from ambit.telemetry.rates import EdgeRate, RateBook, ScrapeError, edge_of, rates_by_edge, read_scrape

A, B = "wl:apps/client", "wl:apps/server"


def tcp_labels(reporter: Reporter, *, mtls: bool = True, src: str = "client") -> TrafficLabels:
    return TrafficLabels(
        reporter,
        source_workload=src,
        source_workload_namespace="apps",
        destination_workload="server",
        destination_workload_namespace="apps",
        destination_service="server.apps.svc.cluster.local",
        connection_security_policy=SecurityPolicy.MUTUAL_TLS if mtls else SecurityPolicy.UNKNOWN,
    )


def requests_text(waypoint: dict[str, int], source: int = 0) -> bytes:
    """istio_requests_total as a waypoint (and a source proxy) would expose it, by response code."""
    lines = ["# TYPE istio_requests counter"]
    common = 'source_workload="client",source_workload_namespace="apps",destination_workload="server",'
    common += 'destination_workload_namespace="apps",connection_security_policy="mutual_tls"'
    for code, count in waypoint.items():
        lines.append(f'istio_requests_total{{reporter="waypoint",response_code="{code}",{common}}} {count}')
    if source:
        lines.append(f'istio_requests_total{{reporter="source",response_code="200",{common}}} {source}')
    return ("\n".join(lines) + "\n").encode()


def only(book: RateBook, now: float, window: float = 10.0) -> EdgeRate:
    found = rates_by_edge(book.rates(now, window))
    assert list(found) == [(A, B)]
    return found[(A, B)]


def test_bytes_and_connections_per_second_come_from_the_destination_reporter_of_a_real_exposition() -> None:
    metrics = ProxyMetrics()
    book = RateBook()
    book.observe("node-1", 100.0, read_scrape(metrics.render()))
    for reporter in (Reporter.SOURCE, Reporter.DESTINATION):  # both ends report it: counted once (rule 3)
        for _ in range(4):
            conn = metrics.connection_opened(tcp_labels(reporter))
            conn.add_received(1000)
            conn.add_sent(500)
            conn.close()
    book.observe("node-1", 102.0, read_scrape(metrics.render()))
    rate = only(book, 102.0)
    assert rate.connections == pytest.approx(2.0) and rate.bytes == pytest.approx(3000.0)
    assert rate.security == "mutual_tls" and rate.to_json()["mtls"] is True
    # No traffic since: the edge is still listed, at zero, once the window holds only quiet intervals.
    book.observe("node-1", 104.0, read_scrape(metrics.render()))
    assert only(book, 104.0, window=2.0).bytes == 0.0
    assert only(book, 104.0, window=10.0).bytes == pytest.approx(1500.0)


def test_a_counter_that_went_down_restarted_from_zero_as_prometheus_counts_it() -> None:
    book = RateBook()
    book.observe("wp", 0.0, read_scrape(requests_text({"200": 100})))
    book.observe("wp", 10.0, read_scrape(requests_text({"200": 150})))
    book.observe("wp", 20.0, read_scrape(requests_text({"200": 30})))  # the waypoint restarted
    assert only(book, 20.0, window=20.0).requests == pytest.approx((50 + 30) / 20)
    assert only(book, 20.0, window=5.0).requests == pytest.approx(3.0)


def test_the_error_ratio_is_the_share_of_5xx_of_the_waypoints_requests() -> None:
    book = RateBook()
    book.observe("wp", 0.0, read_scrape(requests_text({"200": 0, "503": 0}, source=0)))
    book.observe("wp", 4.0, read_scrape(requests_text({"200": 30, "503": 10, "404": 0}, source=999)))
    rate = only(book, 4.0)
    assert rate.requests == pytest.approx(10.0)  # the waypoint's count, not the source's too
    assert rate.error_ratio == pytest.approx(0.25)


def test_a_series_new_since_the_last_scrape_grew_from_zero_and_a_first_scrape_is_only_a_baseline() -> None:
    book = RateBook()
    book.observe("wp", 0.0, read_scrape(requests_text({"200": 500})))
    assert only(book, 0.0).requests == 0.0
    book.observe("wp", 2.0, read_scrape(requests_text({"200": 500, "503": 4})))
    assert only(book, 2.0).requests == pytest.approx(2.0) and only(book, 2.0).error_ratio == 1.0


def test_rates_of_two_targets_add_up_and_a_plaintext_series_makes_the_edge_mixed() -> None:
    book = RateBook()
    for target, mtls in (("node-1", True), ("node-2", False)):
        metrics = ProxyMetrics()
        book.observe(target, 0.0, read_scrape(metrics.render()))
        conn = metrics.connection_opened(tcp_labels(Reporter.DESTINATION, mtls=mtls))
        conn.add_sent(100)
        book.observe(target, 1.0, read_scrape(metrics.render()))
    rate = only(book, 1.0)
    assert rate.bytes == pytest.approx(200.0) and rate.connections == pytest.approx(2.0)
    assert rate.security == "mixed"
    book.forget("node-2")
    assert only(book, 1.0).security == "mutual_tls"


def test_series_without_a_known_source_or_destination_are_on_no_edge() -> None:
    assert edge_of({"source_workload": "unknown", "source_workload_namespace": "apps"}) is None
    assert edge_of({"source_workload": "c", "source_workload_namespace": "a", "destination_service": "x.y"}) == (
        "wl:a/c",
        "svc:x.y",
    )
    metrics = ProxyMetrics()
    metrics.connection_opened(TrafficLabels(Reporter.DESTINATION, destination_workload="server")).close()
    book = RateBook()
    book.observe("node-1", 0.0, read_scrape(metrics.render()))
    assert book.rates(0.0, 10.0) == [] and book.unattributed == 3


def test_the_book_keeps_a_bounded_number_of_increments() -> None:
    book = RateBook(max_kept=50)
    for step in range(200):
        body = requests_text({str(200 + code): step for code in range(10)})
        book.observe("wp", float(step), read_scrape(body))
    assert book.kept <= 50 and len(book.intervals) == 25  # each: itself and one edge's growth
    assert only(book, 199.0, window=3.0).requests == pytest.approx(10.0)


def test_hostile_bodies_are_a_scrape_error() -> None:
    with pytest.raises(ScrapeError, match="UTF-8"):
        read_scrape(b"istio_requests_total 1\n\xff\n")
    with pytest.raises(ScrapeError, match="not Prometheus text"):
        read_scrape(b"istio_requests_total{{{ 1\n")
    many = "".join(f'x{{i="{i}"}} 1\n' for i in range(101)).encode()
    with pytest.raises(ScrapeError, match="more than 100 series"):
        read_scrape(many, max_series=100)
    assert read_scrape(b'istio_requests_total{reporter="waypoint"} NaN\nistio_requests_total{a="1"} -3\n') == {}


@settings(max_examples=400, deadline=None)
@given(
    st.binary(max_size=300)
    | st.text(alphabet='istoeqrua_{}="\\, \n#TYPE0123456789.+-eNaInf', max_size=300).map(str.encode)
)
def test_any_body_is_a_scrape_or_a_scrape_error(body: bytes) -> None:
    try:
        kept = read_scrape(body)
    except ScrapeError as exc:
        assert str(exc) and "\n" not in str(exc)
        return
    book = RateBook()
    book.observe("t", 0.0, kept)
    book.observe("t", 1.0, kept)
    for rate in book.rates(1.0, 10.0):
        assert rate.requests == 0.0 and rate.bytes == 0.0
