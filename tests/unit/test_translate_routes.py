"""Gateway API routes → waypoint route tables and route status (spec §1.4, §10.3): golden files, then single rules.

Golden files: ``golden/routes/<case>-in.yaml`` (API objects, one YAML document each) is translated with
``translate_all`` and each waypoint's :class:`WaypointConfig` plus every route's status is rendered to
``<case>-out.yaml`` (fields at their default are left out, so the files show what each case sets).
``AMBIT_UPDATE_GOLDEN=1 pytest ...`` rewrites the outputs.
"""

from __future__ import annotations

import dataclasses
import enum
import os
from pathlib import Path
from typing import Any

import pytest
import yaml
from hypothesis import example, given, settings
from hypothesis import strategies as st

from ambit.controlplane.translate import Translation, translate_all
from ambit.controlplane.translate.routerules import parse_duration, regex_problem
from ambit.model.route_matches import PathMatchType
from ambit.model.routes import RetryPolicy, WaypointConfig

GOLDEN = Path(__file__).parent / "golden" / "routes"
CASES = sorted(p.name.removesuffix("-in.yaml") for p in GOLDEN.glob("*-in.yaml"))
KINDS = {
    "Pod": "pods",
    "Service": "services",
    "EndpointSlice": "endpoint_slices",
    "Namespace": "namespaces",
    "ServiceEntry": "service_entries",
    "Gateway": "gateways",
    "GatewayClass": "gateway_classes",
    "HTTPRoute": "http_routes",
    "GRPCRoute": "grpc_routes",
    "TCPRoute": "tcp_routes",
    "TLSRoute": "tls_routes",
    "ReferenceGrant": "reference_grants",
    "VirtualService": "virtual_services",
    "DestinationRule": "destination_rules",
}
Obj = dict[str, Any]


def translate_objects(objects: list[Obj]) -> Translation:
    out: dict[str, list[Obj]] = {name: [] for name in KINDS.values()}
    for obj in objects:
        out[KINDS[obj["kind"]]].append(obj)
    return translate_all(**out)  # type: ignore[arg-type]


def plain(value: Any) -> Any:
    """A model value as YAML-friendly data, fields at their default left out."""
    if dataclasses.is_dataclass(value) and not isinstance(value, type):
        out: dict[str, Any] = {}
        for f in dataclasses.fields(value):
            item = getattr(value, f.name)
            if f.default is not dataclasses.MISSING and item == f.default:
                continue
            if f.default_factory is not dataclasses.MISSING and item == f.default_factory():
                continue
            out[f.name] = plain(item)
        return out
    if isinstance(value, enum.Enum):
        return value.value
    if isinstance(value, tuple):
        return [plain(v) for v in value]
    if isinstance(value, frozenset):
        return sorted(plain(v) for v in value)
    return value


def render(translation: Translation) -> str:
    status = [
        {
            "route": f"{s.kind} {s.key}",
            "generation": s.generation,
            "parents": [
                {
                    "parentRef": p.parent_ref_dict(),
                    "conditions": [
                        {"type": c.type, "status": str(c.status), "reason": c.reason, "message": c.message}
                        for c in p.conditions
                    ],
                }
                for p in s.parents
            ],
        }
        for s in translation.route_status
    ]
    document = {"waypoints": [plain(c) for c in translation.waypoint_configs], "status": status}
    return yaml.safe_dump(document, sort_keys=False, width=120)


def load(case: str) -> list[Obj]:
    return [doc for doc in yaml.safe_load_all((GOLDEN / f"{case}-in.yaml").read_text()) if doc]


def test_every_expected_golden_case_exists() -> None:
    expected = {
        "basic",
        "precedence",
        "weights",
        "filters",
        "cross_namespace",
        "grpc",
        "tcp",
        "tls",
        "invalid",
        "no_waypoint",
        "gateway_parent",
        "timeouts_retries",
        "consumer",
        "serviceentry",
        "virtualservice",
        "virtualservice_httproute",
        "destination_rules",
    }
    assert expected <= set(CASES)


