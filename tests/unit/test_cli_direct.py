"""The node proxy's command line parsed without typer (:mod:`ambit.cli.direct`) gives the command exactly what typer
gives it, and whatever it is not sure of is left to typer."""

from __future__ import annotations

import functools
import importlib
import os
from typing import Any

import pytest
import typer
from typer.testing import CliRunner

from ambit.cli.direct import command_spec, parse_direct
from ambit.cli.main import DIRECT_COMMANDS
from ambit.cli.mesh import nodeagent, nodeproxy

LAB_FLAGS = [
    "--node", "node-1", "--lab-dir", "/tmp/lab",
    "--xds-address", "198.18.0.1:15012", "--ca-address", "198.18.0.1:15012",
    "--root-cert", "/tmp/lab/nodes/node-1/root-cert.pem", "--token", "/tmp/lab/nodes/node-1/token",
    "--notify-fd", "5",
]  # fmt: skip


def typer_kwargs(argv: list[str], env: dict[str, str]) -> dict[str, Any]:
    """What typer passes to ``nodeproxy`` for ``argv``: the same declaration, a body that records its arguments."""
    seen: dict[str, Any] = {}

    @functools.wraps(nodeproxy)
    def record(**kwargs: Any) -> None:
        seen.update(kwargs)

    app = typer.Typer()
    app.command()(record)
    result = CliRunner().invoke(app, argv, env=env)
    assert result.exit_code == 0, result.output
    return seen


@pytest.mark.parametrize(
    "argv",
    [
        LAB_FLAGS,
        ["--node", "node-1", "--lab-dir", "/tmp/lab", "--pool-max-streams=1", "--pool-idle-timeout=-1"],
        ["--node=n", "--no-dns-proxy", "--dns-upstream", "10.0.0.1", "--dns-upstream=10.0.0.2", "--flow-log-size=0"],
        ["--node", "n", "--dns-proxy", "--event-loop", "asyncio", "--config", "w.yaml", "--local-ca", "ca"],
        ["--node", "n", "--crl-path", "/etc/crl.pem", "--secret-ttl", "5m", "--drain-deadline", "3", "--node", "m"],
        ["--node", "n", "--flow-log-size", "1000000", "--admin-token-file", "t", "--xds-server-name", "x.svc"],
        ["--node", "n", "--trust-domain", "example.org", "--cluster-id", "c2", "--xds-address="],
    ],
)
@pytest.mark.parametrize("crl_env", [None, "", "/var/run/crl.pem"])
def test_plain_arguments_give_the_command_what_typer_gives_it(argv: list[str], crl_env: str | None) -> None:
    env = {k: v for k, v in os.environ.items() if k != "CRL_PATH"}
    if crl_env is not None:
        env["CRL_PATH"] = crl_env
    spec = command_spec(nodeproxy)
    assert spec is not None
    saved = os.environ.copy()
    try:
        os.environ.clear()
        os.environ.update(env)
        ours = parse_direct(spec, argv)
    finally:
        os.environ.clear()
        os.environ.update(saved)
    assert ours == typer_kwargs(argv, env)


@pytest.mark.parametrize(
    "argv",
    [
        ["--help"],
        ["--node", "n", "--bogus"],
        ["--node", "n", "stray"],
        ["--node"],
        ["--node", "n", "--config", "--local-ca", "ca"],
        ["--node", "n", "--flow-log-size", "-1"],
        ["--node", "n", "--flow-log-size=-1"],
        ["--node", "n", "--flow-log-size=1000001"],
        ["--node", "n", "--flow-log-size=1e3"],
        ["--node", "n", "--notify-fd", "2"],
        ["--node", "n", "--notify-fd", "five"],
        ["--node", "n", "--config="],
        ["--node", "n", "--dns-proxy=yes"],
        ["-n", "n"],
    ],
)
def test_what_the_parser_is_not_sure_of_is_left_to_typer(argv: list[str]) -> None:
    spec = command_spec(nodeproxy)
    assert spec is not None
    assert parse_direct(spec, argv) is None


def test_an_option_without_a_declared_name_leaves_the_whole_command_to_typer() -> None:
    assert command_spec(nodeagent) is None  # --uninstall is typer's implicit --uninstall/--no-uninstall


def test_every_direct_command_can_be_parsed_without_typer() -> None:
    """An option the parser does not understand would silently send the command back through typer (and pydantic)."""
    for name, (module, function) in DIRECT_COMMANDS.items():
        assert command_spec(getattr(importlib.import_module(module), function)) is not None, name
