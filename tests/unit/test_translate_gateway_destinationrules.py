"""DestinationRules at the ingress gateway: which rule reaches each backend Service of a gateway's routes (istiod's
lookup for a gateway proxy: its namespace, the Service's, the root namespace, with exportTo), with subsets
resolved, through the whole translation into its GatewayConfig and over the wire. Upstream's TestIngressTLS objects
verbatim (istio tests/integration/ambient baseline_test.go), an Istio Gateway and a Gateway API Gateway, then the
key-material rule and the decoder's judgement of a hostile config."""

from __future__ import annotations

import base64
from typing import Any

import pytest
from tests.upstream_objects import ingress_tls_objects

from ambit.controlplane.translate import Translation, translate_all
from ambit.model.destination_policy import (
    ClientTls,
    ConnectionPool,
    DestinationPolicy,
    H2Upgrade,
    LoadBalancer,
    LoadBalancerType,
    Subset,
    TlsMode,
    TrafficPolicy,
)
from ambit.model.ingress import GatewayConfig
from ambit.xds.errors import XdsConversionError
from ambit.xds.gateway import decode_gateway_config, gateway_config_to_proto, pack_gateway_config

Obj = dict[str, Any]
ROOT = "istio-system"
GATEWAY_KEY = "ingress/istio-ingressgateway"
CAPTURED = "captured.echo.svc.cluster.local"
CAPTURED_KEY = f"echo/{CAPTURED}"


def namespace(name: str) -> Obj:
    return {"metadata": {"name": name}}


def service(name: str, ns: str = "echo", ip: str = "10.96.0.10") -> Obj:
    return {
        "metadata": {"name": name, "namespace": ns},
        "spec": {
            "clusterIP": ip,
            "selector": {"app": name},
            "ports": [{"name": "http", "port": 80}, {"name": "https", "port": 443}],
        },
    }


def pod(name: str, ip: str, ns: str = "echo", **labels: str) -> Obj:
    return {
        "metadata": {"name": name, "namespace": ns, "uid": f"uid-{name}", "labels": labels},
        "spec": {"nodeName": "n1", "serviceAccountName": "default"},
        "status": {"phase": "Running", "podIP": ip, "podIPs": [{"ip": ip}]},
    }


def gateway_pod(ns: str = "ingress") -> Obj:
    found = pod("istio-ingressgateway-1", "198.18.4.9", ns, app="istio-ingressgateway", istio="ingressgateway")
    found["spec"]["serviceAccountName"] = "istio-ingressgateway-service-account"
    return found


def rule(name: str, ns: str, host: str = CAPTURED, **spec: Any) -> Obj:
    return {
        "apiVersion": "networking.istio.io/v1",
        "kind": "DestinationRule",
        "metadata": {"name": name, "namespace": ns},
        "spec": {"host": host, **spec},
    }


def lb(simple: str) -> dict[str, Any]:
    return {"loadBalancer": {"simple": simple}}


def translate(objects: list[Obj], *, pods: list[Obj] | None = None, **extra: Any) -> Translation:
    """The upstream layout: the gateway pods in ``ingress`` (unless ``pods`` says otherwise), the echo apps in
    ``echo``; Istio objects are sorted by kind."""
    by_kind: dict[str, list[Obj]] = {"Gateway": [], "VirtualService": [], "DestinationRule": []}
    for obj in objects:
        by_kind[obj["kind"]].append(obj)
    translation = translate_all(
        [gateway_pod(), *(pods or [])],
        [service("captured"), service("other", ip="10.96.0.11"), *extra.pop("services", [])],
        [],
        [namespace(n) for n in ("echo", "ingress", ROOT, "elsewhere")],
        istio_gateways=by_kind["Gateway"],
        virtual_services=by_kind["VirtualService"],
        destination_rules=by_kind["DestinationRule"],
        root_namespace=ROOT,
        **extra,
    )
    for config in translation.gateway_configs:  # what reaches a gateway is what its decoder accepts
        assert decode_gateway_config(config.gateway, pack_gateway_config(gateway_config_to_proto(config))) == config
    return translation


def config(translation: Translation, key: str = GATEWAY_KEY) -> GatewayConfig:
    (found,) = [c for c in translation.gateway_configs if c.gateway == key]
    return found


def route_to(host: str, ns: str = "echo", port: int = 443, subset: str = "") -> Obj:
    destination: dict[str, Any] = {"host": host, "port": {"number": port}}
    if subset:
        destination["subset"] = subset
    return {
        "apiVersion": "networking.istio.io/v1",
        "kind": "VirtualService",
        "metadata": {"name": "route", "namespace": ns},
        "spec": {"gateways": ["gateway"], "hosts": ["*"], "http": [{"route": [{"destination": destination}]}]},
    }


def test_upstream_ingress_tls_sends_the_backend_s_simple_tls_rule_to_the_gateway() -> None:
    found = config(translate(ingress_tls_objects("captured", 443, "echo"))).destination_rules
    assert found == (
        DestinationPolicy(
            CAPTURED_KEY,
            "echo/captured",
            TrafficPolicy(tls=ClientTls(TlsMode.SIMPLE, insecure_skip_verify=True)),
        ),
    )


