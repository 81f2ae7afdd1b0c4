"""The topology model: edges from flows (counts add up for any flow list), nodes and policies from config dumps."""

from __future__ import annotations

import contextlib
import json
from typing import Any

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st
from tests.proxyconfig_rig import record_dump, running_node_proxy

from ambit.telemetry.flows import VERDICTS, Flow
from ambit.telemetry.topology import (
    FlowStore,
    Inventory,
    TopologyError,
    build_graph,
    destination_id,
    edge_flows,
    graph_to_json,
    read_inventory,
    source_id,
)

NOW = 1_800_000_000.0


def flow(seq: int, **fields: Any) -> Flow:
    base: dict[str, Any] = {"time": NOW - 10, "direction": "inbound", "verdict": "allowed", "mtls": True}
    return Flow(seq=seq, **(base | fields))


def test_flows_between_workloads_make_one_edge_with_its_counts() -> None:
    flows = [
        flow(1, src_workload="client", src_namespace="apps", dst_workload="server", dst_namespace="apps", bytes_sent=3),
        flow(2, src_workload="client", src_namespace="apps", dst_workload="server", dst_namespace="apps", mtls=False),
        flow(
            3,
            src_workload="client",
            src_namespace="apps",
            dst_workload="server",
            dst_namespace="apps",
            verdict="denied",
            reason="explicitly denied by: apps/deny",
            bytes_recv=4,
        ),
    ]
    graph = build_graph(flows, Inventory(), now=NOW)
    (edge,) = graph.edges
    assert (edge.src, edge.dst) == ("wl:apps/client", "wl:apps/server")
    assert (edge.flows, edge.bytes, edge.mtls, edge.plaintext, edge.denied, edge.allowed) == (3, 7, 2, 1, 1, 2)
    assert [n.id for n in graph.nodes] == ["wl:apps/client", "wl:apps/server"]
    assert not any(n.known for n in graph.nodes)  # no proxy's config named them


def test_a_flow_names_its_ends_by_workload_then_service_then_address() -> None:
    assert source_id(flow(1, src_addr="198.18.0.9:4000")) == "ip:198.18.0.9"
    assert source_id(flow(1, src_addr="[fd00::1]:4000")) == "ip:fd00::1"
    assert destination_id(flow(1, dst_addr="198.19.0.20:80", dst_service="echo.apps.svc.cluster.local")) == (
        "svc:echo.apps.svc.cluster.local"
    )
    assert destination_id(flow(1, dst_addr="198.19.0.20:80")) == "ip:198.19.0.20"
    assert destination_id(flow(1)) == "ip:?"


def test_flows_outside_the_window_are_left_out() -> None:
    flows = [flow(1, time=NOW - 400, src_addr="198.18.0.1:1"), flow(2, time=NOW - 5, src_addr="198.18.0.2:1")]
    graph = build_graph(flows, Inventory(), now=NOW, window=300)
    assert [e.src for e in graph.edges] == ["ip:198.18.0.2"]
    assert [f.seq for f in edge_flows(flows, "ip:198.18.0.1", "ip:?", now=NOW, window=300)] == []
    assert [f.seq for f in edge_flows(flows, "ip:198.18.0.1", "ip:?", now=NOW, window=500)] == [1]


def test_edge_flows_are_newest_first_and_bounded() -> None:
    flows = [flow(i, time=NOW - 100 + i, src_addr="198.18.0.1:1") for i in range(50)]
    chosen = edge_flows(flows, "ip:198.18.0.1", "ip:?", now=NOW, limit=10)
    assert [f.seq for f in chosen] == list(range(49, 39, -1))


def test_the_store_keeps_the_newest_flows_only() -> None:
    store = FlowStore(capacity=3)
    store.add(flow(i, time=NOW - 10 + i) for i in range(5))
    assert len(store) == 3
    assert [f.seq for f in store.recent(NOW, 300)] == [2, 3, 4]
    with pytest.raises(ValueError):
        FlowStore(capacity=0)


async def test_a_recorded_node_proxy_dump_gives_workloads_services_and_their_policies(tmp_path: Any) -> None:
    async with running_node_proxy(tmp_path) as proxy:
        dump = record_dump(proxy)
    inventory = read_inventory(dump)
    graph = build_graph([], inventory, now=NOW)
    nodes = {n.id: n for n in graph.nodes}
    assert set(nodes) == {
        "wl:apps/client",
        "wl:apps/server",
        "wl:apps/legacy",
        "wl:istio-system/waypoint-0",
        "svc:echo.apps.svc.cluster.local",
        "svc:waypoint.apps.svc.cluster.local",
    }
    client = nodes["wl:apps/client"].details
    assert client["identity"] == "spiffe://cluster.local/ns/apps/sa/client"
    assert client["policies"] == ["apps/allow-client (ALLOW)", "istio-system/deny-all (DENY)"]
    assert nodes["wl:apps/server"].details["waypoint"] == "waypoint.apps.svc.cluster.local"
    assert nodes["wl:apps/legacy"].details["identity"] == ""  # plaintext (TCP): no identity
    assert nodes["wl:apps/legacy"].details["waypoint"] == "198.19.0.30"
    assert nodes["wl:istio-system/waypoint-0"].details["policies"] == ["istio-system/deny-all (DENY)"]
    assert nodes["svc:echo.apps.svc.cluster.local"].details["vips"] == ["198.19.0.20"]
    json.dumps(graph_to_json(graph))  # serialisable as is


