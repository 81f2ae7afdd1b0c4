"""Service rules: rendering (golden files, malformed input, fuzzing), applying through a recorded runner, the
ServiceProxy loop against an in-process API server, and (root) the kernel's verdict on the rendered scripts.

Golden files live in ``golden/lab_services/<case>.nft``; ``AMBIT_UPDATE_GOLDEN=1 pytest ...`` rewrites them.
"""

from __future__ import annotations

import asyncio
import os
import shutil
import subprocess
from collections.abc import AsyncIterator, Callable
from pathlib import Path
from typing import Any

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st
from json_strategies import json_values, perturbed

from ambit.apiserver.server import ApiServer, ApiServerSettings
from ambit.commands import Call, CommandResult, RecordingRunner
from ambit.k8s import InformerSettings, KubeClient, kinds
from ambit.lab.network import nft_tables
from ambit.lab.network.services import RenderedRules, render_service_rules
from ambit.lab.network.services_apply import (
    ServiceProxy,
    ServiceProxySettings,
    ServiceRulesError,
    apply_rules,
    bridge_netfilter_enabled,
    remove_rules,
)

GOLDEN = Path(__file__).parent / "golden" / "lab_services"
POD_CIDR = "198.18.1.0/24"
GATEWAY = "198.18.1.1"
NS = "default"


# -- object builders ---------------------------------------------------------------------------------------------


def service(name: str, cluster_ip: str | None, *ports: Any, kind: str | None = None, ns: str = NS) -> Any:
    """A Service; ``cluster_ip`` None leaves the choice to the API server."""
    spec: dict[str, Any] = {"ports": list(ports)}
    if cluster_ip is not None:
        spec["clusterIP"] = cluster_ip
    if kind is not None:
        spec["type"] = kind
    return {"apiVersion": "v1", "kind": "Service", "metadata": {"namespace": ns, "name": name}, "spec": spec}


def port(number: int, name: str | None = None, protocol: str | None = None, target: int | str | None = None) -> Any:
    out: dict[str, Any] = {"port": number}
    if name is not None:
        out["name"] = name
    if protocol is not None:
        out["protocol"] = protocol
    if target is not None:
        out["targetPort"] = target
    return out


def endpoint(ip: str, ready: bool | None = True) -> Any:
    out: dict[str, Any] = {"addresses": [ip]}
    if ready is not None:
        out["conditions"] = {"ready": ready}
    return out


def endpoint_slice(name: str, svc: str, ports: Any, endpoints: list[Any], ns: str = NS) -> Any:
    return {
        "apiVersion": "discovery.k8s.io/v1",
        "kind": "EndpointSlice",
        "metadata": {"namespace": ns, "name": name, "labels": {"kubernetes.io/service-name": svc}},
        "addressType": "IPv4",
        "ports": ports,
        "endpoints": endpoints,
    }


def render(services: list[Any], slices: list[Any], **options: Any) -> RenderedRules:
    return render_service_rules(services, slices, **{"node_pod_cidr": POD_CIDR, "node_gateway": GATEWAY, **options})


# -- golden cases ------------------------------------------------------------------------------------------------

