"""Entry point of the ``ambit`` command: one typer app with a sub-command per component.

Each sub-command lives in its own module, and ``main`` imports only the module of the command being run: the
modules pull in what their commands need (the gRPC extension, HTTP clients, rich), and a node proxy, a CNI call or
``ambit lab exec`` should not pay two seconds of imports for commands it does not run. ``--help`` and anything
unknown import them all, so help lists every command and typer reports unknown ones as usual.

The long-running processes of pods are not typer's: ``ambit nodeproxy`` (a per-node daemon, restarted on every
hand-over), ``ambit waypoint proxy`` and ``ambit gateway`` (a waypoint's and an ingress gateway's pods).
:data:`ARGPARSE_COMMANDS` hands each to a ``main(argv) -> int`` that parses its flags with argparse
(:mod:`ambit.cli.argv_flags`), so typer, click and rich are never imported into them (``tests/unit/
test_cli_nodeproxy.py``, ``tests/unit/test_cli_l7_proxy.py``). The other ``waypoint`` commands stay typer's. This
module imports typer only for the others.
"""

from __future__ import annotations

import importlib
import sys
from collections.abc import Callable, Sequence

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


ARGPARSE_COMMANDS: dict[tuple[str, ...], tuple[str, str]] = {
    ("nodeproxy",): ("ambit.cli.nodeproxy", "main"),
    ("waypoint", "proxy"): ("ambit.cli.l7_proxy", "waypoint_main"),
    ("gateway",): ("ambit.cli.l7_proxy", "gateway_main"),
}
"""Commands whose first arguments (these words, exactly) hand the rest to a ``main(argv) -> int`` function of a
module (module, function), without typer."""


def argparse_main(argv: Sequence[str]) -> tuple[Callable[[Sequence[str]], int], list[str]] | None:
    """The argparse ``main`` that runs ``argv`` (the arguments after the program name) and the arguments it gets, or
    None for a typer command."""
    for words, (module, function) in ARGPARSE_COMMANDS.items():
        if tuple(argv[: len(words)]) == words:
            main: Callable[[Sequence[str]], int] = getattr(importlib.import_module(module), function)
            return main, list(argv[len(words) :])
    return None


def modules_for(argv: Sequence[str]) -> tuple[str, ...]:
    """The modules to import to run ``argv`` (the arguments after the program name): the named command's, or all."""
    command = next((arg for arg in argv if not arg.startswith("-")), None)
    if command in COMMAND_MODULES:
        return COMMAND_MODULES[command]
    return tuple(dict.fromkeys(module for modules in COMMAND_MODULES.values() for module in modules))


def main() -> None:
    argv = sys.argv[1:]
    found = argparse_main(argv)
    if found is not None:
        command_main, rest = found
        sys.exit(command_main(rest))
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
