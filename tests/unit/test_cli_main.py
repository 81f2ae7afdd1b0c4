"""The ``ambit`` entry point imports only the module of the command it runs, and its table of commands is complete."""

from __future__ import annotations

import importlib
import subprocess
import sys

import pytest

from ambit.cli import main as cli_main
from ambit.cli.app import app

HEAVY = ("grpc", "aiohttp", "cryptography.x509")


def registered() -> dict[str, str]:
    """Every top-level command or group registered on the app so far, with the module that registered it."""
    out: dict[str, str] = {}
    for command in app.registered_commands:
        assert command.callback is not None
        name = command.name or command.callback.__name__.replace("_", "-")
        out[name] = command.callback.__module__
    for group in app.registered_groups:
        assert group.name is not None and group.typer_instance is not None
        out[group.name] = group.typer_instance.registered_commands[0].callback.__module__  # type: ignore[union-attr]
    return out


def test_the_table_names_every_command_and_the_module_that_registers_it() -> None:
    for module in cli_main.modules_for([]):
        importlib.import_module(module)
    found = registered()
    assert set(found) == set(cli_main.COMMAND_MODULES)
    for name, module in found.items():
        assert module in cli_main.COMMAND_MODULES[name], name


@pytest.mark.parametrize(
    ("argv", "modules"),
    [
        (["lab", "exec", "pod", "--", "true"], ("ambit.cli.lab",)),
        (["nodeproxy", "--help"], ("ambit.cli.mesh",)),
        (["waypoint", "proxy"], ("ambit.cli.waypoint", "ambit.cli.waypoint_proxy")),
    ],
)
def test_a_named_command_imports_only_its_modules(argv: list[str], modules: tuple[str, ...]) -> None:
    assert cli_main.modules_for(argv) == modules


@pytest.mark.parametrize("argv", [[], ["--help"], ["no-such-command"], ["-x"]])
def test_help_and_unknown_commands_import_everything(argv: list[str]) -> None:
    assert set(cli_main.modules_for(argv)) == {m for ms in cli_main.COMMAND_MODULES.values() for m in ms}


def test_lab_exec_does_not_load_the_grpc_or_http_stacks() -> None:
    probe = (
        "import sys\n"
        "from ambit.cli import main\n"
        "sys.argv = ['ambit', 'lab', 'exec', '--help']\n"
        "try:\n    main.main()\nexcept SystemExit:\n    pass\n"
        f"print('loaded:', *(m for m in {HEAVY!r} if m in sys.modules), file=sys.stderr)\n"
    )
    done = subprocess.run([sys.executable, "-c", probe], capture_output=True, text=True, timeout=60, check=True)
    assert "--container" in done.stdout  # the help of the command was shown
    assert done.stderr.strip().splitlines()[-1] == "loaded:", done.stderr


def test_the_node_proxy_loads_neither_aiohttp_nor_grpcio() -> None:
    """``ambit nodeproxy`` imports what its command imports (the data path once its arguments are good) and serves
    its admin, stats and readiness ports on h11: aiohttp (and its multidict and yarl) stays out of the process. Its
    xDS and CA clients call through :mod:`ambit.xds.grpc_channel` (our HTTP/2 engine): grpcio stays out too."""
    probe = (
        "import sys\n"
        "from ambit.cli import main\n"
        "for name in main.modules_for(['nodeproxy']):\n    __import__(name)\n"
        "import ambit.inpod.eventloop, ambit.inpod.settings, ambit.model.identity, ambit.inpod.allocator\n"
        "import ambit.inpod.daemon\n"
        "loaded = sorted(m for m in sys.modules if m.split('.')[0] in ('aiohttp', 'multidict', 'yarl', 'grpc'))\n"
        "print('loaded:', *loaded, 'telemetry' if 'ambit.telemetry.endpoints' in sys.modules else '')\n"
    )
    done = subprocess.run([sys.executable, "-c", probe], capture_output=True, text=True, timeout=60, check=True)
    assert done.stdout.strip() == "loaded: telemetry", done.stdout


