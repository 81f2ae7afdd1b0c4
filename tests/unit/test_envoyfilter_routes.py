"""HTTP_ROUTE MERGE patches: what istiod would merge into a waypoint's Envoy routes, made on Ambit's route rules
(:mod:`ambit.controlplane.translate.envoyfilter_routes`), selected by route configuration, virtual host, route
name and action, and refused (noted) whole for anything the engine has no form for."""

from __future__ import annotations

from typing import Any

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from ambit.controlplane.translate.envoyfilter_routes import merge_routes
from ambit.controlplane.translate.envoyfilters import IngressProxy, translate_envoy_filters
from ambit.model.route_matches import RouteMatch
from ambit.model.routes import (
    BackendService,
    DirectResponse,
    HeaderModifier,
    RequestRedirect,
    RetryPolicy,
    RouteRule,
    RouteTable,
    Timeouts,
    WeightedBackend,
)

ROOT = "istio-system"
WAYPOINT = "app/waypoint"
HOST = "reviews.app.svc.cluster.local"
GATEWAY_REF = {"group": "gateway.networking.k8s.io", "kind": "Gateway", "name": "waypoint"}
TO_REVIEWS = (WeightedBackend(BackendService("app", HOST, 80)),)


def ef(*patches: dict[str, Any], name: str = "f", priority: int = 0) -> dict[str, Any]:
    meta = {"name": name, "namespace": "app", "uid": f"u-{name}", "generation": 3}
    return {
        "metadata": meta,
        "spec": {"targetRefs": [GATEWAY_REF], "configPatches": list(patches), "priority": priority},
    }


def route_patch(value: dict[str, Any], route: dict[str, Any] | None = None, **match: Any) -> dict[str, Any]:
    rc: dict[str, Any] = dict(match)
    if route is not None:
        rc["vhost"] = {**rc.get("vhost", {}), "route": route}
    return {
        "applyTo": "HTTP_ROUTE",
        "match": {"context": "SIDECAR_INBOUND", "routeConfiguration": rc},
        "patch": {"operation": "MERGE", "value": value},
    }


def tables() -> tuple[RouteTable, ...]:
    named = RouteRule("HTTPRoute/app/r", RouteMatch(), backends=TO_REVIEWS, rule_name="main")
    other = RouteRule("HTTPRoute/app/r", RouteMatch(method="POST"), backends=TO_REVIEWS, rule_name="writes")
    direct = RouteRule("HTTPRoute/app/d", RouteMatch(), direct_response=DirectResponse(418), rule_name="tea")
    moved = RouteRule("HTTPRoute/app/m", RouteMatch(), redirect=RequestRedirect(hostname="x"), rule_name="moved")
    return (
        RouteTable(f"app/{HOST}", 80, http=(named, other, direct, moved)),
        RouteTable(f"app/{HOST}", 9080, http=(named,)),
        RouteTable("app/ratings.app.svc.cluster.local", 80, http=(named,)),
    )


def patched(*objects: dict[str, Any]) -> tuple[tuple[RouteTable, ...], list[str]]:
    t = translate_envoy_filters(objects, [WAYPOINT], root_namespace=ROOT, proxy_version="1.32.0")
    return merge_routes(tables(), t.route_merges_for(WAYPOINT)), [f"{n.field}: {n.reason}" for n in t.notes]


def rules(found: tuple[RouteTable, ...]) -> dict[tuple[str, int, str], RouteRule]:
    return {(t.service_key.partition("/")[2], t.port, r.rule_name): r for t in found for r in t.http}


