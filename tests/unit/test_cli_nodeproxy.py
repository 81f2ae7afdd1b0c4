"""``ambit nodeproxy`` on argparse (:mod:`ambit.cli.nodeproxy`): the typer command's flags, help, environment
variables, values and exit statuses, without typer, click or rich in the process."""

from __future__ import annotations

import functools
import os
import re
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest
import typer
from typer.testing import CliRunner

from ambit.cli.app import app
from ambit.cli.argv_flags import build_parser
from ambit.cli.mesh import nodeproxy
from ambit.cli.nodeproxy import DESCRIPTION, main
from ambit.cli.nodeproxy_flags import FLAGS, PROG

LAB_FLAGS = [
    "--node", "node-1", "--lab-dir", "/tmp/lab",
    "--xds-address", "198.18.0.1:15012", "--ca-address", "198.18.0.1:15012",
    "--root-cert", "/tmp/lab/nodes/node-1/root-cert.pem", "--token", "/tmp/lab/nodes/node-1/token",
    "--notify-fd", "5",
]  # fmt: skip

FORBIDDEN = ("typer", "click", "rich", "pydantic", "shellingham", "aiohttp", "grpc", "hypothesis", "jsonschema")
"""Top-level packages the node proxy's process must not import."""

UNTIL_USED = ("dns", "yaml", "prometheus_client", "cryptography")
"""Top-level packages the node proxy imports only once it uses them: dnspython for a pod's DNS proxy or the first
hostname lookup, YAML for a local config file, prometheus_client for the first scrape of the stats port,
cryptography for a CRL or a local CA (never for its certificates from a CA: see the test below)."""


def typer_options() -> dict[str, Any]:
    """The options of typer's ``nodeproxy`` command (click's, as typer vendors it), by parameter name."""
    command = typer.main.get_command(app).commands["nodeproxy"]  # type: ignore[attr-defined]
    return {p.name: p for p in command.params if p.param_type_name == "option"}


def typer_kwargs(argv: list[str], env: dict[str, str]) -> dict[str, Any]:
    """What typer passes to ``nodeproxy`` for ``argv``: the same declaration, a body that records its arguments."""
    seen: dict[str, Any] = {}

    @functools.wraps(nodeproxy)
    def record(**kwargs: Any) -> None:
        seen.update(kwargs)

    recorder = typer.Typer()
    recorder.command()(record)
    result = CliRunner().invoke(recorder, argv, env=env)
    assert result.exit_code == 0, result.output
    return seen


def typer_exit_code(argv: list[str], env: dict[str, str] | None = None) -> int:
    """The status typer's parsing of ``argv`` ends with, the command's body not run."""
    recorder = typer.Typer()
    recorder.command()(functools.wraps(nodeproxy)(lambda **kwargs: None))
    return CliRunner().invoke(recorder, argv, env=env).exit_code


def test_the_argparse_flags_are_the_typer_commands_flags_with_the_same_help_defaults_and_variables() -> None:
    ours = {flag.dest: flag for flag in FLAGS}
    params = typer_options()
    assert set(ours) == set(params)
    for name, option in params.items():
        flag = ours[name]
        assert (*option.opts, *option.secondary_opts) == flag.names, name
        assert option.help == flag.help, name
        assert option.default == flag.default, name
        assert option.required == flag.required, name
        assert option.envvar == flag.envvar, name
        assert option.multiple == flag.repeatable, name
        if flag.metavar is not None:
            assert option.metavar == flag.metavar, name


def test_the_help_of_both_lists_the_same_options() -> None:
    wide = {**os.environ, "COLUMNS": "200"}  # no flag name cut at a line's end
    done = subprocess.run(
        [sys.executable, "-m", "ambit.cli", "nodeproxy", "--help"],
        check=False,
        capture_output=True,
        text=True,
        timeout=60,
        env=wide,
    )
    assert done.returncode == 0, done.stderr
    assert done.stdout.startswith("usage: ambit nodeproxy [OPTIONS]")
    typer_help = CliRunner().invoke(app, ["nodeproxy", "--help"], env=wide, terminal_width=200)
    assert typer_help.exit_code == 0
    pattern = re.compile(r"(?<![\w-])--[a-z][a-z-]*[a-z]")
    names = set(pattern.findall(done.stdout))
    assert names == set(pattern.findall(typer_help.output))
    assert names == {n for flag in FLAGS for n in flag.names} | {"--help"}


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
        ["--node", "n", "--config=", "--notify-fd=3", "--flow-log-size", " 7"],
        ["--node", "n", "--tls-transport", "socket", "--event-loop=asyncio"],
    ],
)
@pytest.mark.parametrize("crl_env", [None, "", "/var/run/crl.pem"])
def test_every_flag_gives_the_command_what_typer_gives_it(argv: list[str], crl_env: str | None) -> None:
    env = {k: v for k, v in os.environ.items() if k != "CRL_PATH"}
    if crl_env is not None:
        env["CRL_PATH"] = crl_env
    ours = vars(build_parser(PROG, DESCRIPTION, FLAGS, env).parse_args(argv))
    assert ours == typer_kwargs(argv, env)


