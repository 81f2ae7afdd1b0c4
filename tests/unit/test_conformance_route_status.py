"""Gateway API conformance, status side of HTTPRoutes on an ingress Gateway (class ``istio``): the parent
conditions and reasons the translation writes, the ``attachedRoutes`` a listener counts, and what the gateway
answers for a rule whose backend did not resolve. Each case replays one upstream conformance test with manifests
of our own in the shape of the suite's base (a Gateway ``same-namespace`` with an HTTP listener on port 80 that
admits routes of its own namespace ``infra``; backends ``infra-backend-v1``/``v2`` there, ``app-backend-v1``/``v2``
in ``app``, ``web-backend`` in ``web``).

- HTTPRouteInvalidNonExistentBackendRef: a missing Service → ResolvedRefs False/BackendNotFound, Accepted, 500.
- HTTPRouteInvalidBackendRefUnknownKind: a backendRef of an unknown group/kind → InvalidKind, Accepted, 500.
- HTTPRouteInvalidCrossNamespaceBackendRef: another namespace's Service, no grant → RefNotPermitted, 500.
- HTTPRouteInvalidReferenceGrant: grants that do not fit (the wrong namespace, from group/kind/namespace, to
  group/kind/name) permit nothing → RefNotPermitted, 500.
- HTTPRoutePartiallyInvalidViaInvalidReferenceGrant: a grant naming another Service: that rule 500, the sibling
  rule reaches its backend.
- HTTPRouteReferenceGrant: a grant from HTTPRoutes of the route's namespace to the Service → resolved, forwarded.
- HTTPRouteInvalidCrossNamespaceParentRef: a route of another namespace on a ``Same`` listener →
  NotAllowedByListeners, ResolvedRefs True, no listener counts it.
- HTTPRouteDisallowedKind: an HTTPRoute on a listener whose ``allowedRoutes.kinds`` is TLSRoute only →
  NotAllowedByListeners, ResolvedRefs True, ``attachedRoutes`` 0.
- HTTPRouteInvalidParentRefNotMatchingListenerPort, HTTPRouteInvalidParentRefNotMatchingSectionName,
  HTTPRouteInvalidParentRefSectionNameNotMatchingPort: NoMatchingParent, ``attachedRoutes`` 0.
- HTTPRouteObservedGenerationBump: every condition carries the route's current generation.
- HTTPRouteOmittedBackendRefs: rules without backendRefs (omitted or empty) answer 500, ResolvedRefs stays True.
- HTTPRouteServiceTypes: backends are Services of any type, headless ones included (ResolvedRefs True).
- GatewayHTTPListenerIsolation: four HTTP listeners on one port (no hostname, ``*.example.com``,
  ``*.foo.example.com``, ``abc.foo.example.com``), a route on each by sectionName: a request reaches only the
  routes of the most specific listener its host matches, 404 for the paths of the others.
"""

from __future__ import annotations

from typing import Any

from ambit.controlplane.gateway.ingress_status import ingress_attached_routes
from ambit.controlplane.translate.ingress import IngressTranslation, translate_ingress
from ambit.controlplane.translate.services import translate_service
from ambit.model.routes import BackendService
from ambit.model.workload import Service
from ambit.waypoint.decisions import Forward, RequestHead, Respond
from ambit.waypoint.ingress_routing import IngressRouter

INFRA, APP, WEB = "infra", "app", "web"
GROUP = "gateway.networking.k8s.io"
SERVICES = [
    Service("infra-backend-v1", INFRA, "infra-backend-v1.infra.svc.cluster.local"),
    Service("infra-backend-v2", INFRA, "infra-backend-v2.infra.svc.cluster.local"),
    Service("app-backend-v1", APP, "app-backend-v1.app.svc.cluster.local"),
    Service("app-backend-v2", APP, "app-backend-v2.app.svc.cluster.local"),
    Service("web-backend", WEB, "web-backend.web.svc.cluster.local"),
]


def same_namespace() -> dict[str, Any]:
    listener = {"name": "http", "port": 80, "protocol": "HTTP", "allowedRoutes": {"namespaces": {"from": "Same"}}}
    return {
        "metadata": {"namespace": INFRA, "name": "same-namespace", "generation": 1},
        "spec": {"gatewayClassName": "istio", "listeners": [listener]},
    }


