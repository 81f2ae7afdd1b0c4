"""Ingress Gateways deployed by hand (:mod:`ambit.controlplane.translate.manual_gateways`, istiod's "manual
deployment"): the pods behind the Service a Gateway's Hostname address names read its config and are who policies
select; without such pods no one reads it; a managed Gateway keeps its own service account. A pod that comes later
is seen through the translation memo (the gateway stage is not reused across pod changes while such a Gateway
exists). Before, such a Gateway's config was readable only by ``<name>-istio``, which no pod runs as.
"""

from __future__ import annotations

from typing import Any

from ambit.controlplane.translate import TranslationMemo, translate_all
from ambit.controlplane.translate.manual_gateways import backing_pod, requested_services

NS = "edge"
RENDERED = "gateway.networking.k8s.io/gateway-name"
"""A label the controller's pods would carry: a Gateway deployed by hand has none of them."""


def gateway(*addresses: dict[str, str], name: str = "edge") -> dict[str, Any]:
    return {
        "metadata": {"name": name, "namespace": NS, "uid": f"u-{name}", "resourceVersion": "1", "generation": 1},
        "spec": {
            "gatewayClassName": "istio",
            "addresses": list(addresses),
            "listeners": [{"name": "http", "port": 8080, "protocol": "HTTP"}],
        },
    }


def service(name: str = "edge-proxies", selector: dict[str, str] | None = None) -> dict[str, Any]:
    return {
        "metadata": {"name": name, "namespace": NS, "uid": f"u-svc-{name}", "resourceVersion": "1"},
        "spec": {
            "selector": {"app": "edge-proxy"} if selector is None else selector,
            "clusterIP": "10.96.0.20",
            "ports": [{"port": 8080}],
        },
    }


def pod(name: str, account: str = "edge-sa", *, phase: str = "Running", **labels: str) -> dict[str, Any]:
    return {
        "metadata": {
            "name": name,
            "namespace": NS,
            "uid": f"u-pod-{name}",
            "resourceVersion": "1",
            "labels": {"app": "edge-proxy", **labels},
        },
        "spec": {"serviceAccountName": account, "nodeName": "node-1"},
        "status": {"phase": phase, "podIP": f"10.244.0.{len(name) + 10}"},
    }


NAMESPACES = [{"metadata": {"name": NS, "uid": "u-ns", "resourceVersion": "1"}}]
BY_HAND = gateway({"type": "Hostname", "value": "edge-proxies"})


def translate(gateways: list[dict[str, Any]], pods: list[dict[str, Any]], **kwargs: Any) -> Any:
    return translate_all(pods, [service()], [], NAMESPACES, gateways=gateways, **kwargs)


def authz(name: str, **labels: str) -> dict[str, Any]:
    rule = {"from": [{"source": {"requestPrincipals": ["*"]}}]}
    spec = {"selector": {"matchLabels": labels}, "rules": [rule]}
    return {"metadata": {"namespace": NS, "name": name, "uid": name}, "spec": spec}


def test_the_pods_behind_the_named_service_read_the_config_and_are_what_policies_select() -> None:
    policies = [authz("first", tier="first"), authz("second", tier="second"), authz("rendered", **{RENDERED: "edge"})]
    pods = [pod("b-pod", tier="second"), pod("a-pod", tier="first")]
    out = translate([BY_HAND], pods, authorization_policies=policies)
    assert dict(out.gateway_accounts)[f"{NS}/edge"] == "edge-sa"
    (config,) = [c for c in out.gateway_configs if c.gateway == f"{NS}/edge"]
    assert [p.name for p in config.policies] == ["first"]  # the first pod's labels, not the rendered ones


def test_without_pods_behind_the_service_no_one_reads_the_config() -> None:
    out = translate([BY_HAND], [pod("done", phase="Succeeded")])
    assert f"{NS}/edge" not in dict(out.gateway_accounts)


def test_a_managed_gateway_keeps_its_own_service_account() -> None:
    out = translate([gateway(name="managed")], [pod("a-pod")])
    assert dict(out.gateway_accounts)[f"{NS}/managed"] == "managed-istio"


def test_a_pod_that_comes_later_is_seen_through_the_memo() -> None:
    memo = TranslationMemo()
    first = translate([BY_HAND], [], translation_memo=memo)
    assert f"{NS}/edge" not in dict(first.gateway_accounts)
    later = pod("a-pod")
    out = translate([BY_HAND], [later], translation_memo=memo, changed={("pods", f"{NS}/a-pod"): later})
    assert dict(out.gateway_accounts)[f"{NS}/edge"] == "edge-sa"


def test_only_a_service_of_the_gateway_s_namespace_with_a_selector_leads_to_pods() -> None:
    elsewhere = requested_services(gateway({"type": "Hostname", "value": "edge-proxies.other.svc.cluster.local"}), "")
    assert backing_pod(elsewhere, "cluster.local", [service()], [pod("a-pod")]) is None
    here = requested_services(BY_HAND, "cluster.local")
    assert backing_pod(here, "cluster.local", [service(selector={})], [pod("a-pod")]) is None
    found = backing_pod(here, "cluster.local", [service()], [pod("a-pod")])
    assert found is not None and found["metadata"]["name"] == "a-pod"
