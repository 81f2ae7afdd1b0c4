"""EnvoyFilters → each waypoint's honoured patches (ambit.controlplane.translate.envoyfilters): upstream's
TestWaypointEnvoyFilter object, istiod's selection for waypoints (targetRefs, namespaces, GatewayClass, order,
proxyVersion, context), the header semantics, and what is noted instead of applied."""

from __future__ import annotations

import copy
import re
from typing import Any

import pytest
from hypothesis import example, given, settings
from hypothesis import strategies as st
from tests.upstream_objects import waypoint_envoy_filter

from ambit import ISTIO_VERSION, __version__
from ambit.controlplane.translate import translate_all
from ambit.controlplane.translate.envoyfilters import IngressProxy, PatchNote, translate_envoy_filters
from ambit.model.envoyfilter import (
    HeaderAction,
    HeaderOp,
    HeaderPatch,
    PatchScope,
    ProxyPatches,
    version_matches,
    version_pattern_problem,
)

ROOT = "istio-system"
WAYPOINT = "app/waypoint"
APPEND, OVERWRITE, REMOVE = HeaderAction.APPEND, HeaderAction.OVERWRITE, HeaderAction.REMOVE
LUA_TYPE = "type.googleapis.com/envoy.extensions.filters.http.lua.v3.Lua"
GATEWAY_REF = {"group": "gateway.networking.k8s.io", "kind": "Gateway", "name": "waypoint"}


def ef(
    patches: list[dict[str, Any]],
    *,
    namespace: str = "app",
    name: str = "f",
    targets: list[dict[str, Any]] | None = None,
    priority: int | None = None,
    created: str = "",
    generation: int = 1,
) -> dict[str, Any]:
    spec: dict[str, Any] = {"configPatches": patches}
    spec["targetRefs"] = [GATEWAY_REF] if targets is None else targets
    if priority is not None:
        spec["priority"] = priority
    meta = {"name": name, "namespace": namespace, "uid": f"u-{namespace}-{name}", "generation": generation}
    return {"metadata": {**meta, "creationTimestamp": created}, "spec": spec}


def vhost(value: dict[str, Any], match: dict[str, Any] | None = None, **extra: Any) -> dict[str, Any]:
    return {
        "applyTo": extra.get("apply_to", "VIRTUAL_HOST"),
        "match": {"context": "SIDECAR_INBOUND", **(match or {})},
        "patch": {"operation": extra.get("operation", "MERGE"), "value": value},
    }


def add(key: str, value: str, **option: Any) -> dict[str, Any]:
    return {"request_headers_to_add": [{"header": {"key": key, "value": value}, **option}]}


def lua(code: str, operation: str = "INSERT_BEFORE", sub: str = "envoy.filters.http.router") -> dict[str, Any]:
    return {
        "applyTo": "HTTP_FILTER",
        "match": {
            "context": "SIDECAR_INBOUND",
            "listener": {
                "filterChain": {
                    "filter": {"name": "envoy.filters.network.http_connection_manager", "subFilter": {"name": sub}}
                }
            },
        },
        "patch": {
            "operation": operation,
            "value": {"name": "envoy.lua", "typed_config": {"@type": LUA_TYPE, "inlineCode": code}},
        },
    }


def run(
    *objects: dict[str, Any], waypoints: tuple[str, ...] = (WAYPOINT,), version: str = "1.0.0"
) -> tuple[dict[str, ProxyPatches], list[PatchNote]]:
    t = translate_envoy_filters(objects, waypoints, root_namespace=ROOT, proxy_version=version)
    return dict(t.by_waypoint), list(t.notes)


def request_ops(found: dict[str, ProxyPatches], key: str = WAYPOINT) -> tuple[HeaderOp, ...]:
    patches = found.get(key, ProxyPatches())
    return patches.filter_request_ops() + patches.route_request_ops("reviews.app.svc.cluster.local", 80)


