"""Telemetry objects through a real API server and the real control plane (xDS on loopback, no webhook): the CRD
serves v1 and v1alpha1, the view watches them, upstream's TestCustomizeMetrics object reaches the waypoint's
WaypointConfig (field 7) for the Service it targets, an expression Ambit cannot evaluate is a Warning Event naming
the field, and deleting the object is pushed."""

from __future__ import annotations

import contextlib
import secrets
from typing import Any

import pytest
from tests.integration.controlplane_rig import Subscription, eventually
from tests.integration.controlplane_rig import subscribe as rig_subscribe

from ambit.controlplane.process import SKIPPED_REASON, ControlPlane
from ambit.k8s import KubeClient, kinds
from ambit.k8s.kinds import ResourceKind
from ambit.model.metric_overrides import IstioMetric
from ambit.model.routes import WaypointConfig
from ambit.xds.convert import ADDRESS_TYPE_URL
from ambit.xds.routes import WAYPOINT_CONFIG_TYPE_URL, decode_waypoint_config

Obj = dict[str, Any]
TELEMETRIES_V1ALPHA1 = ResourceKind("telemetry.istio.io", "v1alpha1", "telemetries", "Telemetry")


@pytest.fixture
def plane_options() -> dict[str, Any]:
    return {"deploy_waypoints": False}


def subscribe(
    kube: KubeClient, plane: ControlPlane, namespace: str, names: list[str]
) -> contextlib.AbstractAsyncContextManager[Subscription[WaypointConfig]]:
    configs = Subscription(WAYPOINT_CONFIG_TYPE_URL, decode_waypoint_config)
    return rig_subscribe(kube, plane, (namespace, "waypoint"), configs, names, also=[ADDRESS_TYPE_URL])


async def waypoint_namespace(kube: KubeClient) -> str:
    """A namespace bound to its ready waypoint "waypoint", with Services service-addressed-waypoint and other."""
    ns = f"tel-{secrets.token_hex(3)}"
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
    address = {"status": {"addresses": [{"type": "Hostname", "value": f"waypoint.{ns}.svc.cluster.local"}]}}
    await kube.patch_status(kinds.GATEWAYS, "waypoint", address, ns)
    for name in ("service-addressed-waypoint", "other"):
        service = {"metadata": {"name": name, "namespace": ns}, "spec": {"ports": [{"name": "http", "port": 80}]}}
        await kube.create(kinds.SERVICES, service, ns)
    await kube.create(kinds.SERVICE_ACCOUNTS, {"metadata": {"name": "waypoint", "namespace": ns}}, ns)
    return ns


def telemetry(name: str, value: str, api_version: str = "telemetry.istio.io/v1") -> Obj:
    return {
        "apiVersion": api_version,
        "kind": "Telemetry",
        "metadata": {"name": name},
        "spec": {
            "targetRefs": [{"kind": "Service", "group": "core", "name": "service-addressed-waypoint"}],
            "metrics": [
                {
                    "providers": [{"name": "prometheus"}],
                    "overrides": [
                        {
                            "match": {"metric": "REQUEST_COUNT"},
                            "tagOverrides": {
                                "custom_dimension": {"value": value},
                                "source_principal": {"operation": "REMOVE"},
                            },
                        }
                    ],
                }
            ],
        },
    }


async def test_upstreams_telemetry_reaches_the_waypoint_and_a_bad_expression_is_a_warning(
    kube: KubeClient, plane: ControlPlane
) -> None:
    ns = await waypoint_namespace(kube)
    name = f"{ns}/waypoint"
    await kube.create(kinds.TELEMETRIES, telemetry("ns-default", "'test'"), ns)
    # v1alpha1 is served too; this one's value is a CEL call Ambit does not evaluate
    bad = telemetry("uneval", "request.auth.claims['sub']", api_version="telemetry.istio.io/v1alpha1")
    await kube.create(TELEMETRIES_V1ALPHA1, bad, ns)
    key = f"{ns}/service-addressed-waypoint.{ns}.svc.cluster.local"
    async with subscribe(kube, plane, ns, [name]) as waypoint:

        def entries() -> list[tuple[str, list[tuple[str, str | None]]]]:
            config = waypoint.config(name)
            if config is None:
                return []
            return [
                (e.service_key, [(t.name, t.value and t.value.source) for o in e.overrides for t in o.tags])
                for e in config.metrics
            ]

        await eventually(lambda: entries() == [(key, [("custom_dimension", "'test'"), ("source_principal", None)])])
        config = waypoint.config(name)
        assert config is not None and config.metrics[0].overrides[0].metric is IstioMetric.REQUEST_COUNT

        async def warning() -> list[Obj]:
            events = (await kube.list(kinds.EVENTS, ns))[0]
            return [e for e in events if e.get("reason") == SKIPPED_REASON and e["regarding"].get("name") == "uneval"]

        [event] = await eventually(warning)
        assert event["type"] == "Warning"
        assert "tagOverrides.custom_dimension.value" in event["note"] and "unsupported expression" in event["note"]

        # Deleting the good one is pushed; the bad one's REMOVE still applies (only its bad tag was skipped).
        await kube.delete(kinds.TELEMETRIES, "ns-default", ns)
        await eventually(lambda: entries() == [(key, [("source_principal", None)])])
        await kube.delete(kinds.TELEMETRIES, "uneval", ns)
        await eventually(lambda: entries() == [])
