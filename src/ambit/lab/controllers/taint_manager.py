"""The NoExecute taint manager: deletes bound pods that may no longer stay on their node (decisions in
:mod:`eviction`).

A reconcile, for one pod bound to a node: when :func:`eviction.eviction_time` has passed, the pod gets the
``DisruptionTarget`` condition (reason ``DeletionByTaintManager``), a Normal Event ``TaintManagerEviction``
("Marking for deletion Pod <ns>/<name>"), and is deleted; when it lies ahead, the key is looked at again then.
A node's taint change queues every pod bound to it; a pod's binding or tolerations change queues the pod.
When each taint was first seen is remembered per (node, key, value) while the taint stays, for taints without
``timeAdded``.
"""

from __future__ import annotations

import logging
from collections.abc import Callable
from typing import Any

from ambit.k8s import Informer, KubeNotFoundError, kinds
from ambit.lab.controllers import pods as podstate
from ambit.lab.controllers.controller import Controller
from ambit.lab.controllers.eviction import eviction_time, no_execute_taints
from ambit.lab.controllers.ownership import Object, is_deleting, key_of, name_of
from ambit.lab.controllers.placement import Taint, tolerations_of
from ambit.lab.controllers.workqueue import Key

log = logging.getLogger("ambit.lab.controllers.taint_manager")


def _node_of(pod: Object) -> str:
    return str((pod.get("spec") or {}).get("nodeName") or "")


class TaintManager(Controller):
    name = "taint-eviction-controller"
    failure_reason = "FailedEviction"

    def setup(self) -> None:
        self.first_seen: dict[tuple[str, str, str], float] = {}
        self.informers.pods.add_handler(on_add=self._pod_changed, on_update=self._pod_updated)
        self.informers.nodes.add_handler(on_add=self._node_changed, on_update=self._node_updated)

    @property
    def objects(self) -> Informer:
        return self.informers.pods

    def all_keys(self) -> list[Key]:
        tainted = {name_of(n) for n in self.informers.nodes.items() if no_execute_taints(n)}
        return [key_of(p) for p in self.informers.pods.items() if _node_of(p) in tainted]

    def _pod_changed(self, pod: Object) -> None:
        if _node_of(pod) and not is_deleting(pod):
            self.queue.add(key_of(pod))

    def _pod_updated(self, old: Object, new: Object) -> None:
        if _node_of(old) != _node_of(new) or tolerations_of(old) != tolerations_of(new):
            self._pod_changed(new)

    def _node_changed(self, node: Object) -> None:
        name = name_of(node)
        taints = no_execute_taints(node)
        now = self.clock()
        current = {(name, t.key, t.value) for t in taints}
        for key in [k for k in self.first_seen if k[0] == name and k not in current]:
            del self.first_seen[key]
        for key in current:
            self.first_seen.setdefault(key, now)
        if taints:
            for pod in self.informers.pods.items():
                if _node_of(pod) == name:
                    self._pod_changed(pod)

    def _node_updated(self, old: Object, new: Object) -> None:
        if (old.get("spec") or {}).get("taints") != (new.get("spec") or {}).get("taints"):
            self._node_changed(new)

    def _since(self, node: Object) -> Callable[[Taint], float]:
        added: dict[tuple[str, str], float] = {}
        for item in (node.get("spec") or {}).get("taints") or []:
            if isinstance(item, dict) and item.get("timeAdded"):
                stamp = podstate.parse_time(item["timeAdded"])
                if stamp is not None:
                    added[(str(item.get("key")), str(item.get("value") or ""))] = stamp
        name = name_of(node)

        def since(taint: Taint) -> float:
            found = added.get((taint.key, taint.value))
            if found is not None:
                return found
            return self.first_seen.setdefault((name, taint.key, taint.value), self.clock())

        return since

    async def reconcile(self, key: Key) -> float | None:
        pod = self.find(key)
        if pod is None or is_deleting(pod) or not _node_of(pod) or podstate.is_terminal(pod):
            return None
        node = self.informers.nodes.find(_node_of(pod))
        if node is None:
            return None
        taints = no_execute_taints(node)
        if not taints:
            return None
        deadline = eviction_time(tolerations_of(pod), taints, self._since(node))
        if deadline is None:
            return None
        wait = deadline - self.clock()
        if wait > 0:
            return wait
        await self.evict(pod)
        return None

    async def evict(self, pod: Object) -> None:
        namespace, name = key_of(pod)
        condition: dict[str, Any] = {
            "type": "DisruptionTarget",
            "status": "True",
            "reason": "DeletionByTaintManager",
            "message": "Taint manager: deleting due to NoExecute taint",
            "lastTransitionTime": podstate.rfc3339(self.clock()),
        }
        try:
            patch = {"status": {"conditions": [condition]}}
            await self.client.patch_status(kinds.PODS, name, patch, namespace, patch_type="strategic")
            self.recorder.record(
                pod, "Normal", "TaintManagerEviction", f"Marking for deletion Pod {namespace}/{name}", "Delete"
            )
            await self.client.delete(kinds.PODS, name, namespace)
        except KubeNotFoundError:
            return
        log.info("evicted %s/%s from %s (NoExecute taint)", namespace, name, _node_of(pod))