@pytest.mark.parametrize("value", ["false", "0", "no", "off", "true", "1", "Yes", " on ", ""])
def test_a_boolean_variable_is_read_as_click_reads_it(value: str) -> None:
    """XDS_ON_DEMAND=false is False, as under typer, not the (true) string "false"."""
    env = {**os.environ, "XDS_ON_DEMAND": value}
    ours = vars(build_parser(PROG, DESCRIPTION, FLAGS, env).parse_args(["--node", "n"]))
    assert ours == typer_kwargs(["--node", "n"], env)
    assert ours["xds_on_demand"] is (value.strip().lower() in ("true", "1", "yes", "on"))


def test_a_boolean_variable_outside_clicks_words_is_a_usage_error_naming_it(
    monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    monkeypatch.setenv("XDS_ON_DEMAND", "maybe")
    with pytest.raises(SystemExit) as exited:
        main(["--node", "n"])
    assert exited.value.code == 2
    assert typer_exit_code(["--node", "n"], {"XDS_ON_DEMAND": "maybe"}) == 2
    err = capsys.readouterr().err
    assert "XDS_ON_DEMAND" in err and "Traceback" not in err and len(err.splitlines()) == 2


@pytest.mark.parametrize(
    "argv",
    [
        [],
        ["--node"],
        ["--node", "n", "--bogus"],
        ["--node", "n", "stray"],
        ["--nod", "n"],
        ["--node", "n", "--flow-log-size", "-1"],
        ["--node", "n", "--flow-log-size=1000001"],
        ["--node", "n", "--flow-log-size=1e3"],
        ["--node", "n", "--notify-fd", "2"],
        ["--node", "n", "--notify-fd", "five"],
        ["--node", "n", "--dns-proxy=yes"],
        ["-n", "n"],
    ],
)
def test_a_usage_error_exits_2_as_under_typer_with_one_line_and_no_traceback(
    argv: list[str], capsys: pytest.CaptureFixture[str]
) -> None:
    with pytest.raises(SystemExit) as exited:
        main(argv)
    assert exited.value.code == 2
    assert typer_exit_code(argv) == 2
    err = capsys.readouterr().err
    assert err.startswith("usage: ambit nodeproxy [OPTIONS]\nambit nodeproxy: error: ")
    assert "Traceback" not in err and len(err.splitlines()) == 2


@pytest.mark.parametrize(
    ("argv", "words"),
    [
        (["--node", "n", "--trust-domain", "Bad Domain"], "invalid value for '--trust-domain'"),
        (["--node", "n", "--event-loop", "tornado"], "invalid value for '--event-loop'"),
        (["--node", "n", "--tls-transport", "ktls"], "invalid value for '--tls-transport'"),
        (["--node", "n", "--dns-upstream", "resolver.local"], "invalid value for '--dns-upstream'"),
        (["--node", "n", "--pool-max-streams", "0"], "error: "),
        (["--node", "n", "--xds-address", "198.18.0.1:15012"], "need --root-cert and --token"),
        (["--node", "n"], "in a pod (no --lab-dir), give --xds-address"),
    ],
)
def test_the_commands_own_checks_are_usage_errors_before_anything_starts(
    argv: list[str], words: str, capsys: pytest.CaptureFixture[str]
) -> None:
    with pytest.raises(SystemExit) as exited:
        main(argv)
    assert exited.value.code == 2
    err = capsys.readouterr().err
    assert words in err and "Traceback" not in err


def test_a_notify_fd_that_is_not_open_is_a_usage_error(capsys: pytest.CaptureFixture[str]) -> None:
    # A number above every descriptor open now (a fixed one, 1000, was open in a busy test worker once).
    closed = max(int(name) for name in os.listdir("/proc/self/fd")) + 1000
    with pytest.raises(SystemExit) as exited:
        main(["--node", "n", "--notify-fd", str(closed)])
    assert exited.value.code == 2
    err = capsys.readouterr().err
    assert f"file descriptor {closed} is not open" in err and "Traceback" not in err


def test_a_lab_directory_without_a_lab_exits_1(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    assert main(["--node", "n", "--lab-dir", str(tmp_path)]) == 1
    assert capsys.readouterr().err == f"ambit: no lab in {tmp_path}\n"


def test_help_exits_0_and_shows_the_variable_and_the_defaults(capsys: pytest.CaptureFixture[str]) -> None:
    with pytest.raises(SystemExit) as exited:
        main(["--help"])
    assert exited.value.code == 0
    out = "".join(capsys.readouterr().out.split())  # as wrapped at any width
    assert "[envvar:CRL_PATH]" in out
    assert "[default:4096]" in out and "[default:--dns-proxy]" in out and "[default:uvloop]" in out


def test_the_node_proxys_start_imports_neither_typer_click_rich_nor_the_other_commands() -> None:
    """The entry point as the DaemonSet and the lab call it, up to the command's own checks (a bad trust domain
    stops it there), then the data path's modules, which the proxy imports once its arguments are good."""
    probe = (
        "import sys\n"
        "from ambit.cli import main\n"
        "sys.argv = ['ambit', 'nodeproxy', '--node', 'n', '--trust-domain', 'Bad!']\n"
        "try:\n    main.main()\nexcept SystemExit as exc:\n    assert exc.code == 2, exc.code\n"
        "import ambit.inpod.daemon, ambit.inpod.allocator, ambit.cli.process_logging\n"
        f"bad = sorted(m for m in sys.modules if m.split('.')[0] in {FORBIDDEN + UNTIL_USED!r})\n"
        "cli = sorted(m for m in sys.modules if m.startswith('ambit.cli.'))\n"
        "print('loaded:', *bad, '|', *cli)\n"
    )
    done = subprocess.run(
        [sys.executable, "-X", "importtime", "-c", probe], check=False, capture_output=True, text=True, timeout=60
    )
    assert done.returncode == 0, done.stderr[-2000:]
    assert (
        done.stdout.strip()
        == "loaded: | ambit.cli.argv_flags ambit.cli.main ambit.cli.nodeproxy ambit.cli.nodeproxy_flags "
        "ambit.cli.process_logging"
    ), done.stdout
    imported = {line.rsplit("|", 1)[-1].strip() for line in done.stderr.splitlines() if line.startswith("import time")}
    assert not {name for name in imported if name.split(".")[0] in FORBIDDEN}


WAYPOINT_ONLY = ("ambit.model.requestauth",)
"""ambit's own modules the node proxy's start must not import: the JWT model (RequestAuthentication) only a
waypoint's L7 policies use; the node proxy's L4 decisions never carry a request identity."""


def test_the_node_proxys_start_leaves_the_waypoints_modules_unloaded() -> None:
    probe = (
        "import sys\n"
        "from ambit.cli import main\n"
        "sys.argv = ['ambit', 'nodeproxy', '--node', 'n', '--trust-domain', 'Bad!']\n"
        "try:\n    main.main()\nexcept SystemExit as exc:\n    assert exc.code == 2, exc.code\n"
        "import ambit.inpod.daemon, ambit.inpod.allocator, ambit.cli.process_logging\n"
        "import ambit.rbac\n"
        f"print(sorted(m for m in sys.modules if m in {WAYPOINT_ONLY!r}))\n"
    )
    done = subprocess.run([sys.executable, "-c", probe], check=False, capture_output=True, text=True, timeout=60)
    assert done.returncode == 0, done.stderr[-2000:]
    assert done.stdout.strip() == "[]"


def test_the_first_certificate_from_a_ca_loads_no_cryptography(tmp_path: Path) -> None:
    """What a node proxy does with its first workload certificate from istiod or our control plane: the CSR (in
    the CA client's worker), the answer's chain, both HBONE contexts, a peer's check and the ``/config_dump`` entry.
    cryptography costs a process about 10 MiB, so none of it may import that."""
    from ambit.model.identity import SpiffeId
    from ambit.tls.certs import new_ca
    from ambit.tls.issuance import sign_csr
    from ambit.tls.spiffe import make_csr

    identity = SpiffeId("cluster.local", "shop", "alice")
    csr, key = make_csr(identity)
    chain = sign_csr(new_ca("root", now=1_800_000_000), csr, now=1_800_000_000, ttl_seconds=3600)
    (tmp_path / "key.pem").write_bytes(key)
    (tmp_path / "leaf.pem").write_bytes(chain[0])
    (tmp_path / "root.pem").write_bytes(chain[1])
    probe = (
        "import ssl, sys\n"
        "import ambit.inpod.daemon, ambit.proxy.hbone_client, ambit.proxy.hbone_server\n"
        "from ambit.identity.istiod import _make_csr\n"
        "from ambit.model.identity import SpiffeId\n"
        "identity = SpiffeId('cluster.local', 'shop', 'alice')\n"
        "_make_csr(identity)\n"
        "from ambit.tls.workload import WorkloadCertificate\n"
        "from ambit.tls.spiffe import check_peer\n"
        f"d = {str(tmp_path)!r}\n"
        "leaf, root = (open(f'{d}/{n}.pem', 'rb').read() for n in ('leaf', 'root'))\n"
        "cert = WorkloadCertificate.from_chain(identity, [leaf, root], open(f'{d}/key.pem', 'rb').read())\n"
        "cert.client_context(), cert.server_context(), cert.to_dump(0.0)\n"
        "der = ssl.PEM_cert_to_DER_cert(leaf.decode())\n"
        "assert check_peer(der, trust_domain='cluster.local', expected=frozenset({identity})) == identity\n"
        "print(sorted(m for m in sys.modules if m.split('.')[0] == 'cryptography'))\n"
    )
    done = subprocess.run([sys.executable, "-c", probe], check=False, capture_output=True, text=True, timeout=60)
    assert done.returncode == 0, done.stderr[-2000:]
    assert done.stdout.strip() == "[]"


@pytest.mark.parametrize(
    ("variable", "value"),
    [("IPV6_ENABLED", "maybe"), ("DRAIN_MAX", "forever"), ("ZTUNNEL_WORKER_THREADS", "0")],
)
def test_a_bad_environment_setting_is_a_usage_error_before_anything_starts(
    variable: str, value: str, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    """The settings the DaemonSet gives by variable alone (ztunnel's IPV6_ENABLED, DRAIN_MAX) are checked with the
    flags: one line naming the variable, exit 2, nothing started."""
    monkeypatch.setenv(variable, value)
    with pytest.raises(SystemExit) as exited:
        main(["--node", "n"])
    assert exited.value.code == 2
    err = capsys.readouterr().err
    assert variable in err and "Traceback" not in err


@pytest.mark.parametrize("value", ["yes", "1"])
def test_a_native_path_that_cannot_be_had_stops_the_start_with_one_line(
    value: str, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    """AMBIT_NATIVE is read once, before anything starts: a bad value, or 1 without a usable extension, exits 1."""
    from ambit import native

    monkeypatch.setenv("AMBIT_NATIVE", value)
    monkeypatch.setattr(native, "load_tls_records", lambda: (None, "not built here"))
    native.use(None)
    try:
        assert main(["--node", "n", "--config", "w.yaml", "--local-ca", "ca"]) == 1
    finally:
        native.use(None)
    err = capsys.readouterr().err
    assert "AMBIT_NATIVE" in err and "Traceback" not in err and len(err.splitlines()) == 1


@pytest.mark.parametrize("value", ["0", "33", "two", "1_0", "+2", " 2", "\u0661"])
def test_a_workers_count_that_is_not_one_to_32_is_a_usage_error(value: str, capsys: pytest.CaptureFixture[str]) -> None:
    with pytest.raises(SystemExit) as exited:
        main(["--node", "n", "--workers", value])
    assert exited.value.code == 2
    err = capsys.readouterr().err
    assert "--workers must be" in err and "Traceback" not in err


def test_the_workers_count_comes_from_the_flag_then_ztunnels_variable_then_one() -> None:
    from ambit.inpod.settings import parse_workers

    assert parse_workers(None, {}) == 1
    assert parse_workers(None, {"ZTUNNEL_WORKER_THREADS": "2"}) == 2
    assert parse_workers("4", {"ZTUNNEL_WORKER_THREADS": "2"}) == 4
    assert parse_workers("32", {}) == 32
