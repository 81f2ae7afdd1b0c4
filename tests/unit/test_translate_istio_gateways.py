"""Istio's own Gateway (networking.istio.io) and the VirtualServices bound to it → the GatewayConfig of the gateway
pods it selects (ambit.controlplane.translate.istio_gateways): upstream's TestIngress and TestAuthorizationGateway
objects verbatim, then each rule of the module, then arbitrary objects (hypothesis)."""

from __future__ import annotations

import base64
import dataclasses
import time
from typing import Any

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st
from tests.ingress_pki import cert_sha256_hex, client_cert, opaque_secret, spki_sha256_b64
from tests.upstream_objects import authorization_gateway_route, ingress_gateway, ingress_route

from ambit.controlplane.translate import Translation, translate_all
from ambit.controlplane.translate.istio_gateway_servers import CIPHER_SUITES
from ambit.model.ingress import (
    GatewayConfig,
    IngressCertificate,
    IngressListener,
    ListenerProtocol,
    ListenerTls,
    TlsMode,
    VirtualHost,
)
from ambit.model.route_matches import PathMatch, PathMatchType, RouteMatch, ValueMatch
from ambit.model.routes import BackendService, CorsPolicy, RetryPolicy, RouteRule, Timeouts, WeightedBackend
from ambit.tls.certs import issue_server_cert, new_ca
from ambit.xds.errors import XdsConversionError
from ambit.xds.gateway import decode_gateway_config, gateway_config_to_proto, pack_gateway_config

Obj = dict[str, Any]
KEY = "istio-system/istio-ingressgateway"
ACCOUNT = "istio-ingressgateway-service-account"
B = BackendService("app", "b.app.svc.cluster.local", 80)
NOW = time.time()
CA = new_ca("test ingress CA", now=NOW)
PAIR = issue_server_cert(CA, common_name="a.example.com", dns_names=["a.example.com"], ip_addresses=[], now=NOW)


def namespace(name: str) -> Obj:
    return {"metadata": {"name": name}}


def service(name: str, ns: str = "app", ports: tuple[int, ...] = (80,), ip: str = "10.96.0.10") -> Obj:
    return {
        "metadata": {"name": name, "namespace": ns},
        "spec": {"clusterIP": ip, "ports": [{"name": f"p{p}", "port": p} for p in ports]},
    }


def gateway_pod(
    name: str = "istio-ingressgateway-1",
    ns: str = "istio-system",
    account: str = ACCOUNT,
    labels: dict[str, str] | None = None,
) -> Obj:
    return {
        "metadata": {
            "name": name,
            "namespace": ns,
            "uid": f"uid-{name}",
            "labels": labels if labels is not None else {"app": "istio-ingressgateway", "istio": "ingressgateway"},
        },
        "spec": {"serviceAccountName": account, "nodeName": "n1"},
        "status": {"phase": "Running", "podIP": "198.18.4.9", "podIPs": [{"ip": "198.18.4.9"}]},
    }


def tls_secret(name: str = "cert", ns: str = "istio-system") -> Obj:
    return {
        "metadata": {"name": name, "namespace": ns},
        "type": "kubernetes.io/tls",
        "data": {
            "tls.crt": base64.b64encode(PAIR.cert_pem).decode(),
            "tls.key": base64.b64encode(PAIR.key_pem).decode(),
        },
    }


def gateway(*servers: Obj, name: str = "gateway", ns: str = "app", created: str = "", **selector: str) -> Obj:
    meta: Obj = {"name": name, "namespace": ns}
    if created:
        meta["creationTimestamp"] = created
    return {"metadata": meta, "spec": {"selector": selector or {"istio": "ingressgateway"}, "servers": list(servers)}}


def server(port: int, protocol: str, *hosts: str, **tls: str) -> Obj:
    out: Obj = {"port": {"number": port, "name": f"p{port}", "protocol": protocol}, "hosts": list(hosts or ("*",))}
    if tls:
        out["tls"] = tls
    return out


def vs(name: str = "route", ns: str = "app", created: str = "", **spec: Any) -> Obj:
    meta: Obj = {"name": name, "namespace": ns}
    if created:
        meta["creationTimestamp"] = created
    return {"metadata": meta, "spec": spec}


def translate(
    gateways: list[Obj],
    virtual_services: list[Obj],
    *,
    pods: list[Obj] | None = None,
    secrets: list[Obj] = (),  # type: ignore[assignment]
    more_services: tuple[Obj, ...] = (),
    **extra: Any,
) -> Translation:
    translation = translate_all(
        pods=[gateway_pod()] if pods is None else pods,
        services=[service("b"), service("c", ports=(80, 8080), ip="10.96.0.11"), *more_services],
        endpoint_slices=(),
        namespaces=[namespace("app"), namespace("istio-system"), namespace("other")],
        istio_gateways=gateways,
        virtual_services=virtual_services,
        secrets=secrets,
        **extra,
    )
    for config in translation.gateway_configs:  # what reaches a gateway is what its decoder accepts
        assert decode_gateway_config(config.gateway, pack_gateway_config(gateway_config_to_proto(config))) == config
    return translation


def config(translation: Translation, key: str = KEY) -> GatewayConfig:
    found = [c for c in translation.gateway_configs if c.gateway == key]
    assert len(found) == 1, translation.gateway_configs
    return found[0]


def notes(translation: Translation) -> list[str]:
    return [f"{s.kind} {s.namespace}/{s.name} {s.note}" for s in translation.skipped]