def test_a_timeout_and_retry_merge_reach_the_named_route_of_the_selected_service_port_only() -> None:
    value = {
        "route": {
            "timeout": "2.5s",
            "retry_policy": {
                "num_retries": 4,
                "retry_on": "gateway-error,retriable-status-codes",
                "retriable_status_codes": [409],
                "per_try_timeout": "0.5s",
                "retry_back_off": {"base_interval": "0.1s"},
            },
        }
    }
    found, notes = patched(ef(route_patch(value, {"name": "main"}, name=f"inbound-vip|80|http|{HOST}")))
    assert notes == []
    by = rules(found)
    main = by[(HOST, 80, "main")]
    assert main.timeouts == Timeouts(request=2.5, backend_request=0.5)
    assert main.retry == RetryPolicy(attempts=4, codes=(409, 502, 503, 504), backoff=0.1, on_connect_failure=True)
    untouched = tables()
    assert by[(HOST, 80, "writes")] == untouched[0].http[1]  # another route name
    assert by[(HOST, 9080, "main")] == untouched[1].http[0]  # another port's route configuration
    assert by[("ratings.app.svc.cluster.local", 80, "main")] == untouched[2].http[0]  # another Service


def test_proto_merge_semantics_a_later_patch_replaces_scalars_and_appends_lists() -> None:
    first = route_patch({"route": {"timeout": "5s", "retry_policy": {"retriable_status_codes": [500]}}}, portNumber=80)
    second = route_patch({"route": {"timeout": "0s", "retry_policy": {"retriable_status_codes": [502]}}})
    found, _ = patched(ef(first, name="a", priority=1), ef(second, name="b", priority=2))
    main = rules(found)[(HOST, 80, "main")]
    assert main.timeouts.request is None  # 0s: no timeout, as Envoy reads it
    assert main.retry.codes == (503, 500, 502)  # the default 503, then both appended


@pytest.mark.parametrize(
    ("action", "chosen"),
    [("ROUTE", {"main", "writes"}), ("DIRECT_RESPONSE", {"tea"}), ("REDIRECT", {"moved"}), ("ANY", None)],
)
def test_the_route_action_match_selects_by_what_the_rule_does(action: str, chosen: set[str] | None) -> None:
    found, _ = patched(ef(route_patch({"route": {"timeout": "1s"}}, {"action": action}, portNumber=80)))
    timed = {r.rule_name for (h, p, _), r in rules(found).items() if p == 80 and h == HOST and r.timeouts.request}
    assert timed == (chosen or {"main", "writes", "tea", "moved"})


def test_header_lists_join_the_rules_header_filters() -> None:
    value = {
        "request_headers_to_add": [
            {"header": {"key": "X-Added", "value": "1"}},
            {"header": {"key": "x-set", "value": "2"}, "append_action": "OVERWRITE_IF_EXISTS_OR_ADD"},
        ],
        "request_headers_to_remove": ["x-secret"],
        "response_headers_to_add": [{"header": {"key": "x-out", "value": "100%%"}, "append": False}],
    }
    found, notes = patched(ef(route_patch(value, {"name": "main"})))
    assert notes == []
    main = rules(found)[(HOST, 80, "main")]
    assert main.request_headers == HeaderModifier(set=(("x-set", "2"),), add=(("x-added", "1"),), remove=("x-secret",))
    assert main.response_headers == HeaderModifier(set=(("x-out", "100%"),))


@pytest.mark.parametrize(
    ("patch", "reason"),
    [
        ({**route_patch({}), "patch": {"operation": "REMOVE"}}, "REMOVE of an HTTP route is not supported"),
        (route_patch({"route": {"cluster": "outbound|80||x"}}), "merging cluster is not supported"),
        (route_patch({"route": {"retry_policy": {"retry_on": "reset"}}}), "reset not supported"),
        (route_patch({"route": {"timeout": 5}}), "expected a duration"),
        (route_patch({"typed_per_filter_config": {}}), "merging typed_per_filter_config is not supported"),
        (route_patch({"route": {"timeout": "1s"}}, {"name": "app.r.0"}), "generated name of an unnamed rule"),
        (
            route_patch({"request_headers_to_add": [{"header": {"key": "x", "value": "%REQ(y)%"}}]}),
            "%-substitutions",
        ),
        (
            route_patch(
                {"request_headers_to_add": [{"header": {"key": "x", "value": "1"}, "append_action": "ADD_IF_ABSENT"}]}
            ),
            "not supported on a route",
        ),
        (route_patch({"request_headers_to_remove": ["content-length"]}), "not a header name Ambit edits"),
    ],
)
def test_what_the_engine_has_no_form_for_is_refused_whole_and_noted(patch: dict[str, Any], reason: str) -> None:
    found, notes = patched(ef(route_patch({"route": {"timeout": "9s"}}, {"name": "writes"}), patch))
    (note,) = notes
    assert note.startswith("spec.configPatches[1]:") and reason in note, note
    by = rules(found)
    assert by[(HOST, 80, "writes")].timeouts.request == 9.0  # the object's other patch still applies
    assert by[(HOST, 80, "main")] == tables()[0].http[0]


