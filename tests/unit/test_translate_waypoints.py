"""Waypoint binding (spec §1.4, §4.1, §10.3): the rules of :mod:`ambit.controlplane.translate.waypoints` one by
one, table-driven, a fuzz test over arbitrary labels and Gateways, the waypoint fields through xDS and the local
YAML form, and the WaypointBound status plan."""

from __future__ import annotations

import ipaddress
from typing import Any

import pytest
import yaml
from hypothesis import given, settings
from hypothesis import strategies as st

from ambit.controlplane.status import plan_conditions
from ambit.controlplane.translate import translate_all
from ambit.controlplane.translate.waypoint_status import WAYPOINT_BOUND, bound_status
from ambit.controlplane.translate.waypoints import Binding, WaypointIndex
from ambit.model.localconfig import LocalConfig, LocalConfigError, parse_local_config, render_local_config
from ambit.model.workload import GatewayAddress, NamespacedHostname, NetworkAddress, Service, Workload
from ambit.xds.convert import XdsConversionError, address_from_proto, address_of

Obj = dict[str, Any]
HOST = GatewayAddress(NamespacedHostname("app", "waypoint.app.svc.cluster.local"))


def gateway(
    name: str = "waypoint",
    namespace: str = "app",
    *,
    addresses: list[Obj] | None = None,
    labels: dict[str, str] | None = None,
    allowed: Obj | None = None,
    class_name: str = "istio-waypoint",
) -> Obj:
    listener: Obj = {"name": "mesh", "port": 15008, "protocol": "HBONE"}
    if allowed is not None:
        listener["allowedRoutes"] = {"namespaces": allowed}
    return {
        "kind": "Gateway",
        "metadata": {"name": name, "namespace": namespace, "labels": labels or {}},
        "spec": {"gatewayClassName": class_name, "listeners": [listener]},
        "status": {
            "addresses": [{"type": "Hostname", "value": f"{name}.{namespace}.svc.cluster.local"}]
            if addresses is None
            else addresses
        },
    }


def namespace(name: str, **labels: str) -> Obj:
    return {"kind": "Namespace", "metadata": {"name": name, "labels": labels}}


def index(*gateways: Obj, namespaces: tuple[Obj, ...] = (), classes: tuple[Obj, ...] = ()) -> WaypointIndex:
    return WaypointIndex.build(gateways, classes, (namespace("app"), *namespaces), network="")


def key(binding: Binding) -> str | None:
    return None if binding.waypoint is None else binding.waypoint.key


USE = "istio.io/use-waypoint"
USE_NS = "istio.io/use-waypoint-namespace"


# -- which Gateways are waypoints, and their address (rules 1, 2) --------------------------------------------------
@pytest.mark.parametrize(
    ("addresses", "expected"),
    [
        ([{"type": "Hostname", "value": "wp.app.svc"}], GatewayAddress(NamespacedHostname("app", "wp.app.svc"))),
        (
            [{"type": "IPAddress", "value": "198.19.0.9"}, {"type": "Hostname", "value": "wp.app.svc"}],
            GatewayAddress(NamespacedHostname("app", "wp.app.svc")),
        ),
        ([{"type": "IPAddress", "value": "198.19.0.9"}], GatewayAddress(NetworkAddress.parse("/198.19.0.9"))),
        ([{"value": "198.19.0.9"}], GatewayAddress(NetworkAddress.parse("/198.19.0.9"))),
        (
            [{"type": "IPAddress", "value": "not-an-ip"}, {"value": "2001:db8::9"}],
            GatewayAddress(NetworkAddress.parse("/2001:db8::9")),
        ),
        ([], None),
        ([{"type": "IPAddress", "value": "bogus"}], None),
        ([{"type": "NamedAddress", "value": "x"}], None),
    ],
)
def test_a_waypoint_is_ready_only_with_a_usable_address_and_a_hostname_wins(
    addresses: list[Obj], expected: GatewayAddress | None
) -> None:
    found = index(gateway("wp", addresses=addresses)).ready.get("app/wp")
    assert (found.address if found else None) == expected


