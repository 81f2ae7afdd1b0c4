"""NetworkPolicy rules: the semantics of rendered tables (table-driven, judged by a small reader of the script),
golden files, hostile objects, fuzzing, the PolicyAgent loop against an in-process API server, and (root) the
kernel's verdict on the rendered scripts.

Golden files live in ``golden/lab_network_policies/<case>.nft``; ``AMBIT_UPDATE_GOLDEN=1 pytest ...`` rewrites them.
"""

from __future__ import annotations

import asyncio
import ipaddress
import json
import os
import re
import shutil
import subprocess
from collections.abc import AsyncIterator, Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st
from json_strategies import json_values, perturbed

from ambit.apiserver.defaults import apply_defaults
from ambit.apiserver.server import ApiServer, ApiServerSettings
from ambit.apiserver.validation import validate_object
from ambit.commands import Call, CommandResult, RecordingRunner
from ambit.k8s import InformerSettings, KubeClient, kinds
from ambit.lab.network.policies import RenderedPolicies, render_policy_rules
from ambit.lab.network.policies_apply import (
    PolicyAgent,
    PolicyAgentSettings,
    PolicyRulesError,
    apply_policy_rules,
    node_sources,
    remove_policy_rules,
)
from ambit.lab.network.topology import NodeAddresses

GOLDEN = Path(__file__).parent / "golden" / "lab_network_policies"
NODE = "node-1"
SOURCES = ("198.18.0.11", "198.18.1.1", "169.254.7.127")
NS = "default"

# -- object builders ---------------------------------------------------------------------------------------------


def pod(
    name: str,
    ip: str | list[str] | None,
    labels: dict[str, str] | None = None,
    *,
    node: str = NODE,
    ns: str = NS,
    ports: tuple[tuple[str, int, str], ...] = (),
    phase: str = "Running",
    host_network: bool = False,
) -> Any:
    ips = [ip] if isinstance(ip, str) else (ip or [])
    container: dict[str, Any] = {"name": "c", "image": "i"}
    if ports:
        container["ports"] = [{"name": n, "containerPort": p, "protocol": proto} for n, p, proto in ports]
    spec: dict[str, Any] = {"nodeName": node, "containers": [container]}
    if host_network:
        spec["hostNetwork"] = True
    status: dict[str, Any] = {"phase": phase}
    if ips:
        status["podIP"] = ips[0]
        status["podIPs"] = [{"ip": i} for i in ips]
    return {"metadata": {"namespace": ns, "name": name, "labels": labels or {}}, "spec": spec, "status": status}


def policy(
    name: str,
    selector: dict[str, Any] | None = None,
    *,
    ingress: list[Any] | None = None,
    egress: list[Any] | None = None,
    types: list[str] | None = None,
    ns: str = NS,
) -> Any:
    spec: dict[str, Any] = {"podSelector": selector if selector is not None else {}}
    if ingress is not None:
        spec["ingress"] = ingress
    if egress is not None:
        spec["egress"] = egress
    if types is not None:
        spec["policyTypes"] = types
    return {"metadata": {"namespace": ns, "name": name}, "spec": spec}


def namespace(name: str, **labels: str) -> Any:
    return {"metadata": {"name": name, "labels": labels}}


def app(name: str) -> dict[str, Any]:
    return {"matchLabels": {"app": name}}


def render(policies: list[Any], pods: list[Any], namespaces: list[Any] | None = None) -> RenderedPolicies:
    return render_policy_rules(policies, pods, namespaces or [], node_name=NODE, node_sources=SOURCES)


# -- reading a rendered table back: the verdict for one packet ---------------------------------------------------

_MATCH = re.compile(r"(ip6?) (saddr|daddr)( \. meta l4proto \. th dport)? @(\S+)")


@dataclass(frozen=True)
class Packet:
    src: str
    dst: str
    proto: str = "tcp"
    port: int = 80
    established: bool = False
    mark: int = 0
    dnat: bool = False


