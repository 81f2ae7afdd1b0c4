"""Fixtures for tests on real namespaces: they need root (CI is root: there they fail instead of skipping).

Every lab a test makes has a random id (``Topology.new``), so its names carry a prefix no one else uses, and is
swept in the fixture's finalizer, which then checks that nothing with the prefix is left on the machine.

Labs whose network reaches into the root namespace all use the same addresses (``198.18.0.1`` on the lab bridge,
the pod ranges routed there), so two of them cannot be up at once: tests that call ``create_network`` take
``root_lab_lock`` first, and wait for each other instead of failing.
"""

from __future__ import annotations

import contextlib
import os
import subprocess
from collections.abc import Callable, Iterator
from pathlib import Path

import pytest
from tests import harness

from ambit.commands import SubprocessRunner
from ambit.lab.cluster.record import Record, SweepIncompleteError, sweep
from ambit.lab.network.topology import Topology

LOCK_WAIT = 1800.0
"""How long a test may queue behind other labs (e2e modules hold theirs for minutes); its timeout stops meanwhile."""


@pytest.fixture(autouse=True)
def _needs_root() -> None:
    if os.geteuid() != 0:
        if os.environ.get("CI"):
            pytest.fail("netns tests need root, and CI runs as root")
        pytest.skip("needs root (network namespaces)")


@pytest.fixture
def root_lab_lock() -> Iterator[None]:
    """Held while a test's lab has its bridge and routes in the root namespace."""
    with harness.root_lab_lock(LOCK_WAIT):
        yield


def lab_leftovers(topology: Topology) -> list[str]:
    """Anything on the machine with the lab's prefix: namespaces, root links, root routes on its links."""
    mine = topology.prefix + "-"
    out: list[str] = []
    for argv in (["ip", "netns", "list"], ["ip", "-br", "link"], ["ip", "route"]):
        text = subprocess.run(argv, capture_output=True, text=True, check=True).stdout
        out += [line for line in text.splitlines() if mine in line]
    return out


@pytest.fixture(name="lab_leftovers")
def lab_leftovers_fixture() -> Callable[[Topology], list[str]]:
    return lab_leftovers


@pytest.fixture
def new_lab(tmp_path: Path) -> Iterator[Callable[..., Topology]]:
    """Make a lab topology (nothing created yet); every lab made is swept afterwards, and checked gone."""
    labs: list[Topology] = []

    def make(nodes: int, ip_family: str = "ipv4") -> Topology:
        topology = Topology.new(nodes, tmp_path / f"lab{len(labs)}", ip_family=ip_family)
        labs.append(topology)
        return topology

    yield make
    for topology in labs:
        with contextlib.suppress(SweepIncompleteError):
            sweep(topology, Record(topology.record_file), SubprocessRunner())
        assert lab_leftovers(topology) == [], f"lab {topology.lab_id} left things behind"
