"""Canary waypoints (rule 9 of :mod:`ambit.controlplane.translate.waypoints`; istiod's weighted waypoints): which
canary a Service gets and why not, the weight as Go's ``Atoi`` reads it, the canary waypoint programmed with the
Service's policies, routes and RequestAuthentications, and ``Service.weighted_waypoints`` through xDS (field 13)
and the local file. Every refusal reason has its golden row in ``golden/translate/waypoint_canary-*.yaml``."""

from __future__ import annotations

import re
from typing import Any

import pytest
from google.protobuf.message import DecodeError
from hypothesis import given
from hypothesis import strategies as st

from ambit.api import workload_pb2 as pb
from ambit.controlplane.translate import translate_all
from ambit.controlplane.translate.waypoint_status import bound_status
from ambit.controlplane.translate.waypoints import WaypointIndex
from ambit.model.localconfig import LocalConfig, LocalConfigError, parse_local_config, render_local_config
from ambit.model.policy import Scope
from ambit.model.workload import GatewayAddress, NamespacedHostname, Service, WeightedWaypoint
from ambit.xds.convert import MAX_WEIGHTED_WAYPOINTS, XdsConversionError, address_from_proto, address_of

Obj = dict[str, Any]
USE = "istio.io/use-waypoint"
CANARY = "istio.io/use-waypoint-canary"
CANARY_NS = "istio.io/use-waypoint-canary-namespace"
WEIGHT = "istio.io/use-waypoint-canary-weight"


def gateway(name: str, namespace: str = "app", *, ready: bool = True, allowed: Obj | None = None, **labels: str) -> Obj:
    listener: Obj = {"name": "mesh", "port": 15008, "protocol": "HBONE"}
    if allowed is not None:
        listener["allowedRoutes"] = {"namespaces": allowed}
    return {
        "kind": "Gateway",
        "metadata": {"name": name, "namespace": namespace, "labels": labels},
        "spec": {"gatewayClassName": "istio-waypoint", "listeners": [listener]},
        "status": {
            "addresses": [{"type": "Hostname", "value": f"{name}.{namespace}.svc.cluster.local"}] if ready else []
        },
    }


def namespace(name: str, labels: dict[str, str] | None = None, annotations: dict[str, str] | None = None) -> Obj:
    return {"kind": "Namespace", "metadata": {"name": name, "labels": labels or {}, "annotations": annotations or {}}}


GATEWAYS = [
    gateway("primary"),
    gateway("canary"),
    gateway("coming", ready=False),
    gateway("wl", **{"istio.io/waypoint-for": "workload"}),
    gateway("open", "infra", allowed={"from": "All"}),
    gateway("private", "infra"),
]


def index(ns_labels: dict[str, str], ns_annotations: dict[str, str]) -> WaypointIndex:
    return WaypointIndex.build(
        GATEWAYS, (), [namespace("app", ns_labels, ns_annotations), namespace("infra")], network=""
    )


