"""targetRefs AuthorizationPolicy → waypoint policies and WaypointAccepted (waypoint_policies rules 1-9)."""

from __future__ import annotations

import ipaddress
from pathlib import Path
from typing import Any

import pytest
import yaml
from hypothesis import given, settings
from hypothesis import strategies as st

from ambit.controlplane.translate import translate_all
from ambit.controlplane.translate.skips import Skipped
from ambit.controlplane.translate.waypoint_policies import (
    MESH_CONTROLLER,
    WAYPOINT_ACCEPTED,
    ServiceTarget,
    TargetIndex,
    policies_for,
    translate_waypoint_policy,
)
from ambit.model.policy import Action, Clause, KeyedMatch, Match, Rule, Scope, ServiceAccountMatch, StringMatch

INDEX = TargetIndex(
    waypoints=frozenset({"shop/waypoint", "other/waypoint"}),
    gateway_classes={"istio-waypoint": MESH_CONTROLLER, "istio": "istio.io/gateway-controller"},
    services={
        "shop/reviews": ServiceTarget(("shop/reviews.shop.svc.cluster.local",), "shop/waypoint"),
        "shop/ratings": ServiceTarget(("shop/ratings.shop.svc.cluster.local",), "shop/waypoint"),
        "shop/plain": ServiceTarget(("shop/plain.shop.svc.cluster.local",), None),
    },
    service_entries={"shop/ext": ServiceTarget(("shop/a.example", "shop/b.example"), "shop/egress")},
)
GATEWAY = {"group": "gateway.networking.k8s.io", "kind": "Gateway", "name": "waypoint"}
CLASS = {"group": "gateway.networking.k8s.io", "kind": "GatewayClass", "name": "istio-waypoint"}


def ap(
    refs: list[dict[str, Any]] | None = None,
    rules: list[Any] | None = None,
    action: str | None = None,
    namespace: str = "shop",
    **extra: Any,
) -> dict[str, Any]:
    spec: dict[str, Any] = {"targetRefs": [GATEWAY] if refs is None else refs, "rules": rules or [], **extra}
    if action:
        spec["action"] = action
    return {"metadata": {"name": "p", "namespace": namespace, "generation": 3}, "spec": spec}


def svc(name: str, kind: str = "Service", group: str = "") -> dict[str, Any]:
    return {"group": group, "kind": kind, "name": name}


STATUS_CASES = [
    # (refs, namespace, accepted, reason, message)
    ([GATEWAY], "shop", True, "Accepted", "bound to shop/waypoint"),
    ([{**GATEWAY, "name": "nope"}], "shop", False, "TargetNotFound", "not bound"),
    ([CLASS], "istio-system", True, "Accepted", "bound to istio-waypoint"),
    (
        [CLASS],
        "shop",
        False,
        "Invalid",
        "AuthorizationPolicy must be in the root namespace `istio-system` when referencing a GatewayClass",
    ),
    (
        [{**CLASS, "name": "istio"}],
        "istio-system",
        False,
        "Invalid",
        "GatewayClass must use controller name `istio.io/mesh-controller` for waypoints",
    ),
    ([{**CLASS, "name": "missing"}], "istio-system", False, "TargetNotFound", "not bound"),
    ([svc("reviews")], "shop", True, "Accepted", "bound to shop/waypoint"),
    ([svc("reviews", group="core")], "shop", True, "Accepted", "bound to shop/waypoint"),
    ([svc("plain")], "shop", False, "AncestorNotBound", "Service shop/plain is not bound to a waypoint"),
    ([svc("gone")], "shop", False, "TargetNotFound", "Service shop/gone was not found"),
    ([svc("ext", "ServiceEntry", "networking.istio.io")], "shop", True, "Accepted", "bound to shop/egress"),
    (
        [svc("nope", "ServiceEntry", "networking.istio.io")],
        "shop",
        False,
        "TargetNotFound",
        "ServiceEntry shop/nope was not found",
    ),
    ([svc("reviews", "Deployment", "apps")], "shop", False, "Invalid", "unsupported targetRef apps/Deployment"),
    ([svc("reviews", group="networking.istio.io")], "shop", False, "Invalid", "unsupported targetRef"),
    (
        [{**GATEWAY, "namespace": "other"}],
        "shop",
        False,
        "Invalid",
        "cross namespace referencing is not currently supported",
    ),
    (
        [GATEWAY, svc("plain"), svc("gone")],
        "shop",
        True,
        "PartiallyInvalid",
        "Invalid targetRefs: Service.core:shop/plain, Service.core:shop/gone",
    ),
    ([GATEWAY, svc("reviews")], "shop", True, "Accepted", ""),
    ([svc("plain"), svc("gone")], "shop", False, "Invalid", "Invalid targetRefs: Service.core:shop/plain, "),
]


