"""DestinationRules at a real ingress gateway: upstream's TestIngressTLS objects (istio tests/integration/ambient
baseline_test.go: an Istio Gateway on port 80, a VirtualService to the backend's ``https`` port, a DestinationRule
``tls.mode: SIMPLE, insecureSkipVerify``), translated by the control plane's pure translation and applied to an
:class:`~ambit.waypoint.ingress.IngressGateway` on loopback as its xDS client would. The gateway originates TLS to
the backend inside the HBONE tunnel; without the rule it sends plain HTTP to a TLS port and fails. With the rule's
CA the backend's certificate is verified, and a backend whose certificate does not chain to it is refused (an
impersonating backend never gets the request). A VirtualService route to a subset reaches the subset's workloads;
a subset no rule defines is answered 503, never sent to every endpoint. MUTUAL presents the client certificate of
the rule's ``credentialName``, which only a rule of the gateway's own namespace hands it: an exported rule from the
Service's namespace leaves the gateway without the key, and it refuses (503) rather than send without one.
``h2UpgradePolicy: UPGRADE`` sends the client's HTTP/1.1 requests to the backend as HTTP/2. The connection pool's
``http2MaxRequests`` bounds the requests in flight to the backend (over it: 503). A TCP server's relay follows the
rule too: TLS originated to a TLS backend, and a subset no rule defines closes the connection.
"""

from __future__ import annotations

import asyncio
import base64
import dataclasses
import json
import time
from pathlib import Path
from typing import Any

import aiohttp
from tests.ingress_pki import client_cert, opaque_secret
from tests.integration.ingress_rig import EDGE_CA, GATEWAY_ID, ingress_rig
from tests.integration.waypoint_rig import free_port
from tests.upstream_objects import ingress_tls_objects

from ambit.controlplane.translate import translate_all
from ambit.model.ingress import GatewayConfig
from ambit.tls.certs import new_ca

Obj = dict[str, Any]


def gateway_config(objects: list[Obj], secrets: list[Obj] | None = None) -> GatewayConfig:
    """The GatewayConfig the control plane serves the ``istio: ingressgateway`` pods for ``objects`` (Istio
    Gateways, VirtualServices, DestinationRules), with the rig's workload as the pod behind Service ``secure``."""
    gateway_pod = {
        "metadata": {
            "name": "istio-ingressgateway-0",
            "namespace": "istio-system",
            "labels": {"app": "istio-ingressgateway", "istio": "ingressgateway"},
        },
        "spec": {"serviceAccountName": "istio-ingressgateway-service-account"},
    }
    backend_pod = {
        "metadata": {
            "name": "multi-1",
            "namespace": "app",
            "uid": "multi-1",
            "labels": {"app": "secure", "version": "v1"},
        },
        "spec": {"nodeName": "n1", "serviceAccountName": "multi"},
        "status": {"phase": "Running", "podIP": "127.0.0.2", "podIPs": [{"ip": "127.0.0.2"}]},
    }
    backends = [
        {
            "metadata": {"name": name, "namespace": "app"},
            "spec": {
                "clusterIP": ip,
                "selector": {"app": "secure"},
                "ports": [{"name": "https", "port": 443, "targetPort": target}],
            },
        }
        for name, ip, target in (
            ("secure", "198.18.2.5", 8443),
            ("mutual", "198.18.2.6", 8444),
            ("one", "198.18.2.1", 8441),
        )
    ]
    backends.extend(
        {
            "metadata": {"name": name, "namespace": "app"},
            "spec": {
                "clusterIP": ip,
                "selector": {"app": "secure"},
                "ports": [{"name": "http", "port": 80, "targetPort": target}],
            },
        }
        for name, ip, target in (("h2c", "198.18.2.7", 8082), ("web", "198.18.2.4", 8080))
    )
    by_kind: dict[str, list[Obj]] = {"Gateway": [], "VirtualService": [], "DestinationRule": []}
    for obj in objects:
        by_kind[obj["kind"]].append(obj)
    translation = translate_all(
        pods=[gateway_pod, backend_pod],
        services=backends,
        endpoint_slices=(),
        namespaces=[{"metadata": {"name": "app"}}, {"metadata": {"name": "istio-system"}}],
        istio_gateways=by_kind["Gateway"],
        virtual_services=by_kind["VirtualService"],
        destination_rules=by_kind["DestinationRule"],
        secrets=secrets or [],
    )
    (config,) = translation.gateway_configs
    port = free_port()  # the server's port 80 on loopback
    return dataclasses.replace(config, listeners=tuple(dataclasses.replace(i, port=port) for i in config.listeners))


