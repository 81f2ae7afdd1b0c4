"""Per-kind strategies: how one kind's writes and deletes differ from every other kind's, as one table.

Theory of operation: the verbs (:mod:`ambit.apiserver.verbs`) and deletion (:mod:`ambit.apiserver.deletion`) run
the same steps for every kind and ask the kind's :class:`Strategy` at each point where kinds differ, as
kube-apiserver's registry asks a ``RESTCreateStrategy``/``RESTUpdateStrategy``. :class:`StrategyTable` is the
table, keyed by where a kind is stored; a kind that is not in it gets :class:`Strategy`, the common behaviour.

The hooks, in the order a write reaches them:

1. ``prepare_for_create`` (after defaults): what the server sets on a new object.
2. ``prepare_for_update`` (main resource only, before ``generation`` is judged): what a client may not change;
   ``defaults_on_update`` says whether defaults apply again afterwards.
3. ``derive`` (create, and updates of the main resource; after defaults, before mutating admission): fields
   derived from the rest of the object, which may need the object to be valid first.
4. ``after_commit``: what follows from a stored object (a served type, a namespace's default objects).
5. ``deletion_plan``: how a delete starts (at once, after a grace period, or by terminating a namespace);
   ``may_remove_now`` says whether an object whose last finalizer went may go yet; ``after_remove`` follows a
   removal. ``own_labels_select_namespace`` tells admission where a namespace selector reads labels.

Strategies decide; the storing is done by the callers, through the ``commit`` they are given.
"""

from __future__ import annotations

import copy
import uuid
from collections.abc import Callable, Mapping
from dataclasses import dataclass
from typing import Any

from ambit.apiserver import errors, names, priority, validation
from ambit.apiserver.registry import CRD_KEY, Registry, ResourceType, crd_is_established, resource_type_from_crd
from ambit.apiserver.requests import JsonObject, rfc3339
from ambit.apiserver.service_ips import ServiceIpAllocator
from ambit.apiserver.store import Store, TypeKey
from ambit.apiserver.watch import WatchHub

NAMESPACES = ("", "namespaces")
PODS = ("", "pods")
SERVICES = ("", "services")
SERVICE_ACCOUNTS = ("", "serviceaccounts")
CONFIG_MAPS = ("", "configmaps")
PRIORITY_CLASSES = ("scheduling.k8s.io", "priorityclasses")
CONTROLLER_REVISIONS = ("apps", "controllerrevisions")
DAEMON_SETS = ("apps", "daemonsets")
STATEFUL_SETS = ("apps", "statefulsets")
STATEFUL_SET_MUTABLE = (
    "replicas",
    "ordinals",
    "template",
    "updateStrategy",
    "revisionHistoryLimit",
    "persistentVolumeClaimRetentionPolicy",
    "minReadySeconds",
)
TEMPLATE_GENERATION = "deprecated.daemonset.template.generation"
JOBS = ("batch", "jobs")
JOB_CONTROLLER_UID = "batch.kubernetes.io/controller-uid"
JOB_NAME = "batch.kubernetes.io/job-name"
JOB_LEGACY_LABELS = {JOB_CONTROLLER_UID: "controller-uid", JOB_NAME: "job-name"}
JOB_IMMUTABLE = ("selector", "template", "completionMode")

Commit = Callable[[str, ResourceType, str, str, JsonObject], None]
"""Store an object and announce it: (event type, resource type, namespace, name, object)."""


@dataclass(frozen=True, slots=True)
class GracefulDelete:
    """Mark the object deleted ``seconds`` from now; its node deletes it again once it has stopped it."""

    seconds: int


@dataclass(frozen=True, slots=True)
class TerminateNamespace:
    """Mark the namespace Terminating, delete what it holds, and remove it once it is empty."""


DeletionPlan = GracefulDelete | TerminateNamespace | None
"""None: the common path (finalizers, else removal now)."""