def tlsroutes_only() -> dict[str, Any]:
    listener = {
        "name": "tls",
        "port": 443,
        "protocol": "TLS",
        "tls": {"mode": "Passthrough"},
        "allowedRoutes": {"namespaces": {"from": "Same"}, "kinds": [{"kind": "TLSRoute"}]},
    }
    return {
        "metadata": {"namespace": INFRA, "name": "tlsroutes-only", "generation": 1},
        "spec": {"gatewayClassName": "istio", "listeners": [listener]},
    }


def backend(name: str, namespace: str | None = None, **extra: Any) -> dict[str, Any]:
    ref: dict[str, Any] = {"name": name, "port": 8080, **extra}
    if namespace is not None:
        ref["namespace"] = namespace
    return ref


def http_route(
    name: str,
    rules: list[dict[str, Any]],
    *,
    namespace: str = INFRA,
    parent: dict[str, Any] | None = None,
    generation: int = 1,
) -> dict[str, Any]:
    ref = parent if parent is not None else {"name": "same-namespace"}
    return {
        "metadata": {"namespace": namespace, "name": name, "generation": generation},
        "spec": {"parentRefs": [ref], "rules": rules},
    }


def grant(namespace: str, from_namespace: str, to_name: str | None = None) -> dict[str, Any]:
    to: dict[str, Any] = {"group": "", "kind": "Service"}
    if to_name is not None:
        to["name"] = to_name
    return {
        "metadata": {"namespace": namespace, "name": "grant"},
        "spec": {"from": [{"group": GROUP, "kind": "HTTPRoute", "namespace": from_namespace}], "to": [to]},
    }


def translate(
    *routes: dict[str, Any],
    gateways: list[dict[str, Any]] | None = None,
    grants: list[dict[str, Any]] | None = None,
    services: list[Service] | None = None,
) -> IngressTranslation:
    return translate_ingress(
        gateways=gateways or [same_namespace()],
        http_routes=list(routes),
        k8s_services=SERVICES if services is None else services,
        find_secret=lambda ns, name: None,
        namespace_labels={},
        reference_grants=grants or [],
    )


def conditions(out: IngressTranslation, name: str) -> dict[str, tuple[bool, str]]:
    (status,) = [s for s in out.status if s.name == name]
    (parent,) = status.parents
    return {c.type: (c.status, c.reason) for c in parent.conditions}


def answer(out: IngressTranslation, path: str) -> Forward | Respond:
    (config,) = out.configs
    decision = IngressRouter(config).decide(None, BackendService(INFRA, "", 80), RequestHead("GET", path, "x"), 0.0)
    assert isinstance(decision, Forward | Respond)
    return decision


def forwarded_to(out: IngressTranslation, path: str) -> str:
    decision = answer(out, path)
    assert isinstance(decision, Forward), decision
    return decision.backend.hostname


def answers_500(out: IngressTranslation, path: str) -> bool:
    decision = answer(out, path)
    return isinstance(decision, Respond) and decision.status == 500


def attached(gateway: dict[str, Any], *routes: dict[str, Any]) -> dict[str, int]:
    return ingress_attached_routes(gateway, {"HTTPRoute": list(routes)})


# -- backend references ----------------------------------------------------------------------------------------
def test_invalid_nonexistent_backend_ref() -> None:
    out = translate(http_route("r", [{"backendRefs": [backend("nonexistent")]}]))
    assert conditions(out, "r") == {"Accepted": (True, "Accepted"), "ResolvedRefs": (False, "BackendNotFound")}
    assert answers_500(out, "/")


def test_invalid_backend_ref_unknown_kind() -> None:
    ref = backend("infra-backend-v1", group="unknownkind.example.com", kind="NonExistent")
    out = translate(
        http_route("r", [{"matches": [{"path": {"type": "PathPrefix", "value": "/v2"}}], "backendRefs": [ref]}])
    )
    assert conditions(out, "r") == {"Accepted": (True, "Accepted"), "ResolvedRefs": (False, "InvalidKind")}
    assert answers_500(out, "/v2")