CASES: dict[str, tuple[list[Any], list[Any]]] = {
    "clusterip": (
        [service("web", "198.19.0.10", port(80, target=8080))],
        [
            endpoint_slice(
                "web-a",
                "web",
                [{"port": 8080}],
                [endpoint("198.18.2.7"), endpoint("198.18.1.5", ready=None), endpoint("198.18.1.6", ready=False)],
            )
        ],
    ),
    "multi_port_named": (
        [
            service(
                "shop",
                "198.19.0.20",
                port(80, "http", target="web"),
                port(9090, "metrics", target="metrics"),
                kind="NodePort",
            )
        ],
        [
            # two slices whose pods serve the named port "http" on different numbers
            endpoint_slice(
                "shop-a",
                "shop",
                [{"name": "http", "port": 8080}, {"name": "metrics", "port": 9100}],
                [endpoint("198.18.1.10")],
            ),
            endpoint_slice(
                "shop-b",
                "shop",
                [{"name": "metrics", "port": 9100}, {"name": "http", "port": 8081}],
                [endpoint("198.18.3.4"), endpoint("198.18.1.10")],
            ),
        ],
    ),
    "udp": (
        [
            service(
                "dns",
                "198.19.0.53",
                port(53, "dns", "UDP"),
                port(53, "dns-tcp", "TCP"),
                kind="LoadBalancer",
                ns="kube-system",
            )
        ],
        [
            endpoint_slice(
                "dns-x",
                "dns",
                [
                    {"name": "dns", "port": 5353, "protocol": "UDP"},
                    {"name": "dns-tcp", "port": 5353, "protocol": "TCP"},
                ],
                [endpoint("198.18.1.53")],
                ns="kube-system",
            )
        ],
    ),
    "no_endpoints": (
        [
            service("nobody", "198.19.0.30", port(80), port(53, "dns", "UDP")),
            service("unready", "198.19.0.31", port(443, "https")),
        ],
        [endpoint_slice("unready-a", "unready", [{"name": "https", "port": 8443}], [endpoint("198.18.1.9", False)])],
    ),
    "not_proxied": (
        [
            service("db", "None", port(5432)),
            {
                "metadata": {"namespace": NS, "name": "ext"},
                "spec": {"type": "ExternalName", "externalName": "example.com", "ports": [{"port": 80}]},
            },
        ],
        [endpoint_slice("db-a", "db", [{"port": 5432}], [endpoint("198.18.1.7")])],
    ),
    "empty": ([], []),
    "bridge_netfilter": (
        [service("web", "198.19.0.10", port(80, target=8080))],
        [endpoint_slice("web-a", "web", [{"port": 8080}], [endpoint("198.18.2.7"), endpoint("198.18.1.5")])],
    ),
    "service_range": ([service("web", "198.19.0.10", port(80))], []),
    "load_balancer": (
        [
            service("edge", "198.19.0.40", port(8080, "http"), port(8443, "https"), kind="LoadBalancer")
            | {"status": {"loadBalancer": {"ingress": [{"ip": "198.18.0.225"}]}}}
        ],
        [
            endpoint_slice(
                "edge-a",
                "edge",
                [{"name": "http", "port": 8080}, {"name": "https", "port": 8443}],
                [endpoint("198.18.2.9")],
            )
        ],
    ),
    # A dual-stack Service's second table: its IPv6 cluster IP to the endpoints of its IPv6 slice (the IPv4 slice
    # and the IPv4-only Service belong to the other table).
    "dual_stack_v6": (
        [
            service("web", "198.19.0.10", port(80, target=8080))
            | {"spec": {"clusterIP": "198.19.0.10", "clusterIPs": ["198.19.0.10", "fd00:ab:ffff::2"],
                        "ipFamilies": ["IPv4", "IPv6"], "ports": [port(80, target=8080)]}},
            service("six", "fd00:ab:ffff::3", port(53, "dns", "UDP")),
            service("four", "198.19.0.11", port(80)),
        ],
        [
            endpoint_slice("web-v4", "web", [{"port": 8080}], [endpoint("198.18.1.5")]),
            endpoint_slice("web-v6", "web", [{"port": 8080}], [endpoint("fd00:ab:0:1::5"), endpoint("fd00:ab:0:2::7")])
            | {"addressType": "IPv6"},
        ],
    ),
}  # fmt: skip
LB_CIDR = "198.18.0.224/28"
V6 = {"family": 6, "node_pod_cidr": "fd00:ab:0:1::/64", "node_gateway": "fd00:ab:0:1::1"}
OPTIONS: dict[str, dict[str, Any]] = {
    "dual_stack_v6": {**V6, "service_cidr": "fd00:ab:ffff::/108", "bridge_netfilter": True},
    "service_range": {"service_cidr": "198.19.0.0/16"},
    "load_balancer": {"load_balancer_cidr": LB_CIDR},
    "bridge_netfilter": {"bridge_netfilter": True},
}


def render_case(name: str) -> RenderedRules:
    services, slices = CASES[name]
    return render(services, slices, **OPTIONS.get(name, {}))


def golden(name: str, script: str) -> None:
    path = GOLDEN / f"{name}.nft"
    if os.environ.get("AMBIT_UPDATE_GOLDEN"):
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_text(script)
    assert script == path.read_text(), f"{path} differs (AMBIT_UPDATE_GOLDEN=1 rewrites it)"


@pytest.mark.parametrize("case", sorted(CASES))
def test_rendered_script_matches_its_golden_file(case: str) -> None:
    rendered = render_case(case)
    golden(case, rendered.script)
    assert rendered.skipped == []


