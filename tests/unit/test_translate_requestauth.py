"""RequestAuthentication → each waypoint's policies (ambit.controlplane.translate.requestauth): the rules, the
targets, Istio's validation as skips, and the binding to waypoints."""

from __future__ import annotations

from typing import Any

import pytest
from tests.unit.jwt_keys import rsa_signer

from ambit.controlplane.translate import translate_all
from ambit.controlplane.translate.requestauth import (
    RequestAuthTranslation,
    Target,
    bind_to_waypoints,
    parse_duration,
    translate_request_authentication,
)
from ambit.controlplane.translate.skips import Skipped
from ambit.model.requestauth import ClaimToHeader, JwtHeader, JwtRule, RequestAuthentication

ROOT = "istio-system"
JWKS = rsa_signer(kid="k1").jwks()
WAYPOINT = {"group": "gateway.networking.k8s.io", "kind": "Gateway", "name": "waypoint"}


def obj(spec: dict[str, Any], namespace: str = "app", name: str = "jwt") -> dict[str, Any]:
    return {
        "apiVersion": "security.istio.io/v1",
        "kind": "RequestAuthentication",
        "metadata": {"name": name, "namespace": namespace, "uid": "u1"},
        "spec": spec,
    }


def translate(o: dict[str, Any]) -> tuple[RequestAuthTranslation, list[Skipped]]:
    skips: list[Skipped] = []
    return translate_request_authentication(o, root_namespace=ROOT, skips=skips), skips


def test_a_full_rule_is_translated_field_for_field() -> None:
    result, skips = translate(
        obj(
            {
                "targetRefs": [WAYPOINT],
                "jwtRules": [
                    {
                        "issuer": "https://issuer.example",
                        "audiences": ["a", "b"],
                        "jwks": JWKS,
                        "fromHeaders": [{"name": "X-Token", "prefix": "Bearer "}],
                        "fromParams": ["tok"],
                        "fromCookies": ["session"],
                        "outputPayloadToHeader": "X-Jwt-Payload",
                        "outputClaimToHeaders": [{"header": "x-sub", "claim": "sub"}],
                        "forwardOriginalToken": True,
                        "timeout": "1.5s",
                        "spaceDelimitedClaims": ["roles"],
                    }
                ],
            }
        )
    )
    assert skips == []
    assert result.targets == (Target("Gateway", "app", "waypoint"),)
    assert result.policy == RequestAuthentication(
        "jwt",
        "app",
        (
            JwtRule(
                issuer="https://issuer.example",
                audiences=("a", "b"),
                jwks=JWKS,
                from_headers=(JwtHeader("x-token", "Bearer "),),
                from_params=("tok",),
                from_cookies=("session",),
                output_payload_to_header="x-jwt-payload",
                output_claim_to_headers=(ClaimToHeader("x-sub", "sub"),),
                forward_original_token=True,
                timeout_seconds=1.5,
                space_delimited_claims=("roles",),
            ),
        ),
    )


def test_a_jwks_uri_rule_gets_istios_default_timeout() -> None:
    result, _ = translate(obj({"targetRef": WAYPOINT, "jwtRules": [{"issuer": "i", "jwksUri": "https://k/j"}]}))
    assert result.policy is not None and result.policy.rules == (JwtRule("i", jwks_uri="https://k/j"),)


@pytest.mark.parametrize(
    ("spec", "labels"),
    [({"selector": {"matchLabels": {"app": "a"}}}, (("app", "a"),)), ({}, ()), ({"selector": {}}, ())],
    ids=["selector", "namespace-wide", "empty selector"],
)
def test_policies_without_target_refs_are_ignored_at_waypoints_without_a_skip_and_keep_their_labels(
    spec: dict[str, Any], labels: tuple[tuple[str, str], ...]
) -> None:
    result, skips = translate(obj({**spec, "jwtRules": [{"issuer": "i", "jwks": JWKS}]}))
    assert skips == [] and result.targets == () and result.workload_labels == labels
    assert result.policy is not None and result.policy.rules == (JwtRule("i", jwks=JWKS),)
    assert bind_to_waypoints([result], waypoints=["app/waypoint"], service_keys={}, bound={}) == {}


