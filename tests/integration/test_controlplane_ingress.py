"""Ingress gateway configuration through the real control plane: a Gateway of class ``istio`` with an HTTPS listener
and an attached HTTPRoute reaches the gateway's service account over delta ADS, certificates included; a rotated
Secret is pushed; another workload's identity naming the same resource, and a wildcard subscriber, get nothing
(the keys travel only to the gateway); the route's parent status says Accepted.

A real API server (subprocess, the CRDs installed) and the real control plane (no webhook, no deployment
controller), and raw gRPC delta clients authenticated with real service-account tokens
(tests/integration/controlplane_rig.py).
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
from tests.unit.jwt_keys import rsa_signer

from ambit.controlplane.process import ControlPlane
from ambit.k8s import KubeClient, kinds
from ambit.model.ingress import GatewayConfig, ListenerProtocol, TlsMode
from ambit.tls.certs import KeyPair, issue_server_cert, new_ca
from ambit.xds.gateway import GATEWAY_CONFIG_TYPE_URL, decode_gateway_config

Obj = dict[str, Any]
CA = new_ca("ingress xds test CA", now=time.time())


@pytest.fixture
def plane_options() -> dict[str, Any]:
    return {"deploy_waypoints": False}


def subscribe(
    kube: KubeClient, plane: ControlPlane, namespace: str, account: str, names: list[str]
) -> contextlib.AbstractAsyncContextManager[Subscription[GatewayConfig]]:
    """A delta ADS stream as ``namespace/account`` subscribed to GatewayConfig ``names``."""
    gateway_configs = Subscription(GATEWAY_CONFIG_TYPE_URL, decode_gateway_config)
    return rig_subscribe(kube, plane, (namespace, account), gateway_configs, names)


def tls_secret(name: str, pair: KeyPair) -> Obj:
    return {
        "metadata": {"name": name},
        "type": "kubernetes.io/tls",
        "data": {
            "tls.crt": base64.b64encode(pair.cert_pem).decode(),
            "tls.key": base64.b64encode(pair.key_pem).decode(),
        },
    }


async def test_the_gateway_gets_its_listeners_routes_and_keys_and_no_one_else_does(
    kube: KubeClient, plane: ControlPlane
) -> None:
    ns = f"in-{secrets.token_hex(3)}"
    await kube.create(kinds.NAMESPACES, {"metadata": {"name": ns}})
    await kube.create(
        kinds.SERVICES, {"metadata": {"name": "echo"}, "spec": {"ports": [{"port": 80, "targetPort": 8080}]}}, ns
    )
    first = issue_server_cert(CA, common_name="a.example", dns_names=["a.example"], ip_addresses=[], now=time.time())
    await kube.create(kinds.SECRETS, tls_secret("edge-cert", first), ns)
    gateway = {
        "metadata": {"name": "edge"},
        "spec": {
            "gatewayClassName": "istio",
            "listeners": [
                {"name": "http", "port": 8080, "protocol": "HTTP"},
                {
                    "name": "https",
                    "port": 8443,
                    "protocol": "HTTPS",
                    "hostname": "a.example",
                    "tls": {"certificateRefs": [{"name": "edge-cert"}]},
                },
            ],
        },
    }
    await kube.create(kinds.GATEWAYS, gateway, ns)
    route = {
        "metadata": {"name": "echo"},
        "spec": {
            "parentRefs": [{"name": "edge"}],
            "hostnames": ["a.example"],
            "rules": [{"backendRefs": [{"name": "echo", "port": 80}]}],
        },
    }
    await kube.create(kinds.HTTP_ROUTES, route, ns)
    name = f"{ns}/edge"
    async with (
        subscribe(kube, plane, ns, "edge-istio", [name]) as owner,
        subscribe(kube, plane, ns, "intruder", [name]) as intruder,
        subscribe(kube, plane, "istio-system", "ztunnel", ["*"]) as wildcard,
    ):

        def served() -> GatewayConfig | None:
            config = owner.config(name)
            ready = config is not None and len(config.listeners) == 2 and config.listeners[1].virtual_hosts
            return config if ready else None

        config = await eventually(served)
        http, https = config.listeners
        assert (http.name, http.port, http.protocol) == ("http", 8080, ListenerProtocol.HTTP)
        assert (https.name, https.port, https.protocol, https.hostname) == (
            "https",
            8443,
            ListenerProtocol.HTTPS,
            "a.example",
        )
        assert https.certificates[0].cert_pem == first.cert_pem
        (vhost,) = https.virtual_hosts
        backend = vhost.http[0].backends[0].backend
        assert vhost.hostname == "a.example" and backend is not None
        assert (backend.hostname, backend.port) == (f"echo.{ns}.svc.cluster.local", 80)

        # The keys never reach another identity, whatever name it subscribes to.
        assert intruder.held == {} and intruder.sent == []
        assert wildcard.held == {} and wildcard.sent == []

        # A rotated Secret is pushed to the gateway.
        rotated = issue_server_cert(
            CA, common_name="a.example", dns_names=["a.example"], ip_addresses=[], now=time.time()
        )
        patch = {"data": tls_secret("edge-cert", rotated)["data"]}
        await kube.patch(kinds.SECRETS, "edge-cert", patch, ns)

        def rotated_served() -> bool:
            config = owner.config(name)
            return config is not None and any(
                c.cert_pem == rotated.cert_pem for item in config.listeners for c in item.certificates
            )

        await eventually(rotated_served)
        assert intruder.sent == [] and wildcard.sent == []

    async def accepted() -> bool:
        obj = await kube.get(kinds.HTTP_ROUTES, "echo", ns)
        parents = (obj.get("status") or {}).get("parents") or []
        return any(
            p.get("parentRef", {}).get("name") == "edge"
            and any(c.get("type") == "Accepted" and c.get("status") == "True" for c in p.get("conditions") or ())
            for p in parents
        )

    await eventually(accepted)


async def test_policies_selecting_or_targeting_the_gateway_reach_its_config(
    kube: KubeClient, plane: ControlPlane
) -> None:
    ns = f"in-{secrets.token_hex(3)}"
    await kube.create(kinds.NAMESPACES, {"metadata": {"name": ns}})
    gateway = {
        "metadata": {"name": "edge"},
        "spec": {"gatewayClassName": "istio", "listeners": [{"name": "http", "port": 8080, "protocol": "HTTP"}]},
    }
    await kube.create(kinds.GATEWAYS, gateway, ns)
    jwks = rsa_signer().jwks()
    authn = {
        "metadata": {"name": "jwt"},
        "spec": {
            "targetRefs": [{"group": "gateway.networking.k8s.io", "kind": "Gateway", "name": "edge"}],
            "jwtRules": [{"issuer": "https://issuer.example", "jwks": jwks}],
        },
    }
    authz = {
        "metadata": {"name": "need-jwt"},
        "spec": {
            "selector": {"matchLabels": {"gateway.networking.k8s.io/gateway-name": "edge"}},
            "rules": [{"from": [{"source": {"requestPrincipals": ["https://issuer.example/*"]}}]}],
        },
    }
    await kube.create(kinds.REQUEST_AUTHENTICATIONS, authn, ns)
    await kube.create(kinds.AUTHORIZATION_POLICIES, authz, ns)
    name = f"{ns}/edge"
    async with subscribe(kube, plane, ns, "edge-istio", [name]) as owner:

        def served() -> GatewayConfig | None:
            config = owner.config(name)
            return config if config is not None and config.policies and config.request_authentications else None

        config = await eventually(served)
        assert [p.key for p in config.policies] == [f"{ns}/need-jwt"]
        assert [p.key for p in config.request_authentications] == [f"{ns}/jwt"]

        await kube.delete(kinds.AUTHORIZATION_POLICIES, "need-jwt", ns)
        await eventually(lambda: (c := owner.config(name)) is not None and not c.policies)


async def test_tls_passthrough_and_tcp_listeners_get_their_tlsroutes_and_tcproutes(
    kube: KubeClient, plane: ControlPlane
) -> None:
    ns = f"in-{secrets.token_hex(3)}"
    await kube.create(kinds.NAMESPACES, {"metadata": {"name": ns}})
    for service in ("secure", "db"):
        spec = {"ports": [{"port": 443 if service == "secure" else 5432}]}
        await kube.create(kinds.SERVICES, {"metadata": {"name": service}, "spec": spec}, ns)
    gateway = {
        "metadata": {"name": "edge"},
        "spec": {
            "gatewayClassName": "istio",
            "listeners": [
                {"name": "tls", "port": 9443, "protocol": "TLS", "tls": {"mode": "Passthrough"}},
                {"name": "tcp", "port": 5432, "protocol": "TCP"},
            ],
        },
    }
    await kube.create(kinds.GATEWAYS, gateway, ns)
    tls_route = {
        "metadata": {"name": "secure"},
        "spec": {
            "parentRefs": [{"name": "edge", "sectionName": "tls"}],
            "hostnames": ["secure.example"],
            "rules": [{"backendRefs": [{"name": "secure", "port": 443}]}],
        },
    }
    tcp_route = {
        "metadata": {"name": "db"},
        "spec": {"parentRefs": [{"name": "edge"}], "rules": [{"backendRefs": [{"name": "db", "port": 5432}]}]},
    }
    misplaced = {
        "metadata": {"name": "misplaced"},
        "spec": {**tcp_route["spec"], "parentRefs": [{"name": "edge", "sectionName": "tls"}]},
    }
    await kube.create(kinds.TLS_ROUTES, tls_route, ns)
    await kube.create(kinds.TCP_ROUTES, tcp_route, ns)
    await kube.create(kinds.TCP_ROUTES, misplaced, ns)
    name = f"{ns}/edge"
    async with subscribe(kube, plane, ns, "edge-istio", [name]) as owner:

        def served() -> GatewayConfig | None:
            config = owner.config(name)
            ready = config is not None and len(config.listeners) == 2 and all(i.virtual_hosts for i in config.listeners)
            return config if ready else None

        config = await eventually(served)
        tls, tcp = config.listeners
        assert (tls.protocol, tls.certificates, [v.hostname for v in tls.virtual_hosts]) == (
            ListenerProtocol.TLS,
            (),
            ["secure.example"],
        )
        backend = tls.virtual_hosts[0].tcp_backends[0].backend
        assert backend is not None and (backend.hostname, backend.port) == (f"secure.{ns}.svc.cluster.local", 443)
        (vhost,) = tcp.virtual_hosts
        backend = vhost.tcp_backends[0].backend
        assert backend is not None and (backend.hostname, backend.port) == (f"db.{ns}.svc.cluster.local", 5432)

    async def accepted(kind: Any, route: str) -> tuple[str, str] | None:
        obj = await kube.get(kind, route, ns)
        for parent in (obj.get("status") or {}).get("parents") or []:
            for c in parent.get("conditions") or ():
                if c.get("type") == "Accepted":
                    return c.get("status"), c.get("reason")
        return None

    async def judged() -> bool:
        return (
            await accepted(kinds.TLS_ROUTES, "secure") == ("True", "Accepted")
            and await accepted(kinds.TCP_ROUTES, "db") == ("True", "Accepted")
            and await accepted(kinds.TCP_ROUTES, "misplaced") == ("False", "NotAllowedByListeners")
        )

    await eventually(judged)


async def test_istio_gateway_servers_and_virtual_services_reach_the_selected_pods_account_only(
    kube: KubeClient, plane: ControlPlane
) -> None:
    """Istio's Gateway (networking.istio.io) selecting pods by label: the config named ``<ns>/<app label>`` reaches
    the pods' service account, with the HTTP server routed by the bound VirtualService and the HTTPS server's
    credential from the pods' namespace; another account naming it gets nothing."""
    from tests.upstream_objects import ingress_gateway, ingress_route

    ns = f"ig-{secrets.token_hex(3)}"
    await kube.create(kinds.NAMESPACES, {"metadata": {"name": ns}})
    await kube.create(kinds.SERVICES, {"metadata": {"name": "echo"}, "spec": {"ports": [{"port": 80}]}}, ns)
    pair = issue_server_cert(CA, common_name="a.example", dns_names=["a.example"], ip_addresses=[], now=time.time())
    await kube.create(kinds.SECRETS, tls_secret("edge-cert", pair), ns)
    labels = {"app": "istio-ingressgateway", "istio": "ingressgateway"}
    pod = {
        "metadata": {"name": "istio-ingressgateway-0", "labels": labels},
        "spec": {"serviceAccountName": "gw-sa", "containers": [{"name": "istio-proxy", "image": "ambit"}]},
    }
    await kube.create(kinds.PODS, pod, ns)
    gateway = ingress_gateway()
    gateway["spec"]["servers"].append(
        {
            "port": {"number": 443, "name": "https", "protocol": "HTTPS"},
            "hosts": ["a.example"],
            "tls": {"mode": "SIMPLE", "credentialName": "edge-cert"},
        }
    )
    await kube.create(kinds.ISTIO_GATEWAYS, gateway, ns)
    await kube.create(kinds.VIRTUAL_SERVICES, ingress_route("echo"), ns)
    name = f"{ns}/istio-ingressgateway"
    async with (
        subscribe(kube, plane, ns, "gw-sa", [name]) as owner,
        subscribe(kube, plane, ns, "intruder", [name]) as intruder,
    ):

        def served() -> GatewayConfig | None:
            config = owner.config(name)
            return config if config is not None and len(config.listeners) == 2 else None

        config = await eventually(served)
        http, https = config.listeners
        assert (http.port, http.protocol) == (80, ListenerProtocol.HTTP)
        backend = http.virtual_hosts[0].http[0].backends[0].backend
        assert backend is not None and backend.hostname == f"echo.{ns}.svc.cluster.local"
        assert (https.port, https.hostname, https.certificates[0].cert_pem) == (443, "a.example", pair.cert_pem)
        assert https.virtual_hosts[0].hostname == "a.example"
        assert intruder.held == {} and intruder.sent == []


