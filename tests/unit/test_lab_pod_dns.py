"""A pod's resolv.conf from dnsPolicy and dnsConfig, as the kubelet forms it (ambit.lab.runtime.pod_dns)."""

from __future__ import annotations

from typing import Any

import pytest
from hypothesis import given
from hypothesis import strategies as st

from ambit.lab.runtime.pod_dns import ClusterDns, DnsConfigError, ResolvConf, parse_resolv_conf, pod_dns

CLUSTER = ClusterDns(("198.19.0.10",))
NODE = parse_resolv_conf(
    "# the node's\nnameserver 192.0.2.53\nnameserver 192.0.2.54\nsearch corp.example\noptions edns0\n"
)


def pod(**spec: Any) -> dict[str, Any]:
    return {"metadata": {"name": "web", "namespace": "apps"}, "spec": spec}


def test_cluster_first_is_the_kubelet_file() -> None:
    result = pod_dns(pod(), CLUSTER, NODE)
    assert result.warnings == ()
    assert result.resolv.render() == (
        "search apps.svc.cluster.local svc.cluster.local cluster.local corp.example\n"
        "nameserver 198.19.0.10\n"
        "options ndots:5\n"
    )
    assert pod_dns(pod(), CLUSTER, ResolvConf()).resolv.searches == (
        "apps.svc.cluster.local",
        "svc.cluster.local",
        "cluster.local",
    )


def test_host_network_pods_get_the_node_file_unless_they_ask_for_cluster_first_with_host_net() -> None:
    assert pod_dns(pod(hostNetwork=True), CLUSTER, NODE).resolv == NODE
    with_host_net = pod_dns(pod(hostNetwork=True, dnsPolicy="ClusterFirstWithHostNet"), CLUSTER, NODE)
    assert with_host_net.resolv.nameservers == ("198.19.0.10",)
    assert pod_dns(pod(dnsPolicy="Default"), CLUSTER, NODE).resolv == NODE


def test_cluster_first_without_a_cluster_dns_falls_back_to_default_with_a_warning() -> None:
    result = pod_dns(pod(), ClusterDns(()), NODE)
    assert result.resolv == NODE and "using Default" in result.warnings[0]


def test_none_takes_only_the_dns_config() -> None:
    config = {
        "nameservers": ["198.18.1.53"],
        "searches": ["lab.example"],
        "options": [{"name": "ndots", "value": "2"}, {"name": "edns0"}],
    }
    result = pod_dns(pod(dnsPolicy="None", dnsConfig=config), CLUSTER, NODE)
    assert result.resolv.render() == "search lab.example\nnameserver 198.18.1.53\noptions ndots:2 edns0\n"


def test_dns_config_is_merged_into_cluster_first_as_the_kubelet_merges_it() -> None:
    config = {
        "nameservers": ["198.19.0.10", "198.18.1.53"],
        "searches": ["cluster.local", "lab.example"],
        "options": [{"name": "ndots", "value": "1"}, {"name": "timeout", "value": "2"}],
    }
    resolv = pod_dns(pod(dnsConfig=config), CLUSTER, ResolvConf()).resolv
    assert resolv.nameservers == ("198.19.0.10", "198.18.1.53")
    assert resolv.searches == ("apps.svc.cluster.local", "svc.cluster.local", "cluster.local", "lab.example")
    assert resolv.options == ("ndots:1", "timeout:2")


@pytest.mark.parametrize(
    ("spec", "field"),
    [
        ({"dnsPolicy": "Sometimes"}, "spec.dnsPolicy"),
        ({"dnsPolicy": "None"}, "spec.dnsConfig"),
        ({"dnsPolicy": "None", "dnsConfig": {"searches": ["a.example"]}}, "spec.dnsConfig.nameservers"),
        ({"dnsConfig": {"nameservers": ["1.1.1.1", "1.1.1.2", "1.1.1.3", "1.1.1.4"]}}, "spec.dnsConfig.nameservers"),
        ({"dnsConfig": {"nameservers": ["dns.example"]}}, "spec.dnsConfig.nameservers[0]"),
        ({"dnsConfig": {"searches": [f"s{i}.example" for i in range(33)]}}, "spec.dnsConfig.searches"),
        ({"dnsConfig": {"searches": ["Bad_Name"]}}, "spec.dnsConfig.searches[0]"),
        ({"dnsConfig": {"searches": ["lab.example\n"]}}, "spec.dnsConfig.searches[0]"),
        ({"dnsConfig": {"searches": ["lab.example.\n"]}}, "spec.dnsConfig.searches[0]"),
        ({"dnsConfig": {"searches": ["a" * 60 + f".x{i}" for i in range(32)] * 1}}, "spec.dnsConfig.searches"),
        ({"dnsConfig": {"options": [{"value": "1"}]}}, "spec.dnsConfig.options[0].name"),
        ({"dnsConfig": {"options": [{"name": "ndots", "value": "1\nnameserver 6.6.6.6"}]}}, "options[0].value"),
        ({"dnsConfig": "nameserver 1.1.1.1"}, "spec.dnsConfig"),
    ],
)
def test_bad_dns_config_is_a_clear_error_naming_the_field(spec: dict[str, Any], field: str) -> None:
    with pytest.raises(DnsConfigError, match=field.replace("[", r"\[").replace("]", r"\]")):
        pod_dns(pod(**spec), CLUSTER, NODE)


def test_merged_limits_omit_the_excess_with_the_kubelet_warning() -> None:
    config = {"nameservers": ["198.18.1.1", "198.18.1.2", "198.18.1.3"]}
    result = pod_dns(pod(dnsConfig=config), CLUSTER, NODE)
    assert result.resolv.nameservers == ("198.19.0.10", "198.18.1.1", "198.18.1.2")
    assert result.warnings == (
        "Nameserver limits were exceeded, some nameservers have been omitted, the applied nameserver line is: "
        "198.19.0.10 198.18.1.1 198.18.1.2",
    )
    searches = {"searches": [f"s{i}.example" for i in range(30)]}
    result = pod_dns(pod(dnsConfig=searches), CLUSTER, NODE)
    assert len(result.resolv.searches) == 32 and result.warnings[0].startswith("Search Line limits were exceeded")


@given(st.text(max_size=300))
def test_any_node_file_parses_and_renders_without_injecting_lines(text: str) -> None:
    resolv = parse_resolv_conf(text)
    rendered = pod_dns(pod(dnsPolicy="Default"), CLUSTER, resolv).resolv.render()
    for line in rendered.splitlines():
        assert line.split(" ", 1)[0] in ("search", "nameserver", "options")


@given(
    st.dictionaries(
        st.sampled_from(["nameservers", "searches", "options"]),
        st.lists(st.text(max_size=20) | st.dictionaries(st.text(max_size=5), st.text(max_size=5)), max_size=4),
    )
)
def test_any_dns_config_is_accepted_or_a_dns_config_error(config: dict[str, Any]) -> None:
    try:
        rendered = pod_dns(pod(dnsConfig=config), CLUSTER, NODE).resolv.render()
    except DnsConfigError:
        return
    assert all(line.split(" ", 1)[0] in ("search", "nameserver", "options") for line in rendered.splitlines())
