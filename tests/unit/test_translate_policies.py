"""AuthorizationPolicy and PeerAuthentication translation, rule by rule (spec §7.2, §7.4; istiod's authorization.go).

The golden cases (``golden/translate/policy_*``, ``peerauth_*``) show whole outputs; these pin single rules, the
edge cases where Ambit deliberately differs from istiod, and what a tenant must not be able to do.
"""

from __future__ import annotations

import ipaddress
from typing import Any

import pytest
from hypothesis import example, given
from hypothesis import strategies as st

from ambit.controlplane.translate import translate_all
from ambit.controlplane.translate.peerauth import STATIC_STRICT_NAME, PeerAuthIndex
from ambit.controlplane.translate.policies import (
    cidrs,
    parse_go_bool,
    ports,
    translate_authorization_policy,
)
from ambit.model.policy import Action, Scope, StringMatch

Obj = dict[str, Any]


def ap(name: str = "p", namespace: str = "ns", annotations: Obj | None = None, **spec: Any) -> Obj:
    return {
        "metadata": {"name": name, "namespace": namespace, "generation": 7, "annotations": annotations or {}},
        "spec": spec,
    }


def pa(name: str, namespace: str, created: str = "2026-01-01T00:00:00Z", **spec: Any) -> Obj:
    return {"metadata": {"name": name, "namespace": namespace, "creationTimestamp": created}, "spec": spec}


def pod(name: str, namespace: str, labels: Obj, ip: str = "198.18.1.5") -> Obj:
    return {
        "metadata": {"name": name, "namespace": namespace, "labels": labels},
        "spec": {"nodeName": "n", "containers": [{"name": "c"}]},
        "status": {"phase": "Running", "podIP": ip, "conditions": [{"type": "Ready", "status": "True"}]},
    }


GO_BOOLS = [("true", True), ("1", True), ("T", True), ("TRUE", True), ("yes", False), ("", False), ("tRuE", False)]


@pytest.mark.parametrize(("text", "value"), GO_BOOLS)
def test_dry_run_is_read_as_go_parse_bool_reads_it(text: str, value: bool) -> None:
    assert parse_go_bool(text) is value


def test_ports_are_decimal_1_to_65535_and_anything_else_is_dropped() -> None:
    assert ports(["80", "0", "65535", "65536", "http", "+80", " 80", "८०", "08"]) == (80, 65535, 8)


def test_ips_become_networks_with_host_bits_cleared_and_unparsable_ones_are_dropped() -> None:
    assert cidrs(["10.1.2.3/8", "198.18.0.1", "::1", "fe80::1%eth0", "10.0.0.0/255.0.0.0", "x", "1.2.3.4/33"]) == (
        ipaddress.ip_network("10.0.0.0/8"),
        ipaddress.ip_network("198.18.0.1/32"),
        ipaddress.ip_network("::1/128"),
    )


def test_a_rule_without_from_to_or_when_matches_everything() -> None:
    policy = translate_authorization_policy(ap(action="DENY", rules=[{}])).policy
    assert policy is not None and len(policy.rules) == 1 and policy.rules[0].clauses == ()


def test_spec_empty_is_an_allow_with_no_rules_and_the_root_namespace_makes_it_global() -> None:
    result = translate_authorization_policy(ap(namespace="istio-system"))
    assert result.policy is not None and result.policy.scope is Scope.GLOBAL
    assert result.policy.action is Action.ALLOW and result.policy.rules == ()
    root = translate_authorization_policy(ap(namespace="mesh-root"), root_namespace="mesh-root").policy
    assert root is not None and root.scope is Scope.GLOBAL


def test_a_bare_service_account_is_qualified_with_the_policy_namespace() -> None:
    policy = translate_authorization_policy(
        ap(rules=[{"from": [{"source": {"serviceAccounts": ["web", "other/db"]}}]}])
    ).policy
    assert policy is not None
    [match] = policy.rules[0].clauses[0].matches
    assert [str(a) for a in match.service_accounts] == ["ns/web", "other/db"]


def test_principals_are_passed_as_written_trust_domain_included() -> None:
    policy = translate_authorization_policy(ap(rules=[{"from": [{"source": {"principals": ["td/ns/a/sa/b"]}}]}]))
    assert policy.policy is not None
    assert policy.policy.rules[0].clauses[0].matches[0].principals == (StringMatch.exact("td/ns/a/sa/b"),)


def test_a_deny_whose_only_rule_lost_its_http_part_never_fires() -> None:
    result = translate_authorization_policy(ap(action="DENY", rules=[{"to": [{"operation": {"methods": ["GET"]}}]}]))
    assert result.policy is not None and result.policy.rules == ()
    assert result.status is not None and result.status.accepted and "will have no effect" in result.status.message


def test_a_deny_keeps_the_l4_part_of_an_http_rule() -> None:
    rule = {"to": [{"operation": {"methods": ["GET"], "ports": ["80"]}}]}
    result = translate_authorization_policy(ap(action="DENY", rules=[rule]))
    assert result.policy is not None
    assert result.policy.rules[0].clauses[0].matches[0].destination_ports == (80,)
    assert result.status is not None and "enforced without the HTTP rules" in result.status.message


