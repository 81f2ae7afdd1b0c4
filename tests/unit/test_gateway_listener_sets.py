"""ListenerSets at an ingress Gateway (:mod:`ambit.controlplane.translate.listener_sets`,
:mod:`ambit.controlplane.gateway.ingress_status` rules 7 and 8, :mod:`ambit.controlplane.translate.ingress` rule 9).
The expected statuses are those of istiod's golden files (pilot/pkg/config/kube/gateway/testdata/listenerset*.yaml
and their .status.yaml.golden), transcribed: listenerset, listenerset-cross-namespace, listenerset-invalid,
listenerset-https-missing-tls, listenerset-hostname-conflict."""

from __future__ import annotations

import base64
import time
from typing import Any

import pytest

from ambit.controlplane.gateway.ingress_status import ingress_attached_routes, ingress_status, listener_set_status
from ambit.controlplane.gateway.render import listener_ports
from ambit.controlplane.gateway.status import Deployed
from ambit.controlplane.translate.ingress import translate_ingress
from ambit.controlplane.translate.listener_sets import (
    LISTENER_SET_KINDS,
    ListenerSetVerdict,
    MergedGateway,
    admits_listener_set,
    merge_listener_sets,
)
from ambit.controlplane.translate.listeners import CONFLICT_MESSAGE, backend_client_certificate
from ambit.controlplane.translate.reference_grants import ReferenceGrants
from ambit.model.workload import Service
from ambit.tls.certs import issue_server_cert, new_ca

NOW = time.time()
PAIR = issue_server_cert(
    new_ca("listener set test CA", now=NOW), common_name="a.com", dns_names=["a.com"], ip_addresses=[], now=NOW
)
LSET = LISTENER_SET_KINDS[0]
XLSET = LISTENER_SET_KINDS[1]
HOST = "parent-gateway-istio.istio-system.svc.cluster.local"
ADDRESSES = ({"type": "IPAddress", "value": "198.18.0.50"},)
FOUND = Deployed(service_exists=True, ready=True)
OK = [
    ("Accepted", "True", "Accepted", "No errors found"),
    ("Conflicted", "False", "NoConflicts", "No errors found"),
    ("Programmed", "True", "Programmed", "No errors found"),
    ("ResolvedRefs", "True", "ResolvedRefs", "No errors found"),
]
HTTP_KINDS = [
    {"group": "gateway.networking.k8s.io", "kind": "HTTPRoute"},
    {"group": "gateway.networking.k8s.io", "kind": "GRPCRoute"},
]


def secret(namespace: str, name: str) -> dict[str, Any]:
    data = {"tls.crt": base64.b64encode(PAIR.cert_pem).decode(), "tls.key": base64.b64encode(PAIR.key_pem).decode()}
    return {"metadata": {"name": name, "namespace": namespace}, "type": "kubernetes.io/tls", "data": data}


SECRETS = {
    ("istio-system", "my-cert-http"): secret("istio-system", "my-cert-http"),
    ("ns2", "ns2-cert"): secret("ns2", "ns2-cert"),
    ("ns3", "ns3-cert"): secret("ns3", "ns3-cert"),
    ("ns4", "ns4-cert"): secret("ns4", "ns4-cert"),
}


def find_secret(namespace: str, name: str) -> dict[str, Any] | None:
    return SECRETS.get((namespace, name))


def gateway(name: str = "parent-gateway", *listeners: dict[str, Any], allowed: Any = "All", **spec: Any) -> Any:
    body: dict[str, Any] = {"gatewayClassName": "istio", "listeners": list(listeners), **spec}
    if allowed is not None:
        body["allowedListeners"] = {"namespaces": allowed if isinstance(allowed, dict) else {"from": allowed}}
    return {"metadata": {"name": name, "namespace": "istio-system", "generation": 1}, "spec": body}


def listener(name: str, port: int | None, protocol: str, hostname: str | None = None, **extra: Any) -> Any:
    out: dict[str, Any] = {"name": name, "protocol": protocol, **extra}
    if port is not None:
        out["port"] = port
    if hostname is not None:
        out["hostname"] = hostname
    return out


def https(name: str, hostname: str, cert: str, namespace: str | None = None, port: int = 443) -> Any:
    ref: dict[str, Any] = {"kind": "Secret", "group": "", "name": cert}
    if namespace is not None:
        ref["namespace"] = namespace
    return listener(name, port, "HTTPS", hostname, tls={"mode": "Terminate", "certificateRefs": [ref]})


