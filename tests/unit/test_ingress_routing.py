"""The ingress gateway's pure parts: the translation of ingress Gateways and HTTPRoutes into a GatewayConfig (and the
routes' ingress parent status), the GatewayConfig wire form, and the gateway's routing by listener and virtual
host, with hostile input."""

from __future__ import annotations

import base64
import contextlib
import time
from typing import Any

import pytest
from google.protobuf import any_pb2
from hypothesis import given, settings
from hypothesis import strategies as st

from ambit.controlplane.translate.ingress import served_hostnames, translate_ingress
from ambit.model.envoyfilter import ProxyPatches
from ambit.model.ingress import GatewayConfig, IngressCertificate, IngressListener, ListenerProtocol, VirtualHost
from ambit.model.route_matches import PathMatch, PathMatchType, RouteMatch
from ambit.model.routes import BackendService, RouteRule, WeightedBackend
from ambit.model.workload import Service
from ambit.tls.certs import issue_server_cert, new_ca
from ambit.waypoint.decisions import Forward, RequestHead, Respond
from ambit.waypoint.ingress_routing import IngressRouter, request_host
from ambit.xds.errors import XdsConversionError
from ambit.xds.gateway import (
    GATEWAY_CONFIG_TYPE_URL,
    decode_gateway_config,
    gateway_config_to_proto,
    pack_gateway_config,
)

CA = new_ca("routing test CA", now=time.time())
PAIR = issue_server_cert(CA, common_name="a.example", dns_names=["a.example"], ip_addresses=[], now=time.time())
ECHO = Service("echo", "app", "echo.app.svc.cluster.local")


def secret() -> dict[str, Any]:
    return {
        "metadata": {"namespace": "edge", "name": "cert"},
        "type": "kubernetes.io/tls",
        "data": {
            "tls.crt": base64.b64encode(PAIR.cert_pem).decode(),
            "tls.key": base64.b64encode(PAIR.key_pem).decode(),
        },
    }


def gateway(*listeners: dict[str, Any]) -> dict[str, Any]:
    return {
        "metadata": {"namespace": "edge", "name": "edge"},
        "spec": {"gatewayClassName": "istio", "listeners": list(listeners)},
    }


def route(name: str, namespace: str = "app", hostnames: list[str] | None = None, **ref: Any) -> dict[str, Any]:
    spec: dict[str, Any] = {
        "parentRefs": [{"name": "edge", "namespace": "edge", **ref}],
        "rules": [{"backendRefs": [{"name": "echo", "port": 80}]}],
    }
    if hostnames is not None:
        spec["hostnames"] = hostnames
    return {"metadata": {"namespace": namespace, "name": name, "generation": 3}, "spec": spec}


ALL = {"namespaces": {"from": "All"}}
HTTP = {"name": "http", "port": 8080, "protocol": "HTTP", "allowedRoutes": ALL}
HTTPS = {
    "name": "https",
    "port": 8443,
    "protocol": "HTTPS",
    "hostname": "a.example",
    "tls": {"certificateRefs": [{"name": "cert"}]},
    "allowedRoutes": ALL,
}


def translate(gw: dict[str, Any], *routes: dict[str, Any], labels: dict[str, dict[str, str]] | None = None) -> Any:
    return translate_ingress(
        gateways=[gw],
        http_routes=list(routes),
        k8s_services=[ECHO],
        find_secret=lambda ns, name: secret() if (ns, name) == ("edge", "cert") else None,
        namespace_labels=labels or {},
    )


# -- translation ----------------------------------------------------------------------------------------------
def test_a_route_attaches_to_every_admitting_listener_with_its_hostnames() -> None:
    out = translate(gateway(HTTP, HTTPS), route("echo", hostnames=["a.example", "b.example"]))
    (config,) = out.configs
    http, https = config.listeners
    assert [v.hostname for v in http.virtual_hosts] == ["a.example", "b.example"]
    assert [v.hostname for v in https.virtual_hosts] == ["a.example"]  # b.example is not under the listener's name
    assert https.certificates == (IngressCertificate(PAIR.cert_pem, PAIR.key_pem),)
    backend = https.virtual_hosts[0].http[0].backends[0].backend
    assert backend == BackendService("app", "echo.app.svc.cluster.local", 80)
    assert out.accounts == (("edge/edge", "edge-istio"),)
    (status,) = out.status
    (parent,) = status.parents
    assert [(c.type, c.status, c.reason) for c in parent.conditions] == [
        ("Accepted", True, "Accepted"),
        ("ResolvedRefs", True, "ResolvedRefs"),
    ]


