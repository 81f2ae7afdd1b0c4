"""The admin, stats and readiness servers on loopback (ports 0), plus the pure readiness and log-level pieces."""

from __future__ import annotations

import json
import logging
import socket
from collections.abc import AsyncIterator, Iterator
from dataclasses import dataclass, field
from typing import Any

import aiohttp
import pytest
from hypothesis import given
from hypothesis import strategies as st
from prometheus_client.parser import text_string_to_metric_families

from ambit.telemetry import BadLogLevelError, TelemetryError
from ambit.telemetry.endpoints import ProxyEndpoints, parse_log_levels
from ambit.telemetry.metrics import ProxyMetrics, Reporter, TrafficLabels
from ambit.telemetry.readiness import Readiness

LOOPBACK = "127.0.0.1"
TOKEN = "test-admin-token-0123456789"
DUMP: dict[str, Any] = {"workloads": [{"name": "web-0", "namespace": "default"}], "version": "0.1.0"}


@dataclass
class Harness:
    endpoints: ProxyEndpoints
    metrics: ProxyMetrics
    readiness: Readiness
    session: aiohttp.ClientSession
    quits: list[None] = field(default_factory=list)

    def url(self, server: str, path: str) -> str:
        return f"http://{LOOPBACK}:{self.endpoints.ports[server]}{path}"

    async def call(self, method: str, server: str, path: str) -> tuple[int, str, aiohttp.ClientResponse]:
        """``method`` on ``path``, with the admin token (the admin POSTs need it; see tests/security/test_admin.py)."""
        headers = {"Authorization": f"Bearer {TOKEN}"}
        async with self.session.request(method, self.url(server, path), headers=headers) as response:
            return response.status, await response.text(), response


@pytest.fixture
def restore_log_levels() -> Iterator[None]:
    names = ["ambit", "access", "ambit.proxy"]
    saved = {name: logging.getLogger(name).level for name in names}
    yield
    for name, level in saved.items():
        logging.getLogger(name).setLevel(level)


@pytest.fixture
async def harness(restore_log_levels: None) -> AsyncIterator[Harness]:
    metrics, readiness = ProxyMetrics(build_version="test"), Readiness()
    quits: list[None] = []
    endpoints = ProxyEndpoints(
        metrics=metrics,
        readiness=readiness,
        config_dump=lambda: DUMP,
        quit=lambda: quits.append(None),
        admin_token=TOKEN,
        admin_address=(LOOPBACK, 0),
        stats_address=(LOOPBACK, 0),
        readiness_address=(LOOPBACK, 0),
    )
    await endpoints.start()
    try:
        async with aiohttp.ClientSession() as session:
            yield Harness(endpoints, metrics, readiness, session, quits)
    finally:
        await endpoints.aclose()


# --- servers -----------------------------------------------------------------------------------------------------


async def test_each_server_binds_its_own_port(harness: Harness) -> None:
    ports = harness.endpoints.ports
    assert set(ports) == {"admin", "stats", "readiness"}
    assert len(set(ports.values())) == 3
    assert all(port > 0 for port in ports.values())


async def test_admin_index_lists_the_endpoints(harness: Harness) -> None:
    status, body, _ = await harness.call("GET", "admin", "/")
    assert status == 200
    for path in ("/config_dump", "/logging", "/quitquitquit", "/metrics", "/healthz/ready"):
        assert path in body


async def test_config_dump_is_indented_json_of_the_callback(harness: Harness) -> None:
    status, body, response = await harness.call("GET", "admin", "/config_dump")
    assert status == 200
    assert response.content_type == "application/json"
    assert json.loads(body) == DUMP
    assert body == json.dumps(DUMP, indent=2) + "\n"


async def test_a_failing_config_dump_is_a_one_line_500(caplog: pytest.LogCaptureFixture) -> None:
    def broken() -> dict[str, Any]:
        raise RuntimeError("state not loaded")

    endpoints = ProxyEndpoints(
        metrics=ProxyMetrics(),
        readiness=Readiness(),
        config_dump=broken,
        quit=lambda: None,
        admin_token=TOKEN,
        admin_address=(LOOPBACK, 0),
        stats_address=(LOOPBACK, 0),
        readiness_address=(LOOPBACK, 0),
    )
    await endpoints.start()
    try:
        async with aiohttp.ClientSession() as session:
            url = f"http://{LOOPBACK}:{endpoints.ports['admin']}/config_dump"
            async with session.get(url) as response:
                assert response.status == 500
                assert await response.text() == "config_dump failed: RuntimeError: state not loaded\n"
    finally:
        await endpoints.aclose()
    assert any(r.getMessage() == "config_dump failed" and r.exc_info for r in caplog.records)


