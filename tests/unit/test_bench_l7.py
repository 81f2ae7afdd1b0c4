"""The L7 benchmark's pure parts: h2load's command line, summary and log (real output captured once, in
golden/h2load/), percentiles, the rows with their ratios and the goals, and the objects it puts on the lab."""

# ruff: noqa: RUF001, RUF003 - × in the expected scenario names

from __future__ import annotations

import contextlib
import sys
from pathlib import Path

import pytest
from hypothesis import given
from hypothesis import strategies as st

REPO = Path(__file__).resolve().parents[2]
if str(REPO) not in sys.path:
    sys.path.insert(0, str(REPO))

from bench import l7_objects as objects  # noqa: E402
from bench.h2load import (  # noqa: E402
    HTTP1,
    HTTP2,
    H2loadError,
    Load,
    Logged,
    check_clean,
    latencies,
    parse_log,
    parse_summary,
)
from bench.l7 import (  # noqa: E402
    PROFILES,
    Reading,
    closed_load,
    fixed_load,
    handshake_load,
    samples_of,
    scenario_name,
)
from bench.l7_report import (  # noqa: E402
    L7_CPU,
    L7_RSS,
    P99,
    RATE,
    Sample,
    added_p99,
    aggregate,
    markdown,
    verdicts,
)
from bench.mesh.tunnels import Credentials  # noqa: E402

GOLDEN = Path(__file__).parent / "golden" / "h2load"


def golden(name: str) -> str:
    return (GOLDEN / name).read_text()


# -- h2load's output ------------------------------------------------------------------------------------------------
def test_a_keep_alive_run_s_summary_is_read() -> None:
    summary = parse_summary(golden("h1-keepalive.txt"))
    assert (summary.seconds, summary.requests_per_second) == (2.01, 31031.0)
    assert (summary.done, summary.succeeded, summary.status_2xx) == (31031, 31031, 31031)
    assert summary.protocol == "http/1.1"
    assert parse_summary(golden("h2c.txt")).protocol == "h2c"
    check_clean(summary, "direct")


def test_the_negotiated_protocol_is_read_over_tls_and_milliseconds_are_seconds() -> None:
    assert parse_summary(golden("tls-h2.txt")).protocol == "h2"
    close = parse_summary(golden("tls-h1-close.txt"))
    assert close.seconds == pytest.approx(0.36078)
    assert (close.done, close.requests_per_second) == (400, 1108.70)


def test_a_fixed_rate_run_reports_the_rate_it_held() -> None:
    assert parse_summary(golden("h2c-fixed-rate.txt")).requests_per_second == 200.0
    assert parse_summary(golden("h2c.txt")).requests_per_second == 37604.0


def test_a_run_that_did_nothing_or_got_failures_is_an_error() -> None:
    with pytest.raises(H2loadError, match="no request was done"):
        check_clean(parse_summary(golden("refused.txt")), "l4")
    failed = golden("h1-keepalive.txt").replace("31031 succeeded, 0 failed", "30031 succeeded, 1000 failed")
    with pytest.raises(H2loadError, match="1000 failed"):
        check_clean(parse_summary(failed), "waypoint")
    not_2xx = golden("h2c.txt").replace("37604 2xx, 0 3xx, 0 4xx, 0 5xx", "37000 2xx, 0 3xx, 0 4xx, 604 5xx")
    with pytest.raises(H2loadError, match=r"37000 of 37604 got a 2xx \(0 3xx, 0 4xx, 604 5xx\)"):
        check_clean(parse_summary(not_2xx), "gateway")


def test_a_few_requests_gone_wrong_are_tolerated_and_counted() -> None:
    assert check_clean(parse_summary(golden("h2c.txt")), "l4") == 0
    few = golden("h2c.txt").replace("37604 2xx, 0 3xx, 0 4xx, 0 5xx", "37603 2xx, 0 3xx, 0 4xx, 1 5xx")
    assert check_clean(parse_summary(few), "waypoint") == 1


def test_a_run_must_speak_the_protocol_its_load_asked_for() -> None:
    check_clean(parse_summary(golden("tls-h2.txt")), "gateway", HTTP2)
    check_clean(parse_summary(golden("h2c.txt")), "l4", HTTP2)
    check_clean(parse_summary(golden("tls-h1-close.txt")), "gateway", HTTP1)
    with pytest.raises(H2loadError, match=r"spoke http/1\.1, not HTTP/2"):
        check_clean(parse_summary(golden("h1-keepalive.txt")), "gateway", HTTP2)


