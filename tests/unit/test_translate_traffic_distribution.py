"""A Service's or ServiceEntry's load balancing (ambit.controlplane.translate.traffic_distribution): istiod's
precedence table, one row at a time, the translation memo following a namespace's annotation, and hostile
annotation values. The golden case ``traffic_distribution`` shows the same through the whole translation."""

from __future__ import annotations

from typing import Any

import pytest
from hypothesis import given
from hypothesis import strategies as st

from ambit.controlplane.translate import TranslationMemo, translate_all
from ambit.controlplane.translate.services import translate_service
from ambit.controlplane.translate.skips import Skipped
from ambit.controlplane.translate.traffic_distribution import (
    TRAFFIC_DISTRIBUTION_ANNOTATION,
    Distribution,
    entry_load_balancing,
    service_load_balancing,
    traffic_distribution,
)
from ambit.model.workload import HealthPolicy, LoadBalancingMode, RoutingScope

ANNOTATION = TRAFFIC_DISTRIBUTION_ANNOTATION
ZONE = (LoadBalancingMode.FAILOVER, (RoutingScope.NETWORK, RoutingScope.REGION, RoutingScope.ZONE))
NODE = (
    LoadBalancingMode.FAILOVER,
    (RoutingScope.NETWORK, RoutingScope.REGION, RoutingScope.ZONE, RoutingScope.SUBZONE, RoutingScope.NODE),
)
NONE: tuple[LoadBalancingMode, tuple[RoutingScope, ...]] = (LoadBalancingMode.UNSPECIFIED, ())


def svc(spec: dict[str, Any] | None = None, annotations: dict[str, str] | None = None) -> dict[str, Any]:
    return {
        "metadata": {"name": "web", "namespace": "shop", "annotations": annotations or {}},
        "spec": {"clusterIP": "198.19.0.1", "ports": [{"port": 80}], **(spec or {})},
    }


@pytest.mark.parametrize(
    ("spec", "own", "namespace", "expected"),
    [
        ({}, None, None, NONE),
        ({"trafficDistribution": "PreferClose"}, None, None, ZONE),
        ({"trafficDistribution": "PreferSameZone"}, None, None, ZONE),
        ({"trafficDistribution": "PreferSameNode"}, None, None, NODE),
        # The spec wins over both annotations.
        ({"trafficDistribution": "PreferClose"}, "PreferSameNode", "PreferSameNode", ZONE),
        # A spec value not known here is passed over (istiod's switch has no default), and is case-sensitive.
        ({"trafficDistribution": "preferclose"}, None, None, NONE),
        ({"trafficDistribution": "SomethingNew"}, "PreferSameNode", None, NODE),
        # The Service's annotation wins over its namespace's; annotations are read in any letter case.
        ({}, "PREFERSAMENODE", "PreferClose", NODE),
        ({}, None, "preferclose", ZONE),
        ({}, None, "PreferSameNode", NODE),
        # A set but unknown annotation is no distribution: the namespace's is not consulted.
        ({}, "Anywhere", "PreferSameNode", NONE),
        ({}, None, "Anywhere", NONE),
        ({}, "", "PreferClose", ZONE),  # an empty annotation is not set
        # internalTrafficPolicy: Local wins over every distribution.
        ({"internalTrafficPolicy": "Local", "trafficDistribution": "PreferSameNode"}, None, None, None),
        ({"internalTrafficPolicy": "Cluster", "trafficDistribution": "PreferClose"}, None, None, ZONE),
    ],
)
def test_the_load_balancing_follows_istiods_precedence(
    spec: dict[str, Any],
    own: str | None,
    namespace: str | None,
    expected: tuple[LoadBalancingMode, tuple[RoutingScope, ...]] | None,
) -> None:
    balancing = service_load_balancing(
        svc(spec, {ANNOTATION: own} if own is not None else None),
        {ANNOTATION: namespace} if namespace is not None else {},
    )
    if expected is None:
        expected = (LoadBalancingMode.STRICT, (RoutingScope.NODE,))
    assert (balancing.mode, balancing.routing_preference) == expected
    assert balancing.health_policy is HealthPolicy.ONLY_HEALTHY


