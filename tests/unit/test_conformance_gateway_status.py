"""Gateway API conformance, status side of ingress Gateways (class ``istio``): the Gateway's and each listener's
conditions, ``supportedKinds``, ``attachedRoutes`` and ``observedGeneration``, judged as the suite judges them (the
listeners must be exactly those expected; expected kinds must be listed and an expected empty list means none).
Each case replays one upstream conformance test with manifests of our own.

- GatewayInvalidRouteKind: ``allowedRoutes.kinds`` naming only an unknown kind → ResolvedRefs
  False/InvalidRouteKinds and no supportedKinds; with HTTPRoute beside it, HTTPRoute listed.
- GatewayInvalidTLSConfiguration: a certificateRef to a missing Secret, of another group, of another kind, or to a
  malformed Secret → ResolvedRefs False/InvalidCertificateRef, HTTPRoute still listed, 0 routes.
- GatewayListenerUnsupportedProtocol: a listener of an unknown protocol → Accepted False/UnsupportedProtocol with
  no kinds; the Gateway is Accepted False (only that listener) or True/ListenersNotValid (beside an HTTP one).
  The validating webhook admits such a Gateway, as the CRD's pattern does (it refused ``INVALID`` before).
- GatewaySecretMissingReferenceGrant, GatewaySecretInvalidReferenceGrant: a Secret of another namespace without a
  grant that fits (wrong namespace, from group/kind/namespace, to group/kind/name) → RefNotPermitted, HTTPRoute
  still listed in supportedKinds (it was not, before: a listener not Accepted listed none).
- GatewaySecretReferenceGrantSpecific, GatewaySecretReferenceGrantAllInNamespace: a fitting grant → Programmed
  and ResolvedRefs True.
- GatewayObservedGenerationBump: every condition, the listeners' too, carries the Gateway's generation.
- GatewayModifyListeners: a listener added or removed is reported, the Gateway's conditions follow, and a route
  naming the Gateway without a sectionName counts on the HTTP and the HTTPS listener alike.
- attachedRoutes (GatewayWithAttachedRoutes, HTTPRouteHostnameIntersection, both skipped by Istio; istiod counts
  only the listeners a route is accepted on): a route whose hostnames do not meet a listener's hostname is not
  counted there (it was), one with a matching name or a covering wildcard is, a TCPRoute has no hostnames; a
  listener whose ``allowedRoutes`` selects namespaces by label counts the routes of the namespaces it selects, its
  own only when selected, as the translation attaches them (it counted its own namespace's and no other's).
- GatewayInfrastructure: ``spec.infrastructure`` labels and annotations reach the ServiceAccount, the pods and the
  Service, which carry the ``gateway.networking.k8s.io/gateway-name`` label the suite lists them by.
- GatewayOptionalAddressValue: an address without a value (the implementation assigns one) is admitted by the
  validating webhook (it was refused: "required"), as are the GatewayStaticAddresses test's addresses (a
  domain-prefixed type, Hostname values); a value given is still checked (an IPAddress that is not one, a Hostname
  that is not a DNS name). The rest of GatewayStaticAddresses (binding to those addresses) is replayed in
  tests/unit/test_conformance_gateway_addresses.py.
- GatewayNameMaximumLength: a Gateway named with 253 characters cannot be deployed (its Service name would not be
  a DNS label) but still gets its conditions, at its generation (as istiod, which does not shorten names either).
"""

from __future__ import annotations

import base64
import time
from typing import Any

import pytest

from ambit.controlplane.gateway.ingress_status import ingress_attached_routes, ingress_status
from ambit.controlplane.gateway.render import Rendered, Unrenderable, WaypointTemplateSettings, render_waypoint
from ambit.controlplane.gateway.status import Deployed
from ambit.controlplane.translate.listeners import judge_listeners
from ambit.controlplane.translate.reference_grants import ReferenceGrants
from ambit.controlplane.webhook import validate
from ambit.tls.certs import issue_server_cert, new_ca

