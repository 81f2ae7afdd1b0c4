"""Policies at the ingress gateway (:mod:`ambit.controlplane.translate.gateway_policies`): which
AuthorizationPolicies and RequestAuthentications reach a Gateway of class ``istio``, by targetRefs and by selector
on its pods' labels, through the whole translation into its GatewayConfig and over the wire."""

from __future__ import annotations

from typing import Any

import pytest
from tests.unit.jwt_keys import rsa_signer

from ambit.controlplane.translate import translate_all
from ambit.controlplane.translate.gateway_pods import pod_labels
from ambit.model.ingress import GatewayConfig
from ambit.model.policy import Action, Scope
from ambit.xds.gateway import decode_gateway_config, gateway_config_to_proto, pack_gateway_config

ROOT = "istio-system"
JWKS = rsa_signer().jwks()
GATEWAY_REF = {"group": "gateway.networking.k8s.io", "kind": "Gateway", "name": "edge"}
ISTIO_CLASS = {"group": "gateway.networking.k8s.io", "kind": "GatewayClass", "name": "istio"}
WAYPOINT_CLASS = {"group": "gateway.networking.k8s.io", "kind": "GatewayClass", "name": "istio-waypoint"}


def gateway(name: str = "edge", namespace: str = "edge", **infra_labels: str) -> dict[str, Any]:
    return {
        "metadata": {"namespace": namespace, "name": name, "uid": f"uid-{name}"},
        "spec": {
            "gatewayClassName": "istio",
            "listeners": [{"name": "http", "port": 8080, "protocol": "HTTP"}],
            **({"infrastructure": {"labels": infra_labels}} if infra_labels else {}),
        },
    }


def namespace(name: str) -> dict[str, Any]:
    return {"metadata": {"name": name}}


def authz(name: str, namespace: str = "edge", **spec: Any) -> dict[str, Any]:
    rule = {"from": [{"source": {"requestPrincipals": ["*"]}}]}
    return {"metadata": {"namespace": namespace, "name": name, "uid": name}, "spec": {"rules": [rule], **spec}}


def authn(name: str, namespace: str = "edge", **spec: Any) -> dict[str, Any]:
    return {
        "metadata": {"namespace": namespace, "name": name, "uid": name},
        "spec": {"jwtRules": [{"issuer": "https://issuer.example", "jwks": JWKS}], **spec},
    }


def configs(
    gateways: list[dict[str, Any]],
    policies: list[dict[str, Any]] | None = None,
    authns: list[dict[str, Any]] | None = None,
) -> dict[str, GatewayConfig]:
    translation = translate_all(
        [],
        [],
        [],
        [namespace("edge"), namespace("other"), namespace(ROOT)],
        gateways=gateways,
        authorization_policies=policies or [],
        request_authentications=authns or [],
        root_namespace=ROOT,
    )
    return {c.gateway: c for c in translation.gateway_configs}


def test_the_gateway_pods_carry_the_gateway_name_labels_and_its_infrastructure_labels() -> None:
    labels = pod_labels(gateway(team="payments"))
    assert labels["gateway.networking.k8s.io/gateway-name"] == "edge"
    assert labels["istio.io/gateway-name"] == "edge"
    assert labels["team"] == "payments"


AUTHZ_CASES = [
    ("targetRefs the Gateway", authz("p", targetRefs=[GATEWAY_REF]), True),
    ("targetRef the Gateway", authz("p", targetRef=GATEWAY_REF), True),
    ("targetRefs another Gateway", authz("p", targetRefs=[{**GATEWAY_REF, "name": "other"}]), False),
    (
        "selector on the gateway-name label",
        authz("p", selector={"matchLabels": {"istio.io/gateway-name": "edge"}}),
        True,
    ),
    ("selector on an infrastructure label", authz("p", selector={"matchLabels": {"team": "payments"}}), True),
    ("selector that does not match", authz("p", selector={"matchLabels": {"app": "reviews"}}), False),
    ("namespace-wide", authz("p"), True),
    ("namespace-wide elsewhere", authz("p", "other"), False),
    ("selector elsewhere", authz("p", "other", selector={"matchLabels": {"istio.io/gateway-name": "edge"}}), False),
    ("mesh-wide", authz("p", ROOT), True),
    ("root selector", authz("p", ROOT, selector={"matchLabels": {"istio.io/gateway-name": "edge"}}), True),
    ("the waypoint class", authz("p", ROOT, targetRefs=[WAYPOINT_CLASS]), False),
    ("the istio class", authz("p", ROOT, targetRefs=[ISTIO_CLASS]), False),
]


@pytest.mark.parametrize(("case", "policy", "applies"), AUTHZ_CASES, ids=[c[0] for c in AUTHZ_CASES])
def test_which_authorization_policies_reach_the_gateway(case: str, policy: dict[str, Any], applies: bool) -> None:
    found = configs([gateway(team="payments")], policies=[policy])["edge/edge"].policies
    assert [p.key for p in found] == ([f"{policy['metadata']['namespace']}/p"] if applies else [])
    for p in found:
        assert p.scope is Scope.WAYPOINT and p.action is Action.ALLOW
        assert p.rules and p.rules[0].is_l7  # requestPrincipals kept: the gateway enforces L7 fields


