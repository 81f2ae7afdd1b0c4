"""Gateway API conformance, ``spec.addresses`` of ingress Gateways (class ``istio``), judged as the suite judges
them and worded as istiod words them, with manifests of our own.

- GatewayStaticAddresses, as Istio runs it (usable: the Hostname of the ``infra-backend-v1`` Service; unusable: the
  Hostname ``foo``): with an address of an unknown type beside them, Accepted False/UnsupportedAddress; without
  it, Accepted True and Programmed False/AddressNotUsable ('hostname "foo..." not found'); with the usable one
  alone, Programmed True and exactly that address in ``status.addresses``. The status follows each change of the
  spec (transition times move when a condition flips). None of the three is deployed: a Hostname address names
  the proxies of a manual deployment. Before, the addresses were ignored: every step said Accepted True and
  Programmed by the Gateway's own Service.
- istiod's unit goldens (``pilot/pkg/config/kube/gateway/testdata/invalid.yaml``, ``multi-gateway.yaml`` without its
  ServiceEntry host, ``tls-terminate.yaml``, ``http.yaml`` and the many that bind to ``istio-ingressgateway``): a
  Service of the Gateway's namespace with endpoints on the listener's port (short name or fully qualified), a
  hostname that is no Service, a listener port that is the workload's port (with istiod's hint), a port no
  endpoint serves, a Service without endpoints, a load balancer whose address is pending or given, a single
  address of an unknown type (nothing left: only the conditions are written).
- istiod's listenerset-invalid golden: a ListenerSet of a manual deployment is Programmed from the parent's
  Services on its own port (12345: not found); one whose parent has no Hostname address is not accepted ("Parent
  not accepted: ..."). Before, both were judged by the parent's own deployed Service.
- A managed Gateway with one IPAddress asks its LoadBalancer Service for it (``loadBalancerIP``), as istiod's
  template does; before, the address was not rendered.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from typing import Any

import pytest
from hypothesis import given
from hypothesis import strategies as st

from ambit.controlplane.gateway.ingress_status import (
    gateway_ports,
    ingress_attached_routes,
    ingress_status,
    listener_set_server_ports,
    listener_set_status,
)
from ambit.controlplane.gateway.render import Rendered, WaypointTemplateSettings, render_waypoint
from ambit.controlplane.gateway.static_addresses import (
    Bound,
    bind,
    english_join,
    resolve,
)
from ambit.controlplane.gateway.status import Deployed, plan_status
from ambit.controlplane.translate.listener_sets import LISTENER_SET_KINDS, merge_listener_sets
from ambit.controlplane.translate.listeners import judge_listeners
from ambit.controlplane.translate.manual_gateways import is_managed, requested_services
from ambit.controlplane.translate.reference_grants import ReferenceGrants

INFRA = "gateway-conformance-infra"
DOMAIN = "cluster.local"
USABLE = {"type": "Hostname", "value": f"infra-backend-v1.{INFRA}.svc.{DOMAIN}"}
UNUSABLE = {"type": "Hostname", "value": "foo"}
INVALID = {"type": "test/fake-invalid-type", "value": "fake address teehee!"}
HTTPROUTE = {"group": "gateway.networking.k8s.io", "kind": "HTTPRoute"}


def service(
    name: str,
    namespace: str = INFRA,
    ports: Sequence[tuple[str, int, int]] = (("", 8080, 3000),),
    *,
    kind: str = "ClusterIP",
    ingress: Sequence[Mapping[str, str]] = (),
    labels: Mapping[str, str] | None = None,
) -> dict[str, Any]:
    """A Service with ports (name, port, targetPort)."""
    return {
        "metadata": {"name": name, "namespace": namespace, "labels": dict(labels or {})},
        "spec": {
            "type": kind,
            "clusterIP": "10.96.0.7",
            "ports": [
                {"name": n, "port": p, "targetPort": t} if n else {"port": p, "targetPort": t} for n, p, t in ports
            ],
        },
        "status": {"loadBalancer": {"ingress": [dict(i) for i in ingress]}},
    }


def endpoint_slice(svc: Mapping[str, Any], *, endpoints: int = 1) -> dict[str, Any]:
    """The EndpointSlice the Service's controller writes: each port by name with its target port."""
    meta = svc["metadata"]
    ports = [{"name": p.get("name", ""), "port": p["targetPort"]} for p in svc["spec"]["ports"]]
    return {
        "metadata": {
            "name": f"{meta['name']}-abcde",
            "namespace": meta["namespace"],
            "labels": {"kubernetes.io/service-name": meta["name"]},
        },
        "ports": ports,
        "endpoints": [{"addresses": [f"10.244.0.{i + 10}"]} for i in range(endpoints)],
    }


