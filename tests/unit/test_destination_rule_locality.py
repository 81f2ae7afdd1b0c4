"""A DestinationRule's ``loadBalancer.localityLbSetting``: read from the manifest (top level, port level, subsets),
judged as istiod's validation judges it (translation, webhook), and applied when a waypoint or an ingress gateway
picks an endpoint (ambit.model.locality_lb's rules; istiod's ApplyLocalityLoadBalancer as Envoy then uses it)."""

from __future__ import annotations

import dataclasses
import ipaddress
from collections.abc import Sequence
from typing import Any

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from ambit.controlplane.translate.destinationrules import parse_destination_rule
from ambit.controlplane.translate.locality_lb import read_locality_lb
from ambit.controlplane.translate.shapes import ShapeError
from ambit.controlplane.translate.skips import Skipped
from ambit.controlplane.webhook.traffic import validate_destination_rule
from ambit.model.destination_policy import (
    DestinationPolicy,
    LoadBalancer,
    OutlierDetection,
    PortTrafficPolicy,
    Subset,
    TrafficPolicy,
)
from ambit.model.locality_lb import (
    LocalityChoice,
    LocalityDistribute,
    LocalityFailover,
    LocalityLbSetting,
    by_locality,
    setting_problems,
)
from ambit.model.routes import BackendService
from ambit.model.state import WorkloadState
from ambit.model.workload import (
    LoadBalancingMode,
    Locality,
    NetworkAddress,
    PortMapping,
    RoutingScope,
    Service,
    TunnelProtocol,
    Workload,
)
from ambit.waypoint.destinations import pick_endpoint, pick_ingress_endpoint
from ambit.waypoint.traffic_policy import BackendPolicy, plan_backend

KEY = "app/echo.app.svc.cluster.local"
NETWORK = "topology.istio.io/network"
REGION = "topology.kubernetes.io/region"
ZONE = "topology.kubernetes.io/zone"
HOSTNAME = "kubernetes.io/hostname"

# Translation.


def rule(balancer: dict[str, Any], **spec: Any) -> dict[str, Any]:
    return {
        "apiVersion": "networking.istio.io/v1",
        "kind": "DestinationRule",
        "metadata": {"name": "dr", "namespace": "app", "uid": "u", "creationTimestamp": ""},
        "spec": {"host": "echo", "trafficPolicy": {"loadBalancer": balancer}, **spec},
    }


def parse(obj: dict[str, Any]) -> tuple[Any, list[Skipped]]:
    skips: list[Skipped] = []
    return parse_destination_rule(obj, domain="cluster.local", skips=skips, find_secret=lambda ns, n: None), skips


@pytest.mark.parametrize(
    ("setting", "expected"),
    [
        ({"enabled": False}, LocalityLbSetting(enabled=False)),
        ({}, LocalityLbSetting()),
        (
            {"distribute": [{"from": "us/a/*", "to": {"us/a/*": 80, "us/b/*": 20}}, {"from": "*", "to": {"*": 100}}]},
            LocalityLbSetting(
                distribute=(
                    LocalityDistribute("us/a/*", (("us/a/*", 80), ("us/b/*", 20))),
                    LocalityDistribute("*", (("*", 100),)),
                )
            ),
        ),
        (
            {"failover": [{"from": "us", "to": "eu"}], "failoverPriority": [NETWORK, HOSTNAME]},
            LocalityLbSetting(failover=(LocalityFailover("us", "eu"),), failover_priority=(NETWORK, HOSTNAME)),
        ),
        (
            {"failoverPriority": [NETWORK, f"{REGION}=us", ZONE]},
            LocalityLbSetting(failover_priority=(NETWORK, f"{REGION}=us", ZONE)),
        ),
    ],
)
def test_the_setting_is_read_into_the_rules_load_balancer(setting: dict[str, Any], expected: LocalityLbSetting) -> None:
    outlier = {"consecutive5xxErrors": 1}
    obj = rule({"simple": "ROUND_ROBIN", "localityLbSetting": setting})
    obj["spec"]["trafficPolicy"]["outlierDetection"] = outlier
    parsed, skips = parse(obj)
    assert skips == []
    assert parsed.traffic_policy.load_balancer.locality == expected