def test_same_namespace_is_the_default_and_a_selector_admits_by_labels() -> None:
    same = dict(HTTP, allowedRoutes={})
    out = translate(gateway(same), route("echo"))
    assert out.status[0].parents[0].conditions[0].reason == "NotAllowedByListeners"
    selector = dict(
        HTTP, allowedRoutes={"namespaces": {"from": "Selector", "selector": {"matchLabels": {"ingress": "yes"}}}}
    )
    out = translate(gateway(selector), route("echo"), labels={"app": {"ingress": "yes"}})
    assert out.status[0].parents[0].conditions[0].status is True


def test_section_name_port_and_hostname_mismatches_are_reported() -> None:
    out = translate(gateway(HTTP), route("a", sectionName="nope"), route("b", hostnames=["c.example"], port=8443))
    reasons = {s.name: s.parents[0].conditions[0].reason for s in out.status}
    assert reasons == {"a": "NoMatchingParent", "b": "NoMatchingParent"}
    out = translate(gateway(HTTPS), route("c", hostnames=["c.example"]))
    assert out.status[0].parents[0].conditions[0].reason == "NoMatchingListenerHostname"


def test_an_unready_listener_is_not_served_and_takes_no_route() -> None:
    broken = dict(HTTPS, tls={"certificateRefs": [{"name": "missing"}]})
    out = translate(gateway(broken), route("echo"))
    assert out.configs[0].listeners == ()
    assert out.status[0].parents[0].conditions[0].reason == "NotAllowedByListeners"


def test_a_backend_in_another_namespace_needs_a_reference_grant() -> None:
    foreign = route("echo", namespace="web")
    foreign["spec"]["rules"][0]["backendRefs"][0]["namespace"] = "app"
    out = translate(gateway(HTTP), foreign)
    resolved = out.status[0].parents[0].conditions[1]
    assert (resolved.status, resolved.reason) == (False, "RefNotPermitted")
    grant = {
        "metadata": {"namespace": "app", "name": "web-to-echo"},
        "spec": {
            "from": [{"group": "gateway.networking.k8s.io", "kind": "HTTPRoute", "namespace": "web"}],
            "to": [{"group": "", "kind": "Service", "name": "echo"}],
        },
    }
    out = translate_ingress(
        gateways=[gateway(HTTP)],
        http_routes=[foreign],
        k8s_services=[ECHO],
        find_secret=lambda ns, name: None,
        namespace_labels={},
        reference_grants=[grant],
    )
    assert out.status[0].parents[0].conditions[1].status is True
    backend = out.configs[0].listeners[0].virtual_hosts[0].http[0].backends[0].backend
    assert backend == BackendService("app", "echo.app.svc.cluster.local", 80)


def test_parents_that_are_not_ingress_gateways_are_left_alone() -> None:
    waypoint = gateway(HTTP)
    waypoint["spec"]["gatewayClassName"] = "istio-waypoint"
    out = translate(waypoint, route("echo"))
    assert out.configs == () and out.status == ()


@pytest.mark.parametrize(
    ("listener", "route_hosts", "served"),
    [
        ("", (), ("*",)),
        ("a.example", (), ("a.example",)),
        ("*.example", ("a.example", "b.other"), ("a.example",)),
        ("a.example", ("*.example",), ("a.example",)),
        ("*.example", ("*.a.example",), ("*.a.example",)),
        ("*.a.example", ("*.example",), ("*.a.example",)),
        ("a.example", ("b.example",), ()),
    ],
)
def test_hostnames_served_are_the_narrower_of_listener_and_route(
    listener: str, route_hosts: tuple[str, ...], served: tuple[str, ...]
) -> None:
    assert served_hostnames(listener, route_hosts) == served