def test_upstream_ingress_routes_every_host_on_port_80_to_the_destination() -> None:
    translation = translate([ingress_gateway("app")], [ingress_route("b", "app")])
    got = config(translation)
    assert dict(translation.gateway_accounts)[KEY] == ACCOUNT
    (listener,) = got.listeners
    assert (listener.port, listener.protocol, listener.hostname) == (80, ListenerProtocol.HTTP, "")
    (host,) = listener.virtual_hosts
    assert host.hostname == "*"
    (rule,) = host.http
    assert rule.match == RouteMatch() and rule.backends == (WeightedBackend(B, 100),)
    assert rule.route == "VirtualService/app/route"


def test_a_bound_virtual_service_s_cors_policy_reaches_the_gateway_s_rule() -> None:
    route = ingress_route("b", "app")
    route["spec"]["http"][0]["corsPolicy"] = {"allowOrigins": [{"exact": "cors.com"}], "allowMethods": ["GET"]}
    (listener,) = config(translate([ingress_gateway("app")], [route])).listeners
    (rule,) = listener.virtual_hosts[0].http
    assert rule.cors == CorsPolicy(allow_origins=(ValueMatch("origin", "cors.com"),), allow_methods="GET")


def test_upstream_authorization_gateway_routes_each_path_to_its_port() -> None:
    translation = translate([ingress_gateway("app")], [authorization_gateway_route("c", 80, 8080, "app")])
    (listener,) = config(translation).listeners
    (host,) = listener.virtual_hosts
    allowed, deny = host.http
    assert allowed.match.path == PathMatch(PathMatchType.EXACT, "/allowed")
    assert allowed.backends[0].backend == BackendService("app", "c.app.svc.cluster.local", 80)
    assert deny.match.path == PathMatch(PathMatchType.EXACT, "/deny")
    assert deny.backends[0].backend == BackendService("app", "c.app.svc.cluster.local", 8080)


def test_a_virtual_service_binds_only_to_the_gateways_it_names() -> None:
    mesh_only = vs("mesh-only", hosts=["*"], http=[{"route": [{"destination": {"host": "c"}}]}])
    by_full_name = vs(
        "full",
        ns="other",
        gateways=["app/gateway"],
        hosts=["full.example.com"],
        http=ingress_route("b")["spec"]["http"],
    )
    other_gateway = vs("elsewhere", gateways=["nope"], hosts=["*"], http=ingress_route("c")["spec"]["http"])
    by_full_name["spec"]["http"][0]["route"][0]["destination"]["host"] = "b.app.svc.cluster.local"
    translation = translate([ingress_gateway("app")], [mesh_only, by_full_name, other_gateway])
    (listener,) = config(translation).listeners
    assert [h.hostname for h in listener.virtual_hosts] == ["full.example.com"]
    assert listener.virtual_hosts[0].http[0].route == "VirtualService/other/full"


def test_server_hosts_limit_the_namespaces_and_names_a_virtual_service_serves() -> None:
    gw = gateway(server(80, "HTTP", "./*.example.com", "other/*"))
    here = vs(
        "here", gateways=["gateway"], hosts=["a.example.com", "*", "x.org"], http=ingress_route("b")["spec"]["http"]
    )
    translation = translate([gw], [here])
    (listener,) = config(translation).listeners
    # "a.example.com" is narrower than the server's "*.example.com"; "*" narrows to the server's host; "other/*"
    # is not visible to a VirtualService of namespace app, so "x.org" is not served.
    assert [h.hostname for h in listener.virtual_hosts] == ["a.example.com", "*.example.com"]


def test_virtual_services_for_one_host_are_concatenated_oldest_first() -> None:
    route = ingress_route("b")["spec"]["http"]
    newer = vs("newer", created="2024-02-01T00:00:00Z", gateways=["gateway"], hosts=["*"], http=route)
    older = vs(
        "older",
        created="2024-01-01T00:00:00Z",
        gateways=["gateway"],
        hosts=["*"],
        http=[{"match": [{"uri": {"prefix": "/old"}}], "route": [{"destination": {"host": "c"}}]}],
    )
    (listener,) = config(translate([ingress_gateway("app")], [newer, older])).listeners
    assert [r.route for r in listener.virtual_hosts[0].http] == ["VirtualService/app/older", "VirtualService/app/newer"]


def test_a_match_naming_another_gateway_is_left_out_and_port_matches_hold_for_the_server_port() -> None:
    rules = [
        {"match": [{"gateways": ["mesh"], "uri": {"prefix": "/mesh"}}], "route": [{"destination": {"host": "c"}}]},
        {"match": [{"port": 8080, "uri": {"prefix": "/other-port"}}], "route": [{"destination": {"host": "c"}}]},
        {
            "match": [{"gateways": ["gateway"], "port": 80, "uri": {"prefix": "/ok"}}],
            "route": [{"destination": {"host": "b"}}],
        },
    ]
    (listener,) = config(
        translate([ingress_gateway("app")], [vs(gateways=["gateway"], hosts=["*"], http=rules)])
    ).listeners
    assert [r.match.path for r in listener.virtual_hosts[0].http] == [PathMatch(PathMatchType.PREFIX, "/ok")]


