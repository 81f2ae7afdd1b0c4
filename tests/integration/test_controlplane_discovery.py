"""``discoverySelectors`` through the real control plane and API server: the upstream ambient tests' selector written
into the ``istio`` ConfigMap, then a namespace labelled ``istio.io/test-exclude-namespace`` leaves the workload API
(its Service and its pod's workload removed over xDS) and comes back when the label is removed, live, with no
restart; a namespace that stays included is never touched.
"""

from __future__ import annotations

import contextlib
import secrets
from collections.abc import AsyncIterator
from typing import Any

import pytest
from tests.integration.controlplane_rig import eventually, make_pod

from ambit.controlplane.process import ControlPlane
from ambit.k8s import KubeAlreadyExistsError, KubeClient, KubeNotFoundError, kinds

EXCLUDE = "istio.io/test-exclude-namespace"
UPSTREAM = f"""discoverySelectors:
- matchExpressions:
  - key: {EXCLUDE}
    operator: DoesNotExist
"""


@pytest.fixture
async def two_namespaces(kube: KubeClient) -> AsyncIterator[tuple[str, str]]:
    """``apps`` and ``external`` (upstream's names, made unique), both ambient, deleted after the test."""
    suffix = secrets.token_hex(3)
    names = (f"apps-{suffix}", f"external-{suffix}")
    for name in names:
        await kube.create(
            kinds.NAMESPACES, {"metadata": {"name": name, "labels": {"istio.io/dataplane-mode": "ambient"}}}
        )
    try:
        yield names
    finally:
        for name in names:
            with contextlib.suppress(KubeNotFoundError):
                await kube.delete(kinds.NAMESPACES, name)


@pytest.fixture
async def mesh(kube: KubeClient) -> AsyncIterator[Any]:
    """Writes the ``istio`` ConfigMap's ``mesh`` (creating it); deleted after the test."""

    async def write(text: str) -> None:
        body = {"metadata": {"name": "istio", "namespace": "istio-system"}, "data": {"mesh": text}}
        try:
            await kube.create(kinds.CONFIG_MAPS, body, "istio-system")
        except KubeAlreadyExistsError:
            await kube.patch(kinds.CONFIG_MAPS, "istio", {"data": {"mesh": text}}, "istio-system")

    try:
        yield write
    finally:
        with contextlib.suppress(KubeNotFoundError):
            await kube.delete(kinds.CONFIG_MAPS, "istio", "istio-system")


def service(name: str) -> dict[str, Any]:
    return {
        "metadata": {"name": name},
        "spec": {"selector": {"app": name}, "ports": [{"name": "http", "port": 80, "targetPort": 8080}]},
    }


def served(plane: ControlPlane, *names: str) -> bool:
    """Whether every one of ``names`` is a resource the control plane serves over xDS now."""
    held = plane.table.current.by_name
    return all(name in held for name in names)


def gone(plane: ControlPlane, *names: str) -> bool:
    held = plane.table.current.by_name
    return not any(name in held for name in names)


async def test_a_namespace_labelled_out_leaves_the_workload_api_and_comes_back_live(
    kube: KubeClient, plane: ControlPlane, two_namespaces: tuple[str, str], mesh: Any
) -> None:
    apps, external = two_namespaces
    await mesh(UPSTREAM)
    await kube.create(kinds.SERVICES, service("server"), apps)
    await kube.create(kinds.SERVICES, service("external"), external)
    await make_pod(kube, apps, "server-0", "198.18.91.10", {"app": "server"})
    await make_pod(kube, external, "external-0", "198.18.91.20", {"app": "external"})
    included = (f"{apps}/server.{apps}.svc.cluster.local", f"Kubernetes//Pod/{apps}/server-0")
    excluded = (f"{external}/external.{external}.svc.cluster.local", f"Kubernetes//Pod/{external}/external-0")
    await eventually(lambda: served(plane, *included, *excluded))

    await kube.patch(kinds.NAMESPACES, external, {"metadata": {"labels": {EXCLUDE: "true"}}})
    await eventually(lambda: gone(plane, *excluded))
    assert served(plane, *included)

    await kube.patch(kinds.NAMESPACES, external, {"metadata": {"labels": {EXCLUDE: None}}})
    await eventually(lambda: served(plane, *excluded))
    assert served(plane, *included)

    # Clearing the selectors in the ConfigMap (live too): a labelled namespace is discovered again.
    await kube.patch(kinds.NAMESPACES, external, {"metadata": {"labels": {EXCLUDE: "true"}}})
    await eventually(lambda: gone(plane, *excluded))
    await mesh("discoverySelectors: []\n")
    await eventually(lambda: served(plane, *included, *excluded))
