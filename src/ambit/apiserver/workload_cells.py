"""The cells kube-apiserver prints for apps/v1 workloads in ``kubectl get`` (pure; the columns are in
:data:`ambit.apiserver.printers.PRINTERS`; Jobs and CronJobs are in :mod:`ambit.apiserver.batch_cells`).

Deployments, ReplicaSets and DaemonSets print their replica counts, then the wide CONTAINERS, IMAGES (of the pod
template) and SELECTOR; StatefulSets READY and the wide CONTAINERS and IMAGES; ControllerRevisions their
controller (``kind.group/name``) and revision.

Invariants (those of :mod:`ambit.apiserver.printers`): a cell function never raises on any JSON-shaped object, and
time comes in as ``now``.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

from ambit.apiserver.cells import (
    Cell,
    age,
    as_int,
    as_map,
    as_maps,
    as_str,
    format_label_selector,
    format_labels,
    name_of,
)


def containers_and_images(template: Any) -> tuple[str, str]:
    """The names and the images of a pod template's containers, comma-separated (the wide columns)."""
    containers = as_maps(as_map(as_map(template).get("spec")).get("containers"))
    names = ",".join(as_str(c.get("name")) for c in containers)
    images = ",".join(as_str(c.get("image")) for c in containers)
    return names, images


def deployment_cells(d: Mapping[str, Any], now: float) -> list[Cell]:
    spec, status = as_map(d.get("spec")), as_map(d.get("status"))
    names, images = containers_and_images(spec.get("template"))
    return [
        name_of(d),
        f"{as_int(status.get('readyReplicas'))}/{as_int(spec.get('replicas'), 1)}",
        as_int(status.get("updatedReplicas")),
        as_int(status.get("availableReplicas")),
        age(d, now),
        names,
        images,
        format_label_selector(spec.get("selector")),
    ]


def replica_set_cells(rs: Mapping[str, Any], now: float) -> list[Cell]:
    spec, status = as_map(rs.get("spec")), as_map(rs.get("status"))
    names, images = containers_and_images(spec.get("template"))
    return [
        name_of(rs),
        as_int(spec.get("replicas"), 1),
        as_int(status.get("replicas")),
        as_int(status.get("readyReplicas")),
        age(rs, now),
        names,
        images,
        format_label_selector(spec.get("selector")),
    ]


def daemon_set_cells(ds: Mapping[str, Any], now: float) -> list[Cell]:
    spec, status = as_map(ds.get("spec")), as_map(ds.get("status"))
    template = as_map(spec.get("template"))
    names, images = containers_and_images(template)
    return [
        name_of(ds),
        as_int(status.get("desiredNumberScheduled")),
        as_int(status.get("currentNumberScheduled")),
        as_int(status.get("numberReady")),
        as_int(status.get("updatedNumberScheduled")),
        as_int(status.get("numberAvailable")),
        format_labels(as_map(template.get("spec")).get("nodeSelector")),
        age(ds, now),
        names,
        images,
        format_label_selector(spec.get("selector")),
    ]


def stateful_set_cells(ss: Mapping[str, Any], now: float) -> list[Cell]:
    spec, status = as_map(ss.get("spec")), as_map(ss.get("status"))
    names, images = containers_and_images(spec.get("template"))
    ready = f"{as_int(status.get('readyReplicas'))}/{as_int(spec.get('replicas'), 1)}"
    return [name_of(ss), ready, age(ss, now), names, images]


def controller_revision_cells(rev: Mapping[str, Any], now: float) -> list[Cell]:
    controller = "<none>"
    for ref in as_maps(as_map(rev.get("metadata")).get("ownerReferences")):
        if ref.get("controller") is True:
            group = as_str(ref.get("apiVersion")).rpartition("/")[0]
            kind = as_str(ref.get("kind")).lower()
            controller = f"{kind}.{group}/{as_str(ref.get('name'))}" if group else f"{kind}/{as_str(ref.get('name'))}"
            break
    return [name_of(rev), controller, as_int(rev.get("revision")), age(rev, now)]


# ---- scheduling.k8s.io/v1, policy/v1 ---------------------------------------------------------------------