def test_upstreams_object_gives_its_waypoint_both_headers_and_notes_the_inbound_cluster_merge() -> None:
    found, notes = run(waypoint_envoy_filter("waypoint", "app"), waypoints=(WAYPOINT, "other/waypoint"))
    assert found == {
        WAYPOINT: ProxyPatches(
            filters=(HeaderPatch("app/inbound[0]", (HeaderOp(APPEND, "x-lua-inbound", "hello world"),)),),
            routes=(HeaderPatch("app/inbound[1]", (HeaderOp(APPEND, "x-vhost-inbound", "hello world"),)),),
        )
    }
    (note,) = notes
    assert (note.field, note.generation) == ("spec.configPatches[2]", 0)
    assert "no inbound cluster of a waypoint" in note.reason


def test_upstreams_object_reaches_the_waypoint_config_through_translate_all() -> None:
    namespace = {"apiVersion": "v1", "kind": "Namespace", "metadata": {"name": "app"}}
    gateway_class = {"metadata": {"name": "istio-waypoint"}, "spec": {"controllerName": "istio.io/mesh-controller"}}
    gateway = {
        "metadata": {"name": "waypoint", "namespace": "app"},
        "spec": {
            "gatewayClassName": "istio-waypoint",
            "listeners": [{"name": "m", "port": 15008, "protocol": "HBONE"}],
        },
        "status": {"addresses": [{"type": "Hostname", "value": "waypoint.app.svc.cluster.local"}]},
    }
    service = {
        "metadata": {"name": "reviews", "namespace": "app", "labels": {"istio.io/use-waypoint": "waypoint"}},
        "spec": {"clusterIP": "10.96.0.10", "ports": [{"name": "http", "port": 80}]},
    }
    route = {
        "metadata": {"name": "reviews", "namespace": "app"},
        "spec": {
            "parentRefs": [{"group": "", "kind": "Service", "name": "reviews", "port": 80}],
            "rules": [{"name": "main", "backendRefs": [{"name": "reviews", "port": 80}]}],
        },
    }
    upstream = waypoint_envoy_filter("waypoint", "app")
    upstream["spec"]["configPatches"].append(
        {
            "applyTo": "HTTP_ROUTE",
            "match": {"context": "SIDECAR_INBOUND", "routeConfiguration": {"vhost": {"route": {"name": "main"}}}},
            "patch": {"operation": "MERGE", "value": {"route": {"timeout": "3s"}}},
        }
    )
    translation = translate_all(
        [],
        [service],
        [],
        [namespace],
        gateways=[gateway],
        gateway_classes=[gateway_class],
        http_routes=[route],
        envoy_filters=[upstream],
        root_namespace=ROOT,
    )
    (config,) = translation.waypoint_configs
    assert [op.name for op in request_ops({WAYPOINT: config.envoy_patches})] == ["x-lua-inbound", "x-vhost-inbound"]
    assert [n.field for n in translation.envoy_filter_notes] == ["spec.configPatches[2]"]
    (table,) = config.tables
    assert [(r.rule_name, r.timeouts.request) for r in table.http] == [("main", 3.0)]  # the HTTP_ROUTE merge


def test_a_filter_in_another_namespace_never_applies_whatever_namespace_its_target_names() -> None:
    hostile = ef([vhost(add("x-evil", "1"))], namespace="attacker", targets=[{**GATEWAY_REF, "namespace": "app"}])
    from_root = ef([vhost(add("x-root", "1"))], namespace=ROOT, targets=[{**GATEWAY_REF, "namespace": "app"}])
    found, notes = run(hostile, from_root)
    assert found == {}
    assert {(n.namespace, n.field) for n in notes} == {("attacker", "spec"), (ROOT, "spec")}


def test_a_target_naming_another_namespace_or_gateway_or_kind_does_not_attach() -> None:
    for target in (
        {**GATEWAY_REF, "namespace": "elsewhere"},
        {**GATEWAY_REF, "name": "other"},
        {**GATEWAY_REF, "group": ""},
        {"kind": "Service", "name": "reviews"},
        {"group": "networking.istio.io", "kind": "ServiceEntry", "name": "reviews"},
    ):
        assert run(ef([vhost(add("x", "1"))], targets=[target]))[0] == {}, target


def test_selector_or_no_target_never_reaches_a_waypoint() -> None:
    selected = ef([vhost(add("x", "1"))], targets=[])
    selected["spec"]["workloadSelector"] = {"labels": {"gateway.networking.k8s.io/gateway-name": "waypoint"}}
    everywhere = ef([vhost(add("y", "1"))], namespace=ROOT, targets=[])
    assert run(selected, everywhere)[0] == {}