class Table:
    """The sets and chains of a rendered script, and what its ``forward`` chain does with one packet."""

    def __init__(self, script: str) -> None:
        self.sets: dict[str, list[str]] = {}
        self.chains: dict[str, list[str]] = {}
        current: list[str] | None = None
        for line in script.splitlines():
            head = re.fullmatch(r"\t(set|chain) (\S+) \{", line)
            if head:
                current = (self.sets if head.group(1) == "set" else self.chains).setdefault(head.group(2), [])
            elif line.startswith("\t\t\t") and current is not None:
                current.append(line.strip().rstrip(","))
            elif line.startswith("\t\t") and current is not None:
                if not line.strip().startswith(("type ", "flags ", "elements ", "}")):
                    current.append(line.strip())
            elif line == "\t}":
                current = None

    def verdict(self, packet: Packet) -> str:
        return self._run("forward", packet) or "accept"

    def _run(self, chain: str, packet: Packet) -> str | None:
        for rule in self.chains[chain]:
            action = self._rule(rule, packet)
            if action is None:
                continue
            if action == "return":
                return None
            if action.startswith(("jump ", "goto ")):
                result = self._run(action.split()[1], packet)
                if result is not None or action.startswith("goto "):
                    return result
                continue
            return action
        return None

    def _rule(self, rule: str, packet: Packet) -> str | None:
        """The rule's action when it matches ``packet``, else None."""
        if rule.startswith("ct state established,related "):
            return "accept" if packet.established else None
        if rule.startswith("meta mark & 0x4000 == 0x4000 "):
            return "accept" if packet.mark & 0x4000 else None
        if rule.startswith("ct status dnat "):
            return "drop" if packet.dnat else None
        if rule.startswith("meta l4proto tcp reject"):
            return "refuse" if packet.proto == "tcp" else None
        if rule.startswith("reject"):
            return "refuse"
        action = rule
        for m in _MATCH.finditer(rule):
            family, field, with_port, name = m.groups()
            address = ipaddress.ip_address(packet.src if field == "saddr" else packet.dst)
            if address.version != (6 if family == "ip6" else 4):
                return None
            if not any(_element_matches(e, address, packet, bool(with_port)) for e in self.sets[name]):
                return None
            action = action.replace(m.group(0), "")
        return action.strip()


def _element_matches(element: str, address: Any, packet: Packet, with_port: bool) -> bool:
    parts = element.split(" . ")
    if address not in ipaddress.ip_network(parts[0]):
        return False
    if not with_port:
        return True
    first, _, last = parts[2].partition("-")
    return parts[1] == packet.proto and int(first) <= packet.port <= int(last or first)


def verdicts(rendered: RenderedPolicies, *packets: Packet) -> list[str]:
    table = Table(rendered.script)
    return [table.verdict(p) for p in packets]


SERVER = pod("httpbin", "198.18.1.5", {"app": "httpbin"}, ports=(("http", 8080, "TCP"),))
CLIENT = pod("client", "198.18.2.7", {"app": "client"}, node="node-2")
LOCAL_CLIENT = pod("sleep", "198.18.1.9", {"app": "sleep"})
OTHER_NS = pod("other", "198.18.2.8", {"app": "client"}, node="node-2", ns="other")
ONLY_HBONE = policy("only-hbone", app("httpbin"), ingress=[{"ports": [{"protocol": "TCP", "port": 15008}]}])
PODS = [SERVER, CLIENT, LOCAL_CLIENT, OTHER_NS]


def to_server(port: int = 8080, src: str = "198.18.2.7", proto: str = "tcp", **kw: Any) -> Packet:
    return Packet(src, "198.18.1.5", proto, port, **kw)


# -- semantics ---------------------------------------------------------------------------------------------------


def test_without_policies_every_packet_passes() -> None:
    assert verdicts(render([], PODS), to_server(), Packet("198.18.1.5", "198.18.2.7")) == ["accept", "accept"]


def test_only_hbone_isolates_the_server_for_ingress_and_allows_15008_from_anyone() -> None:
    rendered = render([ONLY_HBONE], PODS)
    assert verdicts(
        rendered,
        to_server(15008),
        to_server(15008, src="198.18.1.9"),
        to_server(8080),
        to_server(8080, src="198.18.1.9"),
        to_server(15008, proto="udp"),
    ) == ["accept", "accept", "refuse", "refuse", "refuse"]
    # the server's own egress, and other pods' ingress, are not isolated
    assert verdicts(rendered, Packet("198.18.1.5", "198.18.2.7", port=9), Packet("198.18.2.7", "198.18.1.9")) == [
        "accept",
        "accept",
    ]
    assert (rendered.policies, rendered.isolated, rendered.skipped) == (1, 1, [])


def test_replies_node_traffic_and_a_pod_reaching_itself_through_a_service_always_pass() -> None:
    rendered = render([policy("deny", {}, ingress=[], egress=[], types=["Ingress", "Egress"])], PODS)
    assert verdicts(
        rendered,
        to_server(8080),
        to_server(8080, established=True),
        to_server(8080, src="198.18.0.11"),
        to_server(8080, src="198.18.1.1"),
        to_server(8080, src="169.254.7.127"),
        Packet("198.18.1.5", "198.18.1.5", mark=0x4000),
        Packet("198.18.1.5", "198.18.2.7"),
        Packet("198.18.1.5", "198.18.2.7", established=True),
    ) == ["refuse", "accept", "accept", "accept", "accept", "accept", "refuse", "accept"]


