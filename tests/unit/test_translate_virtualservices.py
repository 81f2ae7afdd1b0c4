"""VirtualService → waypoint route tables (ambit.controlplane.translate.virtualservices): upstream's objects from
istio tests/integration/ambient/baseline_test.go (TestServerRouting, TestTrafficSplit) verbatim, then each rule of
the module, then arbitrary objects (hypothesis)."""

from __future__ import annotations

import time
from typing import Any

import pytest
import yaml
from hypothesis import given, settings
from hypothesis import strategies as st

from ambit.controlplane.translate import Translation, translate_all
from ambit.controlplane.translate.virtualservices import MAX_ENTRIES, host_matches
from ambit.model.route_matches import ClaimMatch, PathMatch, PathMatchType, RouteMatch, ValueMatch, ValueMatchType
from ambit.model.routes import (
    BackendService,
    CorsPolicy,
    DirectResponse,
    Fault,
    HeaderModifier,
    PathModifier,
    PathModifierType,
    RegexRewrite,
    RequestMirror,
    RequestRedirect,
    RetryPolicy,
    RouteTable,
    Timeouts,
    URLRewrite,
    WeightedBackend,
)
from ambit.xds.routes import decode_waypoint_config, pack_waypoint_config, waypoint_config_to_proto

Obj = dict[str, Any]
CLUSTER = """
apiVersion: v1
kind: Namespace
metadata: {name: app, labels: {istio.io/use-waypoint: waypoint}}
---
apiVersion: v1
kind: Namespace
metadata: {name: other}
---
apiVersion: gateway.networking.k8s.io/v1
kind: GatewayClass
metadata: {name: istio-waypoint}
spec: {controllerName: istio.io/mesh-controller}
---
apiVersion: gateway.networking.k8s.io/v1
kind: Gateway
metadata: {name: waypoint, namespace: app}
spec:
  gatewayClassName: istio-waypoint
  listeners: [{name: mesh, port: 15008, protocol: HBONE}]
status:
  addresses: [{type: Hostname, value: waypoint.app.svc.cluster.local}]
---
apiVersion: v1
kind: Service
metadata: {name: b, namespace: app}
spec: {clusterIP: 10.96.0.10, ports: [{name: http, port: 80}]}
---
apiVersion: v1
kind: Service
metadata: {name: c, namespace: app}
spec: {clusterIP: 10.96.0.11, ports: [{name: http, port: 80}, {name: grpc, port: 7070}]}
---
apiVersion: v1
kind: Service
metadata: {name: d, namespace: other}
spec: {clusterIP: 10.96.1.10, ports: [{name: http, port: 8080}]}
"""
KINDS = {
    "Namespace": "namespaces",
    "Service": "services",
    "Gateway": "gateways",
    "GatewayClass": "gateway_classes",
    "VirtualService": "virtual_services",
    "HTTPRoute": "http_routes",
    "ConfigMap": "config_maps",
}
B = BackendService("app", "b.app.svc.cluster.local", 80)
C = BackendService("app", "c.app.svc.cluster.local", 80)

# Upstream's objects, with {{.Destination}} = b and applied in namespace app (t.ConfigIstio().Eval(apps.Namespace)).
SET_HEADER = """apiVersion: networking.istio.io/v1
kind: VirtualService
metadata:
  name: route
spec:
  hosts:
  - "b"
  http:
  - headers:
      request:
        add:
          istio-custom-header: user-defined-value
    route:
    - destination:
        host: "b"
"""
SUBSET = """apiVersion: networking.istio.io/v1
kind: VirtualService
metadata:
  name: route
spec:
  hosts:
  - "b"
  http:
  - route:
    - destination:
        host: "b"
        subset: v1
"""
TRAFFIC_SPLIT = """apiVersion: networking.istio.io/v1
kind: VirtualService
metadata:
  name: route
spec:
  hosts:
  - "b"
  http:
  - match:
    - headers:
        user:
          exact: istio-custom-user
    route:
    - destination:
        host: "b"
        subset: v2
  - route:
    - destination:
        host: "b"
        subset: v1
"""


# Upstream's object from istio tests/integration/pilot/common/routing.go ("cors"), {{ .dstSvc }} = b.
CORS = """apiVersion: networking.istio.io/v1
kind: VirtualService
metadata:
  name: default
spec:
  hosts:
    - b
  http:
  - corsPolicy:
      allowOrigins:
      - exact: cors.com
      allowMethods:
      - POST
      - GET
      allowCredentials: false
      allowHeaders:
      - X-Foo-Bar
      - X-Foo-Baz
      maxAge: "24h"
    route:
    - destination:
        host: b
"""


