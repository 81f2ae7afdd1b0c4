"""Overlays on waypoint Deployments through the real control plane and API server (istiod's class defaults
ConfigMap and ``spec.infrastructure.parametersRef``): a change to either ConfigMap re-renders the Gateway's objects;
an unusable ``parametersRef`` sets ``Accepted`` False/``InvalidParameters`` and a broken overlay ``Programmed``
False/``Invalid``, and neither writes anything.

A real API server (subprocess) and the real control plane (no webhook, no lab controllers).
"""

from __future__ import annotations

import contextlib
from collections.abc import AsyncIterator
from typing import Any

import pytest
from tests.integration.controlplane_rig import eventually
from tests.integration.gateway_rig import condition, get, waypoint

from ambit.controlplane.process import ControlPlane
from ambit.k8s import KubeClient, KubeNotFoundError, kinds

Obj = dict[str, Any]
GRACE = "spec: {template: {spec: {terminationGracePeriodSeconds: %d}}}"


@pytest.fixture
def plane_options() -> dict[str, Any]:
    return {"waypoint_xds_address": "198.18.0.1:15012", "waypoint_image_pull_policy": "Never"}


@pytest.fixture
async def class_defaults(kube: KubeClient, plane: ControlPlane) -> AsyncIterator[str]:
    """The name of the waypoint class defaults ConfigMap in istio-system, deleted after the test."""
    name = "waypoint-class-defaults"
    try:
        yield name
    finally:
        with contextlib.suppress(KubeNotFoundError):
            await kube.delete(kinds.CONFIG_MAPS, name, "istio-system")


def config_map(name: str, namespace: str, labels: dict[str, str] | None = None, **data: str) -> Obj:
    return {"metadata": {"name": name, "namespace": namespace, "labels": labels or {}}, "data": data}


async def grace_period(kube: KubeClient, name: str, namespace: str, want: int) -> Obj | None:
    deployment = await get(kube, kinds.DEPLOYMENTS, name, namespace)
    spec = ((deployment or {}).get("spec") or {}).get("template", {}).get("spec", {})
    return deployment if spec.get("terminationGracePeriodSeconds") == want else None


async def accepted(kube: KubeClient, name: str, namespace: str, status: str, reason: str) -> Obj | None:
    gateway = await get(kube, kinds.GATEWAYS, name, namespace)
    found = condition(gateway, "Accepted")
    return gateway if (found.get("status"), found.get("reason")) == (status, reason) else None


async def test_the_class_defaults_config_map_re_renders_every_waypoint_of_its_class(
    kube: KubeClient, plane: ControlPlane, namespace: str, class_defaults: str
) -> None:
    await kube.create(kinds.GATEWAYS, waypoint("waypoint", namespace))
    await eventually(lambda: grace_period(kube, "waypoint", namespace, 30))
    other_class = config_map(
        "ingress-defaults", "istio-system", {"gateway.istio.io/defaults-for-class": "istio"}, deployment=GRACE % 9
    )
    await kube.create(kinds.CONFIG_MAPS, other_class)
    try:
        labels = {"gateway.istio.io/defaults-for-class": "istio-waypoint"}
        overlay = "spec: {template: {spec: {terminationGracePeriodSeconds: 3, nodeSelector: {disk: ssd}}}}"
        await kube.create(kinds.CONFIG_MAPS, config_map(class_defaults, "istio-system", labels, deployment=overlay))
        deployment = await eventually(lambda: grace_period(kube, "waypoint", namespace, 3))
        assert deployment["spec"]["template"]["spec"]["nodeSelector"] == {"disk": "ssd"}
        await kube.patch(kinds.CONFIG_MAPS, class_defaults, {"data": {"deployment": GRACE % 5}}, "istio-system")
        deployment = await eventually(lambda: grace_period(kube, "waypoint", namespace, 5))
        assert not deployment["spec"]["template"]["spec"].get("nodeSelector"), "what the overlay no longer sets goes"
        await kube.delete(kinds.CONFIG_MAPS, class_defaults, "istio-system")
        deployment = await eventually(lambda: grace_period(kube, "waypoint", namespace, 30))
        assert deployment["metadata"]["labels"]["gateway.istio.io/managed"] == "istio.io-mesh-controller"
    finally:
        await kube.delete(kinds.CONFIG_MAPS, "ingress-defaults", "istio-system")


