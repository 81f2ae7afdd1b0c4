"""Telemetry → each waypoint's metric overrides (ambit.controlplane.translate.telemetry): upstream's
TestCustomizeMetrics object, which Telemetries reach a waypoint's requests, their precedence and merging, and what
is skipped with a reason."""

from __future__ import annotations

from typing import Any

import pytest
from tests.upstream_objects import customize_metrics_spec

from ambit.controlplane.translate import translate_all
from ambit.controlplane.translate.skips import Skipped
from ambit.controlplane.translate.telemetry import ServiceRef, translate_telemetry, waypoint_metrics
from ambit.model.metric_overrides import (
    Attribute,
    Expression,
    IstioMetric,
    MetricOverride,
    ServiceMetrics,
    TagOverride,
)

ROOT = "istio-system"
WAYPOINT = {"group": "gateway.networking.k8s.io", "kind": "Gateway", "name": "waypoint"}
REVIEWS, RATINGS = "app/reviews.app.svc.cluster.local", "app/ratings.app.svc.cluster.local"
SERVICES = {REVIEWS: ServiceRef("Service", "app", "reviews"), RATINGS: ServiceRef("Service", "app", "ratings")}
BOUND = {REVIEWS: "app/waypoint", RATINGS: "app/waypoint"}
UPSTREAM_SPEC: dict[str, Any] = customize_metrics_spec()


def tel(spec: dict[str, Any], namespace: str = "app", name: str = "t", created: str = "") -> dict[str, Any]:
    return {
        "apiVersion": "telemetry.istio.io/v1",
        "kind": "Telemetry",
        "metadata": {"name": name, "namespace": namespace, "uid": "u-" + name, "creationTimestamp": created},
        "spec": spec,
    }


def count_tags(**tags: str | None) -> dict[str, Any]:
    return {
        "metrics": [
            {
                "overrides": [
                    {
                        "match": {"metric": "REQUEST_COUNT"},
                        "tagOverrides": {
                            k: {"operation": "REMOVE"} if v is None else {"value": v} for k, v in tags.items()
                        },
                    }
                ]
            }
        ]
    }


def literal(text: str) -> Expression:
    return Expression(f"'{text}'", Attribute.LITERAL, text)


def resolve(*objects: dict[str, Any], waypoint: str = "app/waypoint") -> tuple[dict[str, Any], list[Skipped]]:
    skips: list[Skipped] = []
    translations = [t for t in (translate_telemetry(o, skips=skips) for o in objects) if t is not None]
    bound = {k: waypoint for k in BOUND}
    found = waypoint_metrics(
        translations, waypoints=[waypoint], services=SERVICES, bound=bound, canaries={}, root_namespace=ROOT
    )
    return {e.service_key: e for e in found.get(waypoint, ())}, skips


def count(entry: ServiceMetrics) -> dict[str, str | None]:
    (override,) = [o for o in entry.overrides if o.metric is IstioMetric.REQUEST_COUNT]
    return {t.name: None if t.value is None else t.value.argument for t in override.tags}


def test_upstreams_object_reaches_only_its_service_at_the_waypoint_through_translate_all() -> None:
    namespace = {"apiVersion": "v1", "kind": "Namespace", "metadata": {"name": "app"}}
    gateway_class = {"metadata": {"name": "istio-waypoint"}, "spec": {"controllerName": "istio.io/mesh-controller"}}
    gateway = {
        "metadata": {"name": "waypoint", "namespace": "app"},
        "spec": {
            "gatewayClassName": "istio-waypoint",
            "listeners": [{"name": "m", "port": 15008, "protocol": "HBONE"}],
        },
        "status": {"addresses": [{"type": "Hostname", "value": "waypoint.app.svc.cluster.local"}]},
    }

    def service(name: str, ip: str) -> dict[str, Any]:
        return {
            "metadata": {"name": name, "namespace": "app", "labels": {"istio.io/use-waypoint": "waypoint"}},
            "spec": {"clusterIP": ip, "ports": [{"name": "http", "port": 80}]},
        }

    translation = translate_all(
        [],
        [service("service-addressed-waypoint", "10.96.0.10"), service("other", "10.96.0.11")],
        [],
        [namespace],
        gateways=[gateway],
        gateway_classes=[gateway_class],
        telemetries=[tel(UPSTREAM_SPEC, name="ns-default")],
        root_namespace=ROOT,
    )
    assert translation.skipped == ()
    (config,) = translation.waypoint_configs
    assert config.metrics == (
        ServiceMetrics(
            "app/service-addressed-waypoint.app.svc.cluster.local",
            overrides=(
                MetricOverride(
                    IstioMetric.REQUEST_COUNT,
                    tags=(TagOverride("custom_dimension", literal("test")), TagOverride("source_principal")),
                ),
            ),
        ),
    )