def test_clusterip_spreads_over_ready_endpoints_only() -> None:
    rendered = render(*CASES["clusterip"])
    assert (rendered.services, rendered.endpoints) == (1, 2)
    assert "198.18.1.6" not in rendered.script
    assert "numgen random mod 2 vmap" in rendered.script


def test_named_ports_resolve_per_slice_and_duplicate_endpoints_collapse() -> None:
    rendered = render(*CASES["multi_port_named"])
    # http: 198.18.1.10:8080 and :8081 (two slices say different things), 198.18.3.4:8081; metrics: 2 addresses
    assert (rendered.services, rendered.endpoints) == (1, 5)
    assert "dnat to 198.18.1.10:8080" in rendered.script
    assert "dnat to 198.18.3.4:8081" in rendered.script
    assert rendered.script.count("dnat to 198.18.1.10:9100") == 1


def test_a_service_without_ready_endpoints_is_rejected_with_a_reset_or_port_unreachable() -> None:
    rendered = render(*CASES["no_endpoints"])
    assert (rendered.services, rendered.endpoints) == (2, 0)
    assert "198.19.0.30 . tcp . 80 : goto reject-tcp" in rendered.script
    assert "198.19.0.30 . udp . 53 : goto reject-udp" in rendered.script
    assert "198.19.0.31 . tcp . 443 : goto reject-tcp" in rendered.script
    assert "meta l4proto tcp reject with tcp reset" in rendered.script
    assert "reject with icmp type port-unreachable" in rendered.script


def test_headless_and_external_name_services_are_not_proxied_and_not_reported() -> None:
    rendered = render(*CASES["not_proxied"])
    assert rendered.script == render([], []).script
    assert (rendered.services, rendered.endpoints, rendered.skipped) == (0, 0, [])


def test_output_is_independent_of_input_order() -> None:
    services = CASES["no_endpoints"][0] + CASES["multi_port_named"][0]
    slices = CASES["no_endpoints"][1] + CASES["multi_port_named"][1]
    assert render(services, slices).script == render(services[::-1], slices[::-1]).script


def test_hairpin_snat_is_limited_to_the_nodes_pod_range() -> None:
    rendered = render_service_rules([], [], node_pod_cidr="198.18.7.0/24", node_gateway="198.18.7.1")
    assert "ct status dnat ip saddr 198.18.7.0/24 ip daddr 198.18.7.0/24 snat to 198.18.7.1" in rendered.script
    assert "masquerade" not in rendered.script


def test_with_br_netfilter_only_an_endpoint_reaching_itself_is_snated() -> None:
    """The bridge un-DNATs replies itself: a pod calling a Service keeps its address (Istio's TestServices checks
    the original source); only an endpoint's connection to itself is marked and SNATed, as kube-proxy does."""
    script = render_case("bridge_netfilter").script
    assert "ip saddr 198.18.1.0/24 ip daddr 198.18.1.0/24" not in script
    assert f"meta mark & 0x4000 == 0x4000 snat to {GATEWAY}" in script
    assert "ip saddr 198.18.2.7 meta mark set meta mark | 0x4000" in script
    chain = script.split("chain endpoint-default/web/tcp/80__198.18.2.7/8080 {")[1].split("}")[0]
    assert chain.index("meta mark set") < chain.index("dnat to 198.18.2.7:8080"), chain


def test_a_load_balancer_address_is_proxied_like_the_cluster_ip_and_external_traffic_is_masqueraded() -> None:
    script = render_case("load_balancer").script
    assert "198.18.0.225 . tcp . 8080 : goto service-default/edge/tcp/8080" in script
    assert "198.19.0.40 . tcp . 8080 : goto service-default/edge/tcp/8080" in script
    assert "ct status dnat ct original ip daddr @load-balancer-ips masquerade" in script
    assert "ip daddr @load-balancer-ips reject" in script


def test_a_load_balancer_address_outside_the_lab_range_is_left_out_with_a_reason() -> None:
    hijack = service("evil", "198.19.0.41", port(6443), kind="LoadBalancer") | {
        "status": {"loadBalancer": {"ingress": [{"ip": "198.18.0.1"}, {"ip": "not-an-ip"}]}}
    }
    rendered = render([hijack], [], load_balancer_cidr=LB_CIDR)
    assert "198.18.0.1 ." not in rendered.script
    assert any("198.18.0.1 is outside 198.18.0.224/28" in reason for reason in rendered.skipped)
    assert any("not-an-ip" in reason for reason in rendered.skipped)


