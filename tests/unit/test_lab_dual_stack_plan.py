"""A dual-stack lab's plan, the pure parts: the IPv6 addresses of nodes and pods, the CNI configuration with two
host-local ranges, IPv6 routes only inside node namespaces, the commands that build it (never a host-wide IPv6
setting), the Node's podCIDRs, EndpointSlices per address family and the node agent's IPv6 switch."""

from __future__ import annotations

import ipaddress
import json
from pathlib import Path
from typing import Any

import pytest
from hypothesis import given
from hypothesis import strategies as st

from ambit.cni.enrolment import pod_has_ipv6
from ambit.commands import RecordingRunner
from ambit.lab.cluster.record import Record
from ambit.lab.controllers.endpoints import PodEndpoint, endpoints_subsets, pod_endpoints, service_address_types
from ambit.lab.controllers.slicing import plan_family_slices
from ambit.lab.network.bridge import create_network, join_routes, node_conflist, node_routes
from ambit.lab.network.topology import MAX_NODES, NODE_NETWORK_V6, SERVICE_CIDR_V6, Topology
from ambit.lab.runtime.kubelet import NodeRuntimeSettings
from ambit.lab.runtime.node_status import node_manifest


def dual(tmp_path: Path, nodes: int = 3) -> Topology:
    return Topology.new(nodes, tmp_path / "lab", ip_family="dual")


@given(st.integers(1, MAX_NODES), st.integers(1, MAX_NODES))
def test_every_node_gets_its_own_ipv6_address_and_pod_range_inside_fd00_ab(a: int, b: int) -> None:
    topology = Topology("abcd", MAX_NODES, "/nonexistent", ip_family="dual")
    one, other = topology.node(a), topology.node(b)
    ula = ipaddress.ip_network("fd00:ab::/32")
    for node in (one, other):
        pods = ipaddress.ip_network(node.pod_cidr6)
        assert pods.prefixlen == 64 and pods.subnet_of(ula)  # type: ignore[arg-type]
        assert ipaddress.ip_address(node.address6) in ipaddress.ip_network(NODE_NETWORK_V6)
        assert ipaddress.ip_address(node.pod_gateway6) in pods
        assert not pods.overlaps(ipaddress.ip_network(NODE_NETWORK_V6))
        assert not pods.overlaps(ipaddress.ip_network(SERVICE_CIDR_V6))
        assert node.pod_cidrs == (node.pod_cidr, node.pod_cidr6)
    if a != b:
        assert not ipaddress.ip_network(one.pod_cidr6).overlaps(ipaddress.ip_network(other.pod_cidr6))
        assert one.address6 != other.address6


def test_an_ipv4_lab_has_no_ipv6_anywhere(tmp_path: Path) -> None:
    topology = Topology.new(2, tmp_path / "lab")
    node = topology.node(1)
    assert (node.address6, node.pod_cidr6, node.pod_gateway6) == ("", "", "")
    assert topology.service_cidrs == ("198.19.0.0/16",)
    assert all(":" not in route.dst for route in node_routes(topology, node))
    assert len(node_conflist(topology, node)["plugins"][0]["ipam"]["ranges"]) == 1


def test_the_ip_family_is_kept_in_lab_json_and_a_bad_one_is_refused(tmp_path: Path) -> None:
    topology = dual(tmp_path)
    topology.save()
    loaded = Topology.load(topology.path)
    assert loaded == topology and loaded.dual_stack
    assert loaded.service_cidrs == ("198.19.0.0/16", SERVICE_CIDR_V6)
    with pytest.raises(ValueError, match="ipv4, dual"):
        Topology.new(2, tmp_path / "other", ip_family="ipv6")
    data = json.loads((topology.path / "lab.json").read_text())
    (topology.path / "lab.json").write_text(json.dumps({**data, "ip_family": "both"}))
    assert Topology.load(topology.path) is None


def test_pods_get_two_host_local_ranges_ipv4_first_with_a_default_route_in_each_family(tmp_path: Path) -> None:
    topology = dual(tmp_path)
    ipam = node_conflist(topology, topology.node(2))["plugins"][0]["ipam"]
    assert ipam["ranges"] == [
        [{"subnet": "198.18.2.0/24", "gateway": "198.18.2.1"}],
        [{"subnet": "fd00:ab:0:2::/64", "gateway": "fd00:ab:0:2::1"}],
    ]
    assert ipam["routes"] == [{"dst": "0.0.0.0/0", "gw": "198.18.2.1"}, {"dst": "::/0", "gw": "fd00:ab:0:2::1"}]


