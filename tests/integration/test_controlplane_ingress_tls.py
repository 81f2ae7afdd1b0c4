"""Gateway API TLS listeners through the real control plane (issue 18): a TLS ``Terminate`` listener whose certificate
lives in another namespace, served only while a ReferenceGrant there allows it; the other namespace's Secret
rotated and pushed without restart; the grant withdrawn and the listener gone; a Passthrough listener on the same
port all along.

A real API server (subprocess, the CRDs installed) and the real control plane (no webhook, no deployment
controller), with a raw delta ADS client authenticated as the gateway's service account
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

from ambit.controlplane.process import ControlPlane
from ambit.k8s import KubeClient, kinds
from ambit.model.ingress import GatewayConfig, ListenerProtocol
from ambit.tls.certs import KeyPair, issue_server_cert, new_ca
from ambit.xds.gateway import GATEWAY_CONFIG_TYPE_URL, decode_gateway_config

Obj = dict[str, Any]
CA = new_ca("ingress tls xds test CA", now=time.time())
GROUP = "gateway.networking.k8s.io"


@pytest.fixture
def plane_options() -> dict[str, Any]:
    return {"deploy_waypoints": False}


def subscribe(
    kube: KubeClient, plane: ControlPlane, namespace: str, account: str, names: list[str]
) -> contextlib.AbstractAsyncContextManager[Subscription[GatewayConfig]]:
    gateway_configs = Subscription(GATEWAY_CONFIG_TYPE_URL, decode_gateway_config)
    return rig_subscribe(kube, plane, (namespace, account), gateway_configs, names)


def tls_data(pair: KeyPair) -> dict[str, str]:
    return {"tls.crt": base64.b64encode(pair.cert_pem).decode(), "tls.key": base64.b64encode(pair.key_pem).decode()}


def cert() -> KeyPair:
    return issue_server_cert(
        CA, common_name="echo.example", dns_names=["echo.example"], ip_addresses=[], now=time.time()
    )


async def test_a_granted_certificate_of_another_namespace_is_served_rotated_and_withdrawn_with_its_grant(
    kube: KubeClient, plane: ControlPlane
) -> None:
    ns, certs = f"gt-{secrets.token_hex(3)}", f"gc-{secrets.token_hex(3)}"
    for name in (ns, certs):
        await kube.create(kinds.NAMESPACES, {"metadata": {"name": name}})
    await kube.create(kinds.SERVICES, {"metadata": {"name": "echo"}, "spec": {"ports": [{"port": 9000}]}}, ns)
    first = cert()
    secret = {"metadata": {"name": "shared"}, "type": "kubernetes.io/tls", "data": tls_data(first)}
    await kube.create(kinds.SECRETS, secret, certs)
    grant = {
        "metadata": {"name": "gateways-of-" + ns},
        "spec": {
            "from": [{"group": GROUP, "kind": "Gateway", "namespace": ns}],
            "to": [{"group": "", "kind": "Secret", "name": "shared"}],
        },
    }
    await kube.create(kinds.REFERENCE_GRANTS, grant, certs)
    gateway = {
        "metadata": {"name": "edge"},
        "spec": {
            "gatewayClassName": "istio",
            "listeners": [
                {
                    "name": "terminate",
                    "port": 9443,
                    "protocol": "TLS",
                    "hostname": "echo.example",
                    "tls": {"mode": "Terminate", "certificateRefs": [{"name": "shared", "namespace": certs}]},
                },
                {"name": "passthrough", "port": 9443, "protocol": "TLS", "tls": {"mode": "Passthrough"}},
            ],
        },
    }
    await kube.create(kinds.GATEWAYS, gateway, ns)
    route = {
        "metadata": {"name": "echo"},
        "spec": {
            "parentRefs": [{"name": "edge", "sectionName": "terminate"}],
            "rules": [{"backendRefs": [{"name": "echo", "port": 9000}]}],
        },
    }
    await kube.create(kinds.TCP_ROUTES, route, ns)
    name = f"{ns}/edge"
    async with subscribe(kube, plane, ns, "edge-istio", [name]) as owner:

        def serving(pair: KeyPair | None) -> Any:
            def check() -> GatewayConfig | None:
                config = owner.config(name)
                if config is None:
                    return None
                found = {item.name: item for item in config.listeners}
                terminate = found.get("terminate")
                if pair is None:
                    return config if terminate is None and "passthrough" in found else None
                ok = terminate is not None and [c.cert_pem for c in terminate.certificates] == [pair.cert_pem]
                return config if ok and terminate is not None and terminate.virtual_hosts else None

            return check

        config = await eventually(serving(first))
        terminate = next(i for i in config.listeners if i.name == "terminate")
        assert (terminate.protocol, terminate.port) == (ListenerProtocol.TLS_TERMINATE, 9443)
        backend = terminate.virtual_hosts[0].tcp_backends[0].backend
        assert backend is not None and backend.hostname == f"echo.{ns}.svc.cluster.local"

        # The other namespace's Secret rotated: pushed, no restart.
        rotated = cert()
        await kube.patch(kinds.SECRETS, "shared", {"data": tls_data(rotated)}, certs)
        await eventually(serving(rotated))

        # The grant withdrawn: the listener is no longer served (its key no longer sent), the passthrough stays.
        await kube.delete(kinds.REFERENCE_GRANTS, grant["metadata"]["name"], certs)
        await eventually(serving(None))
