"""The injection templates (ConfigMap ``istio-sidecar-injector``) through the real control plane and API server, as
Istio's TestWaypointChanges edits them: the shipped ConfigMap changes nothing; editing its waypoint template rolls
the waypoint's Deployment; a broken or hostile template writes nothing and says why while the control plane goes
on serving; deleting the ConfigMap falls back to Ambit's own rendering.

A real API server (subprocess) and the real control plane (no webhook, no lab controllers).
"""

from __future__ import annotations

import contextlib
import time
from collections.abc import AsyncIterator
from pathlib import Path
from typing import Any

import pytest
import yaml
from tests.integration.controlplane_rig import eventually
from tests.integration.gateway_rig import condition, get, waypoint

from ambit.controlplane.process import ControlPlane
from ambit.k8s import KubeClient, KubeNotFoundError, kinds

Obj = dict[str, Any]
SHIPPED = Path(__file__).resolve().parents[2] / "deploy" / "base" / "istiod" / "injector-configmap.yaml"
NAME = "istio-sidecar-injector"
ANCHOR = "serviceAccountName: {{.ServiceAccount | quote}}"


@pytest.fixture
def plane_options() -> dict[str, Any]:
    return {"waypoint_xds_address": "198.18.0.1:15012", "waypoint_image_pull_policy": "Never"}


@pytest.fixture
async def injector(kube: KubeClient, plane: ControlPlane) -> AsyncIterator[Obj]:
    """The shipped ConfigMap, created in istio-system and deleted after the test."""
    created = await kube.create(kinds.CONFIG_MAPS, yaml.safe_load(SHIPPED.read_text()), "istio-system")
    try:
        yield created
    finally:
        with contextlib.suppress(KubeNotFoundError):
            await kube.delete(kinds.CONFIG_MAPS, NAME, "istio-system")


def with_waypoint_template(config_map: Obj, edit: Any) -> Obj:
    """``config_map``'s data with the waypoint template replaced by ``edit(template)``, as upstream edits it
    (parse ``config``, change ``templates.waypoint``, write it back)."""
    config = yaml.safe_load(config_map["data"]["config"])
    config["templates"]["waypoint"] = edit(config["templates"]["waypoint"])
    return {"data": {"config": yaml.safe_dump(config)}}


async def grace_period(kube: KubeClient, namespace: str, want: int) -> Obj | None:
    deployment = await get(kube, kinds.DEPLOYMENTS, "waypoint", namespace)
    spec = ((deployment or {}).get("spec") or {}).get("template", {}).get("spec", {})
    return deployment if spec.get("terminationGracePeriodSeconds") == want else None


async def invalid(kube: KubeClient, namespace: str, expected: str) -> Obj | None:
    found = condition(await get(kube, kinds.GATEWAYS, "waypoint", namespace), "Programmed")
    return found if found.get("reason") == "Invalid" and expected in found.get("message", "") else None


async def test_editing_the_waypoint_template_rolls_the_waypoint_and_deleting_it_falls_back(
    kube: KubeClient, plane: ControlPlane, namespace: str, injector: Obj
) -> None:
    await kube.create(kinds.GATEWAYS, waypoint("waypoint", namespace))
    before = await eventually(lambda: grace_period(kube, namespace, 30))
    labels = before["spec"]["template"]["metadata"]["labels"]
    assert labels["istio.io/dataplane-mode"] == "none"
    patch = with_waypoint_template(
        injector,
        lambda text: text.replace(
            ANCHOR, ANCHOR + "\n      nodeSelector: {disk: ssd}\n      terminationGracePeriodSeconds: 3"
        ),
    )
    await kube.patch(kinds.CONFIG_MAPS, NAME, patch, "istio-system")
    deployment = await eventually(lambda: grace_period(kube, namespace, 3))
    assert deployment["spec"]["template"]["spec"]["nodeSelector"] == {"disk": "ssd"}
    assert deployment["spec"]["template"]["spec"]["containers"][0]["command"] == ["ambit"]
    await kube.delete(kinds.CONFIG_MAPS, NAME, "istio-system")
    deployment = await eventually(lambda: grace_period(kube, namespace, 30))
    assert not deployment["spec"]["template"]["spec"].get("nodeSelector")


async def test_a_broken_or_hostile_template_writes_nothing_and_the_plane_goes_on(
    kube: KubeClient, plane: ControlPlane, namespace: str, injector: Obj
) -> None:
    """Attack: whoever can write the ConfigMap writes a template that loops a billion times, then one nested past
    the bound, then one that does not parse: each is refused with one line in the Gateway's status, what was
    deployed stays, and the controller still deploys other Gateways and follows a fixed template."""
    await kube.create(kinds.GATEWAYS, waypoint("waypoint", namespace))
    before = await eventually(lambda: grace_period(kube, namespace, 30))
    hostile = [
        ("{{ range $a := 1000000000 }}{{ range $b := 1000000000 }}x{{ end }}{{ end }}", "range over 1000000000"),
        ("{{ range .Ports }}" * 2000 + "{{ end }}" * 2000, "nested more than 64 levels deep"),
        ("{{ .Name ", "unclosed action"),
    ]
    for text, expected in hostile:
        started = time.monotonic()
        await kube.patch(kinds.CONFIG_MAPS, NAME, with_waypoint_template(injector, lambda _, t=text: t), "istio-system")
        found = await eventually(lambda e=expected: invalid(kube, namespace, e))
        assert found["message"].startswith(f"ConfigMap istio-system/{NAME} template 'waypoint': template: ")
        assert time.monotonic() - started < 30
    after = await kube.get(kinds.DEPLOYMENTS, "waypoint", namespace)
    assert after["metadata"]["resourceVersion"] == before["metadata"]["resourceVersion"]
    ingress = {
        "metadata": {"name": "edge", "namespace": namespace},
        "spec": {"gatewayClassName": "istio", "listeners": [{"name": "http", "port": 80, "protocol": "HTTP"}]},
    }
    await kube.create(kinds.GATEWAYS, ingress)
    await eventually(lambda: get(kube, kinds.DEPLOYMENTS, "edge-istio", namespace))
    patch = with_waypoint_template(
        injector, lambda text: text.replace(ANCHOR, ANCHOR + "\n      terminationGracePeriodSeconds: 7")
    )
    await kube.patch(kinds.CONFIG_MAPS, NAME, patch, "istio-system")
    await eventually(lambda: grace_period(kube, namespace, 7))
