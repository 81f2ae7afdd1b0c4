"""The mesh config through the real control plane and API server (Istio's TestServiceEntryVisibility, control plane
side): the ``istio`` ConfigMap's ``mesh`` key in istio-system is followed live; its ``serviceEntryVisibility``
decides what each ServiceEntry's Service is sent with over xDS and the ``istio.io/VisibilityApplied`` condition on
the entry; a bad edit keeps the previous config and gets a Warning Event on the ConfigMap; a removal clears it all.
"""

from __future__ import annotations

import contextlib
import functools
import ipaddress
import secrets
from collections.abc import AsyncIterator
from typing import Any

import pytest
from tests.integration.controlplane_rig import eventually

from ambit.api import workload_pb2 as pb
from ambit.controlplane.process import SKIPPED_REASON, ControlPlane
from ambit.k8s import KubeAlreadyExistsError, KubeClient, KubeNotFoundError, kinds

Obj = dict[str, Any]
SHADOW = "visibility-shadow.internal"
LOCAL_ONLY = "visibility-local-only.internal"
UPSTREAM_PATCH = """serviceEntryVisibility:
  applyToSidecars: true
  defaultVisibility: NAMESPACE
  policies:
  - visibility: PUBLIC
    matchingRules:
    - namespaceSelector:
        matchLabels:
          se-visibility: public
"""
APPLIED = "istio.io/VisibilityApplied"


def service_entry(name: str, host: str, app: str) -> Obj:
    """The entry as the upstream test writes it."""
    return {
        "apiVersion": "networking.istio.io/v1",
        "kind": "ServiceEntry",
        "metadata": {"name": name},
        "spec": {
            "hosts": [host],
            "ports": [{"name": "http", "number": 80, "protocol": "HTTP", "targetPort": 8080}],
            "location": "MESH_INTERNAL",
            "resolution": "STATIC",
            "workloadSelector": {"labels": {"app": app}},
        },
    }


@pytest.fixture
async def namespaces(kube: KubeClient) -> AsyncIterator[tuple[str, str]]:
    """A namespace-local one and one labelled ``se-visibility: public``, both ambient, deleted after the test."""
    suffix = secrets.token_hex(3)
    local, public = f"vis-local-{suffix}", f"vis-public-{suffix}"
    ambient = {"istio.io/dataplane-mode": "ambient"}
    await kube.create(kinds.NAMESPACES, {"metadata": {"name": local, "labels": ambient}})
    await kube.create(
        kinds.NAMESPACES, {"metadata": {"name": public, "labels": {**ambient, "se-visibility": "public"}}}
    )
    try:
        yield local, public
    finally:
        for name in (local, public):
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


def served(plane: ControlPlane, key: str) -> pb.Service | None:
    """Service ``key`` as the control plane serves it over xDS."""
    resource = plane.table.current.by_name.get(key)
    if resource is None:
        return None
    address = pb.Address()
    resource.body.Unpack(address)
    return address.service


def visibility(plane: ControlPlane, key: str) -> int | None:
    service = served(plane, key)
    return None if service is None else service.visibility


async def condition(kube: KubeClient, namespace: str, name: str) -> Obj | None:
    entry = await kube.get(kinds.SERVICE_ENTRIES, name, namespace)
    return next((c for c in (entry.get("status") or {}).get("conditions") or () if c.get("type") == APPLIED), None)


async def no_condition(kube: KubeClient, namespace: str, name: str) -> bool:
    return await condition(kube, namespace, name) is None


def all_served(plane: ControlPlane, keys: tuple[str, ...]) -> bool:
    """Every Service of ``keys`` is served, with its allocated addresses."""
    return all((service := served(plane, key)) is not None and bool(service.addresses) for key in keys)