def test_a_cluster_ip_service_s_status_addresses_are_never_proxied() -> None:
    plain = service("plain", "198.19.0.42", port(80)) | {
        "status": {"loadBalancer": {"ingress": [{"ip": "198.18.0.226"}]}}
    }
    assert "198.18.0.226" not in render([plain], [], load_balancer_cidr=LB_CIDR).script


def test_the_service_range_catches_addresses_no_service_has_only_when_given() -> None:
    assert "ip daddr 198.19.0.0/16 reject" in render_case("service_range").script
    assert "ip daddr 198.19.0.0/16" not in render(*CASES["service_range"]).script


def test_node_settings_are_checked() -> None:
    with pytest.raises(ValueError):
        render_service_rules([], [], node_pod_cidr="198.18.1.0/33", node_gateway=GATEWAY)
    with pytest.raises(ValueError):
        render_service_rules([], [], node_pod_cidr=POD_CIDR, node_gateway="fe80::1")
    with pytest.raises(ValueError):
        render_service_rules([], [], node_pod_cidr=POD_CIDR, node_gateway=GATEWAY, service_cidr="198.19.0.1/16")


# -- malformed input ---------------------------------------------------------------------------------------------


def test_malformed_services_are_skipped_with_reasons() -> None:
    good = service("good", "198.19.0.1", port(80))
    services = [
        "not an object",
        {"metadata": {"namespace": NS, "name": "nospec"}},
        service("Bad_Name", "198.19.0.2", port(80)),
        service("bad-ip", "198.19.0.300", port(80)),
        service("six", "fd00::1", port(80)),
        service("noip", "", port(80)),
        service("noports", "198.19.0.3"),
        service("weird", "198.19.0.4", port(80), kind="Mesh"),
        service("ports", "198.19.0.5", port(0), port(80, protocol="SCTP"), "x", port(81, name=5), port(82)),  # type: ignore[arg-type]
        service("twice", "198.19.0.6", port(80, "a"), port(80, "b")),
        service("thief", "198.19.0.1", port(80)),  # "good" has that address and port
        good,
        {**good, "spec": {**good["spec"], "ports": [port(99)]}},  # same name again
        service("inject", "198.19.0.7; flush ruleset", port(80)),
    ]
    rendered = render(services, [])
    assert rendered.skipped == [
        "Service (no metadata): 'not an object' is not an object",
        "Service default/nospec: spec is None, not an object",
        "Service default/'Bad_Name': metadata.name 'Bad_Name' is not a DNS label",
        "Service default/bad-ip: spec.clusterIP '198.19.0.300' is not an IP address",
        "Service default/noip: spec.clusterIP is missing",
        "Service default/noports: spec.ports is missing or empty",
        "Service default/weird: spec.type 'Mesh' is not a Service type",
        "Service default/ports: spec.ports[0]: port 0 is not a port number",
        "Service default/ports: spec.ports[1]: protocol 'SCTP' is not supported (TCP and UDP are)",
        "Service default/ports: spec.ports[2]: 'x' is not an object",
        "Service default/ports: spec.ports[3]: name 5 is not a string",
        "Service default/twice: spec.ports[1]: tcp 80 is listed twice",
        "Service default/inject: spec.clusterIP '198.19.0.7; flush ruleset' is not an IP address",
        "Service default/good: listed twice; the first one is used",
        "Service default/thief: 198.19.0.1 tcp 80 is taken by default/good",
    ]
    assert rendered.services == 3  # good, ports (82), twice (80)
    assert "198.19.0.1 . tcp . 80 : goto reject-tcp" in rendered.script
    assert "99" not in rendered.script