CASES: list[tuple[str, dict[str, str], dict[str, str], dict[str, str], dict[str, str], str, int | None, str]] = [
    # (case, labels, annotations, namespace labels, namespace annotations, primary, canary weight or None, reason)
    ("own canary", {USE: "primary", CANARY: "canary"}, {WEIGHT: "25"}, {}, {}, "app/primary", 25, ""),
    ("missing weight is 0", {USE: "primary", CANARY: "canary"}, {}, {}, {}, "app/primary", 0, ""),
    ("weight 100", {USE: "primary", CANARY: "canary"}, {WEIGHT: "100"}, {}, {}, "app/primary", 100, ""),
    ("Atoi sign and zeros", {USE: "primary", CANARY: "canary"}, {WEIGHT: "+007"}, {}, {}, "app/primary", 7, ""),
    ("inherited with the primary", {}, {}, {USE: "primary", CANARY: "canary"}, {WEIGHT: "40"}, "app/primary", 40, ""),
    (
        "own weight over the namespace's",
        {},
        {WEIGHT: "5"},
        {USE: "primary", CANARY: "canary"},
        {WEIGHT: "40"},
        "app/primary",
        5,
        "",
    ),
    (
        "own primary ignores the namespace canary",
        {USE: "primary"},
        {},
        {CANARY: "canary"},
        {WEIGHT: "40"},
        "app/primary",
        None,
        "",
    ),
    (
        "own primary ignores the namespace weight",
        {USE: "primary", CANARY: "canary"},
        {},
        {},
        {WEIGHT: "40"},
        "app/primary",
        0,
        "",
    ),
    (
        "own canary under a namespace primary",
        {CANARY: "canary"},
        {},
        {USE: "primary"},
        {WEIGHT: "9"},
        "app/primary",
        9,
        "",
    ),
    (
        "cross-namespace canary",
        {USE: "primary", CANARY: "open", CANARY_NS: "infra"},
        {WEIGHT: "1"},
        {},
        {},
        "app/primary",
        1,
        "",
    ),
    ("none", {USE: "primary", CANARY: "none"}, {WEIGHT: "10"}, {}, {}, "app/primary", None, ""),
    ("empty", {USE: "primary", CANARY: ""}, {WEIGHT: "10"}, {}, {}, "app/primary", None, ""),
    ("no primary, no canary", {CANARY: "canary"}, {WEIGHT: "10"}, {}, {}, "", None, ""),
    (
        "same as primary",
        {USE: "primary", CANARY: "primary"},
        {WEIGHT: "x"},
        {},
        {},
        "app/primary",
        None,
        "CanarySameAsPrimary",
    ),
    (
        "weight over 100",
        {USE: "primary", CANARY: "canary"},
        {WEIGHT: "101"},
        {},
        {},
        "app/primary",
        None,
        "CanaryInvalidWeight",
    ),
    (
        "negative weight",
        {USE: "primary", CANARY: "canary"},
        {WEIGHT: "-1"},
        {},
        {},
        "app/primary",
        None,
        "CanaryInvalidWeight",
    ),
    (
        "fraction",
        {USE: "primary", CANARY: "canary"},
        {WEIGHT: "2.5"},
        {},
        {},
        "app/primary",
        None,
        "CanaryInvalidWeight",
    ),
    (
        "unicode digits",
        {USE: "primary", CANARY: "canary"},
        {WEIGHT: "\u0665"},
        {},
        {},
        "app/primary",
        None,
        "CanaryInvalidWeight",
    ),
    (
        "invalid weight before a missing canary",
        {USE: "primary", CANARY: "nowhere"},
        {WEIGHT: "x"},
        {},
        {},
        "app/primary",
        None,
        "CanaryInvalidWeight",
    ),
    ("missing canary", {USE: "primary", CANARY: "nowhere"}, {}, {}, {}, "app/primary", None, "WaypointIsNotReady"),
    ("canary not ready", {USE: "primary", CANARY: "coming"}, {}, {}, {}, "app/primary", None, "WaypointIsNotReady"),
    (
        "canary denies",
        {USE: "primary", CANARY: "private", CANARY_NS: "infra"},
        {},
        {},
        {},
        "app/primary",
        None,
        "AttachmentDenied",
    ),
    ("workload-only canary", {USE: "primary", CANARY: "wl"}, {}, {}, {}, "app/primary", None, "UnsupportedTrafficType"),
    ("primary problem wins", {USE: "coming", CANARY: "nowhere"}, {}, {}, {}, "", None, "WaypointIsNotReady"),
]


@pytest.mark.parametrize(
    ("case", "labels", "annotations", "ns_labels", "ns_annotations", "primary", "weight", "reason"),
    CASES,
    ids=[c[0] for c in CASES],
)
def test_canary_binding(
    case: str,
    labels: dict[str, str],
    annotations: dict[str, str],
    ns_labels: dict[str, str],
    ns_annotations: dict[str, str],
    primary: str,
    weight: int | None,
    reason: str,
) -> None:
    binding = index(ns_labels, ns_annotations).find_for_service("app", labels, annotations)
    assert (binding.waypoint.key if binding.waypoint else "", binding.reason) == (primary, reason)
    if weight is None:
        assert binding.canary is None and binding.weighted == ()
    else:
        assert binding.canary is not None and binding.waypoint is not None
        assert binding.weighted == (
            WeightedWaypoint(binding.waypoint.address, 100 - weight),
            WeightedWaypoint(binding.canary.address, weight),
        )