def translate(*documents: str | Obj) -> Translation:
    objects: list[Obj] = [d for d in yaml.safe_load_all(CLUSTER) if d]
    for document in documents:
        if isinstance(document, str):
            loaded = yaml.safe_load(document)
            loaded.setdefault("metadata", {}).setdefault("namespace", "app")
            objects.append(loaded)
        else:
            objects.append(document)
    inputs: dict[str, list[Obj]] = {name: [] for name in KINDS.values()}
    for obj in objects:
        inputs[KINDS[obj["kind"]]].append(obj)
    translation = translate_all(pods=(), endpoint_slices=(), **inputs)  # type: ignore[arg-type]
    for config in translation.waypoint_configs:  # what reaches a waypoint is what its decoder accepts
        assert decode_waypoint_config(config.waypoint, pack_waypoint_config(waypoint_config_to_proto(config))) == config
    return translation


def table(translation: Translation, service: str = "app/b.app.svc.cluster.local", port: int = 80) -> RouteTable:
    (config,) = translation.waypoint_configs
    found = config.find_table(service, port)
    assert found is not None
    return found


def vs(name: str = "route", namespace: str = "app", created: str = "", **spec: Any) -> Obj:
    meta: Obj = {"name": name, "namespace": namespace}
    if created:
        meta["creationTimestamp"] = created
    return {"apiVersion": "networking.istio.io/v1", "kind": "VirtualService", "metadata": meta, "spec": spec}


def to(host: str = "b", **extra: Any) -> Obj:
    return {"destination": {"host": host, **extra}}


def test_upstream_set_header_adds_the_header_on_every_request_to_the_service() -> None:
    (rule,) = table(translate(SET_HEADER)).http
    assert rule.route == "VirtualService/app/route"
    assert rule.match == RouteMatch()
    assert rule.request_headers == HeaderModifier(add=(("istio-custom-header", "user-defined-value"),))
    assert rule.backends == (WeightedBackend(B, 100),)
    assert rule.retry == RetryPolicy()
    assert rule.missing_backend_status == 503


def test_upstream_subset_routes_every_request_to_the_v1_subset() -> None:
    (rule,) = table(translate(SUBSET)).http
    assert rule.backends == (WeightedBackend(BackendService("app", "b.app.svc.cluster.local", 80, "v1"), 100),)


def test_upstream_traffic_split_keeps_written_order_header_match_first() -> None:
    first, second = table(translate(TRAFFIC_SPLIT)).http
    assert first.match == RouteMatch(headers=(ValueMatch("user", "istio-custom-user"),))
    assert first.backends[0].backend == BackendService("app", "b.app.svc.cluster.local", 80, "v2")
    assert second.match == RouteMatch()
    assert second.backends[0].backend == BackendService("app", "b.app.svc.cluster.local", 80, "v1")


def test_other_services_on_the_waypoint_keep_the_default_route() -> None:
    assert table(translate(SET_HEADER), "app/c.app.svc.cluster.local").http == ()


def test_hosts_match_short_names_fqdns_and_wildcards() -> None:
    for host in ("b", "b.app.svc.cluster.local", "*.app.svc.cluster.local", "*"):
        assert table(translate(vs(hosts=[host], http=[{"route": [to()]}]))).http, host
    assert not table(translate(vs(hosts=["b.other.svc.cluster.local"], http=[{"route": [to()]}]))).http
    assert host_matches("*.example.com", "*.a.example.com")
    assert not host_matches("*.a.example.com", "*.example.com")
    assert host_matches("a.example.com", "*.example.com")


def test_a_virtual_service_bound_to_a_gateway_only_does_not_apply_at_the_waypoint() -> None:
    assert not table(translate(vs(hosts=["b"], gateways=["istio-system/ingress"], http=[{"route": [to()]}]))).http
    assert table(translate(vs(hosts=["b"], gateways=["ingress", "mesh"], http=[{"route": [to()]}]))).http


def test_only_the_services_or_the_waypoints_namespace_may_route_and_export_to_counts() -> None:
    elsewhere = vs(
        namespace="other", hosts=["b.app.svc.cluster.local"], http=[{"route": [to("b.app.svc.cluster.local")]}]
    )
    assert not table(translate(elsewhere)).http
    hidden = vs(hosts=["b"], exportTo=["other"], http=[{"route": [to()]}])
    assert not table(translate(hidden)).http
    own = vs(hosts=["b"], exportTo=["."], http=[{"route": [to()]}])
    assert table(translate(own)).http


def mesh_config(text: str) -> Obj:
    """The ``istio`` ConfigMap of the control plane's namespace with ``text`` as its ``mesh``."""
    meta = {"name": "istio", "namespace": "istio-system"}
    return {"apiVersion": "v1", "kind": "ConfigMap", "metadata": meta, "data": {"mesh": text}}


