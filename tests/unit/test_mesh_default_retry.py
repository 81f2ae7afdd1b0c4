"""The mesh config's ``defaultHttpRetryPolicy``: parsed as istiod reads an ``HTTPRetry``
(:mod:`ambit.controlplane.translate.meshconfig` rule 10), given to every route rule that states no retries (a
VirtualService's at a waypoint and at an Istio Gateway, an HTTPRoute's, a GRPCRoute's), carried to the waypoints
in their WaypointConfig, and applied by the engine to the default route (istiod's ``TranslateRoute`` and
``BuildDefaultHTTPOutboundRoute``)."""

from __future__ import annotations

from typing import Any

import pytest
import yaml
from hypothesis import given, settings
from hypothesis import strategies as st

from ambit.controlplane.translate import Translation, translate_all
from ambit.controlplane.translate.meshconfig import (
    DEFAULT_MESH_CONFIG,
    MeshConfigError,
    MeshConfigMemo,
    mesh_config_of,
    parse_mesh_config,
)
from ambit.controlplane.translate.routerules import convert_route
from ambit.controlplane.translate.skips import Skipped
from ambit.model.route_matches import RouteMatch
from ambit.model.routes import (
    ISTIO_RETRY,
    BackendService,
    HttpRetry,
    RetryPolicy,
    RouteRule,
    RouteTable,
    Timeouts,
    WaypointConfig,
    WeightedBackend,
)
from ambit.waypoint.config import RouteConfig
from ambit.waypoint.decisions import Forward, RequestHead
from ambit.waypoint.routing import route
from ambit.xds.routes import decode_waypoint_config, pack_waypoint_config, waypoint_config_to_proto

Obj = dict[str, Any]

NO_RETRIES = "defaultHttpRetryPolicy:\n  attempts: 0\n"
FIVE_TRIES = """defaultHttpRetryPolicy:
  attempts: 4
  perTryTimeout: 1.5s
  retryOn: gateway-error,connect-failure
"""
FIVE = HttpRetry(RetryPolicy(attempts=4, codes=(502, 503, 504), on_connect_failure=True), 1.5)


# --- parsing ------------------------------------------------------------------------------------------------------


def test_istios_shape_gives_the_policy_and_its_per_try_timeout() -> None:
    assert parse_mesh_config(FIVE_TRIES).default_http_retry == FIVE
    snake = FIVE_TRIES.replace("defaultHttpRetryPolicy", "default_http_retry_policy")
    assert parse_mesh_config(snake).default_http_retry == FIVE


@pytest.mark.parametrize("text", ["", "trustDomain: cluster.local", "defaultHttpRetryPolicy: null"])
def test_unset_or_null_is_istios_default(text: str) -> None:
    assert parse_mesh_config(text).default_http_retry == ISTIO_RETRY == HttpRetry(RetryPolicy(), None)


def test_zero_attempts_disables_retries_and_other_fields_read_as_a_virtual_services() -> None:
    assert parse_mesh_config(NO_RETRIES).default_http_retry.policy.attempts == 0
    text = "defaultHttpRetryPolicy: {attempts: 3, backoff: 100ms, retryOn: '503,retriable-4xx,unavailable'}"
    assert parse_mesh_config(text).default_http_retry == HttpRetry(RetryPolicy(3, (409, 503), 0.1, False), None)


@pytest.mark.parametrize(
    ("text", "field"),
    [
        ("defaultHttpRetryPolicy: 3", "defaultHttpRetryPolicy"),
        ("defaultHttpRetryPolicy: {attempts: -1}", "defaultHttpRetryPolicy.attempts"),
        ("defaultHttpRetryPolicy: {attempts: many}", "defaultHttpRetryPolicy.attempts"),
        ("defaultHttpRetryPolicy: {attempts: 101}", "defaultHttpRetryPolicy.attempts"),
        ("defaultHttpRetryPolicy: {attempts: 2, perTryTimeout: soon}", "defaultHttpRetryPolicy.perTryTimeout"),
        ("defaultHttpRetryPolicy: {attempts: 2, retryOn: sometimes}", "defaultHttpRetryPolicy.retryOn"),
        ("defaultHttpRetryPolicy: {attempts: 2, retryOn: '999'}", "defaultHttpRetryPolicy.retryOn"),
    ],
)
def test_a_bad_policy_is_one_line_naming_the_field(text: str, field: str) -> None:
    with pytest.raises(MeshConfigError) as caught:
        parse_mesh_config(text)
    message = str(caught.value)
    assert message.startswith(f"{field}: ") and "\n" not in message


