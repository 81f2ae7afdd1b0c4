"""kube-scheduler's VolumeBinding plugin (pure): what a pod's claims say about where it may run, and what the
scheduler must do to its claims before it binds the pod.

Rules:

1. PreFilter, over the pod's ``persistentVolumeClaim`` volumes (:func:`pod_claims`), in order: a claim that does
   not exist is ``persistentvolumeclaim "<name>" not found``; one being deleted is
   ``persistentvolumeclaim "<name>" is being deleted``; one that is unbound and whose class is not
   WaitForFirstConsumer (or that names no class, or a class that does not exist) makes the pod wait with
   ``pod has unbound immediate PersistentVolumeClaims``. Each stops the pod on every node, with kube's message.
2. Filter, per node: a bound claim's volume must exist and its node affinity must admit the node, else
   ``node(s) had volume node affinity conflict``; an unbound WaitForFirstConsumer claim needs, on the node, an
   available static volume (:func:`volume_binding.best_volume`) or a class with a provisioner, else
   ``node(s) didn't find available persistent volumes to bind``. A claim with ``selected-node`` already set
   fits only that node (the provisioner may already be at work there), else the same affinity message.
3. Once a node is chosen (:func:`bindings`): each unbound WaitForFirstConsumer claim either gets the static
   volume the filter found pre-bound to it (the volume's ``claimRef``; the PV controller completes the binding)
   or the ``volume.kubernetes.io/selected-node`` annotation (the provisioner makes a volume there). The pod is
   bound only once every claim is Bound (:func:`all_bound`); until then the scheduler looks again.
"""

from __future__ import annotations

from collections.abc import Callable, Iterable, Mapping
from dataclasses import dataclass, field
from typing import Any

from ambit.lab.controllers.ownership import is_deleting, key_of, name_of
from ambit.lab.controllers.volume_binding import (
    SELECTED_NODE,
    WAIT_FOR_FIRST_CONSUMER,
    annotations_of,
    best_volume,
    class_of,
    node_admits,
    spec_of,
)

AFFINITY_CONFLICT = "node(s) had volume node affinity conflict"
NO_VOLUMES = "node(s) didn't find available persistent volumes to bind"
UNBOUND_IMMEDIATE = "pod has unbound immediate PersistentVolumeClaims"

Find = Callable[[str], Mapping[str, Any] | None]
"""A lookup by name (claims in the pod's namespace, volumes, classes)."""


def pod_claims(pod: Mapping[str, Any]) -> list[str]:
    """The claim names of the pod's ``persistentVolumeClaim`` volumes, in order, each once."""
    volumes = spec_of(pod).get("volumes")
    names: list[str] = []
    for volume in volumes if isinstance(volumes, list) else []:
        source = volume.get("persistentVolumeClaim") if isinstance(volume, Mapping) else None
        name = source.get("claimName") if isinstance(source, Mapping) else None
        if isinstance(name, str) and name and name not in names:
            names.append(name)
    return names


@dataclass(frozen=True, slots=True)
class VolumeView:
    """What the plugin reads: lookups of the pod's claims, volumes and classes, and all volumes."""

    claim: Find
    volume: Find
    storage_class: Find
    volumes: Iterable[Mapping[str, Any]]


def _is_late(claim: Mapping[str, Any], view: VolumeView) -> bool:
    name = class_of(claim)
    found = view.storage_class(name) if name else None
    return found is not None and found.get("volumeBindingMode") == WAIT_FOR_FIRST_CONSUMER


def prefilter(pod: Mapping[str, Any], view: VolumeView) -> str | None:
    """Rule 1: the message that stops the pod everywhere, or None."""
    for name in pod_claims(pod):
        claim = view.claim(name)
        if claim is None:
            return f'persistentvolumeclaim "{name}" not found'
        if is_deleting(claim):
            return f'persistentvolumeclaim "{name}" is being deleted'
    for name in pod_claims(pod):
        claim = view.claim(name)
        assert claim is not None
        if not spec_of(claim).get("volumeName") and not _is_late(claim, view):
            return UNBOUND_IMMEDIATE
    return None


@dataclass(slots=True)
class NodeFit:
    """Rule 2's answer for one node: ``reason`` (None: it fits) and rule 3's work if the pod goes there."""

    reason: str | None = None
    prebind: list[tuple[str, str]] = field(default_factory=list)
    """(claim, volume) pairs: the volume gets the claim as its ``claimRef``."""
    select: list[str] = field(default_factory=list)
    """Claims to annotate with the node as ``volume.kubernetes.io/selected-node``."""


def fit(pod: Mapping[str, Any], node: Mapping[str, Any], view: VolumeView) -> NodeFit:
    """Rule 2 (after :func:`prefilter` passed)."""
    out = NodeFit()
    taken: set[str] = set()
    for name in pod_claims(pod):
        claim = view.claim(name)
        if claim is None:
            return NodeFit(UNBOUND_IMMEDIATE)
        bound_to = spec_of(claim).get("volumeName")
        if bound_to:
            volume = view.volume(str(bound_to))
            if volume is None or not node_admits(volume, node):
                return NodeFit(AFFINITY_CONFLICT)
            continue
        selected = annotations_of(claim).get(SELECTED_NODE)
        if selected and selected != name_of(node):
            return NodeFit(AFFINITY_CONFLICT)
        candidates = [v for v in view.volumes if name_of(v) not in taken]
        static = best_volume(claim, candidates, node)
        if static is not None:
            taken.add(name_of(static))
            out.prebind.append((name, name_of(static)))
            continue
        storage_class = view.storage_class(class_of(claim)) if class_of(claim) else None
        if storage_class is None or not storage_class.get("provisioner"):
            return NodeFit(NO_VOLUMES)
        if not selected:
            out.select.append(name)
    return out


def all_bound(pod: Mapping[str, Any], view: VolumeView) -> bool:
    """Rule 3: every claim of the pod is Bound."""
    for name in pod_claims(pod):
        claim = view.claim(name)
        if claim is None or (claim.get("status") or {}).get("phase") != "Bound":
            return False
    return True


def claim_key(pod: Mapping[str, Any], name: str) -> tuple[str, str]:
    return (key_of(pod)[0], name)
