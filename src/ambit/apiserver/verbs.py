"""The verbs on stored resources (get, list, create, update, patch, delete) with kube-apiserver's semantics.

Order of a write, as in kube-apiserver: decode → defaults → the kind's preparation → mutating admission →
validation → validating admission → store. Nothing is stored when any step fails, and every failure is an
:class:`ApiError`. Where kinds differ, the verbs ask the kind's strategy (:mod:`ambit.apiserver.strategies`);
deletes are carried out by :mod:`ambit.apiserver.deletion`.

Rules kept here, for every kind:

- ``resourceVersion`` in an update is a precondition (409 when stale); an empty one updates unconditionally.
- A write is computed from the version it read, and admission (webhooks) may wait in between: when the object
  changed meanwhile, a conditional write (an update or patch carrying ``resourceVersion``, a delete with a
  version precondition) is a 409, and an unconditional one is computed again from the new version, up to
  :data:`UNCONDITIONAL_ATTEMPTS` times (etcd's compare-and-swap in kube-apiserver's ``GuaranteedUpdate``). A
  write never lands over a version it did not read.
- ``/status`` changes only status (plus labels and annotations, which istio-cni and others write through
  ``pods/status``); the main resource of a kind with a status subresource ignores status changes.
- ``metadata.generation`` starts at 1 and grows when anything but metadata and status changes.
- Finalizers cannot be added to an object being deleted; an update that leaves such an object without
  finalizers removes it.
- A write that changes nothing keeps the object's version and is not stored.
- Nothing can be created in a terminating namespace.
"""

from __future__ import annotations

import copy
import logging
import secrets
import time
import uuid
from collections.abc import Callable
from typing import Any

from ambit.apiserver import errors, validation
from ambit.apiserver.admission import AdmissionController
from ambit.apiserver.admission_chain import AdmissionChain, Request
from ambit.apiserver.authorizer import (
    CLUSTER_ROLE_BINDINGS,
    CLUSTER_ROLES,
    ROLE_BINDINGS,
    Authorizer,
    BindingStrategy,
    ClusterRoleStrategy,
)
from ambit.apiserver.defaults import apply_defaults
from ambit.apiserver.deletion import Deleter
from ambit.apiserver.nesting import copy_document
from ambit.apiserver.objects import apply_patch, check_body, merge_update, unchanged
from ambit.apiserver.pod_security import PodSecuritySettings
from ambit.apiserver.priority import builtin_classes
from ambit.apiserver.registry import CRD_KEY, Registry, ResourceType, crd_is_established, resource_type_from_crd
from ambit.apiserver.requests import (
    DeleteOptions,
    JsonObject,
    ListResult,
    User,
    decode_continue,
    encode_continue,
    rfc3339,
)
from ambit.apiserver.selectors import FieldSelector, parse_label_selector
from ambit.apiserver.store import Store, StoredObject
from ambit.apiserver.strategies import NAMESPACES, StrategyContext, StrategyTable
from ambit.apiserver.token_requests import TokenEndpoints
from ambit.apiserver.tokens import TokenIssuer
from ambit.apiserver.watch import ObjectFilter, WatchHub

SYSTEM_NAMESPACES = ("default", "kube-system", "kube-public", "kube-node-lease")
log = logging.getLogger("ambit.apiserver")
STALE = "the object has been modified; please apply your changes to the latest version and try again"
UNCONDITIONAL_ATTEMPTS = 5