@dataclass(slots=True)
class StrategyContext:
    """What strategies may read and write; ``now`` reads the server's clock at call time."""

    store: Store
    registry: Registry
    hub: WatchHub
    now: Callable[[], float]
    commit: Commit
    root_ca_pem: str = ""


class Strategy:
    """The common behaviour; each subclass overrides what its kind does differently."""

    def __init__(self, context: StrategyContext) -> None:
        self.context = context

    def prepare_for_create(self, rtype: ResourceType, obj: JsonObject) -> None:
        """A built-in kind with a status subresource starts with an empty status; a custom one with none."""
        if "status" in rtype.subresources:
            if rtype.builtin:
                obj.setdefault("status", {})
            else:
                obj.pop("status", None)

    def prepare_for_update(self, rtype: ResourceType, old: JsonObject, new: JsonObject) -> None:
        """With a status subresource, the main resource does not change status."""
        if "status" in rtype.subresources:
            _keep(old, new, "status")

    defaults_on_update = True
    """Whether defaults apply again when the main resource is updated."""

    def derive(self, rtype: ResourceType, old: JsonObject | None, new: JsonObject) -> None:
        """Nothing is derived by default."""

    def after_commit(self, etype: str, rtype: ResourceType, obj: JsonObject) -> None:
        """Nothing follows by default."""

    def deletion_plan(self, obj: JsonObject, grace_period: int | None) -> DeletionPlan:
        return None

    def may_remove_now(self, obj: JsonObject) -> bool:
        return True

    def after_remove(self, obj: JsonObject) -> None:
        """Nothing follows by default."""

    def own_labels_select_namespace(self) -> bool:
        """Whether admission's namespace selector reads the object's own labels (the object is a namespace)."""
        return False


class NamespaceStrategy(Strategy):
    """Namespaces: spec and status are the server's, the name label is always set, and new namespaces get
    what kube-controller-manager adds (the default service account, the root CA ConfigMap)."""

    defaults_on_update = False

    def prepare_for_update(self, rtype: ResourceType, old: JsonObject, new: JsonObject) -> None:
        _keep(old, new, "status")
        new["spec"] = copy.deepcopy(old.get("spec", {}))
        labels = new["metadata"].setdefault("labels", {})
        if isinstance(labels, dict):
            labels["kubernetes.io/metadata.name"] = new["metadata"]["name"]

    def after_commit(self, etype: str, rtype: ResourceType, obj: JsonObject) -> None:
        if etype == "ADDED":
            self._populate(obj["metadata"]["name"])

    def deletion_plan(self, obj: JsonObject, grace_period: int | None) -> DeletionPlan:
        return TerminateNamespace()

    def own_labels_select_namespace(self) -> bool:
        return True

    def _populate(self, namespace: str) -> None:
        ctx = self.context
        now = rfc3339(ctx.now())
        sa_type = ctx.registry.find(*SERVICE_ACCOUNTS)
        cm_type = ctx.registry.find(*CONFIG_MAPS)
        assert sa_type is not None and cm_type is not None
        if ctx.store.get(SERVICE_ACCOUNTS, namespace, "default") is None:
            sa = {"apiVersion": "v1", "kind": "ServiceAccount", "metadata": _new_meta("default", namespace, now)}
            ctx.commit("ADDED", sa_type, namespace, "default", sa)
        if ctx.root_ca_pem and ctx.store.get(CONFIG_MAPS, namespace, "kube-root-ca.crt") is None:
            cm = {
                "apiVersion": "v1",
                "kind": "ConfigMap",
                "metadata": _new_meta("kube-root-ca.crt", namespace, now),
                "data": {"ca.crt": ctx.root_ca_pem},
            }
            ctx.commit("ADDED", cm_type, namespace, "kube-root-ca.crt", cm)


