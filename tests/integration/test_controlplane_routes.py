"""Waypoint routes through the real control plane: an HTTPRoute on a Service bound to a waypoint reaches that
waypoint as a WaypointConfig over delta ADS, a change to the route is pushed, the route gets its Gateway API
status, and no other identity can read the config.

A real API server (subprocess, the CRDs installed), the real control plane, and raw gRPC delta clients, each
authenticated with a real service-account token (tests/integration/controlplane_rig.py).
"""

from __future__ import annotations

import base64
import contextlib
import secrets
import time
from typing import Any

import pytest
from tests.integration.controlplane_rig import Subscription, eventually
from tests.integration.controlplane_rig import subscribe as rig_subscribe

from ambit.controlplane.process import SKIPPED_REASON, ControlPlane
from ambit.k8s import KubeClient, kinds
from ambit.model.route_matches import PathMatch, PathMatchType
from ambit.model.routes import WaypointConfig
from ambit.tls.certs import issue_client_cert, new_ca
from ambit.xds.convert import ADDRESS_TYPE_URL
from ambit.xds.routes import WAYPOINT_CONFIG_TYPE_URL, decode_waypoint_config

Obj = dict[str, Any]


@pytest.fixture
def plane_options() -> dict[str, Any]:
    # The Gateways' addresses are written by the test, as a deployed waypoint's would be: no deployment controller.
    return {"deploy_waypoints": False}


def subscribe(
    kube: KubeClient, plane: ControlPlane, namespace: str, account: str, names: list[str]
) -> contextlib.AbstractAsyncContextManager[Subscription[WaypointConfig]]:
    """A stream as ``namespace/account`` that opens Addresses (wildcard) and WaypointConfig (``names``)."""
    waypoint_configs = Subscription(WAYPOINT_CONFIG_TYPE_URL, decode_waypoint_config)
    return rig_subscribe(kube, plane, (namespace, account), waypoint_configs, names, also=[ADDRESS_TYPE_URL])


async def mesh_namespace(kube: KubeClient) -> str:
    """A namespace bound to its waypoint "waypoint" (ready, hostname address), with Services reviews and
    reviews-v1/v2 and the service accounts waypoint and intruder."""
    ns = f"rt-{secrets.token_hex(3)}"
    await kube.create(kinds.NAMESPACES, {"metadata": {"name": ns, "labels": {"istio.io/use-waypoint": "waypoint"}}})
    gateway = {
        "apiVersion": "gateway.networking.k8s.io/v1",
        "kind": "Gateway",
        "metadata": {"name": "waypoint", "namespace": ns},
        "spec": {
            "gatewayClassName": "istio-waypoint",
            "listeners": [{"name": "mesh", "port": 15008, "protocol": "HBONE"}],
        },
    }
    await kube.create(kinds.GATEWAYS, gateway, ns)
    hostname = f"waypoint.{ns}.svc.cluster.local"
    await kube.patch_status(
        kinds.GATEWAYS, "waypoint", {"status": {"addresses": [{"type": "Hostname", "value": hostname}]}}, ns
    )
    for name in ("reviews", "reviews-v1", "reviews-v2"):
        service = {"metadata": {"name": name, "namespace": ns}, "spec": {"ports": [{"name": "http", "port": 9080}]}}
        await kube.create(kinds.SERVICES, service, ns)
    for account in ("waypoint", "intruder"):
        await kube.create(kinds.SERVICE_ACCOUNTS, {"metadata": {"name": account, "namespace": ns}}, ns)
    return ns


def route(ns: str, prefix: str, backend: str) -> Obj:
    return {
        "apiVersion": "gateway.networking.k8s.io/v1",
        "kind": "HTTPRoute",
        "metadata": {"name": "reviews", "namespace": ns},
        "spec": {
            "parentRefs": [{"group": "", "kind": "Service", "name": "reviews", "port": 9080}],
            "rules": [
                {
                    "matches": [{"path": {"type": "PathPrefix", "value": prefix}}],
                    "backendRefs": [{"name": backend, "port": 9080}],
                }
            ],
        },
    }


def first_path(config: WaypointConfig | None, ns: str) -> PathMatch | None:
    if config is None:
        return None
    table = config.find_table(f"{ns}/reviews.{ns}.svc.cluster.local", 9080)
    if table is None or not table.http:
        return None
    return table.http[0].match.path


