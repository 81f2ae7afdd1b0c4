"""The ``ambit`` command's typer app, on which each command module registers its commands."""

from __future__ import annotations

from collections.abc import Callable
from typing import Annotated, Any

import typer

__all__ = ["TlsTransportOption", "app", "run_argv_command"]

app = typer.Typer(
    help="Ambit: an ambient-mode service mesh, wire-compatible with Istio ambient.",
    no_args_is_help=True,
    add_completion=False,
)


TlsTransportOption = Annotated[
    str,
    typer.Option(
        "--tls-transport",
        envvar="HBONE_TLS_TRANSPORT",
        help="HBONE's TLS transport: socket (TLS on the socket itself, the default) or loop (the event loop's, "
        "memory BIOs; answers a peer's TLS KeyUpdate requests without bound, so kept for comparison only).",
    ),
]
"""The node proxy's, the waypoint's and the gateway's ``--tls-transport`` (one flag, one variable, one help)."""


@app.callback()
def _root() -> None:
    """Ambit: an ambient-mode service mesh, wire-compatible with Istio ambient."""
    # A callback keeps the app a group of commands when only one module is imported (typer would otherwise make a
    # lone command the whole program).


def run_argv_command(start: Callable[..., None], flags: dict[str, Any], failure_prefix: str) -> None:
    """The body of the typer declaration of a command whose entry point is argparse's (:mod:`ambit.cli.argv_flags`):
    ``start(**flags)``, its :class:`~ambit.cli.argv_flags.UsageError` a click usage error (exit status 2) and its
    :class:`~ambit.cli.argv_flags.CommandFailed` one line after ``failure_prefix`` (exit status 1)."""
    from ambit.cli.argv_flags import CommandFailed, UsageError

    try:
        start(**flags)
    except UsageError as exc:
        raise typer.BadParameter(exc.message, param_hint=exc.flag) from None
    except CommandFailed as exc:
        typer.echo(f"{failure_prefix}: {exc}", err=True)
        raise typer.Exit(1) from None