def _new_meta(name: str, namespace: str, now: str) -> JsonObject:
    return {"name": name, "namespace": namespace, "uid": str(uuid.uuid4()), "creationTimestamp": now}


class PodStrategy(Strategy):
    """Pods: status is the kubelet's from the start; a new pod's priority comes from its PriorityClass (the
    Priority admission plugin, :mod:`priority`); a pod bound to a node is deleted gracefully."""

    def prepare_for_create(self, rtype: ResourceType, obj: JsonObject) -> None:
        """The status stays as sent."""

    def derive(self, rtype: ResourceType, old: JsonObject | None, new: JsonObject) -> None:
        if old is None:
            classes = [item.obj for item in self.context.store.items(PRIORITY_CLASSES)]
            priority.admit_pod(new, classes)

    def deletion_plan(self, obj: JsonObject, grace_period: int | None) -> DeletionPlan:
        spec = obj.get("spec") or {}
        if grace_period == 0 or not spec.get("nodeName"):
            return None
        grace = int(spec.get("terminationGracePeriodSeconds", 30)) if grace_period is None else grace_period
        return GracefulDelete(grace) if grace > 0 else None

    def may_remove_now(self, obj: JsonObject) -> bool:
        """A pod in its grace period stays until the node deletes it again."""
        return not obj["metadata"].get("deletionGracePeriodSeconds")


class ServiceStrategy(Strategy):
    """Services: IP families and cluster IPs are decided on create and on update
    (:mod:`ambit.apiserver.service_ips`, :mod:`ambit.apiserver.service_families`)."""

    def __init__(self, context: StrategyContext, ips: ServiceIpAllocator) -> None:
        super().__init__(context)
        self.ips = ips

    def prepare_for_create(self, rtype: ResourceType, obj: JsonObject) -> None:
        self.ips.allocate(obj)

    def prepare_for_update(self, rtype: ResourceType, old: JsonObject, new: JsonObject) -> None:
        super().prepare_for_update(rtype, old, new)
        self.ips.reallocate(old, new)


class PriorityClassStrategy(Strategy):
    """PriorityClasses: ``value`` and ``preemptionPolicy`` are fixed at create; at most one is the global default
    (the Priority admission plugin's rules)."""

    def prepare_for_update(self, rtype: ResourceType, old: JsonObject, new: JsonObject) -> None:
        name = str(new["metadata"].get("name", ""))
        causes = []
        if new.get("value") != old.get("value"):
            causes.append(names.forbidden("value", "may not be changed in an update."))
        if new.get("preemptionPolicy", old.get("preemptionPolicy")) != old.get("preemptionPolicy"):
            causes.append(names.invalid("preemptionPolicy", new.get("preemptionPolicy"), "field is immutable"))
        if causes:
            raise errors.invalid(rtype.kind, name, causes, rtype.group)

    def derive(self, rtype: ResourceType, old: JsonObject | None, new: JsonObject) -> None:
        if new.get("globalDefault") is not True:
            return
        name = str(new["metadata"].get("name", ""))
        for item in self.context.store.items(PRIORITY_CLASSES):
            other = str(item.obj["metadata"].get("name", ""))
            if other != name and item.obj.get("globalDefault") is True:
                raise errors.forbidden(
                    f'priorityclasses.scheduling.k8s.io "{name}" is forbidden: PriorityClass {other} is already '
                    "marked as default. Only one default can exist"
                )


class DaemonSetStrategy(Strategy):
    """DaemonSets: the template generation (``deprecated.daemonset.template.generation``, apps/v1's form of
    ``spec.templateGeneration``) is 1 on create and grows by one with each template change; clients cannot set
    it."""

    def derive(self, rtype: ResourceType, old: JsonObject | None, new: JsonObject) -> None:
        generation = 1
        if old is not None:
            before = (old["metadata"].get("annotations") or {}).get(TEMPLATE_GENERATION, "1")
            generation = int(before) if str(before).isdigit() else 1
            if (old.get("spec") or {}).get("template") != (new.get("spec") or {}).get("template"):
                generation += 1
        annotations = new["metadata"].get("annotations")
        if not isinstance(annotations, dict):
            annotations = new["metadata"]["annotations"] = {}
        annotations[TEMPLATE_GENERATION] = str(generation)