class Cluster:
    """A :class:`~ambit.controlplane.gateway.static_addresses.ServiceLookup` over a few objects."""

    def __init__(self, *services: dict[str, Any], slices: Sequence[dict[str, Any]] | None = None) -> None:
        self.services = {(s["metadata"]["namespace"], s["metadata"]["name"]): s for s in services}
        self.slices = list(slices if slices is not None else [endpoint_slice(s) for s in services])

    def find_service(self, namespace: str, name: str) -> Mapping[str, Any] | None:
        return self.services.get((namespace, name))

    def endpoint_slices(self, namespace: str, service: str) -> Sequence[Mapping[str, Any]]:
        return [
            s
            for s in self.slices
            if s["metadata"]["namespace"] == namespace
            and s["metadata"]["labels"]["kubernetes.io/service-name"] == service
        ]


CONFORMANCE = Cluster(service("infra-backend-v1"), service("infra-backend-v2"))


def gateway(
    *addresses: Mapping[str, str],
    listeners: Sequence[Mapping[str, Any]] = ({"name": "http", "port": 8080, "protocol": "HTTP"},),
    namespace: str = INFRA,
    name: str = "gateway-static-addresses",
    generation: int = 1,
    annotations: Mapping[str, str] | None = None,
) -> dict[str, Any]:
    return {
        "metadata": {
            "name": name,
            "namespace": namespace,
            "generation": generation,
            "uid": "u-1",
            "resourceVersion": "1",
            "annotations": dict(annotations or {}),
        },
        "spec": {"gatewayClassName": "istio", "addresses": [dict(a) for a in addresses], "listeners": list(listeners)},
    }


def wanted(gw: Mapping[str, Any], cluster: Cluster = CONFORMANCE) -> dict[str, Any]:
    """The status the controller wants for ``gw``, a manual deployment."""
    assert not is_managed(gw)
    judged = judge_listeners(gw, lambda ns, name: None, grants=ReferenceGrants.build([]))
    requested = requested_services(gw, DOMAIN)
    resolution = resolve(gw["metadata"]["namespace"], requested.services, gateway_ports(judged), cluster, DOMAIN)
    host = f"{gw['metadata']['name']}-istio.{gw['metadata']['namespace']}.svc.{DOMAIN}"
    return ingress_status(
        gw,
        Deployed(),
        judged,
        host=host,
        addresses=(),
        attached=ingress_attached_routes(gw, {}),
        bound=Bound(requested, resolution),
    )


def cond(status: Mapping[str, Any], type_: str) -> tuple[str, str, str]:
    (found,) = [c for c in status["conditions"] if c["type"] == type_]
    return found["status"], found["reason"], found["message"]


def written(obj: dict[str, Any], now: str, cluster: Cluster = CONFORMANCE) -> dict[str, Any]:
    """``obj`` after the controller's status write (the merge patch applied as the API server would)."""
    patch = plan_status(obj, wanted(obj, cluster), now)
    if patch is None:
        return obj
    status = dict(obj.get("status") or {})
    for key, value in patch["status"].items():
        if value is None:
            status.pop(key, None)
        else:
            status[key] = value
    return {**obj, "status": status}


# -- GatewayStaticAddresses -----------------------------------------------------------------------------------
ASSIGNED = f"{USABLE['value']}:8080"
FOO = f"foo.{INFRA}.svc.{DOMAIN}"


def test_static_addresses_an_unsupported_type_is_not_accepted() -> None:
    out = wanted(gateway(INVALID, UNUSABLE, USABLE))
    assert cond(out, "Accepted") == (
        "False",
        "UnsupportedAddress",
        "only Hostname is supported, ignoring [fake address teehee!]",
    )
    assert cond(out, "Programmed") == (
        "False",
        "AddressNotUsable",
        f'Assigned to service(s) {ASSIGNED}, but failed to assign to all requested addresses: hostname "{FOO}" '
        "not found",
    )
    assert out["addresses"] == [USABLE]