def test_refused_packets_are_answered_unless_they_came_through_a_service() -> None:
    rendered = render([ONLY_HBONE], PODS)
    assert verdicts(rendered, to_server(8080), to_server(8080, dnat=True), to_server(15008, dnat=True)) == [
        "refuse",
        "drop",
        "accept",
    ]


def test_policies_of_one_direction_leave_the_other_open() -> None:
    egress_only = policy("egress", app("httpbin"), egress=[], types=["Egress"])
    rendered = render([egress_only], PODS)
    assert verdicts(rendered, to_server(8080), Packet("198.18.1.5", "198.18.2.7")) == ["accept", "refuse"]


def test_policy_types_default_as_kube_defaults_them() -> None:
    # no policyTypes, egress rules given: both directions
    both = policy("both", app("httpbin"), egress=[{"ports": [{"port": 53, "protocol": "UDP"}]}])
    rendered = render([both], PODS)
    assert verdicts(
        rendered, to_server(8080), Packet("198.18.1.5", "198.18.2.7", "udp", 53), Packet("198.18.1.5", "198.18.2.7")
    ) == ["refuse", "accept", "refuse"]


def test_the_union_of_every_selecting_policy_is_allowed() -> None:
    web = policy("web", app("httpbin"), ingress=[{"ports": [{"port": 8080}]}])
    rendered = render([ONLY_HBONE, web], PODS)
    assert verdicts(rendered, to_server(15008), to_server(8080), to_server(9090)) == ["accept", "accept", "refuse"]


@pytest.mark.parametrize(
    ("peer", "namespaces", "allowed"),
    [
        # podSelector alone: matching pods of the policy's namespace
        ({"podSelector": app("client")}, [], {"198.18.2.7"}),
        # namespaceSelector alone: every pod of the chosen namespaces
        ({"namespaceSelector": {"matchLabels": {"team": "x"}}}, [namespace("other", team="x")], {"198.18.2.8"}),
        # the name label the API server sets on every namespace
        ({"namespaceSelector": {"matchLabels": {"kubernetes.io/metadata.name": "other"}}}, [], {"198.18.2.8"}),
        # both: the chosen pods of the chosen namespaces
        (
            {"namespaceSelector": {}, "podSelector": app("client")},
            [namespace("other"), namespace(NS)],
            {"198.18.2.7", "198.18.2.8"},
        ),
        ({"namespaceSelector": {}, "podSelector": app("sleep")}, [], {"198.18.1.9"}),
        # ipBlock minus its except blocks, pods or not
        (
            {"ipBlock": {"cidr": "198.18.2.0/24", "except": ["198.18.2.8/31"]}},
            [],
            {"198.18.2.7", "198.18.2.100"},
        ),
        ({"ipBlock": {"cidr": "198.18.2.7/16"}}, [], {"198.18.2.7", "198.18.2.8", "198.18.1.9", "198.18.2.100"}),
    ],
)
def test_every_kind_of_ingress_peer(peer: dict[str, Any], namespaces: list[Any], allowed: set[str]) -> None:
    rendered = render([policy("p", app("httpbin"), ingress=[{"from": [peer]}])], PODS, namespaces)
    sources = ["198.18.2.7", "198.18.2.8", "198.18.1.9", "198.18.2.100"]
    got = dict(zip(sources, verdicts(rendered, *(to_server(80, src=s) for s in sources)), strict=True))
    assert {s for s, v in got.items() if v == "accept"} == allowed


def test_named_ingress_ports_resolve_on_each_selected_pod() -> None:
    second = pod("httpbin-2", "198.18.1.6", {"app": "httpbin"}, ports=(("http", 9090, "TCP"), ("dns", 53, "UDP")))
    named = policy("named", app("httpbin"), ingress=[{"ports": [{"port": "http"}, {"port": "dns", "protocol": "UDP"}]}])
    rendered = render([named], [*PODS, second])
    assert verdicts(
        rendered,
        to_server(8080),
        to_server(9090),
        Packet("198.18.2.7", "198.18.1.6", port=9090),
        Packet("198.18.2.7", "198.18.1.6", port=8080),
        Packet("198.18.2.7", "198.18.1.6", "udp", 53),
        Packet("198.18.2.7", "198.18.1.6", "tcp", 53),
    ) == ["accept", "refuse", "accept", "refuse", "accept", "refuse"]