def test_gateways_selecting_one_pod_group_merge_their_servers_and_a_port_keeps_its_first_protocol() -> None:
    first = gateway(server(80, "HTTP", "a.example.com"), name="first", created="2024-01-01T00:00:00Z")
    second = gateway(
        server(80, "HTTP", "b.example.com"), server(8000, "TCP"), name="second", created="2024-01-02T00:00:00Z"
    )
    third = gateway(server(80, "TCP"), name="third", created="2024-01-03T00:00:00Z")
    route = ingress_route("b")["spec"]["http"]
    bound = vs(
        gateways=["first", "second", "third"],
        hosts=["*"],
        http=route,
        tcp=[{"route": [{"destination": {"host": "c", "port": {"number": 8080}}}]}],
    )
    translation = translate([third, second, first], [bound])
    http, tcp = config(translation).listeners
    assert (http.port, http.protocol) == (80, ListenerProtocol.HTTP)
    assert [h.hostname for h in http.virtual_hosts] == ["a.example.com", "b.example.com"]
    assert (tcp.port, tcp.protocol) == (8000, ListenerProtocol.TCP)
    (host,) = tcp.virtual_hosts
    assert host.tcp_backends == (WeightedBackend(BackendService("app", "c.app.svc.cluster.local", 8080), 100),)
    assert any("app/third spec.servers[0].port: port 80 already serves HTTP" in n for n in notes(translation))


def test_https_simple_serves_the_credential_of_the_gateway_pods_namespace() -> None:
    gw = gateway(server(443, "HTTPS", "a.example.com", mode="SIMPLE", credentialName="cert"))
    bound = vs(gateways=["gateway"], hosts=["a.example.com"], http=ingress_route("b")["spec"]["http"])
    (listener,) = config(translate([gw], [bound], secrets=[tls_secret()])).listeners
    assert (listener.protocol, listener.hostname) == (ListenerProtocol.HTTPS, "a.example.com")
    assert listener.certificates[0].cert_pem == PAIR.cert_pem
    assert [h.hostname for h in listener.virtual_hosts] == ["a.example.com"]


def test_a_credential_outside_the_gateway_namespace_or_an_unsupported_mode_is_not_served() -> None:
    gw = gateway(
        server(443, "HTTPS", mode="SIMPLE", credentialName="cert"),
        server(8443, "HTTPS", mode="AUTO_PASSTHROUGH", credentialName="cert"),
        server(9443, "HTTPS", mode="SIMPLE"),
        server(7000, "MONGO"),
    )
    translation = translate([gw], [], secrets=[tls_secret(ns="app")])
    assert config(translation).listeners == ()
    found = "\n".join(notes(translation))
    assert "spec.servers[0].tls.credentialName: Secret istio-system/cert not found" in found
    assert "spec.servers[1].tls.mode: TLS mode AUTO_PASSTHROUGH is not supported" in found
    assert "spec.servers[2].tls.credentialName: SIMPLE TLS needs a credentialName" in found
    assert "spec.servers[3].port.protocol: protocol MONGO is not supported" in found


def test_tls_passthrough_routes_each_sni_host_the_server_covers() -> None:
    gw = gateway(server(443, "TLS", "*.example.com", mode="PASSTHROUGH"))
    tls = [
        {"match": [{"sniHosts": ["a.example.com", "x.org"]}], "route": [{"destination": {"host": "b"}}]},
        {
            "match": [{"sniHosts": ["a.example.com", "c.example.com"]}],
            "route": [{"destination": {"host": "c", "port": {"number": 8080}}}],
        },
    ]
    (listener,) = config(translate([gw], [vs(gateways=["gateway"], hosts=["*.example.com"], tls=tls)])).listeners
    assert listener.protocol is ListenerProtocol.TLS
    hosts = {h.hostname: h.tcp_backends[0].backend for h in listener.virtual_hosts}
    assert hosts == {"a.example.com": B, "c.example.com": BackendService("app", "c.app.svc.cluster.local", 8080)}


def test_pods_group_by_namespace_and_app_label_and_read_as_their_first_pods_account() -> None:
    pods = [
        gateway_pod("istio-ingressgateway-2", account="intruder"),
        gateway_pod("istio-ingressgateway-1"),
        gateway_pod("mine", ns="app", account="edge", labels={"app": "edge", "istio": "ingressgateway"}),
        gateway_pod("nameless", ns="app", labels={"istio": "ingressgateway"}),
        gateway_pod("unselected", ns="app", labels={"app": "web"}),
        gateway_pod(
            "managed", ns="app", labels={"app": "m", "istio": "ingressgateway", "gateway.istio.io/managed": "x"}
        ),
    ]
    translation = translate([ingress_gateway("app")], [ingress_route("b", "app")], pods=pods)
    assert dict(translation.gateway_accounts) == {KEY: ACCOUNT, "app/edge": "edge"}
    found = "\n".join(notes(translation))
    assert "Pod istio-system/istio-ingressgateway-2 spec.serviceAccountName" in found
    assert "Pod app/nameless metadata.labels: selected by an Istio Gateway but has no app label" in found


def test_a_server_port_is_the_gateway_service_port_and_binds_its_target_port() -> None:
    lb = {
        "metadata": {"name": "istio-ingressgateway", "namespace": "istio-system"},
        "spec": {
            "type": "LoadBalancer",
            "clusterIP": "10.96.9.9",
            "selector": {"istio": "ingressgateway"},
            "ports": [
                {"name": "http2", "port": 80, "targetPort": 8080},
                {"name": "https", "port": 443, "targetPort": 8443},
            ],
        },
    }
    rules = [{"match": [{"port": 80, "uri": {"prefix": "/"}}], "route": [{"destination": {"host": "b"}}]}]
    gw = gateway(server(80, "HTTP"), server(9000, "HTTP"))
    translation = translate([gw], [vs(gateways=["gateway"], hosts=["*"], http=rules)], more_services=(lb,))
    mapped, unmapped = config(translation).listeners
    assert (mapped.port, unmapped.port) == (8080, 9000)
    assert len(mapped.virtual_hosts[0].http) == 1  # match.port is the server's port as written
    assert unmapped.virtual_hosts[0].http == ()