def test_only_the_istio_waypoint_class_is_declared_and_another_class_is_a_sandwich() -> None:
    idx = index(gateway("ingress", class_name="istio"), gateway("waypoint"))
    assert idx.declared == frozenset({"app/waypoint"})
    assert [(k, w.sandwich) for k, w in sorted(idx.ready.items())] == [("app/ingress", True), ("app/waypoint", False)]


@pytest.mark.parametrize(
    ("gateway_label", "class_label", "expected"),
    [(None, None, "service"), (None, "all", "all"), ("workload", "all", "workload"), ("none", None, "none")],
)
def test_traffic_type_comes_from_the_gateway_else_its_class_else_service(
    gateway_label: str | None, class_label: str | None, expected: str
) -> None:
    labels = {"istio.io/waypoint-for": gateway_label} if gateway_label else {}
    cls = {
        "metadata": {"name": "istio-waypoint", "labels": {"istio.io/waypoint-for": class_label} if class_label else {}}
    }
    found = index(gateway(labels=labels), classes=(cls,)).ready["app/waypoint"]
    assert found.traffic_type == expected


# -- binding (rules 3-6) ---------------------------------------------------------------------------------------------
SERVICE_CASES: list[tuple[str, dict[str, str], dict[str, str], str | None, str]] = [
    # (case, object labels, namespace labels, bound waypoint key, reason)
    ("own label", {USE: "waypoint"}, {}, "app/waypoint", ""),
    ("namespace default", {}, {USE: "waypoint"}, "app/waypoint", ""),
    ("none opts out of the namespace", {USE: "none"}, {USE: "waypoint"}, None, ""),
    ("none on the namespace", {}, {USE: "none"}, None, ""),
    ("no label anywhere", {}, {}, None, ""),
    ("missing waypoint", {USE: "nowhere"}, {}, None, "WaypointIsNotReady"),
    ("empty name", {USE: ""}, {}, None, "WaypointIsNotReady"),
    ("not ready", {USE: "coming"}, {}, None, "WaypointIsNotReady"),
    ("namespace names a missing one", {}, {USE: "nowhere"}, None, "WaypointIsNotReady"),
    ("workload-only waypoint", {USE: "wl"}, {}, None, "UnsupportedTrafficType"),
    ("cross namespace, All", {USE: "open", USE_NS: "infra"}, {}, "infra/open", ""),
    ("cross namespace, Same", {USE: "private", USE_NS: "infra"}, {}, None, "AttachmentDenied"),
    ("cross namespace, Selector matches", {USE: "picky", USE_NS: "infra"}, {"team": "a"}, "infra/picky", ""),
    ("cross namespace, Selector does not", {USE: "picky", USE_NS: "infra"}, {"team": "b"}, None, "AttachmentDenied"),
    ("malformed selector admits none", {USE: "broken", USE_NS: "infra"}, {"team": "a"}, None, "AttachmentDenied"),
    ("namespace's own namespace label", {}, {USE: "open", USE_NS: "infra"}, "infra/open", ""),
    ("namespace default across namespaces, Same", {}, {USE: "private", USE_NS: "infra"}, None, "AttachmentDenied"),
    (
        "a waypoint's own Service",
        {USE: "waypoint", "gateway.istio.io/managed": "istio.io-mesh-controller"},
        {},
        None,
        "",
    ),
    ("an east/west gateway", {"gateway.istio.io/managed": "istio.io-eastwest-controller"}, {USE: "waypoint"}, None, ""),
]