def test_text_that_is_not_a_summary_is_an_error() -> None:
    with pytest.raises(H2loadError, match="no summary"):
        parse_summary("h2load: could not resolve host\n")


def test_the_log_s_durations_give_the_percentiles_of_the_2xx_requests() -> None:
    logged = parse_log(golden("h2c.log"))
    assert len(logged) == 200 and all(r.status == 200 for r in logged)
    durations = sorted(r.duration_us for r in logged)
    timing = latencies(logged)
    assert timing.count == 200
    assert durations[99] <= timing.p50 <= durations[100]
    assert durations[197] <= timing.p99 <= durations[199]
    assert latencies(parse_log(golden("h1-keepalive.log"))).p50 > 0


def test_failed_requests_are_left_out_of_the_percentiles() -> None:
    logged = [Logged(1, 200, 100), Logged(2, -1, 10**9), Logged(3, 0, 10**9), Logged(4, 200, 300)]
    assert latencies(logged).p50 == 200.0
    with pytest.raises(H2loadError, match="no successful request"):
        latencies([Logged(1, -1, 5)])


def test_a_log_line_that_is_not_three_integers_is_an_error() -> None:
    with pytest.raises(H2loadError, match="line 2 has 2 fields"):
        parse_log("1\t200\t5\n1\t200\n")
    with pytest.raises(H2loadError, match="not three integers"):
        parse_log("1\tok\t5\n")


@given(st.text(max_size=400))
def test_arbitrary_output_gives_an_h2load_error_or_figures(text: str) -> None:
    for parse in (parse_summary, parse_log):
        with contextlib.suppress(H2loadError):
            parse(text)


@given(st.lists(st.tuples(st.integers(), st.integers(-2, 600), st.integers(0, 10**7)), max_size=30))
def test_arbitrary_logs_give_percentiles_or_an_h2load_error(rows: list[tuple[int, int, int]]) -> None:
    text = "".join(f"{a}\t{b}\t{c}\n" for a, b, c in rows)
    with contextlib.suppress(H2loadError):
        timing = latencies(parse_log(text))
        assert timing.p50 <= timing.p99


@given(st.text(max_size=300))
def test_haproxy_stats_info_never_raises(text: str) -> None:
    assert isinstance(objects.parse_stats_info(text), dict)


# -- h2load's command line ------------------------------------------------------------------------------------------
def test_http1_and_http2_loads_become_h2load_arguments() -> None:
    h1 = Load(HTTP1, 16, seconds=2, warm_up=0.5).argv("http://10.0.0.1/", "/tmp/log")
    expected = ["h2load", "-c", "16", "-t", "1", "--h1", "-D", "2000ms", "--warm-up-time=500ms"]
    assert h1 == [*expected, "--log-file=/tmp/log", "http://10.0.0.1/"]
    h2 = Load(HTTP2, 4, 4, seconds=8, rate_per_connection=100).argv("https://x/", "/l", "10.0.0.9:8443")
    assert h2[h2.index("-m") + 1] == "4" and "--rps=100" in h2 and "--connect-to=10.0.0.9:8443" in h2
    close = Load(HTTP1, 8, requests=400, headers=("Connection: close",)).argv("https://x/", "/l")
    assert close[close.index("-n") + 1] == "400" and close[close.index("-H") + 1] == "Connection: close"
    assert Load(HTTP2, 4, 4).in_flight == 16 and Load(HTTP1, 16, 4).in_flight == 16


def test_a_load_has_a_duration_or_a_count_and_a_known_protocol() -> None:
    with pytest.raises(ValueError, match="either a duration or a request count"):
        Load(HTTP1, 1).argv("http://x/", "/l")
    with pytest.raises(ValueError, match="either a duration or a request count"):
        Load(HTTP1, 1, seconds=1, requests=5).argv("http://x/", "/l")
    with pytest.raises(ValueError, match="unknown protocol"):
        Load("HTTP/3", 1, seconds=1).argv("http://x/", "/l")