def test_https_redirect_marks_the_server_s_virtual_hosts_and_adds_one_per_server_host() -> None:
    redirecting = {**server(80, "HTTP", "a.example.com", "*.redirect.example"), "tls": {"httpsRedirect": True}}
    plain = server(80, "HTTP", "b.example.com")
    gw = gateway(redirecting, plain)
    routes = [
        vs("a", gateways=["gateway"], hosts=["a.example.com"], http=ingress_route("b")["spec"]["http"]),
        vs("b", gateways=["gateway"], hosts=["b.example.com"], http=ingress_route("b")["spec"]["http"]),
    ]
    translation = translate([gw], routes)
    (listener,) = config(translation).listeners
    hosts = {h.hostname: h for h in listener.virtual_hosts}
    assert set(hosts) == {"a.example.com", "b.example.com", "*.redirect.example"}
    assert hosts["a.example.com"].https_redirect and hosts["a.example.com"].http  # routes kept, redirect first
    assert hosts["*.redirect.example"].https_redirect and not hosts["*.redirect.example"].http
    assert not hosts["b.example.com"].https_redirect  # another server on the port does not redirect
    assert not any("httpsRedirect" in n for n in notes(translation))


def test_an_empty_selector_selects_nothing() -> None:
    gw = ingress_gateway("app")
    gw["spec"]["selector"] = {}
    translation = translate([gw], [ingress_route("b", "app")])
    assert translation.gateway_configs == ()
    assert any("spec.selector: an empty selector is not served" in n for n in notes(translation))


def test_a_selector_authorization_policy_on_the_gateway_pods_applies_at_the_gateway() -> None:
    policy = {
        "metadata": {"name": "deny-path", "namespace": "istio-system"},
        "spec": {
            "selector": {"matchLabels": {"istio": "ingressgateway"}},
            "action": "DENY",
            "rules": [{"to": [{"operation": {"paths": ["/deny"]}}]}],
        },
    }
    elsewhere = {**policy, "metadata": {"name": "other", "namespace": "app"}}
    translation = translate(
        [ingress_gateway("app")], [ingress_route("b", "app")], authorization_policies=[policy, elsewhere]
    )
    assert [p.key for p in config(translation).policies] == ["istio-system/deny-path"]


def test_exported_elsewhere_a_virtual_service_does_not_reach_the_gateway() -> None:
    hidden = ingress_route("b", "app")
    hidden["spec"]["exportTo"] = ["."]
    (listener,) = config(translate([ingress_gateway("app")], [hidden])).listeners
    assert listener.virtual_hosts == ()


def test_the_mesh_default_export_to_applies_to_a_virtual_service_without_one() -> None:
    def with_default(export: str) -> GatewayConfig:
        mesh = {
            "metadata": {"name": "istio", "namespace": "istio-system"},
            "data": {"mesh": f"defaultVirtualServiceExportTo: {export}"},
        }
        routes = [ingress_route("b", "app")]
        return config(translate([ingress_gateway("app")], routes, config_maps=[mesh]))

    (hidden,) = with_default("[other]").listeners
    assert hidden.virtual_hosts == ()
    (shown,) = with_default("['*']").listeners
    assert shown.virtual_hosts != ()


_TEXT = st.one_of(
    st.text(max_size=12),
    st.sampled_from(
        ["*", "./*", "app/a.example.com", "HTTP", "HTTPS", "TLS", "TCP", "SIMPLE", "PASSTHROUGH", "gateway"]
    ),
)
_JSON = st.recursive(
    st.one_of(st.none(), st.booleans(), st.integers(-5, 70000), _TEXT),
    lambda inner: st.one_of(st.lists(inner, max_size=3), st.dictionaries(_TEXT, inner, max_size=3)),
    max_leaves=12,
)
_SERVER = st.fixed_dictionaries(
    {},
    optional={
        "port": st.one_of(
            _JSON, st.fixed_dictionaries({"number": st.one_of(st.integers(-1, 70000), _JSON), "protocol": _TEXT})
        ),
        "hosts": st.one_of(_JSON, st.lists(_TEXT, max_size=3)),
        "tls": st.one_of(_JSON, st.fixed_dictionaries({"mode": _TEXT, "credentialName": _TEXT})),
    },
)


@settings(max_examples=150, deadline=None)
@given(
    servers=st.one_of(_JSON, st.lists(st.one_of(_SERVER, _JSON), max_size=3)),
    selector=st.one_of(_JSON, st.just({"istio": "ingressgateway"})),
    spec=st.dictionaries(st.sampled_from(["gateways", "hosts", "http", "tcp", "tls", "exportTo"]), _JSON, max_size=4),
)
def test_arbitrary_gateways_and_virtual_services_never_raise(servers: Any, selector: Any, spec: Any) -> None:
    gw = {"metadata": {"name": "gateway", "namespace": "app"}, "spec": {"selector": selector, "servers": servers}}
    spec.setdefault("gateways", ["gateway"])
    translate([gw], [vs(**spec)], secrets=[tls_secret()])


def test_a_look_alike_pod_in_another_namespace_never_gets_the_gateway_s_keys() -> None:
    """Attack: a tenant labels a pod of its own namespace like the gateway (Gateway selectors reach every
    namespace). It becomes a gateway of its own, readable by its own account, whose credentials come from its own
    namespace: the istio-system Secret is never in its config."""
    gw = gateway(server(443, "HTTPS", "a.example.com", mode="SIMPLE", credentialName="cert"))
    pods = [gateway_pod(), gateway_pod("look-alike", ns="evil", account="tenant")]
    translation = translate([gw], [], pods=pods, secrets=[tls_secret()])
    assert dict(translation.gateway_accounts) == {KEY: ACCOUNT, "evil/istio-ingressgateway": "tenant"}
    assert config(translation).listeners[0].certificates[0].key_pem == PAIR.key_pem
    assert config(translation, "evil/istio-ingressgateway").listeners == ()
    assert any("Secret evil/cert not found" in n for n in notes(translation))


