"""The mesh config's ``localityLbSetting``: read and judged as a DestinationRule's
(:mod:`ambit.controlplane.translate.meshconfig` rule 11), carried to the waypoints and ingress gateways in their
configs (:mod:`ambit.xds.destinationrules` rule 8), and applied by the pickers after the rule's own setting and the
Service's traffic distribution (:mod:`ambit.model.locality_lb` rule 7, istiod's ``GetEffectiveLbSetting``)."""

from __future__ import annotations

import contextlib
import dataclasses
import ipaddress
import re
from typing import Any

import pytest
import yaml
from hypothesis import given, settings
from hypothesis import strategies as st

from ambit.api import gateway_pb2, waypoint_pb2
from ambit.controlplane.translate import translate_all
from ambit.controlplane.translate.meshconfig import (
    DEFAULT_MESH_CONFIG,
    MeshConfigError,
    MeshConfigMemo,
    mesh_config_of,
    parse_mesh_config,
)
from ambit.controlplane.translate.skips import Skipped
from ambit.model.destination_policy import DestinationPolicy, LoadBalancer, OutlierDetection, TrafficPolicy
from ambit.model.ingress import GatewayConfig
from ambit.model.locality_lb import (
    MESH_DEFAULT,
    LocalityChoice,
    LocalityDistribute,
    LocalityFailover,
    LocalityLbSetting,
)
from ambit.model.routes import BackendService, WaypointConfig
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
from ambit.waypoint.destinations import pick_endpoint
from ambit.waypoint.traffic_policy import BackendPolicy, plan_backend
from ambit.xds.errors import XdsConversionError
from ambit.xds.gateway import gateway_config_from_proto, gateway_config_to_proto
from ambit.xds.routes import decode_waypoint_config, pack_waypoint_config, waypoint_config_to_proto

Obj = dict[str, Any]
FAILOVER = LocalityLbSetting(failover=(LocalityFailover("us", "eu"),), failover_priority=("topology.istio.io/network",))
SPLIT = LocalityLbSetting(distribute=(LocalityDistribute("us/*", (("eu", 100),)),))

# --- the mesh config ----------------------------------------------------------------------------------------------

MESH_FAILOVER = """
localityLbSetting:
  failover: [{from: us, to: eu}]
  failoverPriority: [topology.istio.io/network]
"""


def test_the_setting_is_read_as_a_destination_rules_is() -> None:
    assert parse_mesh_config(MESH_FAILOVER).locality_lb == FAILOVER
    snake = "locality_lb_setting:\n  failover: [{from: us, to: eu}]\n  failover_priority: [topology.istio.io/network]\n"
    assert parse_mesh_config(snake).locality_lb == FAILOVER
    assert parse_mesh_config("localityLbSetting: {enabled: false}").locality_lb == LocalityLbSetting(enabled=False)
    distribute = "localityLbSetting: {distribute: [{from: us/*, to: {eu: 100}}]}"
    assert parse_mesh_config(distribute).locality_lb == SPLIT


@pytest.mark.parametrize("text", ["", "{}", "localityLbSetting: null", "localityLbSetting: {}", "trustDomain: td"])
def test_unset_or_null_is_istios_default(text: str) -> None:
    assert parse_mesh_config(text).locality_lb == MESH_DEFAULT == LocalityLbSetting()


@pytest.mark.parametrize(
    ("text", "field"),
    [
        ("localityLbSetting: [1]", "localityLbSetting"),
        ("localityLbSetting: {enabled: maybe}", "localityLbSetting.enabled"),
        ("localityLbSetting: {distribute: [{from: us, to: {eu: 60}}]}", "localityLbSetting.distribute[0].to"),
        (
            "localityLbSetting: {distribute: [{from: us, to: {eu: 100}}], failover: [{from: us, to: eu}]}",
            "localityLbSetting.distribute",
        ),
        ("localityLbSetting: {failover: [{from: us, to: us}]}", "localityLbSetting.failover[0]"),
    ],
)
def test_a_bad_setting_is_one_line_naming_the_field(text: str, field: str) -> None:
    with pytest.raises(MeshConfigError, match=f"^{re.escape(field)}: "):
        parse_mesh_config(text)