def test_named_egress_ports_resolve_on_the_peer_pod_and_never_on_an_ip_block() -> None:
    peer = pod("db", "198.18.2.20", {"app": "db"}, node="node-2", ports=(("sql", 5432, "TCP"),))
    rule = {"to": [{"podSelector": app("db")}, {"ipBlock": {"cidr": "10.0.0.0/8"}}], "ports": [{"port": "sql"}]}
    rendered = render([policy("e", app("sleep"), egress=[rule], types=["Egress"])], [*PODS, peer])
    assert verdicts(
        rendered,
        Packet("198.18.1.9", "198.18.2.20", port=5432),
        Packet("198.18.1.9", "198.18.2.20", port=80),
        Packet("198.18.1.9", "10.1.2.3", port=5432),
    ) == ["accept", "refuse", "refuse"]
    # with no "to", a named port matches every pod that has it
    anywhere = policy("e", app("sleep"), egress=[{"ports": [{"port": "sql"}, {"port": 443}]}], types=["Egress"])
    assert verdicts(
        render([anywhere], [*PODS, peer]),
        Packet("198.18.1.9", "198.18.2.20", port=5432),
        Packet("198.18.1.9", "198.18.2.21", port=5432),
        Packet("198.18.1.9", "203.0.113.9", port=443),
    ) == ["accept", "refuse", "accept"]


def test_port_ranges_protocols_and_all_ports_of_a_protocol() -> None:
    ports = [{"port": 9000, "endPort": 9010}, {"protocol": "UDP"}, {"protocol": "SCTP", "port": 7}]
    rendered = render([policy("r", app("httpbin"), ingress=[{"ports": ports}])], PODS)
    assert verdicts(
        rendered,
        to_server(9000),
        to_server(9010),
        to_server(9011),
        to_server(1, proto="udp"),
        to_server(65535, proto="udp"),
        to_server(7, proto="sctp"),
        to_server(7),
    ) == ["accept", "accept", "refuse", "accept", "accept", "accept", "refuse"]


def test_an_egress_rule_needs_both_its_peer_and_its_port() -> None:
    rule = {"to": [{"ipBlock": {"cidr": "198.18.2.0/24"}}, {"podSelector": app("httpbin")}], "ports": [{"port": 80}]}
    rendered = render([policy("e", app("sleep"), egress=[rule])], PODS)
    assert verdicts(
        rendered,
        Packet("198.18.1.9", "198.18.2.7", port=80),
        Packet("198.18.1.9", "198.18.1.5", port=80),
        Packet("198.18.1.9", "198.18.2.7", port=81),
        Packet("198.18.1.9", "198.18.3.7", port=80),
    ) == ["accept", "accept", "refuse", "refuse"]


def test_only_this_nodes_pods_are_judged_here() -> None:
    remote = policy("remote", app("client"), ingress=[], egress=[], types=["Ingress", "Egress"])
    rendered = render([remote], PODS)
    assert verdicts(rendered, Packet("198.18.2.7", "198.18.1.5"), Packet("198.18.1.5", "198.18.2.7")) == [
        "accept",
        "accept",
    ]
    assert (rendered.policies, rendered.isolated) == (0, 0)


def test_host_network_pods_finished_pods_and_pods_without_an_address_are_left_out() -> None:
    pods = [
        pod("host", "198.18.0.11", {"app": "httpbin"}, host_network=True),
        pod("done", "198.18.1.20", {"app": "httpbin"}, phase="Succeeded"),
        pod("new", None, {"app": "httpbin"}),
        pod("peer", "198.18.0.12", {"app": "client"}, host_network=True, node="node-2"),
    ]
    deny = policy("deny", app("httpbin"), ingress=[{"from": [{"podSelector": app("client")}]}])
    rendered = render([deny], pods)
    assert (rendered.policies, rendered.isolated, rendered.skipped) == (0, 0, [])
    assert "198.18.1.20" not in rendered.script and "198.18.0.12" not in rendered.script


def test_dual_stack_pods_are_judged_in_both_families() -> None:
    server = pod("httpbin", ["198.18.1.5", "fd00:ab:0:1::5"], {"app": "httpbin"})
    client = pod("client", ["198.18.2.7", "fd00:ab:0:2::7"], {"app": "client"}, node="node-2")
    rule = {"from": [{"podSelector": app("client")}], "ports": [{"port": 8080}]}
    rendered = render_policy_rules(
        [policy("p", app("httpbin"), ingress=[rule])],
        [server, client],
        [],
        node_name=NODE,
        node_sources=(*SOURCES, "fd00:ab::b", "fd00:ab:0:1::1"),
    )
    assert verdicts(
        rendered,
        Packet("fd00:ab:0:2::7", "fd00:ab:0:1::5", port=8080),
        Packet("fd00:ab:0:2::8", "fd00:ab:0:1::5", port=8080),
        Packet("fd00:ab:0:2::7", "fd00:ab:0:1::5", port=22),
        Packet("fd00:ab:0:1::1", "fd00:ab:0:1::5", port=22),
        to_server(8080),
    ) == ["accept", "refuse", "refuse", "accept", "accept"]