def test_a_refused_canary_keeps_the_service_bound_and_says_why_after_istiods_words() -> None:
    labels = {USE: "primary", CANARY: "primary", "istio.io/ingress-use-waypoint": "true"}
    binding = index({}, {}).find_for_service("app", labels, {})
    status = bound_status({"metadata": {"name": "web", "namespace": "app", "generation": 4}}, binding)
    assert status is not None
    assert (status.accepted, status.reason, status.type, status.generation) == (
        True,
        "WaypointAccepted",
        "istio.io/WaypointBound",
        4,
    )
    assert status.message == (
        "Successfully attached to waypoint app/primary. Ingress traffic will traverse the waypoint. Canary waypoint"
        ' not attached: canary waypoint "app/primary" must differ from the primary waypoint'
    )


@given(st.text(max_size=12) | st.from_regex(r"[+-]?0*[0-9]{1,4}", fullmatch=True))
def test_the_weight_is_read_as_go_atoi_and_anything_else_is_refused_never_raised(text: str) -> None:
    labels = {USE: "primary", CANARY: "canary"}
    binding = index({}, {}).find_for_service("app", labels, {WEIGHT: text})
    valid = re.fullmatch(r"[+-]?[0-9]+", text, flags=re.ASCII) is not None and 0 <= int(text) <= 100
    assert (binding.canary is not None) == valid
    assert binding.reason == ("" if valid else "CanaryInvalidWeight")
    if valid:
        assert binding.canary_weight == int(text)


# -- the canary waypoint is programmed for the Service ------------------------------------------------------------


def _objects(canary_weight: str = "50") -> dict[str, Any]:
    svc = {
        "kind": "Service",
        "metadata": {
            "name": "web",
            "namespace": "app",
            "labels": {USE: "primary", CANARY: "canary"},
            "annotations": {WEIGHT: canary_weight},
        },
        "spec": {"clusterIP": "198.19.0.10", "ports": [{"port": 80}]},
    }
    svc_ref = {"group": "", "kind": "Service", "name": "web"}
    route = {
        "metadata": {"name": "web-route", "namespace": "app"},
        "spec": {
            "parentRefs": [svc_ref],
            "rules": [{"backendRefs": [{"name": "web", "port": 80}]}],
        },
    }
    policy = {
        "metadata": {"name": "web-authz", "namespace": "app"},
        "spec": {"targetRefs": [svc_ref], "action": "DENY", "rules": [{"to": [{"operation": {"paths": ["/x"]}}]}]},
    }
    authn = {
        "metadata": {"name": "web-jwt", "namespace": "app"},
        "spec": {
            "targetRefs": [svc_ref],
            "jwtRules": [{"issuer": "https://issuer.example", "jwksUri": "https://issuer.example/jwks"}],
        },
    }
    return {
        "pods": [],
        "services": [svc],
        "endpoint_slices": [],
        "namespaces": [namespace("app")],
        "gateways": [gateway("primary"), gateway("canary"), gateway("bystander")],
        "authorization_policies": [policy],
        "http_routes": [route],
        "request_authentications": [authn],
    }


