"""Parsing the node proxy's pool limits: flags first, then ztunnel's environment variables, then the defaults."""

from __future__ import annotations

from pathlib import Path

import pytest

from ambit.hbone.liveness import LivenessSettings
from ambit.inpod.settings import (
    DEFAULT_POOL_IDLE_TIMEOUT,
    DEFAULT_POOL_MAX_STREAMS,
    NodeProxySettings,
    NodeProxySettingsError,
    own_pod_from_environment,
    parse_connection_bounds,
    parse_ipv6_enabled,
    parse_pool_limits,
)
from ambit.zds.protocol import WorkloadInfo

STREAMS_ENV, TIMEOUT_ENV = "POOL_MAX_STREAMS_PER_CONNECTION", "POOL_UNUSED_RELEASE_TIMEOUT"


def test_without_flags_or_environment_the_limits_are_ztunnels_defaults() -> None:
    assert parse_pool_limits(None, None, {}) == (100, 300.0)
    assert (DEFAULT_POOL_MAX_STREAMS, DEFAULT_POOL_IDLE_TIMEOUT) == (100, 300.0)


def test_settings_default_to_the_same_limits() -> None:
    from pathlib import Path

    settings = NodeProxySettings(node="n", zds_socket=Path("/nonexistent"))
    assert (settings.pool_max_streams, settings.pool_idle_timeout) == (100, 300.0)


def test_the_environment_is_read_when_no_flag_is_given() -> None:
    assert parse_pool_limits(None, None, {STREAMS_ENV: "1", TIMEOUT_ENV: "0"}) == (1, 0.0)


def test_a_flag_wins_over_the_environment() -> None:
    assert parse_pool_limits("7", "2.5", {STREAMS_ENV: "1", TIMEOUT_ENV: "0"}) == (7, 2.5)


@pytest.mark.parametrize(
    ("text", "seconds"),
    [("0", 0.0), ("300", 300.0), ("0.5", 0.5), (".25", 0.25), ("300s", 300.0), ("5m", 300.0), ("500ms", 0.5),
     ("1h", 3600.0), (" 10 ", 10.0)],
)  # fmt: skip
def test_the_idle_timeout_is_seconds_or_a_duration_with_a_unit(text: str, seconds: float) -> None:
    assert parse_pool_limits(None, text, {}) == (100, seconds)


@pytest.mark.parametrize(
    ("streams", "timeout", "message"),
    [
        ("0", None, "--pool-max-streams: expected at least 1 stream per connection, got 0"),
        ("-2", None, "--pool-max-streams: expected at least 1"),
        ("many", None, "--pool-max-streams: expected a whole number, got 'many'"),
        ("1.5", None, "--pool-max-streams: expected a whole number"),
        (None, "-1", "--pool-idle-timeout: expected 0 seconds or more, got '-1'"),
        (None, "soon", "--pool-idle-timeout: expected seconds (e.g. 300, 0.5) or a duration"),
        (None, "5 days", "--pool-idle-timeout: expected seconds"),
        (None, "nan", "--pool-idle-timeout: expected seconds"),
        (None, "9" * 400, "is too large"),
    ],
)
def test_a_bad_flag_is_named_in_one_line(streams: str | None, timeout: str | None, message: str) -> None:
    with pytest.raises(NodeProxySettingsError) as caught:
        parse_pool_limits(streams, timeout, {})
    assert message in str(caught.value)
    assert "\n" not in str(caught.value)


def test_a_bad_environment_variable_is_named_as_such() -> None:
    with pytest.raises(NodeProxySettingsError, match=r"^\$POOL_MAX_STREAMS_PER_CONNECTION: expected at least 1"):
        parse_pool_limits(None, None, {STREAMS_ENV: "0"})
    with pytest.raises(NodeProxySettingsError, match=r"^\$POOL_UNUSED_RELEASE_TIMEOUT: expected 0 seconds or more"):
        parse_pool_limits(None, None, {TIMEOUT_ENV: "-5"})


def test_the_help_of_the_pool_flags_names_the_defaults_in_force() -> None:
    """The CLI's help states the defaults as text (importing the data path there would slow every command)."""
    import inspect

    from ambit.cli import mesh

    source = inspect.getsource(mesh)
    assert f"else $POOL_MAX_STREAMS_PER_CONNECTION, else {DEFAULT_POOL_MAX_STREAMS})" in source
    assert f"else $POOL_UNUSED_RELEASE_TIMEOUT, else {DEFAULT_POOL_IDLE_TIMEOUT:g})" in source


def test_the_proxys_own_pod_comes_from_the_downward_api_variables_as_ztunnel_reads_them() -> None:
    env = {"POD_NAME": "ztunnel-x", "POD_NAMESPACE": "istio-system", "SERVICE_ACCOUNT": "ztunnel"}
    assert own_pod_from_environment({**env, "INSTANCE_IP": "198.18.0.9"}) == (
        WorkloadInfo("ztunnel-x", "istio-system", "ztunnel"),
        "198.18.0.9",
    )
    assert own_pod_from_environment(env) == (None, None)  # no address: no self-proxy listener
    assert own_pod_from_environment({**env, "INSTANCE_IP": "node-1"}) == (None, None)
    assert own_pod_from_environment({"INSTANCE_IP": "198.18.0.9"}) == (None, None)