INFRA, WEB, APP = "infra", "web", "app"
GROUP = "gateway.networking.k8s.io"
HTTPROUTE = {"group": GROUP, "kind": "HTTPRoute"}
CA = new_ca("conformance CA", now=time.time())
PAIR = issue_server_cert(CA, common_name="a.example", dns_names=["a.example"], ip_addresses=[], now=time.time())
ADDRESS = [{"type": "Hostname", "value": "gw-istio.infra.svc.cluster.local"}]


def tls_secret(namespace: str, name: str, cert: bytes = PAIR.cert_pem, key: bytes = PAIR.key_pem) -> dict[str, Any]:
    return {
        "metadata": {"namespace": namespace, "name": name},
        "type": "kubernetes.io/tls",
        "data": {"tls.crt": base64.b64encode(cert).decode(), "tls.key": base64.b64encode(key).decode()},
    }


SECRETS = {
    (INFRA, "tls-validity-checks-certificate"): tls_secret(INFRA, "tls-validity-checks-certificate"),
    (INFRA, "malformed-certificate"): tls_secret(INFRA, "malformed-certificate", b"Hello world\n", b"Hello world\n"),
    (WEB, "certificate"): tls_secret(WEB, "certificate"),
}


def gateway(*listeners: dict[str, Any], generation: int = 1, name: str = "gw") -> dict[str, Any]:
    return {
        "metadata": {"namespace": INFRA, "name": name, "generation": generation, "uid": "u-1"},
        "spec": {"gatewayClassName": "istio", "listeners": list(listeners)},
    }


def https(*refs: dict[str, Any]) -> dict[str, Any]:
    return {
        "name": "https",
        "port": 443,
        "protocol": "HTTPS",
        "allowedRoutes": {"namespaces": {"from": "All"}},
        "tls": {"certificateRefs": list(refs)},
    }


def http(name: str = "http", port: int = 80, **extra: Any) -> dict[str, Any]:
    return {"name": name, "port": port, "protocol": "HTTP", **extra}


def status(
    gw: dict[str, Any], grants: list[dict[str, Any]] | None = None, routes: list[dict[str, Any]] | None = None
) -> dict[str, Any]:
    judged = judge_listeners(gw, lambda ns, name: SECRETS.get((ns, name)), grants=ReferenceGrants.build(grants or []))
    attached = ingress_attached_routes(gw, {"HTTPRoute": routes or []})
    found = Deployed(service_exists=True, ready=True)
    return ingress_status(gw, found, judged, host=ADDRESS[0]["value"], addresses=ADDRESS, attached=attached)


def listener(out: dict[str, Any], name: str) -> dict[str, Any]:
    (found,) = [item for item in out["listeners"] if item["name"] == name]
    return found


def cond(conditions: list[dict[str, Any]], type_: str) -> tuple[str, str]:
    (found,) = [c for c in conditions if c["type"] == type_]
    return found["status"], found["reason"]


def kinds(item: dict[str, Any]) -> list[str]:
    return [k["kind"] for k in item["supportedKinds"]]


# -- route kinds ----------------------------------------------------------------------------------------------
def test_invalid_route_kind() -> None:
    only = http(allowedRoutes={"namespaces": {"from": "All"}, "kinds": [{"kind": "InvalidRoute"}]})
    item = listener(status(gateway(only)), "http")
    assert item["supportedKinds"] == []
    assert cond(item["conditions"], "ResolvedRefs") == ("False", "InvalidRouteKinds")
    assert item["attachedRoutes"] == 0
    both = http(
        allowedRoutes={"namespaces": {"from": "All"}, "kinds": [{"kind": "InvalidRoute"}, {"kind": "HTTPRoute"}]}
    )
    item = listener(status(gateway(both)), "http")
    assert HTTPROUTE in item["supportedKinds"]
    assert cond(item["conditions"], "ResolvedRefs") == ("False", "InvalidRouteKinds")


# -- certificates ---------------------------------------------------------------------------------------------
@pytest.mark.parametrize(
    "ref",
    [
        {"group": "", "kind": "Secret", "name": "nonexistent-certificate"},
        {"group": "wrong.group.company.io", "kind": "Secret", "name": "tls-validity-checks-certificate"},
        {"group": "", "kind": "WrongKind", "name": "tls-validity-checks-certificate"},
        {"group": "", "kind": "Secret", "name": "malformed-certificate"},
    ],
    ids=["nonexistent", "unsupported group", "unsupported kind", "malformed"],
)
def test_invalid_tls_configuration(ref: dict[str, Any]) -> None:
    item = listener(status(gateway(https(ref))), "https")
    assert HTTPROUTE in item["supportedKinds"]
    assert cond(item["conditions"], "ResolvedRefs") == ("False", "InvalidCertificateRef")
    assert item["attachedRoutes"] == 0


