"""Gateway API conformance (MESH-HTTP), routing share: routes whose parentRef is a Service, served by the namespace
waypoint (``istio.io/use-waypoint``). Each case translates its manifests with :func:`translate_all` (the suite's mesh
base: Services ``echo``, ``echo-v1``, ``echo-v2`` in ``gateway-conformance-mesh`` with ports 80, 8080, 443, 9090
and 7070) and routes the request with the waypoint's engine (:func:`~ambit.waypoint.routing.route`) on the table of
the Service and port it was sent to, as the waypoint's shell picks it.

- MeshBasic: no route, the request reaches the Service it was sent to.
- MeshPorts: a parentRef with a port binds that port only; without one, every port.
- MeshFrontend, MeshFrontendHostname: the route follows the Service addressed, not the ``Host`` header; a pod
  addressed directly has no route.
- MeshTrafficSplit (mesh-split): Exact paths split between two Services.
- MeshHTTPRouteSimpleSameNamespace, MeshHTTPRouteMatching, MeshHTTPRouteQueryParamMatching,
  MeshHTTPRouteRequestHeaderModifier, MeshHTTPRouteRedirectHostAndStatus, MeshHTTPRouteRedirectPath,
  MeshHTTPRouteRedirectPort, MeshHTTPRouteSchemeRedirect, MeshHTTPRouteRewritePath, MeshHTTPRouteNamedRule,
  MeshHTTPRouteBackendRequestHeaderModifier, MeshHTTPRouteWeight (skipped by Istio, checked anyway): the
  gateway cases' manifests (:mod:`test_conformance_routing`) attached to the Service ``echo`` port 80 instead, with
  their backends ``echo-v1``/``echo-v2`` port 8080.
- MeshGRPCRouteRequestHeaderModifier: a GRPCRoute on ``echo`` port 7070 picks its rule by header and edits the
  request's headers.
"""

from __future__ import annotations

import copy
from typing import Any

import pytest
import yaml
from tests.unit import test_conformance_routing as gw

from ambit.controlplane.translate import translate_all
from ambit.model.routes import BackendService, RouteTable
from ambit.waypoint.decisions import Decision, Forward, RequestHead, Respond
from ambit.waypoint.routing import route

MESH = "gateway-conformance-mesh"
PORTS = [
    {"name": "http", "port": 80, "appProtocol": "http", "targetPort": 8080},
    {"name": "http-alt", "port": 8080, "appProtocol": "http"},
    {"name": "https", "port": 443, "targetPort": 8443},
    {"name": "tcp", "port": 9090},
    {"name": "grpc", "port": 7070, "appProtocol": "grpc"},
]
BASE: list[dict[str, Any]] = [
    {"kind": "Namespace", "metadata": {"name": MESH, "labels": {"istio.io/use-waypoint": "waypoint"}}},
    {
        "kind": "GatewayClass",
        "metadata": {"name": "istio-waypoint"},
        "spec": {"controllerName": "istio.io/mesh-controller"},
    },
    {
        "kind": "Gateway",
        "metadata": {"name": "waypoint", "namespace": MESH},
        "spec": {
            "gatewayClassName": "istio-waypoint",
            "listeners": [{"name": "mesh", "port": 15008, "protocol": "HBONE"}],
        },
        "status": {"addresses": [{"type": "Hostname", "value": f"waypoint.{MESH}.svc.cluster.local"}]},
    },
    *(
        {
            "kind": "Service",
            "metadata": {"name": name, "namespace": MESH},
            "spec": {"clusterIP": f"10.96.0.{number}", "ports": PORTS},
        }
        for number, name in enumerate(("echo", "echo-v1", "echo-v2"), start=10)
    ),
]
ECHO = {"group": "", "kind": "Service", "name": "echo", "port": 80}


def host(name: str) -> str:
    return f"{name}.{MESH}.svc.cluster.local"


def to_mesh(manifests: str) -> str:
    """A gateway case's routes attached to the Service ``echo`` port 80, backends ``infra-backend-vN`` →
    ``echo-vN`` (port 8080 kept)."""
    docs = []
    for doc in yaml.safe_load_all(manifests):
        if not doc or doc.get("kind", "HTTPRoute") != "HTTPRoute":
            continue
        attached = copy.deepcopy(doc)
        attached["spec"]["parentRefs"] = [ECHO]
        docs.append(attached)
    text = yaml.safe_dump_all(docs)
    assert "infra-backend-v3" not in text
    return text.replace("infra-backend-v", "echo-v")