def test_an_unknown_command_is_reported_as_typer_does() -> None:
    done = subprocess.run(
        [sys.executable, "-m", "ambit.cli", "no-such-command"], capture_output=True, text=True, timeout=60, check=False
    )
    assert done.returncode == 2
    assert "No such command" in done.stderr


@pytest.mark.parametrize(
    ("text", "namespace", "expected"),
    [
        ("ztunnel-abcde", "", ("ztunnel-abcde", "istio-system")),
        ("ztunnel-abcde", "mesh", ("ztunnel-abcde", "mesh")),
        ("ztunnel-abcde.mesh", "", ("ztunnel-abcde", "mesh")),
        ("pod/ztunnel-abcde", "istio-system", ("ztunnel-abcde", "istio-system")),
    ],
)
def test_a_node_proxy_pod_is_named_as_istioctl_names_it(text: str, namespace: str, expected: tuple[str, str]) -> None:
    from ambit.cli.proxy_config import parse_pod

    assert parse_pod(text, namespace) == expected


@pytest.mark.parametrize("text", ["daemonset/ztunnel", "", "Ztunnel", "a..b", "pod/", "x" * 64, "a.b.c", "../etc"])
def test_anything_else_is_refused_with_a_clear_error(text: str) -> None:
    import typer

    from ambit.cli.proxy_config import parse_pod

    with pytest.raises(typer.BadParameter):
        parse_pod(text, "")


def test_with_a_pod_dash_n_is_its_namespace_and_the_filter_is_workload_namespace() -> None:
    from ambit.cli.proxy_config import Where

    assert Where.of(None, "apps", "", None, None).filter == "apps"  # no pod: -n filters, as before
    where = Where.of("ztunnel-x", "istio-system", "apps", None, None)
    assert (where.pod, where.pod_namespace, where.filter) == ("ztunnel-x", "istio-system", "apps")


def _cli(*args: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [sys.executable, "-m", "ambit.cli", *args],
        capture_output=True,
        text=True,
        timeout=60,
        env={"COLUMNS": "200", "PATH": "/usr/bin:/bin", "TERM": "dumb", "NO_COLOR": "1"},
        check=False,
    )


def test_lab_up_has_no_supervised_mesh_and_refuses_the_old_flag() -> None:
    done = _cli("lab", "up", "--help")
    assert done.returncode == 0, done.stderr
    text = " ".join(done.stdout.split())
    assert "--no-mesh" in text and "--supervised" not in text and "--install" not in text, text
    refused = _cli("lab", "up", "--supervised", "--dir", "/nonexistent/ambit-lab")
    assert refused.returncode == 2 and "No such option" in refused.stderr, refused.stderr
    assert "Traceback" not in refused.stderr
    assert _cli("lab", "supervise", "--help").returncode == 2


def test_lab_restart_names_its_components_and_refuses_a_per_node_restart_before_touching_a_lab() -> None:
    help_text = " ".join(_cli("lab", "restart", "--help").stdout.split())
    assert "nodeproxy, nodeagent or controlplane" in help_text and "kubectl rollout restart" in help_text, help_text
    unknown = _cli("lab", "restart", "kubelet", "--dir", "/nonexistent/ambit-lab")
    assert unknown.returncode == 2 and "one of nodeproxy, nodeagent, controlplane" in unknown.stderr, unknown.stderr
    per_node = _cli("lab", "restart", "nodeproxy", "--node", "node-1", "--dir", "/nonexistent/ambit-lab")
    assert per_node.returncode == 2 and "--node is refused" in per_node.stderr, per_node.stderr
    no_lab = _cli("lab", "restart", "nodeproxy", "--dir", "/nonexistent/ambit-lab")
    assert no_lab.returncode == 1 and "no lab in /nonexistent/ambit-lab" in no_lab.stderr, no_lab.stderr
    assert not any("Traceback" in d.stderr for d in (unknown, per_node, no_lab))


def test_the_app_is_still_found_where_older_command_modules_import_it_from() -> None:
    from ambit.cli.main import app as where_it_was

    assert where_it_was is app
    with pytest.raises(AttributeError):
        cli_main.no_such_name  # noqa: B018
