"""Rancher's local-path provisioner, as kind installs it, decided without I/O: which claims get a volume, where the
volume's directory lives, and what PersistentVolume describes it. :mod:`provisioner` carries it out.

Rules:

1. The lab's default StorageClass is kind's: ``standard``, annotated as the default, provisioner
   ``rancher.io/local-path``, ``volumeBindingMode: WaitForFirstConsumer``, ``reclaimPolicy: Delete``
   (:func:`default_storage_class`).
2. A claim is provisioned (:func:`provisioning`) when it is not being deleted, names no volume, its class exists and
   names :data:`PROVISIONER`, and it has a node to put the volume on: with WaitForFirstConsumer the one the
   scheduler wrote in ``volume.kubernetes.io/selected-node``; with Immediate a claim has no node and the answer is
   kube's local-path error (the provisioner needs a node). A node that does not exist is an error too.
3. The volume's directory is ``/var/local-path-provisioner/pvc-<uid>_<namespace>_<name>`` in the node's own
   filesystem (the node's private tree: :class:`ambit.lab.network.topology.HostPathLayout`); the volume is named
   ``pvc-<claim uid>``, as kube names provisioned volumes.
4. The volume (:func:`provisioned_volume`): the claim's request as its capacity, the claim's access modes and
   volume mode, a ``hostPath`` (``DirectoryOrCreate``) to the directory, a required node affinity on the node's
   ``kubernetes.io/hostname``, the class's reclaim policy, pre-bound to the claim (``claimRef`` with its uid), and
   annotated ``pv.kubernetes.io/provisioned-by: rancher.io/local-path``.
5. A volume is reclaimed (:func:`reclaimable`) when it was provisioned here, its policy is Delete, and its phase
   is Released: the directory goes, then the volume.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

from ambit.lab.controllers.ownership import is_deleting, key_of
from ambit.lab.controllers.volume_binding import (
    PROVISIONED_BY,
    SELECTED_NODE,
    WAIT_FOR_FIRST_CONSUMER,
    access_modes,
    annotations_of,
    claim_ref_for,
    spec_of,
    uid_of,
    volume_mode,
)

PROVISIONER = "rancher.io/local-path"
DEFAULT_CLASS = "standard"
BASE_PATH = "/var/local-path-provisioner"
HOSTNAME_LABEL = "kubernetes.io/hostname"


def default_storage_class() -> dict[str, Any]:
    """Rule 1."""
    return {
        "apiVersion": "storage.k8s.io/v1",
        "kind": "StorageClass",
        "metadata": {
            "name": DEFAULT_CLASS,
            "annotations": {"storageclass.kubernetes.io/is-default-class": "true"},
        },
        "provisioner": PROVISIONER,
        "reclaimPolicy": "Delete",
        "volumeBindingMode": WAIT_FOR_FIRST_CONSUMER,
    }


@dataclass(frozen=True, slots=True)
class Provision:
    """Make the directory and the volume for the claim, on ``node``."""

    node: str


@dataclass(frozen=True, slots=True)
class Refuse:
    """The claim cannot be provisioned: ``reason`` and ``message`` of kube's ``ProvisioningFailed`` Event."""

    message: str


Decision = Provision | Refuse | None
"""None: not ours, or nothing to do (yet)."""


def provisioning(claim: Mapping[str, Any], storage_class: Mapping[str, Any] | None, nodes: set[str]) -> Decision:
    """Rule 2."""
    if storage_class is None or storage_class.get("provisioner") != PROVISIONER:
        return None
    if is_deleting(claim) or spec_of(claim).get("volumeName"):
        return None
    node = annotations_of(claim).get(SELECTED_NODE)
    if storage_class.get("volumeBindingMode") != WAIT_FOR_FIRST_CONSUMER:
        return Refuse("configuration error, no node was specified")
    if not isinstance(node, str) or not node:
        return None
    if node not in nodes:
        return Refuse(f'failed to get target node: node "{node}" not found')
    return Provision(node)


def volume_name(claim: Mapping[str, Any]) -> str:
    """Rule 3."""
    return f"pvc-{uid_of(claim)}"


def directory(claim: Mapping[str, Any]) -> str:
    """Rule 3: the directory, as the node sees it."""
    namespace, name = key_of(claim)
    return f"{BASE_PATH}/{volume_name(claim)}_{namespace}_{name}"


def provisioned_volume(claim: Mapping[str, Any], storage_class: Mapping[str, Any], node: str) -> dict[str, Any]:
    """Rule 4."""
    storage = _mapping(_mapping(spec_of(claim).get("resources")).get("requests")).get("storage")
    return {
        "apiVersion": "v1",
        "kind": "PersistentVolume",
        "metadata": {
            "name": volume_name(claim),
            "annotations": {PROVISIONED_BY: PROVISIONER, "local.path.provisioner/selected-node": node},
        },
        "spec": {
            "capacity": {"storage": str(storage)},
            "accessModes": sorted(access_modes(claim)),
            "volumeMode": volume_mode(claim),
            "hostPath": {"path": directory(claim), "type": "DirectoryOrCreate"},
            "nodeAffinity": {
                "required": {
                    "nodeSelectorTerms": [
                        {"matchExpressions": [{"key": HOSTNAME_LABEL, "operator": "In", "values": [node]}]}
                    ]
                }
            },
            "persistentVolumeReclaimPolicy": str(storage_class.get("reclaimPolicy") or "Delete"),
            "storageClassName": str(_mapping(storage_class.get("metadata")).get("name") or ""),
            "claimRef": claim_ref_for(claim),
        },
    }


def _mapping(value: Any) -> Mapping[str, Any]:
    return value if isinstance(value, Mapping) else {}


def provisioned_here(volume: Mapping[str, Any]) -> bool:
    return annotations_of(volume).get(PROVISIONED_BY) == PROVISIONER


def reclaimable(volume: Mapping[str, Any]) -> bool:
    """Rule 5."""
    phase = _mapping(volume.get("status")).get("phase")
    policy = spec_of(volume).get("persistentVolumeReclaimPolicy")
    return provisioned_here(volume) and policy == "Delete" and phase == "Released"


def volume_node(volume: Mapping[str, Any]) -> str | None:
    """The node a volume provisioned here lives on (from its node affinity; the annotation can be edited)."""
    terms = _mapping(_mapping(spec_of(volume).get("nodeAffinity")).get("required")).get("nodeSelectorTerms")
    for term in terms if isinstance(terms, list) else []:
        exprs = _mapping(term).get("matchExpressions")
        for expr in exprs if isinstance(exprs, list) else []:
            if isinstance(expr, Mapping) and expr.get("key") == HOSTNAME_LABEL and expr.get("operator") == "In":
                values = expr.get("values")
                if isinstance(values, list) and len(values) == 1 and isinstance(values[0], str):
                    return values[0]
    return None


def volume_path(volume: Mapping[str, Any]) -> str | None:
    host_path = spec_of(volume).get("hostPath")
    path = host_path.get("path") if isinstance(host_path, Mapping) else None
    return path if isinstance(path, str) and path.startswith(BASE_PATH + "/") else None