async def get_five(port: int) -> list[tuple[int, str]]:
    """TestIngressTLS' call: five plain HTTP requests to the gateway's port 80, each with a 2 s timeout."""
    out = []
    async with aiohttp.ClientSession(timeout=aiohttp.ClientTimeout(total=2)) as client:
        for i in range(5):
            async with client.get(f"http://127.0.0.1:{port}/call-{i}", headers={"Host": "captured"}) as response:
                out.append((response.status, await response.text()))
    return out


async def test_upstream_ingress_tls_originates_tls_to_the_backend_s_https_port(tmp_path: Path) -> None:
    config = gateway_config(ingress_tls_objects("secure", 443, "app"))
    assert [d.rule for d in config.destination_rules] == ["app/secure"]
    port = config.listeners[0].port
    async with ingress_rig(tmp_path, config) as rig:
        answers = await get_five(port)
        assert [status for status, _ in answers] == [200] * 5, answers
        assert all(json.loads(body)["tls"] is True for _, body in answers)
        assert [json.loads(body)["path"] for _, body in answers] == [f"/call-{i}" for i in range(5)]
        assert rig.endpoint.peers and all(p == GATEWAY_ID for p in rig.endpoint.peers)  # inside HBONE
        dumped = rig.proc.config_dump()["routes"]["destinationRules"]  # what `proxy-config` shows for the gateway
        assert [(d["service"], d["rule"]) for d in dumped] == [("app/secure.app.svc.cluster.local", "app/secure")]


async def test_without_the_destination_rule_the_gateway_speaks_plain_http_to_the_tls_port(tmp_path: Path) -> None:
    gateway, route, _ = ingress_tls_objects("secure", 443, "app")
    config = gateway_config([gateway, route])
    assert config.destination_rules == ()
    async with ingress_rig(tmp_path, config):
        statuses = [status for status, _ in await get_five(config.listeners[0].port)]
        assert 200 not in statuses and set(statuses) <= {502, 503}, statuses


def ca_secret(name: str, ca_pem: bytes) -> Obj:
    return {
        "metadata": {"name": name, "namespace": "app"},
        "type": "Opaque",
        "data": {"ca.crt": base64.b64encode(ca_pem).decode()},
    }


def verifying_rule(credential: str) -> Obj:
    return {
        "apiVersion": "networking.istio.io/v1",
        "kind": "DestinationRule",
        "metadata": {"name": "secure", "namespace": "app"},
        "spec": {
            "host": "secure",
            "trafficPolicy": {"tls": {"mode": "SIMPLE", "credentialName": credential, "sni": "secure.example.com"}},
        },
    }


async def test_a_rule_s_ca_verifies_the_backend_and_an_impersonating_backend_is_refused(tmp_path: Path) -> None:
    gateway, route, _ = ingress_tls_objects("secure", 443, "app")
    trusted = gateway_config([gateway, route, verifying_rule("edge-ca")], [ca_secret("edge-ca", EDGE_CA.cert_pem)])
    async with ingress_rig(tmp_path, trusted):
        assert [status for status, _ in await get_five(trusted.listeners[0].port)] == [200] * 5
    # The rule trusts another CA: the rig's backend (its certificate from EDGE_CA) is not the one asked for.
    other = new_ca("another CA", now=time.time())
    refused = gateway_config([gateway, route, verifying_rule("other-ca")], [ca_secret("other-ca", other.cert_pem)])
    async with ingress_rig(tmp_path / "refused", refused):
        answers = await get_five(refused.listeners[0].port)
        assert all(status == 503 for status, _ in answers), answers
        assert not any('"tls"' in body for _, body in answers)  # no request reached the backend's application


def subset_objects(subset: str) -> list[Obj]:
    gateway, route, _ = ingress_tls_objects("secure", 443, "app")
    route["spec"]["http"][0]["route"][0]["destination"]["subset"] = subset
    rule = {
        "apiVersion": "networking.istio.io/v1",
        "kind": "DestinationRule",
        "metadata": {"name": "secure", "namespace": "app"},
        "spec": {
            "host": "secure",
            "trafficPolicy": {"tls": {"mode": "SIMPLE", "insecureSkipVerify": True}},
            "subsets": [{"name": "v1", "labels": {"version": "v1"}}, {"name": "v2", "labels": {"version": "v2"}}],
        },
    }
    return [gateway, route, rule]