def test_static_addresses_an_unusable_address_is_accepted_but_not_programmed() -> None:
    out = wanted(gateway(UNUSABLE, USABLE))
    assert cond(out, "Accepted") == ("True", "Accepted", "Resource accepted")
    assert cond(out, "Programmed")[:2] == ("False", "AddressNotUsable")


def test_static_addresses_the_usable_address_alone_is_programmed_and_reported() -> None:
    out = wanted(gateway(USABLE))
    assert cond(out, "Accepted") == ("True", "Accepted", "Resource accepted")
    assert cond(out, "Programmed") == ("True", "Programmed", f"Resource programmed, assigned to service(s) {ASSIGNED}")
    assert out["addresses"] == [USABLE]
    (listener,) = out["listeners"]
    assert listener["name"] == "http" and listener["attachedRoutes"] == 0
    assert HTTPROUTE in listener["supportedKinds"]
    states = {c["type"]: c["status"] for c in listener["conditions"]}
    assert states["Accepted"] == states["ResolvedRefs"] == "True"


def test_static_addresses_the_status_follows_each_patch_of_the_spec() -> None:
    obj = written(gateway(INVALID, UNUSABLE, USABLE), "t1")
    assert cond(obj["status"], "Accepted")[:2] == ("False", "UnsupportedAddress")
    obj = written({**gateway(UNUSABLE, USABLE, generation=2), "status": obj["status"]}, "t2")
    assert cond(obj["status"], "Accepted")[:2] == ("True", "Accepted")
    assert cond(obj["status"], "Programmed")[:2] == ("False", "AddressNotUsable")
    assert {c["type"]: c["observedGeneration"] for c in obj["status"]["conditions"]}["Accepted"] == 2
    obj = written({**gateway(USABLE, generation=3), "status": obj["status"]}, "t3")
    assert cond(obj["status"], "Programmed")[:2] == ("True", "Programmed")
    times = {c["type"]: c["lastTransitionTime"] for c in obj["status"]["conditions"]}
    assert times["Accepted"] == "t2" and times["Programmed"] == "t3" and times["ResolvedRefs"] == "t1"
    assert obj["status"]["addresses"] == [USABLE]
    assert plan_status(obj, wanted(obj), "t4") is None  # settled: nothing more to write


@pytest.mark.parametrize(
    "addresses", [(INVALID, UNUSABLE, USABLE), (UNUSABLE, USABLE), (USABLE,), (UNUSABLE,), (INVALID,)]
)
def test_static_addresses_no_step_is_deployed(addresses: tuple[Mapping[str, str], ...]) -> None:
    assert not is_managed(gateway(*addresses))


@pytest.mark.parametrize("addresses", [(), ({"value": "10.0.0.9"},), ({"type": "IPAddress", "value": "10.0.0.9"},)])
def test_no_address_or_one_ip_address_is_deployed(addresses: tuple[Mapping[str, str], ...]) -> None:
    assert is_managed(gateway(*addresses))


# -- istiod's goldens -----------------------------------------------------------------------------------------
SYSTEM = "istio-system"
INGRESS = service(
    "istio-ingressgateway",
    SYSTEM,
    (("http", 80, 8080), ("https", 443, 8443), ("tcp", 34000, 34000), ("tcp-other", 34001, 34001)),
    kind="LoadBalancer",
    ingress=({"ip": "1.2.3.4"},),
)
GOLDEN = Cluster(INGRESS)
INGRESS_HOST = f"istio-ingressgateway.{SYSTEM}.svc.{DOMAIN}"
SHORT = {"type": "Hostname", "value": "istio-ingressgateway"}


def listener(port: int, protocol: str = "HTTP", name: str = "default") -> dict[str, Any]:
    return {"name": name, "port": port, "protocol": protocol, "hostname": "*.domain.example"}


def test_golden_a_short_name_binds_to_the_service_and_reports_its_load_balancer_ip() -> None:
    out = wanted(gateway(SHORT, namespace=SYSTEM, listeners=[listener(80)]), GOLDEN)
    assert cond(out, "Programmed") == (
        "True",
        "Programmed",
        f"Resource programmed, assigned to service(s) {INGRESS_HOST}:80",
    )
    assert out["addresses"] == [{"type": "IPAddress", "value": "1.2.3.4"}]