def test_invalid_cross_namespace_backend_ref_and_invalid_reference_grants() -> None:
    route = http_route("r", [{"backendRefs": [backend("web-backend", WEB)]}])
    misplaced = grant(INFRA, INFRA, "web-backend")  # in the route's namespace, not the Service's: permits nothing

    def wrong(where: str, field: str, value: str) -> dict[str, Any]:
        found = grant(WEB, INFRA, "web-backend")
        found["spec"][where][0][field] = value
        return found

    wrong_ones = [
        misplaced,
        wrong("from", "group", "not-the-group"),
        wrong("from", "kind", "Gateway"),
        wrong("from", "namespace", "not-the-namespace"),
        wrong("to", "group", "not-the-group"),
        wrong("to", "kind", "Secret"),
        wrong("to", "name", "not-the-service"),
    ]
    for grants in ([], [misplaced], wrong_ones):
        out = translate(route, grants=grants)
        assert conditions(out, "r") == {"Accepted": (True, "Accepted"), "ResolvedRefs": (False, "RefNotPermitted")}
        assert answers_500(out, "/")


def test_partially_invalid_via_invalid_reference_grant() -> None:
    route = http_route(
        "r",
        [
            {
                "matches": [{"path": {"type": "PathPrefix", "value": "/v2"}}],
                "backendRefs": [backend("app-backend-v2", APP)],
            },
            {"backendRefs": [backend("app-backend-v1", APP)]},
        ],
    )
    out = translate(route, grants=[grant(APP, INFRA, "app-backend-v1")])
    assert conditions(out, "r") == {"Accepted": (True, "Accepted"), "ResolvedRefs": (False, "RefNotPermitted")}
    assert answers_500(out, "/v2")
    assert forwarded_to(out, "/") == "app-backend-v1.app.svc.cluster.local"


def test_reference_grant_permits_the_named_service_and_all_of_a_namespace() -> None:
    route = http_route("r", [{"backendRefs": [backend("web-backend", WEB)]}])
    for to_name in ("web-backend", None):
        out = translate(route, grants=[grant(WEB, INFRA, to_name)])
        assert conditions(out, "r") == {"Accepted": (True, "Accepted"), "ResolvedRefs": (True, "ResolvedRefs")}
        assert forwarded_to(out, "/") == "web-backend.web.svc.cluster.local"
    other_kind = grant(WEB, INFRA, "web-backend")
    other_kind["spec"]["from"][0]["kind"] = "GRPCRoute"
    assert conditions(translate(route, grants=[other_kind]), "r")["ResolvedRefs"] == (False, "RefNotPermitted")


# -- parent references ----------------------------------------------------------------------------------------
def test_invalid_cross_namespace_parent_ref() -> None:
    route = http_route(
        "r",
        [{"backendRefs": [backend("web-backend")]}],
        namespace=WEB,
        parent={"name": "same-namespace", "namespace": INFRA},
    )
    out = translate(route)
    assert conditions(out, "r") == {
        "Accepted": (False, "NotAllowedByListeners"),
        "ResolvedRefs": (True, "ResolvedRefs"),
    }
    assert attached(same_namespace(), route) == {"http": 0}
    (config,) = out.configs
    assert config.listeners[0].virtual_hosts == ()


def test_disallowed_kind() -> None:
    route = http_route(
        "r", [{"backendRefs": [backend("infra-backend-v1")]}], parent={"name": "tlsroutes-only", "namespace": INFRA}
    )
    out = translate(route, gateways=[tlsroutes_only()])
    assert conditions(out, "r") == {
        "Accepted": (False, "NotAllowedByListeners"),
        "ResolvedRefs": (True, "ResolvedRefs"),
    }
    assert attached(tlsroutes_only(), route) == {"tls": 0}


def test_parent_refs_not_matching_a_listener() -> None:
    rules = [{"backendRefs": [backend("infra-backend-v1")]}]
    routes = [
        http_route("port", rules, parent={"name": "same-namespace", "port": 81}),
        http_route("section", rules, parent={"name": "same-namespace", "sectionName": "foo"}),
        http_route("both", rules, parent={"name": "same-namespace", "sectionName": "http", "port": 81}),
    ]
    out = translate(*routes)
    for route in routes:
        name = route["metadata"]["name"]
        assert conditions(out, name)["Accepted"] == (False, "NoMatchingParent"), name
    assert attached(same_namespace(), *routes) == {"http": 0}
    (config,) = out.configs
    assert config.listeners[0].virtual_hosts == ()
    ok = http_route("ok", rules, parent={"name": "same-namespace", "sectionName": "http", "port": 80})
    assert conditions(translate(ok), "ok")["Accepted"] == (True, "Accepted")
    assert attached(same_namespace(), ok) == {"http": 1}


