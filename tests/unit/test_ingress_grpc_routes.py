"""GRPCRoutes on an ingress Gateway of class ``istio``, written as users write them: the translation into the
gateway's listeners (service/method and header matches, filters, backends, hostnames intersected with the
listener's), the routes' parent status with istiod's reasons, the listener's ``attachedRoutes``, and the gateway's
routing of gRPC request heads. Attacks: a GRPCRoute from a namespace the listener does not admit, one aimed at a
TCP listener, and one a listener's ``allowedRoutes.kinds`` excludes are not attached anywhere."""

from __future__ import annotations

from typing import Any

from ambit.controlplane.gateway.ingress_status import ingress_attached_routes
from ambit.controlplane.translate import translate_all
from ambit.controlplane.translate.ingress import IngressTranslation, translate_ingress
from ambit.model.ingress import GatewayConfig
from ambit.model.route_matches import PathMatch, PathMatchType, ValueMatch, ValueMatchType
from ambit.model.routes import BackendService, HeaderModifier
from ambit.model.workload import Service
from ambit.waypoint.decisions import Forward, RequestHead, Respond
from ambit.waypoint.ingress_routing import IngressRouter

ECHO = Service("echo", "app", "echo.app.svc.cluster.local")
ALL = {"namespaces": {"from": "All"}}
HTTP = {"name": "http", "port": 8080, "protocol": "HTTP", "hostname": "*.example.com", "allowedRoutes": ALL}
TCP = {"name": "tcp", "port": 9000, "protocol": "TCP", "allowedRoutes": ALL}


def gateway(*listeners: dict[str, Any]) -> dict[str, Any]:
    return {
        "metadata": {"namespace": "edge", "name": "edge"},
        "spec": {"gatewayClassName": "istio", "listeners": list(listeners)},
    }


def grpc_route(name: str = "echo", namespace: str = "app", **spec: Any) -> dict[str, Any]:
    """A GRPCRoute as the Gateway API documentation writes one: service and method, a header, a header filter."""
    body: dict[str, Any] = {
        "parentRefs": [{"name": "edge", "namespace": "edge"}],
        "hostnames": ["grpc.example.com", "other.test"],
        "rules": [
            {
                "matches": [
                    {
                        "method": {"service": "echo.Echo", "method": "Say"},
                        "headers": [{"name": "X-Tenant", "value": "blue"}],
                    }
                ],
                "filters": [
                    {
                        "type": "RequestHeaderModifier",
                        "requestHeaderModifier": {"set": [{"name": "x-via", "value": "gw"}]},
                    }
                ],
                "backendRefs": [{"name": "echo", "port": 9090}],
            },
            {"matches": [{"method": {"service": "echo.Echo"}}], "backendRefs": [{"name": "echo", "port": 9090}]},
        ],
    }
    body.update(spec)
    return {
        "apiVersion": "gateway.networking.k8s.io/v1",
        "kind": "GRPCRoute",
        "metadata": {"namespace": namespace, "name": name, "generation": 2},
        "spec": body,
    }


def translate(gw: dict[str, Any], *grpc: dict[str, Any], http: tuple[dict[str, Any], ...] = ()) -> IngressTranslation:
    return translate_ingress(
        gateways=[gw],
        http_routes=list(http),
        grpc_routes=list(grpc),
        k8s_services=[ECHO],
        find_secret=lambda ns, name: None,
        namespace_labels={},
    )


def conditions(out: IngressTranslation, name: str = "echo") -> list[tuple[str, bool, str]]:
    (status,) = [s for s in out.status if s.name == name]
    (parent,) = status.parents
    return [(c.type, c.status, c.reason) for c in parent.conditions]


def test_a_grpc_route_serves_its_methods_on_the_http_listener_under_the_listener_s_hostname() -> None:
    out = translate(gateway(HTTP), grpc_route())
    (config,) = out.configs
    (listener,) = config.listeners
    # other.test is not under *.example.com: only grpc.example.com is served
    assert [v.hostname for v in listener.virtual_hosts] == ["grpc.example.com"]
    exact, prefix = listener.virtual_hosts[0].http
    assert exact.match.path == PathMatch(PathMatchType.EXACT, "/echo.Echo/Say")
    assert exact.match.method == "POST"
    assert exact.match.headers == (ValueMatch("x-tenant", "blue", ValueMatchType.EXACT),)
    assert exact.request_headers == HeaderModifier(set=(("x-via", "gw"),))
    assert exact.backends[0].backend == BackendService("app", "echo.app.svc.cluster.local", 9090)
    assert prefix.match.path == PathMatch(PathMatchType.PATH_PREFIX, "/echo.Echo")
    assert exact.route == "GRPCRoute/app/echo"
    assert conditions(out) == [("Accepted", True, "Accepted"), ("ResolvedRefs", True, "ResolvedRefs")]
    (status,) = out.status
    assert (status.kind, status.generation) == ("GRPCRoute", 2)
    assert status.parents[0].parent_ref_dict() == {"name": "edge", "namespace": "edge"}