def listener_set(
    name: str, namespace: str, *listeners: Any, parent: str = "parent-gateway", created: str = "", x: bool = False
) -> Any:
    meta: dict[str, Any] = {"name": name, "namespace": namespace, "generation": 2}
    if created:
        meta["creationTimestamp"] = created
    ref = {"name": parent, "namespace": "istio-system", "kind": "Gateway", "group": "gateway.networking.k8s.io"}
    return (XLSET if x else LSET), {"metadata": meta, "spec": {"parentRef": ref, "listeners": list(listeners)}}


def route(name: str, *parents: dict[str, Any], path: str = "/", namespace: str = "istio-system") -> Any:
    return {
        "metadata": {"name": name, "namespace": namespace, "generation": 1},
        "spec": {
            "parentRefs": list(parents),
            "rules": [
                {
                    "matches": [{"path": {"type": "PathPrefix", "value": path}}],
                    "backendRefs": [{"name": "httpbin", "port": 80}],
                }
            ],
        },
    }


def set_ref(name: str, namespace: str = "istio-system", **extra: Any) -> dict[str, Any]:
    return {"name": name, "namespace": namespace, "kind": "ListenerSet", "group": "gateway.networking.k8s.io", **extra}


def merged(gw: Any, sets: list[Any], labels: dict[str, dict[str, str]] | None = None, grants: Any = ()) -> Any:
    return merge_listener_sets(
        gw,
        sets,
        find_secret=find_secret,
        grants=ReferenceGrants.build(grants),
        namespace_labels=labels if labels is not None else {"istio-system": {}, "ns1": {}, "ns2": {}},
    )


def conditions(status: dict[str, Any]) -> list[tuple[str, str, str, str]]:
    return [(c["type"], c["status"], c["reason"], c["message"]) for c in status["conditions"]]


def verdict(result: MergedGateway, name: str) -> ListenerSetVerdict:
    return next(v for v in result.sets if v.name == name)


def set_status(v: ListenerSetVerdict, routes: list[Any] = ()) -> dict[str, Any]:  # type: ignore[assignment]
    attached = ingress_attached_routes(v.obj, {"HTTPRoute": routes}, origin=v.origin, listeners=list(v.raw.values()))
    return listener_set_status(v, FOUND, host=HOST, addresses=ADDRESSES, attached=attached)


HTTPBIN = Service(namespace="istio-system", name="httpbin", hostname="httpbin.istio-system.svc.cluster.local")


# -- istiod's listenerset.yaml ------------------------------------------------------------------------------------
PARENT = gateway("parent-gateway", listener("foo", 80, "HTTP", "foo.com"))
SETS = [
    listener_set("single-entry-http", "istio-system", listener("first", 80, "HTTP", "first.foo.com")),
    listener_set("single-entry-tls", "istio-system", https("second", "second.foo.com", "my-cert-http")),
    listener_set(
        "multi-entry",
        "istio-system",
        listener("third", 80, "HTTP", "third.foo.com"),
        https("forth", "forth.foo.com", "my-cert-http"),
    ),
]
ROUTES = [
    route("bind-set", set_ref("single-entry-http"), path="/set"),
    route("bind-both", {"name": "parent-gateway"}, set_ref("single-entry-http"), path="/both"),
    route("bind-parent", {"name": "parent-gateway"}, path="/parent"),
]


def test_istiod_s_listenerset_golden_parent_counts_three_sets_and_keeps_its_own_route_counts() -> None:
    result = merged(PARENT, SETS)
    status = ingress_status(
        PARENT,
        FOUND,
        result.judged,
        host=HOST,
        addresses=ADDRESSES,
        attached=ingress_attached_routes(PARENT, {"HTTPRoute": ROUTES}),
        listener_sets=result.sets,
    )
    assert status["attachedListenerSets"] == 3
    assert conditions(status)[0] == ("Accepted", "True", "Accepted", "Resource accepted")
    assert conditions(status)[2] == ("ResolvedRefs", "True", "ResolvedRefs", "All references resolved")
    assert "80" in conditions(status)[1][3] and "443" in conditions(status)[1][3]  # the sets' port 443 too
    [foo] = status["listeners"]
    assert (foo["name"], foo["attachedRoutes"]) == ("foo", 2)  # bind-both and bind-parent, never bind-set