def test_observed_generation_bump() -> None:
    for generation, name in ((1, "infra-backend-v1"), (2, "infra-backend-v2")):
        out = translate(http_route("r", [{"backendRefs": [backend(name)]}], generation=generation))
        (status,) = out.status
        assert status.generation == generation
        assert conditions(out, "r")["ResolvedRefs"] == (True, "ResolvedRefs")
        assert forwarded_to(out, "/") == f"{name}.infra.svc.cluster.local"


def test_omitted_backend_refs() -> None:
    route = http_route(
        "r",
        [
            {"matches": [{"path": {"type": "Exact", "value": "/omitted-no-forward"}}]},
            {"matches": [{"path": {"type": "Exact", "value": "/empty-no-forward"}}], "backendRefs": []},
            {"matches": [{"path": {"type": "PathPrefix", "value": "/"}}], "backendRefs": [backend("infra-backend-v1")]},
        ],
    )
    out = translate(route)
    assert conditions(out, "r") == {"Accepted": (True, "Accepted"), "ResolvedRefs": (True, "ResolvedRefs")}
    assert forwarded_to(out, "/forward") == "infra-backend-v1.infra.svc.cluster.local"
    assert answers_500(out, "/omitted-no-forward")
    assert answers_500(out, "/empty-no-forward")


def test_service_types_resolve_headless_and_selectorless_services() -> None:
    def service(name: str, *, headless: bool, selector: bool) -> Service:
        spec: dict[str, Any] = {"ports": [{"name": "first-port", "protocol": "TCP", "port": 8080, "targetPort": 3000}]}
        if headless:
            spec["clusterIP"] = "None"
        if selector:
            spec["selector"] = {"app": "infra-backend-v1"}
        found = translate_service(
            {"metadata": {"namespace": INFRA, "name": name}, "spec": spec}, domain="cluster.local", network=""
        )
        assert found is not None
        return found

    kinds = {
        "manual-endpointslices": (False, False),
        "headless": (True, True),
        "headless-manual-endpointslices": (True, False),
    }
    services = [service(name, headless=h, selector=s) for name, (h, s) in kinds.items()]
    rules = [
        {"matches": [{"path": {"type": "Exact", "value": f"/{name}"}}], "backendRefs": [backend(name)]}
        for name in kinds
    ]
    out = translate(http_route("r", rules), services=services)
    assert conditions(out, "r") == {"Accepted": (True, "Accepted"), "ResolvedRefs": (True, "ResolvedRefs")}
    for name in kinds:
        assert forwarded_to(out, f"/{name}") == f"{name}.infra.svc.cluster.local"


def test_http_listener_isolation() -> None:
    all_ns = {"namespaces": {"from": "All"}}
    names = {
        "empty-hostname": None,
        "wildcard-example-com": "*.example.com",
        "wildcard-foo-example-com": "*.foo.example.com",
        "abc-foo-example-com": "abc.foo.example.com",
    }
    listeners = []
    for name, host in names.items():
        listener: dict[str, Any] = {"name": name, "port": 80, "protocol": "HTTP", "allowedRoutes": all_ns}
        if host is not None:
            listener["hostname"] = host
        listeners.append(listener)
    gw = {
        "metadata": {"namespace": INFRA, "name": "iso", "generation": 1},
        "spec": {"gatewayClassName": "istio", "listeners": listeners},
    }
    routes = [
        http_route(
            f"to-{name}",
            [
                {
                    "matches": [{"path": {"type": "PathPrefix", "value": f"/{name}"}}],
                    "backendRefs": [backend("infra-backend-v1")],
                }
            ],
            parent={"name": "iso", "namespace": INFRA, "sectionName": name},
        )
        for name in names
    ]
    out = translate(*routes, gateways=[gw])
    assert attached(gw, *routes) == dict.fromkeys(names, 1)
    (config,) = out.configs
    router = IngressRouter(config)
    owner = {
        "bar.com": "empty-hostname",
        "bar.example.com": "wildcard-example-com",
        "bar.foo.example.com": "wildcard-foo-example-com",
        "abc.foo.example.com": "abc-foo-example-com",
    }
    for host, listener_name in owner.items():
        for name in names:
            decision = router.decide(None, BackendService(INFRA, "", 80), RequestHead("GET", f"/{name}", host), 0.0)
            if name == listener_name:
                assert isinstance(decision, Forward), (host, name, decision)
            else:
                assert isinstance(decision, Respond) and decision.status == 404, (host, name, decision)