def test_nested_blocks_with_different_ports_give_disjoint_elements() -> None:
    rule = {
        "to": [{"ipBlock": {"cidr": "198.18.0.0/16"}}, {"podSelector": app("httpbin")}],
        "ports": [{"port": 53, "protocol": "UDP"}, {"port": "http"}, {"port": 80, "endPort": 90}],
    }
    rendered = render([policy("e", {}, egress=[rule], types=["Egress"])], PODS)
    elements = Table(rendered.script).sets["p0-eg0-dst4"]
    assert elements == ["198.18.0.0/16 . tcp . 80-90", "198.18.0.0/16 . udp . 53", "198.18.1.5/32 . tcp . 8080"]
    assert verdicts(
        rendered,
        Packet("198.18.1.9", "198.18.1.5", port=8080),
        Packet("198.18.1.9", "198.18.1.6", port=8080),
        Packet("198.18.1.9", "198.18.1.6", port=85),
    ) == ["accept", "refuse", "accept"]


# -- hostile and malformed objects -------------------------------------------------------------------------------


@pytest.mark.parametrize(
    ("obj", "reason"),
    [
        ("nonsense", "NetworkPolicy (no metadata): 'nonsense' is not an object"),
        (policy("x", {"matchLabels": "a"}), "NetworkPolicy default/x: spec.podSelector is not a label selector"),
        (policy("x", {}, types=["Sideways"]), "NetworkPolicy default/x: spec.policyTypes ['Sideways'] is not a list"),
        ({"metadata": {"namespace": "a b", "name": "x"}, "spec": {}}, "metadata.namespace 'a b' is not a DNS label"),
        ({"metadata": {"namespace": NS, "name": "x;flush ruleset"}, "spec": {}}, "is not a DNS subdomain"),
    ],
)
def test_unreadable_policies_are_left_out_with_a_reason(obj: Any, reason: str) -> None:
    rendered = render([obj, ONLY_HBONE], PODS)
    assert any(reason in line for line in rendered.skipped), rendered.skipped
    assert verdicts(rendered, to_server(8080)) == ["refuse"]


@pytest.mark.parametrize(
    ("rule", "reason"),
    [
        ({"ports": [{"port": 0}]}, "spec.ingress[0]: ports[0]: port 0 is not a port number"),
        ({"ports": [{"port": "a b"}]}, "ports[0]: port 'a b' is not a port name"),
        ({"ports": [{"port": 80, "endPort": 70}]}, "endPort 70 is below port 80"),
        ({"ports": [{"port": "http", "endPort": 90}]}, "endPort with a named port"),
        ({"ports": [{"protocol": "ICMP"}]}, "protocol 'ICMP' is not TCP, UDP or SCTP"),
        ({"from": [{}]}, "from[0]: names no peer"),
        ({"from": [{"ipBlock": {"cidr": "10.0.0.0/8"}, "podSelector": {}}]}, "ipBlock with another peer"),
        ({"from": [{"ipBlock": {"cidr": "10.0.0.0/33"}}]}, "ipBlock.cidr '10.0.0.0/33' is not a CIDR"),
        ({"from": [{"ipBlock": {"cidr": "10.0.0.0/8", "except": ["11.0.0.0/8"]}}]}, "is not a CIDR strictly inside"),
        ({"from": [{"ipBlock": {"cidr": "10.0.0.0/8", "except": ["10.0.0.0/8"]}}]}, "is not a CIDR strictly inside"),
        ({"from": "everyone"}, "from 'everyone' is not a list"),
    ],
)
def test_a_malformed_rule_allows_nothing_but_its_policy_still_isolates(rule: Any, reason: str) -> None:
    rendered = render([policy("bad", app("httpbin"), ingress=[rule, {"ports": [{"port": 15008}]}])], PODS)
    assert len(rendered.skipped) == 1 and reason in rendered.skipped[0], rendered.skipped
    assert rendered.skipped[0].endswith("the rule allows nothing")
    assert verdicts(rendered, to_server(8080), to_server(15008)) == ["refuse", "accept"]


def test_malformed_pods_duplicate_addresses_and_duplicate_policies_are_reported() -> None:
    twin = pod("twin", "198.18.1.5", {"app": "httpbin"})
    broken = pod("broken", "not-an-ip", {"app": "httpbin"})
    rendered = render([ONLY_HBONE, ONLY_HBONE], [SERVER, twin, broken])
    assert rendered.skipped == [
        "Pod default/broken: status.podIPs holds 'not-an-ip', not an IP address",
        "Pod default/twin: 198.18.1.5 is also default/httpbin's; left out",
        "NetworkPolicy default/only-hbone: listed twice; the first one is used",
    ]


