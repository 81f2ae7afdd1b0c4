"""Checks of PersistentVolumeClaims, PersistentVolumes and StorageClasses, as kube-apiserver words them (pure).

Theory of operation: like :mod:`ambit.apiserver.spec_validation`, each ``validate_*`` takes the whole object and
returns its causes; ``validation.SPEC_RULES`` names the kinds. Every rule reads defensively, so one request reports
every problem and no input raises. What an update may change is :mod:`ambit.apiserver.claims`' rule (it compares
with the stored object).

Rules kept (kube-apiserver's, for these fields):

1. Access modes: at least one (claims and volumes), each one of :data:`ACCESS_MODES`; ``ReadWriteOncePod`` alone.
2. Claim: ``resources.requests.storage`` is given and is a quantity above zero; ``volumeMode`` Block or
   Filesystem; a given ``storageClassName`` is a DNS-1123 subdomain; the selector is well formed.
3. Volume: ``capacity`` holds ``storage`` and nothing else, a quantity; exactly one volume source; a
   ``hostPath`` or ``local`` path is absolute (``local``) or given (``hostPath``) and holds no ``..``; ``local``
   volumes need ``nodeAffinity``; ``nodeAffinity.required`` has node selector terms as a pod's node affinity
   does; ``persistentVolumeReclaimPolicy`` Delete, Recycle or Retain; a ``claimRef`` names its claim.
4. StorageClass: ``provisioner`` given, a qualified name; ``reclaimPolicy`` Delete or Retain;
   ``volumeBindingMode`` Immediate or WaitForFirstConsumer; at most 512 parameters.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

from ambit.apiserver.names import (
    Cause,
    at,
    dns1123_subdomain,
    forbidden,
    invalid,
    qualified_name,
    required,
    unsupported,
)
from ambit.apiserver.placement_validation import validate_affinity
from ambit.apiserver.shapes import as_object
from ambit.apiserver.spec_validation import validate_label_selector
from ambit.model.errors import QuantityError
from ambit.model.quantity import parse_quantity

ACCESS_MODES = ("ReadOnlyMany", "ReadWriteMany", "ReadWriteOnce", "ReadWriteOncePod")
VOLUME_MODES = ("Block", "Filesystem")
VOLUME_RECLAIM_POLICIES = ("Delete", "Recycle", "Retain")
CLASS_RECLAIM_POLICIES = ("Delete", "Retain")
BINDING_MODES = ("Immediate", "WaitForFirstConsumer")
VOLUME_SOURCES = (
    "hostPath",
    "local",
    "nfs",
    "csi",
    "iscsi",
    "fc",
    "rbd",
    "cephfs",
    "cinder",
    "glusterfs",
    "flexVolume",
    "azureFile",
    "azureDisk",
    "gcePersistentDisk",
    "awsElasticBlockStore",
    "vsphereVolume",
    "quobyte",
    "photonPersistentDisk",
    "portworxVolume",
    "scaleIO",
    "storageos",
    "flocker",
)
"""The ``PersistentVolumeSource`` members (kube's field names): a volume has exactly one of them."""
MAX_PARAMETERS = 512


def _access_modes(value: Any, path: str, needed: str) -> list[Cause]:
    """Rule 1."""
    if value is None or value == []:
        return [required(path, needed)]
    if not isinstance(value, list):
        return [invalid(path, value, "must be a list of strings")]
    causes: list[Cause] = []
    for i, mode in enumerate(value):
        if mode not in ACCESS_MODES:
            causes.append(unsupported(at(path, i), mode, ACCESS_MODES))
    if "ReadWriteOncePod" in value and len(value) > 1:
        causes.append(forbidden(path, "may not use ReadWriteOncePod with other access modes"))
    return causes


def _positive_quantity(value: Any, path: str) -> list[Cause]:
    try:
        amount = parse_quantity(value)
    except QuantityError:
        return [invalid(path, value, "must be a quantity, such as 1Gi or 500M")]
    return [] if amount > 0 else [invalid(path, value, "must be greater than zero")]


def validate_claim_spec(spec: Any, path: str) -> list[Cause]:
    """Rules 1 and 2 for a claim's (or a claim template's) spec."""
    causes: list[Cause] = []
    spec = as_object(spec, path, causes)
    causes.extend(_access_modes(spec.get("accessModes"), at(path, "accessModes"), "at least 1 access mode is required"))
    resources = as_object(spec.get("resources"), at(path, "resources"), causes)
    requests = as_object(resources.get("requests"), at(at(path, "resources"), "requests"), causes)
    storage_path = f"{path}.resources[storage]"
    if requests.get("storage") is None:
        causes.append(required(storage_path))
    else:
        causes.extend(_positive_quantity(requests["storage"], storage_path))
    mode = spec.get("volumeMode")
    if mode is not None and mode not in VOLUME_MODES:
        causes.append(unsupported(at(path, "volumeMode"), mode, VOLUME_MODES))
    class_name = spec.get("storageClassName")
    if class_name not in (None, ""):
        if not isinstance(class_name, str):
            causes.append(invalid(at(path, "storageClassName"), class_name, "must be a string"))
        else:
            causes.extend(invalid(at(path, "storageClassName"), class_name, m) for m in dns1123_subdomain(class_name))
    volume_name = spec.get("volumeName")
    if volume_name is not None and not isinstance(volume_name, str):
        causes.append(invalid(at(path, "volumeName"), volume_name, "must be a string"))
    if spec.get("selector") is not None:
        causes.extend(validate_label_selector(spec.get("selector"), at(path, "selector")))
    return causes


def validate_claim(obj: Mapping[str, Any]) -> list[Cause]:
    return validate_claim_spec(obj.get("spec"), "spec")


def validate_volume(obj: Mapping[str, Any]) -> list[Cause]:
    """Rules 1 and 3."""
    causes: list[Cause] = []
    spec = as_object(obj.get("spec"), "spec", causes)
    causes.extend(_access_modes(spec.get("accessModes"), "spec.accessModes", "must specify at least 1 access mode"))
    capacity = as_object(spec.get("capacity"), "spec.capacity", causes)
    if not capacity:
        causes.append(required("spec.capacity"))
    elif set(capacity) != {"storage"}:
        causes.append(unsupported("spec.capacity", sorted(map(str, capacity)), ("storage",)))
    else:
        causes.extend(_positive_quantity(capacity["storage"], "spec.capacity[storage]"))
    sources = [name for name in VOLUME_SOURCES if spec.get(name) is not None]
    if not sources:
        causes.append(required("spec", "must specify a volume type"))
    for extra in sources[1:]:
        causes.append(forbidden(at("spec", extra), "may not specify more than 1 volume type"))
    causes.extend(_source_paths(spec))
    if spec.get("local") is not None and spec.get("nodeAffinity") is None:
        causes.append(required("spec.nodeAffinity", "Local volumes require node affinity"))
    causes.extend(_node_affinity(spec.get("nodeAffinity")))
    policy = spec.get("persistentVolumeReclaimPolicy")
    if policy is not None and policy not in VOLUME_RECLAIM_POLICIES:
        causes.append(unsupported("spec.persistentVolumeReclaimPolicy", policy, VOLUME_RECLAIM_POLICIES))
    mode = spec.get("volumeMode")
    if mode is not None and mode not in VOLUME_MODES:
        causes.append(unsupported("spec.volumeMode", mode, VOLUME_MODES))
    class_name = spec.get("storageClassName")
    if class_name not in (None, ""):
        if not isinstance(class_name, str):
            causes.append(invalid("spec.storageClassName", class_name, "must be a string"))
        else:
            causes.extend(invalid("spec.storageClassName", class_name, m) for m in dns1123_subdomain(class_name))
    ref = spec.get("claimRef")
    if ref is not None:
        ref = as_object(ref, "spec.claimRef", causes)
        for key in ("name", "namespace"):
            if ref and (not isinstance(ref.get(key), str) or not ref.get(key)):
                causes.append(required(at("spec.claimRef", key)))
    return causes


def _source_paths(spec: Mapping[str, Any]) -> list[Cause]:
    causes: list[Cause] = []
    for source in ("hostPath", "local"):
        if spec.get(source) is None:
            continue
        body = as_object(spec.get(source), at("spec", source), causes)
        path, where = body.get("path"), at(at("spec", source), "path")
        if not isinstance(path, str) or not path:
            causes.append(required(where))
        elif ".." in path.split("/"):
            causes.append(invalid(where, path, "must not contain '..'"))
        elif source == "local" and not path.startswith("/"):
            causes.append(invalid(where, path, "must be an absolute path"))
    return causes


def _node_affinity(affinity: Any) -> list[Cause]:
    """A volume's ``nodeAffinity.required`` is a node selector, checked as a pod's required node affinity is."""
    if affinity is None:
        return []
    causes: list[Cause] = []
    body = as_object(affinity, "spec.nodeAffinity", causes)
    if causes or body.get("required") is None:
        return causes
    shaped = {"nodeAffinity": {"requiredDuringSchedulingIgnoredDuringExecution": body["required"]}}
    prefix = "x.nodeAffinity.requiredDuringSchedulingIgnoredDuringExecution"
    return [
        ("spec.nodeAffinity.required" + path[len(prefix) :], message)
        for path, message in validate_affinity(shaped, "x")
    ]


def validate_storage_class(obj: Mapping[str, Any]) -> list[Cause]:
    """Rule 4."""
    causes: list[Cause] = []
    provisioner = obj.get("provisioner")
    if not isinstance(provisioner, str) or not provisioner:
        causes.append(required("provisioner"))
    else:
        causes.extend(invalid("provisioner", provisioner, m) for m in qualified_name(provisioner))
    policy = obj.get("reclaimPolicy")
    if policy is not None and policy not in CLASS_RECLAIM_POLICIES:
        causes.append(unsupported("reclaimPolicy", policy, CLASS_RECLAIM_POLICIES))
    mode = obj.get("volumeBindingMode")
    if mode is not None and mode not in BINDING_MODES:
        causes.append(unsupported("volumeBindingMode", mode, BINDING_MODES))
    parameters = as_object(obj.get("parameters"), "parameters", causes)
    if len(parameters) > MAX_PARAMETERS:
        causes.append(("parameters", f"Too many: {len(parameters)}: must have at most {MAX_PARAMETERS} items"))
    expansion = obj.get("allowVolumeExpansion")
    if expansion is not None and not isinstance(expansion, bool):
        causes.append(invalid("allowVolumeExpansion", expansion, "must be a boolean"))
    return causes