def test_port_level_and_subset_settings_are_read_and_applied_as_the_policy_merge_says() -> None:
    top = {"failoverPriority": [ZONE]}
    port = {"failoverPriority": [HOSTNAME]}
    subset = {"enabled": False}
    obj = rule({"localityLbSetting": top})
    obj["spec"]["trafficPolicy"]["portLevelSettings"] = [
        {"port": {"number": 9090}, "loadBalancer": {"localityLbSetting": port}, "outlierDetection": {}}
    ]
    obj["spec"]["subsets"] = [
        {"name": "v1", "labels": {"v": "1"}, "trafficPolicy": {"loadBalancer": {"localityLbSetting": subset}}}
    ]
    parsed, skips = parse(obj)
    assert parsed is not None
    policy = parsed.traffic_policy
    assert policy.load_balancer.locality == LocalityLbSetting(failover_priority=(ZONE,))
    assert policy.port_level[0].load_balancer.locality == LocalityLbSetting(failover_priority=(HOSTNAME,))
    assert parsed.subsets[0].traffic_policy.load_balancer.locality == LocalityLbSetting(enabled=False)
    # istiod warns of failover without outlier detection in the same policy (the port entry has one).
    assert [(s.field, s.reason) for s in skips] == [
        (
            "spec.trafficPolicy.loadBalancer.localityLbSetting",
            "failover needs outlierDetection: without it every endpoint is picked alike",
        )
    ]


def test_a_label_workloads_do_not_carry_is_kept_and_noted() -> None:
    obj = rule({"localityLbSetting": {"failoverPriority": [ZONE, "app"]}})
    obj["spec"]["trafficPolicy"]["outlierDetection"] = {}
    parsed, skips = parse(obj)
    assert parsed.traffic_policy.load_balancer.locality.failover_priority == (ZONE, "app")
    assert [s.field for s in skips] == ["spec.trafficPolicy.loadBalancer.localityLbSetting.failoverPriority[1]"]


BAD = [
    ({"enabled": "yes"}, "enabled", "expected true or false"),
    (
        {"distribute": [{"from": "us", "to": {"us": 50}}], "failover": [{"from": "us", "to": "eu"}]},
        "distribute",
        "cannot both be set",
    ),
    ({"distribute": [{"from": "us", "to": {"us": 0, "eu": 100}}]}, "distribute[0].to", "1..100"),
    ({"distribute": [{"from": "us", "to": {"us": 60, "eu": 30}}]}, "distribute[0].to", "not 100"),
    ({"distribute": [{"from": "us", "to": {"us": "100"}}]}, "distribute[0].to", "locality: weight"),
    ({"distribute": [{"from": "us", "to": {"us": 50, "us/a": 50}}]}, "distribute[0].to", "overlaps"),
    ({"distribute": [{"from": "us", "to": {"us/*/a": 100}}]}, "distribute[0].to", "at the end"),
    ({"distribute": [{"from": "us", "to": {"us//a": 100}}]}, "distribute[0].to", "empty"),
    (
        {"distribute": [{"from": "*", "to": {"us": 100}}, {"from": "us", "to": {"us": 100}}]},
        "distribute",
        "overlaps",
    ),
    ({"failover": [{"from": "us", "to": "us"}]}, "failover[0]", "different regions"),
    ({"failover": [{"from": "us/a", "to": "eu"}]}, "failover[0]", "no '/'"),
    ({"failover": [{"from": "us", "to": "e*"}]}, "failover[0]", "'*'"),
    ({"failover": [{"from": "us", "to": "eu"}], "failoverPriority": [REGION]}, "failoverPriority[0]", "failover"),
    ({"failoverPriority": [1]}, "failoverPriority[0]", "expected a string"),
    ({"failoverPriority": [NETWORK] * 17}, "failoverPriority", "more than 16"),
    ({"distribute": [{"from": "*", "to": {"*": 100}}] * 65}, "distribute", "more than 64"),
]


@pytest.mark.parametrize(("setting", "field", "problem"), BAD)
def test_a_bad_setting_skips_the_rule_naming_the_field(setting: dict[str, Any], field: str, problem: str) -> None:
    parsed, skips = parse(rule({"localityLbSetting": setting}))
    assert parsed is None
    assert [s.field for s in skips] == [f"spec.trafficPolicy.loadBalancer.localityLbSetting.{field}"]
    assert problem in skips[0].reason


