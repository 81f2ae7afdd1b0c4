"""Pure checks of an object about to be written, answered as kube-apiserver's field errors.

Theory of operation: :func:`validate_object` returns a list of ``(field path, message)`` causes and the server
raises ``errors.invalid(...)`` with them when the list is not empty. It runs after defaulting, so the server has
already turned ``metadata.generateName`` into a name (with :func:`generate_name`).

Rules:

1. Every object: ``metadata`` is a map; ``metadata.name`` is present and follows its kind's rule in
   :data:`NAME_RULES` (a DNS-1123 subdomain unless listed); the namespace is a DNS label; labels, annotations,
   finalizers and owner references are well formed. Review requests (TokenReview...) need no name.
2. Kinds listed in :data:`SPEC_RULES` are checked further (``spec_validation``, ``crd_validation``). Custom
   resources get rule 1 only: their schemas keep unknown fields.
3. Server-owned metadata (uid, resourceVersion, creationTimestamp, managedFields) is not judged here.

Invariant: no input makes :func:`validate_object` raise; a wrong shape anywhere is a cause. A property test
feeds it arbitrary JSON to hold this.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping
from typing import Any

from ambit.apiserver import scheduling_validation as scheduling
from ambit.apiserver import spec_validation as spec
from ambit.apiserver import storage_validation as storage
from ambit.apiserver.batch_validation import validate_cron_job, validate_job
from ambit.apiserver.crd_validation import validate_crd
from ambit.apiserver.names import (
    Cause,
    at,
    dns1035_label,
    dns1123_label,
    dns1123_subdomain,
    duplicate,
    generate_name,
    invalid,
    path_segment,
    qualified_name,
    required,
    validate_annotations,
    validate_labels,
)
from ambit.apiserver.network_policy_validation import validate_network_policy
from ambit.apiserver.placement_validation import validate_node

__all__ = ["NAME_RULES", "SPEC_RULES", "Cause", "generate_name", "name_rule", "validate_object"]

NameRule = Callable[[str], list[str]]

# Kinds not named by a DNS-1123 subdomain, keyed by (group, kind).
NAME_RULES: dict[tuple[str, str], NameRule] = {
    ("", "Namespace"): dns1123_label,
    ("", "Service"): dns1035_label,
    ("rbac.authorization.k8s.io", "Role"): path_segment,
    ("rbac.authorization.k8s.io", "ClusterRole"): path_segment,
    ("rbac.authorization.k8s.io", "RoleBinding"): path_segment,
    ("rbac.authorization.k8s.io", "ClusterRoleBinding"): path_segment,
    ("certificates.k8s.io", "CertificateSigningRequest"): path_segment,
}

SPEC_RULES: dict[tuple[str, str], Callable[[Mapping[str, Any]], list[Cause]]] = {
    ("", "Pod"): spec.validate_pod,
    ("", "Service"): spec.validate_service,
    ("", "ConfigMap"): spec.validate_config_map,
    ("", "Secret"): spec.validate_secret,
    ("apps", "Deployment"): spec.validate_workload,
    ("apps", "ReplicaSet"): spec.validate_workload,
    ("apps", "DaemonSet"): scheduling.validate_daemon_set,
    ("apps", "ControllerRevision"): scheduling.validate_controller_revision,
    ("scheduling.k8s.io", "PriorityClass"): scheduling.validate_priority_class,
    ("policy", "PodDisruptionBudget"): scheduling.validate_pod_disruption_budget,
    ("networking.k8s.io", "NetworkPolicy"): validate_network_policy,
    ("", "Node"): validate_node,
    ("apps", "StatefulSet"): scheduling.validate_stateful_set,
    ("discovery.k8s.io", "EndpointSlice"): spec.validate_endpoint_slice,
    ("batch", "Job"): validate_job,
    ("batch", "CronJob"): validate_cron_job,
    ("apiextensions.k8s.io", "CustomResourceDefinition"): validate_crd,
    ("", "PersistentVolumeClaim"): storage.validate_claim,
    ("", "PersistentVolume"): storage.validate_volume,
    ("storage.k8s.io", "StorageClass"): storage.validate_storage_class,
}

# Requests rather than stored objects: they carry no name.
_NAMELESS_KINDS = frozenset(
    {
        ("authentication.k8s.io", "TokenReview"),
        ("authentication.k8s.io", "SelfSubjectReview"),
        ("authorization.k8s.io", "SubjectAccessReview"),
        ("authorization.k8s.io", "SelfSubjectAccessReview"),
        ("authorization.k8s.io", "LocalSubjectAccessReview"),
        ("authorization.k8s.io", "SelfSubjectRulesReview"),
    }
)


def name_rule(kind: str, group: str) -> NameRule:
    """The grammar ``metadata.name`` must follow for this kind."""
    return NAME_RULES.get((group, kind), dns1123_subdomain)


def validate_object(kind: str, group: str, obj: Any) -> list[Cause]:
    """Every problem with ``obj`` as a ``kind`` of ``group`` (``""`` for core); empty when it may be stored."""
    if not isinstance(obj, Mapping):
        return [invalid("", obj, "must be a JSON object")]
    causes = validate_metadata(kind, group, obj.get("metadata"))
    rule = SPEC_RULES.get((group, kind))
    if rule is not None:
        causes.extend(rule(obj))
    return causes


def validate_metadata(kind: str, group: str, meta: Any) -> list[Cause]:
    if meta is None:
        meta = {}
    if not isinstance(meta, Mapping):
        return [invalid("metadata", meta, "must be an object")]
    causes: list[Cause] = []
    name = meta.get("name")
    if (group, kind) in _NAMELESS_KINDS:
        pass
    elif name in (None, ""):
        causes.append(required("metadata.name", "name or generateName is required"))
    elif not isinstance(name, str):
        causes.append(invalid("metadata.name", name, "must be a string"))
    else:
        causes.extend(invalid("metadata.name", name, msg) for msg in name_rule(kind, group)(name))
    generate = meta.get("generateName")
    if generate is not None and not isinstance(generate, str):
        causes.append(invalid("metadata.generateName", generate, "must be a string"))
    namespace = meta.get("namespace")
    if namespace not in (None, ""):
        if not isinstance(namespace, str):
            causes.append(invalid("metadata.namespace", namespace, "must be a string"))
        else:
            causes.extend(invalid("metadata.namespace", namespace, msg) for msg in dns1123_label(namespace))
    causes.extend(validate_labels(meta.get("labels"), "metadata.labels"))
    causes.extend(validate_annotations(meta.get("annotations"), "metadata.annotations"))
    causes.extend(_finalizers(meta.get("finalizers")))
    causes.extend(_owner_references(meta.get("ownerReferences")))
    return causes


def _finalizers(finalizers: Any) -> list[Cause]:
    if finalizers is None:
        return []
    if not isinstance(finalizers, list):
        return [invalid("metadata.finalizers", finalizers, "must be a list of strings")]
    causes = []
    seen: set[str] = set()
    for i, item in enumerate(finalizers):
        path = at("metadata.finalizers", i)
        if not isinstance(item, str):
            causes.append(invalid(path, item, "must be a string"))
            continue
        causes.extend(invalid(path, item, msg) for msg in qualified_name(item))
        if item in seen:
            causes.append(duplicate(path, item))
        seen.add(item)
    return causes


def _owner_references(refs: Any) -> list[Cause]:
    if refs is None:
        return []
    if not isinstance(refs, list):
        return [invalid("metadata.ownerReferences", refs, "must be a list")]
    causes = []
    controllers = 0
    for i, ref in enumerate(refs):
        path = at("metadata.ownerReferences", i)
        if not isinstance(ref, Mapping):
            causes.append(invalid(path, ref, "must be an object"))
            continue
        for key in ("apiVersion", "kind", "name", "uid"):
            value = ref.get(key)
            if value in (None, ""):
                causes.append(required(at(path, key)))
            elif not isinstance(value, str):
                causes.append(invalid(at(path, key), value, "must be a string"))
        controllers += ref.get("controller") is True
    if controllers > 1:
        causes.append(
            invalid("metadata.ownerReferences", controllers, "Only one reference can have Controller set to true")
        )
    return causes