def test_the_waypoint_gateway_class_from_the_root_namespace_reaches_every_waypoint_only_from_there() -> None:
    klass = {"group": "gateway.networking.k8s.io", "kind": "GatewayClass", "name": "istio-waypoint"}
    found, _ = run(ef([vhost(add("x", "1"))], namespace=ROOT, targets=[klass]), waypoints=(WAYPOINT, "b/w"))
    assert set(found) == {WAYPOINT, "b/w"}
    assert run(ef([vhost(add("x", "1"))], targets=[klass]))[0] == {}
    assert run(ef([vhost(add("x", "1"))], namespace=ROOT, targets=[{**klass, "name": "istio"}]))[0] == {}


def test_order_is_priority_then_root_namespace_then_creation_then_name() -> None:
    klass = {"group": "gateway.networking.k8s.io", "kind": "GatewayClass", "name": "istio-waypoint"}
    objects = [
        ef([vhost(add("x", "late"))], name="a", created="2026-01-02T00:00:00Z"),
        ef([vhost(add("x", "early"))], name="z", created="2026-01-01T00:00:00Z"),
        ef([vhost(add("x", "root"))], namespace=ROOT, name="r", targets=[klass], created="2026-01-03T00:00:00Z"),
        ef([vhost(add("x", "first"))], name="p", priority=-1, created="2026-01-04T00:00:00Z"),
    ]
    found, _ = run(*objects)
    assert [op.value for op in request_ops(found)] == ["first", "root", "early", "late"]


def test_proxy_version_is_a_searched_expression_and_metadata_is_never_matched() -> None:
    def versioned(pattern: str) -> dict[str, Any]:
        patch = vhost(add("x", pattern))
        patch["match"]["proxy"] = {"proxyVersion": pattern}
        return patch

    found, _ = run(ef([versioned(r"^1\.0"), versioned(r"^2\."), versioned("a" * 1025)]), version="1.0.0")
    assert [op.value for op in request_ops(found)] == [r"^1\.0"]
    meta = vhost(add("x", "1"))
    meta["match"]["proxy"] = {"metadata": {"ISTIO_VERSION": "1"}}
    found, notes = run(ef([meta]))
    assert found == {} and "metadata" in notes[0].reason


@pytest.mark.parametrize("context", ["SIDECAR_OUTBOUND", "GATEWAY"])
def test_route_and_filter_patches_outside_the_inbound_context_are_noted(context: str) -> None:
    patch = vhost(add("x", "1"))
    patch["match"]["context"] = context
    found, notes = run(ef([patch]))
    assert found == {} and "no effect at a waypoint" in notes[0].reason


def test_append_semantics_follow_envoy() -> None:
    value = {
        "request_headers_to_add": [
            {"header": {"key": "A", "value": "1"}},
            {"header": {"key": "b", "value": "2"}, "append": False},
            {"header": {"key": "c", "value": "3"}, "append_action": "ADD_IF_ABSENT"},
            {"header": {"key": "d", "value": "4"}, "appendAction": "OVERWRITE_IF_EXISTS"},
            {"header": {"key": "e", "value": ""}},
            {"header": {"key": "f", "value": ""}, "keep_empty_value": True},
            {"header": {"key": "g", "value": "100%%"}},
        ],
        "request_headers_to_remove": ["X-Gone"],
        "response_headers_to_add": [{"header": {"key": "r", "value": "1"}}],
        "response_headers_to_remove": ["server"],
    }
    found, notes = run(ef([vhost(value)]))
    assert notes == []
    patches = found[WAYPOINT]
    assert patches.route_request_ops("h", 80) == (
        HeaderOp(REMOVE, "x-gone"),
        HeaderOp(APPEND, "a", "1"),
        HeaderOp(OVERWRITE, "b", "2"),
        HeaderOp(HeaderAction.ADD_IF_ABSENT, "c", "3"),
        HeaderOp(HeaderAction.OVERWRITE_IF_EXISTS, "d", "4"),
        HeaderOp(APPEND, "f", ""),
        HeaderOp(APPEND, "g", "100%"),
    )
    assert patches.route_response_ops("h", 80) == (HeaderOp(REMOVE, "server"), HeaderOp(APPEND, "r", "1"))