class Mesh:
    """The waypoint's tables after translating ``manifests`` (HTTPRoutes in the mesh namespace)."""

    def __init__(self, manifests: str) -> None:
        routes = []
        for number, doc in enumerate(d for d in yaml.safe_load_all(manifests) if d):
            doc.setdefault("kind", "HTTPRoute")
            doc["metadata"]["namespace"] = MESH
            doc["metadata"].setdefault("creationTimestamp", f"2026-01-01T00:00:{number:02d}Z")
            routes.append(doc)
        objects = [*BASE, *routes]
        self.out = translate_all(
            pods=[],
            services=[o for o in objects if o["kind"] == "Service"],
            endpoint_slices=[],
            namespaces=[o for o in objects if o["kind"] == "Namespace"],
            gateways=[o for o in objects if o["kind"] == "Gateway"],
            gateway_classes=[o for o in objects if o["kind"] == "GatewayClass"],
            http_routes=[o for o in objects if o["kind"] == "HTTPRoute"],
            grpc_routes=[o for o in objects if o["kind"] == "GRPCRoute"],
        )
        (self.config,) = self.out.waypoint_configs

    def table(self, service: str, port: int) -> RouteTable | None:
        """The table the waypoint's shell looks up for a request to ``service`` on ``port``."""
        return self.config.find_table(f"{MESH}/{host(service)}", port)

    def send(
        self,
        path: str = "/",
        *,
        service: str = "echo",
        port: int = 80,
        method: str = "GET",
        headers: dict[str, str] | None = None,
        authority: str | None = None,
        random: float = 0.0,
    ) -> Decision:
        sent = tuple((k.lower(), v) for k, v in (headers or {}).items())
        request = RequestHead(method, path, authority or service, sent)
        destination = BackendService(MESH, host(service), port)
        return route(self.table(service, port), destination, request, random)

    def backend(self, path: str = "/", **kwargs: Any) -> str:
        decision = self.send(path, **kwargs)
        if isinstance(decision, Respond):
            return str(decision.status)
        assert decision.backend.namespace == MESH
        return decision.backend.hostname.partition(".")[0]


def forward(decision: Decision) -> Forward:
    assert isinstance(decision, Forward), decision
    return decision


def _route(name: str, parent: dict[str, Any], *rules: dict[str, Any]) -> str:
    return yaml.safe_dump({"metadata": {"name": name}, "spec": {"parentRefs": [parent], "rules": list(rules)}})


def _set_response(value: str, backend: str) -> dict[str, Any]:
    return {
        "filters": [gw._modifier("ResponseHeaderModifier", set={"X-Header-Set": value})],
        "backendRefs": [{"name": backend, "port": 80}],
    }


def response_header(decision: Decision) -> str | None:
    """``X-Header-Set`` on the answer of a backend that sets none itself."""
    modifier = forward(decision).response_headers
    return None if modifier is None else dict(modifier.applied([])).get("x-header-set")


# -- MeshBasic, MeshSplit --------------------------------------------------------------------------------------
def test_mesh_basic_without_routes_reaches_the_service_addressed() -> None:
    mesh = Mesh("")
    decision = forward(mesh.send("/", service="echo"))
    assert decision.backend == BackendService(MESH, host("echo"), 80)
    assert decision.request.authority == "echo"


@pytest.mark.parametrize(("path", "expected"), [("/v1", "echo-v1"), ("/v2", "echo-v2"), ("/v3", "404")])
def test_mesh_split(path: str, expected: str) -> None:
    manifest = _route(
        "mesh-split",
        {"group": "", "kind": "Service", "name": "echo"},
        {"matches": [gw._path("Exact", "/v1")], "backendRefs": [{"name": "echo-v1", "port": 80}]},
        {"matches": [gw._path("Exact", "/v2")], "backendRefs": [{"name": "echo-v2", "port": 80}]},
    )
    assert Mesh(manifest).backend(path, service="echo") == expected