def test_a_valid_certificate_in_the_gateways_namespace_is_programmed() -> None:
    item = listener(status(gateway(https({"name": "tls-validity-checks-certificate"}))), "https")
    assert cond(item["conditions"], "Programmed") == ("True", "Programmed")
    assert cond(item["conditions"], "ResolvedRefs") == ("True", "ResolvedRefs")


# -- protocols ------------------------------------------------------------------------------------------------
def test_listener_unsupported_protocol() -> None:
    invalid = {"name": "invalid", "port": 1111, "protocol": "INVALID"}
    out = status(gateway(invalid))
    assert cond(out["conditions"], "Accepted") == ("False", "ListenersNotValid")
    item = listener(out, "invalid")
    assert item["supportedKinds"] == []
    assert cond(item["conditions"], "Accepted") == ("False", "UnsupportedProtocol")
    out = status(gateway(http(), invalid))
    assert cond(out["conditions"], "Accepted") == ("True", "ListenersNotValid")
    assert HTTPROUTE in listener(out, "http")["supportedKinds"]
    assert cond(listener(out, "http")["conditions"], "Accepted") == ("True", "Accepted")
    assert listener(out, "invalid")["supportedKinds"] == []


# -- secrets of another namespace -----------------------------------------------------------------------------
def secret_grant(
    name: str,
    namespace: str = WEB,
    from_group: str = GROUP,
    from_kind: str = "Gateway",
    from_namespace: str = INFRA,
    to_group: str = "",
    to_kind: str = "Secret",
    to_name: str | None = "certificate",
) -> dict[str, Any]:
    to: dict[str, Any] = {"group": to_group, "kind": to_kind}
    if to_name is not None:
        to["name"] = to_name
    return {
        "metadata": {"namespace": namespace, "name": name},
        "spec": {"from": [{"group": from_group, "kind": from_kind, "namespace": from_namespace}], "to": [to]},
    }


CROSS = https({"group": "", "kind": "Secret", "name": "certificate", "namespace": WEB})
WRONG_GRANTS = [
    secret_grant("wrong-namespace", namespace=APP),
    secret_grant("wrong-from-group", from_group="not-the-group"),
    secret_grant("wrong-from-kind", from_kind="HTTPRoute"),
    secret_grant("wrong-from-namespace", from_namespace="not-the-namespace"),
    secret_grant("wrong-to-group", to_group="not-the-group", to_name="other"),
    secret_grant("wrong-to-kind", to_kind="Service"),
    secret_grant("wrong-to-name", to_name="not-the-certificate"),
]


@pytest.mark.parametrize("grants", [[], WRONG_GRANTS], ids=["missing", "invalid"])
def test_secret_reference_grant_missing_or_invalid(grants: list[dict[str, Any]]) -> None:
    item = listener(status(gateway(CROSS), grants), "https")
    assert HTTPROUTE in item["supportedKinds"]
    assert cond(item["conditions"], "ResolvedRefs") == ("False", "RefNotPermitted")
    assert item["attachedRoutes"] == 0


@pytest.mark.parametrize("to_name", ["certificate", None], ids=["specific", "all in namespace"])
def test_secret_reference_grant(to_name: str | None) -> None:
    item = listener(status(gateway(CROSS), [secret_grant("grant", to_name=to_name)]), "https")
    assert HTTPROUTE in item["supportedKinds"]
    assert cond(item["conditions"], "Programmed") == ("True", "Programmed")
    assert cond(item["conditions"], "ResolvedRefs")[0] == "True"


