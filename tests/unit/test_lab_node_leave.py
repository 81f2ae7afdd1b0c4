"""A node leaving a running lab, the pure parts: which pods the drain deletes, the refusals made before anything
changes, the lab's record of removed nodes, and the network commands that take the node away."""

from __future__ import annotations

import dataclasses
from pathlib import Path
from typing import Any

import pytest

from ambit.commands import RecordingRunner
from ambit.lab.cluster.leave import _remove_network, drain_plan, remove_node
from ambit.lab.cluster.lifecycle import LabError
from ambit.lab.network.topology import LOAD_BALANCER_CIDR, Topology


def _pod(name: str, owner: str | None = None, **extra: Any) -> dict[str, Any]:
    meta: dict[str, Any] = {"name": name, "namespace": "ns", "uid": f"uid-{name}"}
    if owner:
        meta["ownerReferences"] = [{"kind": owner, "name": "x", "controller": True}]
    meta.update(extra.pop("metadata", {}))
    return {"metadata": meta, "status": extra.pop("status", {"phase": "Running"}), **extra}


# -- the drain ---------------------------------------------------------------------------------------------------


def test_the_drain_deletes_controlled_pods_and_leaves_daemonset_and_ended_pods() -> None:
    pods = [
        _pod("web", "ReplicaSet"),
        _pod("db", "StatefulSet"),
        _pod("ztunnel", "DaemonSet"),
        _pod("done", "Job", status={"phase": "Succeeded"}),
        _pod("going", "ReplicaSet", metadata={"deletionTimestamp": "2026-12-04T00:00:00Z"}),
    ]
    delete, refused = drain_plan(pods, force=False)
    assert [p["metadata"]["name"] for p in delete] == ["web", "db"]
    assert refused == []


def test_a_pod_no_controller_owns_stops_the_drain_unless_forced() -> None:
    owned_not_controlling = _pod("odd", metadata={"ownerReferences": [{"kind": "ReplicaSet", "name": "x"}]})
    pods = [_pod("lone"), owned_not_controlling, _pod("web", "ReplicaSet")]
    delete, refused = drain_plan(pods, force=False)
    assert refused == ["ns/lone", "ns/odd"]
    assert [p["metadata"]["name"] for p in delete] == ["web"]
    delete, refused = drain_plan(pods, force=True)
    assert refused == []
    assert [p["metadata"]["name"] for p in delete] == ["lone", "odd", "web"]


def test_the_drain_reads_malformed_pods_without_failing() -> None:
    pods: list[dict[str, Any]] = [{}, {"metadata": None}, {"metadata": {"ownerReferences": ["x", None]}}]
    delete, refused = drain_plan(pods, force=False)
    assert delete == [] and len(refused) == 3


# -- refusals before anything changes ------------------------------------------------------------------------------


def test_an_unknown_node_the_last_node_and_no_lab_are_refused(tmp_path: Path) -> None:
    runner = RecordingRunner()
    two = Topology.new(2, tmp_path / "two")
    two.save()
    with pytest.raises(LabError, match=r"no node 'node-7' in this lab \(its nodes: node-1, node-2\)"):
        remove_node(two.path, "node-7", runner=runner)
    one = dataclasses.replace(Topology.new(2, tmp_path / "one"), removed=(1,))
    one.save()
    with pytest.raises(LabError, match="node-2 is the lab's last node"):
        remove_node(one.path, "node-2", runner=runner)
    with pytest.raises(LabError, match="no node 'node-1'"):
        remove_node(one.path, "node-1", runner=runner)
    with pytest.raises(LabError, match="no lab in"):
        remove_node(tmp_path / "none", "node-1", runner=runner)
    assert runner.calls == []
    assert Topology.load(two.path) == two


# -- the lab's record of removed nodes -----------------------------------------------------------------------------


def test_a_removed_node_is_no_longer_a_node_of_the_lab_and_that_is_saved(tmp_path: Path) -> None:
    topology = dataclasses.replace(Topology.new(3, tmp_path / "lab"), removed=(2,))
    assert [n.name for n in topology.all_nodes()] == ["node-1", "node-3"]
    assert topology.node_count == 2
    assert topology.node_named("node-2") is None
    with pytest.raises(ValueError, match="no node 2"):
        topology.node(2)
    topology.save()
    assert Topology.load(topology.path) == topology
    old = Topology.new(2, tmp_path / "old")  # a lab.json written before removals existed
    old.save()
    text = (old.path / "lab.json").read_text().replace('"removed": [],', "")
    (old.path / "lab.json").write_text(text)
    assert Topology.load(old.path) == old


# -- the network -------------------------------------------------------------------------------------------------


def test_removing_a_node_deletes_its_routes_link_and_namespace(tmp_path: Path) -> None:
    topology = Topology.new(3, tmp_path / "lab")
    p = topology.prefix
    node = topology.node(2)
    runner = RecordingRunner()
    _remove_network(topology, dataclasses.replace(topology, removed=(2,)), node, runner)
    assert f"ip route delete 198.18.2.0/24 via 198.18.0.12 dev {p}-br" in runner.commands
    assert f"ip -n {p}-node-1 route delete 198.18.2.0/24 via 198.18.0.12 dev eth0" in runner.commands
    assert f"ip -n {p}-node-3 route delete 198.18.2.0/24 via 198.18.0.12 dev eth0" in runner.commands
    assert f"ip link delete {p}-n2" in runner.commands
    assert f"ip netns delete {p}-node-2" in runner.commands
    assert not any(" replace " in c for c in runner.commands)  # the load-balancer route stays via node-1


def test_when_the_first_node_leaves_the_load_balancer_range_moves_to_the_next(tmp_path: Path) -> None:
    topology = Topology.new(3, tmp_path / "lab")
    topology.save()
    p = topology.prefix
    runner = RecordingRunner()
    _remove_network(topology, dataclasses.replace(topology, removed=(1,)), topology.node(1), runner)
    replaced = [c for c in runner.commands if " replace " in c]
    assert replaced == [f"ip route replace {LOAD_BALANCER_CIDR} via 198.18.0.12 dev {p}-br"]
