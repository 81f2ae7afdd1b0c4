"""The control plane as the istiod Deployment runs it: the webhook configuration comes from ``deploy/`` (pointing at
the istiod Service), the control plane only fills in its caBundle, and the API server reaches the webhook through
the Service's endpoint; the plug-in CA comes from Istio's ``cacerts`` directory."""

from __future__ import annotations

import asyncio
import time
from collections.abc import Awaitable, Callable
from pathlib import Path
from typing import Any

import yaml
from tests.harness import free_port

from ambit.apiserver.server import ApiServer, ApiServerSettings
from ambit.controlplane.process import ControlPlane, ControlPlaneSettings
from ambit.identity.localca import ROOT_COMMON_NAME
from ambit.k8s import KubeApiStatusError, KubeClient, KubeNotFoundError, kinds
from ambit.tls.certs import new_ca

DEPLOY = Path(__file__).resolve().parents[2] / "deploy" / "base" / "istiod"
POLICIES = kinds.ResourceKind("security.istio.io", "v1", "authorizationpolicies", "AuthorizationPolicy")


async def eventually(predicate: Callable[[], Awaitable[Any]], what: str, within: float = 15.0) -> Any:
    deadline = time.monotonic() + within
    while True:
        try:
            value = await predicate()
        except KubeNotFoundError:
            value = None
        if value:
            return value
        assert time.monotonic() < deadline, f"timed out waiting for {what}"
        await asyncio.sleep(0.05)


async def test_in_cluster_the_webhook_is_reached_through_its_service_with_the_plug_in_ca(tmp_path: Path) -> None:
    webhook_port = free_port()
    ca = new_ca(ROOT_COMMON_NAME, now=time.time())
    cacerts = tmp_path / "cacerts"
    cacerts.mkdir()
    (cacerts / "ca-cert.pem").write_bytes(ca.cert_pem)
    (cacerts / "ca-key.pem").write_bytes(ca.key_pem)
    (cacerts / "root-cert.pem").write_bytes(ca.cert_pem)
    settings = ApiServerSettings(data_dir=tmp_path / "api", port=0)
    async with ApiServer(settings) as server, KubeClient.from_kubeconfig(server.kubeconfig) as client:
        await client.create(kinds.NAMESPACES, {"metadata": {"name": "istio-system"}})
        configuration = yaml.safe_load((DEPLOY / "validatingwebhookconfiguration.yaml").read_text())
        await client.create(kinds.VALIDATING_WEBHOOK_CONFIGURATIONS, configuration)
        service = yaml.safe_load((DEPLOY / "service.yaml").read_text())
        created = await client.create(kinds.SERVICES, service, namespace="istio-system")
        port = next(p["port"] for p in created["spec"]["ports"] if p["name"] == "https-webhook")
        endpoints = {
            "apiVersion": "discovery.k8s.io/v1",
            "kind": "EndpointSlice",
            "metadata": {"name": "istiod-1", "labels": {"kubernetes.io/service-name": "istiod"}},
            "addressType": "IPv4",
            "ports": [{"name": "https-webhook", "port": webhook_port, "protocol": "TCP"}],
            "endpoints": [{"addresses": ["127.0.0.1"], "conditions": {"ready": True}}],
        }
        await client.create(kinds.ENDPOINT_SLICES, endpoints, namespace="istio-system")
        plane = ControlPlane(
            ControlPlaneSettings(
                kubeconfig=server.kubeconfig,
                host="127.0.0.1",
                port=0,
                webhook_port=webhook_port,
                webhook_service="istio-system/istiod",
                cacerts_dir=cacerts,
                debounce=0.05,
            ),
            client,
        )
        await plane.start()
        try:
            assert plane.root is not None and plane.root.root_pem == ca.cert_pem

            async def bundled() -> bool:
                found = await client.get(kinds.VALIDATING_WEBHOOK_CONFIGURATIONS, "istio-validator-ambit")
                hook = found["webhooks"][0]
                return bool(hook["clientConfig"].get("caBundle")) and hook["failurePolicy"] == "Fail"

            await eventually(bundled, "the caBundle to be filled in")
            found = await client.get(kinds.VALIDATING_WEBHOOK_CONFIGURATIONS, "istio-validator-ambit")
            assert found["webhooks"][0]["clientConfig"]["service"] == {
                "name": "istiod",
                "namespace": "istio-system",
                "path": "/validate",
                "port": port,
            }
            bad = {
                "apiVersion": "security.istio.io/v1",
                "kind": "AuthorizationPolicy",
                "metadata": {"name": "bad", "namespace": "istio-system"},
                "spec": {"action": "ALLOW", "rules": [{"to": [{"operation": {"ports": ["not-a-port"]}}]}]},
            }
            try:
                await client.create(POLICIES, bad, namespace="istio-system")
            except KubeApiStatusError as exc:
                assert "admission webhook" in str(exc) and "denied" in str(exc), exc
            else:
                raise AssertionError("the webhook, reached through its Service, should have refused the policy")
        finally:
            await plane.aclose()