# -- MeshPorts -------------------------------------------------------------------------------------------------
PORTS_MANIFEST = "---\n".join(
    [
        _route(
            "mesh-split-v1",
            {"group": "", "kind": "Service", "name": "echo-v1", "port": 80},
            _set_response("v1", "echo-v1"),
        ),
        _route("mesh-split-v2", {"group": "", "kind": "Service", "name": "echo-v2"}, _set_response("v2", "echo-v2")),
    ]
)


@pytest.mark.parametrize(
    ("service", "port", "expected"),
    [("echo-v1", 80, "v1"), ("echo-v1", 8080, None), ("echo-v2", 80, "v2"), ("echo-v2", 8080, "v2")],
)
def test_mesh_ports(service: str, port: int, expected: str | None) -> None:
    mesh = Mesh(PORTS_MANIFEST)
    decision = mesh.send("/", service=service, port=port, authority=f"{service}:{port}")
    assert forward(decision).backend.hostname == host(service)
    assert response_header(decision) == expected


# -- MeshFrontend, MeshFrontendHostname ------------------------------------------------------------------------
FRONTEND = _route("mesh-split-v1", {"group": "", "kind": "Service", "name": "echo-v2"}, _set_response("set", "echo-v2"))


@pytest.mark.parametrize(
    ("service", "authority", "expected"),
    [("echo-v2", "echo-v2", "set"), ("echo-v2", "echo-v1", "set"), ("echo-v1", "echo-v2", None)],
)
def test_mesh_frontend_follows_the_service_addressed_not_the_host(
    service: str, authority: str, expected: str | None
) -> None:
    decision = Mesh(FRONTEND).send("/", service=service, authority=authority)
    assert forward(decision).backend.hostname == host(service)
    assert response_header(decision) == expected


def test_mesh_frontend_a_pod_addressed_directly_has_no_route() -> None:
    mesh = Mesh(FRONTEND)
    assert mesh.table("echo-v2", 80) is not None
    pod = BackendService(MESH, "10.244.0.7", 8080)
    decision = forward(route(None, pod, RequestHead("GET", "/", "10.244.0.7:8080"), 0.0))
    assert (decision.backend, decision.response_headers) == (pod, None)


# -- the gateway cases' manifests attached to the Service echo -------------------------------------------------
def test_mesh_simple_same_namespace() -> None:
    manifest = to_mesh(gw._catch_all("gateway-conformance-mesh-test", gw.V1, {"name": "same-namespace"}))
    mesh = Mesh(manifest)
    assert mesh.backend("/") == "echo-v1"
    assert mesh.backend("/", port=8080) == "echo"  # the parentRef names port 80 only


@pytest.mark.parametrize(
    ("path", "headers", "expected"),
    [
        ("/", {}, "echo-v1"),
        ("/example", {}, "echo-v1"),
        ("/", {"Version": "one"}, "echo-v1"),
        ("/v2", {}, "echo-v2"),
        ("/v2/example", {}, "echo-v2"),
        ("/", {"Version": "two"}, "echo-v2"),
        ("/v2/", {}, "echo-v2"),
        ("/v2example", {}, "echo-v1"),
        ("/foo/v2/example", {}, "echo-v1"),
    ],
)
def test_mesh_matching(path: str, headers: dict[str, str], expected: str) -> None:
    assert Mesh(to_mesh(gw.MATCHING)).backend(path, headers=headers) == expected


MESH_QUERY = gw._rules(
    ({"queryParams": gw._query(animal="whale")}, gw.V1),
    ({"queryParams": gw._query(animal="dolphin")}, gw.V2),
    ({**gw._path("PathPrefix", "/path1"), "queryParams": gw._query(animal="whale")}, gw.V1),
    ({**gw._headers(version="one"), "queryParams": gw._query(animal="whale")}, gw.V2),
    (
        [
            {**gw._path("PathPrefix", "/path3"), "queryParams": gw._query(animal="shark")},
            {
                **gw._path("PathPrefix", "/path4"),
                **gw._headers(version="three"),
                "queryParams": gw._query(animal="kraken"),
            },
        ],
        gw.V1,
    ),
    (gw._path("PathPrefix", "/path5"), gw.V1),
    ({"queryParams": gw._query(animal="hydra")}, gw.V2),
)


