"""The control plane's side of upstream TestWaypointAsEgressGatewayForWildcardEntries: a ``DYNAMIC_DNS`` entry
``*.<external ns>.svc.cluster.local`` in the apps namespace, bound with ``istio.io/use-waypoint`` and
``istio.io/use-waypoint-namespace`` to a waypoint of another namespace. The entry is a Service with the wildcard's
allocated address bound to that waypoint; the waypoint's WaypointConfig lists it in ``services`` and in
``dynamic_dns`` (so the waypoint forwards by the name asked), carries the wildcard DestinationRule (SIMPLE TLS for
the 8080 → 443 port), and the same over xDS. Other entries are not ``dynamic_dns``."""

from __future__ import annotations

from typing import Any

from ambit.controlplane.translate import translate_all
from ambit.controlplane.translate.autoallocate import AddressAllocator, plan_addresses
from ambit.model.destination_policy import TlsMode
from ambit.model.workload import AppProtocol, PortMapping
from ambit.xds.routes import waypoint_config_from_proto, waypoint_config_to_proto

Obj = dict[str, Any]
WILDCARD = "*.external.svc.cluster.local"
KEY = f"apps/{WILDCARD}"


def waypoint() -> Obj:
    listener = {
        "name": "mesh",
        "port": 15008,
        "protocol": "HBONE",
        "allowedRoutes": {
            "namespaces": {"from": "Selector", "selector": {"matchLabels": {"kubernetes.io/metadata.name": "apps"}}}
        },
    }
    return {
        "metadata": {"name": "wildcard-egress-gateway", "namespace": "egress"},
        "spec": {"gatewayClassName": "istio-waypoint", "listeners": [listener]},
        "status": {"addresses": [{"type": "Hostname", "value": "wildcard-egress-gateway.egress.svc.cluster.local"}]},
    }


def wildcard_entry() -> Obj:
    obj: Obj = {
        "apiVersion": "networking.istio.io/v1",
        "kind": "ServiceEntry",
        "metadata": {
            "name": "external-wildcard",
            "namespace": "apps",
            "creationTimestamp": "2026-01-01T00:00:00Z",
            "labels": {
                "istio.io/use-waypoint": "wildcard-egress-gateway",
                "istio.io/use-waypoint-namespace": "egress",
            },
        },
        "spec": {
            "hosts": [WILDCARD],
            "ports": [
                {"name": "http", "number": 80, "protocol": "HTTP"},
                {"name": "tls", "number": 443, "protocol": "TLS"},
                {"name": "http-for-tls", "number": 8080, "protocol": "HTTP", "targetPort": 443},
            ],
            "location": "MESH_EXTERNAL",
            "resolution": "DYNAMIC_DNS",
        },
    }
    allocator = AddressAllocator()
    allocator.warm([obj])
    obj["status"] = {"addresses": plan_addresses(obj, allocator)}
    return obj


def dns_entry() -> Obj:
    return {
        "apiVersion": "networking.istio.io/v1",
        "kind": "ServiceEntry",
        "metadata": {
            "name": "plain",
            "namespace": "apps",
            "labels": {"istio.io/use-waypoint": "wildcard-egress-gateway", "istio.io/use-waypoint-namespace": "egress"},
        },
        "spec": {
            "hosts": ["plain.example.com"],
            "ports": [{"name": "http", "number": 80, "protocol": "HTTP"}],
            "resolution": "DNS",
        },
    }


TLS_ORIGINATION = {
    "apiVersion": "networking.istio.io/v1",
    "kind": "DestinationRule",
    "metadata": {"name": "wildcard-tls-origination", "namespace": "apps"},
    "spec": {"host": WILDCARD, "trafficPolicy": {"tls": {"mode": "SIMPLE", "insecureSkipVerify": True}}},
}
NAMESPACES = [
    {"metadata": {"name": "apps", "labels": {"kubernetes.io/metadata.name": "apps"}}},
    {"metadata": {"name": "egress", "labels": {"kubernetes.io/metadata.name": "egress"}}},
]


def test_the_wildcard_entry_is_a_service_bound_to_the_waypoint_of_the_other_namespace() -> None:
    translation = translate_all([], [], [], NAMESPACES, service_entries=[wildcard_entry()], gateways=[waypoint()])
    (service,) = [s for s in translation.config.services if s.key == KEY]
    assert service.vips, "the wildcard has its allocated address"
    assert service.waypoint is not None
    assert service.ports == (
        PortMapping(80, 0, AppProtocol.HTTP11),
        PortMapping(443, 0, AppProtocol.TLS),
        PortMapping(8080, 443, AppProtocol.HTTP11),
    )
    assert not [w for w in translation.config.workloads if KEY in w.services], "no endpoints: resolved per request"


def test_the_waypoint_is_told_to_forward_the_wildcard_by_name_with_its_destination_rule() -> None:
    translation = translate_all(
        [],
        [],
        [],
        NAMESPACES,
        service_entries=[wildcard_entry(), dns_entry()],
        gateways=[waypoint()],
        destination_rules=[TLS_ORIGINATION],
    )
    (config,) = translation.waypoint_configs
    assert config.waypoint == "egress/wildcard-egress-gateway"
    assert config.services == (KEY, "apps/plain.example.com")
    assert config.dynamic_dns == (KEY,)
    (rule,) = config.destination_rules
    assert rule.service_key == KEY
    tls = rule.policy_for(8080).tls
    assert tls is not None and tls.mode is TlsMode.SIMPLE and tls.insecure_skip_verify
    decoded = waypoint_config_from_proto(waypoint_config_to_proto(config), config.waypoint)
    assert decoded.dynamic_dns == (KEY,) and decoded == config


def test_an_unbound_wildcard_entry_tells_no_waypoint_anything() -> None:
    entry = wildcard_entry()
    entry["metadata"]["labels"] = {}
    translation = translate_all([], [], [], NAMESPACES, service_entries=[entry], gateways=[waypoint()])
    assert all(not c.dynamic_dns and KEY not in c.services for c in translation.waypoint_configs)