def test_malformed_endpoint_slices_and_endpoints_are_skipped_with_reasons() -> None:
    svc = service("web", "198.19.0.10", port(80))
    slices = [
        None,
        {"metadata": {"namespace": NS, "name": "nolabel"}, "addressType": "IPv4"},
        endpoint_slice("v6", "web", [{"port": 80}], [endpoint("fd00::5")]) | {"addressType": "IPv6"},
        endpoint_slice("fqdn", "web", [{"port": 80}], [endpoint("example.com")]) | {"addressType": "FQDN"},
        endpoint_slice("typo", "web", [], []) | {"addressType": "ipv4"},
        endpoint_slice("ports", "web", {"port": 80}, []),
        endpoint_slice(
            "mixed",
            "web",
            [{"port": 8080}, {"port": 70000}, {"port": None}, {"port": 8081, "protocol": "ICMP"}, []],
            [
                endpoint("198.18.1.5"),
                {"addresses": []},
                {"addresses": ["198.18.1.6"], "conditions": {"ready": "yes"}},
                {"addresses": ["198.18.1.7"], "conditions": []},
                endpoint("fd00::7"),
                endpoint("198.18.1.8"),
                7,
            ],
        ),
    ]
    rendered = render([svc], slices)
    assert rendered.skipped == [
        "EndpointSlice (no metadata): None is not an object",
        "EndpointSlice default/nolabel: label kubernetes.io/service-name is None, not a Service name",
        "EndpointSlice default/typo: addressType 'ipv4' is not IPv4, IPv6 or FQDN",
        "EndpointSlice default/ports: ports is {'port': 80}, not a list",
        "EndpointSlice default/mixed: ports[1]: port 70000 is not a port number",
        "EndpointSlice default/mixed: ports[3]: protocol 'ICMP' is not supported (TCP and UDP are)",
        "EndpointSlice default/mixed: ports[4]: [] is not an object",
        "EndpointSlice default/mixed: endpoints[1]: addresses [] is not a list of addresses",
        "EndpointSlice default/mixed: endpoints[2]: conditions.ready 'yes' is not a boolean",
        "EndpointSlice default/mixed: endpoints[3]: conditions [] is not an object",
        "EndpointSlice default/mixed: endpoints[4]: addresses[0] fd00::7 is not an IPv4 address "
        "(the slice's addressType)",
        "EndpointSlice default/mixed: endpoints[6]: 7 is not an object",
    ]
    assert (rendered.services, rendered.endpoints) == (1, 2)
    assert "dnat to 198.18.1.5:8080" in rendered.script
    assert "dnat to 198.18.1.8:8080" in rendered.script


def near_valid_services() -> st.SearchStrategy[Any]:
    port = st.fixed_dictionaries(
        {"port": st.sampled_from([53, 80, 443])},
        optional={"name": st.sampled_from(["", "http"]), "protocol": st.sampled_from(["TCP", "UDP"])},
    )
    spec = st.fixed_dictionaries(
        {
            "clusterIP": st.sampled_from(["198.19.0.1", "198.19.0.2", "198.19.0.3", "None"]),
            "ports": st.lists(port, min_size=1, max_size=3),
        },
        optional={"type": st.sampled_from(["ClusterIP", "NodePort", "ExternalName"])},
    )
    meta = st.fixed_dictionaries({"namespace": st.just(NS), "name": st.sampled_from(["web", "db"])})
    return perturbed(st.fixed_dictionaries({"metadata": meta, "spec": spec}))


def near_valid_slices() -> st.SearchStrategy[Any]:
    labels = st.fixed_dictionaries({"kubernetes.io/service-name": st.sampled_from(["web", "db"])})
    meta = st.fixed_dictionaries({"namespace": st.just(NS), "name": st.just("s"), "labels": labels})
    port = st.fixed_dictionaries(
        {"port": st.sampled_from([8080, 8443, None])},
        optional={"name": st.sampled_from(["", "http"]), "protocol": st.sampled_from(["TCP", "UDP"])},
    )
    endpoint = st.fixed_dictionaries(
        {"addresses": st.lists(st.sampled_from(["198.18.1.5", "198.18.2.5"]), min_size=1, max_size=2)},
        optional={"conditions": st.fixed_dictionaries({}, optional={"ready": st.booleans()})},
    )
    slice_ = st.fixed_dictionaries(
        {
            "metadata": meta,
            "addressType": st.sampled_from(["IPv4", "IPv4", "IPv6"]),
            "ports": st.lists(port, min_size=1, max_size=3),
            "endpoints": st.lists(endpoint, min_size=1, max_size=3),
        }
    )
    return perturbed(slice_)


SAFE_CHARS = set("abcdefghijklmnopqrstuvwxyz0123456789-_./:;,{}@#()=+ \t\n") | set("ABCDEFGHIJKLMNOPQRSTUVWXYZ")