def test_istiod_s_listenerset_golden_sets_are_accepted_with_their_own_listener_status() -> None:
    result = merged(PARENT, SETS)
    first = set_status(verdict(result, "single-entry-http"), ROUTES)
    assert conditions(first) == [
        ("Accepted", "True", "Accepted", "Resource accepted"),
        ("Programmed", "True", "Programmed", f"Resource programmed, assigned to service(s) {HOST}:80"),
    ]
    assert [(li["name"], li["attachedRoutes"]) for li in first["listeners"]] == [("first", 2)]
    assert [(c["type"], c["status"], c["reason"], c["message"]) for c in first["listeners"][0]["conditions"]] == OK
    assert first["listeners"][0]["supportedKinds"] == HTTP_KINDS
    multi = set_status(verdict(result, "multi-entry"), ROUTES)
    assert [(li["name"], li["attachedRoutes"]) for li in multi["listeners"]] == [("third", 0), ("forth", 0)]
    assert multi["addressless"] is True


def test_istiod_s_listenerset_golden_routes_attach_to_the_set_by_its_kind_and_are_served_on_its_hostname() -> None:
    translation = translate_ingress(
        gateways=[PARENT],
        http_routes=ROUTES,
        k8s_services=[HTTPBIN],
        find_secret=find_secret,
        namespace_labels={"istio-system": {}},
        listener_sets=SETS,
    )
    parents = {
        s.name: [(p.parent_ref_dict(), [(c.type, c.status, c.reason) for c in p.conditions]) for p in s.parents]
        for s in translation.status
    }
    accepted = [("Accepted", True, "Accepted"), ("ResolvedRefs", True, "ResolvedRefs")]
    assert [c for _, c in parents["bind-set"]] == [accepted]
    assert [c for _, c in parents["bind-both"]] == [accepted, accepted]
    [config] = translation.configs
    by_name = {li.name: li for li in config.listeners}
    first = by_name["istio-system/single-entry-http/first"]
    assert (first.port, first.hostname) == (80, "first.foo.com")
    [host] = first.virtual_hosts
    assert host.hostname == "first.foo.com"
    assert sorted(rule.route for rule in host.http) == [
        "HTTPRoute/istio-system/bind-both",
        "HTTPRoute/istio-system/bind-set",
    ]
    [foo_host] = by_name["foo"].virtual_hosts
    assert sorted(rule.route for rule in foo_host.http) == [
        "HTTPRoute/istio-system/bind-both",
        "HTTPRoute/istio-system/bind-parent",
    ]
    assert {"istio-system/single-entry-tls/second", "istio-system/multi-entry/forth"} <= set(by_name)


def test_a_set_of_the_experimental_name_is_read_alike_and_routes_name_its_own_group_and_kind() -> None:
    sets = [listener_set("x-set", "istio-system", listener("first", 80, "HTTP", "x.foo.com"), x=True)]
    x_ref = {"name": "x-set", "kind": "XListenerSet", "group": "gateway.networking.x-k8s.io"}
    routes = [route("bind-x", x_ref), route("wrong-kind", set_ref("x-set"))]
    translation = translate_ingress(
        gateways=[PARENT],
        http_routes=routes,
        k8s_services=[HTTPBIN],
        find_secret=find_secret,
        namespace_labels={"istio-system": {}},
        listener_sets=sets,
    )
    assert [s.name for s in translation.status] == ["bind-x"]  # a ListenerSet of that name does not exist
    result = merged(PARENT, sets)
    assert set_status(verdict(result, "x-set"), routes)["listeners"][0]["attachedRoutes"] == 1