def test_the_mesh_default_export_to_applies_to_a_virtual_service_without_one() -> None:
    plain = vs(hosts=["b"], http=[{"route": [to()]}])
    assert not table(translate(plain, mesh_config("defaultVirtualServiceExportTo: [other]"))).http
    assert table(translate(plain, mesh_config("defaultVirtualServiceExportTo: ['.']"))).http
    # Its own exportTo wins over the default; another default (ServiceEntries') changes nothing here.
    own = vs(hosts=["b"], exportTo=["*"], http=[{"route": [to()]}])
    assert table(translate(own, mesh_config("defaultVirtualServiceExportTo: [other]"))).http
    assert table(translate(plain, mesh_config("defaultServiceExportTo: [other]"))).http


def test_several_virtual_services_concatenate_in_istiods_order_with_httproutes() -> None:
    """Exported only to the waypoint's namespace first, then HTTPRoutes there, then public ones oldest first."""
    young = vs("young", created="2026-02-01T00:00:00Z", hosts=["b"], http=[{"route": [to("c")]}])
    old = vs(
        "old",
        created="2026-01-01T00:00:00Z",
        hosts=["b"],
        http=[{"match": [{"uri": {"prefix": "/old"}}], "route": [to()]}],
    )
    private = vs(
        "private",
        created="2027-01-01T00:00:00Z",
        hosts=["b"],
        exportTo=["."],
        http=[{"match": [{"uri": {"prefix": "/p"}}], "route": [to()]}],
    )
    route = {
        "apiVersion": "gateway.networking.k8s.io/v1",
        "kind": "HTTPRoute",
        "metadata": {"name": "r", "namespace": "app", "creationTimestamp": "2026-01-15T00:00:00Z"},
        "spec": {
            "parentRefs": [{"group": "", "kind": "Service", "name": "b"}],
            "rules": [
                {"matches": [{"path": {"type": "Exact", "value": "/gw"}}], "backendRefs": [{"name": "c", "port": 80}]}
            ],
        },
    }
    rules = table(translate(young, old, route, private)).http
    assert [r.route for r in rules] == [
        "VirtualService/app/private",
        "HTTPRoute/app/r",
        "VirtualService/app/old",
        "VirtualService/app/young",
    ]


def test_a_rule_without_match_ends_the_virtual_service() -> None:
    spec = {"hosts": ["b"], "http": [{"route": [to()]}, {"match": [{"uri": {"exact": "/never"}}], "route": [to("c")]}]}
    assert len(table(translate(vs(**spec))).http) == 1


def test_matches_that_cannot_hold_at_a_waypoint_are_dropped_never_widened() -> None:
    matches = [
        {"sourceLabels": {"app": "a"}, "uri": {"exact": "/labels"}},
        {"gateways": ["ingress"], "uri": {"exact": "/gateway"}},
        {"port": 7070, "uri": {"exact": "/port"}},
        {"sourceNamespace": "app", "uri": {"exact": "/ns"}},
        {"uri": {"exact": "/kept"}},
    ]
    rules = table(translate(vs(hosts=["b"], http=[{"match": matches, "route": [to()]}]))).http
    assert [r.match.path for r in rules] == [PathMatch(PathMatchType.EXACT, "/kept")]
    only_labels = vs(hosts=["b"], http=[{"match": [{"sourceLabels": {"app": "a"}}], "route": [to()]}])
    assert table(translate(only_labels)).http == ()


def test_a_port_match_selects_the_table_of_that_port() -> None:
    spec = {"hosts": ["c"], "http": [{"match": [{"port": 7070}], "route": [to("c")]}]}
    translation = translate(vs(**spec))
    assert table(translation, "app/c.app.svc.cluster.local", 80).http == ()
    (rule,) = table(translation, "app/c.app.svc.cluster.local", 7070).http
    assert rule.backends[0].backend == BackendService("app", "c.app.svc.cluster.local", 7070)


def test_string_matches_translate_kind_by_kind() -> None:
    match = {
        "uri": {"prefix": "/api"},
        "ignoreUriCase": True,
        "headers": {"X-Exact": {"exact": "a"}, "x-prefix": {"prefix": "b"}, "x-regex": {"regex": "c+"}, "x-any": {}},
        "queryParams": {"q": {"exact": "1"}},
        "withoutHeaders": {"x-debug": {}},
        "method": {"exact": "POST"},
        "authority": {"prefix": "b."},
    }
    (rule,) = table(translate(vs(hosts=["b"], http=[{"match": [match], "route": [to()]}]))).http
    assert rule.match == RouteMatch(
        path=PathMatch(PathMatchType.PREFIX, "/api"),
        headers=(
            ValueMatch("x-any", "", ValueMatchType.PRESENT),
            ValueMatch("x-exact", "a"),
            ValueMatch("x-prefix", "b", ValueMatchType.PREFIX),
            ValueMatch("x-regex", "c+", ValueMatchType.REGULAR_EXPRESSION),
            ValueMatch("host", "b.", ValueMatchType.PREFIX),
        ),
        query_params=(ValueMatch("q", "1"),),
        method="POST",
        ignore_path_case=True,
        without_headers=(ValueMatch("x-debug", "", ValueMatchType.PRESENT),),
    )