async def test_a_mutual_server_reads_generic_secrets_as_istiod_does_and_never_the_ca_root(
    kube: KubeClient, plane: ControlPlane
) -> None:
    """``tls.mode: MUTUAL`` with the credential in a generic Secret (``cert``/``key``) and its CA in a generic
    ``<name>-cacert`` Secret, as Istio's documentation creates them: the control plane sees both and the listener
    carries the CA. A server naming the mesh CA's root Secret (type ``istio.io/ca-root``) gets nothing: that Secret
    is not even watched."""
    from tests.ingress_pki import opaque_secret
    from tests.upstream_objects import ingress_gateway

    ns = f"im-{secrets.token_hex(3)}"
    await kube.create(kinds.NAMESPACES, {"metadata": {"name": ns}})
    pair = issue_server_cert(CA, common_name="m.example", dns_names=["m.example"], ip_addresses=[], now=time.time())
    client_ca = new_ca("mutual client CA", now=time.time())
    await kube.create(kinds.SECRETS, opaque_secret("partner", ns, cert=pair.cert_pem, key=pair.key_pem), ns)
    await kube.create(kinds.SECRETS, opaque_secret("partner-cacert", ns, ca_crt=client_ca.cert_pem), ns)
    root = opaque_secret("fake-root", ns, "istio.io/ca-root", tls_crt=pair.cert_pem, tls_key=pair.key_pem)
    await kube.create(kinds.SECRETS, root, ns)
    labels = {"app": "istio-ingressgateway", "istio": "ingressgateway"}
    pod = {
        "metadata": {"name": "istio-ingressgateway-0", "labels": labels},
        "spec": {"serviceAccountName": "gw-sa", "containers": [{"name": "istio-proxy", "image": "ambit"}]},
    }
    await kube.create(kinds.PODS, pod, ns)
    gateway = ingress_gateway()
    gateway["spec"]["servers"] = [
        {
            "port": {"number": 443, "name": "https", "protocol": "HTTPS"},
            "hosts": ["m.example"],
            "tls": {"mode": "MUTUAL", "credentialName": "partner"},
        },
        {
            "port": {"number": 8443, "name": "https-root", "protocol": "HTTPS"},
            "hosts": ["m.example"],
            "tls": {"mode": "SIMPLE", "credentialName": "fake-root"},
        },
    ]
    await kube.create(kinds.ISTIO_GATEWAYS, gateway, ns)
    name = f"{ns}/istio-ingressgateway"
    async with subscribe(kube, plane, ns, "gw-sa", [name]) as owner:

        def served() -> GatewayConfig | None:
            config = owner.config(name)
            return config if config is not None and any(i.port == 443 for i in config.listeners) else None

        # (a Gateway of another test, selecting the same labels in any namespace, may add its own servers)
        listeners = {i.port: i for i in (await eventually(served)).listeners}
        listener = listeners[443]
        assert (listener.tls.mode, listener.tls.ca_pem) == (TlsMode.MUTUAL, client_ca.cert_pem)
        assert listener.certificates[0].cert_pem == pair.cert_pem
        assert 8443 not in listeners  # the CA root's Secret type is never read


