"""``ambit waypoint proxy`` and ``ambit gateway`` on argparse (:mod:`ambit.cli.l7_proxy`): each typer declaration's
flags, help, environment variables, values and exit statuses, without typer, click or rich in the process."""

from __future__ import annotations

import functools
import os
import re
import socket
import subprocess
import sys
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import click
import pytest
import typer
from hypothesis import given, settings
from hypothesis import strategies as st
from typer.testing import CliRunner

from ambit.cli import main as cli_main
from ambit.cli.app import app
from ambit.cli.argv_flags import Flag, build_parser
from ambit.cli.gateway import gateway
from ambit.cli.l7_proxy import (
    GATEWAY_DESCRIPTION,
    WAYPOINT_DESCRIPTION,
    gateway_main,
    waypoint_main,
)
from ambit.cli.l7_proxy_flags import GATEWAY_FLAGS, GATEWAY_PROG, WAYPOINT_FLAGS, WAYPOINT_PROG
from ambit.cli.waypoint_proxy import proxy


@dataclass(frozen=True)
class Command:
    words: tuple[str, ...]
    prog: str
    description: str
    flags: tuple[Flag, ...]
    main: Callable[[Sequence[str]], int]
    declaration: Callable[..., None]

    def __str__(self) -> str:
        return " ".join(self.words)

    def parse(self, argv: list[str], env: dict[str, str]) -> dict[str, Any]:
        return vars(build_parser(self.prog, self.description, self.flags, env).parse_args(argv))

    def typer_command(self) -> click.Command:
        command: click.Command = typer.main.get_command(app)
        for word in self.words:
            command = command.commands[word]  # type: ignore[attr-defined]
        return command


WAYPOINT = Command(("waypoint", "proxy"), WAYPOINT_PROG, WAYPOINT_DESCRIPTION, WAYPOINT_FLAGS, waypoint_main, proxy)
GATEWAY = Command(("gateway",), GATEWAY_PROG, GATEWAY_DESCRIPTION, GATEWAY_FLAGS, gateway_main, gateway)
COMMANDS = [WAYPOINT, GATEWAY]

POD_ENV = {
    "POD_NAMESPACE": "app",
    "GATEWAY_NAME": "waypoint",
    "SERVICE_ACCOUNT": "waypoint-sa",
    "POD_NAME": "waypoint-0",
    "INSTANCE_IP": "198.18.0.10",
    "NODE_NAME": "node-1",
}
"""The pod's environment, as the controller's Deployment gives it (ambit.controlplane.gateway.render)."""

FORBIDDEN = ("typer", "click", "rich", "shellingham", "pydantic")
"""Top-level packages the waypoint's and the gateway's processes must not import."""


READ = (*POD_ENV, "INSTANCE_IPS", "SECRET_TTL", "HBONE_TLS_TRANSPORT", "PILOT_HTTP10", "ISTIO_META_HTTP10")
"""Every variable the commands read."""


def clean_env(**variables: str) -> dict[str, str]:
    """This process's environment without the variables the commands read, plus ``variables``."""
    return {**{k: v for k, v in os.environ.items() if k not in READ}, **variables}


def set_pod_env(monkeypatch: pytest.MonkeyPatch, env: dict[str, str]) -> dict[str, str]:
    """This process's environment as :func:`clean_env` makes it, for the commands run in it."""
    for name in READ:
        monkeypatch.delenv(name, raising=False)
    for name, value in env.items():
        monkeypatch.setenv(name, value)
    return clean_env(**env)


def typer_kwargs(command: Command, argv: list[str], env: dict[str, str]) -> dict[str, Any]:
    """What typer passes to the declaration for ``argv``: the same declaration, a body that records its arguments."""
    seen: dict[str, Any] = {}

    @functools.wraps(command.declaration)
    def record(**kwargs: Any) -> None:
        seen.update(kwargs)

    recorder = typer.Typer()
    recorder.command()(record)
    result = CliRunner().invoke(recorder, argv, env=env)
    assert result.exit_code == 0, result.output
    return seen


