"""AuthorizationPolicy CUSTOM with an external authorizer: the mesh config's ``extensionProviders``
(extension_providers rules 1-5), the translation (waypoint_policies rule 4), the wire form (xds.ext_authz) and the
waypoint's decisions (waypoint.ext_authz rules 1-7)."""

from __future__ import annotations

import ipaddress
import time
from pathlib import Path
from typing import Any

import pytest
import yaml
from hypothesis import given, settings
from hypothesis import strategies as st
from tests.unit.test_translate_waypoint_policies import _objects

from ambit.api import waypoint_pb2 as pb
from ambit.controlplane.translate import extension_providers as ep
from ambit.controlplane.translate import translate_all
from ambit.controlplane.translate.meshconfig import (
    MeshConfigError,
    MeshConfigMemo,
    mesh_config_of,
    parse_mesh_config,
)
from ambit.controlplane.translate.skips import Skipped
from ambit.controlplane.translate.waypoint_policies import (
    TargetIndex,
    translate_selected_policy,
    translate_waypoint_policy,
)
from ambit.model.envoyfilter import HeaderAction, HeaderOp
from ambit.model.extauthz import MAX_CHECK_BODY, ExtAuthzProvider, HeaderPattern, ProviderKind
from ambit.model.policy import Action, Clause, Match, Policy, Rule, Scope, StringMatch
from ambit.rbac import Connection, Request
from ambit.waypoint.decisions import RequestHead
from ambit.waypoint.ext_authz import (
    CheckAllowed,
    CheckDenied,
    CustomPolicies,
    DeniedOutright,
    http_check_head,
    judge_http_answer,
    on_error,
)
from ambit.waypoint.ext_authz_body import ReplayingSide, read_ahead
from ambit.waypoint.ext_authz_edits import RequestEdit
from ambit.waypoint.http1 import BodyData, Event, MessageEnded, Signal
from ambit.xds.authorization import PolicyReader
from ambit.xds.errors import XdsConversionError
from ambit.xds.waypoint_policies import waypoint_policy_from_proto, waypoint_policy_to_proto

SAMPLE_MESH = """
extensionProviders:
- name: sample-ext-authz-http
  envoyExtAuthzHttp:
    service: ext-authz.foo.svc.cluster.local
    port: 8000
    includeRequestHeadersInCheck: ["x-ext-authz"]
- name: sample-ext-authz-grpc
  envoyExtAuthzGrpc:
    service: foo/ext-authz.foo.svc.cluster.local
    port: "9000"
    timeout: 0.5s
    failOpen: true
- name: zipkin
  zipkin: {service: zipkin.istio-system.svc.cluster.local, port: 9411}
"""


ADDITIONAL = "includeAdditionalHeadersInCheck"


def provider(**fields: Any) -> ExtAuthzProvider:
    base: dict[str, Any] = {
        "name": "authz",
        "kind": ProviderKind.HTTP,
        "service": "foo/ext-authz.foo.svc.cluster.local",
        "port": 8000,
    }
    return ExtAuthzProvider(**(base | fields))


def mesh_with(entry: dict[str, Any]) -> str:
    return yaml.safe_dump({"extensionProviders": [entry]})


# --- the mesh config ----------------------------------------------------------------------------------------------


def test_the_samples_providers_are_read_and_other_kinds_ignored() -> None:
    mesh = parse_mesh_config(SAMPLE_MESH)
    http, grpc = mesh.ext_authz_providers
    assert (http.name, http.kind, http.port, http.timeout, http.status_on_error) == (
        "sample-ext-authz-http",
        ProviderKind.HTTP,
        8000,
        600.0,  # istiod's default
        403,
    )
    assert http.include_request_headers == (HeaderPattern("x-ext-authz"),)
    assert (grpc.kind, grpc.port, grpc.timeout, grpc.fail_open) == (ProviderKind.GRPC, 9000, 0.5, True)
    assert grpc.host_and_namespace == ("ext-authz.foo.svc.cluster.local", "foo")
    assert mesh.find_ext_authz("zipkin") is None and mesh.find_ext_authz("sample-ext-authz-http") is http