async def test_the_upstream_mesh_patch_scopes_entries_and_the_public_one_is_canonical(
    kube: KubeClient, plane: ControlPlane, namespaces: tuple[str, str], mesh: Any
) -> None:
    local, public = namespaces
    await mesh(UPSTREAM_PATCH)
    # The namespace-local entry first, so it is the older one.
    await kube.create(kinds.SERVICE_ENTRIES, service_entry("shadow-local", SHADOW, "shadowlocal"), local)
    await kube.create(kinds.SERVICE_ENTRIES, service_entry("shadow-public", SHADOW, "shadowpublic"), public)
    await kube.create(kinds.SERVICE_ENTRIES, service_entry("local-only", LOCAL_ONLY, "shadowlocal"), local)

    keys = (f"{local}/{SHADOW}", f"{public}/{SHADOW}", f"{local}/{LOCAL_ONLY}")
    await eventually(lambda: all_served(plane, keys))
    assert [visibility(plane, k) for k in keys] == [pb.Service.NAMESPACE, pb.Service.PUBLIC, pb.Service.NAMESPACE]
    shadow_local, shadow_public = served(plane, keys[0]), served(plane, keys[1])
    assert shadow_public is not None and shadow_public.canonical
    assert shadow_local is not None and not shadow_local.canonical
    assert {str(ipaddress.ip_address(a.address)) for a in shadow_local.addresses}.isdisjoint(
        str(ipaddress.ip_address(a.address)) for a in shadow_public.addresses
    )

    got = await eventually(lambda: condition(kube, local, "shadow-local"))
    assert (got["status"], got["reason"], got["observedGeneration"]) == ("True", "Namespace", 1)
    assert got["message"] == (
        "ServiceEntry is visible only within its own namespace (NAMESPACE), per mesh serviceEntryVisibility."
    )
    got = await eventually(lambda: condition(kube, public, "shadow-public"))
    assert (got["status"], got["reason"], got["message"]) == (
        "True",
        "Public",
        "ServiceEntry is visible to the entire mesh (PUBLIC).",
    )

    # A bad edit: the previous config stays in force, and the ConfigMap gets a Warning Event naming the field.
    await mesh("serviceEntryVisibility:\n  defaultVisibility: SECRET\n")

    async def warning() -> Obj | None:
        events = (await kube.list(kinds.EVENTS, "istio-system"))[0]
        return next(
            (e for e in events if e.get("reason") == SKIPPED_REASON and e["regarding"].get("name") == "istio"), None
        )

    event = await eventually(warning)
    assert event["type"] == "Warning" and "data.mesh" in event["note"] and "'SECRET'" in event["note"]
    assert "previous mesh config stays in force" in event["note"]
    assert visibility(plane, keys[0]) == pb.Service.NAMESPACE

    # Removing serviceEntryVisibility (live, no restart): every entry is public again and loses the condition.
    await mesh("defaultServiceExportTo: ['*']\n")
    await eventually(lambda: all(visibility(plane, k) == pb.Service.PUBLIC for k in keys))
    again = served(plane, keys[0])
    assert again is not None and again.canonical  # the older entry is canonical again
    for ns, name in ((local, "shadow-local"), (public, "shadow-public"), (local, "local-only")):
        await eventually(functools.partial(no_condition, kube, ns, name))


async def test_a_mesh_config_in_another_namespace_is_not_read(
    kube: KubeClient, plane: ControlPlane, namespaces: tuple[str, str]
) -> None:
    local, _public = namespaces
    body = {"metadata": {"name": "istio", "namespace": local}, "data": {"mesh": UPSTREAM_PATCH}}
    await kube.create(kinds.CONFIG_MAPS, body, local)
    await kube.create(kinds.SERVICE_ENTRIES, service_entry("shadow-local", SHADOW, "shadowlocal"), local)
    key = f"{local}/{SHADOW}"
    await eventually(lambda: served(plane, key) is not None)
    assert visibility(plane, key) == pb.Service.PUBLIC
    await plane.service_entry_status.write_once()
    assert await condition(kube, local, "shadow-local") is None
