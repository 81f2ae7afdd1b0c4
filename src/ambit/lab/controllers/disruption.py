"""The disruption controller: keeps every PodDisruptionBudget's status (the arithmetic is :mod:`budgets`), which the
API server's eviction subresource reads and charges.

A budget is looked at when it changes, when a pod its selector selects (before or after the change) changes, when
a ReplicaSet or Deployment of its namespace changes (their scale is the budget's ``expectedPods`` for
percentages and ``maxUnavailable``), on every resync, and when the youngest of its ``disruptedPods`` entries
expires. The status is written through the ``status`` subresource with the version it was computed from, so a
concurrent eviction's charge makes the write a 409 and the budget is computed again on fresh caches. A budget
whose status cannot be computed gets kube's fail-safe status (no disruptions allowed, ``SyncFailed``) and a
Warning Event; pods no controller owns are reported with a Warning Event ``UnmanagedPods``.
"""

from __future__ import annotations

import copy
import logging
from collections.abc import Mapping
from typing import Any

from ambit.k8s import Informer, kinds
from ambit.lab.controllers import pods as podstate
from ambit.lab.controllers.budgets import BudgetError, compute, failed_status, new_status
from ambit.lab.controllers.controller import Controller
from ambit.lab.controllers.ownership import Object, key_of
from ambit.lab.controllers.selectors import labels_of
from ambit.lab.controllers.workqueue import Key
from ambit.model.disruption import controller_selector

log = logging.getLogger("ambit.lab.controllers.disruption")


class DisruptionController(Controller):
    name = "disruption-controller"

    def setup(self) -> None:
        self.reported_unmanaged: dict[Key, tuple[str, ...]] = {}
        self.watch_objects(on_delete=self._forget)
        self.informers.pods.add_handler(
            on_add=self._pod_changed,
            on_update=self._pod_updated,
            on_delete=self._pod_changed,
        )
        for scaled in (self.informers.replicasets, self.informers.deployments, self.informers.statefulsets):
            scaled.add_handler(
                on_add=self._namespace_changed,
                on_update=lambda old, new: self._namespace_changed(new),
                on_delete=self._namespace_changed,
            )

    @property
    def objects(self) -> Informer:
        return self.informers.poddisruptionbudgets

    # -- events ---------------------------------------------------------------------------------------------
    def _forget(self, budget: Object) -> None:
        self.reported_unmanaged.pop(key_of(budget), None)

    def _pod_changed(self, pod: Object) -> None:
        namespace, labels = key_of(pod)[0], labels_of(pod)
        for budget in self.informers.poddisruptionbudgets.items():
            if key_of(budget)[0] != namespace:
                continue
            try:
                selector = controller_selector(budget)
            except ValueError:
                self.queue.add(key_of(budget))  # its sync fails and says why
                continue
            if selector is not None and selector.matches(labels):
                self.queue.add(key_of(budget))

    def _pod_updated(self, old: Object, new: Object) -> None:
        self._pod_changed(old)
        self._pod_changed(new)

    def _namespace_changed(self, obj: Object) -> None:
        namespace = key_of(obj)[0]
        for budget in self.informers.poddisruptionbudgets.items():
            if key_of(budget)[0] == namespace:
                self.queue.add(key_of(budget))

    # -- reconcile ------------------------------------------------------------------------------------------
    def _find_scaled(self, kind: str, namespace: str, name: str) -> Mapping[str, Any] | None:
        informers = {
            "ReplicaSet": self.informers.replicasets,
            "Deployment": self.informers.deployments,
            "StatefulSet": self.informers.statefulsets,
        }
        informer = informers.get(kind)
        return None if informer is None else informer.find(name, namespace)

    def _selected(self, budget: Object) -> list[Object]:
        selector = controller_selector(budget)
        if selector is None:
            return []
        namespace = key_of(budget)[0]
        return [p for p in self.informers.pods.items() if key_of(p)[0] == namespace and selector.matches(labels_of(p))]

    async def reconcile(self, key: Key) -> float | None:
        budget = self.find(key)
        if budget is None:
            return None
        now = self.clock()
        stamp = podstate.rfc3339(now)
        try:
            result = compute(budget, self._selected(budget), self._find_scaled, now)
        except (BudgetError, ValueError) as exc:
            failed = failed_status(budget, str(exc), stamp)
            if failed != budget.get("status"):
                self.recorder.record(
                    budget,
                    "Warning",
                    "CalculateExpectedPodCountFailed",
                    f"Failed to calculate the number of expected pods: {exc}",
                    "Sync",
                )
                await self._write(budget, failed)
            return None
        if result.unmanaged and self.reported_unmanaged.get(key) != result.unmanaged:
            self.reported_unmanaged[key] = result.unmanaged
            self.recorder.record(
                budget,
                "Warning",
                "UnmanagedPods",
                f"Pods selected by this PodDisruptionBudget were found to be unmanaged "
                f'({", ".join(result.unmanaged)}): set ".spec.minAvailable" to an integer value to account for them.',
                "Sync",
            )
        fresh = new_status(budget, result, stamp)
        if fresh is not None:
            await self._write(budget, fresh)
        if result.recheck_at is None:
            return None
        return max(result.recheck_at - now, 0.0) + 0.5  # past the entry's expiry, so the next look drops it

    async def _write(self, budget: Object, status: dict[str, Any]) -> None:
        namespace, name = key_of(budget)
        body = copy.deepcopy(budget)
        body["status"] = status
        await self.client.replace(kinds.POD_DISRUPTION_BUDGETS, body, namespace, subresource="status")
        log.debug("%s/%s: %s", namespace, name, status)
