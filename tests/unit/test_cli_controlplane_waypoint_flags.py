"""``ambit controlplane``'s waypoint settings: flags, their environment variables (what deploy/ sets), and bad
values refused with one line before anything starts; and its monitoring port (off unless given)."""

from __future__ import annotations

from typing import Any

import pytest
from typer.testing import CliRunner

from ambit.cli import mesh as mesh_commands  # importing it registers the command on the app
from ambit.cli.app import app
from ambit.controlplane import process


@pytest.fixture
def started(monkeypatch: pytest.MonkeyPatch) -> list[Any]:
    """The settings ``ambit controlplane`` would run with (the run itself replaced)."""
    seen: list[Any] = []

    async def run(settings: Any) -> None:
        seen.append(settings)

    monkeypatch.setattr(process, "run_control_plane", run)
    monkeypatch.setattr(mesh_commands, "configure_logging", lambda *a, **k: None)
    return seen


def test_defaults_follow_the_control_plane_s_namespace(started: list[Any]) -> None:
    result = CliRunner().invoke(app, ["controlplane"], env={"POD_NAMESPACE": "mesh-system"})
    assert result.exit_code == 0, result.output
    (settings,) = started
    assert settings.waypoint_xds_address == "istiod.mesh-system.svc:15012"
    assert settings.waypoint_image == "ambit" and settings.waypoint_image_pull_policy is None
    assert settings.deploy_waypoints is True
    assert settings.revision == "default"


def test_the_revision_comes_from_the_flag_or_istiod_s_environment_variable(started: list[Any]) -> None:
    assert CliRunner().invoke(app, ["controlplane"], env={"REVISION": "canary"}).exit_code == 0
    assert CliRunner().invoke(app, ["controlplane", "--revision", "1-24"]).exit_code == 0
    assert [settings.revision for settings in started] == ["canary", "1-24"]


def test_the_environment_deploy_sets_is_read_and_empty_means_default(started: list[Any]) -> None:
    env = {
        "WAYPOINT_XDS_ADDRESS": "198.19.0.12:15012",
        "WAYPOINT_IMAGE": "ghcr.io/ambit-mesh/ambit:0.1.0",
        "WAYPOINT_IMAGE_PULL_POLICY": "",
    }
    result = CliRunner().invoke(app, ["controlplane", "--no-deploy-waypoints"], env=env)
    assert result.exit_code == 0, result.output
    (settings,) = started
    assert settings.waypoint_xds_address == "198.19.0.12:15012"
    assert settings.waypoint_image == "ghcr.io/ambit-mesh/ambit:0.1.0"
    assert settings.waypoint_image_pull_policy is None and settings.deploy_waypoints is False


@pytest.mark.parametrize(
    ("args", "message"),
    [
        (["--waypoint-image-pull-policy", "Sometimes"], "expected Always, IfNotPresent or Never"),
        (["--waypoint-xds-address", "nohost"], "expected HOST:PORT"),
        (["--waypoint-xds-address", "host:99999"], "expected HOST:PORT"),
        (["--revision", "Foo/../x"], "expected a DNS-1123 label, got 'Foo/../x'"),
        (["--revision", ""], "expected a DNS-1123 label, got ''"),
        (["--http10", "yes"], "expected true or false, got 'yes'"),
    ],
)
def test_bad_waypoint_settings_are_refused(started: list[Any], args: list[str], message: str) -> None:
    result = CliRunner().invoke(app, ["controlplane", *args])
    flat = " ".join(result.output.replace("│", " ").split())  # typer's error box wraps lines
    assert result.exit_code == 2 and message in flat and not started


def test_the_monitoring_port_is_off_by_default_and_served_when_given(started: list[Any]) -> None:
    assert CliRunner().invoke(app, ["controlplane"]).exit_code == 0
    assert CliRunner().invoke(app, ["controlplane", "--monitoring-port", "15014"]).exit_code == 0
    assert CliRunner().invoke(app, ["controlplane", "--monitoring-port", "0"]).exit_code == 0
    assert [settings.monitoring_port for settings in started] == [None, 15014, None]


@pytest.mark.parametrize("port", ["70000", "-1", "metrics"])
def test_a_bad_monitoring_port_is_refused_in_one_line(started: list[Any], port: str) -> None:
    result = CliRunner().invoke(app, ["controlplane", "--monitoring-port", port])
    assert result.exit_code == 2 and "--monitoring-port" in result.output
    assert "Traceback" not in result.output and started == []


def test_pilot_http10_is_off_by_default_and_read_as_istiod_reads_it(started: list[Any]) -> None:
    assert CliRunner().invoke(app, ["controlplane"], env={"PILOT_HTTP10": None}).exit_code == 0
    assert CliRunner().invoke(app, ["controlplane"], env={"PILOT_HTTP10": "true"}).exit_code == 0
    assert CliRunner().invoke(app, ["controlplane", "--http10", "1"]).exit_code == 0
    assert CliRunner().invoke(app, ["controlplane", "--http10", "false"]).exit_code == 0
    assert [settings.http10 for settings in started] == [False, True, True, False]