def test_an_http_when_key_makes_an_allow_rule_go() -> None:
    rule = {"from": [{"source": {"namespaces": ["a"]}}], "when": [{"key": "request.method", "values": ["GET"]}]}
    result = translate_authorization_policy(ap(rules=[rule]))
    assert result.policy is not None and result.policy.rules == ()


def test_dry_run_is_not_sent_unless_enabled_and_then_is_sent_marked() -> None:
    obj = ap(annotations={"istio.io/dry-run": "true"}, action="DENY", rules=[{}])
    off = translate_authorization_policy(obj)
    assert off.policy is None and off.status is not None and not off.status.accepted
    on = translate_authorization_policy(obj, enable_dry_run=True)
    assert on.policy is not None and on.policy.dry_run and on.status is not None and on.status.accepted


def test_target_ref_policies_are_neither_sent_nor_given_a_ztunnel_status() -> None:
    result = translate_authorization_policy(ap(targetRefs=[{"kind": "Gateway", "name": "w"}]))
    assert result.policy is None and result.status is None


def test_the_status_carries_the_generation() -> None:
    status = translate_authorization_policy(ap()).status
    assert status is not None and (status.generation, status.reason, status.message) == (
        7,
        "Accepted",
        "attached to ztunnel",
    )


_junk = st.recursive(
    st.one_of(st.none(), st.booleans(), st.integers(), st.text(max_size=5)),
    lambda inner: st.one_of(
        st.lists(inner, max_size=3),
        st.dictionaries(
            st.sampled_from(["rules", "from", "to", "when", "source", "operation", "ports", "principals", "key",
                             "values", "selector", "matchLabels", "action", "mtls", "mode", "portLevelMtls"]),
            inner,
            max_size=4,
        ),
    ),
    max_leaves=20,
)  # fmt: skip


@given(_junk)
@example({"mtls": {"mode": [None]}})  # an unhashable mode once escaped as a TypeError
@example({"portLevelMtls": {"80": {"mode": {"a": 1}}}})
def test_any_spec_translates_or_is_reported_never_raises(spec: object) -> None:
    obj = {"metadata": {"name": "p", "namespace": "ns"}, "spec": spec}
    translation = translate_all([], [], [], [], authorization_policies=[obj], peer_authentications=[obj])
    assert all(s.name == "p" for s in translation.skipped)


# -- who can affect whom -------------------------------------------------------------------------------------------
def test_a_selector_policy_reaches_only_its_namespace_unless_it_is_in_the_root_namespace() -> None:
    pods = [pod("a", "tenant-a", {"app": "web"}, "198.18.1.1"), pod("b", "tenant-b", {"app": "web"}, "198.18.1.2")]
    policies = [
        ap("mine", "tenant-a", selector={"matchLabels": {"app": "web"}}, action="DENY", rules=[{}]),
        ap("mesh", "istio-system", selector={"matchLabels": {"app": "web"}}, action="DENY", rules=[{}]),
    ]
    config = translate_all(pods, [], [], [], authorization_policies=policies).config
    listed = {w.namespace: w.authorization_policies for w in config.workloads}
    assert listed == {"tenant-a": ("istio-system/mesh", "tenant-a/mine"), "tenant-b": ("istio-system/mesh",)}


def test_service_entry_and_workload_entry_endpoints_are_selected_by_their_labels() -> None:
    entry = {
        "metadata": {"name": "ext", "namespace": "tenant-a"},
        "spec": {
            "hosts": ["ext.example"],
            "addresses": ["240.240.0.1"],
            "ports": [{"number": 80, "name": "http", "protocol": "HTTP"}],
            "resolution": "STATIC",
            "endpoints": [
                {"address": "198.18.9.1", "labels": {"app": "web"}},
                {"address": "198.18.9.2", "labels": {"app": "db"}},
            ],
        },
    }
    wle = {
        "metadata": {"name": "vm", "namespace": "tenant-a", "labels": {"app": "web"}},
        "spec": {"address": "198.18.9.3"},
    }
    policies = [ap("web-only", "tenant-a", selector={"matchLabels": {"app": "web"}}, action="DENY", rules=[{}])]
    config = translate_all(
        [], [], [], [], service_entries=[entry], workload_entries=[wle], authorization_policies=policies
    ).config
    listed = {str(w.addresses[0]): w.authorization_policies for w in config.workloads}
    assert listed == {
        "198.18.9.1": ("tenant-a/web-only",),
        "198.18.9.2": (),
        "198.18.9.3": ("tenant-a/web-only",),
    }