@pytest.mark.parametrize(
    ("dump", "message"),
    [
        ({"workloads": {}}, "workloads is not a list"),
        ({"workloads": [1]}, r"workloads\[0\] is not an object"),
        ({"workloads": [{"name": 5}]}, r"workloads\[0\].name is not a string"),
        ({"services": [{"vips": "x"}]}, r"services\[0\].vips is not a list"),
        ({"workloads": [{"waypoint": []}]}, r"workloads\[0\].waypoint is not an object"),
        ({"policies": [{"name": "x" * 2000}]}, r"policies\[0\].name is not a string"),
    ],
)
def test_a_malformed_dump_is_refused_with_the_field_named(dump: dict[str, Any], message: str) -> None:
    with pytest.raises(TopologyError, match=message):
        read_inventory(dump)


def test_a_waypoints_dump_has_no_inventory() -> None:
    assert read_inventory({"config": {"trustDomain": "example.org"}}) == Inventory()


NAMES = st.sampled_from(["", "a", "b", "<script>", "ns/x"])
FLOWS = st.lists(
    st.builds(
        Flow,
        seq=st.integers(0, 2**20),
        time=st.floats(NOW - 1000, NOW + 10),
        direction=st.sampled_from(["inbound", "outbound"]),
        verdict=st.sampled_from(VERDICTS),
        mtls=st.booleans(),
        src_addr=st.sampled_from(["", "198.18.0.1:1", "[fd00::1]:2", "garbage"]),
        src_workload=NAMES,
        src_namespace=NAMES,
        dst_addr=st.sampled_from(["", "198.19.0.1:80", "x:y"]),
        dst_service=NAMES,
        dst_workload=NAMES,
        dst_namespace=NAMES,
        bytes_sent=st.integers(0, 2**40),
        bytes_recv=st.integers(0, 2**40),
    ),
    max_size=60,
)


@settings(max_examples=150, deadline=None)
@given(FLOWS, st.floats(1, 2000))
def test_any_flow_list_gives_a_graph_whose_counts_add_up(flows: list[Flow], window: float) -> None:
    graph = build_graph(flows, Inventory(), now=NOW, window=window)
    in_window = [f for f in flows if NOW - window <= f.time <= NOW]
    assert sum(e.flows for e in graph.edges) == len(in_window)
    assert sum(e.bytes for e in graph.edges) == sum(f.bytes_sent + f.bytes_recv for f in in_window)
    assert sum(e.denied for e in graph.edges) == sum(f.verdict == "denied" for f in in_window)
    ids = {n.id for n in graph.nodes}
    for edge in graph.edges:
        assert edge.mtls + edge.plaintext == edge.flows == edge.allowed + edge.denied + edge.failed
        assert {edge.src, edge.dst} <= ids
        assert len(edge_flows(flows, edge.src, edge.dst, now=NOW, window=window, limit=1000)) == edge.flows
    json.dumps(graph_to_json(graph))


@settings(max_examples=150, deadline=None)
@given(
    st.recursive(
        st.none() | st.integers() | st.text(max_size=5),
        lambda c: (
            st.lists(c, max_size=3)
            | st.dictionaries(
                st.sampled_from(
                    ["workloads", "services", "policies", "name", "waypoint", "vips", "hostname", "config"]
                ),
                c,
                max_size=4,
            )
        ),
        max_leaves=20,
    )
)
def test_any_dump_is_an_inventory_or_a_topology_error(dump: object) -> None:
    if not isinstance(dump, dict):
        return
    with contextlib.suppress(TopologyError):
        read_inventory(dump)


def test_an_edges_rates_join_its_flows_and_an_owners_name_is_its_only_pod() -> None:
    from ambit.telemetry.rates import EdgeRate
    from ambit.telemetry.topology import WorkloadInfo

    def pod(name: str, owner: str) -> WorkloadInfo:
        return WorkloadInfo(f"wl:apps/{name}", name, "apps", "", "node-1", "", "HBONE", (), (), owner)

    pods = (pod("client-7f9c", "client"), pod("server-1", "server"), pod("server-2", "server"))
    inventory = Inventory(workloads=pods)
    flows = [flow(1, src_workload="client-7f9c", src_namespace="apps", dst_workload="server-1", dst_namespace="apps")]
    rates = [
        EdgeRate("wl:apps/client", "wl:apps/server", 0.0, 0.0, 512.0, 2.0, "mutual_tls"),
        EdgeRate("wl:apps/other", "svc:db.apps.svc.cluster.local", 4.0, 1.0, 0.0, 0.0, "none"),
    ]
    graph = graph_to_json(build_graph(flows, inventory, now=NOW, rates=rates))
    edges = {(e["src"], e["dst"]): e for e in graph["edges"]}
    assert edges["wl:apps/client-7f9c", "wl:apps/server-1"]["rate"] is None
    # The client's owner has one pod: that pod's node; the server's has two: the owner's own node.
    joined = edges["wl:apps/client-7f9c", "wl:apps/server"]
    assert joined["flows"] == 0 and joined["rate"]["bytesPerSecond"] == 512.0 and joined["rate"]["mtls"] is True
    other = edges["wl:apps/other", "svc:db.apps.svc.cluster.local"]["rate"]
    assert other["errorRatio"] == 0.25 and other["mtls"] is False
    nodes = {n["id"]: n for n in graph["nodes"]}
    assert nodes["wl:apps/server"]["known"] is False and nodes["wl:apps/other"]["known"] is False