async def test_the_waypoint_receives_its_routes_and_their_changes_and_no_one_else_does(
    kube: KubeClient, plane: ControlPlane
) -> None:
    ns = await mesh_namespace(kube)
    name = f"{ns}/waypoint"
    await kube.create(kinds.HTTP_ROUTES, route(ns, "/v1", "reviews-v1"), ns)
    async with (
        subscribe(kube, plane, ns, "waypoint", [name]) as waypoint,
        subscribe(kube, plane, ns, "intruder", [name]) as intruder,
        subscribe(kube, plane, "istio-system", "ztunnel", ["*"]) as node_proxy,
    ):
        await eventually(lambda: first_path(waypoint.config(name), ns) == PathMatch(PathMatchType.PATH_PREFIX, "/v1"))
        config = waypoint.config(name)
        assert config is not None and config.waypoint == name
        table = config.find_table(f"{ns}/reviews.{ns}.svc.cluster.local", 9080)
        assert table is not None
        backend = table.http[0].backends[0].backend
        assert backend is not None and backend.hostname == f"reviews-v1.{ns}.svc.cluster.local"

        # A forged subscription (another identity naming the waypoint) and a wildcard one get nothing.
        assert intruder.held == {} and intruder.sent == [] and intruder.responses >= 1
        assert node_proxy.held == {} and node_proxy.sent == []

        # A change to the route is pushed to the waypoint, and still to no one else.
        pushes = waypoint.responses
        await kube.patch(
            kinds.HTTP_ROUTES,
            "reviews",
            {
                "spec": {
                    "rules": [
                        {
                            "matches": [{"path": {"type": "Exact", "value": "/v2"}}],
                            "backendRefs": [{"name": "reviews-v2", "port": 9080}],
                        }
                    ]
                }
            },
            ns,
        )
        await eventually(lambda: first_path(waypoint.config(name), ns) == PathMatch(PathMatchType.EXACT, "/v2"))
        assert waypoint.responses > pushes
        assert intruder.sent == [] and node_proxy.sent == []

        # The route's status: one parent of ours, accepted, references resolved.
        async def status() -> Obj | None:
            obj = await kube.get(kinds.HTTP_ROUTES, "reviews", ns)
            parents = (obj.get("status") or {}).get("parents") or []
            return (
                obj
                if parents
                and obj["metadata"].get("generation") == parents[0]["conditions"][0].get("observedGeneration")
                else None
            )

        obj = await eventually(status)
        (parent,) = obj["status"]["parents"]
        assert parent["controllerName"] == "istio.io/gateway-controller"
        assert parent["parentRef"] == {"group": "", "kind": "Service", "name": "reviews", "port": 9080}
        conditions = {c["type"]: (c["status"], c["reason"]) for c in parent["conditions"]}
        assert conditions["Accepted"] == ("True", "Accepted")
        assert conditions["ResolvedRefs"] == ("True", "ResolvedRefs")

        # A backend that does not exist: ResolvedRefs False BackendNotFound, and the waypoint learns the rule
        # answers 500 (an unresolved backend).
        await kube.patch(
            kinds.HTTP_ROUTES,
            "reviews",
            {"spec": {"rules": [{"backendRefs": [{"name": "nowhere", "port": 9080}]}]}},
            ns,
        )

        def unresolved() -> bool:
            config = waypoint.config(name)
            table = config.find_table(f"{ns}/reviews.{ns}.svc.cluster.local", 9080) if config else None
            return table is not None and len(table.http) == 1 and table.http[0].backends[0].backend is None

        await eventually(unresolved)

        async def not_found() -> bool:
            obj = await kube.get(kinds.HTTP_ROUTES, "reviews", ns)
            conditions = {c["type"]: c for c in obj["status"]["parents"][0]["conditions"]}
            return conditions["ResolvedRefs"]["reason"] == "BackendNotFound"

        await eventually(not_found)
        assert intruder.sent == [] and node_proxy.sent == []