@pytest.mark.parametrize("case", CASES)
def test_routes_match_their_golden_file(case: str) -> None:
    text = render(translate_objects(load(case)))
    path = GOLDEN / f"{case}-out.yaml"
    if os.environ.get("AMBIT_UPDATE_GOLDEN"):
        path.write_text(text)
    assert text == path.read_text()


def config(translation: Translation, key: str = "app/waypoint") -> WaypointConfig:
    return next(c for c in translation.waypoint_configs if c.waypoint == key)


def test_precedence_orders_exact_then_prefix_then_regex_and_ties_by_age_then_name() -> None:
    table = config(translate_objects(load("precedence"))).find_table("app/reviews.app.svc.cluster.local", 9080)
    assert table is not None
    kinds = [r.match.path.kind for r in table.http if r.match.path is not None]
    assert kinds == sorted(
        kinds, key=[PathMatchType.EXACT, PathMatchType.PATH_PREFIX, PathMatchType.REGULAR_EXPRESSION].index
    )
    same = [
        (r.route, str(getattr(r.backends[0].backend, "hostname", None)))
        for r in table.http
        if r.match.path and r.match.path.value == "/same"
    ]
    assert same == [
        ("HTTPRoute/app/a-route", "reviews-v1.app.svc.cluster.local"),
        ("HTTPRoute/app/a-route", "reviews.app.svc.cluster.local"),
        ("HTTPRoute/app/b-route", "reviews-v2.app.svc.cluster.local"),
    ]
    api = [r.route for r in table.http if r.match.path and r.match.path.value == "/api" and not r.match.headers]
    assert api[-2:] == ["HTTPRoute/app/old", "HTTPRoute/app/new-but-same"]


def test_a_consumer_route_applies_only_from_the_waypoints_own_namespace() -> None:
    translation = translate_objects(load("consumer"))
    table = config(translation).find_table("app/reviews.app.svc.cluster.local", 9080)
    assert table is not None and table.http == ()
    status = next(s for s in translation.route_status if s.key == "other/hijack")
    assert status.parents[0].conditions[0].status is False
    shared = config(translation, "infra/shared").find_table("other/bound.other.svc.cluster.local", 80)
    assert shared is not None and [r.route for r in shared.http] == ["HTTPRoute/infra/operator"]


def test_a_route_from_a_namespace_the_waypoint_does_not_admit_attaches_nowhere() -> None:
    translation = translate_objects(load("gateway_parent"))
    routes = {r.route for t in config(translation).tables for r in t.http}
    assert "HTTPRoute/other/intruder" not in routes
    assert "HTTPRoute/app/everything" in routes


def test_header_values_with_line_breaks_never_reach_the_table() -> None:
    table = config(translate_objects(load("filters"))).find_table("app/reviews.app.svc.cluster.local", 9080)
    assert table is not None
    for rule in table.http:
        for modifier in (rule.request_headers, rule.response_headers):
            if modifier is not None:
                assert all("\n" not in v and "\r" not in v for _, v in (*modifier.set, *modifier.add))


@pytest.mark.parametrize(
    "modifier",
    [
        {"set": [{"name": "x-team\n", "value": "a"}]},
        {"add": [{"name": "x-team\n", "value": "a"}]},
        {"remove": ["x-team\n"]},
    ],
)
def test_a_header_name_ending_in_a_newline_makes_the_rule_answer_500(modifier: Obj) -> None:
    """The CRD's pattern is ``^token$`` in RE2, where ``$`` is the end of the text; Python's ``$`` also matches
    before a final newline, so the name is checked as a whole token."""
    route = {
        "apiVersion": "gateway.networking.k8s.io/v1",
        "kind": "HTTPRoute",
        "metadata": {"name": "names", "namespace": "app"},
        "spec": {
            "parentRefs": [{"group": "", "kind": "Service", "name": "reviews"}],
            "rules": [
                {
                    "filters": [{"type": "RequestHeaderModifier", "requestHeaderModifier": modifier}],
                    "backendRefs": [{"name": "reviews-v1", "port": 9080}],
                }
            ],
        },
    }
    translation = translate_objects([*(o for o in load("filters") if o["kind"] != "HTTPRoute"), route])
    table = config(translation).find_table("app/reviews.app.svc.cluster.local", 9080)
    assert table is not None
    (rule,) = table.http
    assert rule.backends == () and rule.request_headers is None
    (status,) = translation.route_status
    resolved = next(c for c in status.parents[0].conditions if c.type == "ResolvedRefs")
    assert resolved.reason == "InvalidFilter"