def test_a_grpc_route_without_hostnames_takes_the_listener_s_and_a_wildcard_is_narrowed_to_it() -> None:
    listener = dict(HTTP, hostname="grpc.example.com")
    out = translate(gateway(listener), grpc_route(hostnames=["*.example.com"]))
    assert [v.hostname for v in out.configs[0].listeners[0].virtual_hosts] == ["grpc.example.com"]
    out = translate(gateway(dict(HTTP, hostname=None)), grpc_route(hostnames=[]))
    assert [v.hostname for v in out.configs[0].listeners[0].virtual_hosts] == ["*"]
    out = translate(gateway(HTTP), grpc_route(hostnames=["grpc.other.test"]))
    assert conditions(out)[0] == ("Accepted", False, "NoMatchingListenerHostname")
    assert out.configs[0].listeners[0].virtual_hosts == ()


def test_a_grpc_route_shares_a_virtual_host_with_http_routes_in_precedence_order() -> None:
    http = {
        "metadata": {"namespace": "app", "name": "web"},
        "spec": {
            "parentRefs": [{"name": "edge", "namespace": "edge"}],
            "hostnames": ["grpc.example.com"],
            "rules": [{"backendRefs": [{"name": "echo", "port": 80}]}],
        },
    }
    out = translate(gateway(HTTP), grpc_route(), http=(http,))
    rules = out.configs[0].listeners[0].virtual_hosts[0].http
    # Exact /echo.Echo/Say, then the longer prefix /echo.Echo, then the HTTPRoute's /
    assert [(r.route, r.match.path.value if r.match.path else None) for r in rules] == [
        ("GRPCRoute/app/echo", "/echo.Echo/Say"),
        ("GRPCRoute/app/echo", "/echo.Echo"),
        ("HTTPRoute/app/web", "/"),
    ]


def test_a_grpc_route_attaches_to_http_and_https_listeners_only() -> None:
    out = translate(gateway(HTTP, TCP), grpc_route())
    assert conditions(out)[0] == ("Accepted", True, "Accepted")
    http_listener, tcp_listener = out.configs[0].listeners
    assert http_listener.virtual_hosts and not tcp_listener.virtual_hosts
    aimed = grpc_route(parentRefs=[{"name": "edge", "namespace": "edge", "sectionName": "tcp"}])
    out = translate(gateway(HTTP, TCP), aimed)
    assert conditions(out)[0] == ("Accepted", False, "NotAllowedByListeners")
    assert all(not listener.virtual_hosts for listener in out.configs[0].listeners)


def test_a_grpc_route_from_a_namespace_the_listener_does_not_admit_is_not_attached() -> None:
    same = dict(HTTP, allowedRoutes={"namespaces": {"from": "Same"}})
    out = translate(gateway(same), grpc_route(namespace="intruder"))
    assert conditions(out)[0] == ("Accepted", False, "NotAllowedByListeners")
    assert out.configs[0].listeners[0].virtual_hosts == ()
    selector = dict(
        HTTP, allowedRoutes={"namespaces": {"from": "Selector", "selector": {"matchLabels": {"edge": "yes"}}}}
    )
    out = translate_ingress(
        gateways=[gateway(selector)],
        http_routes=[],
        grpc_routes=[grpc_route(namespace="intruder"), grpc_route("ok", namespace="app")],
        k8s_services=[ECHO, Service("echo", "intruder", "echo.intruder.svc.cluster.local")],
        find_secret=lambda ns, name: None,
        namespace_labels={"app": {"edge": "yes"}, "intruder": {"edge": "no"}},
    )
    assert conditions(out, "echo")[0] == ("Accepted", False, "NotAllowedByListeners")
    assert conditions(out, "ok")[0] == ("Accepted", True, "Accepted")
    routes = {r.route for v in out.configs[0].listeners[0].virtual_hosts for r in v.http}
    assert routes == {"GRPCRoute/app/ok"}


