"""Entry point of the ``ambit`` command: one typer app with a sub-command per component.

Each sub-command lives in its own module, and ``main`` imports only the module of the command being run: the
modules pull in what their commands need (the gRPC extension, HTTP clients, rich), and a node proxy, a CNI call or
``ambit lab exec`` should not pay two seconds of imports for commands it does not run. ``--help`` and anything
unknown import them all, so help lists every command and typer reports unknown ones as usual.

``ambit nodeproxy`` (a per-node daemon, restarted on every hand-over) is not typer's: :data:`ARGPARSE_COMMANDS`
hands it to :func:`ambit.cli.nodeproxy.main`, which parses its flags with argparse, so typer, click and rich are
never imported into it (``tests/unit/test_cli_nodeproxy.py``). This module imports typer only for the others.
"""

from __future__ import annotations

import importlib
import sys
from collections.abc import Sequence

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


ARGPARSE_COMMANDS: dict[str, str] = {"nodeproxy": "ambit.cli.nodeproxy"}
"""Commands whose first argument hands the rest to the ``main(argv) -> int`` of a module, without typer."""


def modules_for(argv: Sequence[str]) -> tuple[str, ...]:
    """The modules to import to run ``argv`` (the arguments after the program name): the named command's, or all."""
    command = next((arg for arg in argv if not arg.startswith("-")), None)
    if command in COMMAND_MODULES:
        return COMMAND_MODULES[command]
    return tuple(dict.fromkeys(module for modules in COMMAND_MODULES.values() for module in modules))


def main() -> None:
    argv = sys.argv[1:]
    if argv and argv[0] in ARGPARSE_COMMANDS:
        sys.exit(importlib.import_module(ARGPARSE_COMMANDS[argv[0]]).main(argv[1:]))
    for module in modules_for(argv):
        importlib.import_module(module)
    from ambit.cli.app import app

    app()


def __getattr__(name: str) -> object:
    """``ambit.cli.main.app``, where command modules written before :mod:`ambit.cli.app` look for the app (imported
    only then: this module itself never imports typer)."""
    if name == "app":
        from ambit.cli.app import app

        return app
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
