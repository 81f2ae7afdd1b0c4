"""GatewayStaticAddresses through the real control plane: an ingress Gateway whose ``spec.addresses`` name a Service
by hostname is a manual deployment (nothing is deployed for it), its status follows each patch of the addresses
as the suite patches them, and it is woken when the Service it names, or that Service's endpoints, appear; its
config reaches the service account of the pods behind that Service over delta ADS, and not ``<name>-istio``.

A real API server (subprocess, the CRDs installed; no lab controllers, so the EndpointSlice is written by the test
as the EndpointSlice controller would) and the real control plane (no webhook): the deployment controller reads
Services and EndpointSlices from the cluster view's caches.
"""

from __future__ import annotations

import contextlib
from typing import Any

import pytest
from tests.integration.controlplane_rig import Subscription, eventually
from tests.integration.controlplane_rig import subscribe as rig_subscribe
from tests.integration.gateway_rig import condition, get

from ambit.controlplane.process import ControlPlane
from ambit.k8s import KubeClient, kinds
from ambit.model.ingress import GatewayConfig
from ambit.xds.gateway import GATEWAY_CONFIG_TYPE_URL, decode_gateway_config

Obj = dict[str, Any]
OWNED = (kinds.SERVICE_ACCOUNTS, kinds.DEPLOYMENTS, kinds.SERVICES)
INVALID = {"type": "test/fake-invalid-type", "value": "fake address teehee!"}
UNUSABLE = {"type": "Hostname", "value": "foo"}


@pytest.fixture
def plane_options() -> dict[str, Any]:
    return {"waypoint_xds_address": "198.18.0.1:15012", "waypoint_image_pull_policy": "Never"}


def subscribe(
    kube: KubeClient, plane: ControlPlane, namespace: str, account: str, names: list[str]
) -> contextlib.AbstractAsyncContextManager[Subscription[GatewayConfig]]:
    """A delta ADS stream as ``namespace/account`` subscribed to GatewayConfig ``names``."""
    return rig_subscribe(
        kube, plane, (namespace, account), Subscription(GATEWAY_CONFIG_TYPE_URL, decode_gateway_config), names
    )


async def backend(kube: KubeClient, namespace: str, name: str = "infra-backend-v1") -> None:
    """A Service on port 8080 (target 3000) with one endpoint, as the conformance suite's backends are."""
    await kube.create(
        kinds.SERVICES, {"metadata": {"name": name}, "spec": {"ports": [{"port": 8080, "targetPort": 3000}]}}, namespace
    )
    await kube.create(
        kinds.ENDPOINT_SLICES,
        {
            "metadata": {"name": f"{name}-x1", "labels": {"kubernetes.io/service-name": name}},
            "addressType": "IPv4",
            "ports": [{"name": "", "port": 3000, "protocol": "TCP"}],
            "endpoints": [{"addresses": ["10.244.0.10"], "conditions": {"ready": True}}],
        },
        namespace,
    )


def static_gateway(namespace: str, *addresses: Obj) -> Obj:
    return {
        "metadata": {"name": "gateway-static-addresses"},
        "spec": {
            "gatewayClassName": "istio",
            "addresses": list(addresses),
            "listeners": [{"name": "http", "port": 8080, "protocol": "HTTP"}],
        },
    }


async def reasons(kube: KubeClient, namespace: str, accepted: str, programmed: str) -> Obj | None:
    """The Gateway once its Accepted and Programmed reasons are these, at its generation."""
    gateway = await get(kube, kinds.GATEWAYS, "gateway-static-addresses", namespace)
    generation = (gateway or {}).get("metadata", {}).get("generation")
    found = [condition(gateway, "Accepted"), condition(gateway, "Programmed")]
    if [c.get("reason") for c in found] != [accepted, programmed]:
        return None
    return gateway if all(c.get("observedGeneration") == generation for c in found) else None