@pytest.mark.parametrize(("refs", "namespace", "accepted", "reason", "message"), STATUS_CASES)
def test_waypoint_accepted_status(
    refs: list[dict[str, Any]], namespace: str, accepted: bool, reason: str, message: str
) -> None:
    status = translate_waypoint_policy(ap(refs, namespace=namespace), INDEX).status
    assert status is not None
    assert (status.type, status.accepted, status.reason, status.generation) == (
        WAYPOINT_ACCEPTED,
        accepted,
        reason,
        3,
    )
    assert status.message.startswith(message)


def test_a_policy_without_target_refs_is_not_a_waypoint_policy() -> None:
    result = translate_waypoint_policy({"metadata": {"name": "p", "namespace": "shop"}, "spec": {}}, INDEX)
    assert result.status is None and result.for_waypoint("shop/waypoint") == ()


def test_the_deprecated_single_target_ref_is_read() -> None:
    obj = ap([], targetRef=GATEWAY)
    result = translate_waypoint_policy(obj, INDEX)
    assert result.waypoint_policy is not None and result.waypoints == {"shop/waypoint"}


def test_where_the_policies_go() -> None:
    gateway = translate_waypoint_policy(ap([GATEWAY]), INDEX)
    assert [p.scope for p in gateway.for_waypoint("shop/waypoint")] == [Scope.WAYPOINT]
    assert gateway.for_waypoint("other/waypoint") == ()
    every = translate_waypoint_policy(ap([CLASS], namespace="istio-system"), INDEX)
    assert len(every.for_waypoint("shop/waypoint")) == len(every.for_waypoint("any/waypoint")) == 1
    services = translate_waypoint_policy(
        ap([svc("reviews"), svc("plain"), svc("ext", "ServiceEntry", "networking.istio.io")]), INDEX
    )
    (at_shop,) = services.for_waypoint("shop/waypoint")
    assert (at_shop.scope, at_shop.services) == (Scope.SERVICE, ("shop/reviews.shop.svc.cluster.local",))
    (at_egress,) = services.for_waypoint("shop/egress")
    assert at_egress.services == ("shop/a.example", "shop/b.example")
    both = translate_waypoint_policy(ap([GATEWAY, svc("ratings")]), INDEX)
    assert [p.scope for p in policies_for([both], "shop/waypoint")] == [Scope.WAYPOINT, Scope.SERVICE]


FULL_RULE = {
    "from": [
        {
            "source": {
                "principals": ["cluster.local/ns/shop/sa/web"],
                "notPrincipals": ["*/sa/batch"],
                "requestPrincipals": ["https://issuer.example/*"],
                "notRequestPrincipals": ["*/mallory"],
                "namespaces": ["shop"],
                "notNamespaces": ["dev-*"],
                "serviceAccounts": ["web", "jobs/batch"],
                "notServiceAccounts": ["old"],
                "ipBlocks": ["198.18.0.0/16"],
                "notIpBlocks": ["198.18.9.9"],
                "remoteIpBlocks": ["203.0.113.0/24"],
                "notRemoteIpBlocks": ["203.0.113.7"],
                "trustDomains": ["ignored"],
            }
        }
    ],
    "to": [
        {
            "operation": {
                "hosts": ["Shop.Example", "*.Example:*"],
                "notHosts": ["ADMIN.example"],
                "methods": ["GET", "HEAD"],
                "notMethods": ["DELETE"],
                "paths": ["/cart/*", "*/items", "/exact"],
                "notPaths": ["/admin*"],
                "ports": ["8080"],
                "notPorts": ["22"],
            }
        }
    ],
    "when": [
        {"key": "request.headers[X-Env]", "values": ["prod"], "notValues": ["dev*"]},
        {"key": "request.auth.claims[org][team]", "values": ["red"]},
        {"key": "request.auth.audiences", "values": ["shop"]},
        {"key": "request.auth.presenter", "notValues": ["bad"]},
        {"key": "request.auth.principal", "values": ["*"]},
        {"key": "connection.sni", "values": ["*.example"]},
        {"key": "remote.ip", "values": ["10.0.0.0/8"]},
        {"key": "source.ip", "notValues": ["10.1.0.0/16"]},
        {"key": "source.namespace", "values": ["shop"]},
        {"key": "source.principal", "values": ["cluster.local/ns/shop/sa/web"]},
        {"key": "destination.ip", "values": ["198.18.2.0/24"]},
        {"key": "destination.port", "values": ["8080"], "notValues": ["9090"]},
    ],
}