@settings(max_examples=200, deadline=None)
@given(st.lists(near_valid_services(), max_size=5), st.lists(near_valid_slices(), max_size=5))
def test_rendering_arbitrary_objects_never_raises_and_emits_only_validated_tokens(
    services: list[Any], slices: list[Any]
) -> None:
    rendered = render(services, slices)
    assert set(rendered.script) <= SAFE_CHARS
    assert rendered.script == render(services, slices).script
    assert 0 <= rendered.services <= len(services)
    assert all(isinstance(reason, str) and "\n" not in reason for reason in rendered.skipped)


@settings(max_examples=100, deadline=None)
@given(json_values(), json_values())
def test_rendering_non_list_values_inside_lists_never_raises(service: Any, slice_: Any) -> None:
    rendered = render([service], [slice_])
    assert rendered.services == 0


# -- applying (recorded runner) ----------------------------------------------------------------------------------


class Answers:
    """A :class:`RecordingRunner` responder: answers from a queue of (rc, stdout, stderr), success when it is empty."""

    def __init__(self, *answers: tuple[int, bytes, bytes]) -> None:
        self.queue = list(answers)

    def __call__(self, call: Call) -> CommandResult | None:
        if not self.queue:
            return None
        rc, out, err = self.queue.pop(0)
        return CommandResult(call.argv, rc, out, err)


def recorded(*answers: tuple[int, bytes, bytes]) -> RecordingRunner:
    return RecordingRunner(respond=Answers(*answers))


NFT = ("ip", "netns", "exec", "ab12-node-1", "nft", "-f", "-")


async def test_apply_feeds_the_script_to_nft_inside_the_namespace() -> None:
    runner = recorded()
    await apply_rules("ab12-node-1", "table ip x {}\n", runner)
    assert runner.calls == [Call(NFT, b"table ip x {}\n")]


async def test_an_empty_netns_name_means_the_callers_own_namespace() -> None:
    runner = recorded()
    await apply_rules("", "table ip x {}\n", runner)
    await remove_rules("", runner)
    assert [call.argv for call in runner.calls] == [("nft", "-f", "-"), ("nft", "-f", "-")]


async def test_apply_failure_carries_nfts_complaint() -> None:
    runner = recorded((1, b"", b"Error: syntax error\n"))
    with pytest.raises(ServiceRulesError, match="syntax error") as caught:
        await apply_rules("ab12-node-1", "junk", runner)
    assert caught.value.returncode == 1
    assert caught.value.netns == "ab12-node-1"


async def test_remove_deletes_the_table_idempotently_and_tolerates_a_gone_namespace() -> None:
    runner = recorded((0, b"", b""), (255, b"", b'Cannot open network namespace "ab12-node-1": No such file'))
    await remove_rules("ab12-node-1", runner)
    await remove_rules("ab12-node-1", runner)
    script = (
        b"add table ip ambit-lab-services\ndelete table ip ambit-lab-services\n"
        b"add table ip6 ambit-lab-services\ndelete table ip6 ambit-lab-services\n"
    )
    assert runner.calls == [Call(NFT, script), Call(NFT, script)]
    with pytest.raises(ServiceRulesError):
        await remove_rules("ab12-node-1", recorded((1, b"", b"Error: Operation not permitted")))


async def test_an_nft_that_hangs_is_a_failure_after_the_timeout(monkeypatch: pytest.MonkeyPatch) -> None:
    class Hanging(RecordingRunner):
        async def run_async(self, argv: Any, **kwargs: Any) -> CommandResult:
            await asyncio.sleep(10)
            raise AssertionError("not reached")

    assert nft_tables.NFT_TIMEOUT == 10.0
    monkeypatch.setattr(nft_tables, "NFT_TIMEOUT", 0.05)
    with pytest.raises(ServiceRulesError, match=r"applying .* nft exited 124: timed out after 0\.05 s") as caught:
        await apply_rules("ab12-node-1", "table ip x {}\n", Hanging())
    assert caught.value.returncode == 124
    with pytest.raises(ServiceRulesError, match="removing"):
        await remove_rules("ab12-node-1", Hanging())


# -- ServiceProxy against an in-process API server --------------------------------------------------------------