async def test_route_status_is_not_rewritten_when_nothing_changed(kube: KubeClient, plane: ControlPlane) -> None:
    ns = await mesh_namespace(kube)
    await kube.create(kinds.HTTP_ROUTES, route(ns, "/", "reviews"), ns)
    writer = plane.route_status[0]

    async def written() -> Obj | None:
        obj = await kube.get(kinds.HTTP_ROUTES, "reviews", ns)
        return obj if (obj.get("status") or {}).get("parents") else None

    obj = await eventually(written)
    version, writes, pushes = obj["metadata"]["resourceVersion"], writer.writes, plane.pushes
    # Another translation (a new Service) must not write the route again.
    await kube.create(
        kinds.SERVICES, {"metadata": {"name": "other", "namespace": ns}, "spec": {"ports": [{"port": 80}]}}, ns
    )
    await eventually(lambda: plane.pushes > pushes)
    assert await writer.write_once()  # plans every route against the newest translation: nothing to write
    assert (await kube.get(kinds.HTTP_ROUTES, "reviews", ns))["metadata"]["resourceVersion"] == version
    assert writer.writes == writes


async def test_grpc_and_tcp_routes_reach_the_waypoint_and_get_status(kube: KubeClient, plane: ControlPlane) -> None:
    ns = await mesh_namespace(kube)
    name = f"{ns}/waypoint"
    grpc_route = {
        "apiVersion": "gateway.networking.k8s.io/v1",
        "kind": "GRPCRoute",
        "metadata": {"name": "echo", "namespace": ns},
        "spec": {
            "parentRefs": [{"group": "", "kind": "Service", "name": "reviews"}],
            "rules": [
                {
                    "matches": [{"method": {"service": "proto.Echo", "method": "Call"}}],
                    "backendRefs": [{"name": "reviews-v2", "port": 9080}],
                }
            ],
        },
    }
    tcp_route = {
        "apiVersion": "gateway.networking.k8s.io/v1alpha2",
        "kind": "TCPRoute",
        "metadata": {"name": "split", "namespace": ns},
        "spec": {
            "parentRefs": [{"group": "", "kind": "Service", "name": "reviews-v1"}],
            "rules": [
                {
                    "backendRefs": [
                        {"name": "reviews-v1", "port": 9080, "weight": 90},
                        {"name": "reviews-v2", "port": 9080, "weight": 10},
                    ]
                }
            ],
        },
    }
    await kube.create(kinds.GRPC_ROUTES, grpc_route, ns)
    await kube.create(kinds.TCP_ROUTES, tcp_route, ns)
    async with subscribe(kube, plane, ns, "waypoint", [name]) as waypoint:

        def arrived() -> bool:
            config = waypoint.config(name)
            if config is None:
                return False
            grpc_table = config.find_table(f"{ns}/reviews.{ns}.svc.cluster.local", 9080)
            tcp_table = config.find_table(f"{ns}/reviews-v1.{ns}.svc.cluster.local", 9080)
            return (
                grpc_table is not None
                and [r.match.path for r in grpc_table.http] == [PathMatch(PathMatchType.EXACT, "/proto.Echo/Call")]
                and tcp_table is not None
                and [b.weight for b in tcp_table.tcp_backends] == [90, 10]
            )

        await eventually(arrived)

    async def accepted(kind: kinds.ResourceKind, route_name: str) -> bool:
        obj = await kube.get(kind, route_name, ns)
        parents = (obj.get("status") or {}).get("parents") or []
        return bool(parents) and parents[0]["conditions"][0]["reason"] == "Accepted"

    await eventually(lambda: accepted(kinds.GRPC_ROUTES, "echo"))
    await eventually(lambda: accepted(kinds.TCP_ROUTES, "split"))


async def test_a_tls_route_wins_over_a_tcp_route_at_the_waypoint_and_gets_status(
    kube: KubeClient, plane: ControlPlane
) -> None:
    ns = await mesh_namespace(kube)
    name = f"{ns}/waypoint"
    parent = [{"group": "", "kind": "Service", "name": "reviews"}]
    tcp_route = {
        "apiVersion": "gateway.networking.k8s.io/v1alpha2",
        "kind": "TCPRoute",
        "metadata": {"name": "older", "namespace": ns},
        "spec": {"parentRefs": parent, "rules": [{"backendRefs": [{"name": "reviews-v2", "port": 9080}]}]},
    }
    backends = [
        {"name": "reviews", "port": 9080, "weight": 3},
        {"name": "reviews-v1", "port": 9080, "weight": 1},
        {"name": "reviews-v2", "port": 9080, "weight": 1},
    ]
    tls_route = {
        "apiVersion": "gateway.networking.k8s.io/v1alpha2",
        "kind": "TLSRoute",
        "metadata": {"name": "split", "namespace": ns},
        "spec": {"parentRefs": parent, "rules": [{"backendRefs": backends}]},
    }
    await kube.create(kinds.TCP_ROUTES, tcp_route, ns)
    await kube.create(kinds.TLS_ROUTES, tls_route, ns)
    async with subscribe(kube, plane, ns, "waypoint", [name]) as waypoint:

        def arrived() -> bool:
            config = waypoint.config(name)
            table = config.find_table(f"{ns}/reviews.{ns}.svc.cluster.local", 9080) if config else None
            return table is not None and [b.weight for b in table.tcp_backends] == [3, 1, 1]

        await eventually(arrived)

    async def accepted(kind: kinds.ResourceKind, route_name: str) -> bool:
        obj = await kube.get(kind, route_name, ns)
        parents = (obj.get("status") or {}).get("parents") or []
        return bool(parents) and parents[0]["conditions"][0]["reason"] == "Accepted"

    await eventually(lambda: accepted(kinds.TLS_ROUTES, "split"))
    await eventually(lambda: accepted(kinds.TCP_ROUTES, "older"))


