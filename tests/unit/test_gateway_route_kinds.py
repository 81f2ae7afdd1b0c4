"""Listener ``supportedKinds`` and ``InvalidRouteKinds`` (:mod:`ambit.controlplane.translate.route_kinds`): kinds by
protocol as Gateway API and istiod pair them, narrowed by ``allowedRoutes.kinds`` and by what the gateway serves,
in the status of waypoint and ingress Gateways; any JSON listener gives an answer, never an error."""

from __future__ import annotations

from typing import Any

import pytest
from hypothesis import given, settings
from tests.unit.json_strategies import json_objects

from ambit.controlplane.gateway.ingress_status import ingress_status
from ambit.controlplane.gateway.status import Deployed, gateway_status
from ambit.controlplane.translate.listeners import judge_listeners
from ambit.controlplane.translate.route_kinds import ALL_ROUTE_KINDS, supported_kinds

G = "gateway.networking.k8s.io"


def kinds(*names: str) -> list[dict[str, str]]:
    return [{"group": G, "kind": name} for name in names]


@pytest.mark.parametrize(
    ("listener", "expected"),
    [
        ({"protocol": "HTTP"}, kinds("HTTPRoute", "GRPCRoute")),
        ({"protocol": "HTTPS", "tls": {"mode": "Terminate"}}, kinds("HTTPRoute", "GRPCRoute")),
        ({"protocol": "TCP"}, kinds("TCPRoute")),
        ({"protocol": "TLS", "tls": {"mode": "Passthrough"}}, kinds("TLSRoute")),
        ({"protocol": "TLS"}, kinds("TLSRoute")),
        ({"protocol": "TLS", "tls": {"mode": "Terminate"}}, kinds("TLSRoute", "TCPRoute")),
        ({"protocol": "UDP"}, []),
        ({"protocol": "HBONE"}, []),
        ({"protocol": "example.com/custom"}, []),
    ],
    ids=["HTTP", "HTTPS", "TCP", "TLS passthrough", "TLS default", "TLS terminate", "UDP", "HBONE", "custom"],
)
def test_each_protocol_supports_the_kinds_gateway_api_pairs_with_it(
    listener: dict[str, Any], expected: list[dict[str, str]]
) -> None:
    assert supported_kinds(listener, ALL_ROUTE_KINDS) == (expected, True)


def test_allowed_kinds_narrow_the_list_and_an_unsupported_one_is_invalid() -> None:
    tcp_only = {"protocol": "HTTP", "allowedRoutes": {"kinds": [{"kind": "HTTPRoute"}]}}
    assert supported_kinds(tcp_only, ALL_ROUTE_KINDS) == (kinds("HTTPRoute"), True)
    mixed = {"protocol": "HTTP", "allowedRoutes": {"kinds": [{"group": G, "kind": "GRPCRoute"}, {"kind": "TCPRoute"}]}}
    assert supported_kinds(mixed, ALL_ROUTE_KINDS) == (kinds("GRPCRoute"), False)
    other_group = {"protocol": "TCP", "allowedRoutes": {"kinds": [{"group": "example.com", "kind": "TCPRoute"}]}}
    assert supported_kinds(other_group, ALL_ROUTE_KINDS) == ([], False)


def test_a_kind_the_gateway_does_not_serve_is_not_claimed() -> None:
    assert supported_kinds({"protocol": "HTTP"}, {"HTTPRoute"}) == (kinds("HTTPRoute"), True)
    grpc = {"protocol": "HTTP", "allowedRoutes": {"kinds": [{"kind": "GRPCRoute"}]}}
    assert supported_kinds(grpc, {"HTTPRoute"}) == ([], False)


def _resolved(listener_status: dict[str, Any]) -> tuple[str, str, str]:
    (c,) = [c for c in listener_status["conditions"] if c["type"] == "ResolvedRefs"]
    return c["status"], c["reason"], c["message"]


def test_a_waypoints_listeners_report_kinds_by_protocol_and_invalid_allowed_kinds() -> None:
    gw = {
        "metadata": {"name": "waypoint", "namespace": "app", "generation": 1},
        "spec": {
            "gatewayClassName": "istio-waypoint",
            "listeners": [
                {"name": "mesh", "port": 15008, "protocol": "HBONE"},
                {"name": "tcp", "port": 9000, "protocol": "TCP"},
                {"name": "strict", "port": 15008, "protocol": "HBONE", "allowedRoutes": {"kinds": [{"kind": "X"}]}},
            ],
        },
    }
    status = gateway_status(gw, Deployed(service_exists=True, ready=True), domain="cluster.local")
    mesh, tcp, strict = status["listeners"]
    assert (mesh["supportedKinds"], _resolved(mesh)[0]) == ([], "True")
    assert tcp["supportedKinds"] == kinds("TCPRoute")
    assert _resolved(strict) == ("False", "InvalidRouteKinds", "Invalid route kinds")


def test_an_ingress_claims_the_kinds_it_routes_and_flags_kinds_it_does_not_serve() -> None:
    listeners = [
        {"name": "http", "port": 8080, "protocol": "HTTP"},
        {"name": "grpc", "port": 8081, "protocol": "HTTP", "allowedRoutes": {"kinds": [{"kind": "GRPCRoute"}]}},
        {"name": "strict", "port": 8082, "protocol": "HTTP", "allowedRoutes": {"kinds": [{"kind": "TCPRoute"}]}},
        {"name": "tcp", "port": 9000, "protocol": "TCP"},
        {"name": "tls", "port": 9443, "protocol": "TLS", "tls": {"mode": "Passthrough"}},
        {"name": "tls-terminate", "port": 9444, "protocol": "TLS", "tls": {"mode": "Terminate"}},
        {"name": "udp", "port": 9445, "protocol": "UDP"},
    ]
    gw = {
        "metadata": {"name": "edge", "namespace": "edge"},
        "spec": {"gatewayClassName": "istio", "listeners": listeners},
    }
    judged = judge_listeners(gw, {})
    status = ingress_status(gw, Deployed(service_exists=True), judged, host="h", addresses=())
    http, grpc, strict, tcp, tls, terminate, udp = status["listeners"]
    both = kinds("HTTPRoute", "GRPCRoute")
    assert (http["supportedKinds"], _resolved(http)[:2]) == (both, ("True", "ResolvedRefs"))
    assert (grpc["supportedKinds"], _resolved(grpc)[:2]) == (kinds("GRPCRoute"), ("True", "ResolvedRefs"))
    assert (strict["supportedKinds"], _resolved(strict)[:2]) == ([], ("False", "InvalidRouteKinds"))
    assert tcp["supportedKinds"] == kinds("TCPRoute")
    assert tls["supportedKinds"] == kinds("TLSRoute")  # passthrough: TLSRoute only
    assert terminate["supportedKinds"] == kinds("TLSRoute", "TCPRoute")  # terminated: plain bytes, TCPRoute too
    assert udp["supportedKinds"] == []  # not accepted: not served


@settings(max_examples=150, deadline=None)
@given(json_objects())
def test_any_json_listener_gives_kinds_and_a_verdict(listener: dict[str, Any]) -> None:
    found, valid = supported_kinds(listener, ALL_ROUTE_KINDS)
    assert isinstance(valid, bool)
    assert all(k["group"] == G and k["kind"] in ALL_ROUTE_KINDS for k in found)