@pytest.mark.parametrize(("setting", "field", "problem"), BAD)
def test_the_webhook_refuses_a_bad_setting_at_any_level(setting: dict[str, Any], field: str, problem: str) -> None:
    obj = rule({})
    obj["spec"]["subsets"] = [
        {"name": "v1", "trafficPolicy": {"portLevelSettings": [{"port": {"number": 80}, "loadBalancer": {}}]}}
    ]
    obj["spec"]["subsets"][0]["trafficPolicy"]["portLevelSettings"][0]["loadBalancer"]["localityLbSetting"] = setting
    errors = [e for e in validate_destination_rule(obj).errors if not e.warning]
    at = "spec.subsets[0].trafficPolicy.portLevelSettings[0].loadBalancer.localityLbSetting"
    assert [e.path for e in errors] == [f"{at}.{field}"]
    assert problem in errors[0].message


def test_the_webhook_admits_istios_own_examples() -> None:
    setting = {
        "distribute": [{"from": "us-west/zone1/*", "to": {"us-west/zone1/*": 80, "us-west/zone2/*": 20}}],
    }
    assert validate_destination_rule(rule({"localityLbSetting": setting})).errors == []
    setting = {"failover": [{"from": "us-east", "to": "eu-west"}], "failoverPriority": [NETWORK, HOSTNAME]}
    assert validate_destination_rule(rule({"localityLbSetting": setting})).errors == []


json_values: st.SearchStrategy[Any] = st.recursive(
    st.none() | st.booleans() | st.integers(-5, 200) | st.sampled_from(["", "*", "us", "us/*", "eu/a", "a=b", NETWORK]),
    lambda inner: (
        st.lists(inner, max_size=4)
        | st.dictionaries(
            st.sampled_from(["enabled", "distribute", "failover", "failoverPriority", "from", "to", "us", "us/a", "*"]),
            inner,
            max_size=4,
        )
    ),
    max_leaves=24,
)


@settings(max_examples=400, deadline=None)
@given(json_values)
def test_any_setting_is_read_or_refused_by_field_never_raised_otherwise(value: Any) -> None:
    try:
        setting, _ = read_locality_lb(value, "s")
    except ShapeError as error:
        assert error.field.startswith("s")
        return
    assert setting_problems(setting) == []


def test_a_hostile_setting_is_refused_cheaply() -> None:
    huge = {"failoverPriority": ["x" * 1_000_000]}
    with pytest.raises(ShapeError, match="failoverPriority"):
        read_locality_lb(huge, "s")
    many = {"distribute": [{"from": "*", "to": {"*": 100}}] * 100_000}
    with pytest.raises(ShapeError, match="more than 64"):
        read_locality_lb(many, "s")
    regions = {"failover": [{"from": "a" * 100_000, "to": "b"}]}
    with pytest.raises(ShapeError, match="characters"):
        read_locality_lb(regions, "s")


# Picking.


def workload(name: str, region: str, zone: str, *, network: str = "", node: str = "n", subzone: str = "") -> Workload:
    return Workload(
        uid=f"Kubernetes//Pod/app/{name}",
        name=name,
        namespace="app",
        addresses=(ipaddress.ip_address(f"198.18.1.{ord(name[0])}"),),
        tunnel_protocol=TunnelProtocol.HBONE,
        node=node,
        network=network,
        locality=Locality(region, zone, subzone),
        services={KEY: (PortMapping(80, 8080),)},
    )


ME = dataclasses.replace(workload("me", "us", "a", node="n1"), services={})  # the proxy: not an endpoint of echo
# Named so that the farther endpoints sort first (by uid): a first-choice pick without locality takes them.
SAME_ZONE = workload("s-same-zone", "us", "a", node="n2")
SAME_NODE = workload("t-same-node", "us", "a", node="n1")
OTHER_ZONE = workload("c-other-zone", "us", "b")
EU = workload("d-eu", "eu", "a")
AP = workload("e-ap", "ap", "a")
FAR_NETWORK = workload("f-far-network", "us", "a", network="net2", node="n1")
ALL = (SAME_ZONE, SAME_NODE, OTHER_ZONE, EU, AP)


