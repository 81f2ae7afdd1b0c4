"""``ambit nodeproxy`` starts without what it does not use: its command line is argparse's (typer, click, rich and
pydantic are never imported), dnspython waits for the first hostname lookup, and its DNS-over-HTTPS client stack
stays out even then."""

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


def test_the_node_proxy_command_line_is_read_without_typer_or_pydantic(tmp_path: Path) -> None:
    done, imported = imported_by(["nodeproxy", "--node", "n", "--lab-dir", str(tmp_path)])
    assert done.returncode == 1
    assert f"ambit: no lab in {tmp_path}" in done.stderr
    assert "argparse" in imported and not {"typer", "click", "rich", "pydantic"} & set(imported)


def test_a_bad_value_is_reported_by_argparse_with_typers_status(tmp_path: Path) -> None:
    done, imported = imported_by(["nodeproxy", "--node", "n", "--lab-dir", str(tmp_path), "--flow-log-size=-1"])
    assert done.returncode == 2
    assert "--flow-log-size" in done.stderr and "Traceback" not in done.stderr
    assert not {"typer", "click", "rich", "pydantic"} & set(imported)


def test_dnspython_waits_for_the_first_lookup_which_imports_no_http_client_stack() -> None:
    code = (
        "import asyncio, socket, sys\n"
        "from ambit.proxy.hostnames import HostnameLookupError, upstream_lookup\n"
        "lookup = upstream_lookup(['127.0.0.1'], port=9, timeout=0.5)\n"
        "print('dns' in sys.modules)\n"
        "try:\n    asyncio.run(lookup('a.example.com', 4))\nexcept HostnameLookupError:\n    pass\n"
        "print('dns.asyncquery' in sys.modules)\n"
        "print(sorted(m for m in ('httpx2', 'httpcore2', 'h2', 'anyio') if m in sys.modules))\n"
    )
    done = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=60, check=True)
    assert done.stdout.split("\n")[:3] == ["False", "True", "[]"], done.stdout
