"""Which EndpointSlices a Service should have, as a minimal set of writes against the ones it has (pure).

Rules, as kube's EndpointSlice reconciler:

1. Endpoints are grouped by port list (:mod:`endpoints`); each group gets its own slices, at most
   ``max_per_slice`` endpoints each. A Service with no endpoints keeps one empty *placeholder* slice (no ports).
2. An endpoint stays in the slice that already holds it (matched by the pod's uid); new endpoints fill existing
   slices of their group before new slices are made. A slice left empty is deleted.
3. A slice is written only when its content (endpoints, ports, labels, owner, address type) differs from what
   it should be; endpoints and ports are kept in a canonical order so that equal content compares equal.
4. When a plan both deletes and creates slices, the deletions are turned into updates of those slices instead,
   so the Service's slices churn as little as possible.
5. Each address family of the Service has its own slices (``addressType`` IPv4 or IPv6, as kube's reconciler
   runs once per family, each with its own placeholder); rules 1 to 4 hold within a family (a slice's address
   type is immutable, so a slice never turns into the other family's); slices of a family the Service no longer
   has are deleted.

Slices carry the labels ``kubernetes.io/service-name`` and ``endpointslice.kubernetes.io/managed-by:
endpointslice-controller.k8s.io`` (plus the Service's own labels, and ``service.kubernetes.io/headless`` for a
headless Service), a controller reference to the Service, its ``addressType``, and the name
``<service>-<random>`` from ``generateName``.
"""

from __future__ import annotations

import copy
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any

from ambit.lab.controllers.endpoints import PodEndpoint, PortKey, port_key
from ambit.lab.controllers.ownership import Object, key_of, name_of, owner_reference
from ambit.lab.controllers.selectors import labels_of

SERVICE_NAME = "kubernetes.io/service-name"
MANAGED_BY = "endpointslice.kubernetes.io/managed-by"
CONTROLLER = "endpointslice-controller.k8s.io"
HEADLESS = "service.kubernetes.io/headless"


@dataclass(slots=True)
class SlicePlan:
    create: list[Object] = field(default_factory=list)
    update: list[Object] = field(default_factory=list)
    """Whole slices, with the name and ``resourceVersion`` of the slice they replace."""
    delete: list[Object] = field(default_factory=list)

    def __bool__(self) -> bool:
        return bool(self.create or self.update or self.delete)


def slice_labels(service: Mapping[str, Any]) -> dict[str, str]:
    labels = {k: v for k, v in labels_of(service).items() if k not in (SERVICE_NAME, MANAGED_BY, HEADLESS)}
    labels[SERVICE_NAME] = name_of(service)
    labels[MANAGED_BY] = CONTROLLER
    if (service.get("spec") or {}).get("clusterIP") == "None":
        labels[HEADLESS] = ""
    return labels


def _endpoint_id(endpoint: Mapping[str, Any]) -> str:
    ref = endpoint.get("targetRef") or {}
    if ref.get("uid"):
        return f"uid:{ref['uid']}"
    addresses = endpoint.get("addresses") or [""]
    return f"ip:{addresses[0]}"


def _endpoint_order(endpoint: Mapping[str, Any]) -> tuple[str, str]:
    ref = endpoint.get("targetRef") or {}
    return (str(ref.get("name") or ""), str((endpoint.get("addresses") or [""])[0]))


def _ports_body(key: PortKey) -> list[dict[str, Any]]:
    ports = []
    for name, number, protocol, app_protocol in key:
        port: dict[str, Any] = {"name": name, "port": number, "protocol": protocol}
        if app_protocol:
            port["appProtocol"] = app_protocol
        ports.append(port)
    return ports


def slice_body(
    service: Object, key: PortKey, endpoints: Sequence[Mapping[str, Any]], address_type: str = "IPv4"
) -> Object:
    return {
        "apiVersion": "discovery.k8s.io/v1",
        "kind": "EndpointSlice",
        "metadata": {
            "generateName": f"{name_of(service)}-",
            "namespace": key_of(service)[0],
            "labels": slice_labels(service),
            "ownerReferences": [owner_reference(service)],
        },
        "addressType": address_type,
        "endpoints": sorted((copy.deepcopy(dict(e)) for e in endpoints), key=_endpoint_order),
        "ports": _ports_body(key),
    }