def test_golden_two_ports_are_listed_as_english_does() -> None:
    out = wanted(gateway(SHORT, namespace=SYSTEM, listeners=[listener(80), listener(34000, "TCP", "tcp")]), GOLDEN)
    assert cond(out, "Programmed")[2] == (
        f"Resource programmed, assigned to service(s) {INGRESS_HOST}:34000 and {INGRESS_HOST}:80"
    )
    assert english_join(["a", "b", "c"]) == "a, b, and c"


def test_golden_a_hostname_that_is_no_service_is_not_usable() -> None:
    gw = gateway({"type": "Hostname", "value": "fake-service.com"}, namespace=SYSTEM, listeners=[listener(80)])
    out = wanted(gw, GOLDEN)
    assert cond(out, "Accepted")[:2] == ("True", "Accepted")
    assert cond(out, "Programmed") == (
        "False",
        "AddressNotUsable",
        'Failed to assign to any requested addresses: hostname "fake-service.com" not found',
    )
    assert "addresses" not in out or out["addresses"] is None


def test_golden_the_workload_port_gets_istiod_s_hint() -> None:
    out = wanted(gateway(SHORT, namespace=SYSTEM, listeners=[listener(8080)]), GOLDEN)
    assert cond(out, "Programmed") == (
        "False",
        "AddressNotUsable",
        f'Failed to assign to any requested addresses: port 8080 not found for hostname "{INGRESS_HOST}" (hint: the '
        "service port should be specified, not the workload port. Did you mean one of these ports: [80]?)",
    )


def test_golden_a_port_no_endpoint_serves_is_not_usable() -> None:
    out = wanted(gateway(SHORT, namespace=SYSTEM, listeners=[listener(34002, "HTTPS")]), GOLDEN)
    assert cond(out, "Programmed")[:2] == ("False", "AddressNotUsable")
    assert cond(out, "Programmed")[2].endswith(f'port 34002 not found for hostname "{INGRESS_HOST}"')


def test_golden_a_single_address_of_an_unknown_type_writes_only_the_conditions() -> None:
    gw = gateway({"type": "istio.io/FakeType", "value": "1.2.3.4"}, listeners=[listener(80)])
    out = wanted(gw, GOLDEN)
    assert cond(out, "Accepted") == ("False", "UnsupportedAddress", "only Hostname is supported, ignoring [1.2.3.4]")
    assert cond(out, "Programmed") == (
        "False",
        "UnsupportedAddress",
        "Failed to assign to any requested addresses",
    )
    assert cond(out, "ResolvedRefs") == ("True", "ResolvedRefs", "All references resolved")
    assert "listeners" not in out and "addresses" not in out


def test_a_service_without_endpoints_is_not_assigned_yet() -> None:
    out = wanted(gateway(USABLE), Cluster(service("infra-backend-v1"), slices=[]))
    assert cond(out, "Programmed") == (
        "False",
        "AddressNotAssigned",
        f'Failed to assign to any requested addresses: no instances found for hostname "{USABLE["value"]}"',
    )


def test_a_pending_load_balancer_is_assigned_but_not_reported() -> None:
    cluster = Cluster(service("edge", kind="LoadBalancer"))
    out = wanted(gateway({"type": "Hostname", "value": "edge"}), cluster)
    host = f"edge.{INFRA}.svc.{DOMAIN}"
    assert cond(out, "Programmed") == (
        "False",
        "AddressNotAssigned",
        f"Assigned to service(s) {host}:8080, but failed to assign to all requested addresses: address pending for "
        f'hostname "{host}"',
    )
    assert out["addresses"] is None


def test_a_service_of_another_namespace_is_named_in_the_warning() -> None:
    other = f"infra-backend-v1.{INFRA}.svc.{DOMAIN}"
    out = wanted(gateway({"type": "Hostname", "value": other}, namespace="apps"), CONFORMANCE)
    assert cond(out, "Programmed")[2] == (
        f'Failed to assign to any requested addresses: hostname "{other}" not found in namespace "apps", but it was '
        f'found in namespace(s) "{INFRA}"'
    )


def test_the_address_type_annotation_reports_cluster_ips() -> None:
    gw = gateway(USABLE, annotations={"networking.istio.io/address-type": "IPAddress"})
    assert wanted(gw)["addresses"] == [{"type": "IPAddress", "value": "10.96.0.7"}]


