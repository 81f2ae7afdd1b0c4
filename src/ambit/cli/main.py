"""Entry point of the ``ambit`` command: one typer app with a sub-command per component.

Each sub-command lives in its own module, and ``main`` imports only the module of the command being run: the
modules pull in what their commands need (the gRPC extension, HTTP clients, rich), and a node proxy, a CNI call or
``ambit lab exec`` should not pay two seconds of imports for commands it does not run. ``--help`` and anything
unknown import them all, so help lists every command and typer reports unknown ones as usual.

The per-node daemons in :data:`DIRECT_COMMANDS` are parsed without typer's coercion layer when their arguments are
plain (:mod:`ambit.cli.direct`): typer would import pydantic and keep it for the daemon's whole life. Anything else
about them (help, a bad value) goes through typer as for every other command.
"""

from __future__ import annotations

import importlib
import sys
from collections.abc import Sequence

import typer

app = typer.Typer(
    help="Ambit: an ambient-mode service mesh, wire-compatible with Istio ambient.",
    no_args_is_help=True,
    add_completion=False,
)


@app.callback()
def _root() -> None:
    """Ambit: an ambient-mode service mesh, wire-compatible with Istio ambient."""
    # A callback keeps the app a group of commands when only one module is imported (typer would otherwise make a
    # lone command the whole program).


COMMAND_MODULES: dict[str, tuple[str, ...]] = {
    "apiserver": ("ambit.cli.apiserver",),
    "bench": ("ambit.cli.bench",),
    "controlplane": ("ambit.cli.mesh",),
    "dashboard": ("ambit.cli.dashboard",),
    "flows": ("ambit.cli.flows",),
    "gateway": ("ambit.cli.gateway",),
    "get": ("ambit.cli.get",),
    "install": ("ambit.cli.install",),
    "lab": ("ambit.cli.lab",),
    "nodeagent": ("ambit.cli.mesh",),
    "nodeproxy": ("ambit.cli.mesh",),
    "policy": ("ambit.cli.policy",),
    "proxy-config": ("ambit.cli.proxy_config",),
    "proxy-status": ("ambit.cli.proxy_status",),
    "uninstall": ("ambit.cli.install",),
    "version": ("ambit.cli.install",),
    "waypoint": ("ambit.cli.waypoint", "ambit.cli.waypoint_proxy"),
    "ztunnel-config": ("ambit.cli.proxy_config",),
    "zc": ("ambit.cli.proxy_config",),
}
"""The top-level command names and the modules that register them (tests/unit/test_cli_main.py keeps it true)."""


DIRECT_COMMANDS: dict[str, tuple[str, str]] = {"nodeproxy": ("ambit.cli.mesh", "nodeproxy")}
"""Commands run by :func:`ambit.cli.direct.run_direct` when it can: the module and the function of each."""


def modules_for(argv: Sequence[str]) -> tuple[str, ...]:
    """The modules to import to run ``argv`` (the arguments after the program name): the named command's, or all."""
    command = next((arg for arg in argv if not arg.startswith("-")), None)
    if command in COMMAND_MODULES:
        return COMMAND_MODULES[command]
    return tuple(dict.fromkeys(module for modules in COMMAND_MODULES.values() for module in modules))


def main() -> None:
    argv = sys.argv[1:]
    if argv and argv[0] in DIRECT_COMMANDS:
        from ambit.cli.direct import run_direct

        module, function = DIRECT_COMMANDS[argv[0]]
        run_direct(getattr(importlib.import_module(module), function), argv[1:])  # exits unless it declines
    for module in modules_for(argv):
        importlib.import_module(module)
    app()