def test_a_malformed_namespace_is_reported_and_its_pods_keep_the_name_label() -> None:
    peer = {"namespaceSelector": {"matchLabels": {"kubernetes.io/metadata.name": "other"}}}
    rendered = render([policy("p", app("httpbin"), ingress=[{"from": [peer]}])], PODS, [{"metadata": {"name": 7}}])
    assert rendered.skipped == ["Namespace 7: metadata.name 7 is not a DNS label"]
    assert verdicts(rendered, to_server(80, src="198.18.2.8"), to_server(80)) == ["accept", "refuse"]


def test_the_node_settings_are_checked_at_once() -> None:
    with pytest.raises(ValueError):
        render_policy_rules([], [], [], node_name=NODE, node_sources=["not-an-address"])


def test_node_sources_cover_both_families_of_a_dual_stack_node() -> None:
    single = NodeAddresses("node-1", 1, "198.18.0.11", "198.18.1.0/24", "198.18.1.1", "ab-node-1", "ab-n1")
    assert node_sources(single) == ("198.18.0.11", "198.18.1.1", "169.254.7.127")
    dual = NodeAddresses(
        "node-1", 1, "198.18.0.11", "198.18.1.0/24", "198.18.1.1", "ab-node-1", "ab-n1", "fd00:ab::b",
        "fd00:ab:0:1::/64", "fd00:ab:0:1::1",
    )  # fmt: skip
    assert node_sources(dual)[3:] == ("fd00:ab::b", "fd00:ab:0:1::1", "fd16:9254:7127:1337:ffff:ffff:ffff:ffff")


# -- golden files ------------------------------------------------------------------------------------------------

CASES: dict[str, tuple[list[Any], list[Any], list[Any]]] = {
    "only_hbone": ([ONLY_HBONE], PODS, []),
    "peers_and_ports": (
        [
            policy(
                "web",
                app("httpbin"),
                ingress=[
                    {
                        "from": [
                            {"podSelector": app("client")},
                            {"namespaceSelector": {"matchLabels": {"team": "x"}}, "podSelector": app("client")},
                            {"ipBlock": {"cidr": "198.18.0.0/16", "except": ["198.18.3.0/24"]}},
                        ],
                        "ports": [{"port": "http"}, {"port": 9000, "endPort": 9010}, {"protocol": "UDP"}],
                    }
                ],
            ),
            policy(
                "egress",
                {},
                egress=[{"to": [{"podSelector": {}}], "ports": [{"port": 53, "protocol": "UDP"}]}, {"ports": []}],
                types=["Egress"],
            ),
        ],
        PODS,
        [namespace("other", team="x"), namespace(NS)],
    ),
    "deny_all": ([policy("deny", {}, types=["Ingress", "Egress"])], PODS, []),
}


def render_case(name: str) -> RenderedPolicies:
    policies, pods, namespaces = CASES[name]
    return render(policies, pods, namespaces)


@pytest.mark.parametrize("case", sorted(CASES))
def test_golden_scripts(case: str) -> None:
    rendered = render_case(case)
    path = GOLDEN / f"{case}.nft"
    if os.environ.get("AMBIT_UPDATE_GOLDEN"):
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_text(rendered.script)
    assert rendered.script == path.read_text(), f"{path} differs (AMBIT_UPDATE_GOLDEN=1 rewrites it)"
    assert rendered.skipped == []


def test_rendering_is_stable_whatever_the_input_order() -> None:
    policies, pods, namespaces = CASES["peers_and_ports"]
    forward = render(policies, pods, namespaces).script
    assert render(policies[::-1], pods[::-1], namespaces[::-1]).script == forward


# -- fuzzing -----------------------------------------------------------------------------------------------------


def near_valid_policies() -> st.SearchStrategy[Any]:
    selector = st.sampled_from([{}, app("httpbin"), {"matchExpressions": [{"key": "app", "operator": "Exists"}]}])
    port = st.fixed_dictionaries(
        {},
        optional={
            "port": st.sampled_from([80, 8080, "http", 15008]),
            "endPort": st.sampled_from([90, 8090]),
            "protocol": st.sampled_from(["TCP", "UDP", "SCTP"]),
        },
    )
    peer = st.one_of(
        st.fixed_dictionaries({}, optional={"podSelector": selector, "namespaceSelector": selector}),
        st.fixed_dictionaries(
            {"ipBlock": st.fixed_dictionaries({"cidr": st.sampled_from(["198.18.0.0/16", "198.18.1.5/32", "::/0"])})}
        ),
    )
    rule = st.fixed_dictionaries({}, optional={"ports": st.lists(port, max_size=3), "from": st.lists(peer, max_size=3)})
    egress = st.fixed_dictionaries({}, optional={"ports": st.lists(port, max_size=3), "to": st.lists(peer, max_size=3)})
    spec = st.fixed_dictionaries(
        {"podSelector": selector},
        optional={
            "ingress": st.lists(rule, max_size=2),
            "egress": st.lists(egress, max_size=2),
            "policyTypes": st.sampled_from([["Ingress"], ["Egress"], ["Ingress", "Egress"]]),
        },
    )
    meta = st.fixed_dictionaries({"namespace": st.sampled_from([NS, "other"]), "name": st.sampled_from(["a", "b"])})
    return perturbed(st.fixed_dictionaries({"metadata": meta, "spec": spec}))


