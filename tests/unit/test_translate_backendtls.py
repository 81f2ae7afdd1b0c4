"""BackendTLSPolicy → the DestinationRules istiod generates (translate/backendtls.py), alone and through
translate_all up to the waypoint's config, with upstream's TestWaypointAsEgressGateway objects."""

from __future__ import annotations

import copy
from typing import Any

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from ambit.controlplane.translate import translate_all
from ambit.controlplane.translate.backendtls import (
    INVALID_CREDENTIAL,
    config_map_credential,
    generated_destination_rules,
    translate_backend_tls,
)
from ambit.controlplane.translate.skips import Skipped
from ambit.model.destination_policy import ClientTls, TlsMode
from ambit.tls.certs import new_ca
from ambit.waypoint.origination import TlsOriginationError, client_context

CA_PEM = new_ca("backend-ca", now=1.7e9).cert_pem.decode()
ENTRY = {
    "apiVersion": "networking.istio.io/v1",
    "kind": "ServiceEntry",
    "metadata": {"name": "external", "namespace": "app", "labels": {"istio.io/use-waypoint": "waypoint"}},
    "spec": {
        "hosts": ["fake-egress.example.com"],
        "ports": [
            {"name": "http", "number": 80, "protocol": "HTTP"},
            {"name": "https", "number": 443, "protocol": "HTTPS"},
            {"name": "http-for-tls", "number": 8080, "protocol": "HTTP", "targetPort": 443},
        ],
        "location": "MESH_EXTERNAL",
        "resolution": "DNS",
        "endpoints": [{"address": "external.other.svc.cluster.local"}],
    },
}
CA_MAP = {"metadata": {"name": "external-ca-cert", "namespace": "app"}, "data": {"ca.crt": CA_PEM}}


def policy(section: str | None = "http-for-tls", name: str = "fake-egress-tls", created: str = "2026-01-01T00:00:00Z",
           **validation: Any) -> dict[str, Any]:  # fmt: skip
    ref: dict[str, Any] = {"group": "networking.istio.io", "kind": "ServiceEntry", "name": "external"}
    if section is not None:
        ref["sectionName"] = section
    return {
        "apiVersion": "gateway.networking.k8s.io/v1",
        "kind": "BackendTLSPolicy",
        "metadata": {"name": name, "namespace": "app", "creationTimestamp": created},
        "spec": {
            "targetRefs": [ref],
            "validation": validation
            or {
                "hostname": "server.default.svc",
                "caCertificateRefs": [{"kind": "ConfigMap", "name": "external-ca-cert", "group": ""}],
            },
        },
    }


def generate(*policies: dict[str, Any]) -> tuple[list[dict[str, Any]], list[Skipped]]:
    skips: list[Skipped] = []
    maps = {("app", "external-ca-cert"): CA_MAP}
    rules = generated_destination_rules(policies, [], [ENTRY], domain="cluster.local", skips=skips, config_maps=maps)
    return rules, skips


def test_upstreams_policy_becomes_a_port_level_simple_tls_rule_for_the_entrys_host() -> None:
    (rule,), skips = generate(policy())
    assert skips == []
    assert rule["metadata"] == {"name": "external~fake-egress-example-com~gateway", "namespace": "app"}
    assert rule["spec"] == {
        "host": "fake-egress.example.com",
        "trafficPolicy": {
            "portLevelSettings": [
                {
                    "port": {"number": 8080},
                    "tls": {
                        "mode": "SIMPLE",
                        "sni": "server.default.svc",
                        "credentialName": "configmap://app/external-ca-cert",
                    },
                }
            ]
        },
    }


def test_without_a_section_the_tls_is_for_the_whole_host_and_system_trust_needs_no_credential() -> None:
    (rule,), _ = generate(policy(None, hostname="example.com", wellKnownCACertificates="System"))
    assert rule["spec"]["trafficPolicy"] == {"tls": {"mode": "SIMPLE", "sni": "example.com"}}