def test_a_bad_edit_keeps_the_previous_setting_in_force() -> None:
    memo = MeshConfigMemo()
    meta = {"name": "istio", "namespace": "istio-system"}

    skips: list[Skipped] = []

    def read(text: str, version: str) -> LocalityLbSetting:
        config_map = {"metadata": {**meta, "uid": "u", "resourceVersion": version}, "data": {"mesh": text}}
        return mesh_config_of([config_map], namespace="istio-system", memo=memo, skips=skips).locality_lb

    assert read(MESH_FAILOVER, "1") == FAILOVER
    assert read("localityLbSetting: {failover: [{from: us, to: us}]}", "2") == FAILOVER
    (problem,) = skips
    assert problem.field == "data.mesh" and "localityLbSetting.failover[0]" in problem.reason
    assert DEFAULT_MESH_CONFIG.locality_lb == MESH_DEFAULT


_KEYS = st.sampled_from(["enabled", "distribute", "failover", "failoverPriority", "from", "to", "eu", "us"])
_VALUES = st.recursive(
    st.none() | st.booleans() | st.integers() | st.text(max_size=8),
    lambda inner: st.lists(inner, max_size=3) | st.dictionaries(_KEYS, inner, max_size=4),
    max_leaves=12,
)


@given(_VALUES)
@settings(max_examples=300, deadline=None)
def test_any_setting_gives_a_config_or_a_mesh_config_error(value: Any) -> None:
    text = yaml.safe_dump({"localityLbSetting": value})
    with contextlib.suppress(MeshConfigError):
        parse_mesh_config(text)


# --- carried to the proxies ---------------------------------------------------------------------------------------

CLUSTER = """
apiVersion: v1
kind: Namespace
metadata: {name: shop, labels: {istio.io/use-waypoint: waypoint}}
---
apiVersion: gateway.networking.k8s.io/v1
kind: GatewayClass
metadata: {name: istio-waypoint}
spec: {controllerName: istio.io/mesh-controller}
---
apiVersion: gateway.networking.k8s.io/v1
kind: Gateway
metadata: {name: waypoint, namespace: shop}
spec:
  gatewayClassName: istio-waypoint
  listeners: [{name: mesh, port: 15008, protocol: HBONE}]
status:
  addresses: [{type: Hostname, value: waypoint.shop.svc.cluster.local}]
---
apiVersion: gateway.networking.k8s.io/v1
kind: Gateway
metadata: {name: edge, namespace: shop}
spec:
  gatewayClassName: istio
  listeners: [{name: http, port: 80, protocol: HTTP}]
---
apiVersion: gateway.networking.k8s.io/v1
kind: HTTPRoute
metadata: {name: cart, namespace: shop}
spec:
  parentRefs: [{name: edge}]
  rules: [{backendRefs: [{name: cart, port: 80}]}]
---
apiVersion: v1
kind: Service
metadata: {name: cart, namespace: shop}
spec: {clusterIP: 10.96.0.20, ports: [{name: http, port: 80}]}
"""
KINDS = {
    "Namespace": "namespaces",
    "Service": "services",
    "Gateway": "gateways",
    "GatewayClass": "gateway_classes",
    "HTTPRoute": "http_routes",
}


def translate(mesh: str | None) -> tuple[WaypointConfig, GatewayConfig]:
    inputs: dict[str, list[Obj]] = {name: [] for name in KINDS.values()}
    for obj in yaml.safe_load_all(CLUSTER):
        inputs[KINDS[obj["kind"]]].append(obj)
    inputs["namespaces"].append({"metadata": {"name": "istio-system"}})
    config_maps = []
    if mesh is not None:
        meta = {"name": "istio", "namespace": "istio-system"}
        config_maps.append({"apiVersion": "v1", "kind": "ConfigMap", "metadata": meta, "data": {"mesh": mesh}})
    translation = translate_all(pods=(), endpoint_slices=(), config_maps=config_maps, **inputs)  # type: ignore[arg-type]
    (waypoint,) = translation.waypoint_configs
    (gateway,) = translation.gateway_configs
    # what reaches the proxies is what their decoders accept
    assert (
        decode_waypoint_config(waypoint.waypoint, pack_waypoint_config(waypoint_config_to_proto(waypoint))) == waypoint
    )
    assert gateway_config_from_proto(gateway_config_to_proto(gateway), gateway.gateway) == gateway
    return waypoint, gateway


