"""Gateway API conformance, TCPRoutes on an ingress Gateway (class ``istio``; Istio's ambient conformance run
includes the GATEWAY-TCP profile and supports TCPRoute): the parents' conditions, the listeners' ``attachedRoutes``
and the backends each TCP listener relays to. Each case replays one upstream conformance test with manifests of
our own in the shape of the suite's (namespace ``infra``, Services ``tcp-echo-*`` there, one in ``web``).

- TCPRouteInvalidBackendRefNonexistent: a missing Service → ResolvedRefs False/BackendNotFound, Accepted.
- TCPRouteInvalidCrossNamespaceBackendRef: another namespace's Service, no grant → RefNotPermitted.
- TCPRouteReferenceGrant: with a grant from TCPRoutes of the route's namespace the connection reaches the other
  namespace's Service; a grant for HTTPRoutes only does not count (RefNotPermitted, as after the grant is deleted).
- TCPRouteInvalidNonTCPListener: a TCPRoute on an HTTP listener allowing HTTPRoutes only → NotAllowedByListeners,
  ``attachedRoutes`` 0.
- TCPRouteParentRefPortAndSectionName: parentRefs by port, by sectionName and by both each attach to exactly their
  listener.
- TCPRouteParentRefAttachAll: a parentRef with neither attaches to every TCP listener.
- TCPRouteMultipleRoutesAttachment: two routes on one listener are both Accepted and counted; the older relays.
"""

from __future__ import annotations

from typing import Any

from ambit.controlplane.gateway.ingress_status import ingress_attached_routes
from ambit.controlplane.translate.ingress import IngressTranslation, translate_ingress
from ambit.model.workload import Service

INFRA, WEB = "infra", "web"
GROUP = "gateway.networking.k8s.io"
TCP_ONLY = {"kinds": [{"kind": "TCPRoute"}]}
SERVICES = [
    *(
        Service(f"tcp-echo-{n}", INFRA, f"tcp-echo-{n}.{INFRA}.svc.cluster.local")
        for n in ("one", "two", "three", "all")
    ),
    Service("tcp-reference-grant-backend", WEB, f"tcp-reference-grant-backend.{WEB}.svc.cluster.local"),
]


def gateway(name: str, *listeners: tuple[str, int]) -> dict[str, Any]:
    return {
        "metadata": {"namespace": INFRA, "name": name, "generation": 1},
        "spec": {
            "gatewayClassName": "istio",
            "listeners": [
                {"name": n, "protocol": "TCP", "port": port, "allowedRoutes": TCP_ONLY} for n, port in listeners
            ],
        },
    }


def tcp_route(
    name: str, parent: dict[str, Any], backend: str, namespace: str | None = None, created: str = ""
) -> dict[str, Any]:
    ref: dict[str, Any] = {"name": backend, "port": 3000}
    if namespace is not None:
        ref["namespace"] = namespace
    meta: dict[str, Any] = {"namespace": INFRA, "name": name, "generation": 1}
    if created:
        meta["creationTimestamp"] = created
    return {"metadata": meta, "spec": {"parentRefs": [parent], "rules": [{"backendRefs": [ref]}]}}


def translate(
    gw: dict[str, Any], *routes: dict[str, Any], grants: list[dict[str, Any]] | None = None
) -> IngressTranslation:
    return translate_ingress(
        gateways=[gw],
        http_routes=[],
        tcp_routes=list(routes),
        k8s_services=SERVICES,
        find_secret=lambda ns, name: None,
        namespace_labels={},
        reference_grants=grants or [],
    )


def conditions(out: IngressTranslation, name: str) -> dict[str, tuple[bool, str]]:
    (status,) = [s for s in out.status if s.name == name]
    (parent,) = status.parents
    return {c.type: (c.status, c.reason) for c in parent.conditions}


def relays(out: IngressTranslation) -> dict[str, list[str | None]]:
    """Listener name → the hostnames its connections go to (None: a backend that did not resolve)."""
    (config,) = out.configs
    return {
        listener.name: [
            b.backend.hostname.split(".")[0] if b.backend is not None else None
            for host in listener.virtual_hosts
            for b in host.tcp_backends
        ]
        for listener in config.listeners
    }


def test_invalid_backend_ref_nonexistent() -> None:
    gw = gateway("tcp-gateway-invalid-backend", ("tcp", 9300))
    route = tcp_route("r", {"name": gw["metadata"]["name"], "sectionName": "tcp"}, "nonexistent-service")
    out = translate(gw, route)
    assert conditions(out, "r") == {"Accepted": (True, "Accepted"), "ResolvedRefs": (False, "BackendNotFound")}
    assert relays(out) == {"tcp": [None]}