def test_a_listener_whose_allowed_kinds_exclude_grpc_routes_refuses_them() -> None:
    only_http = dict(HTTP, allowedRoutes={**ALL, "kinds": [{"kind": "HTTPRoute"}]})
    out = translate(gateway(only_http), grpc_route())
    assert conditions(out)[0] == ("Accepted", False, "NotAllowedByListeners")
    assert out.configs[0].listeners[0].virtual_hosts == ()


def test_unresolved_backends_and_unsupported_filters_are_reported_and_answer_500() -> None:
    route = grpc_route(
        rules=[
            {"matches": [{"method": {"service": "a.A"}}], "backendRefs": [{"name": "missing", "port": 9090}]},
            {
                "matches": [{"method": {"service": "b.B"}}],
                "filters": [{"type": "URLRewrite", "urlRewrite": {"hostname": "x"}}],
                "backendRefs": [{"name": "echo", "port": 9090}],
            },
        ]
    )
    out = translate(gateway(HTTP), route)
    assert conditions(out)[1] == ("ResolvedRefs", False, "BackendNotFound")
    message = out.status[0].parents[0].conditions[1].message
    assert "backend(missing) not found" in message and 'unsupported filter type "URLRewrite"' in message
    missing, filtered = out.configs[0].listeners[0].virtual_hosts[0].http
    assert missing.backends[0].backend is None  # its share answers 500
    assert filtered.backends == ()  # the filter must not be skipped: the rule answers 500


def test_attached_routes_count_grpc_routes_on_http_listeners_only() -> None:
    gw = gateway(HTTP, TCP)
    routes = [
        grpc_route(),
        grpc_route("to-tcp", parentRefs=[{"name": "edge", "namespace": "edge", "sectionName": "tcp"}]),
    ]
    assert ingress_attached_routes(gw, {"GRPCRoute": routes}) == {"http": 1, "tcp": 0}


def test_translate_all_gives_the_gateway_its_grpc_routes_and_the_route_its_ingress_parent() -> None:
    out = translate_all(
        pods=(),
        services=[
            {
                "metadata": {"name": "echo", "namespace": "app"},
                "spec": {"clusterIP": "198.18.2.9", "ports": [{"name": "grpc", "port": 9090}]},
            }
        ],
        endpoint_slices=(),
        namespaces=[{"metadata": {"name": "app"}}, {"metadata": {"name": "edge"}}],
        gateways=[gateway(HTTP)],
        grpc_routes=[grpc_route()],
    )
    (config,) = out.gateway_configs
    assert [r.route for v in config.listeners[0].virtual_hosts for r in v.http] == ["GRPCRoute/app/echo"] * 2
    (status,) = [s for s in out.route_status if s.kind == "GRPCRoute"]
    assert [c.reason for c in status.parents[0].conditions] == ["Accepted", "ResolvedRefs"]


# -- routing at the gateway -------------------------------------------------------------------------------------
def grpc_head(
    path: str, host: str = "grpc.example.com:8080", method: str = "POST", tenant: str = "blue"
) -> RequestHead:
    headers = (("content-type", "application/grpc"), ("te", "trailers"), ("x-tenant", tenant))
    return RequestHead(method, path, host, headers)


def test_the_gateway_routes_grpc_calls_by_service_method_and_header() -> None:
    config: GatewayConfig = translate(gateway(HTTP), grpc_route()).configs[0]
    router = IngressRouter(config)
    on_http = BackendService("edge", "", 8080)
    say = router.decide(None, on_http, grpc_head("/echo.Echo/Say"), 0.0)
    assert isinstance(say, Forward) and say.backend.port == 9090
    assert ("x-via", "gw") in say.request.headers
    other = router.decide(None, on_http, grpc_head("/echo.Echo/Say", tenant="red"), 0.0)
    assert isinstance(other, Forward) and ("x-via", "gw") not in other.request.headers  # the service rule
    for refused in (
        grpc_head("/echo.Echo/Say", method="GET"),  # gRPC is POST: a GET matches no gRPC rule
        grpc_head("/other.Svc/Say"),
        grpc_head("/echo.Echo/Say", host="other.test"),
    ):
        decision = router.decide(None, on_http, refused, 0.0)
        assert isinstance(decision, Respond) and decision.status == 404, refused