def test_subject_alt_names_of_hostname_and_uri_type_are_checked() -> None:
    sans = [{"type": "Hostname", "hostname": "a.example.com"}, {"type": "URI", "uri": "spiffe://td/ns/x/sa/y"}]
    (rule,), _ = generate(policy(None, hostname="a", subjectAltNames=sans, wellKnownCACertificates="System"))
    assert rule["spec"]["trafficPolicy"]["tls"]["subjectAltNames"] == ["a.example.com", "spiffe://td/ns/x/sa/y"]


def test_the_older_of_two_policies_for_one_target_and_section_wins_and_the_other_is_conflicted() -> None:
    old = policy(name="old", created="2026-01-01T00:00:00Z", hostname="old.example", wellKnownCACertificates="System")
    new = policy(name="new", created="2026-02-01T00:00:00Z", hostname="new.example", wellKnownCACertificates="System")
    for order in ((old, new), (new, old)):
        (rule,), skips = generate(*order)
        assert rule["spec"]["trafficPolicy"]["portLevelSettings"][0]["tls"]["sni"] == "old.example"
        assert [(s.name, "Conflicted" in s.reason) for s in skips] == [("new", True)]


@pytest.mark.parametrize(
    ("change", "field"),
    [
        (lambda p: p["spec"]["targetRefs"][0].update(sectionName="nope"), "spec.targetRefs[0].sectionName"),
        (lambda p: p["spec"]["targetRefs"][0].update(name="missing"), "spec.targetRefs[0]"),
        (lambda p: p["spec"]["targetRefs"][0].update(kind="Pod", group=""), "spec.targetRefs[0]"),
        (lambda p: p["spec"]["validation"].pop("hostname"), "spec.validation.hostname"),
        (lambda p: p["spec"].pop("validation"), "spec.validation"),
    ],
)
def test_an_unusable_policy_generates_nothing_and_says_why(change: Any, field: str) -> None:
    bad = policy()
    change(bad)
    rules, skips = generate(bad)
    assert rules == [] and [s.field for s in skips] == [field]


def test_a_configmap_credential_reads_only_the_rules_own_namespace() -> None:
    maps = {("app", "external-ca-cert"): CA_MAP}
    assert config_map_credential("configmap://app/external-ca-cert", maps, "app") is not None
    assert config_map_credential("configmap://app/external-ca-cert", maps, "other") is None
    assert config_map_credential("configmap://app/missing", maps, "app") is None
    assert config_map_credential("external-ca-cert", maps, "app") is None
    junk = {("app", "j"): {"data": {"ca.crt": "not a certificate"}}}
    assert config_map_credential("configmap://app/j", junk, "app") is None


@settings(max_examples=200, deadline=None)
@given(st.recursive(st.none() | st.booleans() | st.integers() | st.text(max_size=8),
                    lambda inner: st.lists(inner, max_size=3) | st.dictionaries(st.text(max_size=8), inner, max_size=3),
                    max_leaves=12))  # fmt: skip
def test_arbitrary_policy_specs_never_raise(spec: Any) -> None:
    bad = copy.deepcopy(policy())
    bad["spec"] = spec
    skips: list[Skipped] = []
    generated_destination_rules([bad], [{"metadata": spec}], [ENTRY], domain="cluster.local", skips=skips)


def test_through_translate_all_the_waypoint_originates_tls_with_the_configmaps_ca() -> None:
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
    translation = translate_all(
        [],
        [],
        [],
        [namespace],
        gateways=[gateway],
        gateway_classes=[gateway_class],
        service_entries=[ENTRY],
        backend_tls_policies=[policy()],
        config_maps=[CA_MAP],
    )
    (config,) = translation.waypoint_configs
    (rule,) = config.destination_rules
    assert rule.service_key == "app/fake-egress.example.com"
    (level,) = rule.traffic_policy.port_level
    assert level.port == 8080 and level.tls is not None
    assert (level.tls.mode, level.tls.sni, level.tls.ca_certificates) == (TlsMode.SIMPLE, "server.default.svc", CA_PEM)
    assert rule.traffic_policy.tls is None


GATEWAY_ROUTE = {
    "metadata": {"name": "to-external", "namespace": "app"},
    "spec": {
        "parentRefs": [{"name": "ingress"}, {"kind": "Service", "group": "", "name": "external"}],
        "rules": [{"backendRefs": [{"kind": "ServiceEntry", "group": "networking.istio.io", "name": "external"}]}],
    },
}


