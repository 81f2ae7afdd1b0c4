"""Waypoint binding and visibility (rule 10 of :mod:`ambit.controlplane.translate.waypoints`; istiod's
``fetchWaypointForService``): a ServiceEntry exported only to its own namespace never binds to a waypoint in another
namespace, primary or canary, and says so in ``istio.io/WaypointBound``; a public one does; a Kubernetes Service is
not checked, as istiod does not check it."""

from __future__ import annotations

from typing import Any

import pytest

from ambit.controlplane.translate import Translation, translate_all
from ambit.model.workload import Visibility

Obj = dict[str, Any]
USE = "istio.io/use-waypoint"
USE_NS = "istio.io/use-waypoint-namespace"
CANARY = "istio.io/use-waypoint-canary"
CANARY_NS = "istio.io/use-waypoint-canary-namespace"
FORBIDDEN = (
    'cannot bind to waypoint "infra/shared" in another namespace: cross-namespace waypoint binding is not permitted '
    "for a ServiceEntry with NAMESPACE visibility"
)


def gateway(name: str, namespace: str) -> Obj:
    listener = {"name": "mesh", "port": 15008, "protocol": "HBONE", "allowedRoutes": {"namespaces": {"from": "All"}}}
    return {
        "metadata": {"name": name, "namespace": namespace},
        "spec": {"gatewayClassName": "istio-waypoint", "listeners": [listener]},
        "status": {"addresses": [{"type": "Hostname", "value": f"{name}.{namespace}.svc.cluster.local"}]},
    }


def entry(labels: dict[str, str], export_to: list[str] | None = None) -> Obj:
    spec: Obj = {
        "hosts": ["api.example.com"],
        "addresses": ["240.240.0.9"],
        "ports": [{"number": 443, "name": "tls", "protocol": "TLS"}],
        "resolution": "DNS",
    }
    if export_to is not None:
        spec["exportTo"] = export_to
    return {"metadata": {"name": "api", "namespace": "app", "labels": labels}, "spec": spec}


def translate(entries: tuple[Obj, ...] = (), services: tuple[Obj, ...] = ()) -> Translation:
    return translate_all(
        [],
        services,
        [],
        [{"metadata": {"name": "app"}}, {"metadata": {"name": "infra"}}],
        service_entries=entries,
        gateways=[gateway("shared", "infra"), gateway("local", "app"), gateway("canary", "app")],
    )


CROSS = {USE: "shared", USE_NS: "infra"}


@pytest.mark.parametrize(
    ("export_to", "bound"),
    [(None, True), (["*"], True), (["."], False), (["app"], False), (["~"], False)],
    ids=["default", "star", "dot", "own namespace", "nowhere"],
)
def test_a_service_entry_visible_only_in_its_namespace_never_binds_to_another_namespaces_waypoint(
    export_to: list[str] | None, bound: bool
) -> None:
    translation = translate((entry(CROSS, export_to),))
    (service,) = translation.config.services
    (status,) = translation.service_entry_status
    assert service.visibility is (Visibility.PUBLIC if bound else Visibility.NAMESPACE)
    if bound:
        assert service.waypoint is not None
        assert (status.accepted, status.reason) == (True, "WaypointAccepted")
    else:
        assert service.waypoint is None and service.weighted_waypoints == ()
        assert (status.accepted, status.reason, status.message) == (
            False,
            "CrossNamespaceWaypointForbidden",
            FORBIDDEN,
        )


def test_a_namespace_visible_service_entry_still_binds_to_a_waypoint_of_its_own_namespace() -> None:
    translation = translate((entry({USE: "local"}, ["."]),))
    (service,) = translation.config.services
    (status,) = translation.service_entry_status
    assert service.waypoint is not None and (status.accepted, status.reason) == (True, "WaypointAccepted")


def test_a_canary_in_another_namespace_is_refused_for_a_namespace_visible_entry_and_the_primary_kept() -> None:
    labels = {USE: "local", CANARY: "shared", CANARY_NS: "infra"}
    translation = translate((entry(labels, ["."]),))
    (service,) = translation.config.services
    (status,) = translation.service_entry_status
    assert service.waypoint is not None and service.weighted_waypoints == ()
    assert status.accepted and status.message.endswith(f". Canary waypoint not attached: {FORBIDDEN}")
    public = translate((entry(labels),))
    assert len(public.config.services[0].weighted_waypoints) == 2


def test_a_kubernetes_service_exported_to_its_namespace_is_not_checked_as_istiod_does_not() -> None:
    svc = {
        "metadata": {
            "name": "web",
            "namespace": "app",
            "labels": CROSS,
            "annotations": {"networking.istio.io/exportTo": "."},
        },
        "spec": {"clusterIP": "198.19.0.10", "ports": [{"port": 80}]},
    }
    translation = translate(services=(svc,))
    (service,) = translation.config.services
    (status,) = translation.service_status
    assert service.visibility is Visibility.NAMESPACE and service.waypoint is not None
    assert (status.accepted, status.reason) == (True, "WaypointAccepted")