_SAFE_LINE = re.compile(r"[-\t a-z0-9_.:/@{},;=&|]*")


def assert_safe(script: str) -> None:
    """Every line that nft reads (not a ``#`` comment) holds only the characters the renderer writes."""
    for line in script.splitlines():
        if line.startswith("# "):
            assert re.fullmatch(r"# [^\n]*", line) and len(line) < 400, line
            continue
        assert _SAFE_LINE.fullmatch(line), line


@settings(max_examples=150, deadline=None)
@given(st.lists(near_valid_policies(), max_size=4), st.lists(json_values(max_leaves=8), max_size=2))
def test_any_policy_object_gives_a_script_or_reasons_never_an_exception(policies: list[Any], junk: list[Any]) -> None:
    rendered = render([*policies, *junk], [*PODS, *junk], junk)
    assert rendered.script.endswith("}\n")
    assert_safe(rendered.script)


@settings(max_examples=100, deadline=None)
@given(st.text(max_size=40), st.text(max_size=40), st.text(max_size=20))
def test_names_labels_and_ports_cannot_inject_syntax(name: str, label: str, port_name: str) -> None:
    hostile = policy(name, {"matchLabels": {"app": label}}, ingress=[{"ports": [{"port": port_name}]}], ns=name)
    target = pod(name, "198.18.1.5", {"app": label}, ns=name, ports=((port_name, 80, "TCP"),))
    rendered = render([hostile], [target], [namespace(name)])
    assert_safe(rendered.script)


@settings(max_examples=200, deadline=None)
@given(near_valid_policies())
def test_what_the_api_server_accepts_the_renderer_reads_without_a_reason(obj: Any) -> None:
    copy = json.loads(json.dumps(obj))
    if isinstance(copy, dict):
        apply_defaults("networking.k8s.io", "NetworkPolicy", copy)  # never raises, whatever the shape
        if isinstance(copy.get("metadata"), dict) and not copy["metadata"].get("namespace"):
            copy["metadata"]["namespace"] = NS  # the server stores the request's namespace
    causes = validate_object("NetworkPolicy", "networking.k8s.io", copy)
    rendered = render([copy], PODS)
    if not causes:
        assert rendered.skipped == [], rendered.skipped


# -- applying, and the agent loop --------------------------------------------------------------------------------


class Answers:
    """A :class:`RecordingRunner` responder: answers from a queue of (rc, stdout, stderr), success when it is empty."""

    def __init__(self, *answers: tuple[int, bytes, bytes]) -> None:
        self.queue = list(answers)

    def __call__(self, call: Call) -> CommandResult | None:
        if not self.queue:
            return None
        rc, out, err = self.queue.pop(0)
        return CommandResult(call.argv, rc, out, err)


async def test_apply_and_remove_run_nft_in_the_namespace_and_report_failures() -> None:
    runner = RecordingRunner(respond=Answers((0, b"", b""), (1, b"", b"Error: boom")))
    await apply_policy_rules("ab-node-1", "table inet x {}\n", runner)
    with pytest.raises(PolicyRulesError, match="boom"):
        await remove_policy_rules("", runner)
    assert [c.argv for c in runner.calls] == [
        ("ip", "netns", "exec", "ab-node-1", "nft", "-f", "-"),
        ("nft", "-f", "-"),
    ]
    assert runner.calls[1].stdin == b"add table inet ambit-lab-netpol\ndelete table inet ambit-lab-netpol\n"
    gone = RecordingRunner(respond=Answers((1, b"", b"Cannot open network namespace")))
    await remove_policy_rules("ab-node-9", gone)  # already gone: removed


FAST = PolicyAgentSettings(
    debounce=0.02,
    retry_initial=0.02,
    retry_max=0.05,
    informer=InformerSettings(backoff_initial=0.02, backoff_max=0.1, watch_timeout=30),
)


@pytest.fixture
async def kube(tmp_path: Path) -> AsyncIterator[KubeClient]:
    async with (
        ApiServer(ApiServerSettings(data_dir=tmp_path / "api", port=0, crd_dir=None)) as server,
        KubeClient.from_kubeconfig(server.kubeconfig) as client,
    ):
        yield client


