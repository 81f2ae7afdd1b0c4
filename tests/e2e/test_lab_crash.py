"""A node runtime killed with SIGKILL while pods run and start: ``ambit lab down`` still leaves nothing behind.

What is compared, before ``lab up`` and after ``lab down`` (all under the lab lock, so no other lab comes or goes):
network namespaces, root links, the root nftables ruleset (table by table), ``/run/netns`` mounts, and processes
that mention the lab's directory or run in one of its namespaces (their inodes are taken before ``lab down``: a
process keeps a deleted namespace alive under the same inode). Names of other labs (``ab<other id>-``) are not ours
to judge: tests of other developers may create and remove them meanwhile.
"""

from __future__ import annotations

import os
import re
import signal
import subprocess
import time
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path

import pytest
from tests.e2e.lab_driver import (
    TEST_TIMEOUT,
    Lab,
    ambit,
    deployment_manifest,
    http_echo_container,
    lab_down,
    lab_up,
    netns_names,
    root_lab_lock,
    wait_until,
)

pytestmark = [pytest.mark.root, pytest.mark.kubectl, pytest.mark.timeout(TEST_TIMEOUT)]

OTHER_LAB = re.compile(r"\bab[0-9a-f]{4}-")


@dataclass(frozen=True)
class Snapshot:
    netns: frozenset[str]
    links: frozenset[str]
    nft_tables: frozenset[str]
    netns_mounts: frozenset[str]

    @classmethod
    def take(cls) -> Snapshot:
        links = _lines(["ip", "-br", "link"])
        mounts = Path("/proc/self/mountinfo").read_text().splitlines()
        return cls(
            netns=frozenset(netns_names()),
            links=frozenset(line.split()[0].split("@")[0] for line in links),
            nft_tables=frozenset(_nft_tables()),
            netns_mounts=frozenset(m.split()[4] for m in mounts if m.split()[4].startswith("/run/netns/")),
        )

    def new_since(self, before: Snapshot, prefix: str) -> dict[str, list[str]]:
        """What is here and was not before: ours (with ``prefix``) or unexplained (not another lab's). Network
        namespaces count only with our prefix: every one a lab makes carries it, and the machine tests of another
        share (tests/netns, run beside the lab stream) make and remove their own in the same /run/netns."""
        found: dict[str, list[str]] = {}
        for field in ("netns", "links", "nft_tables", "netns_mounts"):
            added = getattr(self, field) - getattr(before, field)
            if field in ("netns", "netns_mounts"):
                mine = [x for x in added if prefix in x]
            else:
                mine = [x for x in added if prefix in x or not OTHER_LAB.search(x)]
            if mine:
                found[field] = sorted(mine)
        return found


def _lines(argv: list[str]) -> list[str]:
    return subprocess.run(argv, capture_output=True, text=True, check=True).stdout.splitlines()


def _nft_tables() -> list[str]:
    """The root namespace's nftables ruleset, one string per table (its header and rules): a table that was added
    or changed since the snapshot shows up in the difference."""
    tables: list[str] = []
    for line in _lines(["nft", "list", "ruleset"]):
        if line.startswith("table "):
            tables.append("")
        if tables:
            tables[-1] += line + "\n"
    return tables


def namespace_inodes(prefix: str) -> set[tuple[int, int]]:
    inodes = set()
    for name in netns_names():
        if name.startswith(prefix + "-"):
            st = os.stat(f"/run/netns/{name}")
            inodes.add((st.st_dev, st.st_ino))
    return inodes


def lab_processes(directory: Path, inodes: set[tuple[int, int]]) -> list[str]:
    """Processes whose command line names the lab's directory, or that live in one of the given namespaces."""
    found = []
    for entry in Path("/proc").iterdir():
        if not entry.name.isdigit() or int(entry.name) == os.getpid():
            continue
        try:
            args = (entry / "cmdline").read_bytes().replace(b"\0", b" ").decode(errors="replace").strip()
            st = os.stat(entry / "ns" / "net")
        except OSError:
            continue
        if str(directory) in args or (st.st_dev, st.st_ino) in inodes:
            found.append(f"{entry.name} {args}")
    return found


@dataclass
class CrashLab:
    lab: Lab
    before: Snapshot


@pytest.fixture
def crash_lab(tmp_path: Path) -> Iterator[CrashLab]:
    """A lab of its own, with a snapshot of the machine taken just before it came up (under the lock)."""
    directory = tmp_path / "lab"
    with root_lab_lock():
        before = Snapshot.take()
        prefix = None
        try:
            topology = lab_up(directory)
            prefix = topology.prefix
            yield CrashLab(Lab(topology, tmp_path / "kubecache"), before)
        finally:
            if directory.exists():  # the test brings it down itself; this is for when it failed before that
                lab_down(directory, prefix, keep_logs=tmp_path / "lab-logs")


def test_lab_down_after_a_node_runtime_is_killed_leaves_nothing_behind(crash_lab: CrashLab) -> None:
    lab, before = crash_lab.lab, crash_lab.before
    prefix = lab.topology.prefix
    lab.kubectl("create", "namespace", "crash")
    lab.apply(deployment_manifest("steady", 4, http_echo_container()), namespace="crash")
    steady = lab.wait_pods_ready("crash", "app=steady", 4)
    on_node_1 = [p for p in steady if p["spec"]["nodeName"] == "node-1"]
    assert on_node_1

    # More pods are on their way (some to node-1) when node-1's runtime dies.
    lab.apply(deployment_manifest("burst", 6, http_echo_container()), namespace="crash")
    wait_until(
        "burst pods bound to node-1",
        lambda: any(p["spec"].get("nodeName") == "node-1" for p in lab.pods("crash", "app=burst")),
        10,
        interval=0.05,
    )
    (runtime,) = lab.runtime_pids()["node-1"]
    os.kill(runtime, signal.SIGKILL)
    wait_until("node-1's runtime to be gone", lambda: lab.runtime_pids()["node-1"] == [], 5, interval=0.05)

    # Its pods outlive it, as containers outlive a kubelet: they still answer in their namespaces.
    time.sleep(1)
    for pod in on_node_1:
        ip = pod["status"]["podIP"]
        out = lab.exec(pod["metadata"]["name"], "crash", "python3", "-c", _GET.format(ip=ip))
        assert pod["metadata"]["name"] in out
    inodes = namespace_inodes(prefix)
    assert len(inodes) >= 2 + len(steady)  # the nodes' and the pods' namespaces
    assert lab_processes(lab.directory, inodes), "the lab's processes should be found before lab down"

    started = time.monotonic()
    lab_down(lab.directory, prefix)
    assert time.monotonic() - started < 30

    assert Snapshot.take().new_since(before, prefix) == {}
    assert lab_processes(lab.directory, inodes) == []
    assert not ambit("lab", "down", "--dir", str(lab.directory)).stderr, "a second lab down is a no-op"


_GET = (
    "import urllib.request; "
    "print(urllib.request.urlopen('http://{ip}:8080/', timeout=3).read().decode())"  # the pod calls itself
)
