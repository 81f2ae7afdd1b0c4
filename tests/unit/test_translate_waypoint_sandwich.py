"""A Gateway of class ``istio`` (an ingress gateway) as a waypoint: the "sandwich" of Istio's TestSimpleHTTPSandwich
(waypoint_gateways rule 1, routes rule 6), with the objects as that test writes them."""

from __future__ import annotations

from typing import Any

import pytest
import yaml

from ambit.controlplane.translate import translate_all
from ambit.controlplane.translate.waypoints import WaypointIndex
from ambit.model.workload import GatewayAddress, NamespacedHostname

Obj = dict[str, Any]

SANDWICH = yaml.safe_load(
    """
apiVersion: gateway.networking.k8s.io/v1
kind: Gateway
metadata:
  name: simple-http-waypoint
  namespace: echo
  uid: gw-uid
  labels:
    istio.io/dataplane-mode: ambient
  annotations:
    networking.istio.io/service-type: ClusterIP
spec:
  gatewayClassName: istio
  listeners:
  - name: captured-fqdn
    hostname: captured.echo.svc.cluster.local
    port: 80
    protocol: HTTP
    allowedRoutes:
      namespaces:
        from: Same
  - name: captured-short
    hostname: captured
    port: 80
    protocol: HTTP
    allowedRoutes:
      namespaces:
        from: Same
  - name: fake-hbone-port
    port: 15008
    protocol: TCP
status:
  addresses:
  - type: Hostname
    value: simple-http-waypoint-istio.echo.svc.cluster.local
"""
)
ROUTE = yaml.safe_load(
    """
apiVersion: gateway.networking.k8s.io/v1
kind: HTTPRoute
metadata:
  name: captured-httproute
  namespace: echo
spec:
  parentRefs:
  - name: simple-http-waypoint
  hostnames:
  - captured.echo.svc.cluster.local
  - captured
  rules:
  - matches:
    - path:
        type: PathPrefix
        value: /
    filters:
    - type: ResponseHeaderModifier
      responseHeaderModifier:
        add:
        - name: traversed-waypoint
          value: captured-gateway
    backendRefs:
    - name: captured
      port: 80
"""
)
SANDWICH_ADDRESS = GatewayAddress(NamespacedHostname("echo", "simple-http-waypoint-istio.echo.svc.cluster.local"))


def service(name: str = "captured", namespace: str = "echo", **labels: str) -> Obj:
    return {
        "metadata": {"name": name, "namespace": namespace, "uid": f"{name}-uid", "labels": labels},
        "spec": {"clusterIP": "198.19.0.10", "ports": [{"name": "http", "port": 80, "targetPort": 18080}]},
    }


def pod(name: str, namespace: str = "echo", ip: str = "198.18.1.10", **labels: str) -> Obj:
    return {
        "metadata": {"name": name, "namespace": namespace, "uid": f"{name}-uid", "labels": labels},
        "spec": {"serviceAccountName": "default"},
        "status": {"phase": "Running", "podIP": ip},
    }


def namespace(name: str, **labels: str) -> Obj:
    return {"metadata": {"name": name, "labels": labels}}


def with_(obj: Obj, path: tuple[str, ...], value: Any) -> Obj:
    out = yaml.safe_load(yaml.safe_dump(obj))
    node = out
    for key in path[:-1]:
        node = node.setdefault(key, {})
    node[path[-1]] = value
    return out


USE = {"istio.io/use-waypoint": "simple-http-waypoint"}


def test_a_service_labelled_with_a_ready_istio_class_gateway_is_bound_to_it() -> None:
    out = translate_all(
        [pod("captured-v1", app="captured")],
        [service(**USE)],
        [],
        [namespace("echo")],
        gateways=[SANDWICH],
        http_routes=[ROUTE],
    )
    (svc,) = out.config.services
    assert svc.waypoint == SANDWICH_ADDRESS
    assert [(s.reason, s.message) for s in out.service_status] == [
        ("WaypointAccepted", "Successfully attached to waypoint echo/simple-http-waypoint")
    ]
    # Served by its own gateway config, with the route attached to the listeners; no waypoint config is made.
    assert out.waypoint_configs == () and out.waypoint_accounts == ()
    (config,) = out.gateway_configs
    assert config.gateway == "echo/simple-http-waypoint"
    hosts = {h.hostname for listener in config.listeners for h in listener.virtual_hosts}
    assert {"captured", "captured.echo.svc.cluster.local"} <= hosts


def test_the_gateways_own_pods_never_take_it_as_their_waypoint() -> None:
    gateway_pod = pod(
        "simple-http-waypoint-istio-1",
        ip="198.18.1.20",
        **{"gateway.networking.k8s.io/gateway-name": "simple-http-waypoint", **USE},
    )
    other = pod("client", ip="198.18.1.21", **USE)
    index = WaypointIndex.build([SANDWICH], [], [namespace("echo")], network="")
    labels = gateway_pod["metadata"]["labels"]
    assert index.find_for_workload("echo", labels, pod=True).waypoint is None
    # Any other pod labelled with it is refused: this gateway takes service traffic only.
    assert index.find_for_workload("echo", other["metadata"]["labels"], pod=True).reason == "UnsupportedTrafficType"