def test_every_http_field_is_read_in_camel_or_snake_case() -> None:
    text = mesh_with(
        {
            "name": "full",
            "envoy_ext_authz_http": {
                "service": "10.0.0.1",
                "port": 80,
                "status_on_error": "503",
                "path_prefix": "/check",
                "include_headers_in_check": ["X-A*"],  # the deprecated field counts when the new one is unset
                "includeAdditionalHeadersInCheck": {"X-Extra": "1"},
                "headersToUpstreamOnAllow": ["*-user"],
                "headersToDownstreamOnDeny": ["x-reason"],
                "headersToDownstreamOnAllow": ["set-cookie"],
                "clearRouteCache": True,
                "includeRequestBodyInCheck": {"maxRequestBytes": 10},
            },
        }
    )
    (p,) = parse_mesh_config(text).ext_authz_providers
    assert (p.status_on_error, p.path_prefix) == (503, "/check")
    assert p.include_request_headers == (HeaderPattern("x-a", prefix=True),)
    assert p.include_additional_headers == (("x-extra", "1"),)
    assert p.headers_to_upstream_on_allow == (HeaderPattern("-user", suffix=True),)
    assert p.headers_to_downstream_on_deny == (HeaderPattern("x-reason"),)
    assert p.headers_to_downstream_on_allow == (HeaderPattern("set-cookie"),)


@pytest.mark.parametrize(
    ("entry", "message"),
    [
        ({"envoyExtAuthzHttp": {"service": "a", "port": 1}}, "empty extension provider name"),
        ({"name": "a", "envoyExtAuthzHttp": {"port": 1}}, "service must not be empty"),
        ({"name": "a", "envoyExtAuthzHttp": {"service": "a b", "port": 1}}, "is not a hostname"),
        ({"name": "a", "envoyExtAuthzHttp": {"service": "a", "port": 0}}, "port must be in the range"),
        ({"name": "a", "envoyExtAuthzHttp": {"service": "a", "port": True}}, "port must be in the range"),
        ({"name": "a", "envoyExtAuthzGrpc": {"service": "a", "port": 70000}}, "port must be in the range"),
        ({"name": "a", "envoyExtAuthzHttp": {"service": "a", "port": 1, "statusOnError": "999"}}, "statusOnError"),
        ({"name": "a", "envoyExtAuthzHttp": {"service": "a", "port": 1, "statusOnError": "x"}}, "statusOnError"),
        ({"name": "a", "envoyExtAuthzHttp": {"service": "a", "port": 1, "timeout": "5"}}, "expected a duration"),
        ({"name": "a", "envoyExtAuthzHttp": {"service": "a", "port": 1, "timeout": "0s"}}, "must be positive"),
        ({"name": "a", "envoyExtAuthzHttp": {"service": "a", "port": 1, "failOpen": "yes"}}, "true or false"),
        ({"name": "a", "envoyExtAuthzHttp": {"service": "a", "port": 1, "pathPrefix": "x"}}, "begin with `/`"),
        (
            {"name": "a", "envoyExtAuthzHttp": {"service": "a", "port": 1, "headersToUpstreamOnAllow": ["*"]}},
            "single wildcard",
        ),
        (
            {"name": "a", "envoyExtAuthzHttp": {"service": "a", "port": 1, ADDITIONAL: {"a b": "1"}}},
            "is not a header name",
        ),
        (
            {"name": "a", "envoyExtAuthzHttp": {"service": "a", "port": 1, ADDITIONAL: {"a": "1\r\nb: 2"}}},
            "control characters",
        ),
        ({"name": "a", "envoyExtAuthzHttp": "nope"}, "expected an object"),
    ],
)
def test_an_invalid_provider_is_one_clear_line(entry: dict[str, Any], message: str) -> None:
    with pytest.raises(MeshConfigError, match="extensionProviders\\[0\\]") as info:
        parse_mesh_config(mesh_with(entry))
    assert message in str(info.value) and "\n" not in str(info.value)


