"""The verbs on stored resources (get, list, create, update, patch, delete) with kube-apiserver's semantics.

Order of a write, as in kube-apiserver: decode → defaults → mutating admission → validation → validating
admission → store. Nothing is stored when any step fails, and every failure is an :class:`ApiError`.

Object lifecycle rules kept here:
- ``resourceVersion`` in an update is a precondition (409 when stale); an empty one updates unconditionally.
- With a status subresource, the main resource ignores status changes and ``/status`` changes only status
  (plus labels and annotations, which istio-cni and others write through ``pods/status``).
- ``metadata.generation`` starts at 1 and grows when anything but metadata and status changes.
- Deleting an object with finalizers only sets ``deletionTimestamp``; it goes when the last finalizer is removed.
  A pod bound to a node is deleted gracefully: the node (kubelet) deletes it again with grace 0 once stopped.
- Deleting a namespace marks it Terminating, deletes what it holds, and removes it once it is empty; nothing can
  be created in a terminating namespace.
- Deleting an owner deletes (Background/Foreground) or orphans its dependents, as the garbage collector does.
"""

from __future__ import annotations

import base64
import copy
import ipaddress
import secrets
import time
import uuid
from collections.abc import Callable, Mapping
from contextvars import ContextVar
from dataclasses import dataclass, field
from datetime import UTC, datetime
from typing import Any

from ambit.apiserver import errors, patch, validation
from ambit.apiserver.admission import AdmissionAttributes, AdmissionController, AdmissionError
from ambit.apiserver.defaults import apply_defaults
from ambit.apiserver.registry import CRD_KEY, Registry, ResourceType, crd_is_established, resource_type_from_crd
from ambit.apiserver.selectors import FieldSelector, label_selector_from_spec, parse_label_selector
from ambit.apiserver.store import Store, StoredObject, decode, encode
from ambit.apiserver.tokens import (
    BoundObject,
    TokenIdentity,
    TokenIssuer,
    TokenRejected,
    check_bound_objects,
    token_review_status,
)
from ambit.apiserver.watch import ObjectFilter, WatchHub

JsonObject = dict[str, Any]

NAMESPACES = ("", "namespaces")
PODS = ("", "pods")
SERVICES = ("", "services")
SERVICE_ACCOUNTS = ("", "serviceaccounts")
CONFIG_MAPS = ("", "configmaps")
VALIDATING = ("admissionregistration.k8s.io", "validatingwebhookconfigurations")
MUTATING = ("admissionregistration.k8s.io", "mutatingwebhookconfigurations")
SYSTEM_NAMESPACES = ("default", "kube-system", "kube-public", "kube-node-lease")
PATCH_TYPES = frozenset(
    {"application/json-patch+json", "application/merge-patch+json", "application/strategic-merge-patch+json"}
)


@dataclass(frozen=True, slots=True)
class User:
    username: str
    uid: str = ""
    groups: tuple[str, ...] = ()
    extra: Mapping[str, list[str]] = field(default_factory=dict)

    def info(self) -> JsonObject:
        out: JsonObject = {"username": self.username, "groups": list(self.groups)}
        if self.uid:
            out["uid"] = self.uid
        if self.extra:
            out["extra"] = {k: list(v) for k, v in self.extra.items()}
        return out


@dataclass(frozen=True, slots=True)
class DeleteOptions:
    grace_period: int | None = None
    propagation: str = "Background"
    precondition_uid: str | None = None
    precondition_rv: str | None = None
    dry_run: bool = False

    @classmethod
    def from_body(cls, body: Any, query: Mapping[str, str]) -> DeleteOptions:
        options = body if isinstance(body, dict) else {}
        grace = options.get("gracePeriodSeconds", query.get("gracePeriodSeconds"))
        propagation = options.get("propagationPolicy") or query.get("propagationPolicy") or "Background"
        if options.get("orphanDependents") is True or query.get("orphanDependents") == "true":
            propagation = "Orphan"
        if propagation not in ("Background", "Foreground", "Orphan"):
            raise errors.bad_request(f"unknown propagationPolicy {propagation!r}")
        pre = options.get("preconditions") or {}
        if not isinstance(pre, dict):
            raise errors.bad_request("preconditions must be an object")
        dry = options.get("dryRun") or query.get("dryRun")
        try:
            grace_value = None if grace is None else int(grace)
        except (TypeError, ValueError):
            raise errors.bad_request(f"gracePeriodSeconds must be an integer, not {grace!r}") from None
        if grace_value is not None and grace_value < 0:
            grace_value = 0
        return cls(grace_value, propagation, pre.get("uid"), pre.get("resourceVersion"), bool(dry))


@dataclass(frozen=True, slots=True)
class ListResult:
    items: list[StoredObject]
    resource_version: int
    continue_token: str
    remaining: int | None


def rfc3339(ts: float) -> str:
    return datetime.fromtimestamp(ts, UTC).strftime("%Y-%m-%dT%H:%M:%SZ")


def _meta(obj: JsonObject) -> JsonObject:
    meta = obj.get("metadata")
    if not isinstance(meta, dict):
        meta = {}
        obj["metadata"] = meta
    return meta


def _content(obj: Mapping[str, Any]) -> JsonObject:
    """What generation counts: everything but metadata and status."""
    return {k: v for k, v in obj.items() if k not in ("metadata", "status")}