# -- generations and changes ----------------------------------------------------------------------------------
def test_observed_generation_bump_and_modified_listeners() -> None:
    listeners = [http(hostname="bar.com", allowedRoutes={"namespaces": {"from": "All"}})]
    before = status(gateway(*listeners, generation=1))
    after = status(gateway(*listeners, http("alternate", 8080), generation=2))
    for out, generation in ((before, 1), (after, 2)):
        every = [*out["conditions"], *(c for item in out["listeners"] for c in item["conditions"])]
        assert {c["observedGeneration"] for c in every} == {generation}
    assert [item["name"] for item in after["listeners"]] == ["http", "alternate"]
    assert cond(after["conditions"], "Accepted") == ("True", "Accepted")
    removed = status(gateway(http("alternate", 8080), generation=3))
    assert [item["name"] for item in removed["listeners"]] == ["alternate"]


def test_attached_routes_count_per_listener() -> None:
    all_ns = {"namespaces": {"from": "All"}}
    gw = gateway(http(allowedRoutes=all_ns), http("other", 8080), https({"name": "tls-validity-checks-certificate"}))
    route = {
        "metadata": {"namespace": WEB, "name": "r"},
        "spec": {"parentRefs": [{"name": "gw", "namespace": INFRA}]},
    }
    same = {"metadata": {"namespace": INFRA, "name": "s"}, "spec": {"parentRefs": [{"name": "gw", "port": 8080}]}}
    out = status(gw, routes=[route, same])
    assert {item["name"]: item["attachedRoutes"] for item in out["listeners"]} == {"http": 1, "other": 1, "https": 1}


def test_modify_listeners_counts_a_route_on_each_listener() -> None:
    all_ns = {"namespaces": {"from": "All"}}
    secure = dict(https({"name": "tls-validity-checks-certificate", "namespace": INFRA}), hostname="secure.test.com")
    added = http(hostname="data.test.com", allowedRoutes=all_ns)
    route = {"metadata": {"namespace": INFRA, "name": "r"}, "spec": {"parentRefs": [{"kind": "Gateway", "name": "gw"}]}}
    out = status(gateway(secure, added, generation=2), routes=[route])
    for item in out["listeners"]:
        assert item["attachedRoutes"] == 1, item["name"]
        assert HTTPROUTE in item["supportedKinds"]
        assert cond(item["conditions"], "Accepted")[0] == "True"
        assert cond(item["conditions"], "ResolvedRefs")[0] == "True"


# -- deployment -----------------------------------------------------------------------------------------------
TEMPLATE = WaypointTemplateSettings(xds_address="198.18.0.1:15012")


def test_infrastructure_labels_and_annotations_are_propagated() -> None:
    gw = gateway(http(port=8080), name="gateway-with-infrastructure-metadata")
    gw["spec"]["infrastructure"] = {"annotations": {"key1": "value1"}, "labels": {"key2": "value2"}}
    rendered = render_waypoint(gw, TEMPLATE)
    assert isinstance(rendered, Rendered), rendered
    pod = rendered.deployment["spec"]["template"]["metadata"]
    for meta in (rendered.service_account["metadata"], pod, rendered.service["metadata"]):
        assert meta["labels"]["gateway.networking.k8s.io/gateway-name"] == "gateway-with-infrastructure-metadata"
        assert meta["labels"]["key2"] == "value2"
        assert meta["annotations"]["key1"] == "value1"


def test_name_maximum_length_still_gets_its_conditions() -> None:
    gw = gateway(http(), name="gateway-name-maximum-length-" + "a" * 225, generation=4)
    assert len(gw["metadata"]["name"]) == 253
    rendered = render_waypoint(gw, TEMPLATE)
    assert isinstance(rendered, Unrenderable)
    judged = judge_listeners(gw, lambda ns, name: None)
    out = ingress_status(gw, Deployed(problem=rendered.message), judged, host="h", addresses=())
    assert {c["observedGeneration"] for c in out["conditions"]} == {4}
    assert cond(out["conditions"], "Accepted") == ("True", "Accepted")
    assert cond(out["conditions"], "Programmed") == ("False", "Invalid")


# -- addresses (the validating webhook) -----------------------------------------------------------------------
def address_errors(*addresses: dict[str, Any]) -> list[str]:
    gw = gateway(http(port=8080))
    gw["kind"] = "Gateway"
    gw["spec"]["addresses"] = list(addresses)
    return [e.path for e in validate("Gateway", gw) if not e.warning]