# -- wire form ------------------------------------------------------------------------------------------------
def sample() -> GatewayConfig:
    rule = RouteRule(
        route="HTTPRoute/app/echo",
        match=RouteMatch(path=PathMatch(PathMatchType.PATH_PREFIX, "/")),
        backends=(WeightedBackend(BackendService("app", "echo.app.svc.cluster.local", 80)),),
    )
    return GatewayConfig(
        "edge/edge",
        (
            IngressListener("http", 8080, ListenerProtocol.HTTP, "", (), (VirtualHost("*", (rule,)),)),
            IngressListener(
                "https",
                8443,
                ListenerProtocol.HTTPS,
                "a.example",
                (IngressCertificate(PAIR.cert_pem, PAIR.key_pem),),
                (VirtualHost("a.example", (rule,)),),
            ),
        ),
    )


def test_a_gateway_config_survives_the_wire() -> None:
    config = sample()
    assert decode_gateway_config("edge/edge", pack_gateway_config(gateway_config_to_proto(config))) == config


def test_a_config_under_another_name_or_an_https_listener_without_certificate_is_refused() -> None:
    body = pack_gateway_config(gateway_config_to_proto(sample()))
    with pytest.raises(XdsConversionError, match="describes"):
        decode_gateway_config("edge/other", body)
    bare = gateway_config_to_proto(sample())
    del bare.listeners[1].certificates[:]
    with pytest.raises(XdsConversionError, match="certificate"):
        decode_gateway_config("edge/edge", pack_gateway_config(bare))


@pytest.mark.parametrize("where", ["listener", "virtual host"])
def test_a_hostname_with_a_trailing_newline_is_refused(where: str) -> None:
    def sent(hostname: str) -> any_pb2.Any:
        message = gateway_config_to_proto(sample())
        listener = message.listeners[1]
        if where == "listener":
            listener.hostname = hostname
        else:
            listener.virtual_hosts[0].hostname = hostname
        return pack_gateway_config(message)

    assert decode_gateway_config("edge/edge", sent("a.example")) == sample()
    with pytest.raises(XdsConversionError, match="not a hostname"):
        decode_gateway_config("edge/edge", sent("a.example\n"))


@settings(max_examples=200, deadline=None)
@given(st.binary(max_size=300))
def test_any_bytes_decode_to_a_config_or_a_conversion_error(value: bytes) -> None:
    with contextlib.suppress(XdsConversionError):
        decode_gateway_config("edge/edge", any_pb2.Any(type_url=GATEWAY_CONFIG_TYPE_URL, value=value))


# -- routing --------------------------------------------------------------------------------------------------
def head(host: str, path: str = "/") -> RequestHead:
    return RequestHead("GET", path, host)


def test_http_routes_by_host_and_unknown_hosts_get_404() -> None:
    config = sample()
    router = IngressRouter(config)
    decision = router.decide(None, BackendService("edge", "", 8080), head("anything:8080"), 0.0)
    assert isinstance(decision, Forward) and decision.backend.hostname == "echo.app.svc.cluster.local"
    decision = router.decide(None, BackendService("edge", "", 8443), head("b.example"), 0.0)
    assert isinstance(decision, Respond) and decision.status == 404
    assert (decision.body, decision.headers) == (b"", ())  # Envoy's router answers no route with an empty 404


def test_an_https_connection_stays_on_the_listener_its_sni_picked() -> None:
    router = IngressRouter(sample())
    assert router.pick_listener(8443, "A.Example.") is not None
    assert router.pick_listener(8443, "b.example") is None
    decision = router.decide(None, BackendService("edge", "https", 8443), head("a.example"), 0.0)
    assert isinstance(decision, Forward)
    decision = router.decide(None, BackendService("edge", "https", 8443), head("other.example"), 0.0)
    assert isinstance(decision, Respond) and decision.status == 404