def test_without_telemetries_nothing_is_overridden() -> None:
    assert resolve() == ({}, [])


def test_a_gateway_target_reaches_every_request_of_that_waypoint_only() -> None:
    found, _ = resolve(tel({"targetRefs": [WAYPOINT], **count_tags(a="'x'")}))
    assert list(found) == [""] and count(found[""]) == {"a": "x"}
    other, _ = resolve(tel({"targetRefs": [{**WAYPOINT, "name": "other"}], **count_tags(a="'x'")}))
    assert other == {}


def test_root_then_waypoint_namespace_then_service_target_later_ones_win_per_tag() -> None:
    found, skips = resolve(
        tel(count_tags(a="'root'", b="'root'", c="'root'"), namespace=ROOT, name="mesh"),
        tel(count_tags(b="'ns'", c="'ns'"), name="ns"),
        tel({"targetRefs": [{"kind": "Service", "name": "reviews"}], **count_tags(c="'svc'")}, name="svc"),
    )
    assert skips == []
    assert count(found[""]) == {"a": "root", "b": "ns", "c": "ns"}
    assert count(found[REVIEWS]) == {"a": "root", "b": "ns", "c": "svc"}
    assert RATINGS not in found  # the same as the waypoint-wide entry


def test_a_service_in_another_namespace_gets_its_namespace_wide_telemetry() -> None:
    refs = {**SERVICES, "shop/cart.shop.svc.cluster.local": ServiceRef("Service", "shop", "cart")}
    skips: list[Skipped] = []
    objects = [tel(count_tags(a="'shop'"), namespace="shop", name="shop-wide")]
    translations = [t for t in (translate_telemetry(o, skips=skips) for o in objects) if t is not None]
    found = waypoint_metrics(
        translations,
        waypoints=["app/waypoint"],
        services=refs,
        bound={"shop/cart.shop.svc.cluster.local": "app/waypoint"},
        canaries={},
        root_namespace=ROOT,
    )
    (entry,) = found["app/waypoint"]
    assert entry.service_key == "shop/cart.shop.svc.cluster.local" and count(entry) == {"a": "shop"}


def test_the_oldest_namespace_wide_telemetry_is_the_namespaces() -> None:
    found, _ = resolve(
        tel(count_tags(a="'new'"), name="a-new", created="2026-02-01T00:00:00Z"),
        tel(count_tags(a="'old'"), name="z-old", created="2026-01-01T00:00:00Z"),
    )
    assert count(found[""]) == {"a": "old"}


def test_selector_telemetries_never_reach_a_waypoint() -> None:
    assert resolve(tel({"selector": {"matchLabels": {"app": "waypoint"}}, **count_tags(a="'x'")})) == ({}, [])


def test_a_gateway_class_target_from_the_root_namespace_reaches_waypoints_there_as_istiod_looks_it_up() -> None:
    ref = {"group": "gateway.networking.k8s.io", "kind": "GatewayClass", "name": "istio-waypoint"}
    obj = tel({"targetRefs": [ref], **count_tags(a="'x'")}, namespace=ROOT)
    found, _ = resolve(obj, waypoint=f"{ROOT}/waypoint")
    assert count(found[""]) == {"a": "x"}
    assert resolve(tel({"targetRefs": [ref], **count_tags(a="'x'")}))[0] == {}  # not from another namespace


@pytest.mark.parametrize(("mode", "applies"), [("CLIENT", False), ("SERVER", True), ("CLIENT_AND_SERVER", True)])
def test_a_waypoint_reports_as_a_server(mode: str, applies: bool) -> None:
    spec = count_tags(a="'x'")
    spec["metrics"][0]["overrides"][0]["match"]["mode"] = mode
    found, _ = resolve(tel({"targetRefs": [WAYPOINT], **spec}))
    assert bool(found) is applies


def test_disabling_one_metric_and_all_metrics() -> None:
    one = {"metrics": [{"overrides": [{"match": {"metric": "REQUEST_DURATION"}, "disabled": True}]}]}
    found, _ = resolve(tel(one))
    assert found[""].overrides == (MetricOverride(IstioMetric.REQUEST_DURATION, disabled=True),)
    every = {"metrics": [{"overrides": [{"disabled": True}]}]}
    found, _ = resolve(tel(every))
    assert found[""] == ServiceMetrics("", disabled=True)
    again = {"metrics": [{"overrides": [{"match": {"metric": "REQUEST_COUNT"}, "disabled": False}]}]}
    found, _ = resolve(tel(every, namespace=ROOT, name="root"), tel(again))
    assert found == {}  # a later override naming a metric enables metrics again