def test_the_traffic_type_comes_from_the_gateway_else_its_own_class() -> None:
    cls = {"metadata": {"name": "istio", "labels": {"istio.io/waypoint-for": "all"}}}
    index = WaypointIndex.build([SANDWICH], [cls], [namespace("echo")], network="")
    assert index.ready["echo/simple-http-waypoint"].traffic_type == "all"
    assert index.ready["echo/simple-http-waypoint"].sandwich
    assert index.declared == frozenset()  # routes and policies keep treating it as an ingress Gateway
    labelled = with_(SANDWICH, ("metadata", "labels", "istio.io/waypoint-for"), "workload")
    index = WaypointIndex.build([labelled], [cls], [namespace("echo")], network="")
    assert index.ready["echo/simple-http-waypoint"].traffic_type == "workload"


# -- attacks: what must not capture traffic ---------------------------------------------------------------------------
@pytest.mark.parametrize(
    "addresses",
    [None, [], [{"type": "IPAddress", "value": "not-an-ip"}], [{"type": "NamedAddress", "value": "x"}]],
    ids=["no status", "no addresses", "unusable IP", "unknown type"],
)
def test_an_istio_class_gateway_without_a_usable_address_captures_nothing(addresses: Any) -> None:
    gateway = with_(SANDWICH, ("status",), {} if addresses is None else {"addresses": addresses})
    out = translate_all([], [service(**USE)], [], [namespace("echo")], gateways=[gateway])
    assert out.config.services[0].waypoint is None
    assert [(s.reason, s.message) for s in out.service_status] == [
        ("WaypointIsNotReady", 'waypoint "echo/simple-http-waypoint" is not ready')
    ]


def test_a_service_of_another_namespace_cannot_bind_to_it() -> None:
    labels = {**USE, "istio.io/use-waypoint-namespace": "echo"}
    out = translate_all(
        [], [service(namespace="other", **labels)], [], [namespace("echo"), namespace("other")], gateways=[SANDWICH]
    )
    assert out.config.services[0].waypoint is None
    assert [s.reason for s in out.service_status] == ["AttachmentDenied"]
    # Its listeners' allowedRoutes (All) do not open it: only an HBONE listener on 15008 says who may bind.
    opened = with_(
        SANDWICH,
        ("spec", "listeners"),
        [{"name": "http", "port": 80, "protocol": "HTTP", "allowedRoutes": {"namespaces": {"from": "All"}}}],
    )
    out = translate_all(
        [], [service(namespace="other", **labels)], [], [namespace("echo"), namespace("other")], gateways=[opened]
    )
    assert out.config.services[0].waypoint is None
    assert [s.reason for s in out.service_status] == ["AttachmentDenied"]


@pytest.mark.parametrize(
    "named",
    [
        "captured",  # a Service, not a Gateway
        "simple-http-waypoint-istio",  # the Gateway's own Service and Deployment
        "other-gateway",  # a Gateway of another namespace, looked up in the object's own
    ],
)
def test_a_use_waypoint_label_naming_something_else_does_nothing(named: str) -> None:
    elsewhere = with_(with_(SANDWICH, ("metadata", "namespace"), "infra"), ("metadata", "name"), "other-gateway")
    out = translate_all(
        [pod("captured-v1", app="captured", **{"istio.io/use-waypoint": named})],
        [service(**{"istio.io/use-waypoint": named})],
        [],
        [namespace("echo"), namespace("infra")],
        gateways=[elsewhere],
    )
    assert out.config.services[0].waypoint is None
    assert out.config.workloads[0].waypoint is None
    assert [s.reason for s in out.service_status] == ["WaypointIsNotReady"]


def test_a_gamma_route_on_a_sandwich_bound_service_is_accepted_but_routes_nothing_there() -> None:
    """istiod converts a route whose parentRef is a Service bound to a Gateway of an Istio-managed class (``istio``
    included: ``waypointManagedByAnotherController`` is false) into a ``mesh`` VirtualService, so its status is
    Accepted; but a class-``istio`` Gateway is built as a router, from the VirtualServices bound to that Gateway
    only, so the sandwich does not serve it. Ambit does the same: the gateway config carries its own routes, and no
    waypoint config is made for the GAMMA route."""
    gamma = {
        "metadata": {"name": "gamma", "namespace": "echo", "generation": 1},
        "spec": {
            "parentRefs": [{"group": "", "kind": "Service", "name": "captured", "port": 80}],
            "rules": [{"filters": [{"type": "RequestHeaderModifier", "requestHeaderModifier": {
                "add": [{"name": "x-gamma", "value": "1"}]}}], "backendRefs": [{"name": "captured", "port": 80}]}],
        },
    }  # fmt: skip
    out = translate_all(
        [pod("captured-v1", app="captured")],
        [service(**USE)],
        [],
        [namespace("echo")],
        gateways=[SANDWICH],
        http_routes=[ROUTE, gamma],
    )
    (status,) = [s for s in out.route_status if s.name == "gamma"]
    (parent,) = status.parents
    assert {(c.type, c.status) for c in parent.conditions} >= {("Accepted", True), ("ResolvedRefs", True)}
    assert out.waypoint_configs == ()
    (config,) = out.gateway_configs
    assert "x-gamma" not in repr(config.listeners)
