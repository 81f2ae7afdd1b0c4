"""Labs whose owning test or benchmark died (ambit.lab.cluster.orphans): a claimed lab whose owner is gone is taken
down by the sweep; one whose owner runs, or one nobody claimed, is left alone. The lab daemons are stand-ins (a
sleeping process with a lab daemon's command line); the lab itself has no network, so its sweep removes nothing
but the processes and the directory."""

from __future__ import annotations

import json
import subprocess
import sys
import time
from collections.abc import Iterator
from pathlib import Path

import pytest

from ambit.lab.cluster.orphans import OWNER_FILE, claim_lab, owner_alive, running_lab_dirs, sweep_orphaned_labs
from ambit.lab.network.topology import Topology


def _dead_pid() -> int:
    child = subprocess.Popen([sys.executable, "-c", "pass"])
    child.wait()
    return child.pid


def _lab(directory: Path) -> Path:
    Topology.new(2, directory).save()
    return directory


@pytest.fixture
def daemons() -> Iterator[list[subprocess.Popen[bytes]]]:
    started: list[subprocess.Popen[bytes]] = []
    yield started
    for proc in started:
        if proc.poll() is None:
            proc.kill()
        proc.wait()


def _daemon(directory: Path, started: list[subprocess.Popen[bytes]]) -> subprocess.Popen[bytes]:
    """A process whose command line is a lab's controllers' (``… ambit.cli lab controllers --dir <lab>``)."""
    code = "import time; time.sleep(60)"
    proc = subprocess.Popen([sys.executable, "-c", code, "ambit.cli", "lab", "controllers", "--dir", str(directory)])
    started.append(proc)
    deadline = time.monotonic() + 10
    while directory not in running_lab_dirs():
        assert time.monotonic() < deadline, "the stand-in daemon was not seen"
        time.sleep(0.02)
    return proc


def test_a_claim_says_whether_its_owner_still_runs(tmp_path: Path) -> None:
    mine = tmp_path / "mine"
    claim_lab(mine)
    assert owner_alive(mine) is True
    dead = tmp_path / "dead"
    dead.mkdir()
    (dead / OWNER_FILE).write_text(json.dumps({"pid": _dead_pid(), "start": 1}))
    assert owner_alive(dead) is False
    assert owner_alive(tmp_path / "unclaimed") is None
    for garbage in ("", "{", "[]", '{"pid": "x", "start": 1}', '{"pid": 1}'):
        (dead / OWNER_FILE).write_text(garbage)
        assert owner_alive(dead) is None, garbage


def test_a_reused_pid_is_not_taken_for_the_owner(tmp_path: Path) -> None:
    claim_lab(tmp_path / "lab")
    claim = json.loads((tmp_path / "lab" / OWNER_FILE).read_text())
    claim["start"] -= 1  # the same pid, started at another time: another process
    (tmp_path / "lab" / OWNER_FILE).write_text(json.dumps(claim))
    assert owner_alive(tmp_path / "lab") is False


@pytest.mark.root
def test_a_lab_whose_owner_died_is_taken_down_and_others_are_left_alone(
    tmp_path: Path, daemons: list[subprocess.Popen[bytes]]
) -> None:
    orphan, owned, unclaimed = (_lab(tmp_path / name) for name in ("orphan", "owned", "unclaimed"))
    (orphan / OWNER_FILE).write_text(json.dumps({"pid": _dead_pid(), "start": 1}))
    claim_lab(owned)
    orphan_daemon = _daemon(orphan, daemons)
    owned_daemon = _daemon(owned, daemons)
    unclaimed_daemon = _daemon(unclaimed, daemons)

    removed = sweep_orphaned_labs(among=[orphan, owned, unclaimed])

    assert removed == [f"lab {orphan}, whose owner died"]
    assert orphan_daemon.wait(10) is not None
    assert not orphan.exists()
    assert owned_daemon.poll() is None and owned.exists()
    assert unclaimed_daemon.poll() is None and unclaimed.exists()
    assert sweep_orphaned_labs(among=[orphan, owned, unclaimed]) == []
