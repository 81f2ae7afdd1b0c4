"""PersistentVolumeClaims, PersistentVolumes and StorageClasses: their defaults, the admission steps kube runs on
them, and what an update may change.

Theory of operation: the defaults (:func:`claim_defaults`, :func:`volume_defaults`, :func:`class_defaults`) are
:mod:`ambit.apiserver.defaults`' entries; the strategies are :class:`~ambit.apiserver.strategies.StrategyTable`
entries, deciding from the object, the stored one and the store.

Rules:

1. Defaults: a claim's ``volumeMode`` is Filesystem and a new claim is ``Pending``; a volume's
   ``persistentVolumeReclaimPolicy`` is Retain and its ``volumeMode`` Filesystem, a new volume ``Pending``; a
   class's ``reclaimPolicy`` is Delete and its ``volumeBindingMode`` Immediate.
2. DefaultStorageClass admission: a new claim without ``storageClassName`` (absent, not ``""``: an empty name asks
   for a class-less volume) gets the default class, the one annotated
   ``storageclass.kubernetes.io/is-default-class: "true"``; with several, the newest, then the first name, as kube
   picks. Without one the field stays absent.
3. StorageObjectInUseProtection admission: a new claim carries the finalizer ``kubernetes.io/pvc-protection``, a
   new volume ``kubernetes.io/pv-protection``; the PV controller removes them once nothing uses the object.
4. A claim's spec is fixed once created, except: ``volumeName`` may be set while it is empty (the binder),
   ``storageClassName`` may be set while it is absent, and a bound claim's ``resources.requests.storage`` may
   grow when its class has ``allowVolumeExpansion`` (else 403, the resize admission's words), never shrink.
5. A class's ``provisioner``, ``parameters``, ``reclaimPolicy`` and ``volumeBindingMode`` are fixed once created.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from typing import Any

from ambit.apiserver import errors, names
from ambit.apiserver.registry import ResourceType
from ambit.apiserver.requests import JsonObject
from ambit.apiserver.strategies import Strategy
from ambit.model.errors import QuantityError
from ambit.model.quantity import parse_quantity

CLAIMS = ("", "persistentvolumeclaims")
VOLUMES = ("", "persistentvolumes")
STORAGE_CLASSES = ("storage.k8s.io", "storageclasses")
DEFAULT_CLASS_ANNOTATION = "storageclass.kubernetes.io/is-default-class"
CLAIM_PROTECTION = "kubernetes.io/pvc-protection"
VOLUME_PROTECTION = "kubernetes.io/pv-protection"
_IMMUTABLE = "spec is immutable after creation except resources.requests and volumeAttributesClassName for bound claims"


# -- rule 1 --------------------------------------------------------------------------------------------------------
def claim_defaults(obj: JsonObject) -> None:
    spec = obj.get("spec")
    if isinstance(spec, dict):
        spec.setdefault("volumeMode", "Filesystem")
    obj["status"] = {"phase": "Pending"}


def volume_defaults(obj: JsonObject) -> None:
    spec = obj.get("spec")
    if isinstance(spec, dict):
        spec.setdefault("persistentVolumeReclaimPolicy", "Retain")
        spec.setdefault("volumeMode", "Filesystem")
    obj["status"] = {"phase": "Pending"}


def class_defaults(obj: JsonObject) -> None:
    obj.setdefault("reclaimPolicy", "Delete")
    obj.setdefault("volumeBindingMode", "Immediate")


# -- rule 2 --------------------------------------------------------------------------------------------------------
def is_default_class(storage_class: Mapping[str, Any]) -> bool:
    annotations = (storage_class.get("metadata") or {}).get("annotations") or {}
    return isinstance(annotations, Mapping) and annotations.get(DEFAULT_CLASS_ANNOTATION) == "true"


def default_class(classes: Sequence[Mapping[str, Any]]) -> str | None:
    """Rule 2's choice among ``classes``."""
    defaults = [c for c in classes if is_default_class(c)]
    if not defaults:
        return None

    def order(c: Mapping[str, Any]) -> tuple[str, str]:
        meta = c.get("metadata") or {}
        return (str(meta.get("creationTimestamp") or ""), str(meta.get("name") or ""))

    newest = max(order(c) for c in defaults)[0]
    return min(order(c)[1] for c in defaults if order(c)[0] == newest)