def test_unknown_destination_answers_503_and_weights_split_without_zero_weights() -> None:
    spec = {
        "hosts": ["b"],
        "http": [{"route": [to("nowhere"), {**to(), "weight": 0}, {**to("c"), "weight": 30}, {**to(), "weight": 70}]}],
    }
    (rule,) = table(translate(vs(**spec))).http
    assert rule.backends == (WeightedBackend(C, 30), WeightedBackend(B, 70))
    single = vs(hosts=["b"], http=[{"route": [to("nowhere")]}])
    (missing,) = table(translate(single)).http
    assert missing.backends == (WeightedBackend(None, 100),) and missing.missing_backend_status == 503


def test_redirect_direct_response_and_fault_translate() -> None:
    http = [
        {
            "match": [{"uri": {"exact": "/r"}}],
            "redirect": {"uri": "/new", "authority": "x.example", "redirectCode": 308},
        },
        {"match": [{"uri": {"exact": "/d"}}], "directResponse": {"status": 418, "body": {"string": "teapot"}}},
        {
            "match": [{"uri": {"exact": "/f"}}],
            "fault": {"delay": {"fixedDelay": "50ms", "percentage": {"value": 10}}, "abort": {"httpStatus": 503}},
            "route": [to()],
        },
    ]
    redirect, direct, fault = table(translate(vs(hosts=["b"], http=http))).http
    assert redirect.redirect == RequestRedirect(
        hostname="x.example",
        path=PathModifier(PathModifierType.REPLACE_FULL_PATH, "/new"),
        status_code=308,
        keeps_host_port=True,
    )
    assert direct.direct_response == DirectResponse(418, b"teapot")
    assert fault.fault == Fault(delay=0.05, delay_percent=10.0, abort_status=503, abort_percent=100.0)


FAULT_ABORT_GRPC = """apiVersion: networking.istio.io/v1
kind: VirtualService
metadata:
  name: default
spec:
  hosts:
  - b
  http:
  - route:
    - destination:
        host: b
    fault:
      abort:
        percentage:
          value: 100
        grpcStatus: "UNAVAILABLE"
"""


def test_upstream_grpc_fault_abort_translates_to_its_status_code() -> None:
    """istio tests/integration/pilot/common routing.go "fault abort gRPC" (expects gRPC status UNAVAILABLE)."""
    translation = translate(FAULT_ABORT_GRPC)
    (rule,) = table(translation).http
    assert rule.fault == Fault(delay_percent=100.0, abort_percent=100.0, abort_grpc_status=14)
    assert not [s for s in translation.skipped if s.kind == "VirtualService"]


@pytest.mark.parametrize(
    ("abort", "field"),
    [
        ({"grpcStatus": "BAD_STATUS"}, "spec.http[0].fault.abort.grpcStatus"),
        ({"grpcStatus": 14}, "spec.http[0].fault.abort.grpcStatus"),
        ({"grpcStatus": "unavailable"}, "spec.http[0].fault.abort.grpcStatus"),
        ({"grpcStatus": "UNAVAILABLE", "httpStatus": 503}, "spec.http[0].fault.abort"),
    ],
)
def test_a_bad_grpc_fault_abort_drops_the_rule_and_names_the_field(abort: Obj, field: str) -> None:
    http = [{"route": [to()], "fault": {"abort": abort}}, {"route": [to("c")]}]
    translation = translate(vs(hosts=["b"], http=http))
    (rule,) = table(translation).http
    assert rule.backends == (WeightedBackend(C, 100),)
    assert field in {s.field for s in translation.skipped if s.kind == "VirtualService"}


@pytest.mark.parametrize(
    ("retry_on", "codes", "connect"),
    [
        ("gateway-error", (502, 503, 504), True),  # Envoy's wouldRetryFromReset: 5xx and gateway-error both retry
        ("5xx", tuple(range(500, 600)), True),
        ("retriable-status-codes,503", (503,), False),
        ("409,retriable-4xx", (409,), False),
        ("reset", (), True),
    ],
)
def test_retry_conditions_retry_on_an_upstream_reset_as_envoy_does(
    retry_on: str, codes: tuple[int, ...], connect: bool
) -> None:
    rule_spec = {"retries": {"attempts": 1, "retryOn": retry_on}, "route": [to()]}
    (rule,) = table(translate(vs(hosts=["b"], http=[rule_spec]))).http
    assert rule.retry == RetryPolicy(attempts=1, codes=codes, on_connect_failure=connect)


def test_retry_backoff_is_the_base_interval_with_or_without_retry_on() -> None:
    for retries, expected in (
        ({"attempts": 3, "backoff": "100ms"}, RetryPolicy(attempts=3, backoff=0.1)),
        ({"attempts": 3, "backoff": "1s", "retryOn": "gateway-error"}, RetryPolicy(3, (502, 503, 504), 1.0, True)),
        ({"attempts": 3}, RetryPolicy(attempts=3, backoff=0.025)),
    ):
        (rule,) = table(translate(vs(hosts=["b"], http=[{"retries": retries, "route": [to()]}]))).http
        assert rule.retry == expected, retries