def test_ipv6_routes_are_only_inside_node_namespaces_via_the_other_nodes(tmp_path: Path) -> None:
    topology = dual(tmp_path)
    node, others = topology.node(1), [topology.node(2), topology.node(3)]
    v6 = [route for route in node_routes(topology, node) if ":" in route.dst]
    assert all(route.namespace == node.netns and route.dev == "eth0" for route in v6)
    assert {(r.dst, r.via) for r in v6} == {
        *((o.pod_cidr6, o.address6) for o in others),
        (SERVICE_CIDR_V6, ""),
    }
    assert v6[0].argv()[:2] == ["ip", "-6"]
    joined = [route for route in join_routes(topology, node) if ":" in route.dst]
    assert {(r.namespace, r.dst, r.via) for r in joined} >= {(o.netns, node.pod_cidr6, node.address6) for o in others}
    assert all(route.namespace is not None for route in joined)


def test_building_a_dual_stack_network_sets_ipv6_only_on_lab_links_and_inside_lab_namespaces(tmp_path: Path) -> None:
    topology = dual(tmp_path, nodes=2)
    runner = RecordingRunner()
    create_network(topology, Record(topology.record_file), runner)
    sysctls = [call.argv for call in runner.calls if "sysctl" in call.argv]
    for argv in sysctls:
        in_lab_netns = argv[:3] == ("ip", "netns", "exec") and argv[3].startswith(topology.prefix)
        for setting in (a for a in argv if a.startswith("net.ipv6.")):
            # The host's own all/default settings are never written: only a lab link's, or inside a lab netns.
            assert in_lab_netns or setting.split(".")[3].startswith(topology.prefix), argv
    root_links = {topology.bridge, *(n.root_link for n in topology.all_nodes())}
    assert {f"sysctl -q -w net.ipv6.conf.{link}.disable_ipv6=1" for link in root_links} <= set(runner.commands)
    node = topology.node(1)
    assert f"ip -6 -n {node.netns} addr add {node.address6}/64 dev eth0 nodad" in runner.commands
    forwarding = [argv for argv in sysctls if "net.ipv6.conf.all.forwarding=1" in argv]
    assert [argv[3] for argv in forwarding] == [n.netns for n in topology.all_nodes()]
    assert not [c for c in runner.commands if c.startswith("ip -6 route") and " -n " not in c]


def test_the_node_registers_both_pod_ranges_and_both_internal_ips(tmp_path: Path) -> None:
    topology = dual(tmp_path, nodes=2)
    settings = NodeRuntimeSettings.for_lab(topology, "node-2")
    spec = node_manifest(settings)["spec"]
    assert spec == {"podCIDR": "198.18.2.0/24", "podCIDRs": ["198.18.2.0/24", "fd00:ab:0:2::/64"]}
    assert settings.node_ip6 == "fd00:ab::c"


# -- EndpointSlices per family --------------------------------------------------------------------------------------

SERVICE: dict[str, Any] = {
    "metadata": {"namespace": "ns", "name": "web", "uid": "svc-uid"},
    "spec": {"selector": {"app": "web"}, "ports": [{"port": 80, "targetPort": 8080}], "ipFamilies": ["IPv4", "IPv6"]},
}


def pod(name: str, *ips: str) -> dict[str, Any]:
    return {
        "metadata": {"namespace": "ns", "name": name, "uid": f"uid-{name}"},
        "spec": {"nodeName": "node-1"},
        "status": {"phase": "Running", "podIP": ips[0], "podIPs": [{"ip": ip} for ip in ips],
                   "conditions": [{"type": "Ready", "status": "True"}]},
    }  # fmt: skip


def by_family(service: dict[str, Any], pods: list[dict[str, Any]]) -> dict[str, list[PodEndpoint]]:
    return {family: pod_endpoints(service, pods, family) for family in service_address_types(service)}