def test_cross_namespace_backend_ref_and_reference_grant() -> None:
    gw = gateway("tcp-reference-grant-gateway", ("tcp", 9320))
    route = tcp_route("r", {"name": gw["metadata"]["name"], "sectionName": "tcp"}, "tcp-reference-grant-backend", WEB)

    def grant(kind: str) -> dict[str, Any]:
        return {
            "metadata": {"namespace": WEB, "name": "tcp-reference-grant"},
            "spec": {
                "from": [{"group": GROUP, "kind": kind, "namespace": INFRA}],
                "to": [{"group": "", "kind": "Service", "name": "tcp-reference-grant-backend"}],
            },
        }

    out = translate(gw, route, grants=[grant("TCPRoute")])
    assert conditions(out, "r") == {"Accepted": (True, "Accepted"), "ResolvedRefs": (True, "ResolvedRefs")}
    assert relays(out) == {"tcp": ["tcp-reference-grant-backend"]}
    for grants in ([], [grant("HTTPRoute")]):
        out = translate(gw, route, grants=grants)
        assert conditions(out, "r") == {"Accepted": (True, "Accepted"), "ResolvedRefs": (False, "RefNotPermitted")}
        assert relays(out) == {"tcp": [None]}


def test_invalid_non_tcp_listener() -> None:
    http_only = {
        "name": "only-allow-http-routes",
        "protocol": "HTTP",
        "port": 5300,
        "allowedRoutes": {"kinds": [{"kind": "HTTPRoute"}]},
    }
    gw = {
        "metadata": {"namespace": INFRA, "name": "tcp-mixed-protocol-gateway", "generation": 1},
        "spec": {"gatewayClassName": "istio", "listeners": [http_only]},
    }
    route = tcp_route(
        "r", {"name": "tcp-mixed-protocol-gateway", "sectionName": "only-allow-http-routes"}, "tcp-echo-one"
    )
    out = translate(gw, route)
    assert conditions(out, "r") == {
        "Accepted": (False, "NotAllowedByListeners"),
        "ResolvedRefs": (True, "ResolvedRefs"),
    }
    assert ingress_attached_routes(gw, {"TCPRoute": [route]}) == {"only-allow-http-routes": 0}


def test_parent_ref_port_and_section_name() -> None:
    name = "tcp-multi-listener-gateway"
    gw = gateway(name, ("one", 9300), ("two", 9301), ("three", 9302))
    routes = [
        tcp_route("by-port", {"name": name, "port": 9300}, "tcp-echo-one"),
        tcp_route("by-section", {"name": name, "sectionName": "two"}, "tcp-echo-two"),
        tcp_route("by-both", {"name": name, "sectionName": "three", "port": 9302}, "tcp-echo-three"),
    ]
    out = translate(gw, *routes)
    for route in routes:
        assert conditions(out, route["metadata"]["name"])["Accepted"] == (True, "Accepted")
    assert relays(out) == {"one": ["tcp-echo-one"], "two": ["tcp-echo-two"], "three": ["tcp-echo-three"]}
    assert ingress_attached_routes(gw, {"TCPRoute": routes}) == {"one": 1, "two": 1, "three": 1}
    (status,) = [s for s in out.status if s.name == "by-both"]
    assert status.parents[0].parent_ref_dict() == {"name": name, "sectionName": "three", "port": 9302}


def test_parent_ref_attach_all() -> None:
    name = "tcp-attach-all-gateway"
    gw = gateway(name, ("one", 9310), ("two", 9311), ("three", 9312), ("four", 9313))
    route = tcp_route("r", {"name": name}, "tcp-echo-all")
    out = translate(gw, route)
    assert conditions(out, "r")["Accepted"] == (True, "Accepted")
    assert relays(out) == {key: ["tcp-echo-all"] for key in ("one", "two", "three", "four")}
    assert ingress_attached_routes(gw, {"TCPRoute": [route]}) == dict.fromkeys(("one", "two", "three", "four"), 1)


def test_multiple_routes_attachment() -> None:
    name = "tcp-multi-route-attach-gateway"
    gw = gateway(name, ("tcp", 9330))
    parent = {"name": name, "sectionName": "tcp"}
    older = tcp_route("tcproute-attach-older", parent, "tcp-echo-one", created="2026-01-01T00:00:00Z")
    newer = tcp_route("tcproute-attach-newer", parent, "tcp-echo-two", created="2026-01-02T00:00:00Z")
    out = translate(gw, newer, older)
    for route in (older, newer):
        assert conditions(out, route["metadata"]["name"])["Accepted"] == (True, "Accepted")
    assert ingress_attached_routes(gw, {"TCPRoute": [older, newer]}) == {"tcp": 2}
    assert relays(out) == {"tcp": ["tcp-echo-one"]}
