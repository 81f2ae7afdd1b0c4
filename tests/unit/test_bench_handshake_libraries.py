"""bench/handshake_libraries.py: both libraries complete and verify the mesh's mutual-TLS handshake (no timing)."""

from __future__ import annotations

import sys
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parents[2]
if str(REPO) not in sys.path:  # bench/ is not installed: its scripts run from the repository root
    sys.path.insert(0, str(REPO))

from bench import handshake_libraries  # noqa: E402


def test_each_library_completes_the_mesh_handshake_and_the_report_names_both() -> None:
    lines = handshake_libraries.measure(pairs=2, rounds=1, groups="X25519")
    assert lines[0].startswith("system: OpenSSL") and "bundled: OpenSSL" in lines[0]
    assert lines[1].startswith("round 1: system ") and "ratio" in lines[1]


def test_a_handshake_with_a_peer_of_another_mesh_fails_on_the_bundled_library(tmp_path: Path) -> None:
    import asyncio

    ours, _ = asyncio.run(handshake_libraries._certificates(tmp_path / "ours"))
    _, theirs = asyncio.run(handshake_libraries._certificates(tmp_path / "theirs"))
    bundled = handshake_libraries.Bundled(ours, theirs)
    with pytest.raises(RuntimeError):
        bundled.pair()