# MUTUAL and ISTIO_MUTUAL servers (rule 7), Secrets as Istio's documentation creates them.

CLIENT_CA = new_ca("client CA", now=NOW)


def mutual_server(port: int = 443, *hosts: str, **tls: Any) -> Obj:
    return server(port, "HTTPS", *(hosts or ("a.example.com",)), **{"mode": "MUTUAL", "credentialName": "cred", **tls})


def test_mutual_reads_certificate_and_ca_from_one_generic_secret() -> None:
    secret = opaque_secret(
        "cred", "istio-system", tls_crt=PAIR.cert_pem, tls_key=PAIR.key_pem, ca_crt=CLIENT_CA.cert_pem
    )
    gw = gateway(mutual_server(subjectAltNames=["spiffe://partner/ns/x/sa/y", "client.example"]))
    (listener,) = config(translate([gw], [], secrets=[secret])).listeners
    assert listener.certificates[0].cert_pem == PAIR.cert_pem
    assert listener.tls == ListenerTls(
        TlsMode.MUTUAL, CLIENT_CA.cert_pem, ("spiffe://partner/ns/x/sa/y", "client.example")
    )


def test_mutual_prefers_the_cacert_secret_and_reads_generic_key_names() -> None:
    other_ca = new_ca("other", now=NOW)
    cred = opaque_secret("cred", "istio-system", cert=PAIR.cert_pem, key=PAIR.key_pem, cacert=other_ca.cert_pem)
    cacert = opaque_secret("cred-cacert", "istio-system", ca_crt=CLIENT_CA.cert_pem)
    (listener,) = config(translate([gateway(mutual_server())], [], secrets=[cred, cacert])).listeners
    assert listener.tls.ca_pem == CLIENT_CA.cert_pem  # <name>-cacert wins, as istiod's GetCaCert reads it


def test_mutual_without_a_ca_or_with_bad_pins_is_not_served_and_says_why() -> None:
    no_ca = tls_secret("cred")
    bad_ca = opaque_secret("bad", "istio-system", tls_crt=PAIR.cert_pem, tls_key=PAIR.key_pem, ca_crt=b"not pem")
    gw = gateway(
        mutual_server(443),
        mutual_server(8443, credentialName="bad"),
        mutual_server(9443, verifyCertificateSpki=["c2hvcnQ="]),
        mutual_server(9444, verifyCertificateHash=["zz" * 32]),
        mutual_server(9445, subjectAltNames="one-string"),
        server(9446, "HTTPS", mode="ISTIO_MUTUAL", credentialName="cred"),
    )
    translation = translate([gw], [], secrets=[no_ca, bad_ca])
    assert config(translation).listeners == ()
    found = "\n".join(notes(translation))
    assert "servers[0].tls.credentialName: MUTUAL needs a CA: Secret istio-system/cred: it has no cacert" in found
    assert "servers[1].tls.credentialName: MUTUAL needs a CA: Secret istio-system/bad: its ca.crt" in found
    assert "servers[2].tls.verifyCertificateSpki[0]: expected the base64 SHA-256 digest" in found
    assert "servers[3].tls.verifyCertificateHash[0]: expected the hex SHA-256 digest" in found
    assert "servers[4].tls.subjectAltNames: expected a list of non-empty strings" in found
    assert "servers[5].tls.credentialName: ISTIO_MUTUAL uses the gateway's mesh certificate" in found


def test_optional_mutual_reads_its_certificate_and_ca_as_mutual_does() -> None:
    secret = opaque_secret(
        "cred", "istio-system", tls_crt=PAIR.cert_pem, tls_key=PAIR.key_pem, ca_crt=CLIENT_CA.cert_pem
    )
    gw = gateway(mutual_server(mode="OPTIONAL_MUTUAL", subjectAltNames=["client.example"]))
    (listener,) = config(translate([gw], [], secrets=[secret])).listeners
    assert listener.certificates[0].cert_pem == PAIR.cert_pem
    assert listener.tls == ListenerTls(TlsMode.OPTIONAL_MUTUAL, CLIENT_CA.cert_pem, ("client.example",))
    cacert = opaque_secret("cred-cacert", "istio-system", ca_crt=new_ca("other", now=NOW).cert_pem)
    (listener,) = config(translate([gw], [], secrets=[secret, cacert])).listeners
    assert listener.tls.ca_pem == cacert_pem(cacert)  # <name>-cacert wins, as for MUTUAL


def cacert_pem(secret: Obj) -> bytes:
    return base64.b64decode(secret["data"]["ca.crt"])


def test_optional_mutual_without_a_ca_is_not_served_and_says_why() -> None:
    gw = gateway(mutual_server(mode="optional_mutual"))
    translation = translate([gw], [], secrets=[tls_secret("cred")])
    assert config(translation).listeners == ()
    found = "\n".join(notes(translation))
    assert "servers[0].tls.credentialName: OPTIONAL_MUTUAL needs a CA: Secret istio-system/cred" in found


