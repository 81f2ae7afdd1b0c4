"""Adding a node to a running lab, the pure parts: the taints it registers with (kubelet's
``--register-with-taints`` grammar), the Node it creates, and the routes that join it to the other nodes."""

from __future__ import annotations

import dataclasses
import json
from pathlib import Path

import pytest
from hypothesis import given
from hypothesis import strategies as st

from ambit.commands import Call, CommandResult, RecordingRunner
from ambit.lab.cluster.join import add_node, default_taints
from ambit.lab.cluster.lifecycle import LabError
from ambit.lab.cluster.record import Record
from ambit.lab.network.bridge import LabNetworkError, Route, add_node_network, join_routes, node_routes
from ambit.lab.network.topology import MAX_NODES, SERVICE_CIDR, Topology
from ambit.lab.runtime.kubelet import NodeRuntimeSettings
from ambit.lab.runtime.node_status import node_manifest
from ambit.lab.runtime.node_taints import (
    CNI_NOT_READY,
    NodeTaint,
    TaintSpecError,
    parse_taint,
    parse_taints,
    render_taints,
)

# -- taints -----------------------------------------------------------------------------------------------------


@pytest.mark.parametrize(
    ("spec", "taint"),
    [
        ("cni.istio.io/not-ready=true:NoSchedule", NodeTaint("cni.istio.io/not-ready", "true", "NoSchedule")),
        ("dedicated:NoExecute", NodeTaint("dedicated", "", "NoExecute")),
        ("a=:PreferNoSchedule", NodeTaint("a", "", "PreferNoSchedule")),
        ("example.com/Gpu=A100_x.1:NoSchedule", NodeTaint("example.com/Gpu", "A100_x.1", "NoSchedule")),
    ],
)
def test_a_taint_is_key_value_and_effect(spec: str, taint: NodeTaint) -> None:
    assert parse_taint(spec) == taint


@pytest.mark.parametrize(
    ("spec", "message"),
    [
        ("dedicated", "expected key=value:Effect"),
        ("dedicated=x", "expected key=value:Effect"),
        ("dedicated=x:Never", "the effect must be one of NoSchedule, PreferNoSchedule, NoExecute"),
        ("dedicated=x:noschedule", "the effect must be one of"),
        ("=x:NoSchedule", "the key is empty"),
        (":NoSchedule", "the key is empty"),
        ("-bad=x:NoSchedule", "key name part must consist of"),
        ("a/b/c=x:NoSchedule", "key a qualified name"),
        ("Bad_Prefix/k=x:NoSchedule", "key prefix part"),
        ("k=bad value:NoSchedule", "value a valid label"),
        ("k=a:b:NoSchedule", "value a valid label"),
        (f"k={'v' * 64}:NoSchedule", "value must be no more than 63"),
    ],
)
def test_a_bad_taint_is_refused_with_what_was_expected(spec: str, message: str) -> None:
    with pytest.raises(TaintSpecError, match="taint ") as caught:
        parse_taint(spec)
    assert message in str(caught.value)
    assert isinstance(caught.value, ValueError)


def test_a_list_is_comma_separated_without_empty_items_or_repeats() -> None:
    assert parse_taints(["a=1:NoSchedule,b:NoExecute", "a=2:NoExecute"]) == (
        NodeTaint("a", "1", "NoSchedule"),
        NodeTaint("b", "", "NoExecute"),
        NodeTaint("a", "2", "NoExecute"),
    )
    with pytest.raises(TaintSpecError, match="an empty item"):
        parse_taints(["a=1:NoSchedule,"])
    with pytest.raises(TaintSpecError, match="a second taint a with effect NoSchedule"):
        parse_taints(["a=1:NoSchedule", "a=2:NoSchedule"])


_NAME = st.from_regex(r"[A-Za-z0-9]([-A-Za-z0-9_.]{0,20}[A-Za-z0-9])?", fullmatch=True)
_KEY = st.builds(lambda p, n: f"{p}/{n}" if p else n, st.sampled_from(["", "example.com", "cni.istio.io"]), _NAME)
_TAINT = st.builds(
    NodeTaint, _KEY, st.one_of(st.just(""), _NAME), st.sampled_from(["NoSchedule", "PreferNoSchedule", "NoExecute"])
)


@given(st.lists(_TAINT, max_size=5, unique_by=lambda t: (t.key, t.effect)))
def test_rendered_taints_parse_back(taints: list[NodeTaint]) -> None:
    assert parse_taints([render_taints(taints)] if taints else []) == tuple(taints)


