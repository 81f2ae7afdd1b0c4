"""The data-path bench restarts the installed node proxies with extra flags through the ztunnel DaemonSet's args.

The cluster is a stand-in for kubectl (:class:`FakeCluster`) that keeps the DaemonSet's container args and, at each
patch, replaces each node's proxy with a real process: a ``runc``-like parent whose child's command line is the
container's (``ambit nodeproxy <args>``), as the lab's runtime runs a container, so the bench finds the proxies' pids
the way it does on a lab. Only the readiness probe (HTTP on the pod's address) is stubbed.
"""

from __future__ import annotations

import contextlib
import json
import os
import signal
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

import bench.mesh.topology as bench_topology
import pytest
from bench.mesh.run import COLD_FLAGS
from bench.mesh.topology import BenchLab, BenchLabError

from ambit.lab.network.topology import Topology
from ambit.lab.runtime.processes import child_of

BASE_ARGS = ["nodeproxy", "--node=$(NODE_NAME)", "--cluster-id=$(CLUSTER_ID)"]


class FakeCluster:
    """kubectl for one DaemonSet, ``ztunnel``, with a pod per node: get, patch (json), rollout status."""

    def __init__(self, nodes: list[str]) -> None:
        self.nodes = nodes
        self.args = list(BASE_ARGS)
        self.patches: list[list[dict[str, Any]]] = []
        self.runcs: dict[str, subprocess.Popen[bytes]] = {}
        self._start_pods()

    def _start_pods(self) -> None:
        for node in list(self.runcs):
            self._stop(self.runcs.pop(node))
        for node in self.nodes:
            child = [sys.executable, "-c", "import time; time.sleep(60)", *self.args]
            runc = [sys.executable, "-c", f"import subprocess; subprocess.run({child!r})"]
            self.runcs[node] = subprocess.Popen(runc)
        deadline = time.monotonic() + 10
        while not all(child_of(p.pid) for p in self.runcs.values()):
            assert time.monotonic() < deadline, "the fake containers did not start"
            time.sleep(0.02)

    def close(self) -> None:
        for runc in self.runcs.values():
            self._stop(runc)

    @staticmethod
    def _stop(runc: subprocess.Popen[bytes]) -> None:
        """End a fake container: its main process (by pid), then the parent."""
        child = child_of(runc.pid)
        if child is not None:
            with contextlib.suppress(ProcessLookupError):
                os.kill(child, signal.SIGKILL)
        runc.wait(10)

    def kubectl(self, *args: str, input: str | None = None) -> str:
        if args[:3] == ("get", "daemonset", "ztunnel"):
            template = {"spec": {"containers": [{"name": "istio-proxy", "args": self.args}]}}
            return json.dumps({"spec": {"template": template}})
        if args[:2] == ("get", "pods"):
            return json.dumps({"items": [self._pod(node) for node in self.nodes]})
        if args[:3] == ("patch", "daemonset", "ztunnel"):
            patch = json.loads(args[args.index("-p") + 1])
            self.patches.append(patch)
            for op in patch:
                if op["path"] == "/spec/template/spec/containers/0/args":
                    self.args = list(op["value"])
            self._start_pods()
            return ""
        if args[:2] == ("rollout", "status"):
            return "daemon set rolled out"
        raise AssertionError(f"unexpected kubectl {args}")

    def _pod(self, node: str) -> dict[str, Any]:
        runc = self.runcs[node]
        return {
            "metadata": {"name": f"ztunnel-{node}", "namespace": "istio-system"},
            "spec": {"nodeName": node},
            "status": {
                "phase": "Running",
                "podIP": "192.0.2.1",
                "containerStatuses": [{"state": {"running": {}}, "containerID": f"ambit://{runc.pid}"}],
            },
        }


def cmdline(pid: int) -> list[str]:
    return Path(f"/proc/{pid}/cmdline").read_bytes().decode().split("\0")[:-1]


@pytest.fixture
def rig(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Any:
    topology = Topology.new(2, tmp_path / "lab")
    cluster = FakeCluster([n.name for n in topology.all_nodes()])
    lab = BenchLab(topology, tmp_path / "kubecache")
    monkeypatch.setattr(lab, "kubectl", cluster.kubectl)
    try:
        yield lab, cluster
    finally:
        cluster.close()


def test_the_proxies_come_back_with_the_cold_flags_then_without_them(
    rig: tuple[BenchLab, FakeCluster], monkeypatch: pytest.MonkeyPatch
) -> None:
    lab, cluster = rig
    monkeypatch.setattr(bench_topology, "_proxy_ready", lambda address: address == "192.0.2.1")
    first = set(lab.node_proxy_pids())
    assert len(first) == 2

    cold = lab.restart_node_proxies(COLD_FLAGS, 10.0)
    assert len(cold) == 2 and not first & set(cold)
    assert all(cmdline(pid)[-2:] == list(COLD_FLAGS) for pid in cold)
    assert cluster.args == [*BASE_ARGS, *COLD_FLAGS] and lab.proxy_flags == COLD_FLAGS
    restarted_at = cluster.patches[-1][1]
    assert restarted_at["path"].endswith("~1restartedAt") and restarted_at["value"].endswith("Z")

    pooled = lab.restart_node_proxies((), 10.0)
    assert len(pooled) == 2 and not set(cold) & set(pooled)
    assert all(not set(COLD_FLAGS) & set(cmdline(pid)) for pid in pooled)
    assert cluster.args == BASE_ARGS  # the installed args, not the cold ones less nothing
    assert cluster.patches[0][1]["value"] != cluster.patches[1][1]["value"]  # each restart is a new revision
    assert {n: len(p) for n, p in lab.node_proxy_pids_by_node().items()} == {"node-1": 1, "node-2": 1}


def test_a_proxy_that_never_gets_ready_ends_the_wait_with_one_clear_error(
    rig: tuple[BenchLab, FakeCluster], monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setattr(bench_topology, "_proxy_ready", lambda address: False)
    lab, _ = rig
    with pytest.raises(BenchLabError, match=r"not back and ready with flags \['--pool-max-streams=1'"):
        lab.restart_node_proxies(COLD_FLAGS, 1.0)