def test_pins_are_read_as_envoy_reads_them() -> None:
    client = client_cert(CLIENT_CA, dns=("client.example",))
    secret = opaque_secret(
        "cred", "istio-system", tls_crt=PAIR.cert_pem, tls_key=PAIR.key_pem, ca_crt=CLIENT_CA.cert_pem
    )
    gw = gateway(
        mutual_server(
            verifyCertificateSpki=[spki_sha256_b64(client)],
            verifyCertificateHash=[cert_sha256_hex(client, colons=True)],
        )
    )
    (listener,) = config(translate([gw], [], secrets=[secret])).listeners
    assert base64.b64encode(listener.tls.spki_sha256[0]).decode() == spki_sha256_b64(client)
    assert listener.tls.cert_sha256[0].hex().upper() == cert_sha256_hex(client)


def test_istio_mutual_serves_the_gateway_s_own_certificate_beside_a_simple_server_on_the_port() -> None:
    gw = gateway(
        server(
            443, "HTTPS", "mesh.example.com", mode="ISTIO_MUTUAL", subjectAltNames=["spiffe://cluster.local/ns/a/sa/b"]
        ),
        server(443, "HTTPS", "a.example.com", mode="SIMPLE", credentialName="cert"),
    )
    bound = vs(gateways=["gateway"], hosts=["*.example.com"], http=ingress_route("b")["spec"]["http"])
    listeners = {i.hostname: i for i in config(translate([gw], [bound], secrets=[tls_secret()])).listeners}
    mesh, simple = listeners["mesh.example.com"], listeners["a.example.com"]
    assert mesh.certificates == () and mesh.tls == ListenerTls(
        TlsMode.ISTIO_MUTUAL, subject_alt_names=("spiffe://cluster.local/ns/a/sa/b",)
    )
    assert [h.hostname for h in mesh.virtual_hosts] == ["mesh.example.com"]
    assert simple.tls == ListenerTls() and simple.certificates


def test_a_listener_config_breaking_the_tls_rules_is_refused_by_the_gateway() -> None:
    https = IngressListener("h", 443, ListenerProtocol.HTTPS, "", (IngressCertificate(b"c", b"k"),))
    http = IngressListener("p", 80, ListenerProtocol.HTTP, "", (), (VirtualHost("*", https_redirect=True),))
    bad = [
        (dataclasses.replace(https, tls=ListenerTls(TlsMode.MUTUAL)), "needs the CA"),
        (dataclasses.replace(https, tls=ListenerTls(TlsMode.OPTIONAL_MUTUAL)), "OPTIONAL_MUTUAL listener needs the CA"),
        (dataclasses.replace(https, tls=ListenerTls(TlsMode.ISTIO_MUTUAL)), "serves the gateway's own"),
        (dataclasses.replace(https, tls=ListenerTls(TlsMode.SIMPLE, b"ca")), "takes no CA"),
        (dataclasses.replace(https, tls=ListenerTls(TlsMode.MUTUAL, b"ca", (), (b"short",))), "32 bytes"),
        (dataclasses.replace(http, tls=ListenerTls(TlsMode.MUTUAL, b"ca")), "takes no client verification"),
        (dataclasses.replace(https, virtual_hosts=(VirtualHost("*", https_redirect=True),)), "does not redirect"),
    ]
    for listener, reason in bad:
        message = gateway_config_to_proto(GatewayConfig("edge/edge", (listener,)))
        with pytest.raises(XdsConversionError, match=reason):
            decode_gateway_config("edge/edge", pack_gateway_config(message))
    good = GatewayConfig(
        "edge/edge", (http, dataclasses.replace(https, certificates=(), tls=ListenerTls(TlsMode.ISTIO_MUTUAL)))
    )
    assert decode_gateway_config("edge/edge", pack_gateway_config(gateway_config_to_proto(good))) == good
    optional = GatewayConfig(
        "edge/edge", (dataclasses.replace(https, tls=ListenerTls(TlsMode.OPTIONAL_MUTUAL, b"ca")),)
    )
    assert decode_gateway_config("edge/edge", pack_gateway_config(gateway_config_to_proto(optional))) == optional


def test_protocol_versions_and_cipher_suites_bound_a_terminating_server_or_refuse_it() -> None:
    secret = opaque_secret(
        "cred", "istio-system", tls_crt=PAIR.cert_pem, tls_key=PAIR.key_pem, ca_crt=CLIENT_CA.cert_pem
    )
    suites = ["ECDHE-ECDSA-AES256-GCM-SHA384", "ECDHE-ECDSA-AES128-GCM-SHA256", "ECDHE-ECDSA-AES256-GCM-SHA384"]
    gw = gateway(
        mutual_server(443, minProtocolVersion="TLSV1_2", maxProtocolVersion="TLSV1_2", cipherSuites=suites),
        server(8443, "HTTPS", "b.example.com", mode="SIMPLE", credentialName="cred", minProtocolVersion="TLSV1_3"),
        server(9443, "HTTPS", "c.example.com", mode="ISTIO_MUTUAL", maxProtocolVersion="TLS_AUTO"),
        mutual_server(9444, minProtocolVersion="TLSV1_1"),
        mutual_server(9445, minProtocolVersion="TLSV1_3", maxProtocolVersion="TLSV1_2"),
        mutual_server(9446, cipherSuites=["NULL-MD5"]),
        mutual_server(9447, maxProtocolVersion="SSLV3"),
    )
    translation = translate([gw], [], secrets=[secret])
    by_port = {i.port: i.tls for i in config(translation).listeners}
    assert (by_port[443].min_version, by_port[443].max_version) == (0x0303, 0x0303)
    assert by_port[443].cipher_suites == ("ECDHE-ECDSA-AES256-GCM-SHA384", "ECDHE-ECDSA-AES128-GCM-SHA256")
    assert by_port[8443] == ListenerTls(min_version=0x0304)
    assert by_port[9443] == ListenerTls(TlsMode.ISTIO_MUTUAL)
    assert by_port[9446] == ListenerTls(TlsMode.MUTUAL, by_port[9446].ca_pem)  # NULL-MD5 dropped: the defaults
    assert set(by_port) == {443, 8443, 9443, 9446}
    found = "\n".join(notes(translation))
    assert "servers[3].tls.minProtocolVersion: TLSV1_1 is not served: TLS below 1.2 is refused" in found
    assert "servers[4].tls.minProtocolVersion: the minimum is above maxProtocolVersion" in found
    assert "servers[6].tls.maxProtocolVersion: expected TLS_AUTO, TLSV1_2 or TLSV1_3, got 'SSLV3'" in found
    assert "cipherSuites" not in found


