"""The kinds the server serves: built-in Kubernetes resources and the resources of established CRDs.

A resource type is identified by (group, plural). Objects are stored once per type, whatever version they were
written with; CRDs with several served versions use the ``None`` conversion strategy (only ``apiVersion``
changes), which is what a CRD without a conversion webhook does in Kubernetes.

Built-in group versions can be turned off as kube-apiserver's ``--runtime-config`` does (:func:`runtime_config`,
:func:`enabled_builtins`): ``policy/v1=false`` stops serving PodDisruptionBudgets, as on a cluster whose API server
was started so. The groups the server itself relies on (core, RBAC, CRDs, token and access reviews) cannot be
turned off, and a version that is a type's storage version can be turned off only with the type's other versions.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Callable, Iterable, Iterator, Mapping
from dataclasses import dataclass, field
from typing import Any

from ambit.apiserver import conversion

ALL_VERBS = ("create", "delete", "deletecollection", "get", "list", "patch", "update", "watch")

_COMMON_FIELDS = frozenset({"metadata.name", "metadata.namespace"})


@dataclass(frozen=True, slots=True)
class ResourceType:
    group: str
    versions: tuple[str, ...]  # served versions, storage (preferred) version first
    kind: str
    plural: str
    singular: str
    namespaced: bool
    short_names: tuple[str, ...] = ()
    categories: tuple[str, ...] = ()
    subresources: frozenset[str] = frozenset()
    verbs: tuple[str, ...] = ALL_VERBS
    extra_fields: frozenset[str] = frozenset()
    printer_columns: tuple[Mapping[str, Any], ...] = ()
    # For CRDs: the per-version printer columns.
    version_columns: Mapping[str, tuple[Mapping[str, Any], ...]] = field(default_factory=dict)
    builtin: bool = True
    # A kind stored as another (events.k8s.io Event as core Event): where, and how to convert both ways.
    stored_as: tuple[str, str] | None = None
    stored_api_version: str | None = None
    to_storage: Callable[[dict[str, Any]], dict[str, Any]] | None = None
    from_storage: Callable[[dict[str, Any]], dict[str, Any]] | None = None
    field_path: Callable[[str], str] | None = None

    @property
    def ident(self) -> tuple[str, str]:
        """What the registry knows this type by: (group, plural)."""
        return (self.group, self.plural)

    @property
    def key(self) -> tuple[str, str]:
        """Where its objects are stored (and watched): usually its own (group, plural)."""
        return self.stored_as or (self.group, self.plural)

    @property
    def storage_api_version(self) -> str:
        """The ``apiVersion`` objects carry in storage."""
        return self.stored_api_version or self.api_version(self.storage_version)

    @property
    def list_kind(self) -> str:
        return f"{self.kind}List"

    @property
    def storage_version(self) -> str:
        return self.versions[0]

    @property
    def field_selectors(self) -> frozenset[str]:
        return _COMMON_FIELDS | self.extra_fields

    def api_version(self, version: str) -> str:
        return f"{self.group}/{version}" if self.group else version

    def columns_for(self, version: str) -> tuple[Mapping[str, Any], ...] | None:
        if self.builtin:
            return None
        columns: tuple[Mapping[str, Any], ...] = self.version_columns.get(version, self.printer_columns)
        return columns


def _core(kind: str, plural: str, namespaced: bool = True, **kw: Any) -> ResourceType:
    return ResourceType(
        group="",
        versions=("v1",),
        kind=kind,
        plural=plural,
        singular=kind.lower(),
        namespaced=namespaced,
        **kw,
    )


_EVENT_FIELDS = frozenset(
    {
        "involvedObject.kind",
        "involvedObject.namespace",
        "involvedObject.name",
        "involvedObject.uid",
        "involvedObject.apiVersion",
        "involvedObject.resourceVersion",
        "involvedObject.fieldPath",
        "reason",
        "reportingComponent",
        "source",
        "type",
    }
)

BUILTINS: tuple[ResourceType, ...] = (
    _core(
        "Namespace",
        "namespaces",
        False,
        short_names=("ns",),
        subresources=frozenset({"status", "finalize"}),
        extra_fields=frozenset({"status.phase"}),
    ),
    _core(
        "Pod",
        "pods",
        short_names=("po",),
        categories=("all",),
        subresources=frozenset({"status", "eviction", "log", "exec", "portforward", "attach"}),
        extra_fields=frozenset(
            {
                "spec.nodeName",
                "spec.restartPolicy",
                "spec.schedulerName",
                "spec.serviceAccountName",
                "spec.hostNetwork",
                "status.phase",
                "status.podIP",
                "status.nominatedNodeName",
            }
        ),
    ),
    _core("Service", "services", short_names=("svc",), categories=("all",), subresources=frozenset({"status"})),
    _core("ConfigMap", "configmaps", short_names=("cm",)),
    _core("Secret", "secrets", extra_fields=frozenset({"type"})),
    _core("ServiceAccount", "serviceaccounts", short_names=("sa",), subresources=frozenset({"token"})),
    _core(
        "Node",
        "nodes",
        False,
        short_names=("no",),
        subresources=frozenset({"status"}),
        extra_fields=frozenset({"spec.unschedulable"}),
    ),
    _core("Event", "events", short_names=("ev",), extra_fields=_EVENT_FIELDS),
    _core("Endpoints", "endpoints", short_names=("ep",)),
    _core("PersistentVolumeClaim", "persistentvolumeclaims", short_names=("pvc",), subresources=frozenset({"status"})),
    _core("PersistentVolume", "persistentvolumes", False, short_names=("pv",), subresources=frozenset({"status"})),
    ResourceType(
        "storage.k8s.io", ("v1",), "StorageClass", "storageclasses", "storageclass", False, short_names=("sc",)
    ),
    ResourceType(
        "events.k8s.io",
        ("v1",),
        "Event",
        "events",
        "event",
        True,
        short_names=("ev",),
        stored_as=("", "events"),
        stored_api_version="v1",
        to_storage=conversion.event_to_core,
        from_storage=conversion.event_from_core,
        field_path=conversion.event_field_path,
        extra_fields=frozenset(
            {
                "regarding.kind",
                "regarding.namespace",
                "regarding.name",
                "regarding.uid",
                "reason",
                "type",
                "reportingController",
            }
        ),
    ),
    ResourceType("discovery.k8s.io", ("v1",), "EndpointSlice", "endpointslices", "endpointslice", True),
    ResourceType("coordination.k8s.io", ("v1",), "Lease", "leases", "lease", True),
    ResourceType(
        "apps",
        ("v1",),
        "Deployment",
        "deployments",
        "deployment",
        True,
        short_names=("deploy",),
        categories=("all",),
        subresources=frozenset({"status", "scale"}),
    ),
    ResourceType(
        "apps",
        ("v1",),
        "ReplicaSet",
        "replicasets",
        "replicaset",
        True,
        short_names=("rs",),
        categories=("all",),
        subresources=frozenset({"status", "scale"}),
    ),
    ResourceType(
        "apps",
        ("v1",),
        "DaemonSet",
        "daemonsets",
        "daemonset",
        True,
        short_names=("ds",),
        categories=("all",),
        subresources=frozenset({"status"}),
    ),
    ResourceType(
        "apps",
        ("v1",),
        "StatefulSet",
        "statefulsets",
        "statefulset",
        True,
        short_names=("sts",),
        categories=("all",),
        subresources=frozenset({"status", "scale"}),
    ),
    ResourceType("apps", ("v1",), "ControllerRevision", "controllerrevisions", "controllerrevision", True),
    ResourceType("batch", ("v1",), "Job", "jobs", "job", True, categories=("all",), subresources=frozenset({"status"})),
    ResourceType(
        "batch",
        ("v1",),
        "CronJob",
        "cronjobs",
        "cronjob",
        True,
        short_names=("cj",),
        categories=("all",),
        subresources=frozenset({"status"}),
    ),
    ResourceType(
        "scheduling.k8s.io", ("v1",), "PriorityClass", "priorityclasses", "priorityclass", False, short_names=("pc",)
    ),
    ResourceType(
        "policy",
        ("v1",),
        "PodDisruptionBudget",
        "poddisruptionbudgets",
        "poddisruptionbudget",
        True,
        short_names=("pdb",),
        subresources=frozenset({"status"}),
    ),
    # Enforced by each lab node (ambit.lab.network.policies), as a CNI enforces it on a cluster.
    ResourceType(
        "networking.k8s.io",
        ("v1",),
        "NetworkPolicy",
        "networkpolicies",
        "networkpolicy",
        True,
        short_names=("netpol",),
    ),
    # Stored and served for manifests that carry one (a waypoint's or gateway's autoscaler); nothing scales on it.
    ResourceType(
        "autoscaling",
        ("v2",),
        "HorizontalPodAutoscaler",
        "horizontalpodautoscalers",
        "horizontalpodautoscaler",
        True,
        short_names=("hpa",),
        categories=("all",),
        subresources=frozenset({"status"}),
    ),
    ResourceType(
        "apiextensions.k8s.io",
        ("v1",),
        "CustomResourceDefinition",
        "customresourcedefinitions",
        "customresourcedefinition",
        False,
        short_names=("crd", "crds"),
        subresources=frozenset({"status"}),
    ),
    ResourceType(
        "authentication.k8s.io",
        ("v1",),
        "TokenReview",
        "tokenreviews",
        "tokenreview",
        False,
        verbs=("create",),
    ),
    ResourceType(
        "admissionregistration.k8s.io",
        ("v1",),
        "ValidatingWebhookConfiguration",
        "validatingwebhookconfigurations",
        "validatingwebhookconfiguration",
        False,
    ),
    ResourceType(
        "admissionregistration.k8s.io",
        ("v1",),
        "MutatingWebhookConfiguration",
        "mutatingwebhookconfigurations",
        "mutatingwebhookconfiguration",
        False,
    ),
    ResourceType("rbac.authorization.k8s.io", ("v1",), "Role", "roles", "role", True),
    ResourceType("rbac.authorization.k8s.io", ("v1",), "ClusterRole", "clusterroles", "clusterrole", False),
    ResourceType("rbac.authorization.k8s.io", ("v1",), "RoleBinding", "rolebindings", "rolebinding", True),
    ResourceType(
        "rbac.authorization.k8s.io", ("v1",), "ClusterRoleBinding", "clusterrolebindings", "clusterrolebinding", False
    ),
    *(
        ResourceType(
            "authorization.k8s.io",
            ("v1",),
            kind,
            kind.lower() + "s",
            kind.lower(),
            kind.startswith("Local"),
            verbs=("create",),
        )
        for kind in (
            "SubjectAccessReview",
            "SelfSubjectAccessReview",
            "LocalSubjectAccessReview",
            "SelfSubjectRulesReview",
        )
    ),
)

# Resources that are created but never stored (they answer a question).
VIRTUAL = frozenset(
    {("authentication.k8s.io", "tokenreviews")}
    | {
        ("authorization.k8s.io", plural)
        for plural in (
            "subjectaccessreviews",
            "selfsubjectaccessreviews",
            "localsubjectaccessreviews",
            "selfsubjectrulesreviews",
        )
    }
)

CRD_KEY = ("apiextensions.k8s.io", "customresourcedefinitions")


def crd_is_established(crd: Mapping[str, Any]) -> bool:
    conditions = (crd.get("status") or {}).get("conditions") or []
    return any(c.get("type") == "Established" and c.get("status") == "True" for c in conditions)


def resource_type_from_crd(crd: Mapping[str, Any]) -> ResourceType:
    """The resource type a (validated) CRD object defines."""
    spec = crd["spec"]
    names = spec["names"]
    served = [v for v in spec.get("versions", []) if v.get("served", True)]
    storage = [v["name"] for v in served if v.get("storage")]
    others = [v["name"] for v in served if not v.get("storage")]
    versions = tuple(storage + others)
    subresources: set[str] = set()
    columns: dict[str, tuple[Mapping[str, Any], ...]] = {}
    for v in served:
        if "status" in (v.get("subresources") or {}):
            subresources.add("status")
        columns[v["name"]] = tuple(v.get("additionalPrinterColumns") or ())
    return ResourceType(
        group=spec["group"],
        versions=versions,
        kind=names["kind"],
        plural=names["plural"],
        singular=names.get("singular") or names["kind"].lower(),
        namespaced=spec.get("scope", "Namespaced") == "Namespaced",
        short_names=tuple(names.get("shortNames") or ()),
        categories=tuple(names.get("categories") or ()),
        subresources=frozenset(subresources),
        version_columns=columns,
        builtin=False,
    )


REQUIRED_GROUPS = frozenset(
    {"", "apiextensions.k8s.io", "rbac.authorization.k8s.io", "authentication.k8s.io", "authorization.k8s.io"}
)
"""Built-in groups the server's own authentication, authorization and CRD handling read: always served."""