def names(kept: Sequence[Workload]) -> list[str]:
    return [w.name for w in kept]


@pytest.mark.parametrize(
    ("setting", "candidates", "expected"),
    [
        # Default failover (no failoverPriority): region/zone/subzone rings.
        (LocalityLbSetting(), ALL, ["s-same-zone", "t-same-node"]),
        (LocalityLbSetting(), (OTHER_ZONE, EU, AP), ["c-other-zone"]),
        (LocalityLbSetting(), (EU, AP), ["d-eu", "e-ap"]),
        # failover: the proxy's region fails over to eu before any other region.
        (LocalityLbSetting(failover=(LocalityFailover("us", "eu"),)), (AP, EU), ["d-eu"]),
        (LocalityLbSetting(failover=(LocalityFailover("us", "eu"),)), (AP,), ["e-ap"]),
        (LocalityLbSetting(failover=(LocalityFailover("eu", "ap"),)), (AP, EU), ["e-ap", "d-eu"]),
        # failoverPriority: the number of leading labels shared.
        (LocalityLbSetting(failover_priority=(REGION, ZONE, HOSTNAME)), ALL, ["t-same-node"]),
        # Only a run of leading labels counts: the zone after a node that differs does not.
        (
            LocalityLbSetting(failover_priority=(REGION, HOSTNAME, ZONE)),
            (SAME_ZONE, OTHER_ZONE),
            ["s-same-zone", "c-other-zone"],
        ),
        (LocalityLbSetting(failover_priority=(ZONE, REGION)), (OTHER_ZONE, SAME_ZONE, EU), ["s-same-zone"]),
        (LocalityLbSetting(failover_priority=(ZONE, REGION)), (OTHER_ZONE, EU), ["d-eu"]),
        (LocalityLbSetting(failover_priority=(f"{REGION}=eu",)), ALL, ["d-eu"]),
        # The network first: another network ranks behind every endpoint of the proxy's own.
        (LocalityLbSetting(failover_priority=(NETWORK, REGION, ZONE, HOSTNAME)), (FAR_NETWORK, AP), ["e-ap"]),
        (LocalityLbSetting(failover_priority=(REGION, NETWORK, HOSTNAME)), (FAR_NETWORK, OTHER_ZONE), ["c-other-zone"]),
        (
            LocalityLbSetting(failover_priority=(REGION, HOSTNAME, NETWORK)),
            (FAR_NETWORK, OTHER_ZONE),
            ["f-far-network"],
        ),
        # Both: failoverPriority first, failover regions within each of its ranks.
        (
            LocalityLbSetting(failover=(LocalityFailover("us", "ap"),), failover_priority=(HOSTNAME,)),
            (EU, AP, OTHER_ZONE),
            ["c-other-zone"],
        ),
        (
            LocalityLbSetting(failover=(LocalityFailover("us", "ap"),), failover_priority=(HOSTNAME,)),
            (EU, AP),
            ["e-ap"],
        ),
        # A label no workload carries compares as empty on both sides.
        (LocalityLbSetting(failover_priority=("app", ZONE)), (SAME_ZONE, OTHER_ZONE), ["s-same-zone"]),
        # Off.
        (LocalityLbSetting(enabled=False), ALL, names(ALL)),
    ],
)
def test_failover_ranks_as_istio_prioritises_for_envoy(
    setting: LocalityLbSetting, candidates: tuple[Workload, ...], expected: list[str]
) -> None:
    assert names(by_locality(setting, ME, candidates, failing_over=True)) == expected


def test_without_outlier_detection_nothing_fails_over() -> None:
    for setting in (LocalityLbSetting(), LocalityLbSetting(failover_priority=(REGION, ZONE))):
        assert names(by_locality(setting, ME, ALL, failing_over=False)) == names(ALL)


SPLIT = LocalityLbSetting(
    distribute=(
        LocalityDistribute("eu/*", (("eu", 100),)),
        LocalityDistribute("us/a", (("us/a", 80), ("us/b", 20))),
        LocalityDistribute("*", (("*", 100),)),
    )
)


