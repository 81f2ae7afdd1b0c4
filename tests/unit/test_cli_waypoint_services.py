"""The Services table of ``ambit waypoint status`` (:mod:`ambit.cli.waypoint_services`): which objects a shown
waypoint fronts, as primary or canary, with the weighted set, bound by the control plane's own rules."""

from __future__ import annotations

from typing import Any

from hypothesis import given, settings
from hypothesis import strategies as st
from tests.unit.json_strategies import json_objects

from ambit.cli.waypoint_services import SERVICE_COLUMNS, service_rows

Obj = dict[str, Any]
USE = "istio.io/use-waypoint"
CANARY = "istio.io/use-waypoint-canary"
CANARY_NS = "istio.io/use-waypoint-canary-namespace"
WEIGHT = "istio.io/use-waypoint-canary-weight"


def gateway(name: str, namespace: str, *, ready: bool = True) -> Obj:
    listener = {"name": "mesh", "port": 15008, "protocol": "HBONE", "allowedRoutes": {"namespaces": {"from": "All"}}}
    addresses = [{"type": "Hostname", "value": f"{name}.{namespace}.svc.cluster.local"}] if ready else []
    return {
        "metadata": {"name": name, "namespace": namespace},
        "spec": {"gatewayClassName": "istio-waypoint", "listeners": [listener]},
        "status": {"addresses": addresses},
    }


def obj(name: str, labels: dict[str, str], annotations: dict[str, str] | None = None, **spec: Any) -> Obj:
    meta = {"name": name, "namespace": "app", "labels": labels, "annotations": annotations or {}}
    return {"metadata": meta, "spec": spec}


GATEWAYS = [
    gateway("primary", "app"),
    gateway("canary", "infra"),
    gateway("other", "app"),
    gateway("down", "app", ready=False),
]
NAMESPACES = [{"metadata": {"name": "app"}}, {"metadata": {"name": "infra"}}]


def rows(shown: set[str], services: list[Obj], entries: list[Obj] = ()) -> list[tuple[str, ...]]:  # type: ignore[assignment]
    return service_rows(
        shown,
        gateways=GATEWAYS,
        gateway_classes=[],
        namespaces=NAMESPACES,
        services=services,
        service_entries=entries,
    )


CANARIED = obj("reviews", {USE: "primary", CANARY: "canary", CANARY_NS: "infra"}, {WEIGHT: "10"})
PLAIN = obj("ratings", {USE: "primary"})
ELSEWHERE = obj("details", {USE: "other"})
UNBOUND = obj("web", {})


def test_a_waypoints_services_are_listed_with_their_weighted_set_or_none() -> None:
    assert SERVICE_COLUMNS == ("NAMESPACE", "NAME", "KIND", "WAYPOINT", "WEIGHTED WAYPOINTS")
    assert rows({"app/primary"}, [CANARIED, PLAIN, ELSEWHERE, UNBOUND]) == [
        ("app", "ratings", "Service", "app/primary", "None"),
        ("app", "reviews", "Service", "app/primary", "app/primary=90%,infra/canary=10%"),
    ]


def test_the_canary_waypoint_lists_the_services_it_takes_a_share_of() -> None:
    assert rows({"infra/canary"}, [CANARIED, PLAIN]) == [
        ("app", "reviews", "Service", "app/primary", "app/primary=90%,infra/canary=10%"),
    ]


def test_a_refused_canary_or_an_unready_waypoint_is_not_shown_as_bound() -> None:
    bad_weight = obj("reviews", {USE: "primary", CANARY: "canary", CANARY_NS: "infra"}, {WEIGHT: "150"})
    not_ready = obj("slow", {USE: "down"})
    assert rows({"app/primary", "infra/canary", "app/down"}, [bad_weight, not_ready]) == [
        ("app", "reviews", "Service", "app/primary", "None"),
    ]


def test_a_service_entry_is_bound_by_the_same_rules_its_export_to_included() -> None:
    public = obj("api", {USE: "canary", "istio.io/use-waypoint-namespace": "infra"}, hosts=["api.example.com"])
    private = obj("db", {USE: "canary", "istio.io/use-waypoint-namespace": "infra"}, hosts=["db.example.com"])
    private["spec"]["exportTo"] = ["."]
    assert rows({"infra/canary"}, [], [public, private]) == [
        ("app", "api", "ServiceEntry", "infra/canary", "None"),
    ]


def test_malformed_objects_give_no_row_and_no_error() -> None:
    junk: list[Obj] = [{"metadata": "x"}, {"metadata": {"labels": {USE: 7}}}, {}]
    assert rows({"app/primary"}, junk, junk) == []


@settings(max_examples=60, deadline=None)
@given(st.lists(json_objects(), max_size=4), st.lists(json_objects(), max_size=4))
def test_any_json_objects_give_rows_or_none_never_an_error(services: list[Obj], entries: list[Obj]) -> None:
    for row in rows({"app/primary", "infra/canary"}, services, entries):
        assert len(row) == len(SERVICE_COLUMNS)


def test_a_service_entry_the_mesh_config_scopes_to_its_namespace_is_not_shown_under_another_namespaces_waypoint() -> (
    None
):
    entry = obj("api", {USE: "canary", "istio.io/use-waypoint-namespace": "infra"}, hosts=["api.example.com"])
    local = obj("own", {USE: "primary"}, hosts=["own.example.com"])

    def with_mesh(text: str) -> list[tuple[str, ...]]:
        config_map = {"metadata": {"name": "istio", "namespace": "istio-system"}, "data": {"mesh": text}}
        return service_rows(
            {"infra/canary", "app/primary"},
            gateways=GATEWAYS,
            gateway_classes=[],
            namespaces=NAMESPACES,
            services=[],
            service_entries=[entry, local],
            mesh_config_maps=[config_map],
        )

    assert with_mesh("serviceEntryVisibility: {defaultVisibility: NAMESPACE}") == [
        ("app", "own", "ServiceEntry", "app/primary", "None"),  # its own namespace's waypoint still binds
    ]
    assert with_mesh("serviceEntryVisibility: {defaultVisibility: NONE}") == []
    assert with_mesh("serviceEntryVisibility: [") == with_mesh("{}")  # unreadable: as without a mesh config
    assert len(with_mesh("{}")) == 2
