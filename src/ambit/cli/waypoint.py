"""``ambit waypoint``: waypoints, as ``istioctl waypoint`` manages them and as their pods run them.

The group holds the management commands (apply, list, status, delete) and ``proxy``, the command a waypoint
Deployment's pods run (:mod:`ambit.cli.waypoint_proxy`), as Istio's waypoint pods run ``pilot-agent proxy
waypoint``.
"""

from __future__ import annotations

import typer

from ambit.cli.main import app

waypoint_app = typer.Typer(help="Waypoints: deploy and inspect them, or run one (proxy).", no_args_is_help=True)
app.add_typer(waypoint_app, name="waypoint")
