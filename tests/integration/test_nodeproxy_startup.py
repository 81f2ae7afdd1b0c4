"""``ambit nodeproxy`` starts without what it does not use: typer parses nothing on its happy path (so pydantic is
never imported), and dnspython's DNS-over-HTTPS client stack stays out."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path


def imported_by(argv: list[str]) -> tuple[subprocess.CompletedProcess[str], list[str]]:
    done = subprocess.run(
        [sys.executable, "-X", "importtime", "-m", "ambit.cli", *argv],
        capture_output=True,
        text=True,
        timeout=60,
        check=False,
    )
    lines = done.stderr.splitlines()
    return done, [line.rsplit("|", 1)[-1].strip() for line in lines if line.startswith("import time:")]


def test_the_node_proxy_command_line_is_read_without_pydantic(tmp_path: Path) -> None:
    done, imported = imported_by(["nodeproxy", "--node", "n", "--lab-dir", str(tmp_path)])
    assert done.returncode == 1
    assert f"ambit: no lab in {tmp_path}" in done.stderr
    assert "typer" in imported and "pydantic" not in imported


def test_a_bad_value_is_still_reported_by_typer(tmp_path: Path) -> None:
    done, imported = imported_by(["nodeproxy", "--node", "n", "--lab-dir", str(tmp_path), "--flow-log-size=-1"])
    assert done.returncode == 2
    assert "--flow-log-size" in done.stderr and "Traceback" not in done.stderr
    assert "pydantic" in imported  # typer's own parsing, as for every other command


def test_the_data_path_imports_no_http_client_stack_for_dns() -> None:
    code = (
        "import sys\n"
        "from ambit.proxy.hostnames import upstream_lookup\n"
        "upstream_lookup(['127.0.0.1'])\n"
        "print(sorted(m for m in ('httpx2', 'httpcore2', 'h2', 'anyio') if m in sys.modules))\n"
    )
    done = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=60, check=True)
    assert done.stdout.strip() == "[]"