async def test_request_authentications_attached_by_target_refs_reach_the_waypoint(
    kube: KubeClient, plane: ControlPlane
) -> None:
    ns = await mesh_namespace(kube)
    name = f"{ns}/waypoint"
    jwks = '{"keys": [{"kty": "EC", "crv": "P-256", "kid": "k1", "x": "%s", "y": "%s"}]}'
    # A public P-256 point (the generator): the key is only carried here, never used to verify.
    jwks %= ("axfR8uEsQkf4vOblY6RA8ncDfYEt6zOg9KE5RdiYwpY", "T-NC4v4af5uO5-tKfA-eFivOM1drMV7Oy7ZAaDe_UfU")

    def authn(name: str, refs: list[Obj] | None, selector: bool = False) -> Obj:
        spec: Obj = {"jwtRules": [{"issuer": "https://issuer.example", "jwks": jwks}]}
        if refs is not None:
            spec["targetRefs"] = refs
        if selector:
            spec["selector"] = {"matchLabels": {"app": "reviews"}}
        return {
            "apiVersion": "security.istio.io/v1",
            "kind": "RequestAuthentication",
            "metadata": {"name": name},
            "spec": spec,
        }

    gateway_ref = {"group": "gateway.networking.k8s.io", "kind": "Gateway", "name": "waypoint"}
    await kube.create(kinds.REQUEST_AUTHENTICATIONS, authn("on-waypoint", [gateway_ref]), ns)
    await kube.create(
        kinds.REQUEST_AUTHENTICATIONS, authn("on-service", [{"group": "", "kind": "Service", "name": "reviews"}]), ns
    )
    await kube.create(kinds.REQUEST_AUTHENTICATIONS, authn("on-pods", None, selector=True), ns)
    async with subscribe(kube, plane, ns, "waypoint", [name]) as waypoint:

        def keys() -> list[tuple[str, tuple[str, ...]]]:
            config = waypoint.config(name)
            return [] if config is None else [(p.name, p.services) for p in config.request_authentications]

        await eventually(
            lambda: keys() == [("on-service", (f"{ns}/reviews.{ns}.svc.cluster.local",)), ("on-waypoint", ())]
        )
        config = waypoint.config(name)
        assert config is not None
        assert config.request_authentications[0].rules[0].issuer == "https://issuer.example"

        # Removing one is pushed; the selector one never arrives.
        await kube.delete(kinds.REQUEST_AUTHENTICATIONS, "on-service", ns)
        await eventually(lambda: keys() == [("on-waypoint", ())])