def test_the_canary_waypoint_gets_the_services_policies_routes_and_authentications() -> None:
    translation = translate_all(**_objects())
    configs = {c.waypoint: c for c in translation.waypoint_configs}
    key = "app/web.app.svc.cluster.local"
    for waypoint in ("app/primary", "app/canary"):
        config = configs[waypoint]
        assert [(p.key, p.scope, p.services) for p in config.policies] == [("app/web-authz", Scope.SERVICE, (key,))]
        table = config.find_table(key, 80)
        assert table is not None and len(table.http) == 1, waypoint
        assert [(a.key, a.services) for a in config.request_authentications] == [("app/web-jwt", (key,))]
        assert config.services == (key,), waypoint  # both serve it only once this config is in
    bystander = configs["app/bystander"]
    assert (bystander.policies, bystander.tables, bystander.request_authentications) == ((), (), ())
    assert bystander.services == ()
    (service,) = translation.config.services
    assert service.waypoint == GatewayAddress(NamespacedHostname("app", "primary.app.svc.cluster.local"))
    assert [w.weight for w in service.weighted_waypoints] == [50, 50]
    statuses = {s.key: (s.accepted, s.message) for s in translation.waypoint_policy_status}
    assert statuses["app/web-authz"] == (True, "bound to app/primary")


def test_a_refused_canary_gets_nothing_of_the_service() -> None:
    translation = translate_all(**_objects(canary_weight="150"))
    configs = {c.waypoint: c for c in translation.waypoint_configs}
    assert configs["app/canary"].policies == () and configs["app/canary"].tables == ()
    assert configs["app/canary"].services == ()
    assert configs["app/primary"].services == ("app/web.app.svc.cluster.local",)
    assert configs["app/primary"].policies and configs["app/primary"].tables
    assert translation.config.services[0].weighted_waypoints == ()
    (status,) = translation.service_status
    assert status.reason == "WaypointAccepted" and "CanaryInvalid" not in status.message
    assert "has an invalid weight" in status.message


def test_a_route_from_the_canary_waypoints_namespace_is_refused_as_from_any_other() -> None:
    objects = _objects()
    objects["namespaces"] = [namespace("app"), namespace("infra")]
    objects["gateways"] = [gateway("primary"), gateway("canary", "infra", allowed={"from": "All"})]
    objects["services"][0]["metadata"]["labels"][CANARY_NS] = "infra"
    route = objects["http_routes"][0]
    route["metadata"]["namespace"] = "infra"
    route["spec"]["parentRefs"][0]["namespace"] = "app"
    translation = translate_all(**objects)
    configs = {c.waypoint: c for c in translation.waypoint_configs}
    assert [w.weight for w in translation.config.services[0].weighted_waypoints] == [50, 50]
    for waypoint in ("app/primary", "infra/canary"):
        table = configs[waypoint].find_table("app/web.app.svc.cluster.local", 80)
        assert table is not None and table.http == (), waypoint  # the Service, without the foreign route
    (status,) = translation.route_status
    (parent,) = status.parents
    accepted = next(c for c in parent.conditions if c.type == "Accepted")
    assert (accepted.status, accepted.reason) == (False, "NotAllowedByListeners")


# -- the wire and the file ---------------------------------------------------------------------------------------

PRIMARY = GatewayAddress(NamespacedHostname("app", "primary.app.svc.cluster.local"))
CANARY_ADDRESS = GatewayAddress(NamespacedHostname("app", "canary.app.svc.cluster.local"), 15009)
WEIGHTED = Service(
    "web",
    "app",
    "web.app.svc.cluster.local",
    waypoint=PRIMARY,
    weighted_waypoints=(WeightedWaypoint(PRIMARY, 70), WeightedWaypoint(CANARY_ADDRESS, 30)),
)


def test_weighted_waypoints_round_trip_through_xds_on_field_13_and_through_the_local_file() -> None:
    message = address_of(WEIGHTED)
    assert address_from_proto(message) == WEIGHTED
    assert pb.Service.DESCRIPTOR.fields_by_name["weighted_waypoints"].number == 13
    assert pb.WeightedWaypoint.DESCRIPTOR.fields_by_name["destination"].number == 1
    assert pb.WeightedWaypoint.DESCRIPTOR.fields_by_name["weight"].number == 2
    assert [w.weight for w in message.service.weighted_waypoints] == [70, 30]
    config = LocalConfig(workloads=(), services=(WEIGHTED,))
    assert parse_local_config(render_local_config(config)) == config
    plain = LocalConfig(workloads=(), services=(Service("web", "app", "web.app.svc.cluster.local", waypoint=PRIMARY),))
    assert "weightedWaypoints" not in render_local_config(plain)  # older files render the same


