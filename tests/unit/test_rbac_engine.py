"""The L4 decision engine (spec §4.3, §7.3), rule by rule, with properties that no ALLOW can undo a DENY."""

from __future__ import annotations

import ipaddress

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from ambit.model.identity import SpiffeId
from ambit.model.policy import Action, Clause, Match, Policy, Rule, Scope, ServiceAccountMatch, StringMatch
from ambit.model.workload import Workload
from ambit.rbac import NOT_ALLOWED, Connection, Decision, PolicyIndex, evaluate, policy_matches

WEB = SpiffeId("cluster.local", "shop", "web")
BATCH = SpiffeId("cluster.local", "jobs", "batch")


def conn(
    identity: SpiffeId | None = WEB, src: str = "198.18.1.5", dst: str = "198.18.2.7", port: int = 8080
) -> Connection:
    return Connection(ipaddress.ip_address(src), identity, ipaddress.ip_address(dst), port)


def policy(
    *matches_per_clause: tuple[Match, ...],
    action: Action = Action.ALLOW,
    name: str = "p",
    namespace: str = "shop",
    scope: Scope = Scope.NAMESPACE,
    dry_run: bool = False,
) -> Policy:
    """A policy of one rule whose clauses hold the given matches."""
    return Policy(name, namespace, scope, action, (Rule(tuple(Clause(m) for m in matches_per_clause)),), dry_run)


def cidr(text: str) -> ipaddress.IPv4Network | ipaddress.IPv6Network:
    return ipaddress.ip_network(text)


# --- one policy: rules 1 to 6 -------------------------------------------------------------------------------------

MATCH_CASES = [
    # (match, connection, expected)
    (Match(principals=(StringMatch.exact("cluster.local/ns/shop/sa/web"),)), conn(), True),
    (Match(principals=(StringMatch.exact("spiffe://cluster.local/ns/shop/sa/web"),)), conn(), False),
    (Match(principals=(StringMatch.suffix("/sa/web"),)), conn(), True),
    (Match(principals=(StringMatch.prefix("cluster.local/ns/jobs/"),)), conn(), False),
    (Match(principals=(StringMatch.presence(),)), conn(), True),
    (Match(principals=(StringMatch.presence(),)), conn(identity=None), False),
    (Match(not_principals=(StringMatch.presence(),)), conn(identity=None), True),
    (Match(not_principals=(StringMatch.presence(),)), conn(), False),
    (Match(not_principals=(StringMatch.exact("cluster.local/ns/jobs/sa/batch"),)), conn(), True),
    (Match(not_principals=(StringMatch.exact("cluster.local/ns/jobs/sa/batch"),)), conn(BATCH), False),
    (
        Match(
            principals=(StringMatch.suffix("/sa/web"),), not_principals=(StringMatch.prefix("cluster.local/ns/shop"),)
        ),
        conn(),
        False,
    ),
    (Match(namespaces=(StringMatch.exact("shop"),)), conn(), True),
    (Match(namespaces=(StringMatch.exact("shop"),)), conn(BATCH), False),
    (Match(namespaces=(StringMatch.exact("shop"),)), conn(identity=None), False),
    (Match(not_namespaces=(StringMatch.exact("shop"),)), conn(identity=None), True),
    (Match(not_namespaces=(StringMatch.prefix("sh"),)), conn(), False),
    (Match(service_accounts=(ServiceAccountMatch("shop", "web"),)), conn(), True),
    (Match(service_accounts=(ServiceAccountMatch("jobs", "web"),)), conn(), False),
    (Match(service_accounts=(ServiceAccountMatch("shop", "web"),)), conn(identity=None), False),
    (Match(not_service_accounts=(ServiceAccountMatch("shop", "web"),)), conn(), False),
    (Match(not_service_accounts=(ServiceAccountMatch("shop", "web"),)), conn(BATCH), True),
    (Match(source_ips=(cidr("198.18.1.0/24"),)), conn(), True),
    (Match(source_ips=(cidr("198.18.1.6/32"),)), conn(), False),
    (Match(source_ips=(cidr("198.18.1.0/24"),)), conn(src="::ffff:198.18.1.5"), True),
    (Match(source_ips=(cidr("fd00::/8"),)), conn(), False),
    (Match(source_ips=(cidr("fd00::/8"),)), conn(src="fd00::5", dst="fd00::7"), True),
    (Match(not_source_ips=(cidr("198.18.1.5/32"),)), conn(), False),
    (Match(not_source_ips=(cidr("198.18.1.5/32"),)), conn(src="198.18.1.6"), True),
    (Match(destination_ips=(cidr("198.18.2.0/24"),)), conn(), True),
    (Match(not_destination_ips=(cidr("198.18.2.0/24"),)), conn(), False),
    (Match(destination_ports=(8080, 9090)), conn(), True),
    (Match(destination_ports=(9090,)), conn(), False),
    (Match(not_destination_ports=(8080,)), conn(), False),
    (Match(not_destination_ports=(22,)), conn(), True),
    (Match(namespaces=(StringMatch.exact("shop"),), destination_ports=(9090,)), conn(), False),  # fields are ANDed
    (Match(namespaces=(StringMatch.exact("shop"),), destination_ports=(8080,)), conn(), True),
]