def test_virtual_host_edits_run_before_route_configuration_ones() -> None:
    found, _ = run(ef([vhost(add("x", "rc"), apply_to="ROUTE_CONFIGURATION"), vhost(add("x", "vhost"))]))
    assert [op.value for op in found[WAYPOINT].route_request_ops("h", 1)] == ["vhost", "rc"]


@pytest.mark.parametrize(
    ("value", "why"),
    [
        (add("x", "a\r\nInjected: 1"), "CR, LF or NUL"),
        (add("x", "a\nb"), "CR, LF or NUL"),
        (add("x", "%DOWNSTREAM_REMOTE_ADDRESS%"), "substitutions"),
        (add("host", "evil"), "authority or a framing header"),
        (add("content-length", "0"), "authority or a framing header"),
        (add(":path", "/admin"), "not a header name"),
        (add("x", "1", append=True, append_action="ADD_IF_ABSENT"), "both be set"),
        (add("x", "1", append_action="SOMETIMES"), "unknown action"),
        ({**add("x", "1"), "name": "v"}, "only the header lists"),
        ({}, "empty merge"),
    ],
)
def test_unsafe_or_unknown_route_merges_are_refused_and_the_rest_still_applies(value: dict[str, Any], why: str) -> None:
    found, notes = run(ef([vhost(value), vhost(add("x-ok", "1"))]))
    assert [op.name for op in request_ops(found)] == ["x-ok"]
    (note,) = notes
    assert note.field == "spec.configPatches[0]" and why in note.reason


def test_route_matches_map_onto_the_destinations_service_and_port() -> None:
    by_name = vhost(
        add("x", "name"), {"routeConfiguration": {"name": "inbound-vip|80|http|reviews.app.svc.cluster.local"}}
    )
    by_port = vhost(add("x", "port"), {"routeConfiguration": {"portNumber": 9080}})
    by_vhost = vhost(add("x", "vhost"), {"routeConfiguration": {"vhost": {"name": "inbound|http|80"}}})
    by_domain = vhost(
        add("x", "domain"), {"routeConfiguration": {"vhost": {"domainName": "ratings.app.svc.cluster.local"}}}
    )
    sidecar_name = vhost(add("x", "never"), {"routeConfiguration": {"name": "80"}})
    found, notes = run(ef([by_name, by_port, by_vhost, by_domain, sidecar_name]))
    patches = found[WAYPOINT]
    assert [op.value for op in patches.route_request_ops("reviews.app.svc.cluster.local", 80)] == ["name", "vhost"]
    assert [op.value for op in patches.route_request_ops("ratings.app.svc.cluster.local", 9080)] == ["port", "domain"]
    assert [n.field for n in notes] == ["spec.configPatches[4]"]


def test_lua_filters_run_in_chain_order_and_their_response_edits_in_reverse() -> None:
    first = lua(
        'function envoy_on_request(h) h:headers():add("x", "1") end function envoy_on_response(h) '
        'h:headers():add("r", "1") end'
    )
    second = lua(
        'function envoy_on_response(h) h:headers():replace("r", "2") end', "INSERT_AFTER", "envoy.filters.http.cors"
    )
    found, notes = run(ef([first, second]))
    assert notes == []
    assert found[WAYPOINT].filter_request_ops() == (HeaderOp(APPEND, "x", "1"),)
    assert found[WAYPOINT].filter_response_ops() == (HeaderOp(OVERWRITE, "r", "2"), HeaderOp(APPEND, "r", "1"))


@pytest.mark.parametrize(
    ("patch", "why"),
    [
        (lua("function envoy_on_request(h) os.exit(1) end"), "outside the header-edit subset"),
        (lua("function envoy_on_request(h) " + "h:headers():add('x','y') " * 3000 + "end"), "longer than"),
        (lua('function envoy_on_request(h) h:headers():add("x", "a\\r\\nb: c") end'), "CR, LF or NUL"),
        (lua('function envoy_on_request(h) h:headers():replace(":path", "/admin") end'), "not a header name"),
        (lua("function envoy_on_request(h) end", "INSERT_FIRST"), "INSERT_FIRST"),
        (lua("function envoy_on_request(h) end", "INSERT_AFTER", "envoy.filters.http.router"), "INSERT_AFTER"),
        (lua("function envoy_on_request(h) end", "ADD"), "ADD of an HTTP filter"),
    ],
)
def test_lua_outside_the_subset_or_position_is_not_run_and_the_rest_still_applies(
    patch: dict[str, Any], why: str
) -> None:
    found, notes = run(ef([patch, vhost(add("x-ok", "1"))]))
    assert [op.name for op in request_ops(found)] == ["x-ok"]
    assert why in notes[0].reason