def typer_exit_code(command: Command, argv: list[str], env: dict[str, str]) -> int:
    """The status typer's parsing of ``argv`` ends with, the declaration's body not run."""
    recorder = typer.Typer()
    recorder.command()(functools.wraps(command.declaration)(lambda **kwargs: None))
    return CliRunner().invoke(recorder, argv, env=env).exit_code


@pytest.mark.parametrize("command", COMMANDS, ids=str)
def test_the_argparse_flags_are_the_typer_commands_flags_with_the_same_help_defaults_and_variables(
    command: Command,
) -> None:
    ours = {flag.dest: flag for flag in command.flags}
    params = {p.name: p for p in command.typer_command().params if p.param_type_name == "option"}
    assert set(ours) == set(params)
    for name, option in params.items():
        flag = ours[name]
        assert (*option.opts, *option.secondary_opts) == flag.names, name
        assert option.help == flag.help, name
        assert option.default == flag.default, name
        assert option.required == flag.required, name
        assert option.envvar == flag.envvar, name
        assert option.multiple == flag.repeatable, name


@pytest.mark.parametrize("command", COMMANDS, ids=str)
def test_the_help_of_both_lists_the_same_options_and_exits_0(command: Command) -> None:
    wide = {**os.environ, "COLUMNS": "200"}  # no flag name cut at a line's end
    done = subprocess.run(
        [sys.executable, "-m", "ambit.cli", *command.words, "--help"],
        check=False,
        capture_output=True,
        text=True,
        timeout=60,
        env=wide,
    )
    assert done.returncode == 0, done.stderr
    assert done.stdout.startswith(f"usage: {command.prog} [OPTIONS]")
    typer_help = CliRunner().invoke(app, [*command.words, "--help"], env=wide, terminal_width=200)
    assert typer_help.exit_code == 0
    pattern = re.compile(r"(?<![\w-])--[a-z][a-z-]*[a-z]")
    names = set(pattern.findall(done.stdout))
    assert names == set(pattern.findall(typer_help.output))
    assert names == {n for flag in command.flags for n in flag.names} | {"--help"}
    flat = "".join(done.stdout.split())
    assert "[envvar:POD_NAMESPACE]" in flat and "[default:15020]" in flat


def test_ambit_help_still_lists_both_commands() -> None:
    listed = CliRunner().invoke(app, ["--help"], terminal_width=200).output
    assert re.search(r"^\W*gateway\s", listed, re.MULTILINE)
    waypoint = CliRunner().invoke(app, ["waypoint", "--help"], terminal_width=200).output
    assert re.search(r"^\W*proxy\s", waypoint, re.MULTILINE)


ARGVS = [
    [],
    [  # as the controller's Deployment runs it (ambit.controlplane.gateway.render), variables expanded
        "--xds-address=istiod.istio-system.svc:15012",
        "--ca-address=istiod.istio-system.svc:15012",
        "--root-cert=/var/run/secrets/istio/root-cert.pem",
        "--token=/var/run/secrets/tokens/istio-token",
        "--cluster-id=Kubernetes",
    ],
    ["--namespace", "shop", "--gateway-name=gw", "--local-ca", "ca", "--config=mesh.yaml"],
    ["--xds-address", "istiod:15012", "--ca-address=istiod:15012", "--root-cert", "r.pem", "--token", "t"],
    ["--admin-port", "1", "--stats-port=2", "--readiness-port", " 3", "--admin-port", "4"],
    ["--log-json", "--admin-token-file", "tok", "--xds-server-name", "x.svc", "--cluster-id", "c2"],
    ["--log-json", "--log-json", "--trust-domain", "example.org", "--service-account", "", "--pod-name=p"],
    ["--instance-ip", "10.0.0.1", "--node-name", "n2", "--gateway-name", "other", "--namespace=ns", "--config="],
    ["--readiness-port=-1", "--local-ca="],
    ["--tls-transport", "socket", "--tls-transport=loop", "--local-ca", "ca"],
]

ENVS = [
    POD_ENV,
    {**POD_ENV, "SERVICE_ACCOUNT": "", "POD_NAME": "", "INSTANCE_IP": "", "NODE_NAME": ""},  # empty: unset
    {"POD_NAMESPACE": "edge", "GATEWAY_NAME": "edge"},
    {**POD_ENV, "HBONE_TLS_TRANSPORT": "socket"},
]


