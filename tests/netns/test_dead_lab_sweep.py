"""A lab killed with its directory gone (a test run stopped mid-module) holds the lab's addresses, so every later lab
refused to start: ``ambit lab down --dead`` and the test harness's lock sweep such labs by prefix, and never a lab
that still has a process in its namespaces (record.py rule 4)."""

from __future__ import annotations

import shutil
import subprocess
import sys
import time
from collections.abc import Callable

import pytest

from ambit.commands import SubprocessRunner
from ambit.lab.cluster.record import Record, dead_lab_prefixes
from ambit.lab.network.bridge import LabNetworkError, create_network
from ambit.lab.network.topology import Topology

pytestmark = [pytest.mark.root, pytest.mark.timeout(60)]


def wait_until(done: Callable[[], bool], timeout: float = 10.0) -> None:
    deadline = time.monotonic() + timeout
    while not done():
        assert time.monotonic() < deadline, "the sleeper never entered its namespace"
        time.sleep(0.02)


def ambit_lab_down_dead() -> str:
    done = subprocess.run(
        [sys.executable, "-m", "ambit.cli", "lab", "down", "--dead"],
        check=False,
        capture_output=True,
        text=True,
        timeout=30,
    )
    assert done.returncode == 0, done.stderr
    return done.stdout


def test_a_dead_labs_network_is_swept_and_a_live_lab_is_left_alone(
    new_lab: Callable[[int], Topology], root_lab_lock: None, lab_leftovers: Callable[[Topology], list[str]]
) -> None:
    runner = SubprocessRunner()
    dead = new_lab(2)
    create_network(dead, Record(dead.record_file), runner)
    shutil.rmtree(dead.path)  # its record goes with the run's temporary directory

    live = new_lab(1)  # a lab whose node runtime still runs: a namespace with a process in it
    live_netns = live.node(1).netns
    Record(live.record_file).note("netns", name=live_netns)
    subprocess.run(["ip", "netns", "add", live_netns], check=True)
    sleeper = subprocess.Popen(["ip", "netns", "exec", live_netns, "sleep", "60"])
    try:
        wait_until(
            lambda: bool(subprocess.run(["ip", "netns", "pids", live_netns], check=False, capture_output=True).stdout)
        )
        next_lab = new_lab(2)
        with pytest.raises(LabNetworkError, match="lab down --dead"):  # the error names the way out
            create_network(next_lab, Record(next_lab.record_file), runner)
        assert dead.prefix in dead_lab_prefixes(runner)
        assert live.prefix not in dead_lab_prefixes(runner)

        assert "removed" in ambit_lab_down_dead()

        assert lab_leftovers(dead) == []
        assert lab_leftovers(live) != [] and sleeper.poll() is None  # untouched, its process still running
        create_network(next_lab, Record(next_lab.record_file), runner)  # the addresses are free again
    finally:
        sleeper.kill()
        sleeper.wait()