def test_other_http_filters_and_apply_tos_are_noted() -> None:
    wasm = lua("")
    wasm["patch"]["value"] = {"name": "envoy.filters.http.wasm", "typed_config": {"@type": "type.googleapis.com/x"}}
    listener = {"applyTo": "LISTENER", "patch": {"operation": "ADD", "value": {"name": "l"}}}
    found, notes = run(ef([wasm, listener, vhost(add("x-ok", "1"))]))
    assert [op.name for op in request_ops(found)] == ["x-ok"]
    assert ["is not run by Ambit" in notes[0].reason, "LISTENER is not honoured" in notes[1].reason] == [True, True]


def test_an_outbound_cluster_merge_asks_for_http2_to_the_matched_backends() -> None:
    cluster = {
        "applyTo": "CLUSTER",
        "match": {"context": "SIDECAR_OUTBOUND", "cluster": {"service": "ext.example.com", "portNumber": 8080}},
        "patch": {"operation": "MERGE", "value": {"http2_protocol_options": {}}},
    }
    typed = copy.deepcopy(cluster)
    typed["match"] = {"cluster": {"name": "outbound|9090||api.example.com"}}
    options = "envoy.extensions.upstreams.http.v3.HttpProtocolOptions"
    typed["patch"]["value"] = {
        "typed_extension_protocol_options": {
            options: {"@type": f"type.googleapis.com/{options}", "explicit_http_config": {"http2_protocol_options": {}}}
        }
    }
    found, notes = run(ef([cluster, typed]))
    assert notes == []
    patches = found[WAYPOINT]
    assert patches.upstream_h2 == (PatchScope("ext.example.com", 8080), PatchScope("api.example.com", 9090))
    assert patches.wants_h2("ext.example.com", 8080) and not patches.wants_h2("ext.example.com", 80)


def test_a_note_carries_the_objects_generation() -> None:
    _, notes = run(ef([{"applyTo": "NETWORK_FILTER", "patch": {"operation": "REMOVE"}}], generation=7))
    assert notes[0].generation == 7 and notes[0].uid == "u-app-f"


def test_malformed_objects_are_noted_never_raised() -> None:
    for spec in ({"configPatches": "x"}, {"configPatches": [1, None, {"applyTo": 3}]}, {"priority": "high"}, None):
        obj = ef([])
        obj["spec"] = spec
        run(obj)


GATEWAY_API = IngressProxy("app/gateway", {"gateway.networking.k8s.io/gateway-name": "gateway"}, gateway_api=True)
CLASSIC = IngressProxy("istio-system/ingressgateway", {"istio": "ingressgateway"}, gateway_api=False)


def gateway_run(*objects: dict[str, Any]) -> tuple[dict[str, ProxyPatches], list[PatchNote]]:
    t = translate_envoy_filters(
        objects, (), root_namespace=ROOT, proxy_version="1.0.0", gateways=(GATEWAY_API, CLASSIC)
    )
    return dict(t.by_gateway), list(t.notes)


def at_gateway(patch: dict[str, Any]) -> dict[str, Any]:
    out = copy.deepcopy(patch)
    out["match"]["context"] = "GATEWAY"
    return out


def test_an_ingress_gateway_takes_gateway_context_patches_by_target_or_selector() -> None:
    targeted = ef([at_gateway(vhost(add("x", "target")))], targets=[{**GATEWAY_REF, "name": "gateway"}])
    selected = ef([at_gateway(vhost(add("x", "selector")))], namespace=ROOT, name="s", targets=[])
    selected["spec"]["workloadSelector"] = {"labels": {"istio": "ingressgateway"}}
    everywhere = ef([at_gateway(vhost(add("x", "all")))], namespace=ROOT, name="all", targets=[])
    found, notes = gateway_run(targeted, selected, everywhere)
    assert notes == []
    assert [op.value for op in found["app/gateway"].route_request_ops("h", 80)] == ["all", "target"]
    assert [op.value for op in found["istio-system/ingressgateway"].route_request_ops("h", 80)] == ["all", "selector"]