def ancestors(*policies: dict[str, Any], maps: Any = None, routes: Any = ()) -> list[dict[str, Any]]:
    """Each policy's ancestors as plain data, for golden-style comparison."""
    skips: list[Skipped] = []
    out = translate_backend_tls(
        policies,
        [],
        [ENTRY],
        domain="cluster.local",
        skips=skips,
        config_maps={("app", "external-ca-cert"): CA_MAP} if maps is None else maps,
        routes=routes,
    )
    return [
        {
            "policy": s.key,
            "ancestors": [
                {
                    "ancestorRef": a.ancestor_ref_dict(),
                    "controllerName": a.controller,
                    "conditions": [(c.type, c.status, c.reason, c.message) for c in a.conditions],
                }
                for a in s.ancestors
            ],
        }
        for s in out.status
    ]


VALID = [("Accepted", True, "Accepted", "Configuration is valid"),
         ("ResolvedRefs", True, "ResolvedRefs", "Configuration is valid")]  # fmt: skip
MESH_REF = {"group": "networking.istio.io", "kind": "ServiceEntry", "name": "external", "sectionName": "http-for-tls"}


def test_an_accepted_policy_has_its_target_as_mesh_ancestor_and_each_routes_gateway_after_it() -> None:
    (status,) = ancestors(policy(), routes=[("HTTPRoute", GATEWAY_ROUTE)])
    assert status == {
        "policy": "app/fake-egress-tls",
        "ancestors": [
            {"ancestorRef": MESH_REF, "controllerName": "istio.io/mesh-controller", "conditions": VALID},
            {
                "ancestorRef": {"group": "gateway.networking.k8s.io", "kind": "Gateway", "name": "ingress"},
                "controllerName": "istio.io/gateway-controller",
                "conditions": VALID,
            },
        ],
    }


@pytest.mark.parametrize(
    ("ref", "maps", "resolved", "message_part"),
    [
        ({"kind": "ConfigMap", "name": "missing"}, None, "InvalidCACertificateRef", "not found"),
        ({"kind": "ConfigMap", "name": "external-ca-cert"}, {("app", "external-ca-cert"): {"data": {"ca.crt": "junk"}}},
         "InvalidCACertificateRef", "holds no PEM certificate"),
        ({"kind": "Secret", "name": "external-ca-cert"}, None, "InvalidKind", "unsupported reference kind: Secret"),
        ({"kind": "Pod", "group": "", "name": "x"}, None, "InvalidKind", "unsupported reference kind: Pod"),
        ({"kind": "ConfigMap", "name": "external-ca-cert"}, {("other", "external-ca-cert"): CA_MAP},
         "InvalidCACertificateRef", "not found"),
    ],
)  # fmt: skip
def test_an_unusable_ca_ref_is_reported_and_the_backend_is_refused_not_sent_plaintext(
    ref: dict[str, Any], maps: Any, resolved: str, message_part: str
) -> None:
    bad = policy(hostname="server.default.svc", caCertificateRefs=[ref])
    (status,) = ancestors(bad, maps=maps)
    ((accepted, resolved_refs),) = [a["conditions"] for a in status["ancestors"]]
    assert accepted[:3] == ("Accepted", False, "NoValidCACertificate")
    assert resolved_refs[:3] == ("ResolvedRefs", False, resolved) and message_part in resolved_refs[3]
    skips: list[Skipped] = []
    (rule,) = generated_destination_rules(
        [bad], [], [ENTRY], domain="cluster.local", skips=skips, config_maps=maps or {}
    )
    (level,) = rule["spec"]["trafficPolicy"]["portLevelSettings"]
    assert level["tls"]["credentialName"] == INVALID_CREDENTIAL


def test_a_conflicted_policy_says_which_older_policy_holds_the_target() -> None:
    old = policy(name="old", created="2026-01-01T00:00:00Z")
    new = policy(name="new", created="2026-02-01T00:00:00Z")
    by_name = {s["policy"]: s["ancestors"][0]["conditions"][0] for s in ancestors(new, old)}
    assert by_name["app/old"] == VALID[0]
    assert by_name["app/new"] == (
        "Accepted",
        False,
        "Conflicted",
        "Conflicts with BackendTLSPolicy 'old' targeting the same backend",
    )