def _differs(current: Mapping[str, Any], want: Mapping[str, Any]) -> bool:
    meta, want_meta = current.get("metadata") or {}, want["metadata"]
    return bool(
        labels_of(current) != want_meta["labels"]
        or (meta.get("ownerReferences") or []) != want_meta["ownerReferences"]
        or current.get("addressType") != want["addressType"]
        or (current.get("ports") or []) != want["ports"]
        or sorted(current.get("endpoints") or [], key=_endpoint_order) != want["endpoints"]
    )


def _as_update(current: Mapping[str, Any], want: Object) -> Object:
    body = copy.deepcopy(want)
    meta = body["metadata"]
    meta.pop("generateName")
    current_meta = current.get("metadata") or {}
    meta["name"] = current_meta.get("name")
    meta["resourceVersion"] = current_meta.get("resourceVersion")
    if current_meta.get("annotations"):
        meta["annotations"] = current_meta["annotations"]
    return body


def plan_family_slices(
    service: Object, endpoints: Mapping[str, Sequence[PodEndpoint]], existing: Sequence[Object], max_per_slice: int
) -> SlicePlan:
    """Rule 5: the writes for every family in ``endpoints`` (address type → its endpoints)."""
    plan = SlicePlan()
    for address_type, members in endpoints.items():
        mine = [s for s in existing if s.get("addressType") == address_type]
        part = plan_slices(service, members, mine, max_per_slice, address_type)
        plan.create += part.create
        plan.update += part.update
        plan.delete += part.delete
    plan.delete += [s for s in existing if s.get("addressType") not in endpoints]
    return plan


def plan_slices(
    service: Object,
    endpoints: Sequence[PodEndpoint],
    existing: Sequence[Object],
    max_per_slice: int,
    address_type: str = "IPv4",
) -> SlicePlan:
    """The writes that turn ``existing`` (the Service's managed slices) into what ``endpoints`` need, for one
    address type."""
    plan = SlicePlan()
    groups: dict[PortKey, list[PodEndpoint]] = {}
    for pe in endpoints:
        groups.setdefault(pe.ports_key, []).append(pe)
    if not groups:
        groups[()] = []  # the placeholder
    by_key: dict[PortKey, list[Object]] = {}
    for current in sorted(existing, key=name_of):
        if current.get("addressType") != address_type:
            plan.delete.append(current)
        else:
            by_key.setdefault(port_key(current.get("ports") or []), []).append(current)
    for key, members in groups.items():
        remaining = {_endpoint_id(pe.endpoint): pe.endpoint for pe in members}
        buckets: list[tuple[Object | None, list[dict[str, Any]]]] = []
        for held_by in by_key.pop(key, []):
            kept = []
            for endpoint in held_by.get("endpoints") or ():
                wanted = remaining.pop(_endpoint_id(endpoint), None) if isinstance(endpoint, dict) else None
                if wanted is not None:
                    kept.append(wanted)
            buckets.append((held_by, kept))
        for endpoint in remaining.values():
            room = next((b for b in buckets if len(b[1]) < max_per_slice), None)
            if room is None:
                room = (None, [])
                buckets.append(room)
            room[1].append(endpoint)
        placeholder_kept = False
        for slice_obj, held in buckets:
            if not held and (members or placeholder_kept):
                if slice_obj is not None:
                    plan.delete.append(slice_obj)
                continue
            placeholder_kept = placeholder_kept or not members
            want = slice_body(service, key, held, address_type)
            if slice_obj is None:
                plan.create.append(want)
            elif _differs(slice_obj, want):
                plan.update.append(_as_update(slice_obj, want))
        if not buckets:
            plan.create.append(slice_body(service, key, [], address_type))
    for leftovers in by_key.values():
        plan.delete.extend(leftovers)
    while plan.create and plan.delete:
        plan.update.append(_as_update(plan.delete.pop(), plan.create.pop()))
    return plan
