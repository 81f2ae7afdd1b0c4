"""The data-path bench restarts a lab's node proxies with extra flags through the real supervisor (fake proxies).

The proxies are sleeping processes whose command line looks like a node proxy's (``nodeproxy --lab-dir <lab>``),
supervised as ``ambit lab supervise`` does; only the readiness probe (HTTP on the node's address) is stubbed, as the
nodes' addresses do not exist here.
"""

from __future__ import annotations

import asyncio
import sys
from pathlib import Path

import bench.mesh.topology as bench_topology
import pytest
from bench.mesh.run import COLD_FLAGS
from bench.mesh.topology import BenchLab, BenchLabError
from tests.supervision import FAST

from ambit.lab.cluster.supervisor import NODEPROXY_FLAGS_FILE, Daemon, Supervisor
from ambit.lab.network.topology import Topology


def fake_proxies(topology: Topology) -> list[Daemon]:
    flags = topology.path / "mesh" / NODEPROXY_FLAGS_FILE
    sleeper = (sys.executable, "-c", "import time; time.sleep(60)", "nodeproxy", "--lab-dir", str(topology.path))
    return [
        Daemon(f"nodeproxy {n.name}", (*sleeper, "--node", n.name), topology.path / f"{n.name}.log", flags)
        for n in topology.all_nodes()
    ]


def cmdline(pid: int) -> list[str]:
    return Path(f"/proc/{pid}/cmdline").read_bytes().decode().split("\0")[:-1]


async def test_the_proxies_come_back_with_the_cold_flags_then_without_them(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setattr(bench_topology, "_proxy_ready", lambda address: True)
    topology = Topology.new(2, tmp_path / "lab", mesh=True)
    (topology.path / "mesh").mkdir(parents=True)
    lab = BenchLab(topology, tmp_path / "kubecache")
    async with Supervisor(fake_proxies(topology), None, FAST) as supervisor:
        while len(supervisor.pids) < 2:  # noqa: ASYNC110 - the supervisor's own state, no event to wait on
            await asyncio.sleep(0.01)
        first = set(await asyncio.to_thread(lab.node_proxy_pids))

        cold = await asyncio.to_thread(lab.restart_node_proxies, COLD_FLAGS, 10.0)
        assert len(cold) == 2 and not first & set(cold)
        assert all(cmdline(pid)[-2:] == list(COLD_FLAGS) for pid in cold)
        assert (topology.path / "mesh" / NODEPROXY_FLAGS_FILE).read_text() == "".join(f"{f}\n" for f in COLD_FLAGS)
        assert lab.proxy_flags == COLD_FLAGS

        pooled = await asyncio.to_thread(lab.restart_node_proxies, (), 10.0)
        assert len(pooled) == 2 and not set(cold) & set(pooled)
        assert all(not set(COLD_FLAGS) & set(cmdline(pid)) for pid in pooled)
        assert not (topology.path / "mesh" / NODEPROXY_FLAGS_FILE).exists()
        assert supervisor.restarts == {f"nodeproxy {n.name}": 2 for n in topology.all_nodes()}


async def test_a_proxy_that_never_gets_ready_ends_the_wait_with_one_clear_error(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setattr(bench_topology, "_proxy_ready", lambda address: False)
    topology = Topology.new(2, tmp_path / "lab", mesh=True)
    (topology.path / "mesh").mkdir(parents=True)
    lab = BenchLab(topology, tmp_path / "kubecache")
    async with Supervisor(fake_proxies(topology), None, FAST) as supervisor:
        while len(supervisor.pids) < 2:  # noqa: ASYNC110
            await asyncio.sleep(0.01)
        with pytest.raises(BenchLabError, match=r"not back and ready with flags \['--pool-max-streams=1'"):
            await asyncio.to_thread(lab.restart_node_proxies, COLD_FLAGS, 1.0)