def full_index(namespace_labels: dict[str, str]) -> WaypointIndex:
    return WaypointIndex.build(
        [
            gateway(),
            gateway("wl", labels={"istio.io/waypoint-for": "workload"}),
            gateway("all", labels={"istio.io/waypoint-for": "all"}),
            gateway("coming", addresses=[]),
            gateway("open", "infra", labels={"istio.io/waypoint-for": "all"}, allowed={"from": "All"}),
            gateway("private", "infra", labels={"istio.io/waypoint-for": "all"}),
            gateway(
                "picky",
                "infra",
                labels={"istio.io/waypoint-for": "all"},
                allowed={"from": "Selector", "selector": {"matchLabels": {"team": "a"}}},
            ),
            gateway("broken", "infra", allowed={"from": "Selector", "selector": {"matchLabels": ["team"]}}),
        ],
        (),
        [namespace("app", **namespace_labels), namespace("infra")],
        network="",
    )


@pytest.mark.parametrize(
    ("case", "labels", "ns_labels", "bound", "reason"), SERVICE_CASES, ids=[c[0] for c in SERVICE_CASES]
)
def test_service_binding(
    case: str, labels: dict[str, str], ns_labels: dict[str, str], bound: str | None, reason: str
) -> None:
    binding = full_index(ns_labels).find_for_service("app", labels)
    assert (key(binding), binding.reason) == (bound, reason)


WORKLOAD_CASES: list[tuple[str, dict[str, str], dict[str, str], bool, str | None, str]] = [
    # (case, labels, namespace labels, is a pod, bound waypoint key, reason)
    ("own label, workload waypoint", {USE: "wl"}, {}, True, "app/wl", ""),
    ("own label, all", {USE: "all"}, {}, True, "app/all", ""),
    ("own label, service-only waypoint", {USE: "waypoint"}, {}, True, None, "UnsupportedTrafficType"),
    ("namespace default, service-only: no error", {}, {USE: "waypoint"}, True, None, ""),
    ("namespace default, workload waypoint", {}, {USE: "wl"}, True, "app/wl", ""),
    ("a waypoint's own pod", {"gateway.networking.k8s.io/gateway-name": "wl", USE: "all"}, {}, True, None, ""),
    (
        "a pod of a waypoint still coming up",
        {"gateway.networking.k8s.io/gateway-name": "coming"},
        {USE: "wl"},
        True,
        None,
        "",
    ),
    (
        "gateway-name of no waypoint",
        {"gateway.networking.k8s.io/gateway-name": "ingress"},
        {USE: "wl"},
        True,
        "app/wl",
        "",
    ),
    (
        "not a pod: the gateway-name label means nothing",
        {"gateway.networking.k8s.io/gateway-name": "wl"},
        {USE: "wl"},
        False,
        "app/wl",
        "",
    ),
    ("none", {USE: "none"}, {USE: "wl"}, True, None, ""),
    ("cross namespace denied", {USE: "private", USE_NS: "infra"}, {}, True, None, "AttachmentDenied"),
]


@pytest.mark.parametrize(
    ("case", "labels", "ns_labels", "is_pod", "bound", "reason"), WORKLOAD_CASES, ids=[c[0] for c in WORKLOAD_CASES]
)
def test_workload_binding(
    case: str, labels: dict[str, str], ns_labels: dict[str, str], is_pod: bool, bound: str | None, reason: str
) -> None:
    binding = full_index(ns_labels).find_for_workload("app", labels, pod=is_pod)
    assert (key(binding), binding.reason) == (bound, reason)


@pytest.mark.parametrize(
    ("labels", "ns_labels", "expected"),
    [
        ({"istio.io/ingress-use-waypoint": "true"}, {}, True),
        ({"istio.io/ingress-use-waypoint": "1"}, {}, True),
        ({"istio.io/ingress-use-waypoint": "yes"}, {}, False),
        ({}, {"istio.io/ingress-use-waypoint": "TRUE"}, True),
        ({"istio.io/ingress-use-waypoint": "false"}, {"istio.io/ingress-use-waypoint": "true"}, False),
    ],
)
def test_ingress_use_waypoint_reads_the_object_then_its_namespace_as_parse_bool(
    labels: dict[str, str], ns_labels: dict[str, str], expected: bool
) -> None:
    binding = full_index({USE: "waypoint", **ns_labels}).find_for_service("app", labels)
    assert binding.ingress_use_waypoint is expected


