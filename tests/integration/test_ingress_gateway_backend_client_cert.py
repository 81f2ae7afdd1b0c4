"""The Gateway's backend client certificate (``spec.tls.backend.clientCertificateRef``, GEP-3155) presented on the
TLS a BackendTLSPolicy makes the ingress gateway originate, through a real gateway on loopback
(:mod:`tests.integration.ingress_rig`): the mesh Service ``mutual`` is an HTTPS server that requires a client
certificate from :data:`EDGE_CA` and answers the client's common name; a BackendTLSPolicy on it (CA from a
ConfigMap, hostname ``mutual.example.com``) and an HTTPRoute to it from the Gateway ``edge``.

With the reference resolved the backend accepts the gateway and sees the Secret's certificate; without it, or with a
reference that does not resolve (no such Secret, another namespace without a ReferenceGrant), the gateway presents
none and the backend refuses the handshake (503). The key reaches the gateway only inside its own configuration.
"""

from __future__ import annotations

import asyncio
import json
from collections.abc import AsyncIterator
from pathlib import Path
from typing import Any

import pytest
from tests.ingress_pki import client_cert, opaque_secret
from tests.integration.ingress_rig import EDGE_CA, IngressRig, as_served, ingress_rig

from ambit.controlplane.translate import translate_all
from ambit.model.destination_policy import TlsMode
from ambit.model.ingress import GatewayConfig

Obj = dict[str, Any]
GATEWAY_CLIENT = client_cert(EDGE_CA, "edge-gateway", dns=("edge.example",))
OUTSIDER = client_cert(EDGE_CA, "outsider")


def gateway_config(client_ref: Obj | None) -> GatewayConfig:
    spec: Obj = {
        "gatewayClassName": "istio",
        "listeners": [
            {"name": "http", "port": 80, "protocol": "HTTP", "allowedRoutes": {"namespaces": {"from": "All"}}}
        ],
    }
    if client_ref is not None:
        spec["tls"] = {"backend": {"clientCertificateRef": client_ref}}
    gateway = {
        "apiVersion": "gateway.networking.k8s.io/v1",
        "kind": "Gateway",
        "metadata": {"name": "edge", "namespace": "edge"},
        "spec": spec,
    }
    route = {
        "apiVersion": "gateway.networking.k8s.io/v1",
        "kind": "HTTPRoute",
        "metadata": {"name": "mutual", "namespace": "app"},
        "spec": {
            "parentRefs": [{"name": "edge", "namespace": "edge"}],
            "rules": [{"backendRefs": [{"name": "mutual", "port": 443}]}],
        },
    }
    policy = {
        "apiVersion": "gateway.networking.k8s.io/v1",
        "kind": "BackendTLSPolicy",
        "metadata": {"name": "mutual-tls", "namespace": "app"},
        "spec": {
            "targetRefs": [{"group": "", "kind": "Service", "name": "mutual"}],
            "validation": {
                "hostname": "mutual.example.com",
                "caCertificateRefs": [{"group": "", "kind": "ConfigMap", "name": "backend-ca"}],
            },
        },
    }
    service = {
        "metadata": {"name": "mutual", "namespace": "app"},
        "spec": {"clusterIP": "198.18.2.7", "ports": [{"name": "https", "port": 443}]},
    }
    translation = translate_all(
        pods=(),
        services=[service],
        endpoint_slices=(),
        namespaces=[{"metadata": {"name": n}} for n in ("app", "edge", "other")],
        gateways=[gateway],
        http_routes=[route],
        backend_tls_policies=[policy],
        secrets=[
            opaque_secret(
                "edge-client",
                "edge",
                "kubernetes.io/tls",
                tls_crt=GATEWAY_CLIENT.cert_pem,
                tls_key=GATEWAY_CLIENT.key_pem,
            ),
            opaque_secret(
                "elsewhere", "other", "kubernetes.io/tls", tls_crt=OUTSIDER.cert_pem, tls_key=OUTSIDER.key_pem
            ),
        ],
        config_maps=[
            {"metadata": {"name": "backend-ca", "namespace": "app"}, "data": {"ca.crt": EDGE_CA.cert_pem.decode()}}
        ],
    )
    (config,) = translation.gateway_configs
    return as_served(config)  # what the gateway gets is what its xDS client decodes (the key included)


async def get(port: int) -> tuple[int, Obj | None]:
    """The status of ``GET /who`` through the gateway's HTTP listener, and the JSON body when it is 200."""
    async with asyncio.timeout(15):
        reader, writer = await asyncio.open_connection("127.0.0.1", port)
        try:
            writer.write(b"GET /who HTTP/1.1\r\nHost: mutual.example.com\r\nConnection: close\r\n\r\n")
            await writer.drain()
            head = (await reader.readuntil(b"\r\n\r\n")).decode("latin-1")
            status = int(head.split(" ", 2)[1])
            length = next(
                (int(h.split(":", 1)[1]) for h in head.split("\r\n") if h.lower().startswith("content-length:")), 0
            )
            body = await reader.readexactly(length)
        finally:
            writer.close()
    return status, json.loads(body) if status == 200 else None


@pytest.fixture
async def rig(tmp_path: Path, request: pytest.FixtureRequest) -> AsyncIterator[IngressRig]:
    async with ingress_rig(tmp_path, gateway_config(request.param)) as running:
        yield running


@pytest.mark.parametrize("rig", [{"name": "edge-client"}], indirect=True)
async def test_the_backend_accepts_the_gateway_presenting_its_client_certificate(rig: IngressRig) -> None:
    (policy,) = rig.proc.router.config.destination_rules
    tls = policy.traffic_policy.tls if policy.traffic_policy is not None else None
    assert tls is not None and tls.mode is TlsMode.MUTUAL and tls.sni == "mutual.example.com"
    status, body = await get(rig.port("http"))
    assert status == 200 and body is not None
    assert body["tls"] is True and body["client"] == "edge-gateway" and body["path"] == "/who"


@pytest.mark.parametrize(
    "rig",
    [
        None,
        {"name": "no-such-secret"},
        {"name": "elsewhere", "namespace": "other"},  # no ReferenceGrant: not presented, whatever the Secret holds
    ],
    indirect=True,
    ids=["no reference", "a missing secret", "another namespace without a grant"],
)
async def test_without_a_resolved_client_certificate_the_backend_refuses_the_gateway(rig: IngressRig) -> None:
    (policy,) = rig.proc.router.config.destination_rules
    tls = policy.traffic_policy.tls if policy.traffic_policy is not None else None
    assert tls is not None and tls.mode is TlsMode.SIMPLE and not tls.private_key
    status, _ = await get(rig.port("http"))
    assert status == 503
