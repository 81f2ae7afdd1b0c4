"""The ``ambit`` command's typer app, on which each command module registers its commands."""

from __future__ import annotations

import typer

__all__ = ["app"]

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