# -- istiod's listenerset-cross-namespace.yaml -------------------------------------------------------------------
CROSS_SETS = [
    listener_set("single-entry-http", "ns1", listener("first", 80, "HTTP", "first.foo.com")),
    listener_set("same-ns-cert", "ns2", https("second", "second.foo.com", "ns2-cert")),
    listener_set(
        "cross-ns-cert",
        "ns2",
        https("allowed", "allowed.foo.com", "ns3-cert", "ns3"),
        https("denied", "denied.foo.com", "ns4-cert", "ns4"),
    ),
    listener_set("all-denied", "ns2", https("only", "only.foo.com", "ns4-cert", "ns4")),
]
CROSS_GRANTS = [
    {
        "metadata": {"name": "do-not-allow-cert-transitively", "namespace": "ns4"},
        "spec": {
            "from": [{"group": "gateway.networking.k8s.io", "kind": "Gateway", "namespace": "istio-system"}],
            "to": [{"group": "", "kind": "Secret"}],
        },
    },
    {
        "metadata": {"name": "allow-listenerset", "namespace": "ns3"},
        "spec": {
            "from": [{"group": "gateway.networking.k8s.io", "kind": "ListenerSet", "namespace": "ns2"}],
            "to": [{"group": "", "kind": "Secret"}],
        },
    },
]
DENIED_MESSAGE = (
    'certificateRef ns4-cert/ns4 not accessible to a Gateway in namespace "ns2" (missing a ReferenceGrant?)'
)


def test_istiod_s_cross_namespace_golden_a_set_needs_its_own_grant_and_the_parent_s_does_not_carry_over() -> None:
    result = merged(PARENT, CROSS_SETS, grants=CROSS_GRANTS)
    cross = set_status(verdict(result, "cross-ns-cert"))
    assert conditions(cross)[0] == ("Accepted", "True", "Accepted", "Resource accepted")
    allowed, denied = cross["listeners"]
    assert [(c["type"], c["status"], c["reason"], c["message"]) for c in allowed["conditions"]] == OK
    assert [(c["type"], c["status"], c["reason"], c["message"]) for c in denied["conditions"]] == [
        ("Accepted", "False", "NoValidCACertificate", DENIED_MESSAGE),
        ("Conflicted", "False", "NoConflicts", "No errors found"),
        ("Programmed", "False", "Invalid", "Bad TLS configuration"),
        ("ResolvedRefs", "False", "RefNotPermitted", DENIED_MESSAGE),
    ]
    none_valid = "None of the ListenerSet's listeners are valid"
    assert conditions(set_status(verdict(result, "all-denied"))) == [
        ("Accepted", "False", "ListenersNotValid", none_valid),
        ("Programmed", "False", "ListenersNotValid", none_valid),
    ]
    assert verdict(result, "same-ns-cert").valid and verdict(result, "single-entry-http").valid
    assert result.attached_listener_sets == 3


# -- istiod's listenerset-invalid.yaml and the attack --------------------------------------------------------------
NOT_ALLOWED = "The parent Gateway does not allow this reference; check the 'spec.allowedRoutes'"


def test_istiod_s_invalid_golden_a_gateway_without_allowed_listeners_refuses_every_set() -> None:
    parent = gateway("parent-no-allowed-listeners", listener("foo", 80, "HTTP", "foo.com"), allowed=None)
    sets = [
        listener_set("not-allowed", "istio-system", listener("first", 80, "HTTP", "first.foo.com"), parent=parent_name)
        for parent_name in ["parent-no-allowed-listeners"]
    ]
    status = set_status(verdict(merged(parent, sets), "not-allowed"))
    assert conditions(status) == [
        ("Accepted", "False", "NotAllowed", NOT_ALLOWED),
        ("Programmed", "False", "NotAllowed", NOT_ALLOWED),
    ]
    assert status["listeners"] == []


def test_istiod_s_invalid_golden_a_waypoint_takes_no_set() -> None:
    waypoint = {
        "metadata": {"name": "waypoint", "namespace": "istio-system"},
        "spec": {
            "gatewayClassName": "istio-waypoint",
            "allowedListeners": {"namespaces": {"from": "All"}},
            "listeners": [{"name": "mesh", "port": 15008, "protocol": "HBONE"}],
        },
    }
    sets = [listener_set("invalid-class", "istio-system", listener("first", 80, "HTTP"), parent="waypoint")]
    result = merged(waypoint, sets)
    message = 'The "istio-waypoint" GatewayClass does not support ListenerSet'
    assert conditions(set_status(verdict(result, "invalid-class")))[0] == ("Accepted", "False", "NotAllowed", message)
    assert result.judged == () and result.attached_listener_sets == 0