def test_an_authorization_policy_cannot_take_the_name_of_the_static_strict_policy() -> None:
    """Names with '_' are invalid in Kubernetes; should one get through, the PeerAuthentication-derived one wins."""
    impostor = ap(STATIC_STRICT_NAME, "istio-system", rules=[{}])  # an ALLOW-all in place of the DENY
    config = translate_all(
        [], [], [], [], authorization_policies=[impostor], peer_authentications=[pa("mesh", "istio-system")]
    ).config
    [policy] = [p for p in config.policies if p.name == STATIC_STRICT_NAME]
    assert policy.action is Action.DENY


def test_a_peer_authentication_in_a_tenant_namespace_does_not_reach_another() -> None:
    index = PeerAuthIndex.build([pa("strict", "tenant-a", mtls={"mode": "STRICT"})], root_namespace="istio-system")
    assert index.find_keys("tenant-a", {}) == (f"istio-system/{STATIC_STRICT_NAME}",)
    assert index.find_keys("tenant-b", {}) == ()


# -- PeerAuthentication precedence ---------------------------------------------------------------------------------
def test_no_peer_authentication_means_no_static_policy() -> None:
    index = PeerAuthIndex.build([], root_namespace="istio-system")
    assert index.policies == () and index.find_keys("ns", {}) == ()


def test_at_one_level_the_oldest_wins_then_the_name() -> None:
    index = PeerAuthIndex.build(
        [
            pa("b-strict", "ns", "2026-01-01T00:00:00Z", mtls={"mode": "STRICT"}),
            pa("a-permissive", "ns", "2026-01-01T00:00:00Z", mtls={"mode": "PERMISSIVE"}),
        ],
        root_namespace="istio-system",
    )
    assert index.find_keys("ns", {}) == ()


def test_an_unset_workload_policy_inherits_and_a_permissive_one_overrides() -> None:
    objs = [
        pa("mesh", "istio-system", mtls={"mode": "STRICT"}),
        pa("unset", "ns", selector={"matchLabels": {"app": "u"}}),
        pa("open", "ns", selector={"matchLabels": {"app": "o"}}, mtls={"mode": "PERMISSIVE"}),
    ]
    index = PeerAuthIndex.build(objs, root_namespace="istio-system")
    assert index.find_keys("ns", {"app": "u"}) == (f"istio-system/{STATIC_STRICT_NAME}",)
    assert index.find_keys("ns", {"app": "o"}) == ()


def test_a_strict_port_under_a_permissive_workload_stays_strict_even_under_a_strict_mesh() -> None:
    """istiod's expression skips this port (and would leave it open); its comment, which we follow, does not."""
    objs = [
        pa("mesh", "istio-system", mtls={"mode": "STRICT"}),
        pa("w", "ns", selector={"matchLabels": {"app": "w"}}, mtls={"mode": "PERMISSIVE"},
           portLevelMtls={"8443": {"mode": "STRICT"}}),
    ]  # fmt: skip
    index = PeerAuthIndex.build(objs, root_namespace="istio-system")
    assert index.find_keys("ns", {"app": "w"}) == ("ns/converted_peer_authentication_w",)
    [converted] = [p for p in index.policies if p.name == "converted_peer_authentication_w"]
    assert converted.rules[0].clauses[0].matches[0].destination_ports == (8443,)


def test_an_unset_workload_with_a_permissive_port_under_an_unset_namespace_and_strict_mesh_keeps_strict() -> None:
    """istiod drops the static policy here and sends no converted one (the workload ends up permissive)."""
    objs = [
        pa("mesh", "istio-system", mtls={"mode": "STRICT"}),
        pa("ns", "ns", mtls={}),
        pa("w", "ns", selector={"matchLabels": {"app": "w"}}, portLevelMtls={"80": {"mode": "PERMISSIVE"}}),
    ]
    index = PeerAuthIndex.build(objs, root_namespace="istio-system")
    assert index.find_keys("ns", {"app": "w"}) == ("ns/converted_peer_authentication_w",)
    [converted] = [p for p in index.policies if p.name == "converted_peer_authentication_w"]
    assert converted.rules[0].clauses[1].matches[0].not_destination_ports == (80,)


def test_the_policy_memo_gives_the_same_translation_and_follows_changes() -> None:
    first = ap("p", "ns", action="DENY", rules=[{}])
    first["metadata"].update(uid="u1", resourceVersion="1")
    broken = {"metadata": {"name": "b", "namespace": "ns", "uid": "u2", "resourceVersion": "1"}, "spec": {"rules": 3}}
    memo: dict[Any, Any] = {}
    plain = translate_all([], [], [], [], authorization_policies=[first, broken])
    assert translate_all([], [], [], [], authorization_policies=[first, broken], policy_memo=memo) == plain
    assert translate_all([], [], [], [], authorization_policies=[first, broken], policy_memo=memo) == plain
    changed = {**first, "metadata": {**first["metadata"], "resourceVersion": "2"}, "spec": {"action": "ALLOW"}}
    again = translate_all([], [], [], [], authorization_policies=[changed], policy_memo=memo)
    assert [p.action for p in again.config.policies] == [Action.ALLOW] and not again.skipped
    assert len(memo) == 1
