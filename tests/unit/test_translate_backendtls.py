"""BackendTLSPolicy → the DestinationRules istiod generates (translate/backendtls.py), alone and through
translate_all up to the waypoint's config, with upstream's TestWaypointAsEgressGateway objects."""

from __future__ import annotations

import copy
from typing import Any

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from ambit.controlplane.translate import translate_all
from ambit.controlplane.translate.backendtls import config_map_credential, generated_destination_rules
from ambit.controlplane.translate.skips import Skipped
from ambit.model.routes import TlsMode

CA_PEM = "-----BEGIN CERTIFICATE-----\nMIIB\n-----END CERTIFICATE-----\n"
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
    rules = generated_destination_rules(policies, [], [ENTRY], domain="cluster.local", skips=skips)
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
        (
            lambda p: p["spec"]["validation"].update(caCertificateRefs=[{"kind": "Secret", "name": "x"}]),
            "spec.validation.caCertificateRefs",
        ),
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