def test_duplicate_names_are_refused_across_kinds() -> None:
    text = yaml.safe_dump(
        {
            "extensionProviders": [
                {"name": "a", "zipkin": {"service": "z", "port": 1}},
                {"name": "a", "envoyExtAuthzHttp": {"service": "b", "port": 1}},
            ]
        }
    )
    with pytest.raises(MeshConfigError, match="duplicate extension provider name a"):
        parse_mesh_config(text)


def test_a_name_istiods_builder_refuses_leaves_the_provider_out_without_failing_the_mesh() -> None:
    mesh = parse_mesh_config(mesh_with({"name": "Bad_Name", "envoyExtAuthzHttp": {"service": "a", "port": 1}}))
    assert mesh.ext_authz_providers == ()


def test_bounds_on_providers_and_patterns() -> None:
    many = [{"name": f"p{i}", "envoyExtAuthzHttp": {"service": "a", "port": 1}} for i in range(ep.MAX_PROVIDERS + 1)]
    with pytest.raises(MeshConfigError, match="at most"):
        parse_mesh_config(yaml.safe_dump({"extensionProviders": many}))
    patterns = [f"h{i}" for i in range(ep.MAX_PATTERNS + 1)]
    entry = {"name": "a", "envoyExtAuthzHttp": {"service": "a", "port": 1, "headersToUpstreamOnAllow": patterns}}
    with pytest.raises(MeshConfigError, match="header patterns in all"):
        parse_mesh_config(mesh_with(entry))


def test_a_bad_provider_edit_keeps_the_previous_mesh_config() -> None:
    def config_map(text: str, version: str) -> dict[str, Any]:
        meta = {"name": "istio", "namespace": "istio-system", "uid": "u", "resourceVersion": version}
        return {"metadata": meta, "data": {"mesh": text}}

    memo = MeshConfigMemo()
    skips: list[Skipped] = []
    good = mesh_config_of([config_map(SAMPLE_MESH, "1")], namespace="istio-system", memo=memo, skips=skips)
    bad = config_map(mesh_with({"name": "x", "envoyExtAuthzHttp": {"service": "a", "port": 0}}), "2")
    assert mesh_config_of([bad], namespace="istio-system", memo=memo, skips=skips) == good
    (problem,) = skips
    assert "port must be in the range" in problem.reason and "previous mesh config stays" in problem.reason


@pytest.mark.parametrize(
    "pattern",
    [ep._DURATION, ep._LABEL, ep._DNS_NAME, ep._CONTROL],
)
def test_the_patterns_run_in_linear_time_on_hostile_input(pattern: Any) -> None:
    hostile = "a" * 50_000 + "!"
    started = time.perf_counter()
    pattern.fullmatch(hostile)
    pattern.search(hostile)
    assert time.perf_counter() - started < 1.0


_scalars = st.none() | st.booleans() | st.integers(-5, 70_000) | st.text(max_size=6) | st.sampled_from(["*", "/x"])
_values = st.recursive(
    _scalars,
    lambda inner: (
        st.lists(inner, max_size=3)
        | st.dictionaries(
            st.sampled_from(
                [
                    "name",
                    "service",
                    "port",
                    "timeout",
                    "failOpen",
                    "statusOnError",
                    "pathPrefix",
                    "includeRequestHeadersInCheck",
                    "includeAdditionalHeadersInCheck",
                    "headersToUpstreamOnAllow",
                    "headersToDownstreamOnDeny",
                    "includeRequestBodyInCheck",
                    "maxRequestBytes",
                    "allowPartialMessage",
                    "packAsBytes",
                    "envoyExtAuthzHttp",
                    "envoyExtAuthzGrpc",
                    "x",
                ]
            ),
            inner,
            max_size=5,
        )
    ),
    max_leaves=16,
)