class ResourceManager:
    """All verbs on all resources; one per server, used from the event loop only."""

    def __init__(
        self,
        store: Store,
        registry: Registry,
        hub: WatchHub,
        *,
        tokens: TokenIssuer,
        admission: AdmissionController | None = None,
        clock: Callable[[], float] = time.time,
        service_cidr: str = "198.19.0.0/16",
        root_ca_pem: str = "",
    ) -> None:
        self.store = store
        self.registry = registry
        self.hub = hub
        self.tokens = tokens
        self.admission = admission
        self.clock = clock
        self.service_network = ipaddress.ip_network(service_cidr)
        self.root_ca_pem = root_ca_pem
        for crd in store.items(CRD_KEY):
            if crd_is_established(crd.obj):
                registry.set_custom(resource_type_from_crd(crd.obj))

    # -- reads ----------------------------------------------------------------------------------------------
    def get(self, rtype: ResourceType, namespace: str, name: str) -> StoredObject:
        item = self.store.get(rtype.key, namespace, name)
        if item is None:
            raise errors.not_found(rtype.plural, name, rtype.group)
        return item

    def selection(self, rtype: ResourceType, namespace: str | None, labels: str, fields: str) -> ObjectFilter:
        label_sel = parse_label_selector(labels) if labels else None
        field_sel = FieldSelector.parse(fields, rtype.field_selectors) if fields else None
        if field_sel is not None and rtype.field_path is not None:
            translate = rtype.field_path
            field_sel = FieldSelector(tuple(r._replace(path=translate(r.path)) for r in field_sel.requirements))
        return ObjectFilter(namespace, label_sel, field_sel)

    def list_items(
        self, rtype: ResourceType, selection: ObjectFilter, *, limit: int = 0, continue_token: str = ""
    ) -> ListResult:
        rv = self.store.resource_version
        start: tuple[str, str] | None = None
        if continue_token:
            start, rv = _decode_continue(continue_token)
            if rv < self.store.horizon:
                raise errors.gone(
                    "The provided continue parameter is too old to display a consistent list result. "
                    "You can start a new list without the continue parameter."
                )
        items = self.store.items(rtype.key, selection.namespace, after=start)
        if selection.labels is not None or selection.fields is not None:
            items = [i for i in items if selection.matches(i)]
        if limit > 0 and len(items) > limit:
            last = items[limit - 1]
            token = _encode_continue((last.namespace, last.obj["metadata"]["name"]), rv)
            return ListResult(items[:limit], rv, token, len(items) - limit)
        return ListResult(items, rv, "", None)

    # -- create ---------------------------------------------------------------------------------------------
    async def create(
        self, rtype: ResourceType, version: str, namespace: str, body: Any, user: User, *, dry_run: bool = False
    ) -> JsonObject:
        obj = self._check_body(rtype, version, namespace, body)
        meta = _meta(obj)
        if meta.get("resourceVersion"):
            raise errors.bad_request("resourceVersion should not be set on objects to be created")
        if not meta.get("name"):
            prefix = meta.get("generateName")
            if not prefix or not isinstance(prefix, str):
                raise errors.invalid(rtype.kind, "", [("metadata.name", "name or generateName is required")])
            meta["name"] = self._generated_name(rtype, namespace, prefix)
        name = str(meta["name"])
        if rtype.namespaced:
            self._check_namespace_open(namespace)
        for key in ("uid", "deletionTimestamp", "deletionGracePeriodSeconds", "selfLink", "managedFields"):
            meta.pop(key, None)
        meta["uid"] = str(uuid.uuid4())
        meta["creationTimestamp"] = rfc3339(self.clock())
        meta["generation"] = 1
        apply_defaults(rtype.group, rtype.kind, obj)
        if rtype.builtin and "status" in rtype.subresources and rtype.key not in (("", "pods"), ("", "services")):
            obj.setdefault("status", {})
        elif not rtype.builtin and "status" in rtype.subresources:
            obj.pop("status", None)
        if rtype.key == SERVICES:
            self._allocate_cluster_ip(obj)
        if rtype.key == CRD_KEY:
            self._prepare_crd(obj)
        attrs = self._attributes("CREATE", rtype, version, namespace, name, obj, None, user, "", dry_run)
        obj = await self._mutate(attrs, obj)
        self._validate(rtype, obj)
        await self._admit(attrs, obj)
        if self.store.get(rtype.key, namespace, name) is not None:
            raise errors.already_exists(rtype.plural, name, rtype.group)
        if dry_run:
            return obj
        self._commit("ADDED", rtype, namespace, name, obj)
        return obj

    def _check_body(self, rtype: ResourceType, version: str, namespace: str, body: Any) -> JsonObject:
        if not isinstance(body, dict):
            raise errors.bad_request("the request body must be a JSON or YAML object")
        obj = body  # callers hand over a freshly decoded body: it is changed in place
        api_version = rtype.api_version(version)
        sent_version = obj.get("apiVersion")
        sent_kind = obj.get("kind")
        if sent_kind is not None and sent_kind != rtype.kind:
            raise errors.bad_request(
                f"the kind in the data ({sent_kind}) does not match the expected kind ({rtype.kind})"
            )
        if sent_version is not None and sent_version != api_version:
            raise errors.bad_request(
                f"the API version in the data ({sent_version}) does not match the expected API version ({api_version})"
            )
        obj["apiVersion"] = api_version
        obj["kind"] = rtype.kind
        meta = obj.get("metadata", {})
        if not isinstance(meta, dict):
            raise errors.bad_request("metadata must be an object")
        obj["metadata"] = meta
        if rtype.namespaced:
            sent_ns = meta.get("namespace")
            if sent_ns and sent_ns != namespace:
                raise errors.bad_request(
                    "the namespace of the provided object does not match the namespace sent on the request"
                )
            meta["namespace"] = namespace
        else:
            meta.pop("namespace", None)
        if rtype.to_storage is not None:
            obj = rtype.to_storage(obj)
        return obj

    def _check_namespace_open(self, namespace: str) -> None:
        ns = self.store.get(NAMESPACES, "", namespace)
        if ns is None:
            raise errors.not_found("namespaces", namespace)
        if ns.obj["metadata"].get("deletionTimestamp"):
            raise errors.forbidden(
                f"unable to create new content in namespace {namespace} because it is being terminated"
            )

    def _generated_name(self, rtype: ResourceType, namespace: str, prefix: str) -> str:
        alphabet = "bcdfghjklmnpqrstvwxz2456789"
        for _ in range(8):
            suffix = "".join(secrets.choice(alphabet) for _ in range(5))
            name = validation.generate_name(prefix, suffix)
            if self.store.get(rtype.key, namespace, name) is None:
                return name
        raise errors.ApiError(409, "AlreadyExists", f"could not generate a unique name from {prefix!r}")

    def _allocate_cluster_ip(self, obj: JsonObject) -> None:
        spec = obj.get("spec")
        if not isinstance(spec, dict) or spec.get("type") == "ExternalName":
            return
        wanted = spec.get("clusterIP")
        if wanted == "None":
            spec["clusterIPs"] = ["None"]
            return
        used = {
            s.obj.get("spec", {}).get("clusterIP")
            for s in self.store.items(SERVICES)
            if isinstance(s.obj.get("spec"), dict)
        }
        if wanted:
            try:
                address = ipaddress.ip_address(wanted)
            except ValueError:
                raise errors.invalid("Service", "", [("spec.clusterIP", f"{wanted!r} is not a valid IP")]) from None
            if address not in self.service_network:
                raise errors.invalid(
                    "Service", "", [("spec.clusterIP", f"{wanted} is not in the service range {self.service_network}")]
                )
            if wanted in used:
                raise errors.invalid("Service", "", [("spec.clusterIP", f"{wanted} is already allocated")])
            spec["clusterIPs"] = [wanted]
            return
        for host in self.service_network.hosts():
            text = str(host)
            if text not in used and not text.endswith(".0"):
                spec["clusterIP"] = text
                spec["clusterIPs"] = [text]
                return
        raise errors.ApiError(500, "InternalError", f"the service IP range {self.service_network} is full")

    def _prepare_crd(self, obj: JsonObject) -> None:
        causes = _crd_causes(obj)
        if causes:
            raise errors.invalid(
                "CustomResourceDefinition", str(obj["metadata"].get("name", "")), causes, "apiextensions.k8s.io"
            )
        names = obj["spec"]["names"]
        now = rfc3339(self.clock())
        obj["status"] = {
            "acceptedNames": copy.deepcopy(names),
            "storedVersions": [v["name"] for v in obj["spec"]["versions"] if v.get("storage")],
            "conditions": [
                {
                    "type": "NamesAccepted",
                    "status": "True",
                    "reason": "NoConflicts",
                    "message": "no conflicts found",
                    "lastTransitionTime": now,
                },
                {
                    "type": "Established",
                    "status": "True",
                    "reason": "InitialNamesAccepted",
                    "message": "the initial names have been accepted",
                    "lastTransitionTime": now,
                },
            ],
        }

    # -- update and patch -----------------------------------------------------------------------------------
    async def update(
        self,
        rtype: ResourceType,
        version: str,
        namespace: str,
        name: str,
        body: Any,
        user: User,
        *,
        subresource: str = "",
        dry_run: bool = False,
    ) -> JsonObject:
        obj = self._check_body(rtype, version, namespace, body)
        meta = obj["metadata"]
        if meta.get("name") not in (None, name):
            raise errors.bad_request(
                f"the name of the object ({meta.get('name')}) does not match the name on the URL ({name})"
            )
        meta["name"] = name
        current = self.get(rtype, namespace, name)
        sent_rv = meta.get("resourceVersion")
        if sent_rv and str(sent_rv) != str(current.rv):
            raise errors.conflict(
                rtype.plural,
                name,
                "the object has been modified; please apply your changes to the latest version and try again",
                rtype.group,
            )
        return await self._replace(rtype, version, current, obj, user, subresource, dry_run)

    async def patch(
        self,
        rtype: ResourceType,
        version: str,
        namespace: str,
        name: str,
        content_type: str,
        body: bytes,
        user: User,
        *,
        subresource: str = "",
        dry_run: bool = False,
    ) -> JsonObject:
        current = self.get(rtype, namespace, name)
        # The media type is judged before the body: an apply body is YAML, and must get the clear 415.
        if content_type == "application/apply-patch+yaml":
            raise errors.ApiError(
                415,
                "UnsupportedMediaType",
                "server-side apply (application/apply-patch+yaml) is not supported by the embedded API server; "
                "use client-side apply (kubectl apply without --server-side)",
            )
        if content_type == "application/strategic-merge-patch+json" and not rtype.builtin:
            raise errors.ApiError(
                415,
                "UnsupportedMediaType",
                f"strategic merge patch is not supported for custom resources ({rtype.kind}); use --type=merge",
            )
        if content_type not in PATCH_TYPES:
            raise errors.unsupported_media_type(content_type)
        try:
            patch_doc = decode(body)
        except Exception:
            raise errors.bad_request("the patch is not valid JSON") from None
        base = copy.deepcopy(current.obj)
        if rtype.from_storage is not None:
            base = rtype.from_storage(base)
        base["apiVersion"] = rtype.api_version(version)
        if content_type == "application/json-patch+json":
            patched = patch.json_patch(base, patch_doc)
        elif content_type == "application/merge-patch+json":
            patched = patch.json_merge_patch(base, patch_doc)
        else:
            if not isinstance(patch_doc, dict):
                raise errors.bad_request("a strategic merge patch must be a JSON object")
            patched = patch.strategic_merge_patch(base, patch_doc, patch.merge_keys_for(rtype.group, rtype.kind))
        if not isinstance(patched, dict):
            raise errors.unprocessable("the patched object is not a JSON object")
        obj = self._check_body(rtype, version, namespace, patched)
        meta = obj["metadata"]
        if meta.get("name") != name:
            raise errors.bad_request("a patch cannot change the object's name")
        if str(meta.get("resourceVersion", "")) not in ("", str(current.rv)):
            raise errors.conflict(
                rtype.plural,
                name,
                "the object has been modified; please apply your changes to the latest version and try again",
                rtype.group,
            )
        return await self._replace(rtype, version, current, obj, user, subresource, dry_run)

    async def _replace(
        self,
        rtype: ResourceType,
        version: str,
        current: StoredObject,
        obj: JsonObject,
        user: User,
        subresource: str,
        dry_run: bool,
    ) -> JsonObject:
        old = current.obj
        namespace = current.namespace
        name = old["metadata"]["name"]
        new = self._merge_update(rtype, old, obj, subresource)
        if subresource != "status" and rtype.key != NAMESPACES:
            apply_defaults(rtype.group, rtype.kind, new, creating=False)
        if rtype.key == CRD_KEY and subresource != "status":
            self._prepare_crd(new)
            new["status"] = copy.deepcopy(old.get("status", new["status"]))
        attrs = self._attributes("UPDATE", rtype, version, namespace, name, new, old, user, subresource, dry_run)
        new = await self._mutate(attrs, new)
        self._validate(rtype, new)
        await self._admit(attrs, new)
        old_cmp = dict(old)
        old_cmp["metadata"] = {k: v for k, v in old["metadata"].items() if k != "resourceVersion"}
        new_cmp = dict(new)
        new_cmp["metadata"] = {k: v for k, v in new["metadata"].items() if k != "resourceVersion"}
        new_cmp["apiVersion"] = old_cmp.get("apiVersion")
        if encode(old_cmp) == encode(new_cmp):
            return copy.deepcopy(old)  # a no-op write keeps its version, as in Kubernetes
        if dry_run:
            return new
        self._commit("MODIFIED", rtype, namespace, name, new)
        meta = new["metadata"]
        if meta.get("deletionTimestamp") and not meta.get("finalizers") and self._may_remove_now(rtype, new):
            self._remove(rtype, namespace, name, new, "Background")
        return new

    def _merge_update(self, rtype: ResourceType, old: JsonObject, obj: JsonObject, subresource: str) -> JsonObject:
        old_meta = old["metadata"]
        if subresource == "status":
            new = copy.deepcopy(old)
            new["apiVersion"] = rtype.storage_api_version
            if "status" in obj:
                new["status"] = obj["status"]
            else:
                new.pop("status", None)
            for key in ("labels", "annotations"):
                if key in obj["metadata"]:
                    new["metadata"][key] = obj["metadata"][key]
                else:
                    new["metadata"].pop(key, None)
            return new
        new = obj
        meta = new["metadata"]
        for key in ("uid", "creationTimestamp", "deletionTimestamp", "deletionGracePeriodSeconds", "generation"):
            if key in old_meta:
                meta[key] = old_meta[key]
            else:
                meta.pop(key, None)
        if old_meta.get("deletionTimestamp"):
            # Finalizers may only be removed once deletion started.
            added = set(meta.get("finalizers") or []) - set(old_meta.get("finalizers") or [])
            if added:
                raise errors.forbidden(
                    "no new finalizers can be added if the object is being deleted, "
                    f"found new finalizers {sorted(added)}"
                )
        if "status" in rtype.subresources or rtype.key == NAMESPACES:
            if "status" in old:
                new["status"] = copy.deepcopy(old["status"])
            else:
                new.pop("status", None)
        if rtype.key == NAMESPACES:
            new["spec"] = copy.deepcopy(old.get("spec", {}))
            labels = meta.setdefault("labels", {})
            if isinstance(labels, dict):
                labels["kubernetes.io/metadata.name"] = meta["name"]
        if rtype.key == SERVICES:
            old_spec, new_spec = old.get("spec") or {}, new.get("spec")
            if isinstance(new_spec, dict):
                for key in ("clusterIP", "clusterIPs"):
                    if not new_spec.get(key) and key in old_spec:
                        new_spec[key] = old_spec[key]
                if new_spec.get("clusterIP") != old_spec.get("clusterIP"):
                    raise errors.invalid("Service", meta["name"], [("spec.clusterIP", "field is immutable")])
        if _content(new) != _content(old):
            meta["generation"] = int(old_meta.get("generation", 1)) + 1
        return new

    # -- scale subresource (autoscaling/v1 Scale: kubectl scale) ----------------------------------------------
    def scale_of(self, rtype: ResourceType, namespace: str, name: str) -> JsonObject:
        obj = self.get(rtype, namespace, name).obj
        meta, spec, status = obj["metadata"], obj.get("spec") or {}, obj.get("status") or {}
        selector = label_selector_from_spec(spec.get("selector")) if isinstance(spec.get("selector"), dict) else None
        return {
            "kind": "Scale",
            "apiVersion": "autoscaling/v1",
            "metadata": {
                k: meta[k] for k in ("name", "namespace", "uid", "resourceVersion", "creationTimestamp") if k in meta
            },
            "spec": {"replicas": int(spec.get("replicas", 1))},
            "status": {"replicas": int(status.get("replicas", 0)), "selector": str(selector or "")},
        }

    async def update_scale(
        self,
        rtype: ResourceType,
        version: str,
        namespace: str,
        name: str,
        body: Any,
        user: User,
        *,
        dry_run: bool = False,
    ) -> JsonObject:
        current = self.get(rtype, namespace, name)
        spec = body.get("spec") if isinstance(body, dict) else None
        replicas = spec.get("replicas") if isinstance(spec, dict) else None
        if not isinstance(replicas, int) or isinstance(replicas, bool) or replicas < 0:
            raise errors.invalid("Scale", name, [("spec.replicas", "must be a non-negative integer")], "autoscaling")
        sent_rv = (
            (body.get("metadata") or {}).get("resourceVersion") if isinstance(body.get("metadata"), dict) else None
        )
        if sent_rv and str(sent_rv) != str(current.rv):
            raise errors.conflict(
                rtype.plural,
                name,
                "the object has been modified; please apply your changes to the latest version and try again",
                rtype.group,
            )
        new = copy.deepcopy(current.obj)
        new.setdefault("spec", {})["replicas"] = replicas
        await self._replace(rtype, version, current, new, user, "", dry_run)
        return self.scale_of(rtype, namespace, name)

    async def patch_scale(
        self,
        rtype: ResourceType,
        version: str,
        namespace: str,
        name: str,
        content_type: str,
        body: bytes,
        user: User,
        *,
        dry_run: bool = False,
    ) -> JsonObject:
        scale = self.scale_of(rtype, namespace, name)
        try:
            doc = decode(body)
        except Exception:
            raise errors.bad_request("the patch is not valid JSON") from None
        if content_type == "application/json-patch+json":
            patched = patch.json_patch(scale, doc)
        elif content_type in ("application/merge-patch+json", "application/strategic-merge-patch+json"):
            patched = patch.json_merge_patch(scale, doc)
        else:
            raise errors.unsupported_media_type(content_type)
        return await self.update_scale(rtype, version, namespace, name, patched, user, dry_run=dry_run)

    # -- delete ---------------------------------------------------------------------------------------------
    async def delete(
        self, rtype: ResourceType, version: str, namespace: str, name: str, options: DeleteOptions, user: User
    ) -> JsonObject:
        current = self.get(rtype, namespace, name)
        meta = current.obj["metadata"]
        if options.precondition_uid and options.precondition_uid != meta.get("uid"):
            raise errors.conflict(
                rtype.plural,
                name,
                f"Precondition failed: UID in precondition: {options.precondition_uid}, "
                f"UID in object meta: {meta.get('uid')}",
                rtype.group,
            )
        if options.precondition_rv and options.precondition_rv != str(current.rv):
            raise errors.conflict(
                rtype.plural,
                name,
                f"Precondition failed: ResourceVersion in precondition: {options.precondition_rv}, "
                f"ResourceVersion in object meta: {current.rv}",
                rtype.group,
            )
        attrs = self._attributes(
            "DELETE", rtype, version, namespace, name, None, current.obj, user, "", options.dry_run
        )
        await self._admit(attrs, None)
        obj = copy.deepcopy(current.obj)
        if options.dry_run:
            return obj
        return self.delete_now(rtype, obj, options)

    def delete_now(self, rtype: ResourceType, obj: JsonObject, options: DeleteOptions) -> JsonObject:
        """Delete (or start deleting) an object already fetched; no admission (used by cascades too)."""
        meta = obj["metadata"]
        namespace, name = meta.get("namespace", ""), meta["name"]
        now = self.clock()
        if rtype.key == NAMESPACES:
            if not meta.get("deletionTimestamp"):
                meta["deletionTimestamp"] = rfc3339(now)
                meta["deletionGracePeriodSeconds"] = 0
                obj["status"] = {"phase": "Terminating"}
                self._commit("MODIFIED", rtype, "", name, obj)
                self._delete_namespace_contents(name)
            return self._finalize_namespace(name) or obj
        if rtype.key == PODS and options.grace_period != 0 and (obj.get("spec") or {}).get("nodeName"):
            grace = options.grace_period
            if grace is None:
                grace = int((obj.get("spec") or {}).get("terminationGracePeriodSeconds", 30))
            if grace > 0:
                current_grace = meta.get("deletionGracePeriodSeconds")
                if not meta.get("deletionTimestamp") or (current_grace is not None and grace < current_grace):
                    meta["deletionTimestamp"] = rfc3339(now + grace)
                    meta["deletionGracePeriodSeconds"] = grace
                    self._commit("MODIFIED", rtype, namespace, name, obj)
                return obj
        if meta.get("finalizers"):
            if not meta.get("deletionTimestamp") or meta.get("deletionGracePeriodSeconds"):
                meta["deletionTimestamp"] = meta.get("deletionTimestamp") or rfc3339(now)
                meta["deletionGracePeriodSeconds"] = 0
                self._commit("MODIFIED", rtype, namespace, name, obj)
            return obj
        meta.setdefault("deletionTimestamp", rfc3339(now))
        meta["deletionGracePeriodSeconds"] = 0
        self._remove(rtype, namespace, name, obj, options.propagation)
        return obj

    def _may_remove_now(self, rtype: ResourceType, obj: JsonObject) -> bool:
        """A pod in its grace period stays until the node deletes it again."""
        return not (rtype.key == PODS and obj["metadata"].get("deletionGracePeriodSeconds"))

    def _remove(self, rtype: ResourceType, namespace: str, name: str, obj: JsonObject, propagation: str) -> None:
        self.hub.publish(self.store.remove(rtype.key, namespace, name, obj))
        if rtype.key == CRD_KEY:
            self._drop_crd_type(obj)
        self._collect_dependents(namespace, str(obj["metadata"].get("uid", "")), propagation)
        if namespace:
            ns = self.store.get(NAMESPACES, "", namespace)
            if ns is not None and ns.obj["metadata"].get("deletionTimestamp"):
                self._finalize_namespace(namespace)

    def _delete_namespace_contents(self, namespace: str) -> None:
        for rtype in list(self.registry):
            if not rtype.namespaced or rtype.key in (("authentication.k8s.io", "tokenreviews"),):
                continue
            for item in self.store.items(rtype.key, namespace):
                if self.store.get(rtype.key, namespace, item.obj["metadata"]["name"]) is None:
                    continue
                self.delete_now(rtype, copy.deepcopy(item.obj), DeleteOptions())

    def _finalize_namespace(self, namespace: str) -> JsonObject | None:
        ns = self.store.get(NAMESPACES, "", namespace)
        if ns is None or not ns.obj["metadata"].get("deletionTimestamp"):
            return None
        for rtype in self.registry:
            if rtype.namespaced and self.store.count(rtype.key, namespace):
                return None
        obj = copy.deepcopy(ns.obj)
        if obj["metadata"].get("finalizers"):
            return None
        spec = obj.get("spec")
        if isinstance(spec, dict):
            spec["finalizers"] = []
        self.hub.publish(self.store.remove(NAMESPACES, "", namespace, obj))
        return obj

    def _collect_dependents(self, namespace: str, owner_uid: str, propagation: str) -> None:
        if not owner_uid:
            return
        for rtype in list(self.registry):
            if rtype.namespaced and not namespace:
                scopes: list[str | None] = [None]
            elif rtype.namespaced:
                scopes = [namespace]
            else:
                scopes = [""] if not namespace else []
            for scope in scopes:
                for item in self.store.items(rtype.key, scope):
                    refs = item.obj["metadata"].get("ownerReferences") or []
                    if not any(isinstance(r, dict) and r.get("uid") == owner_uid for r in refs):
                        continue
                    if self.store.get(rtype.key, item.namespace, item.obj["metadata"]["name"]) is None:
                        continue
                    obj = copy.deepcopy(item.obj)
                    remaining = [r for r in refs if not (isinstance(r, dict) and r.get("uid") == owner_uid)]
                    if propagation == "Orphan" or remaining:
                        if remaining:
                            obj["metadata"]["ownerReferences"] = remaining
                        else:
                            obj["metadata"].pop("ownerReferences", None)
                        self._commit("MODIFIED", rtype, item.namespace, obj["metadata"]["name"], obj)
                    elif not obj["metadata"].get("deletionTimestamp"):
                        self.delete_now(rtype, obj, DeleteOptions())

    def _drop_crd_type(self, crd: JsonObject) -> None:
        spec = crd.get("spec") or {}
        key = (spec.get("group", ""), (spec.get("names") or {}).get("plural", ""))
        rtype = self.registry.find(*key)
        if rtype is None or rtype.builtin:
            return
        for item in self.store.items(key):
            obj = copy.deepcopy(item.obj)
            self.hub.publish(self.store.remove(key, item.namespace, obj["metadata"]["name"], obj))
        self.hub.close_type(key)
        self.registry.remove_custom(key)

    # -- tokens ---------------------------------------------------------------------------------------------
    def request_token(self, namespace: str, name: str, body: Any) -> JsonObject:
        sa = self.store.get(SERVICE_ACCOUNTS, namespace, name)
        if sa is None:
            raise errors.not_found("serviceaccounts", name)
        if not isinstance(body, dict):
            raise errors.bad_request("the TokenRequest must be an object")
        spec = body.get("spec", {})
        if spec is None:
            spec = {}
        if not isinstance(spec, dict):
            raise errors.bad_request("spec must be an object")
        audiences = spec.get("audiences") or list(self.tokens.default_audiences)
        if not isinstance(audiences, list) or not all(isinstance(a, str) for a in audiences):
            raise errors.invalid(
                "TokenRequest", name, [("spec.audiences", "must be a list of strings")], "authentication.k8s.io"
            )
        expiration = spec.get("expirationSeconds", 3600)
        if not isinstance(expiration, int) or expiration < 600:
            raise errors.invalid(
                "TokenRequest",
                name,
                [("spec.expirationSeconds", "may not specify a duration less than 10 minutes")],
                "authentication.k8s.io",
            )
        bound: BoundObject | None = None
        ref = spec.get("boundObjectRef")
        if ref:
            if not isinstance(ref, dict) or ref.get("kind") != "Pod":
                raise errors.invalid(
                    "TokenRequest",
                    name,
                    [("spec.boundObjectRef.kind", "only Pod is supported")],
                    "authentication.k8s.io",
                )
            pod = self.store.get(PODS, namespace, str(ref.get("name", "")))
            if pod is None:
                raise errors.not_found("pods", str(ref.get("name", "")))
            if ref.get("uid") and ref["uid"] != pod.obj["metadata"]["uid"]:
                raise errors.conflict(
                    "pods", str(ref.get("name")), "the UID in the bound object reference does not match the pod"
                )
            bound = BoundObject(pod.obj["metadata"]["name"], pod.obj["metadata"]["uid"])
        now = self.clock()
        issued = self.tokens.issue(
            namespace=namespace,
            service_account=name,
            service_account_uid=sa.obj["metadata"]["uid"],
            audiences=audiences,
            now=now,
            expiration_seconds=expiration,
            bound_pod=bound,
        )
        out_spec = dict(spec)
        out_spec["audiences"] = audiences
        out_spec["expirationSeconds"] = int(issued.expires_at) - int(now)  # the lifetime granted, whole seconds
        return {
            "kind": "TokenRequest",
            "apiVersion": "authentication.k8s.io/v1",
            "metadata": {"name": name, "namespace": namespace, "creationTimestamp": rfc3339(now)},
            "spec": out_spec,
            "status": {"token": issued.token, "expirationTimestamp": rfc3339(issued.expires_at)},
        }

    def review_token(self, token: str, audiences: list[str]) -> TokenIdentity | TokenRejected:
        """Authenticate a service-account token: the signature, expiry and audience, and that what it is bound
        to (the service account, the pod) still exists with the same uid."""
        now = self.clock()
        result = self.tokens.review(token, audiences=audiences, now=now)
        if isinstance(result, TokenRejected):
            return result
        sa = self.store.get(SERVICE_ACCOUNTS, result.namespace, result.service_account.name)
        pod_uid: str | None = None
        pod_deleting = False
        if result.pod is not None:
            pod = self.store.get(PODS, result.namespace, result.pod.name)
            if pod is not None:
                pod_uid = pod.obj["metadata"].get("uid")
                deletion = pod.obj["metadata"].get("deletionTimestamp")
                pod_deleting = bool(deletion) and str(deletion) < rfc3339(now)
        rejected = check_bound_objects(
            result,
            service_account_uid=sa.obj["metadata"].get("uid") if sa else None,
            pod_uid=pod_uid,
            pod_deleting=pod_deleting,
        )
        return rejected or result

    def token_review(self, body: Any) -> JsonObject:
        if not isinstance(body, dict) or not isinstance(body.get("spec"), dict):
            raise errors.bad_request("a TokenReview needs a spec")
        spec = body["spec"]
        token = spec.get("token")
        if not isinstance(token, str) or not token:
            raise errors.invalid("TokenReview", "", [("spec.token", "required")], "authentication.k8s.io")
        audiences = spec.get("audiences") or []
        if not isinstance(audiences, list) or not all(isinstance(a, str) for a in audiences):
            raise errors.invalid(
                "TokenReview", "", [("spec.audiences", "must be a list of strings")], "authentication.k8s.io"
            )
        result = self.review_token(token, audiences)
        status = token_review_status(result)
        return {
            "kind": "TokenReview",
            "apiVersion": "authentication.k8s.io/v1",
            "metadata": {"creationTimestamp": None},
            "spec": spec,
            "status": status,
        }

    # -- bootstrap ------------------------------------------------------------------------------------------
    async def bootstrap(self, crds: list[JsonObject]) -> None:
        """System namespaces and the CRDs the mesh reads; existing objects are left as they are."""
        admin = User("system:apiserver", groups=("system:masters",))
        ns_type = self.registry.find("", "namespaces")
        crd_type = self.registry.find(*CRD_KEY)
        assert ns_type is not None and crd_type is not None
        for name in SYSTEM_NAMESPACES:
            if self.store.get(NAMESPACES, "", name) is None:
                await self.create(ns_type, "v1", "", {"metadata": {"name": name}}, admin)
        for crd in crds:
            name = crd.get("metadata", {}).get("name", "")
            current = self.store.get(CRD_KEY, "", name)
            if current is None:
                await self.create(crd_type, "v1", "", crd, admin)
            elif current.obj.get("spec") != crd.get("spec"):
                body = copy.deepcopy(crd)
                body["metadata"]["resourceVersion"] = str(current.rv)
                await self.update(crd_type, "v1", "", name, body, admin)

    # -- plumbing -------------------------------------------------------------------------------------------
    def _commit(self, etype: str, rtype: ResourceType, namespace: str, name: str, obj: JsonObject) -> None:
        obj["apiVersion"] = rtype.storage_api_version
        event = self.store.put(etype, rtype.key, namespace, name, obj)
        self.hub.publish(event)
        if rtype.key == CRD_KEY and crd_is_established(obj):
            self.registry.set_custom(resource_type_from_crd(obj))
        if rtype.key == NAMESPACES and etype == "ADDED":
            self._populate_namespace(name)

    def _populate_namespace(self, namespace: str) -> None:
        """What kube-controller-manager adds to a new namespace: the default service account, the root CA."""
        now = rfc3339(self.clock())
        sa_type = self.registry.find(*SERVICE_ACCOUNTS)
        cm_type = self.registry.find(*CONFIG_MAPS)
        assert sa_type is not None and cm_type is not None
        if self.store.get(SERVICE_ACCOUNTS, namespace, "default") is None:
            self._commit(
                "ADDED",
                sa_type,
                namespace,
                "default",
                {
                    "apiVersion": "v1",
                    "kind": "ServiceAccount",
                    "metadata": {
                        "name": "default",
                        "namespace": namespace,
                        "uid": str(uuid.uuid4()),
                        "creationTimestamp": now,
                    },
                },
            )
        if self.root_ca_pem and self.store.get(CONFIG_MAPS, namespace, "kube-root-ca.crt") is None:
            self._commit(
                "ADDED",
                cm_type,
                namespace,
                "kube-root-ca.crt",
                {
                    "apiVersion": "v1",
                    "kind": "ConfigMap",
                    "metadata": {
                        "name": "kube-root-ca.crt",
                        "namespace": namespace,
                        "uid": str(uuid.uuid4()),
                        "creationTimestamp": now,
                    },
                    "data": {"ca.crt": self.root_ca_pem},
                },
            )

    def _validate(self, rtype: ResourceType, obj: JsonObject) -> None:
        causes = validation.validate_object(rtype.kind, rtype.key[0], obj)
        if causes:
            raise errors.invalid(rtype.kind, str(obj["metadata"].get("name", "")), causes, rtype.group)

    def _attributes(
        self,
        operation: str,
        rtype: ResourceType,
        version: str,
        namespace: str,
        name: str,
        obj: JsonObject | None,
        old: JsonObject | None,
        user: User,
        subresource: str,
        dry_run: bool,
    ) -> AdmissionAttributes:
        if rtype.key == NAMESPACES:
            ns_labels = ((obj or old or {}).get("metadata") or {}).get("labels") or {}
        elif rtype.namespaced:
            ns = self.store.get(NAMESPACES, "", namespace)
            ns_labels = (ns.obj["metadata"].get("labels") or {}) if ns else {}
        else:
            ns_labels = None
        return AdmissionAttributes(
            operation=operation,
            group=rtype.group,
            version=version,
            resource=rtype.plural,
            subresource=subresource,
            kind_group=rtype.group,
            kind_version=version,
            kind=rtype.kind,
            namespace=namespace if rtype.namespaced else "",
            name=name,
            object=obj,
            old_object=old,
            user_info=user.info(),
            dry_run=dry_run,
            namespace_labels=ns_labels,
        )

    def _webhooks(self, key: tuple[str, str]) -> list[Mapping[str, Any]]:
        return [item.obj for item in self.store.items(key)]

    async def _mutate(self, attrs: AdmissionAttributes, obj: JsonObject) -> JsonObject:
        if self.admission is None:
            return obj
        configs = self._webhooks(MUTATING)
        if not configs:
            return obj
        try:
            mutated, warnings = await self.admission.mutate(configs, attrs)
        except AdmissionError as exc:
            _warn(exc.warnings)
            raise
        _warn(warnings)
        return mutated if mutated is not None else obj

    async def _admit(self, attrs: AdmissionAttributes, obj: JsonObject | None) -> None:
        if self.admission is None:
            return
        configs = self._webhooks(VALIDATING)
        if configs:
            if obj is not None:
                attrs = _with_object(attrs, obj)
            try:
                _warn(await self.admission.validate(configs, attrs))
            except AdmissionError as exc:
                _warn(exc.warnings)
                raise