def test_scenarios_are_named_by_what_they_load() -> None:
    quick = PROFILES["quick"]
    names = {
        scenario_name(closed_load(quick, HTTP1)),
        scenario_name(closed_load(quick, HTTP2)),
        scenario_name(fixed_load(quick, HTTP1)),
        scenario_name(closed_load(quick, HTTP1), ingress=True),
        scenario_name(handshake_load(quick), ingress=True),
    }
    assert names == {
        "HTTP/1.1 keep-alive, 16 connections",
        "HTTP/2, 4 connections × 4 streams",
        "HTTP/1.1 at 1,000 req/s (fixed rate, 10 connections)",
        "ingress HTTPS from the host, HTTP/1.1 keep-alive, 16 connections",
        "ingress HTTPS from the host, a new TLS connection per request (HTTP/1.1, 8 connections)",
    }


# -- rows, ratios, goals ----------------------------------------------------------------------------------------------
def test_a_reading_gives_cpu_per_thousand_requests_and_the_peak_rss() -> None:
    reading = Reading(1000.0, 500.0, 2000.0, 2.0, {"l7": 0.4, "node": 0.2, "all": 0.6}, 50 * 2**20)
    found = {s.metric: s.value for s in samples_of("s", "waypoint", reading, ingress=False)}
    assert found[RATE] == 1000.0 and found[P99] == 2000.0
    assert found[L7_CPU] == pytest.approx(0.2)  # 0.2 vCPU at 1,000 req/s
    assert found["all proxies' CPU per 1,000 req/s"] == pytest.approx(0.3)
    assert found[L7_RSS] == 50.0
    ingress = {s.metric: s.value for s in samples_of("i", "gateway", reading, ingress=True)}
    assert ingress["requests/s per vCPU, L7 proxy"] == pytest.approx(5000.0)
    handshakes = {s.metric for s in samples_of("h", "gateway", reading, ingress=True, handshakes=True)}
    assert "new TLS connections/s per vCPU, node proxies" in handshakes


def _rows(scenario: str = "fixed") -> list[Sample]:
    values = {"direct": (2000, 300), "l4": (1000, 900), "waypoint": (500, 2400), "haproxy-http": (1500, 800)}
    samples = []
    for mode, (rate, p99) in values.items():
        for delta in (-10, 0, 10):
            samples.append(Sample(scenario, RATE, mode, rate + delta, "/s"))
            samples.append(Sample(scenario, P99, mode, p99 + delta, "µs"))
    samples.append(Sample(scenario, L7_CPU, "waypoint", 0.3, "vCPU"))
    samples.append(Sample(scenario, L7_CPU, "haproxy-http", 0.1, "vCPU"))
    samples.append(Sample(scenario, L7_RSS, "waypoint", 50.0, "MiB"))
    return samples


def test_rows_carry_ratios_to_direct_and_to_haproxy_of_the_same_scenario() -> None:
    rows = {(r.metric, r.mode): r for r in aggregate(_rows())}
    waypoint = rows[(RATE, "waypoint")]
    assert (waypoint.value, waypoint.min, waypoint.max) == (500, 490, 510)
    assert waypoint.x_direct == pytest.approx(0.25) and waypoint.x_peer == pytest.approx(500 / 1500)
    assert rows[(RATE, "direct")].x_direct is None and rows[(RATE, "haproxy-http")].x_peer is None
    assert rows[(P99, "l4")].added_over_direct == 600 and rows[(RATE, "l4")].added_over_direct is None
    assert rows[(L7_CPU, "waypoint")].x_peer == pytest.approx(3.0) and rows[(L7_CPU, "waypoint")].x_direct is None
    order = [(r.metric, r.mode) for r in aggregate(_rows())][:4]
    assert order == [(RATE, "direct"), (RATE, "l4"), (RATE, "waypoint"), (RATE, "haproxy-http")]


def test_the_ingress_scenarios_compare_with_haproxy_ingress() -> None:
    samples = [Sample("in", RATE, mode, v, "/s") for mode, v in (("direct", 4), ("gateway", 1), ("haproxy-ingress", 2))]
    rows = {r.mode: r for r in aggregate(samples)}
    assert rows["gateway"].peer == "haproxy-ingress" and rows["gateway"].x_peer == pytest.approx(0.5)