@given(_values)
@settings(max_examples=400, deadline=None)
def test_any_shape_of_extension_providers_gives_providers_or_a_mesh_config_error(raw: Any) -> None:
    try:
        mesh = parse_mesh_config(yaml.safe_dump({"extensionProviders": raw}))
    except MeshConfigError as exc:
        assert str(exc) and "\n" not in str(exc)
        return
    for p in mesh.ext_authz_providers:  # what parsed also survives the wire
        policy = Policy("p", "ns", Scope.WAYPOINT, Action.CUSTOM, (), ext_authz=p)
        back = waypoint_policy_from_proto(PolicyReader("w"), "policies[0]", waypoint_policy_to_proto(policy))
        assert back.ext_authz is not None and back.ext_authz.port == p.port


# --- translation ---------------------------------------------------------------------------------------------------

INDEX = TargetIndex(waypoints=frozenset({"shop/waypoint"}), gateways=frozenset({"shop/ingress"}))
GATEWAY = {"group": "gateway.networking.k8s.io", "kind": "Gateway", "name": "waypoint"}
PROVIDERS = parse_mesh_config(SAMPLE_MESH).ext_authz_providers


def custom(provider_name: str, refs: list[dict[str, Any]] | None = None) -> dict[str, Any]:
    spec: dict[str, Any] = {
        "action": "CUSTOM",
        "provider": {"name": provider_name},
        "rules": [{"to": [{"operation": {"paths": ["/headers"]}}]}],
    }
    if refs is not None:
        spec["targetRefs"] = refs
    return {"metadata": {"name": "ext", "namespace": "shop", "generation": 1}, "spec": spec}


def test_a_custom_policy_naming_a_provider_carries_it_and_its_rules() -> None:
    result = translate_waypoint_policy(custom("sample-ext-authz-http", [GATEWAY]), INDEX, providers=PROVIDERS)
    policy = result.waypoint_policy
    assert policy is not None and policy.action is Action.CUSTOM and policy.ext_authz == PROVIDERS[0]
    assert policy.rules == (Rule((Clause((Match(paths=(StringMatch.exact("/headers"),)),)),)),)
    assert result.status is not None and result.status.accepted and result.status.message == "bound to shop/waypoint"


def test_a_selected_custom_policy_for_an_ingress_gateway_carries_its_provider_too() -> None:
    selected = translate_selected_policy(custom("sample-ext-authz-grpc"), PROVIDERS)
    assert selected is not None and selected.policy.action is Action.CUSTOM
    assert selected.policy.ext_authz == PROVIDERS[1]
    unknown = translate_selected_policy(custom("gone"), PROVIDERS)
    assert unknown is not None and unknown.policy.action is Action.DENY and unknown.policy.ext_authz is None


def test_a_custom_policy_without_a_provider_is_a_deny_of_its_rules() -> None:
    obj = custom("x", [GATEWAY])
    del obj["spec"]["provider"]
    result = translate_waypoint_policy(obj, INDEX, providers=PROVIDERS)
    assert result.waypoint_policy is not None and result.waypoint_policy.action is Action.DENY
    assert result.status is not None and "provider '' is not an external authorizer" in result.status.message


# --- the wire -------------------------------------------------------------------------------------------------------