def test_every_waypoint_and_gateway_config_carries_the_meshs_setting() -> None:
    waypoint, gateway = translate(MESH_FAILOVER)
    assert waypoint.mesh_locality == gateway.mesh_locality == FAILOVER
    waypoint, gateway = translate("localityLbSetting: {enabled: false}")
    assert waypoint.mesh_locality == gateway.mesh_locality == LocalityLbSetting(enabled=False)
    waypoint, gateway = translate(None)
    assert waypoint.mesh_locality == gateway.mesh_locality == MESH_DEFAULT


def test_istios_default_travels_as_an_absent_field() -> None:
    assert not waypoint_config_to_proto(WaypointConfig("app/w")).HasField("mesh_locality_lb")
    assert not gateway_config_to_proto(GatewayConfig("app/g")).HasField("mesh_locality_lb")
    message = waypoint_config_to_proto(WaypointConfig("app/w", mesh_locality=LocalityLbSetting(enabled=False)))
    assert message.mesh_locality_lb.disabled


def test_a_setting_the_control_plane_would_refuse_is_refused_on_the_wire() -> None:
    bad = waypoint_pb2.LocalityLbSetting(failover=[waypoint_pb2.LocalityFailover(source="us", to="us")])
    waypoint = waypoint_pb2.WaypointConfig(waypoint="app/w", mesh_locality_lb=bad)
    with pytest.raises(XdsConversionError, match=r"mesh_locality_lb\.failover\[0\]"):
        decode_waypoint_config("app/w", pack_waypoint_config(waypoint))
    gateway = gateway_pb2.GatewayConfig(gateway="app/g", mesh_locality_lb=bad)
    with pytest.raises(XdsConversionError, match=r"mesh_locality_lb\.failover\[0\]"):
        gateway_config_from_proto(gateway, "app/g")


# --- applied by the pickers ---------------------------------------------------------------------------------------

KEY = "app/echo.app.svc.cluster.local"
ECHO_80 = BackendService("app", "echo.app.svc.cluster.local", 80)
OUTLIERS = TrafficPolicy(outlier_detection=OutlierDetection())


def workload(name: str, region: str, zone: str) -> Workload:
    return Workload(
        uid=f"Kubernetes//Pod/app/{name}",
        name=name,
        namespace="app",
        addresses=(ipaddress.ip_address(f"198.18.1.{ord(name[0])}"),),
        tunnel_protocol=TunnelProtocol.HBONE,
        node="n",
        locality=Locality(region, zone),
        services={KEY: (PortMapping(80, 8080),)},
    )


ME = dataclasses.replace(workload("me", "us", "a"), services={})
# Named so that a first-choice pick without locality takes the farthest.
AP = workload("a-ap", "ap", "a")
EU = workload("b-eu", "eu", "a")
OTHER_ZONE = workload("c-other-zone", "us", "b")
SAME_ZONE = workload("d-same-zone", "us", "a")


def echo(mode: LoadBalancingMode = LoadBalancingMode.UNSPECIFIED) -> Service:
    """``FAILOVER``: a traffic distribution (PreferClose); unspecified: none."""
    return Service(
        name="echo",
        namespace="app",
        hostname="echo.app.svc.cluster.local",
        vips=(NetworkAddress("", ipaddress.ip_address("198.19.1.1")),),
        ports=(PortMapping(80, 8080),),
        load_balancing_mode=mode,
        routing_preference=(RoutingScope.NETWORK, RoutingScope.REGION, RoutingScope.ZONE),
    )