class StatefulSetStrategy(Strategy):
    """StatefulSets: an update may change only :data:`STATEFUL_SET_MUTABLE` of the spec (kube's rule: the
    selector, ``serviceName``, ``podManagementPolicy`` and ``volumeClaimTemplates`` are fixed at create). Judged
    after defaults, so a client that leaves a defaulted field out does not change it."""

    def derive(self, rtype: ResourceType, old: JsonObject | None, new: JsonObject) -> None:
        if old is None:
            return
        before, after = old.get("spec"), new.get("spec")
        if not isinstance(before, dict) or not isinstance(after, dict):
            return
        fixed = {k: v for k, v in before.items() if k not in STATEFUL_SET_MUTABLE}
        if fixed != {k: v for k, v in after.items() if k not in STATEFUL_SET_MUTABLE}:
            allowed = ", ".join(f"'{k}'" for k in STATEFUL_SET_MUTABLE[:-1])
            why = f"updates to statefulset spec for fields other than {allowed} and 'minReadySeconds' are forbidden"
            name = str(new["metadata"].get("name", ""))
            raise errors.invalid(rtype.kind, name, [names.forbidden("spec", why)], rtype.group)


class JobStrategy(Strategy):
    """Jobs: on create, unless ``manualSelector``, the selector is the Job's uid and the template carries it and the
    Job's name (each under its ``batch.kubernetes.io/`` key and its legacy one), as kube generates them; on update
    the selector, the template and ``completionMode`` are fixed, and ``completions`` may change only with
    ``parallelism`` in an Indexed Job (kube's elastic Indexed Jobs)."""

    def derive(self, rtype: ResourceType, old: JsonObject | None, new: JsonObject) -> None:
        spec = new.get("spec")
        if not isinstance(spec, dict):
            return
        if old is None:
            if spec.get("manualSelector") is not True:
                _generate_job_selector(new["metadata"], spec)
            return
        before = old.get("spec")
        if not isinstance(before, dict):
            return
        fixed = [k for k in JOB_IMMUTABLE if before.get(k) != spec.get(k)]
        elastic = spec.get("completionMode") == "Indexed" and spec.get("completions") == spec.get("parallelism")
        if before.get("completions") != spec.get("completions") and not elastic:
            fixed.append("completions")
        if fixed:
            causes = [names.invalid(f"spec.{k}", spec.get(k), "field is immutable") for k in fixed]
            raise errors.invalid(rtype.kind, str(new["metadata"].get("name", "")), causes, rtype.group)


def _generate_job_selector(meta: JsonObject, spec: JsonObject) -> None:
    """kube's generated Job selector; a label the client set itself is kept (validation then judges the match)."""
    uid, name = str(meta.get("uid", "")), str(meta.get("name", ""))
    template = spec.setdefault("template", {})
    if not isinstance(template, dict):
        return
    template_meta = template.setdefault("metadata", {})
    if not isinstance(template_meta, dict):
        return
    labels = template_meta.setdefault("labels", {})
    if isinstance(labels, dict):
        for key, value in ((JOB_CONTROLLER_UID, uid), (JOB_NAME, name)):
            labels.setdefault(key, value)
            labels.setdefault(JOB_LEGACY_LABELS[key], value)
    selector = spec.setdefault("selector", {})
    if isinstance(selector, dict):
        match = selector.setdefault("matchLabels", {})
        if isinstance(match, dict):
            match.setdefault(JOB_CONTROLLER_UID, uid)