def s(*patterns: str) -> tuple[StringMatch, ...]:
    return tuple(StringMatch.of_pattern(p) for p in patterns)


def net(*texts: str) -> tuple[ipaddress.IPv4Network | ipaddress.IPv6Network, ...]:
    return tuple(ipaddress.ip_network(t) for t in texts)


def test_every_field_is_mapped() -> None:
    result = translate_waypoint_policy(ap(rules=[FULL_RULE], action="DENY"), INDEX)
    assert result.status is not None and result.status.reason == "Accepted", result.status
    policy = result.waypoint_policy
    assert policy is not None and policy.action is Action.DENY and policy.scope is Scope.WAYPOINT
    (rule,) = policy.rules
    to, source, *when = rule.clauses
    assert to == Clause(
        (
            Match(
                hosts=s("shop.example", "*.example:*"),
                not_hosts=s("admin.example"),
                methods=("GET", "HEAD"),
                not_methods=("DELETE",),
                paths=s("/cart/*", "*/items", "/exact"),
                not_paths=s("/admin*"),
                destination_ports=(8080,),
                not_destination_ports=(22,),
            ),
        )
    )
    assert source == Clause(
        (
            Match(
                principals=s("cluster.local/ns/shop/sa/web"),
                not_principals=s("*/sa/batch"),
                request_principals=s("https://issuer.example/*"),
                not_request_principals=s("*/mallory"),
                namespaces=s("shop"),
                not_namespaces=s("dev-*"),
                service_accounts=(ServiceAccountMatch("shop", "web"), ServiceAccountMatch("jobs", "batch")),
                not_service_accounts=(ServiceAccountMatch("shop", "old"),),
                source_ips=net("198.18.0.0/16"),
                not_source_ips=net("198.18.9.9/32"),
                remote_ips=net("203.0.113.0/24"),
                not_remote_ips=net("203.0.113.7/32"),
            ),
        )
    )
    assert [c.matches for c in when] == [
        (Match(request_headers=(KeyedMatch(("x-env",), s("prod"), s("dev*")),)),),
        (Match(request_claims=(KeyedMatch(("org", "team"), s("red")),)),),
        (Match(audiences=s("shop")),),
        (Match(not_presenters=s("bad")),),
        (Match(request_principals=s("*")),),
        (Match(sni=s("*.example")),),
        (Match(remote_ips=net("10.0.0.0/8")),),
        (Match(not_source_ips=net("10.1.0.0/16")),),
        (Match(namespaces=s("shop")),),
        (Match(principals=s("cluster.local/ns/shop/sa/web")),),
        (Match(destination_ips=net("198.18.2.0/24")),),
        (Match(destination_ports=(8080,), not_destination_ports=(9090,)),),
    ]


def test_actions_and_dry_run() -> None:
    for name, action in (("ALLOW", Action.ALLOW), ("DENY", Action.DENY), ("AUDIT", Action.AUDIT), (None, Action.ALLOW)):
        policy = translate_waypoint_policy(ap(action=name), INDEX).waypoint_policy
        assert policy is not None and policy.action is action and not policy.dry_run
    dry = ap()
    dry["metadata"]["annotations"] = {"istio.io/dry-run": "true"}
    policy = translate_waypoint_policy(dry, INDEX).waypoint_policy
    assert policy is not None and policy.dry_run


def test_custom_with_an_unknown_provider_fails_closed_as_a_deny_of_its_rules_and_says_so() -> None:
    """istiod's builder: "failed to process CUSTOM action ..., will generate deny configs"."""
    policy = ap(rules=[{"to": [{"operation": {"paths": ["/x"]}}]}], action="CUSTOM", provider={"name": "nope"})
    result = translate_waypoint_policy(policy, INDEX)
    assert result.waypoint_policy is not None and result.waypoint_policy.action is Action.DENY
    assert result.waypoint_policy.ext_authz is None
    assert result.waypoint_policy.rules == (Rule((Clause((Match(paths=s("/x")),)),)),)
    assert result.status is not None and "provider 'nope' is not an external authorizer" in result.status.message


