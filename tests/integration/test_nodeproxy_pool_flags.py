"""``ambit nodeproxy`` refuses pool limits and listener bounds out of range with one clear line, naming the flag or
the variable."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest


def nodeproxy(tmp_path: Path, *flags: str, env: dict[str, str] | None = None) -> subprocess.CompletedProcess[str]:
    argv = [sys.executable, "-m", "ambit.cli", "nodeproxy", "--node", "node-1", "--lab-dir", str(tmp_path), *flags]
    environ = {k: v for k, v in os.environ.items() if not k.startswith("POOL_")} | {"COLUMNS": "300"} | (env or {})
    return subprocess.run(argv, capture_output=True, text=True, timeout=60, check=False, env=environ)


@pytest.mark.parametrize(
    ("flags", "env", "expected"),
    [
        (("--pool-max-streams", "0"), {}, "--pool-max-streams: expected at least 1"),
        (("--pool-idle-timeout=-1",), {}, "--pool-idle-timeout: expected 0 seconds or more"),
        ((), {"POOL_MAX_STREAMS_PER_CONNECTION": "lots"}, "$POOL_MAX_STREAMS_PER_CONNECTION: expected a whole number"),
        (("--dns-upstream", "resolver.example"), {}, "'resolver.example' is not an IP address"),
        ((), {"HBONE_MAX_PENDING_HANDSHAKES": "0"}, "$HBONE_MAX_PENDING_HANDSHAKES: expected a whole number from 1"),
        ((), {"HBONE_HANDSHAKE_TIMEOUT": "soon"}, "$HBONE_HANDSHAKE_TIMEOUT: expected seconds"),
        (
            (),
            {"HBONE_MAX_PENDING_HANDSHAKES": "9000"},
            "connection bounds: max pending handshakes (9000) above max connections (4096)",
        ),
    ],
)
def test_a_pool_limit_out_of_range_is_a_usage_error(
    tmp_path: Path, flags: tuple[str, ...], env: dict[str, str], expected: str
) -> None:
    done = nodeproxy(tmp_path, *flags, env=env)
    assert done.returncode == 2
    assert expected in " ".join(done.stderr.split()).replace("│ ", "").replace(" │", "")
    assert "Traceback" not in done.stderr


def test_valid_pool_limits_pass_on_to_the_next_check(tmp_path: Path) -> None:
    done = nodeproxy(tmp_path, "--pool-max-streams=1", "--pool-idle-timeout=0")
    assert (done.returncode, done.stderr.strip()) == (1, f"ambit: no lab in {tmp_path}")


def test_in_a_pod_the_node_proxy_needs_a_control_plane_or_explicit_files() -> None:
    """Without --lab-dir (the ztunnel DaemonSet) there is no lab to take workloads or a CA from."""
    argv = [sys.executable, "-m", "ambit.cli", "nodeproxy", "--node", "node-1"]
    done = subprocess.run(
        argv, capture_output=True, text=True, timeout=60, check=False, env=os.environ | {"COLUMNS": "300"}
    )
    assert done.returncode == 2
    assert "in a pod (no --lab-dir), give --xds-address (or --config)" in done.stderr