def test_the_most_specific_listener_and_virtual_host_win() -> None:
    wild = IngressListener("wild", 80, ListenerProtocol.HTTP, "*.example", (), (VirtualHost("*.example"),))
    exact = IngressListener("exact", 80, ListenerProtocol.HTTP, "a.example", (), (VirtualHost("a.example"),))
    anyhost = IngressListener("any", 80, ListenerProtocol.HTTP, "", (), ())
    router = IngressRouter(GatewayConfig("edge/edge", (anyhost, wild, exact)))
    picked = [router.pick_listener(80, name) for name in ("a.example", "b.example", "c.other", "")]
    assert [p.name if p else None for p in picked] == ["exact", "wild", "any", "any"]


@pytest.mark.parametrize(
    ("authority", "host"),
    [("A.example:8080", "a.example"), ("a.example.", "a.example"), ("[::1]:80", "::1"), ("", ""), ("x:y", "x:y")],
)
def test_request_host_strips_the_port(authority: str, host: str) -> None:
    assert request_host(authority) == host


@settings(max_examples=200, deadline=None)
@given(st.text(max_size=40), st.text(max_size=40), st.integers(min_value=0, max_value=70000))
def test_any_request_gets_a_decision(authority: str, listener: str, port: int) -> None:
    router = IngressRouter(sample())
    decision = router.decide(None, BackendService("edge", listener, port), head(authority), 0.5)
    assert isinstance(decision, Forward | Respond)


def test_an_https_redirect_host_answers_301_with_host_and_path_verbatim_before_routing() -> None:
    echo = BackendService("app", "echo.app.svc.cluster.local", 80)
    routed = (RouteRule("r", RouteMatch(), backends=(WeightedBackend(echo, 100),)),)
    hosts = (VirtualHost("a.example", routed, (), True), VirtualHost("*.only", (), (), True), VirtualHost("*", routed))
    router = IngressRouter(
        GatewayConfig("edge/edge", (IngressListener("http", 80, ListenerProtocol.HTTP, "", (), hosts),))
    )
    cases = {
        ("a.example", "/x?y=1"): "https://a.example/x?y=1",
        ("A.Example:8080", "/"): "https://A.Example:8080/",
        ("b.only", "/p"): "https://b.only/p",
    }
    for (authority, path), location in cases.items():
        decision = router.decide(None, BackendService("edge", "", 80), head(authority, path), 0.0)
        assert decision == Respond(301, (("location", location),), b"", by_router=False), (authority, path)
    decision = router.decide(None, BackendService("edge", "", 80), head("elsewhere"), 0.0)
    assert isinstance(decision, Forward)  # a host without the flag is routed


@pytest.mark.parametrize(
    ("hops", "forwarded", "connection", "scheme"),
    [
        (None, "https", "http", "http"),  # untrusted: the connection's
        (0, "https", "http", "http"),
        (1, "https", "http", "https"),  # trusted edge proxies: their word
        (1, "http", "https", "http"),
        (1, "gopher", "http", "http"),  # not a valid X-Forwarded-Proto: ignored
        (1, None, "https", "https"),
    ],
)
def test_the_scheme_routes_and_the_backend_see_is_a_trusted_x_forwarded_proto_else_the_connections(
    hops: int | None, forwarded: str | None, connection: str, scheme: str
) -> None:
    backend = BackendService("app", "echo.app.svc.cluster.local", 80)
    rule = RouteRule(route="VirtualService/app/r", match=RouteMatch(), backends=(WeightedBackend(backend),))
    host = VirtualHost("a.example", (rule,))
    config = GatewayConfig(
        "edge/edge",
        (IngressListener("http", 80, ListenerProtocol.HTTP, "", (), (host,)),),
        envoy_patches=ProxyPatches(xff_trusted_hops=hops),
    )
    headers = (("x-forwarded-proto", forwarded),) if forwarded else ()
    request = RequestHead("GET", "/", "a.example", headers, connection)
    decision = IngressRouter(config).decide(None, BackendService("", "", 80), request, 0.0)
    assert isinstance(decision, Forward) and decision.request.scheme == scheme
    assert [v for n, v in decision.request.headers if n == "x-forwarded-proto"] == [scheme]