@pytest.mark.parametrize(
    ("text", "seconds"),
    [("10s", 10.0), ("500ms", 0.5), ("1m", 60.0), ("1h30m", 5400.0), ("0s", None), ("1m30s500ms", 90.5)],
)
def test_durations_parse_as_gateway_api_writes_them(text: str, seconds: float | None) -> None:
    assert parse_duration(text) == seconds


@pytest.mark.parametrize("text", ["", "10", "1.5s", "10 seconds", "-1s", "123456s", "1h1h1h1h1h", "1d", 10, "10s\n"])
def test_bad_durations_are_refused(text: Any) -> None:
    with pytest.raises(ValueError, match="invalid duration"):
        parse_duration(text)


@settings(max_examples=300, deadline=None)
@given(st.text(max_size=40))
@example("[[")  # a nested set: Python warns (FutureWarning), RE2 would read a POSIX class
@example("[[:alpha:]]")
def test_regex_check_never_raises_and_accepted_patterns_compile(pattern: str) -> None:
    import re

    if regex_problem(pattern) is None:
        re.compile(pattern)


KEYS = [
    "path",
    "type",
    "value",
    "matches",
    "filters",
    "backendRefs",
    "name",
    "port",
    "weight",
    "headers",
    "method",
    "retry",
    "timeouts",
    "request",
    "backendRequest",
    "attempts",
    "codes",
    "backoff",
    "kind",
    "group",
    "namespace",
    "queryParams",
    "requestHeaderModifier",
    "set",
    "add",
    "remove",
    "requestRedirect",
    "urlRewrite",
    "requestMirror",
    "backendRef",
    "percent",
    "fraction",
    "statusCode",
    "hostname",
    "service",
    "sectionName",
]
VALUES = st.one_of(
    st.none(),
    st.booleans(),
    st.integers(-5, 70000),
    st.text(max_size=8),
    st.sampled_from(
        [
            "Exact",
            "PathPrefix",
            "RegularExpression",
            "Service",
            "/",
            "/a",
            "(",
            "RequestMirror",
            "RequestHeaderModifier",
            "URLRewrite",
            "RequestRedirect",
            "ReplaceFullPath",
            "reviews",
            "10s",
        ]
    ),
)
ANY_JSON = st.recursive(
    VALUES,
    lambda inner: st.lists(inner, max_size=3) | st.dictionaries(st.sampled_from(KEYS), inner, max_size=4),
    max_leaves=25,
)


@settings(max_examples=300, deadline=None)
@given(st.dictionaries(st.sampled_from(["parentRefs", "hostnames", "rules"]), ANY_JSON, max_size=3), ANY_JSON)
def test_arbitrary_routes_never_break_the_translation(spec: Any, rules: Any) -> None:
    objects = load("basic")
    route = next(o for o in objects if o["kind"] == "HTTPRoute")
    route["spec"]["rules"] = rules
    others = [
        {**route, "kind": kind, "metadata": {**route["metadata"], "name": name}, "spec": spec}
        for kind, name in (("HTTPRoute", "h"), ("GRPCRoute", "g"), ("TCPRoute", "t"), ("TLSRoute", "s"))
    ]
    grpc = {**route, "kind": "GRPCRoute", "metadata": {**route["metadata"], "name": "g2"}}
    tcp = {**route, "kind": "TCPRoute", "metadata": {**route["metadata"], "name": "t2"}}
    tls = {**route, "kind": "TLSRoute", "metadata": {**route["metadata"], "name": "s2"}}
    translation = translate_objects([*objects, *others, grpc, tcp, tls])
    assert {s.key for s in translation.route_status} >= {"app/reviews", "app/g2", "app/t2", "app/s2"}


def test_a_rule_without_retry_gets_istios_default() -> None:
    table = config(translate_objects(load("basic"))).find_table("app/reviews.app.svc.cluster.local", 9080)
    assert table is not None
    assert all(r.retry == RetryPolicy() for r in table.http)