@pytest.mark.parametrize(
    ("rule", "field", "reason"),
    [
        ({"jwks": JWKS}, "spec.jwtRules[0].issuer", "required"),
        ({"issuer": "i", "jwks": JWKS, "audiences": [""]}, "spec.jwtRules[0].audiences[0]", "required"),
        ({"issuer": "i", "jwks": JWKS, "jwksUri": "https://k/j"}, "spec.jwtRules[0].jwksUri", "only one of"),
        ({"issuer": "i", "jwksUri": "file:///etc/passwd"}, "spec.jwtRules[0].jwksUri", "not an http or https"),
        ({"issuer": "i", "jwksUri": "http://h:99999/"}, "spec.jwtRules[0].jwksUri", "not an http or https"),
        ({"issuer": "i", "jwks": "{"}, "spec.jwtRules[0].jwks", "jwks parse error: Jwks is an invalid JSON"),
        ({"issuer": "i"}, "spec.jwtRules[0].jwksUri", "OpenID discovery"),
        ({"issuer": "i", "jwks": JWKS, "fromHeaders": [{"name": ""}]}, "spec.jwtRules[0].fromHeaders[0].name", ""),
        ({"issuer": "i", "jwks": JWKS, "fromHeaders": [{"name": "a b"}]}, "fromHeaders[0].name", "header name"),
        ({"issuer": "i", "jwks": JWKS, "fromParams": [""]}, "spec.jwtRules[0].fromParams[0]", "required"),
        ({"issuer": "i", "jwks": JWKS, "fromCookies": [""]}, "spec.jwtRules[0].fromCookies[0]", "required"),
        ({"issuer": "i", "jwks": JWKS, "outputClaimToHeaders": [{"header": "x"}]}, "[0].claim", "required"),
        ({"issuer": "i", "jwks": JWKS, "outputPayloadToHeader": "x\r\ny"}, "outputPayloadToHeader", "header name"),
        ({"issuer": "i", "jwks": JWKS, "timeout": "soon"}, "spec.jwtRules[0].timeout", "positive duration"),
        ({"issuer": "i", "jwks": JWKS, "timeout": "0s"}, "spec.jwtRules[0].timeout", "positive duration"),
        ({"issuer": "i", "jwks": JWKS, "forwardOriginalToken": "yes"}, "forwardOriginalToken", "boolean"),
        ({"issuer": 7, "jwks": JWKS}, "spec.jwtRules[0].issuer", "expected a string"),
    ],
)
def test_invalid_rules_skip_the_whole_policy_with_the_field_and_reason(
    rule: dict[str, Any], field: str, reason: str
) -> None:
    result, skips = translate(obj({"targetRefs": [WAYPOINT], "jwtRules": [rule]}))
    assert result.policy is None
    assert len(skips) == 1 and skips[0].field.endswith(field) and reason in skips[0].reason
    assert skips[0].kind == "RequestAuthentication" and skips[0].uid == "u1"


@pytest.mark.parametrize(
    ("spec", "field"),
    [
        ({"selector": {"matchLabels": {"a": "b"}}, "targetRefs": [WAYPOINT]}, "spec.selector"),
        ({"targetRef": WAYPOINT, "targetRefs": [WAYPOINT]}, "spec.targetRef"),
        ({"targetRefs": "waypoint"}, "spec.targetRefs"),
    ],
)
def test_conflicting_attachments_skip_the_policy(spec: dict[str, Any], field: str) -> None:
    result, skips = translate(obj({**spec, "jwtRules": [{"issuer": "i", "jwks": JWKS}]}))
    assert result.policy is None and [s.field for s in skips] == [field]


def test_bad_targets_are_skipped_and_the_rest_applies() -> None:
    refs = [
        WAYPOINT,
        {"group": "", "kind": "Pod", "name": "p"},
        {"group": "", "kind": "Service", "name": "s", "namespace": "other"},
        {"group": "gateway.networking.k8s.io", "kind": "GatewayClass", "name": "istio-waypoint"},
        {"group": "networking.istio.io", "kind": "ServiceEntry", "name": "e"},
    ]
    result, skips = translate(obj({"targetRefs": refs, "jwtRules": [{"issuer": "i", "jwks": JWKS}]}))
    assert result.targets == (Target("Gateway", "app", "waypoint"), Target("ServiceEntry", "app", "e"))
    assert [s.field for s in skips] == [
        "spec.targetRefs[1].kind",
        "spec.targetRefs[2].namespace",
        "spec.targetRefs[3].kind",
    ]
    assert "root namespace" in skips[2].reason


def test_a_gateway_class_target_from_the_root_namespace_reaches_every_waypoint() -> None:
    ref = {"group": "gateway.networking.k8s.io", "kind": "GatewayClass", "name": "istio-waypoint"}
    result, skips = translate(obj({"targetRefs": [ref], "jwtRules": [{"issuer": "i", "jwks": JWKS}]}, namespace=ROOT))
    assert skips == [] and result.targets == (Target("GatewayClass", "", "istio-waypoint"),)
    bound = bind_to_waypoints([result], waypoints=["a/w", "b/w"], service_keys={}, bound={})
    assert set(bound) == {"a/w", "b/w"} and all(p[0].services == () for p in bound.values())