@given(st.text(max_size=80))
def test_any_text_parses_or_is_refused_clearly(text: str) -> None:
    try:
        parsed = parse_taints([text])
    except TaintSpecError:
        return
    assert parse_taints([render_taints(parsed)]) == parsed


def test_the_default_is_the_cni_taint_only_when_the_mesh_is_installed(tmp_path: Path) -> None:
    installed = Topology.new(2, tmp_path, installed=True)
    assert default_taints(installed) == (NodeTaint("cni.istio.io/not-ready", "true", "NoSchedule"),)
    assert str(default_taints(installed)[0]) == CNI_NOT_READY
    assert default_taints(Topology.new(2, tmp_path)) == ()


def test_the_node_is_created_with_its_taints(tmp_path: Path) -> None:
    topology = Topology.new(3, tmp_path)
    plain = NodeRuntimeSettings.for_lab(topology, "node-3")
    assert "taints" not in node_manifest(plain)["spec"]
    tainted = dataclasses.replace(
        plain, register_with_taints=(parse_taint("dedicated:NoExecute"), parse_taint(CNI_NOT_READY))
    )
    assert node_manifest(tainted)["spec"]["taints"] == [
        {"key": "dedicated", "effect": "NoExecute"},
        {"key": "cni.istio.io/not-ready", "value": "true", "effect": "NoSchedule"},
    ]


# -- routes -----------------------------------------------------------------------------------------------------


def test_an_added_node_is_routed_from_the_root_and_every_other_node_and_routes_to_them(tmp_path: Path) -> None:
    topology = Topology.new(3, tmp_path)
    p = topology.prefix
    plan = join_routes(topology, topology.node(3))
    assert plan == [
        Route(f"{p}-node-3", "198.18.1.0/24", "198.18.0.11", "eth0"),
        Route(f"{p}-node-3", "198.18.2.0/24", "198.18.0.12", "eth0"),
        Route(None, "198.18.3.0/24", "198.18.0.13", f"{p}-br"),
        Route(f"{p}-node-3", SERVICE_CIDR, "", "eth0"),
        Route(f"{p}-node-1", "198.18.3.0/24", "198.18.0.13", "eth0"),
        Route(f"{p}-node-2", "198.18.3.0/24", "198.18.0.13", "eth0"),
    ]
    assert plan[0].argv() == [
        "ip",
        "-n",
        f"{p}-node-3",
        "route",
        "add",
        "198.18.1.0/24",
        "via",
        "198.18.0.11",
        "dev",
        "eth0",
    ]
    assert plan[2].argv() == ["ip", "route", "add", "198.18.3.0/24", "via", "198.18.0.13", "dev", f"{p}-br"]
    assert plan[3].argv() == ["ip", "-n", f"{p}-node-3", "route", "add", SERVICE_CIDR, "dev", "eth0"]


def test_a_lab_built_at_once_has_the_routes_of_nodes_added_one_by_one(tmp_path: Path) -> None:
    whole = Topology.new(4, tmp_path)
    at_once = {route for node in whole.all_nodes() for route in node_routes(whole, node)}
    one_by_one: set[Route] = set()
    for n in range(1, 5):
        grown = dataclasses.replace(whole, nodes=n)
        one_by_one |= set(join_routes(grown, grown.node(n)))
    assert at_once == one_by_one


def test_adding_a_node_creates_its_namespace_link_routes_and_cni_files_noting_each(tmp_path: Path) -> None:
    topology = Topology.new(3, tmp_path / "lab")
    runner = RecordingRunner()
    record = Record(topology.record_file)
    add_node_network(topology, topology.node(3), record, runner)
    p = topology.prefix
    assert f"ip netns add {p}-node-3" in runner.commands
    assert f"ip link add {p}-n3 type veth peer name eth0 netns {p}-node-3" in runner.commands
    assert f"ip link set {p}-n3 master {p}-br up" in runner.commands
    added = [c for c in runner.commands if " route add " in c]
    assert added == [" ".join(r.argv()) for r in join_routes(topology, topology.node(3))]
    noted = {(e.kind, e.get("name") or e.get("dst")) for e in record.entries()}
    assert {("netns", f"{p}-node-3"), ("link", f"{p}-n3"), ("route", "198.18.3.0/24")} <= noted
    conflist = json.loads((topology.cni_conf_dir("node-3") / "10-ambit-lab.conflist").read_text())
    assert conflist["plugins"][0]["ipam"]["ranges"] == [[{"subnet": "198.18.3.0/24", "gateway": "198.18.3.1"}]]