def test_a_set_from_a_namespace_the_parent_does_not_admit_serves_nothing_and_takes_no_slot() -> None:
    """The attack: a tenant in ``evil`` adds a listener for the parent's own hostname and port, and a hostname of
    its own, to a Gateway that admits only its own namespace. It is NotAllowed, serves nothing, takes no slot
    from the invited set, and a route naming it attaches nowhere."""
    parent = gateway("parent-gateway", listener("foo", 80, "HTTP", "foo.com"), allowed="Same")
    evil = listener_set(
        "evil",
        "evil",
        listener("steal", 80, "HTTP", "shop.foo.com"),
        listener("extra", 8080, "HTTP", "evil.example"),
        created="2020-01-01T00:00:00Z",
    )
    invited = listener_set(
        "shop", "istio-system", listener("shop", 80, "HTTP", "shop.foo.com"), created="2024-01-01T00:00:00Z"
    )
    labels = {"istio-system": {}, "evil": {}}
    result = merged(parent, [evil, invited], labels)
    assert verdict(result, "evil").refusal == ("NotAllowed", NOT_ALLOWED)
    assert verdict(result, "shop").valid  # the older refused set took no slot from it
    routes = [route("hijack", set_ref("evil", "evil"), namespace="evil")]
    translation = translate_ingress(
        gateways=[parent],
        http_routes=routes,
        k8s_services=[HTTPBIN],
        find_secret=find_secret,
        namespace_labels=labels,
        listener_sets=[evil, invited],
    )
    [config] = translation.configs
    assert sorted(li.name for li in config.listeners) == ["foo", "istio-system/shop/shop"]
    assert 8080 not in config.ports()
    assert translation.status == ()
    assert [
        p["port"]
        for p in listener_ports(parent, [li for v in result.sets if v.refusal is None for li in v.raw.values()])
    ] == [15021, 80]


@pytest.mark.parametrize(
    ("allowed", "namespace", "labels", "admitted"),
    [
        ("All", "ns1", {}, True),
        ("Same", "istio-system", {}, True),
        ("Same", "ns1", {}, False),
        ("None", "istio-system", {}, False),
        ("Sideways", "istio-system", {}, False),
        ({"from": "Selector", "selector": {"matchLabels": {"team": "a"}}}, "ns1", {"team": "a"}, True),
        ({"from": "Selector", "selector": {"matchLabels": {"team": "a"}}}, "ns1", {"team": "b"}, False),
        ({"from": "Selector", "selector": {"matchLabels": {"kubernetes.io/metadata.name": "ns1"}}}, "ns1", {}, True),
        ({"from": "Selector", "selector": {"matchLabels": {"team": "a"}}}, "unknown", None, False),
        ({"from": "Selector"}, "ns1", {}, False),
    ],
)
def test_allowed_listeners_admit_namespaces_as_istiod_decides(
    allowed: Any, namespace: str, labels: dict[str, str] | None, admitted: bool
) -> None:
    known = {"istio-system": {}} | ({namespace: labels} if labels is not None else {})
    assert admits_listener_set(gateway("gw", allowed=allowed), namespace, known) is admitted


# -- istiod's listenerset-hostname-conflict.yaml and listenerset-https-missing-tls.yaml ----------------------------
def test_istiod_s_hostname_conflict_golden_the_parent_wins_then_the_oldest_set() -> None:
    parent = gateway(
        "gw",
        listener("gateway-listener", 80, "HTTP", "gateway-listener.com"),
        listener("hostname-conflict-with-gateway-listener", 80, "HTTP", "hostname-conflict-with-gateway-listener.com"),
    )
    one = listener_set(
        "set-1",
        "istio-system",
        listener("listener-set-1-listener", 80, "HTTP", "listener-set-1-listener.com"),
        listener("hostname-conflict-with-gateway-listener", 80, "HTTP", "hostname-conflict-with-gateway-listener.com"),
        listener("shared", 80, "HTTP", "hostname-conflict-with-listener-set-listener.com"),
        parent="gw",
        created="2024-01-01T00:00:01Z",
    )
    two = listener_set(
        "set-0",  # sorts first by name, but is younger: creation time decides
        "istio-system",
        listener("shared", None, "HTTP", "hostname-conflict-with-listener-set-listener.com"),
        parent="gw",
        created="2024-01-01T00:00:02Z",
    )
    result = merged(parent, [two, one])
    assert [v.name for v in result.sets] == ["set-1", "set-0"]
    conflicted = {(v.name, j.name): j.conflicted[1] for v in result.sets for j in v.judged if j.conflicted[0]}
    assert conflicted == {
        ("set-1", "hostname-conflict-with-gateway-listener"): "HostnameConflict",
        ("set-0", "shared"): "HostnameConflict",  # port 80 by default for HTTP
    }
    assert not any(j.conflicted[0] for j in result.judged)
    loser = set_status(verdict(result, "set-0"))["listeners"][0]
    assert [(c["type"], c["status"], c["reason"], c["message"]) for c in loser["conditions"]] == [
        ("Accepted", "False", "HostnameConflict", CONFLICT_MESSAGE),
        ("Conflicted", "True", "HostnameConflict", CONFLICT_MESSAGE),
        ("Programmed", "False", "HostnameConflict", CONFLICT_MESSAGE),
    ]