@pytest.mark.parametrize(("match", "connection", "expected"), MATCH_CASES)
def test_one_match_holds_as_its_fields_say(match: Match, connection: Connection, expected: bool) -> None:
    assert policy_matches(policy((match,)), connection) is expected


def test_a_policy_without_rules_never_matches() -> None:
    assert not policy_matches(Policy("p", "shop", Scope.NAMESPACE, Action.ALLOW), conn())


def test_a_rule_without_clauses_matches_every_connection() -> None:
    assert policy_matches(Policy("p", "shop", Scope.NAMESPACE, Action.ALLOW, (Rule(),)), conn(identity=None))


def test_an_empty_match_is_skipped_so_a_clause_of_only_empty_matches_never_matches() -> None:
    assert not policy_matches(policy((Match(),)), conn())
    assert policy_matches(policy((Match(), Match(destination_ports=(8080,)))), conn())


def test_a_clause_without_matches_never_matches() -> None:
    assert not policy_matches(policy(()), conn())


def test_clauses_are_anded_and_matches_within_a_clause_are_ored() -> None:
    ports = (Match(destination_ports=(80,)), Match(destination_ports=(8080,)))
    who = (Match(namespaces=(StringMatch.exact("shop"),)),)
    assert policy_matches(policy(ports, who), conn())
    assert not policy_matches(policy(ports, who), conn(BATCH))


def test_any_rule_of_a_policy_may_match() -> None:
    p = Policy(
        "p",
        "shop",
        Scope.NAMESPACE,
        Action.ALLOW,
        (Rule((Clause((Match(destination_ports=(1,)),)),)), Rule((Clause((Match(destination_ports=(8080,)),)),))),
    )
    assert policy_matches(p, conn())


# --- decisions: rules 7 to 10 -------------------------------------------------------------------------------------

ALLOW_WEB = policy((Match(principals=(StringMatch.exact("cluster.local/ns/shop/sa/web"),)),), name="allow-web")
DENY_JOBS = policy((Match(namespaces=(StringMatch.exact("jobs"),)),), action=Action.DENY, name="deny-jobs")
DENY_PORT = policy((Match(destination_ports=(9090,)),), action=Action.DENY, name="deny-9090")


@pytest.mark.parametrize(
    ("policies", "connection", "expected"),
    [
        ([], conn(), Decision(True)),
        ([ALLOW_WEB], conn(), Decision(True)),
        ([ALLOW_WEB], conn(BATCH), Decision(False, NOT_ALLOWED)),
        ([ALLOW_WEB], conn(identity=None), Decision(False, NOT_ALLOWED)),
        ([DENY_JOBS], conn(), Decision(True)),
        ([DENY_JOBS], conn(BATCH), Decision(False, "explicitly denied by: shop/deny-jobs", "shop/deny-jobs")),
        (
            [DENY_JOBS, ALLOW_WEB],
            conn(BATCH),
            Decision(False, "explicitly denied by: shop/deny-jobs", "shop/deny-jobs"),
        ),
        (
            [DENY_PORT, ALLOW_WEB],
            conn(port=9090),
            Decision(False, "explicitly denied by: shop/deny-9090", "shop/deny-9090"),
        ),
        ([DENY_PORT, ALLOW_WEB], conn(port=8080), Decision(True)),
        # an ALLOW of everything cannot override a DENY
        (
            [DENY_PORT, Policy("all", "shop", Scope.GLOBAL, Action.ALLOW, (Rule(),))],
            conn(port=9090),
            Decision(False, "explicitly denied by: shop/deny-9090", "shop/deny-9090"),
        ),
        # `spec: {}` ALLOW: exists, never matches → everything denied
        ([Policy("deny-all", "istio-system", Scope.GLOBAL, Action.ALLOW)], conn(), Decision(False, NOT_ALLOWED)),
        # a DENY without rules never matches
        ([Policy("nothing", "shop", Scope.NAMESPACE, Action.DENY)], conn(), Decision(True)),
        # static strict: deny when there is no peer identity
        (
            [policy((Match(not_principals=(StringMatch.presence(),)),), action=Action.DENY, name="strict")],
            conn(identity=None),
            Decision(False, "explicitly denied by: shop/strict", "shop/strict"),
        ),
        (
            [policy((Match(not_principals=(StringMatch.presence(),)),), action=Action.DENY, name="strict")],
            conn(),
            Decision(True),
        ),
    ],
)
def test_decisions_follow_istios_precedence(policies: list[Policy], connection: Connection, expected: Decision) -> None:
    assert evaluate(policies, connection) == expected