def test_an_address_once_reported_stays_when_nothing_is_to_report() -> None:
    obj = written(gateway(USABLE), "t1")
    obj = written({**gateway(USABLE, generation=2), "status": obj["status"]}, "t2", Cluster())
    assert cond(obj["status"], "Programmed")[:2] == ("False", "AddressNotUsable")
    assert obj["status"]["addresses"] == [USABLE]


# -- hostile input --------------------------------------------------------------------------------------------
ADDRESS = st.fixed_dictionaries(
    {},
    optional={
        "type": st.one_of(st.sampled_from(["Hostname", "IPAddress", "x/y"]), st.integers(), st.none()),
        "value": st.one_of(st.text(max_size=40), st.integers(), st.none()),
    },
)


@given(st.lists(st.one_of(ADDRESS, st.integers(), st.text(max_size=5)), max_size=6))
def test_any_addresses_give_a_status_never_a_traceback(addresses: list[Any]) -> None:
    gw = gateway()
    gw["spec"]["addresses"] = addresses
    requested = requested_services(gw, DOMAIN)
    resolution = resolve(INFRA, requested.services, [8080], CONFORMANCE, DOMAIN)
    out = ingress_status(gw, Deployed(), [], host="h", addresses=(), bound=Bound(requested, resolution))
    assert {c["type"] for c in out["conditions"]} >= {"Accepted", "Programmed", "ResolvedRefs"}
    assert all(len(c["message"]) <= 1024 for c in out["conditions"])


def test_a_gateway_naming_many_missing_services_gets_a_bounded_message() -> None:
    many = [{"type": "Hostname", "value": f"missing-{i:02d}-{'x' * 40}"} for i in range(16)]
    out = wanted(gateway(*many))
    assert cond(out, "Programmed")[:2] == ("False", "AddressNotUsable")
    assert len(cond(out, "Programmed")[2]) == 1024


# -- a managed Gateway's static IP ----------------------------------------------------------------------------
@pytest.mark.parametrize(
    ("addresses", "annotations", "ip"),
    [
        (({"type": "IPAddress", "value": "198.18.254.9"},), {}, "198.18.254.9"),
        (({"value": "198.18.254.9"},), {}, "198.18.254.9"),
        (({"type": "IPAddress", "value": "198.18.254.9"},), {"networking.istio.io/service-type": "ClusterIP"}, None),
        (({"type": "IPAddress"},), {}, None),
        ((), {}, None),
    ],
)
def test_one_ip_address_is_the_load_balancer_s_ip(
    addresses: tuple[Mapping[str, str], ...], annotations: Mapping[str, str], ip: str | None
) -> None:
    gw = gateway(*addresses, annotations=annotations)
    assert is_managed(gw)
    out = render_waypoint(gw, WaypointTemplateSettings())
    assert isinstance(out, Rendered)
    assert out.service["spec"].get("loadBalancerIP") == ip


# -- ListenerSets of a manual deployment (istiod's listenerset-invalid golden) --------------------------------
def listener_set(name: str, parent: str, port: int, *extra: dict[str, Any]) -> tuple[tuple[str, str], dict[str, Any]]:
    ref = {"name": parent, "kind": "Gateway", "group": "gateway.networking.k8s.io"}
    listener = {"name": "first", "hostname": "first.foo.com", "protocol": "HTTP", "port": port}
    meta = {"name": name, "namespace": SYSTEM, "generation": 1}
    return LISTENER_SET_KINDS[0], {"metadata": meta, "spec": {"parentRef": ref, "listeners": [listener, *extra]}}


def set_status(parent: dict[str, Any], port: int, *extra: dict[str, Any]) -> dict[str, Any]:
    parent["spec"]["allowedListeners"] = {"namespaces": {"from": "All"}}
    merged = merge_listener_sets(
        parent,
        [listener_set("set", parent["metadata"]["name"], port, *extra)],
        find_secret=lambda ns, name: None,
        grants=ReferenceGrants.build([]),
        namespace_labels={SYSTEM: {}},
    )
    (verdict,) = merged.sets
    bound = bind(requested_services(parent, DOMAIN), listener_set_server_ports(verdict), GOLDEN, DOMAIN)
    return listener_set_status(verdict, Deployed(), host="h", addresses=(), bound=bound)