def test_rewrite_timeout_retries_mirrors_and_headers_translate() -> None:
    rule_spec = {
        "match": [{"uri": {"prefix": "/old"}}],
        "rewrite": {"uri": "/new", "authority": "c.app"},
        "timeout": "2.5s",
        "retries": {"attempts": 3, "perTryTimeout": "500ms", "retryOn": "gateway-error,connect-failure,409"},
        "mirror": {"host": "c"},
        "mirrorPercentage": {"value": 25.5},
        "mirrors": [{"destination": {"host": "b"}, "percentage": {"value": 0}}],
        "headers": {
            "request": {"set": {"x-a": "1", ":authority": "ignored"}, "remove": ["x-b", "host"]},
            "response": {"add": {"x-c": "2"}},
        },
        "route": [{**to(), "headers": {"request": {"add": {"x-d": "3"}}}}],
    }
    (rule,) = table(translate(vs(hosts=["b"], http=[rule_spec]))).http
    assert rule.rewrite == URLRewrite("c.app", PathModifier(PathModifierType.REPLACE_PREFIX_MATCH, "/new"))
    assert rule.timeouts == Timeouts(request=2.5, backend_request=0.5)
    assert rule.retry == RetryPolicy(attempts=3, codes=(409, 502, 503, 504), on_connect_failure=True)
    assert rule.mirrors == (RequestMirror(C, 25.5),)
    assert rule.request_headers == HeaderModifier(set=(("x-a", "1"),), add=(("x-d", "3"),), remove=("x-b",))
    assert rule.response_headers == HeaderModifier(add=(("x-c", "2"),))
    regex = {
        "match": [{"uri": {"regex": "/v1/.*"}}],
        "rewrite": {"uriRegexRewrite": {"match": "^/v1/(.*)", "rewrite": "/v2/\\1"}},
    }
    (rewritten,) = table(translate(vs(hosts=["b"], http=[{**regex, "route": [to()]}]))).http
    assert rewritten.regex_rewrite == RegexRewrite("^/v1/(.*)", "/v2/\\1")


def test_tcp_and_tls_rules_become_the_tables_connection_backends() -> None:
    tcp = vs(hosts=["c"], tcp=[{"match": [{"port": 7070}], "route": [to("b", port={"number": 80})]}])
    translation = translate(tcp)
    assert table(translation, "app/c.app.svc.cluster.local", 7070).tcp_backends == (WeightedBackend(B, 100),)
    assert table(translation, "app/c.app.svc.cluster.local", 80).tcp_backends == ()
    tls = vs(
        "tls",
        created="2027-01-01T00:00:00Z",
        hosts=["c"],
        tls=[{"match": [{"sniHosts": ["c.app.svc.cluster.local"]}], "route": [to("c")]}],
    )
    older_tcp = vs("tcp", created="2026-01-01T00:00:00Z", hosts=["c"], tcp=[{"route": [to("b")]}])
    translation = translate(older_tcp, tls)
    assert table(translation, "app/c.app.svc.cluster.local", 80).tcp_backends == (WeightedBackend(C, 100),)
    other_sni = vs(hosts=["c"], tls=[{"match": [{"sniHosts": ["x.example"]}], "route": [to("c")]}])
    assert table(translate(other_sni), "app/c.app.svc.cluster.local", 80).tcp_backends == ()


def test_upstream_cors_policy_translates_as_istiods_translate_cors_policy() -> None:
    translation = translate(CORS)
    (rule,) = table(translation).http
    assert rule.cors == CorsPolicy(
        allow_origins=(ValueMatch("origin", "cors.com"),),
        allow_methods="POST,GET",
        allow_headers="X-Foo-Bar,X-Foo-Baz",
        max_age=86400,
    )
    assert rule.backends == (WeightedBackend(B, 100),)
    assert not [s for s in translation.skipped if "cors" in s.field.lower()]


def test_cors_origin_kinds_expose_headers_credentials_and_unmatched_preflights_translate() -> None:
    policy = {
        "allowOrigins": [
            {"exact": "https://a.example"},
            {"prefix": "https://b."},
            {"regex": "https://.*\\.c\\.example"},
        ],
        "exposeHeaders": ["X-Trace", "X-Other"],
        "allowCredentials": True,
        "unmatchedPreflights": "IGNORE",
    }
    legacy = {"allowOrigin": ["https://old.example"], "maxAge": "90s", "unmatchedPreflights": "FORWARD"}
    http = [
        {"match": [{"uri": {"prefix": "/a"}}], "corsPolicy": policy, "route": [to()]},
        {"corsPolicy": legacy, "route": [to()]},
    ]
    first, second = table(translate(vs(hosts=["b"], http=http))).http
    assert first.cors == CorsPolicy(
        allow_origins=(
            ValueMatch("origin", "https://a.example"),
            ValueMatch("origin", "https://b.", ValueMatchType.PREFIX),
            ValueMatch("origin", "https://.*\\.c\\.example", ValueMatchType.REGULAR_EXPRESSION),
        ),
        expose_headers="X-Trace,X-Other",
        allow_credentials=True,
        forward_unmatched_preflights=False,
    )
    assert second.cors == CorsPolicy(allow_origins=(ValueMatch("origin", "https://old.example"),), max_age=90)