def test_cipher_suites_istiod_does_not_know_are_dropped_and_the_server_still_served() -> None:
    # upstream routing.go "cipher suite": every suite of Istio's ValidCipherSuites (sorted) plus "fake"
    secret = opaque_secret(
        "cred", "istio-system", tls_crt=PAIR.cert_pem, tls_key=PAIR.key_pem, ca_crt=CLIENT_CA.cert_pem
    )
    suites = [*sorted(CIPHER_SUITES), "fake"]
    translation = translate([gateway(mutual_server(443, cipherSuites=suites))], [], secrets=[secret])
    (listener,) = config(translation).listeners
    assert listener.tls.cipher_suites == tuple(sorted(CIPHER_SUITES))
    assert not notes(translation)


# TLS servers terminating TLS, then routed by the VirtualServices' tcp rules (istiod's TCP server with TLS
# termination).

C8080 = BackendService("app", "c.app.svc.cluster.local", 8080)


def tcp_vs(name: str, host: str, destination: str, port: int = 80, created: str = "") -> Obj:
    rule: Obj = {"route": [{"destination": {"host": destination, "port": {"number": port}}}]}
    return vs(name, created=created, gateways=["gateway"], hosts=[host], tcp=[rule])


def test_a_tls_server_terminating_tls_relays_by_the_tcp_rules_of_its_virtual_services() -> None:
    gw = gateway(
        server(9443, "TLS", "a.example.com", mode="SIMPLE", credentialName="cert"),
        server(9443, "TLS", "b.example.com", mode="MUTUAL", credentialName="cred"),
    )
    secret = opaque_secret(
        "cred", "istio-system", tls_crt=PAIR.cert_pem, tls_key=PAIR.key_pem, ca_crt=CLIENT_CA.cert_pem
    )
    routes = [
        tcp_vs("to-b", "a.example.com", "b", port=80, created="2024-01-01T00:00:00Z"),
        # the first tcp rule holding for the server's port wins: a rule for another port is passed over
        vs(
            "to-c",
            gateways=["gateway"],
            hosts=["b.example.com"],
            tcp=[
                {"match": [{"port": 1234}], "route": [{"destination": {"host": "b", "port": {"number": 80}}}]},
                {"route": [{"destination": {"host": "c", "port": {"number": 8080}}}]},
            ],
        ),
    ]
    translation = translate([gw], routes, secrets=[tls_secret(), secret])
    assert not [n for n in notes(translation) if "Gateway" in n], notes(translation)
    by_host = {i.hostname: i for i in config(translation).listeners}
    simple, mutual = by_host["a.example.com"], by_host["b.example.com"]
    assert (simple.protocol, simple.port, mutual.protocol) == (
        ListenerProtocol.TLS_TERMINATE,
        9443,
        ListenerProtocol.TLS_TERMINATE,
    )
    assert simple.certificates == (IngressCertificate(PAIR.cert_pem, PAIR.key_pem),) and simple.tls == ListenerTls()
    assert simple.virtual_hosts == (VirtualHost("*", tcp_backends=(WeightedBackend(B, 100),)),)
    assert mutual.tls == ListenerTls(TlsMode.MUTUAL, CLIENT_CA.cert_pem)
    assert mutual.virtual_hosts == (VirtualHost("*", tcp_backends=(WeightedBackend(C8080, 100),)),)


def test_a_terminating_tls_server_without_credentials_is_skipped_and_one_beside_passthrough_shares_the_port() -> None:
    gw = gateway(
        server(9443, "TLS", "a.example.com", mode="SIMPLE"),
        server(9444, "TLS", "a.example.com", mode="PASSTHROUGH"),
        server(9444, "TLS", "b.example.com", mode="SIMPLE", credentialName="cert"),
        server(9445, "TLS", "c.example.com", mode="ISTIO_MUTUAL"),
    )
    translation = translate([gw], [tcp_vs("to-b", "*.example.com", "b")], secrets=[tls_secret()])
    found = "\n".join(notes(translation))
    assert "spec.servers[0].tls.credentialName: SIMPLE TLS needs a credentialName" in found
    assert "servers[2]" not in found
    shared = {i.hostname: i.protocol for i in config(translation).listeners if i.port == 9444}
    assert shared == {"a.example.com": ListenerProtocol.TLS, "b.example.com": ListenerProtocol.TLS_TERMINATE}
    listeners = {i.port: i for i in config(translation).listeners}
    mesh = listeners[9445]
    assert (mesh.protocol, mesh.certificates, mesh.tls.mode) == (
        ListenerProtocol.TLS_TERMINATE,
        (),
        TlsMode.ISTIO_MUTUAL,
    )
    assert mesh.virtual_hosts == (VirtualHost("*", tcp_backends=(WeightedBackend(B, 100),)),)