def test_a_bad_edit_keeps_the_previous_default_in_force() -> None:
    def cm(text: str, version: str) -> Obj:
        meta = {"name": "istio", "namespace": "istio-system", "uid": "u", "resourceVersion": version}
        return {"metadata": meta, "data": {"mesh": text}}

    memo = MeshConfigMemo()
    skips: list[Skipped] = []
    good = mesh_config_of([cm(FIVE_TRIES, "1")], namespace="istio-system", memo=memo, skips=skips)
    bad = cm("defaultHttpRetryPolicy: {attempts: 2, retryOn: whenever}", "2")
    assert mesh_config_of([bad], namespace="istio-system", memo=memo, skips=skips).default_http_retry == FIVE
    (problem,) = skips
    assert problem.field == "data.mesh" and "retryOn" in problem.reason and good.default_http_retry == FIVE


_SCALARS = st.one_of(
    st.none(),
    st.booleans(),
    st.integers(-(2**70), 2**70),
    st.floats(allow_nan=True),
    st.text(max_size=30),
    st.sampled_from(["5xx", "gateway-error,503", "1s", "250ms", "-1s", "1e9s", "retriable-4xx, 409 ,"]),
)
_POLICY = st.one_of(
    _SCALARS,
    st.lists(_SCALARS, max_size=3),
    st.dictionaries(
        st.sampled_from(["attempts", "perTryTimeout", "retryOn", "backoff", "retryRemoteLocalities", "x"]),
        st.one_of(_SCALARS, st.lists(_SCALARS, max_size=2), st.dictionaries(st.text(max_size=5), _SCALARS)),
        max_size=5,
    ),
)


@given(_POLICY, st.booleans())
@settings(max_examples=300, deadline=None)
def test_any_policy_gives_a_config_or_a_mesh_config_error(policy: Any, snake: bool) -> None:
    name = "default_http_retry_policy" if snake else "defaultHttpRetryPolicy"
    try:
        text = yaml.safe_dump({name: policy})
    except yaml.YAMLError:
        return
    try:
        mesh = parse_mesh_config(text)
    except MeshConfigError as exc:
        assert "\n" not in str(exc)
        return
    retry = mesh.default_http_retry
    assert 0 <= retry.policy.attempts <= 100
    assert retry.per_try_timeout is None or retry.per_try_timeout > 0


# --- translation --------------------------------------------------------------------------------------------------

CLUSTER = """
apiVersion: v1
kind: Namespace
metadata: {name: shop, labels: {istio.io/use-waypoint: waypoint}}
---
apiVersion: gateway.networking.k8s.io/v1
kind: GatewayClass
metadata: {name: istio-waypoint}
spec: {controllerName: istio.io/mesh-controller}
---
apiVersion: gateway.networking.k8s.io/v1
kind: Gateway
metadata: {name: waypoint, namespace: shop}
spec:
  gatewayClassName: istio-waypoint
  listeners: [{name: mesh, port: 15008, protocol: HBONE}]
status:
  addresses: [{type: Hostname, value: waypoint.shop.svc.cluster.local}]
---
apiVersion: v1
kind: Service
metadata: {name: cart, namespace: shop}
spec: {clusterIP: 10.96.0.20, ports: [{name: http, port: 80}]}
---
apiVersion: v1
kind: Service
metadata: {name: till, namespace: shop}
spec: {clusterIP: 10.96.0.21, ports: [{name: http, port: 80}]}
"""
KINDS = {
    "Namespace": "namespaces",
    "Service": "services",
    "Gateway": "gateways",
    "GatewayClass": "gateway_classes",
    "VirtualService": "virtual_services",
    "HTTPRoute": "http_routes",
    "GRPCRoute": "grpc_routes",
}
CART = "shop/cart.shop.svc.cluster.local"


def translate(mesh: str | None, *objects: Obj) -> WaypointConfig:
    inputs: dict[str, list[Obj]] = {name: [] for name in KINDS.values()}
    for obj in [*(d for d in yaml.safe_load_all(CLUSTER) if d), *objects]:
        inputs[KINDS[obj["kind"]]].append(obj)
    config_maps = []
    if mesh is not None:
        meta = {"name": "istio", "namespace": "istio-system"}
        config_maps.append({"apiVersion": "v1", "kind": "ConfigMap", "metadata": meta, "data": {"mesh": mesh}})
    translation: Translation = translate_all(
        pods=(),
        endpoint_slices=(),
        config_maps=config_maps,
        **inputs,  # type: ignore[arg-type]
    )
    (config,) = translation.waypoint_configs
    # what reaches the waypoint is what its decoder accepts
    assert decode_waypoint_config(config.waypoint, pack_waypoint_config(waypoint_config_to_proto(config))) == config
    return config