def test_bad_cors_values_drop_the_rule_and_say_which_field() -> None:
    bad = [
        {"allowOrigins": [{}]},
        {"allowOrigins": [{"regex": "(?=x)"}]},
        {"allowMethods": ["FETCH"]},
        {"allowHeaders": ["X Bad"]},
        {"exposeHeaders": ["a\r\nb"]},
        {"maxAge": "1.5s"},
        {"allowCredentials": "yes"},
        {"unmatchedPreflights": "DROP"},
        "not a policy",
    ]
    http = [{"match": [{"uri": {"exact": f"/{i}"}}], "corsPolicy": p, "route": [to()]} for i, p in enumerate(bad)]
    translation = translate(vs(hosts=["b"], http=[*http, {"route": [to()]}]))
    (rule,) = table(translation).http
    assert rule.cors is None
    fields = {s.field for s in translation.skipped if s.kind == "VirtualService"}
    assert fields >= {
        "spec.http[0].corsPolicy.allowOrigins[0]",
        "spec.http[1].corsPolicy.allowOrigins[0].regex",
        "spec.http[2].corsPolicy.allowMethods[0]",
        "spec.http[3].corsPolicy.allowHeaders[0]",
        "spec.http[4].corsPolicy.exposeHeaders[0]",
        "spec.http[5].corsPolicy.maxAge",
        "spec.http[6].corsPolicy.allowCredentials",
        "spec.http[7].corsPolicy.unmatchedPreflights",
        "spec.http[8].corsPolicy",
    }


def test_bad_content_drops_the_rule_or_match_and_says_which_field() -> None:
    http = [
        {"match": [{"uri": {"exact": "/s"}}], "route": [to(subset="V_1")]},
        {"match": [{"uri": {"exact": "/w"}}], "route": [{**to(), "weight": 2**40}, {**to("c"), "weight": 1}]},
        {"match": [{"uri": {"exact": "/t"}}], "timeout": "99999999999h", "route": [to()]},
        {"match": [{"uri": {"exact": "/r"}}], "retries": {"attempts": 1, "retryOn": "99999"}, "route": [to()]},
        {"match": [{"uri": {"exact": "no-slash"}}], "route": [to()]},
        {"match": [{"method": {"exact": ""}}], "route": [to()]},
        {"match": [{"queryParams": {"": {"exact": "x"}}}], "route": [to()]},
        {"match": [{"uri": {"regex": "(?=look)"}}, {"uri": {"exact": "/ok"}}], "route": [to()]},
        {"match": [{"uri": {"exact": "/t"}}], "timeout": "soon", "route": [to()]},
        {"match": [{"headers": {"@request.auth.claims": {"exact": "a"}}}], "route": [to()]},
        {"match": [{"uri": {"exact": "/h"}}], "headers": {"request": {"set": {"x": "a\r\nb"}}}, "route": [to()]},
        {
            "match": [{"uri": {"exact": "/u"}}],
            "rewrite": {"uriRegexRewrite": {"match": "(a", "rewrite": "b"}},
            "route": [to()],
        },
        "not a rule",
    ]
    translation = translate(vs(hosts=["b"], http=http))
    (rule,) = table(translation).http
    assert rule.match.path == PathMatch(PathMatchType.EXACT, "/ok")
    fields = {s.field for s in translation.skipped if s.kind == "VirtualService"}
    assert fields >= {
        "spec.http[0].route[0].destination.subset",
        "spec.http[1].route[0].weight",
        "spec.http[2].timeout",
        "spec.http[3].retries.retryOn",
        "spec.http[4].match[0].uri.exact",
        "spec.http[5].match[0].method",
        "spec.http[6].match[0].queryParams",
        "spec.http[7].match[0].uri.regex",
        "spec.http[8].timeout",
        "spec.http[9].match[0].headers.@request.auth.claims",
        "spec.http[10].headers.request.set.x",
        "spec.http[11].rewrite.uriRegexRewrite.match",
        "spec.http[12]",
    }