def test_a_custom_policy_round_trips_over_the_wire() -> None:
    full = provider(
        timeout=0.25,
        fail_open=True,
        status_on_error=503,
        path_prefix="/check",
        include_request_headers=(HeaderPattern("x-ext-authz"), HeaderPattern("x-", prefix=True)),
        include_additional_headers=(("x-extra", "1"),),
        headers_to_upstream_on_allow=(HeaderPattern("-user", suffix=True),),
        headers_to_downstream_on_deny=(HeaderPattern("x-reason"),),
        headers_to_downstream_on_allow=(HeaderPattern("set-cookie"),),
        max_request_bytes=8192,
        allow_partial_message=True,
        pack_as_bytes=True,
    )
    policy = Policy("p", "ns", Scope.WAYPOINT, Action.CUSTOM, (Rule(),), ext_authz=full)
    assert waypoint_policy_from_proto(PolicyReader("w"), "p", waypoint_policy_to_proto(policy)) == policy


@pytest.mark.parametrize(
    ("edit", "problem"),
    [
        (lambda m: m.ClearField("ext_authz"), "only a CUSTOM policy"),
        (lambda m: setattr(m.ext_authz, "kind", 0), "ext_authz.kind"),
        (lambda m: setattr(m.ext_authz, "port", 0), "ext_authz.port"),
        (lambda m: setattr(m.ext_authz, "timeout_ms", 0), "ext_authz.timeout_ms"),
        (lambda m: setattr(m.ext_authz, "status_on_error", 42), "ext_authz.status_on_error"),
        (lambda m: setattr(m.ext_authz, "path_prefix", "nope"), "ext_authz.path_prefix"),
        (lambda m: m.ext_authz.include_request_headers.append("*"), "include_request_headers[0]"),
        (
            lambda m: m.ext_authz.include_additional_headers.append(pb.HeaderValue(name="a b", value="")),
            "include_additional_headers[0].name",
        ),
        (
            lambda m: m.ext_authz.include_additional_headers.append(pb.HeaderValue(name="a", value="\r\n")),
            "include_additional_headers[0].value",
        ),
        (lambda m: setattr(m, "action", pb.POLICY_ACTION_DENY), "only a CUSTOM policy"),
        (lambda m: setattr(m.ext_authz, "max_request_bytes", MAX_CHECK_BODY + 1), "ext_authz.max_request_bytes"),
    ],
)
def test_a_bad_authorizer_on_the_wire_is_refused_naming_the_field(edit: Any, problem: str) -> None:
    message = waypoint_policy_to_proto(Policy("p", "ns", Scope.WAYPOINT, Action.CUSTOM, (), ext_authz=provider()))
    edit(message)
    with pytest.raises(XdsConversionError, match=problem.replace("[", "\\[").replace("]", "\\]")):
        waypoint_policy_from_proto(PolicyReader("w"), "policies[0]", message)


# --- the decision ---------------------------------------------------------------------------------------------------


def conn() -> Connection:
    return Connection(ipaddress.ip_address("10.0.0.1"), None, ipaddress.ip_address("10.0.0.2"), 80)


def req(path: str = "/headers", method: str = "GET") -> Request:
    return Request(method=method, host="httpbin", path=path, headers=())


def custom_policy(name: str, ext: ExtAuthzProvider, path: str = "/headers", dry_run: bool = False) -> Policy:
    rules = (Rule((Clause((Match(paths=(StringMatch.exact(path),)),)),)),)
    return Policy(name, "ns", Scope.WAYPOINT, Action.CUSTOM, rules, dry_run, ext_authz=ext)


def test_only_requests_matching_a_custom_rule_go_to_the_authorizer() -> None:
    ext = provider()
    policies = CustomPolicies.of([custom_policy("a", ext), Policy("allow", "ns", Scope.WAYPOINT, Action.ALLOW)])
    assert policies is not None
    assert policies.step(conn(), req("/headers")) == ext
    assert policies.step(conn(), req("/ip")) is None
    assert CustomPolicies.of([Policy("allow", "ns", Scope.WAYPOINT, Action.ALLOW)]) is None


def test_a_dry_run_custom_policy_still_asks_the_authorizer() -> None:
    """istiod's documented limitation: its rules set the metadata ext_authz is enabled by."""
    policies = CustomPolicies.of([custom_policy("a", provider(), dry_run=True)])
    assert policies is not None and policies.step(conn(), req()) == provider()