def test_a_missing_target_or_section_is_target_not_found_and_other_targets_still_apply() -> None:
    two = policy()
    two["spec"]["targetRefs"].append({"group": "", "kind": "Service", "name": "nope"})
    (status,) = ancestors(two)
    first, second = status["ancestors"]
    assert first["conditions"] == VALID
    assert second["ancestorRef"] == {"group": "", "kind": "Service", "name": "nope"}
    assert second["conditions"][0][:3] == ("Accepted", False, "TargetNotFound")


def test_an_ignored_policy_is_reported_as_ignored_and_conflicts_with_nothing() -> None:
    ignored = policy(name="a-ignored", created="2025-01-01T00:00:00Z")
    ignored["metadata"]["annotations"] = {"istio.io/ignore-policy-attachment": "true"}
    statuses = {s["policy"]: s["ancestors"] for s in ancestors(ignored, policy())}
    ((accepted,),) = [a["conditions"] for a in statuses["app/a-ignored"]]
    assert accepted[:3] == ("Accepted", False, "IgnoredByIstio")
    assert statuses["app/fake-egress-tls"][0]["conditions"] == VALID


def test_unknown_well_known_ca_is_invalid_and_generates_nothing() -> None:
    (status,) = ancestors(policy(hostname="a", wellKnownCACertificates="Mozilla"))
    assert status["ancestors"][0]["conditions"][0][:3] == ("Accepted", False, "Invalid")
    assert generate(policy(hostname="a", wellKnownCACertificates="Mozilla"))[0] == []


def test_ancestors_are_bounded_at_sixteen() -> None:
    many = policy()
    many["spec"]["targetRefs"] = [{"group": "", "kind": "Service", "name": f"s{i}"} for i in range(40)]
    (status,) = ancestors(many)
    assert len(status["ancestors"]) == 16


def test_through_translate_all_a_missing_ca_map_refuses_the_backend() -> None:
    namespace = {"apiVersion": "v1", "kind": "Namespace", "metadata": {"name": "app"}}
    translation = translate_all([], [], [], [namespace], service_entries=[ENTRY], backend_tls_policies=[policy()])
    (status,) = translation.backend_tls_status
    assert status.ancestors[0].conditions[0].reason == "NoValidCACertificate"


def test_a_waypoint_given_an_unresolved_ca_refuses_to_build_a_client_context() -> None:
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
    translation = translate_all(
        [], [], [], [namespace], gateways=[gateway], gateway_classes=[gateway_class], service_entries=[ENTRY],
        backend_tls_policies=[policy()],
    )  # fmt: skip
    (config,) = translation.waypoint_configs
    (level,) = config.destination_rules[0].traffic_policy.port_level
    assert level.tls is not None and level.tls.trust_unresolved and not level.tls.ca_certificates
    with pytest.raises(TlsOriginationError):
        client_context(level.tls, h2=False)
    assert client_context(ClientTls(mode=TlsMode.SIMPLE), h2=False) is not None  # unmarked: the system store


@settings(max_examples=200, deadline=None)
@given(st.recursive(st.none() | st.booleans() | st.integers() | st.text(max_size=8),
                    lambda inner: st.lists(inner, max_size=3) | st.dictionaries(st.text(max_size=8), inner, max_size=3),
                    max_leaves=16),
       st.sampled_from(["parentRefs", "rules", "backendRefs"]))  # fmt: skip
def test_arbitrary_routes_and_ca_maps_never_raise_and_ancestors_stay_bounded(junk: Any, where: str) -> None:
    route: dict[str, Any] = {"metadata": {"namespace": "app"}, "spec": {"parentRefs": [{"name": "gw"}]}}
    if where == "backendRefs":
        route["spec"]["rules"] = [{"backendRefs": junk}]
    else:
        route["spec"][where] = junk
    skips: list[Skipped] = []
    out = translate_backend_tls(
        [policy()], [], [ENTRY], domain="cluster.local", skips=skips,
        config_maps={("app", "external-ca-cert"): {"data": junk}}, routes=[("HTTPRoute", route)],
    )  # fmt: skip
    assert all(len(s.ancestors) <= 16 for s in out.status)