def test_the_goals_are_judged_at_the_fixed_rate_with_the_p99_added() -> None:
    rows = aggregate(_rows())
    assert added_p99(rows, "fixed") == (1500, 500)
    lines = verdicts(rows, ["fixed", "absent"])
    assert lines[0] == "Goal: waypoint CPU per 1,000 req/s ≤ 0.25 vCPU (fixed): missed, 0.300 vCPU at 500 req/s."
    assert lines[1].startswith("Goal: waypoint memory ≤ 60 MB at that rate (fixed): met, 52.4 MB (50.0 MiB)")
    assert (
        lines[2] == "p99 added (fixed): the waypoint +1,500 µs over the L4 mesh path; haproxy-http +500 µs over direct."
    )
    assert lines[3].endswith("(absent): not measured.") and "n/a" in lines[5]


def test_the_markdown_names_the_machine_and_the_load_average_at_both_ends() -> None:
    env = {
        "vcpus": 2,
        "cpu_model": "EPYC",
        "kernel": "6.1",
        "python": "3.11",
        "openssl": "OpenSSL 3",
        "h2load": "h2load nghttp2/1.52.0",
        "haproxy": "HAProxy 2.6",
        "loadavg": 0.5,
        "loadavg_end": 0.75,
        "time": "now",
    }
    text = markdown(aggregate(_rows()), env, "quick", ["a note"])
    assert "2 vCPUs (EPYC)" in text and "load average 0.50 at start, 0.75 at end" in text
    assert "| requests/s | waypoint | 500 | 490–510 | /s | 0.25× |  | 0.33× |" in text
    assert text.endswith("- a note\n")


# -- the objects on the lab -----------------------------------------------------------------------------------------
def test_only_the_waypoint_service_is_bound_to_the_waypoint() -> None:
    found = {(o["kind"], o["metadata"]["name"]): o for o in objects.mesh_objects(b"CERT", b"KEY")}
    assert found[("Service", "amb-wp")]["metadata"]["labels"] == {"istio.io/use-waypoint": "waypoint"}
    assert found[("Service", "amb-l4")]["metadata"]["labels"] == {}
    listener = found[("Gateway", "bench-ingress")]["spec"]["listeners"][0]
    assert (listener["protocol"], listener["hostname"], listener["port"]) == ("HTTPS", "bench.example", 8443)
    assert found[("Secret", "bench-ingress-cert")]["type"] == "kubernetes.io/tls"
    route = found[("HTTPRoute", "bench-ingress")]["spec"]
    assert route["rules"][0]["backendRefs"] == [{"name": "amb-l4", "port": 80}]
    assert [o["kind"] for o in objects.mesh_objects(b"", b"")][2] == "Namespace"


def test_haproxy_configurations_speak_http_with_mutual_tls_between_the_sides(tmp_path: Path) -> None:
    creds = Credentials(tmp_path / "ca.crt", tmp_path / "server.pem", tmp_path / "client.pem")
    files = objects.AnswerFiles(tmp_path / "body", tmp_path / "listener.pem")
    answer = objects.answer_config(files)
    assert f"file {files.body}" in answer and "bind :8080\n" in answer and "bind :8443 ssl" in answer
    client = objects.haproxy_http_config(creds, client=True, server_ip="10.0.2.5")
    assert "mode http" in client and "10.0.2.5:28080 ssl crt" in client and "verify required alpn h2" in client
    server = objects.haproxy_http_config(creds, client=False, server_ip="10.0.2.5")
    assert f"ssl crt {creds.server_pem} ca-file {creds.ca} verify required" in server and "127.0.0.1:8080" in server
    ingress = objects.haproxy_ingress_config(creds, files, server_ip="10.0.2.5", stats_socket=tmp_path / "s")
    assert f"bind 127.0.0.1:18443 ssl crt {files.listener_pem} alpn h2,http/1.1" in ingress
    assert f"stats socket {tmp_path / 's'}" in ingress


def test_haproxy_stats_info_is_read_as_names_and_values() -> None:
    info = objects.parse_stats_info("Name: HAProxy\nSslFrontendSessionReuse_pct: 99\nnoise\n: empty\n")
    assert info == {"Name": "HAProxy", "SslFrontendSessionReuse_pct": "99"}