def test_two_providers_on_one_destination_deny_what_either_policy_matches() -> None:
    policies = CustomPolicies.of(
        [custom_policy("a", provider(name="one")), custom_policy("b", provider(name="two"), path="/ip")]
    )
    assert policies is not None
    assert policies.step(conn(), req("/ip")) == DeniedOutright("ns/b")
    assert policies.step(conn(), req("/other")) is None
    same = CustomPolicies.of([custom_policy("a", provider()), custom_policy("b", provider(), path="/ip")])
    assert same is not None and same.step(conn(), req("/ip")) == provider()


def test_the_check_request_carries_the_method_prefixed_path_host_and_the_named_headers() -> None:
    ext = provider(
        path_prefix="/check",
        include_request_headers=(HeaderPattern("x-ext-authz"), HeaderPattern("x-b", prefix=True)),
        include_additional_headers=(("x-added", "1"), ("x-ext-authz", "forced")),
    )
    head = RequestHead(
        "POST",
        "/headers?a=1",
        "httpbin:8000",
        (
            ("x-ext-authz", "allow"),
            ("X-Bee", "b"),
            ("authorization", "Bearer t"),
            ("cookie", "secret"),
            ("content-length", "12"),
            ("transfer-encoding", "chunked"),
        ),
    )
    check = http_check_head(ext, head)
    assert (check.method, check.path, check.authority) == ("POST", "/check/headers?a=1", "httpbin:8000")
    assert check.headers == (
        ("X-Bee", "b"),
        ("authorization", "Bearer t"),
        ("x-added", "1"),
        ("x-ext-authz", "forced"),
        ("content-length", "0"),
    )


def test_a_200_allows_with_the_named_headers_up_and_down() -> None:
    ext = provider(
        headers_to_upstream_on_allow=(HeaderPattern("x-ext-authz-check-result"),),
        headers_to_downstream_on_allow=(HeaderPattern("set-cookie"),),
    )
    answer = (
        ("x-ext-authz-check-result", "allowed"),
        ("set-cookie", "a=1"),
        ("x-other", "no"),
        ("content-length", "0"),
    )
    assert judge_http_answer(ext, 200, answer, b"") == CheckAllowed(
        (RequestEdit("x-ext-authz-check-result", "allowed"),), (HeaderOp(HeaderAction.APPEND, "set-cookie", "a=1"),)
    )
    assert judge_http_answer(provider(), 200, answer, b"ignored") == CheckAllowed()


def test_a_denial_passes_the_authorizers_status_body_and_headers_with_flag_uaex() -> None:
    answer = (("x-ext-authz-check-result", "denied"), ("host", "authz"), ("content-length", "3"), ("location", "/l"))
    denied = judge_http_answer(provider(), 401, answer, b"no!")
    assert isinstance(denied, CheckDenied)
    assert (denied.status, denied.body, denied.flags) == (401, b"no!", "UAEX")
    assert denied.headers == (("x-ext-authz-check-result", "denied"), ("location", "/l"))  # every one but host
    named = judge_http_answer(provider(headers_to_downstream_on_deny=(HeaderPattern("x-none"),)), 403, answer, b"")
    assert isinstance(named, CheckDenied) and named.headers == (("location", "/l"),)  # location always passes


def test_errors_give_status_on_error_or_pass_with_fail_open() -> None:
    assert judge_http_answer(provider(), 503, (), b"down") == CheckDenied(
        403, (), b"", "ext_authz_error: the authorizer answered 503"
    )
    assert on_error(provider(status_on_error=500), "boom") == CheckDenied(500, (), b"", "boom")
    opened = judge_http_answer(provider(fail_open=True), 500, (), b"")
    assert isinstance(opened, CheckAllowed) and opened.upstream == () and "failOpen" in opened.reason