def rules(config: WaypointConfig) -> tuple[RouteRule, ...]:
    table = config.find_table(CART, 80)
    assert table is not None
    return table.http


def virtual_service(*http: Obj) -> Obj:
    return {
        "apiVersion": "networking.istio.io/v1",
        "kind": "VirtualService",
        "metadata": {"name": "cart", "namespace": "shop"},
        "spec": {"hosts": ["cart"], "http": list(http)},
    }


def http_route(kind: str = "HTTPRoute", **rule: Any) -> Obj:
    return {
        "apiVersion": "gateway.networking.k8s.io/v1",
        "kind": kind,
        "metadata": {"name": "cart", "namespace": "shop"},
        "spec": {
            "parentRefs": [{"group": "", "kind": "Service", "name": "cart", "port": 80}],
            "rules": [{"backendRefs": [{"name": "cart", "port": 80}], **rule}],
        },
    }


TO_CART = {"route": [{"destination": {"host": "cart"}}]}


def test_a_virtual_service_rule_without_retries_gets_the_mesh_default_and_its_per_try_timeout() -> None:
    (rule,) = rules(translate(FIVE_TRIES, virtual_service({**TO_CART, "timeout": "10s"})))
    assert rule.retry == FIVE.policy
    assert rule.timeouts == Timeouts(request=10.0, backend_request=1.5)
    (plain,) = rules(translate(None, virtual_service(TO_CART)))
    assert plain.retry == RetryPolicy() and plain.timeouts == Timeouts()


def test_a_virtual_service_rule_with_retries_keeps_its_own() -> None:
    own = {**TO_CART, "retries": {"attempts": 1, "retryOn": "503"}}
    (rule,) = rules(translate(FIVE_TRIES, virtual_service(own)))
    assert rule.retry == RetryPolicy(attempts=1, codes=(503,), on_connect_failure=False)
    assert rule.timeouts == Timeouts()  # the mesh default's per-try timeout came with its policy only


def test_a_mesh_default_of_zero_attempts_disables_retries_of_rules_without_their_own() -> None:
    (rule,) = rules(translate(NO_RETRIES, virtual_service(TO_CART)))
    assert rule.retry.attempts == 0
    (own,) = rules(translate(NO_RETRIES, virtual_service({**TO_CART, "retries": {"attempts": 2}})))
    assert own.retry.attempts == 2


def test_an_httproute_rule_without_retry_gets_the_mesh_default() -> None:
    (rule,) = rules(translate(FIVE_TRIES, http_route()))
    assert rule.retry == FIVE.policy and rule.timeouts == Timeouts(backend_request=1.5)
    (stated,) = rules(translate(FIVE_TRIES, http_route(retry={"attempts": 1, "codes": [500]})))
    assert stated.retry == RetryPolicy(attempts=1, codes=(500,), on_connect_failure=True)
    assert stated.timeouts == Timeouts()
    (bounded,) = rules(translate(FIVE_TRIES, http_route(timeouts={"backendRequest": "3s"})))
    assert bounded.retry == FIVE.policy and bounded.timeouts == Timeouts(backend_request=3.0)
    (off,) = rules(translate(NO_RETRIES, http_route()))
    assert off.retry.attempts == 0


def test_a_grpcroute_rule_gets_the_mesh_default() -> None:
    def lookup(group: str, kind: str, name: str, namespace: str, route_kind: str) -> BackendService | str:
        return BackendService(namespace, f"{name}.{namespace}.svc.cluster.local", 80)

    converted = convert_route("GRPCRoute", http_route("GRPCRoute"), lookup, FIVE)
    (entry,) = converted.http
    assert entry.rule.retry == FIVE.policy and entry.rule.timeouts == Timeouts(backend_request=1.5)
    (istio,) = convert_route("GRPCRoute", http_route("GRPCRoute"), lookup).http
    assert istio.rule.retry == RetryPolicy()


def test_each_waypoint_config_carries_the_mesh_default_for_its_default_route() -> None:
    config = translate(NO_RETRIES, virtual_service(TO_CART))
    assert config.default_retry == HttpRetry(RetryPolicy(attempts=0), None)
    till = config.find_table("shop/till.shop.svc.cluster.local", 80)
    assert till is None or till.http == ()  # till takes the default route
    assert translate(None).default_retry == ISTIO_RETRY
    assert translate(FIVE_TRIES).default_retry == FIVE


# --- the waypoint's default route ---------------------------------------------------------------------------------

CART_80 = BackendService("shop", "cart.shop.svc.cluster.local", 80)
REQUEST = RequestHead("GET", "/", "cart", ())