@pytest.mark.parametrize("argv", ARGVS)
@pytest.mark.parametrize("env", ENVS)
@pytest.mark.parametrize("command", COMMANDS, ids=str)
def test_every_flag_and_variable_gives_the_command_what_typer_gives_it(
    command: Command, argv: list[str], env: dict[str, str]
) -> None:
    full = clean_env(**env)
    assert command.parse(argv, full) == typer_kwargs(command, argv, full)


def test_dns_upstream_is_repeatable_and_kept_in_order() -> None:
    argv = ["--dns-upstream", "10.96.0.10", "--dns-upstream=fd00::a", "--hbone-port", "15009"]
    env = clean_env(**POD_ENV)
    ours = WAYPOINT.parse(argv, env)
    assert ours == typer_kwargs(WAYPOINT, argv, env)
    assert ours["dns_upstream"] == ["10.96.0.10", "fd00::a"] and ours["hbone_port"] == 15009


VALUE = st.text(st.characters(blacklist_categories=("Cs", "Cc")), max_size=12).filter(lambda v: not v.startswith("-"))
"""A flag's value as a word of its own (argparse's rule 1: a value beginning with '-' goes after '=')."""


@st.composite
def command_lines(draw: st.DrawFn, flags: tuple[Flag, ...]) -> list[str]:
    argv: list[str] = []
    for flag in draw(st.lists(st.sampled_from(flags), max_size=8)):
        if flag.kind is bool:
            argv.append(draw(st.sampled_from(flag.names)))
            continue
        value = str(draw(st.integers(-(2**40), 2**40))) if flag.kind is int else draw(VALUE)
        argv.extend(draw(st.sampled_from([[flag.name, value], [f"{flag.name}={value}"]])))
    return argv


@pytest.mark.parametrize("command", COMMANDS, ids=str)
@settings(max_examples=60, deadline=None)
@given(data=st.data())
def test_any_command_line_parses_as_under_typer(command: Command, data: st.DataObject) -> None:
    argv = data.draw(command_lines(command.flags))
    env = clean_env(**data.draw(st.fixed_dictionaries({}, optional={k: VALUE for k in POD_ENV})))
    if "POD_NAMESPACE" not in env or not env["POD_NAMESPACE"]:
        argv = ["--namespace=ns", *argv]
    if "GATEWAY_NAME" not in env or not env["GATEWAY_NAME"]:
        argv = ["--gateway-name=gw", *argv]
    assert command.parse(argv, env) == typer_kwargs(command, argv, env)


@pytest.mark.parametrize(
    ("argv", "env"),
    [
        ([], {}),  # neither --namespace nor POD_NAMESPACE
        (["--namespace", "a"], {}),  # no Gateway name
        (["--gateway-name", "g"], {"POD_NAMESPACE": ""}),  # an empty variable is unset
        (["--namespace"], {"GATEWAY_NAME": "g"}),
        (["--bogus"], POD_ENV),
        (["stray"], POD_ENV),
        (["--names", "a"], {"GATEWAY_NAME": "g"}),  # never abbreviated
        (["--admin-port", "http"], POD_ENV),
        (["--stats-port=1e3"], POD_ENV),
        (["--log-json=yes"], POD_ENV),
        (["--no-log-json"], POD_ENV),  # a switch: no --no- form, as typer declares it
        (["-n", "a"], {"GATEWAY_NAME": "g"}),
    ],
)
@pytest.mark.parametrize("command", COMMANDS, ids=str)
def test_a_usage_error_exits_2_as_under_typer_with_one_line_and_no_traceback(
    command: Command,
    argv: list[str],
    env: dict[str, str],
    monkeypatch: pytest.MonkeyPatch,
    capsys: pytest.CaptureFixture[str],
) -> None:
    full = set_pod_env(monkeypatch, env)
    with pytest.raises(SystemExit) as exited:
        command.main(argv)
    assert exited.value.code == 2
    assert typer_exit_code(command, argv, full) == 2
    err = capsys.readouterr().err
    assert err.startswith(f"usage: {command.prog} [OPTIONS]\n{command.prog}: error: ")
    assert "Traceback" not in err and len(err.splitlines()) == 2