def test_an_allowing_answer_may_name_request_headers_to_remove_but_not_host() -> None:
    answer = (("x-envoy-auth-headers-to-remove", "Authorization, x-token"), ("x-envoy-auth-headers-to-remove", "host"))
    allowed = judge_http_answer(provider(headers_to_upstream_on_allow=(HeaderPattern.of("x-*"),)), 200, answer, b"")
    assert isinstance(allowed, CheckAllowed) and allowed.remove == ("authorization", "x-token")
    assert allowed.upstream == ()  # the list itself is Envoy's, never passed on
    denied = judge_http_answer(provider(), 403, answer, b"")
    assert isinstance(denied, CheckDenied) and denied.headers == ()


# --- delivery through translate_all -------------------------------------------------------------------------------


def test_the_mesh_config_map_providers_reach_the_waypoint_with_the_custom_policy() -> None:
    objects = _objects()
    objects["authorization_policies"] = [
        {
            "metadata": {"name": "ext-authz", "namespace": "app"},
            "spec": {
                "targetRefs": [{**GATEWAY}],
                "action": "CUSTOM",
                "provider": {"name": "sample-ext-authz-http"},
                "rules": [{"to": [{"operation": {"paths": ["/headers"]}}]}],
            },
        }
    ]
    mesh = {"metadata": {"name": "istio", "namespace": "istio-system"}, "data": {"mesh": SAMPLE_MESH}}
    translation = translate_all(pods=[], endpoint_slices=[], config_maps=[mesh], **objects)  # type: ignore[arg-type]
    (config,) = translation.waypoint_configs
    (policy,) = config.policies
    assert (policy.key, policy.action, policy.ext_authz) == ("app/ext-authz", Action.CUSTOM, PROVIDERS[0])
    (status,) = translation.waypoint_policy_status
    assert (status.accepted, status.message) == (True, "bound to app/waypoint")

    without = translate_all(pods=[], endpoint_slices=[], **objects)  # type: ignore[arg-type]
    (config,) = without.waypoint_configs
    assert config.policies[0].action is Action.DENY  # no such provider: istiod's deny config


# --- the body in the check ----------------------------------------------------------------------------------------


def test_include_request_body_in_check_is_read_and_bounded() -> None:
    body = {"maxRequestBytes": 5_000_000, "allowPartialMessage": True, "packAsBytes": True}
    (p,) = parse_mesh_config(
        mesh_with({"name": "a", "envoyExtAuthzGrpc": {"service": "a", "port": 1, "includeRequestBodyInCheck": body}})
    ).ext_authz_providers
    assert (p.max_request_bytes, p.allow_partial_message, p.pack_as_bytes) == (MAX_CHECK_BODY, True, True)
    for bad in ({}, {"maxRequestBytes": 0}, {"maxRequestBytes": "x"}, {"maxRequestBytes": 1, "packAsBytes": "y"}, 3):
        entry = {"name": "a", "envoyExtAuthzHttp": {"service": "a", "port": 1, "includeRequestBodyInCheck": bad}}
        with pytest.raises(MeshConfigError, match="includeRequestBodyInCheck"):
            parse_mesh_config(mesh_with(entry))


def test_a_check_with_a_body_says_its_length_and_whether_it_was_cut() -> None:
    head = RequestHead("POST", "/p", "h", (("content-length", "100"),))
    check = http_check_head(provider(max_request_bytes=4), head, b"abcd", partial=True)
    assert check.headers == (("content-length", "4"),)
    named = provider(max_request_bytes=4, include_request_headers=(HeaderPattern.of("x-envoy-auth-*"),))
    spoofed = RequestHead("POST", "/p", "h", (("x-envoy-auth-partial-body", "false"),))
    check = http_check_head(named, spoofed, b"abcd", partial=True)
    assert check.headers == (("x-envoy-auth-partial-body", "true"), ("content-length", "4"))  # ours, not the client's