def test_waypoint_contexts_do_not_reach_a_gateway_and_gateway_ones_not_a_waypoint() -> None:
    inbound = ef([vhost(add("x", "inbound"))], targets=[{**GATEWAY_REF, "name": "gateway"}])
    found, notes = gateway_run(inbound)
    assert found == {} and "no effect at an ingress gateway" in notes[0].reason
    assert run(ef([at_gateway(vhost(add("x", "1")))]))[0] == {}


def test_a_classic_gateway_ignores_target_refs_and_a_gateway_route_match_is_by_port_only() -> None:
    targeted = ef([at_gateway(vhost(add("x", "1")))], targets=[{**GATEWAY_REF, "name": "ingressgateway"}])
    by_port = at_gateway(vhost(add("x", "443"), {"routeConfiguration": {"portNumber": 443}}))
    by_name = at_gateway(vhost(add("x", "named"), {"routeConfiguration": {"name": "http.80"}}))
    found, notes = gateway_run(targeted, ef([by_port, by_name], targets=[{**GATEWAY_REF, "name": "gateway"}], name="g"))
    assert "istio-system/ingressgateway" not in found
    assert [op.value for op in found["app/gateway"].route_request_ops("h", 443)] == ["443"]
    assert found["app/gateway"].route_request_ops("h", 80) == ()
    assert [n.field for n in notes if n.name == "g"] == ["spec.configPatches[1]"]


def test_the_control_plane_logs_a_note_once_per_generation(caplog: pytest.LogCaptureFixture) -> None:
    from types import SimpleNamespace

    from ambit.controlplane.process import ControlPlane
    from ambit.controlplane.translate import Translation
    from ambit.model.localconfig import LocalConfig

    plane = SimpleNamespace(_envoy_notes=set())

    def translate(generation: int) -> Translation:
        obj = ef([{"applyTo": "LISTENER", "patch": {"operation": "ADD"}}], generation=generation)
        notes = translate_envoy_filters([obj], [WAYPOINT], root_namespace=ROOT, proxy_version="1").notes
        return Translation(LocalConfig((), ()), envoy_filter_notes=notes)

    caplog.set_level("WARNING", logger="ambit.controlplane")
    for generation in (1, 1, 1, 2, 2):
        ControlPlane._note_envoy_filters(plane, translate(generation))  # type: ignore[arg-type]
    lines = [r.getMessage() for r in caplog.records if "EnvoyFilter" in r.getMessage()]
    reason = "spec.configPatches[0] not applied: applyTo: LISTENER is not honoured by Ambit"
    assert lines == [f"EnvoyFilter app/f (generation {g}) {reason}" for g in (1, 2)]


def test_a_filter_pinned_to_the_istio_minor_ambit_implements_applies_and_one_pinned_to_another_does_not() -> None:
    """Ambit's proxies state :data:`ambit.ISTIO_VERSION`, not Ambit's own version, for ``proxyVersion``."""
    major, minor, _ = ISTIO_VERSION.split(".")

    def pinned(pattern: str) -> dict[str, Any]:
        patch = vhost(add("x-pinned", pattern))
        patch["match"]["proxy"] = {"proxyVersion": pattern}
        return patch

    ours = rf"^{major}\.{minor}.*"
    others = (r"^1\.2[0-9].*", rf"^{major}\.{int(minor) - 1}.*", r"^0\.1\.0$")
    found, notes = run(ef([pinned(ours), *map(pinned, others)]), version=ISTIO_VERSION)
    assert [op.value for op in request_ops(found)] == [ours] and notes == []
    assert not version_matches(rf"^{re.escape(__version__)}$", ISTIO_VERSION)  # Ambit's build is not the match


def test_an_invalid_version_expression_is_ignored_with_a_note_and_an_over_long_one_matches_nothing() -> None:
    def pinned(pattern: str, value: str) -> dict[str, Any]:
        patch = vhost(add("x", value))
        patch["match"]["proxy"] = {"proxyVersion": pattern}
        return patch

    found, notes = run(ef([pinned("(", "broken"), pinned(r"(?=1)1", "lookahead"), pinned("1" * 1025, "long")]))
    assert [op.value for op in request_ops(found)] == ["broken", "lookahead"]  # as istiod: no version match
    assert [n.field for n in notes] == [f"spec.configPatches[{i}].match.proxy.proxyVersion" for i in range(3)]
    assert "ignored" in notes[0].reason and "look-ahead" in notes[1].reason and "matches no proxy" in notes[2].reason


