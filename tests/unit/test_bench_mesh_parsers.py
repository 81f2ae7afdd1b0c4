"""The benchmark's readers of iperf3 and sockperf output, its aggregation, and its PNG writer."""

from __future__ import annotations

import contextlib
import json
import sys
import zlib
from pathlib import Path

import pytest
from hypothesis import given
from hypothesis import strategies as st

REPO = Path(__file__).resolve().parents[2]
if str(REPO) not in sys.path:
    sys.path.insert(0, str(REPO))


from bench.mesh.chart import draw  # noqa: E402
from bench.mesh.probes import ProbeError, parse_iperf3, parse_sockperf  # noqa: E402
from bench.mesh.profile import PROFILES  # noqa: E402
from bench.mesh.results import Sample, aggregate  # noqa: E402

SOCKPERF = """sockperf: [Total Run] RunTime=1.000 sec; Warm up time=400 msec; SentMessages=21122; ReceivedMessages=21121
sockperf: ---> percentile 99.000 =   73.860
sockperf: ---> percentile 90.000 =   61.511
sockperf: ---> percentile 50.000 =   56.794
"""


def test_sockperf_percentiles_and_reply_count_are_read() -> None:
    result = parse_sockperf(SOCKPERF)
    assert (result.p50, result.p90, result.p99, result.messages) == (56.794, 61.511, 73.860, 21121)


def test_iperf3_receiver_figures_are_read_and_its_error_is_reported() -> None:
    ok = json.dumps({"end": {"sum_received": {"bits_per_second": 1e9, "bytes": 125000000}}})
    assert parse_iperf3(ok).bytes == 125000000
    with pytest.raises(ProbeError, match="server is busy"):
        parse_iperf3(json.dumps({"error": "the server is busy running a test"}))


@given(st.text(max_size=300))
def test_arbitrary_tool_output_gives_a_probe_error_or_figures(text: str) -> None:
    for parse in (parse_iperf3, parse_sockperf):
        with contextlib.suppress(ProbeError):
            parse(text)


def test_ratios_are_taken_to_direct_and_stunnel_of_the_same_scenario() -> None:
    samples = [
        Sample("bulk", "throughput", mode, value, "Gbit/s")
        for mode, value in [("direct", 10), ("direct", 12), ("stunnel", 5), ("ambit", 4), ("ambit", 6)]
    ]
    rows = {r.mode: r for r in aggregate(samples)}
    assert rows["direct"].value == 11
    assert rows["ambit"].x_direct == pytest.approx(5 / 11)
    assert rows["ambit"].x_stunnel == pytest.approx(1.0)
    assert (rows["ambit"].min, rows["ambit"].max) == (4, 6)


def test_the_chart_is_a_png_whose_pixels_decompress(tmp_path: Path) -> None:
    rows = aggregate([Sample("bulk", "throughput", m, v, "Gbit/s") for m, v in [("direct", 10.0), ("ambit", 4.0)]])
    data = draw(rows, [("bulk", "throughput")], tmp_path / "c.png").read_bytes()
    assert data.startswith(b"\x89PNG\r\n\x1a\n")
    start = data.index(b"IDAT") + 4
    length = int.from_bytes(data[start - 8 : start - 4], "big")
    assert len(zlib.decompress(data[start : start + length])) == 260 * (1 + 720 * 3)


def test_the_flow_logs_cost_is_the_ratio_of_the_medians_with_and_without_it() -> None:
    from bench.mesh.run import AMBIT, FLOW_LOG_SCENARIO, NO_FLOW_LOG, flow_log_cost

    samples = [Sample(FLOW_LOG_SCENARIO, "connections/s", AMBIT, v, "/s") for v in (970, 990, 980)]
    samples += [Sample(FLOW_LOG_SCENARIO, "connections/s", NO_FLOW_LOG, v, "/s") for v in (1000, 1010, 990)]
    assert flow_log_cost(aggregate(samples)) == pytest.approx(0.98)
    assert flow_log_cost(aggregate(samples[:3])) is None


def test_a_client_past_its_bound_fails_naming_its_route_and_its_sockets(monkeypatch: pytest.MonkeyPatch) -> None:
    """A hung bulk run (flaky-tests 49) names the route that hung and its TCP sockets, and is not retried."""
    import subprocess

    from bench.mesh import scenarios
    from bench.mesh.probes import ProbeTimeout

    calls: list[list[str]] = []

    def run(argv: list[str], **kwargs: object) -> subprocess.CompletedProcess[str]:
        calls.append(argv)
        if "iperf3" in argv:
            raise subprocess.TimeoutExpired(argv, kwargs["timeout"])  # type: ignore[arg-type]
        return subprocess.CompletedProcess(argv, 0, "ESTAB 0 4194304 198.18.0.9:41000 198.18.0.12:5201\n", "")

    monkeypatch.setattr(scenarios.subprocess, "run", run)
    route = scenarios.Route("ambit", "bench-c1", "198.18.0.12", {"iperf3": 5201}, ())
    with pytest.raises(ProbeTimeout) as caught:
        scenarios.bulk(route, "bulk, 4 streams", 4, 2.0)
    message = str(caught.value)
    assert message.startswith("ambit: iperf3 -c 198.18.0.12 -p 5201 -t 2 -P 4 -J did not finish within 32 s")
    assert "client netns bench-c1" in message
    assert "ESTAB 0 4194304" in message
    assert sum("iperf3" in argv for argv in calls) == 1  # a hang is reported, not hidden by the busy-server retry


def test_the_unpinned_scenario_runs_in_bench_quick_and_full_but_not_in_the_smoke_test() -> None:
    assert PROFILES["short"].unpinned_sizes == (14,)  # `make bench-quick`
    assert PROFILES["full"].unpinned_sizes == (14, 1024)
    assert PROFILES["smoke"].unpinned_sizes == ()


def test_the_smoke_test_leaves_out_what_only_repeats_a_measurement_and_bench_quick_keeps_it() -> None:
    smoke, short = PROFILES["smoke"], PROFILES["short"]
    assert (smoke.rr_sizes, smoke.fresh_idle, smoke.flow_log) == ((14,), False, False)
    assert (short.rr_sizes, short.fresh_idle, short.flow_log) == ((14, 1024), True, True)