async def test_a_route_to_a_subset_reaches_its_workloads_and_an_undefined_subset_is_refused(tmp_path: Path) -> None:
    config = gateway_config(subset_objects("v1"))
    (policy,) = config.destination_rules
    assert [(s.name, sorted(s.workloads)) for s in policy.subsets] == [
        ("v1", ["Kubernetes//Pod/app/multi-1"]),
        ("v2", []),
    ]
    async with ingress_rig(tmp_path, config) as rig:
        assert [status for status, _ in await get_five(config.listeners[0].port)] == [200] * 5
        # v2 selects no workload: no healthy upstream. "v3" is defined by no rule: 503 (NC), never every endpoint.
        for subset in ("v2", "v3"):
            before = len(rig.endpoint.peers)
            changed = gateway_config(subset_objects(subset))
            listeners = tuple(dataclasses.replace(i, port=config.listeners[0].port) for i in changed.listeners)
            rig.proc.apply(dataclasses.replace(changed, listeners=listeners))  # the same port, the new route
            statuses = [status for status, _ in await get_five(config.listeners[0].port)]
            assert statuses == [503] * 5, (subset, statuses)
            assert len(rig.endpoint.peers) == before


CLIENT = client_cert(EDGE_CA, "gateway-client")


def mutual_objects(rule_namespace: str) -> tuple[list[Obj], list[Obj]]:
    """TestIngressTLS' Gateway and route to ``mutual``, and a MUTUAL rule in ``rule_namespace`` whose
    ``credentialName`` Secret (in the same namespace) holds :data:`CLIENT` and the backend's CA."""
    gateway, route, _ = ingress_tls_objects("mutual", 443, "app")
    tls = {"mode": "MUTUAL", "credentialName": "client", "sni": "mutual.example.com"}
    rule = {
        "apiVersion": "networking.istio.io/v1",
        "kind": "DestinationRule",
        "metadata": {"name": "mutual", "namespace": rule_namespace},
        "spec": {"host": "mutual.app.svc.cluster.local", "trafficPolicy": {"tls": tls}},
    }
    secret = opaque_secret(
        "client",
        rule_namespace,
        "kubernetes.io/tls",
        tls_crt=CLIENT.cert_pem,
        tls_key=CLIENT.key_pem,
        ca_crt=EDGE_CA.cert_pem,
    )
    return [gateway, route, rule], [secret]


async def test_mutual_presents_the_rule_s_client_certificate_only_from_the_gateway_s_namespace(tmp_path: Path) -> None:
    config = gateway_config(*mutual_objects("istio-system"))
    async with ingress_rig(tmp_path, config):
        answers = await get_five(config.listeners[0].port)
        assert [status for status, _ in answers] == [200] * 5, answers
        assert all(json.loads(body)["client"] == "gateway-client" for _, body in answers)
    # The same rule exported from the Service's namespace: the gateway gets the rule but not the Secret's key, and
    # refuses rather than open TLS without the certificate the backend requires.
    config = gateway_config(*mutual_objects("app"))
    (policy,) = config.destination_rules
    assert policy.traffic_policy is not None and policy.traffic_policy.tls is not None
    assert policy.traffic_policy.tls.private_key == ""
    async with ingress_rig(tmp_path / "elsewhere", config):
        answers = await get_five(config.listeners[0].port)
        assert [status for status, _ in answers] == [503] * 5, answers


def h2c_objects(**connection_pool: Any) -> list[Obj]:
    gateway, route, _ = ingress_tls_objects("h2c", 80, "app")
    rule = {
        "apiVersion": "networking.istio.io/v1",
        "kind": "DestinationRule",
        "metadata": {"name": "h2c", "namespace": "app"},
        "spec": {"host": "h2c", "trafficPolicy": {"connectionPool": {"http": connection_pool}}},
    }
    return [gateway, route, rule]


async def test_h2_upgrade_policy_sends_http1_clients_requests_upstream_as_http2(tmp_path: Path) -> None:
    config = gateway_config(h2c_objects(h2UpgradePolicy="UPGRADE"))
    async with ingress_rig(tmp_path, config) as rig:
        answers = await get_five(config.listeners[0].port)
        assert [status for status, _ in answers] == [200] * 5, answers
        assert all(json.loads(body)["proto"] == "HTTP/2.0" for _, body in answers)
        # DO_NOT_UPGRADE: the same backend gets HTTP/1.1 (and answers 505).
        changed = gateway_config(h2c_objects(h2UpgradePolicy="DO_NOT_UPGRADE"))
        listeners = tuple(dataclasses.replace(i, port=config.listeners[0].port) for i in changed.listeners)
        rig.proc.apply(dataclasses.replace(changed, listeners=listeners))
        assert {status for status, _ in await get_five(config.listeners[0].port)} == {505}


