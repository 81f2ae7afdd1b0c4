"""Entry point of the ``ambit`` command: one typer app with a sub-command per component."""

from __future__ import annotations

import typer

app = typer.Typer(
    help="Ambit: an ambient-mode service mesh, wire-compatible with Istio ambient.",
    no_args_is_help=True,
    add_completion=False,
)


def main() -> None:
    import ambit.cli.apiserver
    import ambit.cli.bench
    import ambit.cli.gateway
    import ambit.cli.get
    import ambit.cli.install
    import ambit.cli.lab
    import ambit.cli.mesh
    import ambit.cli.policy
    import ambit.cli.proxy_config
    import ambit.cli.proxy_status
    import ambit.cli.waypoint
    import ambit.cli.waypoint_proxy  # noqa: F401

    app()