CA = ["--local-ca", "ca"]

CHECKS = [
    ([*CA, "--trust-domain", "Bad Domain"], {}, "invalid value for '--trust-domain'"),
    ([*CA, "--namespace", "a/b"], {}, "invalid value for '--namespace'"),
    ([*CA, "--service-account", ".."], {}, "invalid value for '--service-account'"),
    ([*CA, "--instance-ip", "pod.local"], {}, "invalid value for '--instance-ip': not an IP address"),
    (CA, {"INSTANCE_IP": "10.0.0.300"}, "invalid value for '--instance-ip'"),
    (CA, {"INSTANCE_IPS": "10.0.0.1, fd00::x"}, "invalid value for 'INSTANCE_IPS'"),
    ([*CA, "--xds-address", "istiod:15012"], {}, "need --root-cert and --token"),
    ([], {}, "give --ca-address (with --root-cert and --token) or --local-ca"),
    ([*CA, "--gateway-name="], {}, "invalid value for '--gateway-name'"),
    (CA, {"SECRET_TTL": "never"}, "$SECRET_TTL"),
    ([*CA, "--tls-transport", "kernel"], {}, "invalid value for '--tls-transport': unknown TLS transport 'kernel'"),
    (CA, {"HBONE_TLS_TRANSPORT": "ktls"}, "invalid value for '--tls-transport'"),
    (CA, {"PILOT_HTTP10": "yes"}, "PILOT_HTTP10: expected true or false, got 'yes'"),
]


@pytest.mark.parametrize(("argv", "env", "words"), CHECKS)
@pytest.mark.parametrize("command", COMMANDS, ids=str)
def test_the_commands_own_checks_are_usage_errors_naming_the_flag_before_anything_starts(
    command: Command,
    argv: list[str],
    env: dict[str, str],
    words: str,
    monkeypatch: pytest.MonkeyPatch,
    capsys: pytest.CaptureFixture[str],
    tmp_path: Path,
) -> None:
    set_pod_env(monkeypatch, {**POD_ENV, **env})
    with pytest.raises(SystemExit) as exited:  # were the checks passed, the missing config would end it (status 1)
        command.main([f"--config={tmp_path / 'missing.yaml'}", *argv])
    assert exited.value.code == 2
    err = capsys.readouterr().err
    assert words in err and "Traceback" not in err and len(err.splitlines()) == 2


@pytest.mark.parametrize("command", COMMANDS, ids=str)
def test_the_typer_declaration_makes_the_same_checks(command: Command) -> None:
    result = CliRunner().invoke(app, [*command.words, "--local-ca", "ca", "--instance-ip", "x"], env=POD_ENV)
    assert result.exit_code == 2
    assert "--instance-ip" in result.output and "not an IP address" in result.output


@pytest.mark.parametrize("command", COMMANDS, ids=str)
def test_a_process_that_cannot_run_prints_the_command_and_the_error_and_exits_1(
    command: Command, tmp_path: Path
) -> None:
    """Its admin port taken and its config file missing: whichever it meets first ends it, in one line."""
    missing = tmp_path / "mesh.yaml"
    with socket.socket() as taken:
        taken.bind(("127.0.0.1", 0))
        taken.listen()
        port = taken.getsockname()[1]
        done = subprocess.run(
            [
                sys.executable,
                "-m",
                "ambit.cli",
                *command.words,
                f"--local-ca={tmp_path / 'ca'}",
                f"--config={missing}",
                f"--admin-port={port}",
                "--stats-port=0",
                "--readiness-port=0",
                "--hbone-port=0" if command is WAYPOINT else "--pod-name=p",
            ],
            check=False,
            capture_output=True,
            text=True,
            timeout=60,
            env=clean_env(**{**POD_ENV, "INSTANCE_IP": "127.0.0.1"}),
        )
    assert done.returncode == 1, done.stderr
    assert done.stderr.startswith(f"{command.prog}: ") and len(done.stderr.splitlines()) == 1, done.stderr
    assert f"127.0.0.1:{port}" in done.stderr or str(missing) in done.stderr


