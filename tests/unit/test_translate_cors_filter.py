"""The HTTPRoute ``CORS`` filter → a rule's CorsPolicy (ambit.controlplane.translate.cors_filter, routerules rule 3):
istiod's origin mapping, its other fields, what a backendRef's CORS filter gets, and arbitrary input (hypothesis):
never a traceback, and every origin match kept comes from an origin the CRD admits."""

from __future__ import annotations

import re
from typing import Any

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st
from tests.unit.json_strategies import cors_filter_specs, json_values, perturbed

from ambit.controlplane.translate.cors_filter import ANY_ORIGIN_PATTERN, cors_policy, is_cors_origin, origin_match
from ambit.controlplane.translate.routerules import INVALID_FILTER, convert_route
from ambit.model.route_matches import ValueMatch, ValueMatchType
from ambit.model.routes import BackendService, CorsPolicy
from ambit.waypoint.patterns import pattern_problem

EXACT, PREFIX, REGEX = ValueMatchType.EXACT, ValueMatchType.PREFIX, ValueMatchType.REGULAR_EXPRESSION


@pytest.mark.parametrize(
    ("origin", "value", "kind"),
    [
        ("*", ANY_ORIGIN_PATTERN, REGEX),
        ("https://www.foo.com", "https://www.foo.com", EXACT),
        ("http://localhost:8080", "http://localhost:8080", EXACT),
        ("https://*", "https://", PREFIX),
        ("https://*.bar.com", r"^https://.*\.bar\.com$", REGEX),
        ("http://*.example-1.org:8443", r"^http://.*\.example-1\.org:8443$", REGEX),
    ],
)
def test_origins_map_as_istiod_maps_them(origin: str, value: str, kind: ValueMatchType) -> None:
    assert is_cors_origin(origin)
    assert origin_match(origin) == ValueMatch("origin", value, kind)


@pytest.mark.parametrize(
    ("origin", "allowed"),
    [
        ("https://www.bar.com", True),
        ("https://xpto.www.bar.com", True),  # '*' is greedy to the left: any number of labels
        ("https://bar.com", False),
        ("http://www.bar.com", False),
        ("https://www.bar.com.evil", False),
        ("https://www.bar.company", False),
    ],
)
def test_a_wildcard_host_matches_any_labels_to_its_left_and_nothing_else(origin: str, allowed: bool) -> None:
    pattern = re.compile(origin_match("https://*.bar.com").value)
    assert (pattern.fullmatch(origin) is not None) is allowed


@pytest.mark.parametrize(
    ("origin", "allowed"),
    [
        ("https://foobar.com", True),
        ("https://foobar.com:12345", True),
        ("chrome-extension://abc", True),
        ("null", False),
        ("https://foobar.com/path", False),
        ("https://foo bar.com", False),
        ("://foobar.com", False),
    ],
)
def test_star_alone_allows_any_well_formed_origin_only(origin: str, allowed: bool) -> None:
    assert (re.fullmatch(ANY_ORIGIN_PATTERN, origin) is not None) is allowed


@pytest.mark.parametrize(
    "origin",
    ["", "https://", "ftp://a.com", "https://a.*.com", "https://*.*.com", "http://localhost:*", "https://a.com/",
     "https://a.com:123456", "https://a_b.com", "*.example.com", "https://" + "a" * 250],
)  # fmt: skip
def test_origins_the_crd_refuses_are_not_cors_origins(origin: str) -> None:
    assert not is_cors_origin(origin)


def test_the_filter_maps_every_field_and_ignores_unmatched_preflights() -> None:
    policy = cors_policy(
        {
            "allowOrigins": ["https://www.foo.com", "https://*.bar.com"],
            "allowMethods": ["GET", "OPTIONS"],
            "allowHeaders": ["x-header-1", "x-header-2"],
            "exposeHeaders": ["x-header-3", "x-header-4"],
            "allowCredentials": True,
            "maxAge": 3600,
        }
    )
    assert policy == CorsPolicy(
        allow_origins=(
            ValueMatch("origin", "https://www.foo.com"),
            ValueMatch("origin", r"^https://.*\.bar\.com$", REGEX),
        ),
        allow_methods="GET,OPTIONS",
        allow_headers="x-header-1,x-header-2",
        expose_headers="x-header-3,x-header-4",
        max_age=3600,
        allow_credentials=True,
        forward_unmatched_preflights=False,
    )