class RuntimeConfigError(ValueError):
    """A ``--runtime-config`` entry that is malformed, names no built-in group version, or one that must stay."""


def runtime_config(entries: Iterable[str], types: Iterable[ResourceType] = BUILTINS) -> frozenset[tuple[str, str]]:
    """The (group, version) pairs that ``entries`` (``GROUP/VERSION=false`` or ``=true``, comma-separated lists
    allowed, as kube-apiserver's flag) turn off. ``=true`` (or no value) is what every built-in version already
    is. Raises :class:`RuntimeConfigError` naming the entry."""
    known = {(t.group, v) for t in types for v in t.versions}
    off: set[tuple[str, str]] = set()
    for entry in (part.strip() for item in entries for part in item.split(",")):
        if not entry:
            continue
        key, sep, value = entry.partition("=")
        group, slash, version = key.strip().rpartition("/")
        group = "" if group == "api" else group
        if not slash or not version or (group, version) not in known:
            raise RuntimeConfigError(f"{entry!r}: not a built-in GROUP/VERSION (e.g. policy/v1=false)")
        flag = value.strip().lower() if sep else "true"
        if flag not in ("true", "false"):
            raise RuntimeConfigError(f"{entry!r}: the value must be true or false")
        if flag == "true":
            off.discard((group, version))
            continue
        if group in REQUIRED_GROUPS:
            raise RuntimeConfigError(f"{entry!r}: the server itself needs {key.strip()}: it cannot be turned off")
        off.add((group, version))
    for t in types:
        if (t.group, t.versions[0]) in off and any((t.group, v) not in off for v in t.versions[1:]):
            raise RuntimeConfigError(
                f"{t.group}/{t.versions[0]} is where {t.plural} are stored: turn it off with its other versions"
            )
    return frozenset(off)