async def eventually(predicate: Callable[[], bool]) -> None:
    async with asyncio.timeout(5):
        while not predicate():  # noqa: ASYNC110 (the agent's task signals no one: poll it)
            await asyncio.sleep(0.01)


async def test_the_agent_follows_policies_and_pods_and_skips_unchanged_scripts(kube: KubeClient) -> None:
    runner = RecordingRunner(respond=Answers())
    agent = PolicyAgent(kube, netns="", node_name=NODE, node_sources=SOURCES, runner=runner, settings=FAST)
    server = pod("httpbin", None, {"app": "httpbin"})
    await kube.create(kinds.PODS, server)
    async with agent:
        assert agent.stats.applies == 1 and "198.18.1.5" not in (agent.applied_script or "")
        await kube.create(kinds.NETWORK_POLICIES, ONLY_HBONE)
        await eventually(lambda: agent.stats.renders >= 2)
        assert agent.rendered is not None and agent.rendered.policies == 0  # the pod has no address yet
        status = {"phase": "Running", "podIP": "198.18.1.5", "podIPs": [{"ip": "198.18.1.5"}]}
        await kube.patch_status(kinds.PODS, "httpbin", {"status": status}, namespace=NS)
        await eventually(lambda: "198.18.1.5" in (agent.applied_script or ""))
        applies = agent.stats.applies
        await kube.patch(kinds.PODS, "httpbin", {"metadata": {"annotations": {"a": "b"}}}, namespace=NS)
        await eventually(lambda: agent.stats.unchanged >= 1)
        assert agent.stats.applies == applies
        await kube.delete(kinds.NETWORK_POLICIES, "only-hbone", namespace=NS)
        await eventually(lambda: "198.18.1.5" not in (agent.applied_script or "x"))
    assert runner.calls[-1].stdin == b"add table inet ambit-lab-netpol\ndelete table inet ambit-lab-netpol\n"


async def test_a_failed_apply_is_retried_with_the_same_script(kube: KubeClient) -> None:
    runner = RecordingRunner(respond=Answers())
    agent = PolicyAgent(kube, netns="", node_name=NODE, node_sources=SOURCES, runner=runner, settings=FAST)
    await kube.create(kinds.PODS, pod("httpbin", None, {"app": "httpbin"}))
    status = {"phase": "Running", "podIP": "198.18.1.5", "podIPs": [{"ip": "198.18.1.5"}]}
    await kube.patch_status(kinds.PODS, "httpbin", {"status": status}, namespace=NS)
    async with agent:
        runner.respond = Answers((1, b"", b"Error: transient"))
        await kube.create(kinds.NETWORK_POLICIES, ONLY_HBONE)
        await eventually(lambda: agent.stats.failures == 1 and agent.stats.applies == 2)
        assert runner.calls[-1].stdin == runner.calls[-2].stdin


# -- the kernel's verdict (root) ---------------------------------------------------------------------------------

needs_nft = pytest.mark.skipif(
    os.geteuid() != 0 or shutil.which("nft") is None or shutil.which("unshare") is None,
    reason="needs root, nft and unshare",
)


def nft_in_throwaway_netns(command: str, stdin: str = "") -> subprocess.CompletedProcess[str]:
    """Run a shell command in a fresh network namespace that goes away with it: nothing of the machine is touched."""
    return subprocess.run(
        ["unshare", "--net", "sh", "-c", command], input=stdin, capture_output=True, text=True, timeout=30, check=False
    )


@pytest.mark.root
@needs_nft
@pytest.mark.parametrize("case", sorted(CASES))
def test_rendered_scripts_pass_nft_check_and_load_into_a_kernel_twice(case: str, tmp_path: Path) -> None:
    script = tmp_path / "rules.nft"
    script.write_text(render_case(case).script)
    checked = nft_in_throwaway_netns(f"nft -c -f {script}")
    assert checked.returncode == 0, checked.stderr
    loaded = nft_in_throwaway_netns(f"nft -f {script} && nft -f {script} && nft list table inet ambit-lab-netpol")
    assert loaded.returncode == 0, loaded.stderr
    assert loaded.stdout.count("type filter hook forward") == 1


@pytest.mark.root
@needs_nft
@settings(max_examples=25, deadline=None)
@given(st.lists(near_valid_policies(), max_size=4))
def test_scripts_rendered_from_arbitrary_policies_load_into_a_kernel(policies: list[Any]) -> None:
    script = render(policies, PODS, [namespace("other", team="x")]).script
    loaded = nft_in_throwaway_netns("nft -f -", script)
    assert loaded.returncode == 0, loaded.stderr + script