def test_optional_address_value_and_static_addresses_are_admitted() -> None:
    assert address_errors({"type": "IPAddress"}) == []
    assert address_errors({"type": "Hostname"}, {}) == []
    static = [
        {"type": "test/fake-invalid-type", "value": "fake address teehee!"},
        {"type": "Hostname", "value": "foo"},
        {"type": "Hostname", "value": "infra-backend-v1.gateway-conformance-infra.svc.cluster.local"},
        {"type": "Hostname", "value": "*.example.com"},
        {"value": "10.0.0.1"},
    ]
    assert address_errors(*static) == []
    bad = address_errors({"value": "not-an-ip"}, {"type": "Hostname", "value": "Not A Name"})
    assert bad == ["spec.addresses[0].value", "spec.addresses[1].value"]


def test_the_webhook_admits_a_listener_of_an_unknown_protocol_as_the_crd_does() -> None:
    for protocol in ("INVALID", "GOPHER", "example.com/custom", "HTTP"):
        gw = gateway({"name": "invalid", "port": 1111, "protocol": protocol})
        gw["kind"] = "Gateway"
        assert [e.path for e in validate("Gateway", gw) if not e.warning] == [], protocol
    for protocol in ("", "GO PHER", "-bad", "example.com/"):
        gw = gateway({"name": "invalid", "port": 1111, "protocol": protocol})
        gw["kind"] = "Gateway"
        assert "spec.listeners[0].protocol" in [e.path for e in validate("Gateway", gw)], protocol


def test_attached_routes_count_only_listeners_whose_hostname_a_route_meets() -> None:
    all_ns = {"namespaces": {"from": "All"}}
    gw = gateway(
        http("very", hostname="very.specific.com", allowedRoutes=all_ns),
        http("wild", 8080, hostname="*.wildcard.io", allowedRoutes=all_ns),
        http("any", 8081, allowedRoutes=all_ns),
    )

    def route(name: str, *hostnames: str) -> dict[str, Any]:
        spec: dict[str, Any] = {"parentRefs": [{"name": "gw"}]}
        if hostnames:
            spec["hostnames"] = list(hostnames)
        return {"metadata": {"namespace": INFRA, "name": name}, "spec": spec}

    routes = [
        route("specific", "very.specific.com"),
        route("under-wildcard", "foo.wildcard.io", "non.matching.com"),
        route("covering", "*.specific.com"),
        route("none-match", "non.matching.com", "*.nonmatchingwildcard.io"),
        route("no-hostnames"),
    ]
    counts = ingress_attached_routes(gw, {"HTTPRoute": routes})
    assert counts == {"very": 3, "wild": 2, "any": 5}
    tcp = {"name": "tcp", "port": 9000, "protocol": "TCP", "allowedRoutes": all_ns}
    assert ingress_attached_routes(gateway(tcp), {"TCPRoute": [route("t")]}) == {"tcp": 1}


def test_attached_routes_count_routes_of_namespaces_a_selector_admits() -> None:
    selector = {"namespaces": {"from": "Selector", "selector": {"matchLabels": {"gateway": "yes"}}}}
    gw = gateway(http(allowedRoutes=selector))

    def route(namespace: str) -> dict[str, Any]:
        return {
            "metadata": {"namespace": namespace, "name": "r"},
            "spec": {"parentRefs": [{"name": "gw", "namespace": INFRA}]},
        }

    routes = {"HTTPRoute": [route(WEB), route(APP), route(INFRA)]}
    labels = {WEB: {"gateway": "yes"}, APP: {"gateway": "no"}}
    assert ingress_attached_routes(gw, routes, namespace_labels=labels) == {"http": 1}  # web only: infra is unlabelled
    labels[INFRA] = {"gateway": "yes"}
    assert ingress_attached_routes(gw, routes, namespace_labels=labels) == {"http": 2}
    assert ingress_attached_routes(gw, routes) == {"http": 1}  # without labels only its own namespace
    broken = gateway(http(allowedRoutes={"namespaces": {"from": "Selector", "selector": {"matchLabels": [1]}}}))
    assert ingress_attached_routes(broken, routes, namespace_labels=labels) == {"http": 0}