def _add_finalizer(obj: JsonObject, finalizer: str) -> None:
    meta = obj["metadata"]
    finalizers = meta.get("finalizers")
    if finalizers is None:
        finalizers = meta["finalizers"] = []
    if not isinstance(finalizers, list):
        return  # malformed: validation answers it with a 422
    if finalizer not in finalizers:
        finalizers.append(finalizer)


class ClaimStrategy(Strategy):
    """Rules 2 to 4 for claims."""

    def prepare_for_create(self, rtype: ResourceType, obj: JsonObject) -> None:
        super().prepare_for_create(rtype, obj)
        obj["status"] = {"phase": "Pending"}
        _add_finalizer(obj, CLAIM_PROTECTION)

    def derive(self, rtype: ResourceType, old: JsonObject | None, new: JsonObject) -> None:
        spec = new.get("spec")
        if not isinstance(spec, dict):
            return
        if old is None:
            if "storageClassName" not in spec or spec["storageClassName"] is None:
                classes = [item.obj for item in self.context.store.items(STORAGE_CLASSES)]
                chosen = default_class(classes)
                if chosen is not None:
                    spec["storageClassName"] = chosen
            return
        self._check_update(rtype, old, new)

    def _check_update(self, rtype: ResourceType, old: JsonObject, new: JsonObject) -> None:
        """Rule 4."""
        before, after = dict(old.get("spec") or {}), dict(new.get("spec") or {})
        name = str(new["metadata"].get("name", ""))
        if not before.get("volumeName") and after.get("volumeName"):
            before["volumeName"] = after["volumeName"]
        if before.get("storageClassName") is None and after.get("storageClassName") is not None:
            before["storageClassName"] = after["storageClassName"]
        old_size, new_size = _storage(before), _storage(after)
        resources_changed = before.get("resources") != after.get("resources")
        before.pop("resources", None)
        after.pop("resources", None)
        bound = (old.get("status") or {}).get("phase") == "Bound"
        if before != after or (resources_changed and not bound):
            raise errors.invalid(rtype.kind, name, [names.forbidden("spec", _IMMUTABLE)], rtype.group)
        if not resources_changed or old_size == new_size:
            return
        if old_size is not None and new_size is not None and new_size < old_size:
            cause = names.forbidden("spec.resources.requests.storage", "field can not be less than previous value")
            raise errors.invalid(rtype.kind, name, [cause], rtype.group)
        class_name = str(after.get("storageClassName") or "")
        found = self.context.store.get(STORAGE_CLASSES, "", class_name) if class_name else None
        if found is None or found.obj.get("allowVolumeExpansion") is not True:
            raise errors.forbidden(
                f'persistentvolumeclaims "{name}" is forbidden: only dynamically provisioned pvc can be resized and '
                "the storageclass that provisions the pvc must support resize"
            )


def _storage(spec: Mapping[str, Any]) -> Any:
    requests = ((spec.get("resources") or {}) if isinstance(spec.get("resources"), Mapping) else {}).get("requests")
    raw = requests.get("storage") if isinstance(requests, Mapping) else None
    try:
        return parse_quantity(raw)
    except QuantityError:
        return None


class VolumeStrategy(Strategy):
    """Rules 1 and 3 for volumes."""

    def prepare_for_create(self, rtype: ResourceType, obj: JsonObject) -> None:
        super().prepare_for_create(rtype, obj)
        obj["status"] = {"phase": "Pending"}
        _add_finalizer(obj, VOLUME_PROTECTION)


class StorageClassStrategy(Strategy):
    """Rule 5."""

    def prepare_for_update(self, rtype: ResourceType, old: JsonObject, new: JsonObject) -> None:
        name = str(new["metadata"].get("name", ""))
        causes = [
            names.forbidden(key, f"updates to {key} are forbidden.")
            for key in ("parameters", "provisioner", "reclaimPolicy")
            if new.get(key, old.get(key)) != old.get(key)
        ]
        if new.get("volumeBindingMode", old.get("volumeBindingMode")) != old.get("volumeBindingMode"):
            causes.append(names.invalid("volumeBindingMode", new.get("volumeBindingMode"), "field is immutable"))
        if causes:
            raise errors.invalid(rtype.kind, name, causes, rtype.group)