def planned(rule: DestinationPolicy | None) -> BackendPolicy:
    found = plan_backend({} if rule is None else {KEY: rule}, ECHO_80)
    assert isinstance(found, BackendPolicy)
    return found


def picked(service: Service, locality: LocalityChoice | None, *candidates: Workload) -> str | None:
    state = WorkloadState()
    state.replace_all([ME, *candidates], [service])
    endpoint = pick_endpoint(state, service, 80, lambda c: c[0], near=ME, locality=locality)
    return None if endpoint is None else endpoint.workload.name


NO_RULE, OUTLIER_RULE = None, DestinationPolicy(KEY, traffic_policy=OUTLIERS)
OWN_RULE = DestinationPolicy(
    KEY, traffic_policy=dataclasses.replace(OUTLIERS, load_balancer=LoadBalancer(locality=LocalityLbSetting()))
)
OFF_RULE = DestinationPolicy(
    KEY,
    traffic_policy=dataclasses.replace(OUTLIERS, load_balancer=LoadBalancer(locality=LocalityLbSetting(enabled=False))),
)


@pytest.mark.parametrize(
    ("rule", "mesh", "expected"),
    [
        # The rule's own setting wins, whatever the mesh says; enabled: false there turns locality off.
        (OWN_RULE, LocalityLbSetting(enabled=False), (LocalityLbSetting(), True, False)),
        (OFF_RULE, FAILOVER, (LocalityLbSetting(enabled=False), True, False)),
        # No setting of its own: the mesh's.
        (OUTLIER_RULE, FAILOVER, (FAILOVER, True, True)),
        (OUTLIER_RULE, MESH_DEFAULT, (MESH_DEFAULT, True, True)),
        (OUTLIER_RULE, LocalityLbSetting(enabled=False), None),
        # Without outlier detection only a distribute can change a pick; without a rule too.
        (NO_RULE, FAILOVER, None),
        (NO_RULE, SPLIT, (SPLIT, False, True)),
        (DestinationPolicy(KEY), SPLIT, (SPLIT, False, True)),
        (NO_RULE, dataclasses.replace(SPLIT, enabled=False), None),
    ],
)
def test_the_effective_setting_follows_istiods_precedence(
    rule: DestinationPolicy | None, mesh: LocalityLbSetting, expected: tuple[LocalityLbSetting, bool, bool] | None
) -> None:
    found = planned(rule).locality(lambda: 0.5, mesh)
    assert (None if found is None else (found.setting, found.failing_over, found.mesh_default)) == expected


def test_the_meshs_failover_picks_as_a_rules_would() -> None:
    mesh = planned(OUTLIER_RULE).locality(lambda: 0.5, FAILOVER)
    assert picked(echo(), mesh, AP, EU) == "b-eu"  # from us, eu before any other region
    assert picked(echo(), None, AP, EU) == "a-ap"
    assert picked(echo(), mesh, AP, EU, OTHER_ZONE) == "c-other-zone"  # the proxy's own region first


def test_the_meshs_distribute_applies_to_a_service_without_a_rule() -> None:
    mesh = planned(NO_RULE).locality(lambda: 0.5, SPLIT)
    assert picked(echo(), mesh, SAME_ZONE, EU) == "b-eu"  # us/* sends everything to eu
    assert picked(echo(), mesh, SAME_ZONE) is None  # istiod sends Envoy no endpoint outside the distribution


def test_a_services_traffic_distribution_comes_before_the_meshs_setting() -> None:
    prefer_close = echo(LoadBalancingMode.FAILOVER)
    mesh = planned(NO_RULE).locality(lambda: 0.5, SPLIT)
    assert picked(prefer_close, mesh, EU, OTHER_ZONE, SAME_ZONE) == "d-same-zone"
    off = planned(OUTLIER_RULE).locality(lambda: 0.5, LocalityLbSetting(enabled=False))
    assert off is None and picked(prefer_close, off, EU, SAME_ZONE) == "d-same-zone"  # mesh off: still preferred