request_warnings: ContextVar[list[str] | None] = ContextVar("request_warnings", default=None)
"""Warnings for the client of the request being served (admission webhooks add them); the HTTP shell sends them
as ``Warning: 299`` headers."""


def _warn(warnings: list[str]) -> None:
    sink = request_warnings.get()
    if sink is not None:
        sink.extend(warnings)


def _with_object(attrs: AdmissionAttributes, obj: JsonObject) -> AdmissionAttributes:
    import dataclasses

    return dataclasses.replace(attrs, object=obj)


def _encode_continue(start: tuple[str, str], rv: int) -> str:
    raw = encode({"v": 1, "rv": rv, "start": list(start)})
    return base64.urlsafe_b64encode(raw).decode().rstrip("=")


def _decode_continue(token: str) -> tuple[tuple[str, str], int]:
    try:
        data = decode(base64.urlsafe_b64decode(token + "=" * (-len(token) % 4)))
        start = data["start"]
        return (str(start[0]), str(start[1])), int(data["rv"])
    except Exception:
        raise errors.bad_request("continue key is not valid") from None


def _crd_causes(obj: Mapping[str, Any]) -> list[tuple[str, str]]:
    spec = obj.get("spec")
    if not isinstance(spec, dict):
        return [("spec", "Required value")]
    causes: list[tuple[str, str]] = []
    group = spec.get("group")
    names = spec.get("names")
    if not isinstance(group, str) or "." not in group:
        causes.append(("spec.group", "should be a domain with at least one dot"))
    if (
        not isinstance(names, dict)
        or not isinstance(names.get("plural"), str)
        or not isinstance(names.get("kind"), str)
    ):
        causes.append(("spec.names", "plural and kind are required"))
    elif isinstance(group, str) and obj.get("metadata", {}).get("name") != f"{names['plural']}.{group}":
        causes.append(("metadata.name", f'must be spec.names.plural+"."+spec.group ({names["plural"]}.{group})'))
    versions = spec.get("versions")
    if (
        not isinstance(versions, list)
        or not versions
        or not all(isinstance(v, dict) and v.get("name") for v in versions)
    ):
        causes.append(("spec.versions", "must have at least one version with a name"))
    elif sum(1 for v in versions if v.get("storage")) != 1:
        causes.append(("spec.versions", "must have exactly one version marked as storage version"))
    if spec.get("scope", "Namespaced") not in ("Namespaced", "Cluster"):
        causes.append(("spec.scope", 'supported values: "Cluster", "Namespaced"'))
    return causes