FAST = ServiceProxySettings(
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
        while not predicate():  # noqa: ASYNC110 (the proxy's task signals no one: poll it)
            await asyncio.sleep(0.01)


async def test_service_proxy_applies_on_start_follows_changes_and_removes_on_close(kube: KubeClient) -> None:
    created = await kube.create(kinds.SERVICES, service("web", None, port(80, target=8080)))
    vip = created["spec"]["clusterIP"]
    runner = recorded()
    proxy = ServiceProxy(
        kube, netns="ab12-node-1", node_pod_cidr=POD_CIDR, node_gateway=GATEWAY, runner=runner, settings=FAST
    )
    await proxy.start()
    assert len(runner.calls) == 1
    first = runner.calls[0].stdin
    assert first is not None and f"{vip} . tcp . 80 : goto reject-tcp".encode() in first

    await kube.create(kinds.ENDPOINT_SLICES, endpoint_slice("web-a", "web", [{"port": 8080}], [endpoint("198.18.1.5")]))
    await eventually(lambda: len(runner.calls) == 2)
    second = runner.calls[1].stdin
    assert second is not None and b"dnat to 198.18.1.5:8080" in second
    assert proxy.applied_script == second.decode()

    # a change that renders the same script runs no nft
    await kube.patch(kinds.ENDPOINT_SLICES, "web-a", {"metadata": {"labels": {"extra": "1"}}}, NS)
    await eventually(lambda: proxy.stats.unchanged >= 1)
    assert len(runner.calls) == 2

    await proxy.aclose()
    assert runner.calls[-1] == Call(
        NFT,
        b"add table ip ambit-lab-services\ndelete table ip ambit-lab-services\n"
        b"add table ip6 ambit-lab-services\ndelete table ip6 ambit-lab-services\n",
    )
    assert proxy.applied_script is None


async def test_service_proxy_retries_a_failed_apply(kube: KubeClient) -> None:
    runner = recorded()
    proxy = ServiceProxy(
        kube, netns="ab12-node-1", node_pod_cidr=POD_CIDR, node_gateway=GATEWAY, runner=runner, settings=FAST
    )
    async with proxy:
        runner.respond = Answers((1, b"", b"Error: transient"))
        await kube.create(kinds.SERVICES, service("db", None, port(5432)))
        await eventually(lambda: proxy.stats.applies == 2)
        assert proxy.stats.failures == 1
        assert runner.calls[-1].stdin == runner.calls[-2].stdin  # the same script, applied again


async def test_service_proxy_start_failure_leaves_nothing_running(kube: KubeClient) -> None:
    runner = recorded((1, b"", b"Error: no nft here"))
    proxy = ServiceProxy(
        kube, netns="ab12-node-1", node_pod_cidr=POD_CIDR, node_gateway=GATEWAY, runner=runner, settings=FAST
    )
    with pytest.raises(ServiceRulesError):
        await proxy.start()
    assert proxy.applied_script is None
    assert not [t for t in asyncio.all_tasks() if (t.get_name() or "").startswith("informer")]


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
def test_rendered_script_passes_nft_check_and_loads_into_a_kernel(case: str, tmp_path: Path) -> None:
    script = tmp_path / "rules.nft"
    script.write_text(render_case(case).script)
    checked = nft_in_throwaway_netns(f"nft -c -f {script}")
    assert checked.returncode == 0, checked.stderr
    # nft -c leaves out the kernel's hook validation (a reject in postrouting passes it): load the script for
    # real, twice, to show that applying it again replaces the table instead of adding to it.
    family = "ip6" if OPTIONS.get(case, {}).get("family") == 6 else "ip"
    loaded = nft_in_throwaway_netns(f"nft -f {script} && nft -f {script} && nft list table {family} ambit-lab-services")
    assert loaded.returncode == 0, loaded.stderr
    assert loaded.stdout.count("chain nat-prerouting {") == 1
    assert loaded.stdout.count("type filter hook") == 2


@pytest.mark.root
@needs_nft
@settings(max_examples=25, deadline=None)
@given(st.lists(near_valid_services(), max_size=4), st.lists(near_valid_slices(), max_size=4))
def test_scripts_rendered_from_arbitrary_objects_load_into_a_kernel(services: list[Any], slices: list[Any]) -> None:
    script = render(services, slices).script
    loaded = nft_in_throwaway_netns("nft -f -", script)
    assert loaded.returncode == 0, loaded.stderr + script


def test_bridge_netfilter_is_on_only_when_the_setting_reads_1(tmp_path: Path) -> None:
    setting = tmp_path / "bridge-nf-call-iptables"
    assert bridge_netfilter_enabled(setting) is False  # absent: no br_netfilter
    for text, on in (("1\n", True), ("0\n", False), ("", False)):
        setting.write_text(text)
        assert bridge_netfilter_enabled(setting) is on