def test_binding_gives_each_waypoint_its_policies() -> None:
    rules = (JwtRule("i", jwks=JWKS),)
    whole = RequestAuthTranslation(RequestAuthentication("gw", "app", rules), (Target("Gateway", "app", "waypoint"),))
    svc = RequestAuthTranslation(
        RequestAuthentication("svc", "app", rules),
        (Target("Service", "app", "reviews"), Target("ServiceEntry", "app", "ext"), Target("Service", "app", "gone")),
    )
    both = RequestAuthTranslation(
        RequestAuthentication("both", "app", rules),
        (Target("Gateway", "app", "waypoint"), Target("Service", "app", "reviews")),
    )
    other = RequestAuthTranslation(RequestAuthentication("other", "app", rules), (Target("Gateway", "app", "nope"),))
    service_keys = {
        ("Service", "app", "reviews"): ("app/reviews.app.svc.cluster.local",),
        ("ServiceEntry", "app", "ext"): ("app/a.example", "app/b.example"),
    }
    bound = {
        "app/reviews.app.svc.cluster.local": "app/waypoint",
        "app/a.example": "app/waypoint",
        "app/b.example": "app/second",
    }
    result = bind_to_waypoints(
        [whole, svc, both, other, RequestAuthTranslation(None)],
        waypoints=["app/waypoint", "app/second", "app/idle"],
        service_keys=service_keys,
        bound=bound,
    )
    assert result == {
        "app/second": (RequestAuthentication("svc", "app", rules, ("app/b.example",)),),
        "app/waypoint": (
            RequestAuthentication("both", "app", rules),
            RequestAuthentication("gw", "app", rules),
            RequestAuthentication("svc", "app", rules, ("app/a.example", "app/reviews.app.svc.cluster.local")),
        ),
    }


@pytest.mark.parametrize(
    ("text", "seconds"),
    [("5s", 5.0), ("1.5s", 1.5), ("500ms", 0.5), ("1m30s", 90.0), ("", None), ("5", None), ("s", None), ("1x", None)],
)
def test_durations_read_as_go_writes_them(text: str, seconds: float | None) -> None:
    assert parse_duration(text) == seconds


def test_translate_all_puts_attached_policies_into_waypoint_configs() -> None:
    namespace = {"apiVersion": "v1", "kind": "Namespace", "metadata": {"name": "app"}}
    gateway_class = {"metadata": {"name": "istio-waypoint"}, "spec": {"controllerName": "istio.io/mesh-controller"}}
    gateway = {
        "metadata": {"name": "waypoint", "namespace": "app"},
        "spec": {
            "gatewayClassName": "istio-waypoint",
            "listeners": [{"name": "mesh", "port": 15008, "protocol": "HBONE"}],
        },
        "status": {"addresses": [{"type": "Hostname", "value": "waypoint.app.svc.cluster.local"}]},
    }
    service = {
        "metadata": {"name": "reviews", "namespace": "app", "labels": {"istio.io/use-waypoint": "waypoint"}},
        "spec": {"clusterIP": "10.96.0.10", "ports": [{"name": "http", "port": 9080}]},
    }
    rule = [{"issuer": "i", "jwks": JWKS}]
    service_ref = {"group": "", "kind": "Service", "name": "reviews"}
    policies = [
        obj({"targetRefs": [WAYPOINT], "jwtRules": rule}, name="on-gateway"),
        obj({"targetRefs": [service_ref], "jwtRules": rule}, name="on-service"),
        obj({"selector": {"matchLabels": {"app": "reviews"}}, "jwtRules": rule}, name="sidecar-only"),
        obj({"targetRefs": [WAYPOINT], "jwtRules": [{"jwks": JWKS}]}, name="invalid"),
    ]
    translation = translate_all(
        [],
        [service],
        [],
        [namespace],
        gateways=[gateway],
        gateway_classes=[gateway_class],
        request_authentications=policies,
    )
    (config,) = translation.waypoint_configs
    assert config.waypoint == "app/waypoint"
    rules = (JwtRule("i", jwks=JWKS),)
    assert config.request_authentications == (
        RequestAuthentication("on-gateway", "app", rules),
        RequestAuthentication("on-service", "app", rules, ("app/reviews.app.svc.cluster.local",)),
    )
    assert [(s.name, s.field) for s in translation.skipped if s.kind == "RequestAuthentication"] == [
        ("invalid", "spec.jwtRules[0].issuer")
    ]


def test_an_ingress_gateway_gets_the_policies_of_its_gateway_but_no_gateway_class_target() -> None:
    rules = (JwtRule("i", jwks=JWKS),)
    own = RequestAuthTranslation(RequestAuthentication("own", "edge", rules), (Target("Gateway", "edge", "ingress"),))
    waypoints = RequestAuthTranslation(
        RequestAuthentication("wp", ROOT, rules), (Target("GatewayClass", "", "istio-waypoint"),)
    )
    result = bind_to_waypoints(
        [own, waypoints], waypoints=["edge/ingress"], service_keys={}, bound={}, waypoint_class=False
    )
    assert [p.key for p in result["edge/ingress"]] == ["edge/own"]


def test_a_gateway_class_target_other_than_the_waypoint_class_is_skipped_as_istiod_never_attaches_it() -> None:
    refs = [
        {"group": "gateway.networking.k8s.io", "kind": "GatewayClass", "name": "istio"},
        {"group": "gateway.networking.k8s.io", "kind": "GatewayClass", "name": "istio-waypoint"},
    ]
    result, skips = translate(obj({"targetRefs": refs, "jwtRules": [{"issuer": "i", "jwks": JWKS}]}, namespace=ROOT))
    assert result.targets == (Target("GatewayClass", "", "istio-waypoint"),)
    assert [s.field for s in skips] == ["spec.targetRefs[0].name"]
    assert "only the GatewayClass 'istio-waypoint'" in skips[0].reason