def forward(config: RouteConfig, service_key: str = CART, port: int = 80) -> Forward:
    decision = route(config.find_table(service_key, port), CART_80, REQUEST, 0.5)
    assert isinstance(decision, Forward)
    return decision


def test_without_a_mesh_default_the_default_route_keeps_istios_retries() -> None:
    decision = forward(RouteConfig(WaypointConfig("shop/waypoint")))
    assert decision.retry == RetryPolicy() and decision.timeouts == Timeouts()
    assert RouteConfig(WaypointConfig("shop/waypoint")).find_table(CART, 80) is None


@pytest.mark.parametrize("tables", [(), (RouteTable(CART, 80),)], ids=["no table", "table without rules"])
def test_the_default_route_takes_the_mesh_default_and_its_per_try_timeout(tables: tuple[RouteTable, ...]) -> None:
    config = RouteConfig(WaypointConfig("shop/waypoint", tables, default_retry=FIVE))
    decision = forward(config)
    assert decision.retry == FIVE.policy and decision.timeouts == Timeouts(backend_request=1.5)
    assert config.find_table(CART, 80) is config.find_table(CART, 80)  # made once per destination
    off = RouteConfig(WaypointConfig("shop/waypoint", tables, default_retry=HttpRetry(RetryPolicy(attempts=0))))
    assert forward(off).retry.attempts == 0 and forward(off).timeouts == Timeouts()


def test_a_table_with_rules_is_untouched_by_the_mesh_default() -> None:
    rule = RouteRule(route="HTTPRoute/shop/cart", match=RouteMatch(), backends=(WeightedBackend(CART_80, 1),))
    table = RouteTable(CART, 80, http=(rule,))
    config = RouteConfig(WaypointConfig("shop/waypoint", (table,), default_retry=FIVE))
    assert config.find_table(CART, 80) is table
    assert forward(config).retry == RetryPolicy()


def test_a_new_config_replaces_the_default_route_s_retries() -> None:
    config = RouteConfig(WaypointConfig("shop/waypoint", default_retry=FIVE))
    assert forward(config).retry == FIVE.policy
    config.replace(WaypointConfig("shop/waypoint"))
    assert forward(config).retry == RetryPolicy()


@pytest.mark.parametrize(
    "retry",
    [ISTIO_RETRY, FIVE, HttpRetry(RetryPolicy(attempts=0)), HttpRetry(RetryPolicy(), 0.25)],
    ids=["istio", "five", "off", "timeout only"],
)
def test_the_mesh_default_crosses_the_wire_intact(retry: HttpRetry) -> None:
    config = WaypointConfig("shop/waypoint", default_retry=retry)
    message = waypoint_config_to_proto(config)
    assert message.HasField("default_retry") == (retry.policy != RetryPolicy())
    assert decode_waypoint_config("shop/waypoint", pack_waypoint_config(message)) == config


def test_the_default_mesh_config_has_istios_default() -> None:
    assert DEFAULT_MESH_CONFIG.default_http_retry is ISTIO_RETRY


def test_an_httproute_at_an_ingress_gateway_gets_the_mesh_default() -> None:
    gateway = {
        "apiVersion": "gateway.networking.k8s.io/v1",
        "kind": "Gateway",
        "metadata": {"name": "edge", "namespace": "shop"},
        "spec": {"gatewayClassName": "istio", "listeners": [{"name": "http", "port": 80, "protocol": "HTTP"}]},
    }
    route = http_route()
    route["spec"]["parentRefs"] = [{"name": "edge"}]
    cart = {
        "metadata": {"name": "cart", "namespace": "shop"},
        "spec": {"clusterIP": "10.96.0.20", "ports": [{"port": 80}]},
    }

    def rule(mesh: str) -> RouteRule:
        translation = translate_all(
            pods=(),
            services=[cart],
            endpoint_slices=(),
            namespaces=[{"metadata": {"name": "shop"}}, {"metadata": {"name": "istio-system"}}],
            gateways=[gateway],
            http_routes=[route],
            config_maps=[{"metadata": {"name": "istio", "namespace": "istio-system"}, "data": {"mesh": mesh}}],
        )
        (config,) = translation.gateway_configs
        (listener,) = config.listeners
        (host,) = listener.virtual_hosts
        (found,) = host.http
        return found

    custom = rule(FIVE_TRIES)
    assert custom.retry == FIVE.policy and custom.timeouts == Timeouts(backend_request=1.5)
    assert rule(NO_RETRIES).retry.attempts == 0
    assert rule("{}").retry == RetryPolicy()