def test_an_ingress_gateway_takes_no_http_route_patch() -> None:
    obj = ef(route_patch({"route": {"timeout": "1s"}}))
    obj["spec"] = {"configPatches": obj["spec"]["configPatches"]}  # no targets: selects gateway pods
    obj["spec"]["configPatches"][0]["match"]["context"] = "GATEWAY"
    gateway = IngressProxy("app/gw", {"istio": "ingressgateway"}, gateway_api=False)
    t = translate_envoy_filters([obj], [], root_namespace=ROOT, proxy_version="1.32.0", gateways=[gateway])
    assert t.route_merges == {} and "waypoints only" in t.notes[0].reason


def test_a_version_pinned_merge_applies_only_to_that_version() -> None:
    patch = route_patch({"route": {"timeout": "1s"}}, {"name": "main"})
    patch["match"]["proxy"] = {"proxyVersion": r"^1\.2[0-9].*"}
    found, _ = patched(ef(patch))
    assert rules(found)[(HOST, 80, "main")].timeouts.request is None


_FIELDS = [
    "route", "timeout", "retry_policy", "num_retries", "retry_on", "retriable_status_codes", "per_try_timeout",
    "retry_back_off", "base_interval", "request_headers_to_add", "header", "key", "value", "append",
    "request_headers_to_remove", "response_headers_to_add",
]  # fmt: skip
_VALUES = st.recursive(
    st.none() | st.booleans() | st.integers() | st.text(max_size=6),
    lambda children: st.lists(children, max_size=3) | st.dictionaries(st.sampled_from(_FIELDS), children, max_size=4),
)


@settings(max_examples=200, deadline=None)
@given(value=_VALUES)
def test_any_patch_value_is_honoured_or_noted_never_a_traceback(value: Any) -> None:
    patch = route_patch({}, {"name": "main"})
    patch["patch"]["value"] = value
    t = translate_envoy_filters([ef(patch)], [WAYPOINT], root_namespace=ROOT, proxy_version="1.32.0")
    merge_routes(tables(), t.route_merges_for(WAYPOINT))
    assert bool(t.route_merges) != bool(t.notes)


def test_a_service_port_without_routes_has_istiods_default_route_to_merge_into() -> None:
    bare = RouteTable(f"app/{HOST}", 80)
    t = translate_envoy_filters(
        [ef(route_patch({"route": {"timeout": "2s"}}, {"name": "default", "action": "ROUTE"}))],
        [WAYPOINT],
        root_namespace=ROOT,
        proxy_version="1.32.0",
    )
    (table,) = merge_routes((bare,), t.route_merges_for(WAYPOINT))
    (rule,) = table.http
    assert (rule.rule_name, rule.match, rule.backends, rule.timeouts.request) == (
        "default",
        RouteMatch(),
        TO_REVIEWS,
        2.0,
    )
    # a merge that selects only named routes, or only redirects, leaves the implicit default alone
    for route in ({"name": "main"}, {"action": "REDIRECT"}):
        t = translate_envoy_filters(
            [ef(route_patch({"route": {"timeout": "2s"}}, route))], [WAYPOINT], root_namespace=ROOT, proxy_version="1"
        )
        assert merge_routes((bare,), t.route_merges_for(WAYPOINT)) == (bare,)