def test_providers_without_prometheus_turn_the_waypoints_metrics_off_and_ignore_their_overrides() -> None:
    found, _ = resolve(
        tel({"metrics": [{"providers": [{"name": "stackdriver"}], **count_tags(a="'x'")["metrics"][0]}]})
    )
    assert found[""] == ServiceMetrics("", disabled=True)
    mixed = {
        "metrics": [
            {"providers": [{"name": "stackdriver"}], **count_tags(a="'sd'")["metrics"][0]},
            {"providers": [{"name": "prometheus"}], **count_tags(b="'prom'")["metrics"][0]},
        ]
    }
    found, _ = resolve(tel(mixed))
    assert count(found[""]) == {"b": "prom"}


def test_all_metrics_overrides_reach_every_standard_metric() -> None:
    spec = {"metrics": [{"overrides": [{"tagOverrides": {"request_protocol": {"operation": "REMOVE"}}}]}]}
    found, _ = resolve(tel(spec))
    assert {o.metric for o in found[""].overrides} == set(IstioMetric)


@pytest.mark.parametrize(
    ("spec", "field", "reason"),
    [
        (
            count_tags(a="request.auth.claims['sub']"),
            "spec.metrics[0].overrides[0].tagOverrides.a.value",
            "unsupported",
        ),
        (count_tags(a="'a' + 'b'"), "tagOverrides.a.value", "only a single string literal"),
        (count_tags(**{"bad-name": "'x'"}), "tagOverrides.bad-name", "not a valid metric label name"),
        (count_tags(le="'x'"), "tagOverrides.le", "reserved"),
        (count_tags(__name__="'x'"), "tagOverrides.__name__", "reserved"),
        ({"metrics": [{"overrides": [{"tagOverrides": {"a": {}}}]}]}, "tagOverrides.a.value", "required"),
        (
            {"metrics": [{"overrides": [{"tagOverrides": {"a": {"operation": "SET", "value": "'x'"}}}]}]},
            "tagOverrides.a.operation",
            "unknown operation",
        ),
        ({"metrics": [{"overrides": [{"match": {"customMetric": "m"}}]}]}, "match.customMetric", "custom metrics"),
        ({"metrics": [{"overrides": [{"match": {"metric": "NOPE"}}]}]}, "match.metric", "unknown metric"),
        ({"metrics": [{"overrides": [{"match": {"mode": "BOTH"}}]}]}, "match.mode", "unknown mode"),
        ({"metrics": [{"overrides": [{"disabled": "yes"}]}]}, "overrides[0].disabled", "expected a boolean"),
    ],
)
def test_what_cannot_be_applied_is_skipped_with_its_field_and_reason_and_the_rest_applies(
    spec: dict[str, Any], field: str, reason: str
) -> None:
    spec["metrics"].append(count_tags(ok="'kept'")["metrics"][0])
    found, skips = resolve(tel(spec))
    (skip,) = skips
    assert skip.kind == "Telemetry" and field in skip.field and reason in skip.reason, skip
    assert count(found[""])["ok"] == "kept"


def test_selector_and_target_refs_together_skip_the_whole_object() -> None:
    spec = {"selector": {"matchLabels": {"a": "b"}}, "targetRefs": [WAYPOINT], **count_tags(a="'x'")}
    found, skips = resolve(tel(spec))
    assert found == {} and [s.field for s in skips] == ["spec.selector"]


def test_a_target_of_another_kind_is_skipped() -> None:
    spec = {"targetRefs": [{"kind": "Pod", "name": "p"}, WAYPOINT], **count_tags(a="'x'")}
    found, skips = resolve(tel(spec))
    assert [s.field for s in skips] == ["spec.targetRefs[0].kind"] and count(found[""]) == {"a": "x"}


def test_a_canary_waypoint_gets_the_services_overrides_too() -> None:
    skips: list[Skipped] = []
    t = translate_telemetry(
        tel({"targetRefs": [{"kind": "Service", "name": "reviews"}], **count_tags(a="'x'")}), skips=skips
    )
    assert t is not None
    found = waypoint_metrics(
        [t],
        waypoints=["app/waypoint", "app/canary"],
        services=SERVICES,
        bound=BOUND,
        canaries={REVIEWS: "app/canary"},
        root_namespace=ROOT,
    )
    assert [e.service_key for e in found["app/canary"]] == [REVIEWS] == [e.service_key for e in found["app/waypoint"]]