class ControllerRevisionStrategy(Strategy):
    """ControllerRevisions: ``data`` is immutable once created; ``revision`` may change (a rollback renumbers)."""

    def prepare_for_update(self, rtype: ResourceType, old: JsonObject, new: JsonObject) -> None:
        if new.get("data") != old.get("data"):
            name = str(new["metadata"].get("name", ""))
            raise errors.invalid(
                rtype.kind, name, [names.invalid("data", new.get("data"), "field is immutable")], rtype.group
            )


class CrdStrategy(Strategy):
    """CustomResourceDefinitions: validated, then their names accepted and their type served at once."""

    def derive(self, rtype: ResourceType, old: JsonObject | None, new: JsonObject) -> None:
        causes = validation.validate_object(rtype.kind, rtype.group, new)
        if causes:
            raise errors.invalid(rtype.kind, str(new["metadata"].get("name", "")), causes, rtype.group)
        status = _accepted_status(new, rfc3339(self.context.now()))
        new["status"] = copy.deepcopy(old["status"]) if old is not None and "status" in old else status

    def after_commit(self, etype: str, rtype: ResourceType, obj: JsonObject) -> None:
        if crd_is_established(obj):
            self.context.registry.set_custom(resource_type_from_crd(obj))

    def after_remove(self, obj: JsonObject) -> None:
        """The type stops being served: its objects go, and so do its watches."""
        ctx = self.context
        spec = obj.get("spec") or {}
        key = (spec.get("group", ""), (spec.get("names") or {}).get("plural", ""))
        rtype = ctx.registry.find(*key)
        if rtype is None or rtype.builtin:
            return
        for item in ctx.store.items(key):
            gone = copy.deepcopy(item.obj)
            ctx.hub.publish(ctx.store.remove(key, item.namespace, gone["metadata"]["name"], gone))
        ctx.hub.close_type(key)
        ctx.registry.remove_custom(key)


def _accepted_status(crd: Mapping[str, Any], now: str) -> JsonObject:
    def condition(kind: str, reason: str, message: str) -> JsonObject:
        return {"type": kind, "status": "True", "reason": reason, "message": message, "lastTransitionTime": now}

    return {
        "acceptedNames": copy.deepcopy(crd["spec"]["names"]),
        "storedVersions": [v["name"] for v in crd["spec"]["versions"] if v.get("storage")],
        "conditions": [
            condition("NamesAccepted", "NoConflicts", "no conflicts found"),
            condition("Established", "InitialNamesAccepted", "the initial names have been accepted"),
        ],
    }


def _keep(old: Mapping[str, Any], new: JsonObject, key: str) -> None:
    if key in old:
        new[key] = copy.deepcopy(old[key])
    else:
        new.pop(key, None)


class StrategyTable:
    """The strategy of every kind: the table's entry for its storage key, else the common one."""

    def __init__(self, context: StrategyContext, *, service_cidr: str) -> None:
        from ambit.apiserver import claims  # its strategies build on Strategy, defined here

        self.common = Strategy(context)
        self.by_key: dict[TypeKey, Strategy] = {
            NAMESPACES: NamespaceStrategy(context),
            PODS: PodStrategy(context),
            SERVICES: ServiceStrategy(context, ServiceIpAllocator(context.store, service_cidr)),
            CRD_KEY: CrdStrategy(context),
            PRIORITY_CLASSES: PriorityClassStrategy(context),
            CONTROLLER_REVISIONS: ControllerRevisionStrategy(context),
            DAEMON_SETS: DaemonSetStrategy(context),
            STATEFUL_SETS: StatefulSetStrategy(context),
            JOBS: JobStrategy(context),
            claims.CLAIMS: claims.ClaimStrategy(context),
            claims.VOLUMES: claims.VolumeStrategy(context),
            claims.STORAGE_CLASSES: claims.StorageClassStrategy(context),
        }

    def __getitem__(self, rtype: ResourceType) -> Strategy:
        return self.by_key.get(rtype.key, self.common)