def test_a_terminating_tls_server_no_tcp_rule_holds_for_serves_no_route() -> None:
    gw = gateway(server(9443, "TLS", "a.example.com", mode="SIMPLE", credentialName="cert"))
    rule = {"match": [{"port": 1234}], "route": [{"destination": {"host": "b", "port": {"number": 80}}}]}
    routes = [vs("elsewhere", gateways=["gateway"], hosts=["a.example.com"], tcp=[rule])]
    (listener,) = config(translate([gw], routes, secrets=[tls_secret()])).listeners
    assert listener.virtual_hosts == ()


def test_a_tls_terminate_listener_breaking_the_wire_rules_is_refused_by_the_gateway() -> None:
    cert = (IngressCertificate(b"c", b"k"),)
    terminate = IngressListener("t", 9443, ListenerProtocol.TLS_TERMINATE, "", cert, (VirtualHost("*"),))
    passthrough = IngressListener("p", 9444, ListenerProtocol.TLS, "", (), (VirtualHost("*"),))
    rule = (
        config(
            translate(
                [gateway(server(80, "HTTP"))],
                [vs(gateways=["gateway"], hosts=["*"], http=ingress_route("b")["spec"]["http"])],
            )
        )
        .listeners[0]
        .virtual_hosts[0]
        .http
    )
    bad = [
        (dataclasses.replace(terminate, certificates=()), "TLS_TERMINATE listener needs a certificate"),
        (dataclasses.replace(passthrough, certificates=cert), "TLS listener takes no certificates"),
        (dataclasses.replace(passthrough, tls=ListenerTls(TlsMode.MUTUAL, b"ca")), "takes no client verification"),
        (dataclasses.replace(terminate, virtual_hosts=(VirtualHost("*", rule),)), "takes no HTTP rules"),
    ]
    for listener, reason in bad:
        message = gateway_config_to_proto(GatewayConfig("edge/edge", (listener,)))
        with pytest.raises(XdsConversionError, match=reason):
            decode_gateway_config("edge/edge", pack_gateway_config(message))
    good = GatewayConfig(
        "edge/edge", (dataclasses.replace(terminate, tls=ListenerTls(TlsMode.OPTIONAL_MUTUAL, b"ca")),)
    )
    assert decode_gateway_config("edge/edge", pack_gateway_config(gateway_config_to_proto(good))) == good


def test_passthrough_and_terminated_servers_share_a_port_by_sni_and_a_duplicate_host_leaves_its_server_out() -> None:
    """istiod puts every TLS server of a port on one listener, a filter chain per server told apart by SNI; a TLS
    server repeating a host already there is left out whole (its other hosts too)."""
    gw = gateway(
        server(443, "HTTPS", "a.example.com", mode="SIMPLE", credentialName="cert"),
        server(443, "TLS", "*.pass.example.com", mode="PASSTHROUGH"),
        server(443, "HTTPS", "mesh.example.com", mode="ISTIO_MUTUAL"),
        server(443, "TLS", "a.example.com", "other.example.com", mode="PASSTHROUGH"),  # a.example.com again
        server(443, "HTTP", "plain.example.com"),  # plaintext beside TLS: never
    )
    http = [{"route": [{"destination": {"host": "b"}}]}]
    to_c = [{"destination": {"host": "c", "port": {"number": 8080}}}]
    tls = [{"match": [{"sniHosts": ["x.pass.example.com"]}], "route": to_c}]
    routes = [vs("web", gateways=["gateway"], hosts=["a.example.com"], http=http),
              vs("pass", gateways=["gateway"], hosts=["*.pass.example.com"], tls=tls)]  # fmt: skip
    translation = translate([gw], routes, secrets=[tls_secret()])
    found = "\n".join(notes(translation))
    assert "spec.servers[3].hosts: duplicate host names on port 443: a.example.com" in found
    assert "spec.servers[4].port: port 443 already serves HTTPS" in found
    by_host = {i.hostname: i for i in config(translation).listeners}
    assert set(by_host) == {"a.example.com", "*.pass.example.com", "mesh.example.com"}
    web, passthrough, mesh = by_host["a.example.com"], by_host["*.pass.example.com"], by_host["mesh.example.com"]
    assert (web.protocol, web.port, web.certificates) == (
        ListenerProtocol.HTTPS,
        443,
        (IngressCertificate(PAIR.cert_pem, PAIR.key_pem),),
    )
    assert [h.hostname for h in web.virtual_hosts] == ["a.example.com"]
    assert (passthrough.protocol, passthrough.certificates) == (ListenerProtocol.TLS, ())
    assert passthrough.virtual_hosts == (
        VirtualHost("x.pass.example.com", tcp_backends=(WeightedBackend(C8080, 100),)),
    )
    assert (mesh.protocol, mesh.tls.mode) == (ListenerProtocol.HTTPS, TlsMode.ISTIO_MUTUAL)


def test_a_rule_without_retries_gets_the_mesh_default_retry_policy() -> None:
    def rule_with(mesh_text: str) -> RouteRule:
        mesh = {"metadata": {"name": "istio", "namespace": "istio-system"}, "data": {"mesh": mesh_text}}
        (listener,) = config(
            translate([ingress_gateway("app")], [ingress_route("b", "app")], config_maps=[mesh])
        ).listeners
        (host,) = listener.virtual_hosts
        (rule,) = host.http
        return rule

    custom = rule_with("defaultHttpRetryPolicy: {attempts: 4, perTryTimeout: 2s, retryOn: '503'}")
    assert custom.retry == RetryPolicy(attempts=4, codes=(503,), on_connect_failure=False)
    assert custom.timeouts == Timeouts(backend_request=2.0)
    assert rule_with("defaultHttpRetryPolicy: {attempts: 0}").retry.attempts == 0
    assert rule_with("{}").retry == RetryPolicy()