async def test_quitquitquit_answers_ok_then_calls_quit(harness: Harness) -> None:
    status, body, _ = await harness.call("POST", "admin", "/quitquitquit")
    assert (status, body) == (200, "OK\n")
    assert len(harness.quits) == 1


async def test_quitquitquit_by_get_is_405_and_does_not_quit(harness: Harness) -> None:
    status, _, _ = await harness.call("GET", "admin", "/quitquitquit")
    assert status == 405
    assert harness.quits == []


async def test_logging_get_shows_levels_and_post_sets_the_ambit_logger(harness: Harness) -> None:
    logging.getLogger("ambit").setLevel(logging.INFO)
    status, body, _ = await harness.call("GET", "admin", "/logging")
    assert status == 200
    assert "ambit: info" in body.splitlines()
    status, body, _ = await harness.call("POST", "admin", "/logging?level=debug")
    assert status == 200
    assert logging.getLogger("ambit").level == logging.DEBUG
    assert "ambit: debug" in body.splitlines()


async def test_logging_post_sets_named_loggers(harness: Harness) -> None:
    status, body, _ = await harness.call("POST", "admin", "/logging?level=access:warning,ambit.proxy:error")
    assert status == 200
    assert logging.getLogger("access").level == logging.WARNING
    assert logging.getLogger("ambit.proxy").level == logging.ERROR
    assert "ambit.proxy: error" in body.splitlines()


async def test_logging_post_with_a_bad_level_is_a_400_naming_it(harness: Harness) -> None:
    before = logging.getLogger("ambit").level
    status, body, _ = await harness.call("POST", "admin", "/logging?level=loud")
    assert status == 400
    assert "'loud'" in body
    status, _, _ = await harness.call("POST", "admin", "/logging")
    assert status == 400
    assert logging.getLogger("ambit").level == before


async def test_metrics_are_served_on_both_paths(harness: Harness) -> None:
    conn = harness.metrics.connection_opened(TrafficLabels(Reporter.SOURCE, source_workload="web-0"))
    conn.add_received(11)
    conn.add_sent(22)
    for path in ("/metrics", "/stats/prometheus"):
        status, body, response = await harness.call("GET", "stats", path)
        assert status == 200
        assert response.headers["Content-Type"] == harness.metrics.content_type
        values = {s.name: s.value for f in text_string_to_metric_families(body) for s in f.samples}
        assert values["istio_tcp_received_bytes_total"] == 11
        assert values["istio_tcp_sent_bytes_total"] == 22


async def test_metrics_by_post_is_405(harness: Harness) -> None:
    status, _, _ = await harness.call("POST", "stats", "/metrics")
    assert status == 405


async def test_readiness_is_500_naming_pending_tasks_until_they_are_done(harness: Harness) -> None:
    harness.readiness.add_pending("state manager")
    harness.readiness.add_pending("proxy")
    status, body, _ = await harness.call("GET", "readiness", "/healthz/ready")
    assert (status, body) == (500, "not ready, pending: proxy, state manager")
    harness.readiness.done("proxy")
    status, body, _ = await harness.call("GET", "readiness", "/healthz/ready")
    assert (status, body) == (500, "not ready, pending: state manager")
    harness.readiness.done("state manager")
    status, body, _ = await harness.call("GET", "readiness", "/healthz/ready")
    assert (status, body) == (200, "ready\n")


@pytest.mark.parametrize("method", ["POST", "PUT", "DELETE", "HEAD"])
async def test_readiness_with_another_method_is_405(harness: Harness, method: str) -> None:
    status, _, _ = await harness.call(method, "readiness", "/healthz/ready")
    assert status == 405


@pytest.mark.parametrize(
    ("server", "path"),
    [("admin", "/nope"), ("admin", "/metrics"), ("stats", "/healthz/ready"), ("readiness", "/config_dump")],
)
async def test_unknown_paths_are_404(harness: Harness, server: str, path: str) -> None:
    status, _, _ = await harness.call("GET", server, path)
    assert status == 404