# -- status (waypoint_status rule 7) -----------------------------------------------------------------------------------
def test_bound_status_words_it_as_istiod_and_no_binding_means_no_condition() -> None:
    svc = {"metadata": {"name": "web", "namespace": "app", "generation": 2}}
    idx = full_index({})
    bound = bound_status(svc, idx.find_for_service("app", {USE: "waypoint"}))
    assert bound is not None
    assert (bound.type, bound.accepted, bound.reason, bound.message, bound.generation) == (
        WAYPOINT_BOUND,
        True,
        "WaypointAccepted",
        "Successfully attached to waypoint app/waypoint",
        2,
    )
    refused = bound_status(svc, idx.find_for_service("app", {USE: "nowhere"}))
    assert refused is not None and (refused.accepted, refused.reason) == (False, "WaypointIsNotReady")
    assert refused.message == 'waypoint "app/nowhere" is not ready'
    assert bound_status(svc, idx.find_for_service("app", {})) is None


def test_the_waypoint_bound_plan_writes_once_keeps_other_conditions_and_removes_it_when_the_label_goes() -> None:
    svc = {"metadata": {"name": "web", "namespace": "app", "generation": 1}}
    wanted = bound_status(svc, full_index({}).find_for_service("app", {USE: "waypoint"}))
    other = {"type": "istio.io/VisibilityApplied", "status": "True"}
    first = plan_conditions([other], wanted, "2026-01-01T00:00:00Z", WAYPOINT_BOUND)
    assert first is not None and first[0] == other and first[1]["type"] == WAYPOINT_BOUND
    assert plan_conditions(first, wanted, "2026-01-01T00:00:09Z", WAYPOINT_BOUND) is None  # no status loop
    assert plan_conditions(first, None, "2026-01-01T00:00:09Z", WAYPOINT_BOUND) == [other]
    assert plan_conditions([other], None, "2026-01-01T00:00:09Z", WAYPOINT_BOUND) is None
    # The policy writer's condition is not this one: a WaypointBound plan never touches ZtunnelAccepted.
    ztunnel = {"type": "ZtunnelAccepted", "status": "True"}
    assert plan_conditions([ztunnel], None, "2026-01-01T00:00:09Z", WAYPOINT_BOUND) is None


# -- the whole translation ---------------------------------------------------------------------------------------------
def test_a_namespace_label_binds_its_services_and_the_status_follows_it() -> None:
    svc = {
        "metadata": {"name": "web", "namespace": "app"},
        "spec": {"clusterIP": "198.19.0.10", "ports": [{"port": 80}]},
    }
    pod = {
        "metadata": {"name": "web-1", "namespace": "app"},
        "status": {"phase": "Running", "podIP": "198.18.1.10"},
    }
    bound = translate_all([pod], [svc], [], [namespace("app", **{USE: "waypoint"})], gateways=[gateway()])
    assert bound.config.services[0].waypoint == HOST
    assert bound.config.workloads[0].waypoint is None  # a service waypoint does not take pod traffic
    assert [s.reason for s in bound.service_status] == ["WaypointAccepted"]
    unbound = translate_all([pod], [svc], [], [namespace("app")], gateways=[gateway()])
    assert unbound.config.services[0].waypoint is None and unbound.service_status == ()