AUTHN_CASES = [
    ("targetRefs the Gateway", authn("j", targetRefs=[GATEWAY_REF]), True),
    ("targetRefs the istio GatewayClass from the root", authn("j", ROOT, targetRefs=[ISTIO_CLASS]), False),
    ("targetRefs the waypoint GatewayClass", authn("j", ROOT, targetRefs=[WAYPOINT_CLASS]), False),
    (
        "selector on the gateway-name label",
        authn("j", selector={"matchLabels": {"istio.io/gateway-name": "edge"}}),
        True,
    ),
    ("selector that does not match", authn("j", selector={"matchLabels": {"app": "reviews"}}), False),
    ("namespace-wide", authn("j"), True),
    ("namespace-wide elsewhere", authn("j", "other"), False),
    ("mesh-wide", authn("j", ROOT), True),
]


@pytest.mark.parametrize(("case", "policy", "applies"), AUTHN_CASES, ids=[c[0] for c in AUTHN_CASES])
def test_which_request_authentications_reach_the_gateway(case: str, policy: dict[str, Any], applies: bool) -> None:
    found = configs([gateway()], authns=[policy])["edge/edge"].request_authentications
    assert [(p.key, p.services) for p in found] == ([(f"{policy['metadata']['namespace']}/j", ())] if applies else [])


def test_each_gateway_gets_its_own_policies_once_in_key_order_and_they_survive_the_wire() -> None:
    policies = [
        authz("z-own", targetRefs=[GATEWAY_REF]),
        authz("a-selected", selector={"matchLabels": {"istio.io/gateway-name": "edge"}}),
        authz("mesh", ROOT),
    ]
    found = configs([gateway(), gateway("side")], policies=policies, authns=[authn("j", targetRefs=[GATEWAY_REF])])
    assert [p.key for p in found["edge/edge"].policies] == ["edge/a-selected", "edge/z-own", f"{ROOT}/mesh"]
    assert [p.key for p in found["edge/side"].policies] == [f"{ROOT}/mesh"]  # namespace-wide ones aside
    assert [p.key for p in found["edge/side"].request_authentications] == []
    config = found["edge/edge"]
    assert decode_gateway_config("edge/edge", pack_gateway_config(gateway_config_to_proto(config))) == config


def test_a_policy_targeting_the_gateway_is_reported_bound_to_it() -> None:
    translation = translate_all(
        [],
        [],
        [],
        [namespace("edge")],
        gateways=[gateway()],
        authorization_policies=[authz("p", targetRefs=[GATEWAY_REF])],
    )
    (status,) = translation.waypoint_policy_status
    assert (status.accepted, status.reason, status.message) == (True, "Accepted", "bound to edge/edge")


def test_waypoints_still_ignore_selector_and_namespace_wide_policies() -> None:
    waypoint = {
        "metadata": {"namespace": "edge", "name": "waypoint"},
        "spec": {
            "gatewayClassName": "istio-waypoint",
            "listeners": [{"name": "mesh", "port": 15008, "protocol": "HBONE"}],
        },
        "status": {"addresses": [{"type": "Hostname", "value": "waypoint.edge.svc.cluster.local"}]},
    }
    translation = translate_all(
        [],
        [],
        [],
        [namespace("edge")],
        gateways=[waypoint],
        authorization_policies=[authz("p")],
        request_authentications=[authn("j")],
        root_namespace=ROOT,
    )
    (config,) = translation.waypoint_configs
    assert config.policies == () and config.request_authentications == ()


def test_a_policy_targeting_the_istio_gateway_class_is_refused_with_istiods_reason_and_message() -> None:
    istio_class = {"metadata": {"name": "istio"}, "spec": {"controllerName": "istio.io/gateway-controller"}}
    translation = translate_all(
        [],
        [],
        [],
        [namespace("edge"), namespace(ROOT)],
        gateways=[gateway()],
        gateway_classes=[istio_class],
        authorization_policies=[authz("p", ROOT, targetRefs=[ISTIO_CLASS])],
        request_authentications=[authn("j", ROOT, targetRefs=[ISTIO_CLASS])],
        root_namespace=ROOT,
    )
    (status,) = translation.waypoint_policy_status
    assert (status.accepted, status.reason, status.message) == (
        False,
        "Invalid",
        "GatewayClass must use controller name `istio.io/mesh-controller` for waypoints",
    )
    (config,) = translation.gateway_configs
    assert config.policies == () and config.request_authentications == ()
    assert [(s.name, s.field) for s in translation.skipped if s.kind == "RequestAuthentication"] == [
        ("j", "spec.targetRefs[0].name")
    ]


def test_a_custom_policy_selecting_the_gateway_carries_its_authorizer_over_the_wire() -> None:
    """Istio's External Authorization task at an ingress gateway: a selector policy with action CUSTOM."""
    mesh = """
extensionProviders:
- name: sample-ext-authz-grpc
  envoyExtAuthzGrpc: {service: ext-authz.foo.svc.cluster.local, port: 9000}
"""
    policy = authz(
        "ext-authz",
        selector={"matchLabels": {"istio.io/gateway-name": "edge"}},
        action="CUSTOM",
        provider={"name": "sample-ext-authz-grpc"},
    )
    translation = translate_all(
        [],
        [],
        [],
        [namespace("edge"), namespace(ROOT)],
        gateways=[gateway()],
        authorization_policies=[policy],
        config_maps=[{"metadata": {"name": "istio", "namespace": ROOT}, "data": {"mesh": mesh}}],
        root_namespace=ROOT,
    )
    (config,) = translation.gateway_configs
    (found,) = config.policies
    assert found.action is Action.CUSTOM and found.ext_authz is not None
    assert (found.ext_authz.name, found.ext_authz.port) == ("sample-ext-authz-grpc", 9000)
    assert decode_gateway_config("edge/edge", pack_gateway_config(gateway_config_to_proto(config))) == config