async def test_static_addresses_are_judged_as_the_suite_patches_them_and_nothing_is_deployed(
    kube: KubeClient, plane: ControlPlane, namespace: str
) -> None:
    await backend(kube, namespace)
    usable = {"type": "Hostname", "value": f"infra-backend-v1.{namespace}.svc.cluster.local"}
    await kube.create(kinds.GATEWAYS, static_gateway(namespace, INVALID, UNUSABLE, usable), namespace)
    gateway = await eventually(lambda: reasons(kube, namespace, "UnsupportedAddress", "AddressNotUsable"))
    assert condition(gateway, "Accepted")["message"] == "only Hostname is supported, ignoring [fake address teehee!]"

    patch = {"spec": {"addresses": [UNUSABLE, usable]}}
    await kube.patch(kinds.GATEWAYS, "gateway-static-addresses", patch, namespace)
    gateway = await eventually(lambda: reasons(kube, namespace, "Accepted", "AddressNotUsable"))
    assert condition(gateway, "Programmed")["status"] == "False"

    await kube.patch(kinds.GATEWAYS, "gateway-static-addresses", {"spec": {"addresses": [usable]}}, namespace)
    gateway = await eventually(lambda: reasons(kube, namespace, "Accepted", "Programmed"))
    assert condition(gateway, "Programmed")["message"] == (
        f"Resource programmed, assigned to service(s) {usable['value']}:8080"
    )
    assert gateway["status"]["addresses"] == [usable]
    (listener,) = gateway["status"]["listeners"]
    assert listener["name"] == "http" and listener["attachedRoutes"] == 0
    for kind in OWNED:
        assert await get(kube, kind, "gateway-static-addresses-istio", namespace) is None, kind


async def test_a_manual_deployment_is_programmed_when_the_service_it_names_comes(
    kube: KubeClient, plane: ControlPlane, namespace: str
) -> None:
    await kube.create(kinds.GATEWAYS, static_gateway(namespace, {"type": "Hostname", "value": "late"}), namespace)
    gateway = await eventually(lambda: reasons(kube, namespace, "Accepted", "AddressNotUsable"))
    assert condition(gateway, "Programmed")["message"] == (
        f'Failed to assign to any requested addresses: hostname "late.{namespace}.svc.cluster.local" not found'
    )
    assert plane.gateways is not None
    controller = plane.gateways

    async def quiet() -> bool:  # once the caches have caught up with its writes, a pass writes nothing
        before = controller.writes
        await controller.reconcile_once()
        return controller.writes == before

    await eventually(quiet)
    seen = [-1]

    def idle() -> bool:  # and the pass its last write caused has run: no pass for 5 polls in a row
        seen.append(controller.passes)
        return len(seen) > 5 and len(set(seen[-5:])) == 1

    await eventually(idle)
    await backend(kube, namespace, "late")  # no change to the Gateway: the Service and its slice wake the controller
    gateway = await eventually(lambda: reasons(kube, namespace, "Accepted", "Programmed"))
    assert gateway["status"]["addresses"] == [{"type": "Hostname", "value": f"late.{namespace}.svc.cluster.local"}]


async def test_the_proxies_behind_the_named_service_get_the_config_and_the_unused_default_account_does_not(
    kube: KubeClient, plane: ControlPlane, namespace: str
) -> None:
    selector = {"app": "edge-proxy"}
    service = {"metadata": {"name": "edge-proxies"}, "spec": {"selector": selector, "ports": [{"port": 8080}]}}
    await kube.create(kinds.SERVICES, service, namespace)
    pod = {
        "metadata": {"name": "edge-proxy-1", "labels": selector},
        "spec": {"serviceAccountName": "edge-sa", "nodeName": "node-1", "containers": [{"name": "p", "image": "p"}]},
    }
    await kube.create(kinds.PODS, pod, namespace)
    await kube.create(
        kinds.GATEWAYS, static_gateway(namespace, {"type": "Hostname", "value": "edge-proxies"}), namespace
    )
    name = f"{namespace}/gateway-static-addresses"
    async with (
        subscribe(kube, plane, namespace, "edge-sa", [name]) as proxy,
        subscribe(kube, plane, namespace, "gateway-static-addresses-istio", [name]) as unused,
    ):
        config = await eventually(lambda: proxy.config(name))
        (listener,) = config.listeners
        assert (listener.name, listener.port) == ("http", 8080)
        assert unused.held == {} and unused.sent == []
