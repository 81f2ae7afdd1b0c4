"""Gateway API conformance, GRPCRoutes on an ingress Gateway (class ``istio``): the parents' conditions and the
gateway's routing of gRPC calls, each case replaying one upstream conformance test with manifests of our own in
the shape of the suite's (the Gateway ``same-namespace``, HTTP on port 80, routes of its namespace ``infra``;
backends ``grpc-infra-backend-v1``/``v2``/``v3``). A call no rule matches gets 404, which a gRPC client reads as
``Unimplemented``, the code the suite expects.

- GRPCExactMethodMatching: service and method matched exactly; another method or service is not routed.
- GRPCRouteHeaderMatching: header matches (names case-insensitive), a rule with more header matches preferred,
  several matches in one rule ORed.
- GRPCRouteListenerHostnameMatching: listeners ``bar.com``, ``foo.bar.com``, ``*.bar.com``, ``*.foo.com`` on one
  port, routes attached by sectionName; a call reaches the route of the most specific listener its authority
  matches, none for a host no listener takes.
- GRPCRouteWeight: backends share a rule's calls by weight.
- GRPCRouteNamedRule: a rule's ``name`` is accepted and changes nothing.
- GRPCRouteRequestHeaderModifier: set, add and remove on the call's metadata.
"""

from __future__ import annotations

from typing import Any

from ambit.controlplane.gateway.ingress_status import ingress_attached_routes
from ambit.controlplane.translate.ingress import IngressTranslation, translate_ingress
from ambit.model.routes import BackendService
from ambit.model.workload import Service
from ambit.waypoint.decisions import Forward, RequestHead, Respond
from ambit.waypoint.ingress_routing import IngressRouter

INFRA = "infra"
ECHO = "gateway_api_conformance.echo_basic.grpcecho.GrpcEcho"
SERVICES = [
    Service(f"grpc-infra-backend-{v}", INFRA, f"grpc-infra-backend-{v}.infra.svc.cluster.local")
    for v in ["v1", "v2", "v3"]
]
SAME = {"namespaces": {"from": "Same"}}


def same_namespace() -> dict[str, Any]:
    return gateway("same-namespace", {"name": "http", "port": 80, "protocol": "HTTP", "allowedRoutes": SAME})


def gateway(name: str, *listeners: dict[str, Any]) -> dict[str, Any]:
    return {
        "metadata": {"namespace": INFRA, "name": name, "generation": 1},
        "spec": {"gatewayClassName": "istio", "listeners": list(listeners)},
    }


def backend(version: str, weight: int | None = None) -> dict[str, Any]:
    ref: dict[str, Any] = {"name": f"grpc-infra-backend-{version}", "port": 8080}
    if weight is not None:
        ref["weight"] = weight
    return ref


def grpc_route(name: str, rules: list[dict[str, Any]], *parents: dict[str, Any]) -> dict[str, Any]:
    return {
        "metadata": {"namespace": INFRA, "name": name, "generation": 1},
        "spec": {"parentRefs": list(parents) or [{"name": "same-namespace"}], "rules": rules},
    }


def translate(*routes: dict[str, Any], gw: dict[str, Any] | None = None) -> IngressTranslation:
    return translate_ingress(
        gateways=[gw or same_namespace()],
        http_routes=[],
        grpc_routes=list(routes),
        k8s_services=SERVICES,
        find_secret=lambda ns, name: None,
        namespace_labels={},
    )


def accepted_everywhere(out: IngressTranslation) -> None:
    for status in out.status:
        for parent in status.parents:
            found = {c.type: (c.status, c.reason) for c in parent.conditions}
            assert found == {"Accepted": (True, "Accepted"), "ResolvedRefs": (True, "ResolvedRefs")}, status.name


def call(
    out: IngressTranslation,
    method: str = "Echo",
    metadata: dict[str, str] | None = None,
    authority: str = "gw.example",
    random: float = 0.0,
) -> Forward | Respond:
    (config,) = out.configs
    headers = (
        ("content-type", "application/grpc"),
        ("te", "trailers"),
        *((k.lower(), v) for k, v in (metadata or {}).items()),
    )
    head = RequestHead("POST", f"/{ECHO}/{method}", authority, headers)
    decision = IngressRouter(config).decide(None, BackendService(INFRA, "", 80), head, random)
    assert isinstance(decision, Forward | Respond)
    return decision


def reached(decision: Forward | Respond) -> str:
    assert isinstance(decision, Forward), decision
    return decision.backend.hostname.split(".")[0].removeprefix("grpc-infra-backend-")


def unimplemented(decision: Forward | Respond) -> bool:
    return isinstance(decision, Respond) and decision.status == 404


def method_rule(method: str | None, version: str, service: str = ECHO, **extra: Any) -> dict[str, Any]:
    match: dict[str, Any] = {"service": service}
    if method is not None:
        match["method"] = method
    return {"matches": [{"method": match}], "backendRefs": [backend(version)], **extra}