def enabled_builtins(
    off: frozenset[tuple[str, str]], types: Iterable[ResourceType] = BUILTINS
) -> tuple[ResourceType, ...]:
    """``types`` without the versions ``off`` names; a type left with no version is not served at all."""
    out = []
    for t in types:
        versions = tuple(v for v in t.versions if (t.group, v) not in off)
        if versions == t.versions:
            out.append(t)
        elif versions:
            out.append(dataclasses.replace(t, versions=versions))
    return tuple(out)


class Registry:
    """Lookup of resource types by (group, plural) and by (group, version, plural)."""

    def __init__(self, types: Iterable[ResourceType] = BUILTINS) -> None:
        self._builtin: dict[tuple[str, str], ResourceType] = {t.ident: t for t in types}
        self._custom: dict[tuple[str, str], ResourceType] = {}

    def __iter__(self) -> Iterator[ResourceType]:
        yield from self._builtin.values()
        yield from self._custom.values()

    def find(self, group: str, plural: str) -> ResourceType | None:
        return self._builtin.get((group, plural)) or self._custom.get((group, plural))

    def find_served(self, group: str, version: str, plural: str) -> ResourceType | None:
        rtype = self.find(group, plural)
        if rtype is None or version not in rtype.versions:
            return None
        return rtype

    def find_kind(self, group: str, kind: str) -> ResourceType | None:
        for rtype in self:
            if rtype.group == group and rtype.kind == kind:
                return rtype
        return None

    def set_custom(self, rtype: ResourceType) -> None:
        if rtype.ident in self._builtin:
            return
        self._custom[rtype.ident] = rtype

    def remove_custom(self, key: tuple[str, str]) -> None:
        self._custom.pop(key, None)

    def groups(self) -> dict[str, list[str]]:
        """Group name → served versions, preferred first; the core group is left out."""
        out: dict[str, list[str]] = {}
        for rtype in self:
            if not rtype.group:
                continue
            versions = out.setdefault(rtype.group, [])
            for v in rtype.versions:
                if v not in versions:
                    versions.append(v)
        for versions in out.values():
            versions.sort(key=_version_priority)
        return out


def _version_priority(version: str) -> tuple[int, int, int]:
    """Kubernetes version ordering: GA before beta before alpha, higher numbers first."""
    import re

    m = re.fullmatch(r"v(\d+)(?:(alpha|beta)(\d+))?", version)
    if not m:
        return (3, 0, 0)
    major = int(m.group(1))
    stage = {"": 0, "beta": 1, "alpha": 2}[m.group(2) or ""]
    minor = int(m.group(3) or 0)
    return (stage, -major, -minor)