@pytest.mark.parametrize(
    ("when", "problem"),
    [
        ({"key": "request.bogus", "values": ["x"]}, "unknown attribute 'request.bogus'"),
        ({"key": "experimental.envoy.filters.a[b]", "values": ["x"]}, "unknown attribute"),
        ({"key": "request.headers[a][b]", "values": ["x"]}, "malformed header key"),
        ({"key": "request.headers", "values": ["x"]}, "malformed header key"),
        ({"key": "request.auth.claims[]", "values": ["x"]}, "malformed claim key"),
        ({"key": "destination.port", "values": ["http"]}, "invalid port 'http'"),
        ({"key": "source.ip", "values": ["1.2.3.4/40"]}, "invalid IP address or CIDR"),
    ],
)
def test_invalid_values_are_enforced_more_restrictively(when: dict[str, Any], problem: str) -> None:
    rule = {"to": [{"operation": {"methods": ["POST"]}}], "when": [when]}
    allow = translate_waypoint_policy(ap(rules=[rule, {}], action="ALLOW"), INDEX)
    assert allow.waypoint_policy is not None
    assert allow.waypoint_policy.rules == (Rule(),)  # the bad rule is dropped, the empty one stays
    assert allow.status is not None and (allow.status.accepted, allow.status.reason) == (False, "Invalid")
    assert problem in allow.status.message
    deny = translate_waypoint_policy(ap(rules=[rule], action="DENY"), INDEX)
    assert deny.waypoint_policy is not None
    assert deny.waypoint_policy.rules == (Rule((Clause((Match(methods=("POST",)),)),)),)  # condition ignored


def test_path_templates_are_kept_apart_from_the_string_forms() -> None:
    operation = {"paths": ["/a/{*}", "/exact", "/p/*"], "notPaths": ["/{**}/admin"]}
    result = translate_waypoint_policy(ap(rules=[{"to": [{"operation": operation}]}]), INDEX)
    assert result.waypoint_policy is not None
    expected = Match(
        paths=(StringMatch.exact("/exact"), StringMatch.prefix("/p/")),
        path_templates=("/a/{*}",),
        not_path_templates=("/{**}/admin",),
    )
    assert result.waypoint_policy.rules == (Rule((Clause((expected,)),)),)
    assert result.status is not None and result.status.accepted


@pytest.mark.parametrize("bad", ["/a/{**}/{*}", "a/{*}", "/a/{b}", "/a/{*}.txt"])
def test_an_invalid_path_template_is_a_problem(bad: str) -> None:
    result = translate_waypoint_policy(ap(rules=[{"to": [{"operation": {"paths": [bad]}}]}]), INDEX)
    assert result.waypoint_policy is not None and result.waypoint_policy.rules == (), "an ALLOW rule is dropped"
    assert result.status is not None and "invalid path" in result.status.message


def test_an_empty_operation_matches_everything_as_envoy_any() -> None:
    rule = {"to": [{"operation": {}}, {"operation": {"methods": ["GET"]}}], "from": [{"source": {}}]}
    policy = translate_waypoint_policy(ap(rules=[rule]), INDEX).waypoint_policy
    assert policy is not None and policy.rules == (Rule(),)


@pytest.mark.parametrize(
    ("spec", "field"),
    [
        ({"targetRefs": "Gateway"}, "spec.targetRefs"),
        ({"targetRefs": [GATEWAY], "action": "MAYBE"}, "spec.action"),
        ({"targetRefs": [{**GATEWAY, "name": 5}]}, "spec.targetRefs[0].name"),
        ({"targetRefs": [GATEWAY], "rules": [{"when": [{"key": 3}]}]}, "spec.rules[0].when[0].key"),
        ({"targetRefs": [GATEWAY], "rules": [{"to": [{"operation": {"paths": "/x"}}]}]}, "paths"),
    ],
)
def test_objects_of_the_wrong_shape_are_skipped(spec: dict[str, Any], field: str) -> None:
    skips: list[Skipped] = []
    result = translate_waypoint_policy(
        {"metadata": {"name": "p", "namespace": "shop"}, "spec": spec}, INDEX, skips=skips
    )
    assert result.status is None and result.waypoint_policy is None
    assert len(skips) == 1 and field in skips[0].field


