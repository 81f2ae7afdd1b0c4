"""``kubectl get pvc``, ``pv`` and ``sc`` columns, as kube-apiserver prints them (pure; see :mod:`printers`).

Rules (kube's printers for these kinds):

1. A claim: its phase (``Terminating`` once deleted), the volume it names, and, once it names one, the bound
   capacity and access modes from its status; its class, its VolumeAttributesClass (``<unset>``), its age, and
   (wide) its volume mode (``<unset>`` when absent).
2. A volume: its capacity, access modes, reclaim policy, phase (``Terminating`` once deleted), its claim as
   ``namespace/name``, its class, VolumeAttributesClass, the status reason, its age, and (wide) its volume mode.
3. A class: its name, with `` (default)`` for the default class, its provisioner, reclaim policy (Delete when
   absent), binding mode (Immediate when absent), whether it allows expansion, its age.
4. Access modes print as kube's short forms in a fixed order: RWO, ROX, RWX, RWOP, each once.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

from ambit.apiserver.cells import Cell, age, as_map, as_str, name_of
from ambit.apiserver.claims import is_default_class
from ambit.apiserver.printers import AGE, NAME, Column, Printer

_SHORT_MODES = (
    ("ReadWriteOnce", "RWO"),
    ("ReadOnlyMany", "ROX"),
    ("ReadWriteMany", "RWX"),
    ("ReadWriteOncePod", "RWOP"),
)
UNSET = "<unset>"


def access_modes(modes: Any) -> str:
    """Rule 4."""
    listed = modes if isinstance(modes, list) else []
    return ",".join(short for mode, short in _SHORT_MODES if mode in listed)


def _phase(obj: Mapping[str, Any]) -> str:
    if as_map(obj.get("metadata")).get("deletionTimestamp"):
        return "Terminating"
    return as_str(as_map(obj.get("status")).get("phase"))


def _storage(capacity: Any) -> str:
    return as_str(as_map(capacity).get("storage"))


def _claim_cells(pvc: Mapping[str, Any], now: float) -> list[Cell]:
    spec, status = as_map(pvc.get("spec")), as_map(pvc.get("status"))
    volume = as_str(spec.get("volumeName"))
    capacity = _storage(status.get("capacity")) if volume else ""
    modes = access_modes(status.get("accessModes")) if volume else ""
    return [
        name_of(pvc),
        _phase(pvc),
        volume,
        capacity,
        modes,
        as_str(spec.get("storageClassName")),
        as_str(spec.get("volumeAttributesClassName"), UNSET) or UNSET,
        age(pvc, now),
        as_str(spec.get("volumeMode"), UNSET) or UNSET,
    ]


def _volume_cells(pv: Mapping[str, Any], now: float) -> list[Cell]:
    spec, status = as_map(pv.get("spec")), as_map(pv.get("status"))
    ref = as_map(spec.get("claimRef"))
    claim = f"{as_str(ref.get('namespace'))}/{as_str(ref.get('name'))}" if ref else ""
    return [
        name_of(pv),
        _storage(spec.get("capacity")),
        access_modes(spec.get("accessModes")),
        as_str(spec.get("persistentVolumeReclaimPolicy")),
        _phase(pv),
        claim,
        as_str(spec.get("storageClassName")),
        as_str(spec.get("volumeAttributesClassName"), UNSET) or UNSET,
        as_str(status.get("reason")),
        age(pv, now),
        as_str(spec.get("volumeMode"), UNSET) or UNSET,
    ]


def _class_cells(sc: Mapping[str, Any], now: float) -> list[Cell]:
    name = name_of(sc) + (" (default)" if is_default_class(sc) else "")
    return [
        name,
        as_str(sc.get("provisioner")),
        as_str(sc.get("reclaimPolicy"), "Delete") or "Delete",
        as_str(sc.get("volumeBindingMode"), "Immediate") or "Immediate",
        sc.get("allowVolumeExpansion") is True,
        age(sc, now),
    ]


def _col(name: str, description: str, type: str = "string", priority: int = 0) -> Column:
    return Column(name, description, type=type, priority=priority)


_CLASS = _col("StorageClass", "The storage class of the object.")
_ATTRIBUTES = _col("VolumeAttributesClass", "The VolumeAttributesClass of the object.")
_MODE = _col("VolumeMode", "Filesystem or Block.", priority=1)
_MODES = _col("Access Modes", "Access modes, as RWO, ROX, RWX, RWOP.")

STORAGE_PRINTERS: dict[tuple[str, str], Printer] = {
    ("", "PersistentVolumeClaim"): Printer(
        (
            NAME,
            _col("Status", "Pending, Bound, Lost, or Terminating."),
            _col("Volume", "The volume bound to the claim."),
            _col("Capacity", "The bound volume's capacity."),
            _MODES,
            _CLASS,
            _ATTRIBUTES,
            AGE,
            _MODE,
        ),
        _claim_cells,
    ),
    ("", "PersistentVolume"): Printer(
        (
            NAME,
            _col("Capacity", "The volume's capacity."),
            _MODES,
            _col("Reclaim Policy", "What happens to the volume when its claim goes: Retain, Delete, Recycle."),
            _col("Status", "Available, Bound, Released, Failed, Pending, or Terminating."),
            _col("Claim", "The claim bound to the volume, as namespace/name."),
            _CLASS,
            _ATTRIBUTES,
            _col("Reason", "Why the volume is in its phase."),
            AGE,
            _MODE,
        ),
        _volume_cells,
    ),
    ("storage.k8s.io", "StorageClass"): Printer(
        (
            NAME,
            _col("Provisioner", "The provisioner that makes the class's volumes."),
            _col("ReclaimPolicy", "Delete or Retain, for the volumes it makes."),
            _col("VolumeBindingMode", "Immediate or WaitForFirstConsumer."),
            _col("AllowVolumeExpansion", "Whether claims of the class may grow.", "boolean"),
            AGE,
        ),
        _class_cells,
    ),
}
