"""Deleting objects: finalizers, graceful deletion, owner-reference garbage collection, namespace termination.

Theory of operation (kube-apiserver's and the garbage collector's rules, done synchronously):

1. A delete first asks the kind's strategy for a plan (:mod:`ambit.apiserver.strategies`). A pod bound to a node
   gets a grace period: ``deletionTimestamp`` is set that far ahead and the pod stays until its node deletes it
   again with grace 0. A shorter grace period replaces a longer one, never the reverse.
2. An object with finalizers only gets ``deletionTimestamp``; an update that removes the last finalizer removes
   it (the verbs ask :meth:`Deleter.may_remove_now` and call :meth:`Deleter.remove`).
3. Removing an object collects its dependents: those it is the last owner of are deleted (Background and
   Foreground alike), the others lose the owner reference; with Orphan every dependent only loses the reference.
4. Deleting a namespace marks it Terminating, deletes everything it holds, and removes it once it is empty and
   has no finalizers; each removal inside a terminating namespace checks again.
5. An object created with owner references none of whose owners exists (no object of that kind and name with
   that uid: an owner deleted while a controller still wrote from a stale cache) is deleted at once, as the
   garbage collector deletes a dependent whose owners are all absent. An owner of a kind this server does not
   serve is taken to exist (it cannot be judged), as is a reference without a uid.

Deletion here never runs admission: :meth:`Deleter.delete_now` is called by the verbs after admission and by the
cascades above, which kube-apiserver runs as controllers.
"""

from __future__ import annotations

import copy
from collections.abc import Callable

from ambit.apiserver.registry import Registry, ResourceType
from ambit.apiserver.requests import DeleteOptions, JsonObject, rfc3339
from ambit.apiserver.store import Store
from ambit.apiserver.strategies import NAMESPACES, Commit, GracefulDelete, StrategyTable, TerminateNamespace
from ambit.apiserver.watch import WatchHub

TOKEN_REVIEWS = ("authentication.k8s.io", "tokenreviews")


class Deleter:
    def __init__(
        self,
        store: Store,
        registry: Registry,
        hub: WatchHub,
        strategies: StrategyTable,
        *,
        now: Callable[[], float],
        commit: Commit,
    ) -> None:
        self.store = store
        self.registry = registry
        self.hub = hub
        self.strategies = strategies
        self.now = now
        self.commit = commit

    def delete_now(self, rtype: ResourceType, obj: JsonObject, options: DeleteOptions) -> JsonObject:
        """Delete (or start deleting) an object already fetched; returns the object as it now stands."""
        meta = obj["metadata"]
        namespace, name = meta.get("namespace", ""), meta["name"]
        now = self.now()
        plan = self.strategies[rtype].deletion_plan(obj, options.grace_period)
        if isinstance(plan, TerminateNamespace):
            if not meta.get("deletionTimestamp"):
                meta["deletionTimestamp"] = rfc3339(now)
                meta["deletionGracePeriodSeconds"] = 0
                obj["status"] = {"phase": "Terminating"}
                self.commit("MODIFIED", rtype, "", name, obj)
                self._delete_namespace_contents(name)
            return self._finalize_namespace(name) or obj
        if isinstance(plan, GracefulDelete):
            current_grace = meta.get("deletionGracePeriodSeconds")
            if not meta.get("deletionTimestamp") or (current_grace is not None and plan.seconds < current_grace):
                meta["deletionTimestamp"] = rfc3339(now + plan.seconds)
                meta["deletionGracePeriodSeconds"] = plan.seconds
                self.commit("MODIFIED", rtype, namespace, name, obj)
            return obj
        if meta.get("finalizers"):
            if not meta.get("deletionTimestamp") or meta.get("deletionGracePeriodSeconds"):
                meta["deletionTimestamp"] = meta.get("deletionTimestamp") or rfc3339(now)
                meta["deletionGracePeriodSeconds"] = 0
                self.commit("MODIFIED", rtype, namespace, name, obj)
            return obj
        meta.setdefault("deletionTimestamp", rfc3339(now))
        meta["deletionGracePeriodSeconds"] = 0
        self.remove(rtype, namespace, name, obj, options.propagation)
        return obj

    def may_remove_now(self, rtype: ResourceType, obj: JsonObject) -> bool:
        """Whether an object being deleted whose finalizers are gone may be removed now."""
        meta = obj["metadata"]
        return (
            bool(meta.get("deletionTimestamp"))
            and not meta.get("finalizers")
            and self.strategies[rtype].may_remove_now(obj)
        )

    def remove(self, rtype: ResourceType, namespace: str, name: str, obj: JsonObject, propagation: str) -> None:
        self.hub.publish(self.store.remove(rtype.key, namespace, name, obj))
        self.strategies[rtype].after_remove(obj)
        self._collect_dependents(namespace, str(obj["metadata"].get("uid", "")), propagation)
        if namespace:
            ns = self.store.get(NAMESPACES, "", namespace)
            if ns is not None and ns.obj["metadata"].get("deletionTimestamp"):
                self._finalize_namespace(namespace)

    def _delete_namespace_contents(self, namespace: str) -> None:
        for rtype in list(self.registry):
            if not rtype.namespaced or rtype.key == TOKEN_REVIEWS:
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

    def collect_if_orphaned(self, rtype: ResourceType, namespace: str, obj: JsonObject) -> bool:
        """Rule 5 for an object just created; True when it was deleted."""
        refs = obj["metadata"].get("ownerReferences")
        if not isinstance(refs, list) or not refs:
            return False
        for ref in refs:
            if not isinstance(ref, dict) or self._owner_may_exist(ref, namespace):
                return False
        self.delete_now(rtype, copy.deepcopy(obj), DeleteOptions())
        return True

    def _owner_may_exist(self, ref: JsonObject, namespace: str) -> bool:
        uid, name, kind = ref.get("uid"), ref.get("name"), ref.get("kind")
        api_version = ref.get("apiVersion")
        if not (isinstance(uid, str) and uid and isinstance(name, str) and isinstance(kind, str)):
            return True
        group = api_version.rpartition("/")[0] if isinstance(api_version, str) else ""
        owner_type = self.registry.find_kind(group, kind)
        if owner_type is None or (owner_type.namespaced and not namespace):
            return True  # not judged: an unknown kind, or a namespaced owner of a cluster-scoped object
        found = self.store.get(owner_type.key, namespace if owner_type.namespaced else "", name)
        return found is not None and found.obj["metadata"].get("uid") == uid

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
                        self.commit("MODIFIED", rtype, item.namespace, obj["metadata"]["name"], obj)
                    elif not obj["metadata"].get("deletionTimestamp"):
                        self.delete_now(rtype, obj, DeleteOptions())
