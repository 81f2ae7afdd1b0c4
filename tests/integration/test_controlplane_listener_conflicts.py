"""Listener conflicts of an ingress Gateway through the real control plane: a Gateway of class ``istio`` whose
listeners conflict gets istiod's listener conditions in its status (the loser Accepted False, Conflicted True,
Programmed False, with ProtocolConflict or HostnameConflict); the gateway's config over delta ADS holds only the
winners; a tenant's route in another namespace that names the permissive loser is not attached, and nothing of
it is served; fixing the spec clears the conflict.

A real API server (subprocess, the CRDs installed) and the real control plane with its gateway controller, and a
raw gRPC delta client authenticated as the gateway's service account (tests/integration/controlplane_rig.py).
"""

from __future__ import annotations

import contextlib
import secrets
from typing import Any

import pytest
from tests.integration.controlplane_rig import Subscription, eventually
from tests.integration.controlplane_rig import subscribe as rig_subscribe
from tests.integration.gateway_rig import get

from ambit.controlplane.process import ControlPlane
from ambit.k8s import KubeClient, kinds
from ambit.model.ingress import GatewayConfig
from ambit.xds.gateway import GATEWAY_CONFIG_TYPE_URL, decode_gateway_config

Obj = dict[str, Any]
MESSAGE = "Listener has a conflict with another listener attached to the same Gateway"


@pytest.fixture
def plane_options() -> dict[str, Any]:
    return {"waypoint_xds_address": "198.18.0.1:15012", "waypoint_image_pull_policy": "Never"}


def subscribe(
    kube: KubeClient, plane: ControlPlane, namespace: str, account: str, names: list[str]
) -> contextlib.AbstractAsyncContextManager[Subscription[GatewayConfig]]:
    configs = Subscription(GATEWAY_CONFIG_TYPE_URL, decode_gateway_config)
    return rig_subscribe(kube, plane, (namespace, account), configs, names)


def listener_conditions(gateway: Obj | None, name: str) -> dict[str, tuple[str, str, str]]:
    for item in ((gateway or {}).get("status") or {}).get("listeners") or ():
        if item.get("name") == name:
            return {c["type"]: (c["status"], c["reason"], c["message"]) for c in item.get("conditions") or ()}
    return {}


async def test_conflicting_listeners_get_istiod_s_status_and_only_the_winners_are_served(
    kube: KubeClient, plane: ControlPlane
) -> None:
    ns, tenant = f"cf-{secrets.token_hex(3)}", f"tenant-{secrets.token_hex(3)}"
    for name in (ns, tenant):
        await kube.create(kinds.NAMESPACES, {"metadata": {"name": name}})
    await kube.create(
        kinds.SERVICES, {"metadata": {"name": "shop"}, "spec": {"ports": [{"port": 80, "targetPort": 8080}]}}, ns
    )
    await kube.create(
        kinds.SERVICES, {"metadata": {"name": "evil"}, "spec": {"ports": [{"port": 80, "targetPort": 8080}]}}, tenant
    )
    listeners = [
        {"name": "web", "port": 8080, "protocol": "HTTP", "hostname": "shop.example.com"},
        # a duplicate that admits every namespace: the later one loses, whatever it admits
        {
            "name": "open",
            "port": 8080,
            "protocol": "HTTP",
            "hostname": "shop.example.com",
            "allowedRoutes": {"namespaces": {"from": "All"}},
        },
        {"name": "raw", "port": 8080, "protocol": "TCP"},
        {"name": "other", "port": 8080, "protocol": "HTTP", "hostname": "other.example.com"},
    ]
    gateway = {"metadata": {"name": "edge"}, "spec": {"gatewayClassName": "istio", "listeners": listeners}}
    await kube.create(kinds.GATEWAYS, gateway, ns)
    hijack = {
        "metadata": {"name": "hijack"},
        "spec": {
            "parentRefs": [{"name": "edge", "namespace": ns, "sectionName": "open"}],
            "hostnames": ["shop.example.com"],
            "rules": [{"backendRefs": [{"name": "evil", "port": 80}]}],
        },
    }
    await kube.create(kinds.HTTP_ROUTES, hijack, tenant)
    own = {
        "metadata": {"name": "shop"},
        "spec": {
            "parentRefs": [{"name": "edge", "sectionName": "web"}],
            "rules": [{"backendRefs": [{"name": "shop", "port": 80}]}],
        },
    }
    await kube.create(kinds.HTTP_ROUTES, own, ns)

    async def reported() -> Obj | None:
        found = await get(kube, kinds.GATEWAYS, "edge", ns)
        return found if listener_conditions(found, "raw") and listener_conditions(found, "web") else None

    status = await eventually(reported)
    assert listener_conditions(status, "open") == {
        "Accepted": ("False", "HostnameConflict", MESSAGE),
        "Conflicted": ("True", "HostnameConflict", MESSAGE),
        "Programmed": ("False", "HostnameConflict", MESSAGE),
    }
    assert listener_conditions(status, "raw") == {
        "Accepted": ("False", "ProtocolConflict", MESSAGE),
        "Conflicted": ("True", "ProtocolConflict", MESSAGE),
        "Programmed": ("False", "ProtocolConflict", MESSAGE),
    }
    for winner in ("web", "other"):
        found = listener_conditions(status, winner)
        assert found["Conflicted"][:2] == ("False", "NoConflicts") and found["Accepted"][:2] == ("True", "Accepted")
    accepted = next(c for c in status["status"]["conditions"] if c["type"] == "Accepted")
    assert (accepted["status"], accepted["reason"]) == ("True", "ListenersNotValid")
    counts = {item["name"]: item["attachedRoutes"] for item in status["status"]["listeners"]}
    assert counts["open"] == 0  # the tenant's route names it, but a conflicted listener takes no route

    async def hijack_refused() -> Obj | None:
        obj = await kube.get(kinds.HTTP_ROUTES, "hijack", tenant)
        for parent in (obj.get("status") or {}).get("parents") or []:
            for c in parent.get("conditions") or ():
                if c.get("type") == "Accepted":
                    return dict(c)
        return None

    refused = await eventually(hijack_refused)
    assert (refused["status"], refused["reason"]) == ("False", "NotAllowedByListeners")

    key = f"{ns}/edge"
    async with subscribe(kube, plane, ns, "edge-istio", [key]) as owner:

        def served() -> GatewayConfig | None:
            config = owner.config(key)
            return config if config is not None and config.listeners and config.listeners[0].virtual_hosts else None

        config = await eventually(served)
        assert [item.name for item in config.listeners] == ["web", "other"]
        backends = {
            b.backend.hostname
            for item in config.listeners
            for vhost in item.virtual_hosts
            for rule in vhost.http
            for b in rule.backends
            if b.backend is not None
        }
        assert backends == {f"shop.{ns}.svc.cluster.local"}  # nothing of the tenant's

        # the owner removes the duplicate and the TCP listener: the conflicts clear
        await kube.patch(kinds.GATEWAYS, "edge", {"spec": {"listeners": [listeners[0], listeners[3]]}}, ns)

        async def cleared() -> Obj | None:
            found = await get(kube, kinds.GATEWAYS, "edge", ns)
            names = [item.get("name") for item in (found or {}).get("status", {}).get("listeners") or ()]
            return found if names == ["web", "other"] else None

        status = await eventually(cleared)
        accepted = next(c for c in status["status"]["conditions"] if c["type"] == "Accepted")
        assert (accepted["status"], accepted["reason"]) == ("True", "Accepted")