@pytest.mark.parametrize(
    ("argv", "target"),
    [
        (["waypoint", "proxy", "--help"], ("waypoint_main", ["--help"])),
        (["gateway", "--namespace", "a"], ("gateway_main", ["--namespace", "a"])),
        (["gateway"], ("gateway_main", [])),
        (["waypoint", "--help"], None),
        (["waypoint", "apply", "-n", "a"], None),
        (["waypoint", "-n", "a", "proxy"], None),
        (["proxy", "waypoint"], None),
        (["gateways"], None),
        ([], None),
    ],
)
def test_the_entry_point_hands_only_these_words_to_argparse(
    argv: list[str], target: tuple[str, list[str]] | None
) -> None:
    found = cli_main.argparse_main(argv)
    if target is None:
        assert found is None
    else:
        assert found is not None
        assert (found[0].__name__, found[1]) == target


@pytest.mark.parametrize(
    ("command", "process_modules"),
    [
        (WAYPOINT, "ambit.waypoint.process"),
        (GATEWAY, "ambit.waypoint.ingress"),
    ],
    ids=str,
)
def test_the_process_imports_neither_typer_click_rich_nor_the_other_commands(
    command: Command, process_modules: str
) -> None:
    """The entry point as the pods call it, up to the command's own checks (a bad trust domain stops it there), then
    the modules the process imports once its arguments are good."""
    probe = (
        "import sys\n"
        "from ambit.cli import main\n"
        f"sys.argv = ['ambit', *{list(command.words)!r}, '--local-ca', 'ca', '--trust-domain', 'Bad!']\n"
        "try:\n    main.main()\nexcept SystemExit as exc:\n    assert exc.code == 2, exc.code\n"
        f"import {process_modules}, ambit.cli.process_logging, ambit.inpod.eventloop\n"
        f"bad = sorted(m for m in sys.modules if m.split('.')[0] in {FORBIDDEN!r})\n"
        "cli = sorted(m for m in sys.modules if m.startswith('ambit.cli.'))\n"
        "print('loaded:', *bad, '|', *cli)\n"
    )
    done = subprocess.run(
        [sys.executable, "-X", "importtime", "-c", probe],
        check=False,
        capture_output=True,
        text=True,
        timeout=60,
        env=clean_env(**POD_ENV),
    )
    assert done.returncode == 0, done.stderr[-2000:]
    assert done.stdout.strip() == (
        "loaded: | ambit.cli.argv_flags ambit.cli.l7_proxy ambit.cli.l7_proxy_flags ambit.cli.main "
        "ambit.cli.process_logging"
    ), done.stdout
    imported = {line.rsplit("|", 1)[-1].strip() for line in done.stderr.splitlines() if line.startswith("import time")}
    assert not {name for name in imported if name.split(".")[0] in FORBIDDEN}


@pytest.mark.parametrize(
    ("env", "accepted"),
    [({}, False), ({"PILOT_HTTP10": "true"}, True), ({"ISTIO_META_HTTP10": "1"}, True)],
)
def test_http10_is_accepted_by_the_control_plane_s_switch_or_the_proxy_s_metadata(
    env: dict[str, str], accepted: bool, monkeypatch: pytest.MonkeyPatch
) -> None:
    from ambit.cli.l7_proxy import l7_settings

    set_pod_env(monkeypatch, env)
    settings = l7_settings(
        "waypoint",
        namespace="app",
        gateway_name="waypoint",
        service_account="sa",
        pod_name="",
        instance_ip=None,
        node_name="",
        xds_address=None,
        ca_address=None,
        root_cert=None,
        token=None,
        server_name="istiod.istio-system.svc",
        cluster_id="Kubernetes",
        trust_domain="cluster.local",
        config=None,
        local_ca=Path("ca"),
        admin_port=15000,
        stats_port=15020,
        readiness_port=15021,
        log_json=False,
    )
    assert settings.accept_http10 is accepted