_json = st.recursive(
    st.none() | st.booleans() | st.integers() | st.text(max_size=5),
    lambda inner: st.lists(inner, max_size=3) | st.dictionaries(st.text(max_size=8), inner, max_size=3),
    max_leaves=12,
)
_keys = st.sampled_from(["rules", "targetRefs", "targetRef", "action", "from", "to", "when", "operation", "source"])


@settings(max_examples=300, deadline=None)
@given(st.dictionaries(_keys, _json, max_size=4), st.lists(st.dictionaries(_keys, _json, max_size=3), max_size=2))
def test_any_spec_gives_a_translation_or_a_skip_never_an_exception(spec: dict[str, Any], rules: list[Any]) -> None:
    obj = {"metadata": {"name": "p", "namespace": "shop"}, "spec": {"targetRefs": [GATEWAY], "rules": rules, **spec}}
    skips: list[Skipped] = []
    result = translate_waypoint_policy(obj, INDEX, skips=skips)
    if skips:
        assert result.status is None and result.waypoint_policy is None and result.service_policy is None
    elif result.status is not None:
        assert result.status.reason in ("Accepted", "Invalid", "PartiallyInvalid", "TargetNotFound")


# --- delivery through translate_all ------------------------------------------------------------------------------

GOLDEN_BASIC = Path(__file__).parent / "golden" / "routes" / "basic-in.yaml"


def _objects() -> dict[str, list[dict[str, Any]]]:
    kinds = {
        "Namespace": "namespaces",
        "GatewayClass": "gateway_classes",
        "Gateway": "gateways",
        "Service": "services",
        "HTTPRoute": "http_routes",
    }
    out: dict[str, list[dict[str, Any]]] = {k: [] for k in (*kinds.values(), "authorization_policies")}
    for doc in yaml.safe_load_all(GOLDEN_BASIC.read_text()):
        if doc:
            out[kinds[doc["kind"]]].append(doc)
    out["authorization_policies"] = [
        {"metadata": {"name": "gw", "namespace": "app"}, "spec": {"targetRefs": [GATEWAY], "action": "DENY"}},
        {
            "metadata": {"name": "svc", "namespace": "app", "generation": 2},
            "spec": {"targetRefs": [svc("reviews"), svc("nope")], "rules": [{}]},
        },
        {"metadata": {"name": "mesh", "namespace": "istio-system"}, "spec": {"targetRefs": [CLASS]}},
        {"metadata": {"name": "unbound", "namespace": "other"}, "spec": {"targetRefs": [svc("details")]}},
        {"metadata": {"name": "l4", "namespace": "app"}, "spec": {"rules": [{}]}},
    ]
    return out


def test_each_waypoint_gets_exactly_the_policies_bound_to_it() -> None:
    translation = translate_all(pods=[], endpoint_slices=[], **_objects())  # type: ignore[arg-type]
    (config,) = translation.waypoint_configs
    assert config.waypoint == "app/waypoint"
    assert [(p.key, p.scope, p.services) for p in config.policies] == [
        ("app/gw", Scope.WAYPOINT, ()),
        ("app/svc", Scope.SERVICE, ("app/reviews.app.svc.cluster.local",)),
        ("istio-system/mesh", Scope.WAYPOINT, ()),
    ]
    assert [p.key for p in translation.config.policies] == ["app/l4"]  # the node proxy never sees them
    statuses = {s.key: (s.type, s.accepted, s.reason, s.message) for s in translation.waypoint_policy_status}
    assert statuses == {
        "app/gw": (WAYPOINT_ACCEPTED, True, "Accepted", "bound to app/waypoint"),
        "app/svc": (WAYPOINT_ACCEPTED, True, "PartiallyInvalid", "Invalid targetRefs: Service.core:app/nope"),
        "istio-system/mesh": (WAYPOINT_ACCEPTED, True, "Accepted", "bound to istio-waypoint"),
        "other/unbound": (
            WAYPOINT_ACCEPTED,
            False,
            "AncestorNotBound",
            "Service other/details is not bound to a waypoint",
        ),
    }
    assert {s.key for s in translation.policy_status} == {"app/l4"}  # no ZtunnelAccepted for targetRefs