@pytest.mark.parametrize(
    ("rule", "field"),
    [
        ({"match": [{"headers": {"x-team\n": {"exact": "a"}}}]}, "spec.http[0].match[0].headers"),
        ({"headers": {"request": {"set": {"x-team\n": "a"}}}}, "spec.http[0].headers.request.set"),
        ({"headers": {"response": {"add": {"x-team\n": "a"}}}}, "spec.http[0].headers.response.add"),
        ({"corsPolicy": {"allowHeaders": ["x-team\n"]}}, "spec.http[0].corsPolicy.allowHeaders[0]"),
        ({"corsPolicy": {"exposeHeaders": ["x-team\n"]}}, "spec.http[0].corsPolicy.exposeHeaders[0]"),
    ],
)
def test_a_header_name_ending_in_a_newline_drops_the_rule_and_says_which_field(rule: Obj, field: str) -> None:
    """``$`` also matches before a final newline: a ``^token$`` check with ``match`` would let ``x-team\\n`` in."""
    translation = translate(vs(hosts=["b"], http=[{**rule, "route": [to()]}, {"route": [to("c")]}]))
    (kept,) = table(translation).http
    assert kept.backends == (WeightedBackend(C, 100),)
    assert field in {s.field for s in translation.skipped if s.kind == "VirtualService"}


def test_a_header_name_ending_in_a_newline_is_never_removed() -> None:
    translation = translate(vs(hosts=["b"], http=[{"headers": {"request": {"remove": ["x-team\n"]}}, "route": [to()]}]))
    (rule,) = table(translation).http
    assert rule.request_headers is None  # like a pseudo-header: not a name a request can carry, nothing to remove


JSON = st.recursive(
    st.none()
    | st.booleans()
    | st.integers(-5, 70000)
    | st.text(max_size=8)
    | st.sampled_from(["b", "*", "c", "1s", "/"]),
    lambda children: st.lists(children, max_size=3) | st.dictionaries(st.text(max_size=6), children, max_size=4),
    max_leaves=20,
)
FIELDS = st.sampled_from(
    [
        *("match", "route", "redirect", "directResponse", "headers", "rewrite", "timeout", "retries", "fault"),
        *("mirror", "mirrors", "mirrorPercentage", "uri", "weight", "destination", "host", "port", "exact"),
        *("prefix", "regex", "request", "set", "add", "remove", "percentage", "value", "status", "body"),
        *("withoutHeaders", "tcp", "corsPolicy", "allowOrigins", "allowOrigin", "allowMethods", "allowHeaders"),
        *("exposeHeaders", "maxAge", "allowCredentials", "unmatchedPreflights"),
    ]
)
SHAPED = st.recursive(
    JSON,
    lambda children: st.lists(children, max_size=3) | st.dictionaries(FIELDS, children, max_size=4),
    max_leaves=30,
)


@settings(max_examples=150, deadline=None)
@given(http=SHAPED, tcp=JSON, hosts=st.one_of(JSON, st.just(["b"])), exports=JSON)
def test_arbitrary_virtual_services_never_break_the_translation(http: Any, tcp: Any, hosts: Any, exports: Any) -> None:
    """Nothing raises, and whatever reaches a table is accepted by the waypoint's decoder: a hostile
    VirtualService never makes a waypoint refuse (NACK) its whole config."""
    obj = vs(hosts=hosts, http=http, tcp=tcp, tls=tcp, exportTo=exports)
    translate(obj)  # which checks every config against the waypoint's decoder
    translate(vs(hosts=["b"], http=http if isinstance(http, list) else [http]))


def test_a_hostile_wildcard_virtual_service_is_bounded_per_table_and_translates_quickly() -> None:
    """Attack: one VirtualService for ``*`` with 2,000 rules in the waypoint's namespace applies to every Service
    there. Each table takes its first MAX_ENTRIES entries (reported), and the rules are converted once per port."""
    services = [
        {"apiVersion": "v1", "kind": "Service", "metadata": {"name": f"s{i}", "namespace": "app"},
         "spec": {"clusterIP": f"10.96.2.{i + 1}", "ports": [{"name": "http", "port": 80}]}}
        for i in range(20)
    ]  # fmt: skip
    rules = [{"match": [{"uri": {"prefix": f"/{j}"}}], "route": [to()]} for j in range(2000)]
    started = time.perf_counter()
    translation = translate(vs(hosts=["*"], http=rules), *services)
    elapsed = time.perf_counter() - started
    kept = table(translation, "app/s7.app.svc.cluster.local").http
    assert len(kept) == MAX_ENTRIES and kept[-1].match.path == PathMatch(PathMatchType.PREFIX, f"/{MAX_ENTRIES - 1}")
    assert any(s.field == "spec.http" and "at most" in s.reason for s in translation.skipped)
    assert elapsed < 30.0, elapsed  # a few seconds here, most of it the decoder check in translate()