@pytest.mark.parametrize(
    ("path", "headers", "expected"),
    [
        ("/?animal=whale", {}, "echo-v1"),
        ("/?animal=dolphin", {}, "echo-v2"),
        ("/?animal=whale&otherparam=irrelevant", {}, "echo-v1"),
        ("/?animal=dolphin&color=yellow", {}, "echo-v2"),
        ("/?color=blue", {}, "404"),
        ("/?animal=dog", {}, "404"),
        ("/?animal=whaledolphin", {}, "404"),
        ("/", {}, "404"),
        ("/path1?animal=whale", {}, "echo-v1"),
        ("/?animal=whale", {"version": "one"}, "echo-v2"),
        ("/path3?animal=shark", {}, "echo-v1"),
        ("/path4?animal=kraken", {"version": "three"}, "echo-v1"),
        ("/?animal=shark", {}, "404"),
        ("/path4?animal=kraken", {}, "404"),
        ("/path5?animal=hydra", {}, "echo-v1"),
    ],
)
def test_mesh_query_param_matching(path: str, headers: dict[str, str], expected: str) -> None:
    assert Mesh(to_mesh(MESH_QUERY)).backend(path, headers=headers) == expected


@pytest.mark.parametrize(("path", "sent", "expected", "absent"), gw.HEADER_CASES[:-1])
@pytest.mark.parametrize("on_backends", [False, True])
def test_mesh_request_header_modifier(
    path: str, sent: dict[str, str], expected: dict[str, str], absent: list[str], on_backends: bool
) -> None:
    manifest = gw._modifier_rules("RequestHeaderModifier")
    if on_backends:
        manifest = gw._on_backends(manifest)
    decision = forward(Mesh(to_mesh(manifest)).send(path, headers=sent))
    seen = gw.joined(decision.request.headers)
    assert {k: seen.get(k) for k in expected} == expected
    assert not set(absent) & set(seen)
    assert decision.backend.hostname == host("echo-v1")


REDIRECT_CASES = [
    ("/hostname-redirect", (302, "http", "example.org", "", "/hostname-redirect")),
    ("/host-and-status", (301, "http", "example.org", "", "/host-and-status")),
    ("/original-prefix/lemon", (302, "http", "echo", "", "/replacement-prefix/lemon")),
    ("/full/path/original", (302, "http", "echo", "", "/full-path-replacement")),
    ("/path-and-host", (302, "http", "example.org", "", "/replacement-prefix")),
    ("/path-and-status", (301, "http", "echo", "", "/replacement-prefix")),
    ("/full-path-and-host", (302, "http", "example.org", "", "/replacement-full")),
    ("/full-path-and-status", (301, "http", "echo", "", "/replacement-full")),
    ("/port", (302, "http", "echo", "8083", "/port")),
    ("/port-and-host", (302, "http", "example.org", "8083", "/port-and-host")),
    ("/port-and-status", (301, "http", "echo", "8083", "/port-and-status")),
    ("/port-and-host-and-status", (302, "http", "example.org", "8083", "/port-and-host-and-status")),
    ("/scheme", (302, "https", "echo", "", "/scheme")),
    ("/scheme-and-host", (302, "https", "example.org", "", "/scheme-and-host")),
    ("/scheme-and-status", (301, "https", "echo", "", "/scheme-and-status")),
    ("/scheme-and-host-and-status", (302, "https", "example.org", "", "/scheme-and-host-and-status")),
]


@pytest.mark.parametrize(("path", "expected"), REDIRECT_CASES)
def test_mesh_redirects(path: str, expected: tuple[int, str, str, str, str]) -> None:
    assert gw.redirected(Mesh(to_mesh(gw.REDIRECTS)).send(path)) == expected


@pytest.mark.parametrize(
    ("path", "expected"),
    [
        ("/prefix/one/two", "/one/two"),
        ("/strip-prefix/three", "/three"),
        ("/strip-prefix", "/"),
        ("/full/one/two", "/one"),
        ("/full/rewrite-path-and-modify-headers/test", "/test"),
        ("/prefix/rewrite-path-and-modify-headers/one", "/prefix/one"),
    ],
)
def test_mesh_rewrite_path(path: str, expected: str) -> None:
    decision = forward(Mesh(to_mesh(gw.REWRITE_PATH)).send(path, headers=gw.MODIFY_SENT))
    assert (decision.request.path, decision.backend.hostname) == (expected, host("echo-v1"))
    if "modify-headers" in path:
        seen = gw.joined(decision.request.headers)
        assert {k: seen.get(k) for k in gw.MODIFIED} == gw.MODIFIED
        assert "x-header-remove" not in seen