class Superseded(errors.ApiError):
    """The object changed while a write computed from its older version was in admission (a 409)."""

    def __init__(self, rtype: ResourceType, name: str) -> None:
        stale = errors.conflict(rtype.plural, name, STALE, rtype.group)
        super().__init__(stale.code, stale.reason, stale.message, details=stale.details)


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
        pod_security: PodSecuritySettings | None = None,
    ) -> None:
        self.store = store
        self.registry = registry
        self.hub = hub
        self.clock = clock  # replaceable at run time (tests move time): the parts below read it through now()
        self.admission = AdmissionChain(store, admission, pod_security)
        context = StrategyContext(store, registry, hub, self.now, self.commit, root_ca_pem)
        self.strategies = StrategyTable(context, service_cidr=service_cidr)
        self.deleter = Deleter(store, registry, hub, self.strategies, now=self.now, commit=self.commit)
        self.tokens = TokenEndpoints(store, tokens, now=self.now)
        self.rbac = Authorizer(store)
        self.strategies.by_key[CLUSTER_ROLES] = ClusterRoleStrategy(context)
        self.strategies.by_key[ROLE_BINDINGS] = self.strategies.by_key[CLUSTER_ROLE_BINDINGS] = BindingStrategy(context)
        for crd in store.items(CRD_KEY):
            if crd_is_established(crd.obj):
                registry.set_custom(resource_type_from_crd(crd.obj))

    def now(self) -> float:
        return self.clock()

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
            start, rv = decode_continue(continue_token)
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
            token = encode_continue((last.namespace, last.obj["metadata"]["name"]), rv)
            return ListResult(items[:limit], rv, token, len(items) - limit)
        return ListResult(items, rv, "", None)

    # -- create ---------------------------------------------------------------------------------------------
    async def create(
        self, rtype: ResourceType, version: str, namespace: str, body: Any, user: User, *, dry_run: bool = False
    ) -> JsonObject:
        obj = check_body(rtype, version, namespace, body)
        meta = obj["metadata"]
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
        meta["creationTimestamp"] = rfc3339(self.now())
        meta["generation"] = 1
        apply_defaults(rtype.group, rtype.kind, obj)
        strategy = self.strategies[rtype]
        strategy.prepare_for_create(rtype, obj)
        strategy.derive(rtype, None, obj)
        self.rbac.check_write(rtype, namespace, obj, user)
        request = Request("CREATE", rtype, version, namespace, name, user, dry_run=dry_run)
        attrs = self.admission.attributes(request, obj, None, own_labels=strategy.own_labels_select_namespace())
        obj = await self.admission.mutate(attrs, obj)
        self._validate(rtype, obj)
        await self.admission.validate(attrs, obj)
        if self.store.get(rtype.key, namespace, name) is not None:
            raise errors.already_exists(rtype.plural, name, rtype.group)
        if dry_run:
            return obj
        self.commit("ADDED", rtype, namespace, name, obj)
        self.deleter.collect_if_orphaned(rtype, namespace, obj)  # deletion.py rule 5
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
        obj = check_body(rtype, version, namespace, body)
        meta = obj["metadata"]
        if meta.get("name") not in (None, name):
            raise errors.bad_request(
                f"the name of the object ({meta.get('name')}) does not match the name on the URL ({name})"
            )
        meta["name"] = name
        sent_rv = meta.get("resourceVersion")
        for attempt in range(UNCONDITIONAL_ATTEMPTS):
            current = self.get(rtype, namespace, name)
            if sent_rv and str(sent_rv) != str(current.rv):
                raise errors.conflict(rtype.plural, name, STALE, rtype.group)
            # Only an unconditional update is computed again (replace() writes into the body it is given).
            sent = obj if sent_rv else copy_document(obj)
            try:
                return await self.replace(rtype, version, current, sent, user, subresource, dry_run)
            except Superseded:
                if sent_rv or attempt == UNCONDITIONAL_ATTEMPTS - 1:
                    raise
        raise AssertionError("unreachable")

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
        for attempt in range(UNCONDITIONAL_ATTEMPTS):
            current = self.get(rtype, namespace, name)
            patched = apply_patch(rtype, version, current.obj, content_type, body)
            if not isinstance(patched, dict):
                raise errors.unprocessable("the patched object is not a JSON object")
            obj = check_body(rtype, version, namespace, patched)
            meta = obj["metadata"]
            if meta.get("name") != name:
                raise errors.bad_request("a patch cannot change the object's name")
            if str(meta.get("resourceVersion", "")) not in ("", str(current.rv)):
                raise errors.conflict(rtype.plural, name, STALE, rtype.group)
            try:
                return await self.replace(rtype, version, current, obj, user, subresource, dry_run)
            except Superseded:
                # Applied again to the new version: a patch that names the version it read fails above.
                if attempt == UNCONDITIONAL_ATTEMPTS - 1:
                    raise
        raise AssertionError("unreachable")

    async def replace(
        self,
        rtype: ResourceType,
        version: str,
        current: StoredObject,
        obj: JsonObject,
        user: User,
        subresource: str,
        dry_run: bool,
    ) -> JsonObject:
        """Store ``obj`` over ``current`` (whose preconditions the caller checked)."""
        old = current.obj
        namespace = current.namespace
        name = old["metadata"]["name"]
        strategy = self.strategies[rtype]
        new = merge_update(rtype, strategy, old, obj, subresource)
        if subresource != "status":
            if strategy.defaults_on_update:
                apply_defaults(rtype.group, rtype.kind, new, creating=False)
            strategy.derive(rtype, old, new)
        self.rbac.check_write(rtype, namespace, new, user)
        request = Request("UPDATE", rtype, version, namespace, name, user, subresource, dry_run)
        attrs = self.admission.attributes(request, new, old, own_labels=strategy.own_labels_select_namespace())
        new = await self.admission.mutate(attrs, new)
        self._validate(rtype, new)
        await self.admission.validate(attrs, new)
        if self.get(rtype, namespace, name).rv != current.rv:
            raise Superseded(rtype, name)
        if unchanged(old, new):
            return copy_document(old)  # a no-op write keeps its version, as in Kubernetes
        if dry_run:
            return new
        self.commit("MODIFIED", rtype, namespace, name, new)
        if self.deleter.may_remove_now(rtype, new):
            self.deleter.remove(rtype, namespace, name, new, "Background")
        return new

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
        own_labels = self.strategies[rtype].own_labels_select_namespace()
        request = Request("DELETE", rtype, version, namespace, name, user, "", options.dry_run)
        await self.admission.validate(
            self.admission.attributes(request, None, current.obj, own_labels=own_labels), None
        )
        latest = self.get(rtype, namespace, name)
        if options.precondition_rv and latest.rv != current.rv:
            raise errors.conflict(
                rtype.plural,
                name,
                f"Precondition failed: ResourceVersion in precondition: {options.precondition_rv}, "
                f"ResourceVersion in object meta: {latest.rv}",
                rtype.group,
            )
        if latest.obj["metadata"].get("uid") != meta.get("uid"):
            raise errors.not_found(rtype.plural, name, rtype.group)  # deleted and created again meanwhile
        obj = copy_document(latest.obj)
        if options.dry_run:
            return obj
        return self.deleter.delete_now(rtype, obj, options)

    # -- bootstrap ------------------------------------------------------------------------------------------
    async def bootstrap(self, crds: list[JsonObject], rbac: list[JsonObject] | None = None) -> None:
        """System namespaces, the CRDs the mesh reads, kube's default RBAC roles and bindings with ``rbac`` (the
        components' own), and the built-in PriorityClasses; existing objects are left as they are, but for changed
        CRDs and roles."""
        admin = User("system:apiserver", groups=("system:masters",))
        ns_type = self.registry.find(*NAMESPACES)
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
        for obj in self.rbac.bootstrap_objects(rbac or []):
            await self._reconcile(obj, admin)
        for obj in builtin_classes():
            await self._reconcile(obj, admin)

    async def ensure(self, obj: JsonObject, fields: tuple[str, ...]) -> None:
        """Create ``obj`` as the API server itself, or bring the ``fields`` (dotted paths, e.g. ``spec.ports``) of
        the stored one back to ``obj``'s; the rest (a Service's allocated address, labels added by users) stays as
        stored. A stored object that cannot take them (an immutable field in the way) is logged and left."""
        admin = User("system:apiserver", groups=("system:masters",))
        group, _, version = str(obj.get("apiVersion", "")).rpartition("/")
        rtype = self.registry.find_kind(group, str(obj.get("kind", "")))
        assert rtype is not None, obj.get("kind")
        meta = obj.get("metadata") or {}
        namespace, name = str(meta.get("namespace", "")), str(meta.get("name", ""))
        current = self.store.get(rtype.key, namespace, name)
        if current is None:
            await self.create(rtype, version, namespace, copy.deepcopy(obj), admin)
            return
        body = copy.deepcopy(current.obj)
        for path in fields:
            *parents, last = path.split(".")
            source: Any = obj
            target: Any = body
            for part in parents:
                source = source.get(part) or {}
                target = target.setdefault(part, {})
            target[last] = copy.deepcopy(source.get(last))
        if body != current.obj:
            body["metadata"]["resourceVersion"] = str(current.rv)
            try:
                await self.update(rtype, version, namespace, name, body, admin)
            except errors.ApiError as exc:
                log.warning("cannot bring %s %s/%s back to its defaults: %s", rtype.kind, namespace, name, exc)

    async def _reconcile(self, obj: JsonObject, admin: User) -> None:
        group, _, version = str(obj.get("apiVersion", "")).rpartition("/")
        rtype = self.registry.find_kind(group, str(obj.get("kind", "")))
        if rtype is None:
            raise errors.bad_request(f"cannot bootstrap a {obj.get('kind')!r} ({obj.get('apiVersion')!r})")
        meta = obj.get("metadata") or {}
        namespace, name = str(meta.get("namespace", "")), str(meta.get("name", ""))
        current = self.store.get(rtype.key, namespace, name)
        if current is None:
            await self.create(rtype, version, namespace, obj, admin)
            return
        fields = ("roleRef", "subjects") if "roleRef" in obj else ("rules",)
        if obj.get("aggregationRule") or all(current.obj.get(f) == obj.get(f) for f in fields):
            return
        body = copy.deepcopy(current.obj)
        body.update({f: obj.get(f) for f in fields})
        await self.update(rtype, version, namespace, name, body, admin)

    # -- plumbing -------------------------------------------------------------------------------------------
    def commit(self, etype: str, rtype: ResourceType, namespace: str, name: str, obj: JsonObject) -> None:
        """Store and announce ``obj``, then let its kind's strategy act on it."""
        obj["apiVersion"] = rtype.storage_api_version
        self.hub.publish(self.store.put(etype, rtype.key, namespace, name, obj))
        self.strategies[rtype].after_commit(etype, rtype, obj)

    def _validate(self, rtype: ResourceType, obj: JsonObject) -> None:
        causes = validation.validate_object(rtype.kind, rtype.key[0], obj)
        if causes:
            raise errors.invalid(rtype.kind, str(obj["metadata"].get("name", "")), causes, rtype.group)