def test_a_dual_stack_service_gets_one_slice_per_family_each_with_that_familys_addresses() -> None:
    pods = [pod("a", "198.18.1.5", "fd00:ab:0:1::5"), pod("b", "198.18.2.6")]
    plan = plan_family_slices(SERVICE, by_family(SERVICE, pods), [], max_per_slice=100)
    slices = {s["addressType"]: [e["addresses"] for e in s["endpoints"]] for s in plan.create}
    assert slices == {"IPv4": [["198.18.1.5"], ["198.18.2.6"]], "IPv6": [["fd00:ab:0:1::5"]]}
    assert not plan.update and not plan.delete


def legacy_ips(service: dict[str, Any], pods: list[dict[str, Any]]) -> list[str]:
    return [a["ip"] for subset in endpoints_subsets(service, pods) for a in subset.get("addresses", ())]


@pytest.mark.parametrize(
    ("spec", "primary_ip", "expected"),
    [
        # kube's endpoints controller: the family of the ClusterIP, whatever the Service's other families ...
        ({"clusterIP": "198.19.0.7", "ipFamilies": ["IPv4", "IPv6"]}, "198.18.1.5", ["198.18.1.5", "198.18.2.6"]),
        ({"clusterIP": "fd00:ab:ffff::7", "ipFamilies": ["IPv6", "IPv4"]}, "198.18.1.5", ["fd00:ab:0:1::5"]),
        # ... headless: the first of ipFamilies, else the family of each pod's primary address.
        ({"clusterIP": "None", "ipFamilies": ["IPv6"]}, "198.18.1.5", ["fd00:ab:0:1::5"]),
        ({"clusterIP": "None"}, "fd00:ab:0:1::5", ["198.18.2.6", "fd00:ab:0:1::5"]),
        ({"clusterIP": "None"}, "198.18.1.5", ["198.18.1.5", "198.18.2.6"]),
    ],
)
def test_legacy_endpoints_hold_one_family_chosen_as_kube_does(
    spec: dict[str, Any], primary_ip: str, expected: list[str]
) -> None:
    ips = ["198.18.1.5", "fd00:ab:0:1::5"]
    if primary_ip != ips[0]:
        ips.reverse()
    service = {"metadata": {"namespace": "ns", "name": "web"}, "spec": {**spec, "ports": [{"port": 80}]}}
    assert legacy_ips(service, [pod("a", *ips), pod("b", "198.18.2.6")]) == expected  # b: an IPv4-only pod


def test_a_service_downgraded_to_one_family_loses_the_other_familys_slices_without_retyping_them() -> None:
    pods = [pod("a", "198.18.1.5", "fd00:ab:0:1::5")]
    stored = [
        {**s, "metadata": {**s["metadata"], "name": f"web-{s['addressType'].lower()}", "resourceVersion": "1"}}
        for s in plan_family_slices(SERVICE, by_family(SERVICE, pods), [], max_per_slice=100).create
    ]
    single = {**SERVICE, "spec": {**SERVICE["spec"], "ipFamilies": ["IPv4"]}}
    plan = plan_family_slices(single, by_family(single, pods), stored, max_per_slice=100)
    assert [s["metadata"]["name"] for s in plan.delete] == ["web-ipv6"]
    assert not plan.create and not plan.update
    assert service_address_types({"spec": {}}) == ["IPv4"]


# -- the node agent's IPv6 switch ----------------------------------------------------------------------------------


@pytest.mark.parametrize(
    ("status", "extra", "expected"),
    [
        ({"podIPs": [{"ip": "198.18.1.5"}, {"ip": "fd00:ab:0:1::5"}]}, (), True),
        ({"podIP": "198.18.1.5", "podIPs": [{"ip": "198.18.1.5"}]}, (), False),
        ({}, ("198.18.1.5/24", "fd00:ab:0:1::5/64"), True),
        ({"podIPs": [{"ip": "not an ip"}, "x", {"ip": 7}]}, ("also-bad",), False),
    ],
)
def test_a_pod_is_redirected_in_ipv6_when_it_has_an_ipv6_address(
    status: dict[str, Any], extra: tuple[str, ...], expected: bool
) -> None:
    assert pod_has_ipv6({"status": status}, extra) is expected