def test_a_malformed_weighted_set_from_a_peer_is_refused_with_its_field() -> None:
    message = address_of(WEIGHTED)
    message.service.weighted_waypoints[1].ClearField("destination")
    with pytest.raises(XdsConversionError, match=r"service\.weighted_waypoints\[1\]\.destination: missing"):
        address_from_proto(message)
    message = address_of(WEIGHTED)
    message.service.weighted_waypoints[0].destination.hbone_mtls_port = 0
    with pytest.raises(XdsConversionError, match=r"weighted_waypoints\[0\]\.destination\.hbone_mtls_port"):
        address_from_proto(message)
    message = address_of(WEIGHTED)
    for _ in range(MAX_WEIGHTED_WAYPOINTS):
        message.service.weighted_waypoints.add().CopyFrom(message.service.weighted_waypoints[0])
    with pytest.raises(XdsConversionError, match="more than 16"):
        address_from_proto(message)


@pytest.mark.parametrize(
    ("weighted", "problem"),
    [
        ("x", "expected a list"),
        ([{"weight": 1}], r"weightedWaypoints\[0\]\.destination: required"),
        ([{"destination": {"address": "/198.19.0.9"}, "weight": -1}], r"weight: expected an integer"),
        ([{"destination": {"address": "/198.19.0.9"}, "weight": True}], r"weight: expected an integer"),
        ([{"destination": {"address": "/198.19.0.9"}, "weight": 1, "extra": 2}], "extra"),
    ],
)
def test_a_malformed_weighted_set_in_the_local_file_is_a_clear_error(weighted: Any, problem: str) -> None:
    text = (
        "services:\n- name: web\n  namespace: app\n  hostname: web.app.svc.cluster.local\n"
        f"  weightedWaypoints: {__import__('json').dumps(weighted)}\n"
    )
    with pytest.raises(LocalConfigError, match=problem):
        parse_local_config(text)


gateway_addresses = st.builds(
    GatewayAddress,
    st.builds(
        NamespacedHostname,
        st.from_regex(r"[a-z][a-z0-9-]{0,10}", fullmatch=True),
        st.from_regex(r"[a-z][a-z0-9.-]{0,20}", fullmatch=True),
    ),
    st.integers(1, 65535),
)
weighted_sets = st.lists(
    st.builds(WeightedWaypoint, gateway_addresses, st.integers(0, 0xFFFFFFFF)), max_size=MAX_WEIGHTED_WAYPOINTS
)


@given(weighted_sets)
def test_any_weighted_set_round_trips_through_xds_and_the_local_file(entries: list[WeightedWaypoint]) -> None:
    service = Service("web", "app", "web.app.svc.cluster.local", waypoint=PRIMARY, weighted_waypoints=tuple(entries))
    assert address_from_proto(address_of(service)) == service
    config = LocalConfig(workloads=(), services=(service,))
    assert parse_local_config(render_local_config(config)) == config


@given(st.lists(st.binary(max_size=40), max_size=3))
def test_arbitrary_bytes_in_the_weighted_set_decode_or_are_refused_with_a_conversion_error(blobs: list[bytes]) -> None:
    message = address_of(WEIGHTED)
    for blob in blobs:
        # Field 13 of Service, length-delimited: one more WeightedWaypoint made of arbitrary bytes.
        raw = message.service.SerializeToString() + bytes([13 << 3 | 2, len(blob)]) + blob
        try:
            message.service.CopyFrom(pb.Service.FromString(raw))
        except DecodeError:
            continue  # not a message at all: the xDS layer refuses it before conversion
    try:
        decoded = address_from_proto(message)
    except XdsConversionError:
        return
    assert isinstance(decoded, Service) and len(decoded.weighted_waypoints) >= 2