@pytest.mark.parametrize(("max_age", "expected"), [(None, 5), (1, 1), (86400, 86400), (0, None), (-3, None)])
def test_max_age_defaults_to_the_crds_five_seconds_and_is_left_out_below_one(
    max_age: int | None, expected: int | None
) -> None:
    spec: dict[str, Any] = {"allowOrigins": ["*"]}
    if max_age is not None:
        spec["maxAge"] = max_age
    assert cors_policy(spec).max_age == expected


def test_wrong_types_are_left_out() -> None:
    policy = cors_policy(
        {
            "allowOrigins": ["https://a.com", 7, None, "https://*.*.com"],
            "allowMethods": "GET",
            "allowHeaders": [["x"]],
            "allowCredentials": "true",
            "maxAge": "60",
        }
    )
    assert policy == CorsPolicy(
        allow_origins=(ValueMatch("origin", "https://a.com"),), max_age=None, forward_unmatched_preflights=False
    )
    assert cors_policy(None) == CorsPolicy(max_age=5, forward_unmatched_preflights=False)


def _lookup(group: str, kind: str, name: str, namespace: str, route_kind: str) -> BackendService | str:
    return BackendService("app", f"{name}.app.svc.cluster.local", 80)


def _route(rule: dict[str, Any]) -> dict[str, Any]:
    return {"metadata": {"namespace": "app", "name": "r"}, "spec": {"rules": [rule]}}


CORS = {"type": "CORS", "cors": {"allowOrigins": ["https://a.com"], "maxAge": 60}}


def test_a_rules_cors_filter_goes_on_each_of_its_matches() -> None:
    rule = {
        "matches": [{"path": {"value": "/a"}}, {"path": {"value": "/b"}}],
        "filters": [CORS],
        "backendRefs": [{"name": "web", "port": 80}],
    }
    converted = convert_route("HTTPRoute", _route(rule), _lookup)
    assert not converted.problems
    expected = CorsPolicy((ValueMatch("origin", "https://a.com"),), max_age=60, forward_unmatched_preflights=False)
    assert [e.rule.cors for e in converted.http] == [expected, expected]
    assert all(e.rule.backends[0].backend is not None for e in converted.http)


def test_a_backend_refs_cors_filter_is_refused_as_istiod_refuses_it() -> None:
    rule = {"backendRefs": [{"name": "web", "port": 80, "filters": [CORS]}, {"name": "api", "port": 80}]}
    converted = convert_route("HTTPRoute", _route(rule), _lookup)
    assert [(p.reason, "CORS" in p.message) for p in converted.problems] == [(INVALID_FILTER, True)]
    (entry,) = converted.http
    assert entry.rule.cors is None
    assert [b.backend is not None for b in entry.rule.backends] == [False, True]  # its share answers 500


def test_a_cors_filter_beside_an_unsupported_filter_is_not_applied() -> None:
    rule = {"filters": [CORS, {"type": "ExtensionRef", "extensionRef": {}}], "backendRefs": [{"name": "w", "port": 1}]}
    (entry,) = convert_route("HTTPRoute", _route(rule), _lookup).http
    assert entry.rule.cors is None and entry.rule.backends == ()  # the rule answers 500


@settings(max_examples=300, deadline=None)
@given(value=json_values() | perturbed(cors_filter_specs()))
def test_any_json_gives_a_policy_that_ignores_unmatched_preflights(value: Any) -> None:
    policy = cors_policy(value)
    assert not policy.forward_unmatched_preflights
    assert policy.max_age is None or policy.max_age >= 1
    assert all(m.kind in (EXACT, PREFIX, REGEX) and m.value for m in policy.allow_origins)


@settings(max_examples=300, deadline=None)
@given(
    origins=st.lists(
        st.text(alphabet="htps:/*.-abc019", max_size=24) | st.sampled_from(["*", "https://*", "https://*.a.b"]),
        max_size=6,
    )
)
def test_every_origin_kept_is_admitted_and_its_match_holds_for_itself_unless_it_has_a_wildcard(
    origins: list[str],
) -> None:
    policy = cors_policy({"allowOrigins": origins})
    kept = [o for o in origins if is_cors_origin(o)]
    assert policy.allow_origins == tuple(origin_match(o) for o in kept)
    for origin, match in zip(kept, policy.allow_origins, strict=True):
        assert match.kind is EXACT or "*" in origin
        if match.kind is REGEX:
            assert origin.count("*") == 1  # one wildcard: at most one '.*', never a costly pattern
            assert pattern_problem(match.value) is None  # the waypoint's engine runs it
