"""The install manifests as a plan: which objects, in which order, how each is replaced, and when each is ready.

Theory of operation. ``ambit install`` reads the rendered kustomization (a YAML stream) and turns it into
:class:`Manifest` values here, with no I/O; :mod:`ambit.k8s.install` carries the plan out against an API server.

1. Every document is a mapping with ``apiVersion``, ``kind`` and ``metadata.name``; its kind is one of
   :data:`KINDS` (the kinds ``deploy/`` uses). Anything else is a :class:`ManifestError` naming the document, not
   a traceback. YAML aliases are refused: kustomize never writes them and they are the way to a billion laughs.
2. Apply order is by dependency, as Helm and istioctl order: namespaces, CRDs (then the caller waits for them to
   be Established), service accounts and RBAC, configuration, Services, workloads, disruption budgets, and
   admission webhooks last (a webhook registered before its server exists would refuse what follows).
   Objects of one rank keep the order of the stream. Removal is the reverse order.
3. An object that exists is replaced by the desired one at the current ``resourceVersion``; what the cluster
   allocated or the control plane wrote survives a re-install: a Service's cluster IPs, and a webhook's
   ``caBundle`` and ``failurePolicy`` once the control plane has filled the bundle in.
4. Ready means: a CRD Established; a Deployment observed at its generation, every replica updated and available;
   a DaemonSet observed at its generation with as many pods updated and available as it wants scheduled (at
   least one node). Every other kind is ready once it exists.
"""

from __future__ import annotations

import copy
from collections.abc import Iterable, Mapping
from dataclasses import dataclass
from typing import Any

import yaml

from ambit.errors import AmbitError
from ambit.k8s import kinds
from ambit.k8s.kinds import ResourceKind


class ManifestError(AmbitError):
    """The manifests cannot be read or are not what ``ambit install`` knows how to apply."""


class InstallError(AmbitError):
    """Installing or uninstalling failed (an API error, a timeout, a kind the server does not serve)."""


_RBAC = "rbac.authorization.k8s.io"
KINDS: dict[tuple[str, str], tuple[ResourceKind, int]] = {
    ("v1", "Namespace"): (kinds.NAMESPACES, 0),
    ("apiextensions.k8s.io/v1", "CustomResourceDefinition"): (kinds.CUSTOM_RESOURCE_DEFINITIONS, 1),
    ("v1", "ServiceAccount"): (kinds.SERVICE_ACCOUNTS, 2),
    (f"{_RBAC}/v1", "ClusterRole"): (ResourceKind(_RBAC, "v1", "clusterroles", "ClusterRole", False), 2),
    (f"{_RBAC}/v1", "Role"): (ResourceKind(_RBAC, "v1", "roles", "Role"), 2),
    (f"{_RBAC}/v1", "ClusterRoleBinding"): (
        ResourceKind(_RBAC, "v1", "clusterrolebindings", "ClusterRoleBinding", False),
        3,
    ),
    (f"{_RBAC}/v1", "RoleBinding"): (ResourceKind(_RBAC, "v1", "rolebindings", "RoleBinding"), 3),
    ("v1", "ConfigMap"): (kinds.CONFIG_MAPS, 4),
    ("v1", "Service"): (kinds.SERVICES, 5),
    ("apps/v1", "Deployment"): (kinds.DEPLOYMENTS, 6),
    ("apps/v1", "DaemonSet"): (kinds.DAEMON_SETS, 6),
    ("policy/v1", "PodDisruptionBudget"): (
        ResourceKind("policy", "v1", "poddisruptionbudgets", "PodDisruptionBudget"),
        7,
    ),
    ("admissionregistration.k8s.io/v1", "ValidatingWebhookConfiguration"): (
        kinds.VALIDATING_WEBHOOK_CONFIGURATIONS,
        8,
    ),
}
"""(apiVersion, kind) → the resource and its apply rank (rule 2)."""


@dataclass(frozen=True, slots=True)
class Manifest:
    """One object to apply."""

    kind: ResourceKind
    name: str
    namespace: str | None
    rank: int
    obj: Mapping[str, Any]

    @property
    def ref(self) -> str:
        """``Kind ns/name`` or ``Kind name``, for progress lines."""
        where = f"{self.namespace}/{self.name}" if self.namespace else self.name
        return f"{self.kind.kind} {where}"


_LOADER = getattr(yaml, "CSafeLoader", yaml.SafeLoader)


def _refuse_aliases(text: str) -> None:
    """Rule 1: aliases are refused before anything is built from the stream."""
    for event in yaml.parse(text, Loader=_LOADER):
        if isinstance(event, yaml.AliasEvent):
            line = f" (line {event.start_mark.line + 1})" if event.start_mark is not None else ""
            raise ManifestError(f"YAML aliases are not accepted{line}")


def parse_manifests(text: str) -> list[Manifest]:
    """The objects of a YAML stream, in stream order (rule 1). Raises :class:`ManifestError`."""
    try:
        _refuse_aliases(text)
        docs = list(yaml.load_all(text, Loader=_LOADER))
    except yaml.YAMLError as exc:
        raise ManifestError(f"the manifests are not valid YAML: {exc}") from None
    out: list[Manifest] = []
    for index, doc in enumerate(docs, start=1):
        if doc is None:
            continue
        out.append(_manifest(index, doc))
    return out