def test_entries_past_the_bound_are_cut_in_order_across_virtual_services() -> None:
    first = vs(
        "a",
        created="2026-01-01T00:00:00Z",
        hosts=["b"],
        http=[{"match": [{"uri": {"prefix": f"/a{j}"}}], "route": [to()]} for j in range(MAX_ENTRIES - 1)],
    )
    second = vs(
        "z",
        created="2026-02-01T00:00:00Z",
        hosts=["b"],
        http=[{"match": [{"uri": {"prefix": "/z1"}}, {"uri": {"prefix": "/z2"}}], "route": [to()]}],
    )
    translation = translate(first, second)
    rules = table(translation).http
    assert len(rules) == MAX_ENTRIES and rules[-1].route == "VirtualService/app/z"
    assert rules[-1].match.path == PathMatch(PathMatchType.PREFIX, "/z1")
    assert [(s.name, s.field) for s in translation.skipped if "at most" in s.reason] == [("z", "spec.http")]


def test_jwt_claim_headers_become_claim_matches_in_both_of_istios_forms() -> None:
    # upstream routing.go jwtClaimRoute: "." separators, and "usage2" with brackets; withoutHeaders too.
    match = {
        "headers": {
            "@request.auth.claims.nested.key1": {"exact": "valueA"},
            "@request.auth.claims[sub]": {"prefix": "sub"},
            "x-plain": {"exact": "1"},
        },
        "withoutHeaders": {"@request.auth.claims[nested][nested-2][key1]": {"regex": "value[AB]"}},
    }
    (rule,) = table(translate(vs(hosts=["b"], http=[{"match": [match], "route": [to()]}]))).http
    assert rule.match.headers == (ValueMatch("x-plain", "1"),)
    assert rule.match.claims == (
        ClaimMatch(("nested", "key1"), "valueA"),
        ClaimMatch(("sub",), "sub", ValueMatchType.PREFIX),
    )
    assert rule.match.without_claims == (
        ClaimMatch(("nested", "nested-2", "key1"), "value[AB]", ValueMatchType.REGULAR_EXPRESSION),
    )


@pytest.mark.parametrize(
    "name", ["@request.auth.claims", "@request.auth.claims.", "@request.auth.claims[]", "@request.auth.claims.a..b"]
)
def test_a_claim_header_naming_no_claim_drops_its_entry(name: str) -> None:
    translation = translate(vs(hosts=["b"], http=[{"match": [{"headers": {name: {"exact": "x"}}}], "route": [to()]}]))
    (config,) = translation.waypoint_configs
    found = config.find_table("app/b.app.svc.cluster.local", 80)
    assert found is None or not found.http
    fields = [s.field for s in translation.skipped if s.kind == "VirtualService"]
    assert fields == [f"spec.http[0].match[0].headers.{name}"]


def test_a_scheme_match_becomes_a_header_match_on_the_scheme() -> None:
    # upstream routing.go "HTTP scheme match": istiod writes match.scheme as a :scheme header match
    match = {"scheme": {"exact": "http"}, "uri": {"prefix": "/"}}
    (rule,) = table(translate(vs(hosts=["b"], http=[{"match": [match], "route": [to()]}]))).http
    assert rule.match.headers == (ValueMatch(":scheme", "http"),)


def test_a_host_set_on_one_of_several_destinations_is_that_destinations_own_authority() -> None:
    # upstream routing.go "set host header multi destination" / "... in route and multi destination"
    def routes(**rule: Any) -> list[Obj]:
        dest = {"headers": {"request": {"set": {"Host": "dest-authority"}}}, "weight": 50}
        return [{"route": [{"destination": {"host": "b"}, **dest}, {"destination": {"host": "b"}, **dest}], **rule}]

    (rule,) = table(translate(vs(hosts=["b"], http=routes()))).http
    assert [b.request_headers for b in rule.backends] == [HeaderModifier(set=(("host", "dest-authority"),))] * 2
    route_level = {"headers": {"request": {"set": {":authority": "route-authority"}}}}
    (rule,) = table(translate(vs(hosts=["b"], http=routes(**route_level)))).http
    assert [b.request_headers for b in rule.backends] == [None, None]
    assert rule.rewrite is not None and rule.rewrite.hostname == "route-authority"


@settings(max_examples=150, deadline=None)
@given(
    suffix=st.text(st.sampled_from(".[]ab@/- \x00\u00e9"), max_size=40),
    prefix=st.sampled_from(["@request.auth.claims", "@REQUEST.AUTH.CLAIMS", "@request.auth.claim"]),
)
def test_any_claim_header_name_is_a_claim_match_of_printable_names_or_its_entry_is_dropped(
    prefix: str, suffix: str
) -> None:
    name = prefix + suffix
    http = [{"match": [{"headers": {name: {"exact": "v"}}}], "route": [to()]}]
    translation = translate(vs(hosts=["b"], http=http))  # never raises; what reaches the waypoint decodes
    (config,) = translation.waypoint_configs
    found = config.find_table("app/b.app.svc.cluster.local", 80)
    rules = found.http if found is not None else ()
    for rule in rules:
        for claim in rule.match.claims:
            assert 0 < len(claim.path) <= 16 and all(step and step.isprintable() for step in claim.path)
    if not rules:
        assert [s.field for s in translation.skipped if s.kind == "VirtualService"]