def test_the_first_matching_deny_by_key_is_named() -> None:
    a = policy((Match(destination_ports=(8080,)),), action=Action.DENY, name="a")
    b = policy((Match(destination_ports=(8080,)),), action=Action.DENY, name="b")
    assert evaluate([b, a], conn()).denied_by == "shop/a"


def test_dry_run_policies_only_report() -> None:
    dry_deny = policy((Match(destination_ports=(8080,)),), action=Action.DENY, name="dry", dry_run=True)
    decision = evaluate([dry_deny], conn())
    assert decision.allowed
    assert decision.dry_run == "explicitly denied by: shop/dry"
    dry_allow = policy((Match(destination_ports=(1,)),), name="dry-allow", dry_run=True)
    decision = evaluate([dry_allow], conn())
    assert decision.allowed
    assert decision.dry_run == NOT_ALLOWED
    # a dry-run ALLOW does not make an enforced ALLOW set "exist"
    assert evaluate([dry_allow, DENY_JOBS], conn()).allowed


def test_dry_run_that_would_allow_reports_nothing() -> None:
    dry = policy((Match(destination_ports=(8080,)),), name="dry", dry_run=True)
    assert evaluate([dry], conn()).dry_run == ""


def test_the_trace_names_every_policy_and_the_rule_that_matched() -> None:
    decision = evaluate([DENY_JOBS, ALLOW_WEB], conn())
    assert [(t.key, t.action, t.rule) for t in decision.trace] == [
        ("shop/allow-web", Action.ALLOW, 0),
        ("shop/deny-jobs", Action.DENY, None),
    ]


# --- the index: rule 7 ----------------------------------------------------------------------------------------------


def workload(namespace: str = "shop", keys: tuple[str, ...] = ()) -> Workload:
    return Workload(
        uid=f"Kubernetes//Pod/{namespace}/w",
        name="w",
        namespace=namespace,
        addresses=(ipaddress.ip_address("198.18.2.7"),),
        authorization_policies=keys,
    )


def test_the_index_finds_namespace_global_and_listed_policies_only() -> None:
    ns_policy = policy((Match(),), name="ns", namespace="shop", scope=Scope.NAMESPACE)
    other_ns = policy((Match(),), name="ns", namespace="jobs", scope=Scope.NAMESPACE)
    mesh = policy((Match(),), name="mesh", namespace="istio-system", scope=Scope.GLOBAL)
    selected = policy((Match(),), name="sel", namespace="shop", scope=Scope.WORKLOAD_SELECTOR)
    unlisted = policy((Match(),), name="other", namespace="shop", scope=Scope.WORKLOAD_SELECTOR)
    index = PolicyIndex([ns_policy, other_ns, mesh, selected, unlisted])
    found, missing = index.find_for(workload(keys=("shop/sel", "shop/gone")))
    assert sorted(p.key for p in found) == ["istio-system/mesh", "shop/ns", "shop/sel"]
    assert missing == ("shop/gone",)


def test_replacing_a_policy_moves_it_between_indexes() -> None:
    index = PolicyIndex([policy((Match(),), name="p", scope=Scope.NAMESPACE)])
    index.put(policy((Match(),), name="p", scope=Scope.WORKLOAD_SELECTOR))
    assert index.find_for(workload())[0] == []
    index.remove("shop/p")
    assert len(index) == 0
    assert index.find_for(workload(keys=("shop/p",))) == ([], ("shop/p",))


def test_a_workload_without_policies_is_allowed_without_evaluation() -> None:
    decision = PolicyIndex().check(workload(), conn(identity=None))
    assert decision == Decision(True)


# --- properties ----------------------------------------------------------------------------------------------------