def _manifest(index: int, doc: Any) -> Manifest:
    where = f"document {index}"
    if not isinstance(doc, dict):
        raise ManifestError(f"{where}: expected a mapping, got {type(doc).__name__}")
    api_version, kind_name = doc.get("apiVersion"), doc.get("kind")
    if not isinstance(api_version, str) or not isinstance(kind_name, str):
        raise ManifestError(f"{where}: apiVersion and kind must be strings")
    meta = doc.get("metadata")
    name = meta.get("name") if isinstance(meta, dict) else None
    if not isinstance(name, str) or not name:
        raise ManifestError(f"{where} ({kind_name}): metadata.name is missing")
    entry = KINDS.get((api_version, kind_name))
    if entry is None:
        known = ", ".join(sorted(k for _, k in KINDS))
        raise ManifestError(f"{where} ({api_version} {kind_name} {name}): not a kind ambit install applies ({known})")
    kind, rank = entry
    namespace = meta.get("namespace") if isinstance(meta, dict) else None
    if kind.namespaced:
        if not isinstance(namespace, str) or not namespace:
            raise ManifestError(f"{where} ({kind_name} {name}): a namespaced object needs metadata.namespace")
    elif namespace is not None:
        raise ManifestError(f"{where} ({kind_name} {name}): cluster-scoped, but names namespace {namespace!r}")
    return Manifest(kind, name, namespace if kind.namespaced else None, rank, doc)


def apply_order(manifests: Iterable[Manifest]) -> list[Manifest]:
    """Rule 2: by rank, stream order within a rank."""
    return sorted(manifests, key=lambda m: m.rank)


def delete_order(manifests: Iterable[Manifest]) -> list[Manifest]:
    """Rule 2: the reverse of :func:`apply_order`."""
    return list(reversed(apply_order(manifests)))


def replacement(desired: Mapping[str, Any], current: Mapping[str, Any]) -> dict[str, Any]:
    """Rule 3: ``desired`` as a PUT over ``current``."""
    out = copy.deepcopy(dict(desired))
    meta = dict(out.get("metadata") or {})
    version = (current.get("metadata") or {}).get("resourceVersion")
    if version:
        meta["resourceVersion"] = version
    out["metadata"] = meta
    kind = desired.get("kind")
    if kind == "Service":
        spec, now = dict(out.get("spec") or {}), current.get("spec") or {}
        for key in ("clusterIP", "clusterIPs"):
            if key not in spec and key in now:
                spec[key] = now[key]
        out["spec"] = spec
    elif kind == "ValidatingWebhookConfiguration":
        filled = {
            w.get("name"): w
            for w in current.get("webhooks") or ()
            if isinstance(w, dict) and (w.get("clientConfig") or {}).get("caBundle")
        }
        for webhook in out.get("webhooks") or ():
            live = filled.get(webhook.get("name"))
            if live is not None and not (webhook.get("clientConfig") or {}).get("caBundle"):
                webhook["clientConfig"] = dict(
                    webhook.get("clientConfig") or {}, caBundle=live["clientConfig"]["caBundle"]
                )
                if "failurePolicy" in live:
                    webhook["failurePolicy"] = live["failurePolicy"]
    return out


@dataclass(frozen=True, slots=True)
class Readiness:
    ready: bool
    detail: str


def readiness(kind: ResourceKind, obj: Mapping[str, Any]) -> Readiness:
    """Rule 4: whether ``obj`` (as the server has it) is ready, and a few words on where it stands."""
    meta, status = obj.get("metadata") or {}, obj.get("status") or {}
    observed = int(status.get("observedGeneration") or 0) >= int(meta.get("generation") or 0)
    if kind == kinds.CUSTOM_RESOURCE_DEFINITIONS:
        established = any(
            c.get("type") == "Established" and c.get("status") == "True" for c in status.get("conditions") or ()
        )
        return Readiness(established, "established" if established else "not established yet")
    if kind == kinds.DEPLOYMENTS:
        wanted = int((obj.get("spec") or {}).get("replicas", 1))
        updated = int(status.get("updatedReplicas") or 0)
        available = int(status.get("availableReplicas") or 0)
        ready = observed and updated >= wanted and available >= wanted
        return Readiness(ready, f"{available}/{wanted} available, {updated} updated")
    if kind == kinds.DAEMON_SETS:
        wanted = int(status.get("desiredNumberScheduled") or 0)
        updated = int(status.get("updatedNumberScheduled") or 0)
        available = int(status.get("numberAvailable") or 0)
        ready = observed and wanted > 0 and updated >= wanted and available >= wanted
        return Readiness(ready, f"{available}/{wanted} available, {updated} updated")
    return Readiness(True, "created")


def needs_wait(kind: ResourceKind) -> bool:
    """Whether rule 4 has anything to wait for with this kind."""
    return kind in (kinds.CUSTOM_RESOURCE_DEFINITIONS, kinds.DEPLOYMENTS, kinds.DAEMON_SETS)


def summary(manifests: Iterable[Manifest]) -> str:
    """One line: how many objects of each kind, in apply order (``3 ServiceAccount, 2 DaemonSet, ...``)."""
    counts: dict[str, int] = {}
    for m in apply_order(manifests):
        counts[m.kind.kind] = counts.get(m.kind.kind, 0) + 1
    return ", ".join(f"{n} {k}" for k, n in counts.items())