def test_a_node_whose_namespace_or_range_is_taken_is_not_added(tmp_path: Path) -> None:
    topology = Topology.new(3, tmp_path / "lab")
    p = topology.prefix

    def respond(call: Call) -> CommandResult | None:
        if call.argv == ("ip", "netns", "list"):
            return CommandResult(call.argv, 0, f"{p}-node-1\n{p}-node-3 (id: 4)\n".encode())
        if call.argv == ("ip", "-j", "link", "show"):
            return CommandResult(call.argv, 0, json.dumps([{"ifname": f"{p}-n1"}]).encode())
        if call.argv[:3] == ("ip", "-j", "-4"):
            return CommandResult(call.argv, 0, json.dumps([{"dst": "198.18.3.0/24", "dev": "other0"}]).encode())
        return None

    runner = RecordingRunner(respond=respond)
    with pytest.raises(
        LabNetworkError, match=f"cannot add node-3: namespace {p}-node-3 exists.*198.18.3.0/24 is routed via other0"
    ):
        add_node_network(topology, topology.node(3), Record(topology.record_file), runner)
    assert not any(" add " in c for c in runner.commands)


# -- the add's refusals and its undo ------------------------------------------------------------------------------


def _link_add_refused(call: Call) -> CommandResult | None:
    if call.argv[:3] == ("ip", "link", "add"):
        return CommandResult(call.argv, 2, b"", b"RTNETLINK answers: Operation not permitted")
    return None


def test_a_failed_add_removes_what_it_made_and_restores_the_topology(tmp_path: Path) -> None:
    topology = Topology.new(2, tmp_path / "lab", installed=True)
    topology.save()
    p = topology.prefix
    runner = RecordingRunner(respond=_link_add_refused)
    with pytest.raises(LabError, match=r"adding node-3 failed: .*Operation not permitted"):
        add_node(topology.path, runner=runner)
    assert Topology.load(topology.path) == topology
    assert f"ip netns delete {p}-node-3" in runner.commands
    assert f"ip link delete {p}-n3" in runner.commands
    assert f"ip route delete 198.18.3.0/24 via 198.18.0.13 dev {p}-br" in runner.commands
    assert f"ip -n {p}-node-1 route delete 198.18.3.0/24 via 198.18.0.13 dev eth0" in runner.commands
    assert not topology.node_dir("node-3").exists()


def test_the_next_add_takes_the_lowest_index_a_removed_node_left(tmp_path: Path) -> None:
    topology = dataclasses.replace(Topology.new(4, tmp_path / "lab"), removed=(2, 3))
    topology.save()
    runner = RecordingRunner(respond=_link_add_refused)
    with pytest.raises(LabError, match="adding node-2 failed"):
        add_node(topology.path, runner=runner)
    assert any(c.startswith(f"ip link add {topology.prefix}-n2 ") for c in runner.commands), runner.commands
    assert Topology.load(topology.path) == topology


def test_a_lab_at_its_size_limit_or_no_lab_gets_no_node(tmp_path: Path) -> None:
    runner = RecordingRunner()
    full = dataclasses.replace(Topology.new(2, tmp_path / "b"), nodes=MAX_NODES)
    full.save()
    with pytest.raises(LabError, match=f"the lab has {MAX_NODES} nodes, the most"):
        add_node(full.path, runner=runner)
    with pytest.raises(LabError, match="no lab in"):
        add_node(tmp_path / "none", runner=runner)
    assert runner.calls == []


def test_a_refused_add_leaves_the_route_that_was_in_the_way_alone(tmp_path: Path) -> None:
    topology = Topology.new(2, tmp_path / "lab")
    topology.save()

    def respond(call: Call) -> CommandResult | None:
        if call.argv[:3] == ("ip", "-j", "-4"):
            return CommandResult(call.argv, 0, json.dumps([{"dst": "198.18.3.0/24", "dev": "other0"}]).encode())
        return None

    runner = RecordingRunner(respond=respond)
    with pytest.raises(LabError, match=r"198\.18\.3\.0/24 is routed via other0"):
        add_node(topology.path, runner=runner)
    deletes = [c for c in runner.commands if " delete " in c]
    assert deletes and all("other0" not in c and " dev " in c for c in deletes if " route " in c)