def tcp_objects(subset: str = "") -> list[Obj]:
    """An Istio Gateway TCP server on 9000 relaying to ``one`` (a server speaking a line protocol over TLS only),
    and a rule for ``one`` originating TLS, with subset ``v1``."""
    gateway, _, _ = ingress_tls_objects("one", 443, "app")
    gateway["spec"]["servers"] = [{"port": {"number": 9000, "name": "tcp", "protocol": "TCP"}, "hosts": ["*"]}]
    destination: dict[str, Any] = {"host": "one", "port": {"number": 443}}
    if subset:
        destination["subset"] = subset
    route = {
        "apiVersion": "networking.istio.io/v1",
        "kind": "VirtualService",
        "metadata": {"name": "tcp", "namespace": "app"},
        "spec": {"gateways": ["gateway"], "hosts": ["*"], "tcp": [{"route": [{"destination": destination}]}]},
    }
    rule = {
        "apiVersion": "networking.istio.io/v1",
        "kind": "DestinationRule",
        "metadata": {"name": "one", "namespace": "app"},
        "spec": {
            "host": "one",
            "trafficPolicy": {"tls": {"mode": "SIMPLE", "insecureSkipVerify": True}},
            "subsets": [{"name": "v1", "labels": {"version": "v1"}}],
        },
    }
    return [gateway, route, rule]


async def ask_line(port: int) -> bytes:
    reader, writer = await asyncio.open_connection("127.0.0.1", port)
    try:
        writer.write(b"hello\n")
        await writer.drain()
        return await asyncio.wait_for(reader.readline(), 10)
    finally:
        writer.close()


async def test_a_tcp_server_relays_through_the_rule_s_originated_tls_and_subset(tmp_path: Path) -> None:
    config = gateway_config(tcp_objects("v1"))
    port = config.listeners[0].port
    async with ingress_rig(tmp_path, config) as rig:
        assert await ask_line(port) == b"one hello\n"  # plain bytes in, TLS to the backend
        assert rig.endpoint.peers == [GATEWAY_ID]
        changed = gateway_config(tcp_objects("v9"))  # a subset no rule defines: closed, never relayed
        listeners = tuple(dataclasses.replace(i, port=port) for i in changed.listeners)
        rig.proc.apply(dataclasses.replace(changed, listeners=listeners))
        try:
            answer = await ask_line(port)
        except ConnectionResetError:  # closed with our line unread
            answer = b""
        assert answer == b""
        assert rig.endpoint.peers == [GATEWAY_ID]
        assert rig.proc.connection_refusals["no endpoint"] == 1


async def test_the_connection_pool_bounds_the_requests_in_flight_to_the_backend(tmp_path: Path) -> None:
    gateway, route, _ = ingress_tls_objects("web", 80, "app")
    rule = {
        "apiVersion": "networking.istio.io/v1",
        "kind": "DestinationRule",
        "metadata": {"name": "web", "namespace": "app"},
        "spec": {"host": "web", "trafficPolicy": {"connectionPool": {"http": {"http2MaxRequests": 1}}}},
    }
    config = gateway_config([gateway, route, rule])
    url = f"http://127.0.0.1:{config.listeners[0].port}"
    async with ingress_rig(tmp_path, config) as rig, aiohttp.ClientSession() as client:

        async def get(path: str) -> tuple[int, str]:
            async with client.get(url + path, timeout=aiohttp.ClientTimeout(total=10)) as response:
                return response.status, await response.text()

        held = asyncio.create_task(get("/hold"))
        await asyncio.wait_for(rig.hold.arrived.wait(), 10)
        status, body = await get("/second")  # one request is in flight already: over the limit
        assert status == 503 and "overflow" in body
        rig.hold.release.set()
        assert (await held)[0] == 200
        assert (await get("/third"))[0] == 200  # the slot is free again


async def test_istio_mutual_changes_nothing_for_a_meshed_backend(tmp_path: Path) -> None:
    """HBONE already is mutual TLS with the gateway's identity: an ``ISTIO_MUTUAL`` rule adds no TLS inside it."""
    gateway, route, rule = ingress_tls_objects("web", 80, "app")
    rule["spec"]["trafficPolicy"] = {"tls": {"mode": "ISTIO_MUTUAL"}}
    config = gateway_config([gateway, route, rule])
    async with ingress_rig(tmp_path, config) as rig:
        answers = await get_five(config.listeners[0].port)
        assert [status for status, _ in answers] == [200] * 5, answers
        assert all(json.loads(body)["tls"] is False for _, body in answers)
        assert rig.endpoint.peers and all(p == GATEWAY_ID for p in rig.endpoint.peers)