def test_publish_not_ready_addresses_allows_all_with_or_without_a_distribution() -> None:
    alone = service_load_balancing(svc({"publishNotReadyAddresses": True}), {})
    assert (alone.mode, alone.routing_preference, alone.health_policy) == (*NONE, HealthPolicy.ALLOW_ALL)
    close = service_load_balancing(svc({"publishNotReadyAddresses": True, "trafficDistribution": "PreferClose"}), {})
    assert (close.mode, close.routing_preference, close.health_policy) == (*ZONE, HealthPolicy.ALLOW_ALL)
    # Only a real true: a string is not a boolean (the API server would not store one).
    assert (
        service_load_balancing(svc({"publishNotReadyAddresses": "true"}), {}).health_policy is HealthPolicy.ONLY_HEALTHY
    )


def test_a_translated_service_carries_it_and_an_unknown_own_annotation_is_reported() -> None:
    skips: list[Skipped] = []
    service = translate_service(
        svc({"trafficDistribution": "PreferSameNode", "publishNotReadyAddresses": True}),
        domain="cluster.local",
        network="",
        skips=skips,
    )
    assert service is not None
    assert (service.load_balancing_mode, service.routing_preference) == NODE
    assert service.health_policy is HealthPolicy.ALLOW_ALL
    assert skips == []
    translate_service(svc(annotations={ANNOTATION: "Closest"}), domain="cluster.local", network="", skips=skips)
    [skip] = skips
    assert skip.field == f"metadata.annotations[{ANNOTATION!r}]"
    assert skip.reason.startswith("'Closest' is not a traffic distribution: expected one of PreferClose")


@pytest.mark.parametrize(
    ("resolution", "own", "namespace", "expected", "health"),
    [
        ("NONE", "PreferClose", None, (LoadBalancingMode.PASSTHROUGH, ()), HealthPolicy.ALLOW_ALL),
        ("none", None, "PreferClose", (LoadBalancingMode.PASSTHROUGH, ()), HealthPolicy.ALLOW_ALL),
        ("STATIC", None, None, NONE, HealthPolicy.ONLY_HEALTHY),
        ("STATIC", None, "PreferSameNode", NODE, HealthPolicy.ONLY_HEALTHY),
        ("DNS", "preferclose", "PreferSameNode", ZONE, HealthPolicy.ONLY_HEALTHY),
    ],
)
def test_a_service_entry_takes_annotations_only_and_none_resolution_is_passthrough(
    resolution: str,
    own: str | None,
    namespace: str | None,
    expected: tuple[LoadBalancingMode, tuple[RoutingScope, ...]],
    health: HealthPolicy,
) -> None:
    balancing = entry_load_balancing(
        resolution,
        {ANNOTATION: own} if own is not None else {},
        {ANNOTATION: namespace} if namespace is not None else {},
    )
    assert (balancing.mode, balancing.routing_preference, balancing.health_policy) == (*expected, health)


def _namespace(annotation: str | None) -> dict[str, Any]:
    return {"metadata": {"name": "shop", "annotations": {ANNOTATION: annotation} if annotation else {}}}


def test_a_namespace_annotation_change_translates_its_services_again_through_the_memo() -> None:
    service = svc()
    service["metadata"].update(uid="u-1", resourceVersion="7")
    memo = TranslationMemo()
    first = translate_all([], [service], [], [_namespace(None)], translation_memo=memo)
    assert first.config.services[0].routing_preference == ()
    second = translate_all([], [service], [], [_namespace("PreferClose")], translation_memo=memo)
    assert (second.config.services[0].load_balancing_mode, second.config.services[0].routing_preference) == ZONE
    third = translate_all([], [service], [], [_namespace(None)], translation_memo=memo)
    assert third.config.services[0].routing_preference == ()


@given(st.text(max_size=2000), st.one_of(st.none(), st.integers(), st.text(max_size=50)))
def test_any_annotation_or_spec_value_gives_a_distribution_and_a_short_problem(value: str, spec: object) -> None:
    distribution, problem = traffic_distribution(spec, {ANNOTATION: value}, {ANNOTATION: value})
    assert isinstance(distribution, Distribution)
    assert len(problem) < 300
    balancing = service_load_balancing({"metadata": {"annotations": {ANNOTATION: value}}, "spec": spec}, {})
    assert balancing.mode in (LoadBalancingMode.UNSPECIFIED, LoadBalancingMode.FAILOVER)


@pytest.mark.parametrize("junk", [None, [], "x", 3, {"annotations": "x"}])
def test_malformed_objects_give_no_distribution_rather_than_a_traceback(junk: Any) -> None:
    assert service_load_balancing({"metadata": junk, "spec": junk}, {}).routing_preference == ()