async def test_a_grpc_route_reaches_the_gateway_and_one_from_an_unadmitted_namespace_is_refused_in_its_status(
    kube: KubeClient, plane: ControlPlane
) -> None:
    ns, other = f"in-{secrets.token_hex(3)}", f"out-{secrets.token_hex(3)}"
    for namespace in (ns, other):
        await kube.create(kinds.NAMESPACES, {"metadata": {"name": namespace}})
        service = {"metadata": {"name": "grpc"}, "spec": {"ports": [{"name": "grpc", "port": 9090}]}}
        await kube.create(kinds.SERVICES, service, namespace)
    gateway = {
        "metadata": {"name": "edge"},
        "spec": {"gatewayClassName": "istio", "listeners": [{"name": "http", "port": 8080, "protocol": "HTTP"}]},
    }
    await kube.create(kinds.GATEWAYS, gateway, ns)

    def grpc_route(namespace: str) -> Obj:
        return {
            "metadata": {"name": "echo"},
            "spec": {
                "parentRefs": [{"name": "edge", "namespace": ns}],
                "hostnames": ["grpc.example.com"],
                "rules": [
                    {
                        "matches": [{"method": {"service": "echo.Echo", "method": "Say"}}],
                        "backendRefs": [{"name": "grpc", "port": 9090}],
                    }
                ],
            },
        }

    await kube.create(kinds.GRPC_ROUTES, grpc_route(ns), ns)
    await kube.create(kinds.GRPC_ROUTES, grpc_route(other), other)
    name = f"{ns}/edge"
    async with subscribe(kube, plane, ns, "edge-istio", [name]) as owner:

        def served() -> GatewayConfig | None:
            config = owner.config(name)
            return config if config is not None and config.listeners and config.listeners[0].virtual_hosts else None

        config = await eventually(served)
        (vhost,) = config.listeners[0].virtual_hosts
        (rule,) = vhost.http
        assert vhost.hostname == "grpc.example.com" and rule.route == f"GRPCRoute/{ns}/echo"
        assert rule.match.path is not None and rule.match.path.value == "/echo.Echo/Say"
        backend = rule.backends[0].backend
        assert backend is not None and backend.hostname == f"grpc.{ns}.svc.cluster.local"

    async def conditions(namespace: str) -> dict[str, tuple[str, str]] | None:
        obj = await kube.get(kinds.GRPC_ROUTES, "echo", namespace)
        parents = (obj.get("status") or {}).get("parents") or []
        mine = [p for p in parents if p.get("parentRef", {}).get("name") == "edge"]
        if not mine:
            return None
        assert mine[0]["controllerName"] == "istio.io/gateway-controller"
        return {c["type"]: (c["status"], c["reason"]) for c in mine[0].get("conditions") or ()}

    admitted = await eventually(lambda: conditions(ns))
    assert admitted == {"Accepted": ("True", "Accepted"), "ResolvedRefs": ("True", "ResolvedRefs")}
    refused = await eventually(lambda: conditions(other))
    assert refused["Accepted"] == ("False", "NotAllowedByListeners")