def test_mesh_named_rule() -> None:
    route_doc = yaml.safe_load(
        gw._rules((gw._path("PathPrefix", "/named"), gw.V1), (gw._path("PathPrefix", "/unnamed"), gw.V2))
    )
    route_doc["spec"]["rules"][0]["name"] = "named-rule"
    mesh = Mesh(to_mesh(yaml.safe_dump(route_doc)))
    assert (mesh.backend("/named"), mesh.backend("/unnamed")) == ("echo-v1", "echo-v2")
    (status,) = mesh.out.route_status
    assert all(c.status for c in status.parents[0].conditions)


def test_mesh_weights_split_requests() -> None:
    manifest = to_mesh(
        gw._weighted({"name": gw.V1, "port": 8080, "weight": 70}, {"name": gw.V2, "port": 8080, "weight": 30})
    )
    mesh = Mesh(manifest)
    names = [mesh.backend("/", random=i / 1000) for i in range(1000)]
    assert (names.count("echo-v1"), names.count("echo-v2")) == (700, 300)


# -- MeshGRPCRouteRequestHeaderModifier -------------------------------------------------------------------------
def _grpc_rule(case: str, backend: str, **edits: Any) -> dict[str, Any]:
    return {
        "matches": [{"headers": [{"name": "x-test-case", "value": case}]}],
        "filters": [gw._modifier("RequestHeaderModifier", **edits)],
        "backendRefs": [{"name": backend, "port": 7070}],
    }


GRPC_MODIFIER = yaml.safe_dump(
    {
        "kind": "GRPCRoute",
        "metadata": {"name": "grpc-request-header-modifier"},
        "spec": {
            "parentRefs": [{"group": "", "kind": "Service", "name": "echo", "port": 7070}],
            "rules": [
                _grpc_rule("set", "echo-v1", set={"x-header-set": "set-overwrites-values"}),
                _grpc_rule("add", "echo-v1", add={"x-header-add": "add-appends-values"}),
                _grpc_rule("remove", "echo-v1", remove=["x-header-remove"]),
                _grpc_rule(
                    "multi",
                    "echo-v2",
                    set={"x-header-set-1": "header-set-1", "x-header-set-2": "header-set-2"},
                    add={"x-header-add-1": "header-add-1", "x-header-add-2": "header-add-2"},
                    remove=["x-header-remove-1", "x-header-remove-2"],
                ),
            ],
        },
    }
)


@pytest.mark.parametrize(
    ("case", "sent", "backend", "expected", "absent"),
    [
        (
            "set",
            {"x-header-set": "old", "some-other-header": "kept"},
            "echo-v1",
            {"x-header-set": "set-overwrites-values", "some-other-header": "kept"},
            [],
        ),
        ("add", {"x-header-add": "first"}, "echo-v1", {"x-header-add": "first,add-appends-values"}, []),
        ("remove", {"x-header-remove": "gone"}, "echo-v1", {}, ["x-header-remove"]),
        (
            "multi",
            {"x-header-set-2": "old", "x-header-add-2": "add-header-2", "x-header-remove-2": "gone"},
            "echo-v2",
            {
                "x-header-set-1": "header-set-1",
                "x-header-set-2": "header-set-2",
                "x-header-add-1": "header-add-1",
                "x-header-add-2": "add-header-2,header-add-2",
            },
            ["x-header-remove-1", "x-header-remove-2"],
        ),
    ],
)
def test_mesh_grpc_request_header_modifier(
    case: str, sent: dict[str, str], backend: str, expected: dict[str, str], absent: list[str]
) -> None:
    headers = {"content-type": "application/grpc", "x-test-case": case, **sent}
    decision = Mesh(GRPC_MODIFIER).send(
        "/grpc.testing.TestService/UnaryCall", service="echo", port=7070, method="POST", headers=headers
    )
    decision = forward(decision)
    assert decision.backend == BackendService(MESH, host(backend), 7070)
    seen = gw.joined(decision.request.headers)
    assert {k: seen.get(k) for k in expected} == expected
    assert seen["x-test-case"] == case
    assert not set(absent) & set(seen)
