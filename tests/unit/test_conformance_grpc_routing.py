"""Gateway API conformance (GATEWAY-GRPC, ingress class ``istio``), routing share: GRPCRoutes replayed from their
manifests through :func:`translate_ingress` and the gateway's router, on the gateways and Services of
:mod:`test_conformance_routing` (with ``grpc-infra-backend-v1``/``-v2``/``-v3``). A request no rule takes is a 404
the gateway's HTTP/2 side answers as gRPC ``UNIMPLEMENTED``, which is what the suite expects.

- GRPCExactMethodMatching: service and method pick the backend; another method is UNIMPLEMENTED.
- GRPCRouteHeaderMatching: metadata (header) matches, more headers first, ORed matches.
- GRPCRouteListenerHostnameMatching: the listener by host, then its routes.
- GRPCRouteNamedRule: a named rule routes like any.
- GRPCRouteWeight: 70/30/0.
"""

from __future__ import annotations

from typing import Any

import pytest
import yaml
from tests.unit import test_conformance_routing as gw

from ambit.waypoint.http2_proxy import grpc_status_of

SERVICE = "gateway_api_conformance.echo_basic.grpcecho.GrpcEcho"
V1, V2, V3 = "grpc-infra-backend-v1", "grpc-infra-backend-v2", "grpc-infra-backend-v3"
UNIMPLEMENTED = 12


def _grpc(name: str, rules: list[dict[str, Any]], *parents: dict[str, Any]) -> str:
    spec = {"parentRefs": list(parents) or [{"name": "same-namespace"}], "rules": rules}
    return yaml.safe_dump({"kind": "GRPCRoute", "metadata": {"name": name}, "spec": spec})


def _to(backend: str, *matches: dict[str, Any], **extra: Any) -> dict[str, Any]:
    rule: dict[str, Any] = {"backendRefs": [{"name": backend, "port": 8080}], **extra}
    if matches:
        rule["matches"] = list(matches)
    return rule


def _method(name: str) -> dict[str, Any]:
    return {"method": {"service": SERVICE, "method": name}}


def call(gateways: gw.Gateways, method: str = "Echo", **kwargs: Any) -> str:
    """The backend a unary call reaches, or ``grpc:<code>`` for an answer of the gateway's own."""
    headers = {"content-type": "application/grpc", "te": "trailers", **kwargs.pop("headers", {})}
    decision = gateways.send(f"/{SERVICE}/{method}", method="POST", headers=headers, **kwargs)
    if isinstance(decision, gw.Respond):
        return f"grpc:{grpc_status_of(decision.status)}"
    return decision.backend.hostname.partition(".")[0]


@pytest.mark.parametrize(
    ("method", "expected"), [("Echo", V1), ("EchoTwo", V2), ("EchoThree", f"grpc:{UNIMPLEMENTED}")]
)
def test_exact_method_matching(method: str, expected: str) -> None:
    manifest = _grpc("exact-matching", [_to(V1, _method("Echo")), _to(V2, _method("EchoTwo"))])
    assert call(gw.Gateways(manifest), method) == expected


def _headers(**values: str) -> dict[str, Any]:
    return {"headers": [{"name": n, "value": v} for n, v in values.items()]}


@pytest.mark.parametrize(
    ("metadata", "expected"),
    [
        ({"Version": "one"}, V1),
        ({"Version": "two"}, V2),
        ({"Version": "two", "Color": "orange"}, V1),
        ({"Version": "two", "Color": "blue"}, V2),
        ({"Color": "orange"}, f"grpc:{UNIMPLEMENTED}"),
        ({"Some-Other-Header": "one"}, f"grpc:{UNIMPLEMENTED}"),
        ({"Color": "blue"}, V1),
        ({"Color": "green"}, V1),
        ({"Color": "red"}, V2),
        ({"Color": "yellow"}, V2),
    ],
)
def test_header_matching(metadata: dict[str, str], expected: str) -> None:
    manifest = _grpc(
        "grpc-header-matching",
        [
            _to(V1, _headers(version="one")),
            _to(V2, _headers(version="two")),
            _to(V1, _headers(version="two", color="orange")),
            _to(V1, _headers(color="blue"), _headers(color="green")),
            _to(V2, _headers(color="red"), _headers(color="yellow")),
        ],
    )
    assert call(gw.Gateways(manifest), headers=metadata) == expected


@pytest.mark.parametrize(
    ("host", "expected"),
    [
        ("bar.com", V1),
        ("foo.bar.com", V2),
        ("baz.bar.com", V3),
        ("boo.bar.com", V3),
        ("multiple.prefixes.bar.com", V3),
        ("multiple.prefixes.foo.com", V3),
        ("foo.com", f"grpc:{UNIMPLEMENTED}"),
        ("no.matching.host", f"grpc:{UNIMPLEMENTED}"),
    ],
)
def test_listener_hostname_matching(host: str, expected: str) -> None:
    def section(name: str) -> dict[str, str]:
        return {"name": "hosts", "sectionName": name}

    manifest = "---\n".join(
        [
            gw._listeners_gateway(
                "hosts",
                ("listener-1", 80, "bar.com"),
                ("listener-2", 80, "foo.bar.com"),
                ("listener-3", 80, "*.bar.com"),
                ("listener-4", 80, "*.foo.com"),
            ),
            _grpc("backend-v1", [_to(V1)], section("listener-1")),
            _grpc("backend-v2", [_to(V2)], section("listener-2")),
            _grpc("backend-v3", [_to(V3)], section("listener-3"), section("listener-4")),
        ]
    )
    assert call(gw.Gateways(manifest), gateway="hosts", host=host) == expected


def test_named_rule() -> None:
    manifest = _grpc("grpc-named-rules", [_to(V1, _method("Echo"), name="named-rule"), _to(V2, _method("EchoTwo"))])
    gateways = gw.Gateways(manifest)
    assert (call(gateways, "Echo"), call(gateways, "EchoTwo")) == (V1, V2)


def test_weight() -> None:
    refs = [{"name": b, "port": 8080, "weight": w} for b, w in ((V1, 70), (V2, 30), (V3, 0))]
    gateways = gw.Gateways(_grpc("weighted-backends", [{"backendRefs": refs}]))
    names = [call(gateways, random=i / 1000) for i in range(1000)]
    assert (names.count(V1), names.count(V2), names.count(V3)) == (700, 300, 0)