label_text = st.text(st.characters(codec="utf-8", exclude_categories=("Cs",)), max_size=12)
any_value: st.SearchStrategy[Any] = st.one_of(
    st.none(),
    st.integers(),
    label_text,
    st.lists(label_text, max_size=2),
    st.dictionaries(label_text, label_text, max_size=2),
)
label_keys = st.sampled_from(
    [
        USE,
        USE_NS,
        "istio.io/waypoint-for",
        "istio.io/ingress-use-waypoint",
        "gateway.istio.io/managed",
        "gateway.networking.k8s.io/gateway-name",
    ]
)
labels_st = st.dictionaries(
    label_keys, st.one_of(label_text, st.sampled_from(["waypoint", "none", "all", "app"]), any_value), max_size=4
)
gateway_st = st.fixed_dictionaries(
    {
        "metadata": st.fixed_dictionaries(
            {
                "name": st.sampled_from(["waypoint", "wl", ""]),
                "namespace": st.sampled_from(["app", "x"]),
                "labels": st.one_of(labels_st, any_value),
            }
        ),
        "spec": st.one_of(
            any_value,
            st.fixed_dictionaries(
                {
                    "gatewayClassName": st.sampled_from(["istio-waypoint", "istio"]),
                    "listeners": st.one_of(
                        any_value,
                        st.lists(
                            st.fixed_dictionaries(
                                {"protocol": st.just("HBONE"), "port": st.just(15008), "allowedRoutes": any_value}
                            ),
                            max_size=2,
                        ),
                    ),
                }
            ),
        ),
        "status": st.one_of(
            any_value,
            st.fixed_dictionaries(
                {
                    "addresses": st.one_of(
                        any_value,
                        st.lists(
                            st.dictionaries(
                                st.sampled_from(["type", "value"]),
                                st.one_of(
                                    label_text, st.sampled_from(["Hostname", "IPAddress", "198.19.0.1"]), any_value
                                ),
                            ),
                            max_size=3,
                        ),
                    )
                }
            ),
        ),
    }
)


@settings(max_examples=200, deadline=None)
@given(
    gateways=st.lists(gateway_st, max_size=3),
    service_labels=st.one_of(labels_st, any_value),
    ns_labels=st.one_of(labels_st, any_value),
    pod_labels=labels_st,  # a map (pods' labels of other shapes are the pod translation's concern)
)
def test_any_labels_and_gateways_never_raise_and_the_result_renders(
    gateways: list[Obj], service_labels: Any, ns_labels: Any, pod_labels: Any
) -> None:
    svc = {
        "metadata": {"name": "web", "namespace": "app", "labels": service_labels},
        "spec": {"clusterIP": "198.19.0.10", "ports": [{"port": 80}]},
    }
    pod = {"metadata": {"name": "p", "namespace": "app", "labels": pod_labels}, "status": {"podIP": "198.18.1.1"}}
    ns = {"metadata": {"name": "app", "labels": ns_labels}}
    translation = translate_all([pod], [svc], [], [ns], gateways=gateways)
    assert parse_local_config(render_local_config(translation.config)) == translation.config
    for item in (*translation.config.workloads, *translation.config.services):
        assert address_from_proto(address_of(item)) == item


# -- the waypoint fields on the wire and in the file -------------------------------------------------------------------
IP_WAYPOINT = GatewayAddress(NetworkAddress("net1", ipaddress.ip_address("2001:db8::9")), 15009)


@pytest.mark.parametrize("waypoint", [HOST, IP_WAYPOINT, None])
def test_the_waypoint_fields_round_trip_through_xds_and_the_local_file(waypoint: GatewayAddress | None) -> None:
    workload = Workload("Kubernetes//Pod/app/p", "p", "app", (ipaddress.ip_address("198.18.1.1"),), waypoint=waypoint)
    service = Service(
        "web", "app", "web.app.svc.cluster.local", waypoint=waypoint, ingress_use_waypoint=waypoint is not None
    )
    for item in (workload, service):
        assert address_from_proto(address_of(item)) == item
    config = LocalConfig(workloads=(workload,), services=(service,))
    assert parse_local_config(render_local_config(config)) == config