def test_exact_method_matching() -> None:
    out = translate(
        grpc_route("r", [method_rule("Echo", "v1"), method_rule("EchoTwo", "v2")]),
    )
    accepted_everywhere(out)
    assert reached(call(out, "Echo")) == "v1"
    assert reached(call(out, "EchoTwo")) == "v2"
    assert unimplemented(call(out, "EchoThree"))


def test_header_matching() -> None:
    def rule(version: str, *matches: list[tuple[str, str]]) -> dict[str, Any]:
        return {
            "matches": [{"headers": [{"name": n, "value": v} for n, v in headers]} for headers in matches],
            "backendRefs": [backend(version)],
        }

    out = translate(
        grpc_route(
            "r",
            [
                rule("v1", [("version", "one")]),
                rule("v2", [("version", "two")]),
                rule("v1", [("version", "two"), ("color", "orange")]),
                rule("v1", [("color", "blue")], [("color", "green")]),
                rule("v2", [("color", "red")], [("color", "yellow")]),
            ],
        )
    )
    accepted_everywhere(out)
    cases = [
        ({"Version": "one"}, "v1"),
        ({"Version": "two"}, "v2"),
        ({"Version": "two", "Color": "orange"}, "v1"),
        ({"Version": "two", "Color": "blue"}, "v2"),
        ({"Color": "blue"}, "v1"),
        ({"Color": "green"}, "v1"),
        ({"Color": "red"}, "v2"),
        ({"Color": "yellow"}, "v2"),
    ]
    for metadata, version in cases:
        assert reached(call(out, metadata=metadata)) == version, metadata
    for metadata in ({"Color": "orange"}, {"Some-Other-Header": "one"}):
        assert unimplemented(call(out, metadata=metadata)), metadata


def test_listener_hostname_matching() -> None:
    hosts = {"listener-1": "bar.com", "listener-2": "foo.bar.com", "listener-3": "*.bar.com", "listener-4": "*.foo.com"}
    gw = gateway(
        "lhm",
        *({"name": n, "port": 80, "protocol": "HTTP", "hostname": h, "allowedRoutes": SAME} for n, h in hosts.items()),
    )

    def parent(section: str) -> dict[str, Any]:
        return {"name": "lhm", "namespace": INFRA, "sectionName": section}

    routes = [
        grpc_route("backend-v1", [{"backendRefs": [backend("v1")]}], parent("listener-1")),
        grpc_route("backend-v2", [{"backendRefs": [backend("v2")]}], parent("listener-2")),
        grpc_route("backend-v3", [{"backendRefs": [backend("v3")]}], parent("listener-3"), parent("listener-4")),
    ]
    out = translate(*routes, gw=gw)
    accepted_everywhere(out)
    assert ingress_attached_routes(gw, {"GRPCRoute": routes}) == dict.fromkeys(hosts, 1)
    cases = {
        "bar.com": "v1",
        "foo.bar.com": "v2",
        "baz.bar.com": "v3",
        "boo.bar.com": "v3",
        "multiple.prefixes.bar.com": "v3",
        "multiple.prefixes.foo.com": "v3",
    }
    for authority, version in cases.items():
        assert reached(call(out, authority=authority)) == version, authority
    assert unimplemented(call(out, authority="no.matching.host"))


def test_weight() -> None:
    out = translate(grpc_route("r", [{"backendRefs": [backend("v1", 70), backend("v2", 30), backend("v3", 0)]}]))
    accepted_everywhere(out)
    shares = [reached(call(out, random=i / 100)) for i in range(100)]
    assert (shares.count("v1"), shares.count("v2"), shares.count("v3")) == (70, 30, 0)


def test_named_rule() -> None:
    out = translate(grpc_route("r", [method_rule("Echo", "v1", name="named-rule"), method_rule("EchoTwo", "v2")]))
    accepted_everywhere(out)
    assert reached(call(out, "Echo")) == "v1"
    assert reached(call(out, "EchoTwo")) == "v2"


def test_request_header_modifier() -> None:
    modifier = {
        "set": [{"name": "X-Header-Set", "value": "set-overwrites-values"}],
        "add": [{"name": "X-Header-Add", "value": "header-val-1"}],
        "remove": ["X-Header-Remove"],
    }
    rule = {
        "filters": [{"type": "RequestHeaderModifier", "requestHeaderModifier": modifier}],
        "backendRefs": [backend("v1")],
    }
    out = translate(grpc_route("r", [rule]))
    accepted_everywhere(out)
    decision = call(out, metadata={"X-Header-Set": "some-other-value", "X-Header-Remove": "val", "X-Header-Add": "a"})
    assert isinstance(decision, Forward)
    headers = list(decision.request.headers)
    assert ("x-header-set", "set-overwrites-values") in headers
    assert ("x-header-set", "some-other-value") not in headers
    assert [v for k, v in headers if k == "x-header-add"] == ["a", "header-val-1"]
    assert all(k != "x-header-remove" for k, _ in headers)