async def test_a_taken_port_is_a_telemetry_error_naming_it_and_nothing_stays_bound() -> None:
    with socket.socket() as taken:
        taken.bind((LOOPBACK, 0))
        taken.listen()
        port = taken.getsockname()[1]
        endpoints = ProxyEndpoints(
            metrics=ProxyMetrics(),
            readiness=Readiness(),
            config_dump=dict,
            quit=lambda: None,
            admin_token=TOKEN,
            admin_address=(LOOPBACK, 0),
            stats_address=(LOOPBACK, 0),
            readiness_address=(LOOPBACK, port),
        )
        with pytest.raises(TelemetryError, match=rf"readiness server on 127\.0\.0\.1:{port}"):
            await endpoints.start()
        assert endpoints.ports == {}
        await endpoints.aclose()  # harmless after a failed start


async def test_aclose_twice_is_harmless(harness: Harness) -> None:
    await harness.endpoints.aclose()
    await harness.endpoints.aclose()
    assert harness.endpoints.ports == {}


# --- pure pieces -------------------------------------------------------------------------------------------------


def test_readiness_counts_a_task_once_and_ignores_unknown_done() -> None:
    readiness = Readiness()
    assert readiness.ready
    readiness.add_pending("proxy")
    readiness.add_pending("proxy")
    readiness.done("dns proxy")
    assert not readiness.ready
    assert readiness.pending() == ["proxy"]
    readiness.done("proxy")
    assert readiness.ready
    assert readiness.pending() == []


def test_a_bare_level_applies_to_the_ambit_logger() -> None:
    assert parse_log_levels("debug") == {"ambit": logging.DEBUG}
    assert parse_log_levels(" WARN ") == {"ambit": logging.WARNING}


def test_named_levels_apply_to_their_loggers() -> None:
    assert parse_log_levels("access:info,ambit.proxy:error") == {"access": logging.INFO, "ambit.proxy": logging.ERROR}


@pytest.mark.parametrize("spec", ["", "loud", "debug,", ":debug", "a b:debug", "access:", "ambit..x:info"])
def test_bad_level_specs_are_rejected_with_our_error(spec: str) -> None:
    with pytest.raises(BadLogLevelError, match="bad log level"):
        parse_log_levels(spec)


@given(st.text(max_size=40))
def test_any_level_spec_parses_or_raises_bad_log_level(spec: str) -> None:
    try:
        levels = parse_log_levels(spec)
    except BadLogLevelError:
        return
    assert levels
    assert all(name and isinstance(level, int) for name, level in levels.items())


def _port_free_in_both_families() -> int:
    """A port nothing listens on in IPv4 or IPv6 (a dual socket is bound to it and closed)."""
    with socket.socket(socket.AF_INET6) as probe:
        probe.setsockopt(socket.IPPROTO_IPV6, socket.IPV6_V6ONLY, 0)
        probe.bind(("::", 0))
        return int(probe.getsockname()[1])


async def test_with_ipv6_stats_and_readiness_also_answer_on_ipv6_but_admin_stays_on_ipv4_loopback() -> None:
    if not socket.has_ipv6:
        pytest.skip("no IPv6 in this build")
    stats, ready = _port_free_in_both_families(), _port_free_in_both_families()
    readiness = Readiness()
    endpoints = ProxyEndpoints(
        metrics=ProxyMetrics(build_version="test"),
        readiness=readiness,
        config_dump=lambda: DUMP,
        quit=lambda: None,
        admin_token=TOKEN,
        admin_address=(LOOPBACK, 0),
        stats_address=("0.0.0.0", stats),
        readiness_address=("0.0.0.0", ready),
        ipv6=True,
    )
    await endpoints.start()
    try:
        families = {name: server.families for name, server in endpoints.servers.items()}
        assert families == {
            "admin": [socket.AF_INET],
            "stats": [socket.AF_INET, socket.AF_INET6],
            "readiness": [socket.AF_INET, socket.AF_INET6],
        }
        async with aiohttp.ClientSession() as session:
            for host in ("127.0.0.1", "[::1]"):
                async with session.get(f"http://{host}:{stats}/metrics") as response:
                    assert response.status == 200
                async with session.get(f"http://{host}:{ready}/healthz/ready") as response:
                    assert response.status in (200, 503)  # answered: what it says is the readiness tests' job
    finally:
        await endpoints.aclose()