def test_the_listener_bounds_default_to_safe_values_and_the_node_budget_to_half_the_descriptor_limit() -> None:
    bounds = parse_connection_bounds({}, open_files=20000)
    assert (bounds.hbone.max_connections, bounds.hbone.max_pending, bounds.hbone.max_pending_per_peer) == (
        4096,
        64,
        16,
    )
    assert bounds.hbone.handshake_timeout == 10.0
    assert bounds.hbone.liveness == LivenessSettings(10.0, 600.0, 10.0, 20.0)  # Go's preface, ztunnel's keepalive
    assert (bounds.node_max_connections, bounds.node_max_pending) == (10000, 256)
    assert parse_connection_bounds({}, open_files=None).node_max_connections == 65536
    assert parse_connection_bounds({}, open_files=100).node_max_pending == 25
    assert parse_connection_bounds({}, open_files=20000).node_max_connections_per_peer == 1024
    assert parse_connection_bounds({}, open_files=100).node_max_connections_per_peer == 50


def test_the_listener_bounds_come_from_the_environment() -> None:
    bounds = parse_connection_bounds(
        {
            "HBONE_MAX_CONNECTIONS": "100",
            "HBONE_MAX_PENDING_HANDSHAKES": "10",
            "HBONE_MAX_PENDING_HANDSHAKES_PER_PEER": "3",
            "HBONE_HANDSHAKE_TIMEOUT": "2500ms",
            "HBONE_PREFACE_TIMEOUT": "3s",
            "HBONE_IDLE_TIMEOUT": "15m",
            "HBONE_KEEPALIVE_INTERVAL": "0",
            "HBONE_KEEPALIVE_TIMEOUT": "5",
            "PLAINTEXT_MAX_CONNECTIONS": "50",
            "NODE_MAX_CONNECTIONS": "1000",
            "NODE_MAX_PENDING_HANDSHAKES": "200",
            "NODE_MAX_CONNECTIONS_PER_PEER": "300",
        }
    )
    assert (bounds.hbone.max_connections, bounds.hbone.max_pending, bounds.hbone.max_pending_per_peer) == (100, 10, 3)
    assert bounds.hbone.handshake_timeout == 2.5
    assert bounds.hbone.liveness == LivenessSettings(3.0, 900.0, 0.0, 5.0)
    assert bounds.plaintext.max_connections == 50
    assert (bounds.node_max_connections, bounds.node_max_pending, bounds.node_max_connections_per_peer) == (
        1000,
        200,
        300,
    )


@pytest.mark.parametrize(
    ("environ", "names"),
    [
        ({"HBONE_MAX_CONNECTIONS": "0"}, "$HBONE_MAX_CONNECTIONS"),
        ({"NODE_MAX_CONNECTIONS": "lots"}, "$NODE_MAX_CONNECTIONS"),
        ({"HBONE_HANDSHAKE_TIMEOUT": "0"}, "$HBONE_HANDSHAKE_TIMEOUT"),
        ({"HBONE_HANDSHAKE_TIMEOUT": "-1"}, "$HBONE_HANDSHAKE_TIMEOUT"),
        ({"HBONE_IDLE_TIMEOUT": "soon"}, "$HBONE_IDLE_TIMEOUT"),
        ({"HBONE_PREFACE_TIMEOUT": "0"}, "preface timeout cannot be 0"),
        ({"HBONE_KEEPALIVE_TIMEOUT": "0"}, "keepalive needs a timeout"),
        ({"HBONE_MAX_PENDING_HANDSHAKES": "500", "HBONE_MAX_CONNECTIONS": "100"}, "max connections"),
        ({"NODE_MAX_PENDING_HANDSHAKES": "500", "NODE_MAX_CONNECTIONS": "100"}, "pending"),
        ({"NODE_MAX_CONNECTIONS_PER_PEER": "500", "NODE_MAX_CONNECTIONS": "100"}, "per peer"),
    ],
)
def test_bounds_that_cannot_work_are_one_clear_line(environ: dict[str, str], names: str) -> None:
    with pytest.raises(NodeProxySettingsError, match=names.replace("$", r"\$")):
        parse_connection_bounds(environ)


@pytest.mark.parametrize(
    ("environ", "expected"),
    [
        ({}, True),
        ({"IPV6_ENABLED": "false"}, False),
        ({"IPV6_ENABLED": " TRUE "}, True),
        ({"IPV6_ENABLED": "False"}, False),
    ],
)
def test_ipv6_listeners_are_on_unless_ztunnels_ipv6_enabled_says_false(environ: dict[str, str], expected: bool) -> None:
    assert parse_ipv6_enabled(environ) is expected
    assert NodeProxySettings(node="n", zds_socket=Path("/nonexistent")).ipv6 is True


@pytest.mark.parametrize("text", ["", "0", "no", "yes please", "x" * 200])
def test_an_ipv6_enabled_that_is_not_true_or_false_is_one_clear_error(text: str) -> None:
    with pytest.raises(NodeProxySettingsError, match=r"\$IPV6_ENABLED: expected true or false") as error:
        parse_ipv6_enabled({"IPV6_ENABLED": text})
    assert len(str(error.value)) < 120