def test_only_the_backends_of_the_gateway_s_routes_get_rules() -> None:
    objects = [
        *ingress_tls_objects("captured", 443, "echo"),
        rule("other", "echo", "other", trafficPolicy=lb("RANDOM")),
    ]
    assert [d.service_key for d in config(translate(objects)).destination_rules] == [CAPTURED_KEY]
    # Without a VirtualService the gateway routes nowhere and is told of no rule.
    gateway, _, dr = ingress_tls_objects("captured", 443, "echo")
    assert config(translate([gateway, dr])).destination_rules == ()


LOOKUP_CASES = [
    # (case, rules as (namespace, exportTo, lb), the rule that applies)
    ("the Service's namespace", [("echo", None, "RANDOM")], "echo/captured"),
    (
        "the gateway's namespace before the Service's",
        [("echo", None, "RANDOM"), ("ingress", None, "ROUND_ROBIN")],
        "ingress/captured",
    ),
    (
        "the Service's namespace before the root",
        [(ROOT, None, "RANDOM"), ("echo", None, "ROUND_ROBIN")],
        "echo/captured",
    ),
    ("the root namespace last", [(ROOT, None, "RANDOM")], f"{ROOT}/captured"),
    (
        "exportTo . hides the Service's rule",
        [("echo", ["."], "RANDOM"), (ROOT, None, "ROUND_ROBIN")],
        f"{ROOT}/captured",
    ),
    ("exportTo naming the gateway's namespace", [("echo", ["ingress"], "RANDOM")], "echo/captured"),
    ("exportTo naming another namespace", [("echo", ["elsewhere"], "RANDOM")], None),
    ("a rule of an unrelated namespace", [("elsewhere", None, "RANDOM")], None),
]


@pytest.mark.parametrize(("case", "rules", "applies"), LOOKUP_CASES, ids=[c[0] for c in LOOKUP_CASES])
def test_the_gateway_looks_rules_up_as_istiod_does_for_a_gateway(
    case: str, rules: list[tuple[str, list[str] | None, str]], applies: str | None
) -> None:
    objects = [
        *ingress_tls_objects("captured", 443, "echo")[:2],
        *(
            rule("captured", ns, CAPTURED, trafficPolicy=lb(simple), **({"exportTo": export} if export else {}))
            for ns, export, simple in rules
        ),
    ]
    found = config(translate(objects)).destination_rules
    assert [d.rule for d in found] == ([applies] if applies else [])


def test_a_virtual_service_route_to_a_subset_gets_the_subset_s_workloads_and_policy() -> None:
    pods = [
        pod("captured-v1", "198.18.1.10", app="captured", version="v1"),
        pod("captured-v2", "198.18.1.11", app="captured", version="v2"),
    ]
    subsets = [
        {"name": "v1", "labels": {"version": "v1"}},
        {
            "name": "v2",
            "labels": {"version": "v2"},
            "trafficPolicy": {"connectionPool": {"http": {"h2UpgradePolicy": "UPGRADE", "http2MaxRequests": 7}}},
        },
    ]
    objects = [
        ingress_tls_objects("captured", 80, "echo")[0],
        route_to("captured", port=80, subset="v2"),
        rule("captured", "echo", "captured", trafficPolicy=lb("ROUND_ROBIN"), subsets=subsets),
    ]
    translation = translate(objects, pods=pods)
    (policy,) = config(translation).destination_rules
    uids = {w.name: w.uid for w in translation.config.workloads}
    assert policy.traffic_policy == TrafficPolicy(load_balancer=LoadBalancer(LoadBalancerType.ROUND_ROBIN))
    assert policy.subsets == (
        Subset("v1", frozenset({uids["captured-v1"]})),
        Subset(
            "v2",
            frozenset({uids["captured-v2"]}),
            TrafficPolicy(connection_pool=ConnectionPool(http2_max_requests=7, h2_upgrade=H2Upgrade.UPGRADE)),
        ),
    )
    (rule_sent,) = config(translation).listeners[0].virtual_hosts[0].http
    assert rule_sent.backends[0].backend is not None and rule_sent.backends[0].backend.subset == "v2"


def test_a_gateway_api_gateway_gets_the_rules_of_its_httproute_backends() -> None:
    gateway = {
        "metadata": {"name": "edge", "namespace": "echo", "uid": "uid-edge"},
        "spec": {"gatewayClassName": "istio", "listeners": [{"name": "http", "port": 8080, "protocol": "HTTP"}]},
    }
    route = {
        "metadata": {"name": "to-captured", "namespace": "echo"},
        "spec": {
            "parentRefs": [{"name": "edge"}],
            "rules": [{"backendRefs": [{"name": "captured", "port": 443}]}],
        },
    }
    dr = ingress_tls_objects("captured", 443, "echo")[2]
    translation = translate([dr], gateways=[gateway], http_routes=[route])
    (policy,) = config(translation, "echo/edge").destination_rules
    assert policy.rule == "echo/captured" and policy.traffic_policy is not None
    assert policy.traffic_policy.tls == ClientTls(TlsMode.SIMPLE, insecure_skip_verify=True)