@pytest.mark.parametrize(
    ("draw", "expected"),
    [(0.0, ["s-same-zone", "t-same-node"]), (0.79, ["s-same-zone", "t-same-node"]), (0.8, ["c-other-zone"])],
)
def test_distribute_draws_a_locality_by_weight_and_drops_the_unlisted(draw: float, expected: list[str]) -> None:
    assert names(by_locality(SPLIT, ME, ALL, failing_over=False, draw=draw)) == expected
    assert names(by_locality(SPLIT, ME, ALL, failing_over=True, draw=draw)) == expected  # no failover with it


def test_distribute_shares_a_wildcards_weight_by_endpoints_and_the_first_matching_from_decides() -> None:
    # "*": 100 over us/a (2 endpoints), us/b, eu/a and ap/a (1 each): 40, 20, 20, 20.
    from_eu = workload("me-eu", "eu", "z")
    assert names(by_locality(SPLIT, from_eu, ALL, failing_over=False, draw=0.5)) == ["d-eu"]
    from_ap = workload("me-ap", "ap", "z")
    assert names(by_locality(SPLIT, from_ap, ALL, failing_over=False, draw=0.39)) == ["s-same-zone", "t-same-node"]
    assert names(by_locality(SPLIT, from_ap, ALL, failing_over=False, draw=0.41)) == ["c-other-zone"]
    assert names(by_locality(SPLIT, from_ap, ALL, failing_over=False, draw=0.99)) == ["e-ap"]
    nowhere = LocalityLbSetting(distribute=(LocalityDistribute("eu", (("eu", 100),)),))
    assert names(by_locality(nowhere, ME, ALL, failing_over=False)) == names(ALL)


def test_setting_problems_follow_istios_validation_cases() -> None:
    ok = [
        LocalityLbSetting(distribute=(LocalityDistribute("us/*", (("us/a/*", 50), ("us/b", 50))),)),
        LocalityLbSetting(
            distribute=(LocalityDistribute("us", (("us", 100),)), LocalityDistribute("*", (("*", 100),)))
        ),
        LocalityLbSetting(failover=(LocalityFailover("us", "eu"),), failover_priority=(NETWORK, HOSTNAME)),
    ]
    assert [setting_problems(s) for s in ok] == [[], [], []]
    # Order matters, as in istiod: a zone after its region's wildcard overlaps it (the other way round passes).
    overlapping = LocalityLbSetting(distribute=(LocalityDistribute("us", (("us/*", 50), ("us/a", 50))),))
    assert setting_problems(overlapping) == [("distribute[0].to", "locality 'us/a' overlaps an earlier one")]
    reordered = LocalityLbSetting(distribute=(LocalityDistribute("us", (("us/a", 50), ("us/*", 50))),))
    assert setting_problems(reordered) == []


# Through the pickers.


def echo(mode: LoadBalancingMode = LoadBalancingMode.FAILOVER, preference: tuple[RoutingScope, ...] = ()) -> Service:
    return Service(
        name="echo",
        namespace="app",
        hostname="echo.app.svc.cluster.local",
        vips=(NetworkAddress("", ipaddress.ip_address("198.19.1.1")),),
        ports=(PortMapping(80, 8080),),
        load_balancing_mode=mode,
        routing_preference=preference or (RoutingScope.NETWORK, RoutingScope.REGION, RoutingScope.ZONE),
    )


def first(candidates: Sequence[Workload]) -> Workload:
    return candidates[0]


def picked(service: Service, locality: LocalityChoice | None, *candidates: Workload) -> str | None:
    state = WorkloadState()
    state.replace_all([ME, *candidates], [service])
    endpoint = pick_endpoint(state, service, 80, first, near=ME, locality=locality)
    return None if endpoint is None else endpoint.workload.name


def choice(setting: LocalityLbSetting, failing_over: bool = True, draw: float = 0.0) -> LocalityChoice:
    return LocalityChoice(setting, failing_over, lambda: draw)