async def test_a_parameters_ref_config_map_overlays_the_gateway_s_objects_and_its_changes_are_rolled_out(
    kube: KubeClient, plane: ControlPlane, namespace: str
) -> None:
    gateway = waypoint("waypoint", namespace)
    gateway["spec"]["infrastructure"] = {"parametersRef": {"group": "", "kind": "ConfigMap", "name": "params"}}
    await kube.create(kinds.GATEWAYS, gateway)
    found = await eventually(lambda: accepted(kube, "waypoint", namespace, "False", "InvalidParameters"))
    assert condition(found, "Accepted")["message"] == f"parametersRef ConfigMap {namespace}/params does not exist"
    assert await get(kube, kinds.DEPLOYMENTS, "waypoint", namespace) is None
    params = config_map("params", namespace, deployment=GRACE % 4, podDisruptionBudget="spec: {minAvailable: 1}")
    await kube.create(kinds.CONFIG_MAPS, params)
    await eventually(lambda: accepted(kube, "waypoint", namespace, "True", "Accepted"))
    await eventually(lambda: grace_period(kube, "waypoint", namespace, 4))
    budget = await eventually(lambda: get(kube, kinds.POD_DISRUPTION_BUDGETS, "waypoint", namespace))
    assert budget["spec"]["minAvailable"] == 1
    assert budget["metadata"]["ownerReferences"][0]["name"] == "waypoint"
    await kube.patch(kinds.CONFIG_MAPS, "params", {"data": {"deployment": GRACE % 6}}, namespace)
    await eventually(lambda: grace_period(kube, "waypoint", namespace, 6))


async def test_a_parameters_ref_of_another_kind_is_not_accepted(
    kube: KubeClient, plane: ControlPlane, namespace: str
) -> None:
    gateway = waypoint("waypoint", namespace)
    ref = {"group": "invalid.io", "kind": "InvalidParameters", "name": "invalid"}
    gateway["spec"]["infrastructure"] = {"parametersRef": ref}
    await kube.create(kinds.GATEWAYS, gateway)
    found = await eventually(lambda: accepted(kube, "waypoint", namespace, "False", "InvalidParameters"))
    message = "Unsupported parametersRef group/kind invalid.io/InvalidParameters, only ConfigMap is supported"
    assert condition(found, "Accepted")["message"] == message


async def test_a_broken_overlay_writes_nothing_and_says_why(
    kube: KubeClient, plane: ControlPlane, namespace: str
) -> None:
    """Attack: an overlay that would move the Deployment into another namespace, then one with a key that is not
    supported: the Gateway says why, and what was deployed stays as it was."""
    params = config_map("params", namespace, deployment=GRACE % 4)
    await kube.create(kinds.CONFIG_MAPS, params)
    gateway = waypoint("waypoint", namespace)
    gateway["spec"]["infrastructure"] = {"parametersRef": {"group": "", "kind": "ConfigMap", "name": "params"}}
    await kube.create(kinds.GATEWAYS, gateway)
    before = await eventually(lambda: grace_period(kube, "waypoint", namespace, 4))
    hostile = {"deployment": "metadata: {namespace: istio-system}\n" + GRACE % 1}
    await kube.patch(kinds.CONFIG_MAPS, "params", {"data": hostile}, namespace)

    async def invalid(expected: str) -> Obj | None:
        found = condition(await get(kube, kinds.GATEWAYS, "waypoint", namespace), "Programmed")
        return found if found.get("reason") == "Invalid" and expected in found.get("message", "") else None

    found = await eventually(lambda: invalid("changes the Deployment's identity"))
    assert found["message"].startswith(f"ConfigMap {namespace}/params key 'deployment': "), found
    await kube.patch(kinds.CONFIG_MAPS, "params", {"data": {"deployment": GRACE % 4, "daemonSet": "{}"}}, namespace)
    await eventually(lambda: invalid("unsupported key 'daemonSet'"))
    after = await kube.get(kinds.DEPLOYMENTS, "waypoint", namespace)
    assert after["metadata"]["resourceVersion"] == before["metadata"]["resourceVersion"]
    assert await get(kube, kinds.DEPLOYMENTS, "waypoint", "istio-system") is None