class Side:
    """A client's side that hands out scripted events (and counts 100-continue prompts)."""

    def __init__(self, *events: Event) -> None:
        self.events = list(events)
        self.continued = 0

    async def next_event(self, *, head: bool = False) -> Event:
        return self.events.pop(0)

    async def continue_if_waited(self) -> None:
        self.continued += 1


async def drain(side: ReplayingSide) -> list[Event]:
    out = []
    while True:
        event = await side.next_event()
        out.append(event)
        if not isinstance(event, BodyData):
            return out


async def test_read_ahead_hands_every_event_on_in_order() -> None:
    events: list[Event] = [BodyData(b"abc"), BodyData(b"defgh"), BodyData(b"ij"), MessageEnded((("t", "1"),))]
    client = Side(*events)
    ahead = await read_ahead(client, 6)  # type: ignore[arg-type]
    assert (ahead.body, ahead.longer, client.continued) == (b"abcdef", True, 1)
    assert await drain(ahead.side) == events

    whole = await read_ahead(Side(BodyData(b"abc"), MessageEnded()), 3)  # type: ignore[arg-type]
    assert (whole.body, whole.longer) == (b"abc", False)

    broken = await read_ahead(Side(BodyData(b"ab"), Signal.CLOSED), 10)  # type: ignore[arg-type]
    assert broken.body == b"ab" and await drain(broken.side) == [BodyData(b"ab"), Signal.CLOSED]


def test_a_tcp_connection_meets_custom_rules_as_a_deny_rule_does() -> None:
    """Rule 10: an HTTP field of a CUSTOM rule is ignored on a TCP chain (istiod builds CUSTOM as DENY rules)."""
    policies = CustomPolicies.of([custom_policy("a", provider(kind=ProviderKind.GRPC))])
    assert policies is not None and policies.step(conn(), None) == provider(kind=ProviderKind.GRPC)
    other_port = Policy(
        "b",
        "ns",
        Scope.WAYPOINT,
        Action.CUSTOM,
        (Rule((Clause((Match(destination_ports=(9,)),)),)),),
        ext_authz=provider(),
    )
    only = CustomPolicies.of([other_port])
    assert only is not None and only.step(conn(), None) is None


def test_the_lab_example_of_istios_task_gives_the_waypoint_its_authorizer() -> None:
    example = Path(__file__).parents[2] / "examples" / "lab" / "ext-authz.yaml"
    docs = [d for d in yaml.safe_load_all(example.read_text(encoding="utf-8")) if d]
    kinds = {
        "ConfigMap": "config_maps",
        "Namespace": "namespaces",
        "Gateway": "gateways",
        "Service": "services",
        "AuthorizationPolicy": "authorization_policies",
    }
    objects: dict[str, list[dict[str, Any]]] = {k: [] for k in kinds.values()}
    for doc in docs:
        if doc["kind"] in kinds:
            objects[kinds[doc["kind"]]].append(doc)
    # What the cluster adds: the waypoint's address (its deployment controller) and the built-in class.
    objects["gateways"][0]["status"] = {"addresses": [{"type": "Hostname", "value": "waypoint.foo.svc.cluster.local"}]}
    waypoint_class = {"metadata": {"name": "istio-waypoint"}, "spec": {"controllerName": "istio.io/mesh-controller"}}
    translation = translate_all(
        pods=[],
        endpoint_slices=[],
        gateway_classes=[waypoint_class],
        **objects,  # type: ignore[arg-type]
    )
    (config,) = translation.waypoint_configs
    (policy,) = config.policies
    assert policy.action is Action.CUSTOM and policy.ext_authz is not None
    assert (policy.ext_authz.service, policy.ext_authz.port) == ("ext-authz.foo.svc.cluster.local", 8000)
    assert not [s for s in translation.skipped if s.kind == "ConfigMap"]