def test_golden_a_listener_set_port_the_parent_s_service_lacks_is_not_usable() -> None:
    parent = gateway(SHORT, name="parent-gateway", namespace=SYSTEM, listeners=[listener(80, name="foo")])
    out = set_status(parent, 12345)
    assert cond(out, "Accepted") == ("True", "Accepted", "Resource accepted")
    assert cond(out, "Programmed") == (
        "False",
        "AddressNotUsable",
        f'Failed to assign to any requested addresses: port 12345 not found for hostname "{INGRESS_HOST}"',
    )
    (item,) = out["listeners"]
    assert item["name"] == "first"


def test_golden_a_listener_set_of_a_parent_with_no_usable_address_type_is_not_accepted() -> None:
    custom = {"type": "test.example.com/custom", "value": "0.0.0.0"}
    parent = gateway(custom, name="not-accepted-parent", namespace=SYSTEM, listeners=[listener(80, name="foo")])
    out = set_status(parent, 80)
    assert cond(out, "Accepted") == (
        "False",
        "UnsupportedAddress",
        "Parent not accepted: only Hostname is supported, ignoring [0.0.0.0]",
    )
    assert cond(out, "Programmed") == ("False", "UnsupportedAddress", "Failed to assign to any requested addresses")
    assert "listeners" not in out


def test_a_listener_set_listener_with_a_missing_certificate_still_counts_its_port() -> None:
    parent = gateway(SHORT, name="parent-gateway", namespace=SYSTEM, listeners=[listener(80, name="foo")])
    bad = {
        "name": "second",
        "hostname": "second.foo.com",
        "protocol": "HTTPS",
        "port": 34001,
        "tls": {"certificateRefs": [{"name": "missing"}]},
    }
    out = set_status(parent, 80, bad)
    assert cond(out, "Programmed") == (
        "True",
        "Programmed",
        f"Resource programmed, assigned to service(s) {INGRESS_HOST}:34001 and {INGRESS_HOST}:80",
    )


def test_golden_multi_gateway_lists_every_assigned_port_and_the_missing_namespace_s_hostname() -> None:
    """istiod's multi-gateway golden, less its ServiceEntry host (``example.com``, not looked up by Ambit)."""
    elsewhere = {"type": "Hostname", "value": f"istio-ingressgateway.not-default.svc.{DOMAIN}"}
    listeners = [listener(80, name="http"), {"name": "tcp", "port": 34000, "protocol": "TCP"}]
    out = wanted(gateway(SHORT, elsewhere, namespace=SYSTEM, listeners=listeners), GOLDEN)
    assert cond(out, "Programmed") == (
        "False",
        "AddressNotUsable",
        f"Assigned to service(s) {INGRESS_HOST}:34000 and {INGRESS_HOST}:80, but failed to assign to all requested "
        f'addresses: hostname "{elsewhere["value"]}" not found',
    )
    assert out["addresses"] == [{"type": "IPAddress", "value": "1.2.3.4"}]


def test_golden_tls_terminate_a_port_the_service_lacks_beside_one_it_has() -> None:
    tls = {"certificateRefs": [{"name": "my-cert"}]}
    listeners = [
        {"name": "https", "port": 443, "protocol": "HTTPS", "hostname": "domain.example", "tls": tls},
        {"name": "other", "port": 9443, "protocol": "HTTPS", "hostname": "other.example", "tls": tls},
    ]
    out = wanted(gateway(SHORT, namespace=SYSTEM, listeners=listeners), GOLDEN)
    assert cond(out, "Programmed") == (
        "False",
        "AddressNotUsable",
        f"Assigned to service(s) {INGRESS_HOST}:443, but failed to assign to all requested addresses: port 9443 not "
        f'found for hostname "{INGRESS_HOST}"',
    )


def test_external_ips_are_reported_and_a_load_balancer_s_ingress_only_on_a_load_balancer() -> None:
    with_ips = service("edge", ingress=({"ip": "198.18.254.7"},))
    with_ips["spec"]["externalIPs"] = ["203.0.113.9"]
    out = wanted(gateway({"type": "Hostname", "value": "edge"}), Cluster(with_ips))
    assert out["addresses"] == [{"type": "IPAddress", "value": "203.0.113.9"}]  # a ClusterIP: no load balancer
    with_ips["spec"]["type"] = "LoadBalancer"
    out = wanted(gateway({"type": "Hostname", "value": "edge"}), Cluster(with_ips))
    assert out["addresses"] == [
        {"type": "IPAddress", "value": "198.18.254.7"},
        {"type": "IPAddress", "value": "203.0.113.9"},
    ]