async def test_a_virtual_service_reaches_the_waypoint_in_written_order_and_its_changes_too(
    kube: KubeClient, plane: ControlPlane
) -> None:
    """Istio's TestTrafficSplit VirtualService (the header match to subset v2, then the rest to v1), applied to the
    API server, arrives at the waypoint as two entries in written order; a change to it is pushed."""
    ns = await mesh_namespace(kube)
    name = f"{ns}/waypoint"
    service = f"{ns}/reviews.{ns}.svc.cluster.local"
    virtual_service = {
        "apiVersion": "networking.istio.io/v1",
        "kind": "VirtualService",
        "metadata": {"name": "route", "namespace": ns},
        "spec": {
            "hosts": ["reviews"],
            "http": [
                {
                    "match": [{"headers": {"user": {"exact": "istio-custom-user"}}}],
                    "route": [{"destination": {"host": "reviews", "subset": "v2"}}],
                },
                {"route": [{"destination": {"host": "reviews", "subset": "v1"}}]},
            ],
        },
    }
    await kube.create(kinds.VIRTUAL_SERVICES, virtual_service, ns)
    async with subscribe(kube, plane, ns, "waypoint", [name]) as waypoint:

        def subsets() -> list[str]:
            config = waypoint.config(name)
            table = config.find_table(service, 9080) if config else None
            if table is None:
                return []
            return [b.backend.subset for r in table.http for b in r.backends if b.backend is not None]

        await eventually(lambda: subsets() == ["v2", "v1"])
        config = waypoint.config(name)
        assert config is not None
        table = config.find_table(service, 9080)
        assert table is not None and table.http[0].route == f"VirtualService/{ns}/route"
        assert table.http[0].match.headers[0].name == "user" and table.http[1].missing_backend_status == 503

        await kube.patch(
            kinds.VIRTUAL_SERVICES,
            "route",
            {"spec": {"http": [{"route": [{"destination": {"host": "reviews", "subset": "v2"}}]}]}},
            ns,
        )
        await eventually(lambda: subsets() == ["v2"])

        # A rule the waypoint cannot honour (a claim match naming no claim) is left out, with a Warning Event naming it.
        claims = {"headers": {"@request.auth.claims[]": {"exact": "admins"}}}
        rules = [{"match": [claims], "route": [{"destination": {"host": "reviews", "subset": "v1"}}]}]
        await kube.patch(kinds.VIRTUAL_SERVICES, "route", {"spec": {"http": rules}}, ns)
        await eventually(lambda: subsets() == [])

        async def warned() -> list[Obj]:
            events = (await kube.list(kinds.EVENTS, ns))[0]
            return [e for e in events if e.get("reason") == SKIPPED_REASON and e["regarding"].get("name") == "route"]

        (event,) = await eventually(warned)
        assert event["type"] == "Warning" and "spec.http[0].match[0].headers" in event["note"], event


async def test_a_destination_rule_reaches_the_waypoint_with_its_subsets_resolved_and_follows_the_pods(
    kube: KubeClient, plane: ControlPlane
) -> None:
    ns = await mesh_namespace(kube)
    name = f"{ns}/waypoint"
    selected = {
        "metadata": {"name": "ratings", "namespace": ns},
        "spec": {"selector": {"app": "ratings"}, "ports": [{"name": "http", "port": 9080}]},
    }
    selected["metadata"]["labels"] = {"istio.io/use-waypoint": "waypoint"}
    await kube.create(kinds.SERVICES, selected, ns)
    for pod_name, version, ip in (("ratings-a", "v1", "198.18.211.1"), ("ratings-b", "v2", "198.18.211.2")):
        pod = {
            "metadata": {"name": pod_name, "namespace": ns, "labels": {"app": "ratings", "version": version}},
            "spec": {"containers": [{"name": "app", "image": "app"}]},
        }
        await kube.create(kinds.PODS, pod, ns)
        status = {"phase": "Running", "podIP": ip, "conditions": [{"type": "Ready", "status": "True"}]}
        await kube.patch_status(kinds.PODS, pod_name, {"status": status}, ns)
    rule = {
        "apiVersion": "networking.istio.io/v1",
        "kind": "DestinationRule",
        "metadata": {"name": "ratings"},
        "spec": {
            "host": "ratings",
            "trafficPolicy": {"tls": {"mode": "SIMPLE", "insecureSkipVerify": True}},
            "subsets": [{"name": "v1", "labels": {"version": "v1"}}, {"name": "v2", "labels": {"version": "v2"}}],
        },
    }
    await kube.create(kinds.DESTINATION_RULES, rule, ns)
    key = f"{ns}/ratings.{ns}.svc.cluster.local"
    async with subscribe(kube, plane, ns, "waypoint", [name]) as waypoint:

        def subsets() -> dict[str, set[str]]:
            config = waypoint.config(name)
            policy = config.find_destination_policy(key) if config is not None else None
            if policy is None:
                return {}
            return {s.name: {uid.rsplit("/", 1)[-1] for uid in s.workloads} for s in policy.subsets}

        await eventually(lambda: subsets() == {"v1": {"ratings-a"}, "v2": {"ratings-b"}})
        config = waypoint.config(name)
        assert config is not None
        policy = config.find_destination_policy(key)
        assert policy is not None and policy.rule == f"{ns}/ratings"
        assert policy.traffic_policy is not None and policy.traffic_policy.tls is not None

        # Relabelling a pod moves it to the other subset; the change is pushed.
        await kube.patch(kinds.PODS, "ratings-b", {"metadata": {"labels": {"version": "v1"}}}, ns)
        await eventually(lambda: subsets() == {"v1": {"ratings-a", "ratings-b"}, "v2": set()})
        # Deleting the rule removes it.
        await kube.delete(kinds.DESTINATION_RULES, "ratings", ns)
        await eventually(lambda: subsets() == {})