_ids = st.builds(
    SpiffeId,
    st.just("cluster.local"),
    st.sampled_from(["shop", "jobs", "prod"]),
    st.sampled_from(["web", "batch", "default"]),
)
_connections = st.builds(
    Connection,
    st.sampled_from([ipaddress.ip_address(a) for a in ("198.18.1.5", "198.18.9.9", "fd00::5")]),
    st.one_of(st.none(), _ids),
    st.sampled_from([ipaddress.ip_address(a) for a in ("198.18.2.7", "fd00::7")]),
    st.sampled_from([80, 8080, 9090]),
)
_strings = st.lists(
    st.one_of(
        st.sampled_from(["shop", "jobs", "cluster.local/ns/shop/sa/web"]).map(StringMatch.exact),
        st.sampled_from(["cluster.local/ns/", "sh", "j"]).map(StringMatch.prefix),
        st.sampled_from(["/sa/web", "op", "bs"]).map(StringMatch.suffix),
        st.just(StringMatch.presence()),
    ),
    max_size=2,
).map(tuple)
_cidrs = st.lists(st.sampled_from([cidr("198.18.0.0/16"), cidr("198.18.1.5/32"), cidr("fd00::/16")]), max_size=2).map(
    tuple
)
_ports = st.lists(st.sampled_from([80, 8080, 9090]), max_size=2).map(tuple)
_accounts = st.lists(
    st.builds(ServiceAccountMatch, st.sampled_from(["shop", "jobs"]), st.sampled_from(["web", "batch"])), max_size=1
).map(tuple)
_matches = st.builds(
    Match,
    namespaces=_strings,
    not_namespaces=_strings,
    service_accounts=_accounts,
    not_service_accounts=_accounts,
    principals=_strings,
    not_principals=_strings,
    source_ips=_cidrs,
    not_source_ips=_cidrs,
    destination_ips=_cidrs,
    not_destination_ips=_cidrs,
    destination_ports=_ports,
    not_destination_ports=_ports,
)
_rules = st.lists(
    st.builds(Rule, st.lists(st.builds(Clause, st.lists(_matches, max_size=2).map(tuple)), max_size=2).map(tuple)),
    max_size=2,
).map(tuple)
_policies = st.lists(
    st.builds(
        Policy,
        name=st.sampled_from(["a", "b", "c", "d"]),
        namespace=st.just("shop"),
        scope=st.just(Scope.NAMESPACE),
        action=st.sampled_from(Action),
        rules=_rules,
        dry_run=st.booleans(),
    ),
    max_size=4,
    unique_by=lambda p: p.key,
)


@settings(max_examples=400)
@given(_policies, _connections)
def test_no_connection_a_deny_matches_is_ever_allowed(policies: list[Policy], connection: Connection) -> None:
    decision = evaluate(policies, connection)
    if any(p.action is Action.DENY and not p.dry_run and policy_matches(p, connection) for p in policies):
        assert not decision.allowed
        assert decision.denied_by is not None


@settings(max_examples=300)
@given(_policies, _connections, _rules)
def test_adding_an_allow_never_lifts_a_deny(
    policies: list[Policy], connection: Connection, rules: tuple[Rule, ...]
) -> None:
    before = evaluate(policies, connection)
    extra = Policy("zz-extra", "shop", Scope.NAMESPACE, Action.ALLOW, rules)
    after = evaluate([*policies, extra], connection)
    if before.denied_by is not None:
        assert after == before


@settings(max_examples=300)
@given(_policies, _connections)
def test_dry_run_policies_never_change_the_decision(policies: list[Policy], connection: Connection) -> None:
    enforced = [p for p in policies if not p.dry_run]
    assert evaluate(policies, connection).allowed == evaluate(enforced, connection).allowed


@settings(max_examples=300)
@given(_policies, _connections)
def test_the_index_decides_as_evaluating_the_policies_it_finds(policies: list[Policy], connection: Connection) -> None:
    index = PolicyIndex(policies)
    w = workload()
    assert index.check(w, connection) == evaluate(policies, connection)
    assert index.check(w, connection) == evaluate(policies, connection)  # the cached path decides the same


def test_a_policy_change_clears_the_cached_policies_of_a_destination() -> None:
    index = PolicyIndex([ALLOW_WEB])
    w = workload(keys=("shop/deny-jobs",))
    assert index.check(w, conn(BATCH)).reason == NOT_ALLOWED
    index.put(DENY_JOBS)
    assert index.check(w, conn(BATCH)).denied_by == "shop/deny-jobs"
    index.remove("shop/allow-web")
    assert index.check(w, conn()).allowed
    index.replace_all([])
    assert index.check(w, conn(BATCH)) == Decision(True, missing=("shop/deny-jobs",))