def _tls_secret(name: str, ns: str) -> Obj:
    return {
        "metadata": {"name": name, "namespace": ns},
        "type": "kubernetes.io/tls",
        "data": {
            "tls.crt": base64.b64encode(b"-----BEGIN CERTIFICATE-----\nAA==\n-----END CERTIFICATE-----\n").decode(),
            "tls.key": base64.b64encode(b"-----BEGIN PRIVATE KEY-----\nAA==\n-----END PRIVATE KEY-----\n").decode(),
        },
    }


def test_a_secret_s_client_key_never_reaches_a_gateway_of_another_namespace() -> None:
    """A MUTUAL rule's credentialName key material is served only to proxies of the rule's namespace (istiod reads
    a credentialName from the proxy's own namespace): the gateway in ``ingress`` gets the rule without the key,
    and so refuses MUTUAL traffic rather than send it without a certificate."""
    mutual = {"tls": {"mode": "MUTUAL", "credentialName": "client"}}
    objects = [*ingress_tls_objects("captured", 443, "echo")[:2], rule("captured", "echo", trafficPolicy=mutual)]
    translation = translate(objects, secrets=[_tls_secret("client", "echo")])
    (policy,) = config(translation).destination_rules
    assert policy.traffic_policy is not None and policy.traffic_policy.tls is not None
    assert policy.traffic_policy.tls.mode is TlsMode.MUTUAL
    assert policy.traffic_policy.tls.private_key == "" and policy.traffic_policy.tls.client_certificate == ""
    # The same rule in the gateway's own namespace gives it the key.
    objects[-1] = rule("captured", "ingress", trafficPolicy=mutual)
    translation = translate(objects, secrets=[_tls_secret("client", "ingress")])
    (policy,) = config(translation).destination_rules
    assert policy.traffic_policy is not None and policy.traffic_policy.tls is not None
    assert policy.traffic_policy.tls.private_key.startswith("-----BEGIN PRIVATE KEY-----")


def test_a_gateway_refuses_a_config_whose_destination_rules_break_the_rules() -> None:
    """A hostile or broken control plane: a rule given twice for one Service, or a subset name that is not a DNS
    label, is refused whole (the gateway NACKs it and keeps what it had), with the field named."""
    base = config(translate(ingress_tls_objects("captured", 443, "echo")))
    twice = GatewayConfig(base.gateway, base.listeners, destination_rules=base.destination_rules * 2)
    with pytest.raises(XdsConversionError, match="destination_rules: a service key is given twice"):
        decode_gateway_config(base.gateway, pack_gateway_config(gateway_config_to_proto(twice)))
    bad = GatewayConfig(
        base.gateway,
        base.listeners,
        destination_rules=(DestinationPolicy(CAPTURED_KEY, subsets=(Subset("Not_A_Label"),)),),
    )
    with pytest.raises(XdsConversionError, match=r"destination_rules\[0\]\.subsets\[0\]\.name"):
        decode_gateway_config(base.gateway, pack_gateway_config(gateway_config_to_proto(bad)))


SELECTOR_CASES = [
    # (case, rules as (namespace, workloadSelector labels or None, lb), the rule that applies)
    (
        "a selector rule matching the gateway pods first",
        [("ingress", None, "ROUND_ROBIN"), ("ingress", {"istio": "ingressgateway"}, "RANDOM")],
        "ingress/captured-1",
    ),
    (
        "a selector rule for other pods is passed over",
        [("ingress", None, "ROUND_ROBIN"), ("ingress", {"istio": "egressgateway"}, "RANDOM")],
        "ingress/captured-0",
    ),
    (
        "a selector rule for other pods still hides the wider rules",
        [("ingress", {"app": "other"}, "RANDOM"), ("echo", None, "ROUND_ROBIN")],
        None,
    ),
    (
        "a selector rule of the Service's namespace never applies",
        [("echo", {"istio": "ingressgateway"}, "RANDOM")],
        None,
    ),
]


@pytest.mark.parametrize(("case", "rules", "applies"), SELECTOR_CASES, ids=[c[0] for c in SELECTOR_CASES])
def test_a_workload_selector_rule_of_the_gateway_s_namespace_applies_to_its_pods(
    case: str, rules: list[tuple[str, dict[str, str] | None, str]], applies: str | None
) -> None:
    objects = [
        *ingress_tls_objects("captured", 443, "echo")[:2],
        *(
            rule(
                f"captured-{i}",
                ns,
                CAPTURED,
                trafficPolicy=lb(simple),
                **({"workloadSelector": {"matchLabels": labels}} if labels else {}),
            )
            for i, (ns, labels, simple) in enumerate(rules)
        ),
    ]
    found = config(translate(objects)).destination_rules
    assert [d.rule for d in found] == ([applies] if applies else [])