async def test_subsets_of_a_service_entry_select_its_inline_endpoints_and_follow_their_labels(
    kube: KubeClient, plane: ControlPlane
) -> None:
    ns = await mesh_namespace(kube)
    name = f"{ns}/waypoint"
    entry = {
        "apiVersion": "networking.istio.io/v1",
        "kind": "ServiceEntry",
        "metadata": {"name": "api", "namespace": ns},
        "spec": {
            "hosts": ["api.example.com"],
            "addresses": ["240.240.0.7"],
            "ports": [{"number": 80, "name": "http", "protocol": "HTTP"}],
            "resolution": "STATIC",
            "endpoints": [
                {"address": "198.18.212.1", "labels": {"version": "v1"}},
                {"address": "198.18.212.2", "labels": {"version": "v2"}},
            ],
        },
    }
    await kube.create(kinds.SERVICE_ENTRIES, entry, ns)
    subsets = [{"name": "v1", "labels": {"version": "v1"}}, {"name": "v2", "labels": {"version": "v2"}}]
    rule = {
        "apiVersion": "networking.istio.io/v1",
        "kind": "DestinationRule",
        "metadata": {"name": "api"},
        "spec": {"host": "api.example.com", "subsets": subsets},
    }
    await kube.create(kinds.DESTINATION_RULES, rule, ns)
    async with subscribe(kube, plane, ns, "waypoint", [name]) as waypoint:

        def selected() -> dict[str, set[str]]:
            config = waypoint.config(name)
            policy = config.find_destination_policy(f"{ns}/api.example.com") if config is not None else None
            return {s.name: {uid.rsplit("/", 1)[-1] for uid in s.workloads} for s in policy.subsets} if policy else {}

        await eventually(lambda: selected() == {"v1": {"198.18.212.1"}, "v2": {"198.18.212.2"}})
        endpoints = entry["spec"]["endpoints"]
        endpoints[1]["labels"] = {"version": "v1"}
        await kube.patch(kinds.SERVICE_ENTRIES, "api", {"spec": {"endpoints": endpoints}}, ns)
        await eventually(lambda: selected() == {"v1": {"198.18.212.1", "198.18.212.2"}, "v2": set()})


async def test_a_mutual_rules_secret_reaches_the_waypoint_of_its_namespace(
    kube: KubeClient, plane: ControlPlane
) -> None:
    ns = await mesh_namespace(kube)
    name = f"{ns}/waypoint"
    pair = issue_client_cert(new_ca("client-ca", now=time.time()), common_name="waypoint-client", now=time.time())
    data = {"tls.crt": pair.cert_pem, "tls.key": pair.key_pem}
    encoded = {k: base64.b64encode(v).decode() for k, v in data.items()}
    secret = {"metadata": {"name": "client"}, "type": "kubernetes.io/tls", "data": encoded}  # the kind it watches
    await kube.create(kinds.SECRETS, secret, ns)
    rule = {
        "apiVersion": "networking.istio.io/v1",
        "kind": "DestinationRule",
        "metadata": {"name": "reviews"},
        "spec": {"host": "reviews", "trafficPolicy": {"tls": {"mode": "MUTUAL", "credentialName": "client"}}},
    }
    await kube.create(kinds.DESTINATION_RULES, rule, ns)
    async with subscribe(kube, plane, ns, "waypoint", [name]) as waypoint:

        def tls() -> Any:
            config = waypoint.config(name)
            policy = config.find_destination_policy(f"{ns}/reviews.{ns}.svc.cluster.local") if config else None
            found = policy.traffic_policy.tls if policy and policy.traffic_policy else None
            return found if found is not None and found.private_key else None

        got = await eventually(tls)
        assert got.client_certificate == pair.cert_pem.decode() and got.private_key == pair.key_pem.decode()