def test_the_waypoint_uses_the_proto_field_numbers() -> None:
    workload = Workload("u", "p", "app", (), waypoint=HOST)
    raw = address_of(workload).workload.SerializeToString()
    assert b"\x42" in raw  # field 8, length-delimited: Workload.waypoint
    service = address_of(Service("web", "app", "h", waypoint=IP_WAYPOINT, ingress_use_waypoint=True)).service
    body = service.SerializeToString()
    assert b"\x3a" in body and b"\x60\x01" in body  # field 7 (waypoint), field 12 = true (ingress_use_waypoint)
    assert (
        service.waypoint.hbone_mtls_port == 15009
        and service.waypoint.address.address == IP_WAYPOINT.destination.ip.packed
    )  # type: ignore[union-attr]


@pytest.mark.parametrize(
    ("mutate", "problem"),
    [
        (lambda w: w.waypoint.SetInParent(), "workload.waypoint: neither a hostname nor an address"),
        (lambda w: setattr(w.waypoint.hostname, "hostname", "h"), "workload.waypoint.hostname.namespace: required"),
        (lambda w: setattr(w.waypoint.address, "address", b"\x01\x02"), "expected 4 or 16 bytes"),
        (
            lambda w: (setattr(w.waypoint.hostname, "namespace", "a"), setattr(w.waypoint.hostname, "hostname", "h")),
            "hbone_mtls_port: out of range",
        ),
    ],
)
def test_a_malformed_waypoint_from_a_peer_is_refused_with_its_field(mutate: Any, problem: str) -> None:
    address = address_of(Workload("u", "p", "app", ()))
    mutate(address.workload)
    with pytest.raises(XdsConversionError, match=problem.replace("(", r"\(").replace(")", r"\)")):
        address_from_proto(address)


@pytest.mark.parametrize(
    "waypoint",
    [
        {"hostname": "h"},
        {"hostname": "h", "namespace": "a", "address": "/198.18.0.1"},
        {"address": "/198.18.0.1", "namespace": "a"},
        {"address": "nope"},
        {"hostname": "h", "namespace": "a", "hboneMtlsPort": 0},
        {"hostname": "h", "namespace": "a", "port": 1},
        "waypoint.app",
    ],
)
def test_a_malformed_waypoint_in_the_local_file_is_a_clear_error(waypoint: Any) -> None:
    doc = {"services": [{"name": "web", "namespace": "app", "hostname": "web.app", "waypoint": waypoint}]}
    with pytest.raises(LocalConfigError, match=r"services\[0\]\.waypoint"):
        parse_local_config(yaml.safe_dump(doc))


# -- XFCC client identity (waypoint_gateways rule 8) -----------------------------------------------------------------
XFCC_ANNOTATION = "ambient.istio.io/xfcc-include-client-identity"


@pytest.mark.parametrize(
    ("own", "on_class", "expected"),
    [
        (None, None, False),
        ("true", None, True),
        ("TRUE", None, True),
        ("1", None, False),
        ("false", None, False),
        (None, "true", True),
        ("false", "true", False),
        ("true", "false", True),
    ],
)
def test_xfcc_client_identity_comes_from_the_gateway_else_its_class(
    own: str | None, on_class: str | None, expected: bool
) -> None:
    gw = gateway()
    if own is not None:
        gw["metadata"]["annotations"] = {XFCC_ANNOTATION: own}
    cls = {"metadata": {"name": "istio-waypoint", "annotations": {XFCC_ANNOTATION: on_class} if on_class else {}}}
    assert index(gw, classes=(cls,)).ready["app/waypoint"].xfcc_client_identity is expected


def test_the_waypoint_config_carries_the_xfcc_setting() -> None:
    plain, annotated = gateway("plain"), gateway("annotated")
    annotated["metadata"]["annotations"] = {XFCC_ANNOTATION: "true"}
    translation = translate_all([], [], [], [namespace("app")], gateways=[plain, annotated])
    assert {c.waypoint: c.xfcc_client_identity for c in translation.waypoint_configs} == {
        "app/annotated": True,
        "app/plain": False,
    }