def test_istiod_s_https_missing_tls_golden_a_set_listener_without_tls_is_not_accepted() -> None:
    sets = [listener_set("https-missing-tls", "istio-system", listener("missing-tls", 8443, "HTTPS", "child.com"))]
    status = set_status(verdict(merged(PARENT, sets), "https-missing-tls"))
    assert conditions(status)[0] == (
        "Accepted",
        "False",
        "ListenersNotValid",
        "None of the ListenerSet's listeners are valid",
    )
    assert [(c["type"], c["status"], c["reason"], c["message"]) for c in status["listeners"][0]["conditions"]] == [
        ("Accepted", "False", "UnsupportedProtocol", "protocol is HTTPS but no TLS section is defined"),
        ("Conflicted", "False", "NoConflicts", "No errors found"),
        ("Programmed", "False", "Invalid", "Bad TLS configuration"),
        ("ResolvedRefs", "True", "ResolvedRefs", "No errors found"),
    ]


# -- the Gateway's own ResolvedRefs --------------------------------------------------------------------------------
def backend(ref: dict[str, Any]) -> Any:
    return gateway("gw", listener("foo", 80, "HTTP"), tls={"backend": {"clientCertificateRef": ref}})


@pytest.mark.parametrize(
    ("ref", "grants", "want"),
    [
        ({"name": "my-cert-http"}, [], (True, "ResolvedRefs", "All references resolved")),
        (
            {"name": "missing"},
            [],
            (
                False,
                "InvalidClientCertificateRef",
                "invalid clientCertificateRef //missing., secret istio-system/missing not found",
            ),
        ),
        (
            {"name": "cm", "kind": "ConfigMap"},
            [],
            (
                False,
                "InvalidClientCertificateRef",
                "invalid clientCertificateRef /ConfigMap/cm., only secret is allowed",
            ),
        ),
        (
            {"name": "ns4-cert", "namespace": "ns4"},
            [],
            (
                False,
                "RefNotPermitted",
                'clientCertificateRef ns4-cert/ns4 not accessible to a Gateway in namespace "istio-system"'
                " (missing a ReferenceGrant?)",
            ),
        ),
        ({"name": "ns4-cert", "namespace": "ns4"}, CROSS_GRANTS[:1], (True, "ResolvedRefs", "All references resolved")),
        (
            {"name": "nothing-here", "namespace": "ns4"},
            [],
            (
                False,
                "RefNotPermitted",
                'clientCertificateRef nothing-here/ns4 not accessible to a Gateway in namespace "istio-system"'
                " (missing a ReferenceGrant?)",
            ),
        ),
    ],
)
def test_the_gateway_s_resolved_refs_follows_its_backend_client_certificate(
    ref: dict[str, Any], grants: list[Any], want: tuple[bool, str, str]
) -> None:
    gw = backend(ref)
    assert backend_client_certificate(gw, find_secret, ReferenceGrants.build(grants)) == want
    status = ingress_status(gw, FOUND, merged(gw, []).judged, host=HOST, addresses=ADDRESSES, resolved=want)
    assert conditions(status)[2] == ("ResolvedRefs", "True" if want[0] else "False", want[1], want[2])
    assert status["attachedListenerSets"] is None


def test_a_certificate_ref_refused_for_want_of_a_grant_leaves_a_gateway_listener_not_accepted() -> None:
    gw = gateway("gw", https("tls", "a.com", "ns4-cert", "ns4"))
    [judged] = merged(gw, []).judged
    message = (
        'certificateRef ns4-cert/ns4 not accessible to a Gateway in namespace "istio-system"'
        " (missing a ReferenceGrant?)"
    )
    assert judged.accepted == (False, "NoValidCACertificate", message)
    assert judged.resolved == (False, "RefNotPermitted", message)
