"""The DNS benchmark's readers of dnsperf output, its input files and its choice of the latency rate."""

from __future__ import annotations

import sys
from pathlib import Path

import pytest
from hypothesis import given
from hypothesis import strategies as st

REPO = Path(__file__).resolve().parents[2]
if str(REPO) not in sys.path:  # bench/ is not installed: `python -m bench.dns` runs from the repository root
    sys.path.insert(0, str(REPO))

from bench import dns as bench_dns  # noqa: E402 - after the path set-up above
from bench.dnsperf import DnsperfError, Summary, dnsperf_argv, parse_latencies, parse_summary  # noqa: E402

SUMMARY = """DNS Performance Testing Tool
Version 2.10.0

[Status] Command line: dnsperf -s 127.0.0.1 -p 15053 -d q.txt -l 2 -c 4 -q 16 -t 1
[Status] Testing complete (time limit)

Statistics:

  Queries sent:         61080
  Queries completed:    61000 (99.87%)
  Queries lost:         80 (0.13%)

  Response codes:       NOERROR 60650 (99.29%), SERVFAIL 350 (0.57%)
  Average packet size:  request 40, response 56
  Run time (s):         2.004098
  Queries per second:   30437.635634

  Average Latency (s):  0.001417 (min 0.000021, max 0.012145)
  Latency StdDev (s):   0.001404
"""

VERBOSE = [
    "[Status] Sending queries (to 127.0.0.1:15053)",
    "> NOERROR svc-0.ns-0.svc.cluster.local A 0.000253",
    "> SERVFAIL ext-0.example.com A 0.002000",
    "[Timeout] Query timed out: msg id 41",
    "> NOERROR ext-1.example.com A 0.000088\n",
]


def test_the_statistics_block_is_read_and_only_noerror_answers_count_as_work() -> None:
    summary = parse_summary(SUMMARY)
    assert (summary.sent, summary.completed, summary.lost) == (61080, 61000, 80)
    assert summary.rcodes == {"NOERROR": 60650, "SERVFAIL": 350}
    assert summary.run_time == pytest.approx(2.004098)
    assert summary.answered_per_second == pytest.approx(60650 / 2.004098)
    assert summary.failed == 61080 - 60650


def test_a_run_that_printed_no_statistics_is_an_error_naming_the_missing_line() -> None:
    with pytest.raises(DnsperfError, match="'run time'"):
        parse_summary(SUMMARY.replace("Run time (s):", "Runtime:"))
    with pytest.raises(DnsperfError, match=r"no 'sent' line: Error: could not open q\.txt"):
        parse_summary("Error: could not open q.txt\n")


def test_verbose_lines_give_every_latency_its_response_code_and_the_timeouts() -> None:
    latencies = parse_latencies(VERBOSE)
    assert latencies.seconds == (0.000253, 0.002, 0.000088)
    assert latencies.rcodes == {"NOERROR": 2, "SERVFAIL": 1}
    assert latencies.timeouts == 1


@given(st.text(max_size=2000))
def test_any_text_is_read_or_refused_with_a_dnsperf_error(text: str) -> None:
    try:
        summary = parse_summary(text)
    except DnsperfError:
        return
    assert isinstance(summary, Summary)


@given(st.lists(st.text(max_size=80), max_size=50))
def test_any_lines_give_latencies_without_raising(lines: list[str]) -> None:
    latencies = parse_latencies(lines)
    assert len(latencies.seconds) == sum(latencies.rcodes.values())
    assert all(s >= 0 for s in latencies.seconds)


@given(st.lists(st.tuples(st.sampled_from(["NOERROR", "NXDOMAIN", "SERVFAIL"]), st.integers(0, 10**7)), max_size=30))
def test_verbose_lines_round_trip(responses: list[tuple[str, int]]) -> None:
    lines = [f"> {code} svc-{i}.ns-0.svc.cluster.local A {us / 1e6:.6f}" for i, (code, us) in enumerate(responses)]
    latencies = parse_latencies(lines)
    assert [round(s * 1e6) for s in latencies.seconds] == [us for _, us in responses]


def test_a_paced_run_is_verbose_and_rate_limited_and_a_flood_is_not() -> None:
    paced = dnsperf_argv("127.0.0.1", 15053, Path("q.txt"), 2, max_qps=250, verbose=True)
    assert paced[-3:] == ["-Q", "250", "-v"]
    flood = dnsperf_argv("127.0.0.1", 15053, Path("q.txt"), 1.5, clients=4, outstanding=16)
    assert "-Q" not in flood and "-v" not in flood
    assert flood[flood.index("-l") + 1] == "1.5" and flood[flood.index("-q") + 1] == "16"


def test_the_hosts_file_holds_every_mesh_name_and_as_many_external_names_on_distinct_addresses() -> None:
    lines = bench_dns.hosts_file(1000).splitlines()
    assert len(lines) == 2000
    assert lines[0] == "198.19.0.0 svc-0.ns-0.svc.cluster.local"
    assert lines[1999] == f"{bench_dns.external_ip(999)} ext-999.example.com"
    assert len({line.split()[0] for line in lines}) == 2000
    queries = bench_dns.query_file([bench_dns.external_name(i) for i in range(50)]).splitlines()
    assert sorted(queries) == sorted(f"ext-{i}.example.com A" for i in range(50))


def test_the_latency_rate_is_a_quarter_of_the_proxys_rate_within_bounds() -> None:
    profile = bench_dns.PROFILES["quick"]

    def rate(answers_per_second: float) -> int:
        return bench_dns.latency_rate(Summary(1, 1, 0, {"NOERROR": int(answers_per_second)}, 1.0), profile)

    assert rate(1000) == 250
    assert rate(10) == 20
    assert rate(1_000_000) == profile.latency_qps


def test_the_proxys_failure_counters_are_picked_from_its_log() -> None:
    log = 'x\nambit_dns_dropped_total{reason="overload"} 350.0\nistio_dns_requests_total{a="b"} 9.0\n'
    assert bench_dns.proxy_counters(log) == ['ambit_dns_dropped_total{reason="overload"} 350.0']