def test_the_rules_setting_replaces_the_services_traffic_distribution() -> None:
    prefer_close = echo()
    assert picked(prefer_close, None, OTHER_ZONE, SAME_ZONE) == "s-same-zone"
    assert picked(prefer_close, choice(LocalityLbSetting(enabled=False)), OTHER_ZONE, SAME_ZONE) == "c-other-zone"
    assert (
        picked(prefer_close, choice(LocalityLbSetting(), failing_over=False), OTHER_ZONE, SAME_ZONE) == "c-other-zone"
    )
    hostname_first = choice(LocalityLbSetting(failover_priority=(HOSTNAME,)))
    assert picked(prefer_close, hostname_first, OTHER_ZONE, SAME_ZONE) == "c-other-zone"
    assert picked(prefer_close, hostname_first, OTHER_ZONE, SAME_ZONE, SAME_NODE) == "t-same-node"
    assert picked(prefer_close, choice(SPLIT, draw=0.9), EU, SAME_ZONE, OTHER_ZONE) == "c-other-zone"


def test_internal_traffic_policy_local_still_keeps_only_the_proxys_node() -> None:
    local = echo(LoadBalancingMode.STRICT, (RoutingScope.NODE,))
    assert picked(local, choice(LocalityLbSetting(enabled=False)), SAME_ZONE, SAME_NODE) == "t-same-node"
    assert picked(local, choice(LocalityLbSetting(enabled=False)), SAME_ZONE) is None


def test_an_ingress_gateway_applies_the_rule_to_the_backends_endpoints() -> None:
    state = WorkloadState()
    state.replace_all([ME, EU, AP], [echo()])
    setting = choice(LocalityLbSetting(failover=(LocalityFailover("us", "ap"),)))
    endpoint = pick_ingress_endpoint(state, echo(), 80, first, near=ME, locality=setting)
    assert endpoint is not None and endpoint.workload.name == "e-ap"


def test_the_backend_plan_carries_the_effective_setting_and_whether_it_fails_over() -> None:
    failover = LoadBalancer(locality=LocalityLbSetting(failover_priority=(ZONE,)))
    off = LoadBalancer(locality=LocalityLbSetting(enabled=False))
    rule = DestinationPolicy(
        KEY,
        traffic_policy=TrafficPolicy(
            load_balancer=failover,
            outlier_detection=OutlierDetection(),
            port_level=(PortTrafficPolicy(9090, load_balancer=failover),),
        ),
        subsets=(Subset("v1", frozenset(), TrafficPolicy(load_balancer=off)),),
    )

    def plan(port: int, subset: str = "") -> tuple[LocalityLbSetting, bool] | None:
        planned = plan_backend({KEY: rule}, BackendService("app", "echo.app.svc.cluster.local", port, subset))
        assert isinstance(planned, BackendPolicy)
        found = planned.locality(lambda: 0.5)
        return None if found is None else (found.setting, found.failing_over)

    assert plan(80) == (failover.locality, True)
    assert plan(9090) == (failover.locality, False)  # a port entry replaces outlier detection too
    assert plan(80, "v1") == (off.locality, True)  # the subset's load balancer, the rule's outlier detection
    unruled = plan_backend({}, BackendService("app", "echo.app.svc.cluster.local", 80))
    assert isinstance(unruled, BackendPolicy) and unruled.locality(lambda: 0.5) is None


def test_outlier_detection_alone_brings_the_default_meshs_failover_after_the_traffic_distribution() -> None:
    rule = DestinationPolicy(KEY, traffic_policy=TrafficPolicy(outlier_detection=OutlierDetection()))
    planned = plan_backend({KEY: rule}, BackendService("app", "echo.app.svc.cluster.local", 80))
    assert isinstance(planned, BackendPolicy)
    mesh = planned.locality(lambda: 0.5)
    assert mesh is not None
    assert (mesh.setting, mesh.failing_over, mesh.mesh_default) == (LocalityLbSetting(), True, True)
    # Without a traffic distribution: region, zone, subzone rings (Istio's default mesh localityLbSetting).
    plain = echo(LoadBalancingMode.UNSPECIFIED)
    other_subzone = workload("c-other-subzone", "us", "a", subzone="s1")
    assert picked(plain, mesh, other_subzone, SAME_ZONE) == "s-same-zone"
    assert picked(plain, None, other_subzone, SAME_ZONE) == "c-other-subzone"
    # A traffic distribution comes before the mesh's setting: PreferClose stops at the zone.
    assert picked(echo(), mesh, other_subzone, SAME_ZONE) == "c-other-subzone"
