"""Each waypoint's WaypointConfig lists the Services bound to it (field 8, rule 6 of
:mod:`ambit.controlplane.translate.routes`), from the one binding that also chose its tables and policies. A
waypoint fed by the control plane serves a Service only once it is listed, so the listing must agree with the
workload state (else a bound Service is refused for good) and cover everything chosen for it (else its policies
could be missing while it is served). Checked on random meshes: Services and ServiceEntries in two namespaces,
bound by label (primary, canary) or by namespace, with Service-targeted AuthorizationPolicies."""

from __future__ import annotations

from typing import Any

from hypothesis import given, settings
from hypothesis import strategies as st

from ambit.controlplane.translate import Translation, translate_all
from ambit.model.policy import Scope
from ambit.model.workload import GatewayAddress, NamespacedHostname, Service

Obj = dict[str, Any]
USE = "istio.io/use-waypoint"
CANARY = "istio.io/use-waypoint-canary"
WAYPOINTS = ("alpha", "beta")
"""Waypoint Gateways of each namespace."""


def gateway(name: str, namespace: str) -> Obj:
    return {
        "kind": "Gateway",
        "metadata": {"name": name, "namespace": namespace},
        "spec": {
            "gatewayClassName": "istio-waypoint",
            "listeners": [{"name": "mesh", "port": 15008, "protocol": "HBONE"}],
        },
        "status": {"addresses": [{"type": "Hostname", "value": f"{name}.{namespace}.svc.cluster.local"}]},
    }


def labels_of(use: str | None, canary: str | None) -> dict[str, str]:
    out = {}
    if use is not None:
        out[USE] = use
    if canary is not None:
        out[CANARY] = canary
    return out


choice = st.sampled_from((None, *WAYPOINTS))
services = st.lists(st.tuples(st.sampled_from(("app", "shop")), choice, choice, st.booleans()), max_size=6)


def objects(namespace_use: tuple[str | None, str | None], items: list[tuple[str, str | None, str | None, bool]]) -> Obj:
    svcs: list[Obj] = []
    entries: list[Obj] = []
    policies: list[Obj] = []
    for i, (namespace, use, canary, entry) in enumerate(items):
        name = f"s{i}"
        meta = {"name": name, "namespace": namespace, "labels": labels_of(use, canary)}
        if entry:
            spec = {"hosts": [f"{name}.example.com"], "ports": [{"number": 80, "name": "http", "protocol": "HTTP"}]}
            entries.append({"kind": "ServiceEntry", "metadata": meta, "spec": spec})
            ref = {"group": "networking.istio.io", "kind": "ServiceEntry", "name": name}
        else:
            spec = {"clusterIP": f"198.19.0.{10 + i}", "ports": [{"port": 80}]}
            svcs.append({"kind": "Service", "metadata": meta, "spec": spec})
            ref = {"group": "", "kind": "Service", "name": name}
        policies.append(
            {
                "metadata": {"name": f"deny-{name}", "namespace": namespace},
                "spec": {"targetRefs": [ref], "action": "DENY", "rules": [{"to": [{"operation": {"paths": ["/x"]}}]}]},
            }
        )
    return {
        "pods": [],
        "services": svcs,
        "endpoint_slices": [],
        "namespaces": [
            {"kind": "Namespace", "metadata": {"name": "app", "labels": labels_of(*namespace_use)}},
            {"kind": "Namespace", "metadata": {"name": "shop", "labels": {}}},
        ],
        "gateways": [gateway(name, ns) for ns in ("app", "shop") for name in WAYPOINTS],
        "service_entries": entries,
        "authorization_policies": policies,
    }


def waypoint_key(address: GatewayAddress) -> str:
    destination = address.destination
    assert isinstance(destination, NamespacedHostname)
    return f"{destination.namespace}/{destination.hostname.split('.')[0]}"


def fronted_by(service: Service) -> set[str]:
    """The waypoints the workload state tells a waypoint it serves this Service as (primary or weighted)."""
    return {waypoint_key(g) for g in service.fronting_waypoints}


def check(translation: Translation) -> None:
    configs = {c.waypoint: c for c in translation.waypoint_configs}
    assert set(configs) == {f"{ns}/{name}" for ns in ("app", "shop") for name in WAYPOINTS}
    for key, config in configs.items():
        from_state = sorted(s.key for s in translation.config.services if key in fronted_by(s))
        assert list(config.services) == from_state, key
        listed = set(config.services)
        for policy in config.policies:
            if policy.scope is Scope.SERVICE:
                assert set(policy.services) <= listed, (key, policy.key)
        assert {t.service_key for t in config.tables} <= listed, key
        assert {d.service_key for d in config.destination_rules} <= listed, key


@settings(max_examples=40, deadline=None)
@given(st.tuples(choice, choice), services)
def test_the_listing_is_what_the_state_binds_and_covers_every_policy_and_table(
    namespace_use: tuple[str | None, str | None], items: list[tuple[str, str | None, str | None, bool]]
) -> None:
    check(translate_all(**objects(namespace_use, items)))


def test_a_service_bound_with_a_canary_is_listed_by_both_and_its_deny_goes_to_both() -> None:
    translation = translate_all(**objects((None, None), [("app", "alpha", "beta", False)]))
    check(translation)
    configs = {c.waypoint: c for c in translation.waypoint_configs}
    key = "app/s0.app.svc.cluster.local"
    for waypoint in ("app/alpha", "app/beta"):
        assert configs[waypoint].services == (key,)
        assert [p.key for p in configs[waypoint].policies] == ["app/deny-s0"]
    assert configs["shop/alpha"].services == () and configs["shop/alpha"].policies == ()
