"""``ambit bench``: the data-path benchmark (``bench.mesh``) from the command line.

The benchmark lives in the repository's ``bench/`` directory, not in the installed package: this command runs
``python -m bench.mesh`` from the repository root (found from this file's location) and fails with one line when
Ambit runs from an installation without the repository.
"""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path
from typing import Annotated

import typer

from ambit.cli.app import app


@app.command()
def bench(
    profile: Annotated[str, typer.Option(help="short (about 3 minutes), full, or smoke (seconds, for CI).")] = "short",
    out: Annotated[Path | None, typer.Option(help="Where latest.md, latest.json and latest.png go.")] = None,
) -> None:
    """Benchmark the data path on a lab: ambit against no mesh, stunnel and haproxy (as root)."""
    if profile not in ("short", "full", "smoke"):
        raise typer.BadParameter("short, full or smoke", param_hint="--profile")
    repo = Path(__file__).resolve().parents[3]
    if not (repo / "bench" / "mesh" / "__init__.py").is_file():
        typer.echo(f"ambit bench: no bench/mesh in {repo} (run it from a checkout of the repository)", err=True)
        raise typer.Exit(1)
    argv = [sys.executable, "-m", "bench.mesh", "--profile", profile, *(["--out", str(out)] if out else [])]
    env = dict(os.environ, PYTHONPATH=os.pathsep.join(filter(None, [str(repo), os.environ.get("PYTHONPATH")])))
    raise typer.Exit(subprocess.run(argv, cwd=repo, env=env, check=False).returncode)