@settings(max_examples=300, deadline=None)
@given(st.text(max_size=64))
@example("[[")  # Python warns of a nested set first: under warnings-as-errors that escaped the judge
@example("[[a]")
def test_judging_a_version_expression_never_raises_and_what_it_accepts_compiles(pattern: str) -> None:
    problem = version_pattern_problem(pattern)
    if not problem:
        re.compile(pattern)
    assert isinstance(version_matches(pattern, ISTIO_VERSION), bool)


HCM_TYPE = "type.googleapis.com/envoy.extensions.filters.network.http_connection_manager.v3.HttpConnectionManager"


def hcm_merge(fields: dict[str, Any], listener: dict[str, Any] | None = None) -> dict[str, Any]:
    """Upstream routing.go "https with x-forwarded-proto"'s patch, with ``fields`` in its typed_config."""
    return {
        "applyTo": "NETWORK_FILTER",
        "match": {
            "context": "GATEWAY",
            "listener": listener
            or {"filterChain": {"filter": {"name": "envoy.filters.network.http_connection_manager"}}},
        },
        "patch": {"operation": "MERGE", "value": {"typed_config": {"@type": HCM_TYPE, **fields}}},
    }


def selecting_gateway_pods(*patches: dict[str, Any], name: str = "edge") -> dict[str, Any]:
    obj = ef(list(patches), namespace=ROOT, name=name, targets=[])
    obj["spec"]["workloadSelector"] = {"labels": {"istio": "ingressgateway"}}
    return obj


def test_a_connection_manager_merge_sets_the_gateways_trusted_hops_the_last_merge_winning() -> None:
    upstream = selecting_gateway_pods(hcm_merge({"xff_num_trusted_hops": 1, "normalize_path": True}))
    found, notes = gateway_run(upstream)
    assert notes == [] and found["istio-system/ingressgateway"].xff_trusted_hops == 1
    assert found["istio-system/ingressgateway"].trusts_forwarded_proto
    later = selecting_gateway_pods(hcm_merge({"xff_num_trusted_hops": 0}), name="later")
    later["metadata"]["creationTimestamp"] = "2026-01-02T00:00:00Z"
    upstream["metadata"]["creationTimestamp"] = "2026-01-01T00:00:00Z"
    found, _ = gateway_run(upstream, later)
    assert found["istio-system/ingressgateway"].xff_trusted_hops == 0
    assert not found["istio-system/ingressgateway"].trusts_forwarded_proto


@pytest.mark.parametrize(
    ("patch", "why"),
    [
        (hcm_merge({"xff_num_trusted_hops": 1, "use_remote_address": False}), "use_remote_address"),
        (hcm_merge({"normalize_path": False}), "normalize_path"),
        (hcm_merge({"xff_num_trusted_hops": -1}), "xff_num_trusted_hops"),
        (hcm_merge({"xff_num_trusted_hops": "1"}), "xff_num_trusted_hops"),
        (hcm_merge({"xff_num_trusted_hops": 65}), "xff_num_trusted_hops"),
        (hcm_merge({"xff_num_trusted_hops": 1}, {"portNumber": 80}), "listener"),
        (hcm_merge({"xff_num_trusted_hops": 1}, {"filterChain": {"filter": {"name": "envoy.tcp_proxy"}}}), "filter"),
    ],
)
def test_a_connection_manager_merge_ambit_cannot_honour_is_noted_not_applied(patch: dict[str, Any], why: str) -> None:
    found, notes = gateway_run(selecting_gateway_pods(patch))
    assert "istio-system/ingressgateway" not in found
    assert len(notes) == 1 and why in notes[0].reason


def test_a_connection_manager_merge_is_not_honoured_at_a_waypoint() -> None:
    found, notes = run(ef([hcm_merge({"xff_num_trusted_hops": 1})]))
    assert found == {} and "ingress gateways only" in notes[0].reason
